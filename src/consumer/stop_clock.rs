//! The graceful stop's clock: the one home of the stop's deadline and of the points its
//! steps must end by, and the waits that a stop may cut short.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The graceful stop's clock: unset until the stop begins, then its deadline and the
/// points its steps must end by. The daemon starts it on the signal, before anything
/// else. The supervisor reads the shutdown watch only between polls, and a revoke runs
/// inside a poll: a revoke under way reads this clock while it waits, so that it cannot
/// eat the time of the final commit of the partitions it does not release.
#[derive(Default)]
pub struct StopClock(Mutex<Option<StopTimes>>);

/// When each step of a graceful stop must be over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopTimes {
    /// When the process must have committed (it exits then at the latest).
    pub deadline: Instant,
    /// When draining in-flight messages must end: the deadline less
    /// [`crate::config::settings::commit_reserve`], kept for the commits and the close.
    pub drain_until: Instant,
    /// When a revoke's commit under way at the stop must end: half the reserve is left
    /// for the final commit of the other partitions.
    pub revoke_commit_until: Instant,
}

impl StopClock {
    /// Starts the clock for a stop that began at `begun` and must end by `deadline`;
    /// the first call wins. Returns the clock's times.
    pub fn begin(&self, begun: Instant, deadline: Instant) -> StopTimes {
        let mut times = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *times.get_or_insert_with(|| {
            let reserve =
                crate::config::settings::commit_reserve(deadline.saturating_duration_since(begun));
            StopTimes {
                deadline,
                drain_until: deadline - reserve,
                revoke_commit_until: deadline - reserve / 2,
            }
        })
    }

    /// The stop's times, once it began.
    pub fn times(&self) -> Option<StopTimes> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How often a wait that a stop may cut short looks at the [`StopClock`].
pub(crate) const STOP_CHECK: Duration = Duration::from_millis(50);

/// Sleeps until `until`, or until `deadline()` (which a stop may bring forward) if sooner.
pub(crate) fn sleep_until(until: Instant, deadline: &dyn Fn() -> Instant) {
    loop {
        let now = Instant::now();
        let end = until.min(deadline());
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(STOP_CHECK));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stop_clock_keeps_its_first_start_and_a_reserve_for_the_commits() {
        let clock = StopClock::default();
        assert_eq!(clock.times(), None);
        let begun = Instant::now();
        let times = clock.begin(begun, begun + Duration::from_secs(25));
        // A fifth of 25 s is kept: the drain ends at 20 s, a revoke's commit at 22.5 s.
        assert_eq!(times.drain_until, begun + Duration::from_secs(20));
        assert_eq!(
            times.revoke_commit_until,
            begun + Duration::from_millis(22_500)
        );
        // The supervisor's own start after the daemon's changes nothing.
        let later = begun + Duration::from_secs(1);
        assert_eq!(clock.begin(later, later + Duration::from_secs(25)), times);
        assert_eq!(clock.times(), Some(times));
    }
}
