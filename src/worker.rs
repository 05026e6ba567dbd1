//! The partition worker: one tokio task per assigned partition.
//!
//! It reads its partition's own librdkafka queue (so a slow processor stops only that
//! partition's fetching: librdkafka stops prefetching once the queue holds
//! `queued.max.messages.kbytes`), hands each message to the processor in offset order,
//! and publishes the committable offset after every ack. When told to stop it finishes
//! the message in hand and returns; it never starts a new one.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use futures::{FutureExt, StreamExt};
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;
use rdkafka::Message as _;
use tokio::sync::{watch, Notify};

use crate::dead_letter::DeadLetter;
use crate::failure::{OnFailure, Retry};
use crate::metrics::{self, PartitionMetrics};
use crate::processor::{FailureKind, Kafka, Message, ProcessError, Processor};
use crate::tracker::OffsetTracker;

const NONE: i64 = -1;

/// What a worker shares with the supervisor: lock-free, read at commit time.
#[derive(Debug)]
pub struct WorkerShared {
    /// Next offset to commit, or -1 before the first ack.
    committable: AtomicI64,
    /// The offset being processed right now, or -1.
    in_flight: AtomicI64,
    /// The highest offset acknowledged (for commit metadata), or -1.
    highest_acked: AtomicI64,
    /// The first offset this worker received, or -1.
    first_offset: AtomicI64,
    /// Set when the processor failed and the partition stopped.
    /// The offset the processor failed on (the partition stopped there), or -1.
    halted_at: AtomicI64,
    done: Latch,
    pub metrics: PartitionMetrics,
    /// Set when the partition reached the end of its log (with `ACKD_STOP_AT_END`).
    at_end: AtomicBool,
}

impl WorkerShared {
    fn new() -> Self {
        WorkerShared {
            committable: AtomicI64::new(NONE),
            in_flight: AtomicI64::new(NONE),
            highest_acked: AtomicI64::new(NONE),
            first_offset: AtomicI64::new(NONE),
            halted_at: AtomicI64::new(NONE),
            done: Latch::default(),
            metrics: PartitionMetrics::default(),
            at_end: AtomicBool::new(false),
        }
    }

    pub fn committable(&self) -> Option<i64> {
        some(self.committable.load(Ordering::Acquire))
    }

    pub fn in_flight(&self) -> Option<i64> {
        some(self.in_flight.load(Ordering::Acquire))
    }

    pub fn first_offset(&self) -> Option<i64> {
        some(self.first_offset.load(Ordering::Acquire))
    }

    pub fn highest_acked(&self) -> Option<i64> {
        some(self.highest_acked.load(Ordering::Acquire))
    }

    pub fn at_end(&self) -> bool {
        self.at_end.load(Ordering::Acquire)
    }

    pub fn halted_at(&self) -> Option<i64> {
        some(self.halted_at.load(Ordering::Acquire))
    }

    /// Waits until the worker has returned, or `deadline` passed. True if it returned.
    pub fn wait_done(&self, deadline: Instant) -> bool {
        self.done.wait_until(deadline)
    }
}

fn some(v: i64) -> Option<i64> {
    (v != NONE).then_some(v)
}

/// A one-way flag that threads can wait on with a deadline (the rebalance callback
/// waits on plain threads, outside any async runtime).
#[derive(Debug, Default)]
struct Latch {
    set: Mutex<bool>,
    cond: Condvar,
}

impl Latch {
    fn set(&self) {
        *self.set.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cond.notify_all();
    }

    fn wait_until(&self, deadline: Instant) -> bool {
        let mut set = self.set.lock().unwrap_or_else(|e| e.into_inner());
        while !*set {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            set = self
                .cond
                .wait_timeout(set, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

/// Sets the latch however the worker ends, panics and aborts included.
struct SetOnDrop(Arc<WorkerShared>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.done.set();
    }
}

/// The supervisor's handle on a running worker.
pub struct WorkerHandle {
    pub shared: Arc<WorkerShared>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl WorkerHandle {
    /// Asks the worker to finish the message in hand and return.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Ends a worker that did not stop in time. Its later acks go nowhere: the
    /// supervisor no longer reads its offsets.
    pub fn abort(&self) {
        self.task.abort();
    }
}

/// What a worker needs besides its queue.
pub struct WorkerConfig<P> {
    pub processor: Arc<P>,
    pub log_messages: bool,
    /// `source=` of per-message lines: `ACKD_METRIC_SOURCE`, or the topic when unset.
    pub message_source: Option<Arc<str>>,
    /// With `ACKD_STOP_AT_END`: told when this partition reached its end.
    pub at_end: Option<Arc<Notify>>,
    pub retry: Retry,
    pub on_failure: OnFailure,
    pub dead_letter: Option<Arc<DeadLetter>>,
}

impl<P> Clone for WorkerConfig<P> {
    fn clone(&self) -> Self {
        WorkerConfig {
            processor: self.processor.clone(),
            log_messages: self.log_messages,
            message_source: self.message_source.clone(),
            at_end: self.at_end.clone(),
            retry: self.retry,
            on_failure: self.on_failure,
            dead_letter: self.dead_letter.clone(),
        }
    }
}

/// Starts the worker for one partition on `runtime`.
pub fn spawn<C, P>(
    runtime: &tokio::runtime::Handle,
    queue: StreamPartitionQueue<C>,
    topic: Arc<str>,
    partition: i32,
    resume: Option<i64>,
    config: WorkerConfig<P>,
) -> WorkerHandle
where
    C: ConsumerContext + 'static,
    P: Processor,
{
    let shared = Arc::new(WorkerShared::new());
    let (stop, stop_rx) = watch::channel(false);
    let task = runtime.spawn(run(
        queue,
        topic,
        partition,
        resume,
        config,
        shared.clone(),
        stop_rx,
    ));
    WorkerHandle { shared, stop, task }
}

async fn run<C, P>(
    queue: StreamPartitionQueue<C>,
    topic: Arc<str>,
    partition: i32,
    resume: Option<i64>,
    config: WorkerConfig<P>,
    shared: Arc<WorkerShared>,
    mut stop: watch::Receiver<bool>,
) where
    C: ConsumerContext + 'static,
    P: Processor,
{
    // Declared first, dropped last: the latch is set only once the queue (and with it
    // this worker's hold on the consumer) is gone, aborts included.
    let _done = SetOnDrop(shared.clone());
    let queue = queue;
    let mut tracker = OffsetTracker::new();
    let mut stream = queue.stream();
    let mut first = true;
    let mut rng = fastrand::Rng::new();
    let source = config
        .message_source
        .clone()
        .unwrap_or_else(|| topic.clone());
    loop {
        // A partition with a backlog never waits for its queue: let the other tasks of
        // this thread run now and then (every 128 messages, tokio's budget).
        tokio::task::consume_budget().await;
        // Stop is checked before every message, with one atomic load; the select (which
        // builds a notification future) only when the queue is empty and we must wait.
        if stop.has_changed().unwrap_or(true) {
            break;
        }
        let next = match stream.next().now_or_never() {
            Some(next) => next,
            None => tokio::select! {
                biased;
                _ = stop.changed() => break,
                next = stream.next() => next,
            },
        };
        let message = match next {
            Some(Ok(m)) => m,
            Some(Err(KafkaError::PartitionEOF(_))) if config.at_end.is_some() => {
                // The end of the log as it is now: this partition is done. Later
                // messages stay for the next run.
                tracing::info!(
                    at = "end_of_partition",
                    topic = &*topic,
                    partition,
                    offset = shared.committable()
                );
                shared.at_end.store(true, Ordering::Release);
                if let Some(n) = &config.at_end {
                    n.notify_one();
                }
                let _ = stop.wait_for(|s| *s).await;
                break;
            }
            Some(Err(e)) => {
                tracing::warn!(at = "fetch_error", topic = &*topic, partition, error = %e);
                continue;
            }
            None => break,
        };
        let offset = message.offset();
        if first {
            first = false;
            shared.first_offset.store(offset, Ordering::Release);
            tracing::info!(at = "resumed", topic = &*topic, partition, offset);
            match resume {
                // Behind the committed offset: librdkafka found it out of range and
                // applied auto.offset.reset (ACKD_START_FROM).
                Some(committed) if offset < committed => tracing::warn!(
                    at = "offset_reset",
                    topic = &*topic,
                    partition,
                    from = committed,
                    to = offset,
                    "the committed offset was out of range; the start policy applied: messages from here are processed again"
                ),
                // Ahead of it: out of range and reset to the log end, or offsets that
                // no longer exist (retention, compaction, transaction markers).
                Some(committed) if offset > committed => tracing::warn!(
                    at = "offset_reset",
                    topic = &*topic,
                    partition,
                    from = committed,
                    to = offset,
                    "the first message is past the committed offset: the offsets between were deleted, compacted, transaction markers, or reset by the start policy"
                ),
                _ => {}
            }
        }
        if let Err(e) = tracker.dispatch(offset) {
            // Never commit past a message we could not account for.
            tracing::error!(at = "tracker_error", topic = &*topic, partition, offset, error = %e);
            halt(&shared, offset, &mut stop).await;
            break;
        }
        shared.in_flight.store(offset, Ordering::Release);
        shared.metrics.received();
        let kafka = Kafka::new(&message);
        let view = Message::from_kafka(&kafka, &topic);
        let outcome = handle(&view, &config, &shared, &mut stop, &mut rng).await;
        shared.in_flight.store(NONE, Ordering::Release);
        match outcome {
            Handled::Processed | Handled::Ack => {
                shared.highest_acked.fetch_max(offset, Ordering::AcqRel);
                match tracker.ack(offset) {
                    Ok(Some(next)) => shared.committable.store(next, Ordering::Release),
                    Ok(None) => {}
                    Err(e) => {
                        tracing::error!(at = "tracker_error", topic = &*topic, partition, offset, error = %e)
                    }
                }
                // Skipped and dead-lettered messages have their own lines.
                if config.log_messages && matches!(outcome, Handled::Processed) {
                    metrics::message_processed(&source, &topic, partition, offset, view.key());
                }
            }
            // Told to stop while waiting to retry: the message stays unacknowledged and
            // is redelivered to whoever owns the partition next.
            Handled::Interrupted => break,
            Handled::Halt => {
                drop(message);
                halt(&shared, offset, &mut stop).await;
                break;
            }
        }
    }
}

/// How one message ended.
enum Handled {
    /// The processor acknowledged it.
    Processed,
    /// It failed, and the policy acknowledged it (skipped, or dead-lettered).
    Ack,
    /// It failed and the partition stops here.
    Halt,
    /// Stop was requested during a retry's wait.
    Interrupted,
}

/// Runs the processor on one message, with retries and the failure policy.
async fn handle<P: Processor>(
    view: &Message<'_>,
    config: &WorkerConfig<P>,
    shared: &WorkerShared,
    stop: &mut watch::Receiver<bool>,
    rng: &mut fastrand::Rng,
) -> Handled {
    let (topic, partition, offset) = (view.topic(), view.partition(), view.offset());
    let mut attempt = 1;
    let error = loop {
        let started = shared.metrics.stopwatch();
        let outcome = AssertUnwindSafe(config.processor.process(view))
            .catch_unwind()
            .await;
        let took = started.elapsed();
        let error = match outcome {
            Ok(Ok(())) => {
                shared.metrics.processed(took);
                return Handled::Processed;
            }
            Ok(Err(e)) => e,
            // A panic is a failure of this message, never of the daemon.
            Err(panic) => {
                ProcessError::permanent(format!("processor panicked: {}", panic_reason(&panic)))
            }
        };
        shared.metrics.failed(took);
        if error.kind != FailureKind::Retryable || !config.retry.again(attempt) {
            break error;
        }
        let mut delay = config.retry.delay(attempt, rng);
        if let Some(after) = error.retry_after {
            // The processor knows better (Retry-After), within ACKD_RETRY_MAX_MS.
            delay = delay.max(after.min(config.retry.max));
        }
        shared.metrics.retried();
        tracing::warn!(
            at = "retry",
            topic,
            partition,
            offset,
            attempt,
            max_attempts = config.retry.max_attempts,
            delay_ms = delay.as_millis() as u64,
            error = %error
        );
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return Handled::Interrupted,
            _ = tokio::time::sleep(delay) => {}
        }
        attempt += 1;
    };
    match config.on_failure {
        OnFailure::Halt => {
            tracing::error!(
                at = "process_failed",
                topic,
                partition,
                offset,
                key = view.key(),
                attempts = attempt,
                error = %error,
                "partition halted (ACKD_ON_FAILURE=halt): its offset is not committed past this message"
            );
            Handled::Halt
        }
        OnFailure::Skip => {
            shared.metrics.skipped();
            tracing::warn!(
                at = "skipped",
                topic,
                partition,
                offset,
                key = view.key(),
                attempts = attempt,
                error = %error,
                "acknowledged without processing (ACKD_ON_FAILURE=skip)"
            );
            Handled::Ack
        }
        OnFailure::DeadLetter => {
            dead_letter(view, config, shared, stop, rng, &error, attempt).await
        }
    }
}

/// Hands the message to the dead-letter topic, retrying the produce like a processor
/// failure; if it cannot be delivered, the partition halts: a message never goes nowhere.
async fn dead_letter<P: Processor>(
    view: &Message<'_>,
    config: &WorkerConfig<P>,
    shared: &WorkerShared,
    stop: &mut watch::Receiver<bool>,
    rng: &mut fastrand::Rng,
    error: &ProcessError,
    attempts: u32,
) -> Handled {
    let (topic, partition, offset) = (view.topic(), view.partition(), view.offset());
    let Some(dlq) = &config.dead_letter else {
        tracing::error!(at = "process_failed", topic, partition, offset, error = %error, "no dead-letter producer; partition halted");
        return Handled::Halt;
    };
    let mut attempt = 1;
    loop {
        match dlq.send(view, error).await {
            Ok((dl_partition, dl_offset)) => {
                shared.metrics.dead_lettered();
                tracing::warn!(
                    at = "dead_lettered",
                    topic,
                    partition,
                    offset,
                    key = view.key(),
                    attempts,
                    error = %error,
                    dead_letter_topic = dlq.topic(),
                    dead_letter_partition = dl_partition,
                    dead_letter_offset = dl_offset
                );
                return Handled::Ack;
            }
            Err(e) if config.retry.again(attempt) => {
                let delay = config.retry.delay(attempt, rng);
                tracing::warn!(at = "dead_letter_retry", topic, partition, offset, attempt, delay_ms = delay.as_millis() as u64, error = %e);
                tokio::select! {
                    biased;
                    _ = stop.wait_for(|s| *s) => return Handled::Interrupted,
                    _ = tokio::time::sleep(delay) => {}
                }
                attempt += 1;
            }
            Err(e) => {
                tracing::error!(
                    at = "dead_letter_failed",
                    topic,
                    partition,
                    offset,
                    dead_letter_topic = dlq.topic(),
                    error = %e,
                    "could not dead-letter the message; partition halted, its offset is not committed past it"
                );
                return Handled::Halt;
            }
        }
    }
}

/// Keeps the partition (and its queue) owned but idle until told to stop: dropping the
/// queue would silently stop the partition, and committing past the failed message
/// would lose it.
async fn halt(shared: &WorkerShared, offset: i64, stop: &mut watch::Receiver<bool>) {
    shared.halted_at.store(offset, Ordering::Release);
    let _ = stop.wait_for(|s| *s).await;
}

fn panic_reason(panic: &Box<dyn std::any::Any + Send>) -> &str {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "panic"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn latch_waits_until_set_or_deadline() {
        let shared = Arc::new(WorkerShared::new());
        assert!(!shared.wait_done(Instant::now() + Duration::from_millis(20)));
        let s2 = shared.clone();
        let t = std::thread::spawn(move || drop(SetOnDrop(s2)));
        assert!(shared.wait_done(Instant::now() + Duration::from_secs(10)));
        t.join().unwrap();
    }
}
