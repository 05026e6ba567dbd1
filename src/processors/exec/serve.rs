//! Serving requests with one child: each written to its stdin as the dispatch hands it
//! over (up to `ACKD_EXEC_IN_FLIGHT` held at once), each reply matched to the request
//! it names, each request timed from the moment the child was given it.

use std::time::Instant;

use tokio::sync::{mpsc, watch};

use crate::processors::processor::{BatchError, ProcessError};
use crate::settings::ExecSettings;

use super::child::{Output, Running};
use super::dispatch::Dispatch;
use super::dispatch::Job;
use super::held::{Held, HeldRequests, Load};
use super::protocol::{shorten, RequestName};

/// Why a child's service ended.
pub(super) enum Ended {
    /// A graceful stop began and the child answered all it held (or the deadline
    /// came): it gets EOF next, with this deadline.
    Stop(Instant),
    /// The child failed; it is replaced. What it held is failed only once it is gone,
    /// so that a retry can never overlap the old attempt; the [`Load`] says whether the
    /// failure was the handler's overload (a timeout).
    Failed(String, Vec<Held>, Load),
}

/// What happened next, as the service sees it.
enum Event {
    Stop(Instant),
    StopDeadline,
    Job(Option<Job>),
    Output(Output),
    TimedOut(RequestName),
}

/// One child being served.
pub(super) struct Service<'a> {
    pub(super) running: &'a mut Running,
    pub(super) config: &'a ExecSettings,
    pub(super) inbox: &'a mut mpsc::UnboundedReceiver<Job>,
    pub(super) dispatch: &'a Dispatch,
    pub(super) stop: &'a mut watch::Receiver<Option<Instant>>,
    /// Where a request goes back to the dispatch when its partition may not start
    /// calls as it arrives (a stall between the dispatch and the child).
    pub(super) handed_back: &'a mpsc::UnboundedSender<Job>,
}

impl Service<'_> {
    /// Serves requests until the child fails or a stop began and it answered all it
    /// held. Also says whether it answered any (a healthy child resets the backoff).
    pub(super) async fn run(mut self) -> (Ended, bool) {
        let mut held = HeldRequests::new(self.config.timeout, self.config.in_flight);
        // When the child first answered: what it was given before, it answered in the
        // time it took to start too.
        let mut answered: Option<Instant> = None;
        let mut stopping: Option<Instant> = None;
        loop {
            if let Some(deadline) = stopping.filter(|_| held.is_empty()) {
                return (Ended::Stop(deadline), answered.is_some());
            }
            let failure = match self.next_event(&held, stopping).await {
                Event::Stop(deadline) => {
                    // No new request once the stop began: what it holds, it finishes.
                    self.dispatch.set_serving(self.running.id, false);
                    stopping = Some(deadline);
                    None
                }
                Event::StopDeadline => {
                    for h in held.drain() {
                        self.dispatch.release(self.running.id);
                        let error = BatchError::new(
                            h.sent.offsets.first(),
                            ProcessError::retryable(
                                "exec child did not answer before the shutdown deadline",
                            ),
                        );
                        h.send(Err(error), Load::Unknown);
                    }
                    None
                }
                Event::Job(Some(job)) => self.give(job, &mut held).err(),
                Event::Job(None) => {
                    stopping = Some(Instant::now());
                    None
                }
                Event::Output(output) => self.output(output, &mut held, &mut answered).await,
                Event::TimedOut(name) => {
                    let reason = self.timed_out(&name, held.len());
                    return (
                        Ended::Failed(reason, held.drain(), Load::Overloaded),
                        answered.is_some(),
                    );
                }
            };
            if let Some(reason) = failure {
                let ended = Ended::Failed(reason, held.drain(), Load::Unknown);
                return (ended, answered.is_some());
            }
        }
    }

    async fn next_event(&mut self, held: &HeldRequests, stopping: Option<Instant>) -> Event {
        let timeout = held.earliest_deadline();
        let (timeout_at, name) = match timeout {
            Some((at, name)) => (Some(at), Some(name)),
            None => (None, None),
        };
        let far = || Instant::now() + std::time::Duration::from_secs(86_400);
        tokio::select! {
            biased;
            d = self.stop.wait_for(Option::is_some), if stopping.is_none() => {
                Event::Stop(d.ok().and_then(|d| *d).unwrap_or_else(Instant::now))
            }
            _ = tokio::time::sleep_until(stopping.unwrap_or_else(far).into()), if stopping.is_some() => {
                Event::StopDeadline
            }
            output = self.running.next_output() => Event::Output(output),
            _ = tokio::time::sleep_until(timeout_at.unwrap_or_else(far).into()), if timeout_at.is_some() => {
                Event::TimedOut(name.expect("a deadline has a name"))
            }
            job = self.inbox.recv(), if stopping.is_none() => Event::Job(job),
        }
    }

    /// Writes `job` to the child, unless its worker dropped it while it waited (a stop
    /// or a revoke began, or a drain ran out of time: the partition may be someone
    /// else's now). `Err`: the child cannot be written to.
    fn give(&mut self, job: Job, held: &mut HeldRequests) -> Result<(), String> {
        if !job.queued.may_start() && !job.reply.is_closed() {
            // Not taken: the dispatch waits for the partition, then hands it out again.
            self.dispatch.release(self.running.id);
            let _ = self.handed_back.send(job);
            return Ok(());
        }
        let Job {
            line,
            sent,
            reply,
            queued,
        } = job;
        let taken = match queued.take() {
            Some(taken) if !reply.is_closed() => taken,
            _ => {
                self.dispatch.release(self.running.id);
                return Ok(());
            }
        };
        let written = self.running.give(line);
        if let Some(displaced) = held.give(Held::new(sent, reply, taken)) {
            self.dispatch.release(self.running.id);
            drop(displaced);
        }
        written
    }

    /// A line from the child answers one request it holds; anything else is a failure.
    async fn output(
        &mut self,
        output: Output,
        held: &mut HeldRequests,
        answered: &mut Option<Instant>,
    ) -> Option<String> {
        let line = match output {
            Output::Line(line) => line,
            Output::Closed => return Some(self.running.gone_reason().await),
            Output::WriteFailed(reason) => {
                return Some(self.running.write_failed_reason(reason).await)
            }
        };
        if line.cut > 0 {
            return Some(format!(
                "wrote a line longer than ACKD_EXEC_MAX_LINE_BYTES={} ({} bytes): {}",
                self.config.max_line_bytes,
                line.text.len() as u64 + line.cut,
                shorten(&line.text)
            ));
        }
        match held.answer(&line.text) {
            Ok((request, result)) => {
                let warm = *answered.get_or_insert_with(Instant::now);
                // Released first: the child has room before the worker hears back.
                self.dispatch.release(self.running.id);
                let load = match Load::of(&result) {
                    // Its latency holds the child's start: nothing of the handler's load.
                    Load::Answered if request.given() < warm => Load::Unknown,
                    load => load,
                };
                request.send(result, load);
                None
            }
            Err(reason) => Some(reason),
        }
    }

    /// Why the child is replaced when the request `name` ran out of time.
    fn timed_out(&self, name: &RequestName, holding: usize) -> String {
        let limit = self.config.timeout.as_millis();
        if self.config.in_flight <= 1 && holding <= 1 {
            format!("no reply within ACKD_EXEC_TIMEOUT_MS={limit}")
        } else {
            format!("no reply within ACKD_EXEC_TIMEOUT_MS={limit} to {name}")
        }
    }
}

/// The restart line's reason: why, and what the child held.
pub(super) fn restart_reason(reason: &str, held: &[Held]) -> String {
    const SHOWN: usize = 10;
    match held {
        [] => reason.to_string(),
        [one] => format!("{reason} (offset {})", one.sent.offsets.first()),
        many => {
            let offsets: Vec<String> = many
                .iter()
                .take(SHOWN)
                .map(|h| format!("{}/{}", h.sent.partition, h.sent.offsets.first()))
                .collect();
            let more = if many.len() > SHOWN { ", …" } else { "" };
            format!(
                "{reason} (holding {} requests, partition/offset {}{more})",
                many.len(),
                offsets.join(", ")
            )
        }
    }
}

/// The failure a request held by a failed child gets: retryable, once the child is gone.
pub(super) fn child_failed(running: &Running, reason: &str, held: &Held) -> BatchError {
    BatchError::new(
        held.sent.offsets.first(),
        ProcessError::retryable(format!(
            "exec child {} (pid {}) failed on this message: {reason}",
            running.id, running.pid
        )),
    )
}
