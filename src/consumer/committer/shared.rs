//! What the committer's handles and its thread share: the partitions commits may be sent
//! for (with the epoch of each one's assignment), and the budget for `a=` ranges.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicUsize;
use std::sync::{Condvar, Mutex, MutexGuard};

use super::commit::CommitOffset;
use crate::consumer::handover::RANGES_MAX_BYTES;
use crate::topic_partition::TopicPartition;

/// The partitions commits may be sent for; see src/consumer/committer/mod.rs.
#[derive(Default)]
pub(super) struct Ownership {
    /// Owned partitions and the epoch of their current assignment.
    pub(super) owned: HashMap<TopicPartition, u64>,
    pub(super) last_epoch: u64,
    /// The partitions of the commit being sent right now (inside librdkafka).
    pub(super) sending: Vec<TopicPartition>,
    /// Partitions whose metadata the broker refused even without ranges: their commits
    /// carry none (no dispatch limit either) from then on.
    pub(super) bare: HashSet<TopicPartition>,
}

pub(super) struct Shared {
    pub(super) ownership: Mutex<Ownership>,
    /// Notified when a send ends.
    pub(super) sent: Condvar,
    /// The most bytes of `a=` ranges a commit's metadata carries: lowered each time
    /// the broker refuses metadata with ranges as too large.
    pub(super) ranges_budget: AtomicUsize,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            ownership: Mutex::default(),
            sent: Condvar::new(),
            ranges_budget: AtomicUsize::new(RANGES_BUDGET),
        }
    }
}

/// The bytes of `a=` ranges a commit carries at first (see [`RANGES_MAX_BYTES`]).
pub const RANGES_BUDGET: usize = RANGES_MAX_BYTES;

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, Ownership> {
        self.ownership.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Tags each offset with the epoch of its partition's assignment (0: not owned).
pub(super) fn tag(shared: &Shared, offsets: Vec<CommitOffset>) -> Vec<(CommitOffset, u64)> {
    let o = shared.lock();
    offsets
        .into_iter()
        .map(|c| {
            let epoch = o.owned.get(&c.tp).copied().unwrap_or(0);
            (c, epoch)
        })
        .collect()
}
