//! One child process: started with ackd's secrets withheld, its stdout and stderr read,
//! ended by a kill or a graceful stop.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use super::config::ExecConfig;
use super::lines::{read_lines, Line};

/// How long a child that is being replaced may take to exit on SIGTERM before SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// Sends `signal` to the child's process group (sh and whatever it started).
fn signal_group(pid: u32, signal: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) with a negative pid signals that process group; it has no
        // memory effects. The group is the child's own (process_group(0)) and the child
        // is not reaped yet when this is called, so the id is still ours.
        unsafe {
            libc::kill(-pid, signal);
        }
    }
}

/// The variables of ackd's environment that carry its credentials
/// ([`crate::config::settings::is_secret_variable`]), except those `pass` names.
fn withheld_variables(pass: &[String]) -> Vec<std::ffi::OsString> {
    std::env::vars_os()
        .filter(|(name, value)| {
            let (Some(name), value) = (name.to_str(), value.to_string_lossy()) else {
                return false;
            };
            crate::config::settings::is_secret_variable(name, &value)
                && !pass.contains(&crate::config::settings::variable_name(name))
        })
        .map(|(name, _)| name)
        .collect()
}

/// One running child: `sh` and what it started, in one process group. It is gone only
/// when `sh` has exited **and** its stdout is closed: `sh` may run the handler as its
/// own child, and a signal meant for every process (Heroku signals the whole dyno) can
/// end `sh` while the handler goes on answering.
pub(super) struct Running {
    pub(super) id: usize,
    pub(super) pid: u32,
    child: Child,
    /// Its stdin; dropped to give it EOF.
    stdin: Option<ChildStdin>,
    /// Request lines given and not yet written to `stdin`, written while ackd waits for
    /// its output ([`Running::next_output`]), so that a child busy writing replies
    /// never blocks ackd reading them. Requests given together go in one write.
    unwritten: Vec<u8>,
    /// Lines of its stdout; closed at EOF.
    lines: mpsc::Receiver<Line>,
    /// Its stdout reached EOF (every process holding it is gone).
    eof: bool,
    /// Logs its stderr; awaited when it is gone, so that no line of it is lost.
    stderr: Option<tokio::task::JoinHandle<()>>,
    pub(super) started: Instant,
}

impl Drop for Running {
    fn drop(&mut self) {
        // Abandoned (a forced exit, a runtime shutting down): never leave it behind.
        if !self.gone_now() {
            signal_group(self.pid, libc::SIGKILL);
        }
    }
}

impl Running {
    pub(super) fn start(id: usize, config: &ExecConfig) -> std::io::Result<Running> {
        let mut command = Command::new("sh");
        // A handler is often someone else's code: ackd's credentials stay with ackd.
        for name in withheld_variables(&config.pass_secrets) {
            command.env_remove(name);
        }
        let mut child = command
            .arg("-c")
            .arg(&config.command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("ACKD_EXEC_CHILD", id.to_string())
            // Its own group: ackd alone decides when it stops (a Ctrl-C meant for ackd
            // must not kill it with messages in flight), and signals reach all of it.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().unwrap_or(0);
        let stdin = child.stdin.take();
        // One line waits, one is being read: at most two lines of it in memory.
        let (tx, lines) = mpsc::channel(1);
        let max = config.max_line_bytes;
        if let Some(stdout) = child.stdout.take() {
            tokio::spawn(read_lines(stdout, max, move |line| {
                let tx = tx.clone();
                async move { tx.send(line).await.is_ok() }
            }));
        }
        let stderr = child.stderr.take().map(|stderr| {
            tokio::spawn(read_lines(stderr, max, move |line| async move {
                let truncated_bytes = (line.cut > 0).then_some(line.cut);
                tracing::info!(
                    at = "exec_stderr",
                    child = id,
                    pid,
                    line = line.text,
                    truncated_bytes
                );
                true
            }))
        });
        tracing::info!(at = "exec_started", child = id, pid);
        Ok(Running {
            id,
            pid,
            child,
            stdin,
            unwritten: Vec::new(),
            lines,
            eof: false,
            stderr,
            started: Instant::now(),
        })
    }

    /// Queues a request line for its stdin (written in order, whole lines, while ackd
    /// waits for the child's output).
    pub(super) fn give(&mut self, line: &[u8]) -> Result<(), String> {
        if self.stdin.is_none() {
            return Err("its stdin is closed".to_string());
        }
        self.unwritten.extend_from_slice(line);
        Ok(())
    }

    /// What it did next: a line on stdout, its stdout closed, or a request that could
    /// not be written to its stdin. Writes what it was given meanwhile.
    pub(super) async fn next_output(&mut self) -> Output {
        loop {
            if self.eof {
                return Output::Closed;
            }
            let (lines, stdin, unwritten) = (&mut self.lines, &mut self.stdin, &self.unwritten);
            let writing = !unwritten.is_empty() && stdin.is_some();
            let written = tokio::select! {
                biased;
                line = lines.recv() => match line {
                    Some(line) => return Output::Line(line),
                    None => {
                        self.eof = true;
                        return Output::Closed;
                    }
                },
                // `write` is cancel-safe: what it wrote is what it returns.
                written = async { stdin.as_mut().expect("writing").write(unwritten).await }, if writing => written,
            };
            match written {
                Ok(0) => return Output::WriteFailed("its stdin is closed".to_string()),
                Ok(n) if n == self.unwritten.len() => self.unwritten.clear(),
                Ok(n) => {
                    self.unwritten.drain(..n);
                }
                Err(e) => return Output::WriteFailed(format!("cannot write to its stdin: {e}")),
            }
        }
    }

    /// EOF on its stdin (a stop waits until the child answered all it held, so all it
    /// was given is written).
    pub(super) fn close_stdin(&mut self) {
        self.stdin = None;
        self.unwritten = Vec::new();
    }

    /// The next stdout line; `None` at EOF.
    async fn next_line(&mut self) -> Option<Line> {
        if self.eof {
            return None;
        }
        let line = self.lines.recv().await;
        self.eof = line.is_none();
        line
    }

    fn gone_now(&mut self) -> bool {
        self.eof && !matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits until it is gone (stdout lines meanwhile are dropped); `sh`'s exit status.
    async fn wait_gone(&mut self) -> std::io::Result<std::process::ExitStatus> {
        while self.next_line().await.is_some() {}
        let status = self.child.wait().await;
        if let Some(stderr) = self.stderr.as_mut() {
            let _ = stderr.await;
            self.stderr = None;
        }
        status
    }

    /// Why it went away, after its stdout closed.
    pub(super) async fn gone_reason(&mut self) -> String {
        match tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await {
            Ok(status) => exited(status),
            Err(_) => "closed its stdout".to_string(),
        }
    }

    /// Why a write to its stdin failed: most often because it exited, which says more.
    pub(super) async fn write_failed_reason(&mut self, reason: String) -> String {
        match tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await {
            Ok(status) => format!("{} ({reason})", exited(status)),
            Err(_) => reason,
        }
    }

    /// Ends a child that failed: SIGTERM to its group, SIGKILL after [`KILL_GRACE`].
    pub(super) async fn kill(&mut self) {
        self.close_stdin();
        if !self.gone_now() {
            signal_group(self.pid, libc::SIGTERM);
        }
        if tokio::time::timeout(KILL_GRACE, self.wait_gone())
            .await
            .is_err()
        {
            signal_group(self.pid, libc::SIGKILL);
            let _ = tokio::time::timeout(KILL_GRACE, self.wait_gone()).await;
        }
    }

    /// The graceful end: EOF, SIGTERM halfway to `deadline`, SIGKILL at it.
    pub(super) async fn stop(mut self, deadline: Instant) {
        let begun = Instant::now();
        self.close_stdin();
        let halfway = begun + deadline.saturating_duration_since(begun) / 2;
        let mut how = "eof";
        let mut status = tokio::time::timeout_at(halfway.into(), self.wait_gone()).await;
        if status.is_err() {
            how = "sigterm";
            signal_group(self.pid, libc::SIGTERM);
            status = tokio::time::timeout_at(deadline.into(), self.wait_gone()).await;
        }
        if status.is_err() {
            how = "sigkill";
            signal_group(self.pid, libc::SIGKILL);
            status = tokio::time::timeout(Duration::from_secs(1), self.wait_gone()).await;
        }
        let status = match status {
            Ok(Ok(s)) => s.to_string(),
            Ok(Err(e)) => format!("unknown ({e})"),
            Err(_) => "still running".to_string(),
        };
        tracing::info!(
            at = "exec_stopped",
            child = self.id,
            pid = self.pid,
            how,
            status,
            duration_ms = begun.elapsed().as_millis() as u64
        );
    }
}

/// What a child did, as [`Running::next_output`] sees it.
pub(super) enum Output {
    Line(Line),
    Closed,
    WriteFailed(String),
}

fn exited(status: std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(s) => format!("exited ({s})"),
        Err(e) => format!("exited (status unknown: {e})"),
    }
}
