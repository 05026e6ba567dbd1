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
//!
//! One concept a file: [`Owned`] (one owned partition and what to commit of it), the
//! rdkafka callbacks (rdkafka_context.rs), assignment and resume (assign.rs), revoke
//! (revoke.rs), the release shared by revoke and shutdown (release.rs, outcome.rs), the
//! commit of owned partitions with its retries (commit_retry.rs), broker reachability
//! (connectivity.rs), the interval summary (summary.rs), and the group generation
//! (generation.rs). The graceful stop's clock is src/consumer/stop_clock.rs.

mod assign;
mod commit_retry;
mod connectivity;
mod generation;
mod outcome;
mod owned;
mod rdkafka_context;
mod release;
mod revoke;
mod summary;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use rdkafka::consumer::StreamConsumer;

use crate::config::settings::StartFrom;
use crate::consumer::committer::{CommitOffset, Committer};
use crate::consumer::membership;
use crate::consumer::worker::{self, WorkerConfig};
use crate::output::health::Health;
use crate::output::metrics::{CommitMetrics, Interval, LagLines};
use crate::processors::processor::Processor;
use crate::topic_partition::TopicPartition;

use crate::consumer::stop_clock::StopClock;
pub(crate) use connectivity::Connectivity;
pub(crate) use outcome::Outcome;
pub(crate) use owned::Owned;
pub(crate) use release::log_release_unmarked;

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
    /// What each partition's last lag line said (src/consumer/group/summary.rs).
    lag_lines: LagLines,
}

impl Group {
    /// Acknowledged offsets not yet committed, for `only` (all owned if `None`).
    pub fn uncommitted(&self, only: Option<&[TopicPartition]>) -> Vec<CommitOffset> {
        self.pending(only, false)
    }

    /// What a commit asked for by workers at their dispatch limit sends: the partitions
    /// whose worker wants its limit raised (src/consumer/dispatch_limit.rs), and only
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

    fn pending(&self, only: Option<&[TopicPartition]>, releasing: bool) -> Vec<CommitOffset> {
        self.owned
            .iter()
            .filter(|(tp, _)| only.is_none_or(|o| o.contains(tp)))
            .filter_map(|(tp, p)| p.to_commit(tp, releasing))
            .collect()
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

impl<P: Processor> GroupContext<P> {
    pub fn lock(&self) -> MutexGuard<'_, Group> {
        self.group.lock().unwrap_or_else(|e| e.into_inner())
    }
}
