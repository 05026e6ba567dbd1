//! The pool: one slot per child, fed from one queue of jobs; a slot replaces its child
//! when it fails and stops it at shutdown.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::child::Running;
use super::config::ExecConfig;
use super::serve::{serve, Ended, Failed, Job};

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

impl Pool {
    /// `config.concurrency` slots, each starting its child.
    pub(super) fn start(config: Arc<ExecConfig>, restarts: Arc<AtomicU64>) -> Pool {
        // Jobs wait here for a free child: at most one per partition, or
        // ACKD_CONCURRENCY per partition with key or none ordering.
        let (jobs, rx) = mpsc::channel(1024);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let (stop, stop_rx) = watch::channel(None);
        let slots = (0..config.concurrency)
            .map(|id| {
                tokio::spawn(slot(
                    id,
                    config.clone(),
                    rx.clone(),
                    stop_rx.clone(),
                    restarts.clone(),
                ))
            })
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
    config: Arc<ExecConfig>,
    jobs: Arc<tokio::sync::Mutex<mpsc::Receiver<Job>>>,
    mut stop: watch::Receiver<Option<Instant>>,
    restarts: Arc<AtomicU64>,
) {
    let mut backoff = RESTART_INITIAL;
    loop {
        if stop.borrow().is_some() {
            return;
        }
        let (ended, running) = match Running::start(id, &config) {
            Ok(mut running) => {
                let (ended, answered) = serve(&mut running, &config, &jobs, &mut stop).await;
                if answered {
                    backoff = RESTART_INITIAL;
                }
                (ended, Some(running))
            }
            Err(e) => (Ended::Failed(format!("cannot start sh: {e}"), None), None),
        };
        let (reason, failed) = match ended {
            Ended::Stop(deadline) => {
                if let Some(running) = running {
                    running.stop(deadline).await;
                }
                return;
            }
            Ended::Failed(reason, failed) => (reason, failed),
        };
        let (pid, ran_ms) = match running {
            Some(mut running) => {
                running.kill().await;
                (
                    Some(running.pid),
                    Some(running.started.elapsed().as_millis() as u64),
                )
            }
            None => (None, None),
        };
        if let Some(Failed { reply, error }) = failed {
            let _ = reply.send(Err(error));
        }
        let total = restarts.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(
            at = "exec_restart",
            child = id,
            pid,
            reason,
            ran_ms,
            delay_ms = backoff.as_millis() as u64,
            restarts = total,
            "count#exec.restarts" = 1
        );
        tokio::select! {
            biased;
            _ = stop.wait_for(Option::is_some) => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(RESTART_MAX);
    }
}
