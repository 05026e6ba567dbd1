//! Releasing partitions, for a revoke or the graceful stop: drain their workers, commit
//! what they acknowledged, forget them.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::types::RDKafkaErrorCode;

use super::commit_retry::CommitRetry;
use super::outcome::Released;
use super::{Group, GroupContext, Outcome, Owned};
use crate::consumer::committer::{CommitOffset, Reason};
use crate::consumer::stop_clock::{StopTimes, STOP_CHECK};
use crate::consumer::worker;
use crate::processors::processor::Processor;
use crate::topic_partition::TopicPartition;

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

impl<P: Processor> GroupContext<P> {
    /// The graceful stop's release of every partition still owned (`tps`): drain until
    /// the clock's drain share, then commit (`commit`: unless the stop is one that must
    /// not commit) until its deadline, serving the group with `serve` while a commit is
    /// refused for a rebalance in progress.
    ///
    /// **A revoke while the shutdown serves the group** runs inside `serve` and releases
    /// some of these very partitions itself (commits them under the new generation, logs
    /// `at=revoked`, sets `released_incomplete` if it could not). The shutdown's commit
    /// then goes on with what it still owns, and its outcome leaves those out.
    pub fn shutdown(
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

    /// Releases `tps`, for a revoke or the shutdown: one drain, one rule, in four steps.
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
                if !committing || fatal {
                    // Nothing committed by this release; what was acknowledged is left.
                    let left = pending.iter().find(|c| c.tp == tp).cloned();
                    return (
                        tp,
                        Released {
                            committed: None,
                            left,
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
    /// that were still owned (a revoke served during the shutdown's commit may have
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

impl Group {
    /// Whether releasing `tp` commits nothing but the release mark: its acknowledged
    /// offset and ranges are committed already (periodically), and only the metadata's
    /// `;r` is not.
    pub fn only_the_mark_left(&self, tp: &TopicPartition) -> bool {
        self.owned
            .get(tp)
            .is_some_and(|p| p.to_commit(tp, true).is_some_and(|c| only_the_mark(p, &c)))
    }
}

/// Whether committing `c` for `p` only marks it released: what it carries is committed
/// already, and nothing handed to the processor at or above the committed offset is left
/// unfinished (a release's `processed` is the highest offset handed over), so not
/// committing it loses no acknowledgement and no message is redelivered.
pub(super) fn only_the_mark(p: &Owned, c: &CommitOffset) -> bool {
    p.committed == Some(c.offset)
        && p.committed_acked == c.acked
        && c.processed.is_none_or(|handed| handed < c.offset)
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
