//! Serving jobs (requests for a child) with one child: a request written, its reply
//! read, within the timeout and the shutdown deadline.

use std::time::Instant;

use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot, watch};

use crate::processors::processor::{BatchError, ProcessError, Queued};

use super::child::Running;
use super::config::ExecConfig;
use super::protocol::{parse_reply, shorten, Sent};

/// One request for a child (a message, or a batch), and where its answer goes.
pub(super) struct Job {
    pub(super) line: Vec<u8>,
    pub(super) sent: Sent,
    pub(super) reply: oneshot::Sender<Result<(), BatchError>>,
    /// The call starts when a child takes it, not while it waits for one.
    pub(super) queued: Queued,
}

/// Why a child's service ended.
pub(super) enum Ended {
    /// A graceful stop began: finish, with this deadline.
    Stop(Instant),
    /// The child failed; it is replaced. The message it had, if any, is failed only
    /// once the child is gone, so that its retry can never overlap the old attempt.
    Failed(String, Option<Failed>),
}

/// The message a failed child had, and its failure.
pub(super) struct Failed {
    pub(super) reply: oneshot::Sender<Result<(), BatchError>>,
    pub(super) error: BatchError,
}

/// Serves messages with one child until it fails or a stop begins. Also says whether
/// the child answered any message (a healthy child resets the restart backoff).
pub(super) async fn serve(
    running: &mut Running,
    config: &ExecConfig,
    jobs: &tokio::sync::Mutex<mpsc::Receiver<Job>>,
    stop: &mut watch::Receiver<Option<Instant>>,
) -> (Ended, bool) {
    let mut answered = false;
    loop {
        let job = match next_job(running, jobs, stop).await {
            Ok(job) => job,
            Err(ended) => return (ended, answered),
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
        if reply.is_closed() {
            continue;
        }
        let Some(taken) = queued.take() else {
            continue;
        };
        let outcome = tokio::select! {
            r = tokio::time::timeout(config.timeout, exchange(running, config, &request, &sent)) => match r {
                Ok(r) => r,
                Err(_) => Err(format!(
                    "no reply within ACKD_EXEC_TIMEOUT_MS={}",
                    config.timeout.as_millis()
                )),
            },
            deadline = stop_deadline(stop) => {
                let _ = reply.send(Err(BatchError::new(
                    offset,
                    ProcessError::retryable(
                        "exec child did not answer before the shutdown deadline",
                    ),
                )));
                return (Ended::Stop(deadline), answered);
            }
        };
        // The child is free: the call no longer counts as under way, before the next
        // job (another partition's) is taken.
        drop(taken);
        match outcome {
            Ok(result) => {
                answered = true;
                // The worker may have given up on it (aborted): the answer goes nowhere.
                let _ = reply.send(result);
            }
            Err(reason) => return (failed(running, reason, offset, reply), answered),
        }
    }
}

/// Idle: a job, unless a stop begins, or the child goes away or talks out of turn first.
async fn next_job(
    running: &mut Running,
    jobs: &tokio::sync::Mutex<mpsc::Receiver<Job>>,
    stop: &mut watch::Receiver<Option<Instant>>,
) -> Result<Job, Ended> {
    tokio::select! {
        biased;
        d = async { stop.wait_for(Option::is_some).await.ok().and_then(|d| *d) } => {
            let deadline = d.unwrap_or_else(Instant::now);
            Err(Ended::Stop(deadline))
        }
        line = running.next_line() => {
            let reason = match line {
                Some(l) => format!("wrote to stdout with no message in flight: {}", shorten(&l.text)),
                None => running.gone_reason().await,
            };
            Err(Ended::Failed(reason, None))
        }
        job = async { jobs.lock().await.recv().await } => match job {
            Some(job) => Ok(job),
            None => Err(Ended::Stop(Instant::now())),
        },
    }
}

/// Writes `request` to the child's stdin and reads its reply. `Err`: why the child
/// failed on it.
async fn exchange(
    running: &mut Running,
    config: &ExecConfig,
    request: &[u8],
    sent: &Sent,
) -> Result<Result<(), BatchError>, String> {
    let stdin = running
        .stdin
        .as_mut()
        .ok_or_else(|| "stdin is closed".to_string())?;
    stdin
        .write_all(request)
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
        Some(line) => parse_reply(&line.text, sent),
        None => Err(running.gone_reason().await),
    }
}

/// The message in flight ends at the timeout, or at a graceful stop's deadline: that
/// deadline, once it has come.
fn stop_deadline(
    stop: &watch::Receiver<Option<Instant>>,
) -> impl std::future::Future<Output = Instant> {
    let mut stop = stop.clone();
    async move {
        let _ = stop.wait_for(Option::is_some).await;
        let deadline = stop.borrow().unwrap_or_else(Instant::now);
        tokio::time::sleep_until(deadline.into()).await;
        deadline
    }
}

/// The child failed on the message at `offset`: it is replaced, and the message
/// failed as retryable once it is gone.
fn failed(
    running: &Running,
    reason: String,
    offset: i64,
    reply: oneshot::Sender<Result<(), BatchError>>,
) -> Ended {
    let error = BatchError::new(
        offset,
        ProcessError::retryable(format!(
            "exec child {} (pid {}) failed on this message: {reason}",
            running.id, running.pid
        )),
    );
    Ended::Failed(
        format!("{reason} (offset {offset})"),
        Some(Failed { reply, error }),
    )
}
