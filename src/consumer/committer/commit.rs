//! A commit: what it sends for one partition, why it is sent, and how a waited-for one
//! ended.

use rdkafka::error::KafkaError;

use crate::topic_partition::TopicPartition;

/// What to commit for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitOffset {
    pub tp: TopicPartition,
    /// The next offset to read.
    pub offset: i64,
    /// For the metadata: the highest offset acknowledged or, in a release, the highest
    /// handed to the processor (finished or not).
    pub processed: Option<i64>,
    /// The dispatch limit this commit records (src/consumer/dispatch_limit.rs): once it
    /// is accepted, the partition's worker may start offsets up to it.
    pub limit: Option<i64>,
    /// Offsets acknowledged above `offset`, inclusive ranges, ascending, for the metadata
    /// (empty unless the ordering is concurrent).
    pub acked: Vec<(i64, i64)>,
}

/// Why a commit is sent; named on its `at=committed` lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Periodic,
    Revoke,
    Shutdown,
    /// While the membership is in doubt: a commit whose acceptance proves it
    /// (src/consumer/membership.rs).
    Confirm,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Periodic => "periodic",
            Reason::Revoke => "revoke",
            Reason::Shutdown => "shutdown",
            Reason::Confirm => "confirm",
        }
    }

    /// A release's commit: this process processes nothing more of the partition.
    pub fn releases(self) -> bool {
        matches!(self, Reason::Revoke | Reason::Shutdown)
    }
}

/// How a waited-for commit ended.
#[derive(Debug)]
pub enum CommitError {
    /// The broker (or librdkafka) refused at least one partition; the error of the first.
    /// The partitions it accepted are committed (and logged `at=committed`).
    Refused(KafkaError),
    /// Not answered before the deadline. If it was still queued it is never sent; if
    /// librdkafka had it already, it may still be committed.
    TimedOut,
    /// Not sent for some partitions: their waiter's deadline passed in the queue, or they
    /// were released meanwhile.
    NotSent,
    /// The consumer is gone.
    Closed,
}

impl std::fmt::Display for CommitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommitError::Refused(e) => write!(f, "{e}"),
            CommitError::TimedOut => f.write_str("no answer before the deadline"),
            CommitError::NotSent => f.write_str("not sent: given up before its turn"),
            CommitError::Closed => f.write_str("the consumer is closed"),
        }
    }
}
