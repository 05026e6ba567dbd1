//! What the committer reads from and records in the group it commits for, and which
//! refusals put the membership in doubt.

use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use super::commit::CommitOffset;
use crate::topic_partition::TopicPartition;

/// How often a confirming commit is sent while the membership is in doubt
/// (src/consumer/membership.rs).
pub const CONFIRM_EVERY: Duration = Duration::from_millis(500);

/// Whether a commit refused with `error` means the member may no longer own its
/// partitions: the broker does not know it (its session expired), fenced it, or knows
/// a newer epoch or generation of the group than it does.
pub fn doubted_by(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::UnknownMemberId
                | RDKafkaErrorCode::FencedMemberEpoch
                | RDKafkaErrorCode::StaleMemberEpoch
                | RDKafkaErrorCode::IllegalGeneration
        )
    )
}

/// What an accepted commit of one partition carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// It was a release's (revoke, stop).
    pub released: bool,
    /// Its `a=` ranges were committed with it.
    pub with_ranges: bool,
    pub limit: Limit,
}

/// The dispatch limit an accepted commit recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// This one: offsets up to it may start.
    Recorded(i64),
    /// The commit named none (the limit stays as it was).
    Unchanged,
    /// It carried no metadata at all (the broker refuses it): no limit can be recorded,
    /// so none holds the partition back.
    None,
}

/// What the committer reads from and records in the group it commits for (the
/// consumer's `Group`, which keeps the membership: src/consumer/membership.rs).
pub trait CommitLedger: Send + 'static {
    /// Starts the thread that watches for stalls of the whole process; it ends with the
    /// ledger.
    fn watch_stalls(ledger: Weak<Mutex<Self>>) -> std::io::Result<()>
    where
        Self: Sized;
    /// In doubt, when a confirming commit is due: what it sends.
    fn confirmation_due(&mut self) -> Option<Vec<CommitOffset>>;
    /// Not in doubt, when the membership lease wants renewing: the partition whose
    /// committed offset a renewal reads, and how long to wait for the answer.
    fn renewal_due(&mut self) -> Option<(TopicPartition, Duration)>;
    /// The coordinator answered a request sent at `sent_at`: the lease runs from there.
    fn renewed(&mut self, sent_at: Instant);
    /// The broker accepted `c` (with what [`Accepted`] says): what the group has for its
    /// partition, if still owned.
    fn accepted(&mut self, c: &CommitOffset, accepted: &Accepted);
    /// A commit sent at `sent_at` was accepted: it may prove the membership.
    fn confirmed_by_commit(&mut self, sent_at: Instant);
    /// A periodic or confirming commit was refused with `error`, [`doubted_by`] it: the
    /// membership is in doubt.
    fn doubted(&mut self, error: &KafkaError);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_for_the_member_put_it_in_doubt_others_do_not() {
        use RDKafkaErrorCode as E;
        let cases = [
            (E::UnknownMemberId, true),
            (E::FencedMemberEpoch, true),
            (E::StaleMemberEpoch, true),
            (E::IllegalGeneration, true),
            (E::RebalanceInProgress, false),
            (E::CoordinatorLoadInProgress, false),
            (E::OffsetMetadataTooLarge, false),
            (E::RequestTimedOut, false),
        ];
        for (code, doubted) in cases {
            assert_eq!(
                doubted_by(&KafkaError::ConsumerCommit(code)),
                doubted,
                "{code:?}"
            );
        }
    }
}
