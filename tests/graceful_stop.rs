//! The core promise against the real broker: every message processed once, its offset
//! committed only after it was acknowledged, and a graceful stop (SIGTERM) that commits
//! exactly up to what was processed, so a restart resumes at the next message.
//!
//! Ground truth is the producer's delivery reports (what the broker acknowledged to the
//! producer); committed offsets are read back from the broker.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use common::{ackd::*, lines::*, offsets::*, produce::*, topics::*};

const WAIT: Duration = Duration::from_secs(60);

/// (partition, offset) of every delivered message.
fn delivered_set(d: &[Delivered]) -> BTreeSet<(i32, i64)> {
    d.iter().map(|m| (m.partition, m.offset)).collect()
}

/// Per partition, one past the highest processed offset: what a stop must commit.
fn next_after_processed(processed: &[(i32, i64)]) -> BTreeMap<i32, i64> {
    let mut next = BTreeMap::new();
    for &(p, o) in processed {
        let e = next.entry(p).or_insert(o + 1);
        *e = (*e).max(o + 1);
    }
    next
}

fn assert_no_duplicates(processed: &[(i32, i64)]) {
    let mut seen: HashMap<(i32, i64), usize> = HashMap::new();
    for m in processed {
        *seen.entry(*m).or_default() += 1;
    }
    let dups: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(dups.is_empty(), "processed more than once: {dups:?}");
}

#[test]
fn every_message_is_processed_once_and_the_stop_commits_the_log_end() {
    let (topic, group) = fresh_topic("all", 3);
    let delivered = produce_keyed(&topic, 300, 0);

    let ackd = AckdBuilder::new(&topic, &group)
        // A secret in a pass-through property must never reach a line.
        .env("ACKD_RDKAFKA_SASL_PASSWORD", "hunter2-secret")
        .spawn();
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);
    ackd.sigterm();
    // Heroku may send SIGTERM more than once: the second one must not cut the stop short.
    let lines = ackd.stop(0, WAIT);
    let processed = processed(&lines);
    assert_no_duplicates(&processed);
    let processed_set: BTreeSet<_> = processed.iter().copied().collect();
    assert_eq!(
        processed_set,
        delivered_set(&delivered),
        "processed != produced"
    );

    let ends = log_ends(&delivered);
    let committed = committed(&group, &topic, 3);
    for (p, end) in &ends {
        assert_eq!(
            committed[p],
            Some(*end),
            "partition {p} committed {:?}, log end {end}",
            committed[p]
        );
    }
    // The final commit is in the log drain, per partition, with the same offsets.
    for (p, end) in &ends {
        let line = lines
            .iter()
            .find(|l| {
                field(l, "at").as_deref() == Some("final_commit")
                    && field(l, "partition") == Some(p.to_string())
            })
            .unwrap_or_else(|| {
                panic!(
                    "no at=final_commit line for partition {p}:\n{}",
                    lines.join("\n")
                )
            });
        assert_eq!(field(line, "offset"), Some(end.to_string()), "{line}");
    }
    assert!(lines
        .iter()
        .any(|l| field(l, "at").as_deref() == Some("exit")
            && field(l, "code").as_deref() == Some("0")));
    let all = lines.join("\n");
    assert!(!all.contains("hunter2-secret"), "secret leaked:\n{all}");
    assert!(
        all.contains("sasl.password=[redacted]"),
        "start line should show the property, redacted"
    );
}

#[test]
fn a_stop_in_the_middle_of_a_stream_resumes_at_exactly_the_next_message() {
    let (topic, group) = fresh_topic("resume", 4);

    // A steady producer in the background: 30 batches of 20.
    let producer_topic = topic.clone();
    let producer = std::thread::spawn(move || {
        let mut all = Vec::new();
        for batch in 0..30 {
            all.extend(produce_keyed(&producer_topic, 20, batch * 20));
            std::thread::sleep(Duration::from_millis(50));
        }
        all
    });

    let first = AckdBuilder::new(&topic, &group)
        .env("ACKD_COMMIT_INTERVAL_MS", "60000") // only the stop commits
        .spawn();
    first.wait_for_count(is_processed, 100, WAIT);
    first.stop(0, WAIT);
    let first_processed = processed(&first.lines());
    let committed_after_first = committed(&group, &topic, 4);
    for (p, next) in next_after_processed(&first_processed) {
        assert_eq!(
            committed_after_first[&p],
            Some(next),
            "partition {p}: commit != one past the last processed"
        );
    }

    let second = AckdBuilder::new(&topic, &group).spawn();
    let delivered = producer.join().expect("producer");
    let total = delivered.len();
    // Wait until the second run has processed everything the first did not.
    let remaining = total - first_processed.len();
    second.wait_for_count(is_processed, remaining, WAIT);
    let second_lines = second.stop(0, WAIT);

    // Each partition resumed at the offset the first run committed.
    for (p, c) in &committed_after_first {
        let Some(c) = c else { continue };
        let assigned = second_lines
            .iter()
            .find(|l| {
                field(l, "at").as_deref() == Some("assigned")
                    && field(l, "partition") == Some(p.to_string())
            })
            .unwrap_or_else(|| panic!("no at=assigned for partition {p}"));
        assert_eq!(field(assigned, "offset"), Some(c.to_string()), "{assigned}");
        assert_eq!(
            field(assigned, "from").as_deref(),
            Some("committed"),
            "{assigned}"
        );
    }

    let mut all = first_processed.clone();
    all.extend(processed(&second_lines));
    assert_no_duplicates(&all);
    let all_set: BTreeSet<_> = all.iter().copied().collect();
    let expected = delivered_set(&delivered);
    let lost: Vec<_> = expected.difference(&all_set).collect();
    assert!(lost.is_empty(), "lost {} messages: {lost:?}", lost.len());
    assert_eq!(all.len(), total);
    let committed = committed(&group, &topic, 4);
    for (p, end) in log_ends(&delivered) {
        assert_eq!(committed[&p], Some(end), "partition {p}");
    }
}

#[test]
fn in_flight_messages_finish_before_the_final_commit() {
    let (topic, group) = fresh_topic("inflight", 2);
    let delivered = produce_keyed(&topic, 40, 0);

    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "slow")
        .env("ACKD_TEST_DELAY_MS", "400")
        .env("ACKD_SHUTDOWN_TIMEOUT_MS", "10000")
        .spawn();
    ackd.wait_for_count(is_processed, 2, WAIT);
    let signal_at = ackd.line_count();
    let lines = ackd.stop(0, WAIT);
    assert_signal_line_first(&lines);
    // Messages that were in the processor when SIGTERM arrived completed after it.
    let after: Vec<_> = lines[signal_at..]
        .iter()
        .filter(|l| is_processed(l))
        .collect();
    assert!(
        !after.is_empty(),
        "no message finished after SIGTERM:\n{}",
        lines.join("\n")
    );
    let processed = processed(&lines);
    assert!(
        processed.len() < delivered.len(),
        "the stop should not wait for the backlog"
    );
    let committed = committed(&group, &topic, 2);
    let next = next_after_processed(&processed);
    for p in 0..2 {
        assert_eq!(committed[&p], next.get(&p).copied(), "partition {p}");
    }
}

#[test]
fn past_the_deadline_the_exit_is_non_zero_and_nothing_unacked_is_committed() {
    let (topic, group) = fresh_topic("deadline", 1);
    produce_keyed(&topic, 5, 0);

    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "slow")
        .env("ACKD_TEST_DELAY_MS", "30000")
        .env("ACKD_SHUTDOWN_TIMEOUT_MS", "1500")
        .spawn();
    // The first message is in the processor once its partition resumed.
    ackd.wait_for_line(|l| field(l, "at").as_deref() == Some("resumed"), WAIT);
    ackd.sigterm();
    let code = ackd.wait_exit(Duration::from_secs(20));
    assert_eq!(code, 1, "{}", ackd.lines().join("\n"));
    assert!(ackd.elapsed() < Duration::from_secs(20));
    let lines = ackd.lines();
    assert!(processed(&lines).is_empty());
    assert!(
        lines
            .iter()
            .any(|l| field(l, "at").as_deref() == Some("drain_timeout")
                && field(l, "in_flight_offset").as_deref() == Some("0")),
        "the line should say which offset was in flight:\n{}",
        lines.join("\n")
    );
    // The first commit, before the first call, names where the partition resumed (and
    // the dispatch limit): nothing was acked, nothing past it may be committed.
    assert_eq!(
        committed_offset(&group, &topic, 0),
        Some(0),
        "nothing was acked, nothing may be committed"
    );
}

#[test]
fn a_second_sigint_exits_at_once() {
    let (topic, group) = fresh_topic("sigint", 1);
    produce_keyed(&topic, 3, 0);
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "slow")
        .env("ACKD_TEST_DELAY_MS", "30000")
        .spawn();
    ackd.wait_for_line(|l| field(l, "at").as_deref() == Some("resumed"), WAIT);
    ackd.signal(libc::SIGINT);
    ackd.wait_for_line(
        |l| field(l, "at").as_deref() == Some("shutdown_begun"),
        WAIT,
    );
    ackd.signal(libc::SIGINT);
    ackd.assert_exit(130, Duration::from_secs(10));
    let lines = ackd.lines();
    assert_signal_line_first(&lines);
    assert!(
        lines
            .iter()
            .any(|l| field(l, "at").as_deref() == Some("uncommitted")),
        "a forced exit says what was not committed:\n{}",
        lines.join("\n")
    );
}

/// The signal's line comes before the stop it starts, in every run that has one.
fn assert_signal_line_first(lines: &[String]) {
    let position = |what| lines.iter().position(|l| at(l, what));
    if let (Some(signal), Some(begun)) = (position("signal"), position("shutdown_begun")) {
        assert!(
            signal < begun,
            "shutdown_begun before the signal:\n{}",
            lines.join("\n")
        );
    }
}

/// A process manager (honcho, overmind, foreman) sends SIGTERM to its children while the
/// terminal's Ctrl-C sends SIGINT to the same process group: one stop, not a forced exit.
#[test]
fn a_sigint_after_a_sigterm_still_stops_gracefully() {
    let (topic, group) = fresh_topic("term-int", 1);
    let delivered = produce_keyed(&topic, 6, 0);
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "slow")
        .env("ACKD_TEST_DELAY_MS", "1500")
        .env("ACKD_SHUTDOWN_TIMEOUT_MS", "20000")
        .spawn();
    // The first message is in the processor once its partition resumed.
    ackd.wait_for_line(|l| at(l, "resumed"), WAIT);
    ackd.sigterm();
    ackd.wait_for_line(
        |l| at(l, "signal") && field(l, "signal").as_deref() == Some("SIGTERM"),
        WAIT,
    );
    ackd.signal(libc::SIGINT);
    ackd.assert_exit(0, WAIT);
    let lines = ackd.lines();
    let all = lines.join("\n");
    assert!(
        lines
            .iter()
            .any(|l| at(l, "signal") && field(l, "signal").as_deref() == Some("SIGINT")),
        "each signal is logged:\n{all}"
    );
    assert_signal_line_first(&lines);
    let processed = processed(&lines);
    assert!(
        !processed.is_empty(),
        "the message in flight finished:\n{all}"
    );
    let next = next_after_processed(&processed);
    assert_eq!(
        committed_offset(&group, &topic, 0),
        next.get(&0).copied(),
        "{all}"
    );

    // The next run starts right after: nothing processed is delivered again.
    let again = AckdBuilder::new(&topic, &group)
        .env("ACKD_STOP_AT_END", "true")
        .spawn();
    again.assert_exit(0, WAIT);
    let mut all_processed = processed.clone();
    all_processed.extend(common::lines::processed(&again.lines()));
    assert_no_duplicates(&all_processed);
    assert_eq!(all_processed.len(), delivered.len());
}

/// Two threads wrote these lines (the signal's, the supervisor's): the log must tell the
/// stop in the order it happened, in every run.
#[test]
fn every_stop_logs_its_signal_before_the_stop_begins() {
    let topic = unique_name("order");
    create_topic(&topic, 1);
    for run in 0..6 {
        let ackd = AckdBuilder::new(&topic, &unique_name("g-order")).spawn();
        ackd.wait_for_line(|l| at(l, "assigned"), WAIT);
        ackd.sigterm();
        assert_eq!(ackd.wait_exit(WAIT), 0, "run {run}");
        let lines = ackd.lines();
        assert!(lines.iter().any(|l| at(l, "shutdown_begun")), "run {run}");
        assert_signal_line_first(&lines);
    }
}
