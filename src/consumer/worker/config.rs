//! What a worker needs besides its queue: the processor, the failure policy, batching
//! and concurrency.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::config::failure::{OnFailure, RetryPolicy};
use crate::config::settings::ProcessingOrder;
use crate::consumer::dead_letter::DeadLetter;
use crate::consumer::dispatch_limit::LimitPolicy;

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
    /// How far ahead of the last accepted commit the worker may start messages.
    pub limits: LimitPolicy,
    /// Under the memory budget, what a worker may hold taken out of its queue
    /// (`Budget::taken_bytes`; 0: no budget): a larger message pauses the partition's
    /// fetching while the worker holds it (src/consumer/partition_queue.rs).
    pub taken_max_bytes: usize,
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
            dead_letter: self.dead_letter.clone(),
            batch: self.batch,
            concurrency: self.concurrency,
            limits: self.limits.clone(),
            taken_max_bytes: self.taken_max_bytes,
        }
    }
}
