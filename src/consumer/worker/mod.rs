//! The partition worker: one tokio task per assigned partition.
//!
//! It reads its partition's own librdkafka queue (so a slow processor stops only that
//! partition's fetching: librdkafka stops prefetching once the queue holds
//! `queued.max.messages.kbytes`), hands each message to the processor in offset order,
//! and publishes the committable offset after every ack. When told to stop it finishes
//! the message in hand and returns; it never starts a new one.

use std::panic::AssertUnwindSafe;
mod concurrent;
pub(crate) mod hold;
mod skip;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use rdkafka::consumer::stream_consumer::StreamPartitionQueue;
use rdkafka::consumer::{ConsumerContext, MessageStream};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::BorrowedMessage;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::Message as _;
use tokio::sync::{watch, Notify};

use crate::config::failure::{OnFailure, RetryPolicy};
use crate::config::settings::ProcessingOrder;
use crate::consumer::dead_letter::DeadLetter;
use crate::consumer::tracker::OffsetTracker;
use crate::output::metrics::{self, PartitionMetrics, Took};
use crate::processors::call_start;
use crate::processors::processor::{
    panicked, BatchError, FailureKind, Kafka, Message, ProcessError, Processor,
};

const NONE: i64 = -1;

/// How many messages in a row a partition's task takes from a queue that had them ready
/// before it lets the other tasks of its thread run. A backlog never makes the queue
/// wait, so without this the task would keep its thread. About a millisecond of a cheap
/// processor: often enough to be fair, rarely enough to cost nothing. (Each yield wakes
/// an idle runtime thread to steal the task; yielding at tokio's budget, every 128
/// messages, made 8 times the context switches and cost a quarter more CPU on a
/// backlog.) Processors that await tokio resources also yield at those resources' budget.
const YIELD_EVERY: usize = 1024;

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
    /// When the processor call under way began, on the health endpoint's coarse clock
    /// (`crate::clock::now_ms`), or 0: no call, or the endpoint is off.
    call_started_ms: AtomicU64,
    /// Offsets acknowledged above the committable one, as inclusive ranges, ascending
    /// (only with concurrent ordering: in order, nothing is acknowledged past it).
    acked_above: Mutex<Vec<(i64, i64)>>,
    /// Messages handed to the processor (concurrent ordering): in calls, or waiting in
    /// the processor for a child or a permit (see `waiting`).
    handed_over: AtomicUsize,
    /// Messages read and not handed to the processor: waiting for their key or a free
    /// call (concurrent ordering), or `usize::MAX` (partition ordering, where none wait).
    waiting: AtomicUsize,
    /// The concurrent calls the processor took, oldest first (concurrent ordering, or
    /// partition ordering with a processor whose calls may wait: see `admits_calls`).
    calls: Arc<call_start::CallClock>,
    /// Held while the group membership is in doubt: nothing new starts.
    pub hold: hold::Hold,
    /// Partition ordering with a processor whose calls may wait for capacity
    /// (`Processor::calls_may_wait`): its call is tracked in `calls`, like a concurrent
    /// one. Set once, when the worker starts.
    admits_calls: AtomicBool,
}

impl crate::output::health::PartitionProbe for WorkerShared {
    fn call_started_ms(&self) -> Option<u64> {
        WorkerShared::call_started_ms(self)
    }

    fn oldest_call_offset(&self) -> Option<i64> {
        WorkerShared::oldest_call_offset(self)
    }

    fn in_flight_count(&self) -> usize {
        WorkerShared::in_flight_count(self)
    }

    fn halted(&self) -> bool {
        self.halted_at().is_some()
    }

    fn metrics(&self) -> &PartitionMetrics {
        &self.metrics
    }
}

impl WorkerShared {
    pub(crate) fn new() -> Self {
        WorkerShared {
            committable: AtomicI64::new(NONE),
            in_flight: AtomicI64::new(NONE),
            highest_acked: AtomicI64::new(NONE),
            first_offset: AtomicI64::new(NONE),
            halted_at: AtomicI64::new(NONE),
            done: Latch::default(),
            metrics: PartitionMetrics::default(),
            at_end: AtomicBool::new(false),
            call_started_ms: AtomicU64::new(0),
            acked_above: Mutex::new(Vec::new()),
            handed_over: AtomicUsize::new(0),
            waiting: AtomicUsize::new(usize::MAX),
            calls: Arc::default(),
            hold: hold::Hold::default(),
            admits_calls: AtomicBool::new(false),
        }
    }

    /// When the processor call under way began (see `output::health`), if one is: with
    /// tracked calls (`calls`), the oldest one the processor took (not one waiting for it).
    pub fn call_started_ms(&self) -> Option<u64> {
        Some(self.call_started_ms.load(Ordering::Relaxed))
            .filter(|t| *t != 0)
            .or_else(|| self.calls.oldest().map(|(ms, _)| ms))
    }

    /// The offset of the call `call_started_ms` times: the oldest call the processor
    /// took with tracked calls, else the one in hand.
    pub fn oldest_call_offset(&self) -> Option<i64> {
        self.calls
            .oldest()
            .map(|(_, offset)| offset)
            .or_else(|| self.in_flight())
    }

    /// A processor call begins: a load and a store, no clock read (the hot path).
    pub(crate) fn call_begins(&self) {
        self.call_started_ms
            .store(crate::clock::now_ms(), Ordering::Relaxed);
    }

    pub(crate) fn call_ended(&self) {
        self.call_started_ms.store(0, Ordering::Relaxed);
    }

    pub fn committable(&self) -> Option<i64> {
        some(self.committable.load(Ordering::Acquire))
    }

    pub fn in_flight(&self) -> Option<i64> {
        some(self.in_flight.load(Ordering::Acquire))
    }

    /// Processor calls under way now (messages, or batches): the ones the processor
    /// took, not those waiting in it for a child or a permit.
    pub fn in_flight_count(&self) -> usize {
        if self.waiting().is_some() || self.admits_calls.load(Ordering::Relaxed) {
            self.calls.running()
        } else {
            usize::from(self.in_flight().is_some())
        }
    }

    /// Messages read and waiting to start (concurrent ordering only): for their key, a
    /// free call, or a child or permit of the processor.
    pub fn waiting(&self) -> Option<usize> {
        let unhanded = self.waiting.load(Ordering::Relaxed);
        (unhanded != usize::MAX).then(|| {
            let handed = self.handed_over.load(Ordering::Relaxed);
            unhanded + handed.saturating_sub(self.calls.running_messages())
        })
    }

    pub fn first_offset(&self) -> Option<i64> {
        some(self.first_offset.load(Ordering::Acquire))
    }

    pub fn highest_acked(&self) -> Option<i64> {
        some(self.highest_acked.load(Ordering::Acquire))
    }

    /// Offsets acknowledged above [`WorkerShared::committable`], as inclusive ranges,
    /// ascending; empty when there are none. For the commit metadata: a crash then
    /// redelivers only what was in flight.
    pub fn acked_above(&self) -> Vec<(i64, i64)> {
        self.acked_above
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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

    /// Whether the worker has returned (and dropped its queue).
    pub fn is_done(&self) -> bool {
        self.done.is_set()
    }
}

fn some(v: i64) -> Option<i64> {
    (v != NONE).then_some(v)
}

/// A one-way flag that threads can wait on with a deadline (the rebalance callback
/// waits on plain threads, outside any async runtime), and tasks without blocking (a
/// partition's next worker waits for its previous one).
#[derive(Debug, Default)]
struct Latch {
    set: Mutex<bool>,
    cond: Condvar,
    notify: Notify,
}

impl Latch {
    fn set(&self) {
        *self.set.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cond.notify_all();
        self.notify.notify_waiters();
    }

    fn is_set(&self) -> bool {
        *self.set.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the check: a set() in between still wakes us.
            notified.as_mut().enable();
            if self.is_set() {
                return;
            }
            notified.await;
        }
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
    pub retry: RetryPolicy,
    pub on_failure: OnFailure,
    pub dead_letter: Option<Arc<DeadLetter>>,
    pub batch: Batching,
    /// `ACKD_ORDERING`, `ACKD_CONCURRENCY`, `ACKD_MAX_PENDING`.
    pub concurrency: Concurrency,
}

/// How many processor calls of one partition run at once, and in what order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency {
    pub ordering: ProcessingOrder,
    /// Calls in flight at most (1 with `Ordering::Partition`).
    pub max_in_flight: usize,
    /// Messages held at most, in flight or waiting for their key.
    pub max_pending: usize,
}

impl Concurrency {
    /// One call at a time, in offset order: `ACKD_ORDERING=partition`.
    pub const SEQUENTIAL: Concurrency = Concurrency {
        ordering: ProcessingOrder::Partition,
        max_in_flight: 1,
        max_pending: 1,
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

/// What a message weighs against `Batching::max_bytes`.
fn weight(m: &BorrowedMessage<'_>) -> usize {
    m.key().map_or(0, <[u8]>::len) + m.payload().map_or(0, <[u8]>::len)
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
            batch: self.batch,
            concurrency: self.concurrency,
        }
    }
}

/// A partition's previous worker (of an earlier assignment of it to this process) that
/// had not ended when the partition came back: it was aborted after its drain timed out,
/// and its processor has not returned since. Both workers' queues are handles on one
/// librdkafka queue, and dropping one unhooks the wake-up of every other (rdkafka's
/// `StreamPartitionQueue` disables the queue's callback on drop): so the new worker
/// touches the partition only once the old one is gone, then takes a fresh handle.
pub struct Predecessor<C: ConsumerContext + 'static> {
    pub shared: Arc<WorkerShared>,
    /// Splits the partition's queue again (a handle whose wake-up is hooked anew).
    pub resplit: Box<dyn FnOnce() -> Option<StreamPartitionQueue<C>> + Send>,
}

/// The most ranges a worker publishes for the commit metadata: each takes at least 2
/// of its [`crate::consumer::acked_ranges::MAX_BYTES`] (a digit and a comma), so more never fit.
const PUBLISHED_RANGES_MAX: usize = crate::consumer::acked_ranges::MAX_BYTES / 2 + 1;

/// The union of `a` and `b` (inclusive ranges, ascending, disjoint each), ascending,
/// overlapping and adjacent ones merged, into `out` (cleared first): the lowest `max`.
fn union_into(
    out: &mut Vec<(i64, i64)>,
    a: &[(i64, i64)],
    b: impl Iterator<Item = (i64, i64)>,
    max: usize,
) {
    out.clear();
    let mut b = b.peekable();
    let mut a = a.iter().copied().peekable();
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x <= y => a.next(),
            (Some(_), Some(_)) | (None, Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, None) => break,
        };
        let Some((start, end)) = next else { break };
        let full = out.len() >= max;
        match out.last_mut() {
            Some(last) if start <= last.1.saturating_add(1) => last.1 = last.1.max(end),
            _ if full => break,
            _ => out.push((start, end)),
        }
    }
}

/// Where a partition resumes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resume {
    /// The group's committed offset, if any.
    pub committed: Option<i64>,
    /// Offsets above it that its previous owner acknowledged (read from the commit's
    /// metadata), as inclusive ranges, ascending: not processed again.
    pub acked: Vec<(i64, i64)>,
}

/// Starts the worker for one partition on `runtime`.
pub fn spawn<C, P>(
    runtime: &tokio::runtime::Handle,
    queue: StreamPartitionQueue<C>,
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
    queue: StreamPartitionQueue<C>,
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
    early: StreamPartitionQueue<C>,
    previous: Predecessor<C>,
    topic: &str,
    partition: i32,
    stop: &mut watch::Receiver<bool>,
) -> Option<StreamPartitionQueue<C>> {
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
    queue: StreamPartitionQueue<C>,
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
    let source = config
        .message_source
        .clone()
        .unwrap_or_else(|| topic.clone());
    let Resume {
        committed: resume,
        acked,
    } = resume;
    let mut worker = Worker {
        stream: queue.stream(),
        held: None,
        progress: Progress {
            tracker: OffsetTracker::new(),
            shared,
            topic: &topic,
            partition,
            source: &source,
            log_messages: config.log_messages,
            resume,
            on_failure: config.on_failure,
            fetch_error: None,
            gaps: GapLines::default(),
            skip: skip::Skip::new(acked),
        },
        config: &config,
        shared,
        topic: &topic,
        partition,
        resume,
        stop,
        rng: fastrand::Rng::new(),
        ready: 0,
        first: true,
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
            Step::Stop => return,
        };
    }
}

/// What a partition's worker does next (see [`consume`]).
enum Step {
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
struct Worker<'a, C: ConsumerContext, P> {
    stream: MessageStream<'a, C>,
    /// A message that did not fit in the last batch (ACKD_BATCH_MAX_BYTES): the next
    /// batch's first. Dropped unprocessed on a stop, like a batch being gathered. Or a
    /// fetch error that ended the last batch, handled before anything after it.
    held: Option<KafkaResult<BorrowedMessage<'a>>>,
    progress: Progress<'a>,
    config: &'a WorkerConfig<P>,
    shared: &'a WorkerShared,
    topic: &'a Arc<str>,
    partition: i32,
    resume: Option<i64>,
    stop: watch::Receiver<bool>,
    rng: fastrand::Rng,
    /// Messages taken in a row without waiting for the queue (see YIELD_EVERY).
    ready: usize,
    /// No message read yet in this assignment.
    first: bool,
}

impl<'a, C: ConsumerContext + 'static, P: Processor> Worker<'a, C, P> {
    /// The next message or fetch error, and what follows from it.
    async fn read(&mut self) -> Step {
        let Some(next) = self.next().await else {
            return Step::Stop;
        };
        let message = match next {
            Ok(m) => m,
            Err(KafkaError::PartitionEOF(_)) if self.config.at_end.is_some() => {
                return Step::End;
            }
            Err(e) => {
                return match self.progress.fetch_failed(e) {
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
    fn note_first(&mut self, offset: i64) {
        if self.first {
            self.first = false;
            resumed(
                self.shared,
                self.topic,
                self.partition,
                self.resume,
                offset,
                &mut self.progress.skip,
            );
        }
    }

    /// What the queue has next; `None` when told to stop or the queue is gone.
    async fn next(&mut self) -> Option<KafkaResult<BorrowedMessage<'a>>> {
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
        if let Some(held) = self.held.take() {
            return Some(held);
        }
        if let Some(next) = self.stream.next().now_or_never() {
            self.ready += 1;
            return next;
        }
        // Waiting lets the other tasks run.
        self.ready = 0;
        let next = tokio::select! {
            biased;
            _ = self.stop.changed() => None,
            next = self.stream.next() => next,
        };
        // The wait may have spanned a stall of the process (the message is what woke
        // it): checked again, the message stays unstarted until the partition may go on.
        if next.is_some() && !self.shared.hold.wait_unless_stopped(&mut self.stop).await {
            return None;
        }
        next
    }

    /// One message to the processor (`Processor::process`).
    async fn single(&mut self, message: BorrowedMessage<'a>) -> Step {
        let offset = message.offset();
        if let Err(at) = self.progress.dispatch(offset) {
            // Never commit past a message we could not account for.
            return Step::Halt(at);
        }
        if self.progress.skip_acknowledged(&message, self.topic) {
            return Step::Read;
        }
        self.shared.in_flight.store(offset, Ordering::Release);
        self.shared.metrics.received();
        let kafka = Kafka::new(&message);
        let view = Message::from_kafka(&kafka, self.topic);
        let outcome = Handler {
            config: self.config,
            shared: self.shared,
            stop: &mut self.stop,
            rng: &mut self.rng,
            sequential: true,
        }
        .handle(&view)
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

    /// A batch that starts with `first` to the processor (`Processor::process_batch`).
    async fn batch(&mut self, first: BorrowedMessage<'a>) -> Step {
        let mut batch = Vec::with_capacity(self.config.batch.max_messages.min(1024));
        batch.push(first);
        let after = gather(
            &mut batch,
            &mut self.held,
            &mut self.stream,
            &self.config.batch,
            self.config.at_end.is_some(),
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
        let views: Vec<Message<'_>> = kafka
            .iter()
            .map(|k| Message::from_kafka(k, self.topic))
            .collect();
        // The batch ends before a message that may not be handed out (never commit
        // past what we could not account for): the partition halts there.
        let mut refused = None;
        for (i, v) in views.iter().enumerate() {
            if let Err(at) = self.progress.dispatch(v.offset()) {
                refused = Some((i, at));
                break;
            }
        }
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
        let ended = if dispatched.is_empty() {
            BatchEnd::Done
        } else {
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
        };
        // The batch's messages are released on return: holding librdkafka's messages
        // while halted would keep the consumer from closing.
        match (ended, refused, after) {
            (BatchEnd::Halt(offset), _, _) | (BatchEnd::Done, Some((_, offset)), _) => {
                Step::Halt(offset)
            }
            (BatchEnd::Interrupted, _, _) => Step::Stop,
            (BatchEnd::Done, None, After::More) => Step::Read,
            (BatchEnd::Done, None, After::End) => Step::End,
            (BatchEnd::Done, None, After::Stop | After::Closed) => Step::Stop,
        }
    }
}

/// The first message of the assignment: where the partition resumed, and whether that
/// is where its committed offset said.
fn resumed(
    shared: &WorkerShared,
    topic: &str,
    partition: i32,
    resume: Option<i64>,
    offset: i64,
    skip: &mut skip::Skip,
) {
    shared.first_offset.store(offset, Ordering::Release);
    tracing::info!(at = "resumed", topic, partition, offset);
    match resume {
        // Behind the committed offset: librdkafka found it out of range and applied
        // auto.offset.reset (ACKD_START_FROM).
        Some(committed) if offset < committed => {
            tracing::warn!(
                at = "offset_reset",
                topic,
                partition,
                from = committed,
                to = offset,
                "the committed offset was out of range; the start policy applied: messages from here are processed again"
            );
            // The log is not the one the commit's metadata described (truncated): the
            // messages at the offsets it named may be new ones; nor may commits name them.
            skip.discard(topic, partition);
            shared
                .acked_above
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
        }
        // Ahead of it: out of range and reset to the log end, or offsets that no longer
        // exist (retention, compaction, transaction markers).
        Some(committed) if offset > committed => tracing::warn!(
            at = "offset_reset",
            topic,
            partition,
            from = committed,
            to = offset,
            "the first message is past the committed offset: the offsets between were deleted, compacted, transaction markers, or reset by the start policy"
        ),
        _ => {}
    }
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

/// A partition's offsets between its queue and the commit: what was handed to the
/// processor, what was acknowledged, what may be committed.
struct Progress<'a> {
    tracker: OffsetTracker,
    shared: &'a WorkerShared,
    topic: &'a str,
    partition: i32,
    source: &'a str,
    log_messages: bool,
    /// The committed offset the assignment resumed from, if any.
    resume: Option<i64>,
    on_failure: OnFailure,
    /// A fetch error since the last message: offsets missing after it may be messages
    /// librdkafka could not read, not offsets that hold none.
    fetch_error: Option<KafkaError>,
    gaps: GapLines,
    /// Offsets the previous owner acknowledged above its commit: not processed again.
    skip: skip::Skip,
}

/// How often a partition writes an `at=offset_gap` line at most (see [`Progress::gap`]).
const GAP_LINE_EVERY: Duration = Duration::from_secs(10);

/// The rate limit of a partition's `at=offset_gap` lines.
#[derive(Default)]
struct GapLines {
    last_line: Option<Instant>,
    /// Gaps, and offsets in them, since the last line that had no line of their own.
    unlogged: u64,
    unlogged_skipped: u64,
}

impl Progress<'_> {
    /// The offset the next message should have: one past the last handed out, else the
    /// committed offset the assignment resumed from.
    fn expected(&self) -> Option<i64> {
        self.tracker
            .last_dispatched()
            .map(|o| o + 1)
            .or(self.resume)
    }

    /// `offset` goes to the processor. `Err(at)` (logged): it may not, and the
    /// partition must not be committed past `at`.
    fn dispatch(&mut self, offset: i64) -> Result<(), i64> {
        let after_error = self.fetch_error.take();
        if let Some(from) = self.expected().filter(|&e| offset > e) {
            match after_error {
                Some(error) => self.unread(from, offset, &error)?,
                // The first message's distance from the committed offset is logged
                // by `resumed` (at=offset_reset).
                None if self.tracker.last_dispatched().is_none() => {
                    self.shared.metrics.offsets_skipped((offset - from) as u64)
                }
                None => self.gap(from, offset),
            }
        }
        self.tracker.dispatch(offset).map_err(|e| {
            tracing::error!(at = "tracker_error", topic = self.topic, partition = self.partition, offset, error = %e);
            offset
        })
    }

    /// Offsets `from..to` hold no message that reached ackd, and no fetch error came
    /// before them: compaction, transaction markers and aborted transactions
    /// (`isolation.level=read_committed`) leave such gaps as a matter of course;
    /// retention passing the position, an offset reset (`ACKD_START_FROM`) or a
    /// truncated log leave them too. Every gap is counted (`count#offsets.skipped`);
    /// one of a single offset (a transaction's marker) is a debug line; a longer one is
    /// an info line, at most one per partition every [`GAP_LINE_EVERY`], which counts
    /// the gaps since the previous line that had none.
    fn gap(&mut self, from: i64, to: i64) {
        let skipped = (to - from) as u64;
        self.shared.metrics.offsets_skipped(skipped);
        let now = Instant::now();
        let quiet = skipped == 1
            || self
                .gaps
                .last_line
                .is_some_and(|t| now.duration_since(t) < GAP_LINE_EVERY);
        if quiet {
            self.gaps.unlogged += 1;
            self.gaps.unlogged_skipped += skipped;
            tracing::debug!(
                at = "offset_gap",
                topic = self.topic,
                partition = self.partition,
                from,
                to,
                skipped
            );
            return;
        }
        tracing::info!(
            at = "offset_gap",
            topic = self.topic,
            partition = self.partition,
            from,
            to,
            skipped,
            earlier_gaps = self.gaps.unlogged,
            earlier_skipped = self.gaps.unlogged_skipped,
            "no message at these offsets reached ackd (compacted, transaction markers, aborted transactions, deleted by retention, or passed by an offset reset): the committed offset passes them; none was a message that failed"
        );
        self.gaps = GapLines {
            last_line: Some(now),
            unlogged: 0,
            unlogged_skipped: 0,
        };
    }

    /// Offsets `from..to` are missing after a fetch error: they may be messages
    /// librdkafka could not read and moved past. The failure policy decides: with
    /// `skip` they are passed (a line says so), else the partition halts at `from`.
    fn unread(&mut self, from: i64, to: i64, error: &KafkaError) -> Result<(), i64> {
        let skipped = (to - from) as u64;
        if self.on_failure == OnFailure::Skip {
            self.shared.metrics.offsets_skipped(skipped);
            self.shared.metrics.skipped();
            tracing::warn!(
                at = "skipped",
                topic = self.topic,
                partition = self.partition,
                offset = from,
                to,
                skipped,
                error = %error,
                "offsets left unread after a fetch error, passed without processing (ACKD_ON_FAILURE=skip)"
            );
            return Ok(());
        }
        self.fetch_halt(from, Some(to), error);
        Err(from)
    }

    /// The line of a partition halted by a fetch error at `offset`.
    fn fetch_halt(&self, offset: i64, to: Option<i64>, error: &KafkaError) {
        tracing::error!(
            at = "fetch_failed",
            topic = self.topic,
            partition = self.partition,
            offset,
            to,
            on_failure = self.on_failure.as_str(),
            error = %error,
            "messages from this offset could not be read: partition halted, its offset is not committed past them (a corrupt batch halts whatever ACKD_ON_FAILURE says; nothing unreadable can be dead-lettered)"
        );
    }

    /// A fetch error on the partition's queue. A batch that fails its CRC check
    /// (`check.crcs=true`) halts the partition at once, whatever `ACKD_ON_FAILURE` says:
    /// librdkafka fetches that batch again and again and never delivers what follows,
    /// so there is nothing to skip to (and nothing to dead-letter). Any other error is
    /// logged, and the offsets missing before the next message are then treated as
    /// unread ([`Progress::unread`]: an unsupported format, which librdkafka does move
    /// past, is skipped with `skip` and halts the partition otherwise). `Err(at)`: halt
    /// at `at`.
    fn fetch_failed(&mut self, error: KafkaError) -> Result<(), i64> {
        // The end of the log is no error, and no message is missing after it.
        if let KafkaError::PartitionEOF(_) = error {
            return Ok(());
        }
        if matches!(
            error,
            KafkaError::MessageConsumption(RDKafkaErrorCode::BadMessage)
        ) {
            // Without a known position (no message yet, no committed offset) nothing
            // can be committed by this worker anyway.
            let at = self.expected().unwrap_or(0);
            self.fetch_halt(at, None, &error);
            return Err(at);
        }
        tracing::warn!(
            at = "fetch_error",
            topic = self.topic,
            partition = self.partition,
            expected_offset = self.expected(),
            error = %error,
            "offsets missing before the next message are treated as unread (ACKD_ON_FAILURE applies)"
        );
        self.fetch_error = Some(error);
        Ok(())
    }

    /// Whether `message` (just dispatched) is one the partition's previous owner
    /// acknowledged above its commit: if so it is acknowledged again, not processed.
    fn skip_acknowledged(&mut self, message: &BorrowedMessage<'_>, topic: &str) -> bool {
        if self.skip.is_empty() || !self.skip.take(message.offset(), topic, self.partition) {
            return false;
        }
        let kafka = Kafka::new(message);
        self.ack(&Message::from_kafka(&kafka, topic), false);
        true
    }

    /// Publishes the offsets acknowledged above the committable one (for the commit's
    /// metadata), using `scratch` to compute them: this worker's acks, and the ranges
    /// the previous owner acknowledged that it has not passed yet. At most what the
    /// metadata can hold ([`PUBLISHED_RANGES_MAX`]): the work per call stays bounded
    /// however much is pending.
    fn publish_acked_above(&mut self, scratch: &mut Vec<(i64, i64)>) {
        self.tracker
            .acked_ranges_into(scratch, PUBLISHED_RANGES_MAX);
        if !self.skip.is_empty() {
            let own = std::mem::take(scratch);
            union_into(scratch, &own, self.skip.remaining(), PUBLISHED_RANGES_MAX);
        }
        let mut published = self
            .shared
            .acked_above
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if *published != *scratch {
            published.clone_from(scratch);
        }
    }

    /// `view` is acknowledged: by the processor (`processed`: its per-message line), or
    /// by the failure policy (which wrote its own line).
    fn ack(&mut self, view: &Message<'_>, processed: bool) {
        let offset = view.offset();
        // The line first: a commit line that names this offset always follows it.
        if self.log_messages && processed {
            metrics::message_processed(self.source, self.topic, self.partition, offset, view.key());
        }
        self.shared
            .highest_acked
            .fetch_max(offset, Ordering::AcqRel);
        match self.tracker.ack(offset) {
            Ok(Some(next)) => self.shared.committable.store(next, Ordering::Release),
            Ok(None) => {}
            Err(e) => {
                tracing::error!(at = "tracker_error", topic = self.topic, partition = self.partition, offset, error = %e)
            }
        }
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
/// rest of `ACKD_BATCH_MAX_WAIT_MS`, or the partition ends. A backlog fills it without
/// waiting.
async fn gather<'q, S>(
    batch: &mut Vec<BorrowedMessage<'q>>,
    held: &mut Option<KafkaResult<BorrowedMessage<'q>>>,
    stream: &mut S,
    batching: &Batching,
    stop_at_end: bool,
    stop: &mut watch::Receiver<bool>,
) -> After
where
    S: futures::Stream<Item = Result<BorrowedMessage<'q>, KafkaError>> + Unpin,
{
    let deadline = tokio::time::Instant::now() + batching.max_wait;
    // Weighed only with a byte limit: key and payload are two FFI calls per message.
    let limit = batching.max_bytes;
    let mut bytes: usize = if limit > 0 {
        batch.iter().map(weight).sum()
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
                if limit > 0 {
                    bytes += weight(&m);
                    if bytes > limit {
                        // Full by size: this one starts the next batch.
                        *held = Some(Ok(m));
                        break;
                    }
                }
                batch.push(m);
            }
            Some(Err(KafkaError::PartitionEOF(_))) if stop_at_end => return After::End,
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

/// How one message ended.
enum Handled {
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
enum BatchEnd {
    /// Every message of it is acknowledged (processed, or by the failure policy).
    Done,
    /// The partition stops at this offset; the messages before it are acknowledged.
    Halt(i64),
    /// Stop was requested during a retry's wait, or before the processor took the call.
    Interrupted,
}

/// Where a batch's acknowledgements go as its handler makes them: `index` is the
/// message's place in the batch.
trait Acks {
    fn ack(&mut self, index: usize, view: &Message<'_>, processed: bool);
}

impl Acks for Progress<'_> {
    fn ack(&mut self, _index: usize, view: &Message<'_>, processed: bool) {
        Progress::ack(self, view, processed);
    }
}

/// Runs the processor on what the partition hands it, with retries and the failure
/// policy: what one message or batch needs besides itself.
struct Handler<'a, P> {
    config: &'a WorkerConfig<P>,
    shared: &'a WorkerShared,
    stop: &'a mut watch::Receiver<bool>,
    rng: &'a mut fastrand::Rng,
    /// The partition's only call (partition ordering): it publishes the offset in hand
    /// and when its call began. Concurrent calls leave that to their loop.
    sequential: bool,
}

impl<P: Processor> Handler<'_, P> {
    /// Runs the processor on one message, with retries and the failure policy.
    async fn handle(&mut self, view: &Message<'_>) -> Handled {
        let mut attempt = 1;
        let error = loop {
            let started = self.shared.metrics.stopwatch();
            let call = AssertUnwindSafe(self.config.processor.process(view)).catch_unwind();
            let Some(outcome) = self.attempt((view.offset(), 1), call).await else {
                return Handled::Interrupted;
            };
            let took = started.elapsed();
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
            if error.kind != FailureKind::Retryable || !self.config.retry.again(attempt) {
                break error;
            }
            if !self.wait_to_retry(view, 1, attempt, &error).await {
                return Handled::Interrupted;
            }
            attempt += 1;
        };
        self.give_up(view, &error, attempt).await
    }

    /// Runs the processor on a batch: the messages before a failed one are acknowledged,
    /// the failed one gets retries and the failure policy, the rest is handed over again.
    async fn handle_batch(&mut self, batch: &[Message<'_>], acks: &mut impl Acks) -> BatchEnd {
        let mut rest = batch;
        // Attempts of rest[0], the message the last failure was on.
        let mut attempt = 1;
        while let (Some(first), Some(last)) = (rest.first(), rest.last()) {
            if self.sequential {
                self.shared
                    .in_flight
                    .store(first.offset(), Ordering::Release);
            }
            let started = Instant::now();
            let call = AssertUnwindSafe(self.config.processor.process_batch(rest)).catch_unwind();
            let Some(outcome) = self.attempt((first.offset(), rest.len()), call).await else {
                return BatchEnd::Interrupted;
            };
            let took = started.elapsed();
            let (failed_at, error) = match outcome {
                Ok(Ok(())) => {
                    self.shared.metrics.processed_many(rest.len() as u64, took);
                    let from = batch.len() - rest.len();
                    for (i, view) in rest.iter().enumerate() {
                        acks.ack(from + i, view, true);
                    }
                    return BatchEnd::Done;
                }
                Ok(Err(BatchError { offset, error })) => {
                    match rest.iter().position(|m| m.offset() == offset) {
                        Some(i) => (i, error),
                        None => {
                            tracing::warn!(
                                at = "batch_error",
                                topic = first.topic(),
                                partition = first.partition(),
                                offset,
                                first_offset = first.offset(),
                                last_offset = last.offset(),
                                "the processor reported a failure at an offset that is not in the batch: the batch failed at its first message"
                            );
                            (0, error)
                        }
                    }
                }
                // A panic out of a processor's own process_batch: which message it was
                // on is unknown, so it is the batch's first unacknowledged one. (The
                // default process_batch catches panics per message.)
                Err(panic) => (0, panicked(&panic)),
            };
            if failed_at > 0 {
                self.shared
                    .metrics
                    .processed_many(failed_at as u64, Took::UNTIMED);
                let from = batch.len() - rest.len();
                for (i, view) in rest[..failed_at].iter().enumerate() {
                    acks.ack(from + i, view, true);
                }
                rest = &rest[failed_at..];
                attempt = 1;
            }
            self.shared.metrics.failed(took);
            let view = &rest[0];
            if error.kind == FailureKind::Retryable && self.config.retry.again(attempt) {
                if !self.wait_to_retry(view, rest.len(), attempt, &error).await {
                    return BatchEnd::Interrupted;
                }
                attempt += 1;
                continue;
            }
            match self.give_up(view, &error, attempt).await {
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

    /// One attempt of the processor call. A concurrent one, or the partition's only
    /// one when the processor's calls may wait for capacity, starts when the processor
    /// takes it, and a stop before that drops it (`None`: its messages stay
    /// unacknowledged, for the next reader). Otherwise the partition's only call times
    /// itself: no allocation, atomic or lock more per message (noop, log).
    async fn attempt<F: std::future::Future>(
        &mut self,
        (offset, messages): (i64, usize),
        call: F,
    ) -> Option<F::Output> {
        let clock = &self.shared.calls;
        if !self.sequential {
            return call_start::admitted(call, clock, (offset, messages), self.stop).await;
        }
        if self.config.processor.calls_may_wait() {
            // A copy: `admitted` marks the stop seen, and the partition's read loop
            // (`Worker::next`) must still see it.
            let mut stop = self.stop.clone();
            return call_start::admitted(call, clock, (offset, messages), &mut stop).await;
        }
        self.shared.call_begins();
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

    /// The failure policy, once a message failed for good.
    async fn give_up(
        &mut self,
        view: &Message<'_>,
        error: &ProcessError,
        attempts: u32,
    ) -> Handled {
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
            OnFailure::DeadLetter => self.dead_letter(view, error, attempts).await,
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
        let Some(dlq) = &self.config.dead_letter else {
            tracing::error!(at = "process_failed", topic, partition, offset, error = %error, "no dead-letter producer; partition halted");
            return Handled::Halt;
        };
        let mut attempt = 1;
        loop {
            match dlq.send(view, error).await {
                Ok((dl_partition, dl_offset)) => {
                    self.shared.metrics.dead_lettered();
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
                Err(e) if self.config.retry.again(attempt) => {
                    let delay = self.config.retry.delay(attempt, self.rng);
                    tracing::warn!(at = "dead_letter_retry", topic, partition, offset, attempt, delay_ms = delay.as_millis() as u64, error = %e);
                    tokio::select! {
                        biased;
                        _ = self.stop.wait_for(|s| *s) => return Handled::Interrupted,
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
}

/// Keeps the partition (and its queue) owned but idle until told to stop: dropping the
/// queue would silently stop the partition, and committing past the failed message
/// would lose it.
async fn halt(shared: &WorkerShared, offset: i64, stop: &mut watch::Receiver<bool>) {
    shared.halted_at.store(offset, Ordering::Release);
    let _ = stop.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress<'a>(shared: &'a WorkerShared, on_failure: OnFailure) -> Progress<'a> {
        Progress {
            tracker: OffsetTracker::new(),
            shared,
            topic: "t",
            partition: 0,
            source: "t",
            log_messages: false,
            resume: Some(0),
            on_failure,
            fetch_error: None,
            gaps: GapLines::default(),
            skip: skip::Skip::default(),
        }
    }

    fn counted(shared: &WorkerShared) -> (u64, u64) {
        let mut i = metrics::Interval::default();
        shared.metrics.take_into(&mut i);
        (i.offsets_skipped, i.skipped)
    }

    fn transient() -> KafkaError {
        KafkaError::MessageConsumption(RDKafkaErrorCode::UnknownTopicOrPartition)
    }

    /// Issue 19, item 16: the previous owner's ranges stay published until this owner
    /// passes them, merged with its own acks.
    #[test]
    fn published_ranges_keep_the_previous_owners_until_passed() {
        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Halt);
        p.skip = skip::Skip::new(vec![(20, 29), (40, 49)]);
        let mut scratch = Vec::new();
        p.publish_acked_above(&mut scratch);
        assert_eq!(shared.acked_above(), vec![(20, 29), (40, 49)]);
        // 10 stuck; 11..=19 acknowledged; 20 and 21 skipped (acknowledged again).
        for o in 10..=21 {
            p.tracker.dispatch(o).unwrap();
        }
        for o in 11..=21 {
            p.tracker.ack(o).unwrap();
        }
        assert!(p.skip.take(20, "t", 0) && p.skip.take(21, "t", 0));
        p.publish_acked_above(&mut scratch);
        assert_eq!(shared.acked_above(), vec![(11, 29), (40, 49)]);
    }

    /// Issue 19, item 15: however many ranges are pending, what is published (and then
    /// copied by each commit) is what the metadata can hold.
    #[test]
    fn published_ranges_are_bounded_by_what_the_metadata_holds() {
        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Halt);
        for o in 0..10_000 {
            p.tracker.dispatch(o).unwrap();
        }
        for o in (1..10_000).step_by(2) {
            p.tracker.ack(o).unwrap();
        }
        p.skip = skip::Skip::new(vec![(20_000, 20_010)]);
        let mut scratch = Vec::new();
        p.publish_acked_above(&mut scratch);
        let published = shared.acked_above();
        assert_eq!(published.len(), PUBLISHED_RANGES_MAX);
        assert_eq!(published[..2], [(1, 1), (3, 3)]);
    }

    #[test]
    fn union_merges_overlapping_and_adjacent_ranges() {
        let mut out = Vec::new();
        let own = [(1, 3), (10, 12), (30, 30)];
        union_into(&mut out, &own, [(4, 5), (11, 20), (40, 41)].into_iter(), 10);
        assert_eq!(out, vec![(1, 5), (10, 20), (30, 30), (40, 41)]);
        union_into(&mut out, &own, [(0, 0)].into_iter(), 2);
        assert_eq!(out, vec![(0, 3), (10, 12)]);
        union_into(&mut out, &[], std::iter::empty(), 2);
        assert!(out.is_empty());
    }

    #[test]
    fn offsets_missing_after_a_fetch_error_halt_the_partition_unless_skip() {
        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Halt);
        assert_eq!(p.dispatch(0), Ok(()));
        assert_eq!(p.dispatch(1), Ok(()));
        assert_eq!(p.fetch_failed(transient()), Ok(()));
        assert_eq!(p.dispatch(5), Err(2), "halted at the first unread offset");

        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::DeadLetter);
        assert_eq!(p.fetch_failed(transient()), Ok(()));
        assert_eq!(p.dispatch(3), Err(0), "unread from the committed offset");

        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Skip);
        assert_eq!(p.dispatch(0), Ok(()));
        assert_eq!(p.fetch_failed(transient()), Ok(()));
        assert_eq!(p.dispatch(4), Ok(()));
        assert_eq!(counted(&shared), (3, 1), "3 offsets passed, as one skip");
    }

    #[test]
    fn a_fetch_error_with_nothing_missing_after_it_is_forgotten() {
        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Halt);
        assert_eq!(p.dispatch(0), Ok(()));
        assert_eq!(p.fetch_failed(transient()), Ok(()));
        assert_eq!(p.dispatch(1), Ok(()));
        // A later gap is an ordinary one.
        assert_eq!(p.dispatch(9), Ok(()));
        assert_eq!(counted(&shared), (7, 0));
    }

    #[test]
    fn a_corrupt_batch_halts_at_the_next_offset_whatever_the_policy() {
        for policy in [OnFailure::Halt, OnFailure::Skip, OnFailure::DeadLetter] {
            let shared = WorkerShared::new();
            let mut p = progress(&shared, policy);
            assert_eq!(p.dispatch(0), Ok(()));
            let crc = KafkaError::MessageConsumption(RDKafkaErrorCode::BadMessage);
            assert_eq!(p.fetch_failed(crc), Err(1), "{policy:?}");
        }
        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Halt);
        assert_eq!(p.fetch_failed(KafkaError::PartitionEOF(0)), Ok(()));
        assert_eq!(p.dispatch(0), Ok(()));
        assert_eq!(
            p.dispatch(3),
            Ok(()),
            "the end of the log is no fetch error"
        );
    }

    #[test]
    fn gaps_are_counted_and_single_offsets_are_quiet() {
        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Halt);
        // The first message's distance from the committed offset: counted, no gap line
        // (at=offset_reset says it).
        assert_eq!(p.dispatch(2), Ok(()));
        // Transaction markers: one offset each.
        assert_eq!(p.dispatch(4), Ok(()));
        assert_eq!(p.dispatch(6), Ok(()));
        assert!(p.gaps.last_line.is_none());
        assert_eq!((p.gaps.unlogged, p.gaps.unlogged_skipped), (2, 2));
        // A longer gap is a line, which counts the quiet ones before it.
        assert_eq!(p.dispatch(20), Ok(()));
        assert!(p.gaps.last_line.is_some());
        assert_eq!((p.gaps.unlogged, p.gaps.unlogged_skipped), (0, 0));
        // The next within GAP_LINE_EVERY waits for the next line.
        assert_eq!(p.dispatch(30), Ok(()));
        assert_eq!((p.gaps.unlogged, p.gaps.unlogged_skipped), (1, 9));
        assert_eq!(counted(&shared), (2 + 1 + 1 + 13 + 9, 0));
    }

    #[tokio::test]
    async fn a_task_waiting_on_the_latch_wakes_when_it_is_set() {
        let shared = Arc::new(WorkerShared::new());
        let waiting = tokio::spawn({
            let shared = shared.clone();
            async move { shared.done.wait().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        let s2 = shared.clone();
        std::thread::spawn(move || drop(SetOnDrop(s2)))
            .join()
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("woken")
            .unwrap();
        assert!(shared.is_done());
        // Already set: returns at once.
        shared.done.wait().await;
    }

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
