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
//! What may be committed is decided here ([`Group::uncommitted`]: acknowledged, for
//! partitions we own); the [`Committer`] sends it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use rdkafka::bindings as rdsys;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use crate::config::settings::StartFrom;
use crate::consumer::committer::{self, CommitLedger, CommitOffset, Committer, Reason};
use crate::consumer::membership;
use crate::consumer::worker::{self, WorkerConfig, WorkerHandle};
use crate::output::health::{Busy, Health};
use crate::output::metrics::{self, CommitMetrics, Interval};
use crate::processors::processor::Processor;
use crate::topic_partition::TopicPartition;

/// The consumer type ackd runs.
pub type AckdConsumer<P> = StreamConsumer<GroupContext<P>>;

/// One owned partition.
pub struct Owned {
    pub worker: WorkerHandle,
    /// The offset the group has committed, as far as this process knows.
    pub committed: Option<i64>,
    /// The committed offset at assignment, where the partition was meant to resume.
    pub assigned_at: Option<i64>,
    /// Never commit beyond this offset (set when a message could not be accounted for).
    pub cap: Option<i64>,
    /// The partition's high watermark, from librdkafka's statistics.
    pub high_watermark: i64,
    /// This process's last accepted commit of it was a release (revoke, stop), not a
    /// periodic one.
    pub released: bool,
    /// The acknowledged offsets above `committed` that its metadata carries (empty when
    /// none, or the broker refused them).
    pub committed_acked: Vec<(i64, i64)>,
}

impl Owned {
    /// What to commit, if the acknowledged offset moved past the committed one; on a
    /// release (`releasing`), also the same offset again when this process's last commit
    /// of it was periodic, so that the metadata says it was released (the next owner then
    /// knows it redelivers nothing).
    fn to_commit(&self, tp: &TopicPartition, releasing: bool) -> Option<CommitOffset> {
        let acked = self.worker.shared.committable()?;
        let acked = self.cap.map_or(acked, |cap| acked.min(cap));
        // After a reset to before the committed offset (it was out of range), that
        // offset is no baseline: what was acknowledged since is what must be committed.
        let first = self.worker.shared.first_offset();
        let reset_back = matches!((first, self.assigned_at), (Some(f), Some(a)) if f < a);
        let baseline = if reset_back && self.committed == self.assigned_at {
            None
        } else {
            self.committed
        };
        let mark = releasing && !self.released && self.committed == Some(acked);
        // Offsets acknowledged above it (concurrent ordering), for the metadata; none
        // when capped: the cap is a message that could not be accounted for.
        let above: Vec<(i64, i64)> = match self.cap {
            Some(_) => Vec::new(),
            None => self
                .worker
                .shared
                .acked_above()
                .into_iter()
                .filter_map(|(a, b)| Some((a.max(acked.checked_add(1)?), b)))
                .filter(|(a, b)| a <= b)
                .collect(),
        };
        // The same offset again when only the ranges grew: a slow message holding the
        // offset back must not leave everything acknowledged after it to a crash.
        let more_acked = self.committed == Some(acked) && above != self.committed_acked;
        // The highest offset processed, as far as the metadata goes: ranges inherited
        // from the previous owner may reach above what this one processed.
        let processed = self
            .worker
            .shared
            .highest_acked()
            .max(above.last().map(|r| r.1));
        (mark || more_acked || baseline.is_none_or(|c| acked > c)).then(|| CommitOffset {
            tp: tp.clone(),
            offset: acked,
            processed,
            acked: above,
        })
    }

    /// The next offset this partition will process: the acknowledged one, else where
    /// it resumed.
    fn next_to_process(&self) -> Option<i64> {
        self.worker.shared.committable().or(self.committed)
    }
}

/// The partitions this process owns.
#[derive(Default)]
pub struct Group {
    pub owned: BTreeMap<TopicPartition, Owned>,
    /// Counts of workers that ended during the current metrics interval.
    retired: Interval,
    /// Workers released with their partition that had not ended (aborted while their
    /// processor would not return): if the partition comes back, its next worker waits
    /// for them ([`worker::Predecessor`]).
    lingering: HashMap<TopicPartition, Arc<worker::WorkerShared>>,
    /// Set while this process may no longer be a member (src/consumer/membership.rs):
    /// its partitions are held.
    pub doubt: Option<membership::Doubt>,
}

impl Group {
    /// Acknowledged offsets not yet committed, for `only` (all owned if `None`).
    pub fn uncommitted(&self, only: Option<&[TopicPartition]>) -> Vec<CommitOffset> {
        self.pending(only, false)
    }

    /// What releasing `only` commits: [`Group::uncommitted`], and the offsets last
    /// committed periodically again, as released.
    pub fn to_release(&self, only: &[TopicPartition]) -> Vec<CommitOffset> {
        self.pending(Some(only), true)
    }

    /// What a commit that proves the membership sends: per owned partition, what is
    /// acknowledged and not committed, else the offset committed already (with the
    /// ranges it carries); none for a partition with neither.
    pub fn confirming(&self) -> Vec<CommitOffset> {
        self.owned
            .iter()
            .filter_map(|(tp, p)| {
                p.to_commit(tp, false).or_else(|| {
                    Some(CommitOffset {
                        tp: tp.clone(),
                        offset: p.committed?,
                        processed: p.worker.shared.highest_acked(),
                        acked: p.committed_acked.clone(),
                    })
                })
            })
            .collect()
    }

    fn pending(&self, only: Option<&[TopicPartition]>, releasing: bool) -> Vec<CommitOffset> {
        self.owned
            .iter()
            .filter(|(tp, _)| only.is_none_or(|o| o.contains(tp)))
            .filter_map(|(tp, p)| p.to_commit(tp, releasing))
            .collect()
    }
}

impl membership::Members for Group {
    fn doubt_slot(&mut self) -> &mut Option<membership::Doubt> {
        &mut self.doubt
    }

    fn owns_nothing(&self) -> bool {
        self.owned.is_empty()
    }

    fn owned_partitions(&self) -> Vec<&TopicPartition> {
        self.owned.keys().collect()
    }

    fn hold_owned(&self, hold: bool) {
        for p in self.owned.values() {
            if hold {
                p.worker.shared.hold.hold();
            } else {
                p.worker.shared.hold.lift();
            }
        }
    }

    fn confirming(&self) -> Vec<CommitOffset> {
        Group::confirming(self)
    }
}

impl CommitLedger for Group {
    fn watch_stalls(group: Weak<Mutex<Group>>) -> std::io::Result<()> {
        membership::watch_stalls(group)
    }

    fn confirmation_due(&mut self) -> Option<Vec<CommitOffset>> {
        membership::confirmation_due(self)
    }

    fn accepted(&mut self, c: &CommitOffset, released: bool, with_ranges: bool) {
        if let Some(p) = self.owned.get_mut(&c.tp) {
            p.committed = Some(c.offset);
            p.released = released;
            p.committed_acked = if with_ranges {
                c.acked.clone()
            } else {
                Vec::new()
            };
        }
    }

    fn confirmed_by_commit(&mut self, sent_at: Instant) {
        membership::confirmed_by_commit(self, sent_at);
    }

    fn doubted(&mut self, error: &KafkaError) {
        membership::doubt(self, membership::Cause::Refused(error));
    }
}

/// The rdkafka context: owns the group state and reacts to rebalances.
pub struct GroupContext<P: Processor> {
    /// Set right after the consumer is created; partitions' queues need the `Arc`.
    pub consumer: OnceLock<Weak<AckdConsumer<P>>>,
    /// Set right after the consumer is created, too: it sends every commit.
    pub committer: OnceLock<Committer>,
    pub commit_metrics: Arc<CommitMetrics>,
    pub group: Arc<Mutex<Group>>,
    pub runtime: tokio::runtime::Handle,
    pub worker: WorkerConfig<P>,
    pub drain_timeout: Duration,
    pub start_from: StartFrom,
    /// `source=` of process-wide metric lines.
    pub source: String,
    pub metrics_interval: Duration,
    /// Set once the last summary is written: statistics during the close write none.
    pub summaries_done: AtomicBool,
    /// Authentication failures seen by [`ClientContext::error`]; fatal (src/consumer/auth.rs).
    pub auth: crate::consumer::auth::AuthFailures,
    /// Whether the brokers are reachable, as far as librdkafka's errors tell.
    pub connectivity: Connectivity,
    /// Set when the shutdown begins: partitions assigned after that get no worker.
    pub stopping: AtomicBool,
    /// What the health endpoint reports (kept current even when it is off: it is cheap).
    pub health: Arc<Health>,
    /// Set when, while stopping, a revoke released partitions with acknowledged offsets
    /// it could not commit (lost, refused, or a drain past its deadline): the stop is
    /// then incomplete, as if the final commit had failed.
    pub released_incomplete: AtomicBool,
    /// `ACKD_MEMORY_MB`: the prefetch budget, logged with each assignment change.
    pub memory: Option<crate::consumer::memory::Budget>,
    /// The graceful stop's clock, set by the daemon on the signal (see [`StopClock`]).
    pub stop_clock: Arc<StopClock>,
    /// Set once a revoke cut short by the stop has told every worker to stop.
    pub workers_stopped: AtomicBool,
}

/// The graceful stop's clock: unset until the stop begins, then its deadline and the
/// points its steps must end by. The daemon starts it on the signal, before anything
/// else. The supervisor reads the shutdown watch only between polls, and a revoke runs
/// inside a poll: a revoke under way reads this clock while it waits, so that it cannot
/// eat the time of the final commit of the partitions it does not release.
#[derive(Default)]
pub struct StopClock(Mutex<Option<StopTimes>>);

/// When each step of a graceful stop must be over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopTimes {
    /// When the process must have committed (it exits then at the latest).
    pub deadline: Instant,
    /// When draining in-flight messages must end: the deadline less
    /// [`crate::config::settings::commit_reserve`], kept for the commits and the close.
    pub drain_until: Instant,
    /// When a revoke's commit under way at the stop must end: half the reserve is left
    /// for the final commit of the other partitions.
    pub revoke_commit_until: Instant,
}

impl StopClock {
    /// Starts the clock for a stop that began at `begun` and must end by `deadline`;
    /// the first call wins. Returns the clock's times.
    pub fn begin(&self, begun: Instant, deadline: Instant) -> StopTimes {
        let mut times = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *times.get_or_insert_with(|| {
            let reserve =
                crate::config::settings::commit_reserve(deadline.saturating_duration_since(begun));
            StopTimes {
                deadline,
                drain_until: deadline - reserve,
                revoke_commit_until: deadline - reserve / 2,
            }
        })
    }

    /// The stop's times, once it began.
    pub fn times(&self) -> Option<StopTimes> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How often a wait that a stop may cut short looks at the [`StopClock`].
const STOP_CHECK: Duration = Duration::from_millis(50);

/// Sleeps until `until`, or until `deadline()` (which a stop may bring forward) if sooner.
fn sleep_until(until: Instant, deadline: &dyn Fn() -> Instant) {
    loop {
        let now = Instant::now();
        let end = until.min(deadline());
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(STOP_CHECK));
    }
}

/// Waits until the worker of `s` has returned, or `deadline()` (which a stop may bring
/// forward) passed. True if it returned.
fn wait_done_by(s: &worker::WorkerShared, deadline: &dyn Fn() -> Instant) -> bool {
    loop {
        let now = Instant::now();
        let end = deadline();
        if now >= end {
            return s.is_done();
        }
        if s.wait_done(end.min(now + STOP_CHECK)) {
            return true;
        }
    }
}

/// How often a broker outage is reported again while it lasts.
const UNREACHABLE_REPEAT: Duration = Duration::from_secs(30);

/// Broker reachability as the log shows it. librdkafka reports every failed reconnect
/// (tens per second while no broker listens); the log gets one `at=brokers_unreachable`
/// line when all brokers are down, a reminder every [`UNREACHABLE_REPEAT`] while they
/// stay down (with the count of suppressed reports), and `at=brokers_reachable` once a
/// broker answers again. The suppressed reports are still there at debug level.
#[derive(Default)]
pub struct Connectivity(Mutex<Outage>);

#[derive(Default)]
struct Outage {
    /// When the current outage began; `None` while the brokers are reachable.
    since: Option<Instant>,
    last_report: Option<Instant>,
    suppressed: u64,
}

/// librdkafka errors that mean "cannot reach a broker" (it retries them by itself).
fn is_unreachable(code: Option<RDKafkaErrorCode>) -> bool {
    matches!(
        code,
        Some(
            RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::Resolve
        )
    )
}

impl Connectivity {
    fn lock(&self) -> MutexGuard<'_, Outage> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reports a librdkafka error (from the error callback, or the consumer's queue) if
    /// it is about reaching brokers; returns false, logging nothing, for other errors.
    pub fn error(&self, error: &KafkaError, reason: Option<&str>) -> bool {
        let code = error.rdkafka_error_code();
        if !is_unreachable(code) {
            return false;
        }
        let now = Instant::now();
        let mut outage = self.lock();
        let Some(since) = outage.since else {
            if code == Some(RDKafkaErrorCode::AllBrokersDown) {
                *outage = Outage {
                    since: Some(now),
                    last_report: Some(now),
                    suppressed: 0,
                };
                tracing::error!(
                    at = "brokers_unreachable",
                    error = %error,
                    reason,
                    "no broker can be reached; librdkafka keeps reconnecting. Acknowledged offsets are kept and committed once a broker is back, unless the outage outlasts session.timeout.ms: then the partitions are given up uncommitted (lost=true) and those messages are redelivered"
                );
            } else {
                // One broker's connection failed or closed; others may be fine.
                tracing::warn!(at = "kafka_error", error = %error, reason);
            }
            return true;
        };
        if outage
            .last_report
            .is_none_or(|r| now.duration_since(r) >= UNREACHABLE_REPEAT)
        {
            let suppressed = std::mem::take(&mut outage.suppressed);
            outage.last_report = Some(now);
            tracing::error!(
                at = "brokers_unreachable",
                down_ms = now.duration_since(since).as_millis() as u64,
                suppressed,
                error = %error,
                reason,
                "still no broker reachable; retrying"
            );
        } else {
            outage.suppressed += 1;
            tracing::debug!(at = "kafka_error", error = %error, reason, "suppressed while the brokers are unreachable");
        }
        true
    }

    /// A broker answered (an assignment, or statistics showing a broker up).
    pub fn reachable(&self) {
        let mut outage = self.lock();
        if let Some(since) = outage.since {
            tracing::info!(
                at = "brokers_reachable",
                down_ms = since.elapsed().as_millis() as u64,
                suppressed = outage.suppressed,
                "a broker answers again"
            );
            *outage = Outage::default();
        }
    }
}

impl<P: Processor> GroupContext<P> {
    pub fn lock(&self) -> MutexGuard<'_, Group> {
        self.group.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the summary of the interval that ends now, and each partition's lag.
    pub fn summarize(&self, last: bool) {
        if self.summaries_done.load(Ordering::Acquire) {
            return;
        }
        if last {
            self.summaries_done.store(true, Ordering::Release);
        }
        let mut group = self.lock();
        let mut interval = std::mem::take(&mut group.retired);
        let mut in_flight = 0;
        let mut waiting = None;
        let mut lag_total = None;
        let mut lags = Vec::new();
        let mut halted = Vec::new();
        for (tp, p) in &group.owned {
            p.worker.shared.metrics.take_into(&mut interval);
            if let Some(offset) = p.worker.shared.halted_at() {
                halted.push((tp.clone(), offset));
            }
            in_flight += p.worker.shared.in_flight_count();
            if let Some(w) = p.worker.shared.waiting() {
                *waiting.get_or_insert(0) += w;
            }
            if let Some(lag) = metrics::lag(p.high_watermark, p.next_to_process()) {
                *lag_total.get_or_insert(0) += lag;
                lags.push((tp.clone(), lag));
            }
        }
        let partitions = group.owned.len();
        drop(group);
        metrics::emit_summary(
            &mut interval,
            &self.commit_metrics,
            &self.source,
            self.metrics_interval.as_millis() as u64,
            partitions,
            metrics::InFlight {
                calls: in_flight,
                waiting,
            },
            halted.len(),
            lag_total,
            last,
        );
        // Repeated every interval: a stopped partition must not look like a quiet one.
        for ((topic, partition), offset) in halted {
            tracing::error!(
                at = "halted",
                topic = &*topic,
                partition,
                offset,
                "partition stopped on a processor failure; nothing past this offset is processed or committed"
            );
        }
        for ((topic, partition), lag) in &lags {
            metrics::emit_lag(topic, *partition, *lag, &self.source);
        }
        self.health.set_lags(lags);
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
        // A partition's end (ACKD_STOP_AT_END) reaches its worker too, which says so; after
        // an authentication failure, unreachable brokers are its consequence, not news.
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::PartitionEOF) || self.auth.failed()
        {
            tracing::debug!(at = "kafka_error", error = %error, reason);
            return;
        }
        if !self.connectivity.error(&error, Some(reason)) {
            tracing::error!(at = "kafka_error", error = %error, reason);
        }
    }

    /// librdkafka's statistics arrive every `ACKD_METRICS_INTERVAL_MS`: they carry the
    /// high watermarks of fetch responses (lag), and they pace the summary.
    fn stats(&self, statistics: Statistics) {
        let _busy = self.health.busy(Busy::Statistics);
        if statistics.brokers.values().any(|b| b.state == "UP") {
            self.connectivity.reachable();
        }
        {
            let mut group = self.lock();
            for (topic, t) in &statistics.topics {
                for (partition, p) in &t.partitions {
                    if let Some(owned) = group
                        .owned
                        .get_mut(&(Arc::from(topic.as_str()), *partition))
                    {
                        owned.high_watermark = p.hi_offset;
                    }
                }
            }
        }
        self.summarize(false);
    }
}

impl<P: Processor> ConsumerContext for GroupContext<P> {
    fn pre_rebalance(&self, base: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let _busy = self.health.busy(Busy::Assign);
                self.assign(base, tpl);
                self.health.joined();
            }
            Rebalance::Revoke(tpl) => {
                let _busy = self.health.busy(Busy::Revoke);
                self.revoke(base, tpl)
            }
            Rebalance::Error(e) => tracing::error!(at = "rebalance_error", error = %e),
        }
        // What the prefetch may hold now (ACKD_MEMORY_MB), once the owned set changed.
        if let (Some(budget), Rebalance::Assign(_) | Rebalance::Revoke(_)) =
            (&self.memory, rebalance)
        {
            if !self.stopping.load(Ordering::Acquire) {
                budget.log(Some(self.lock().owned.len()));
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
        self.connectivity.reachable();
        if self.stopping.load(Ordering::Acquire) {
            // The shutdown serves a rebalance to commit; what it gets now it will not
            // process (its acks could not be committed by a consumer that is closing).
            for e in tpl.elements() {
                tracing::info!(
                    at = "assign_ignored",
                    topic = e.topic(),
                    partition = e.partition(),
                    "stopping: not processed here; the next owner starts at the committed offset"
                );
            }
            return;
        }
        // Where each partition resumes: the group's committed offset, else the policy.
        let committed = base
            .committed_offsets(tpl.clone(), Duration::from_secs(10))
            .map_err(|e| tracing::warn!(at = "committed_unknown", error = %e, "could not read committed offsets"))
            .ok();
        let mut resume: HashMap<TopicPartition, (Offset, committer::ReadMetadata)> = committed
            .iter()
            .flat_map(committer::committed_with_metadata)
            .map(|(tp, offset, read)| (tp, (offset, read)))
            .collect();
        let generation = generation(base);
        let mut group = self.lock();
        // The group assigned to this member: it is one.
        membership::confirmed(&mut *group, "rebalance");
        for e in tpl.elements() {
            let tp: TopicPartition = (Arc::from(e.topic()), e.partition());
            let (topic, partition) = (&*tp.0, tp.1);
            let mut acked_above = Vec::new();
            let committed_offset = match resume.remove(&tp) {
                Some((Offset::Offset(o), read)) => {
                    acked_above = resume_from_commit(topic, partition, o, &read, generation);
                    Some(o)
                }
                Some(_) => {
                    tracing::info!(
                        at = "assigned",
                        topic,
                        partition,
                        from = self.start_from.as_str(),
                        generation,
                        "no committed offset: the start policy applies"
                    );
                    None
                }
                None => {
                    tracing::info!(
                        at = "assigned",
                        topic,
                        partition,
                        from = "unknown",
                        generation
                    );
                    None
                }
            };
            // Assigned twice without a revoke in between: the old worker's acks belong to
            // a finished assignment and are dropped with it.
            if let Some(old) = group.owned.remove(&tp) {
                old.worker.stop();
                old.worker.abort();
                group
                    .lingering
                    .insert(tp.clone(), old.worker.shared.clone());
            }
            // A previous worker of this partition that has not ended still holds a
            // handle on its queue: the new one must not read it before that is gone.
            let predecessor = group
                .lingering
                .remove(&tp)
                .filter(|s| !s.is_done())
                .map(|shared| {
                    let (consumer, topic) = (Arc::downgrade(&consumer), tp.0.clone());
                    worker::Predecessor {
                        shared,
                        resplit: Box::new(move || {
                            consumer.upgrade()?.split_partition_queue(&topic, partition)
                        }),
                    }
                });
            let Some(queue) = consumer.split_partition_queue(topic, partition) else {
                tracing::error!(
                    at = "assign_error",
                    topic,
                    partition,
                    "librdkafka gave no queue for this partition"
                );
                continue;
            };
            let acked_above_inherited = acked_above.clone();
            let worker = worker::spawn(
                &self.runtime,
                queue,
                tp.0.clone(),
                partition,
                worker::Resume {
                    committed: committed_offset,
                    acked: acked_above,
                },
                self.worker.clone(),
                predecessor,
            );
            if let Some(c) = self.committer.get() {
                c.acquire(&tp);
            }
            self.health.assigned(tp.clone(), worker.shared.clone());
            group.owned.insert(
                tp,
                Owned {
                    worker,
                    committed: committed_offset,
                    assigned_at: committed_offset,
                    cap: None,
                    high_watermark: -1,
                    released: false,
                    // What the committed metadata names: a commit that names fewer
                    // (with the same offset) is one to make.
                    committed_acked: acked_above_inherited,
                },
            );
        }
    }

    /// librdkafka's revoke, inside a poll of the supervisor's thread: the rebalance goes
    /// on when this returns. See [`GroupContext::release`] for the steps.
    fn revoke(&self, base: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        // After a fatal error (fenced) librdkafka unassigns everything: nothing of it is
        // ours to commit any more, however the revoke is flagged.
        let lost = base.assignment_lost() || base.client().fatal_error().is_some();
        let tps: Vec<TopicPartition> = tpl
            .elements()
            .iter()
            .map(|e| (Arc::from(e.topic()), e.partition()))
            .collect();
        let generation = generation(base);
        let started = Instant::now();
        // A revoke that is not lost comes from the group: this process is a member.
        if !lost {
            membership::confirmed(&mut *self.lock(), "rebalance");
        }
        // The supervisor is blocked from here until the revoke returns: say so. (The
        // close's final revoke, after the stop released everything, has nothing to do.)
        let owned: Vec<String> = {
            let group = self.lock();
            tps.iter()
                .filter(|tp| group.owned.contains_key(*tp))
                .map(|(t, p)| format!("{t}/{p}"))
                .collect()
        };
        if !owned.is_empty() {
            tracing::info!(
                at = "revoke_begun",
                partitions = owned.len(),
                lost,
                generation,
                revoking = owned.join(",")
            );
        }
        // A stop that begins meanwhile brings both deadlines forward (issue 13.5): the
        // partitions not revoked still need their final commit before its deadline.
        let drain_until = started + self.drain_timeout;
        let commit_until = drain_until + COMMIT_BUDGET;
        let outcome = self.release(
            &tps,
            Deadlines {
                drain: &|| self.cut_short(drain_until, |t| t.drain_until),
                commit: &|| self.cut_short(commit_until, |t| t.revoke_commit_until),
            },
            (!lost).then_some(Commit {
                reason: Reason::Revoke,
                retry: CommitRetry::Wait,
            }),
        );
        if lost {
            membership::ended(&mut *self.lock());
        }
        let duration_ms = crate::clock::millis(started.elapsed());
        let stopping = self.stopping.load(Ordering::Acquire) || self.stop_clock.times().is_some();
        if stopping && (!outcome.complete || outcome.left_uncommitted().next().is_some()) {
            self.released_incomplete.store(true, Ordering::Release);
        }
        for (tp, offset) in outcome.committed() {
            tracing::info!(
                at = "revoked",
                topic = &*tp.0,
                partition = tp.1,
                offset,
                lost,
                generation,
                duration_ms
            );
        }
        for tp in outcome.without_commit() {
            tracing::info!(
                at = "revoked",
                topic = &*tp.0,
                partition = tp.1,
                lost,
                generation,
                duration_ms
            );
        }
    }

    /// The graceful stop's release of every partition still owned (`tps`): drain until
    /// the clock's drain share, then commit (`commit`: unless the stop is one that must
    /// not commit) until its deadline, serving the group with `serve` while a commit is
    /// refused for a rebalance in progress.
    ///
    /// **A revoke while the shutdown serves the group** runs inside `serve` and releases
    /// some of these very partitions itself (commits them under the new generation, logs
    /// `at=revoked`, sets `released_incomplete` if it could not). The shutdown's commit
    /// then goes on with what it still owns, and its outcome leaves those out.
    pub fn shutdown(
        &self,
        tps: &[TopicPartition],
        times: StopTimes,
        commit: bool,
        serve: &dyn Fn(Instant),
    ) -> Outcome {
        self.release(
            tps,
            Deadlines {
                drain: &|| times.drain_until,
                commit: &|| times.deadline,
            },
            commit.then_some(Commit {
                reason: Reason::Shutdown,
                retry: CommitRetry::Serve(serve),
            }),
        )
    }

    /// `own`, or the stop's time for this step (`pick`) if a stop began and it is sooner.
    /// Once a stop began, every worker is told to stop, too: the stop stops fetching at
    /// the signal, even while the supervisor's thread is held by a revoke.
    fn cut_short(&self, own: Instant, pick: fn(&StopTimes) -> Instant) -> Instant {
        let Some(times) = self.stop_clock.times() else {
            return own;
        };
        if !self.workers_stopped.swap(true, Ordering::AcqRel) {
            for p in self.lock().owned.values() {
                p.worker.stop();
            }
        }
        own.min(pick(&times))
    }

    /// Releases `tps`, for a revoke or the shutdown: one drain, one rule, in four steps.
    /// 1. [`GroupContext::drain`]: stop the workers, wait for their in-flight messages
    ///    until `deadlines.drain`.
    /// 2. Commit what they acknowledged until `deadlines.commit`
    ///    ([`GroupContext::commit_owned`]); nothing for a lost assignment
    ///    (`commit: None`) or a consumer librdkafka declared dead (fenced).
    /// 3. [`GroupContext::forget`]: no commit for them is sent after this; drop them from
    ///    the group, abort their workers.
    /// 4. Say per partition what happened ([`Outcome`]).
    fn release(
        &self,
        tps: &[TopicPartition],
        deadlines: Deadlines<'_>,
        commit: Option<Commit<'_>>,
    ) -> Outcome {
        let drained = self.drain(tps, deadlines.drain);
        // A consumer librdkafka declared dead (fenced, e.g. while it drained) commits
        // nothing: its partitions are another process's now.
        let mut fatal = self.fatal_error().is_some();
        let commit = commit.filter(|_| !fatal);
        let committing = commit.is_some();
        let (pending, commit_ok) = match commit {
            None => (self.lock().uncommitted(Some(tps)), true),
            Some(c) => self.commit_owned(tps, c.reason, deadlines.commit, c.retry),
        };
        // Fenced while committing: the commit is refused for good, however it was.
        fatal |= !commit_ok && self.fatal_error().is_some();
        let removed = self.forget(tps, deadlines.commit);
        let partitions = removed
            .into_iter()
            .map(|(tp, p)| {
                if !committing || fatal {
                    // Nothing committed by this release; what was acknowledged is left.
                    let left = pending.iter().find(|c| c.tp == tp).cloned();
                    return (
                        tp,
                        Released {
                            committed: None,
                            left,
                        },
                    );
                }
                // Per partition: the committer sets `committed` only where the broker
                // accepted, so a partition whose offset it holds is committed.
                let left = pending
                    .iter()
                    .find(|c| c.tp == tp && p.committed != Some(c.offset))
                    .cloned();
                (
                    tp,
                    Released {
                        committed: p.committed,
                        left,
                    },
                )
            })
            .collect();
        Outcome {
            partitions,
            complete: drained && commit_ok,
            fatal,
        }
    }

    /// Step 1 of a release: stops the workers of `tps` and waits until they returned or
    /// `deadline()` passed (a stop may bring it forward). True if all returned; each
    /// one that did not is logged `at=drain_timeout`.
    fn drain(&self, tps: &[TopicPartition], deadline: &dyn Fn() -> Instant) -> bool {
        // Wait without holding the lock: the committer needs it meanwhile.
        let shared: Vec<(TopicPartition, Arc<worker::WorkerShared>)> = {
            let group = self.lock();
            tps.iter()
                .filter_map(|tp| group.owned.get(tp).map(|p| (tp.clone(), p)))
                .map(|(tp, p)| {
                    p.worker.stop();
                    (tp, p.worker.shared.clone())
                })
                .collect()
        };
        let mut all = true;
        for (tp, s) in &shared {
            if !wait_done_by(s, deadline) {
                all = false;
                tracing::error!(
                    at = "drain_timeout",
                    topic = &*tp.0,
                    partition = tp.1,
                    in_flight_offset = s.in_flight(),
                    "in-flight message did not finish before the deadline; it is not committed and will be redelivered"
                );
            }
        }
        all
    }

    /// Step 3 of a release: after the commit, `tps` are no longer ours. Returns those
    /// that were still owned (a revoke served during the shutdown's commit may have
    /// released some already).
    fn forget(
        &self,
        tps: &[TopicPartition],
        deadline: &dyn Fn() -> Instant,
    ) -> Vec<(TopicPartition, Owned)> {
        // From here no commit for these partitions is sent (src/consumer/committer.rs):
        // one that timed out but is still queued is dropped, one inside librdkafka is
        // waited for.
        if let Some(c) = self.committer.get() {
            c.release(tps);
        }
        let removed: Vec<(TopicPartition, Owned)> = {
            let mut group = self.lock();
            let removed: Vec<(TopicPartition, Owned)> = tps
                .iter()
                .filter_map(|tp| group.owned.remove(tp).map(|p| (tp.clone(), p)))
                .collect();
            for (tp, p) in &removed {
                p.worker.shared.metrics.take_into(&mut group.retired);
                self.health.released(tp);
            }
            removed
        };
        for (_, p) in &removed {
            p.worker.abort();
        }
        // An aborted worker lets go of its queue at its next await; wait for that, so no
        // queue outlives the partition (or keeps the consumer alive past its close); not
        // past the commit's deadline, which a stop may have brought forward.
        let grace = (Instant::now() + Duration::from_secs(1)).min(deadline());
        for (tp, p) in &removed {
            if !p.worker.shared.wait_done(grace) {
                tracing::error!(
                    at = "worker_stuck",
                    topic = &*tp.0,
                    partition = tp.1,
                    "worker did not end after abort (its processor does not return); if the partition comes back, it is not read until this worker ends"
                );
                self.lock()
                    .lingering
                    .insert(tp.clone(), p.worker.shared.clone());
            }
        }
        removed
    }

    /// librdkafka's fatal error, once it declared the consumer dead (for a consumer, the
    /// one fatal error is FENCED_INSTANCE_ID).
    pub fn fatal_error(&self) -> Option<(RDKafkaErrorCode, String)> {
        let consumer = self.consumer.get().and_then(Weak::upgrade)?;
        consumer.client().fatal_error()
    }

    /// Step 2 of a release: commits what the partitions of `tps` that are still owned
    /// acknowledged, until `deadline()`. Returns the last offsets tried and whether they
    /// are committed.
    ///
    /// A commit refused because a rebalance is under way ([`Refusal::Rebalancing`]) can
    /// succeed once the rebalance is over (Kafka's advice: serve the group, then commit
    /// again). With [`CommitRetry::Serve`] (the shutdown, which owns the poll loop) that
    /// is what happens: the partitions stay owned meanwhile, so a revoke that arrives
    /// while serving commits them itself, under the new generation. A commit refused for a
    /// stale member epoch ([`Refusal::StaleEpoch`]) or while the coordinator moves
    /// ([`Refusal::CoordinatorMoving`]) is sent again either way: librdkafka's own thread
    /// fetches the epoch or finds the coordinator.
    fn commit_owned(
        &self,
        tps: &[TopicPartition],
        reason: Reason,
        deadline: &dyn Fn() -> Instant,
        retry: CommitRetry<'_>,
    ) -> (Vec<CommitOffset>, bool) {
        let Some(committer) = self.committer.get() else {
            let pending = self.lock().to_release(tps);
            let ok = pending.is_empty();
            return (pending, ok);
        };
        let mut wait = match retry {
            CommitRetry::Serve(_) => REBALANCE_WAIT_FIRST,
            CommitRetry::Wait => REVOKE_WAIT_FIRST,
        };
        loop {
            // Recomputed each time: a revoke served meanwhile commits and forgets its own.
            let pending = self.lock().to_release(tps);
            let error = match committer.commit(pending.clone(), reason, deadline) {
                Ok(()) => return (pending, true),
                Err(e) => e,
            };
            let until = Instant::now() + wait;
            let refusal = match &error {
                committer::CommitError::Refused(e) => Refusal::of(e),
                _ => Refusal::Final,
            };
            match (refusal, retry) {
                (Refusal::Rebalancing, CommitRetry::Serve(serve)) if until < deadline() => {
                    tracing::warn!(
                        at = "commit_retry",
                        reason = reason.as_str(),
                        partitions = pending.len(),
                        wait_ms = wait.as_millis() as u64,
                        error = %error,
                        "commit refused while the group rebalances: serving the rebalance, then committing again"
                    );
                    serve(until);
                }
                (Refusal::StaleEpoch, retry) if until < deadline() => {
                    tracing::warn!(
                        at = "commit_retry",
                        reason = reason.as_str(),
                        partitions = pending.len(),
                        wait_ms = wait.as_millis() as u64,
                        error = %error,
                        "commit refused for a stale member epoch: the partitions are still ours; committing again once librdkafka's heartbeat has the current epoch"
                    );
                    // librdkafka heartbeats on its own thread (it hastens the next one on
                    // this error): a revoke, which runs inside the rebalance callback, can
                    // wait for it; the shutdown serves the group meanwhile.
                    match retry {
                        CommitRetry::Serve(serve) => serve(until),
                        CommitRetry::Wait => sleep_until(until, deadline),
                    }
                }
                // librdkafka finds the new coordinator on its own thread: waiting is enough,
                // so a revoke (which cannot serve the group) retries too.
                (Refusal::CoordinatorMoving, retry) if until < deadline() => {
                    tracing::warn!(
                        at = "commit_retry",
                        reason = reason.as_str(),
                        partitions = pending.len(),
                        wait_ms = wait.as_millis() as u64,
                        error = %error,
                        "commit refused while the group's coordinator moves or loads: committing again"
                    );
                    match retry {
                        CommitRetry::Serve(serve) => serve(until),
                        CommitRetry::Wait => sleep_until(until, deadline),
                    }
                }
                _ => {
                    if refusal == Refusal::MemberGone {
                        tracing::error!(
                            at = "member_gone",
                            reason = reason.as_str(),
                            partitions = pending.len(),
                            error = %error,
                            "the broker no longer counts this process a member of the group: its partitions may already be another's, so the commit is not retried; their next owner redelivers from the last committed offset"
                        );
                    }
                    // The committer logged a refusal (or a drop) per partition; the rest is
                    // ours to say.
                    if !matches!(
                        error,
                        committer::CommitError::Refused(_) | committer::CommitError::NotSent
                    ) {
                        for c in &pending {
                            tracing::error!(at = "commit_failed", topic = &*c.tp.0, partition = c.tp.1, offset = c.offset, error = %error,
                                "not committed; messages from the last committed offset will be redelivered");
                        }
                    }
                    return (pending, false);
                }
            }
            wait = (wait * 2).min(REBALANCE_WAIT_MAX);
        }
    }
}

/// The `at=assigned` line of a partition resuming at its committed offset `o`, and the
/// offsets above it its previous owner acknowledged (concurrent ordering), to skip:
/// only when the metadata is this ackd's, written beside `o` itself. Otherwise nothing
/// is skipped, and `metadata=` says why.
fn resume_from_commit(
    topic: &str,
    partition: i32,
    o: i64,
    read: &committer::ReadMetadata,
    generation: Option<i32>,
) -> Vec<(i64, i64)> {
    let previous = read.previous.as_ref();
    let acked_above = previous.map_or_else(Vec::new, |p| p.acked_above(o));
    let skipped = crate::consumer::acked_ranges::count(&acked_above);
    // Redelivery is visible: a previous owner that released the partition had processed
    // through `processed` and nothing after, so exactly the offsets from the resume
    // offset to it come again, but those it acknowledged above its commit. One that did
    // not release it (crashed, fenced, lost it) may have processed on after its last
    // commit, which left no trace: how much comes again is not known (the crash bound
    // in the README bounds it); nor is it when ackd's metadata does not describe `o`.
    let redelivery = match previous {
        Some(p) if p.released => Some(
            p.redelivery(o, skipped)
                .map_or_else(|| "unknown".to_string(), |n| n.to_string()),
        ),
        Some(_) => Some("unknown".to_string()),
        None => untrusted_metadata(read.state).map(|_| "unknown".to_string()),
    };
    tracing::info!(
        at = "assigned",
        topic,
        partition,
        offset = o,
        from = "committed",
        generation,
        metadata = read.state.as_str(),
        highest_processed = previous.map(|p| p.processed),
        released = previous.map(|p| p.released),
        redelivery = redelivery.as_deref(),
        acked_above = (skipped > 0).then_some(skipped)
    );
    if let Some(why) = untrusted_metadata(read.state) {
        tracing::warn!(
            at = "commit_metadata_ignored",
            topic,
            partition,
            offset = o,
            metadata = read.state.as_str(),
            "{why}: no offset above the committed one is skipped (messages the previous owner acknowledged above it may come again)"
        );
    }
    acked_above
}

/// Why ackd's metadata beside a committed offset is not trusted (`None`: it is, or it
/// is not ackd's at all).
fn untrusted_metadata(state: committer::MetadataState) -> Option<&'static str> {
    use committer::MetadataState::*;
    match state {
        Stale => Some("ackd's metadata was written beside another offset (copied or moved by a tool: MirrorMaker 2's offset sync, kafka-consumer-groups, an admin client)"),
        OldFormat => Some("the metadata is an older ackd's format, which does not say which offset it was written beside"),
        NewerFormat => Some("the metadata is a later ackd's format"),
        Absent | Current | Foreign => None,
    }
}

/// The group generation this member is in, as librdkafka knows it: in an assignment the
/// one that made it, in an eager revoke the one being left. On `assigned`/`revoked`
/// lines, so that who owned a partition when can be read across processes' logs.
fn generation<C: ConsumerContext>(base: &BaseConsumer<C>) -> Option<i32> {
    // SAFETY: rd_kafka_consumer_group_metadata returns a copy the caller owns (or null
    // when the consumer is in no group), destroyed right after reading it.
    unsafe {
        let metadata = rdsys::rd_kafka_consumer_group_metadata(base.client().native_ptr());
        if metadata.is_null() {
            return None;
        }
        let generation = rdsys::rd_kafka_consumer_group_metadata_generation_id(metadata);
        rdsys::rd_kafka_consumer_group_metadata_destroy(metadata);
        (generation >= 0).then_some(generation)
    }
}

/// What a refused commit means for trying it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// The classic protocol's "a rebalance is in progress" (ILLEGAL_GENERATION,
    /// REBALANCE_IN_PROGRESS): once it completes, a member that still owns the
    /// partitions can commit them under the new generation (KIP-429; the Java client
    /// calls these retriable: "complete the rebalance by calling poll() and then retry").
    /// Only the shutdown, which owns the poll loop, can complete it.
    Rebalancing,
    /// The consumer protocol's STALE_MEMBER_EPOCH: the member's epoch moved on (a new
    /// assignment) since librdkafka last heard it. The member is still in the group and
    /// the partitions still ours until we release them; librdkafka hastens a heartbeat
    /// that brings the current epoch but does not retry a manual commit itself (KIP-848;
    /// rdkafka_cgrp.c): a commit sent again after it is accepted.
    StaleEpoch,
    /// The group's coordinator moves or loads ([`coordinator_moving`]): the same commit
    /// succeeds once the new coordinator is ready, without serving the group.
    CoordinatorMoving,
    /// UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH: the broker dropped or fenced the member;
    /// its partitions may already be another's. Never retried.
    MemberGone,
    /// Anything else: not retried here (the next periodic commit tries again).
    Final,
}

impl Refusal {
    fn of(error: &KafkaError) -> Refusal {
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::IllegalGeneration | RDKafkaErrorCode::RebalanceInProgress) => {
                Refusal::Rebalancing
            }
            Some(RDKafkaErrorCode::StaleMemberEpoch) => Refusal::StaleEpoch,
            Some(RDKafkaErrorCode::UnknownMemberId | RDKafkaErrorCode::FencedMemberEpoch) => {
                Refusal::MemberGone
            }
            _ if coordinator_moving(error) => Refusal::CoordinatorMoving,
            _ => Refusal::Final,
        }
    }
}

/// Commit refusals that mean "the group's coordinator is moving to another broker or is
/// still loading the group's offsets" (a broker restarted or died). The member keeps its
/// partitions meanwhile; the same commit succeeds once the new coordinator is ready (the
/// Java client retries these within `commitSync`'s timeout). librdkafka gives them to the
/// application as they are.
fn coordinator_moving(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::CoordinatorLoadInProgress
                | RDKafkaErrorCode::CoordinatorNotAvailable
        )
    )
}

/// How long the shutdown serves a rebalance before committing again, at first and at most.
const REBALANCE_WAIT_FIRST: Duration = Duration::from_millis(250);
const REBALANCE_WAIT_MAX: Duration = Duration::from_secs(2);
/// How long a revoke waits before committing again, at first (doubling up to the
/// maximum above): the group waits for the revoke, and a follow-up rebalance that starts
/// meanwhile refuses the commit for good (REBALANCE_IN_PROGRESS), so it tries soon.
const REVOKE_WAIT_FIRST: Duration = Duration::from_millis(50);

/// How long a revoke's commit may take once the drain is done.
const COMMIT_BUDGET: Duration = Duration::from_secs(10);

/// When a release's steps must end; read at each wait, as a stop may bring them forward.
struct Deadlines<'a> {
    drain: &'a dyn Fn() -> Instant,
    commit: &'a dyn Fn() -> Instant,
}

/// A release's commit: why, and how a refusal is retried.
struct Commit<'a> {
    reason: Reason,
    retry: CommitRetry<'a>,
}

/// How a commit refused for a passing reason is tried again (see [`Refusal`]).
#[derive(Clone, Copy)]
enum CommitRetry<'a> {
    /// The shutdown owns the poll loop: it serves the group (this function, until the
    /// instant given) so that a rebalance in progress completes, then commits again.
    Serve(&'a dyn Fn(Instant)),
    /// A revoke runs inside the rebalance callback and cannot serve the group: it only
    /// waits, which is enough for a stale epoch or a moving coordinator, not for a
    /// rebalance in progress.
    Wait,
}

/// What a release did with one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// The offset the group has committed for it (by this release or before); `None`
    /// when nothing is, or when the release committed nothing (lost, fenced).
    pub committed: Option<i64>,
    /// What was acknowledged and left uncommitted: refused or not answered, or, without
    /// a commit, all that was acknowledged since the last commit.
    pub left: Option<CommitOffset>,
}

/// What a release achieved.
pub struct Outcome {
    /// Each released partition, in the order asked.
    pub partitions: Vec<(TopicPartition, Released)>,
    /// Whether every worker finished in time and every commit succeeded.
    pub complete: bool,
    /// librdkafka declared the consumer dead (fenced) before or during the commit:
    /// nothing was committed.
    pub fatal: bool,
}

impl Outcome {
    /// Partitions and the offset committed for them.
    pub fn committed(&self) -> impl Iterator<Item = (&TopicPartition, i64)> {
        self.partitions
            .iter()
            .filter_map(|(tp, r)| r.committed.map(|o| (tp, o)))
    }

    /// Partitions with nothing committed.
    pub fn without_commit(&self) -> impl Iterator<Item = &TopicPartition> {
        self.partitions
            .iter()
            .filter(|(_, r)| r.committed.is_none())
            .map(|(tp, _)| tp)
    }

    /// What was acknowledged and left uncommitted: redelivered to the next owner.
    pub fn left_uncommitted(&self) -> impl Iterator<Item = &CommitOffset> {
        self.partitions.iter().filter_map(|(_, r)| r.left.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stop_clock_keeps_its_first_start_and_a_reserve_for_the_commits() {
        let clock = StopClock::default();
        assert_eq!(clock.times(), None);
        let begun = Instant::now();
        let times = clock.begin(begun, begun + Duration::from_secs(25));
        // A fifth of 25 s is kept: the drain ends at 20 s, a revoke's commit at 22.5 s.
        assert_eq!(times.drain_until, begun + Duration::from_secs(20));
        assert_eq!(
            times.revoke_commit_until,
            begun + Duration::from_millis(22_500)
        );
        // The supervisor's own start after the daemon's changes nothing.
        let later = begun + Duration::from_secs(1);
        assert_eq!(clock.begin(later, later + Duration::from_secs(25)), times);
        assert_eq!(clock.times(), Some(times));
    }

    #[test]
    fn refused_commits_are_retried_only_where_the_member_still_owns_its_partitions() {
        use RDKafkaErrorCode as E;
        for (code, expected) in [
            (E::RebalanceInProgress, Refusal::Rebalancing),
            (E::IllegalGeneration, Refusal::Rebalancing),
            (E::StaleMemberEpoch, Refusal::StaleEpoch),
            (E::UnknownMemberId, Refusal::MemberGone),
            (E::FencedMemberEpoch, Refusal::MemberGone),
            (E::NotCoordinator, Refusal::CoordinatorMoving),
            (E::GroupAuthorizationFailed, Refusal::Final),
        ] {
            assert_eq!(
                Refusal::of(&KafkaError::ConsumerCommit(code)),
                expected,
                "{code:?}"
            );
        }
    }
}
