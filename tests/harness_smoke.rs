//! Proves the test harness (tests/common) against the real broker (Apache Kafka).
//! Test names start with `harness_smoke` so that `scripts/test harness_smoke` selects them.

mod common;

use std::collections::BTreeMap;
use std::time::Instant;

use common::{broker::*, lines::*, offsets::*, produce::*, topics::*};

#[test]
fn harness_smoke_broker_topic_produce_committed() {
    let t0 = Instant::now();
    let b = broker();
    let started = t0.elapsed();
    assert!(b.bootstrap().starts_with("127.0.0.1:"));
    // Same broker for the whole binary.
    assert_eq!(broker().port(), b.port());

    let topic = unique_name("smoke");
    create_topic(&topic, 3);

    let t1 = Instant::now();
    let delivered = produce_keyed(&topic, 30, 0);
    let produced = t1.elapsed();
    eprintln!("broker start {started:?}, produce of 30 messages {produced:?}");

    assert_eq!(delivered.len(), 30);
    for (i, d) in delivered.iter().enumerate() {
        assert_eq!(d.key.as_deref(), Some(format!("k-{i}").as_bytes()));
        assert!((0..3).contains(&d.partition), "partition {}", d.partition);
    }

    // Per partition, the offsets are exactly 0..n (contiguous, no gaps, no duplicates).
    let mut by_partition: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for d in &delivered {
        by_partition.entry(d.partition).or_default().push(d.offset);
    }
    assert!(
        by_partition.len() > 1,
        "keys all hashed to one partition: {by_partition:?}"
    );
    for (p, offsets) in &by_partition {
        let mut sorted = offsets.clone();
        sorted.sort_unstable();
        let expected: Vec<i64> = (0..offsets.len() as i64).collect();
        assert_eq!(sorted, expected, "partition {p} offsets");
        assert_eq!(
            offsets, &sorted,
            "partition {p} reports out of produce order"
        );
    }

    let ends = log_ends(&delivered);
    assert_eq!(ends.values().sum::<i64>(), 30);
    for (p, offsets) in &by_partition {
        assert_eq!(ends[p], offsets.len() as i64);
    }

    // Same key, same partition; a second batch continues the offsets.
    let again = produce_keyed(&topic, 30, 0);
    for (a, d) in again.iter().zip(&delivered) {
        assert_eq!(a.partition, d.partition, "key {:?} moved", d.key);
    }
    let ends2 = log_ends(&again);
    for (p, end) in &ends {
        assert_eq!(ends2[p], 2 * end, "partition {p}");
    }

    // A fresh group has nothing committed.
    let group = unique_name("smoke-group");
    let c = committed(&group, &topic, 3);
    assert_eq!(c, (0..3).map(|p| (p, None)).collect::<BTreeMap<_, _>>());

    b.assert_running();
}

#[test]
fn harness_smoke_produce_unkeyed_and_explicit() {
    let topic = unique_name("smoke-explicit");
    create_topic(&topic, 1);
    let delivered = produce(
        &topic,
        &[
            (None, b"a".to_vec()),
            (Some(b"key".to_vec()), b"b".to_vec()),
            (None, Vec::new()),
        ],
    );
    let offsets: Vec<_> = delivered.iter().map(|d| (d.partition, d.offset)).collect();
    assert_eq!(offsets, vec![(0, 0), (0, 1), (0, 2)]);
    assert_eq!(delivered[1].key.as_deref(), Some(&b"key"[..]));
    assert_eq!(log_ends(&delivered), BTreeMap::from([(0, 3)]));
}

#[test]
fn harness_smoke_unique_names() {
    let a = unique_name("x");
    let b = unique_name("x");
    assert_ne!(a, b);
    assert!(a.starts_with("x-"));
    assert!(a
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'));
}

#[test]
fn harness_smoke_logfmt_field() {
    let line = "count#ackd.messages.processed=1 source=t1 topic=t1 partition=0 offset=41 key=k-7";
    assert_eq!(
        field(line, "count#ackd.messages.processed").as_deref(),
        Some("1")
    );
    assert_eq!(field(line, "partition").as_deref(), Some("0"));
    assert_eq!(field(line, "offset").as_deref(), Some("41"));
    assert_eq!(field(line, "key").as_deref(), Some("k-7"));
    assert_eq!(field(line, "missing"), None);

    let line = r#"at=error msg="broker said \"no\" to C:\\tmp" topic=t1 empty="" flag"#;
    assert_eq!(field(line, "at").as_deref(), Some("error"));
    assert_eq!(
        field(line, "msg").as_deref(),
        Some(r#"broker said "no" to C:\tmp"#)
    );
    assert_eq!(field(line, "topic").as_deref(), Some("t1"));
    assert_eq!(field(line, "empty").as_deref(), Some(""));
    assert_eq!(field(line, "flag").as_deref(), Some(""));

    // A key=value inside a quoted value is not a field.
    let line = r#"at=warn msg="offset=99 partition=7" offset=3"#;
    assert_eq!(field(line, "offset").as_deref(), Some("3"));
    assert_eq!(field(line, "partition"), None);

    // Prefixes without '=' (timestamps, levels) are skipped over.
    let line = "2024-01-01T00:00:00Z INFO at=exit code=0 duration_ms=123";
    assert_eq!(field(line, "code").as_deref(), Some("0"));
    assert_eq!(field(line, "duration_ms").as_deref(), Some("123"));
}

#[test]
fn harness_smoke_processed_lines() {
    let lines: Vec<String> = [
        "at=assigned topic=t1 partition=0 offset=12 from=committed",
        "count#ackd.messages.processed=1 source=t1 topic=t1 partition=0 offset=12 key=k-1",
        "count#ackd.messages.processed=1 source=t1 topic=t1 partition=2 offset=5 key=k-2",
        "at=committed topic=t1 partition=0 offset=13",
        "count#ackd.messages.processed=10 source=t1",
        "count#ackd.messages.processed=1 source=t1 topic=t1 partition=0 offset=12 key=k-1",
        "at=exit code=0 duration_ms=123",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(processed(&lines), vec![(0, 12), (2, 5), (0, 12)]);
    let counts = processed_counts(&lines);
    assert_eq!(counts[&(0, 12)], 2);
    assert_eq!(counts[&(2, 5)], 1);
}
