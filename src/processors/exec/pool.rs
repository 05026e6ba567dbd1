//! The pool: one slot per child, fed by the dispatch; a slot replaces its child when it
//! fails and stops it at shutdown.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::settings::ExecSettings;

use super::child::Running;
use super::dispatch::Dispatch;
use super::dispatch::Job;
use super::held::{Held, Load};
use super::serve::{child_failed, restart_reason, Ended, Service};

/// First wait before a failed child is started again; doubles per failure in a row.
const RESTART_INITIAL: Duration = Duration::from_millis(100);
/// Longest wait before a restart.
const RESTART_MAX: Duration = Duration::from_secs(10);

/// The running pool (started on the first message: children need the runtime).
pub(super) struct Pool {
    pub(super) jobs: mpsc::Sender<Job>,
    pub(super) stop: watch::Sender<Option<Instant>>,
    pub(super) slots: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// What every slot shares.
struct Shared {
    config: Arc<ExecSettings>,
    dispatch: Arc<Dispatch>,
    /// Requests a failed child had in its inbox but was never given: handed out again.
    handed_back: mpsc::UnboundedSender<Job>,
    restarts: Arc<AtomicU64>,
}

impl Pool {
    /// `config.concurrency` slots, each starting its child, and the dispatch.
    pub(super) fn start(config: Arc<ExecSettings>, restarts: Arc<AtomicU64>) -> Pool {
        // Jobs wait here for a child with room: the workers bound how many (one per
        // partition, or ACKD_CONCURRENCY per partition with key or none ordering).
        let (jobs, jobs_rx) = mpsc::channel(1024);
        let (stop, stop_rx) = watch::channel(None);
        let (dispatch, inboxes) = Dispatch::new(config.concurrency, config.in_flight);
        let (handed_back, handed_back_rx) = mpsc::unbounded_channel();
        tokio::spawn(
            dispatch
                .clone()
                .run(jobs_rx, handed_back_rx, stop_rx.clone()),
        );
        let shared = Arc::new(Shared {
            config,
            dispatch,
            handed_back,
            restarts,
        });
        let slots = inboxes
            .into_iter()
            .enumerate()
            .map(|(id, inbox)| tokio::spawn(slot(id, shared.clone(), inbox, stop_rx.clone())))
            .collect();
        Pool {
            jobs,
            stop,
            slots: Mutex::new(slots),
        }
    }
}

/// One slot of the pool: runs a child, replaces it when it fails, stops it at shutdown.
async fn slot(
    id: usize,
    shared: Arc<Shared>,
    mut inbox: mpsc::UnboundedReceiver<Job>,
    mut stop: watch::Receiver<Option<Instant>>,
) {
    let mut backoff = RESTART_INITIAL;
    loop {
        if stop.borrow().is_some() {
            return;
        }
        let (ended, running) = match Running::start(id, &shared.config) {
            Ok(mut running) => {
                shared.dispatch.set_serving(id, true);
                let service = Service {
                    running: &mut running,
                    config: &shared.config,
                    inbox: &mut inbox,
                    dispatch: &shared.dispatch,
                    stop: &mut stop,
                    handed_back: &shared.handed_back,
                };
                let (ended, answered) = service.run().await;
                shared.dispatch.set_serving(id, false);
                if answered {
                    backoff = RESTART_INITIAL;
                }
                (ended, Some(running))
            }
            Err(e) => (
                Ended::Failed(format!("cannot start sh: {e}"), Vec::new(), Load::Unknown),
                None,
            ),
        };
        let (reason, held, load) = match ended {
            Ended::Stop(deadline) => {
                if let Some(running) = running {
                    running.stop(deadline).await;
                }
                return;
            }
            Ended::Failed(reason, held, load) => (reason, held, load),
        };
        hand_back(id, &shared, &mut inbox);
        replace(id, &shared, running, (&reason, load), held, backoff).await;
        tokio::select! {
            biased;
            _ = stop.wait_for(Option::is_some) => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RESTART_MAX);
    }
}

/// What a failed child's inbox still has (never given to it) goes to another child, as
/// it is: no child saw it, so its request still says what it said (`"redelivered"`,
/// `"attempt"`). What the child held fails instead (`replace`): its retry is a new
/// request, rendered again as a redelivery.
fn hand_back(id: usize, shared: &Shared, inbox: &mut mpsc::UnboundedReceiver<Job>) {
    while let Ok(job) = inbox.try_recv() {
        shared.dispatch.release(id);
        let _ = shared.handed_back.send(job);
    }
}

/// Ends a failed child, then fails what it held (retryable: retried, never
/// acknowledged) and logs the restart.
async fn replace(
    id: usize,
    shared: &Shared,
    running: Option<Running>,
    (reason, load): (&str, Load),
    held: Vec<Held>,
    backoff: Duration,
) {
    let logged = restart_reason(reason, &held);
    let (pid, ran_ms) = match running {
        Some(mut running) => {
            running.kill().await;
            for h in held {
                let error = child_failed(&running, reason, &h);
                shared.dispatch.release(id);
                h.send(Err(error), load);
            }
            let ran_ms = running.started.elapsed().as_millis() as u64;
            (Some(running.pid), Some(ran_ms))
        }
        None => (None, None),
    };
    let total = shared.restarts.fetch_add(1, Ordering::Relaxed) + 1;
    tracing::warn!(
        at = "exec_restart",
        child = id,
        pid,
        reason = logged,
        ran_ms,
        delay_ms = backoff.as_millis() as u64,
        restarts = total,
        "count#exec.restarts" = 1
    );
}
