//! The consumer group: what ackd owns, and what happens when that changes.
//!
//! [`GroupContext`] is the rdkafka context of ackd's one consumer. librdkafka calls its
//! rebalance hooks on the thread that polls the main queue, which is the supervisor's
//! own thread (never a tokio worker), so they may block:
//! - on assign, each new partition gets its own queue (split *before* librdkafka starts
//!   fetching it, so no message can reach the main queue) and its own worker;
//! - on revoke, the revoked partitions' workers are told to stop, their in-flight
//!   messages finish (bounded by the drain timeout), their acked offsets are committed
//!   synchronously, and only then does the rebalance go on. A lost assignment (session
//!   timed out, fenced) commits nothing: the partitions may already be someone else's.
//!
//! Offsets reach the broker two ways, both here: [`store_acked`] hands acknowledged
//! offsets to librdkafka, whose auto-commit sends them every commit interval; a drain
//! (revoke, shutdown) commits them synchronously. The rule "store and commit only what
//! was acknowledged, only for partitions we own" lives in this one place.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::{Offset, TopicPartitionList};

use crate::processor::Processor;
use crate::settings::StartFrom;
use crate::worker::{self, WorkerConfig, WorkerHandle};

/// A topic and partition.
pub type Tp = (Arc<str>, i32);

/// The consumer type ackd runs.
pub type AckdConsumer<P> = StreamConsumer<GroupContext<P>>;

/// One owned partition.
pub struct Owned {
    pub worker: WorkerHandle,
    /// The offset the group has committed, as far as this process knows.
    pub committed: Option<i64>,
    /// The offset last stored in librdkafka (which auto-commits stored offsets).
    pub stored: Option<i64>,
    /// Never commit beyond this offset (set when a message could not be accounted for).
    pub cap: Option<i64>,
}

impl Owned {
    /// The acknowledged offset, if it moved past `since`.
    fn acked_past(&self, since: Option<i64>) -> Option<i64> {
        let acked = self.worker.shared.committable()?;
        let acked = self.cap.map_or(acked, |cap| acked.min(cap));
        since.is_none_or(|c| acked > c).then_some(acked)
    }
}

/// The partitions this process owns.
#[derive(Default)]
pub struct Group {
    pub owned: BTreeMap<Tp, Owned>,
}

impl Group {
    /// Acknowledged offsets not yet committed, for the given partitions.
    pub fn uncommitted(&self, only: &[Tp]) -> Vec<(Tp, i64)> {
        only.iter()
            .filter_map(|tp| {
                let p = self.owned.get(tp)?;
                p.acked_past(p.committed).map(|o| (tp.clone(), o))
            })
            .collect()
    }

    /// Acknowledged offsets not yet stored, for every partition; marks them stored.
    fn take_unstored(&mut self) -> Vec<(Tp, i64)> {
        let mut out = Vec::new();
        for (tp, p) in &mut self.owned {
            if let Some(o) = p.acked_past(p.stored) {
                p.stored = Some(o);
                out.push((tp.clone(), o));
            }
        }
        out
    }
}

/// Builds the list of offsets. Kept short-lived: a TPL alive at consumer drop can hang
/// it (rust-rdkafka #453).
fn tpl_of(offsets: &[(Tp, i64)]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::with_capacity(offsets.len());
    for ((topic, partition), offset) in offsets {
        // Offsets come from the tracker: always >= 0, so this cannot fail.
        let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset));
    }
    tpl
}

/// Hands the acknowledged offsets to librdkafka, which commits stored offsets every
/// `auto.commit.interval.ms` (= `ACKD_COMMIT_INTERVAL_MS`) and reports each commit
/// through [`GroupContext::commit_callback`]. Only acknowledged offsets are ever stored.
pub fn store_acked<P: Processor, X: Consumer<GroupContext<P>>>(
    ctx: &GroupContext<P>,
    consumer: &X,
) {
    let offsets = ctx.lock().take_unstored();
    if offsets.is_empty() {
        return;
    }
    if let Err(e) = consumer.store_offsets(&tpl_of(&offsets)) {
        // __STATE: a partition is no longer assigned; its acks are dropped on purpose.
        tracing::debug!(at = "store_failed", error = %e, partitions = offsets.len());
    }
}

/// Stores and synchronously commits `offsets` (already "next offset to read"). Storing
/// first keeps librdkafka's own commit-on-revoke from sending an older offset after ours.
fn commit_sync<X: Consumer<C>, C: ConsumerContext>(
    consumer: &X,
    offsets: &[(Tp, i64)],
) -> KafkaResult<()> {
    if offsets.is_empty() {
        return Ok(());
    }
    let tpl = tpl_of(offsets);
    let _ = consumer.store_offsets(&tpl);
    consumer.commit(&tpl, CommitMode::Sync)
}

/// The rdkafka context: owns the group state and reacts to rebalances.
pub struct GroupContext<P: Processor> {
    /// Set right after the consumer is created; partitions' queues need the `Arc`.
    pub consumer: OnceLock<Weak<AckdConsumer<P>>>,
    pub group: Arc<Mutex<Group>>,
    pub runtime: tokio::runtime::Handle,
    pub worker: WorkerConfig<P>,
    pub drain_timeout: Duration,
    pub start_from: StartFrom,
    /// Authentication failures seen by [`ClientContext::error`]; fatal (src/auth.rs).
    pub auth: crate::auth::AuthFailures,
}

impl<P: Processor> GroupContext<P> {
    pub fn lock(&self) -> MutexGuard<'_, Group> {
        self.group.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<P: Processor> ClientContext for GroupContext<P> {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", facility = fac, "{log_message}")
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // An authentication failure gets its own line (once) and stops ackd.
        if self.auth.observe(&error, reason) {
            return;
        }
        tracing::error!(at = "kafka_error", error = %error, reason);
    }
}

impl<P: Processor> ConsumerContext for GroupContext<P> {
    fn pre_rebalance(&self, base: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => self.assign(base, tpl),
            Rebalance::Revoke(tpl) => self.revoke(base, tpl),
            Rebalance::Error(e) => tracing::error!(at = "rebalance_error", error = %e),
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        let mut group = self.lock();
        for e in offsets.elements() {
            let Offset::Offset(offset) = e.offset() else {
                continue;
            };
            let partition = e.partition();
            let outcome = result.clone().and(e.error());
            match outcome {
                Ok(()) => {
                    tracing::info!(at = "committed", topic = e.topic(), partition, offset);
                    let tp: Tp = (Arc::from(e.topic()), partition);
                    if let Some(p) = group.owned.get_mut(&tp) {
                        p.committed = Some(p.committed.map_or(offset, |c| c.max(offset)));
                    }
                }
                Err(err) => {
                    tracing::error!(
                        at = "commit_failed",
                        topic = e.topic(),
                        partition,
                        offset,
                        error = %err,
                        "not committed; retried at the next commit, redelivered from the last committed offset if the process stops first"
                    );
                }
            }
        }
    }
}

impl<P: Processor> GroupContext<P> {
    fn assign(&self, base: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let Some(consumer) = self.consumer.get().and_then(Weak::upgrade) else {
            tracing::error!(at = "assign_error", "consumer is gone; ignoring assignment");
            return;
        };
        // Where each partition resumes: the group's committed offset, else the policy.
        let committed = base
            .committed_offsets(tpl.clone(), Duration::from_secs(10))
            .map_err(|e| tracing::warn!(at = "committed_unknown", error = %e, "could not read committed offsets"))
            .ok();
        let mut group = self.lock();
        for e in tpl.elements() {
            let topic: Arc<str> = Arc::from(e.topic());
            let partition = e.partition();
            let resume = committed
                .as_ref()
                .and_then(|c| c.find_partition(e.topic(), partition))
                .map(|c| c.offset());
            let committed_offset = match resume {
                Some(Offset::Offset(o)) => {
                    tracing::info!(
                        at = "assigned",
                        topic = &*topic,
                        partition,
                        offset = o,
                        from = "committed"
                    );
                    Some(o)
                }
                Some(_) => {
                    tracing::info!(
                        at = "assigned",
                        topic = &*topic,
                        partition,
                        from = self.start_from.as_str(),
                        "no committed offset: the start policy applies"
                    );
                    None
                }
                None => {
                    tracing::info!(
                        at = "assigned",
                        topic = &*topic,
                        partition,
                        from = "unknown"
                    );
                    None
                }
            };
            let Some(queue) = consumer.split_partition_queue(&topic, partition) else {
                tracing::error!(
                    at = "assign_error",
                    topic = &*topic,
                    partition,
                    "librdkafka gave no queue for this partition"
                );
                continue;
            };
            let worker = worker::spawn(
                &self.runtime,
                queue,
                topic.clone(),
                partition,
                self.worker.clone(),
            );
            let previous = group.owned.insert(
                (topic, partition),
                Owned {
                    worker,
                    committed: committed_offset,
                    stored: committed_offset,
                    cap: None,
                },
            );
            if let Some(old) = previous {
                // Assigned twice without a revoke in between: the old worker's acks
                // belong to a finished assignment and are dropped with it.
                old.worker.stop();
                old.worker.abort();
            }
        }
    }

    fn revoke(&self, base: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let lost = base.assignment_lost();
        let tps: Vec<Tp> = tpl
            .elements()
            .iter()
            .map(|e| (Arc::from(e.topic()), e.partition()))
            .collect();
        let deadline = Instant::now() + self.drain_timeout;
        let outcome = drain_and_commit(self, base, &tps, deadline, !lost);
        for (tp, offset) in outcome.committed {
            tracing::info!(
                at = "revoked",
                topic = &*tp.0,
                partition = tp.1,
                offset,
                lost
            );
        }
        for tp in outcome.without_commit {
            tracing::info!(at = "revoked", topic = &*tp.0, partition = tp.1, lost);
        }
    }
}

/// What a drain achieved.
pub struct Drained {
    /// Partitions and the offset now committed for them (newly or before).
    pub committed: Vec<(Tp, i64)>,
    /// Partitions released with nothing committed by this process.
    pub without_commit: Vec<Tp>,
    /// Whether every worker finished in time and every commit succeeded.
    pub complete: bool,
}

/// Stops the workers of `tps`, waits for them until `deadline`, commits what they acked
/// (unless `commit` is false: a lost assignment), and forgets the partitions. Used by
/// revokes and by the shutdown: one drain, one rule.
pub fn drain_and_commit<P: Processor, X: Consumer<GroupContext<P>>>(
    ctx: &GroupContext<P>,
    base: &X,
    tps: &[Tp],
    deadline: Instant,
    commit_acked: bool,
) -> Drained {
    let mut complete = true;
    {
        let group = ctx.lock();
        for tp in tps {
            if let Some(p) = group.owned.get(tp) {
                p.worker.stop();
            }
        }
    }
    // Wait without holding the lock: the commit callback may need it meanwhile.
    let shared: Vec<(Tp, Arc<worker::WorkerShared>)> = {
        let group = ctx.lock();
        tps.iter()
            .filter_map(|tp| {
                group
                    .owned
                    .get(tp)
                    .map(|p| (tp.clone(), p.worker.shared.clone()))
            })
            .collect()
    };
    for (tp, s) in &shared {
        if !s.wait_done(deadline) {
            complete = false;
            tracing::error!(
                at = "drain_timeout",
                topic = &*tp.0,
                partition = tp.1,
                in_flight_offset = s.in_flight(),
                "in-flight message did not finish before the deadline; it is not committed and will be redelivered"
            );
        }
    }
    let (pending, mut removed) = {
        let mut group = ctx.lock();
        let pending = group.uncommitted(tps);
        let removed: Vec<(Tp, Owned)> = tps
            .iter()
            .filter_map(|tp| group.owned.remove(tp).map(|p| (tp.clone(), p)))
            .collect();
        (pending, removed)
    };
    for (_, p) in &removed {
        p.worker.abort();
    }
    // An aborted worker lets go of its queue at its next await; wait for that, so no
    // queue outlives the partition (or keeps the consumer alive past its close).
    let grace = Instant::now() + Duration::from_secs(1);
    for (tp, p) in &removed {
        if !p.worker.shared.wait_done(grace) {
            tracing::error!(
                at = "worker_stuck",
                topic = &*tp.0,
                partition = tp.1,
                "worker did not end after abort"
            );
        }
    }
    let mut committed = Vec::new();
    let mut without_commit = Vec::new();
    if commit_acked {
        let commit_ok = match commit_sync(base, &pending) {
            Ok(()) => true,
            Err(e) => {
                complete = false;
                for (tp, offset) in &pending {
                    tracing::error!(
                        at = "commit_failed",
                        topic = &*tp.0,
                        partition = tp.1,
                        offset,
                        error = %e,
                        "not committed; messages from the last committed offset will be redelivered"
                    );
                }
                false
            }
        };
        for (tp, p) in removed.drain(..) {
            match pending.iter().find(|(t, _)| *t == tp) {
                Some((_, o)) if commit_ok => committed.push((tp, *o)),
                _ => match p.committed {
                    Some(c) => committed.push((tp, c)),
                    None => without_commit.push(tp),
                },
            }
        }
    } else {
        without_commit.extend(removed.drain(..).map(|(tp, _)| tp));
    }
    Drained {
        committed,
        without_commit,
        complete,
    }
}
