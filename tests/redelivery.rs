//! Redelivery known in advance, on a real broker: every message handed to a
//! processor a second time, by any process, says `redelivered=true`; after a crash the
//! next owner's `at=assigned` states `redelivery_at_most=N` and `flagged_through=B`, and
//! per partition it repeats at most N messages, none above B; nothing is lost.
//!
//! Deliveries are read from the `log` processor's per-message lines (`redelivered=true
//! attempt=N` when flagged), or from a file an `exec` handler appends each request to
//! before it answers (tests/common/deliveries.rs). Each test prints its row of the
//! summary table (`--nocapture`).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{
    ackd::*, broker::*, deliveries::*, lines::*, offsets::*, produce::*, topics::*, wait::*,
};

const WAIT: Duration = Duration::from_secs(90);
const PARTITIONS: i32 = 4;
/// SIGKILLs per random-kill test (`REDELIVERY_KILLS` overrides).
const KILLS: usize = 7;

/// A small xorshift generator: the kills' moments, reproducible from the seed printed
/// (`REDELIVERY_SEED` sets it).
struct Rng(u64);

impl Rng {
    fn seeded(case: &str) -> Rng {
        let seed = std::env::var("REDELIVERY_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        eprintln!("{case}: REDELIVERY_SEED={seed}");
        Rng(seed | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Processor {
    /// The in-process `log` processor: deliveries are its per-message lines.
    Log,
    /// `exec` with the recorder handler: deliveries are its file's lines.
    Exec,
}

/// One random-kill case: where it runs, with what, and where the exec handler writes.
struct Case {
    topic: String,
    group: String,
    processor: Processor,
    ordering: &'static str,
    /// `ACKD_BATCH_MAX_MESSAGES` (1: none).
    batch: usize,
    /// `ACKD_GROUP_PROTOCOL=consumer` (KIP-848) instead of classic.
    consumer_protocol: bool,
    dir: PathBuf,
    file: PathBuf,
}

impl Case {
    fn new(name: &str, partitions: i32, processor: Processor, ordering: &'static str) -> Case {
        let (topic, group) = fresh_topic(name, partitions);
        let (dir, file) = deliveries_file(name);
        Case {
            topic,
            group,
            processor,
            ordering,
            batch: 1,
            consumer_protocol: false,
            dir,
            file,
        }
    }

    /// ackd run number `run`: commits every 500 ms; under `key` ordering 8 calls in
    /// flight per partition (and 4 exec children).
    fn spawn(&self, run: usize) -> AckdProcess {
        let b = match self.processor {
            Processor::Log => AckdBuilder::new(&self.topic, &self.group),
            Processor::Exec => exec_ackd(
                &self.topic,
                &self.group,
                &recorder_command(&self.dir, &self.file, run),
            ),
        };
        let b = if self.consumer_protocol {
            b.consumer_protocol()
        } else {
            b
        };
        let b = b
            .env("ACKD_COMMIT_INTERVAL_MS", "500")
            .env("ACKD_ORDERING", self.ordering)
            .env("ACKD_BATCH_MAX_MESSAGES", self.batch.to_string());
        match (self.ordering, self.processor) {
            ("key", Processor::Exec) => b
                .env("ACKD_CONCURRENCY", "8")
                .env("ACKD_EXEC_CONCURRENCY", "4"),
            ("key", Processor::Log) => b.env("ACKD_CONCURRENCY", "8"),
            _ => b,
        }
        .spawn()
    }

    /// The deliveries of run `run` (its process `p`), in order.
    fn deliveries_of(&self, run: usize, p: &AckdProcess) -> Vec<Delivery> {
        match self.processor {
            Processor::Log => from_processed_lines(run, &p.lines()),
            Processor::Exec => from_file(&self.file)
                .into_iter()
                .filter(|d| d.run == run)
                .collect(),
        }
    }

    /// Every delivery of `runs`, in the order they happened (runs one after the other).
    fn ordered(&self, runs: &[AckdProcess]) -> Vec<Delivery> {
        match self.processor {
            Processor::Log => runs
                .iter()
                .enumerate()
                .flat_map(|(r, p)| self.deliveries_of(r, p))
                .collect(),
            Processor::Exec => from_file(&self.file),
        }
    }

    /// After run `run` was killed: its exec handlers have stopped too (they see EOF),
    /// so that nothing it handed over is recorded after the next run began.
    fn wait_handlers_gone(&self, run: usize) {
        if self.processor == Processor::Exec {
            let command = recorder_command(&self.dir, &self.file, run);
            // Each argument ends with a NUL in /proc/PID/cmdline: run 1 is not run 10.
            let args: String = command
                .split(' ')
                .skip(1)
                .map(|a| format!("{a}\0"))
                .collect();
            wait_until(WAIT, || !process_running_with(&args));
        }
    }
}

/// Whether a process's command line (NUL-separated arguments) contains `args`.
fn process_running_with(args: &str) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(args))
    })
}

/// Runs of a case killed at random moments: each is assigned, then, three times out of
/// four, hands over at least one message first; then waits up to 1.5 s and is SIGKILLed.
fn kill_runs(case: &Case, kills: usize, rng: &mut Rng) -> Vec<AckdProcess> {
    let mut runs = Vec::new();
    for run in 0..kills {
        let p = case.spawn(run);
        p.wait_for_line(|l| at(l, "assigned"), WAIT);
        if rng.below(4) > 0 {
            wait_until(WAIT, || !case.deliveries_of(run, &p).is_empty());
        }
        std::thread::sleep(Duration::from_millis(rng.below(1500)));
        p.sigkill();
        p.assert_exit(128 + libc::SIGKILL, WAIT);
        case.wait_handlers_gone(run);
        runs.push(p);
    }
    runs
}

/// The random-kill test of one processor and ordering: a steady producer (about 200
/// messages/s over 4 partitions), `KILLS` SIGKILLed runs, then a last run that drains
/// everything and stops gracefully. Checks and prints what [`assert_flagged`] does.
fn random_kills(name: &str, processor: Processor, ordering: &'static str) {
    random_kills_of(Case::new(name, PARTITIONS, processor, ordering), name);
}

fn random_kills_of(case: Case, name: &str) {
    let started = Instant::now();
    let kills = std::env::var("REDELIVERY_KILLS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(KILLS);
    let mut rng = Rng::seeded(name);
    let producer = SteadyProducer::start(&case.topic, 10, Duration::from_millis(50));
    let mut runs = kill_runs(&case, kills, &mut rng);
    let last = case.spawn(kills);
    last.wait_for_line(|l| at(l, "assigned"), WAIT);
    let delivered = producer.finish();
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    runs.push(last);
    wait_until(WAIT, || {
        let seen: BTreeSet<_> = case
            .ordered(&runs)
            .iter()
            .map(|d| (d.partition, d.offset))
            .collect();
        seen.is_superset(&expected)
    });
    runs[kills].stop(0, WAIT);
    let per_run: Vec<(Vec<Delivery>, Vec<String>)> = runs
        .iter()
        .enumerate()
        .map(|(r, p)| (case.deliveries_of(r, p), p.lines()))
        .collect();
    let (f, rows) = assert_flagged(&per_run, &case.ordered(&runs), &expected);
    assert_committed_to_ends(&case.group, &case.topic, PARTITIONS, &log_ends(&delivered));
    eprintln!(
        "{SUMMARY_HEADER}\n{}\n  ({:.1} s; at=redelivered lines: {})",
        summary(name, kills, &f, &rows),
        started.elapsed().as_secs_f64(),
        redelivered_lines(&runs).join(" | ")
    );
    // Kills that all landed where nothing was read above a commit tested no repeat.
    assert!(
        !f.repeats.is_empty(),
        "{name}: no kill left a message to repeat (REDELIVERY_SEED above reproduces it)"
    );
}

/// The `at=redelivered` lines of every run, shortened to run, partition, flagged, bound.
fn redelivered_lines(runs: &[AckdProcess]) -> Vec<String> {
    runs.iter()
        .enumerate()
        .flat_map(|(r, p)| {
            all_at(&p.lines(), "redelivered")
                .into_iter()
                .map(|l| {
                    let f = |k| field(l, k).unwrap_or_default();
                    format!(
                        "r{r}p{} flagged={} at_most={}",
                        f("partition"),
                        f("flagged"),
                        f("redelivery_at_most")
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn sigkills_under_partition_ordering_with_the_log_processor_repeat_only_flagged_messages() {
    random_kills("kills-log-partition", Processor::Log, "partition");
}

#[test]
fn sigkills_under_key_ordering_with_the_log_processor_repeat_only_flagged_messages() {
    random_kills("kills-log-key", Processor::Log, "key");
}

#[test]
fn sigkills_under_partition_ordering_with_exec_repeat_only_flagged_messages() {
    random_kills("kills-exec-partition", Processor::Exec, "partition");
}

#[test]
fn sigkills_under_key_ordering_with_exec_repeat_only_flagged_messages() {
    random_kills("kills-exec-key", Processor::Exec, "key");
}

/// Batches of up to 10 (exec, partition ordering): every message of a batch says
/// whether it may be a repeat.
#[test]
fn sigkills_with_exec_batches_repeat_only_flagged_messages() {
    let name = "kills-exec-batches";
    let mut case = Case::new(name, PARTITIONS, Processor::Exec, "partition");
    case.batch = 10;
    random_kills_of(case, name);
}

/// Deliveries recorded in `file` by run `run`.
fn recorded(file: &Path, run: usize) -> usize {
    from_file(file).iter().filter(|d| d.run == run).count()
}

/// A zombie: ackd A (exec, recording) is SIGSTOPped mid-stream past its session (1 s
/// classic; 6 s under the consumer protocol, the test broker's), B takes its partitions
/// and works on; then A is continued. Both stop gracefully at the end. In the order the
/// deliveries happened (one file, appended by both), no repeat is unflagged; B repeats at
/// most what its `at=assigned` lines stated, inside the windows.
#[test]
fn a_classic_zombie_woken_after_its_session_expired_repeats_nothing_unflagged() {
    zombie("zombie-classic", false);
}

#[test]
fn a_consumer_protocol_zombie_woken_after_its_session_expired_repeats_nothing_unflagged() {
    zombie("zombie-consumer", true);
}

fn zombie(name: &str, consumer_protocol: bool) {
    let mut case = Case::new(name, PARTITIONS, Processor::Exec, "partition");
    case.consumer_protocol = consumer_protocol;
    let producer = SteadyProducer::start(&case.topic, 5, Duration::from_millis(50));
    let a = case.spawn(0);
    a.wait_for_line(|l| at(l, "assigned"), WAIT);
    wait_until(WAIT, || recorded(&case.file, 0) >= 100);
    a.signal(libc::SIGSTOP);
    let b = case.spawn(1);
    b.wait_for_line(|l| at(l, "assigned"), WAIT);
    let b_before = recorded(&case.file, 1);
    wait_until(WAIT, || recorded(&case.file, 1) >= b_before + 200);
    let before_wake = a.line_count();
    a.signal(libc::SIGCONT);
    a.wait_for_line_from(before_wake, |l| at(l, "revoke_begun"), WAIT);
    let delivered = producer.finish();
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    wait_until(WAIT, || {
        let seen: BTreeSet<_> = from_file(&case.file)
            .iter()
            .map(|d| (d.partition, d.offset))
            .collect();
        seen.is_superset(&expected)
    });
    let (a_lines, b_lines) = (a.stop(0, WAIT), b.stop(0, WAIT));
    let ordered = from_file(&case.file);
    let (mine, theirs): (Vec<Delivery>, Vec<Delivery>) = ordered.iter().partition(|d| d.run == 0);
    // B after A as runs: B's repeats of A's deliveries against what B stated.
    let per_run = vec![(mine, a_lines.clone()), (theirs, b_lines.clone())];
    let (f, rows) = assert_flagged(&per_run, &ordered, &expected);
    let woken: Vec<&String> = a_lines[before_wake..]
        .iter()
        .filter(|l| !is_processed(l))
        .take(20)
        .collect();
    eprintln!(
        "{SUMMARY_HEADER}\n{}\n  the zombie after waking: {woken:?}",
        summary(name, 0, &f, &rows)
    );
}

/// A broker that refuses every commit's metadata (`offset.metadata.max.bytes`=8): ackd
/// still processes everything (committing without metadata), and after each SIGKILL the
/// next owner cannot know, so it flags every message the log holds from its committed
/// offset (`redelivery_at_most` = high watermark - offset): no unflagged repeat.
#[test]
fn with_commit_metadata_refused_a_sigkill_is_followed_by_conservative_flags() {
    let b = Broker::start(BrokerOptions {
        server_config: vec![("offset.metadata.max.bytes".into(), "8".into())],
        ..BrokerOptions::default()
    });
    let (topic, group) = fresh_topic_on(&b, "refused", 2);
    let member = || {
        AckdBuilder::on(&b.bootstrap(), &topic, &group)
            .env("ACKD_COMMIT_INTERVAL_MS", "500")
            .spawn()
    };
    let producer =
        SteadyProducer::start_with(producer_on(&b), &topic, 5, Duration::from_millis(50));
    let mut runs = Vec::new();
    for _ in 0..2 {
        let p = member();
        wait_until(WAIT, || {
            let lines = p.lines();
            count_at(&lines, "committed") >= 2 && processed(&lines).len() >= 50
        });
        p.sigkill();
        p.assert_exit(128 + libc::SIGKILL, WAIT);
        runs.push(p);
    }
    let last = member();
    last.wait_for_line(|l| at(l, "assigned"), WAIT);
    let delivered = producer.finish();
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    runs.push(last);
    let all = |runs: &[AckdProcess]| -> Vec<Delivery> {
        runs.iter()
            .enumerate()
            .flat_map(|(r, p)| from_processed_lines(r, &p.lines()))
            .collect()
    };
    wait_until(WAIT, || {
        let seen: BTreeSet<_> = all(&runs).iter().map(|d| (d.partition, d.offset)).collect();
        seen.is_superset(&expected)
    });
    runs[2].stop(0, WAIT);
    let lines: Vec<Vec<String>> = runs.iter().map(|p| p.lines()).collect();
    assert!(
        lines[0].iter().any(|l| at(l, "commit_metadata_refused")),
        "no at=commit_metadata_refused:\n{}",
        lines[0].join("\n")
    );
    for (r, l) in lines.iter().enumerate().skip(1) {
        for s in stated(l) {
            assert!(
                s.at_most.is_some_and(|n| n > 0) && s.offset.is_some(),
                "run {r}: after a SIGKILL without metadata, a positive bound: {}",
                s.line
            );
        }
    }
    let per_run: Vec<(Vec<Delivery>, Vec<String>)> = lines
        .iter()
        .enumerate()
        .map(|(r, l)| (from_processed_lines(r, l), l.clone()))
        .collect();
    let (f, rows) = assert_flagged(&per_run, &all(&runs), &expected);
    let committed = committed_at(&b, &group, &topic, 2);
    for (p, end) in log_ends(&delivered) {
        assert_eq!(committed[&p], Some(end), "partition {p}");
    }
    eprintln!(
        "{SUMMARY_HEADER}\n{}",
        summary("metadata refused (max 8 bytes)", 2, &f, &rows)
    );
}

/// A previous owner on the older format (`ackd/2`, no dispatch limit) that crashed at
/// offset 8 of 20: ackd cannot know what it started, so `at=assigned` states
/// `redelivery_at_most=12` (high watermark 20 - 8) through offset 19, offsets 8..=19
/// arrive `redelivered=true`, and 20..=24, produced after the assignment, arrive false.
#[test]
fn a_previous_owner_on_the_older_format_gets_everything_up_to_the_log_end_flagged() {
    flagged_up_to_the_log_end("older-format", Some(b"ackd/2:o=8;p=12;end"));
}

/// The same when offset 8 was committed with another client's metadata.
#[test]
fn another_writers_commit_gets_everything_up_to_the_log_end_flagged() {
    flagged_up_to_the_log_end("foreign-writer", Some(b"checkpoint:8"));
}

/// The same when offset 8 was committed without metadata.
#[test]
fn a_commit_without_metadata_gets_everything_up_to_the_log_end_flagged() {
    flagged_up_to_the_log_end("bare-commit", Some(b""));
}

/// The same with the first ackd format (`ackd:processed=`).
#[test]
fn the_first_ackd_format_gets_everything_up_to_the_log_end_flagged() {
    flagged_up_to_the_log_end("first-format", Some(b"ackd:processed=12"));
}

/// The same with current metadata that describes another offset (`o=5` beside 8: moved
/// by a tool): its limit says nothing about 8.
#[test]
fn metadata_beside_another_offset_gets_everything_up_to_the_log_end_flagged() {
    flagged_up_to_the_log_end("stale-metadata", Some(b"ackd/3:o=5;p=6;l=9;end"));
}

/// A group that never committed: everything the log held at the assignment (0..=19,
/// `redelivery_at_most=20`) is flagged, what comes after is not.
#[test]
fn a_group_without_a_committed_offset_gets_what_the_log_held_flagged() {
    flagged_up_to_the_log_end("no-commit", None);
}

/// 20 messages; offset 8 committed with `metadata` (None: nothing committed, the start
/// is 0); ackd is assigned the partition and must flag from the start through 19 and
/// state that count, then 5 messages more arrive unflagged.
fn flagged_up_to_the_log_end(name: &str, metadata: Option<&[u8]>) {
    let (topic, group) = fresh_topic(name, 1);
    produce_numbered(&topic, 20);
    let start = match metadata {
        Some(m) => {
            commit_raw_metadata_on(&broker().bootstrap(), &group, &topic, 0, 8, m);
            8
        }
        None => 0,
    };
    let p = AckdBuilder::new(&topic, &group).spawn();
    let assigned = p.wait_for_line(|l| at(l, "assigned"), WAIT);
    let s = stated(std::slice::from_ref(&assigned)).remove(0);
    let committed = metadata.map(|_| start);
    assert_eq!(
        (s.offset, s.at_most, s.from, s.through),
        (committed, Some(20 - start), committed, Some(19)),
        "{assigned}"
    );
    p.wait_for_count(is_processed, (20 - start) as usize, WAIT);
    let values: Vec<String> = (20..25).map(|i| format!("v-{i}")).collect();
    produce_strs(
        &topic,
        &values.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    p.wait_for_count(is_processed, (25 - start) as usize, WAIT);
    let lines = p.stop(0, WAIT);
    let got: Vec<(i64, bool, u64)> = from_processed_lines(0, &lines)
        .iter()
        .map(|d| (d.offset, d.redelivered, d.attempt))
        .collect();
    let want: Vec<(i64, bool, u64)> = (start..25).map(|o| (o, o < 20, 1)).collect();
    assert_eq!(got, want, "{}", lines.join("\n"));
    let n = (20 - start).to_string();
    assert!(
        all_at(&lines, "redelivered").iter().any(|l| {
            field(l, "flagged") == Some(n.clone())
                && field(l, "redelivery_at_most") == Some(n.clone())
        }),
        "no at=redelivered flagged={n} redelivery_at_most={n}:\n{}",
        lines.join("\n")
    );
    assert_committed(&group, &topic, 0, Some(25));
}

/// The committed metadata of partition 0, as text, polled every 200 ms until `done`
/// says it is what the test waits for; returns it.
#[track_caller]
fn wait_for_metadata(group: &str, topic: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let (_, raw) = committed_raw_metadata_on(&broker().bootstrap(), group, topic, 0);
        let m = String::from_utf8_lossy(&raw).into_owned();
        if done(&m) {
            return m;
        }
        assert!(Instant::now() < deadline, "metadata still {m:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

impl Case {
    /// Run `run` with a holding recorder (answering "hold" messages once `release`
    /// exists), key ordering, and `env`.
    fn holding_member(&self, release: &Path, run: usize, env: &[(&str, &str)]) -> AckdProcess {
        let command = holding_recorder_command(&self.dir, &self.file, run, release);
        env.iter()
            .fold(
                exec_ackd(&self.topic, &self.group, &command)
                    .env("ACKD_COMMIT_INTERVAL_MS", "500")
                    .env("ACKD_ORDERING", "key"),
                |b, (k, v)| b.env(*k, *v),
            )
            .spawn()
    }

    /// Whether run `run` handed over the message at `offset` (partition 0).
    fn delivered_by(&self, run: usize, offset: i64) -> bool {
        from_file(&self.file)
            .iter()
            .any(|d| d.run == run && d.partition == 0 && d.offset == offset)
    }

    /// Run 0, reading far ahead (`ACKD_MAX_PENDING`=5000; windows of 1,000) behind the
    /// held messages:
    /// SIGKILLed once it finished the others and committed them as ranges up to
    /// `highest` (`p=`); returns it and that commit's metadata.
    fn killed_behind_held(&self, release: &Path, highest: i64) -> (AckdProcess, String) {
        let run0 = self.holding_member(
            release,
            0,
            &[
                ("ACKD_MAX_PENDING", "5000"),
                ("ACKD_CONCURRENCY", "16"),
                ("ACKD_EXEC_CONCURRENCY", "4"),
                ("ACKD_REDELIVERY_WINDOW_MAX", "1000"),
            ],
        );
        let p = format!(";p={highest};");
        let m0 = wait_for_metadata(&self.group, &self.topic, |m| m.contains(&p));
        run0.sigkill();
        run0.assert_exit(128 + libc::SIGKILL, WAIT);
        (run0, m0)
    }
}

/// Produces `n` messages with keys `k-<i>` to a one-partition topic: value "hold" at the
/// offsets `held` (a holding recorder does not answer them), "ok" elsewhere.
fn produce_holding(topic: &str, n: i64, held: &[i64]) {
    let messages: Vec<(Option<Vec<u8>>, Vec<u8>)> = (0..n)
        .map(|i| {
            let value = if held.contains(&i) { "hold" } else { "ok" };
            (
                Some(format!("k-{i}").into_bytes()),
                value.as_bytes().to_vec(),
            )
        })
        .collect();
    let delivered = produce(topic, &messages);
    let got: Vec<i64> = delivered
        .iter()
        .zip(&messages)
        .filter(|(_, m)| m.1 == b"hold")
        .map(|(d, _)| d.offset)
        .collect();
    assert_eq!(got, held, "one partition, in order");
}

/// Two crashes in a row behind a message that never finishes (key ordering). Run 0
/// (`ACKD_MAX_PENDING`=5000) holds offsets 1 and 1500 ("hold": the handler does not
/// answer), finishes every other offset up to 1999, commits 1 with them as acknowledged
/// ranges and a dispatch limit past 1500, and is SIGKILLed. Run 1, configured with
/// `ACKD_MAX_PENDING`=2 and `ACKD_REDELIVERY_WINDOW_MAX`=1000 (a rolling change of
/// settings), inherits that window, starts offset 1 again (held), and is SIGKILLed. Run
/// 2 must still flag 1500, which run 0 handed over: whatever run 1's own limit was, the
/// window run 1 inherited is still a window of possible repeats.
#[test]
fn a_second_crash_keeps_the_window_the_crashed_owner_before_it_left() {
    let case = Case::new("double-crash", 1, Processor::Exec, "key");
    let release = case.dir.join("release");
    produce_holding(&case.topic, 2000, &[1, 1999]);
    let member = |run, env: &[(&str, &str)]| case.holding_member(&release, run, env);
    let delivered_by = |run, offset| case.delivered_by(run, offset);
    let (run0, m0) = case.killed_behind_held(&release, 1998);
    assert!(delivered_by(0, 1999), "{m0}");
    let run1 = member(
        1,
        &[
            ("ACKD_MAX_PENDING", "2"),
            ("ACKD_CONCURRENCY", "2"),
            ("ACKD_EXEC_CONCURRENCY", "2"),
            ("ACKD_REDELIVERY_WINDOW_MAX", "1000"),
        ],
    );
    wait_until(WAIT, || delivered_by(1, 1));
    run1.sigkill();
    run1.assert_exit(128 + libc::SIGKILL, WAIT);
    let m1 = committed_raw_metadata_on(&broker().bootstrap(), &case.group, &case.topic, 0);
    std::fs::write(&release, "").unwrap();
    let run2 = member(2, &[]);
    let expected: BTreeSet<(i32, i64)> = (0..2000).map(|o| (0, o)).collect();
    // Run 2 finishes the held messages: everything is committed.
    wait_until(WAIT, || {
        committed_offset(&case.group, &case.topic, 0) == Some(2000)
    });
    run2.stop(0, WAIT);
    let runs = [run0, run1, run2];
    eprintln!(
        "double crash: run 0 committed {m0:?}; run 1 left {:?}",
        String::from_utf8_lossy(&m1.1)
    );
    let per_run: Vec<(Vec<Delivery>, Vec<String>)> = runs
        .iter()
        .enumerate()
        .map(|(r, p)| (case.deliveries_of(r, p), p.lines()))
        .collect();
    let (f, rows) = assert_flagged(&per_run, &from_file(&case.file), &expected);
    eprintln!(
        "{SUMMARY_HEADER}\n{}",
        summary("double crash behind a held message", 2, &f, &rows)
    );
}

/// The window's size at a steady rate (docs/guarantees.md, "Redelivery after a crash,
/// known in advance"): each commit proposes the highest offset read plus about two
/// commit intervals of messages at the partition's rate, at least 1,000. At ~50 messages/s
/// per partition and 500 ms commits that is the minimum, 1,000 (two intervals are ~50;
/// measured: 1,001 each time):
/// after each of 3 SIGKILLs (each run ~2.5 s past its start), the next owner's
/// `redelivery_at_most` is at least that minimum (the last commit's limit is a window past
/// what was read then, which is at least the commit), and at most what the killed run had
/// read above the commit (its highest processed offset + 1 - the resume offset) plus twice
/// the minimum (a new owner that reads the backlog of its restart faster than that asks
/// for a commit early, which doubles the window: room for "about").
#[test]
fn at_a_steady_rate_the_stated_window_is_about_two_commit_intervals_at_least_1000() {
    const MIN: i64 = 1000;
    const SLACK: i64 = 2 * MIN;
    let case = Case::new("window-size", 2, Processor::Log, "partition");
    let producer = SteadyProducer::start(&case.topic, 5, Duration::from_millis(50));
    let mut runs: Vec<AckdProcess> = Vec::new();
    let mut report = Vec::new();
    let mut problems = Vec::new();
    for run in 0..4 {
        let p = case.spawn(run);
        p.wait_for_line(|l| at(l, "assigned"), WAIT);
        if let Some(killed) = runs.last() {
            let highest = highest_per_partition(&from_processed_lines(run - 1, &killed.lines()));
            for s in stated(&p.lines()) {
                let (Some(o), Some(n)) = (s.offset, s.at_most) else {
                    problems.push(format!("no offset or count: {}", s.line));
                    continue;
                };
                let read = highest.get(&s.partition).map_or(0, |h| h + 1 - o);
                report.push(format!("r{run}p{} {n} (read {read})", s.partition));
                if n < MIN {
                    problems.push(format!("stated {n} < the minimum {MIN}: {}", s.line));
                }
                if n > read + SLACK {
                    problems.push(format!(
                        "stated {n} > read above the commit {read} + {SLACK}: {}",
                        s.line
                    ));
                }
            }
        }
        if run == 3 {
            runs.push(p);
            break;
        }
        let start = from_processed_lines(run, &p.lines()).len();
        p.wait_for_count(is_processed, start + 250, WAIT);
        p.sigkill();
        p.assert_exit(128 + libc::SIGKILL, WAIT);
        runs.push(p);
    }
    producer.finish();
    runs[3].stop(0, WAIT);
    eprintln!(
        "window at ~50 messages/s per partition, 500 ms commits (2 intervals = 50 messages, minimum 1000): stated after each SIGKILL: {}",
        report.join(", ")
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The window follows the rate: a backlog read at full speed states a window well
/// beyond the 1,000 floor that the steady 50 messages/s above stays at. ackd A, with
/// 20 s commits, is assigned an empty partition (so it inherits no window from the log)
/// and processes one message, then reads 4,000 produced at once: two intervals of
/// messages are over 2,000 at any rate above 50 messages/s (a debug build on a loaded
/// machine reads some hundreds a second), and a worker that reads past the
/// middle of its window asks for a commit at once, which sizes the next window by that
/// rate. SIGKILLed once it has processed 2,000 (past its first limit, 1,000: a later
/// commit was accepted), B's `redelivery_at_most` is over 2,000: more than twice the
/// floor, and than the low rate's window with its slack.
#[test]
fn read_at_full_speed_the_stated_window_grows_beyond_the_floor() {
    const MIN: i64 = 1000;
    let (topic, group) = fresh_topic("window-rate", 1);
    let spawn = || {
        AckdBuilder::new(&topic, &group)
            .env("ACKD_COMMIT_INTERVAL_MS", "20000")
            .spawn()
    };
    let a = spawn();
    a.wait_for_line(|l| at(l, "assigned"), WAIT);
    produce_numbered(&topic, 1);
    a.wait_for_line(is_processed, WAIT);
    produce_numbered(&topic, 4000);
    a.wait_for_count(is_processed, 2000, WAIT);
    a.sigkill();
    a.assert_exit(128 + libc::SIGKILL, WAIT);
    let b = spawn();
    b.wait_for_line(|l| at(l, "assigned"), WAIT);
    let stated = stated(&b.lines());
    b.stop(0, WAIT);
    let [s] = &stated[..] else {
        panic!("one partition, one at=assigned: {stated:?}");
    };
    let n = s.at_most.unwrap_or_else(|| panic!("no count: {}", s.line));
    eprintln!(
        "window after reading a backlog at full speed, 20 s commits: stated {n}: {}",
        s.line
    );
    assert!(
        n > 2 * MIN,
        "read at full speed, the window stayed near the floor {MIN}: {}",
        s.line
    );
}

/// The highest offset of each partition among `deliveries`.
fn highest_per_partition(deliveries: &[Delivery]) -> std::collections::BTreeMap<i32, i64> {
    let mut out = std::collections::BTreeMap::new();
    for d in deliveries {
        let e = out.entry(d.partition).or_insert(d.offset);
        *e = (*e).max(d.offset);
    }
    out
}

/// Graceful handoffs flag nothing: A is assigned (no message yet), then a steady
/// producer starts; B joins (A releases half the partitions to it), then A stops with
/// SIGTERM (B takes the rest). Every `at=assigned` states `redelivery_at_most=0`, no
/// delivery says `redelivered=true`, and no message comes twice.
#[test]
fn graceful_handoffs_state_nothing_to_redeliver_and_flag_nothing() {
    let case = Case::new("graceful", PARTITIONS, Processor::Log, "partition");
    let a = case.spawn(0);
    a.wait_for_count(|l| at(l, "assigned"), PARTITIONS as usize, WAIT);
    let producer = SteadyProducer::start(&case.topic, 10, Duration::from_millis(50));
    a.wait_for_count(is_processed, 100, WAIT);
    let b = case.spawn(1);
    b.wait_for_line(|l| at(l, "assigned"), WAIT);
    b.wait_for_count(is_processed, 50, WAIT);
    a.stop(0, WAIT);
    b.wait_for_count(|l| at(l, "assigned"), PARTITIONS as usize, WAIT);
    let delivered = producer.finish();
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    let all = || -> Vec<Delivery> {
        from_processed_lines(0, &a.lines())
            .into_iter()
            .chain(from_processed_lines(1, &b.lines()))
            .collect()
    };
    wait_until(WAIT, || {
        let seen: BTreeSet<_> = all().iter().map(|d| (d.partition, d.offset)).collect();
        seen.is_superset(&expected)
    });
    b.stop(0, WAIT);
    let lines: Vec<String> = a.lines().into_iter().chain(b.lines()).collect();
    let stated_lines = stated(&lines);
    let all = all();
    let f = findings(&all);
    let flagged: Vec<&Delivery> = all.iter().filter(|d| d.redelivered).collect();
    assert!(
        stated_lines.iter().all(|s| s.at_most == Some(0))
            && flagged.is_empty()
            && f.repeats.is_empty(),
        "stated {:?}; flagged {flagged:?}; repeats {:?}\n{}",
        stated_lines.iter().map(|s| &s.line).collect::<Vec<_>>(),
        f.repeats,
        lines.join("\n")
    );
    assert_committed_to_ends(&case.group, &case.topic, PARTITIONS, &log_ends(&delivered));
    eprintln!(
        "graceful handoffs: {} messages, {} assignments stated 0, none flagged, none repeated",
        f.messages,
        stated_lines.len()
    );
}

/// One crash behind a held message (key ordering): run 0 holds offset 1, finishes 0 and
/// 2..=1999 (committed as ranges above 1), and is SIGKILLed; then messages are produced
/// past its dispatch limit L. Run 1 skips the acknowledged ranges, hands over 1 again and
/// 2000..=L for the first time, all flagged, and the rest unflagged; its
/// `at=redelivered complete=true` counts exactly the 1 + (L - 1999) it handed over
/// flagged, not the offsets it skipped.
#[test]
fn after_a_crash_behind_a_held_message_the_redelivered_count_leaves_out_the_skipped() {
    let case = Case::new("held-count", 1, Processor::Exec, "key");
    let release = case.dir.join("release");
    produce_holding(&case.topic, 2000, &[1]);
    let (run0, m0) = case.killed_behind_held(&release, 1999);
    std::fs::write(&release, "").unwrap();
    let limit = without_limit(&m0)
        .1
        .unwrap_or_else(|| panic!("no l= in {m0}"));
    let end = limit + 11;
    produce_keyed(&case.topic, (end - 2000) as usize, 2000);
    let run1 = case.holding_member(&release, 1, &[]);
    wait_until(WAIT, || {
        committed_offset(&case.group, &case.topic, 0) == Some(end)
    });
    run1.stop(0, WAIT);
    let runs = [run0, run1];
    let per_run: Vec<(Vec<Delivery>, Vec<String>)> = runs
        .iter()
        .enumerate()
        .map(|(r, p)| (case.deliveries_of(r, p), p.lines()))
        .collect();
    let expected: BTreeSet<(i32, i64)> = (0..end).map(|o| (0, o)).collect();
    let (f, rows) = assert_flagged(&per_run, &from_file(&case.file), &expected);
    let flags: Vec<(i64, bool)> = per_run[1]
        .0
        .iter()
        .map(|d| (d.offset, d.redelivered))
        .collect();
    let want: Vec<(i64, bool)> = std::iter::once((1, true))
        .chain((2000..end).map(|o| (o, o <= limit)))
        .collect();
    let mut sorted = flags.clone();
    sorted.sort();
    assert_eq!(
        sorted, want,
        "run 1's deliveries (offset, redelivered); run 0 committed {m0}"
    );
    eprintln!(
        "{SUMMARY_HEADER}\n{}",
        summary("one crash behind a held message", 1, &f, &rows)
    );
}

/// A new group (nothing committed) over a partition of 30 messages: every message is
/// flagged (conservatively: offsets may have expired or been deleted), and the
/// partition's `at=redelivered` says why, without a previous owner or an "again", and
/// `complete=true` once all of its window was read.
#[test]
fn a_new_group_says_why_it_flags_and_that_its_window_is_complete() {
    let (topic, group) = fresh_topic("fresh-wording", 1);
    produce_numbered(&topic, 30);
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_STOP_AT_END", "true")
        .spawn();
    ackd.assert_exit(0, WAIT);
    let lines = ackd.lines();
    let all = lines.join("\n");
    assert_eq!(processed(&lines).len(), 30, "{all}");
    let flagged = lines
        .iter()
        .filter(|l| is_processed(l) && field(l, "redelivered").as_deref() == Some("true"))
        .count();
    assert_eq!(flagged, 30, "a new group flags every message: {all}");
    let redelivered = all_at(&lines, "redelivered");
    assert_eq!(redelivered.len(), 1, "{all}");
    for l in redelivered {
        assert_eq!(field(l, "flagged").as_deref(), Some("30"), "{l}");
        assert_eq!(field(l, "complete").as_deref(), Some("true"), "{l}");
        let msg = field(l, "msg").unwrap_or_default();
        assert!(
            !msg.contains("previous owner") && !msg.contains("again"),
            "no previous owner is known, nothing is handed over again: {l}"
        );
        assert!(msg.contains("no committed offset"), "says why: {l}");
    }
}
