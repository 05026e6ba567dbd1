//! The processor call on what the partition hands it (a message, or a batch): its
//! attempts, the wait before a retry, and the failure policy (`ACKD_ON_FAILURE`: halt,
//! skip, or dead-letter) once a message failed for good.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::time::Instant;

use futures::FutureExt;
use tokio::sync::watch;

use super::shared::WorkerShared;
use super::task::WorkerConfig;
use crate::consumer::copier::Copy;
use crate::output::metrics::Took;
use crate::processors::call_start;
use crate::processors::processor::{
    panicked, BatchError, FailureKind, Message, ProcessError, Processor,
};
use crate::settings::OnFailure;

/// What a call to `Processor::process` returned, or its panic.
pub(super) type Outcome = std::thread::Result<Result<(), ProcessError>>;

/// How one message ended.
pub(super) enum Handled {
    /// The processor acknowledged it.
    Processed,
    /// It failed, and the policy acknowledged it (skipped, or dead-lettered).
    Ack,
    /// It failed and the partition stops here.
    Halt,
    /// Stop was requested during a retry's wait, or before the processor took the call.
    Interrupted,
}

/// How a batch ended.
pub(super) enum BatchEnd {
    /// Every message of it is acknowledged (processed, or by the failure policy).
    Done,
    /// The partition stops at this offset; the messages before it are acknowledged.
    Halt(i64),
    /// Stop was requested during a retry's wait, or before the processor took the call.
    Interrupted,
}

/// Where a batch's acknowledgements go as its handler makes them: `index` is the
/// message's place in the batch.
pub(super) trait Acks {
    fn ack(&mut self, index: usize, view: &Message<'_>, processed: bool);
}

/// Runs the processor on what the partition hands it, with retries and the failure
/// policy: what one message or batch needs besides itself.
pub(super) struct Handler<'a, P> {
    pub(super) config: &'a WorkerConfig<P>,
    pub(super) shared: &'a WorkerShared,
    pub(super) stop: &'a mut watch::Receiver<bool>,
    pub(super) rng: &'a mut fastrand::Rng,
    /// The partition's only call (partition ordering): it publishes the offset in hand
    /// and when its call began. Concurrent calls leave that to their loop.
    pub(super) sequential: bool,
}

impl<P: Processor> Handler<'_, P> {
    /// Runs the processor on one message, with retries and the failure policy.
    pub(super) async fn handle(&mut self, view: &Message<'_>) -> Handled {
        self.handle_after(view, None).await
    }

    /// [`Self::handle`], its first attempt's outcome and duration given when the caller
    /// made that call itself (`first`).
    pub(super) async fn handle_after(
        &mut self,
        view: &Message<'_>,
        mut first: Option<(Outcome, Took)>,
    ) -> Handled {
        let mut attempt = 1;
        let error = loop {
            let (outcome, took) = match first.take() {
                Some(done) => done,
                None => {
                    // A retry hands over a copy that says so; the first attempt, the view.
                    let again;
                    let handed = if attempt == 1 {
                        view
                    } else {
                        again = retried(view, attempt);
                        &again
                    };
                    let started = self.shared.metrics.stopwatch();
                    let call =
                        AssertUnwindSafe(self.config.processor.process(handed)).catch_unwind();
                    let offset = view.offset();
                    let Some(outcome) = self.attempt((offset, offset, 1), call).await else {
                        return Handled::Interrupted;
                    };
                    (outcome, started.elapsed())
                }
            };
            let error = match outcome {
                Ok(Ok(())) => {
                    self.shared.metrics.processed(took);
                    return Handled::Processed;
                }
                Ok(Err(e)) => e,
                // A panic is a failure of this message, never of the daemon.
                Err(panic) => panicked(&panic),
            };
            self.shared.metrics.failed(took);
            if error.kind != FailureKind::Retryable || !self.retries_in_place(attempt) {
                break error;
            }
            if !self.wait_to_retry(view, 1, attempt, &error).await {
                return Handled::Interrupted;
            }
            attempt += 1;
        };
        let made = view.attempt().saturating_add(attempt - 1);
        self.give_up(view, &error, (attempt, made)).await
    }

    /// Runs the processor on a batch: the messages before a failed one are acknowledged,
    /// the failed one gets retries and the failure policy, the rest is handed over again.
    pub(super) async fn handle_batch(
        &mut self,
        batch: &[Message<'_>],
        acks: &mut impl Acks,
    ) -> BatchEnd {
        let mut rest = batch;
        // Attempts of rest[0], the message the last failure was on (the retry policy's).
        let mut attempt = 1;
        // Calls made: each handed all of `rest` over, so its messages' attempts.
        let (mut calls, mut again) = (0, Vec::new());
        while let Some(first) = rest.first() {
            if self.sequential {
                self.shared
                    .in_flight
                    .store(first.offset(), Ordering::Release);
            }
            calls += 1;
            let handed = handed_over(rest, calls, &mut again);
            let started = Instant::now();
            let call = AssertUnwindSafe(self.config.processor.process_batch(handed)).catch_unwind();
            let last = rest[rest.len() - 1].offset();
            let span = (first.offset(), last, rest.len());
            let Some(outcome) = self.attempt(span, call).await else {
                return BatchEnd::Interrupted;
            };
            let took = started.elapsed();
            let (failed_at, error): (usize, ProcessError) = match outcome {
                Ok(Ok(())) => {
                    self.shared.metrics.processed_many(rest.len() as u64, took);
                    ack_processed(acks, batch.len() - rest.len(), handed);
                    return BatchEnd::Done;
                }
                Ok(Err(BatchError { offset, error })) => (failed_at(rest, offset), error),
                // A panic out of a processor's own process_batch: which message it was
                // on is unknown, so it is the batch's first unacknowledged one. (The
                // default process_batch catches panics per message.)
                Err(panic) => (0, panicked(&panic)),
            };
            // The attempt the processor saw the failed message as: each call hands all of
            // `rest` over again.
            let made = handed.get(failed_at).map_or(1, Message::attempt);
            if failed_at > 0 {
                self.shared
                    .metrics
                    .processed_many(failed_at as u64, Took::UNTIMED);
                ack_processed(acks, batch.len() - rest.len(), &handed[..failed_at]);
                rest = &rest[failed_at..];
                attempt = 1;
            }
            self.shared.metrics.failed(took);
            let view = &rest[0];
            if error.kind == FailureKind::Retryable && self.retries_in_place(attempt) {
                if !self.wait_to_retry(view, rest.len(), attempt, &error).await {
                    return BatchEnd::Interrupted;
                }
                attempt += 1;
                continue;
            }
            match self.give_up(view, &error, (attempt, made)).await {
                Handled::Ack => {
                    acks.ack(batch.len() - rest.len(), view, false);
                    rest = &rest[1..];
                    attempt = 1;
                }
                Handled::Processed => unreachable!("the failure policy never processes"),
                Handled::Halt => return BatchEnd::Halt(view.offset()),
                Handled::Interrupted => return BatchEnd::Interrupted,
            }
        }
        BatchEnd::Done
    }

    /// Whether a retryable failure of attempt `attempt` is tried again in place: not
    /// with retry tiers, which are the retries (the next tier has the message at once).
    fn retries_in_place(&self, attempt: u32) -> bool {
        self.config.retry_tiers.is_empty() && self.config.retry.again(attempt)
    }

    /// One attempt of the processor call, on `messages` offsets from `first` to `last`.
    /// A concurrent one, or the partition's only one when the processor's calls may
    /// wait for capacity, starts when the processor takes it, and a stop before that
    /// drops it (`None`: its messages stay unacknowledged, for the next reader, and were
    /// never handed over). Otherwise the partition's only call times itself and notes
    /// its offsets handed over: one store each, no allocation or lock (noop, log).
    pub(super) async fn attempt<F: std::future::Future>(
        &mut self,
        (first, last, messages): (i64, i64, usize),
        call: F,
    ) -> Option<F::Output> {
        let tracked = (&self.shared.calls, &self.shared.hold);
        let span = (first, last, messages);
        if !self.sequential {
            return call_start::admitted(call, tracked, span, self.stop).await;
        }
        if self.config.processor.calls_may_wait() {
            // A copy: `admitted` marks the stop seen, and the partition's read loop
            // (`Worker::next`) must still see it.
            let mut stop = self.stop.clone();
            return call_start::admitted(call, tracked, span, &mut stop).await;
        }
        // A retry after its delay, a batch after its gathering: the wait may have
        // spanned a stall, or the membership fallen in doubt meanwhile.
        if !self.shared.hold.may_start() {
            let mut stop = self.stop.clone();
            if !self.shared.hold.wait_unless_stopped(&mut stop).await {
                return None;
            }
        }
        self.shared.only_call_begins(last);
        let outcome = call.await;
        self.shared.call_ended();
        Some(outcome)
    }

    /// Logs a retry of `view` (and the `messages - 1` after it, for a batch) and waits for
    /// it. False: stop was requested meanwhile.
    async fn wait_to_retry(
        &mut self,
        view: &Message<'_>,
        messages: usize,
        attempt: u32,
        error: &ProcessError,
    ) -> bool {
        let mut delay = self.config.retry.delay(attempt, self.rng);
        if let Some(after) = error.retry_after {
            // The processor knows better (Retry-After), within ACKD_RETRY_MAX_MS.
            delay = delay.max(after.min(self.config.retry.max));
        }
        self.shared.metrics.retried();
        tracing::warn!(
            at = "retry",
            topic = view.topic(),
            partition = view.partition(),
            offset = view.offset(),
            batch_messages = (self.config.batch.max_messages > 1).then_some(messages),
            attempt,
            max_attempts = self.config.retry.max_attempts,
            delay_ms = delay.as_millis() as u64,
            error = %error
        );
        tokio::select! {
            biased;
            _ = self.stop.wait_for(|s| *s) => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }

    /// The failure policy, once a message failed in place `attempts` times, and as the
    /// processor's attempt `made` (counted on from the attempts its copy says were made
    /// before, from a retry tier): a retryable failure goes to the next retry tier, if
    /// any; else `ACKD_ON_FAILURE`.
    async fn give_up(
        &mut self,
        view: &Message<'_>,
        error: &ProcessError,
        (attempts, made): (u32, u32),
    ) -> Handled {
        if error.kind == FailureKind::Retryable {
            let tiers = self.config.retry_tiers.clone();
            if let Some(next) = tiers.next(view.topic()) {
                return self
                    .forward(view, error, made, next.topic, Some(next.delay))
                    .await;
            }
        }
        let (topic, partition, offset) = (view.topic(), view.partition(), view.offset());
        match self.config.on_failure {
            OnFailure::Halt => {
                tracing::error!(
                    at = "process_failed",
                    topic,
                    partition,
                    offset,
                    key = view.key(),
                    attempts,
                    error = %error,
                    "partition halted (ACKD_ON_FAILURE=halt): its offset is not committed past this message"
                );
                Handled::Halt
            }
            OnFailure::Skip => {
                self.shared.metrics.skipped();
                tracing::warn!(
                    at = "skipped",
                    topic,
                    partition,
                    offset,
                    key = view.key(),
                    attempts,
                    error = %error,
                    "acknowledged without processing (ACKD_ON_FAILURE=skip)"
                );
                Handled::Ack
            }
            OnFailure::DeadLetter => self.dead_letter(view, error, made).await,
        }
    }

    /// Hands the message to the dead-letter topic, retrying the produce like a processor
    /// failure; if it cannot be delivered, the partition halts: a message never goes nowhere.
    async fn dead_letter(
        &mut self,
        view: &Message<'_>,
        error: &ProcessError,
        attempts: u32,
    ) -> Handled {
        let (topic, partition, offset) = (view.topic(), view.partition(), view.offset());
        let Some(dlq) = self
            .config
            .copier
            .as_ref()
            .and_then(|c| c.dead_letter_topic())
        else {
            tracing::error!(at = "process_failed", topic, partition, offset, error = %error, "no dead-letter producer; partition halted");
            return Handled::Halt;
        };
        self.forward(view, error, attempts, dlq, None).await
    }

    /// Hands the message to `to`: its next retry tier (`delay` its tier's), or the
    /// dead-letter topic (`None`), acknowledged once the broker has the copy.
    async fn forward(
        &mut self,
        view: &Message<'_>,
        error: &ProcessError,
        attempts: u32,
        to: &str,
        delay: Option<std::time::Duration>,
    ) -> Handled {
        let copy = Copy {
            error,
            attempts,
            from_tier: self.config.from_tier,
            delay,
        };
        let (at, lines) = match delay {
            None => ("dead_lettered", ("dead_letter_retry", "dead_letter_failed")),
            Some(_) => ("retry_topic", ("retry_topic_retry", "retry_topic_failed")),
        };
        let (to_partition, to_offset, due) = match self.copy(view, to, &copy, lines).await {
            Ok(sent) => sent,
            Err(handled) => return handled,
        };
        let dead = delay.is_none();
        if dead {
            self.shared.metrics.dead_lettered();
        } else {
            self.shared.metrics.retried();
        }
        tracing::warn!(
            at,
            topic = view.topic(),
            partition = view.partition(),
            offset = view.offset(),
            key = view.key(),
            attempts,
            error = %error,
            dead_letter_topic = dead.then_some(to),
            dead_letter_partition = dead.then_some(to_partition),
            dead_letter_offset = dead.then_some(to_offset),
            retry_topic = (!dead).then_some(to),
            retry_partition = (!dead).then_some(to_partition),
            retry_offset = (!dead).then_some(to_offset),
            delay_ms = delay.map(|d| d.as_millis() as u64),
            due_ms = due
        );
        Handled::Ack
    }

    /// Produces `view`'s copy to `to`, retrying the produce like a processor failure.
    /// `Err`: how the message ends instead (stopped meanwhile: unacknowledged; not
    /// delivered: the partition halts, its offset not committed past it). `lines` are
    /// the `at=` of a retry of the produce and of its failure.
    async fn copy(
        &mut self,
        view: &Message<'_>,
        to: &str,
        copy: &Copy<'_>,
        (retry_at, failed_at): (&'static str, &'static str),
    ) -> Result<(i32, i64, Option<i64>), Handled> {
        let (topic, partition, offset) = (view.topic(), view.partition(), view.offset());
        let Some(copier) = self.config.copier.clone() else {
            tracing::error!(
                at = "process_failed",
                topic,
                partition,
                offset,
                "no producer for copies; partition halted"
            );
            return Err(Handled::Halt);
        };
        let mut attempt = 1;
        loop {
            match copier.send(to, view, copy).await {
                Ok(sent) => return Ok(sent),
                // Never made however often it is tried: say so, and halt.
                Err(e) if e.too_large() => {
                    tracing::error!(at = "copy_too_large", topic, partition, offset, to, error = %e,
                        "the copy of this message is larger than its topic takes (max.message.bytes): not retried; partition halted, its offset is not committed past it; raise the topic's max.message.bytes");
                    return Err(Handled::Halt);
                }
                Err(e) if self.config.retry.again(attempt) => {
                    let delay = self.config.retry.delay(attempt, self.rng);
                    tracing::warn!(at = retry_at, topic, partition, offset, attempt, delay_ms = delay.as_millis() as u64, error = %e);
                    tokio::select! {
                        biased;
                        _ = self.stop.wait_for(|s| *s) => return Err(Handled::Interrupted),
                        _ = tokio::time::sleep(delay) => {}
                    }
                    attempt += 1;
                }
                Err(e) => {
                    tracing::error!(
                        at = failed_at,
                        topic,
                        partition,
                        offset,
                        to,
                        error = %e,
                        "could not produce the copy; partition halted, its offset is not committed past it"
                    );
                    return Err(Handled::Halt);
                }
            }
        }
    }
}

/// `view` as its `attempt`th handing over in this call: a retry, so redelivered. The
/// attempts count on from the view's own (1, unless the partition handed it over before).
fn retried<'m>(view: &Message<'m>, attempt: u32) -> Message<'m> {
    view.with_delivery(true, view.attempt().saturating_add(attempt - 1))
}

/// What the `calls`th call of a batch hands over: `rest` itself the first time, then
/// copies of it (in `again`, its allocation reused) that say they are handed over again.
fn handed_over<'s, 'm>(
    rest: &'s [Message<'m>],
    calls: u32,
    again: &'s mut Vec<Message<'m>>,
) -> &'s [Message<'m>] {
    if calls == 1 {
        return rest;
    }
    again.clear();
    again.extend(rest.iter().map(|m| retried(m, calls)));
    again
}

/// Acknowledges `views`, processed: a batch's messages from its `from`th on.
fn ack_processed(acks: &mut impl Acks, from: usize, views: &[Message<'_>]) {
    for (i, view) in views.iter().enumerate() {
        acks.ack(from + i, view, true);
    }
}

/// Where in `rest` (the batch handed to the processor) its failure at `offset` is: the
/// message's index, or the first message's if `offset` is not in the batch (logged).
fn failed_at(rest: &[Message<'_>], offset: i64) -> usize {
    if let Some(i) = rest.iter().position(|m| m.offset() == offset) {
        return i;
    }
    let (first, last) = (&rest[0], &rest[rest.len() - 1]);
    tracing::warn!(
        at = "batch_error",
        topic = first.topic(),
        partition = first.partition(),
        offset,
        first_offset = first.offset(),
        last_offset = last.offset(),
        "the processor reported a failure at an offset that is not in the batch: the batch failed at its first message"
    );
    0
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::consumer::worker::{Batching, Concurrency};
    use crate::processors::processor::ProcessError;
    use crate::settings::{OnFailure, RetryPolicy};

    /// What each call was handed: (offset, redelivered, attempt) of its messages.
    type Calls = Mutex<Vec<Vec<(i64, bool, u32)>>>;

    /// Fails retryably at the offsets of `fail_at`, one per call in turn, then acks.
    struct Recording {
        calls: Calls,
        fail_at: Mutex<Vec<i64>>,
    }

    impl Recording {
        fn failing_at(offsets: &[i64]) -> Recording {
            Recording {
                calls: Mutex::default(),
                fail_at: Mutex::new(offsets.iter().rev().copied().collect()),
            }
        }

        fn record(&self, messages: &[Message<'_>]) -> Option<i64> {
            let seen = messages
                .iter()
                .map(|m| (m.offset(), m.redelivered(), m.attempt()))
                .collect();
            self.calls.lock().unwrap().push(seen);
            self.fail_at.lock().unwrap().pop()
        }
    }

    impl Processor for Recording {
        async fn process(&self, message: &Message<'_>) -> Result<(), ProcessError> {
            match self.record(std::slice::from_ref(message)) {
                Some(_) => Err(ProcessError::retryable("not yet")),
                None => Ok(()),
            }
        }

        async fn process_batch(&self, messages: &[Message<'_>]) -> Result<(), BatchError> {
            match self.record(messages) {
                Some(at) => Err(BatchError::new(at, ProcessError::retryable("not yet"))),
                None => Ok(()),
            }
        }
    }

    fn config(processor: Recording) -> WorkerConfig<Recording> {
        WorkerConfig {
            processor: Arc::new(processor),
            log_messages: false,
            message_source: None,
            at_end: None,
            retry: RetryPolicy {
                initial: Duration::from_millis(1),
                max: Duration::from_millis(1),
                max_attempts: 5,
            },
            on_failure: OnFailure::Halt,
            copier: None,
            retry_tiers: Default::default(),
            from_tier: false,
            batch: Batching {
                max_messages: 8,
                max_wait: Duration::ZERO,
                max_bytes: 0,
            },
            concurrency: Concurrency::SEQUENTIAL,
            limits: Default::default(),
            taken_max_bytes: 0,
            delay_ms: 0,
        }
    }

    /// Runs `run` with a handler of `config`.
    async fn with_handler<P: Processor, T>(
        config: &WorkerConfig<P>,
        run: impl AsyncFnOnce(&mut Handler<'_, P>) -> T,
    ) -> T {
        let shared = WorkerShared::new();
        let (_stop_tx, mut stop) = watch::channel(false);
        let mut rng = fastrand::Rng::with_seed(7);
        let mut handler = Handler {
            config,
            shared: &shared,
            stop: &mut stop,
            rng: &mut rng,
            sequential: true,
        };
        run(&mut handler).await
    }

    #[tokio::test]
    async fn each_retry_hands_the_message_over_redelivered_with_its_attempt() {
        let config = config(Recording::failing_at(&[5, 5]));
        let view = Message::new("t", 0, 5, None, None, None);
        let handled = with_handler(&config, async |h| h.handle(&view).await).await;
        assert!(matches!(handled, Handled::Processed));
        let calls = config.processor.calls.lock().unwrap().concat();
        assert_eq!(calls, [(5, false, 1), (5, true, 2), (5, true, 3)]);
        // A message the partition says may be a repeat is one from its first attempt.
        let config = self::config(Recording::failing_at(&[]));
        let view = view.with_delivery(true, 1);
        with_handler(&config, async |h| h.handle(&view).await).await;
        let calls = config.processor.calls.lock().unwrap().concat();
        assert_eq!(calls, [(5, true, 1)]);
    }

    /// A batch that halts at its third message was handed over whole: its last offset
    /// is what a release names, though only the first two are acknowledged.
    #[tokio::test]
    async fn a_halted_batch_was_handed_over_to_its_last_message() {
        let mut config = config(Recording::failing_at(&[2]));
        config.retry.max_attempts = 1;
        let views: Vec<Message<'_>> = (0..4)
            .map(|o| Message::new("t", 0, o, None, None, None))
            .collect();
        let shared = WorkerShared::new();
        let (_stop_tx, mut stop) = watch::channel(false);
        let mut rng = fastrand::Rng::with_seed(7);
        let mut handler = Handler {
            config: &config,
            shared: &shared,
            stop: &mut stop,
            rng: &mut rng,
            sequential: true,
        };
        let mut acks: Vec<(usize, bool, u32)> = Vec::new();
        let ended = handler.handle_batch(&views, &mut acks).await;
        assert!(matches!(ended, BatchEnd::Halt(2)));
        assert_eq!(acks.len(), 2);
        assert_eq!(shared.handed_through(), Some(3));
    }

    /// Acknowledged messages, by index, with the delivery they were handed over with.
    impl Acks for Vec<(usize, bool, u32)> {
        fn ack(&mut self, index: usize, view: &Message<'_>, _processed: bool) {
            self.push((index, view.redelivered(), view.attempt()));
        }
    }

    #[tokio::test]
    async fn a_batch_handed_over_again_is_the_next_attempt_of_each_of_its_messages() {
        // Fails at 1 (0 is acknowledged), then at 2 (1 is), then acks 2 and 3.
        let config = config(Recording::failing_at(&[1, 2]));
        let views: Vec<Message<'_>> = (0..4)
            .map(|o| Message::new("t", 0, o, None, None, None))
            .collect();
        let mut acks: Vec<(usize, bool, u32)> = Vec::new();
        let ended = with_handler(&config, async |h| h.handle_batch(&views, &mut acks).await).await;
        assert!(matches!(ended, BatchEnd::Done));
        let calls = config.processor.calls.lock().unwrap().clone();
        assert_eq!(
            calls,
            [
                vec![(0, false, 1), (1, false, 1), (2, false, 1), (3, false, 1)],
                vec![(1, true, 2), (2, true, 2), (3, true, 2)],
                vec![(2, true, 3), (3, true, 3)],
            ]
        );
        assert_eq!(
            acks,
            [(0, false, 1), (1, true, 2), (2, true, 3), (3, true, 3)]
        );
    }
}
