//! The log drain as an operator reads it: every line is logfmt (read with an independent
//! parser, the `logfmt` crate), every metric token follows l2met's rules, the summaries'
//! counts add up to what was produced, and lag is > 0 with a backlog and 0 when caught up.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{ackd::*, lines::*, offsets::*, produce::*, topics::*};

const WAIT: Duration = Duration::from_secs(60);

/// l2met: `count#`/`measure#`/`sample#` + a name of `[A-Za-z0-9._-]` under the prefix;
/// the value a non-negative decimal number with an optional letters-only unit.
fn assert_l2met(line: &str, key: &str, value: &str) {
    let (kind, name) = key.split_once('#').unwrap();
    assert!(
        matches!(kind, "count" | "measure" | "sample"),
        "{line}: {key}"
    );
    assert!(name.starts_with("ackd."), "{line}: {key} lacks the prefix");
    assert!(
        name.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')),
        "{line}: bad metric name {key}"
    );
    let digits = value.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &value[digits.len()..];
    let number_ok = !digits.is_empty()
        && digits.split('.').count() <= 2
        && digits
            .split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
    assert!(
        number_ok,
        "{line}: {key}={value} is not a non-negative decimal"
    );
    if kind == "measure" {
        assert_eq!(unit, "ms", "{line}: durations carry their unit");
    }
}

/// Every line parses as logfmt, the two parsers agree, and metric tokens are l2met's.
fn assert_all_lines_are_logfmt(lines: &[String]) {
    assert!(!lines.is_empty());
    for line in lines {
        let pairs = logfmt::parse(line);
        assert!(!pairs.is_empty(), "not logfmt: {line}");
        let ours = common::lines::logfmt(line);
        assert_eq!(pairs.len(), ours.len(), "parsers disagree on {line}");
        for (pair, (key, value)) in pairs.iter().zip(&ours) {
            assert_eq!(&pair.key, key, "{line}");
            // The crate mishandles `\\` (it drops one), so values are compared where
            // no escape is involved.
            if !line.contains('\\') {
                assert_eq!(pair.val.as_deref().unwrap_or(""), value, "{line}");
            }
            assert!(
                key.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '#')),
                "{line}: bad key {key}"
            );
            if key.contains('#') {
                assert_l2met(line, key, value);
            }
        }
        assert!(!line.contains('\u{1b}'), "ANSI escape in {line}");
    }
}

/// Each partition's last lag line's value.
fn last_lag_lines(lines: &[String]) -> BTreeMap<String, String> {
    let mut lag = BTreeMap::new();
    for l in lines.iter().filter(|l| at(l, "lag")) {
        lag.insert(
            field(l, "partition").unwrap(),
            field(l, "sample#ackd.lag").unwrap(),
        );
    }
    lag
}

fn sum(lines: &[String], key: &str) -> u64 {
    lines
        .iter()
        .filter(|l| at(l, "summary"))
        .filter_map(|l| field(l, key))
        .map(|v| v.parse::<u64>().unwrap())
        .sum()
}

#[test]
fn every_line_is_logfmt_and_the_summaries_add_up() {
    let (topic, group) = fresh_topic("metrics", 3);
    let delivered = produce_keyed(&topic, 500, 0);
    // A key that needs quoting and one that is not UTF-8 must not break a line.
    let mut odd = produce(
        &topic,
        &[
            (
                Some(b"a key with spaces=\"quoted\"".to_vec()),
                b"x".to_vec(),
            ),
            (Some(vec![0xff, 0xfe, b'k']), b"y".to_vec()),
            (None, b"null key".to_vec()),
        ],
    );
    odd.extend(delivered);
    let delivered = odd;

    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_METRICS_INTERVAL_MS", "300")
        .env("ACKD_COMMIT_INTERVAL_MS", "200")
        .spawn();
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);
    // Caught up: a later summary reports no lag on any partition.
    let from = ackd.line_count();
    ackd.wait_for_line_from(
        from,
        |l| at(l, "summary") && field(l, "sample#ackd.lag.total").as_deref() == Some("0"),
        WAIT,
    );
    let lines = ackd.stop(0, WAIT);

    assert_all_lines_are_logfmt(&lines);
    let n = delivered.len() as u64;
    assert_eq!(sum(&lines, "count#ackd.received"), n, "received");
    assert_eq!(sum(&lines, "count#ackd.processed"), n, "processed");
    assert_eq!(sum(&lines, "count#ackd.failed"), 0);
    assert!(
        sum(&lines, "count#ackd.commits") >= 1,
        "periodic commits are counted"
    );
    let last: Vec<_> = lines
        .iter()
        .filter(|l| at(l, "summary") && field(l, "last").as_deref() == Some("true"))
        .collect();
    assert_eq!(last.len(), 1, "one final summary");
    // The last lag line of every partition that had one says 0 (a partition gets lines
    // while it is behind, and one when it caught up).
    let lag = last_lag_lines(&lines);
    assert!(lag.values().all(|v| v == "0"), "{lag:?}");
    // Each periodic commit's lines carry offsets and a duration.
    let commit = lines
        .iter()
        .find(|l| at(l, "committed"))
        .expect("an at=committed line");
    assert!(
        field(commit, "offset").is_some() && field(commit, "duration_ms").is_some(),
        "{commit}"
    );
    // Odd keys: quoted, escaped, or left out, and read back intact.
    assert!(lines
        .iter()
        .any(|l| is_processed(l)
            && field(l, "key").as_deref() == Some("a key with spaces=\"quoted\"")));
    assert!(lines
        .iter()
        .any(|l| is_processed(l) && field(l, "key").as_deref() == Some("\\xff\\xfek")));
    assert_eq!(
        lines
            .iter()
            .filter(|l| is_processed(l) && field(l, "key").is_none())
            .count(),
        1
    );
}

#[test]
fn lag_is_positive_while_a_backlog_is_processed() {
    let (topic, group) = fresh_topic("lag", 1);
    let delivered = produce_keyed(&topic, 200, 0);
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "slow")
        .env("ACKD_TEST_DELAY_MS", "20")
        .env("ACKD_METRICS_INTERVAL_MS", "300")
        .spawn();
    let line = ackd.wait_for_line(
        |l| at(l, "lag") && field(l, "sample#ackd.lag").is_some_and(|v| v != "0"),
        WAIT,
    );
    let lag: i64 = field(&line, "sample#ackd.lag").unwrap().parse().unwrap();
    assert!(lag > 0 && lag <= delivered.len() as i64, "{line}");
    // A summary's in-flight sample sees the slow processor at work. Waited for, not
    // looked up after the stop: the summary written with the first lag line can fall
    // where no call is under way (before the first, or between two), and a stop that
    // soon leaves no other summary.
    ackd.wait_for_line(
        |l| at(l, "summary") && field(l, "sample#ackd.in_flight").as_deref() == Some("1"),
        WAIT,
    );
    let lines = ackd.stop(0, WAIT);
    assert_all_lines_are_logfmt(&lines);
}

#[test]
fn the_source_of_metric_lines_can_be_set() {
    let (topic, group) = fresh_topic("source", 1);
    produce_keyed(&topic, 5, 0);
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_METRICS_INTERVAL_MS", "300")
        .env("ACKD_METRIC_SOURCE", "consumer.3")
        .env("ACKD_METRIC_PREFIX", "billing")
        .spawn();
    ackd.wait_for_count(
        |l| l.contains("count#billing.messages.processed=1"),
        5,
        WAIT,
    );
    ackd.wait_for_line(
        |l| at(l, "summary") && l.contains("count#billing.processed="),
        WAIT,
    );
    let lines = ackd.stop(0, WAIT);
    for l in lines.iter().filter(|l| l.contains('#')) {
        assert_eq!(field(l, "source").as_deref(), Some("consumer.3"), "{l}");
        assert!(!l.contains("#ackd."), "{l}");
    }
}

/// 200 partitions, each with messages: every partition's worker records durations, and
/// ackd's peak memory stays within what the memory table of docs/performance.md adds up to (the
/// prefetch of 10 small messages per partition, 26 KiB of histograms per partition,
/// the runtime's ~20 MiB): under 40 MiB. With 188 KiB of histograms per partition it
/// peaked at 57 MiB.
#[test]
fn two_hundred_partitions_stay_within_the_memory_table() {
    let (topic, group) = fresh_topic("mem-200", 200);
    let delivered = produce_keyed(&topic, 2000, 0);
    let ends = log_ends(&delivered);
    let ackd = AckdBuilder::new(&topic, &group).spawn();
    ackd.wait_for_count(is_processed, 2000, WAIT);
    let assigned = ackd.lines().iter().filter(|l| at(l, "assigned")).count();
    let peak_kib = peak_rss_kib(ackd.pid());
    ackd.stop(0, WAIT);
    eprintln!(
        "200 partitions ({} with messages, {assigned} assigned): 2000 messages processed, ackd's peak RSS {peak_kib} KiB",
        ends.len()
    );
    assert_eq!(assigned, 200);
    assert!(peak_kib < 40 * 1024, "peak RSS {peak_kib} KiB");
    assert_committed_to_ends(&group, &topic, 200, &ends);
}

/// ackd's cap on lag lines per summary (`LAG_LINES_MAX` in src/output/metrics.rs).
const LAG_LINES_MAX: usize = 100;

/// The lines after each summary, up to the next one (the summary first).
fn intervals(lines: &[String]) -> Vec<&[String]> {
    let starts: Vec<usize> = (0..lines.len())
        .filter(|&i| at(&lines[i], "summary"))
        .collect();
    starts
        .iter()
        .zip(starts.iter().skip(1).chain([&lines.len()]))
        .map(|(&a, &b)| &lines[a..b])
        .collect()
}

/// 150 partitions, each 3 messages behind a processor taking 1 s per message, then at
/// rest: what a log drain receives per summary does not grow with the partitions. A
/// partition gets a lag line while it is behind and one when it caught up (that says
/// 0), at most 100 after one summary (`at=lag_omitted` counts the rest); at rest, the
/// summary alone. Every summary wrote 150 lag lines before.
#[test]
fn lag_lines_per_summary_are_bounded_and_none_at_rest() {
    let partitions = 150;
    let (topic, group) = fresh_topic("rest-150", partitions);
    let records: Vec<Record<'_>> = (0..partitions)
        .flat_map(|p| [p; 3])
        .map(|p| (p, Some(&b"k"[..]), &b"v"[..], &[][..]))
        .collect();
    produce_records(&topic, &records);
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "slow")
        .env("ACKD_TEST_DELAY_MS", "1000")
        .env("ACKD_METRICS_INTERVAL_MS", "300")
        // A session long enough that the membership lease cannot lapse during the test: a
        // lapse commits every partition again, with a line each.
        .env("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "30000")
        .env("ACKD_RDKAFKA_HEARTBEAT_INTERVAL_MS", "1000")
        .spawn();
    ackd.wait_for_count(is_processed, records.len(), WAIT);
    let from = ackd.line_count();
    ackd.wait_for_line_from(
        from,
        |l| at(l, "summary") && field(l, "sample#ackd.lag.total").as_deref() == Some("0"),
        WAIT,
    );
    // Caught up; then 12 summaries more (3.6 s at rest).
    let rest_from = ackd.line_count();
    ackd.wait_for_count(
        |l| at(l, "summary"),
        count_at(&ackd.lines(), "summary") + 12,
        WAIT,
    );
    let before_stop = ackd.lines();
    let lines = ackd.stop(0, WAIT);
    assert_all_lines_are_logfmt(&lines);

    for interval in intervals(&lines) {
        let lag = count_at(interval, "lag");
        assert!(
            lag <= LAG_LINES_MAX,
            "{lag} lag lines after one summary: {}",
            interval[0]
        );
    }
    let omitted = lines
        .iter()
        .find(|l| at(l, "lag_omitted"))
        .expect("an at=lag_omitted line while 150 partitions were behind");
    assert_eq!(
        field(omitted, "partitions").as_deref(),
        Some("50"),
        "{omitted}"
    );
    // At rest (the last 6 intervals complete before the stop): the summary, no lag line.
    let complete = &intervals(&before_stop[rest_from..])[..];
    let complete = &complete[1..complete.len() - 1];
    assert!(complete.len() >= 6, "{} intervals at rest", complete.len());
    for interval in &complete[complete.len() - 6..] {
        assert!(
            interval.len() <= 2 && count_at(interval, "lag") == 0,
            "at rest, after one summary: {interval:#?}"
        );
    }
    // Every partition was behind and had lines; each one's last says 0.
    let lag = last_lag_lines(&lines);
    assert_eq!(lag.len(), partitions as usize, "{lag:?}");
    assert!(lag.values().all(|v| v == "0"), "{lag:?}");
}

/// The lag in seconds with `ACKD_ORDERING=none`: several calls at once, messages read
/// far ahead of them, and acknowledged out of order; the age reported is the oldest
/// message's not processed (the committed offset's), not the newest one's read, within
/// a second (messages 100 ms apart: a message read 10 ahead would be a second off).
#[test]
fn lag_in_seconds_with_concurrent_calls_is_the_oldest_message_s() {
    let (topic, group) = fresh_topic("lag-secs-none", 1);
    let start = common::stamped::epoch_ms() - 3_600_000;
    let stamps: Vec<i64> = (0..60).map(|i| start + i * 100).collect();
    common::stamped::produce_at(&topic, 0, &stamps);
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "slow")
        .env("ACKD_TEST_DELAY_MS", "150")
        .env("ACKD_ORDERING", "none")
        .env("ACKD_CONCURRENCY", "3")
        .env("ACKD_METRICS_INTERVAL_MS", "200")
        .spawn();
    ackd.wait_for_line(
        |l| {
            at(l, "summary")
                && field(l, "sample#ackd.lag.total").as_deref() == Some("0")
                && field(l, "sample#ackd.lag.seconds.max").as_deref() == Some("0.0")
        },
        WAIT,
    );
    let checked = common::stamped::assert_lag_seconds(&ackd.timed_lines(), &stamps);
    eprintln!("lag seconds, ordering none: {checked} lines checked");
    assert!(checked >= 5, "too few lines with a lag to check");
    let lines = ackd.stop(0, WAIT);
    assert_all_lines_are_logfmt(&lines);
}
