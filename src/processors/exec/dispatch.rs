//! A request for a child ([`Job`]) and which child gets it: of the children serving,
//! the one with the fewest requests in flight, among those holding fewer than
//! `ACKD_EXEC_IN_FLIGHT`. A request waits here while every child is full (or being
//! replaced).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::{mpsc, oneshot, watch, Notify};

use super::held::Reply;
use super::protocol::Sent;
use crate::processors::processor::Queued;

/// How loaded each child is, and the way to hand it a request.
pub(super) struct Dispatch {
    loads: Mutex<Vec<Load>>,
    /// A child has room again (answered, failed, or started).
    room: Notify,
    /// Requests one child holds at most.
    limit: usize,
}

struct Load {
    /// Requests handed to it, not yet answered or given back.
    held: usize,
    /// It runs and takes requests (not starting, failed or stopping).
    serving: bool,
    inbox: mpsc::UnboundedSender<Job>,
}

impl Dispatch {
    /// A dispatch for `children` children of `limit` requests each, and each child's
    /// inbox (the slot keeps it across restarts of its child).
    pub(super) fn new(
        children: usize,
        limit: usize,
    ) -> (Arc<Dispatch>, Vec<mpsc::UnboundedReceiver<Job>>) {
        let (loads, inboxes) = (0..children)
            .map(|_| {
                let (inbox, rx) = mpsc::unbounded_channel();
                let load = Load {
                    held: 0,
                    serving: false,
                    inbox,
                };
                (load, rx)
            })
            .unzip();
        let dispatch = Dispatch {
            loads: Mutex::new(loads),
            room: Notify::new(),
            limit: limit.max(1),
        };
        (Arc::new(dispatch), inboxes)
    }

    fn loads(&self) -> MutexGuard<'_, Vec<Load>> {
        self.loads.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands `job` to the serving child with the fewest held that has room; gives it
    /// back when none has.
    fn try_hand(&self, job: Job) -> Result<(), Job> {
        let mut loads = self.loads();
        let emptiest = loads
            .iter_mut()
            .filter(|l| l.serving && l.held < self.limit)
            .min_by_key(|l| l.held);
        let Some(load) = emptiest else {
            return Err(job);
        };
        // Sent under the lock: a child that stops serving takes no job after that.
        load.inbox.send(job).map_err(|e| e.0)?;
        load.held += 1;
        Ok(())
    }

    /// `child` is done with one request it was handed (answered, failed, dropped or
    /// given back).
    pub(super) fn release(&self, child: usize) {
        if let Some(load) = self.loads().get_mut(child) {
            load.held = load.held.saturating_sub(1);
        }
        self.room.notify_one();
    }

    /// Whether `child` takes requests: true once it started, false from the moment it
    /// failed or a stop began.
    pub(super) fn set_serving(&self, child: usize, serving: bool) {
        if let Some(load) = self.loads().get_mut(child) {
            load.serving = serving;
        }
        if serving {
            self.room.notify_one();
        }
    }

    /// Hands out `jobs` (and those a failed child `handed_back` before it had them)
    /// until a stop begins or the processor is dropped.
    pub(super) async fn run(
        self: Arc<Self>,
        mut jobs: mpsc::Receiver<Job>,
        mut handed_back: mpsc::UnboundedReceiver<Job>,
        mut stop: watch::Receiver<Option<Instant>>,
    ) {
        loop {
            let job = tokio::select! {
                biased;
                _ = stop.wait_for(Option::is_some) => return,
                Some(job) = handed_back.recv() => job,
                job = jobs.recv() => match job {
                    Some(job) => job,
                    None => return,
                },
            };
            if !self.hand_when_room(job, &mut stop).await {
                return;
            }
        }
    }

    /// Hands `job` out once a child has room and its partition may start calls (not
    /// while the membership is in doubt, or just after a stall: its partition may be
    /// another's). False: a stop began first. A job its worker dropped while it waited
    /// (a stop or a revoke) is dropped, never handed out.
    async fn hand_when_room(
        &self,
        mut job: Job,
        stop: &mut watch::Receiver<Option<Instant>>,
    ) -> bool {
        loop {
            if !job.queued.may_start() {
                tokio::select! {
                    biased;
                    _ = stop.wait_for(Option::is_some) => return false,
                    _ = job.reply.closed() => return true,
                    _ = job.queued.startable() => continue,
                }
            }
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            job = match self.try_hand(job) {
                Ok(()) => return true,
                Err(job) => job,
            };
            tokio::select! {
                biased;
                _ = stop.wait_for(Option::is_some) => return false,
                _ = job.reply.closed() => return true,
                _ = notified => {}
            }
        }
    }
}

/// One request for a child (a message, or a batch), and where its answer goes.
pub(super) struct Job {
    pub(super) line: Vec<u8>,
    pub(super) sent: Sent,
    pub(super) reply: oneshot::Sender<Reply>,
    /// The call starts when a child takes it, not while it waits for one.
    pub(super) queued: Queued,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::exec::protocol::{Offsets, Sent};
    use crate::processors::processor::queued;
    use tokio::sync::oneshot;

    fn job(offset: i64) -> (Job, oneshot::Receiver<Reply>) {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            line: Vec::new(),
            sent: Sent {
                topic: "t".into(),
                partition: 0,
                offsets: Offsets::One(offset),
            },
            reply,
            queued: queued(),
        };
        (job, answer)
    }

    fn offsets(inbox: &mut mpsc::UnboundedReceiver<Job>) -> Vec<i64> {
        std::iter::from_fn(|| inbox.try_recv().ok())
            .map(|j| j.sent.offsets.first())
            .collect()
    }

    #[test]
    fn a_request_goes_to_the_serving_child_with_the_fewest_in_flight_and_room() {
        let (dispatch, mut inboxes) = Dispatch::new(3, 2);
        let mut answers = Vec::new();
        let mut hand = |offset| {
            let (j, a) = job(offset);
            answers.push(a);
            dispatch.try_hand(j).map_err(|j| j.sent.offsets.first())
        };
        // Nobody serves yet: nothing is handed out.
        assert_eq!(hand(0), Err(0));
        dispatch.set_serving(0, true);
        dispatch.set_serving(1, true);
        for offset in 1..=3 {
            assert_eq!(hand(offset), Ok(()));
        }
        // 1 and 3 to child 0 (ties go to the first), 2 to child 1.
        assert_eq!(offsets(&mut inboxes[0]), vec![1, 3]);
        assert_eq!(offsets(&mut inboxes[1]), vec![2]);
        assert_eq!(hand(4), Ok(()));
        assert_eq!(offsets(&mut inboxes[1]), vec![4]);
        // Both hold 2, the limit: the next waits until one is released.
        assert_eq!(hand(5), Err(5));
        dispatch.release(1);
        assert_eq!(hand(6), Ok(()));
        assert_eq!(offsets(&mut inboxes[1]), vec![6]);
        // A child that stops serving gets nothing, even with room.
        dispatch.release(0);
        dispatch.set_serving(0, false);
        assert_eq!(hand(7), Err(7));
        dispatch.set_serving(2, true);
        assert_eq!(hand(8), Ok(()));
        assert_eq!(offsets(&mut inboxes[2]), vec![8]);
        assert!(offsets(&mut inboxes[0]).is_empty());
    }
}
