//! The latch a worker sets when it has returned.

use std::sync::{Condvar, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

/// A one-way flag that threads can wait on with a deadline (the rebalance callback
/// waits on plain threads, outside any async runtime), and tasks without blocking (a
/// partition's next worker waits for its previous one).
#[derive(Debug, Default)]
pub(super) struct Latch {
    set: Mutex<bool>,
    cond: Condvar,
    notify: Notify,
}

impl Latch {
    pub(super) fn set(&self) {
        *self.set.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cond.notify_all();
        self.notify.notify_waiters();
    }

    pub(super) fn is_set(&self) -> bool {
        *self.set.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the check: a set() in between still wakes us.
            notified.as_mut().enable();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }

    pub(super) fn wait_until(&self, deadline: Instant) -> bool {
        let mut set = self.set.lock().unwrap_or_else(|e| e.into_inner());
        while !*set {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            set = self
                .cond
                .wait_timeout(set, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}
