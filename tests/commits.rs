//! What the broker does with ackd's commits, per partition, on a real Kafka broker:
//! a partition whose commit the broker refuses does not fail the commit of the others,
//! and the ones it accepted are logged and counted as committed (issue 13, item 9).
//! (Metadata another client wrote: `tests/commit_metadata.rs`.)
//!
//! The broker limits commit metadata to 20 bytes (`offset.metadata.max.bytes`): ackd's
//! `ackd/2:o=O;p=H;end` (`;r` before `end` on a release) fits while O < 100, and is refused
//! with OFFSET_METADATA_TOO_LARGE for that partition alone once O >= 100. That is a per-partition refusal from a real broker,
//! as a deleted topic or a topic-level ACL would give.

mod common;

use std::time::{Duration, Instant};

use common::{
    ackd::AckdBuilder,
    broker::{broker_keeping_metadata, Broker},
    lines::{at, field, is_processed, processed},
    offsets::committed,
    produce::produce_records,
    topics::fresh_topic,
};

const WAIT: Duration = Duration::from_secs(90);

/// The longest metadata the test broker keeps.
const METADATA_MAX: usize = 20;

fn kafka() -> &'static Broker {
    broker_keeping_metadata(METADATA_MAX)
}

/// Produces `n` messages to `partition` of `topic`.
fn produce_to(topic: &str, partition: i32, n: usize) {
    let value = vec![b'.'; 50];
    let records: Vec<_> = (0..n)
        .map(|_| (partition, None, value.as_slice(), &[][..]))
        .collect();
    produce_records(topic, &records);
}

fn on(line: &str, what: &str, partition: i32) -> bool {
    at(line, what) && field(line, "partition").as_deref() == Some(&partition.to_string())
}

#[test]
fn a_partition_the_broker_refuses_does_not_fail_the_others() {
    kafka();
    let (topic, group) = fresh_topic("per-partition", 2);
    // Partition 0: offsets 0..=7, metadata up to "ackd/2:o=8;p=7;r;end" (20 bytes): accepted.
    // Partition 1: offsets 0..=119, metadata "ackd/2:o=120;p=119;end" (22 bytes): refused.
    produce_to(&topic, 0, 5);
    produce_to(&topic, 1, 120);
    assert!(
        committer_metadata_len(8, true) <= METADATA_MAX
            && committer_metadata_len(100, false) > METADATA_MAX
    );

    let started = Instant::now();
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_COMMIT_INTERVAL_MS", "200")
        .spawn();
    ackd.wait_for_count(is_processed, 125, WAIT);
    // Partition 0 is committed although every commit it went out with also carried the
    // refused partition 1.
    let committed_line = ackd.wait_for_line(|l| on(l, "committed", 0), WAIT);
    assert_eq!(field(&committed_line, "offset").as_deref(), Some("5"));
    // Partition 1 goes on being refused, each time alone: partition 0 is done.
    let refused = ackd.wait_for_count(|l| on(l, "commit_failed", 1), 3, WAIT);
    assert!(
        refused[0].contains("too large") || refused[0].contains("TooLarge"),
        "{}",
        refused[0]
    );
    assert_eq!(
        committed(&group, &topic, 2),
        [(0, Some(5)), (1, None)].into()
    );

    // New messages on partition 0 are committed while partition 1 still fails.
    produce_to(&topic, 0, 3);
    ackd.wait_for_line(
        |l| on(l, "committed", 0) && field(l, "offset").as_deref() == Some("8"),
        WAIT,
    );
    ackd.sigterm();
    // Incomplete: partition 1's final commit is refused too.
    let code = ackd.wait_exit(WAIT);
    let lines = ackd.lines();
    let all = lines.join("\n");
    assert_eq!(code, 1, "{all}");
    assert!(
        !lines.iter().any(|l| on(l, "commit_failed", 0)),
        "a partition the broker accepted is logged as failed:\n{all}"
    );
    // Each accepted offset is committed once: partition 0 is not sent again with 1's.
    // (The stop commits its offset once more, to mark the partition released: that one
    // is the final commit, checked below.)
    let commits_0: Vec<i64> = lines
        .iter()
        .filter(|l| on(l, "committed", 0) && field(l, "reason").as_deref() == Some("periodic"))
        .filter_map(|l| field(l, "offset")?.parse().ok())
        .collect();
    assert!(
        commits_0.first() == Some(&5)
            && commits_0.last() == Some(&8)
            && commits_0.windows(2).all(|w| w[0] < w[1]),
        "partition 0 committed {commits_0:?}:\n{all}"
    );
    let final_0 = lines
        .iter()
        .find(|l| on(l, "final_commit", 0))
        .unwrap_or_else(|| panic!("no final_commit for partition 0:\n{all}"));
    assert_eq!(field(final_0, "offset").as_deref(), Some("8"), "{final_0}");
    // Partition 1's acknowledged offset is reported as not committed, not as "nothing
    // acknowledged".
    assert!(
        !lines.iter().any(|l| on(l, "final_commit", 1)),
        "partition 1 was never committed:\n{all}"
    );
    let not_committed_1 = lines
        .iter()
        .find(|l| on(l, "not_committed", 1))
        .unwrap_or_else(|| panic!("no not_committed line for partition 1:\n{all}"));
    assert_eq!(
        field(not_committed_1, "acked_offset").as_deref(),
        Some("120"),
        "{not_committed_1}"
    );
    let failed_1 = lines.iter().filter(|l| on(l, "commit_failed", 1)).count();
    assert_eq!(
        committed(&group, &topic, 2),
        [(0, Some(8)), (1, None)].into()
    );
    eprintln!(
        "per-partition: 128 messages processed {} times, partition 0 committed at {commits_0:?}, partition 1 refused {failed_1} times, exit {code}, {:?}",
        processed(&lines).len(),
        started.elapsed()
    );
}

/// The length of ackd's commit metadata for committed offset `o` (all processed below
/// it), `released` or not.
fn committer_metadata_len(o: i64, released: bool) -> usize {
    let r = if released { ";r" } else { "" };
    format!("ackd/2:o={o};p={}{r};end", o - 1).len()
}
