//! The graceful stop, whole: what a signal does, the stop's clock, and its sequence on
//! both threads that take part.
//!
//! - The first SIGTERM or SIGINT starts a graceful stop with a deadline of
//!   `ACKD_SHUTDOWN_TIMEOUT_MS`; more SIGTERMs are logged and ignored (Heroku may send
//!   several), and so is a first SIGINT after a SIGTERM (a process manager's SIGTERM and
//!   the terminal's Ctrl-C); a second SIGINT (Ctrl-C twice) exits at once, saying what
//!   was not committed; before anything is consumed, either one exits 0 at once.
//! - The daemon (the `main` thread's future) starts the [`StopClock`] and announces it,
//!   which wakes the supervisor; the supervisor ([`sequence`]) stops fetching, drains,
//!   commits, reports the exit code, and closes. The supervisor may also stop on its own
//!   (a fatal error, `ACKD_STOP_AT_END`): it starts the clock then.
//! - Two channels between the two threads: the clock (a watch, daemon to supervisor) and
//!   the supervisor's [`Report`]s (an mpsc, supervisor to daemon: its own stop, the final
//!   commit's exit code, its return).
//! - The daemon waits for the supervisor's code, a second SIGINT, or the deadline; past
//!   the deadline ackd exits non-zero with an account of what was not committed.
//! - A revoke under way when the stop begins reads the clock, and ends by its times.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rdkafka::bindings as rdsys;
use rdkafka::consumer::Consumer;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook_tokio::Signals;
use tokio::sync::{mpsc, watch};

use crate::consumer::committer::Reason;
use crate::consumer::group::{log_release_unmarked, AckdConsumer, Group, Outcome};
use crate::consumer::supervisor::{log_fatal, serve_until, Control};
use crate::exit;
use crate::output::health::{Health, Phase};
use crate::output::metrics::millis;
use crate::output::TopicPartition;
use crate::processors::processor::Processor;

/// Installs the handlers of SIGTERM and SIGINT. `Err(code)`: they could not be.
pub(crate) fn install() -> Result<Signals, i32> {
    Signals::new([SIGTERM, SIGINT]).map_err(|e| {
        tracing::error!(at = "start_failed", error = %e, "cannot install signal handlers");
        exit::SOFTWARE
    })
}

/// Only a second SIGINT forces the exit: a person pressing Ctrl-C again. A SIGTERM never
/// does (Heroku may send several), nor does a first SIGINT after a SIGTERM: a process
/// manager (honcho, overmind, foreman) sends SIGTERM to its children while the terminal's
/// Ctrl-C sends SIGINT to the same process group, and both arrive together.
#[derive(Debug, Default)]
pub(crate) struct SigintCount(u32);

impl SigintCount {
    /// The count once `first` started the stop.
    pub(crate) fn after(first: Option<i32>) -> Self {
        SigintCount(u32::from(first == Some(SIGINT)))
    }

    /// Counts a signal received while stopping; true if it forces the exit.
    pub(crate) fn forces(&mut self, signal: Option<i32>) -> bool {
        if signal == Some(SIGINT) {
            self.0 += 1;
        }
        self.0 >= 2
    }
}

/// The name of `signal` in the `signal=` field of a line.
pub(crate) fn signal_name(signal: Option<i32>) -> &'static str {
    match signal {
        Some(SIGTERM) => "SIGTERM",
        Some(SIGINT) => "SIGINT",
        _ => "unknown",
    }
}

/// A signal before anything was consumed (while ackd waited for its topics, or counted
/// their partitions): ackd exits at once, 0.
pub(crate) fn stopped_while_waiting(signal: Option<i32>) -> i32 {
    tracing::info!(
        at = "signal",
        signal = signal_name(signal),
        "stopped before consuming anything: nothing to commit"
    );
    exit::OK
}

/// The graceful stop's clock: unset until the stop begins, then its deadline and the
/// points its steps must end by; also how the daemon tells the supervisor that the stop
/// began. The daemon starts it on the signal, before anything else, and wakes the
/// supervisor's poll loop once its own line is written ([`StopClock::announce`]). The
/// supervisor learns of the stop only between polls, and a revoke runs inside a poll: a
/// revoke under way reads this clock while it waits, so that it cannot eat the time of
/// the final commit of the partitions it does not release.
pub struct StopClock(watch::Sender<Option<StopTimes>>);

impl Default for StopClock {
    fn default() -> Self {
        StopClock(watch::channel(None).0)
    }
}

/// When each step of a graceful stop must be over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopTimes {
    /// When the process must have committed (it exits then at the latest).
    pub deadline: Instant,
    /// When draining in-flight messages must end: the deadline less
    /// [`crate::settings::commit_reserve`], kept for the commits and the close.
    pub drain_until: Instant,
    /// When a revoke's commit under way at the stop must end: half the reserve is left
    /// for the final commit of the other partitions.
    pub revoke_commit_until: Instant,
}

impl StopClock {
    /// Starts the clock for a stop that began at `begun` and must end by `deadline`;
    /// the first call wins. Returns the clock's times.
    /// Readers see the times at once; the supervisor's poll loop is not woken
    /// ([`StopClock::announce`] does that).
    pub fn begin(&self, begun: Instant, deadline: Instant) -> StopTimes {
        let mut started = None;
        // `false`: the times change without waking the watch's receivers.
        self.0.send_if_modified(|times| {
            started = Some(*times.get_or_insert_with(|| {
                let reserve =
                    crate::settings::commit_reserve(deadline.saturating_duration_since(begun));
                StopTimes {
                    deadline,
                    drain_until: deadline - reserve,
                    revoke_commit_until: deadline - reserve / 2,
                }
            }));
            false
        });
        started.expect("set inside the closure")
    }

    /// Wakes the supervisor's poll loop: the stop began.
    pub(crate) fn announce(&self) {
        self.0.send_modify(|_| {});
    }

    /// The stop's times, once it began.
    pub fn times(&self) -> Option<StopTimes> {
        *self.0.borrow()
    }

    /// What the supervisor's poll loop waits on. Taken before its thread starts, so that
    /// no announce can come before it.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<StopTimes>> {
        self.0.subscribe()
    }
}

/// How often a wait that a stop may cut short looks at the [`StopClock`].
pub(crate) const STOP_CHECK: Duration = Duration::from_millis(50);

/// Sleeps until `until`, or until `deadline()` (which a stop may bring forward) if sooner.
pub(crate) fn sleep_until(until: Instant, deadline: &dyn Fn() -> Instant) {
    loop {
        let now = Instant::now();
        let end = until.min(deadline());
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(STOP_CHECK));
    }
}

/// What the supervisor tells the daemon, in this order: the one channel from its
/// thread to the daemon.
pub(crate) enum Report {
    /// It stops on its own (a fatal error): the deadline, which the daemon holds as it
    /// does after a signal, and the exit code.
    Stopping { deadline: Instant, code: i32 },
    /// The final commit is done: the exit code, before the (possibly slow) close.
    Committed(i32),
    /// The supervisor returned: the exit code.
    Done(i32),
}

/// The daemon's end of the supervisor's reports; closed (`None`) if its thread ended
/// without a last one.
pub(crate) type Reports = mpsc::UnboundedReceiver<Report>;

/// A graceful stop under way: its deadline, and what the daemon waits for.
pub(crate) struct Stopping {
    deadline: Instant,
    /// The supervisor's exit code when it stopped on its own (a fatal error).
    fatal_code: Option<i32>,
    sigints: SigintCount,
    /// The final commit's exit code, if the supervisor reported it before the stop.
    committed: Option<i32>,
    reports: Reports,
}

/// Running: until a signal, or the supervisor stops on its own (a fatal error: it says
/// so with its deadline first, then stops as after a signal). `Err(code)`: the
/// supervisor returned first; ackd exits with `code`.
pub(crate) async fn until_stop<P: Processor>(
    timeout: Duration,
    clock: &StopClock,
    health: &Health,
    signals: &mut Signals,
    mut reports: Reports,
    processor: &Arc<P>,
) -> Result<Stopping, i32> {
    // A stop of the supervisor's own without a deadline to hold (`ACKD_STOP_AT_END`)
    // reports its final commit here, then returns.
    let mut committed = None;
    let (deadline, fatal_code, sigints) = loop {
        tokio::select! {
            s = signals.next() => {
                let deadline = begin_stop(s, timeout, clock, health);
                break (deadline, None, SigintCount::after(s));
            }
            report = reports.recv() => match report {
                Some(Report::Stopping { deadline, code }) => {
                    break (deadline, Some(code), SigintCount::default());
                }
                Some(Report::Committed(code)) => committed = Some(code),
                Some(Report::Done(_)) | None => {
                    stop_processor(processor.clone(), Instant::now() + timeout).await;
                    return Err(done_code(report));
                }
            }
        }
    };
    Ok(Stopping {
        deadline,
        fatal_code,
        sigints,
        committed,
        reports,
    })
}

/// The exit code the supervisor returned (`Done`), or, if its thread ended without
/// saying, [`exit::SOFTWARE`].
fn done_code(report: Option<Report>) -> i32 {
    match report {
        Some(Report::Done(code)) => code,
        _ => exit::SOFTWARE,
    }
}

/// `signal` starts the graceful stop: its deadline, `timeout` from now.
fn begin_stop(
    signal: Option<i32>,
    timeout: Duration,
    clock: &StopClock,
    health: &Health,
) -> Instant {
    let begun = Instant::now();
    let deadline = begun + timeout;
    // The clock before the line: a revoke holding the supervisor reads only the
    // clock, and writing a line may wait for room while a slow stdout takes the queue.
    // The line before the announce: the supervisor's lines of the stop come after it.
    health.set_phase(Phase::Stopping);
    clock.begin(begun, deadline);
    tracing::info!(
        at = "signal",
        signal = signal_name(signal),
        deadline_ms = timeout.as_millis() as u64,
        "graceful stop: stop fetching, finish in-flight messages, commit, leave the group"
    );
    clock.announce();
    deadline
}

/// The graceful stop, until the supervisor returns (the exit code it gives), a second
/// SIGINT, or the deadline.
pub(crate) async fn finish_stop<P: Processor>(
    mut stopping: Stopping,
    signals: &mut Signals,
    group: &Mutex<Group>,
    processor: Arc<P>,
) -> i32 {
    let deadline = stopping.deadline;
    let mut committed_code = stopping.committed;
    // The processor's shutdown runs once the final commit is done, beside the close.
    let mut processor_stop =
        committed_code.map(|_| tokio::spawn(stop_processor(processor.clone(), deadline)));
    loop {
        tokio::select! {
            report = stopping.reports.recv() => match report {
                // Its own stop's report, crossing the signal's: the signal's deadline holds.
                Some(Report::Stopping { .. }) => {}
                Some(Report::Committed(code)) => {
                    committed_code = Some(code);
                    processor_stop =
                        Some(tokio::spawn(stop_processor(processor.clone(), deadline)));
                }
                Some(Report::Done(_)) | None => {
                    match processor_stop.take() {
                        Some(task) => {
                            let _ = task.await;
                        }
                        None => stop_processor(processor, deadline).await,
                    }
                    return done_code(report);
                }
            },
            s = signals.next() => {
                if stopping.sigints.forces(s) {
                    tracing::warn!(at = "signal", signal = "SIGINT", "second SIGINT: exiting now");
                    log_uncommitted(group);
                    return exit::FORCED;
                }
                tracing::info!(
                    at = "signal",
                    signal = signal_name(s),
                    "already stopping; a second SIGINT exits at once"
                );
            }
            _ = tokio::time::sleep_until(deadline.into()) => {
                return deadline_passed(committed_code, stopping.fatal_code, group);
            }
        }
    }
}

/// The deadline passed: the exit code, `committed_code` if the final commit was done.
fn deadline_passed(
    committed_code: Option<i32>,
    fatal_code: Option<i32>,
    group: &Mutex<Group>,
) -> i32 {
    match committed_code {
        // Committed; only the close (leaving the group) is slow. The group
        // notices after session.timeout.ms instead.
        Some(code) => {
            tracing::warn!(
                at = "close_timeout",
                "leaving the group did not finish before the deadline; offsets are committed"
            );
            code
        }
        None => {
            tracing::error!(
                at = "shutdown_timeout",
                "the deadline passed before the final commit was answered; the lines below say, per partition, what that leaves"
            );
            log_uncommitted(group);
            // A fatal error's own code says more than "incomplete".
            fatal_code.unwrap_or(exit::INCOMPLETE)
        }
    }
}

/// The processor's shutdown hook, bounded by `deadline`. (Paths that give up at the
/// deadline skip it: what the processor holds is dropped with the runtime.)
async fn stop_processor<P: Processor>(processor: Arc<P>, deadline: Instant) {
    let _ = tokio::time::timeout_at(deadline.into(), processor.shutdown(deadline)).await;
}

/// Says, per partition, what was acknowledged and not committed: what will be
/// redelivered; or, where everything acknowledged is committed and only the release mark
/// is not, that nothing is.
fn log_uncommitted(group: &Mutex<Group>) {
    let Ok(group) = group.try_lock() else {
        tracing::error!(
            at = "uncommitted",
            "partition state is busy; see the lines above for the last commits"
        );
        return;
    };
    for (tp, p) in &group.owned {
        if group.only_the_mark_left(tp) {
            if let Some(offset) = p.committed {
                log_release_unmarked(
                    tp,
                    offset,
                    Reason::Shutdown,
                    &"the process exits before it is answered",
                );
                continue;
            }
        }
        tracing::error!(
            at = "uncommitted",
            topic = &*tp.0,
            partition = tp.1,
            acked_offset = p.worker.shared.committable(),
            committed_offset = p.committed,
            "redelivery starts at the committed offset"
        );
    }
}

/// Why the poll loop ended.
pub(crate) enum Stop {
    /// A stop asked for (a signal, `ACKD_STOP_AT_END`): drain and commit by this
    /// deadline; exit 0 unless something is left uncommitted.
    Graceful(Instant),
    /// ackd cannot go on (a fatal librdkafka error, an invariant broken): stop gracefully
    /// with this exit code, committing what was acknowledged only if `commit`.
    Fatal { code: i32, commit: bool },
}

/// The supervisor's side of the stop, once its poll loop ended; returns the exit code:
/// start the [`StopClock`] (unless the signal did) → stop fetching → release every
/// partition ([`crate::consumer::group::GroupContext::release_at_stop`]: drain, final
/// commit, forget) → report per partition → tell the daemon the code → close.
pub(crate) fn sequence<P: Processor>(
    consumer: Arc<AckdConsumer<P>>,
    stop: Stop,
    mut control: Control,
    shutdown_timeout: Duration,
) -> i32 {
    let (deadline, mut code, commit) = stop_terms(&stop, &mut control, shutdown_timeout);
    consumer.context().health.set_phase(match stop {
        Stop::Graceful(_) => Phase::Stopping,
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
    let drained = ctx.release_at_stop(&tps, times, commit, &serve);
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
    // The halted partitions as the drain left them: a call that fails for good during
    // the drain halts its partition then, and the stop is not clean either.
    let halted = halted_after(&drained, halted);
    report(&drained, commit, &halted);
    if code == exit::OK && (!complete || !halted.is_empty()) {
        code = exit::INCOMPLETE;
    }
    if !ctx.metrics_interval.is_zero() {
        ctx.summarize(true);
    }
    let _ = control.reports.send(Report::Committed(code));

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
        Stop::Graceful(deadline) => (deadline, exit::OK, true),
        Stop::Fatal { code, commit } => {
            let deadline = Instant::now() + shutdown_timeout;
            let _ = control.reports.send(Report::Stopping { deadline, code });
            (deadline, code, commit)
        }
    }
}

/// The partitions owned as the stop begins, and those of them halted by a failure so
/// far (where). A call under way may still halt its partition during the drain: the
/// release says so ([`halted_after`]).
fn owned_and_halted<P: Processor>(
    consumer: &AckdConsumer<P>,
) -> (Vec<TopicPartition>, Vec<(TopicPartition, i64)>) {
    let ctx = consumer.context();
    let group = ctx.lock();
    let tps: Vec<TopicPartition> = group.owned.keys().cloned().collect();
    let halted = group
        .owned
        .iter()
        .filter_map(|(tp, p)| p.worker.shared.halted_at().map(|o| (tp.clone(), o)))
        .collect();
    (tps, halted)
}

/// The partitions halted once the release is over, and where: those its drain left
/// halted, and those halted as the stop began that a revoke served during the stop
/// released instead.
fn halted_after(
    drained: &Outcome,
    at_start: Vec<(TopicPartition, i64)>,
) -> Vec<(TopicPartition, i64)> {
    let mut halted: Vec<(TopicPartition, i64)> = drained
        .halted()
        .map(|(tp, offset)| (tp.clone(), offset))
        .collect();
    for (tp, offset) in at_start {
        if !drained.partitions.iter().any(|(t, _)| *t == tp) {
            halted.push((tp, offset));
        }
    }
    halted
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
/// (and redelivered), and the partitions a processor failure halted (before the stop or
/// during its drain).
fn report(drained: &Outcome, commit: bool, halted: &[(TopicPartition, i64)]) {
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
    for (tp, offset) in halted {
        tracing::error!(
            at = "halted",
            topic = &*tp.0,
            partition = tp.1,
            offset,
            "a processor failure stopped this partition"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The signals received, the first one starting the stop: whether the last forced it.
    fn forced(signals: &[i32]) -> bool {
        let mut count = SigintCount::after(Some(signals[0]));
        signals[1..].iter().any(|&s| count.forces(Some(s)))
    }

    #[test]
    fn only_a_second_sigint_forces_the_exit() {
        assert!(forced(&[SIGINT, SIGINT]));
        assert!(forced(&[SIGINT, SIGTERM, SIGINT]));
        assert!(forced(&[SIGTERM, SIGINT, SIGINT]));
        assert!(!forced(&[SIGTERM, SIGINT]));
        assert!(!forced(&[SIGINT, SIGTERM]));
        assert!(!forced(&[SIGTERM, SIGTERM, SIGTERM]));
    }

    #[test]
    fn the_stop_clock_keeps_its_first_start_and_a_reserve_for_the_commits() {
        let clock = StopClock::default();
        assert_eq!(clock.times(), None);
        let begun = Instant::now();
        let times = clock.begin(begun, begun + Duration::from_secs(25));
        // A fifth of 25 s is kept: the drain ends at 20 s, a revoke's commit at 22.5 s.
        assert_eq!(times.drain_until, begun + Duration::from_secs(20));
        assert_eq!(
            times.revoke_commit_until,
            begun + Duration::from_millis(22_500)
        );
        // The supervisor's own start after the daemon's changes nothing.
        let later = begun + Duration::from_secs(1);
        assert_eq!(clock.begin(later, later + Duration::from_secs(25)), times);
        assert_eq!(clock.times(), Some(times));
    }
}
