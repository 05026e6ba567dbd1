//! The core promise against the real broker: every message processed once, its offset
//! committed only after it was acknowledged, and a graceful stop (SIGTERM) that commits
//! exactly up to what was processed, so a restart resumes at the next message.
//!
//! Ground truth is the producer's delivery reports (what the broker acknowledged to the
//! producer); committed offsets are read back from the broker.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use common::{
    ackd::*, broker::*, deliveries::*, lines::*, offsets::*, produce::*, spawn::*, topics::*,
};

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
    // Within 20 s (wait_exit fails otherwise): not after the 30 s call.
    let code = ackd.wait_exit(Duration::from_secs(20));
    assert_eq!(code, 1, "{}", ackd.lines().join("\n"));
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

/// The signal's line is written, and before the stop it starts.
#[track_caller]
fn assert_signal_line_first(lines: &[String]) {
    let all = lines.join("\n");
    let position = |what| {
        lines
            .iter()
            .position(|l| at(l, what))
            .unwrap_or_else(|| panic!("no at={what} line:\n{all}"))
    };
    let (signal, begun) = (position("signal"), position("shutdown_begun"));
    assert!(signal < begun, "shutdown_begun before the signal:\n{all}");
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

// A stop hands the next owner what it handed a processor and did not finish: that owner's
// `at=assigned` says `released=true redelivery=N`, and exactly those N offsets reach its
// processor flagged `redelivered=true`; the messages read but never handed over (the
// partition's queue behind a message in its backoff, the rest of the read-ahead) come
// unflagged. Each case first runs ackd A, stops it with the offset `at` unfinished, then
// runs B (the `log` processor: its per-message lines say the flag) to the end. The group
// starts as an ackd leaves a partition it released before anything was produced (a
// group with no commit at all is one whose earlier reader ackd cannot know of: every
// message in the log is flagged then, by A and, through A's release, by B).

/// Commits offset 0 of `partitions` partitions of `topic` for `group` with the metadata
/// of an ackd that released them having handed nothing over.
fn released_at_zero(group: &str, topic: &str, partitions: i32) {
    for p in 0..partitions {
        let metadata = b"ackd/3:o=0;p=-1;l=999;r;end";
        commit_raw_metadata_on(&broker().bootstrap(), group, topic, p, 0, metadata);
    }
}

/// An exec handler that appends `run partition offset redelivered attempt` for every
/// message it is handed (as tests/common's recorder does) and then answers each request;
/// the message at offset `argv[4]` as `argv[3]` says: `retry` or `fail` (then the
/// messages of a batch before it are acknowledged), or `ack` like the others.
const ANSWERING_RECORDER: &str = r#"import json, os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
run, how, at = sys.argv[2], sys.argv[3], int(sys.argv[4])
# Seconds to wait before answering the message at `at` (0 unless given).
delay = float(sys.argv[5]) if len(sys.argv) > 5 else 0
for line in sys.stdin:
    req = json.loads(line)
    batch = req if isinstance(req, list) else [req]
    os.write(fd, "".join(
        f"{run} {m['partition']} {m['offset']} {'true' if m['redelivered'] else 'false'} {m['attempt']}\n"
        for m in batch).encode())
    reply = {"topic": batch[0]["topic"], "partition": batch[0]["partition"]}
    if isinstance(req, list):
        reply.update(first=batch[0]["offset"], last=batch[-1]["offset"])
    else:
        reply.update(offset=req["offset"])
    if how != "ack" and any(m["offset"] == at for m in batch):
        time.sleep(delay)
        reply.update({how: f"{how} at {at}", "offset": at})
    else:
        reply.update(ack=True)
    print(json.dumps(reply), flush=True)
"#;

/// One case: a one-partition topic of `n` messages (values `v-<i>`, or what `values`
/// sets), its group, and the file A's exec handler records to.
struct Handover {
    topic: String,
    group: String,
    dir: PathBuf,
    file: PathBuf,
}

impl Handover {
    fn new(name: &str, values: &[String]) -> Handover {
        let (topic, group) = fresh_topic(name, 1);
        let records: Vec<Record<'_>> = values
            .iter()
            .map(|v| (0, None, v.as_bytes(), &[][..]))
            .collect();
        produce_records(&topic, &records);
        released_at_zero(&group, &topic, 1);
        let (dir, file) = deliveries_file(name);
        Handover {
            topic,
            group,
            dir,
            file,
        }
    }

    fn numbered(name: &str, n: usize) -> Handover {
        Handover::new(name, &(0..n).map(|i| format!("v-{i}")).collect::<Vec<_>>())
    }

    /// A: exec with [`ANSWERING_RECORDER`] answering `how` at `at`, a retry's backoff
    /// of 15 s, a commit every 500 ms.
    fn exec_a(&self, how: &str, at: i64) -> AckdBuilder {
        let script = self.dir.join("answering.py");
        std::fs::write(&script, ANSWERING_RECORDER).expect("write the handler");
        let command = format!(
            "python3 {} {} 0 {how} {at}",
            script.display(),
            self.file.display()
        );
        exec_ackd(&self.topic, &self.group, &command)
            .env("ACKD_COMMIT_INTERVAL_MS", "500")
            .env("ACKD_RETRY_INITIAL_MS", "15000")
            .env("ACKD_RETRY_MAX_MS", "15000")
    }

    /// The offsets A's handler was handed.
    fn handed_to_a(&self) -> BTreeSet<i64> {
        from_file(&self.file).iter().map(|d| d.offset).collect()
    }

    /// B, after A stopped: asserts that B's processor gets `again` (the offsets from
    /// `resume` on that A handed over) flagged and every other offset up to `last`
    /// unflagged, that B's `at=assigned` says `released=true redelivery=` their count,
    /// and that A's commit said so (committed at `resume`, released, `p=` the last
    /// offset A handed over). Returns B's lines.
    fn b_flags_exactly(&self, resume: i64, again: &BTreeSet<i64>, last: i64) -> Vec<String> {
        let bootstrap = broker().bootstrap();
        let (offset, raw) = committed_raw_metadata_on(&bootstrap, &self.group, &self.topic, 0);
        let metadata = String::from_utf8_lossy(&raw).into_owned();
        let b = AckdBuilder::new(&self.topic, &self.group).spawn();
        let assigned = b.wait_for_line(|l| at(l, "assigned"), WAIT);
        b.wait_for_line(|l| is_processed_at(l, last), WAIT);
        let lines = b.stop(0, WAIT);
        let seen = from_processed_lines(1, &lines);
        let offsets: Vec<i64> = seen.iter().map(|d| d.offset).collect();
        let all = lines.join("\n");
        assert_eq!(offsets, (resume..=last).collect::<Vec<_>>(), "{all}");
        let flagged: BTreeSet<i64> = seen
            .iter()
            .filter(|d| d.redelivered)
            .map(|d| d.offset)
            .collect();
        assert_eq!(
            &flagged, again,
            "flagged redelivered: exactly what was handed over unfinished (the release committed {metadata}; next: {assigned})"
        );
        let count = again.len().to_string();
        assert_eq!(
            field(&assigned, "released").as_deref(),
            Some("true"),
            "{assigned}"
        );
        assert_eq!(field(&assigned, "redelivery"), Some(count), "{assigned}");
        let highest = again.last().copied().unwrap_or(resume - 1);
        assert_eq!(offset, Some(resume), "{metadata}");
        assert!(
            metadata.starts_with(&format!("ackd/3:o={resume};p={highest};"))
                && metadata.ends_with(";r;end"),
            "A's release should name {highest}, the last offset it handed over: {metadata}"
        );
        eprintln!(
            "released {metadata}; next: {assigned}; flagged {flagged:?} of {resume}..={last}"
        );
        lines
    }
}

/// The reported case: a message answered `retry` is in its 15 s backoff when A gets
/// SIGTERM; the messages after it were read and never handed over.
#[test]
fn a_message_in_its_retry_backoff_at_a_stop_comes_back_flagged() {
    let h = Handover::numbered("handed-retry", 20);
    let a = h.exec_a("retry", 5).spawn();
    a.wait_for_line(|l| at_offset(l, "retry", 5), WAIT);
    a.stop(0, WAIT);
    assert_eq!(h.handed_to_a(), (0..=5).collect(), "A handed 0 to 5 over");
    h.b_flags_exactly(5, &BTreeSet::from([5]), 19);
}

/// The batch case: batches of 10, the second (10 to 19) answered `retry` at 13, so 10
/// to 12 are acknowledged and 13 to 19 were handed over unfinished; the third batch
/// (20 to 29) never was.
#[test]
fn a_batch_in_its_retry_backoff_at_a_stop_comes_back_flagged_from_the_failed_message() {
    let h = Handover::numbered("handed-batch", 30);
    let a = h.exec_a("retry", 13).batches(10).spawn();
    a.wait_for_line(|l| at_offset(l, "retry", 13), WAIT);
    a.stop(0, WAIT);
    assert_eq!(h.handed_to_a(), (0..=19).collect(), "A handed 0 to 19 over");
    h.b_flags_exactly(13, &(13..=19).collect(), 29);
}

/// A message answered `fail` halts the partition (`ACKD_ON_FAILURE=halt`); A is then
/// stopped (exit 1: halted).
#[test]
fn a_halted_message_comes_back_flagged() {
    let h = Handover::numbered("handed-halt", 20);
    let a = h.exec_a("fail", 5).env("ACKD_ON_FAILURE", "halt").spawn();
    a.wait_for_line(|l| at_offset(l, "process_failed", 5), WAIT);
    a.stop(1, WAIT);
    assert_eq!(h.handed_to_a(), (0..=5).collect());
    h.b_flags_exactly(5, &BTreeSet::from([5]), 19);
}

/// The permanent failure comes during the drain: offset 5 is answered `fail` 3 s after
/// A's handler took it, and A got SIGTERM once it had. The halt is the stop's to report
/// (`at=halted`, exit 1), and A's release names 5 as handed over, not the read-ahead.
#[test]
fn a_halt_during_the_drain_is_reported_and_exits_1() {
    let h = Handover::numbered("handed-halt-drain", 20);
    let script = h.dir.join("answering.py");
    std::fs::write(&script, ANSWERING_RECORDER).expect("write the handler");
    let command = format!(
        "python3 {} {} 0 fail 5 3",
        script.display(),
        h.file.display()
    );
    let a = exec_ackd(&h.topic, &h.group, &command)
        .env("ACKD_ON_FAILURE", "halt")
        .spawn();
    common::wait::wait_until(WAIT, || h.handed_to_a().contains(&5));
    let lines = a.stop(1, WAIT);
    let halted: Vec<&String> = all_at(&lines, "halted");
    assert!(
        halted
            .iter()
            .any(|l| field(l, "partition").as_deref() == Some("0")),
        "the stop's report names the partition halted during its drain:\n{}",
        lines.join("\n")
    );
    assert_eq!(h.handed_to_a(), (0..=5).collect(), "A handed 0 to 5 over");
    h.b_flags_exactly(5, &BTreeSet::from([5]), 19);
}

/// The processor call of offset 5 is still running at the stop's drain deadline
/// (`at=drain_timeout in_flight_offset=5`, exit 1): it is committed released with 5
/// as handed over. (The in-process `faulty` processor blocks on it: an exec or http
/// request cannot outlast the drain, as their timeouts must fit in it.)
#[test]
fn a_call_still_running_at_the_drain_deadline_comes_back_flagged() {
    let dir = fresh_dir("handed-drain");
    let release = dir.join("release");
    let mut values: Vec<String> = (0..20).map(|i| format!("v-{i}")).collect();
    values[5] = format!("block:{}", release.display());
    let h = Handover::new("handed-drain", &values);
    let a = AckdBuilder::new(&h.topic, &h.group)
        .env("ACKD_PROCESSOR", "faulty")
        .env("ACKD_COMMIT_INTERVAL_MS", "500")
        .env("ACKD_SHUTDOWN_TIMEOUT_MS", "3000")
        .spawn();
    a.wait_for_line(|l| at_offset(l, "test_blocked", 5), WAIT);
    let lines = a.stop(1, WAIT);
    std::fs::write(&release, "").expect("release the blocked call");
    assert!(
        lines.iter().any(|l| at(l, "drain_timeout")
            && field(l, "in_flight_offset").as_deref() == Some("5")),
        "{}",
        lines.join("\n")
    );
    assert_eq!(
        processed(&lines).iter().map(|m| m.1).collect::<Vec<_>>(),
        (0..5).collect::<Vec<_>>()
    );
    h.b_flags_exactly(5, &BTreeSet::from([5]), 19);
}

/// A revoke: A (two partitions, offset 5 of each answered `retry` once, then a 15 s
/// backoff) is in both backoffs when B joins the group and takes a partition. A's
/// revoke commits it released with 5 handed over: B's `at=assigned` says so, its first
/// call of 5 is flagged (the `faulty` processor's retry reason quotes the flag), and 6
/// to 19 come unflagged.
#[test]
fn a_message_in_its_retry_backoff_at_a_revoke_comes_back_flagged() {
    let (topic, group) = fresh_topic("handed-revoke", 2);
    let values: Vec<String> = (0..20)
        .map(|i| {
            if i == 5 {
                "retry:1".into()
            } else {
                format!("v-{i}")
            }
        })
        .collect();
    let records: Vec<Record<'_>> = (0..2)
        .flat_map(|p| values.iter().map(move |v| (p, None, v.as_bytes(), &[][..])))
        .collect();
    produce_records(&topic, &records);
    released_at_zero(&group, &topic, 2);
    let member = || {
        AckdBuilder::new(&topic, &group)
            .env("ACKD_PROCESSOR", "faulty")
            .env("ACKD_COMMIT_INTERVAL_MS", "500")
    };
    let a = member()
        .env("ACKD_RETRY_INITIAL_MS", "15000")
        .env("ACKD_RETRY_MAX_MS", "15000")
        .spawn();
    a.wait_for_count(|l| at_offset(l, "retry", 5), 2, WAIT);
    let b = member().quick_retries().spawn();
    let assigned = b.wait_for_line(|l| at(l, "assigned"), WAIT);
    let p: i32 = field(&assigned, "partition").unwrap().parse().unwrap();
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
    let on_p = |l: &str| field(l, "partition") == Some(p.to_string());
    b.wait_for_line(|l| on_p(l) && is_processed_at(l, 19), WAIT);
    let b_lines = b.stop(0, WAIT);
    a.stop(0, WAIT);
    let retry = b_lines
        .iter()
        .find(|l| on_p(l) && at_offset(l, "retry", 5))
        .unwrap_or_else(|| panic!("B retried 5:\n{}", b_lines.join("\n")));
    assert!(
        retry.contains("redelivered=true attempt=1"),
        "B's first call of 5 should be flagged: {retry}"
    );
    let seen: Vec<Delivery> = from_processed_lines(1, &b_lines)
        .into_iter()
        .filter(|d| d.partition == p)
        .collect();
    assert_eq!(
        seen.iter().map(|d| d.offset).collect::<Vec<_>>(),
        (5..20).collect::<Vec<_>>()
    );
    let flagged: Vec<i64> = seen
        .iter()
        .filter(|d| d.redelivered)
        .map(|d| d.offset)
        .collect();
    assert_eq!(flagged, vec![5], "{}", b_lines.join("\n"));
    eprintln!("revoked while in backoff: B {assigned}; flagged {flagged:?} of 5..=19");
}

/// A release after a crash: A processes 0 to 19 and is SIGKILLed with only its first
/// commit (offset 0) accepted; B takes over (flagging 0 up to A's dispatch limit), is in
/// its retry's backoff on 5 when it gets SIGTERM, and releases at 5. A had handed 5 to
/// 19 over: B's release names them, as far as the log reached when B was assigned, and
/// C flags them; 20 to 24, produced after B's stop, no one had: unflagged.
#[test]
fn a_release_after_a_crash_passes_on_what_the_crashed_owner_may_have_handed_over() {
    let values: Vec<String> = (0..20)
        .map(|i| {
            if i == 5 {
                "retry:1".into()
            } else {
                format!("v-{i}")
            }
        })
        .collect();
    let h = Handover::new("handed-after-crash", &values);
    let member = || {
        AckdBuilder::new(&h.topic, &h.group)
            .env("ACKD_PROCESSOR", "faulty")
            .env("ACKD_COMMIT_INTERVAL_MS", "600000")
    };
    let a = member().quick_retries().spawn();
    a.wait_for_line(|l| is_processed_at(l, 19), WAIT);
    a.sigkill();
    a.assert_exit(128 + libc::SIGKILL, WAIT);
    let b = member()
        .env("ACKD_RETRY_INITIAL_MS", "15000")
        .env("ACKD_RETRY_MAX_MS", "15000")
        .spawn();
    let b_assigned = b.wait_for_line(|l| at(l, "assigned"), WAIT);
    assert_eq!(
        field(&b_assigned, "released").as_deref(),
        Some("false"),
        "{b_assigned}"
    );
    b.wait_for_line(|l| at_offset(l, "retry", 5), WAIT);
    b.stop(0, WAIT);
    let records: Vec<String> = (20..25).map(|i| format!("v-{i}")).collect();
    let records: Vec<Record<'_>> = records
        .iter()
        .map(|v| (0, None, v.as_bytes(), &[][..]))
        .collect();
    produce_records(&h.topic, &records);
    h.b_flags_exactly(5, &(5..=19).collect(), 24);
}
