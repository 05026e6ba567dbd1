//! What a release (revoke or shutdown) did with each partition.

use crate::consumer::committer::CommitOffset;
use crate::topic_partition::TopicPartition;

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
