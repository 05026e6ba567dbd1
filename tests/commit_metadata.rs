//! Commit metadata and out-of-range offsets on Apache Kafka:
//! - each commit carries `ackd:processed=H` (`;released` on a revoke's or a stop's); the
//!   next owner's `at=assigned` line reads it back (`highest_processed=`, `released=`,
//!   `redelivery=`), compared with the redelivery the harness counts (messages both runs
//!   processed): exact after a release, `unknown` after a SIGKILL (the killed process
//!   processed on after its last commit, which no commit records);
//! - a committed offset whose records were deleted (DeleteRecords) is out of range: ackd
//!   logs `at=offset_reset from= to=`, processes what remains, and commits the log end.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{
    accounting::*, ackd::*, broker::*, lines::*, offsets::*, produce::*, topics::*, wait::*,
};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

const WAIT: Duration = Duration::from_secs(90);

fn int(line: &str, key: &str) -> Option<i64> {
    field(line, key).and_then(|v| v.parse().ok())
}

/// Per partition, the group's committed offset and its metadata, as the broker keeps them.
fn committed_with_metadata(
    group: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, (Option<i64>, String)> {
    let consumer: BaseConsumer = broker()
        .client_config()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("create committed-offsets consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed offsets");
    got.elements()
        .iter()
        .map(|e| {
            let offset = match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            };
            (e.partition(), (offset, e.metadata().to_string()))
        })
        .collect()
}

/// Per partition, the last `at=what` line of a run.
fn last_per_partition(lines: &[String], what: &str) -> BTreeMap<i32, String> {
    lines
        .iter()
        .filter(|l| at(l, what))
        .filter_map(|l| Some((int(l, "partition")? as i32, l.clone())))
        .collect()
}

/// Per partition, how many of `earlier`'s processed offsets `later` processed again.
fn counted_redelivery(earlier: &[String], later: &[String], p: i32) -> i64 {
    let again: BTreeSet<(i32, i64)> = processed(later).into_iter().collect();
    processed(earlier)
        .iter()
        .filter(|(q, o)| *q == p && again.contains(&(p, *o)))
        .count() as i64
}

#[test]
fn the_resume_line_says_the_redelivery_exactly_after_a_release_and_its_bound_after_a_sigkill() {
    const PARTITIONS: i32 = 4;
    let (topic, group) = fresh_topic("meta-crash", PARTITIONS);
    let producer = SteadyProducer::start(&topic, 10, Duration::from_millis(50));
    let member = || {
        AckdBuilder::new(&topic, &group)
            .env("ACKD_COMMIT_INTERVAL_MS", "500")
            .spawn()
    };

    // 1. SIGKILL mid-stream, periodic commits on.
    let killed = member();
    killed.wait_for_line(|l| at(l, "committed"), WAIT);
    let so_far = processed(&killed.lines()).len();
    killed.wait_for_count(is_processed, so_far + 60, WAIT);
    // Killed once a round's lines are out: a line still queued in ackd when the kill
    // lands is lost, and the next round is an interval away.
    let is_committed = |l: &str| at(l, "committed");
    let commits = killed.lines().iter().filter(|l| is_committed(l)).count();
    killed.wait_for_count(is_committed, commits + PARTITIONS as usize, WAIT);
    killed.sigkill();
    killed.assert_exit(128 + libc::SIGKILL, WAIT);
    let killed_lines = killed.lines();
    // What the broker keeps: the last commit the killed process got accepted.
    let stored = committed_with_metadata(&group, &topic, PARTITIONS);
    let last_commits = last_per_partition(&killed_lines, "committed");

    // 2. The next owner resumes there, processes everything, and stops with SIGTERM.
    let next = member();
    wait_until(WAIT, || {
        last_per_partition(&next.lines(), "assigned").len() == PARTITIONS as usize
    });
    let mut delivered = producer.finish();
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    wait_until(WAIT, || {
        let mut seen: BTreeSet<_> = processed(&killed_lines).into_iter().collect();
        seen.extend(processed(&next.lines()));
        seen.is_superset(&expected)
    });
    let next_lines = next.stop(0, WAIT);
    let assigned = last_per_partition(&next_lines, "assigned");
    let mut report = Vec::new();
    for p in 0..PARTITIONS {
        let line = &assigned[&p];
        let (c, metadata) = &stored[&p];
        let last = &last_commits[&p];
        assert_eq!(*c, int(last, "offset"), "partition {p}: {last}");
        let c = c.unwrap();
        let (metadata, limit) = without_limit(metadata);
        assert_eq!(
            metadata,
            format!("ackd/3:o={c};p={};end", c - 1),
            "periodic"
        );
        let limit = limit.expect("a dispatch limit");
        assert_eq!(int(line, "offset"), Some(c), "{line}");
        assert_eq!(int(line, "highest_processed"), Some(c - 1), "{line}");
        // The killed process processed on after its last commit; no commit says how far.
        let counted = counted_redelivery(&killed_lines, &next_lines, p);
        let last_processed = processed(&killed_lines)
            .iter()
            .filter(|(q, _)| *q == p)
            .map(|(_, o)| *o)
            .max()
            .unwrap();
        assert_eq!(counted, last_processed + 1 - c, "partition {p}");
        assert_eq!(field(line, "released").as_deref(), Some("false"), "{line}");
        // Nothing above its dispatch limit was started: that bounds the redelivery.
        assert!(
            last_processed <= limit,
            "partition {p}: {last_processed} > {limit}"
        );
        assert_eq!(int(line, "dispatch_limit"), Some(limit), "{line}");
        assert_eq!(
            int(line, "redelivery_at_most"),
            Some(limit + 1 - c),
            "{line}"
        );
        assert_eq!(int(line, "flagged_through"), Some(limit), "{line}");
        assert_eq!(field(line, "redelivery"), None, "not exact: {line}");
        report.push(format!("p{p} at most {}/{counted}", limit + 1 - c));
    }

    // 3. After that release, the group's metadata says so, and the next owner knows it
    //    redelivers nothing (the last periodic commit may have committed the end
    //    already: the stop commits it again, as released).
    let ends = log_ends(&delivered);
    let stored = committed_with_metadata(&group, &topic, PARTITIONS);
    for (p, end) in &ends {
        assert_eq!(
            (stored[p].0, without_limit(&stored[p].1).0),
            (Some(*end), format!("ackd/3:o={end};p={};r;end", end - 1)),
            "partition {p}"
        );
    }
    let more = produce_keyed(&topic, 40, 100_000);
    delivered.extend(more.iter().cloned());
    let third = member();
    third.wait_for_count(is_processed, more.len(), WAIT);
    let third_lines = third.stop(0, WAIT);
    let assigned = last_per_partition(&third_lines, "assigned");
    let mut released_report = Vec::new();
    for (p, end) in &ends {
        let line = &assigned[p];
        assert_eq!(int(line, "offset"), Some(*end), "{line}");
        assert_eq!(field(line, "released").as_deref(), Some("true"), "{line}");
        let counted = counted_redelivery(&next_lines, &third_lines, *p);
        assert_eq!(int(line, "redelivery"), Some(counted), "{line}");
        released_report.push(format!("p{p} {counted}/{counted}"));
    }

    let all: Vec<(i32, i64)> = [&killed_lines, &next_lines, &third_lines]
        .iter()
        .flat_map(|l| processed(l))
        .collect();
    let lines: Vec<String> = [&killed_lines, &next_lines, &third_lines]
        .iter()
        .flat_map(|l| l.iter().cloned())
        .collect();
    let t = tally(&delivered, &all, &lines);
    assert!(t.lost.is_empty(), "lost {:?}", t.lost);
    assert_committed_to_ends(&group, &topic, PARTITIONS, &log_ends(&delivered));
    eprintln!(
        "metadata: messages {}, runs 3 (SIGKILL, SIGTERM, SIGTERM), lost 0, duplicated {}; \
         redelivery ackd/counted after the SIGKILL [{}], after the release [{}]",
        delivered.len(),
        t.duplicated.len(),
        report.join(", "),
        released_report.join(", ")
    );
}

#[test]
fn a_committed_offset_whose_records_were_deleted_is_reset_and_logged() {
    let (topic, group) = fresh_topic("deleted", 1);
    let first = produce_numbered_keyed(&topic, 0, 20);

    let run = AckdBuilder::new(&topic, &group).spawn();
    run.wait_for_count(is_processed, 20, WAIT);
    run.stop(0, WAIT);
    assert_committed(&group, &topic, 0, Some(20));

    // 30 more (offsets 20..50); then everything before 35 is deleted, the committed
    // offset 20 with it.
    let second = produce_numbered_keyed(&topic, 20, 30);
    assert_eq!(second.first().map(|d| d.offset), Some(20));
    let admin: AdminClient<DefaultClientContext> =
        broker().client_config().create().expect("admin client");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Offset(35))
        .unwrap();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let result =
        futures::executor::block_on(admin.delete_records(&tpl, &opts)).expect("delete records");
    let low = result
        .find_partition(&topic, 0)
        .expect("partition 0 in the result");
    assert!(low.error().is_ok(), "delete records: {:?}", low.error());
    assert_eq!(low.offset(), Offset::Offset(35), "the new log start");

    let run = AckdBuilder::new(&topic, &group).spawn();
    let reset = run.wait_for_line(|l| at(l, "offset_reset"), WAIT);
    assert_eq!(int(&reset, "from"), Some(20), "{reset}");
    assert_eq!(int(&reset, "to"), Some(35), "{reset}");
    run.wait_for_count(is_processed, 15, WAIT);
    let lines = run.stop(0, WAIT);
    let assigned = lines.iter().find(|l| at(l, "assigned")).unwrap();
    assert_eq!(int(assigned, "offset"), Some(20), "{assigned}");
    let got = processed(&lines);
    assert_eq!(
        got,
        (35..50).map(|o| (0, o)).collect::<Vec<_>>(),
        "what remains, once each, in order"
    );
    assert_eq!(committed_offset(&group, &topic, 0), Some(50), "the log end");
    eprintln!(
        "out of range: messages {}, committed 20, deleted before 35 (20..35 gone with it), \
         at=offset_reset from=20 to=35, processed 35..50 ({} messages), committed 50, exit 0",
        first.len() + second.len(),
        got.len()
    );
}

/// `n` keyed messages to partition 0 (keys `k-<start+i>`), in order.
fn produce_numbered_keyed(topic: &str, start: usize, n: usize) -> Vec<Delivered> {
    let keys: Vec<String> = (start..start + n).map(|i| format!("k-{i}")).collect();
    let records: Vec<Record<'_>> = keys
        .iter()
        .map(|k| (0, Some(k.as_bytes()), &b"v"[..], &[][..]))
        .collect();
    produce_records(topic, &records)
        .into_iter()
        .zip(keys)
        .map(|((partition, offset), k)| Delivered {
            partition,
            offset,
            key: Some(k.into_bytes()),
        })
        .collect()
}

/// Commits `offset` with `metadata` for partition 0 of `topic` as `group`, as a previous
/// owner (or an operator's tool) would have.
fn commit_by_hand(group: &str, topic: &str, offset: i64, metadata: &str) {
    let previous: BaseConsumer = broker()
        .client_config()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("create committing consumer");
    let mut tpl = TopicPartitionList::new();
    let mut e = tpl.add_partition(topic, 0);
    e.set_offset(Offset::Offset(offset)).unwrap();
    e.set_metadata(metadata);
    previous
        .commit(&tpl, rdkafka::consumer::CommitMode::Sync)
        .expect("commit by hand");
}

#[test]
fn a_committed_offset_past_the_log_end_is_reset_by_the_start_policy() {
    let (topic, group) = fresh_topic("past-end", 1);
    let delivered = produce_numbered_keyed(&topic, 0, 10);
    commit_by_hand(&group, &topic, 1000, "");

    let run = AckdBuilder::new(&topic, &group).spawn();
    let reset = run.wait_for_line(|l| at(l, "offset_reset"), WAIT);
    assert_eq!(int(&reset, "from"), Some(1000), "{reset}");
    assert_eq!(int(&reset, "to"), Some(0), "earliest: {reset}");
    run.wait_for_count(is_processed, 10, WAIT);
    run.stop(0, WAIT);
    assert_eq!(
        processed(&run.lines()),
        (0..10).map(|o| (0, o)).collect::<Vec<_>>()
    );
    assert_committed_to_ends(&group, &topic, 1, &log_ends(&delivered));
    eprintln!("past the end: committed 1000 of 10, at=offset_reset from=1000 to=0, processed 0..10, committed 10");
}

#[test]
fn a_release_past_what_was_committed_says_how_much_comes_again() {
    let (topic, group) = fresh_topic("meta-hand", 1);
    let delivered = produce_numbered_keyed(&topic, 0, 10);
    // A previous owner that had processed through 7 when it released the partition at 4.
    commit_by_hand(&group, &topic, 4, "ackd/2:o=4;p=7;r;end");

    let run = AckdBuilder::new(&topic, &group).spawn();
    let assigned = run.wait_for_line(|l| at(l, "assigned"), WAIT);
    assert_eq!(int(&assigned, "offset"), Some(4), "{assigned}");
    assert_eq!(int(&assigned, "highest_processed"), Some(7), "{assigned}");
    assert_eq!(int(&assigned, "redelivery"), Some(4), "4..=7: {assigned}");
    run.wait_for_count(is_processed, 6, WAIT);
    run.stop(0, WAIT);
    assert_committed_to_ends(&group, &topic, 1, &log_ends(&delivered));
    let (offset, metadata) = &committed_with_metadata(&group, &topic, 1)[&0];
    assert_eq!(
        (*offset, without_limit(metadata).0),
        (Some(10), "ackd/3:o=10;p=9;r;end".to_string())
    );
}

/// Commit metadata another client wrote is ignored. Kafka decodes
/// metadata as UTF-8 and stores what it got, so bytes that are not UTF-8 come back as
/// U+FFFD: the crash such bytes caused is staged in `tests/mock_cluster.rs`, whose broker
/// keeps them as they are.
#[test]
fn metadata_another_client_wrote_is_ignored() {
    let (topic, group) = fresh_topic("foreign-meta", 1);
    produce_numbered(&topic, 10);
    // Another client committed offset 4 with metadata that is not UTF-8.
    let foreign: &[u8] = b"\xff\xfe\xc3(";
    let bootstrap = broker().bootstrap();
    commit_raw_metadata_on(&bootstrap, &group, &topic, 0, 4, foreign);
    let (offset, stored) = committed_raw_metadata_on(&bootstrap, &group, &topic, 0);
    assert_eq!(offset, Some(4));
    // Kafka replaced each invalid sequence with U+FFFD (EF BF BD).
    assert_eq!(stored, "\u{FFFD}\u{FFFD}\u{FFFD}(".as_bytes());

    let started = std::time::Instant::now();
    let ackd = AckdBuilder::new(&topic, &group).spawn();
    let assigned = ackd.wait_for_line(|l| at(l, "assigned"), WAIT);
    assert_eq!(
        field(&assigned, "offset").as_deref(),
        Some("4"),
        "{assigned}"
    );
    assert_eq!(
        field(&assigned, "from").as_deref(),
        Some("committed"),
        "{assigned}"
    );
    assert_eq!(field(&assigned, "highest_processed"), None, "{assigned}");
    ackd.wait_for_count(is_processed, 6, WAIT);
    ackd.sigterm();
    let code = ackd.wait_exit(WAIT);
    let lines = ackd.lines();
    assert_eq!(code, 0, "{}", lines.join("\n"));
    let offsets: Vec<i64> = processed(&lines).into_iter().map(|(_, o)| o).collect();
    assert_eq!(offsets, (4..10).collect::<Vec<_>>());
    // ackd's own commit replaces the foreign metadata with its own.
    let (offset, metadata) = committed_raw_metadata_on(&bootstrap, &group, &topic, 0);
    let metadata = String::from_utf8(metadata).unwrap();
    assert_eq!(
        (offset, without_limit(&metadata).0),
        (Some(10), "ackd/3:o=10;p=9;r;end".to_string())
    );
    eprintln!(
        "foreign metadata: resumed at 4, processed {} messages, exit {code}, {:?}",
        offsets.len(),
        started.elapsed()
    );
}

// Commit metadata that does not describe the offset it sits
// beside (moved by a tool, copied from another group, left by another ackd version) must
// never make ackd skip a message; metadata that does keeps its ranges across owners.

/// Runs ackd on `topic`/`group` (partition ordering unless `env` says otherwise) until
/// the log's end as it is now, and returns its lines, having checked it exited 0.
fn run_to_end(topic: &str, group: &str, env: &[(&str, &str)]) -> Vec<String> {
    let mut builder = AckdBuilder::new(topic, group)
        .env("ACKD_PROCESSOR", "faulty")
        .env("ACKD_STOP_AT_END", "true")
        .env("ACKD_COMMIT_INTERVAL_MS", "200");
    for (k, v) in env {
        builder = builder.env(*k, *v);
    }
    let ackd = builder.spawn();
    let code = ackd.wait_exit(WAIT);
    let lines = ackd.lines();
    assert_eq!(code, 0, "{}", lines.join("\n"));
    lines
}

/// The offsets `lines` processed, each as often as it was.
fn processed_offsets(lines: &[String]) -> Vec<i64> {
    let mut got: Vec<i64> = processed(lines).into_iter().map(|(_, o)| o).collect();
    got.sort_unstable();
    got
}

/// A tool (MirrorMaker 2's offset sync, an admin client's alterConsumerGroupOffsets)
/// set the group's offset to 5 and kept metadata that an
/// older ackd wrote beside another offset. Its ranges name offsets relative to an
/// offset it does not record: nothing may be skipped. Likewise metadata of a later
/// ackd's format (here with a field this one does not know), and this format's cut
/// short (no `end`), even beside the offset it names.
#[test]
fn metadata_moved_to_another_offset_skips_nothing() {
    for (metadata, state) in [
        (&b"ackd:processed=29;acked=1-9;released"[..], "old_format"),
        (b"ackd/4:o=5;p=29;a=1-9;L=4;r;end", "newer_format"),
        (b"ackd/2:o=5;p=29;a=1-9", "foreign"),
    ] {
        let (topic, group) = fresh_topic("meta-moved", 1);
        produce_numbered_keyed(&topic, 0, 80);
        commit_raw_metadata_on(&broker().bootstrap(), &group, &topic, 0, 5, metadata);
        let lines = run_to_end(&topic, &group, &[]);
        let assigned = lines.iter().find(|l| at(l, "assigned")).unwrap();
        assert_eq!(int(assigned, "acked_above"), None, "{assigned}");
        assert_eq!(
            field(assigned, "metadata").as_deref(),
            Some(state),
            "{assigned}"
        );
        assert!(!lines.iter().any(|l| at(l, "resume_skipped")), "{lines:?}");
        assert_eq!(processed_offsets(&lines), (5..80).collect::<Vec<_>>());
        assert_committed(&group, &topic, 0, Some(80));
        eprintln!(
            "metadata {:?} beside offset 5: metadata={state}, processed 5..80 once each (75), skipped 0, committed 80, exit 0",
            String::from_utf8_lossy(metadata)
        );
    }
}

/// ackd's own metadata (a key-ordered run SIGKILLed while offset 20 was held, its ranges
/// naming 21..=79) copied byte for byte beside offset 5
/// of another group, as MirrorMaker 2 writes a translated offset with the upstream
/// metadata. The copy skips nothing; the original still skips what it names.
#[test]
fn ackd_metadata_copied_beside_another_offset_skips_nothing() {
    let topic = unique_name("meta-copied");
    let (group, copy) = (unique_name("g-meta-orig"), unique_name("g-meta-copy"));
    create_topic(&topic, 1);
    let messages: Vec<(Option<Vec<u8>>, Vec<u8>)> = (0..80)
        .map(|i| match i {
            20 => (Some(b"stuck".to_vec()), b"retry:1".to_vec()),
            _ => (Some(format!("k{}", i % 7).into_bytes()), b"ok".to_vec()),
        })
        .collect();
    produce(&topic, &messages);
    let held = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "faulty")
        .env("ACKD_ORDERING", "key")
        .env("ACKD_COMMIT_INTERVAL_MS", "200")
        .env("ACKD_RETRY_INITIAL_MS", "600000")
        .env("ACKD_RETRY_MAX_MS", "600000")
        .spawn();
    held.wait_for_count(is_processed, 79, WAIT);
    let bootstrap = broker().bootstrap();
    let stored = || committed_raw_metadata_on(&bootstrap, &group, &topic, 0);
    wait_until(WAIT, || {
        let (o, m) = stored();
        o == Some(20) && String::from_utf8_lossy(&m).contains(";a=1-59;")
    });
    held.sigkill();
    held.assert_exit(128 + libc::SIGKILL, WAIT);
    let (_, metadata) = stored();
    commit_raw_metadata_on(&bootstrap, &copy, &topic, 0, 5, &metadata);

    let lines = run_to_end(&topic, &copy, &[("ACKD_RETRY_INITIAL_MS", "20")]);
    let assigned = lines.iter().find(|l| at(l, "assigned")).unwrap();
    assert_eq!(int(assigned, "acked_above"), None, "{assigned}");
    assert_eq!(
        field(assigned, "metadata").as_deref(),
        Some("stale"),
        "{assigned}"
    );
    let got = processed_offsets(&lines);
    assert_eq!(got, (5..80).collect::<Vec<_>>(), "{lines:?}");
    assert_committed(&copy, &topic, 0, Some(80));

    // The original, beside the offset it was committed with, skips 21..=79.
    let lines = run_to_end(&topic, &group, &[("ACKD_RETRY_INITIAL_MS", "20")]);
    assert_eq!(processed_offsets(&lines), vec![20], "{lines:?}");
    eprintln!(
        "ackd metadata {:?} copied beside offset 5 of another group: processed 5..80 (75), skipped 0, committed 80; \
         beside its own offset 20: processed 20 alone, 59 skipped",
        String::from_utf8_lossy(&metadata)
    );
}

/// Some clients (confluent-kafka-python's AdminClient and `Consumer.commit`) store
/// metadata with a trailing NUL byte. Trailing NULs are trimmed before the strict
/// parse: ackd's metadata so stored reads as written.
#[test]
fn metadata_with_a_trailing_nul_reads_as_written() {
    let (topic, group) = fresh_topic("meta-nul", 1);
    produce_numbered_keyed(&topic, 0, 80);
    let mut metadata = predecessor_metadata(5, 29, "1-9", true).into_bytes();
    metadata.push(0);
    commit_raw_metadata_on(&broker().bootstrap(), &group, &topic, 0, 5, &metadata);
    let lines = run_to_end(&topic, &group, &[]);
    let assigned = lines.iter().find(|l| at(l, "assigned")).unwrap();
    assert_eq!(int(assigned, "acked_above"), Some(9), "{assigned}");
    assert_eq!(
        field(assigned, "released").as_deref(),
        Some("true"),
        "{assigned}"
    );
    let expected: Vec<i64> = std::iter::once(5).chain(15..80).collect();
    assert_eq!(processed_offsets(&lines), expected);
    assert_committed(&group, &topic, 0, Some(80));
    eprintln!("metadata with a trailing NUL at offset 5: read as written, 6..=14 skipped, 5 and 15..80 processed, committed 80");
}

/// The metadata a key-ordered predecessor writes beside `offset` when it had processed
/// through `processed` and acknowledged `acked` above the offset (relative to it).
fn predecessor_metadata(offset: i64, processed: i64, acked: &str, released: bool) -> String {
    let released = if released { ";r" } else { "" };
    format!("ackd/2:o={offset};p={processed};a={acked}{released};end")
}

/// The ranges a key-ordered predecessor left survive the commits of a next
/// owner that has not passed them yet, and its crash: the third owner still skips them.
/// Offset 10 fails once, and the next owner waits minutes to retry it: under partition
/// ordering it stops there; under key ordering it also finishes 11..=19 and skips
/// 20..=59 meanwhile.
#[test]
fn inherited_ranges_survive_a_commit_and_a_crash_of_the_next_owner() {
    for (ordering, named, first) in [
        ("partition", "a=10-49", (0..10).collect::<Vec<i64>>()),
        ("key", "a=1-49", (0..20).filter(|o| *o != 10).collect()),
    ] {
        let (topic, group) = fresh_topic("meta-inherit", 1);
        let messages: Vec<(Option<Vec<u8>>, Vec<u8>)> = (0..60)
            .map(|i| match i {
                10 => (None, b"retry:1".to_vec()),
                _ => (Some(format!("k{i}").into_bytes()), b"ok".to_vec()),
            })
            .collect();
        produce(&topic, &messages);
        // The predecessor acknowledged 20..=59 above its commit at 0, then crashed.
        let bootstrap = broker().bootstrap();
        let inherited = predecessor_metadata(0, 59, "20-59", false);
        commit_raw_metadata_on(&bootstrap, &group, &topic, 0, 0, inherited.as_bytes());

        let next = AckdBuilder::new(&topic, &group)
            .env("ACKD_PROCESSOR", "faulty")
            .env("ACKD_ORDERING", ordering)
            .env("ACKD_COMMIT_INTERVAL_MS", "200")
            .env("ACKD_RETRY_INITIAL_MS", "600000")
            .env("ACKD_RETRY_MAX_MS", "600000")
            .spawn();
        next.wait_for_line(|l| at(l, "retry"), WAIT);
        next.wait_for_count(is_processed, first.len(), WAIT);
        // Offset 10 committed, and the commits after the last message finished.
        let want = format!("ackd/3:o=10;p=59;{named};end");
        let stored = || {
            let (offset, m) = committed_raw_metadata_on(&bootstrap, &group, &topic, 0);
            (offset, without_limit(&String::from_utf8(m).unwrap()).0)
        };
        let until = std::time::Instant::now() + Duration::from_secs(20);
        let mut got = stored();
        while got != (Some(10), want.clone()) && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
            got = stored();
        }
        let metadata = got.1;
        next.sigkill();
        next.assert_exit(128 + libc::SIGKILL, WAIT);
        assert_eq!(processed_offsets(&next.lines()), first, "{ordering}");
        assert_eq!(
            (got.0, metadata.as_str()),
            (Some(10), want.as_str()),
            "{ordering}"
        );

        let lines = run_to_end(&topic, &group, &[("ACKD_RETRY_INITIAL_MS", "20")]);
        let assigned = lines.iter().find(|l| at(l, "assigned")).unwrap();
        // Offsets 10..=59 are the previous owners': processed again, or skipped.
        let again: Vec<i64> = (10..20).filter(|o| !first.contains(o)).collect();
        assert_eq!(
            int(assigned, "acked_above"),
            Some(50 - again.len() as i64),
            "{assigned}"
        );
        assert_eq!(processed_offsets(&lines), again, "{ordering}");
        assert_committed(&group, &topic, 0, Some(60));
        eprintln!(
            "inherited ranges 20..=59, next owner under {ordering} ordering: committed {metadata:?}, SIGKILLed; \
             the third processed {again:?} and skipped the rest: each message processed once"
        );
    }
}

/// A topic deleted and created again under the same name. Kafka 4.4's group
/// coordinator deletes the group's committed offsets (metadata with them) of a deleted
/// topic's partitions, so the group starts the new topic by its start policy: whatever
/// ackd's metadata named of the old topic, no message of the new one is skipped.
#[test]
fn a_topic_deleted_and_created_again_skips_nothing_of_the_new_one() {
    let (topic, group) = fresh_topic("meta-recreated", 1);
    produce_numbered_keyed(&topic, 0, 20);
    let bootstrap = broker().bootstrap();
    let old = predecessor_metadata(10, 19, "1-9", true);
    commit_raw_metadata_on(&bootstrap, &group, &topic, 0, 10, old.as_bytes());

    let admin: AdminClient<DefaultClientContext> =
        broker().client_config().create().expect("admin client");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let deleted =
        futures::executor::block_on(admin.delete_topics(&[&topic], &opts)).expect("delete topic");
    assert!(deleted.iter().all(Result::is_ok), "{deleted:?}");
    // The name is free again once the deletion is complete: creating it retries until then.
    wait_until(WAIT, || {
        let new =
            rdkafka::admin::NewTopic::new(&topic, 1, rdkafka::admin::TopicReplication::Fixed(1));
        let created = futures::executor::block_on(admin.create_topics([&new], &opts));
        matches!(created.as_deref(), Ok([Ok(_)]))
    });
    produce_numbered_keyed(&topic, 0, 30);
    let survived = committed_raw_metadata_on(&bootstrap, &group, &topic, 0);

    let lines = run_to_end(&topic, &group, &[]);
    assert!(!lines.iter().any(|l| at(l, "resume_skipped")), "{lines:?}");
    let got = processed_offsets(&lines);
    let from = survived.0.unwrap_or(0);
    assert_eq!(got, (from..30).collect::<Vec<_>>(), "{lines:?}");
    assert_committed(&group, &topic, 0, Some(30));
    eprintln!(
        "topic deleted and created again: the group's committed offset and metadata after it: {:?} {:?}; \
         processed {}..30 of the new topic, skipped 0",
        survived.0,
        String::from_utf8_lossy(&survived.1),
        from
    );
}
