//! A partition's task whole: its configuration, spawning it (after a predecessor of the
//! partition that has not ended), the state machine it runs (read, halt, end, stop),
//! reading its queue one message at a time, a single message's call, and batches
//! (`ACKD_BATCH_MAX_MESSAGES` above 1: gathering one, and handing it to the processor).
//! With `ACKD_ORDERING=key`/`none` its read loop is concurrent.rs's. Every message
//! passes [`Worker::next`], where it waits for the dispatch limit and, with
//! `ACKD_DELAY_MS`, for its due time.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;
use rdkafka::Timestamp;
use tokio::sync::{watch, Notify};

use super::handler::{BatchEnd, Handled, Handler};
use super::progress::Progress;
use super::shared::{DispatchLimit, Hold, LimitPolicy, SetOnDrop, WorkerShared, NONE};
use crate::consumer::copier::{epoch_ms, tier_delivery, Copier};
use crate::consumer::handover::{resumed, Flagging, Resume, Skip};
use crate::consumer::partition_queue::{Messages, PartitionQueue};
use crate::processors::processor::{Fetched, FetchedMessage, Kafka, Message, Processor};
use crate::settings::ProcessingOrder;
use crate::settings::{OnFailure, RetryPolicy, RetryTiers};

/// What a worker needs besides its queue.
pub struct WorkerConfig<P> {
    pub processor: Arc<P>,
    pub log_messages: bool,
    /// `source=` of per-message lines: `ACKD_METRIC_SOURCE`, or the topic when unset.
    pub message_source: Option<Arc<str>>,
    /// With `ACKD_STOP_AT_END`: told when this partition reached its end.
    pub at_end: Option<Arc<Notify>>,
    pub retry: RetryPolicy,
    pub on_failure: OnFailure,
    /// The producer of dead letters and retry copies, when either is on.
    pub copier: Option<Arc<Copier>>,
    /// `ACKD_RETRY_TOPICS` (empty: retries in place).
    pub retry_tiers: Arc<RetryTiers>,
    /// This worker's topic is a retry tier: its messages are handed over as the attempts
    /// their copies say, and wait for the tier's delay.
    pub from_tier: bool,
    pub batch: Batching,
    /// `ACKD_ORDERING`, `ACKD_CONCURRENCY`, `ACKD_MAX_PENDING`.
    pub concurrency: Concurrency,
    /// How far ahead of the last accepted commit the worker may start messages.
    pub limits: LimitPolicy,
    /// Under the memory budget, what a worker may hold taken out of its queue
    /// (`Budget::taken_bytes`; 0: no budget): a larger message pauses the partition's
    /// fetching while the worker holds it (src/consumer/partition_queue.rs).
    pub taken_max_bytes: usize,
    /// `ACKD_DELAY_MS`: a message starts no earlier than its timestamp plus this; 0: off.
    /// A retry tier's worker has its tier's delay instead.
    pub delay_ms: u64,
}

impl<P> WorkerConfig<P> {
    /// The configuration of `topic`'s workers: a retry tier's messages wait for the
    /// tier's delay after their copy was produced (the mechanism of `ACKD_DELAY_MS`).
    fn for_topic(mut self, topic: &str) -> Self {
        if let Some(delay) = self.retry_tiers.delay_of(topic) {
            self.delay_ms = delay.as_millis() as u64;
            self.from_tier = true;
        }
        self
    }

    /// How `view`, read from the partition, is handed over the first time: a retry
    /// tier's copy as the attempt its copy says, else as the partition's window says.
    pub(super) fn delivery<'m>(&self, view: Message<'m>, redelivered: bool) -> Message<'m> {
        if self.from_tier {
            tier_delivery(view)
        } else {
            view.with_delivery(redelivered, 1)
        }
    }
}

/// How many processor calls of one partition run at once, and in what order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency {
    pub ordering: ProcessingOrder,
    /// Calls in flight at most (1 with `Ordering::Partition`).
    pub max_in_flight: usize,
    /// Messages held at most, in flight or waiting for their key.
    pub max_pending: usize,
    /// Their key and value bytes at most (0: no limit): the memory budget's
    /// (src/consumer/memory.rs). At least one message is always held.
    pub max_pending_bytes: usize,
}

impl Concurrency {
    /// One call at a time, in offset order: `ACKD_ORDERING=partition`.
    pub const SEQUENTIAL: Concurrency = Concurrency {
        ordering: ProcessingOrder::Partition,
        max_in_flight: 1,
        max_pending: 1,
        max_pending_bytes: 0,
    };
}

/// How many messages one processor call gets (`ACKD_BATCH_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// 1: `Processor::process`, one message per call; above 1: `process_batch`.
    pub max_messages: usize,
    /// How long a batch waits for more messages once it has its first.
    pub max_wait: Duration,
    /// Key and value bytes per batch at most (0: no limit); a bigger message goes alone.
    pub max_bytes: usize,
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
            copier: self.copier.clone(),
            retry_tiers: self.retry_tiers.clone(),
            from_tier: self.from_tier,
            batch: self.batch,
            concurrency: self.concurrency,
            limits: self.limits.clone(),
            taken_max_bytes: self.taken_max_bytes,
            delay_ms: self.delay_ms,
        }
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

/// A partition's previous worker (of an earlier assignment of it to this process) that
/// had not ended when the partition came back: it was aborted after its drain timed out,
/// and its processor has not returned since. Both workers' queues are handles on one
/// librdkafka queue, and dropping one unhooks the wake-up of every other
/// (`PartitionQueue` disables the queue's callback on drop): so the new worker
/// touches the partition only once the old one is gone, then takes a fresh handle.
pub struct Predecessor<C: ConsumerContext + 'static> {
    pub shared: Arc<WorkerShared>,
    /// Splits the partition's queue again (a handle whose wake-up is hooked anew).
    pub resplit: Box<dyn FnOnce() -> Option<PartitionQueue<C>> + Send>,
}

/// Starts the worker for one partition on `runtime`.
pub fn spawn<C, P>(
    runtime: &tokio::runtime::Handle,
    queue: PartitionQueue<C>,
    topic: Arc<str>,
    partition: i32,
    resume: Resume,
    config: WorkerConfig<P>,
    predecessor: Option<Predecessor<C>>,
) -> WorkerHandle
where
    C: ConsumerContext + 'static,
    P: Processor,
{
    let shared = Arc::new(WorkerShared::new());
    shared.dispatch.configure(config.limits.clone());
    shared.dispatch.inherit(resume.window.through);
    let inherited = resume.existed_through.unwrap_or(resume.window.through);
    shared
        .inherited_through
        .store(inherited.min(resume.window.through), Ordering::Relaxed);
    let (stop, stop_rx) = watch::channel(false);
    let task = runtime.spawn(run(
        queue,
        topic,
        partition,
        resume,
        config,
        shared.clone(),
        stop_rx,
        predecessor,
    ));
    WorkerHandle { shared, stop, task }
}

#[allow(clippy::too_many_arguments)]
async fn run<C, P>(
    queue: PartitionQueue<C>,
    topic: Arc<str>,
    partition: i32,
    resume: Resume,
    config: WorkerConfig<P>,
    shared: Arc<WorkerShared>,
    mut stop: watch::Receiver<bool>,
    predecessor: Option<Predecessor<C>>,
) where
    C: ConsumerContext + 'static,
    P: Processor,
{
    // Declared first, dropped last: the latch is set only once the queue (and with it
    // this worker's hold on the consumer) is gone, aborts included.
    let _done = SetOnDrop(shared.clone());
    let queue = match predecessor {
        None => queue,
        Some(previous) => {
            match after_predecessor(queue, previous, &topic, partition, &mut stop).await {
                Some(queue) => queue,
                None => return,
            }
        }
    };
    consume(queue, topic, partition, resume, config, &shared, stop).await
}

/// Waits for the partition's previous worker to end (or for a stop), then takes a fresh
/// handle on the partition's queue. `None`: stopped meanwhile, or no queue.
async fn after_predecessor<C: ConsumerContext + 'static>(
    early: PartitionQueue<C>,
    previous: Predecessor<C>,
    topic: &str,
    partition: i32,
    stop: &mut watch::Receiver<bool>,
) -> Option<PartitionQueue<C>> {
    let started = Instant::now();
    tracing::warn!(
        at = "partition_waiting",
        topic,
        partition,
        "this partition's previous worker has not ended (its processor has not returned since its drain timed out): the partition is not read until it does"
    );
    tokio::select! {
        biased;
        _ = stop.wait_for(|s| *s) => return None,
        _ = previous.shared.done.wait() => {}
    }
    // The previous worker's drop unhooked the wake-up this handle set up: replace it.
    drop(early);
    let queue = (previous.resplit)();
    tracing::info!(
        at = "partition_released",
        topic,
        partition,
        waited_ms = started.elapsed().as_millis() as u64,
        "the previous worker ended; this one reads the partition from here"
    );
    if queue.is_none() {
        tracing::error!(
            at = "assign_error",
            topic,
            partition,
            "librdkafka gave no queue for this partition"
        );
    }
    queue
}

/// Reads the partition until told to stop: the worker proper, a small state machine.
///
/// ```text
///            ┌──────────── next message (or fetch error) ───────────┐
///            ▼                                                      │
///   Read ─▶ one message, or a batch (ACKD_BATCH_MAX_MESSAGES > 1) ──┘
///    │           │                    │
///    │           ▼                    ▼
///    │   Halt(offset): idle,     End: idle, the partition
///    │   nothing committed       reached its end
///    │   past offset             (ACKD_STOP_AT_END)
///    ▼           │                    │
///   Stop ◀───────┴── told to stop ────┘
/// ```
/// `Halt` and `End` keep the partition (and its queue) until the stop: dropping the
/// queue would silently stop the partition. `Stop` returns.
async fn consume<C, P>(
    queue: PartitionQueue<C>,
    topic: Arc<str>,
    partition: i32,
    resume: Resume,
    config: WorkerConfig<P>,
    shared: &Arc<WorkerShared>,
    stop: watch::Receiver<bool>,
) where
    C: ConsumerContext + 'static,
    P: Processor,
{
    let config = config.for_topic(&topic);
    let source = config
        .message_source
        .clone()
        .unwrap_or_else(|| topic.clone());
    let Resume {
        resume_from,
        acked,
        window,
        ..
    } = resume;
    let mut worker = Worker {
        messages: queue.messages(config.taken_max_bytes, config.at_end.is_some()),
        held: None,
        progress: Progress::new(
            shared,
            (&topic, partition),
            &source,
            &config,
            resume_from,
            acked,
        ),
        config: &config,
        shared,
        topic: &topic,
        partition,
        resume_from,
        stop,
        rng: fastrand::Rng::new(),
        ready: 0,
        first: true,
        flagging: Flagging::new(window),
    };
    // The previous owner's ranges are this owner's to name until it passes them: its
    // commits must not name fewer acknowledged offsets than it knows of.
    worker.progress.publish_acked_above(&mut Vec::new());
    let concurrent = config.concurrency.ordering != ProcessingOrder::Partition;
    shared.admits_calls.store(
        !concurrent && config.processor.calls_may_wait(),
        Ordering::Relaxed,
    );
    let mut step = Step::Read;
    loop {
        step = match step {
            Step::Read if concurrent => worker.concurrently().await,
            Step::Read => worker.read().await,
            Step::Halt(offset) => {
                halt(shared, offset, &mut worker.stop).await;
                Step::Stop
            }
            Step::End => {
                reached_end(shared, &config, &topic, partition, &mut worker.stop).await;
                Step::Stop
            }
            Step::Stop => {
                let skipped = worker.progress.skip.total_skipped();
                worker.flagging.finish(skipped, &topic, partition);
                worker.progress.gaps.flush((&topic, partition));
                return;
            }
        };
    }
}

/// What a partition's worker does next (see [`consume`]).
pub(super) enum Step {
    /// Take what the queue has next and hand it to the processor.
    Read,
    /// Stay idle until stopped; nothing past this offset is committed.
    Halt(i64),
    /// Stay idle until stopped: the partition reached its end (`ACKD_STOP_AT_END`).
    End,
    /// Return (told to stop, or the queue is gone).
    Stop,
}

/// One partition's reading state, between its queue and its processor.
pub(super) struct Worker<'a, P> {
    pub(super) messages: Messages<'a>,
    /// A message that did not fit in the last batch (ACKD_BATCH_MAX_BYTES): the next
    /// batch's first. Or one waiting for the dispatch limit or its due time
    /// (`ACKD_DELAY_MS`). Dropped unprocessed on a stop, like a batch being gathered. Or a
    /// fetch error that ended the last batch, handled before anything after it.
    pub(super) held: Option<Fetched<'a>>,
    pub(super) progress: Progress<'a>,
    pub(super) config: &'a WorkerConfig<P>,
    pub(super) shared: &'a WorkerShared,
    pub(super) topic: &'a Arc<str>,
    pub(super) partition: i32,
    /// The committed offset the assignment resumed from, if any.
    pub(super) resume_from: Option<i64>,
    pub(super) stop: watch::Receiver<bool>,
    pub(super) rng: fastrand::Rng,
    /// Messages taken in a row without waiting for the queue (see [`YIELD_EVERY`]).
    pub(super) ready: usize,
    /// No message read yet in this assignment.
    pub(super) first: bool,
    /// The offsets flagged as possible repeats, and how many were read.
    pub(super) flagging: Flagging,
}

/// With `ACKD_STOP_AT_END`: the end of the log as it is now; this partition is done
/// (later messages stay for the next run). Waits to be told to stop.
async fn reached_end<P>(
    shared: &WorkerShared,
    config: &WorkerConfig<P>,
    topic: &str,
    partition: i32,
    stop: &mut watch::Receiver<bool>,
) {
    tracing::info!(
        at = "end_of_partition",
        topic,
        partition,
        offset = shared.committable()
    );
    shared.at_end.store(true, Ordering::Release);
    if let Some(n) = &config.at_end {
        n.notify_one();
    }
    let _ = stop.wait_for(|s| *s).await;
}

/// Keeps the partition (and its queue) owned but idle until told to stop: dropping the
/// queue would silently stop the partition, and committing past the failed message
/// would lose it.
async fn halt(shared: &WorkerShared, offset: i64, stop: &mut watch::Receiver<bool>) {
    shared.halted_at.store(offset, Ordering::Release);
    let _ = stop.wait_for(|s| *s).await;
}

/// The assignment's first message, at `offset`: published (the group compares it with
/// the offset it resumed from), and where it resumed logged. Behind the committed offset
/// (a reset), the ranges the previous owner acknowledged no longer name the same
/// messages: no commit names them any more.
fn first_message(
    shared: &WorkerShared,
    (topic, partition): (&str, i32),
    resume_from: Option<i64>,
    offset: i64,
    skip: &mut Skip,
) {
    shared.first_offset.store(offset, Ordering::Release);
    if resumed(topic, partition, resume_from, offset, skip) {
        shared
            .acked_above
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// How many messages in a row a partition's task takes from a queue that had them ready
/// before it lets the other tasks of its thread run. A backlog never makes the queue
/// wait, so without this the task would keep its thread. About a millisecond of a cheap
/// processor: often enough to be fair, rarely enough to cost nothing. (Each yield wakes
/// an idle runtime thread to steal the task; yielding at tokio's budget, every 128
/// messages, made 8 times the context switches and cost a quarter more CPU on a
/// backlog.) Processors that await tokio resources also yield at those resources' budget.
const YIELD_EVERY: usize = 1024;

impl<'a, P: Processor> Worker<'a, P> {
    /// The next message or fetch error, and what follows from it.
    pub(super) async fn read(&mut self) -> Step {
        let Some(next) = self.next().await else {
            return Step::Stop;
        };
        let message = match next {
            Ok(m) => m,
            Err(e) if is_end(&e) && self.config.at_end.is_some() => return Step::End,
            Err(e) => {
                return match self.progress.fetch_failed(*e) {
                    Ok(()) => Step::Read,
                    Err(offset) => Step::Halt(offset),
                };
            }
        };
        self.note_first(message.offset());
        if self.config.batch.max_messages > 1 {
            self.batch(message).await
        } else {
            self.single(message).await
        }
    }

    /// The assignment's first message says where the partition resumed (`at=resumed`).
    pub(super) fn note_first(&mut self, offset: i64) {
        if self.first {
            self.first = false;
            first_message(
                self.shared,
                (self.topic, self.partition),
                self.resume_from,
                offset,
                &mut self.progress.skip,
            );
        }
    }

    /// What the queue has next, once it may start (at most the dispatch limit of the
    /// last accepted commit: src/consumer/worker/shared.rs); `None` when told to stop
    /// or the queue is gone. One async function on the hot path: a second layer of
    /// future around the read moved each message through twice (about 75 instructions
    /// a message under callgrind).
    pub(super) async fn next(&mut self) -> Option<Fetched<'a>> {
        if self.ready >= YIELD_EVERY {
            self.ready = 0;
            tokio::task::yield_now().await;
        }
        // Stop is checked before every message, with one atomic load; the select (which
        // builds a notification future) only when the queue is empty and we must wait.
        if self.stop.has_changed().unwrap_or(true) {
            return None;
        }
        // Held (the membership is in doubt), or woken from a stall of the process that
        // the membership's watch has not seen yet: the next message stays in the queue.
        if !self.shared.hold.may_start()
            && !self.shared.hold.wait_unless_stopped(&mut self.stop).await
        {
            return None;
        }
        let mut next = if let Some(held) = self.held.take() {
            Some(held)
        } else if let Some(next) = self.messages.next().now_or_never() {
            self.ready += 1;
            next
        } else {
            // Waiting lets the other tasks run.
            self.ready = 0;
            let hold = &self.shared.hold;
            Some(wait_next(&mut self.messages, &mut self.held, hold, &mut self.stop).await?)
        };
        let offset = match &next {
            Some(Ok(m)) => m.offset(),
            _ => return next,
        };
        if !self.shared.dispatch.permits(offset) {
            // Kept while waiting: a caller that gives up the wait (the concurrent
            // loop's select) finds it here next time.
            self.held = next;
            if !self.shared.dispatch.wait_for(offset, &mut self.stop).await {
                return None;
            }
            next = self.held.take();
        }
        // Off (0): this branch is all it costs, no clock read.
        if self.config.delay_ms > 0 {
            if let Some(Ok(m)) = &next {
                if let Some(wait) = not_due(m, self.config.delay_ms) {
                    // Kept unstarted while waiting, as for the dispatch limit: a stop
                    // releases it, and the next owner gets it unflagged.
                    delay_log(m, wait, self.topic, self.config.delay_ms);
                    self.held = next;
                    if !self.wait_due(wait).await {
                        return None;
                    }
                    next = self.held.take();
                }
            }
        }
        let skipped = self.progress.skip.total_skipped();
        self.flagging
            .read(offset, skipped, self.topic, self.partition);
        next
    }

    /// Waits `wait`, then as long as the held message is still not due (a wall clock
    /// stepped back); false if told to stop first. After a long wait the process may
    /// have been stalled: the membership is checked again before it starts.
    async fn wait_due(&mut self, mut wait: Duration) -> bool {
        loop {
            tokio::select! {
                biased;
                _ = self.stop.wait_for(|s| *s) => return false,
                _ = tokio::time::sleep(wait) => {}
            }
            match &self.held {
                Some(Ok(m)) => match not_due(m, self.config.delay_ms) {
                    Some(more) => wait = more,
                    None => break,
                },
                _ => break,
            }
        }
        self.shared.hold.wait_unless_stopped(&mut self.stop).await
    }

    /// One message to the processor (`Processor::process`).
    pub(super) async fn single(&mut self, message: FetchedMessage<'a>) -> Step {
        let offset = message.offset();
        if let Err(at) = self.progress.dispatch(offset, message.timestamp_ms()) {
            // Never commit past a message we could not account for.
            return Step::Halt(at);
        }
        if self.progress.skip_acknowledged(&message, self.topic) {
            return Step::Read;
        }
        self.shared.in_flight.store(offset, Ordering::Release);
        self.shared.metrics.received();
        let kafka = Kafka::new(&message);
        let redelivered = self.flagging.window.covers(offset);
        let view = self
            .config
            .delivery(Message::from_kafka(&kafka, self.topic), redelivered);
        let mut first = None;
        if !self.config.processor.calls_may_wait() {
            // The call `Handler::attempt` would make for it, made here: the retry
            // machinery's futures are built only for a call that failed (about 190
            // instructions a message less under callgrind for noop).
            let started = self.shared.metrics.stopwatch();
            self.shared.only_call_begins(offset);
            let call = AssertUnwindSafe(self.config.processor.process(&view));
            let outcome = call.catch_unwind().await;
            self.shared.call_ended();
            let took = started.elapsed();
            if let Ok(Ok(())) = outcome {
                self.shared.metrics.processed(took);
                self.shared.in_flight.store(NONE, Ordering::Release);
                self.progress.ack(&view, true);
                return Step::Read;
            }
            first = Some((outcome, took));
        }
        let outcome = Handler {
            config: self.config,
            shared: self.shared,
            stop: &mut self.stop,
            rng: &mut self.rng,
            sequential: true,
        }
        .handle_after(&view, first)
        .await;
        self.shared.in_flight.store(NONE, Ordering::Release);
        match outcome {
            Handled::Processed => self.progress.ack(&view, true),
            // Skipped and dead-lettered messages have their own lines.
            Handled::Ack => self.progress.ack(&view, false),
            // Told to stop while waiting to retry: the message stays unacknowledged and
            // is redelivered to whoever owns the partition next.
            Handled::Interrupted => return Step::Stop,
            // The message is released on return: holding librdkafka's messages while
            // halted would keep the consumer from closing.
            Handled::Halt => return Step::Halt(offset),
        }
        Step::Read
    }
}

impl<'a, P: Processor> Worker<'a, P> {
    /// A batch that starts with `first` to the processor (`Processor::process_batch`).
    pub(super) async fn batch(&mut self, first: FetchedMessage<'a>) -> Step {
        let mut batch = Vec::with_capacity(self.config.batch.max_messages.min(1024));
        batch.push(first);
        let after = gather(
            &mut batch,
            &mut self.held,
            &mut self.messages,
            &self.config.batch,
            self.config.at_end.is_some(),
            (&self.shared.dispatch, self.config.delay_ms),
            &mut self.stop,
        )
        .await;
        self.ready += batch.len() - 1;
        if let After::Stop = after {
            // Not handed to the processor yet: whoever reads the partition next gets
            // these messages, for the first time.
            return Step::Stop;
        }
        let kafka: Vec<Kafka<'_>> = batch.iter().map(Kafka::new).collect();
        let window = self.flagging.window;
        let views: Vec<Message<'_>> = kafka
            .iter()
            .map(|k| {
                let view = Message::from_kafka(k, self.topic);
                let redelivered = window.covers(view.offset());
                self.config.delivery(view, redelivered)
            })
            .collect();
        let refused = self.dispatch_batch(&views);
        let dispatched = &views[..refused.map_or(views.len(), |(i, _)| i)];
        // Offsets the previous owner acknowledged are acknowledged again, not processed.
        let kept: Vec<Message<'_>>;
        let dispatched = if self.progress.skip.is_empty() {
            dispatched
        } else {
            let progress = &mut self.progress;
            kept = batch[..dispatched.len()]
                .iter()
                .zip(dispatched)
                .filter(|(m, _)| !progress.skip_acknowledged(m, self.topic))
                .map(|(_, v)| *v)
                .collect();
            &kept
        };
        // The rest of the batch was read past next(): counted against the window too,
        // once its offsets acknowledged by the previous owner are skipped.
        let skipped = self.progress.skip.total_skipped();
        for m in &batch[1..] {
            self.flagging
                .read(m.offset(), skipped, self.topic, self.partition);
        }
        let ended = self.handle_dispatched(dispatched).await;
        // The batch's messages are released on return: holding librdkafka's messages
        // while halted would keep the consumer from closing.
        after_batch(ended, refused.map(|(_, at)| at), after)
    }

    /// Hands the batch's messages to the tracker, in order. The batch ends before a
    /// message that may not be handed out (never commit past what we could not account
    /// for): `Some((index, at))`, the partition halts at `at`.
    fn dispatch_batch(&mut self, views: &[Message<'_>]) -> Option<(usize, i64)> {
        for (i, v) in views.iter().enumerate() {
            if let Err(at) = self.progress.dispatch(v.offset(), v.timestamp_ms()) {
                return Some((i, at));
            }
        }
        None
    }

    /// The batch's dispatched messages (none skipped) to the processor, if any.
    async fn handle_dispatched(&mut self, dispatched: &[Message<'_>]) -> BatchEnd {
        if dispatched.is_empty() {
            return BatchEnd::Done;
        }
        self.shared.metrics.received_many(dispatched.len() as u64);
        let ended = Handler {
            config: self.config,
            shared: self.shared,
            stop: &mut self.stop,
            rng: &mut self.rng,
            sequential: true,
        }
        .handle_batch(dispatched, &mut self.progress)
        .await;
        self.shared.in_flight.store(NONE, Ordering::Release);
        ended
    }
}

/// What the partition does after a batch: how its call `ended`, where it was `refused`
/// (the offset to halt at), and what ended its gathering.
fn after_batch(ended: BatchEnd, refused: Option<i64>, after: After) -> Step {
    match (ended, refused, after) {
        (BatchEnd::Halt(offset), _, _) | (BatchEnd::Done, Some(offset), _) => Step::Halt(offset),
        (BatchEnd::Interrupted, _, _) => Step::Stop,
        (BatchEnd::Done, None, After::More) => Step::Read,
        (BatchEnd::Done, None, After::End) => Step::End,
        (BatchEnd::Done, None, After::Stop | After::Closed) => Step::Stop,
    }
}

/// What ended the gathering of a batch.
enum After {
    /// The batch is full, or waited `ACKD_BATCH_MAX_WAIT_MS`: more may follow.
    More,
    /// The partition reached its end (`ACKD_STOP_AT_END`): this batch is its last.
    End,
    /// Stop was requested: the batch is not started.
    Stop,
    /// The queue is gone.
    Closed,
}

/// Adds messages to `batch` (which holds its first) until it is full (by count, or by
/// bytes: the message that does not fit is put in `held`), the queue stays empty for the
/// rest of `ACKD_BATCH_MAX_WAIT_MS`, the next message is above the dispatch limit or not
/// due yet (`ACKD_DELAY_MS`: it goes to `held` too, and waits there), or the partition
/// ends. A backlog fills it without waiting.
async fn gather<'q, S>(
    batch: &mut Vec<FetchedMessage<'q>>,
    held: &mut Option<Fetched<'q>>,
    stream: &mut S,
    batching: &Batching,
    stop_at_end: bool,
    (dispatch, delay_ms): (&DispatchLimit, u64),
    stop: &mut watch::Receiver<bool>,
) -> After
where
    S: futures::Stream<Item = Fetched<'q>> + Unpin,
{
    let deadline = tokio::time::Instant::now() + batching.max_wait;
    // Weighed only with a byte limit: key and payload are two FFI calls per message.
    let limit = batching.max_bytes;
    let mut bytes: usize = if limit > 0 {
        batch.iter().map(FetchedMessage::size).sum()
    } else {
        0
    };
    while batch.len() < batching.max_messages {
        // A stop while filling from a backlog: nothing more is taken from the queue.
        if stop.has_changed().unwrap_or(true) {
            return After::Stop;
        }
        let next = match stream.next().now_or_never() {
            Some(next) => next,
            None if batching.max_wait.is_zero() => break,
            None => tokio::select! {
                biased;
                _ = stop.changed() => return After::Stop,
                _ = tokio::time::sleep_until(deadline) => break,
                next = stream.next() => next,
            },
        };
        match next {
            Some(Ok(m)) => {
                if !dispatch.permits(m.offset())
                    || (delay_ms > 0 && not_due(&m, delay_ms).is_some())
                {
                    *held = Some(Ok(m));
                    break;
                }
                if limit > 0 {
                    bytes += m.size();
                    if bytes > limit {
                        // Full by size: this one starts the next batch.
                        *held = Some(Ok(m));
                        break;
                    }
                }
                batch.push(m);
            }
            Some(Err(e)) if stop_at_end && is_end(&e) => return After::End,
            Some(Err(e)) => {
                // The batch ends before it; the partition handles it next.
                *held = Some(Err(e));
                break;
            }
            None => return After::Closed,
        }
    }
    After::More
}

/// Waits for the queue's next item (`None`: told to stop, or the queue is gone), then
/// for the hold: the wait may have spanned a stall of the process (the item is what
/// woke it), so the item stays unstarted until the partition may go on.
///
/// Cancel safe: the concurrent loop's `select!` drops this future whenever a call ends
/// or a batch's wait is over. The item is in `held` (where [`Worker::next`] looks
/// first) before the hold is awaited, so a dropped wait loses nothing.
async fn wait_next<T, S>(
    stream: &mut S,
    held: &mut Option<T>,
    hold: &Hold,
    stop: &mut watch::Receiver<bool>,
) -> Option<T>
where
    S: futures::Stream<Item = T> + Unpin,
{
    let next = tokio::select! {
        biased;
        _ = stop.changed() => return None,
        next = stream.next() => next?,
    };
    if !hold.may_start() {
        *held = Some(next);
        if !hold.wait_unless_stopped(stop).await {
            return None;
        }
        return held.take();
    }
    Some(next)
}

/// Whether a fetch error is the partition's end (said only with `ACKD_STOP_AT_END`).
pub(super) fn is_end(error: &KafkaError) -> bool {
    matches!(error, KafkaError::PartitionEOF(_))
}

/// How long `message` must still wait under `ACKD_DELAY_MS` (`delay_ms`): until its
/// timestamp (create or log-append time) plus the delay, by this host's clock. `None`:
/// due now, or it has no timestamp (not delayed).
fn not_due(message: &FetchedMessage<'_>, delay_ms: u64) -> Option<Duration> {
    let (Timestamp::CreateTime(ms) | Timestamp::LogAppendTime(ms)) = message.timestamp() else {
        return None;
    };
    let due = u64::try_from(ms).ok()?.saturating_add(delay_ms);
    let now = u64::try_from(epoch_ms()).unwrap_or(0);
    (due > now).then(|| Duration::from_millis(due - now))
}

/// Says that a message waits for its due time (debug), and warns when its timestamp is
/// well ahead of this host's clock: the partition then waits longer than the delay.
fn delay_log(message: &FetchedMessage<'_>, wait: Duration, topic: &str, delay_ms: u64) {
    let wait_ms = wait.as_millis() as u64;
    let (partition, offset) = (message.partition(), message.offset());
    if wait_ms > delay_ms.saturating_add(FUTURE_TIMESTAMP_MS) {
        tracing::warn!(
            at = "delay_future_timestamp",
            topic,
            partition,
            offset,
            wait_ms,
            "the message's timestamp is ahead of this host's clock: its partition waits longer than ACKD_DELAY_MS"
        );
    } else {
        tracing::debug!(at = "delay_wait", topic, partition, offset, wait_ms);
    }
}

/// How far ahead of this host's clock a timestamp may be before a wait for it is
/// warned of: producers' clocks differ by a little.
const FUTURE_TIMESTAMP_MS: u64 = 60_000;

#[cfg(test)]
mod tests {
    use super::*;

    /// The read loop of `ACKD_ORDERING=key`/`none` selects between the queue and the
    /// calls under way: a call that ends drops the read's future wherever it waits. A
    /// message taken from the queue and then held (a stall, a doubt) must survive that.
    #[tokio::test]
    async fn a_message_taken_then_held_survives_the_wait_being_dropped() {
        let hold = Hold::default();
        let (tx, mut queue) = futures::channel::mpsc::unbounded::<i64>();
        let (stop_tx, mut stop) = watch::channel(false);
        let mut held = None;
        {
            let wait = wait_next(&mut queue, &mut held, &hold, &mut stop);
            tokio::pin!(wait);
            assert!(
                futures::poll!(wait.as_mut()).is_pending(),
                "the queue is empty"
            );
            // The process stalls, the membership is in doubt; then the message arrives.
            hold.hold();
            tx.unbounded_send(7).unwrap();
            assert!(
                futures::poll!(wait.as_mut()).is_pending(),
                "the message waits for the hold"
            );
            // Dropped here, as the select drops it when a call ends.
        }
        // `Worker::next` takes it from there first.
        assert_eq!(held.take(), Some(7), "the message taken is kept, not lost");
        hold.lift();
        tx.unbounded_send(8).unwrap();
        let next = wait_next(&mut queue, &mut held, &hold, &mut stop).await;
        assert_eq!(next, Some(8));
        // A stop during the hold leaves the message unstarted.
        hold.hold();
        tx.unbounded_send(9).unwrap();
        let waiting = wait_next(&mut queue, &mut held, &hold, &mut stop);
        stop_tx.send(true).unwrap();
        assert_eq!(waiting.await, None);
    }
}
