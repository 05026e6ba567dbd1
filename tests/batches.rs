//! Batches (`ACKD_BATCH_MAX_MESSAGES` above 1) with the default `process_batch` (the
//! processor's `process` per message, stopping at the first failure): what a batch
//! acknowledges, what it commits, how a failure in the middle is retried or given up,
//! and that a batch being gathered is never lost on a stop. The exec and http
//! processors' own batch forms are tested in tests/exec.rs and tests/http.rs.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{ackd::*, lines::*, offsets::*, produce::*, topics::*};

const WAIT: Duration = Duration::from_secs(60);

/// Produces `payloads` to `partition` in order (keys `k-<i>`); returns their offsets.
fn produce_payloads(topic: &str, partition: i32, payloads: &[&str]) -> Vec<i64> {
    let keys: Vec<String> = (0..payloads.len()).map(|i| format!("k-{i}")).collect();
    let records: Vec<Record<'_>> = payloads
        .iter()
        .zip(&keys)
        .map(|(v, k)| (partition, Some(k.as_bytes()), v.as_bytes(), &[][..]))
        .collect();
    produce_records(topic, &records)
        .into_iter()
        .map(|(_, o)| o)
        .collect()
}

/// The offsets processed on `partition`, in the order of their lines.
fn processed_on(lines: &[String], partition: i32) -> Vec<i64> {
    processed(lines)
        .into_iter()
        .filter(|(p, _)| *p == partition)
        .map(|(_, o)| o)
        .collect()
}

/// ackd with the `faulty` processor, batches of `max`, and a long enough wait that a
/// backlog produced before the start fills the first batch whole.
fn faulty_batches(topic: &str, group: &str, max: usize) -> AckdBuilder {
    AckdBuilder::new(topic, group)
        .env("ACKD_PROCESSOR", "faulty")
        .batches(max)
        .quick_retries()
}

#[test]
fn batches_of_any_size_commit_every_message_once() {
    for max in [2usize, 7, 64, 1000] {
        let (topic, group) = fresh_topic(&format!("batch{max}"), 3);
        let delivered = produce_keyed(&topic, 450, 0);
        let ackd = AckdBuilder::new(&topic, &group)
            .env("ACKD_PROCESSOR", "log")
            .env("ACKD_BATCH_MAX_MESSAGES", max.to_string())
            .env("ACKD_STOP_AT_END", "true")
            .spawn();
        ackd.assert_exit(0, WAIT);
        let lines = ackd.lines();
        let counts = processed_counts(&lines);
        let duplicated = counts.values().filter(|n| **n > 1).count();
        let lost = delivered
            .iter()
            .filter(|d| !counts.contains_key(&(d.partition, d.offset)))
            .count();
        assert_eq!(
            (counts.len(), lost, duplicated),
            (delivered.len(), 0, 0),
            "batch {max}: processed, lost, duplicated"
        );
        for p in 0..3 {
            let offsets = processed_on(&lines, p);
            assert!(
                offsets.windows(2).all(|w| w[0] < w[1]),
                "batch {max}: partition {p} out of order"
            );
        }
        let ends = log_ends(&delivered);
        let committed = committed(&group, &topic, 3);
        for p in 0..3 {
            assert_eq!(
                committed[&p],
                ends.get(&p).copied(),
                "batch {max}: partition {p}"
            );
        }
        let start = lines.iter().find(|l| at(l, "start")).unwrap();
        assert_eq!(field(start, "batch_max_messages"), Some(max.to_string()));
    }
}

#[test]
fn a_retryable_failure_in_a_batch_acks_what_came_before_and_retries_the_rest() {
    let (topic, group) = fresh_topic("batch-retry", 1);
    let mut payloads = vec!["ok"; 20];
    payloads[5] = "retry:2";
    produce_payloads(&topic, 0, &payloads);
    let ackd = faulty_batches(&topic, &group, 8)
        .env("ACKD_STOP_AT_END", "true")
        .spawn();
    ackd.assert_exit(0, WAIT);
    let lines = ackd.lines();
    // The first batch is offsets 0..=7: 0..=4 are acknowledged, 5 fails, and the rest of
    // the batch (5, 6, 7) is handed over again, twice.
    let retries = all_at(&lines, "retry");
    assert_eq!(retries.len(), 2, "{}", lines.join("\n"));
    for r in &retries {
        assert_eq!(field(r, "offset").as_deref(), Some("5"), "{r}");
        assert_eq!(field(r, "batch_messages").as_deref(), Some("3"), "{r}");
    }
    assert_eq!(
        processed_on(&lines, 0),
        (0..20).collect::<Vec<_>>(),
        "each once, in order"
    );
    assert_committed(&group, &topic, 0, Some(20));
}

#[test]
fn a_permanent_failure_in_a_batch_halts_the_partition_at_that_message() {
    let (topic, group) = fresh_topic("batch-halt", 2);
    let mut payloads = vec!["ok"; 12];
    payloads[5] = "fail";
    produce_payloads(&topic, 0, &payloads);
    let other = produce_payloads(&topic, 1, &["ok"; 12]);
    let ackd = faulty_batches(&topic, &group, 8).spawn();
    ackd.wait_for_line(
        |l| at(l, "process_failed") && field(l, "offset").as_deref() == Some("5"),
        WAIT,
    );
    ackd.wait_for_count(
        |l| is_processed(l) && field(l, "partition").as_deref() == Some("1"),
        other.len(),
        WAIT,
    );
    ackd.sigterm();
    assert_eq!(ackd.wait_exit(WAIT), 1, "a halted partition exits 1");
    let lines = ackd.lines();
    assert_eq!(processed_on(&lines, 0), vec![0, 1, 2, 3, 4]);
    let committed = committed(&group, &topic, 2);
    assert_eq!(
        committed[&0],
        Some(5),
        "the messages before the failed one in its batch are committed, nothing past it"
    );
    assert_eq!(committed[&1], Some(12));
}

#[test]
fn skipped_messages_in_a_batch_do_not_hold_back_the_rest() {
    let (topic, group) = fresh_topic("batch-skip", 1);
    let mut payloads = vec!["ok"; 30];
    payloads[3] = "panic";
    payloads[4] = "fail";
    payloads[17] = "fail";
    produce_payloads(&topic, 0, &payloads);
    let ackd = faulty_batches(&topic, &group, 10)
        .env("ACKD_ON_FAILURE", "skip")
        .env("ACKD_STOP_AT_END", "true")
        .spawn();
    ackd.assert_exit(0, WAIT);
    let lines = ackd.lines();
    let skipped: Vec<i64> = lines
        .iter()
        .filter(|l| at(l, "skipped"))
        .map(|l| field(l, "offset").unwrap().parse().unwrap())
        .collect();
    assert_eq!(skipped, vec![3, 4, 17]);
    let expected: Vec<i64> = (0..30).filter(|o| !skipped.contains(o)).collect();
    assert_eq!(processed_on(&lines, 0), expected);
    assert_committed(&group, &topic, 0, Some(30));
}

/// Dead-letter in batches: each failed message is copied to the dead-letter topic as it
/// fails, the ones before it in its batch are acknowledged, the rest handed over again;
/// everything is committed.
#[test]
fn dead_letters_in_a_batch_are_copied_and_the_rest_processed() {
    let topic = unique_name("batch-dlq-src");
    let dlq = unique_name("batch-dlq");
    let group = unique_name("g-batch-dlq");
    create_topic(&topic, 1);
    create_topic(&dlq, 1);
    let mut payloads = vec!["ok"; 20];
    payloads[5] = "fail";
    payloads[12] = "fail";
    produce_payloads(&topic, 0, &payloads);
    let ackd = faulty_batches(&topic, &group, 8)
        .env("ACKD_ON_FAILURE", "dead-letter")
        .env("ACKD_DEAD_LETTER_TOPIC", &dlq)
        .env("ACKD_STOP_AT_END", "true")
        .spawn();
    ackd.assert_exit(0, WAIT);
    let lines = ackd.lines();
    let dead: Vec<i64> = lines
        .iter()
        .filter(|l| at(l, "dead_lettered"))
        .map(|l| field(l, "offset").unwrap().parse().unwrap())
        .collect();
    assert_eq!(dead, vec![5, 12]);
    let expected: Vec<i64> = (0..20).filter(|o| !dead.contains(o)).collect();
    assert_eq!(processed_on(&lines, 0), expected);
    assert_committed(&group, &topic, 0, Some(20));
    let copies = read_back(&dlq, 2, WAIT);
    let sources: Vec<&str> = copies
        .iter()
        .map(|c| c.headers["ackd.source.offset"].as_str())
        .collect();
    assert_eq!(sources, ["5", "12"]);
    assert!(copies
        .iter()
        .all(|c| c.payload.as_deref() == Some(&b"fail"[..])));
    assert_eq!(copies[0].key.as_deref(), Some(&b"k-5"[..]));
}

/// One message, far from a full batch, is processed once the 200 ms wait is over: within
/// 10 s (room for a loaded machine), where a batcher that waited longer (for a commit, a
/// stop, a fuller batch) would not; no commit or stop comes in that time.
#[test]
fn a_batch_does_not_wait_for_messages_that_do_not_come() {
    let (topic, group) = fresh_topic("batch-wait", 1);
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "log")
        .env("ACKD_BATCH_MAX_MESSAGES", "500")
        .env("ACKD_BATCH_MAX_WAIT_MS", "200")
        .env("ACKD_COMMIT_INTERVAL_MS", "60000")
        .spawn();
    ackd.wait_for_line(|l| at(l, "assigned"), WAIT);
    produce_payloads(&topic, 0, &["alone"]);
    ackd.wait_for_line(is_processed, Duration::from_secs(10));
    ackd.stop(0, WAIT);
    assert_eq!(processed_on(&ackd.lines(), 0), vec![0]);
    assert_committed(&group, &topic, 0, Some(1));
}

#[test]
fn a_stop_while_a_batch_is_gathered_loses_nothing() {
    let (topic, group) = fresh_topic("batch-stop", 2);
    let delivered = produce_keyed(&topic, 6, 0);
    // Batches of 1000 waiting a minute: the six messages are gathered, never started.
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "log")
        .env("ACKD_BATCH_MAX_MESSAGES", "1000")
        .env("ACKD_BATCH_MAX_WAIT_MS", "60000")
        .spawn();
    ackd.wait_for_count(|l| at(l, "resumed"), log_ends(&delivered).len(), WAIT);
    ackd.stop(0, WAIT);
    assert!(
        processed(&ackd.lines()).is_empty(),
        "nothing was handed to the processor"
    );
    // Each partition's first commit, before its first call, names offset 0 (and the
    // dispatch limit): nothing past a message not processed.
    let before = committed(&group, &topic, 2);
    assert!(
        before.values().all(|c| *c == Some(0)),
        "nothing is committed for messages not processed: {before:?}"
    );
    // The next run gets them, each once.
    let again = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "log")
        .env("ACKD_BATCH_MAX_MESSAGES", "1000")
        .env("ACKD_BATCH_MAX_WAIT_MS", "0")
        .env("ACKD_STOP_AT_END", "true")
        .spawn();
    again.assert_exit(0, WAIT);
    let counts = processed_counts(&again.lines());
    assert_eq!(counts.len(), delivered.len());
    assert!(counts.values().all(|n| *n == 1), "{counts:?}");
    let ends: BTreeMap<i32, i64> = log_ends(&delivered);
    let after = committed(&group, &topic, 2);
    for (p, end) in ends {
        assert_eq!(after[&p], Some(end), "partition {p}");
    }
}

/// The processor gets `redelivered` and `attempt` on every message: a message failing
/// twice (`retry:2`) says false and 1, then true and 2 (in its failures' reasons); with `process` (batches of 1) and the default `process_batch` (batches of 8, where
/// the rest of the batch comes again with it). Produced once the partition is assigned:
/// no message can be a repeat on its first try.
#[test]
fn a_retried_message_says_it_is_redelivered_and_its_attempt() {
    for max in [1usize, 8] {
        let (topic, group) = fresh_topic(&format!("batch-attempt{max}"), 1);
        let ackd = faulty_batches(&topic, &group, max).spawn();
        ackd.wait_for_line(|l| at(l, "assigned"), WAIT);
        let mut payloads = vec!["ok"; 8];
        payloads[5] = "retry:2";
        produce_payloads(&topic, 0, &payloads);
        ackd.wait_for_count(is_processed, 8, WAIT);
        let lines = ackd.stop(0, WAIT);
        let errors: Vec<String> = all_at(&lines, "retry")
            .iter()
            .map(|l| field(l, "error").unwrap_or_default())
            .collect();
        assert_eq!(
            errors,
            [
                "retryable: attempt 1 of 2 failing (redelivered=false attempt=1)",
                "retryable: attempt 2 of 2 failing (redelivered=true attempt=2)",
            ],
            "batches of {max}"
        );
        assert_eq!(processed_on(&lines, 0), (0..8).collect::<Vec<_>>());
    }
}
