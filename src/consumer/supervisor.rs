//! The supervisor: the one thread that owns the consumer.
//!
//! It polls librdkafka's main queue (which serves rebalances, statistics and errors;
//! messages never arrive there, each partition has its own queue), queues the periodic
//! commit, and on shutdown runs the stop sequence: stop fetching, drain, commit
//! synchronously, close (leave the group). It is a plain thread, not a tokio worker,
//! because the rebalance callbacks it serves block while partitions drain.
//!
//! Periodic commits are queued from this thread and revokes run on it, and the committer
//! sends in order, so a periodic commit can never follow a revoke's commit and send an
//! older offset for a partition that has already moved to another member.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::bindings as rdsys;
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::BorrowedMessage;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::Message as _;
use tokio::sync::{mpsc, oneshot, watch, Notify};

use crate::clock::millis;
use crate::consumer::group::{AckdConsumer, Outcome};
use crate::exit;
use crate::output::health::{Busy, Phase};
use crate::processors::processor::Processor;
use crate::topic_partition::TopicPartition;

/// What the daemon tells the supervisor.
pub struct Control {
    /// A tick per commit interval.
    pub commit_ticks: mpsc::Receiver<()>,
    /// A worker wants its dispatch limit raised now (src/consumer/dispatch_limit.rs).
    pub limits_wanted: Arc<Notify>,
    /// Set to the deadline when a graceful stop begins.
    pub shutdown: watch::Receiver<Option<Instant>>,
    /// With `ACKD_STOP_AT_END`: notified when a partition reached its end.
    pub at_end: Option<Arc<Notify>>,
    /// Told the exit code once the final commit is done, before the (possibly slow) close.
    pub committed: oneshot::Sender<i32>,
    /// Told the deadline and the exit code when the supervisor stops on its own (a fatal
    /// error): the daemon holds the deadline as it does after a signal.
    pub fatal: Option<oneshot::Sender<(Instant, i32)>>,
}

/// Why the poll loop ended.
enum Stop {
    Shutdown(Instant),
    /// ackd cannot go on (a fatal librdkafka error, an invariant broken): stop gracefully
    /// with this exit code, committing what was acknowledged only if `commit`.
    Fatal {
        code: i32,
        commit: bool,
    },
}

/// Runs the supervisor to the end; returns the exit code. The stop, once the poll loop
/// ended: start the [`crate::consumer::stop_clock::StopClock`] (unless the signal did) → stop
/// fetching → release every partition ([`crate::consumer::group::GroupContext::shutdown`]:
/// drain, final commit, forget) → report per partition → tell the daemon the code → close.
pub fn run<P: Processor>(
    consumer: Arc<AckdConsumer<P>>,
    mut control: Control,
    shutdown_timeout: Duration,
) -> i32 {
    let stop = futures::executor::block_on(poll_loop(&consumer, &mut control, shutdown_timeout));
    let (deadline, mut code, commit) = stop_terms(&stop, &mut control, shutdown_timeout);
    consumer.context().health.set_phase(match stop {
        Stop::Shutdown(_) => Phase::Stopping,
        Stop::Fatal { .. } => Phase::Fatal,
    });
    let started = Instant::now();
    let ctx = consumer.context();
    // On a signal the daemon started the clock already (a revoke under way read it);
    // a stop of the supervisor's own starts it here.
    let times = ctx.stop_clock.begin(started, deadline);
    ctx.stopping.store(true, Ordering::Release);
    let (tps, halted) = owned_and_halted(&consumer);
    tracing::info!(
        at = "shutdown_begun",
        partitions = tps.len(),
        halted = halted.len()
    );

    stop_fetching(&consumer);

    // In-flight messages still finish (their effects are under way), but a member that
    // librdkafka declared dead (fenced) commits nothing: its partitions are someone else's.
    let serve = |until: Instant| serve_until(&consumer, until);
    let drained = ctx.shutdown(&tps, times, commit, &serve);
    // A revoke served while committing may have released partitions uncommitted.
    let complete = drained.complete && !ctx.released_incomplete.load(Ordering::Acquire);
    // Fenced while stopping (Heroku starts the replacement dyno, with the same DYNO,
    // while this one drains): say so, as when it happens while running.
    if drained.fatal && code == exit::OK {
        ctx.health.set_phase(Phase::Fatal);
        log_fatal(&consumer, None);
        code = exit::UNAVAILABLE;
    }
    let commit = commit && !drained.fatal;
    tracing::info!(
        at = "drained",
        partitions = tps.len(),
        complete,
        duration_ms = millis(started.elapsed())
    );
    report(&drained, commit, &halted);
    if code == exit::OK && (!complete || !halted.is_empty()) {
        code = exit::INCOMPLETE;
    }
    if !ctx.metrics_interval.is_zero() {
        ctx.summarize(true);
    }
    let _ = control.committed.send(code);

    // Close: leaves the group, so the partitions move at once, not after the session
    // timeout. librdkafka's final revoke finds nothing left to drain.
    let closing = Instant::now();
    match close(&consumer) {
        Ok(()) => tracing::info!(at = "closed", duration_ms = millis(closing.elapsed())),
        Err(e) => tracing::info!(at = "closed", error = e, "the group was not left"),
    }
    // Never dropped: rust-rdkafka's drop would close again (and log that it failed) and
    // then wait for librdkafka's threads. Only the daemon runs this, and the process
    // ends with `_exit` right after (src/exit.rs): librdkafka's threads end with it, and
    // after the close there is nothing left for them to send.
    std::mem::forget(consumer);
    code
}

/// How often the close looks whether librdkafka has finished it.
const CLOSE_POLL: Duration = Duration::from_millis(1);

/// Closes the consumer: librdkafka serves the final revoke here, then leaves the group
/// (sends LeaveGroup; under static membership it does not). rust-rdkafka's drop does the
/// same with polls of 100 ms, and no event ends the last of them, so the close cost
/// ~100 ms of every stop: here it takes a few. Until closed, or for ever: past the
/// stop's deadline the daemon exits without waiting (`at=close_timeout`). `Err`:
/// librdkafka refused the close (after a fatal error: the member is dead already).
fn close<P: Processor>(consumer: &AckdConsumer<P>) -> Result<(), String> {
    let client = consumer.client().native_ptr();
    // SAFETY: a live client. The close keeps its own reference to the consumer's queue
    // (where it posts the final revoke), so this handle is released at once.
    let error = unsafe {
        let queue = rdsys::rd_kafka_queue_get_consumer(client);
        if queue.is_null() {
            return Err("not a group consumer".into());
        }
        let error = rdsys::rd_kafka_consumer_close_queue(client, queue);
        rdsys::rd_kafka_queue_destroy(queue);
        error
    };
    if !error.is_null() {
        // SAFETY: an error librdkafka returned, destroyed once after it is read.
        let text = unsafe {
            let text = std::ffi::CStr::from_ptr(rdsys::rd_kafka_error_string(error))
                .to_string_lossy()
                .into_owned();
            rdsys::rd_kafka_error_destroy(error);
            text
        };
        return Err(text);
    }
    // SAFETY: a live client.
    while unsafe { rdsys::rd_kafka_consumer_closed(client) } == 0 {
        let next = Instant::now() + CLOSE_POLL;
        serve_until(consumer, next);
        // The serve ends early after a fatal error: never spin.
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    Ok(())
}

/// What a stop means: its deadline, the exit code so far, and whether the final commit
/// is made. A stop of the supervisor's own (a fatal error) tells the daemon its deadline
/// and code.
fn stop_terms(
    stop: &Stop,
    control: &mut Control,
    shutdown_timeout: Duration,
) -> (Instant, i32, bool) {
    match *stop {
        Stop::Shutdown(deadline) => (deadline, exit::OK, true),
        Stop::Fatal { code, commit } => {
            let deadline = Instant::now() + shutdown_timeout;
            if let Some(fatal) = control.fatal.take() {
                let _ = fatal.send((deadline, code));
            }
            (deadline, code, commit)
        }
    }
}

/// The partitions owned as the stop begins, and those of them halted by a failure.
fn owned_and_halted<P: Processor>(
    consumer: &AckdConsumer<P>,
) -> (Vec<TopicPartition>, Vec<TopicPartition>) {
    let ctx = consumer.context();
    let tps: Vec<TopicPartition> = ctx.lock().owned.keys().cloned().collect();
    let halted: Vec<TopicPartition> = ctx
        .lock()
        .owned
        .iter()
        .filter(|(_, p)| p.worker.shared.halted_at().is_some())
        .map(|(tp, _)| tp.clone())
        .collect();
    (tps, halted)
}

/// Stops fetching: nothing new is handed out, what is prefetched stays unprocessed.
fn stop_fetching<P: Processor>(consumer: &AckdConsumer<P>) {
    if let Ok(assignment) = consumer.assignment() {
        if assignment.count() > 0 {
            if let Err(e) = consumer.pause(&assignment) {
                tracing::warn!(at = "pause_failed", error = %e);
            }
        }
    }
}

/// The stop's account, per partition: the final commit, or what is left uncommitted
/// (and redelivered), and the partitions a processor failure halted.
fn report(drained: &Outcome, commit: bool, halted: &[TopicPartition]) {
    for (tp, offset) in drained.committed() {
        tracing::info!(
            at = "final_commit",
            topic = &*tp.0,
            partition = tp.1,
            offset
        );
    }
    for c in drained.left_uncommitted() {
        tracing::error!(
            at = "not_committed",
            topic = &*c.tp.0,
            partition = c.tp.1,
            acked_offset = c.offset,
            "acknowledged but not committed (refused, or no commit after a fatal error): the partition's next owner redelivers from its last committed offset"
        );
    }
    for (tp, released) in &drained.partitions {
        if commit && released.committed.is_none() && released.left.is_none() {
            tracing::info!(
                at = "final_commit",
                topic = &*tp.0,
                partition = tp.1,
                "nothing acknowledged, nothing committed"
            );
        }
    }
    for tp in halted {
        tracing::error!(
            at = "halted",
            topic = &*tp.0,
            partition = tp.1,
            "a processor failure stopped this partition"
        );
    }
}

/// Serves the main queue (rebalances, errors) until `until`, while the shutdown waits for
/// a rebalance to finish before it commits again. Every partition with a worker has its
/// own queue; a message here belongs to a partition assigned while stopping, which is
/// not processed: it is dropped uncommitted, for the next owner.
fn serve_until<P: Processor>(consumer: &AckdConsumer<P>, until: Instant) {
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
fn log_fatal<P: Processor>(consumer: &AckdConsumer<P>, code: Option<RDKafkaErrorCode>) {
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
    loop {
        let stop = tokio::select! {
            biased;
            changed = control.shutdown.changed() => {
                let deadline = *control.shutdown.borrow();
                match (changed, deadline) {
                    (_, Some(deadline)) => Some(Stop::Shutdown(deadline)),
                    (Err(_), None) => Some(Stop::Shutdown(Instant::now())),
                    (Ok(()), None) => None,
                }
            }
            _ = wait_at_end(control.at_end.as_deref()) => all_at_end(consumer, shutdown_timeout),
            Some(()) = control.commit_ticks.recv() => {
                commit_due(consumer);
                None
            }
            _ = control.limits_wanted.notified() => {
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
        return Some(Stop::Shutdown(Instant::now() + shutdown_timeout));
    }
    None
}

/// The commit interval passed: the committer commits what is uncommitted.
fn commit_due<P: Processor>(consumer: &AckdConsumer<P>) {
    let ctx = consumer.context();
    let _busy = ctx.health.busy(Busy::Commit);
    if let Some(committer) = ctx.committer.get() {
        committer.periodic(ctx.lock().uncommitted(None));
    }
}

/// A worker wants its dispatch limit raised: the committer commits its partition (and
/// any other that wants one) now.
fn limits_due<P: Processor>(consumer: &AckdConsumer<P>) {
    let ctx = consumer.context();
    let _busy = ctx.health.busy(Busy::Commit);
    if let Some(committer) = ctx.committer.get() {
        committer.limits(ctx.lock().limits_wanted());
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
