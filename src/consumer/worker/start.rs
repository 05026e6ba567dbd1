//! Starting a partition's worker: its task, the supervisor's handle on it, and the wait
//! for a previous worker of the partition that has not ended.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use rdkafka::consumer::ConsumerContext;
use tokio::sync::watch;

use super::config::WorkerConfig;
use super::consume::consume;
use super::shared::{SetOnDrop, WorkerShared};
use crate::consumer::handover::Resume;
use crate::consumer::partition_queue::PartitionQueue;
use crate::processors::processor::Processor;

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
