//! The dispatch limit (docs/guarantees.md, "Redelivery after a crash"): every commit's
//! metadata records `l=L`, the highest offset this process may hand to a processor
//! before its next commit is accepted, and a worker never starts a message above the
//! limit of the last *accepted* commit. After a crash the next owner then knows that
//! nothing above L was started, and flags exactly the offsets up to L as possible
//! repeats.
//!
//! The limit runs ahead of the work so that throughput does not wait for it: each
//! commit proposes the highest offset read plus a window of about two commit intervals
//! of the partition's messages (at least [`MIN_REDELIVERY_WINDOW`], at most
//! `ACKD_REDELIVERY_WINDOW_MAX`), and a worker that reads past the middle of its window
//! asks for a commit at once instead of waiting for the interval.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};

use crate::settings::MIN_REDELIVERY_WINDOW;

/// No limit committed yet: nothing may start.
const NONE: i64 = -1;

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
}

impl Default for DispatchLimit {
    fn default() -> Self {
        DispatchLimit {
            accepted: AtomicI64::new(NONE),
            ask_from: AtomicI64::new(NONE),
            read: AtomicI64::new(NONE),
            wanted: AtomicBool::new(false),
            raised: Notify::new(),
            sizing: Mutex::new(Sizing {
                proposed: NONE,
                window: 0,
                at: None,
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
        let early = self.wanted();
        let mut s = self.sizing.lock().unwrap_or_else(|e| e.into_inner());
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
/// doubled (at least) when the worker asked early, which says the window was too small
/// for the rate.
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
