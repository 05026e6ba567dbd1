//! One owned partition: its worker, what the group has committed of it, and what to
//! commit next.

use crate::consumer::committer::CommitOffset;
use crate::consumer::worker::{WorkerHandle, WorkerShared};
use crate::topic_partition::TopicPartition;

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
    /// of it was periodic, or there was none since the assignment, so that the metadata
    /// says it was released and what was handed over unfinished (the next owner then
    /// flags exactly that). Running, also when the worker wants its dispatch
    /// limit raised (src/consumer/dispatch_limit.rs): a commit carries the next one.
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
