//! Delayed processing (`ACKD_DELAY_MS`) against the real broker: a message is processed
//! no earlier than its timestamp plus the delay, each once, and committed; a stop while
//! messages wait for their time exits at once and leaves them unstarted (the next owner
//! processes them unflagged); a bad value is a configuration error.
//!
//! Timestamps are set by the test's producer (CreateTime), so each message's due time
//! is known exactly; the test's clock at each per-message line is compared with it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::producer::FutureRecord;

use common::{ackd::*, broker::*, lines::*, offsets::*, produce::*, topics::*};

const WAIT: Duration = Duration::from_secs(60);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

/// Produces `n` messages to each of `partitions` partitions, each stamped `timestamp()`
/// (CreateTime, read as it is sent); returns each one's timestamp by (partition, offset).
fn produce_stamped(
    topic: &str,
    partitions: i32,
    n: usize,
    timestamp: impl Fn() -> i64,
) -> BTreeMap<(i32, i64), i64> {
    let producer = producer_on(broker());
    let mut stamped = BTreeMap::new();
    for i in 0..n {
        for p in 0..partitions {
            let key = format!("k-{p}-{i}");
            let ts = timestamp();
            let record = FutureRecord::to(topic)
                .partition(p)
                .key(key.as_bytes())
                .payload("v")
                .timestamp(ts);
            let d = futures::executor::block_on(producer.send(record, Duration::from_secs(10)))
                .map_err(|(e, _)| e)
                .unwrap_or_else(|e| panic!("produce to {topic}: {e}"));
            stamped.insert((d.partition, d.offset), ts);
        }
    }
    stamped
}

/// Per partition, one past the highest offset of `messages`.
fn ends(messages: impl IntoIterator<Item = (i32, i64)>) -> BTreeMap<i32, i64> {
    let mut ends = BTreeMap::new();
    for (p, o) in messages {
        let e = ends.entry(p).or_insert(o + 1);
        *e = (*e).max(o + 1);
    }
    ends
}

/// Produces while ackd (with `ACKD_DELAY_MS=1500` and `extra` settings) runs: every
/// message processed once, none before its timestamp plus 1.5 s, all committed.
fn each_message_waits_for_its_time(prefix: &str, extra: &[(&str, &str)]) {
    const DELAY_MS: i64 = 1500;
    let (topic, group) = fresh_topic(prefix, 2);
    let mut builder = AckdBuilder::new(&topic, &group).env("ACKD_DELAY_MS", DELAY_MS.to_string());
    for (k, v) in extra {
        builder = builder.env(*k, *v);
    }
    let ackd = builder.spawn();
    ackd.wait_for_count(|l| at(l, "assigned"), 2, WAIT);
    // The test's wall clock at a line: its arrival, on the monotonic clock, from here.
    let (anchor_ms, anchor) = (now_ms(), Instant::now());
    // Two rounds, so that messages arrive while earlier ones wait.
    let mut stamped = produce_stamped(&topic, 2, 10, now_ms);
    stamped.extend(produce_stamped(&topic, 2, 10, now_ms));
    ackd.wait_for_count(is_processed, stamped.len(), WAIT);
    let timed = ackd.timed_lines();
    let lines = ackd.stop(0, WAIT);

    let mut seen = BTreeSet::new();
    for (arrived, line) in timed.iter().filter(|(_, l)| is_processed(l)) {
        let p: i32 = field(line, "partition").unwrap().parse().unwrap();
        let o: i64 = field(line, "offset").unwrap().parse().unwrap();
        assert!(seen.insert((p, o)), "processed twice: {line}");
        let ts = stamped[&(p, o)];
        let at_ms = anchor_ms + arrived.duration_since(anchor).as_millis() as i64;
        // The early side tight (a few ms for the test's two clocks), the late side wide.
        assert!(
            at_ms + 5 >= ts + DELAY_MS,
            "processed {} ms early: {line}",
            ts + DELAY_MS - at_ms
        );
        assert!(
            at_ms <= ts + DELAY_MS + 15_000,
            "processed {} ms after its due time: {line}",
            at_ms - ts - DELAY_MS
        );
    }
    assert_eq!(
        seen,
        stamped.keys().copied().collect::<BTreeSet<_>>(),
        "processed != produced"
    );
    let committed = committed(&group, &topic, 2);
    for (p, end) in ends(stamped.keys().copied()) {
        assert_eq!(
            committed[&p],
            Some(end),
            "partition {p}:\n{}",
            lines.join("\n")
        );
    }
}

#[test]
fn each_message_is_processed_no_earlier_than_its_timestamp_plus_the_delay() {
    each_message_waits_for_its_time("delay", &[]);
}

#[test]
fn the_delay_holds_with_key_ordering_and_batches() {
    each_message_waits_for_its_time(
        "delay-key",
        &[
            ("ACKD_ORDERING", "key"),
            ("ACKD_BATCH_MAX_MESSAGES", "4"),
            ("ACKD_BATCH_MAX_WAIT_MS", "50"),
        ],
    );
    each_message_waits_for_its_time(
        "delay-batch",
        &[
            ("ACKD_BATCH_MAX_MESSAGES", "4"),
            ("ACKD_BATCH_MAX_WAIT_MS", "50"),
        ],
    );
}

/// A stop while messages wait for their time: exit 0 at once, what was processed is
/// committed, the waiting ones are not processed; the next owner processes them, not
/// flagged as possible repeats (no processor had them).
fn a_stop_releases_waiting_messages(prefix: &str, extra: &[(&str, &str)]) {
    let (topic, group) = fresh_topic(prefix, 2);
    let mut builder = AckdBuilder::new(&topic, &group)
        .env("ACKD_DELAY_MS", "60000")
        .env("RUST_LOG", "info,ackd::consumer::worker::task=debug");
    for (k, v) in extra {
        builder = builder.env(*k, *v);
    }
    let first = builder.spawn();
    // Assigned before anything is produced: no message of this run is flagged as one an
    // earlier owner may have had (a group's first run flags the log it finds), so every
    // flag the next run shows would be this run's.
    first.wait_for_count(|l| at(l, "assigned"), 2, WAIT);
    // Due long ago: processed at once.
    let old = produce_stamped(&topic, 2, 5, || now_ms() - 120_000);
    // Due in a minute: still waiting at the stop.
    let waiting = produce_stamped(&topic, 2, 5, now_ms);
    first.wait_for_count(is_processed, old.len(), WAIT);
    // Each partition's first not-yet-due message is read and waiting.
    first.wait_for_count(|l| at(l, "delay_wait"), 2, WAIT);
    let asked = Instant::now();
    let lines = first.stop(0, WAIT);
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the stop took {took:?}:\n{}",
        lines.join("\n")
    );
    let done: BTreeSet<_> = processed(&lines).into_iter().collect();
    assert_eq!(
        done,
        old.keys().copied().collect::<BTreeSet<_>>(),
        "{}",
        lines.join("\n")
    );
    let committed_first = committed(&group, &topic, 2);
    for (p, end) in ends(old.keys().copied()) {
        assert_eq!(committed_first[&p], Some(end), "partition {p}");
    }

    let second = AckdBuilder::new(&topic, &group).spawn();
    let got = second.wait_for_count(is_processed, waiting.len(), WAIT);
    let lines = second.stop(0, WAIT);
    let again: BTreeSet<_> = processed(&lines).into_iter().collect();
    assert_eq!(again, waiting.keys().copied().collect::<BTreeSet<_>>());
    for line in &got {
        assert_ne!(
            field(line, "redelivered").as_deref(),
            Some("true"),
            "{line}\nfirst run:\n{}\nsecond run:\n{}",
            first.lines().join("\n"),
            lines.join("\n")
        );
    }
    for (p, end) in ends(waiting.keys().copied()) {
        assert_committed(&group, &topic, p, Some(end));
    }
}

#[test]
fn a_stop_while_messages_wait_exits_at_once_and_leaves_them_unstarted() {
    a_stop_releases_waiting_messages("delay-stop", &[]);
}

#[test]
fn a_stop_while_messages_wait_with_key_ordering_leaves_them_unstarted() {
    a_stop_releases_waiting_messages("delay-stop-key", &[("ACKD_ORDERING", "key")]);
}

#[test]
fn a_bad_delay_is_a_configuration_error() {
    for bad in ["604800001", "-1", "1s"] {
        let ackd = AckdBuilder::without_broker("t", "g")
            .env("ACKD_DELAY_MS", bad)
            .spawn();
        let line = ackd.assert_config_error("ACKD_DELAY_MS", WAIT);
        assert!(line.contains("604800000"), "{line}");
    }
}
