//! On Apache Kafka: with concurrent ordering, the offsets acknowledged
//! above the committed one travel in the commit's metadata (`;a=`, relative to the
//! committed offset), and after a SIGKILL the next owner skips them: only the messages
//! that were in flight come again.
//!
//! Messages stuck in flight are the testkit's `faulty` processor's `retry:1` payloads with
//! a retry wait of minutes: their key waits, the other keys go on and finish above them.
//!
//! This binary's broker keeps at most 300 bytes of commit metadata
//! (`offset.metadata.max.bytes`; Kafka's default is 4,096): enough for the first test's
//! ranges, not for the second's, whose commits the broker refuses until ackd writes fewer
//! ranges (`at=commit_metadata_dropped`): redelivery instead, never a lost commit.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{
    accounting::*, ackd::*, broker::*, lines::*, offsets::*, produce::*, topics::*, wait::*,
};

const WAIT: Duration = Duration::from_secs(90);
const METADATA_MAX: usize = 300;

fn kafka() -> &'static Broker {
    broker_keeping_metadata(METADATA_MAX)
}

/// Keyed messages at offsets `from..to` of a one-partition topic; those at `stuck`
/// offsets say `retry:1`, each with a key of its own (so only it waits).
fn produce_with_stuck(topic: &str, from: i64, to: i64, stuck: &BTreeSet<i64>) -> Vec<Delivered> {
    let messages: Vec<(Option<Vec<u8>>, Vec<u8>)> = (from..to)
        .map(|i| {
            if stuck.contains(&i) {
                (Some(format!("stuck-{i}").into_bytes()), b"retry:1".to_vec())
            } else {
                (Some(format!("k{}", i % 37).into_bytes()), b"ok".to_vec())
            }
        })
        .collect();
    let delivered = produce(topic, &messages);
    let offsets: Vec<i64> = delivered.iter().map(|d| d.offset).collect();
    assert_eq!(
        offsets,
        (from..to).collect::<Vec<_>>(),
        "one partition, in order"
    );
    delivered
}

/// A member with key ordering whose `retry:1` messages wait `retry_ms` before their retry.
fn member(topic: &str, group: &str, retry_ms: u64) -> AckdProcess {
    AckdBuilder::new(topic, group)
        .env("ACKD_PROCESSOR", "faulty")
        .env("ACKD_ORDERING", "key")
        .env("ACKD_CONCURRENCY", "64")
        .env("ACKD_COMMIT_INTERVAL_MS", "200")
        .env("ACKD_RETRY_INITIAL_MS", retry_ms.to_string())
        .env("ACKD_RETRY_MAX_MS", retry_ms.to_string())
        .spawn()
}

fn stored(group: &str, topic: &str) -> (Option<i64>, String) {
    let (offset, raw) = committed_raw_metadata_on(&kafka().bootstrap(), group, topic, 0);
    (
        offset,
        // The dispatch limit follows the rate: not compared.
        without_limit(&String::from_utf8(raw).expect("ackd's metadata is UTF-8")).0,
    )
}

/// The absolute offsets an `acked=` value relative to `committed` names (the harness's
/// own reading of the documented format).
fn acked_offsets(committed: i64, metadata: &str) -> BTreeSet<i64> {
    let Some(value) = metadata.split(';').find_map(|f| f.strip_prefix("a=")) else {
        return BTreeSet::new();
    };
    value
        .split(',')
        .flat_map(|item| {
            let (a, b) = item.split_once('-').unwrap_or((item, item));
            let (a, b): (i64, i64) = (a.parse().unwrap(), b.parse().unwrap());
            committed + a..=committed + b
        })
        .collect()
}

struct Crash {
    /// `ackd status`'s line between the kill and the restart.
    status: String,
    delivered: Vec<Delivered>,
    killed: Vec<String>,
    next: Vec<String>,
    /// The committed offset and metadata the killed process left.
    committed: i64,
    metadata: String,
}

/// Runs a member until everything but the `stuck` messages is processed and the group's
/// commit metadata says `until`, SIGKILLs it, and runs the next member (short retry wait)
/// until every message is processed; stops it with SIGTERM. The messages come in two
/// halves, the second once a commit with ranges stored the first: the committed offset
/// stays at the first stuck message while the ranges above it grow, so the ranges of
/// the second half reach the broker only in commits of the same offset again.
fn crash_and_resume(
    n: i64,
    stuck: &BTreeSet<i64>,
    until: impl Fn(&(Option<i64>, String)) -> bool,
) -> Crash {
    kafka();
    let (topic, group) = fresh_topic("acked-meta", 1);
    let first_stuck = *stuck.first().unwrap();
    let mut delivered = produce_with_stuck(&topic, 0, n / 2, stuck);

    let killed = member(&topic, &group, 600_000);
    wait_until(WAIT, || {
        let (o, m) = stored(&group, &topic);
        o == Some(first_stuck) && m.contains(";a=")
    });
    delivered.extend(produce_with_stuck(&topic, n / 2, n, stuck));
    killed.wait_for_count(is_processed, (n as usize) - stuck.len(), WAIT);
    wait_until(WAIT, || until(&stored(&group, &topic)));
    killed.sigkill();
    killed.assert_exit(128 + libc::SIGKILL, WAIT);
    let (committed, metadata) = stored(&group, &topic);
    let committed = committed.expect("a committed offset");
    // `ackd status` reads the same metadata.
    let status = AckdBuilder::new(&topic, &group).arg("status").spawn();
    status.assert_exit(0, WAIT);
    let status = status.lines();
    let status = status
        .iter()
        .find(|l| at(l, "status"))
        .expect("a status line");

    let next = member(&topic, &group, 20);
    wait_until(WAIT, || {
        let mut seen: BTreeSet<i64> = processed(&killed.lines()).iter().map(|m| m.1).collect();
        seen.extend(processed(&next.lines()).iter().map(|m| m.1));
        seen.len() == n as usize
    });
    next.stop(0, WAIT);
    assert_eq!(
        stored(&group, &topic).0,
        Some(n),
        "the stop commits the end"
    );
    Crash {
        status: status.clone(),
        delivered,
        killed: killed.lines(),
        next: next.lines(),
        committed,
        metadata,
    }
}

impl Crash {
    /// Checks what the next member skipped, processed and said; returns (skipped,
    /// redelivered).
    fn check(&self, n: i64) -> (usize, usize) {
        let skipped = acked_offsets(self.committed, &self.metadata);
        let assigned = self
            .next
            .iter()
            .find(|l| at(l, "assigned"))
            .expect("an assigned line");
        assert_eq!(
            field(assigned, "offset").and_then(|o| o.parse().ok()),
            Some(self.committed),
            "{assigned}"
        );
        assert_eq!(
            field(assigned, "acked_above").and_then(|o| o.parse().ok()),
            Some(skipped.len()),
            "{assigned}"
        );
        assert_eq!(
            field(&self.status, "acked_above").and_then(|o| o.parse().ok()),
            Some(skipped.len()),
            "{}",
            self.status
        );
        let resume_skipped = self.next.iter().find(|l| at(l, "resume_skipped"));
        assert_eq!(
            resume_skipped.and_then(|l| field(l, "skipped")?.parse().ok()),
            Some(skipped.len()),
            "{resume_skipped:?}"
        );
        // The next member processes exactly what is at or above the commit and not
        // skipped: nothing it was told was acknowledged, everything it was not.
        let again: BTreeSet<i64> = processed(&self.next).iter().map(|m| m.1).collect();
        let expected: BTreeSet<i64> = (self.committed..n)
            .filter(|o| !skipped.contains(o))
            .collect();
        assert_eq!(again, expected, "metadata {:?}", self.metadata);
        let all: Vec<(i32, i64)> = processed(&self.killed)
            .into_iter()
            .chain(processed(&self.next))
            .collect();
        let lines: Vec<String> = self.killed.iter().chain(&self.next).cloned().collect();
        let t = tally(&self.delivered, &all, &lines);
        assert!(t.lost.is_empty(), "lost {:?}", t.lost);
        (skipped.len(), t.duplicated.len())
    }
}

/// Only the messages in flight at the kill (the stuck ones) are processed again; the
/// acknowledged ones above the commit are skipped, and the resume says how many.
#[test]
fn after_a_sigkill_only_the_messages_in_flight_are_processed_again() {
    const N: i64 = 300;
    let stuck: BTreeSet<i64> = [10, 150].into();
    // Committed 10 (10 is in flight), acked 11..=149 and 151..=299, relative 1-139,141-289.
    let want = "ackd/3:o=10;p=299;a=1-139,141-289;end";
    let crash = crash_and_resume(N, &stuck, |(o, m)| *o == Some(10) && m == want);
    assert_eq!((crash.committed, crash.metadata.as_str()), (10, want));
    let (skipped, redelivered) = crash.check(N);
    assert_eq!(skipped, 288);
    // The stuck messages failed their first attempt in the killed process: they were
    // never processed there, so none is counted twice.
    assert_eq!(redelivered, 0);
    let again = processed(&crash.next).len();
    assert_eq!(again, stuck.len());
    eprintln!(
        "acked metadata: {N} messages, key ordering, concurrency 64, SIGKILL with {} in flight: \
         committed {}, skipped {skipped}, processed again {again}, duplicated {redelivered}, lost 0",
        stuck.len(),
        crash.committed
    );
}

/// Ranges too long for the broker (`offset.metadata.max.bytes`=300): the commit is made
/// again without them, later commits carry fewer ranges, and after a SIGKILL what the
/// metadata kept is skipped and everything else from the commit on is processed again.
#[test]
fn ranges_the_broker_refuses_cost_redelivery_never_a_commit() {
    const N: i64 = 600;
    // 50 stuck messages, 8 apart: "1-7,9-15,...,385-391,393-595": some 360 bytes of ranges.
    let stuck: BTreeSet<i64> = (0..50).map(|i| 5 + 8 * i).collect();
    let crash = crash_and_resume(N, &stuck, |(o, m)| {
        *o == Some(5) && m.contains(";a=") && m.starts_with("ackd/3:o=5;p=599;")
    });
    assert!(crash.metadata.len() <= METADATA_MAX, "{}", crash.metadata);
    let dropped: Vec<&String> = crash
        .killed
        .iter()
        .filter(|l| at(l, "commit_metadata_dropped"))
        .collect();
    assert!(!dropped.is_empty(), "no commit_metadata_dropped line");
    assert!(
        !crash.killed.iter().any(|l| at(l, "commit_failed")),
        "a commit was lost:\n{}",
        crash.killed.join("\n")
    );
    let (skipped, redelivered) = crash.check(N);
    let in_range = (crash.committed..N).count();
    assert!(skipped > 0 && skipped < in_range - stuck.len(), "{skipped}");
    let again = processed(&crash.next).len();
    eprintln!(
        "acked metadata over the broker's limit ({METADATA_MAX} bytes): {} commit_metadata_dropped, kept {:?} ({} bytes); \
         {N} messages, {} stuck, committed {}, skipped {skipped}, processed again {again}, duplicated {redelivered}, lost 0",
        dropped.len(),
        crash.metadata,
        crash.metadata.len(),
        stuck.len(),
        crash.committed,
    );
}

/// A committed offset past the log's end (a truncated log: unclean leader election, or
/// an offset committed by hand) is out of range and the start policy resets it to the
/// log's start: the offsets the metadata named are not the messages that will be there
/// then. They are processed, never skipped.
#[test]
fn after_a_reset_back_the_ranges_of_the_old_commit_skip_nothing() {
    kafka();
    let (topic, group) = fresh_topic("acked-reset", 1);
    let none = BTreeSet::new();
    let mut delivered = produce_with_stuck(&topic, 0, 5, &none);
    // Committed 10, acknowledged 12..=15: none of it exists yet.
    commit_raw_metadata_on(
        &kafka().bootstrap(),
        &group,
        &topic,
        0,
        10,
        b"ackd/2:o=10;p=15;a=2-5;end",
    );
    let ackd = member(&topic, &group, 20);
    let assigned = ackd.wait_for_line(|l| at(l, "assigned"), WAIT);
    assert_eq!(
        field(&assigned, "acked_above").as_deref(),
        Some("4"),
        "{assigned}"
    );
    let reset = ackd.wait_for_line(|l| at(l, "offset_reset"), WAIT);
    assert_eq!(field(&reset, "to").as_deref(), Some("0"), "{reset}");
    ackd.wait_for_count(is_processed, 5, WAIT);
    // Offsets 5..=19 arrive after the reset: 12 to 15 among them, new messages.
    delivered.extend(produce_with_stuck(&topic, 5, 20, &none));
    ackd.wait_for_count(is_processed, 20, WAIT);
    let lines = ackd.stop(0, WAIT);
    let t = tally(&delivered, &processed(&lines), &lines);
    assert!(t.lost.is_empty() && t.duplicated.is_empty(), "{:?}", t.lost);
    assert!(
        !lines.iter().any(|l| at(l, "resume_skipped")),
        "{}",
        lines.join("\n")
    );
    assert_eq!(
        stored(&group, &topic),
        (Some(20), "ackd/3:o=20;p=19;r;end".into())
    );
    eprintln!("acked metadata after a reset back from 10 to 0: 20 processed, 0 skipped, lost 0");
}

/// A halt under key ordering: the calls in flight finish above the failed message, and
/// the stop's commit (released) names them. The next owner skips them and says that
/// exactly one message, the failed one, comes again.
#[test]
fn a_release_after_a_halt_names_what_finished_above_the_failed_message() {
    kafka();
    let (topic, group) = fresh_topic("acked-halt", 1);
    const N: i64 = 300;
    let messages: Vec<(Option<Vec<u8>>, Vec<u8>)> = (0..N)
        .map(|i| match i {
            // Fails both attempts, the second after a wait: the calls after it are
            // under way or done by then.
            10 => (Some(b"failing".to_vec()), b"retry:5".to_vec()),
            _ => (Some(format!("k{}", i % 37).into_bytes()), b"ok".to_vec()),
        })
        .collect();
    let delivered = produce(&topic, &messages);
    let halting = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "faulty")
        .env("ACKD_ORDERING", "key")
        .env("ACKD_CONCURRENCY", "64")
        .env("ACKD_RETRY_INITIAL_MS", "300")
        .env("ACKD_RETRY_MAX_ATTEMPTS", "2")
        .spawn();
    halting.wait_for_line(|l| at(l, "halted"), WAIT);
    halting.sigterm();
    assert_eq!(halting.wait_exit(WAIT), 1, "a halt stops uncleanly");
    let first = halting.lines();
    let (committed, metadata) = stored(&group, &topic);
    assert_eq!(committed, Some(10), "{metadata}");
    let finished: BTreeSet<i64> = processed(&first).iter().map(|m| m.1).collect();
    let above: BTreeSet<i64> = finished.range(11..).copied().collect();
    let highest = *finished.last().unwrap();
    assert!(
        !above.is_empty(),
        "nothing finished above the failed message"
    );
    assert_eq!(
        metadata,
        format!("ackd/3:o=10;p={highest};a=1-{};r;end", highest - 10),
        "finished above 10: {above:?}"
    );
    assert_eq!(acked_offsets(10, &metadata), above);

    let next = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "faulty")
        .env("ACKD_ORDERING", "key")
        .env("ACKD_CONCURRENCY", "64")
        .env("ACKD_ON_FAILURE", "skip")
        .env("ACKD_RETRY_INITIAL_MS", "20")
        .env("ACKD_RETRY_MAX_ATTEMPTS", "2")
        .spawn();
    let assigned = next.wait_for_line(|l| at(l, "assigned"), WAIT);
    assert_eq!(
        field(&assigned, "released").as_deref(),
        Some("true"),
        "{assigned}"
    );
    assert_eq!(
        field(&assigned, "redelivery").as_deref(),
        Some("1"),
        "{assigned}"
    );
    assert_eq!(
        field(&assigned, "acked_above").and_then(|v| v.parse().ok()),
        Some(above.len()),
        "{assigned}"
    );
    next.wait_for_count(is_processed, (N - 1 - highest) as usize, WAIT);
    next.wait_for_line(|l| at(l, "skipped"), WAIT);
    let second = next.stop(0, WAIT);
    let again: BTreeSet<i64> = processed(&second).iter().map(|m| m.1).collect();
    assert_eq!(again, (highest + 1..N).collect::<BTreeSet<_>>());
    let all: Vec<(i32, i64)> = processed(&first)
        .into_iter()
        .chain(processed(&second))
        .collect();
    let lines: Vec<String> = first.iter().chain(&second).cloned().collect();
    let t = tally(&delivered, &all, &lines);
    // 10 failed in both runs (skipped in the second): no processed line.
    assert_eq!(t.lost, vec![(0, 10)]);
    assert!(t.duplicated.is_empty(), "{:?}", t.duplicated);
    assert_eq!(stored(&group, &topic).0, Some(N));
    eprintln!(
        "acked metadata after a halt at 10: {} finished above it and named in the release, skipped by the next owner; redelivery=1 (the failed message), duplicated 0",
        above.len()
    );
}

/// SIGKILL mid-stream under `none` ordering, with one message in 25 slow (a retry
/// 150-300 ms later) so that messages finish out of order all along: the next owner
/// processes again exactly what the killed one's last commit did not name (at or above
/// its offset, not in its ranges), never what it named; nothing is lost.
#[test]
fn a_sigkill_mid_stream_redelivers_only_what_the_last_commit_did_not_name() {
    kafka();
    const N: i64 = 2000;
    const CONCURRENCY: usize = 16;
    let (topic, group) = fresh_topic("acked-mid", 1);
    let slow: BTreeSet<i64> = (0..N).filter(|i| i % 25 == 7).collect();
    let delivered = produce_with_stuck(&topic, 0, N, &slow);
    let run = |retry_ms: &str| {
        AckdBuilder::new(&topic, &group)
            .env("ACKD_PROCESSOR", "faulty")
            .env("ACKD_ORDERING", "none")
            .env("ACKD_CONCURRENCY", CONCURRENCY.to_string())
            .env("ACKD_COMMIT_INTERVAL_MS", "100")
            .env("ACKD_RETRY_INITIAL_MS", retry_ms)
            .env("ACKD_RETRY_MAX_MS", retry_ms)
            .spawn()
    };
    let killed = run("300");
    killed.wait_for_line(|l| at(l, "committed"), WAIT);
    killed.wait_for_count(is_processed, (N / 2) as usize, WAIT);
    killed.sigkill();
    killed.assert_exit(128 + libc::SIGKILL, WAIT);
    let killed_lines = killed.lines();
    let (committed, metadata) = stored(&group, &topic);
    let committed = committed.expect("committed");
    let named = acked_offsets(committed, &metadata);
    assert!(
        !killed_lines
            .iter()
            .any(|l| at(l, "commit_metadata_dropped")),
        "this test's ranges fit the broker's limit"
    );

    let next = run("20");
    wait_until(WAIT, || {
        let mut seen: BTreeSet<i64> = processed(&killed_lines).iter().map(|m| m.1).collect();
        seen.extend(processed(&next.lines()).iter().map(|m| m.1));
        seen.len() == N as usize
    });
    let next_lines = next.stop(0, WAIT);
    let before: BTreeSet<i64> = processed(&killed_lines).iter().map(|m| m.1).collect();
    let again: BTreeSet<i64> = processed(&next_lines).iter().map(|m| m.1).collect();
    assert_eq!(
        again,
        (committed..N)
            .filter(|o| !named.contains(o))
            .collect::<BTreeSet<_>>(),
        "committed {committed}, metadata {metadata}"
    );
    let redelivered: BTreeSet<i64> = before.intersection(&again).copied().collect();
    // Without the ranges: everything the killed run processed at or above the commit.
    let without: usize = before.range(committed..).count();
    assert!(
        named.iter().all(|o| before.contains(o)),
        "named but not processed"
    );
    let all: Vec<(i32, i64)> = processed(&killed_lines)
        .into_iter()
        .chain(processed(&next_lines))
        .collect();
    let lines: Vec<String> = killed_lines.iter().chain(&next_lines).cloned().collect();
    let t = tally(&delivered, &all, &lines);
    assert!(t.lost.is_empty(), "lost {:?}", t.lost);
    assert_eq!(t.duplicated.len(), redelivered.len());
    eprintln!(
        "acked metadata mid-stream: {N} messages, none ordering, concurrency {CONCURRENCY}, 1 in 25 slow, SIGKILL after {} processed: \
         committed {committed}, {} named above it ({} bytes of metadata), redelivered {} (without the ranges: {without}), lost 0",
        before.len(),
        named.len(),
        metadata.len(),
        redelivered.len(),
    );
}
