//! A simulated processing time, for processors that stand in for real work in tests and
//! benchmarks: the testkit's `slow` processor (`ACKD_TEST_DELAY_MS`) and
//! `examples/slow_processor.rs` (`SLOW_DELAY_MS`, used by `scripts/bench`).
//!
//! `5` is 5 ms every time; `0-5` is uniform between 0 and 5 ms, drawn per call with
//! microsecond resolution (Parallel Consumer's benchmark case: "0-5 ms at random"). What a
//! tokio sleep really takes is longer: its timer rounds a deadline up to the next
//! millisecond and wakes when the runtime gets to it, so callers that need the real mean
//! time it themselves.

use std::time::Duration;

/// A fixed or uniformly random delay, in whole milliseconds at its bounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delay {
    min_ms: u64,
    max_ms: u64,
}

impl Delay {
    /// Always `ms` milliseconds.
    pub fn fixed(ms: u64) -> Delay {
        Delay {
            min_ms: ms,
            max_ms: ms,
        }
    }

    /// `N` or `MIN-MAX` (whole milliseconds, `MIN <= MAX`, each at most `limit_ms`); the
    /// error says what is allowed, for a `SettingError`'s problem.
    pub fn parse(text: &str, limit_ms: u64) -> Result<Delay, String> {
        let problem = || {
            format!(
                "expected a whole number of milliseconds from 0 to {limit_ms}, or a range MIN-MAX of them (e.g. 0-5: uniform at random)"
            )
        };
        let number = |s: &str| {
            s.trim()
                .parse::<u64>()
                .ok()
                .filter(|ms| *ms <= limit_ms)
                .ok_or_else(problem)
        };
        let (min_ms, max_ms) = match text.split_once('-') {
            Some((a, b)) => (number(a)?, number(b)?),
            None => {
                let ms = number(text)?;
                (ms, ms)
            }
        };
        if min_ms > max_ms {
            return Err(problem());
        }
        Ok(Delay { min_ms, max_ms })
    }

    /// One delay: the fixed one, or uniform in `[min, max]` to the microsecond.
    pub fn sample(&self, rng: &mut fastrand::Rng) -> Duration {
        Duration::from_micros(rng.u64(self.min_ms * 1000..=self.max_ms * 1000))
    }

    /// The mean of [`Delay::sample`]: what the delay asks for, not what a sleep takes.
    pub fn mean(&self) -> Duration {
        Duration::from_micros((self.min_ms + self.max_ms) * 500)
    }

    /// Whether every call is the same delay (no random draw needed).
    pub fn is_fixed(&self) -> bool {
        self.min_ms == self.max_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_number_or_a_range_and_refuses_the_rest() {
        assert_eq!(Delay::parse("5", 100), Ok(Delay::fixed(5)));
        assert_eq!(Delay::parse("0", 100), Ok(Delay::default()));
        assert_eq!(
            Delay::parse("0-5", 100),
            Ok(Delay {
                min_ms: 0,
                max_ms: 5
            })
        );
        assert_eq!(Delay::parse(" 2 - 2 ", 100), Ok(Delay::fixed(2)));
        for bad in [
            "", "-", "5-", "-5", "5-0", "1.5", "a-b", "0-101", "101", "1-2-3",
        ] {
            let e = Delay::parse(bad, 100).expect_err(bad);
            assert!(e.contains("0 to 100") && e.contains("0-5"), "{bad}: {e}");
        }
    }

    #[test]
    fn samples_stay_in_the_range_and_average_its_middle() {
        let mut rng = fastrand::Rng::with_seed(14);
        let delay = Delay::parse("0-5", 100).unwrap();
        let n = 100_000;
        let mut total = Duration::ZERO;
        let (mut below_1ms, mut above_4ms) = (0, 0);
        for _ in 0..n {
            let d = delay.sample(&mut rng);
            assert!(d <= Duration::from_millis(5), "{d:?}");
            below_1ms += usize::from(d < Duration::from_millis(1));
            above_4ms += usize::from(d > Duration::from_millis(4));
            total += d;
        }
        assert_eq!(delay.mean(), Duration::from_micros(2500));
        let mean_us = total.as_micros() as f64 / n as f64;
        assert!((mean_us - 2500.0).abs() < 25.0, "mean {mean_us} µs");
        // Uniform: each fifth of the range gets about a fifth of the draws.
        for tail in [below_1ms, above_4ms] {
            assert!((19_000..21_000).contains(&tail), "{tail} of {n}");
        }
        let fixed = Delay::fixed(3);
        assert!(fixed.is_fixed() && !delay.is_fixed());
        assert_eq!(fixed.sample(&mut rng), Duration::from_millis(3));
    }
}
