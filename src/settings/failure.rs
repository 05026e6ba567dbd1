//! What happens when a processor does not acknowledge a message.
//!
//! A retryable failure is tried again, on the same message (its partition waits; others
//! go on), after an exponential backoff with jitter, up to `ACKD_RETRY_MAX_ATTEMPTS`
//! attempts in all. When attempts run out, or the failure is permanent (a panic is), the
//! `ACKD_ON_FAILURE` policy decides: halt the partition, skip the message, or hand it to
//! a dead-letter topic.

use std::time::Duration;

/// `ACKD_ON_FAILURE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// The partition stops at the message; nothing past it is committed.
    Halt,
    /// The message is logged, counted and acknowledged.
    Skip,
    /// The message goes to `ACKD_DEAD_LETTER_TOPIC`; acknowledged once the broker has it.
    DeadLetter,
}

impl OnFailure {
    pub const ALLOWED: &'static str = "halt, skip or dead-letter";

    pub fn parse(s: &str) -> Option<OnFailure> {
        match s {
            "halt" => Some(OnFailure::Halt),
            "skip" => Some(OnFailure::Skip),
            "dead-letter" => Some(OnFailure::DeadLetter),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OnFailure::Halt => "halt",
            OnFailure::Skip => "skip",
            OnFailure::DeadLetter => "dead-letter",
        }
    }
}

/// `ACKD_RETRY_*`: how often and how patiently a retryable failure is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub initial: Duration,
    pub max: Duration,
    /// Attempts in all, the first included; 1 means no retry.
    pub max_attempts: u32,
}

impl RetryPolicy {
    /// The wait after failed attempt `attempt` (1-based): `initial × 2^(attempt-1)`,
    /// capped at `max`, then "equal jitter" (a uniform draw in its upper half), so
    /// that many partitions failing at once do not retry in lockstep while the wait
    /// still grows.
    pub fn delay(&self, attempt: u32, rng: &mut fastrand::Rng) -> Duration {
        let exp = attempt.saturating_sub(1).min(32);
        let base = self
            .initial
            .saturating_mul(1u32 << exp.min(31))
            .min(self.max);
        let half = base / 2;
        half + Duration::from_nanos(rng.u64(0..=half.as_nanos() as u64))
    }

    /// Whether another attempt follows attempt `attempt`.
    pub fn again(&self, attempt: u32) -> bool {
        attempt < self.max_attempts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn retry() -> RetryPolicy {
        RetryPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
            max_attempts: 4,
        }
    }

    #[test]
    fn attempts_are_counted_with_the_first() {
        let r = retry();
        assert!(r.again(1) && r.again(3));
        assert!(!r.again(4));
        assert!(!RetryPolicy {
            max_attempts: 1,
            ..r
        }
        .again(1));
    }

    #[test]
    fn policies_parse() {
        for p in [OnFailure::Halt, OnFailure::Skip, OnFailure::DeadLetter] {
            assert_eq!(OnFailure::parse(p.as_str()), Some(p));
        }
        assert_eq!(OnFailure::parse("retry"), None);
    }

    proptest! {
        /// The delay doubles per attempt up to the cap, jittered within its upper half.
        #[test]
        fn delay_grows_exponentially_within_jitter_and_cap(attempt in 1u32..100, seed in any::<u64>()) {
            let r = retry();
            let mut rng = fastrand::Rng::with_seed(seed);
            let d = r.delay(attempt, &mut rng);
            let base = (r.initial.as_millis() * (1u128 << (attempt - 1).min(60))).min(r.max.as_millis());
            prop_assert!(d.as_millis() >= base / 2, "{d:?} below half of {base}");
            prop_assert!(d.as_millis() <= base, "{d:?} above {base}");
        }
    }
}
