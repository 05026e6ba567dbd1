//! What the endpoint reports, kept current by the group and the supervisor: the
//! partitions and their workers, the phase, the supervisor's callback under way.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::output::health::now_ms;
use crate::output::metrics::{BucketCounts, CommitMetrics, Counts, Lag, PartitionMetrics};
use crate::output::TopicPartition;

use super::prometheus::{page, prometheus_name, Scrape};

/// What a supervisor callback may take beyond `ACKD_SHUTDOWN_TIMEOUT_MS`: a revoke drains
/// for that long, then commits (10 s at most) and waits 1 s for aborted workers.
pub const SUPERVISOR_MARGIN: Duration = Duration::from_secs(15);

/// Why the consumer is not ready, besides having no partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Running = 0,
    Stopping = 1,
    Fatal = 2,
}

/// What the supervisor thread is busy with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Busy {
    Assign = 1,
    Revoke = 2,
    Statistics = 3,
    /// Queuing the periodic commit (it waits for the group's lock).
    Commit = 4,
}

impl Busy {
    pub(super) fn name(v: u8) -> &'static str {
        match v {
            1 => "assign",
            2 => "revoke",
            3 => "statistics",
            4 => "commit",
            _ => "unknown",
        }
    }
}

/// Marks the supervisor busy until dropped; then it is as busy as before (a callback
/// served inside another one does not end the outer one's time).
pub struct BusyGuard<'a> {
    health: &'a Health,
    since: u64,
    what: u8,
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        let h = self.health;
        h.supervisor_busy.store(self.what, Ordering::Relaxed);
        h.supervisor_since.store(self.since, Ordering::Relaxed);
    }
}

/// What the endpoint reads of a partition's worker (the consumer's `WorkerShared`):
/// atomics the worker writes anyway.
pub trait PartitionProbe: Send + Sync {
    /// When the oldest processor call under way began, on [`now_ms`]'s clock.
    fn call_started_ms(&self) -> Option<u64>;
    /// The first offset of that call.
    fn oldest_call_offset(&self) -> Option<i64>;
    /// Messages in processor calls under way.
    fn in_flight_count(&self) -> usize;
    /// Whether the partition is halted.
    fn halted(&self) -> bool;
    /// The partition's counters.
    fn metrics(&self) -> &PartitionMetrics;
}

/// The partitions a scrape sums over, and the counts of those that are gone.
#[derive(Default)]
pub(super) struct Registry {
    pub(super) live: BTreeMap<TopicPartition, Arc<dyn PartitionProbe>>,
    retired: Counts,
    retired_durations: BucketCounts,
}

impl Registry {
    fn retire(&mut self, shared: &dyn PartitionProbe) {
        self.retired.add(&shared.metrics().counts());
        self.retired_durations
            .add(&shared.metrics().buckets.snapshot());
    }
}

/// What the endpoint reports; the group and the supervisor keep it current.
pub struct Health {
    pub(super) registry: Mutex<Registry>,
    /// Each partition's lag as the last summary computed it (`at=lag`).
    pub(super) lags: Mutex<Vec<(TopicPartition, Lag)>>,
    pub(super) phase: AtomicU8,
    /// The group gave this member an assignment (perhaps an empty one): it is in the group.
    pub(super) joined: AtomicBool,
    /// When the supervisor's current callback began (coarse clock), or 0.
    pub(super) supervisor_since: AtomicU64,
    pub(super) supervisor_busy: AtomicU8,
    pub(super) commits: Arc<CommitMetrics>,
    /// A processor call running longer than this is stuck.
    pub(super) stuck_after: Duration,
    /// A supervisor callback running longer than this is stuck.
    pub(super) supervisor_after: Duration,
    /// `ACKD_METRIC_PREFIX` as a Prometheus name.
    pub(super) prefix: String,
}

impl Health {
    pub fn new(
        commits: Arc<CommitMetrics>,
        stuck_after: Duration,
        supervisor_after: Duration,
        metric_prefix: &str,
    ) -> Health {
        Health {
            registry: Mutex::default(),
            lags: Mutex::default(),
            phase: AtomicU8::new(Phase::Running as u8),
            joined: AtomicBool::new(false),
            supervisor_since: AtomicU64::new(0),
            supervisor_busy: AtomicU8::new(0),
            commits,
            stuck_after,
            supervisor_after,
            prefix: prometheus_name(metric_prefix),
        }
    }

    pub(super) fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The group assigned this member its partitions, none perhaps (more members than
    /// partitions): it is in the group and consuming what it was given.
    pub fn joined(&self) {
        self.joined.store(true, Ordering::Release);
    }

    /// A partition got a worker.
    pub fn assigned(&self, tp: TopicPartition, shared: Arc<dyn PartitionProbe>) {
        let mut r = self.registry();
        if let Some(old) = r.live.insert(tp, shared) {
            r.retire(&*old);
        }
    }

    /// A partition left: its counts stay in the totals, in the same step (a scrape never
    /// sees them twice or not at all).
    pub fn released(&self, tp: &TopicPartition) {
        let mut r = self.registry();
        if let Some(old) = r.live.remove(tp) {
            r.retire(&*old);
        }
    }

    pub fn set_lags(&self, lags: Vec<(TopicPartition, Lag)>) {
        *self.lags.lock().unwrap_or_else(|e| e.into_inner()) = lags;
    }

    /// The stop began (signal, end reached) or ackd cannot go on (`Phase::Fatal`).
    pub fn set_phase(&self, phase: Phase) {
        // A fatal error stays the reason even when the stop follows.
        let _ = self
            .phase
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                (p < phase as u8).then_some(phase as u8)
            });
    }

    /// Marks the supervisor busy with `what` until the guard is dropped.
    pub fn busy(&self, what: Busy) -> BusyGuard<'_> {
        let guard = BusyGuard {
            health: self,
            since: self.supervisor_since.load(Ordering::Relaxed),
            what: self.supervisor_busy.load(Ordering::Relaxed),
        };
        if guard.since == 0 {
            self.supervisor_busy.store(what as u8, Ordering::Relaxed);
            self.supervisor_since.store(now_ms(), Ordering::Relaxed);
        }
        guard
    }

    pub(super) fn live_partitions(&self) -> Vec<(TopicPartition, Arc<dyn PartitionProbe>)> {
        self.registry()
            .live
            .iter()
            .map(|(tp, s)| (tp.clone(), s.clone()))
            .collect()
    }

    /// `/metrics`: the summary line's vocabulary in Prometheus's text format 0.0.4, as
    /// totals since start.
    pub(super) fn metrics(&self) -> String {
        page(&self.prefix, &self.scrape())
    }

    /// What `/metrics` reports now.
    fn scrape(&self) -> Scrape<'_> {
        // One look at the list: the retired counts and the live partitions agree.
        let (mut counts, mut durations, owned, partitions) = {
            let r = self.registry();
            let owned: Vec<TopicPartition> = r.live.keys().cloned().collect();
            let live: Vec<Arc<dyn PartitionProbe>> = r.live.values().cloned().collect();
            (r.retired, r.retired_durations, owned, live)
        };
        let mut in_flight = 0u64;
        let mut halted = 0u64;
        for s in &partitions {
            counts.add(&s.metrics().counts());
            durations.add(&s.metrics().buckets.snapshot());
            in_flight += s.in_flight_count() as u64;
            halted += u64::from(s.halted());
        }
        let lags: Vec<(TopicPartition, Lag)> = self
            .lags
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(tp, _)| owned.contains(tp))
            .cloned()
            .collect();
        Scrape {
            counts,
            durations,
            commits: &self.commits,
            in_flight,
            partitions: partitions.len() as u64,
            halted,
            lags,
        }
    }
}
