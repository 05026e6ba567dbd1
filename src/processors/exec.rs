//! The `exec` processor: messages handed to long-lived child processes over a line
//! protocol, so a handler can be written in any language.
//!
//! - `ACKD_EXEC_CONCURRENCY` children run `sh -c "$ACKD_EXEC_COMMAND"`, each in its own
//!   process group. Each is served by one task (a "slot") that takes the next message
//!   from a queue shared by all slots, writes it as one JSON line to the child's stdin,
//!   and reads one reply line from its stdout. A child has at most one message at a
//!   time; the partition workers send a message only after the previous one of its
//!   partition (`ACKD_ORDERING=partition`) or of its key (`key`) was answered, so that
//!   order holds with any pool size. With `key` or `none` one partition may keep up to
//!   `ACKD_CONCURRENCY` children busy.
//! - A child that closes its stdout (exits), writes something that is not a reply to
//!   the request in flight, or does not answer within `ACKD_EXEC_TIMEOUT_MS` is killed
//!   (SIGTERM to its group, SIGKILL after 2 s), then its message fails as retryable (the worker's retry and
//!   `ACKD_ON_FAILURE` apply; the retry never overlaps the old attempt), and it is
//!   started again after a backoff (100 ms, doubling to 10 s; back to
//!   100 ms once a child answered). Each restart is an `at=exec_restart` line carrying
//!   `count#exec.restarts=1` (l2met sums them) and the total so far.
//! - Its stderr is logged line by line as `at=exec_stderr child=N pid=P line="…"`.
//! - No line is held longer than `ACKD_EXEC_MAX_LINE_BYTES`: a longer stdout line is a
//!   protocol error, a longer stderr line is logged cut, with `truncated_bytes=`; the
//!   rest of such a line is read and dropped, never buffered.
//! - [`Exec::shutdown`]: a child finishes the message it has, then gets EOF on stdin;
//!   one still running halfway to the deadline gets SIGTERM, just before it SIGKILL.
//!
//! Wire format (README "exec processor"): request (built by [`super::json`])
//! `{"topic":"t","partition":0,"offset":41,"timestamp_ms":1700000000000,"key":"k-1","value":"hello","headers":[{"name":"trace","value":"t-1"}]}`
//! where a key, value or header value that is not UTF-8 comes as `key_base64`,
//! `value_base64` (standard alphabet, padded) instead, and a null one as JSON null; reply
//! `{"ack":true,"offset":41}`, `{"retry":"reason","offset":41}` or
//! `{"fail":"reason","offset":41}` (see [`parse_reply`]): every reply names what it
//! answers, so that no stray, extra or late line can answer another request.

use std::fmt;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::error::SettingError;
use crate::config::settings::Settings;
use crate::processors::processor::{
    queued, BatchError, FailureKind, Message, ProcessError, Queued,
};

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
    /// The longest line read from a child's stdout or stderr, newline excluded.
    pub max_line_bytes: usize,
    /// `ACKD_EXEC_PASS_SECRETS`: the secret variables children get anyway.
    pub pass_secrets: Vec<String>,
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
            max_line_bytes: settings.exec_max_line_bytes,
            pass_secrets: settings.exec_pass_secrets.clone(),
        })
    }
}

/// One request for a child (a message, or a batch), and where its answer goes.
struct Job {
    line: Vec<u8>,
    sent: Sent,
    reply: oneshot::Sender<Result<(), BatchError>>,
    /// The call starts when a child takes it, not while it waits for one.
    queued: Queued,
}

/// What a request carried, which its reply must name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub topic: String,
    pub partition: i32,
    pub offsets: Offsets,
}

/// The offsets a request carries, which its reply names.
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

    fn last(&self) -> i64 {
        match self {
            Offsets::One(o) => *o,
            Offsets::Batch(v) => v.last().copied().unwrap_or(-1),
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
            // Jobs wait here for a free child: at most one per partition, or
            // ACKD_CONCURRENCY per partition with key or none ordering.
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
        let sent = Sent {
            topic: message.topic().to_string(),
            partition: message.partition(),
            offsets: Offsets::One(message.offset()),
        };
        self.request(request_line(message), sent)
            .await
            .map_err(|e| e.error)
    }

    /// A batch as one request: a JSON array line, answered by one reply line.
    pub async fn process_batch(&self, messages: &[Message<'_>]) -> Result<(), BatchError> {
        let Some(head) = messages.first() else {
            return Ok(());
        };
        let sent = Sent {
            topic: head.topic().to_string(),
            partition: head.partition(),
            offsets: Offsets::Batch(messages.iter().map(Message::offset).collect()),
        };
        self.request(batch_line(messages), sent).await
    }

    async fn request(&self, line: Vec<u8>, sent: Sent) -> Result<(), BatchError> {
        let pool = self.pool();
        let first = sent.offsets.first();
        let (reply, answer) = oneshot::channel();
        let job = Job {
            line,
            sent,
            reply,
            queued: queued(),
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

/// What a reply line means. `Err`: not a reply to `sent` (a protocol error).
///
/// Every reply names the request it answers, so that no line a handler writes (an
/// extra one, a late one, a debug print, one answer per message of a batch) can answer
/// a request it was not written for:
/// - a message (a JSON object) by its `"offset"`;
/// - a batch (a JSON array) by `"first"` and `"last"`, its first and last offsets. `ack`
///   acknowledges all of it; `retry` and `fail` are for the message at `"offset"`,
///   which must be one of the batch (the ones before it are acknowledged), or for its
///   first message without one.
///
/// `"topic"` and `"partition"`, when given, must be the request's too.
pub fn parse_reply(line: &str, sent: &Sent) -> Result<Result<(), BatchError>, String> {
    let value: Value = serde_json::from_str(line.trim())
        .map_err(|e| format!("reply is not JSON ({e}): {}", shorten(line)))?;
    let Value::Object(o) = value else {
        return Err(format!("reply is not a JSON object: {}", shorten(line)));
    };
    let outcome = match (o.get("ack"), o.get("retry"), o.get("fail")) {
        (Some(Value::Bool(true)), None, None) => None,
        (None, Some(reason), None) => Some((FailureKind::Retryable, reason)),
        (None, None, Some(reason)) => Some((FailureKind::Permanent, reason)),
        _ => {
            return Err(format!(
                "reply needs exactly one of \"ack\":true, \"retry\":reason, \"fail\":reason: {}",
                shorten(line)
            ))
        }
    };
    if let Some(topic) = o.get("topic") {
        if topic.as_str() != Some(sent.topic.as_str()) {
            return Err(format!(
                "reply is for topic {topic}, the request sent was from {:?}: {}",
                sent.topic,
                shorten(line)
            ));
        }
    }
    if let Some(partition) = o.get("partition") {
        if partition.as_i64() != Some(i64::from(sent.partition)) {
            return Err(format!(
                "reply is for partition {partition}, the request sent was from partition {}: {}",
                sent.partition,
                shorten(line)
            ));
        }
    }
    let named = |key: &str| o.get(key).map(|v| (v, v.as_i64()));
    let failed_at = match &sent.offsets {
        Offsets::One(offset) => {
            if o.contains_key("first") || o.contains_key("last") {
                return Err(format!(
                    "reply names a batch (\"first\", \"last\"), the request sent was one message, offset {offset}: {}",
                    shorten(line)
                ));
            }
            match named("offset") {
                Some((_, Some(n))) if n == *offset => *offset,
                Some((v, _)) => {
                    return Err(format!(
                        "reply is for offset {v}, the message sent was offset {offset}: {}",
                        shorten(line)
                    ))
                }
                None => {
                    return Err(format!(
                        "reply names no \"offset\" (it must name the message it answers, {{\"ack\":true,\"offset\":{offset}}}): {}",
                        shorten(line)
                    ))
                }
            }
        }
        Offsets::Batch(batch) => {
            let (first, last) = (sent.offsets.first(), sent.offsets.last());
            match (named("first"), named("last")) {
                (Some((_, Some(f))), Some((_, Some(l)))) if f == first && l == last => {}
                (None, None) => {
                    return Err(format!(
                        "reply to a batch names no \"first\" and \"last\" (it must name the batch it answers, {{\"ack\":true,\"first\":{first},\"last\":{last}}}): {}",
                        shorten(line)
                    ))
                }
                _ => {
                    return Err(format!(
                        "reply is not for the batch sent ({first} to {last}): {}",
                        shorten(line)
                    ))
                }
            }
            match (named("offset"), outcome.is_some()) {
                (None, _) => first,
                (Some((_, Some(n))), true) if batch.binary_search(&n).is_ok() => n,
                (Some(_), false) => {
                    return Err(format!(
                        "an ack of a batch is for all of it and names no \"offset\": {}",
                        shorten(line)
                    ))
                }
                (Some((v, _)), true) => {
                    return Err(format!(
                        "reply names offset {v}, which is not in the batch sent ({first} to {last}): {}",
                        shorten(line)
                    ))
                }
            }
        }
    };
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    Ok(match outcome {
        None => Ok(()),
        Some((FailureKind::Retryable, reason)) => Err(BatchError::new(
            failed_at,
            ProcessError::retryable(format!("handler: {}", text(reason))),
        )),
        Some((_, reason)) => Err(BatchError::new(
            failed_at,
            ProcessError::permanent(format!("handler: {}", text(reason))),
        )),
    })
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
struct Running {
    id: usize,
    pid: u32,
    child: Child,
    stdin: Option<ChildStdin>,
    /// Lines of its stdout; closed at EOF.
    lines: mpsc::Receiver<Line>,
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
            lines,
            eof: false,
            stderr,
            started: Instant::now(),
        })
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

/// One line of a child's output (lossy UTF-8, without the newline), at most the
/// configured maximum; `cut` bytes of it beyond that were dropped unread into memory.
struct Line {
    text: String,
    cut: u64,
}

/// Reads `stream` line by line into `each` until EOF or until `each` returns false.
/// At most `max` bytes of a line are kept: the rest of a longer one is consumed and
/// counted as it arrives, so a handler writing without newlines costs no memory.
async fn read_lines<R, F, Fut>(stream: R, max: usize, mut each: F)
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
                    Some(l) => format!("wrote to stdout with no message in flight: {}", shorten(&l.text)),
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
            sent,
            reply,
            queued,
        } = job;
        let offset = sent.offsets.first();
        // Its worker dropped it while it waited (a stop or a revoke began before a
        // child was free), or was aborted (a drain that ran out of time): the partition
        // may be someone else's now, so it is not handed out.
        if reply.is_closed() || !queued.take() {
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
                Some(line) if line.cut > 0 => Err(format!(
                    "wrote a line longer than ACKD_EXEC_MAX_LINE_BYTES={} ({} bytes): {}",
                    config.max_line_bytes,
                    line.text.len() as u64 + line.cut,
                    shorten(&line.text)
                )),
                Some(line) => parse_reply(&line.text, &sent),
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
    use crate::processors::processor::FailureKind;
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

    fn one(offset: i64) -> Sent {
        Sent {
            topic: "t".into(),
            partition: 2,
            offsets: Offsets::One(offset),
        }
    }

    fn batch(offsets: &[i64]) -> Sent {
        Sent {
            topic: "t".into(),
            partition: 2,
            offsets: Offsets::Batch(offsets.to_vec()),
        }
    }

    #[test]
    fn replies_ack_retry_or_fail_the_message_they_name() {
        for ok in [
            "{\"ack\":true,\"offset\":5}\n",
            " {\"ack\": true, \"offset\": 5} ",
            "{\"ack\":true,\"topic\":\"t\",\"partition\":2,\"offset\":5}",
            "{\"offset\":5,\"ack\":true,\"note\":\"other keys are ignored\"}",
        ] {
            assert_eq!(parse_reply(ok, &one(5)), Ok(Ok(())), "{ok}");
        }
        let r = parse_reply("{\"retry\":\"db down\",\"offset\":5}", &one(5))
            .unwrap()
            .unwrap_err();
        assert_eq!((r.offset, r.error.kind), (5, FailureKind::Retryable));
        assert!(r.error.reason.contains("db down"));
        let r = parse_reply("{\"fail\":\"bad input\",\"offset\":5}", &one(5))
            .unwrap()
            .unwrap_err();
        assert_eq!((r.offset, r.error.kind), (5, FailureKind::Permanent));
        assert!(r.error.reason.contains("bad input"));
    }

    #[test]
    fn a_line_that_does_not_name_the_message_sent_is_a_protocol_error() {
        for bad in [
            "ok",
            "",
            "[1]",
            "{}",
            // Not naming the message: a debug print, an extra or a per-message line.
            "{\"ack\":true}",
            "{\"retry\":\"x\"}",
            "{\"fail\":\"x\"}",
            // Naming another one: a late or out-of-order answer.
            "{\"ack\":true,\"offset\":4}",
            "{\"ack\":true,\"offset\":\"5\"}",
            "{\"ack\":true,\"offset\":5,\"partition\":3}",
            "{\"ack\":true,\"offset\":5,\"topic\":\"u\"}",
            "{\"ack\":true,\"first\":5,\"last\":5}",
            "{\"ack\":false,\"offset\":5}",
            "{\"ack\":true,\"fail\":\"x\",\"offset\":5}",
        ] {
            assert!(parse_reply(bad, &one(5)).is_err(), "{bad:?} accepted");
        }
        let e = parse_reply("{\"ack\":true}", &one(5)).unwrap_err();
        assert!(e.contains("names no \"offset\""), "{e}");
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
    fn a_batch_reply_names_the_batch_and_acks_all_or_the_ones_before_a_failure() {
        let sent = batch(&[10, 11, 13]);
        for ok in [
            "{\"ack\":true,\"first\":10,\"last\":13}",
            "{\"ack\":true,\"topic\":\"t\",\"partition\":2,\"first\":10,\"last\":13}",
        ] {
            assert_eq!(parse_reply(ok, &sent), Ok(Ok(())), "{ok}");
        }
        let e = parse_reply(
            "{\"retry\":\"later\",\"first\":10,\"last\":13,\"offset\":11}",
            &sent,
        )
        .unwrap()
        .unwrap_err();
        assert_eq!((e.offset, e.error.kind), (11, FailureKind::Retryable));
        let e = parse_reply(
            "{\"fail\":\"bad\",\"first\":10,\"last\":13,\"offset\":13}",
            &sent,
        )
        .unwrap()
        .unwrap_err();
        assert_eq!((e.offset, e.error.kind), (13, FailureKind::Permanent));
        // Without an offset, the failure is the batch's first message's.
        let e = parse_reply("{\"fail\":\"bad\",\"first\":10,\"last\":13}", &sent)
            .unwrap()
            .unwrap_err();
        assert_eq!(e.offset, 10);
        for bad in [
            // The README's replies before replies named the batch, and per-message ones.
            "{\"ack\":true}",
            "{\"ack\":true,\"offset\":13}",
            "{\"ack\":true,\"offset\":10}",
            "{\"fail\":\"x\",\"offset\":10}",
            // Another batch, or half a name.
            "{\"ack\":true,\"first\":11,\"last\":13}",
            "{\"ack\":true,\"first\":10,\"last\":11}",
            "{\"ack\":true,\"first\":10}",
            "{\"ack\":true,\"first\":10,\"last\":13,\"partition\":1}",
            // An ack is for all of it; a failure's offset is one of the batch.
            "{\"ack\":true,\"first\":10,\"last\":13,\"offset\":13}",
            "{\"fail\":\"x\",\"first\":10,\"last\":13,\"offset\":12}",
            "{\"fail\":\"x\",\"first\":10,\"last\":13,\"offset\":14}",
            "[{\"ack\":true}]",
        ] {
            assert!(parse_reply(bad, &sent).is_err(), "{bad:?} accepted");
        }
    }

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
