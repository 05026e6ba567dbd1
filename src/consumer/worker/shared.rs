//! What a worker shares with the supervisor and the health endpoint: its offsets, its
//! calls, whether it has returned (a latch), and the hold the group puts on it while the
//! membership is in doubt.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use tokio::sync::{watch, Notify};

use crate::consumer::dispatch_limit::DispatchLimit;
use crate::consumer::membership;
use crate::output::metrics::PartitionMetrics;
use crate::processors::call_start;

/// An offset not (yet) known, in the atomics of [`WorkerShared`].
pub(super) const NONE: i64 = -1;

/// What a worker shares with the supervisor: lock-free, read at commit time.
#[derive(Debug)]
pub struct WorkerShared {
    /// Next offset to commit, or -1 before the first ack.
    pub(super) committable: AtomicI64,
    /// The offset being processed right now, or -1.
    pub(super) in_flight: AtomicI64,
    /// The highest offset acknowledged (for commit metadata), or -1.
    pub(super) highest_acked: AtomicI64,
    /// The first offset this worker received, or -1.
    pub(super) first_offset: AtomicI64,
    /// Set when the processor failed and the partition stopped.
    /// The offset the processor failed on (the partition stopped there), or -1.
    pub(super) halted_at: AtomicI64,
    pub(super) done: Latch,
    pub metrics: PartitionMetrics,
    /// Set when the partition reached the end of its log (with `ACKD_STOP_AT_END`).
    pub(super) at_end: AtomicBool,
    /// When the processor call under way began, on the health endpoint's coarse clock
    /// (`crate::clock::now_ms`), or 0: no call, or the endpoint is off.
    pub(super) call_started_ms: AtomicU64,
    /// Offsets acknowledged above the committable one, as inclusive ranges, ascending
    /// (only with concurrent ordering: in order, nothing is acknowledged past it).
    pub(super) acked_above: Mutex<Vec<(i64, i64)>>,
    /// Messages handed to the processor (concurrent ordering): in calls, or waiting in
    /// the processor for a child or a permit (see `waiting`).
    pub(super) handed_over: AtomicUsize,
    /// Messages read and not handed to the processor: waiting for their key or a free
    /// call (concurrent ordering), or `usize::MAX` (partition ordering, where none wait).
    pub(super) waiting: AtomicUsize,
    /// The concurrent calls the processor took, oldest first (concurrent ordering, or
    /// partition ordering with a processor whose calls may wait: see `admits_calls`).
    pub(super) calls: Arc<call_start::CallClock>,
    /// Held while the group membership is in doubt: nothing new starts.
    pub hold: Hold,
    /// Partition ordering with a processor whose calls may wait for capacity
    /// (`Processor::calls_may_wait`): its call is tracked in `calls`, like a concurrent
    /// one. Set once, when the worker starts.
    pub(super) admits_calls: AtomicBool,
    /// The highest offset that may start: the last accepted commit's dispatch limit.
    pub dispatch: DispatchLimit,
    /// The end of the window the assignment inherited, as far as the log reached then
    /// (`Resume::existed_through`): the highest offset a previous owner may have handed
    /// to a processor, or -1.
    pub(super) inherited_through: AtomicI64,
}

impl crate::output::health::PartitionProbe for WorkerShared {
    fn call_started_ms(&self) -> Option<u64> {
        WorkerShared::call_started_ms(self)
    }

    fn oldest_call_offset(&self) -> Option<i64> {
        WorkerShared::oldest_call_offset(self)
    }

    fn in_flight_count(&self) -> usize {
        WorkerShared::in_flight_count(self)
    }

    fn halted(&self) -> bool {
        self.halted_at().is_some()
    }

    fn metrics(&self) -> &PartitionMetrics {
        &self.metrics
    }
}

impl WorkerShared {
    pub(crate) fn new() -> Self {
        WorkerShared {
            committable: AtomicI64::new(NONE),
            in_flight: AtomicI64::new(NONE),
            highest_acked: AtomicI64::new(NONE),
            first_offset: AtomicI64::new(NONE),
            halted_at: AtomicI64::new(NONE),
            done: Latch::default(),
            metrics: PartitionMetrics::default(),
            at_end: AtomicBool::new(false),
            call_started_ms: AtomicU64::new(0),
            acked_above: Mutex::new(Vec::new()),
            handed_over: AtomicUsize::new(0),
            waiting: AtomicUsize::new(usize::MAX),
            calls: Arc::default(),
            hold: Hold::default(),
            admits_calls: AtomicBool::new(false),
            dispatch: DispatchLimit::default(),
            inherited_through: AtomicI64::new(NONE),
        }
    }

    /// When the processor call under way began (see `output::health`), if one is: with
    /// tracked calls (`calls`), the oldest one the processor took (not one waiting for it).
    pub fn call_started_ms(&self) -> Option<u64> {
        Some(self.call_started_ms.load(Ordering::Relaxed))
            .filter(|t| *t != 0)
            .or_else(|| self.calls.oldest().map(|(ms, _)| ms))
    }

    /// The offset of the call `call_started_ms` times: the oldest call the processor
    /// took with tracked calls, else the one in hand.
    pub fn oldest_call_offset(&self) -> Option<i64> {
        self.calls
            .oldest()
            .map(|(_, offset)| offset)
            .or_else(|| self.in_flight())
    }

    /// A processor call begins: a load and a store, no clock read (the hot path).
    pub(crate) fn call_begins(&self) {
        self.call_started_ms
            .store(crate::clock::now_ms(), Ordering::Relaxed);
    }

    /// The partition's only call, which the processor takes at once (its calls never
    /// wait), begins with the offsets up to `last`: handed over, and timed for `/live`.
    pub(super) fn only_call_begins(&self, last: i64) {
        self.calls.handed(last);
        self.call_begins();
    }

    pub(crate) fn call_ended(&self) {
        self.call_started_ms.store(0, Ordering::Relaxed);
    }

    pub fn committable(&self) -> Option<i64> {
        some(self.committable.load(Ordering::Acquire))
    }

    pub fn in_flight(&self) -> Option<i64> {
        some(self.in_flight.load(Ordering::Acquire))
    }

    /// Processor calls under way now (messages, or batches): the ones the processor
    /// took, not those waiting in it for a child or a permit.
    pub fn in_flight_count(&self) -> usize {
        if self.waiting().is_some() || self.admits_calls.load(Ordering::Relaxed) {
            self.calls.running()
        } else {
            usize::from(self.in_flight().is_some())
        }
    }

    /// Messages read and waiting to start (concurrent ordering only): for their key, a
    /// free call, or a child or permit of the processor.
    pub fn waiting(&self) -> Option<usize> {
        let unhanded = self.waiting.load(Ordering::Relaxed);
        (unhanded != usize::MAX).then(|| {
            let handed = self.handed_over.load(Ordering::Relaxed);
            unhanded + handed.saturating_sub(self.calls.running_messages())
        })
    }

    pub fn first_offset(&self) -> Option<i64> {
        some(self.first_offset.load(Ordering::Acquire))
    }

    pub fn highest_acked(&self) -> Option<i64> {
        some(self.highest_acked.load(Ordering::Acquire))
    }

    /// The highest offset a processor of the group may have been handed: by this
    /// worker, in a call the processor took (finished or not; never one a stop dropped
    /// while it waited for a child or a permit, nor a message read and not started),
    /// or by a previous owner, as far as the assignment knew (its redelivery window).
    /// What a release's commit records (`p=`), so that the next owner flags exactly
    /// these. The worker's part is one relaxed store per call (one atomic maximum for a
    /// call the processor takes from its queue), read here once per commit.
    pub fn handed_through(&self) -> Option<i64> {
        let inherited = some(self.inherited_through.load(Ordering::Relaxed));
        self.calls.highest_handed().max(inherited)
    }

    /// Offsets acknowledged above [`WorkerShared::committable`], as inclusive ranges,
    /// ascending; empty when there are none. For the commit metadata: a crash then
    /// redelivers only what was in flight.
    pub fn acked_above(&self) -> Vec<(i64, i64)> {
        self.acked_above
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn at_end(&self) -> bool {
        self.at_end.load(Ordering::Acquire)
    }

    pub fn halted_at(&self) -> Option<i64> {
        some(self.halted_at.load(Ordering::Acquire))
    }

    /// Waits until the worker has returned, or `deadline` passed. True if it returned.
    pub fn wait_done(&self, deadline: Instant) -> bool {
        self.done.wait_until(deadline)
    }

    /// Whether the worker has returned (and dropped its queue).
    pub fn is_done(&self) -> bool {
        self.done.is_set()
    }
}

fn some(v: i64) -> Option<i64> {
    (v != NONE).then_some(v)
}

/// Sets the latch however the worker ends, panics and aborts included.
pub(super) struct SetOnDrop(pub(super) Arc<WorkerShared>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.done.set();
    }
}

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

/// A partition held while the group membership is in doubt (see
/// [`crate::consumer::membership`]): its worker starts no new processor call; the calls
/// under way finish. Lifted when the membership is confirmed; a stop ends the wait. A
/// worker that wakes from a stall of the process before the membership's watch does
/// waits for it.
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
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_task_waiting_on_the_latch_wakes_when_it_is_set() {
        let shared = Arc::new(WorkerShared::new());
        let waiting = tokio::spawn({
            let shared = shared.clone();
            async move { shared.done.wait().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        let s2 = shared.clone();
        std::thread::spawn(move || drop(SetOnDrop(s2)))
            .join()
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("woken")
            .unwrap();
        assert!(shared.is_done());
        // Already set: returns at once.
        shared.done.wait().await;
    }

    #[test]
    fn handed_through_is_the_highest_handed_over_or_inherited() {
        let shared = WorkerShared::new();
        assert_eq!(shared.handed_through(), None);
        shared.inherited_through.store(40, Ordering::Relaxed);
        assert_eq!(
            shared.handed_through(),
            Some(40),
            "a crashed owner's window"
        );
        shared.calls.handed(12);
        assert_eq!(shared.handed_through(), Some(40));
        shared.calls.handed(41);
        assert_eq!(shared.handed_through(), Some(41));
    }

    #[test]
    fn latch_waits_until_set_or_deadline() {
        let shared = Arc::new(WorkerShared::new());
        assert!(!shared.wait_done(Instant::now() + Duration::from_millis(20)));
        let s2 = shared.clone();
        let t = std::thread::spawn(move || drop(SetOnDrop(s2)));
        assert!(shared.wait_done(Instant::now() + Duration::from_secs(10)));
        t.join().unwrap();
    }

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
