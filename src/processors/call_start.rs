//! When a concurrent call starts: when the processor takes it, not when the worker
//! hands it over.
//!
//! With `ACKD_ORDERING=key` or `none` a partition hands the processor up to
//! `ACKD_CONCURRENCY` calls at once, more than a pool of `ACKD_EXEC_CONCURRENCY` children
//! or `ACKD_HTTP_CONCURRENCY` requests serves: the rest wait in the processor. With
//! `partition` ordering each partition has one call, but many partitions share the
//! pool the same way; there the worker tracks calls only for a processor whose
//! `calls_may_wait` says so (the others' calls start when made, and cost nothing
//! here). A call that waits has not started: a stop or a revoke drops it (its message stays
//! unacknowledged, for the next owner), and the health endpoint does not count its
//! wait as time in the call.
//!
//! ```text
//!   Fresh ──first poll, not queued──▶ Started ──returns──▶ Ended
//!     │                                  ▲
//!     └─[`queued`]──▶ Queued ──[`Queued::take`]
//!   Fresh, Queued ──stop──▶ Dropped (the call's future is dropped; `take` says false)
//! ```
//! A processor says it queues a call with [`crate::processors::processor::queued`] while its
//! future is polled; one that does not counts as started once its future was first
//! polled.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use tokio::sync::watch;

const FRESH: u8 = 0;
const QUEUED: u8 = 1;
const STARTED: u8 = 2;
const DROPPED: u8 = 3;
const ENDED: u8 = 4;

/// What lets a partition start calls: the consumer's membership hold, which holds and
/// lifts it from above; processors only ask, where they take a queued call.
pub(crate) trait StartGate: Send + Sync {
    /// Whether a new call may start now (an atomic load or two).
    fn may_start(&self) -> bool;
    /// Resolves once a new call may start.
    fn startable(&self) -> BoxFuture<'_, ()>;
}

tokio::task_local! {
    /// The call whose future is being polled (set only while the worker polls one).
    static CALL: Arc<CallStart>;
}

/// One attempt of one concurrent call: where it stands, and when the processor took it.
pub(crate) struct CallStart {
    state: AtomicU8,
    /// When it started, on the health endpoint's coarse clock (0: not yet, or off).
    started_ms: AtomicU64,
    /// Its first offset (what `/live` names when it is the oldest).
    offset: i64,
    /// Its last offset (a batch's last): handed to the processor once it starts.
    last: i64,
    /// Its messages (a batch's).
    messages: usize,
    clock: Arc<CallClock>,
    /// Its partition's hold: a call the processor takes starts only while the
    /// partition may start calls, however long it waited in the processor's queue.
    hold: Option<Arc<dyn StartGate>>,
}

impl CallStart {
    /// The current call, if the worker is polling one: the processor queues it.
    /// `None` outside a tracked call (partition ordering with a processor whose calls
    /// never wait, a direct call, a test),
    /// or when the call started already (a batch's second message, a retry's queue).
    pub(crate) fn queue_current() -> Option<Arc<CallStart>> {
        let call = CALL.try_with(Arc::clone).ok()?;
        call.state
            .compare_exchange(FRESH, QUEUED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
            .then_some(call)
    }

    /// Whether the call may start now: its partition is not held (the membership is
    /// not in doubt) and the process did not just wake from a stall (see
    /// [`StartGate`]). A processor asks before it takes a queued call.
    pub(crate) fn may_start(&self) -> bool {
        self.hold.as_ref().is_none_or(|h| h.may_start())
    }

    /// Resolves once the call may start (see [`CallStart::may_start`]).
    pub(crate) async fn startable(&self) {
        if let Some(hold) = &self.hold {
            hold.startable().await;
        }
    }

    /// The processor takes the call now. False: the worker dropped it meanwhile.
    pub(crate) fn take(self: &Arc<Self>) -> bool {
        match self.begin_from(QUEUED) {
            Ok(()) => true,
            Err(state) => state != DROPPED,
        }
    }

    /// After a poll: a call the processor did not queue counts as started.
    fn polled(self: &Arc<Self>) {
        let _ = self.begin_from(FRESH);
    }

    fn begin_from(self: &Arc<Self>, from: u8) -> Result<(), u8> {
        self.state
            .compare_exchange(from, STARTED, Ordering::AcqRel, Ordering::Acquire)?;
        self.clock.begin(self);
        Ok(())
    }

    /// Drops the call unless the processor took it. True: dropped.
    fn give_up(&self) -> bool {
        [FRESH, QUEUED].into_iter().any(|from| {
            self.state
                .compare_exchange(from, DROPPED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })
    }

    /// Ended by its future's end, or earlier by the processor that freed its child or
    /// permit ([`crate::processors::processor::Taken`]); the first of the two counts.
    pub(crate) fn end(&self) {
        if self
            .state
            .compare_exchange(STARTED, ENDED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.clock.end(self.messages);
        }
    }
}

/// A partition's calls under way, in the order the processor took them: the oldest
/// one's start is what `/live` reads. O(1) a call (amortized): a call ends by its state,
/// and ended calls leave from the front only.
#[derive(Default)]
pub(crate) struct CallClock {
    started: Mutex<VecDeque<Arc<CallStart>>>,
    /// When the oldest call under way started (0: none).
    oldest_ms: AtomicU64,
    oldest_offset: AtomicI64,
    running: AtomicUsize,
    /// Messages in the running calls.
    messages: AtomicUsize,
    /// One past the highest offset handed to the processor (0: none yet): what a
    /// release's commit says its successor may see again (`WorkerShared::handed_through`).
    handed_end: AtomicI64,
}

impl CallClock {
    fn begin(&self, call: &Arc<CallStart>) {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        // Read under the lock: the queue stays in start order.
        call.started_ms
            .store(crate::output::health::now_ms(), Ordering::Relaxed);
        started.push_back(call.clone());
        // Calls start in any order (a pool takes them as children free up): the highest.
        self.handed_end
            .fetch_max(call.last.saturating_add(1), Ordering::Relaxed);
        self.running.fetch_add(1, Ordering::Relaxed);
        self.messages.fetch_add(call.messages, Ordering::Relaxed);
        self.publish(&started);
    }

    fn end(&self, messages: usize) {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        while started
            .front()
            .is_some_and(|c| c.state.load(Ordering::Acquire) == ENDED)
        {
            started.pop_front();
        }
        self.running.fetch_sub(1, Ordering::Relaxed);
        self.messages.fetch_sub(messages, Ordering::Relaxed);
        self.publish(&started);
    }

    fn publish(&self, started: &VecDeque<Arc<CallStart>>) {
        let (ms, offset) = started.front().map_or((0, -1), |c| {
            (c.started_ms.load(Ordering::Relaxed), c.offset)
        });
        self.oldest_offset.store(offset, Ordering::Relaxed);
        self.oldest_ms.store(ms, Ordering::Relaxed);
    }

    /// When the oldest call the processor took began, and its first offset.
    pub(crate) fn oldest(&self) -> Option<(u64, i64)> {
        let ms = self.oldest_ms.load(Ordering::Relaxed);
        (ms != 0).then(|| (ms, self.oldest_offset.load(Ordering::Relaxed)))
    }

    /// A call the processor takes at once (its calls never wait) hands it the offsets
    /// up to `last`: one store, as a partition's only call hands them in ascending order.
    pub(crate) fn handed(&self, last: i64) {
        self.handed_end
            .store(last.saturating_add(1), Ordering::Relaxed);
    }

    /// The highest offset handed to the processor: in a call it took, whether or not
    /// that call finished.
    pub(crate) fn highest_handed(&self) -> Option<i64> {
        let end = self.handed_end.load(Ordering::Relaxed);
        (end > 0).then(|| end - 1)
    }

    /// Calls the processor took and has not returned.
    pub(crate) fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// Messages in those calls.
    pub(crate) fn running_messages(&self) -> usize {
        self.messages.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for CallClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallClock")
            .field("running", &self.running())
            .field("oldest", &self.oldest())
            .finish()
    }
}

/// Ends the call in the clock however its future ends (returned, or dropped).
struct EndOnDrop<'a>(&'a CallStart);

impl Drop for EndOnDrop<'_> {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// Runs one attempt of a concurrent call (of `messages` from `offset` to `last`) of the
/// partition held by `hold`. `None`: a stop came before the processor took it; it was
/// dropped, unstarted.
///
/// The call starts only while its partition may start calls: it is first polled once
/// the hold allows it (a retry after its delay, a batch after its gathering may come
/// after a stall), and a processor that queues it checks again when it takes it
/// ([`CallStart::may_start`]).
pub(crate) async fn admitted<F: Future, G: StartGate + 'static>(
    call: F,
    (clock, hold): (&Arc<CallClock>, &Arc<G>),
    (offset, last, messages): (i64, i64, usize),
    stop: &mut watch::Receiver<bool>,
) -> Option<F::Output> {
    if !hold.may_start() {
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return None,
            _ = hold.startable() => {}
        }
    }
    let start = Arc::new(CallStart {
        state: AtomicU8::new(FRESH),
        started_ms: AtomicU64::new(0),
        offset,
        last,
        messages,
        clock: clock.clone(),
        hold: Some(hold.clone() as Arc<dyn StartGate>),
    });
    let _end = EndOnDrop(&start);
    let mut call = std::pin::pin!(CALL.scope(start.clone(), call));
    let mut polled = std::future::poll_fn(|cx| {
        let out = call.as_mut().poll(cx);
        start.polled();
        out
    });
    let mut watching = true;
    loop {
        // Biased: a call not polled before the stop is dropped, not started.
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s), if watching => {
                if start.give_up() {
                    return None;
                }
                watching = false;
            }
            out = &mut polled => return Some(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use tokio::sync::Notify;

    /// A gate held and lifted by hand, as the consumer's hold is.
    #[derive(Default)]
    struct Hold {
        held: AtomicBool,
        lifted: Notify,
    }

    impl Hold {
        fn hold(&self) {
            self.held.store(true, Ordering::Release);
        }

        fn lift(&self) {
            self.held.store(false, Ordering::Release);
            self.lifted.notify_waiters();
        }
    }

    impl StartGate for Hold {
        fn may_start(&self) -> bool {
            !self.held.load(Ordering::Acquire)
        }

        fn startable(&self) -> BoxFuture<'_, ()> {
            Box::pin(async move {
                loop {
                    let lifted = self.lifted.notified();
                    tokio::pin!(lifted);
                    lifted.as_mut().enable();
                    if self.may_start() {
                        return;
                    }
                    lifted.await;
                }
            })
        }
    }

    fn call(clock: &Arc<CallClock>, offset: i64) -> Arc<CallStart> {
        Arc::new(CallStart {
            state: AtomicU8::new(FRESH),
            started_ms: AtomicU64::new(0),
            offset,
            last: offset,
            messages: 1,
            clock: clock.clone(),
            hold: None,
        })
    }

    #[test]
    fn a_queued_call_dropped_before_it_is_taken_is_never_taken() {
        let clock = Arc::new(CallClock::default());
        let c = call(&clock, 5);
        c.state.store(QUEUED, Ordering::Release);
        assert!(c.give_up());
        assert!(!c.take());
        assert_eq!(clock.running(), 0);
    }

    #[test]
    fn a_taken_call_is_not_dropped_and_counts_until_it_ends() {
        let clock = Arc::new(CallClock::default());
        let c = call(&clock, 5);
        c.state.store(QUEUED, Ordering::Release);
        assert!(c.take());
        assert!(!c.give_up());
        assert_eq!(clock.running(), 1);
        c.end();
        assert_eq!(clock.running(), 0);
        assert_eq!(clock.oldest(), None);
    }

    #[test]
    fn the_oldest_is_the_first_taken_not_yet_ended() {
        let clock = Arc::new(CallClock::default());
        let (a, b, c) = (call(&clock, 1), call(&clock, 2), call(&clock, 3));
        // Taken in the order b, a, c (a pool may serve them out of offset order).
        b.polled();
        a.polled();
        assert_eq!(
            clock.highest_handed(),
            Some(2),
            "the highest taken, not the last"
        );
        c.polled();
        assert_eq!(clock.started.lock().unwrap().front().unwrap().offset, 2);
        a.end();
        assert_eq!(clock.started.lock().unwrap().len(), 3, "a waits behind b");
        b.end();
        assert_eq!(clock.started.lock().unwrap().front().unwrap().offset, 3);
        assert_eq!(clock.running(), 1);
    }

    #[tokio::test]
    async fn a_held_partition_starts_no_call_until_the_hold_lifts() {
        let clock = Arc::new(CallClock::default());
        let hold = Arc::new(Hold::default());
        let (tx, mut rx) = watch::channel(false);
        let mut rx2 = rx.clone();
        hold.hold();
        let polled = std::sync::atomic::AtomicBool::new(false);
        let call = admitted(
            async {
                polled.store(true, Ordering::Release);
                7
            },
            (&clock, &hold),
            (1, 1, 1),
            &mut rx,
        );
        tokio::pin!(call);
        assert!(futures::poll!(call.as_mut()).is_pending());
        assert!(!polled.load(Ordering::Acquire), "not polled while held");
        assert_eq!(clock.highest_handed(), None, "nothing handed over");
        hold.lift();
        assert_eq!(call.await, Some(7));
        // Held, then stopped: dropped, never polled.
        hold.hold();
        let held = admitted(
            async { unreachable!("started while held") },
            (&clock, &hold),
            (2, 2, 1),
            &mut rx2,
        );
        tokio::pin!(held);
        assert!(futures::poll!(held.as_mut()).is_pending());
        tx.send(true).unwrap();
        assert_eq!(held.await, None::<()>);
    }

    #[tokio::test]
    async fn a_queued_call_may_not_start_while_its_partition_is_held() {
        let clock = Arc::new(CallClock::default());
        let hold = Arc::new(Hold::default());
        let call = call(&clock, 5);
        let call = Arc::new(CallStart {
            hold: Some(hold.clone() as Arc<dyn StartGate>),
            ..Arc::try_unwrap(call).ok().unwrap()
        });
        assert!(call.may_start());
        hold.hold();
        assert!(!call.may_start(), "the processor leaves it queued");
        let waiting = call.startable();
        tokio::pin!(waiting);
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        hold.lift();
        waiting.await;
        assert!(call.may_start());
    }

    #[tokio::test]
    async fn a_stop_drops_a_queued_call_and_waits_for_a_started_one() {
        let clock = Arc::new(CallClock::default());
        let hold = Arc::new(Hold::default());
        let (tx, mut rx) = watch::channel(false);
        // Queued, never taken: the stop drops it.
        let (taken_tx, taken_rx) = tokio::sync::oneshot::channel::<Arc<CallStart>>();
        let queued = async move {
            let me = CallStart::queue_current().expect("a concurrent call");
            let _ = taken_tx.send(me);
            std::future::pending::<()>().await
        };
        let mut rx2 = rx.clone();
        let waiting = tokio::spawn({
            let (clock, hold) = (clock.clone(), hold.clone());
            async move { admitted(queued, (&clock, &hold), (1, 1, 1), &mut rx2).await }
        });
        let me = taken_rx.await.unwrap();
        tx.send(true).unwrap();
        assert_eq!(waiting.await.unwrap(), None);
        assert!(!me.take(), "dropped: the processor must not run it");
        assert_eq!(
            clock.highest_handed(),
            None,
            "a dropped call was not handed"
        );
        // Not polled before the stop: dropped.
        let out = admitted(
            async {
                tokio::task::yield_now().await;
                7
            },
            (&clock, &hold),
            (2, 2, 1),
            &mut rx,
        );
        assert_eq!(out.await, None, "a stop before its first poll drops it");
        // Started at its first poll: a stop after that waits for it.
        let (tx, mut rx) = watch::channel(false);
        let started = admitted(
            async {
                tokio::task::yield_now().await;
                let _ = tx.send(true);
                tokio::task::yield_now().await;
                7
            },
            (&clock, &hold),
            (3, 3, 1),
            &mut rx,
        );
        assert_eq!(started.await, Some(7));
        assert_eq!(clock.running(), 0);
        assert_eq!(clock.highest_handed(), Some(3), "a started call was handed");
    }
}
