//! How many requests a processor has in flight: a fixed number, or one that finds the
//! capacity of what answers them by itself (`ACKD_HTTP_CONCURRENCY_MODE=adaptive` for
//! the `http` processor's endpoint, `ACKD_EXEC_CONCURRENCY_MODE=adaptive` for the
//! `exec` processor's children together); and the pause a `Retry-After` puts on every
//! request to an endpoint.
//!
//! Adaptive is AIMD over windows of responses, TCP's congestion avoidance: a window is
//! as many successes as the limit (about one round trip at the limit). A window whose
//! mean latency stays within [`TOLERANCE`] times the endpoint's unloaded latency (the
//! lowest window mean seen) grows the limit by one, if the limit was used; an overload
//! (a 429, a 503 or a timeout; an exec `{"retry":…}` reply or timeout), or a window
//! slower than that, shrinks it by [`BACKOFF`], once per round: answers to requests
//! started before a decrease do not decrease it again.
//! Near the limit of the last refusal it grows once in [`CAREFUL`] windows, and each
//! refusal there again doubles that wait (up to [`CAREFUL_MAX`] windows): an endpoint
//! whose capacity holds is probed less and less often, so its refusals become rare.
//! Why these two signals: an endpoint says it is full only by slowing down or refusing.
//! Netflix's concurrency-limits (its AIMD and gradient limiters) and Envoy's adaptive
//! concurrency filter (a gradient against a measured minimum round trip) read the same
//! two; AIMD is the simplest that converges, and the one whose moves an operator can
//! follow on the metric lines.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::output::metrics::LimitGauge;

/// A window's mean latency up to this many times the unloaded latency lets the limit
/// grow; above it, the endpoint is queueing: shrink.
const TOLERANCE: f64 = 2.0;
/// What a decrease multiplies the limit by (Netflix's AIMD default), taking one
/// permit away at least.
const BACKOFF: f64 = 0.9;
/// Near the limit where the endpoint last refused, the limit grows once in this many
/// windows: each probe past that point costs a refused request.
const CAREFUL: u32 = 4;
/// The longest wait between probes at the limit of the last refusal, in windows: about
/// a second at a window of 15 ms, so that a steady endpoint refuses about one request
/// of `CAREFUL_MAX` × limit, and one that has more room again is found within seconds.
const CAREFUL_MAX: u32 = 64;
/// Where an adaptive limit starts (or at its maximum, if lower): low, so that a small
/// endpoint is not flooded before the first window says how it copes.
const INITIAL: usize = 4;

/// Whether the limit adapts, its bound, and the longest pause a `Retry-After` sets.
#[derive(Debug, Clone, Copy)]
pub struct LimitSettings {
    pub adaptive: bool,
    /// `ACKD_HTTP_CONCURRENCY` (`ACKD_EXEC_CONCURRENCY` × `ACKD_EXEC_IN_FLIGHT`): the
    /// fixed limit, or the adaptive one's upper bound.
    pub max: usize,
    /// `ACKD_RETRY_MAX_MS`: a message waits no longer for its own retry either.
    pub pause_max: Duration,
}

/// The permits of one processor's requests.
pub struct RequestLimit {
    permits: Semaphore,
    settings: LimitSettings,
    state: Mutex<State>,
    /// Where an adaptive limit is published (the summary line's and `/metrics`' gauge).
    gauge: Option<&'static LimitGauge>,
}

struct State {
    /// The adaptive limit, with its fraction (the permits are its whole part).
    limit: f64,
    /// Permits in all: handed out, free, minus [`State::debt`].
    granted: usize,
    /// Permits out beyond a lowered limit: forgotten as they come back.
    debt: usize,
    in_flight: usize,
    /// No request starts before this (a `Retry-After`).
    paused_until: Option<Instant>,
    /// The lowest mean latency of a window: the endpoint unloaded.
    base: Option<Duration>,
    /// Decreases so far: a request remembers the count it started under.
    round: u64,
    window: Window,
    /// The permits at the last refusal (429, 503, timeout), until the limit passes it.
    ceiling: Option<usize>,
    /// Windows that held since the last careful increase.
    held: u32,
    /// Windows between careful increases now: [`CAREFUL`], doubled by each refusal at
    /// the same ceiling.
    careful: u32,
}

#[derive(Default)]
struct Window {
    successes: usize,
    latency: Duration,
    /// Most requests in flight at once while it lasted.
    peak: usize,
}

/// One request's permit: it goes back when dropped.
pub struct Permit<'a> {
    limit: &'a RequestLimit,
    permit: Option<SemaphorePermit<'a>>,
    round: u64,
    started: Instant,
}

impl RequestLimit {
    pub fn new(settings: LimitSettings, gauge: Option<&'static LimitGauge>) -> RequestLimit {
        let max = settings.max.max(1);
        let start = if settings.adaptive {
            INITIAL.min(max)
        } else {
            max
        };
        let limit = RequestLimit {
            permits: Semaphore::new(start),
            settings: LimitSettings { max, ..settings },
            state: Mutex::new(State {
                limit: start as f64,
                granted: start,
                debt: 0,
                in_flight: 0,
                paused_until: None,
                base: None,
                round: 0,
                window: Window::default(),
                ceiling: None,
                held: 0,
                careful: CAREFUL,
            }),
            gauge: gauge.filter(|_| settings.adaptive),
        };
        limit.publish(start);
        limit
    }

    /// The limit now: how many requests may be in flight at once.
    pub fn current(&self) -> usize {
        self.lock().granted
    }

    /// Waits for a permit, and for any pause to pass. Dropping the future gives up
    /// the wait: a request that waits is not in flight.
    pub async fn acquire(&self) -> Permit<'_> {
        loop {
            let paused = self.lock().paused_until;
            if let Some(until) = paused.filter(|u| *u > Instant::now()) {
                tokio::time::sleep_until(until.into()).await;
                continue;
            }
            let permit = self.permits.acquire().await.expect("never closed");
            let mut state = self.lock();
            if state.paused_until.is_some_and(|u| u > Instant::now()) {
                // A pause began while this one waited: it waits for the pause too.
                state.give_back(permit);
                continue;
            }
            state.in_flight += 1;
            state.window.peak = state.window.peak.max(state.in_flight);
            return Permit {
                limit: self,
                permit: Some(permit),
                round: state.round,
                started: Instant::now(),
            };
        }
    }

    /// No request starts for `after` from now (at most `pause_max`): the endpoint asked
    /// every client to wait, not only the request it answered.
    pub fn pause(&self, after: Duration) {
        let until = Instant::now() + after.min(self.settings.pause_max);
        let mut state = self.lock();
        state.paused_until = Some(state.paused_until.map_or(until, |u| u.max(until)));
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, limit: usize) {
        if let Some(gauge) = self.gauge {
            gauge.set(limit as u64);
        }
    }

    fn succeeded(&self, round: u64, latency: Duration) {
        if !self.settings.adaptive {
            return;
        }
        let mut guard = self.lock();
        let state = &mut *guard;
        if round != state.round {
            // Started under the limit before the last decrease: says nothing of this one.
            return;
        }
        let w = &mut state.window;
        w.successes += 1;
        w.latency += latency;
        if w.successes < state.granted {
            return;
        }
        let mean = w.latency / w.successes as u32;
        let used = w.peak * 2 >= state.granted;
        state.window = Window::default();
        let base = state.base.map_or(mean, |b| b.min(mean));
        state.base = Some(base);
        if mean.as_secs_f64() > base.as_secs_f64() * TOLERANCE {
            if state.granted == 1 {
                // Slow with one request at a time: that is the endpoint unloaded now.
                state.base = Some(mean);
            } else {
                self.decrease(state);
            }
        } else if used && state.granted < self.settings.max {
            let limit = (state.limit + 1.0).min(self.settings.max as f64);
            if !Self::probe(state, limit.floor() as usize) {
                return;
            }
            self.resize(state, limit);
        }
    }

    /// Whether the limit may grow to `target` permits now: at or past the last
    /// refusal's ceiling only once in `careful` windows.
    fn probe(state: &mut State, target: usize) -> bool {
        let Some(ceiling) = state.ceiling else {
            return true;
        };
        if target >= ceiling && target > state.granted {
            state.held += 1;
            if state.held < state.careful {
                return false;
            }
            state.held = 0;
        }
        if target > ceiling {
            // Past it without a refusal: the endpoint has more room now.
            state.ceiling = None;
            state.careful = CAREFUL;
        }
        true
    }

    fn overloaded(&self, round: u64) {
        if !self.settings.adaptive {
            return;
        }
        let mut state = self.lock();
        if round == state.round {
            // Refused again before passing the last ceiling: the same capacity, probed
            // half as often from now on.
            state.careful = match state.ceiling {
                Some(_) => (state.careful * 2).min(CAREFUL_MAX),
                None => CAREFUL,
            };
            state.ceiling = Some(state.granted);
            state.held = 0;
            self.decrease(&mut state);
        }
    }

    fn decrease(&self, state: &mut State) {
        state.round += 1;
        state.window = Window::default();
        // By one permit at least: at a small limit 90% would keep it where it was.
        let fewer = (state.granted as f64 - 1.0).min(state.limit * BACKOFF);
        self.resize(state, fewer.max(1.0));
    }

    fn resize(&self, state: &mut State, limit: f64) {
        state.limit = limit;
        let target = (limit.floor() as usize).clamp(1, self.settings.max);
        if target > state.granted {
            let more = target - state.granted;
            let paid = more.min(state.debt);
            state.debt -= paid;
            self.permits.add_permits(more - paid);
        } else if target < state.granted {
            let fewer = state.granted - target;
            let forgotten = self.permits.forget_permits(fewer);
            state.debt += fewer - forgotten;
        }
        if target != state.granted {
            state.granted = target;
            self.publish(target);
        }
    }
}

impl State {
    fn give_back(&mut self, permit: SemaphorePermit<'_>) {
        if self.debt > 0 {
            self.debt -= 1;
            permit.forget();
        }
    }
}

impl Permit<'_> {
    /// Answered 2xx: its latency, from the permit on, counts toward the window.
    pub fn succeeded(&self) {
        self.limit.succeeded(self.round, self.started.elapsed());
    }

    /// Answered (an exec `{"ack":…}`) after `latency` in the hands of what answered it:
    /// that counts toward the window (an exec child's, from the moment it was given the
    /// request: not the wait for a child being restarted).
    pub fn succeeded_in(&self, latency: Duration) {
        self.limit.succeeded(self.round, latency);
    }

    /// Answered 429 or 503 (an exec `{"retry":…}`), or timed out: the endpoint is full.
    pub fn overloaded(&self) {
        self.limit.overloaded(self.round);
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let mut state = self.limit.lock();
        state.in_flight -= 1;
        state.give_back(permit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adaptive(max: usize) -> RequestLimit {
        RequestLimit::new(
            LimitSettings {
                adaptive: true,
                max,
                pause_max: Duration::from_secs(60),
            },
            None,
        )
    }

    /// Runs `rounds` windows at the limit, each request taking `latency(in flight)`.
    async fn windows(limit: &RequestLimit, rounds: usize, latency: impl Fn(usize) -> u64) {
        for _ in 0..rounds {
            let n = limit.current();
            let mut permits = Vec::new();
            for _ in 0..n {
                permits.push(limit.acquire().await);
            }
            for p in &permits {
                limit.succeeded(p.round, Duration::from_millis(latency(n)));
            }
        }
    }

    #[tokio::test]
    async fn grows_while_latency_holds_and_stops_where_it_doubles() {
        let limit = adaptive(100);
        assert_eq!(limit.current(), INITIAL);
        windows(&limit, 10, |_| 10).await;
        assert_eq!(limit.current(), INITIAL + 10, "one a window");
        // Latency 10 ms plus 1 ms a request: 14 ms at the start (4 in flight), twice
        // that at 18.
        let limit = adaptive(100);
        windows(&limit, 200, |n| 10 + n as u64).await;
        let settled = limit.current();
        assert!((15..=19).contains(&settled), "{settled}");
    }

    #[tokio::test]
    async fn an_overload_shrinks_once_per_round_and_never_below_one() {
        let limit = adaptive(100);
        windows(&limit, 16, |_| 10).await;
        assert_eq!(limit.current(), 20);
        let cohort: Vec<_> = [limit.acquire().await, limit.acquire().await].into();
        cohort[0].overloaded();
        assert_eq!(limit.current(), 18);
        cohort[1].overloaded();
        assert_eq!(limit.current(), 18, "same round: no second decrease");
        // Refused at 20: back up to 19 at once, then once in 4 windows.
        drop(cohort);
        windows(&limit, 1, |_| 10).await;
        assert_eq!(limit.current(), 19);
        windows(&limit, 3, |_| 10).await;
        assert_eq!(limit.current(), 19, "careful near the refusal");
        windows(&limit, 1, |_| 10).await;
        assert_eq!(limit.current(), 20);
        windows(&limit, 4, |_| 10).await;
        assert_eq!(limit.current(), 21);
        windows(&limit, 1, |_| 10).await;
        assert_eq!(limit.current(), 22, "past it: the endpoint has room");
        for _ in 0..100 {
            limit.acquire().await.overloaded();
        }
        assert_eq!(limit.current(), 1);
    }

    #[tokio::test]
    async fn each_refusal_at_the_same_ceiling_halves_how_often_it_is_probed() {
        let limit = adaptive(100);
        windows(&limit, 16, |_| 10).await;
        let mut waits = Vec::new();
        for _ in 0..6 {
            assert_eq!(limit.current(), 20);
            limit.acquire().await.overloaded();
            assert_eq!(limit.current(), 18);
            windows(&limit, 1, |_| 10).await;
            let mut waited = 0;
            while limit.current() < 20 {
                windows(&limit, 1, |_| 10).await;
                waited += 1;
            }
            waits.push(waited);
        }
        assert_eq!(waits, [4, 8, 16, 32, 64, 64]);
        // Past the ceiling without a refusal: careful only once more, then every window.
        windows(&limit, 64, |_| 10).await;
        assert_eq!(limit.current(), 21);
        windows(&limit, 1, |_| 10).await;
        assert_eq!(limit.current(), 22);
        limit.acquire().await.overloaded();
        windows(&limit, 1, |_| 10).await;
        let before = limit.current();
        windows(&limit, 4, |_| 10).await;
        assert_eq!(
            limit.current(),
            before + 1,
            "a new ceiling starts at 4 windows"
        );
    }

    #[tokio::test]
    async fn at_a_small_limit_each_overload_takes_one_permit_away() {
        let limit = adaptive(100);
        for expected in [3, 2, 1, 1] {
            limit.acquire().await.overloaded();
            assert_eq!(limit.current(), expected);
        }
    }

    #[tokio::test]
    async fn a_lowered_limit_takes_back_permits_as_they_return() {
        let limit = adaptive(100);
        windows(&limit, 16, |_| 10).await;
        let out: Vec<_> = futures::future::join_all((0..20).map(|_| limit.acquire())).await;
        out[0].overloaded();
        drop(out);
        assert_eq!(limit.permits.available_permits(), 18);
        assert_eq!(limit.lock().debt, 0);
    }

    #[tokio::test]
    async fn a_pause_holds_every_new_request_and_is_capped() {
        let limit = RequestLimit::new(
            LimitSettings {
                adaptive: false,
                max: 4,
                pause_max: Duration::from_millis(300),
            },
            None,
        );
        let start = Instant::now();
        limit.pause(Duration::from_millis(100));
        drop(limit.acquire().await);
        assert!(start.elapsed() >= Duration::from_millis(100));
        let start = Instant::now();
        limit.pause(Duration::from_secs(3600));
        drop(limit.acquire().await);
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(60));
        assert_eq!(limit.current(), 4, "a fixed limit stays");
    }
}
