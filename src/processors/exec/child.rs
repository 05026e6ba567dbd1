//! One child process: started with ackd's secrets withheld, its stdout and stderr read
//! line by line (each line bounded), ended by a kill or a graceful stop.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use crate::settings::ExecSettings;

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
/// ([`crate::settings::is_secret_variable`]), except those `pass` names.
fn withheld_variables(pass: &[String]) -> Vec<std::ffi::OsString> {
    std::env::vars_os()
        .filter(|(name, value)| {
            let (Some(name), value) = (name.to_str(), value.to_string_lossy()) else {
                return false;
            };
            crate::settings::is_secret_variable(name, &value)
                && !pass.contains(&crate::settings::variable_name(name))
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
    /// Request lines for its stdin, written in order by `writer`; dropped to give it EOF.
    requests: Option<mpsc::UnboundedSender<Vec<u8>>>,
    /// Writes `requests` to its stdin, so that a child busy writing replies never
    /// blocks ackd reading them; says why on `write_failed` if a write fails.
    writer: tokio::task::JoinHandle<()>,
    write_failed: mpsc::Receiver<String>,
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
    pub(super) fn start(id: usize, config: &ExecSettings) -> std::io::Result<Running> {
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
        let (requests, queue) = mpsc::unbounded_channel();
        let (failed, write_failed) = mpsc::channel(1);
        let writer = tokio::spawn(write_requests(child.stdin.take(), queue, failed));
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
            requests: Some(requests),
            writer,
            write_failed,
            lines,
            eof: false,
            stderr,
            started: Instant::now(),
        })
    }

    /// Queues a request line for its stdin (written in order, whole lines).
    pub(super) fn give(&self, line: Vec<u8>) -> Result<(), String> {
        self.requests
            .as_ref()
            .and_then(|r| r.send(line).ok())
            .ok_or_else(|| "its stdin is closed".to_string())
    }

    /// What it did next: a line on stdout, its stdout closed, or a request that could
    /// not be written to its stdin.
    pub(super) async fn next_output(&mut self) -> Output {
        if self.eof {
            return Output::Closed;
        }
        tokio::select! {
            biased;
            line = self.lines.recv() => match line {
                Some(line) => Output::Line(line),
                None => {
                    self.eof = true;
                    Output::Closed
                }
            },
            Some(reason) = self.write_failed.recv() => Output::WriteFailed(reason),
        }
    }

    /// EOF on its stdin once the requests given so far are written.
    pub(super) fn close_stdin(&mut self) {
        self.requests = None;
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
        self.requests = None;
        self.writer.abort();
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

/// Request lines queued for a child are joined into one write up to about this size.
const WRITE_COALESCE_BYTES: usize = 64 * 1024;

/// Writes request lines to `stdin` in order until `queue` closes (then EOF) or a write
/// fails (then why, on `failed`).
async fn write_requests(
    stdin: Option<ChildStdin>,
    mut queue: mpsc::UnboundedReceiver<Vec<u8>>,
    failed: mpsc::Sender<String>,
) {
    let Some(mut stdin) = stdin else {
        let _ = failed.try_send("its stdin is closed".to_string());
        return;
    };
    while let Some(mut lines) = queue.recv().await {
        // What queued meanwhile goes in the same write: one syscall for many requests
        // when a child holds several, and fewer, fuller reads for the child.
        while lines.len() < WRITE_COALESCE_BYTES {
            match queue.try_recv() {
                Ok(more) => lines.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        let written = match stdin.write_all(&lines).await {
            Ok(()) => stdin.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            let _ = failed.try_send(format!("cannot write to its stdin: {e}"));
            return;
        }
    }
}

fn exited(status: std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(s) => format!("exited ({s})"),
        Err(e) => format!("exited (status unknown: {e})"),
    }
}

/// One line of a child's output (lossy UTF-8, without the newline), at most the
/// configured maximum; `cut` bytes of it beyond that were dropped unread into memory.
pub(super) struct Line {
    pub(super) text: String,
    pub(super) cut: u64,
}

/// Reads `stream` line by line into `each` until EOF or until `each` returns false.
/// At most `max` bytes of a line are kept: the rest of a longer one is consumed and
/// counted as it arrives, so a handler writing without newlines costs no memory.
pub(super) async fn read_lines<R, F, Fut>(stream: R, max: usize, mut each: F)
where
    R: AsyncRead + Unpin,
    F: FnMut(Line) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    let mut cut = 0u64;
    loop {
        let (used, ended) = match reader.fill_buf().await {
            Ok([]) | Err(_) => {
                // EOF: a last line without a newline still counts.
                if !buf.is_empty() || cut > 0 {
                    each(take_line(&mut buf, &mut cut)).await;
                }
                return;
            }
            Ok(chunk) => {
                let (part, ended) = match chunk.iter().position(|b| *b == b'\n') {
                    Some(i) => (&chunk[..i], true),
                    None => (chunk, false),
                };
                let room = max.saturating_sub(buf.len()).min(part.len());
                buf.extend_from_slice(&part[..room]);
                cut += (part.len() - room) as u64;
                (part.len() + usize::from(ended), ended)
            }
        };
        reader.consume(used);
        if ended && !each(take_line(&mut buf, &mut cut)).await {
            return;
        }
    }
}

/// The line in `buf` (a `\r` before the newline dropped), leaving `buf` empty with
/// its capacity (at most the maximum line) for the next one.
fn take_line(buf: &mut Vec<u8>, cut: &mut u64) -> Line {
    if *cut == 0 && buf.last() == Some(&b'\r') {
        buf.pop();
    }
    let line = Line {
        text: String::from_utf8_lossy(buf).into_owned(),
        cut: std::mem::take(cut),
    };
    buf.clear();
    line
}

#[cfg(test)]
mod line_tests {
    use super::*;

    /// Runs [`read_lines`] over `input` with lines of at most `max` bytes.
    fn lines_of(input: &'static [u8], max: usize) -> Vec<(String, u64)> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut got = Vec::new();
            read_lines(input, max, |l| {
                got.push((l.text, l.cut));
                async { true }
            })
            .await;
            got
        })
    }

    #[test]
    fn lines_longer_than_the_maximum_are_cut_and_counted() {
        assert_eq!(
            lines_of(b"short\r\nexactly\n0123456789abc\nlast", 7),
            vec![
                ("short".into(), 0),
                ("exactly".into(), 0),
                ("0123456".into(), 6),
                ("last".into(), 0),
            ]
        );
        // A line far longer than BufReader's buffer: cut, counted, the next one whole.
        let huge: &'static [u8] = Box::leak(
            [vec![b'x'; 100_000], b"\nnext\n".to_vec()]
                .concat()
                .into_boxed_slice(),
        );
        assert_eq!(
            lines_of(huge, 256),
            vec![("x".repeat(256), 100_000 - 256), ("next".into(), 0)]
        );
    }
}
