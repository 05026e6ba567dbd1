//! A partition's worker with `ACKD_ORDERING=key` or `none`: up to `ACKD_CONCURRENCY`
//! processor calls of one partition at once.
//!
//! Everything runs in the partition's one task: the calls are futures polled together
//! (no copy of the message, no task per message), so they overlap where they await
//! (I/O, a child's answer, a timer). Messages are still read, handed to the tracker and
//! committed in offset order; only the calls overlap. [`KeyOrder`] decides which
//! message may start: one key's messages one at a time, in offset order.
//!
//! ```text
//!   queue ─▶ read (while fewer than ACKD_MAX_PENDING above the committable offset)
//!         ─▶ KeyOrder ─▶ calls (≤ ACKD_CONCURRENCY)
//!                                                                           │
//!        tracker: committable = contiguous acked prefix  ◀──── acks ◀───────┘
//! ```
//! A stop or a halt starts nothing new: the calls under way finish, the messages that
//! had not started stay unacknowledged (the committed offset stops before the first of
//! them; the acknowledged ones above it are named in the commit's metadata). A call
//! waiting in the processor (for a child, an http permit) has not started: a stop drops
//! it (see [`crate::processors::call_start`]).
//!
//! The partition hands the processor calls beyond what it can serve at once: its pool
//! is shared by every partition, so no cap of one partition's calls fits it (a
//! partition alone would leave children idle under any cap below the pool's size,
//! and partitions together exceed any cap above it); calls waiting in the pool cost a
//! stop nothing, and the pool finds the next call ready when a child answers.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;

use super::handler::{Acks, BatchEnd, Handled, Handler};
use super::shared::NONE;
use super::task::{is_end, Batching, Step, Worker};
use crate::consumer::key_order::{key_hash, KeyOrder, UnitId};
use crate::processors::processor::{Fetched, FetchedMessage, Kafka, Message, Processor};
use crate::settings::ProcessingOrder;

/// What one processor call gets: a message, or a batch (`ACKD_BATCH_MAX_MESSAGES`).
enum Unit<'q> {
    One(FetchedMessage<'q>),
    Batch(Vec<FetchedMessage<'q>>),
}

impl<'q> Unit<'q> {
    fn messages(&self) -> &[FetchedMessage<'q>] {
        match self {
            Unit::One(m) => std::slice::from_ref(m),
            Unit::Batch(b) => b,
        }
    }
}

/// How a call ended: its unit back, the acknowledgements it made (by index in the
/// unit), and what follows for the partition.
struct Done<'q> {
    id: UnitId,
    unit: Unit<'q>,
    acks: Vec<(usize, bool)>,
    end: BatchEnd,
}

impl Acks for Vec<(usize, bool)> {
    fn ack(&mut self, index: usize, _view: &Message<'_>, processed: bool) {
        self.push((index, processed));
    }
}

/// A batch being filled (`ACKD_BATCH_MAX_MESSAGES` above 1) while the calls run.
struct Open<'q> {
    messages: Vec<FetchedMessage<'q>>,
    bytes: usize,
    deadline: tokio::time::Instant,
}

/// Where the loop is going: on reading, or winding down (nothing new starts, the calls
/// under way finish) to a stop or a halt, or to the end of the partition.
#[derive(Default)]
struct Course {
    stopping: bool,
    /// The lowest offset the partition halts at (a halt wins over a stop).
    halted: Option<i64>,
    /// The partition reached its end (`ACKD_STOP_AT_END`): everything read is finished.
    ended: bool,
}

impl Course {
    fn winding_down(&self) -> bool {
        self.stopping || self.halted.is_some()
    }

    fn halt(&mut self, at: i64) {
        self.halted = Some(self.halted.map_or(at, |h| h.min(at)));
    }
}

/// One run of the concurrent loop: the units read and not finished, the calls under way,
/// the batch being filled, and where the loop is going.
struct Concurrent<'q> {
    order: KeyOrder<Unit<'q>>,
    running: FuturesUnordered<BoxFuture<'q, Done<'q>>>,
    calls: Calls,
    open: Option<Open<'q>>,
    /// Messages read and not finished: in calls, waiting for their key, or in `open`.
    held: usize,
    /// Their key and value bytes (counted only under a byte limit).
    held_bytes: usize,
    course: Course,
    /// Scratch for the ranges acknowledged above the committable offset.
    ranges: Vec<(i64, i64)>,
}

impl<'q> Concurrent<'q> {
    fn new() -> Self {
        Concurrent {
            order: KeyOrder::new(),
            running: FuturesUnordered::new(),
            calls: Calls::default(),
            open: None,
            held: 0,
            held_bytes: 0,
            course: Course::default(),
            ranges: Vec::new(),
        }
    }

    /// Messages read and waiting to be handed to the processor (none when winding down).
    fn waiting(&self) -> usize {
        if self.course.winding_down() {
            0
        } else {
            self.held - self.calls.messages
        }
    }

    /// With no call under way and nothing more to read: the step the loop ends with, if
    /// it is over.
    fn last_step(&self) -> Option<Step> {
        if let Some(at) = self.course.halted {
            return Some(Step::Halt(at));
        }
        if self.course.stopping {
            return Some(Step::Stop);
        }
        if self.course.ended && self.open.is_none() && self.order.unfinished() == 0 {
            return Some(Step::End);
        }
        None
    }

    /// Told to stop (or the call was interrupted, or the queue is gone): winds down.
    fn stopping(&mut self) {
        self.course.stopping = true;
        self.drop_not_started();
    }

    /// The partition halts at `at` (or lower): winds down.
    fn halt(&mut self, at: i64) {
        self.course.halt(at);
        self.drop_not_started();
    }

    /// What winding down leaves: the units not started are dropped with their messages
    /// (unacknowledged: the next reader of the partition gets them; holding librdkafka's
    /// messages would keep the consumer from closing).
    fn drop_not_started(&mut self) {
        self.order.forget_not_started();
        self.open = None;
    }
}

/// The calls handed to the processor, by id (ids follow offsets): their first offsets.
/// When each began is the processor's to say (`WorkerShared::calls`).
#[derive(Default)]
struct Calls {
    started: BTreeMap<UnitId, i64>,
    /// Messages in the calls under way.
    messages: usize,
}

impl<'q, P: Processor> Worker<'q, P> {
    /// Reads and processes the partition concurrently until a stop, a halt or its end.
    pub(super) async fn concurrently(&mut self) -> Step {
        let limits = self.config.concurrency;
        let batching = self.config.batch;
        let mut run = Concurrent::new();
        let mut stop = self.stop.clone();
        loop {
            // Held (the membership is in doubt, or a stall of the process not seen yet):
            // the calls under way go on, none starts.
            let hold = &self.shared.hold;
            let on_hold = !hold.may_start();
            if !run.course.winding_down() && !on_hold {
                self.start_calls(&mut run, &stop, limits.max_in_flight);
            }
            self.publish_calls(&run.calls, run.waiting());
            // The cap counts every offset read above the committable one, finished ones
            // included: behind one slow message the tracker (and the ranges named in the
            // commit's metadata) stay bounded too.
            let reading = !run.course.winding_down()
                && !run.course.ended
                && self.progress.tracker.outstanding() < limits.max_pending
                && (limits.max_pending_bytes == 0 || run.held_bytes < limits.max_pending_bytes);
            if run.running.is_empty() && !reading {
                if let Some(step) = run.last_step() {
                    return step;
                }
            }
            let deadline = run.open.as_ref().map(|o| o.deadline);
            tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s), if !run.course.stopping => run.stopping(),
                Some(done) = run.running.next(), if !run.running.is_empty() => {
                    self.call_ended(done, &mut run);
                }
                next = self.next(), if reading => self.read_one(next, &mut run, &batching),
                _ = hold.startable(), if on_hold && !run.course.winding_down() => {}
                // After the reading arm: a batch waits for more only while the queue has
                // none ready (a backlog fills it at once; with ACKD_BATCH_MAX_WAIT_MS=0
                // it goes with what the queue had).
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)),
                    if deadline.is_some() => self.close_batch(&mut run),
            }
        }
    }

    /// Starts the units whose keys are free, up to `max_in_flight` calls.
    fn start_calls(
        &self,
        run: &mut Concurrent<'q>,
        stop: &watch::Receiver<bool>,
        max_in_flight: usize,
    ) {
        while run.running.len() < max_in_flight {
            let Some((id, unit)) = run.order.start_next() else {
                break;
            };
            run.calls.messages += unit.messages().len();
            run.calls.started.insert(id, unit.messages()[0].offset());
            run.running.push(self.call(id, unit, stop.clone()));
        }
    }

    /// A call ended: its unit is finished, and what it ended with may wind the loop down.
    fn call_ended(&mut self, done: Done<'q>, run: &mut Concurrent<'q>) {
        run.calls.started.remove(&done.id);
        run.calls.messages -= done.unit.messages().len();
        run.held -= done.unit.messages().len();
        if self.config.concurrency.max_pending_bytes > 0 {
            run.held_bytes -= done
                .unit
                .messages()
                .iter()
                .map(FetchedMessage::size)
                .sum::<usize>();
        }
        match self.finished(done, &mut run.order, &mut run.ranges) {
            BatchEnd::Done => {}
            BatchEnd::Halt(at) => run.halt(at),
            BatchEnd::Interrupted => run.stopping(),
        }
    }

    /// What the queue gave (`None`: told to stop, or the queue is gone).
    fn read_one(
        &mut self,
        next: Option<Fetched<'q>>,
        run: &mut Concurrent<'q>,
        batching: &Batching,
    ) {
        match next {
            None => run.stopping(),
            Some(Ok(m)) => {
                let size = if self.config.concurrency.max_pending_bytes > 0 {
                    m.size()
                } else {
                    0
                };
                match self.accept(m, &mut run.order, &mut run.open, batching) {
                    Ok(true) => {
                        run.held += 1;
                        run.held_bytes += size;
                    }
                    Ok(false) => {}
                    Err(at) => run.halt(at),
                }
            }
            Some(Err(e)) if is_end(&e) && self.config.at_end.is_some() => {
                run.course.ended = true;
                self.close_batch(run);
            }
            Some(Err(e)) => {
                if let Err(at) = self.progress.fetch_failed(*e) {
                    run.halt(at);
                }
            }
        }
    }

    /// The batch being filled, if any, is queued as it is (its wait is over, or the
    /// partition ended).
    fn close_batch(&self, run: &mut Concurrent<'q>) {
        if let Some(o) = run.open.take() {
            self.add(&mut run.order, Unit::Batch(o.messages));
        }
    }

    /// A message read from the queue: handed to the tracker, then skipped (its previous
    /// owner acknowledged it), or queued to start. `Ok(false)`: skipped, not held.
    /// `Err(at)`: it could not be accounted for; the partition halts at `at`.
    fn accept(
        &mut self,
        m: FetchedMessage<'q>,
        order: &mut KeyOrder<Unit<'q>>,
        open: &mut Option<Open<'q>>,
        batching: &Batching,
    ) -> Result<bool, i64> {
        let offset = m.offset();
        self.note_first(offset);
        self.progress.dispatch(offset, m.timestamp_ms())?;
        if self.progress.skip_acknowledged(&m, self.topic) {
            return Ok(false);
        }
        self.shared.metrics.received();
        if batching.max_messages <= 1 {
            self.add(order, Unit::One(m));
            return Ok(true);
        }
        // Batches fill from what the queue has ready; a batch not full waits for more at
        // most ACKD_BATCH_MAX_WAIT_MS (the loop's timer), while the calls go on.
        let limit = batching.max_bytes;
        let w = if limit > 0 { m.size() } else { 0 };
        if let Some(o) = open.as_mut() {
            if limit > 0 && o.bytes + w > limit {
                let full = open.take().expect("open");
                self.add(order, Unit::Batch(full.messages));
            }
        }
        let o = open.get_or_insert_with(|| Open {
            messages: Vec::with_capacity(batching.max_messages.min(1024)),
            bytes: 0,
            deadline: tokio::time::Instant::now() + batching.max_wait,
        });
        o.bytes += w;
        o.messages.push(m);
        if o.messages.len() >= batching.max_messages {
            let full = open.take().expect("open");
            self.add(order, Unit::Batch(full.messages));
        }
        Ok(true)
    }

    /// Queues a unit behind the earlier units that share its keys.
    fn add(&self, order: &mut KeyOrder<Unit<'q>>, unit: Unit<'q>) {
        let keys = match self.config.concurrency.ordering {
            ProcessingOrder::Key => unit
                .messages()
                .iter()
                .filter_map(|m| m.key().map(key_hash))
                .collect(),
            // Partition ordering never gets here; `none` holds no keys.
            ProcessingOrder::None | ProcessingOrder::Partition => Vec::new(),
        };
        order.add(keys, unit);
    }

    /// The processor call of one unit, with its retries and the failure policy, as a
    /// future of its own.
    fn call(
        &self,
        id: UnitId,
        unit: Unit<'q>,
        mut stop: watch::Receiver<bool>,
    ) -> BoxFuture<'q, Done<'q>> {
        let config = self.config;
        let shared = self.shared;
        let topic: &'q str = self.topic;
        let window = self.flagging.window;
        let mut rng = fastrand::Rng::with_seed(id ^ 0x9e37_79b9_7f4a_7c15);
        async move {
            let mut acks = Vec::new();
            let end = {
                let kafka: Vec<Kafka<'_>> = unit.messages().iter().map(Kafka::new).collect();
                let views: Vec<Message<'_>> = kafka
                    .iter()
                    .map(|k| {
                        let view = Message::from_kafka(k, topic);
                        let redelivered = window.covers(view.offset());
                        config.delivery(view, redelivered)
                    })
                    .collect();
                let mut handler = Handler {
                    config,
                    shared,
                    stop: &mut stop,
                    rng: &mut rng,
                    sequential: false,
                };
                match &unit {
                    Unit::One(_) => match handler.handle(&views[0]).await {
                        Handled::Processed => {
                            acks.push((0, true));
                            BatchEnd::Done
                        }
                        Handled::Ack => {
                            acks.push((0, false));
                            BatchEnd::Done
                        }
                        Handled::Halt => BatchEnd::Halt(views[0].offset()),
                        Handled::Interrupted => BatchEnd::Interrupted,
                    },
                    Unit::Batch(_) => handler.handle_batch(&views, &mut acks).await,
                }
            };
            Done {
                id,
                unit,
                acks,
                end,
            }
        }
        .boxed()
    }

    /// A call ended: its acknowledgements go to the tracker (and the committable offset
    /// and the ranges acknowledged above it are published), its keys free the units
    /// they held back.
    fn finished(
        &mut self,
        done: Done<'q>,
        order: &mut KeyOrder<Unit<'q>>,
        ranges: &mut Vec<(i64, i64)>,
    ) -> BatchEnd {
        let messages = done.unit.messages();
        for &(i, processed) in &done.acks {
            let kafka = Kafka::new(&messages[i]);
            let view = Message::from_kafka(&kafka, self.topic);
            let view = self
                .config
                .delivery(view, self.flagging.window.covers(view.offset()));
            self.progress.ack(&view, processed);
        }
        self.progress.publish_acked_above(ranges);
        order.finish(done.id);
        done.end
    }

    /// The lowest offset handed to the processor, how many messages it has, and how
    /// many wait to be handed over.
    fn publish_calls(&self, calls: &Calls, waiting: usize) {
        self.shared.waiting.store(waiting, Ordering::Relaxed);
        let lowest = calls.started.values().next().copied().unwrap_or(NONE);
        self.shared.in_flight.store(lowest, Ordering::Release);
        self.shared
            .handed_over
            .store(calls.messages, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_acks_collect_by_index() {
        let mut acks: Vec<(usize, bool)> = Vec::new();
        let m = Message::new("t", 0, 5, None, None, None);
        Acks::ack(&mut acks, 2, &m, true);
        Acks::ack(&mut acks, 3, &m, false);
        assert_eq!(acks, vec![(2, true), (3, false)]);
    }
}
