//! The consumer group: what ackd owns, and what happens when that changes.
//!
//! [`GroupContext`] is the rdkafka context of ackd's one consumer. librdkafka calls its
//! rebalance hooks on the thread that polls the main queue, which is the supervisor's
//! own thread (never one of the runtime's), so they may block:
//! - on assign, each new partition gets its own queue (split *before* librdkafka starts
//!   fetching it, so no message can reach the main queue) and its own worker;
//! - on revoke, the revoked partitions' workers are told to stop, their in-flight
//!   messages finish (bounded by the drain timeout), their acked offsets are committed
//!   synchronously, and only then does the rebalance go on. A lost assignment (session
//!   timed out, fenced) commits nothing: the partitions may already be someone else's.
//!
//! What may be committed is decided here ([`Group::uncommitted`]: acknowledged, for
//! partitions we own); the [`Committer`] sends it.
//!
//! Here: the group's state ([`Group`], each [`Owned`] partition and what to commit of
//! it, the [`GroupContext`]). Beside it: librdkafka's callbacks, the summary and the
//! generation (rdkafka_context.rs), assignment and resume points (assign.rs), the
//! release that revoke and the graceful stop share, with its commit retries and its
//! [`Outcome`] (release.rs), and broker reachability (connectivity.rs). The graceful
//! stop's clock is src/consumer/stop.rs.

mod assign;
mod connectivity;
mod rdkafka_context;
mod release;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use rdkafka::consumer::StreamConsumer;

use crate::consumer::committer::{CommitOffset, Committer};
use crate::consumer::membership;
use crate::consumer::worker::{self, WorkerConfig, WorkerHandle, WorkerShared};
use crate::output::health::Health;
use crate::output::metrics::{CommitMetrics, Interval, LagLines};
use crate::output::TopicPartition;
use crate::processors::processor::Processor;
use crate::settings::StartFrom;

use crate::consumer::stop::StopClock;
pub(crate) use connectivity::Connectivity;
pub(crate) use release::{log_release_unmarked, Outcome};

/// The consumer type ackd runs.
pub type AckdConsumer<P> = StreamConsumer<GroupContext<P>>;

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
    /// Whether the group coordinator answered recently enough (src/consumer/membership.rs).
    pub lease: membership::Lease,
    /// What each partition's last lag line said (src/consumer/group/rdkafka_context.rs).
    lag_lines: LagLines,
}

impl Group {
    /// Acknowledged offsets not yet committed, for `only` (all owned if `None`).
    pub fn uncommitted(&self, only: Option<&[TopicPartition]>) -> Vec<CommitOffset> {
        self.pending(only, false)
    }

    /// What a commit asked for by workers at their dispatch limit sends: the partitions
    /// whose worker wants its limit raised (src/consumer/worker/shared.rs), and only
    /// those: the others keep to the commit interval.
    pub fn limits_wanted(&self) -> Vec<CommitOffset> {
        self.owned
            .iter()
            .filter(|(_, p)| p.worker.shared.dispatch.wanted())
            .filter_map(|(tp, p)| p.to_commit(tp, false))
            .collect()
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
                        // While in doubt the limit stays: only a confirmed member may
                        // start more.
                        limit: p.worker.shared.dispatch.accepted(),
                        acked: p.committed_acked.clone(),
                    })
                })
            })
            .collect()
    }

    /// Whether releasing `tp` commits nothing but the release mark: its acknowledged
    /// offset and ranges are committed already (periodically), and only the metadata's
    /// `;r` is not.
    pub fn only_the_mark_left(&self, tp: &TopicPartition) -> bool {
        self.owned.get(tp).is_some_and(|p| {
            p.to_commit(tp, true)
                .is_some_and(|c| release::only_the_mark(p, &c))
        })
    }

    fn pending(&self, only: Option<&[TopicPartition]>, releasing: bool) -> Vec<CommitOffset> {
        self.owned
            .iter()
            .filter(|(tp, _)| only.is_none_or(|o| o.contains(tp)))
            .filter_map(|(tp, p)| p.to_commit(tp, releasing))
            .collect()
    }
}

/// One owned partition.
pub struct Owned {
    pub worker: WorkerHandle,
    /// The offset the group has committed, as far as this process knows.
    pub committed: Option<i64>,
    /// The committed offset at assignment, where the partition was meant to resume.
    pub resume_from: Option<i64>,
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
    /// of it was periodic, or there was none since the assignment, so that the metadata
    /// says it was released and what was handed over unfinished (the next owner then
    /// flags exactly that). Running, also when the worker wants its dispatch
    /// limit raised (src/consumer/worker/shared.rs): a commit carries the next one.
    pub(super) fn to_commit(&self, tp: &TopicPartition, releasing: bool) -> Option<CommitOffset> {
        let dispatch = &self.worker.shared.dispatch;
        let limit_wanted = !releasing && dispatch.wanted();
        let Some(acked) = self.worker.shared.committable() else {
            let wanted = limit_wanted || (releasing && !self.released);
            return wanted.then(|| self.limit_only(tp, releasing)).flatten();
        };
        let acked = self.cap.map_or(acked, |cap| acked.min(cap));
        // After a reset to before the committed offset (it was out of range), that
        // offset is no baseline: what was acknowledged since is what must be committed.
        let first = self.worker.shared.first_offset();
        let reset_back = matches!((first, self.resume_from), (Some(f), Some(a)) if f < a);
        let baseline = if reset_back && self.committed == self.resume_from {
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
        let processed = highest(&self.worker.shared, &above, releasing);
        let moved = baseline.is_none_or(|c| acked > c);
        (mark || more_acked || limit_wanted || moved).then(|| CommitOffset {
            tp: tp.clone(),
            offset: acked,
            processed,
            limit: Some(dispatch.propose(acked)),
            acked: above,
        })
    }

    /// A commit before anything is acknowledged: at the first offset read (where the
    /// partition really resumes: the committed offset, or where the start policy or an
    /// out-of-range reset put it), else at the committed one. A new owner's first
    /// commit, before its first call, which only raises the dispatch limit; or a
    /// release's, which says what was handed over unfinished (a first message in its
    /// retry's backoff, or halted).
    fn limit_only(&self, tp: &TopicPartition, releasing: bool) -> Option<CommitOffset> {
        let shared = &self.worker.shared;
        let offset = shared
            .first_offset()
            .or_else(|| shared.dispatch.read())
            .or(self.committed)?;
        // The ranges inherited beside the committed offset stay named while it does.
        let acked = match self.committed == Some(offset) {
            true => self.committed_acked.clone(),
            false => Vec::new(),
        };
        Some(CommitOffset {
            tp: tp.clone(),
            offset,
            processed: highest(shared, &acked, releasing),
            limit: Some(shared.dispatch.propose(offset)),
            acked,
        })
    }

    /// The next offset this partition will process: the acknowledged one, else where
    /// it resumed.
    pub(super) fn next_to_process(&self) -> Option<i64> {
        self.worker.shared.committable().or(self.committed)
    }
}

/// The metadata's `p=`, so that the ranges `above` (acknowledged, some perhaps inherited
/// from the previous owner) never reach past it: the highest of them, or if higher, on
/// a release the highest offset a processor may have been handed
/// ([`WorkerShared::handed_through`]: what the next owner flags), else the highest
/// acknowledged (the dispatch limit bounds what was handed over).
pub(super) fn highest(shared: &WorkerShared, above: &[(i64, i64)], releasing: bool) -> Option<i64> {
    let own = match releasing {
        true => shared.handed_through(),
        false => shared.highest_acked(),
    };
    own.max(above.last().map(|r| r.1))
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
    /// Authentication failures seen by [`rdkafka::client::ClientContext::error`]; fatal (src/consumer/auth.rs).
    pub auth: crate::consumer::auth::AuthFailures,
    /// Whether the brokers are reachable, as far as librdkafka's errors tell.
    pub connectivity: Connectivity,
    /// Set when the stop begins: partitions assigned after that get no worker.
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

impl<P: Processor> GroupContext<P> {
    pub fn lock(&self) -> MutexGuard<'_, Group> {
        self.group.lock().unwrap_or_else(|e| e.into_inner())
    }
}
