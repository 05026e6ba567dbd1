//! The `exec` processor: messages handed to long-lived child processes over a line
//! protocol, so a handler can be written in any language.
//!
//! - `ACKD_EXEC_CONCURRENCY` children run `sh -c "$ACKD_EXEC_COMMAND"`, each in its own
//!   process group. Each is served by one task (a "slot") that takes the next message
//!   from a queue shared by all slots, writes it as one JSON line to the child's stdin,
//!   and reads one reply line from its stdout. A child has at most one message at a
//!   time; the partition workers send a partition's next message only after the
//!   previous one was answered, so per-partition order holds with any pool size.
//! - A child that closes its stdout (exits), writes something that is not a reply, or
//!   does not answer within `ACKD_EXEC_TIMEOUT_MS` is killed (SIGTERM to its group,
//!   SIGKILL after 2 s), then its message fails as retryable (the worker's retry and
//!   `ACKD_ON_FAILURE` apply; the retry never overlaps the old attempt), and it is
//!   started again after a backoff (100 ms, doubling to 10 s; back to
//!   100 ms once a child answered). Each restart is an `at=exec_restart` line carrying
//!   `count#exec.restarts=1` (l2met sums them) and the total so far.
//! - Its stderr is logged line by line as `at=exec_stderr child=N pid=P line="…"`.
//! - [`Exec::shutdown`]: a child finishes the message it has, then gets EOF on stdin;
//!   one still running halfway to the deadline gets SIGTERM, just before it SIGKILL.
//!
//! Wire format (README "exec processor"): request (built by [`super::json`])
//! `{"topic":"t","partition":0,"offset":41,"timestamp_ms":1700000000000,"key":"k-1","value":"hello","headers":[{"name":"trace","value":"t-1"}]}`
//! where a key, value or header value that is not UTF-8 comes as `key_base64`,
//! `value_base64` (standard alphabet, padded) instead, and a null one as JSON null; reply
//! `{"ack":true}`, `{"retry":"reason"}` or `{"fail":"reason"}`, optionally with
//! `"offset":N`, which must then be the request's.

use std::fmt;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, oneshot, watch};

use crate::processor::{BatchError, Message, ProcessError};
use crate::settings::{SettingError, Settings};

/// First wait before a failed child is started again; doubles per failure in a row.
const RESTART_INITIAL: Duration = Duration::from_millis(100);
/// Longest wait before a restart.
const RESTART_MAX: Duration = Duration::from_secs(10);
/// How long a child that is being replaced may take to exit on SIGTERM before SIGKILL.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// What the exec processor is configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecConfig {
    /// Run with `sh -c`.
    pub command: String,
    /// Children in the pool.
    pub concurrency: usize,
    /// How long a child may take to answer one message (writing it included).
    pub timeout: Duration,
}

impl ExecConfig {
    /// From `ACKD_EXEC_*`; `ACKD_EXEC_COMMAND` is required.
    pub fn from_settings(settings: &Settings) -> Result<ExecConfig, SettingError> {
        let command = settings.exec_command.clone().ok_or_else(|| SettingError {
            setting: "ACKD_EXEC_COMMAND".into(),
            value: None,
            problem: "is required with ACKD_PROCESSOR=exec: the command line of the handler, run with sh -c (e.g. \"python3 handler.py\")".into(),
        })?;
        Ok(ExecConfig {
            command,
            concurrency: settings.exec_concurrency,
            timeout: settings.exec_timeout,
        })
    }
}

/// One request for a child (a message, or a batch), and where its answer goes.
struct Job {
    line: Vec<u8>,
    offsets: Offsets,
    reply: oneshot::Sender<Result<(), BatchError>>,
}

/// The offsets a request carries, which a reply may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offsets {
    /// One message: a JSON object.
    One(i64),
    /// A batch (`ACKD_BATCH_MAX_MESSAGES` above 1): a JSON array, these offsets in order.
    Batch(Vec<i64>),
}

impl Offsets {
    fn first(&self) -> i64 {
        match self {
            Offsets::One(o) => *o,
            Offsets::Batch(v) => v.first().copied().unwrap_or(-1),
        }
    }
}

/// The running pool (started on the first message: children need the runtime).
struct Pool {
    jobs: mpsc::Sender<Job>,
    stop: watch::Sender<Option<Instant>>,
    slots: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// The `exec` processor. Cheap to share; children start with the first message.
pub struct Exec {
    config: Arc<ExecConfig>,
    pool: OnceLock<Pool>,
    restarts: Arc<AtomicU64>,
}

impl fmt::Debug for Exec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exec")
            .field("concurrency", &self.config.concurrency)
            .field("timeout", &self.config.timeout)
            .field("started", &self.pool.get().is_some())
            .finish()
    }
}

impl Exec {
    pub fn new(config: ExecConfig) -> Exec {
        Exec {
            config: Arc::new(config),
            pool: OnceLock::new(),
            restarts: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Children restarted so far (deaths, hangs, protocol errors).
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    fn pool(&self) -> &Pool {
        self.pool.get_or_init(|| {
            // Jobs wait here for a free child; at most one per partition is ever queued.
            let (jobs, rx) = mpsc::channel(1024);
            let rx = Arc::new(tokio::sync::Mutex::new(rx));
            let (stop, stop_rx) = watch::channel(None);
            let slots = (0..self.config.concurrency)
                .map(|id| {
                    tokio::spawn(slot(
                        id,
                        self.config.clone(),
                        rx.clone(),
                        stop_rx.clone(),
                        self.restarts.clone(),
                    ))
                })
                .collect();
            Pool {
                jobs,
                stop,
                slots: Mutex::new(slots),
            }
        })
    }

    pub async fn process(&self, message: &Message<'_>) -> Result<(), ProcessError> {
        self.request(request_line(message), Offsets::One(message.offset()))
            .await
            .map_err(|e| e.error)
    }

    /// A batch as one request: a JSON array line, answered by one reply line.
    pub async fn process_batch(&self, messages: &[Message<'_>]) -> Result<(), BatchError> {
        let offsets = Offsets::Batch(messages.iter().map(Message::offset).collect());
        self.request(batch_line(messages), offsets).await
    }

    async fn request(&self, line: Vec<u8>, offsets: Offsets) -> Result<(), BatchError> {
        let pool = self.pool();
        let first = offsets.first();
        let (reply, answer) = oneshot::channel();
        let job = Job {
            line,
            offsets,
            reply,
        };
        if pool.jobs.send(job).await.is_err() {
            return Err(BatchError::new(
                first,
                ProcessError::retryable("exec processor is stopped"),
            ));
        }
        answer.await.unwrap_or_else(|_| {
            Err(BatchError::new(
                first,
                ProcessError::retryable("exec processor stopped before a child answered"),
            ))
        })
    }

    /// EOF to every child once it has answered its message, SIGTERM halfway to
    /// `deadline`, SIGKILL just before it.
    pub async fn shutdown(&self, deadline: Instant) {
        let Some(pool) = self.pool.get() else {
            return;
        };
        // SIGKILL a little before the deadline, where ackd stops waiting for this.
        let remaining = deadline.saturating_duration_since(Instant::now());
        let deadline = deadline - (remaining / 10).min(Duration::from_millis(500));
        pool.stop.send_replace(Some(deadline));
        let slots = std::mem::take(&mut *pool.slots.lock().unwrap_or_else(|e| e.into_inner()));
        for slot in slots {
            let _ = slot.await;
        }
    }
}

/// The request line for one message, `\n` included (the object of [`super::json`]).
pub fn request_line(m: &Message<'_>) -> Vec<u8> {
    let mut line = super::json::encode(m);
    line.push(b'\n');
    line
}

/// The request line for a batch: a JSON array of [`request_line`]'s objects, `\n`
/// included.
pub fn batch_line(messages: &[Message<'_>]) -> Vec<u8> {
    let mut line = super::json::encode_batch(messages);
    line.push(b'\n');
    line
}

/// What a reply line means. `Err`: not a reply (a protocol error).
///
/// For one message, `"offset"`, when given, must be its offset. For a batch, `ack`
/// acknowledges all of it (`"offset"`, when given, must be its last); `retry` and `fail`
/// are for the message at `"offset"`, which must be one of the batch (the ones before it
/// are acknowledged), or for its first message without one.
pub fn parse_reply(line: &str, offsets: &Offsets) -> Result<Result<(), BatchError>, String> {
    let value: Value = serde_json::from_str(line.trim())
        .map_err(|e| format!("reply is not JSON ({e}): {}", shorten(line)))?;
    let Value::Object(o) = value else {
        return Err(format!("reply is not a JSON object: {}", shorten(line)));
    };
    let acked = matches!(o.get("ack"), Some(Value::Bool(true)));
    let failed_at = match (o.get("offset"), offsets) {
        (None, _) => offsets.first(),
        (Some(named), Offsets::One(offset)) => {
            if named.as_i64() != Some(*offset) {
                return Err(format!(
                    "reply is for offset {named}, the message sent was offset {offset}"
                ));
            }
            *offset
        }
        (Some(named), Offsets::Batch(batch)) => {
            let last = batch.last().copied().unwrap_or(-1);
            match named.as_i64() {
                Some(n) if acked && n == last => n,
                Some(n) if !acked && batch.binary_search(&n).is_ok() => n,
                _ if acked => {
                    return Err(format!(
                        "an ack of a batch is for all of it: its \"offset\" must be the last one ({last}), not {named}"
                    ))
                }
                _ => {
                    return Err(format!(
                        "reply names offset {named}, which is not in the batch sent ({} to {last})",
                        offsets.first()
                    ))
                }
            }
        }
    };
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    match (o.get("ack"), o.get("retry"), o.get("fail")) {
        (Some(Value::Bool(true)), None, None) => Ok(Ok(())),
        (None, Some(reason), None) => Ok(Err(BatchError::new(
            failed_at,
            ProcessError::retryable(format!("handler: {}", text(reason))),
        ))),
        (None, None, Some(reason)) => Ok(Err(BatchError::new(
            failed_at,
            ProcessError::permanent(format!("handler: {}", text(reason))),
        ))),
        _ => Err(format!(
            "reply needs exactly one of \"ack\":true, \"retry\":reason, \"fail\":reason: {}",
            shorten(line)
        )),
    }
}

fn shorten(line: &str) -> String {
    let line = line.trim_end();
    match line.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line.to_string(),
    }
}

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

/// One running child: `sh` and what it started, in one process group. It is gone only
/// when `sh` has exited **and** its stdout is closed: `sh` may run the handler as its
/// own child, and a signal meant for every process (Heroku signals the whole dyno) can
/// end `sh` while the handler goes on answering.
struct Running {
    id: usize,
    pid: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    /// Lines of its stdout; closed at EOF.
    lines: mpsc::Receiver<String>,
    /// Its stdout reached EOF (every process holding it is gone).
    eof: bool,
    /// Logs its stderr; awaited when it is gone, so that no line of it is lost.
    stderr: Option<tokio::task::JoinHandle<()>>,
    started: Instant,
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
    fn start(id: usize, config: &ExecConfig) -> std::io::Result<Running> {
        let mut child = Command::new("sh")
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
        let (tx, lines) = mpsc::channel(16);
        if let Some(stdout) = child.stdout.take() {
            tokio::spawn(read_lines(stdout, move |line| {
                let tx = tx.clone();
                async move { tx.send(line).await.is_ok() }
            }));
        }
        let stderr = child.stderr.take().map(|stderr| {
            tokio::spawn(read_lines(stderr, move |line| async move {
                tracing::info!(at = "exec_stderr", child = id, pid, line);
                true
            }))
        });
        tracing::info!(at = "exec_started", child = id, pid);
        Ok(Running {
            id,
            pid,
            child,
            stdin,
            lines,
            eof: false,
            stderr,
            started: Instant::now(),
        })
    }

    /// The next stdout line; `None` at EOF.
    async fn next_line(&mut self) -> Option<String> {
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
    async fn gone_reason(&mut self) -> String {
        match tokio::time::timeout(Duration::from_secs(1), self.child.wait()).await {
            Ok(status) => exited(status),
            Err(_) => "closed its stdout".to_string(),
        }
    }

    /// Ends a child that failed: SIGTERM to its group, SIGKILL after [`KILL_GRACE`].
    async fn kill(&mut self) {
        self.stdin = None;
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
    async fn stop(mut self, deadline: Instant) {
        let begun = Instant::now();
        self.stdin = None;
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

/// Reads `stream` line by line (lossy UTF-8, without the newline) into `each` until EOF
/// or until `each` returns false.
async fn read_lines<R, F, Fut>(stream: R, mut each: F)
where
    R: AsyncRead + Unpin,
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf)
                    .trim_end_matches(['\n', '\r'])
                    .to_string();
                if !each(line).await {
                    return;
                }
            }
        }
    }
}

/// Why a child's service ended.
enum Ended {
    /// A graceful stop began: finish, with this deadline.
    Stop(Instant),
    /// The child failed; it is replaced. The message it had, if any, is failed only
    /// once the child is gone, so that its retry can never overlap the old attempt.
    Failed(String, Option<Failed>),
}

/// The message a failed child had, and its failure.
struct Failed {
    reply: oneshot::Sender<Result<(), BatchError>>,
    error: BatchError,
}

/// One slot of the pool: runs a child, replaces it when it fails, stops it at shutdown.
async fn slot(
    id: usize,
    config: Arc<ExecConfig>,
    jobs: Arc<tokio::sync::Mutex<mpsc::Receiver<Job>>>,
    mut stop: watch::Receiver<Option<Instant>>,
    restarts: Arc<AtomicU64>,
) {
    let mut backoff = RESTART_INITIAL;
    loop {
        if stop.borrow().is_some() {
            return;
        }
        let (ended, running) = match Running::start(id, &config) {
            Ok(mut running) => {
                let (ended, answered) = serve(&mut running, &config, &jobs, &mut stop).await;
                if answered {
                    backoff = RESTART_INITIAL;
                }
                (ended, Some(running))
            }
            Err(e) => (Ended::Failed(format!("cannot start sh: {e}"), None), None),
        };
        let (reason, failed) = match ended {
            Ended::Stop(deadline) => {
                if let Some(running) = running {
                    running.stop(deadline).await;
                }
                return;
            }
            Ended::Failed(reason, failed) => (reason, failed),
        };
        let (pid, ran_ms) = match running {
            Some(mut running) => {
                running.kill().await;
                (
                    Some(running.pid),
                    Some(running.started.elapsed().as_millis() as u64),
                )
            }
            None => (None, None),
        };
        if let Some(Failed { reply, error }) = failed {
            let _ = reply.send(Err(error));
        }
        let total = restarts.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(
            at = "exec_restart",
            child = id,
            pid,
            reason,
            ran_ms,
            delay_ms = backoff.as_millis() as u64,
            restarts = total,
            "count#exec.restarts" = 1
        );
        tokio::select! {
            biased;
            _ = stop.wait_for(Option::is_some) => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RESTART_MAX);
    }
}

/// Serves messages with one child until it fails or a stop begins. Also says whether
/// the child answered any message (a healthy child resets the restart backoff).
async fn serve(
    running: &mut Running,
    config: &ExecConfig,
    jobs: &tokio::sync::Mutex<mpsc::Receiver<Job>>,
    stop: &mut watch::Receiver<Option<Instant>>,
) -> (Ended, bool) {
    let mut answered = false;
    loop {
        // Idle: a job, unless the child goes away or talks out of turn first.
        let job = tokio::select! {
            biased;
            d = async { stop.wait_for(Option::is_some).await.ok().and_then(|d| *d) } => {
                let deadline = d.unwrap_or_else(Instant::now);
                return (Ended::Stop(deadline), answered);
            }
            line = running.next_line() => {
                let reason = match line {
                    Some(l) => format!("wrote to stdout with no message in flight: {}", shorten(&l)),
                    None => running.gone_reason().await,
                };
                return (Ended::Failed(reason, None), answered);
            }
            job = async { jobs.lock().await.recv().await } => match job {
                Some(job) => job,
                None => return (Ended::Stop(Instant::now()), answered),
            },
        };
        let Job {
            line: request,
            offsets,
            reply,
        } = job;
        let offset = offsets.first();
        if reply.is_closed() {
            // Its worker was aborted (a drain that ran out of time) while it waited:
            // the partition may be someone else's now, so it is not handed out.
            continue;
        }
        let exchange = async {
            let stdin = running
                .stdin
                .as_mut()
                .ok_or_else(|| "stdin is closed".to_string())?;
            stdin
                .write_all(&request)
                .await
                .map_err(|e| format!("cannot write to its stdin: {e}"))?;
            stdin
                .flush()
                .await
                .map_err(|e| format!("cannot write to its stdin: {e}"))?;
            match running.next_line().await {
                Some(line) => parse_reply(&line, &offsets),
                None => Err(running.gone_reason().await),
            }
        };
        // The message in flight ends at the timeout, or at a graceful stop's deadline.
        let stop_deadline = {
            let mut stop = stop.clone();
            async move {
                let _ = stop.wait_for(Option::is_some).await;
                let deadline = stop.borrow().unwrap_or_else(Instant::now);
                tokio::time::sleep_until(deadline.into()).await;
                deadline
            }
        };
        let outcome = tokio::select! {
            r = tokio::time::timeout(config.timeout, exchange) => match r {
                Ok(r) => r,
                Err(_) => Err(format!(
                    "no reply within ACKD_EXEC_TIMEOUT_MS={}",
                    config.timeout.as_millis()
                )),
            },
            deadline = stop_deadline => {
                let _ = reply.send(Err(BatchError::new(
                    offset,
                    ProcessError::retryable(
                        "exec child did not answer before the shutdown deadline",
                    ),
                )));
                return (Ended::Stop(deadline), answered);
            }
        };
        match outcome {
            Ok(result) => {
                answered = true;
                // The worker may have given up on it (aborted): the answer goes nowhere.
                let _ = reply.send(result);
            }
            Err(reason) => {
                let error = BatchError::new(
                    offset,
                    ProcessError::retryable(format!(
                        "exec child {} (pid {}) failed on this message: {reason}",
                        running.id, running.pid
                    )),
                );
                return (
                    Ended::Failed(
                        format!("{reason} (offset {offset})"),
                        Some(Failed { reply, error }),
                    ),
                    answered,
                );
            }
        }
    }
}

fn exited(status: std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(s) => format!("exited ({s})"),
        Err(e) => format!("exited (status unknown: {e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processor::FailureKind;
    use serde_json::json;

    fn json(line: &[u8]) -> Value {
        assert_eq!(line.last(), Some(&b'\n'));
        serde_json::from_slice(line).unwrap()
    }

    #[test]
    fn requests_carry_text_as_text_and_other_bytes_as_base64() {
        let m = Message::new(
            "t",
            2,
            41,
            Some(b"k-1"),
            Some(b"hello"),
            Some(1_700_000_000_000),
        );
        assert_eq!(
            json(&request_line(&m)),
            json!({"topic":"t","partition":2,"offset":41,
                "timestamp_ms":1_700_000_000_000_i64,"key":"k-1","value":"hello","headers":[]})
        );
        let m = Message::new("t", 0, 0, None, Some(&[0xff, 0x00, 0x80]), None);
        let v = json(&request_line(&m));
        assert_eq!(v["key"], Value::Null);
        assert_eq!(v["timestamp_ms"], Value::Null);
        assert_eq!(v["value_base64"], "/wCA");
        assert!(v.get("value").is_none(), "{v}");
        let m = Message::new("t", 0, 0, Some(&[0xc3]), None, None);
        let v = json(&request_line(&m));
        assert_eq!(v["key_base64"], "ww==");
        assert_eq!(v["value"], Value::Null);
        // A newline in a value is escaped: one message is always one line.
        let line = request_line(&Message::new("t", 0, 0, None, Some(b"a\nb"), None));
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
    }

    #[test]
    fn replies_ack_retry_or_fail_and_anything_else_is_a_protocol_error() {
        assert_eq!(
            parse_reply("{\"ack\":true}\n", &Offsets::One(5)),
            Ok(Ok(()))
        );
        assert_eq!(
            parse_reply(" {\"ack\": true, \"offset\": 5} ", &Offsets::One(5)),
            Ok(Ok(()))
        );
        let r = parse_reply("{\"retry\":\"db down\"}", &Offsets::One(5))
            .unwrap()
            .unwrap_err()
            .error;
        assert_eq!(r.kind, crate::processor::FailureKind::Retryable);
        assert!(r.reason.contains("db down"));
        let r = parse_reply("{\"fail\":\"bad input\"}", &Offsets::One(5))
            .unwrap()
            .unwrap_err()
            .error;
        assert_eq!(r.kind, crate::processor::FailureKind::Permanent);
        assert!(r.reason.contains("bad input"));
        for bad in [
            "ok",
            "",
            "[1]",
            "{}",
            "{\"ack\":false}",
            "{\"ack\":true,\"fail\":\"x\"}",
            "{\"ack\":true,\"offset\":4}",
        ] {
            assert!(
                parse_reply(bad, &Offsets::One(5)).is_err(),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn a_batch_is_one_array_line() {
        let a = Message::new("t", 1, 7, Some(b"k"), Some(b"x\ny"), None);
        let b = Message::new("t", 1, 9, None, Some(&[0xff]), None);
        let line = batch_line(&[a, b]);
        assert_eq!(line.iter().filter(|c| **c == b'\n').count(), 1);
        let v = json(&line);
        assert_eq!(v.as_array().map(Vec::len), Some(2), "{v}");
        assert_eq!(v[0], json(&request_line(&a)));
        assert_eq!(v[1]["offset"], 9);
        assert_eq!(v[1]["value_base64"], "/w==");
    }

    #[test]
    fn a_batch_reply_acks_all_or_names_the_first_failed_offset() {
        let batch = Offsets::Batch(vec![10, 11, 13]);
        assert_eq!(parse_reply("{\"ack\":true}", &batch), Ok(Ok(())));
        assert_eq!(
            parse_reply("{\"ack\":true,\"offset\":13}", &batch),
            Ok(Ok(()))
        );
        let e = parse_reply("{\"retry\":\"later\",\"offset\":11}", &batch)
            .unwrap()
            .unwrap_err();
        assert_eq!((e.offset, e.error.kind), (11, FailureKind::Retryable));
        let e = parse_reply("{\"fail\":\"bad\",\"offset\":13}", &batch)
            .unwrap()
            .unwrap_err();
        assert_eq!((e.offset, e.error.kind), (13, FailureKind::Permanent));
        // Without an offset, the failure is the batch's first message's.
        let e = parse_reply("{\"fail\":\"bad\"}", &batch)
            .unwrap()
            .unwrap_err();
        assert_eq!(e.offset, 10);
        for bad in [
            "{\"fail\":\"x\",\"offset\":12}",
            "{\"fail\":\"x\",\"offset\":14}",
            "{\"ack\":true,\"offset\":11}",
            "[{\"ack\":true}]",
        ] {
            assert!(parse_reply(bad, &batch).is_err(), "{bad:?} accepted");
        }
    }
}
