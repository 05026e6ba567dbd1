//! Reading the partition's queue in offset order, one message to the processor at a time
//! (`ACKD_ORDERING=partition`): the next message (for the concurrent loop too), the
//! assignment's first one, and a single message's call.

use std::sync::atomic::Ordering;

use std::panic::AssertUnwindSafe;

use futures::{FutureExt, StreamExt};
use rdkafka::error::{KafkaError, KafkaResult};

use super::consume::{Step, Worker};
use super::handler::{Handled, Handler};
use super::shared::NONE;
use crate::consumer::handover::resumed;
use crate::fetched_message::FetchedMessage;
use crate::processors::processor::{Kafka, Message, Processor};

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
    pub(super) fn note_first(&mut self, offset: i64) {
        if self.first {
            self.first = false;
            self.shared.first_offset.store(offset, Ordering::Release);
            let (topic, partition) = (self.topic, self.partition);
            if resumed(
                topic,
                partition,
                self.resume_from,
                offset,
                &mut self.progress.skip,
            ) {
                self.shared
                    .acked_above
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clear();
            }
        }
    }

    /// What the queue has next, once it may start (at most the dispatch limit of the
    /// last accepted commit: src/consumer/dispatch_limit.rs); `None` when told to stop
    /// or the queue is gone. One async function on the hot path: a second layer of
    /// future around the read moved each message through twice (about 75 instructions
    /// a message under callgrind).
    pub(super) async fn next(&mut self) -> Option<KafkaResult<FetchedMessage<'a>>> {
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
            let next = tokio::select! {
                biased;
                _ = self.stop.changed() => None,
                next = self.messages.next() => next,
            };
            // The wait may have spanned a stall of the process (the message is what
            // woke it): checked again, the message stays unstarted until the
            // partition may go on.
            if next.is_some() && !self.shared.hold.wait_unless_stopped(&mut self.stop).await {
                return None;
            }
            next
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
        let skipped = self.progress.skip.total_skipped();
        self.flagging
            .read(offset, skipped, self.topic, self.partition);
        next
    }

    /// One message to the processor (`Processor::process`).
    pub(super) async fn single(&mut self, message: FetchedMessage<'a>) -> Step {
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
        let redelivered = self.flagging.window.covers(offset);
        let view = Message::from_kafka(&kafka, self.topic).with_delivery(redelivered, 1);
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
