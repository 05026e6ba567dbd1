//! Batches (`ACKD_BATCH_MAX_MESSAGES` above 1): gathering one from the queue, and
//! handing it to the processor (`Processor::process_batch`).

use std::sync::atomic::Ordering;

use futures::{FutureExt, StreamExt};
use rdkafka::error::{KafkaError, KafkaResult};
use tokio::sync::watch;

use super::config::Batching;
use super::consume::{Step, Worker};
use super::handler::{BatchEnd, Handler};
use super::shared::NONE;
use crate::consumer::dispatch_limit::DispatchLimit;
use crate::fetched_message::FetchedMessage;
use crate::processors::processor::{Kafka, Message, Processor};

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
            &self.shared.dispatch,
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
                view.with_delivery(redelivered, 1)
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
            if let Err(at) = self.progress.dispatch(v.offset()) {
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
/// rest of `ACKD_BATCH_MAX_WAIT_MS`, the next message is above the dispatch limit (it
/// goes to `held` too, and waits there), or the partition ends. A backlog fills it
/// without waiting.
async fn gather<'q, S>(
    batch: &mut Vec<FetchedMessage<'q>>,
    held: &mut Option<KafkaResult<FetchedMessage<'q>>>,
    stream: &mut S,
    batching: &Batching,
    stop_at_end: bool,
    dispatch: &DispatchLimit,
    stop: &mut watch::Receiver<bool>,
) -> After
where
    S: futures::Stream<Item = Result<FetchedMessage<'q>, KafkaError>> + Unpin,
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
                if !dispatch.permits(m.offset()) {
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
