//! Running: the supervisor thread, which owns the consumer, and the commit schedule.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

use super::start::Parts;
use crate::consumer::group::AckdConsumer;
use crate::consumer::supervisor::{self, Control};
use crate::exit;
use crate::processors::processor::Processor;

/// The daemon's ends of the channels to the supervisor thread.
pub(super) struct Supervisor {
    /// Told the deadline when a graceful stop begins.
    pub(super) shutdown: watch::Sender<Option<Instant>>,
    /// The exit code once the final commit is done, before the (possibly slow) close.
    pub(super) committed: oneshot::Receiver<i32>,
    /// The exit code once the supervisor has returned.
    pub(super) done: oneshot::Receiver<i32>,
    /// The deadline and the exit code when the supervisor stops on its own (a fatal
    /// error).
    pub(super) fatal: oneshot::Receiver<(Instant, i32)>,
}

/// Hands the consumer to the supervisor thread: its channels, and the sender of the
/// commit ticks. `Err(code)`: the thread could not be started.
pub(super) fn start_supervisor<P: Processor>(
    consumer: Arc<AckdConsumer<P>>,
    parts: &Parts,
    timeout: Duration,
) -> Result<(Supervisor, mpsc::Sender<()>), i32> {
    let (tick_tx, commit_ticks) = mpsc::channel(1);
    let (shutdown_tx, shutdown) = watch::channel(None);
    let (committed_tx, committed_rx) = oneshot::channel();
    let (done_tx, done_rx) = oneshot::channel();
    let (fatal_tx, fatal_rx) = oneshot::channel();
    let control = Control {
        commit_ticks,
        at_end: parts.at_end.clone(),
        limits_wanted: parts.limits_wanted.clone(),
        shutdown,
        committed: committed_tx,
        fatal: Some(fatal_tx),
    };
    let spawned = std::thread::Builder::new()
        .name("ackd-supervisor".into())
        .spawn(move || {
            let code = supervisor::run(consumer, control, timeout);
            let _ = done_tx.send(code);
        });
    if let Err(e) = spawned {
        tracing::error!(at = "start_failed", error = %e, "cannot start the supervisor thread");
        return Err(exit::SOFTWARE);
    }
    let supervisor = Supervisor {
        shutdown: shutdown_tx,
        committed: committed_rx,
        done: done_rx,
        fatal: fatal_rx,
    };
    Ok((supervisor, tick_tx))
}

/// A tick to the supervisor every `interval` (ACKD_COMMIT_INTERVAL_MS): a commit is due.
pub(super) fn spawn_ticker(
    interval: Duration,
    tick_tx: mpsc::Sender<()>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        loop {
            every.tick().await;
            // A full channel means a commit is already due: skipping the tick is right.
            if let Err(mpsc::error::TrySendError::Closed(_)) = tick_tx.try_send(()) {
                break;
            }
        }
    })
}
