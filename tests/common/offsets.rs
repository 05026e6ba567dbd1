//! Log ends and committed offsets (read, asserted, and committed raw) of a group.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::{broker::*, produce::*};

/// Per partition, the log end offset (max delivered offset + 1), from the producer's
/// delivery reports: the ground truth of what the broker holds.
pub fn log_ends(delivered: &[Delivered]) -> BTreeMap<i32, i64> {
    let mut ends = BTreeMap::new();
    for d in delivered {
        let e = ends.entry(d.partition).or_insert(0);
        *e = (*e).max(d.offset + 1);
    }
    ends
}

/// Asserts that `group` has committed every partition of `topic` (of `partitions`) at
/// its log end in `ends` (from [`log_ends`]): everything delivered was acknowledged.
#[track_caller]
pub fn assert_committed_to_ends(
    group: &str,
    topic: &str,
    partitions: i32,
    ends: &BTreeMap<i32, i64>,
) {
    let committed = committed(group, topic, partitions);
    for (p, end) in ends {
        assert_eq!(committed[p], Some(*end), "partition {p}");
    }
}

/// The committed offset of `group` on `topic`/`partition` (None where nothing is committed).
pub fn committed_offset(group: &str, topic: &str, partition: i32) -> Option<i64> {
    committed(group, topic, partition + 1)[&partition]
}

/// Asserts that `group`'s committed offset on `topic`/`partition` is `expected`.
#[track_caller]
pub fn assert_committed(group: &str, topic: &str, partition: i32, expected: Option<i64>) {
    assert_eq!(
        committed_offset(group, topic, partition),
        expected,
        "committed offset of group {group} on {topic}/{partition}"
    );
}

/// Committed offsets of `group` for partitions `0..partitions` of `topic`
/// (None where nothing is committed). Uses a consumer that never subscribes.
pub fn committed(group: &str, topic: &str, partitions: i32) -> BTreeMap<i32, Option<i64>> {
    committed_with(
        &broker().bootstrap(),
        broker().client_properties(),
        group,
        topic,
        partitions,
    )
}

/// [`committed`] on the brokers at `bootstrap`.
pub fn committed_on(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, Option<i64>> {
    committed_with(bootstrap, &[], group, topic, partitions)
}

/// [`committed`] on a cluster of the test's own, with its client properties (TLS, SASL).
pub fn committed_at(
    b: &Broker,
    group: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, Option<i64>> {
    committed_with(
        &b.bootstrap(),
        b.client_properties(),
        group,
        topic,
        partitions,
    )
}

fn committed_with(
    bootstrap: &str,
    extra: &[(String, String)],
    group: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, Option<i64>> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    for (k, v) in extra {
        config.set(k, v);
    }
    let consumer: BaseConsumer = config.create().expect("create committed-offsets consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    // The group's coordinator may be moving (a node restarting) or loading: the answer
    // then is an error that says to ask again, which librdkafka hands back as it is.
    let deadline = Instant::now() + Duration::from_secs(30);
    let tpl = loop {
        match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
            Ok(tpl) => break tpl,
            Err(e) if is_coordinator_moving(&e) && Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(100))
            }
            Err(e) => panic!("committed offsets of group {group} on {topic}: {e}"),
        }
    };
    tpl.elements()
        .iter()
        .map(|e| {
            let offset = match e.offset() {
                Offset::Offset(o) => Some(o),
                Offset::Invalid => None,
                other => panic!(
                    "unexpected committed offset {other:?} for {topic}/{}",
                    e.partition()
                ),
            };
            (e.partition(), offset)
        })
        .collect()
}

/// Commits `offset` for `topic`/`partition` in `group` on the (plaintext) brokers at
/// `bootstrap` with `metadata` as raw bytes (not necessarily UTF-8), from a consumer that
/// never subscribes, as a client in another language could: rust-rdkafka's
/// `set_metadata` takes only `&str`, so this sets librdkafka's `metadata` field through
/// the C API.
pub fn commit_raw_metadata_on(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partition: i32,
    offset: i64,
    metadata: &[u8],
) {
    use rdkafka::consumer::CommitMode;
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false");
    let consumer: BaseConsumer = config.create().expect("create committing consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))
        .expect("offset");
    // SAFETY: the list has one element, with no metadata yet; librdkafka frees the
    // malloc'd copy with the list.
    unsafe {
        let e = &mut *(*tpl.ptr()).elems;
        let buf = libc::malloc(metadata.len().max(1));
        assert!(!buf.is_null());
        std::ptr::copy_nonoverlapping(metadata.as_ptr(), buf.cast::<u8>(), metadata.len());
        e.metadata = buf;
        e.metadata_size = metadata.len();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match consumer.commit(&tpl, CommitMode::Sync) {
            Ok(()) => return,
            Err(e) if is_coordinator_moving(&e) && Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(100))
            }
            Err(e) => panic!("commit {topic}/{partition} for group {group}: {e}"),
        }
    }
}

/// The committed offset of `group` on `topic`/`partition` at the (plaintext) brokers at
/// `bootstrap`, and its metadata as the raw bytes the broker returned (rust-rdkafka's
/// `metadata()` panics when they are not UTF-8).
pub fn committed_raw_metadata_on(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partition: i32,
) -> (Option<i64>, Vec<u8>) {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group);
    let consumer: BaseConsumer = config.create().expect("create committed-offsets consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let got = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("committed offsets of group {group} on {topic}: {e}"));
    // SAFETY: one element, as asked; its metadata is `metadata_size` bytes (or null).
    let metadata = unsafe {
        let e = &*(*got.ptr()).elems;
        if e.metadata.is_null() {
            Vec::new()
        } else {
            std::slice::from_raw_parts(e.metadata.cast::<u8>(), e.metadata_size).to_vec()
        }
    };
    let offset = match got.elements()[0].offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    };
    (offset, metadata)
}

/// True for the errors a group's coordinator answers while it moves or loads.
pub fn is_coordinator_moving(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::CoordinatorLoadInProgress
                | RDKafkaErrorCode::CoordinatorNotAvailable
        )
    )
}

/// Commit metadata without its `l=` dispatch limit (which follows the partition's rate),
/// and that limit.
pub fn without_limit(m: &str) -> (String, Option<i64>) {
    let Some(at) = m.find(";l=") else {
        return (m.to_string(), None);
    };
    let rest = &m[at + 3..];
    let end = rest.find(';').unwrap_or(rest.len());
    (
        format!("{}{}", &m[..at], &rest[end..]),
        rest[..end].parse().ok(),
    )
}
