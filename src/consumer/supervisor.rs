//! The supervisor: the one thread that owns the consumer.
//!
//! It polls librdkafka's main queue (which serves rebalances, statistics and errors;
//! messages never arrive there, each partition has its own queue), queues the periodic
//! commit, and on a stop runs its sequence: stop fetching, drain, commit synchronously,
//! close (leave the group). It is a plain thread, not one of the runtime's, because the
//! rebalance callbacks it serves block while partitions drain.
//!
//! Periodic commits are queued from this thread and revokes run on it, and the committer
//! sends in order, so a periodic commit can never follow a revoke's commit and send an
//! older offset for a partition that has already moved to another member.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::BorrowedMessage;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::Message as _;
use tokio::sync::{mpsc, watch, Notify};

use crate::consumer::group::AckdConsumer;
use crate::consumer::stop::{self, Report, Reports, Stop, StopTimes};
use crate::exit;
use crate::output::health::Busy;
use crate::output::TopicPartition;
use crate::processors::processor::Processor;

/// What the daemon tells the supervisor.
pub(crate) struct Control {
    /// `ACKD_COMMIT_INTERVAL_MS`: how often a periodic commit is due.
    pub(crate) commit_interval: Duration,
    /// A worker wants its dispatch limit raised now (src/consumer/worker/shared.rs).
    pub(crate) commit_wanted: Arc<Notify>,
    /// The stop's clock: announced when a graceful stop begins.
    pub(crate) stop: watch::Receiver<Option<StopTimes>>,
    /// With `ACKD_STOP_AT_END`: notified when a partition reached its end.
    pub(crate) at_end: Option<Arc<Notify>>,
    /// What the stop tells the daemon ([`Report`]).
    pub(crate) reports: mpsc::UnboundedSender<Report>,
}

/// Runs the supervisor to the end; returns the exit code: its poll loop until a stop,
/// then the stop's own sequence ([`stop::sequence`]).
pub fn run<P: Processor>(
    consumer: Arc<AckdConsumer<P>>,
    mut control: Control,
    shutdown_timeout: Duration,
) -> i32 {
    let stop = futures::executor::block_on(poll_loop(&consumer, &mut control, shutdown_timeout));
    // The commits since the last interval's line, before the stop's own lines.
    if let Some(committer) = consumer.context().committer.get() {
        committer.log_rounds();
    }
    stop::sequence(consumer, stop, control, shutdown_timeout)
}

/// Hands the consumer to the supervisor thread: its reports. `Err(code)`: the thread
/// could not be started.
pub(crate) fn spawn<P: Processor>(
    consumer: Arc<AckdConsumer<P>>,
    at_end: Option<Arc<Notify>>,
    commit_wanted: Arc<Notify>,
    commit_interval: Duration,
    timeout: Duration,
) -> Result<Reports, i32> {
    let (reports, reports_rx) = mpsc::unbounded_channel();
    let done = reports.clone();
    let control = Control {
        commit_interval,
        at_end,
        commit_wanted,
        stop: consumer.context().stop_clock.subscribe(),
        reports,
    };
    let spawned = std::thread::Builder::new()
        .name("ackd-supervisor".into())
        .spawn(move || {
            let code = run(consumer, control, timeout);
            let _ = done.send(Report::Done(code));
        });
    if let Err(e) = spawned {
        tracing::error!(at = "start_failed", error = %e, "cannot start the supervisor thread");
        return Err(exit::SOFTWARE);
    }
    Ok(reports_rx)
}

/// A tick every `interval`, the first one `interval` from now: a periodic commit is due.
/// Ticks missed while a revoke held this thread make one commit at once, then the ticks
/// keep to their schedule.
fn commit_ticks(interval: Duration, runtime: &tokio::runtime::Handle) -> tokio::time::Interval {
    // tokio's timers are made inside its context; this thread polls them from its own loop.
    let _context = runtime.enter();
    let mut every = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    every
}

/// Serves the main queue (rebalances, errors) until `until`, while the stop waits for
/// a rebalance to finish before it commits again. Every partition with a worker has its
/// own queue; a message here belongs to a partition assigned while stopping, which is
/// not processed: it is dropped uncommitted, for the next owner.
pub(crate) fn serve_until<P: Processor>(consumer: &AckdConsumer<P>, until: Instant) {
    let ctx = consumer.context();
    let serve = async {
        loop {
            match consumer.recv().await {
                Ok(_unprocessed) => {}
                // Nothing more will come (fenced): the commit is refused for good.
                Err(KafkaError::MessageConsumptionFatal(_)) => return,
                // Stopping for an authentication failure: unreachable brokers follow from it.
                Err(_) if ctx.auth.failed() => {}
                Err(e) => {
                    if !ctx.connectivity.error(&e, None) {
                        tracing::warn!(at = "kafka_error", error = %e);
                    }
                }
            }
        }
    };
    // The timer is made inside block_on: it needs the runtime's context.
    ctx.runtime.block_on(async {
        let _ = tokio::time::timeout_at(until.into(), serve).await;
    });
}

/// The `at=kafka_fatal` line: librdkafka declared the consumer dead (`code` if it does not
/// say why).
pub(crate) fn log_fatal<P: Processor>(consumer: &AckdConsumer<P>, code: Option<RDKafkaErrorCode>) {
    let (cause, reason) = match (consumer.client().fatal_error(), code) {
        (Some((c, r)), _) => (c, r),
        (None, Some(c)) => (c, String::new()),
        (None, None) => return,
    };
    let fenced = cause == RDKafkaErrorCode::FencedInstanceId;
    tracing::error!(
        at = "kafka_fatal",
        error = %cause,
        reason,
        fenced,
        "librdkafka reported a fatal error: stopping without committing{}",
        match cause {
            RDKafkaErrorCode::FencedInstanceId => "; another process joined with the same group.instance.id (ACKD_STATIC_MEMBERSHIP) and owns the partitions now",
            // KIP-848 refuses the newcomer instead of fencing the first.
            RDKafkaErrorCode::UnreleasedInstanceId => "; another live process holds this group.instance.id (ACKD_STATIC_MEMBERSHIP under ACKD_GROUP_PROTOCOL=consumer): start this one after it has stopped",
            _ => "",
        }
    );
}

/// Resolves when a partition reports its end; never without `ACKD_STOP_AT_END`.
async fn wait_at_end(at_end: Option<&Notify>) {
    match at_end {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

/// Serves the consumer until a stop: a signal's, the end of every partition
/// (`ACKD_STOP_AT_END`), or a fatal error.
async fn poll_loop<P: Processor>(
    consumer: &AckdConsumer<P>,
    control: &mut Control,
    shutdown_timeout: Duration,
) -> Stop {
    let mut ticks = commit_ticks(control.commit_interval, &consumer.context().runtime);
    loop {
        let stop = tokio::select! {
            biased;
            changed = control.stop.changed() => {
                let times = *control.stop.borrow();
                match (changed, times) {
                    (_, Some(times)) => Some(Stop::Graceful(times.deadline)),
                    (Err(_), None) => Some(Stop::Graceful(Instant::now())),
                    (Ok(()), None) => None,
                }
            }
            _ = wait_at_end(control.at_end.as_deref()) => all_at_end(consumer, shutdown_timeout),
            _ = ticks.tick() => {
                // Not once the stop began: its final commit follows.
                if control.stop.borrow().is_none() {
                    commit_due(consumer);
                }
                None
            }
            _ = control.commit_wanted.notified() => {
                limits_due(consumer);
                None
            }
            event = consumer.recv() => on_event(consumer, event),
        };
        if let Some(stop) = stop {
            return stop;
        }
    }
}

/// A partition reached its end (`ACKD_STOP_AT_END`): the stop, if every assigned one has.
fn all_at_end<P: Processor>(
    consumer: &AckdConsumer<P>,
    shutdown_timeout: Duration,
) -> Option<Stop> {
    let group = consumer.context().lock();
    if !group.owned.is_empty() && group.owned.values().all(|p| p.worker.shared.at_end()) {
        tracing::info!(
            at = "end_reached",
            partitions = group.owned.len(),
            "every assigned partition reached its end: stopping"
        );
        return Some(Stop::Graceful(Instant::now() + shutdown_timeout));
    }
    None
}

/// The commit interval passed: the committer commits what changed, and the
/// `at=commits` line sums up the commits of the interval past.
fn commit_due<P: Processor>(consumer: &AckdConsumer<P>) {
    let ctx = consumer.context();
    let _busy = ctx.health.busy(Busy::Commit);
    if let Some(committer) = ctx.committer.get() {
        committer.periodic_round(&ctx.lock());
        committer.log_rounds();
    }
}

/// A worker wants its dispatch limit raised: the committer commits its partition (and
/// any other that wants one, unless a commit of it is on its way) now.
fn limits_due<P: Processor>(consumer: &AckdConsumer<P>) {
    let ctx = consumer.context();
    let _busy = ctx.health.busy(Busy::Commit);
    if let Some(committer) = ctx.committer.get() {
        committer.limits_round(&ctx.lock());
    }
}

/// What the consumer's main queue gave: a message (never expected), a fatal error, or
/// another error. The stop it makes, if any.
fn on_event<P: Processor>(
    consumer: &AckdConsumer<P>,
    event: KafkaResult<BorrowedMessage<'_>>,
) -> Option<Stop> {
    match event {
        Ok(message) => {
            // Impossible while every partition's queue is split before it is
            // assigned. Never commit past it, and restart from the committed offset.
            let tp: TopicPartition = (Arc::from(message.topic()), message.partition());
            let offset = message.offset();
            tracing::error!(
                at = "unexpected_message",
                topic = &*tp.0,
                partition = tp.1,
                offset,
                "message arrived on the main queue; not processed, not committed past; stopping"
            );
            if let Some(p) = consumer.context().lock().owned.get_mut(&tp) {
                p.cap = Some(p.cap.map_or(offset, |c| c.min(offset)));
            }
            Some(Stop::Fatal {
                code: exit::SOFTWARE,
                commit: true,
            })
        }
        Err(KafkaError::MessageConsumptionFatal(code)) => {
            // librdkafka refuses every commit after a fatal error, and for a consumer
            // the fatal errors are FENCED_INSTANCE_ID (classic: another process joined
            // with this group.instance.id and owns the partitions now) and
            // UNRELEASED_INSTANCE_ID (consumer protocol: this process is the newcomer,
            // and owns nothing). Committing would send stale offsets (or be refused):
            // stop without it.
            log_fatal(consumer, Some(code));
            Some(Stop::Fatal {
                code: exit::UNAVAILABLE,
                commit: false,
            })
        }
        Err(e) => {
            // The error callback (GroupContext::error) saw an authentication
            // failure just before: it is fatal. The stop still tries to commit.
            if consumer.context().auth.failed() {
                return Some(Stop::Fatal {
                    code: exit::NOPERM,
                    commit: true,
                });
            }
            if !consumer.context().connectivity.error(&e, None) {
                tracing::warn!(at = "kafka_error", error = %e);
            }
            None
        }
    }
}
