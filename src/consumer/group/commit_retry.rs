//! The commit of a release, with its retries: a commit refused for a passing reason
//! (a rebalance in progress, a stale member epoch, a moving coordinator) is sent again
//! until the release's deadline.

use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use super::release::{log_release_unmarked, only_the_mark};
use super::GroupContext;
use crate::consumer::committer::{CommitError, CommitOffset, Reason};
use crate::consumer::stop_clock::sleep_until;
use crate::processors::processor::Processor;
use crate::topic_partition::TopicPartition;

impl<P: Processor> GroupContext<P> {
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
    pub(super) fn commit_owned(
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
                CommitError::Refused(e) => Refusal::of(e),
                _ => Refusal::Final,
            };
            let retrying = Retrying {
                reason,
                partitions: pending.len(),
                wait,
                error: &error,
            };
            match (refusal, retry) {
                (Refusal::Rebalancing, CommitRetry::Serve(serve)) if until < deadline() => {
                    retrying.log("commit refused while the group rebalances: serving the rebalance, then committing again");
                    serve(until);
                }
                (Refusal::StaleEpoch, retry) if until < deadline() => {
                    retrying.log("commit refused for a stale member epoch: the partitions are still ours; committing again once librdkafka's heartbeat has the current epoch");
                    // librdkafka heartbeats on its own thread (it hastens the next one on
                    // this error): a revoke, which runs inside the rebalance callback, can
                    // wait for it; the shutdown serves the group meanwhile.
                    retry.wait(until, deadline);
                }
                // librdkafka finds the new coordinator on its own thread: waiting is enough,
                // so a revoke (which cannot serve the group) retries too.
                (Refusal::CoordinatorMoving, retry) if until < deadline() => {
                    retrying.log("commit refused while the group's coordinator moves or loads: committing again");
                    retry.wait(until, deadline);
                }
                _ => {
                    give_up(refusal, reason, &pending, &self.marks(&pending), &error);
                    return (pending, false);
                }
            }
            wait = (wait * 2).min(REBALANCE_WAIT_MAX);
        }
    }

    /// For each of `pending`, whether it carries only the release mark.
    fn marks(&self, pending: &[CommitOffset]) -> Vec<bool> {
        let group = self.lock();
        pending
            .iter()
            .map(|c| group.owned.get(&c.tp).is_some_and(|p| only_the_mark(p, c)))
            .collect()
    }
}

/// A commit about to be sent again: its `at=commit_retry` line.
struct Retrying<'a> {
    reason: Reason,
    partitions: usize,
    wait: Duration,
    error: &'a CommitError,
}

impl Retrying<'_> {
    fn log(&self, why: &str) {
        tracing::warn!(
            at = "commit_retry",
            reason = self.reason.as_str(),
            partitions = self.partitions,
            wait_ms = self.wait.as_millis() as u64,
            error = %self.error,
            "{why}"
        );
    }
}

/// A release's commit that is not tried again: what the committer did not log is said
/// here. Where it carried only the release mark (`marks`: what it sent is committed
/// already), nothing acknowledged is lost, and its line says so instead.
fn give_up(
    refusal: Refusal,
    reason: Reason,
    pending: &[CommitOffset],
    marks: &[bool],
    error: &CommitError,
) {
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
    let logged = matches!(error, CommitError::Refused(_) | CommitError::NotSent);
    for (c, mark) in pending.iter().zip(marks) {
        if *mark {
            log_release_unmarked(&c.tp, c.offset, reason, error);
        } else if !logged {
            tracing::error!(at = "commit_failed", topic = &*c.tp.0, partition = c.tp.1, offset = c.offset, error = %error,
                "not committed; messages from the last committed offset will be redelivered");
        }
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

/// How a commit refused for a passing reason is tried again (see [`Refusal`]).
#[derive(Clone, Copy)]
pub(super) enum CommitRetry<'a> {
    /// The shutdown owns the poll loop: it serves the group (this function, until the
    /// instant given) so that a rebalance in progress completes, then commits again.
    Serve(&'a dyn Fn(Instant)),
    /// A revoke runs inside the rebalance callback and cannot serve the group: it only
    /// waits, which is enough for a stale epoch or a moving coordinator, not for a
    /// rebalance in progress.
    Wait,
}

impl CommitRetry<'_> {
    /// Waits until `until` (or `deadline()`, if sooner) before the commit is sent again:
    /// serving the group if this release can, else only sleeping.
    fn wait(self, until: Instant, deadline: &dyn Fn() -> Instant) {
        match self {
            CommitRetry::Serve(serve) => serve(until),
            CommitRetry::Wait => sleep_until(until, deadline),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
