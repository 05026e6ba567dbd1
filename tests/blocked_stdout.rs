//! A log drain that takes nothing (stdout a pipe nobody reads): processing, commits and the
//! graceful stop go on, the lines that could not wait are dropped and counted, and the count
//! is reported once stdout takes lines again. Before this, ackd with 50,000 messages and an
//! unread stdout committed nothing and was still running 40 s after SIGTERM.
//!
//! A drain that takes lines, slowly, is no stuck one: it slows ackd down and loses nothing,
//! at exit too, up to the shutdown timeout; what that cannot wait for is counted in the exit
//! line, written last.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{ackd::*, lines::*, offsets::*, produce::*, spawn::*, topics::*};

const MESSAGES: usize = 20_000;
const WAIT: Duration = Duration::from_secs(90);

/// ackd on `topic` with stdout and stderr pipes that nobody reads yet.
fn spawn_unread(topic: &str, group: &str) -> Child {
    let env = AckdBuilder::new(topic, group)
        .env("ACKD_COMMIT_INTERVAL_MS", "500")
        .env("ACKD_SHUTDOWN_TIMEOUT_MS", "5000")
        .env_map();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ackd"));
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    spawn_tied(cmd).expect("spawn ackd")
}

/// Setup: a topic with a backlog whose per-message lines (~4 MB) are far more than a pipe
/// (64 KiB) and ackd's line buffer (1 MiB) hold. Returns (topic, group, log ends).
fn backlog(name: &str) -> (String, String, std::collections::BTreeMap<i32, i64>) {
    let (topic, group) = fresh_topic(name, 2);
    let delivered = produce_keyed(&topic, MESSAGES, 0);
    (topic, group, log_ends(&delivered))
}

/// Waits until `group` has committed `ends` on every partition of `topic`.
#[track_caller]
fn wait_committed(group: &str, topic: &str, ends: &std::collections::BTreeMap<i32, i64>) {
    let deadline = Instant::now() + WAIT;
    loop {
        let c = committed(group, topic, 2);
        if ends.iter().all(|(p, e)| c[p] == Some(*e)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "with stdout unread, committed {c:?} never reached the log ends {ends:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Reads every line of ackd's stdout on a thread (from now on).
fn read_all(child: &mut Child) -> std::thread::JoinHandle<Vec<String>> {
    let out = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    })
}

/// Waits up to `timeout` for the child to exit; its exit code, or None if it did not.
fn exit_within(child: &mut Child, timeout: Duration) -> Option<i32> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status.code();
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn with_stdout_never_read_it_commits_everything_and_stops_within_the_deadline() {
    let (topic, group, ends) = backlog("stdout-stuck");
    let mut ackd = spawn_unread(&topic, &group);
    wait_committed(&group, &topic, &ends);

    let stopping = Instant::now();
    // SAFETY: kill(2) of our own, unreaped child.
    unsafe { libc::kill(ackd.id() as libc::pid_t, libc::SIGTERM) };
    // ACKD_SHUTDOWN_TIMEOUT_MS is 5 s; the stdout is still not read.
    let code = exit_within(&mut ackd, Duration::from_secs(8));
    let took = stopping.elapsed();
    let _ = ackd.kill();
    let _ = ackd.wait();
    assert_eq!(
        code,
        Some(0),
        "exit after SIGTERM with stdout unread (waited {took:?})"
    );
    eprintln!(
        "stdout never read: {MESSAGES} messages committed to the log ends {ends:?}, exit 0 {took:?} after SIGTERM"
    );
}

#[test]
fn lines_dropped_while_stdout_was_stuck_are_reported_once_it_reads_again() {
    let (topic, group, ends) = backlog("stdout-late");
    let mut ackd = spawn_unread(&topic, &group);
    wait_committed(&group, &topic, &ends);

    // The drain comes back: what was stuck is written, then the report.
    let reader = read_all(&mut ackd);
    // SAFETY: kill(2) of our own, unreaped child.
    unsafe { libc::kill(ackd.id() as libc::pid_t, libc::SIGTERM) };
    let code = exit_within(&mut ackd, WAIT);
    let lines = reader.join().expect("reader");
    let all = lines.join("\n");
    assert_eq!(code, Some(0), "{all}");

    let reports: Vec<&String> = lines.iter().filter(|l| at(l, "lines_dropped")).collect();
    assert_eq!(reports.len(), 1, "one report expected:\n{}", tail(&lines));
    let dropped: u64 = field(reports[0], "count").unwrap().parse().unwrap();
    assert!(dropped > 0, "{}", reports[0]);
    // Every per-message line was written or counted (the count has the other lines
    // dropped meanwhile too: commits, summaries).
    let written = lines.iter().filter(|l| is_processed(l)).count() as u64;
    assert!(
        written < MESSAGES as u64 && written + dropped >= MESSAGES as u64,
        "{written} per-message lines written, {dropped} lines dropped, of {MESSAGES}"
    );
    // The stop's own lines made it, and the exit line says how many were dropped.
    assert!(
        lines.iter().any(|l| at(l, "final_commit")),
        "{}",
        tail(&lines)
    );
    let exit = lines
        .iter()
        .find(|l| at(l, "exit"))
        .unwrap_or_else(|| panic!("no exit line:\n{}", tail(&lines)));
    assert_eq!(
        field(exit, "lines_dropped"),
        Some(dropped.to_string()),
        "{exit}"
    );
    eprintln!("stdout stuck, then read: {written} per-message lines written, {dropped} dropped and reported, exit 0");
}

/// ackd on `topic` that stops at the log ends, its stdout read by a thread that takes at
/// most `bytes_per_s` (a log drain slower than ackd, that keeps reading): the exit code
/// and every byte the reader received.
fn run_read_slowly(
    topic: &str,
    group: &str,
    bytes_per_s: u64,
    shutdown_timeout_ms: u64,
) -> (Option<i32>, Vec<u8>) {
    let env = AckdBuilder::new(topic, group)
        .env("ACKD_STOP_AT_END", "true")
        .env("ACKD_SHUTDOWN_TIMEOUT_MS", shutdown_timeout_ms.to_string())
        .env_map();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ackd"));
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut ackd = spawn_tied(cmd).expect("spawn ackd");
    let mut out = ackd.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let started = Instant::now();
        let (mut got, mut piece) = (Vec::new(), [0u8; 4096]);
        loop {
            match out.read(&mut piece) {
                Ok(0) | Err(_) => return got,
                Ok(n) => got.extend_from_slice(&piece[..n]),
            }
            // Paced: the bytes taken so far at `bytes_per_s`.
            let due = Duration::from_secs_f64(got.len() as f64 / bytes_per_s as f64);
            if let Some(ahead) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(ahead);
            }
        }
    });
    let code = exit_within(&mut ackd, WAIT);
    let _ = ackd.kill();
    let _ = ackd.wait();
    (code, reader.join().expect("reader"))
}

/// The lines of what a reader received.
fn lines_of(out: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(out)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The output ends with a whole line (not cut by the exit).
#[track_caller]
fn assert_ends_whole(out: &[u8]) {
    let text = String::from_utf8_lossy(out);
    assert!(
        text.ends_with('\n'),
        "the output ends inside a line: {:?}",
        &text[text.len().saturating_sub(200)..]
    );
}

#[test]
fn a_slow_reader_gets_every_line_and_the_exit_line_last() {
    // ~2.2 MB of per-message lines, twice what the line buffer holds; at 512 KiB/s one
    // write of the buffer would take 2 s, over the 1 s a stuck stdout is given.
    const N: usize = 16_000;
    let (topic, group) = fresh_topic("stdout-slow", 2);
    produce_keyed(&topic, N, 0);
    let (code, out) = run_read_slowly(&topic, &group, 512 * 1024, 25_000);
    let lines = lines_of(&out);
    assert_eq!(code, Some(0), "{}", tail(&lines));

    let counts = processed_counts(&lines);
    assert_eq!(
        counts.len(),
        N,
        "{} of {N} per-message lines arrived ({} bytes read):\n{}",
        counts.len(),
        out.len(),
        tail(&lines)
    );
    assert_eq!(count_at(&lines, "lines_dropped"), 0, "{}", tail(&lines));
    let last = lines.last().expect("no line at all");
    assert!(
        at(last, "exit"),
        "the exit line is not last:\n{}",
        tail(&lines)
    );
    assert_eq!(field(last, "lines_dropped"), None, "{last}");
    assert_ends_whole(&out);
    eprintln!(
        "read at 512 KiB/s: {N} of {N} per-message lines and the exit line, {} bytes",
        out.len()
    );
}

#[test]
fn at_exit_what_the_shutdown_timeout_cannot_wait_for_is_counted_in_the_exit_line() {
    // ~1.1 MB of lines, nearly all of them queued when the end is reached; at 128 KiB/s a
    // 3 s shutdown timeout writes about a third of them: the rest is dropped and counted.
    const N: usize = 8_000;
    let (topic, group) = fresh_topic("stdout-slower", 2);
    produce_keyed(&topic, N, 0);
    let started = Instant::now();
    let (code, out) = run_read_slowly(&topic, &group, 128 * 1024, 3_000);
    let lines = lines_of(&out);
    assert_eq!(code, Some(0), "{}", tail(&lines));
    assert_ends_whole(&out);

    let last = lines.last().expect("no line at all");
    assert!(
        at(last, "exit"),
        "the exit line is not last:\n{}",
        tail(&lines)
    );
    let dropped: u64 = field(last, "lines_dropped")
        .unwrap_or_else(|| panic!("no count in {last}"))
        .parse()
        .unwrap();
    let written = processed_counts(&lines).len() as u64;
    assert!(
        written < N as u64 && written + dropped >= N as u64,
        "{written} per-message lines written, {dropped} lines dropped, of {N}"
    );
    eprintln!(
        "read at 128 KiB/s, shutdown timeout 3 s: {written} per-message lines written, \
         {dropped} dropped and counted in the exit line, exit 0 after {:?}",
        started.elapsed()
    );
}

fn tail(lines: &[String]) -> String {
    lines[lines.len().saturating_sub(40)..].join("\n")
}
