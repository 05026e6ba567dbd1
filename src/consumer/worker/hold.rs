//! A partition held while the group membership is in doubt (see
//! [`crate::consumer::membership`]): its worker starts no new processor call; the calls
//! under way finish. Lifted when the membership is confirmed; a stop ends the wait. A worker that
//! wakes from a stall of the process before the membership's watch does waits for it.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{watch, Notify};

use crate::consumer::membership;

#[derive(Debug, Default)]
pub struct Hold {
    held: AtomicBool,
    lifted: Notify,
}

impl Hold {
    /// Holds the partition: its worker starts nothing new until [`Hold::lift`].
    pub fn hold(&self) {
        self.held.store(true, Ordering::Release);
    }

    pub fn lift(&self) {
        self.held.store(false, Ordering::Release);
        self.lifted.notify_waiters();
    }

    /// One atomic load.
    pub fn is_held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// Resolves once the hold is lifted (at once if it is not held).
    pub async fn lifted(&self) {
        loop {
            let notified = self.lifted.notified();
            tokio::pin!(notified);
            // Registered before the check: a lift() in between still wakes us.
            notified.as_mut().enable();
            if !self.is_held() {
                return;
            }
            notified.await;
        }
    }

    /// Whether a new call may start: not held, and no stall of the process that the
    /// membership's watch has not seen yet ([`membership::stall_unseen`]).
    #[inline]
    pub fn may_start(&self) -> bool {
        !self.is_held() && !membership::stall_unseen()
    }

    /// Resolves once a new call may start.
    pub async fn startable(&self) {
        while !self.may_start() {
            membership::stall_seen().await;
            self.lifted().await;
        }
    }

    /// Waits until a new call may start; false if told to stop meanwhile.
    pub async fn wait_unless_stopped(&self, stop: &mut watch::Receiver<bool>) -> bool {
        if self.may_start() {
            return true;
        }
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => false,
            _ = self.startable() => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_held_partition_waits_until_lifted_or_stopped() {
        let hold = Arc::new(Hold::default());
        let (stop_tx, mut stop) = watch::channel(false);
        assert!(
            hold.wait_unless_stopped(&mut stop).await,
            "not held: no wait"
        );

        hold.hold();
        let waiting = {
            let (hold, mut stop) = (hold.clone(), stop.clone());
            tokio::spawn(async move { hold.wait_unless_stopped(&mut stop).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "held: it waits");
        hold.lift();
        assert!(waiting.await.unwrap(), "lifted: it goes on");

        hold.hold();
        let waiting = tokio::spawn({
            let hold = hold.clone();
            async move { hold.wait_unless_stopped(&mut stop).await }
        });
        stop_tx.send(true).unwrap();
        assert!(!waiting.await.unwrap(), "stopped while held");
    }
}
