//! A processor that fails: retries with backoff on the failing partition only, then the
//! `ACKD_ON_FAILURE` policy (halt, skip, dead-letter); a panic fails only its message.
//! Uses the testkit's `faulty` processor, which fails as each message's payload says.

mod common;

use std::time::Duration;

use common::{ackd::*, lines::*, offsets::*, produce::*, topics::*};

const WAIT: Duration = Duration::from_secs(60);

fn is(line: &str, what: &str, partition: i32, offset: i64) -> bool {
    (if what == "processed" {
        is_processed(line)
    } else {
        at(line, what)
    }) && field(line, "partition") == Some(partition.to_string())
        && field(line, "offset") == Some(offset.to_string())
}

/// A message to produce: partition, key, payload, headers.
type Spec<'a> = (i32, &'a str, &'a str, &'a [(&'a str, &'a str)]);

/// Produces the messages in order; returns where they went.
fn produce_to(topic: &str, messages: &[Spec<'_>]) -> Vec<(i32, i64)> {
    let headers: Vec<Vec<(&str, &[u8])>> = messages
        .iter()
        .map(|(_, _, _, h)| h.iter().map(|(k, v)| (*k, v.as_bytes())).collect())
        .collect();
    let records: Vec<common::produce::Record<'_>> = messages
        .iter()
        .zip(&headers)
        .map(|((p, k, v, _), h)| (*p, Some(k.as_bytes()), v.as_bytes(), h.as_slice()))
        .collect();
    produce_records(topic, &records)
}

#[test]
fn retryable_failures_are_retried_while_other_partitions_flow() {
    let (topic, group) = fresh_topic("retry", 2);
    produce_to(
        &topic,
        &[
            (0, "a", "ok", &[]),
            (0, "b", "retry:3", &[]),
            (0, "c", "ok", &[]),
        ],
    );
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "faulty")
        .env("ACKD_RETRY_INITIAL_MS", "1000")
        .env("ACKD_RETRY_MAX_MS", "4000")
        .env("ACKD_RETRY_MAX_ATTEMPTS", "5")
        .env("ACKD_METRICS_INTERVAL_MS", "300")
        .spawn();
    ackd.wait_for_line(|l| is(l, "retry", 0, 1), WAIT);
    // While partition 0 waits to retry, partition 1 flows.
    let p1 = produce_to(
        &topic,
        &[
            (1, "x", "ok", &[]),
            (1, "y", "ok", &[]),
            (1, "z", "ok", &[]),
        ],
    );
    ackd.wait_for_count(
        |l| is_processed(l) && field(l, "partition").as_deref() == Some("1"),
        3,
        WAIT,
    );
    assert!(
        !ackd.lines().iter().any(|l| is(l, "processed", 0, 1)),
        "partition 1 should have been processed while partition 0 was still retrying"
    );
    ackd.wait_for_line(|l| is(l, "processed", 0, 2), WAIT);
    let lines = ackd.stop(0, WAIT);
    // Three failed attempts, three retries, then success; in order, each once.
    let retries: Vec<_> = lines.iter().filter(|l| is(l, "retry", 0, 1)).collect();
    assert_eq!(retries.len(), 3, "{}", lines.join("\n"));
    let waits: Vec<u64> = retries
        .iter()
        .map(|l| field(l, "delay_ms").unwrap().parse().unwrap())
        .collect();
    for (i, w) in waits.iter().enumerate() {
        // Exponential with equal jitter: in [base/2, base], base = 1000 × 2^i.
        let base = 1000u64 << i;
        assert!(
            *w >= base / 2 && *w <= base,
            "wait {i} = {w} ms, base {base}"
        );
    }
    let p0: Vec<i64> = processed(&lines)
        .iter()
        .filter(|(p, _)| *p == 0)
        .map(|(_, o)| *o)
        .collect();
    assert_eq!(p0, vec![0, 1, 2], "in order, each once");
    let retried: u64 = lines
        .iter()
        .filter(|l| at(l, "summary"))
        .filter_map(|l| field(l, "count#ackd.retried"))
        .map(|v| v.parse::<u64>().unwrap())
        .sum();
    assert_eq!(retried, 3);
    let committed = committed(&group, &topic, 2);
    assert_eq!(committed[&0], Some(3));
    assert_eq!(committed[&1], Some(p1.last().unwrap().1 + 1));
}

#[test]
fn a_permanent_failure_halts_only_its_partition_and_the_exit_says_so() {
    let (topic, group) = fresh_topic("halt", 2);
    produce_to(
        &topic,
        &[
            (0, "a", "ok", &[]),
            (0, "b", "fail", &[]),
            (0, "c", "ok", &[]),
            (1, "x", "ok", &[]),
            (1, "y", "ok", &[]),
        ],
    );
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "faulty")
        .env("ACKD_METRICS_INTERVAL_MS", "300")
        .spawn();
    ackd.wait_for_line(|l| is(l, "process_failed", 0, 1), WAIT);
    ackd.wait_for_count(
        |l| is_processed(l) && field(l, "partition").as_deref() == Some("1"),
        2,
        WAIT,
    );
    // It keeps saying so while it runs, not only once.
    ackd.wait_for_line(|l| is(l, "halted", 0, 1), WAIT);
    ackd.sigterm();
    assert_eq!(
        ackd.wait_exit(WAIT),
        1,
        "a halted partition makes the exit non-zero"
    );
    let lines = ackd.lines();
    assert!(
        !lines.iter().any(|l| is(l, "processed", 0, 2)),
        "nothing past the failed message"
    );
    let committed = committed(&group, &topic, 2);
    assert_eq!(
        committed[&0],
        Some(1),
        "committed up to the failed message, not past it"
    );
    assert_eq!(committed[&1], Some(2));
}

#[test]
fn skip_acknowledges_a_panic_and_an_exhausted_retry_and_goes_on() {
    let (topic, group) = fresh_topic("skip", 1);
    produce_to(
        &topic,
        &[
            (0, "a", "panic", &[]),
            (0, "b", "retry:10", &[]),
            (0, "c", "ok", &[]),
        ],
    );
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "faulty")
        .env("ACKD_ON_FAILURE", "skip")
        .env("ACKD_RETRY_INITIAL_MS", "10")
        .env("ACKD_RETRY_MAX_ATTEMPTS", "2")
        .spawn();
    ackd.wait_for_line(|l| is(l, "processed", 0, 2), WAIT);
    let lines = ackd.stop(0, WAIT);
    let skipped = all_at(&lines, "skipped");
    assert_eq!(skipped.len(), 2, "{}", lines.join("\n"));
    assert!(
        field(skipped[0], "error").unwrap().contains("panicked"),
        "{}",
        skipped[0]
    );
    assert_eq!(
        field(skipped[1], "attempts").as_deref(),
        Some("2"),
        "{}",
        skipped[1]
    );
    assert!(
        lines.iter().any(|l| at(l, "panic")),
        "the panic is one logfmt line"
    );
    assert!(!lines
        .iter()
        .any(|l| l.contains("RUST_BACKTRACE") || l.starts_with("thread ")));
    assert_committed(&group, &topic, 0, Some(3));
}

#[test]
fn dead_letter_copies_the_message_then_acknowledges_it() {
    let topic = unique_name("dlq-src");
    let dlq = unique_name("dlq");
    let group = unique_name("g-dlq");
    create_topic(&topic, 1);
    create_topic(&dlq, 1);
    produce_to(
        &topic,
        &[
            (0, "a", "ok", &[]),
            (0, "bad-key", "fail", &[("trace", "t-1")]),
            (0, "c", "ok", &[]),
        ],
    );
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "faulty")
        .env("ACKD_ON_FAILURE", "dead-letter")
        .env("ACKD_DEAD_LETTER_TOPIC", &dlq)
        .spawn();
    ackd.wait_for_line(|l| is(l, "processed", 0, 2), WAIT);
    let lines = ackd.stop(0, WAIT);
    let line = lines
        .iter()
        .find(|l| at(l, "dead_lettered"))
        .expect("at=dead_lettered");
    assert_eq!(field(line, "offset").as_deref(), Some("1"), "{line}");
    assert_eq!(
        field(line, "dead_letter_topic"),
        Some(dlq.clone()),
        "{line}"
    );
    assert_committed(&group, &topic, 0, Some(3));

    // Read the dead-letter topic back.
    let got = read_back(&dlq, 1, WAIT);
    let ReadBack {
        key,
        payload,
        headers,
        ..
    } = got.into_iter().next().expect("the dead-lettered copy");
    assert_eq!(key.as_deref(), Some(&b"bad-key"[..]));
    assert_eq!(payload.as_deref(), Some(&b"fail"[..]));
    assert_eq!(headers["trace"], "t-1", "original headers are kept");
    assert_eq!(headers["ackd.source.topic"], topic);
    assert_eq!(headers["ackd.source.partition"], "0");
    assert_eq!(headers["ackd.source.offset"], "1");
    assert!(headers["ackd.error"].contains("permanent"), "{headers:?}");
}
