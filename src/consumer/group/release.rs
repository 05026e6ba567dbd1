//! Releasing partitions: librdkafka's revoke and the graceful stop share one path,
//! [`GroupContext::release`]: drain the workers, commit what they acknowledged (with
//! retries while a refusal may pass), forget the partitions, and say per partition what
//! happened ([`Outcome`]). A stop that begins during a revoke cuts the revoke's waits
//! short.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::TopicPartitionList;

use super::rdkafka_context::generation;
use super::{GroupContext, Owned};
use crate::consumer::committer::{only_the_mark, CommitError, CommitOffset, Reason};
use crate::consumer::membership;
use crate::consumer::stop::{sleep_until, StopTimes, STOP_CHECK};
use crate::consumer::worker;
use crate::output::TopicPartition;
use crate::processors::processor::Processor;

/// When a release's steps must end; read at each wait, as a stop may bring them forward.
pub(super) struct Deadlines<'a> {
    pub(super) drain: &'a dyn Fn() -> Instant,
    pub(super) commit: &'a dyn Fn() -> Instant,
}

/// A release's commit: why, and how a refusal is retried.
pub(super) struct Commit<'a> {
    pub(super) reason: Reason,
    pub(super) retry: CommitRetry<'a>,
}

/// How long a revoke's commit may take once the drain is done.
const COMMIT_BUDGET: Duration = Duration::from_secs(10);

impl<P: Processor> GroupContext<P> {
    /// librdkafka's revoke, inside a poll of the supervisor's thread: the rebalance goes
    /// on when this returns. See [`GroupContext::release`] for the steps.
    pub(super) fn revoke(&self, base: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        // After a fatal error (fenced) librdkafka unassigns everything: nothing of it is
        // ours to commit any more, however the revoke is flagged.
        let lost = base.assignment_lost() || base.client().fatal_error().is_some();
        let tps: Vec<TopicPartition> = tpl
            .elements()
            .iter()
            .map(|e| (Arc::from(e.topic()), e.partition()))
            .collect();
        let generation = generation(base);
        let started = Instant::now();
        // A revoke that is not lost comes from the group: this process is a member.
        if !lost {
            membership::confirmed(&mut *self.lock(), "rebalance");
        }
        self.log_revoke_begun(&tps, lost, generation);
        // A stop that begins meanwhile brings both deadlines forward: the
        // partitions not revoked still need their final commit before its deadline.
        let drain_until = started + self.drain_timeout;
        let commit_until = drain_until + COMMIT_BUDGET;
        let outcome = self.release(
            &tps,
            Deadlines {
                drain: &|| self.cut_short(drain_until, |t| t.drain_until),
                commit: &|| self.cut_short(commit_until, |t| t.revoke_commit_until),
            },
            (!lost).then_some(Commit {
                reason: Reason::Revoke,
                retry: CommitRetry::Wait,
            }),
        );
        if lost {
            membership::ended(&mut *self.lock());
        }
        let duration_ms = crate::output::metrics::millis(started.elapsed());
        let stopping = self.stopping.load(Ordering::Acquire) || self.stop_clock.times().is_some();
        if stopping && (!outcome.complete || outcome.left_uncommitted().next().is_some()) {
            self.released_incomplete.store(true, Ordering::Release);
        }
        log_revoked(&outcome, lost, generation, duration_ms);
    }

    /// The supervisor is blocked from here until the revoke returns: say so. (The
    /// close's final revoke, after the stop released everything, has nothing to do.)
    fn log_revoke_begun(&self, tps: &[TopicPartition], lost: bool, generation: Option<i32>) {
        let owned: Vec<String> = {
            let group = self.lock();
            tps.iter()
                .filter(|tp| group.owned.contains_key(*tp))
                .map(|(t, p)| format!("{t}/{p}"))
                .collect()
        };
        if !owned.is_empty() {
            tracing::info!(
                at = "revoke_begun",
                partitions = owned.len(),
                lost,
                generation,
                revoking = owned.join(",")
            );
        }
    }

    /// `own`, or the stop's time for this step (`pick`) if a stop began and it is sooner.
    /// Once a stop began, every worker is told to stop, too: the stop stops fetching at
    /// the signal, even while the supervisor's thread is held by a revoke.
    fn cut_short(&self, own: Instant, pick: fn(&StopTimes) -> Instant) -> Instant {
        let Some(times) = self.stop_clock.times() else {
            return own;
        };
        if !self.workers_stopped.swap(true, Ordering::AcqRel) {
            for p in self.lock().owned.values() {
                p.worker.stop();
            }
        }
        own.min(pick(&times))
    }
}

/// The `at=revoked` line of each revoked partition, with the offset committed if any.
fn log_revoked(outcome: &Outcome, lost: bool, generation: Option<i32>, duration_ms: f64) {
    let committed = outcome.committed().map(|(tp, offset)| (tp, Some(offset)));
    let uncommitted = outcome.without_commit().map(|tp| (tp, None));
    for (tp, offset) in committed.chain(uncommitted) {
        tracing::info!(
            at = "revoked",
            topic = &*tp.0,
            partition = tp.1,
            offset,
            lost,
            generation,
            duration_ms
        );
    }
}

impl<P: Processor> GroupContext<P> {
    /// The graceful stop's release of every partition still owned (`tps`): drain until
    /// the clock's drain share, then commit (`commit`: unless the stop is one that must
    /// not commit) until its deadline, serving the group with `serve` while a commit is
    /// refused for a rebalance in progress.
    ///
    /// **A revoke while the stop serves the group** runs inside `serve` and releases
    /// some of these very partitions itself (commits them under the new generation, logs
    /// `at=revoked`, sets `released_incomplete` if it could not). The stop's commit
    /// then goes on with what it still owns, and its outcome leaves those out.
    pub fn release_at_stop(
        &self,
        tps: &[TopicPartition],
        times: StopTimes,
        commit: bool,
        serve: &dyn Fn(Instant),
    ) -> Outcome {
        self.release(
            tps,
            Deadlines {
                drain: &|| times.drain_until,
                commit: &|| times.deadline,
            },
            commit.then_some(Commit {
                reason: Reason::Shutdown,
                retry: CommitRetry::Serve(serve),
            }),
        )
    }

    /// Releases `tps`, for a revoke or the stop: one drain, one rule, in four steps.
    /// 1. [`GroupContext::drain`]: stop the workers, wait for their in-flight messages
    ///    until `deadlines.drain`.
    /// 2. Commit what they acknowledged until `deadlines.commit`
    ///    ([`GroupContext::commit_owned`]); nothing for a lost assignment
    ///    (`commit: None`) or a consumer librdkafka declared dead (fenced).
    /// 3. [`GroupContext::forget`]: no commit for them is sent after this; drop them from
    ///    the group, abort their workers.
    /// 4. Say per partition what happened ([`Outcome`]).
    pub(super) fn release(
        &self,
        tps: &[TopicPartition],
        deadlines: Deadlines<'_>,
        commit: Option<Commit<'_>>,
    ) -> Outcome {
        let drained = self.drain(tps, deadlines.drain);
        // A consumer librdkafka declared dead (fenced, e.g. while it drained) commits
        // nothing: its partitions are another process's now.
        let mut fatal = self.fatal_error().is_some();
        let commit = commit.filter(|_| !fatal);
        let committing = commit.is_some();
        let (pending, commit_ok) = match commit {
            None => (self.lock().uncommitted(Some(tps)), true),
            Some(c) => self.commit_owned(tps, c.reason, deadlines.commit, c.retry),
        };
        // Fenced while committing: the commit is refused for good, however it was.
        fatal |= !commit_ok && self.fatal_error().is_some();
        let removed = self.forget(tps, deadlines.commit);
        let partitions = removed
            .into_iter()
            .map(|(tp, p)| {
                // Read after the drain: a call that failed for good during it halted
                // the partition then.
                let halted = p.worker.shared.halted_at();
                if !committing || fatal {
                    // Nothing committed by this release; what was acknowledged is left.
                    let left = pending.iter().find(|c| c.tp == tp).cloned();
                    return (
                        tp,
                        Released {
                            committed: None,
                            left,
                            halted,
                        },
                    );
                }
                // Per partition: the committer sets `committed` only where the broker
                // accepted, so a partition whose offset it holds is committed.
                let left = pending
                    .iter()
                    .find(|c| c.tp == tp && p.committed != Some(c.offset))
                    .cloned();
                (
                    tp,
                    Released {
                        committed: p.committed,
                        left,
                        halted,
                    },
                )
            })
            .collect();
        Outcome {
            partitions,
            complete: drained && commit_ok,
            fatal,
        }
    }

    /// Step 1 of a release: stops the workers of `tps` and waits until they returned or
    /// `deadline()` passed (a stop may bring it forward). True if all returned; each
    /// one that did not is logged `at=drain_timeout`.
    fn drain(&self, tps: &[TopicPartition], deadline: &dyn Fn() -> Instant) -> bool {
        // Wait without holding the lock: the committer needs it meanwhile.
        let shared: Vec<(TopicPartition, Arc<worker::WorkerShared>)> = {
            let group = self.lock();
            tps.iter()
                .filter_map(|tp| group.owned.get(tp).map(|p| (tp.clone(), p)))
                .map(|(tp, p)| {
                    p.worker.stop();
                    (tp, p.worker.shared.clone())
                })
                .collect()
        };
        let mut all = true;
        for (tp, s) in &shared {
            if !wait_done_by(s, deadline) {
                all = false;
                tracing::error!(
                    at = "drain_timeout",
                    topic = &*tp.0,
                    partition = tp.1,
                    in_flight_offset = s.in_flight(),
                    "in-flight message did not finish before the deadline; it is not committed and will be redelivered"
                );
            }
        }
        all
    }

    /// Step 3 of a release: after the commit, `tps` are no longer ours. Returns those
    /// that were still owned (a revoke served during the stop's commit may have
    /// released some already).
    fn forget(
        &self,
        tps: &[TopicPartition],
        deadline: &dyn Fn() -> Instant,
    ) -> Vec<(TopicPartition, Owned)> {
        // From here no commit for these partitions is sent (src/consumer/committer.rs):
        // one that timed out but is still queued is dropped, one inside librdkafka is
        // waited for.
        if let Some(c) = self.committer.get() {
            c.release(tps);
        }
        let removed: Vec<(TopicPartition, Owned)> = {
            let mut group = self.lock();
            let removed: Vec<(TopicPartition, Owned)> = tps
                .iter()
                .filter_map(|tp| group.owned.remove(tp).map(|p| (tp.clone(), p)))
                .collect();
            for (tp, p) in &removed {
                p.worker.shared.metrics.take_into(&mut group.retired);
                self.health.released(tp);
            }
            removed
        };
        for (_, p) in &removed {
            p.worker.abort();
        }
        // An aborted worker lets go of its queue at its next await; wait for that, so no
        // queue outlives the partition (or keeps the consumer alive past its close); not
        // past the commit's deadline, which a stop may have brought forward.
        let grace = (Instant::now() + Duration::from_secs(1)).min(deadline());
        for (tp, p) in &removed {
            if !p.worker.shared.wait_done(grace) {
                tracing::error!(
                    at = "worker_stuck",
                    topic = &*tp.0,
                    partition = tp.1,
                    "worker did not end after abort (its processor does not return); if the partition comes back, it is not read until this worker ends"
                );
                self.lock()
                    .lingering
                    .insert(tp.clone(), p.worker.shared.clone());
            }
        }
        removed
    }

    /// librdkafka's fatal error, once it declared the consumer dead (for a consumer, the
    /// one fatal error is FENCED_INSTANCE_ID).
    pub fn fatal_error(&self) -> Option<(RDKafkaErrorCode, String)> {
        let consumer = self.consumer.get().and_then(Weak::upgrade)?;
        consumer.client().fatal_error()
    }
}

impl<P: Processor> GroupContext<P> {
    /// Step 2 of a release: commits what the partitions of `tps` that are still owned
    /// acknowledged, until `deadline()`. Returns the last offsets tried and whether they
    /// are committed.
    ///
    /// A commit refused because a rebalance is under way ([`Refusal::Rebalancing`]) can
    /// succeed once the rebalance is over (Kafka's advice: serve the group, then commit
    /// again). With [`CommitRetry::Serve`] (the stop, which owns the poll loop) that
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
                    // wait for it; the stop serves the group meanwhile.
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
    /// Only the stop, which owns the poll loop, can complete it.
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

/// How long the stop serves a rebalance before committing again, at first and at most.
const REBALANCE_WAIT_FIRST: Duration = Duration::from_millis(250);
const REBALANCE_WAIT_MAX: Duration = Duration::from_secs(2);
/// How long a revoke waits before committing again, at first (doubling up to the
/// maximum above): the group waits for the revoke, and a follow-up rebalance that starts
/// meanwhile refuses the commit for good (REBALANCE_IN_PROGRESS), so it tries soon.
const REVOKE_WAIT_FIRST: Duration = Duration::from_millis(50);

/// How a commit refused for a passing reason is tried again (see [`Refusal`]).
#[derive(Clone, Copy)]
pub(super) enum CommitRetry<'a> {
    /// The stop owns the poll loop: it serves the group (this function, until the
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

/// What a release did with one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// The offset the group has committed for it (by this release or before); `None`
    /// when nothing is, or when the release committed nothing (lost, fenced).
    pub committed: Option<i64>,
    /// What was acknowledged and left uncommitted: refused or not answered, or, without
    /// a commit, all that was acknowledged since the last commit.
    pub left: Option<CommitOffset>,
    /// The offset a processor failure halted it at, as the drain left it (a call that
    /// failed for good during the drain included).
    pub halted: Option<i64>,
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

    /// Partitions a processor failure halted, and where: before the release or during
    /// its drain.
    pub fn halted(&self) -> impl Iterator<Item = (&TopicPartition, i64)> {
        self.partitions
            .iter()
            .filter_map(|(tp, r)| r.halted.map(|o| (tp, o)))
    }

    /// What was acknowledged and left uncommitted: redelivered to the next owner.
    pub fn left_uncommitted(&self) -> impl Iterator<Item = &CommitOffset> {
        self.partitions.iter().filter_map(|(_, r)| r.left.as_ref())
    }
}

/// The `at=release_unmarked` line of a partition released without its release mark
/// (`error`: why): nothing acknowledged is redelivered, but its next owner cannot know
/// that.
pub(crate) fn log_release_unmarked(
    tp: &TopicPartition,
    offset: i64,
    reason: Reason,
    error: &dyn std::fmt::Display,
) {
    tracing::warn!(
        at = "release_unmarked",
        topic = &*tp.0,
        partition = tp.1,
        offset,
        reason = reason.as_str(),
        error = %error,
        "everything acknowledged is committed (up to this offset): nothing acknowledged is redelivered; only the commit that marks the partition released was not made, so its next owner reads released=false, as after a crash, and flags the messages of this process's dispatch window as possible repeats"
    );
}

/// Waits until the worker of `s` has returned, or `deadline()` (which a stop may bring
/// forward) passed. True if it returned.
fn wait_done_by(s: &worker::WorkerShared, deadline: &dyn Fn() -> Instant) -> bool {
    loop {
        let now = Instant::now();
        let end = deadline();
        if now >= end {
            return s.is_done();
        }
        if s.wait_done(end.min(now + STOP_CHECK)) {
            return true;
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
