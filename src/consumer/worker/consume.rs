//! Reading a partition until told to stop: the worker proper, a small state machine,
//! and the idle states it ends in.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaResult;
use tokio::sync::watch;

use super::config::WorkerConfig;
use super::progress::Progress;
use super::shared::WorkerShared;
use crate::config::settings::ProcessingOrder;
use crate::consumer::handover::{Flagging, Resume};
use crate::consumer::partition_queue::{Messages, PartitionQueue};
use crate::fetched_message::FetchedMessage;
use crate::processors::processor::Processor;

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
pub(super) async fn consume<C, P>(
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
        messages: queue.messages(config.taken_max_bytes),
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
    /// batch's first. Dropped unprocessed on a stop, like a batch being gathered. Or a
    /// fetch error that ended the last batch, handled before anything after it.
    pub(super) held: Option<KafkaResult<FetchedMessage<'a>>>,
    pub(super) progress: Progress<'a>,
    pub(super) config: &'a WorkerConfig<P>,
    pub(super) shared: &'a WorkerShared,
    pub(super) topic: &'a Arc<str>,
    pub(super) partition: i32,
    /// The committed offset the assignment resumed from, if any.
    pub(super) resume_from: Option<i64>,
    pub(super) stop: watch::Receiver<bool>,
    pub(super) rng: fastrand::Rng,
    /// Messages taken in a row without waiting for the queue (see `read::YIELD_EVERY`).
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
