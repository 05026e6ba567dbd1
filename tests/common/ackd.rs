//! Running the real `ackd` binary: [`AckdBuilder`], [`AckdProcess`], and its peak memory.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::{broker::*, lines::*, spawn::*};

/// A process's peak resident memory (VmHWM of /proc/PID/status) in KiB.
pub fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in {status}"))
}

/// A bootstrap address where nothing listens (port 1 is privileged, never a test's).
pub const CLOSED_PORT: &str = "127.0.0.1:1";

/// Builds an `ackd` process (the real binary) against the test broker.
pub struct AckdBuilder {
    env: Vec<(String, Option<String>)>,
    args: Vec<String>,
}

impl AckdBuilder {
    pub fn new(topic: &str, group: &str) -> Self {
        Self::on(&broker().bootstrap(), topic, group)
    }

    /// Like [`AckdBuilder::new`], with `KAFKA_URL` = `bootstrap` (and the shared broker
    /// not started for it).
    pub fn on(bootstrap: &str, topic: &str, group: &str) -> Self {
        AckdBuilder {
            env: Vec::new(),
            args: Vec::new(),
        }
        .env("KAFKA_URL", bootstrap)
        .env("ACKD_TOPICS", topic)
        .env("ACKD_GROUP_ID", group)
        // A member that dies is replaced within a second (the broker allows it:
        // group.min.session.timeout.ms in broker.rs).
        .env("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "1000")
        .env("ACKD_RDKAFKA_HEARTBEAT_INTERVAL_MS", "300")
    }

    /// Like [`AckdBuilder::new`] for a run that must end at its configuration, before
    /// connecting: no broker is started for it (`KAFKA_URL` is a closed loopback port, so a
    /// configuration that is not refused makes ackd wait for a broker, and the test fail).
    pub fn without_broker(topic: &str, group: &str) -> Self {
        Self::on(CLOSED_PORT, topic, group)
    }

    /// `ACKD_GROUP_PROTOCOL=consumer` (KIP-848): the broker sets the session timeout and
    /// heartbeat (broker.rs: 6 s, 500 ms), and librdkafka refuses the classic ones.
    pub fn consumer_protocol(self) -> Self {
        self.env("ACKD_GROUP_PROTOCOL", "consumer")
            .env_remove("ACKD_RDKAFKA_SESSION_TIMEOUT_MS")
            .env_remove("ACKD_RDKAFKA_HEARTBEAT_INTERVAL_MS")
    }

    /// Sets an environment variable (later values win).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), Some(value.into())));
        self
    }

    /// Removes an environment variable set earlier (e.g. a default).
    pub fn env_remove(mut self, key: impl Into<String>) -> Self {
        self.env.push((key.into(), None));
        self
    }

    /// Batches of at most `max` messages, with a wait long enough (2 s) that a backlog
    /// produced before the start fills them whole.
    pub fn batches(self, max: usize) -> Self {
        self.env("ACKD_BATCH_MAX_MESSAGES", max.to_string())
            .env("ACKD_BATCH_MAX_WAIT_MS", "2000")
    }

    /// Quick retries (50 ms, at most 200 ms) so that a test's retried messages come again
    /// within its waits.
    pub fn quick_retries(self) -> Self {
        self.env("ACKD_RETRY_INITIAL_MS", "50")
            .env("ACKD_RETRY_MAX_MS", "200")
    }

    /// Adds a command-line argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Whether `arg` is among the command-line arguments.
    pub fn has_arg(&self, arg: &str) -> bool {
        self.args.iter().any(|a| a == arg)
    }

    /// The environment the child gets (besides PATH and HOME).
    pub fn env_map(&self) -> BTreeMap<String, String> {
        let mut map = BTreeMap::new();
        for (k, v) in &self.env {
            match v {
                Some(v) => map.insert(k.clone(), v.clone()),
                None => map.remove(k),
            };
        }
        map
    }

    pub fn spawn(self) -> AckdProcess {
        let bin = env!("CARGO_BIN_EXE_ackd");
        let mut cmd = Command::new(bin);
        cmd.args(&self.args)
            .env_clear()
            .envs(passthrough_env())
            .envs(self.env_map())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = spawn_tied(cmd).unwrap_or_else(|e| panic!("spawn {bin}: {e}"));
        let output = Arc::new(Output::default());
        let echo = std::env::var_os("ACKD_TEST_ECHO").is_some();
        let pid = child.id();
        let readers = [
            reader(
                child.stdout.take().expect("stdout"),
                true,
                pid,
                echo,
                &output,
            ),
            reader(
                child.stderr.take().expect("stderr"),
                false,
                pid,
                echo,
                &output,
            ),
        ];
        AckdProcess {
            pid,
            started: Instant::now(),
            child: Mutex::new(child),
            status: Mutex::new(None),
            output,
            _readers: readers,
        }
    }
}

/// ackd with the exec processor running `command`, and quick retries.
pub fn exec_ackd(topic: &str, group: &str, command: &str) -> AckdBuilder {
    AckdBuilder::new(topic, group)
        .env("ACKD_PROCESSOR", "exec")
        .env("ACKD_EXEC_COMMAND", command)
        .quick_retries()
}

/// ackd with the http processor POSTing to `url`, and quick retries.
pub fn http_ackd(topic: &str, group: &str, url: &str) -> AckdBuilder {
    AckdBuilder::new(topic, group)
        .env("ACKD_PROCESSOR", "http")
        .env("ACKD_HTTP_URL", url)
        .quick_retries()
}

#[derive(Default)]
struct Output {
    lines: Mutex<Lines>,
    changed: Condvar,
}

#[derive(Default)]
struct Lines {
    all: Vec<String>,
    /// When each line of `all` arrived: orders lines across processes.
    arrived: Vec<Instant>,
    stdout: Vec<String>,
    closed: usize,
}

fn reader(
    stream: impl Read + Send + 'static,
    is_stdout: bool,
    pid: u32,
    echo: bool,
    output: &Arc<Output>,
) -> thread::JoinHandle<()> {
    let output = Arc::clone(output);
    thread::Builder::new()
        .name(format!(
            "ackd-{pid}-{}",
            if is_stdout { "stdout" } else { "stderr" }
        ))
        .spawn(move || {
            let mut r = BufReader::new(stream);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let line = String::from_utf8_lossy(&buf)
                            .trim_end_matches(['\n', '\r'])
                            .to_string();
                        if echo {
                            eprintln!("[ackd {pid}] {line}");
                        }
                        let mut l = output.lines.lock().unwrap_or_else(|e| e.into_inner());
                        if is_stdout {
                            l.stdout.push(line.clone());
                        }
                        l.all.push(line);
                        l.arrived.push(Instant::now());
                        output.changed.notify_all();
                    }
                }
            }
            let mut l = output.lines.lock().unwrap_or_else(|e| e.into_inner());
            l.closed += 1;
            output.changed.notify_all();
        })
        .expect("spawn ackd output reader")
}

/// A running `ackd`. Killed (SIGKILL) on drop if still running, and with the test process.
pub struct AckdProcess {
    pid: u32,
    started: Instant,
    child: Mutex<Child>,
    status: Mutex<Option<ExitStatus>>,
    output: Arc<Output>,
    _readers: [thread::JoinHandle<()>; 2],
}

impl AckdProcess {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// All output lines so far, stdout and stderr interleaved in arrival order.
    pub fn lines(&self) -> Vec<String> {
        self.lock_lines().all.clone()
    }

    /// All output lines so far with the time each arrived.
    pub fn timed_lines(&self) -> Vec<(Instant, String)> {
        let l = self.lock_lines();
        l.arrived
            .iter()
            .copied()
            .zip(l.all.iter().cloned())
            .collect()
    }

    /// Stdout lines so far.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.lock_lines().stdout.clone()
    }

    /// Number of lines so far (a cursor for [`AckdProcess::wait_for_line_from`]).
    pub fn line_count(&self) -> usize {
        self.lock_lines().all.len()
    }

    /// Waits for the first line matching `pred`; panics with all output after `timeout`,
    /// or as soon as ackd's output is closed without a match.
    #[track_caller]
    pub fn wait_for_line(&self, pred: impl Fn(&str) -> bool, timeout: Duration) -> String {
        self.wait_for_line_from(0, pred, timeout)
    }

    /// Like [`AckdProcess::wait_for_line`], looking only at lines with index >= `from`.
    #[track_caller]
    pub fn wait_for_line_from(
        &self,
        from: usize,
        pred: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> String {
        let mut found = self.wait_for_matches(from, &pred, 1, timeout, "a matching line");
        found.swap_remove(0)
    }

    /// Waits until `n` lines match `pred`; returns the first `n` matching lines.
    #[track_caller]
    pub fn wait_for_count(
        &self,
        pred: impl Fn(&str) -> bool,
        n: usize,
        timeout: Duration,
    ) -> Vec<String> {
        self.wait_for_matches(0, &pred, n, timeout, &format!("{n} matching lines"))
    }

    #[track_caller]
    fn wait_for_matches(
        &self,
        from: usize,
        pred: &dyn Fn(&str) -> bool,
        n: usize,
        timeout: Duration,
        what: &str,
    ) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut scanned = from;
        let mut found = Vec::new();
        let mut l = self.lock_lines();
        loop {
            while scanned < l.all.len() && found.len() < n {
                if pred(&l.all[scanned]) {
                    found.push(l.all[scanned].clone());
                }
                scanned += 1;
            }
            if found.len() >= n {
                return found;
            }
            let now = Instant::now();
            let reason = if l.closed >= 2 {
                Some("ackd's output closed (it exited)".to_string())
            } else if now >= deadline {
                Some(format!("timed out after {timeout:?}"))
            } else {
                None
            };
            if let Some(reason) = reason {
                let all = l.all.clone();
                drop(l);
                panic!(
                    "waiting for {what} (found {}): {reason}; ackd pid {} output ({} lines):\n{}",
                    found.len(),
                    self.pid,
                    all.len(),
                    all.join("\n")
                );
            }
            l = self
                .output
                .changed
                .wait_timeout(l, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sends `sig` unless the child has already been reaped.
    pub fn signal(&self, sig: libc::c_int) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        if status.is_none() {
            *status = child.try_wait().expect("try_wait on ackd");
        }
        if status.is_none() {
            // SAFETY: the child is not reaped (we hold its lock), so the pid is still ours.
            unsafe {
                libc::kill(self.pid as libc::pid_t, sig);
            }
        }
    }

    pub fn sigterm(&self) {
        self.signal(libc::SIGTERM);
    }

    pub fn sigkill(&self) {
        self.signal(libc::SIGKILL);
    }

    /// The exit code if ackd has exited (128+signo for a signal death).
    pub fn try_exit_code(&self) -> Option<i32> {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        if status.is_none() {
            *status = child.try_wait().expect("try_wait on ackd");
        }
        status.map(exit_code)
    }

    /// Waits for ackd to exit and for its output to be fully read; returns the exit code
    /// (128+signo for a signal death). On timeout kills it and panics with its output.
    #[track_caller]
    pub fn wait_exit(&self, timeout: Duration) -> i32 {
        let deadline = Instant::now() + timeout;
        let code = loop {
            if let Some(code) = self.try_exit_code() {
                break code;
            }
            if Instant::now() >= deadline {
                self.sigkill();
                let _ = self.child.lock().unwrap_or_else(|e| e.into_inner()).wait();
                panic!(
                    "ackd pid {} did not exit within {timeout:?} (killed it); output:\n{}",
                    self.pid,
                    self.lines().join("\n")
                );
            }
            thread::sleep(Duration::from_millis(10));
        };
        // Let the readers drain the pipes so that `lines()` is complete.
        let drain_deadline = Instant::now() + Duration::from_secs(5);
        let mut l = self.lock_lines();
        while l.closed < 2 {
            let now = Instant::now();
            if now >= drain_deadline {
                break;
            }
            l = self
                .output
                .changed
                .wait_timeout(l, drain_deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        code
    }

    /// Waits for ackd to exit (as [`AckdProcess::wait_exit`]) and asserts that its exit code
    /// is `code`; on a mismatch panics with ackd's output.
    #[track_caller]
    pub fn assert_exit(&self, code: i32, timeout: Duration) {
        let got = self.wait_exit(timeout);
        assert_eq!(
            got,
            code,
            "ackd pid {} exit code; output:\n{}",
            self.pid,
            self.lines().join("\n")
        );
    }

    /// Stops ackd with SIGTERM, asserts that it exits `code` ([`AckdProcess::assert_exit`]),
    /// and returns all its lines.
    #[track_caller]
    pub fn stop(&self, code: i32, timeout: Duration) -> Vec<String> {
        self.sigterm();
        self.assert_exit(code, timeout);
        self.lines()
    }

    /// [`AckdProcess::stop`] with exit 0 for an exec run: every child was stopped by
    /// EOF (it answered what it held first, and did not need SIGTERM or SIGKILL).
    #[track_caller]
    pub fn stop_exec_cleanly(&self, timeout: Duration) -> Vec<String> {
        let lines = self.stop(0, timeout);
        let stopped = all_at(&lines, "exec_stopped");
        assert!(
            !stopped.is_empty(),
            "no at=exec_stopped:\n{}",
            lines.join("\n")
        );
        for l in stopped {
            assert_eq!(field(l, "how").as_deref(), Some("eof"), "{l}");
        }
        lines
    }

    /// Waits for ackd to exit 78 (a configuration error) and asserts that its first
    /// `at=config_error` line names `setting`; returns that line.
    #[track_caller]
    pub fn assert_config_error(&self, setting: &str, timeout: Duration) -> String {
        self.assert_exit(78, timeout);
        let lines = self.lines();
        let line = lines
            .iter()
            .find(|l| at(l, "config_error"))
            .unwrap_or_else(|| panic!("no at=config_error line:\n{}", lines.join("\n")))
            .clone();
        assert_eq!(field(&line, "setting").as_deref(), Some(setting), "{line}");
        line
    }

    /// Time since spawn.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    fn lock_lines(&self) -> std::sync::MutexGuard<'_, Lines> {
        self.output.lines.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => -1,
    }
}

impl Drop for AckdProcess {
    fn drop(&mut self) {
        if self.try_exit_code().is_none() {
            self.sigkill();
            let _ = self.child.lock().unwrap_or_else(|e| e.into_inner()).wait();
        }
    }
}
