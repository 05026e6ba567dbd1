//! What a worker shares with the supervisor, its commits and the health endpoint: its
//! offsets, its calls, whether it has returned (a latch), the hold the group puts on it
//! while the membership is in doubt, and its dispatch limit ([`DispatchLimit`]: the
//! highest offset it may start, which each accepted commit raises).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};

use crate::consumer::membership;
use crate::output::metrics::PartitionMetrics;
use crate::processors::call_start;
use crate::settings::MIN_REDELIVERY_WINDOW;

/// An offset not (yet) known, in the atomics of [`WorkerShared`]; for the
/// [`DispatchLimit`], no limit committed yet: nothing may start.
pub(super) const NONE: i64 = -1;

/// What a worker shares with the supervisor: lock-free, read at commit time.
#[derive(Debug)]
pub struct WorkerShared {
    /// Next offset to commit, or -1 before the first ack.
    pub(super) committable: AtomicI64,
    /// The offset being processed right now, or -1.
    pub(super) in_flight: AtomicI64,
    /// The timestamp (ms since the epoch) of the oldest message read and not yet
    /// acknowledged; once all are, of the last one acknowledged; -1 before the first, or
    /// when that message has none. For the lag in seconds: one relaxed store a message.
    pub(super) oldest_timestamp_ms: AtomicI64,
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
    /// (`crate::output::health::now_ms`), or 0: no call, or the endpoint is off.
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
    /// Held while the group membership is in doubt: nothing new starts. Shared with
    /// the calls the processor queues (`call_start`): they wait for it too.
    pub hold: Arc<Hold>,
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
            oldest_timestamp_ms: AtomicI64::new(NONE),
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
            hold: Arc::default(),
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
            .store(crate::output::health::now_ms(), Ordering::Relaxed);
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

    /// The timestamp of the oldest message the worker read and has not acknowledged
    /// (between two messages, of the last one acknowledged), in ms since the epoch.
    pub fn oldest_timestamp_ms(&self) -> Option<i64> {
        some(self.oldest_timestamp_ms.load(Ordering::Relaxed))
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

/// Processors ask the hold where they take a queued call.
impl call_start::StartGate for Hold {
    fn may_start(&self) -> bool {
        Hold::may_start(self)
    }

    fn startable(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(Hold::startable(self))
    }
}

// The dispatch limit (docs/guarantees.md, "Redelivery after a crash"): every commit's
// metadata records `l=L`, the highest offset this process may hand to a processor
// before its next commit is accepted, and a worker never starts a message above the
// limit of the last *accepted* commit. After a crash the next owner then knows that
// nothing above L was started, and flags exactly the offsets up to L as possible
// repeats.
//
// The limit runs ahead of the work so that throughput does not wait for it: each
// commit proposes the highest offset read plus a window of about two commit intervals
// of the partition's messages (at least [`MIN_REDELIVERY_WINDOW`], at most
// `ACKD_REDELIVERY_WINDOW_MAX`), and a worker that reads past the middle of its window
// asks for a commit at once instead of waiting for the interval.

/// How the limits of a process are sized, and how a worker asks for a commit.
#[derive(Debug, Clone)]
pub struct LimitPolicy {
    /// `ACKD_REDELIVERY_WINDOW_MAX`.
    pub window_max: i64,
    /// `ACKD_COMMIT_INTERVAL_MS`: the window is about two of them.
    pub commit_interval: Duration,
    /// Notified when a worker wants its limit raised now: the supervisor commits.
    pub commit_wanted: Arc<Notify>,
}

/// The defaults (`ACKD_REDELIVERY_WINDOW_MAX`, `ACKD_COMMIT_INTERVAL_MS`), for a worker
/// built without settings (tests).
impl Default for LimitPolicy {
    fn default() -> Self {
        LimitPolicy {
            window_max: 100_000,
            commit_interval: Duration::from_secs(5),
            commit_wanted: Arc::new(Notify::new()),
        }
    }
}

impl LimitPolicy {
    fn window_min(&self) -> i64 {
        (MIN_REDELIVERY_WINDOW as i64).min(self.window_max)
    }
}

/// One partition's dispatch limit, shared by its worker (which checks it before every
/// message) and the group (which proposes the next one at each commit and raises it when
/// a commit is accepted).
#[derive(Debug)]
pub struct DispatchLimit {
    /// The limit of the last accepted commit: the highest offset that may start.
    accepted: AtomicI64,
    /// Past this offset the worker asks for a commit at once (half a window before the
    /// limit, or half way from where it had read if less was left, when it was accepted).
    ask_from: AtomicI64,
    /// The highest offset the worker has read (started, or held at the limit).
    read: AtomicI64,
    /// The worker waits at the limit, or passed `ask_from`: a commit is due now.
    wanted: AtomicBool,
    /// How many times `wanted` was raised: a proposal grows the window for an ask once,
    /// though the ask stays wanted until a commit is accepted.
    asks: AtomicU64,
    raised: Notify,
    sizing: Mutex<Sizing>,
    /// Set when the worker starts ([`DispatchLimit::configure`]).
    policy: OnceLock<LimitPolicy>,
}

/// What the next proposal is sized from.
#[derive(Debug)]
struct Sizing {
    /// The highest limit proposed (proposals only grow: the committer sends in order).
    proposed: i64,
    window: i64,
    /// When the last proposal was made, and the offset read then.
    at: Option<(Instant, i64)>,
    /// `asks` at the last proposal.
    asks_seen: u64,
}

impl Default for DispatchLimit {
    fn default() -> Self {
        DispatchLimit {
            accepted: AtomicI64::new(NONE),
            ask_from: AtomicI64::new(NONE),
            read: AtomicI64::new(NONE),
            wanted: AtomicBool::new(false),
            asks: AtomicU64::new(0),
            raised: Notify::new(),
            sizing: Mutex::new(Sizing {
                proposed: NONE,
                window: 0,
                at: None,
                asks_seen: 0,
            }),
            policy: OnceLock::new(),
        }
    }
}

impl DispatchLimit {
    /// Sets how the limits are sized and how a commit is asked for (once).
    pub fn configure(&self, policy: LimitPolicy) {
        let _ = self.policy.set(policy);
    }

    fn policy(&self) -> &LimitPolicy {
        self.policy.get_or_init(LimitPolicy::default)
    }

    /// The window this partition's previous owner left (`through`: the last offset it may
    /// have handed to a processor, or that ackd cannot rule out): every limit this owner
    /// commits reaches at least there, so that if it crashes too, its successor still
    /// flags what the owner before it may have processed.
    pub fn inherit(&self, through: i64) {
        let mut s = self.sizing.lock().unwrap_or_else(|e| e.into_inner());
        s.proposed = s.proposed.max(through);
    }

    /// Whether `offset` may start now; notes it as read, and asks for a commit once it
    /// passes the middle of the window. A few atomic operations: the hot path.
    #[inline]
    pub fn permits(&self, offset: i64) -> bool {
        // A partition's offsets come in ascending order: a store, not a read-modify-write.
        self.read.store(offset, Ordering::Relaxed);
        let permitted = offset <= self.accepted.load(Ordering::Acquire);
        if !permitted || offset >= self.ask_from.load(Ordering::Relaxed) {
            self.ask();
        }
        permitted
    }

    /// Asks the supervisor for a commit, unless one is asked for already.
    fn ask(&self) {
        if !self.wanted.swap(true, Ordering::AcqRel) {
            self.asks.fetch_add(1, Ordering::AcqRel);
            self.policy().commit_wanted.notify_one();
        }
    }

    /// Waits until `offset` may start; false if told to stop first.
    pub async fn wait_for(&self, offset: i64, stop: &mut watch::Receiver<bool>) -> bool {
        loop {
            let raised = self.raised.notified();
            tokio::pin!(raised);
            // Registered before the check: a raise in between still wakes us.
            raised.as_mut().enable();
            if self.permits(offset) {
                return true;
            }
            tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return false,
                _ = raised => {}
            }
        }
    }

    /// Whether a commit should carry a new limit now, though nothing else changed.
    pub fn wanted(&self) -> bool {
        self.wanted.load(Ordering::Acquire)
    }

    /// The limit the next commit carries: the highest offset read plus the window (at
    /// least the limit already proposed). `floor`: the offset the commit names, below
    /// which nothing is read yet.
    pub fn propose(&self, floor: i64) -> i64 {
        let policy = self.policy();
        let now = Instant::now();
        let read = self.read.load(Ordering::Relaxed).max(floor);
        let mut s = self.sizing.lock().unwrap_or_else(|e| e.into_inner());
        // Asked since the last proposal: a commit still on its way carries an older ask.
        let asks = self.asks.load(Ordering::Acquire);
        let early = asks != s.asks_seen;
        s.asks_seen = asks;
        s.window = next_window(s.window, s.at, (now, read), early, policy);
        s.at = Some((now, read));
        s.proposed = s.proposed.max(read.saturating_add(s.window));
        s.proposed
    }

    /// A commit carrying `limit` was accepted: offsets up to it may start.
    pub fn accept(&self, limit: i64) {
        let previous = self.accepted.fetch_max(limit, Ordering::AcqRel);
        if limit > previous {
            let read = self.read.load(Ordering::Relaxed).max(0);
            // Half the window, or half the slack when less is left: an inherited limit
            // far beyond this owner's window cannot rise before the work nears it.
            let window = self.sizing.lock().unwrap_or_else(|e| e.into_inner()).window;
            let slack = limit.saturating_sub(read).max(0).min(window.max(1));
            self.ask_from
                .store(limit.saturating_sub(slack / 2), Ordering::Relaxed);
            self.wanted.store(false, Ordering::Release);
            self.raised.notify_waiters();
        }
        // Read past it meanwhile (the commit was built before): another one, now.
        if self.read.load(Ordering::Relaxed) >= self.ask_from.load(Ordering::Relaxed) {
            self.ask();
        }
    }

    /// The offset read last (before anything started: the first one, held at the
    /// limit, which is where a first commit stands).
    pub fn read(&self) -> Option<i64> {
        Some(self.read.load(Ordering::Relaxed)).filter(|r| *r != NONE)
    }

    /// No limit can be committed (the broker refuses commit metadata): nothing is
    /// held back, and the next owner flags conservatively.
    pub fn lift(&self) {
        self.accept(i64::MAX);
        self.ask_from.store(i64::MAX, Ordering::Relaxed);
    }

    /// The limit of the last accepted commit, if any.
    pub fn accepted(&self) -> Option<i64> {
        Some(self.accepted.load(Ordering::Acquire)).filter(|l| *l != NONE)
    }
}

/// The next window: about two commit intervals of messages at the rate read since the
/// last proposal (measured over at least [`RATE_SAMPLE`]), between the policy's bounds;
/// doubled (at least) when the worker asked early since the last proposal, which says
/// the window was too small for the rate.
fn next_window(
    window: i64,
    last: Option<(Instant, i64)>,
    now: (Instant, i64),
    early: bool,
    policy: &LimitPolicy,
) -> i64 {
    let (min, max) = (policy.window_min(), policy.window_max);
    let by_rate = last
        .map(|(at, read)| (now.0.saturating_duration_since(at), read))
        .filter(|(elapsed, _)| *elapsed >= RATE_SAMPLE)
        .map(|(elapsed, read)| {
            let messages = now.1.saturating_sub(read).max(0) as u128;
            let interval = policy.commit_interval.as_micros();
            (messages * 2 * interval / elapsed.as_micros()).min(i64::MAX as u128) as i64
        });
    let grown = match (by_rate, early) {
        (Some(r), true) => r.max(window.saturating_mul(2)),
        (Some(r), false) => r,
        (None, true) => window.saturating_mul(2),
        (None, false) => window,
    };
    grown.clamp(min, max)
}

/// The shortest time a rate is measured over: proposals closer together (commits asked
/// for early) keep the window, or double it.
const RATE_SAMPLE: Duration = Duration::from_millis(100);

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

#[cfg(test)]
mod dispatch_limit_tests {
    use super::*;

    fn policy(max: i64) -> LimitPolicy {
        LimitPolicy {
            window_max: max,
            commit_interval: Duration::from_secs(5),
            commit_wanted: Arc::new(Notify::new()),
        }
    }

    fn limit(max: i64) -> DispatchLimit {
        let l = DispatchLimit::default();
        l.configure(policy(max));
        l
    }

    #[test]
    fn nothing_starts_before_a_limit_is_accepted_and_nothing_above_it() {
        let l = limit(100_000);
        assert!(!l.permits(0), "no limit committed yet");
        assert!(l.wanted(), "the worker at the limit asks for a commit");
        let first = l.propose(0);
        assert_eq!(first, 1_000, "the first window is the minimum");
        assert!(!l.permits(0), "proposed is not accepted");
        l.accept(first);
        assert!(!l.wanted());
        assert!(l.permits(0) && l.permits(1_000) && !l.permits(1_001));
        l.accept(10);
        assert_eq!(
            l.accepted(),
            Some(1_000),
            "an older acceptance never lowers it"
        );
    }

    #[test]
    fn the_window_follows_the_rate_between_its_bounds_and_proposals_only_grow() {
        let p = policy(100_000);
        let t0 = Instant::now();
        let t = |ms| t0 + Duration::from_millis(ms);
        // 1000 messages per second, two 5 s intervals: 10,000.
        assert_eq!(
            next_window(0, Some((t(0), 0)), (t(1000), 1000), false, &p),
            10_000
        );
        assert_eq!(
            next_window(0, Some((t(0), 0)), (t(1000), 0), false, &p),
            1_000
        );
        assert_eq!(
            next_window(0, Some((t(0), 0)), (t(100), 1_000_000), false, &p),
            100_000
        );
        assert_eq!(
            next_window(3_000, Some((t(0), 0)), (t(1), 1_000_000), false, &p),
            3_000,
            "too short a sample: the window stays"
        );
        assert_eq!(
            next_window(4_000, None, (t(0), 0), true, &p),
            8_000,
            "asked early: doubled"
        );
        assert_eq!(
            next_window(0, None, (t(0), 0), false, &policy(10)),
            10,
            "the cap wins"
        );

        let l = limit(100_000);
        let a = l.propose(500);
        assert_eq!(a, 1_500);
        assert!(l.propose(0) >= a);
    }

    #[test]
    fn one_ask_grows_the_window_once_however_many_commits_carry_it() {
        // The first commit's answer is not back when the supervisor builds the next
        // (commits are sent in order, several in flight): the worker's one ask must not
        // double the window again, nor a backlog-free partition hold 2,000.
        let l = limit(100_000);
        assert!(!l.permits(0));
        assert_eq!(l.propose(0), 1_000);
        assert!(l.wanted(), "not accepted yet: still wanted");
        assert_eq!(l.propose(0), 1_000, "the same ask: the same window");
        l.accept(1_000);
        assert!(l.permits(500) && l.wanted(), "a new ask, past the middle");
        assert_eq!(l.propose(0), 2_500, "it doubles the window once");
        assert_eq!(l.propose(0), 2_500);
    }

    #[test]
    fn the_worker_asks_for_a_commit_past_the_middle_of_its_window() {
        let l = limit(100_000);
        l.accept(l.propose(0));
        assert!(l.permits(499) && !l.wanted());
        assert!(l.permits(500) && l.wanted(), "past the middle: asks");
        // Read on to 800 meanwhile: the next limit's middle is from there.
        assert!(l.permits(800));
        // Its next limit: 800 and the window (1,000).
        l.accept(1_800);
        assert!(l.permits(1_299) && !l.wanted());
        assert!(l.permits(1_300) && l.wanted());
        l.lift();
        assert!(l.permits(i64::MAX - 1));
    }

    #[test]
    fn an_inherited_window_is_not_asked_about_until_its_end_nears() {
        // The previous owner may have started up to 499,999: this owner's limits reach
        // there, so half way there the proposal cannot rise and an ask would only make
        // the supervisor commit the same limit again (and the worker swap the flag on
        // every message): it asks once the last window before the limit is reached.
        let l = limit(100_000);
        l.inherit(499_999);
        l.accept(l.propose(0));
        assert_eq!(l.accepted(), Some(499_999));
        assert!(l.permits(0) && l.permits(300_000));
        assert!(!l.wanted(), "far from the limit: no commit is due");
        assert!(l.permits(499_498) && !l.wanted());
        assert!(
            l.permits(499_499) && l.wanted(),
            "half a window before it: one is"
        );
    }
}
