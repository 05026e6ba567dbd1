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
//! What each commit carries is read from the partitions we own by the committer
//! (src/consumer/committer.rs: [`Group::uncommitted`] and its kin), which sends it and
//! records in [`Owned`] what the broker accepted.
//!
//! Here: the group's state ([`Group`], each [`Owned`] partition, the [`GroupContext`]).
//! Beside it: librdkafka's callbacks, the summary and the
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

use crate::consumer::committer::Committer;
use crate::consumer::membership;
use crate::consumer::worker::{self, WorkerConfig, WorkerHandle};
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
    /// The next offset this partition will process: the acknowledged one, else where
    /// it resumed.
    pub(super) fn next_to_process(&self) -> Option<i64> {
        self.worker.shared.committable().or(self.committed)
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
