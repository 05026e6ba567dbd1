//! librdkafka's revoke: the revoked partitions are released (drained, committed unless
//! the assignment was lost) before the rebalance goes on; a stop that begins meanwhile
//! cuts its waits short.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::TopicPartitionList;

use super::commit_retry::CommitRetry;
use super::generation::generation;
use super::release::{Commit, Deadlines};
use super::{GroupContext, Outcome};
use crate::consumer::committer::Reason;
use crate::consumer::membership;
use crate::consumer::stop_clock::StopTimes;
use crate::processors::processor::Processor;
use crate::topic_partition::TopicPartition;

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
        // A stop that begins meanwhile brings both deadlines forward (issue 13.5): the
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
        let duration_ms = crate::clock::millis(started.elapsed());
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
