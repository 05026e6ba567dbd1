//! Stopping: until a signal (or the supervisor's own stop), then the graceful stop until
//! the supervisor returns, a second SIGINT, or the deadline.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use signal_hook_tokio::Signals;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::running::Supervisor;
use super::start::Parts;
use crate::config::settings::Settings;
use crate::consumer::committer::Reason;
use crate::consumer::group::{log_release_unmarked, Group};
use crate::consumer::signals::{signal_name, SigintCount};
use crate::exit;
use crate::output::health::Phase;
use crate::processors::processor::Processor;

/// A graceful stop under way: its deadline, and what the daemon waits for.
pub(super) struct Stopping {
    deadline: Instant,
    /// The supervisor's exit code when it stopped on its own (a fatal error).
    fatal_code: Option<i32>,
    sigints: SigintCount,
    committed: oneshot::Receiver<i32>,
    done: oneshot::Receiver<i32>,
    /// Held until ackd exits, like the supervisor's other channels.
    _shutdown: watch::Sender<Option<Instant>>,
    _fatal: oneshot::Receiver<(Instant, i32)>,
}

/// Running: until a signal, or the supervisor stops on its own (a fatal error: it says
/// so with its deadline first, then stops as after a signal). `Err(code)`: the
/// supervisor returned first; ackd exits with `code`.
pub(super) async fn until_stop<P: Processor>(
    settings: &Settings,
    parts: &Parts,
    signals: &mut Signals,
    supervisor: Supervisor,
    ticker: JoinHandle<()>,
    processor: &Arc<P>,
) -> Result<Stopping, i32> {
    let Supervisor {
        shutdown,
        committed,
        mut done,
        mut fatal,
    } = supervisor;
    let (deadline, fatal_code, sigints) = tokio::select! {
        s = signals.next() => {
            let deadline = begin_stop(s, settings.shutdown_timeout, parts, &ticker, &shutdown);
            (deadline, None, SigintCount::after(s))
        }
        Ok((deadline, code)) = &mut fatal => {
            ticker.abort();
            (deadline, Some(code), SigintCount::default())
        }
        code = &mut done => {
            ticker.abort();
            stop_processor(processor.clone(), Instant::now() + settings.shutdown_timeout).await;
            return Err(code.unwrap_or(exit::SOFTWARE));
        }
    };
    Ok(Stopping {
        deadline,
        fatal_code,
        sigints,
        committed,
        done,
        _shutdown: shutdown,
        _fatal: fatal,
    })
}

/// `signal` starts the graceful stop: its deadline, `timeout` from now.
fn begin_stop(
    signal: Option<i32>,
    timeout: Duration,
    parts: &Parts,
    ticker: &JoinHandle<()>,
    shutdown: &watch::Sender<Option<Instant>>,
) -> Instant {
    let begun = Instant::now();
    let deadline = begun + timeout;
    // The clock before the line: a revoke holding the supervisor reads only the
    // clock, and writing a line may wait (at most lines::STALL) on a slow stdout.
    // The line before the watch: the supervisor's lines of the stop come after it.
    parts.health.set_phase(Phase::Stopping);
    parts.stop_clock.begin(begun, deadline);
    ticker.abort();
    tracing::info!(
        at = "signal",
        signal = signal_name(signal),
        deadline_ms = timeout.as_millis() as u64,
        "graceful stop: stop fetching, finish in-flight messages, commit, leave the group"
    );
    let _ = shutdown.send(Some(deadline));
    deadline
}

/// The graceful stop, until the supervisor returns (the exit code it gives), a second
/// SIGINT, or the deadline.
pub(super) async fn finish_stop<P: Processor>(
    mut stopping: Stopping,
    signals: &mut Signals,
    group: &Mutex<Group>,
    processor: Arc<P>,
) -> i32 {
    let deadline = stopping.deadline;
    let mut committed_code = None;
    // The processor's shutdown runs once the final commit is done, beside the close.
    let mut processor_stop = None;
    loop {
        tokio::select! {
            code = &mut stopping.done => {
                match processor_stop.take() {
                    Some(task) => {
                        let _ = task.await;
                    }
                    None => stop_processor(processor, deadline).await,
                }
                return code.unwrap_or(exit::SOFTWARE);
            }
            code = &mut stopping.committed, if committed_code.is_none() => {
                committed_code = Some(code.unwrap_or(exit::SOFTWARE));
                processor_stop = Some(tokio::spawn(stop_processor(processor.clone(), deadline)));
            }
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
