//! The `exec` processor: messages handed to long-lived child processes over a line
//! protocol, so a handler can be written in any language.
//!
//! - `ACKD_EXEC_CONCURRENCY` children run `sh -c "$ACKD_EXEC_COMMAND"`, each in its own
//!   process group, each served by one task (a "slot", `pool.rs`). A call's request waits
//!   in one queue until the dispatch (`dispatch.rs`) hands it to the child with the
//!   fewest in flight that holds fewer than `ACKD_EXEC_IN_FLIGHT` (default 1). The slot
//!   writes it to the child's stdin at once and matches each reply line to the request
//!   it names (`held.rs`; with one in flight, to the one request held). The partition
//!   workers decide what may start: a partition's (`ACKD_ORDERING=partition`) or a key's
//!   (`key`) next message only after the previous one was answered, so that order holds
//!   with any pool size and any number in flight.
//! - A child that closes its stdout (exits), writes something that is not a reply to
//!   a request it holds, or does not answer one within `ACKD_EXEC_TIMEOUT_MS` (from the
//!   moment it was given it) is killed (SIGTERM to its group, SIGKILL after 2 s), then
//!   every request it held fails as retryable (the worker's retry and `ACKD_ON_FAILURE`
//!   apply; a retry never overlaps the old attempt, and its request, rendered again,
//!   says `"redelivered":true` and the next `"attempt"`), and it is
//!   started again after a backoff (100 ms, doubling to 10 s; back to
//!   100 ms once a child answered). Each restart is an `at=exec_restart` line carrying
//!   `count#exec.restarts=1` (l2met sums them) and the total so far.
//! - Its stderr is logged line by line as `at=exec_stderr child=N pid=P line="…"`.
//! - No line is held longer than `ACKD_EXEC_MAX_LINE_BYTES`: a longer stdout line is a
//!   protocol error, a longer stderr line is logged cut, with `truncated_bytes=`; the
//!   rest of such a line is read and dropped, never buffered.
//! - [`Exec::shutdown`]: a child gets no new request, answers those it holds, then
//!   gets EOF on stdin;
//!   one still running halfway to the deadline gets SIGTERM, just before it SIGKILL.
//!
//! Wire format (docs/exec.md): request (built by [`super::json`])
//! `{"topic":"t","partition":0,"offset":41,"timestamp_ms":1700000000000,"key":"k-1","value":"hello","headers":[{"name":"trace","value":"t-1"}],"redelivered":false,"attempt":1}`
//! where a key, value or header value that is not UTF-8 comes as `key_base64`,
//! `value_base64` (standard alphabet, padded) instead, and a null one as JSON null; reply
//! `{"ack":true,"offset":41}`, `{"retry":"reason","offset":41}` or
//! `{"fail":"reason","offset":41}` (see [`parse_reply`]): every reply names what it
//! answers, so that no stray, extra or late line can answer another request.

mod child;
mod dispatch;
mod held;
mod pool;
mod protocol;
mod serve;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::output::metrics::EXEC_LIMIT;
use crate::processors::processor::{queued, BatchError, Message, ProcessError};
use crate::processors::request_limit::{LimitSettings, RequestLimit};
use crate::settings::{ConcurrencyMode, ExecSettings};

use dispatch::Job;
use held::Load;
use pool::Pool;
pub use protocol::{batch_line, parse_reply, request_line, Offsets, Sent};

/// The `exec` processor. Cheap to share; children start with the first message.
pub struct Exec {
    config: Arc<ExecSettings>,
    pool: OnceLock<Pool>,
    restarts: Arc<AtomicU64>,
    /// The requests in flight across the children: at most what they can hold at once
    /// (`ACKD_EXEC_CONCURRENCY` × `ACKD_EXEC_IN_FLIGHT`), or with
    /// `ACKD_EXEC_CONCURRENCY_MODE=adaptive` a limit up to that which follows the
    /// handler's capacity. A call renders its request only with a permit, so the calls
    /// waiting (one per partition behind a busy handler) hold no copy of their messages.
    limit: RequestLimit,
}

impl fmt::Debug for Exec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exec")
            .field("concurrency", &self.config.concurrency)
            .field("concurrency_mode", &self.config.concurrency_mode)
            .field("limit", &self.limit.current())
            .field("timeout", &self.config.timeout)
            .field("started", &self.pool.get().is_some())
            .finish()
    }
}

impl Exec {
    pub fn new(config: ExecSettings) -> Exec {
        let limit = RequestLimit::new(
            LimitSettings {
                adaptive: config.concurrency_mode == ConcurrencyMode::Adaptive,
                max: config.concurrency.max(1) * config.in_flight.max(1),
                // A child has no Retry-After: nothing pauses the pool.
                pause_max: Duration::ZERO,
            },
            Some(&EXEC_LIMIT),
        );
        Exec {
            config: Arc::new(config),
            pool: OnceLock::new(),
            restarts: Arc::new(AtomicU64::new(0)),
            limit,
        }
    }

    /// Children restarted so far (deaths, hangs, protocol errors).
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    fn pool(&self) -> &Pool {
        self.pool
            .get_or_init(|| Pool::start(self.config.clone(), self.restarts.clone()))
    }

    pub async fn process(&self, message: &Message<'_>) -> Result<(), ProcessError> {
        let sent = Sent {
            topic: message.topic().to_string(),
            partition: message.partition(),
            offsets: Offsets::One(message.offset()),
        };
        self.request(|| request_line(message), sent)
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
        self.request(|| batch_line(messages), sent).await
    }

    async fn request(&self, line: impl FnOnce() -> Vec<u8>, sent: Sent) -> Result<(), BatchError> {
        let pool = self.pool();
        let first = sent.offsets.first();
        // Queued before any wait: the call starts when a child takes it.
        let queued = queued();
        // Held until the answer: the permit is the children's room for this request.
        let permit = self.limit.acquire().await;
        let (reply, answer) = oneshot::channel();
        let job = Job {
            line: line(),
            sent,
            reply,
            queued,
        };
        if pool.jobs.send(job).await.is_err() {
            return Err(BatchError::new(
                first,
                ProcessError::retryable("exec processor is stopped"),
            ));
        }
        let (result, load, latency) = answer.await.unwrap_or_else(|_| {
            let stopped = "exec processor stopped before a child answered";
            let error = BatchError::new(first, ProcessError::retryable(stopped));
            (Err(error), Load::Unknown, Duration::ZERO)
        });
        match load {
            Load::Answered => permit.succeeded_in(latency),
            Load::Overloaded => permit.overloaded(),
            Load::Unknown => {}
        }
        result
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
