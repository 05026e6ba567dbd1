//! What the broker does with ackd's commits, per partition, on a real Kafka broker:
//! a partition whose commit the broker refuses does not fail the commit of the others,
//! and the ones it accepted are logged and counted as committed.
//! (Metadata another client wrote: `tests/commit_metadata.rs`.)
//!
//! The broker limits commit metadata to 28 bytes (`offset.metadata.max.bytes`), and
//! ackd's dispatch limit runs 1000 messages ahead (`ACKD_REDELIVERY_WINDOW_MAX=1000`):
//! ackd's `ackd/3:o=O;p=H;l=L;end` (`;r` before `end` on a release) fits while O < 100,
//! and is refused with OFFSET_METADATA_TOO_LARGE for that partition alone once O >= 100
//! (a per-partition refusal from a real broker, as a deleted topic or a topic-level ACL
//! would give). ackd then commits that partition without metadata (the offset matters
//! more than the metadata), and the next owner flags conservatively.

mod common;

use std::time::{Duration, Instant};

use common::{
    ackd::AckdBuilder,
    broker::{broker_keeping_metadata, Broker},
    lines::{at, field, is_processed, processed},
    offsets::{committed, committed_raw_metadata_on, without_limit},
    produce::produce_records,
    topics::fresh_topic,
};

const WAIT: Duration = Duration::from_secs(90);

/// The longest metadata the test broker keeps.
const METADATA_MAX: usize = 28;

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
fn a_partition_whose_metadata_the_broker_refuses_is_committed_without_it_alone() {
    kafka();
    let (topic, group) = fresh_topic("per-partition", 2);
    // Partition 0: offsets 0..=7, metadata up to "ackd/3:o=8;p=7;l=1007;r;end" (27 bytes).
    // Partition 1: offsets 0..=119, metadata "ackd/3:o=120;p=119;l=1119;end" (29 bytes).
    produce_to(&topic, 0, 5);
    produce_to(&topic, 1, 120);
    assert!(metadata_len(8, true) <= METADATA_MAX && metadata_len(120, false) > METADATA_MAX);

    let started = Instant::now();
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_COMMIT_INTERVAL_MS", "200")
        .env("ACKD_REDELIVERY_WINDOW_MAX", "1000")
        .spawn();
    ackd.wait_for_count(is_processed, 125, WAIT);
    // (Its first commit, before the first call, names offset 0 and the dispatch limit.)
    ackd.wait_for_line(
        |l| on(l, "committed", 0) && field(l, "offset").as_deref() == Some("5"),
        WAIT,
    );
    // Partition 1's metadata is refused once: committed again at once without it.
    let refused = ackd.wait_for_line(|l| on(l, "commit_metadata_refused", 1), WAIT);
    ackd.wait_for_line(
        |l| on(l, "committed", 1) && field(l, "offset").as_deref() == Some("120"),
        WAIT,
    );
    assert_eq!(
        committed(&group, &topic, 2),
        [(0, Some(5)), (1, Some(120))].into()
    );

    // New messages on partition 0 are committed, with their metadata.
    produce_to(&topic, 0, 3);
    ackd.wait_for_line(
        |l| on(l, "committed", 0) && field(l, "offset").as_deref() == Some("8"),
        WAIT,
    );
    let lines = ackd.stop(0, WAIT);
    let all = lines.join("\n");
    assert!(
        !lines.iter().any(|l| at(l, "commit_failed")),
        "a commit failed:\n{all}"
    );
    assert!(
        !lines.iter().any(|l| on(l, "commit_metadata_refused", 0)),
        "partition 0's metadata fits:\n{all}"
    );
    // Each accepted offset is committed once: partition 0 is not sent again with 1's.
    let commits_0: Vec<i64> = lines
        .iter()
        .filter(|l| on(l, "committed", 0) && field(l, "reason").as_deref() == Some("periodic"))
        .filter_map(|l| field(l, "offset")?.parse().ok())
        .collect();
    assert!(
        commits_0.contains(&5)
            && commits_0.last() == Some(&8)
            && commits_0.windows(2).all(|w| w[0] <= w[1]),
        "partition 0 committed {commits_0:?}:\n{all}"
    );
    let bootstrap = kafka().bootstrap();
    let (offset_0, metadata_0) = committed_raw_metadata_on(&bootstrap, &group, &topic, 0);
    let (offset_1, metadata_1) = committed_raw_metadata_on(&bootstrap, &group, &topic, 1);
    let metadata_0 = String::from_utf8(metadata_0).unwrap();
    assert_eq!(
        (offset_0, without_limit(&metadata_0).0.as_str()),
        (Some(8), "ackd/3:o=8;p=7;r;end")
    );
    assert_eq!((offset_1, metadata_1), (Some(120), Vec::new()));
    eprintln!(
        "per-partition: 128 messages processed {} times, partition 0 committed at {commits_0:?} with metadata {metadata_0:?}, \
         partition 1's metadata refused ({}) and committed at 120 without it, exit 0, {:?}",
        processed(&lines).len(),
        field(&refused, "offset").unwrap_or_default(),
        started.elapsed()
    );
}

/// The length of ackd's commit metadata for committed offset `o` (all processed below
/// it, the dispatch limit 1000 above the last read), `released` or not.
fn metadata_len(o: i64, released: bool) -> usize {
    let r = if released { ";r" } else { "" };
    format!("ackd/3:o={o};p={};l={}{r};end", o - 1, o - 1 + 1000).len()
}
