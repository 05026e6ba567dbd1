//! The failure policy: retries, then what happens to a message that still fails.

use std::time::Duration;

use crate::settings::raw::RawSettings;
use crate::settings::with_prefix;
use crate::settings::SettingError;

use super::kafka::{valid_topic, Connection};
use super::retry_topics::{no_attempts_in_place, RetryTiers};

/// What happens to a message whose processor call fails.
#[derive(Debug, Clone)]
pub struct FailureSettings {
    /// `ACKD_RETRY_*`: how often, and after what waits, a retryable failure is tried again.
    pub retry: RetryPolicy,
    /// `ACKD_ON_FAILURE`: when attempts run out or a failure is permanent.
    pub on_failure: OnFailure,
    /// `ACKD_DEAD_LETTER_TOPIC`, where `ACKD_ON_FAILURE=dead-letter` sends messages; the
    /// full topic name (`KAFKA_PREFIX` applied).
    pub dead_letter_topic: Option<String>,
    /// `ACKD_RETRY_TOPICS`: the tiers a retryable failure goes through (empty: off,
    /// retries in place).
    pub retry_tiers: RetryTiers,
}

impl FailureSettings {
    /// The retries, `ACKD_ON_FAILURE`, `ACKD_DEAD_LETTER_TOPIC`, which must not be
    /// one of the `connection`'s topics, and `ACKD_RETRY_TOPICS`.
    pub(super) fn parse(
        raw: &RawSettings,
        connection: &Connection,
    ) -> Result<FailureSettings, SettingError> {
        let retry = retry_policy(raw)?;
        let on_failure = OnFailure::parse(&raw.get("on_failure").to_ascii_lowercase())
            .ok_or_else(|| raw.error("on_failure", format!("expected {}", OnFailure::ALLOWED)))?;
        let dead_letter_topic = match raw.get("dead_letter_topic") {
            "" => None,
            t if valid_topic(t) => Some(with_prefix(connection.kafka_prefix.as_deref(), t)),
            t => {
                return Err(raw.error(
                    "dead_letter_topic",
                    format!("`{t}` is not a valid topic name: up to 249 of a-z A-Z 0-9 . _ -"),
                ))
            }
        };
        if on_failure == OnFailure::DeadLetter && dead_letter_topic.is_none() {
            return Err(SettingError::new(
                "ACKD_DEAD_LETTER_TOPIC",
                None,
                "is required with ACKD_ON_FAILURE=dead-letter: the topic failed messages go to",
            ));
        }
        if dead_letter_topic
            .as_ref()
            .is_some_and(|d| connection.topics.contains(d))
        {
            return Err(raw.error(
                "dead_letter_topic",
                "is also in ACKD_TOPICS: dead letters would be consumed again",
            ));
        }
        let taken: Vec<&str> = dead_letter_topic.iter().map(String::as_str).collect();
        let retry_tiers = RetryTiers::parse(raw, &connection.topics, &taken)?;
        if !retry_tiers.is_empty() {
            no_attempts_in_place(raw, retry.max_attempts)?;
        }
        Ok(FailureSettings {
            retry,
            on_failure,
            dead_letter_topic,
            retry_tiers,
        })
    }
}

/// `ACKD_RETRY_INITIAL_MS`, `ACKD_RETRY_MAX_MS` and `ACKD_RETRY_MAX_ATTEMPTS`.
fn retry_policy(raw: &RawSettings) -> Result<RetryPolicy, SettingError> {
    let retry = RetryPolicy {
        initial: raw.millis("retry_initial_ms", 1, 3_600_000)?,
        max: raw.millis("retry_max_ms", 1, 3_600_000)?,
        max_attempts: match raw.get("retry_max_attempts").parse::<u32>() {
            Ok(n) if n >= 1 => n,
            _ => {
                return Err(raw.error(
                    "retry_max_attempts",
                    "expected a whole number of attempts, 1 or more (1: no retry)",
                ))
            }
        },
    };
    if retry.max < retry.initial {
        return Err(raw.error(
            "retry_max_ms",
            format!(
                "is below ACKD_RETRY_INITIAL_MS ({} ms): the longest wait cannot be shorter than the first",
                retry.initial.as_millis()
            ),
        ));
    }
    Ok(retry)
}

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
mod policy_tests {
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

#[cfg(test)]
mod tests {
    use crate::settings::test_vars::{err, vars};
    use crate::settings::Settings;

    #[test]
    fn failure_policy_settings_are_checked_together() {
        let e = err(&[("ACKD_ON_FAILURE", "dead-letter")]);
        assert_eq!(e.setting, "ACKD_DEAD_LETTER_TOPIC");
        let e = err(&[("ACKD_ON_FAILURE", "drop")]);
        assert!(e.problem.contains("halt, skip or dead-letter"), "{e}");
        let e = err(&[
            ("ACKD_RETRY_INITIAL_MS", "5000"),
            ("ACKD_RETRY_MAX_MS", "100"),
        ]);
        assert_eq!(e.setting, "ACKD_RETRY_MAX_MS");
        let e = err(&[("ACKD_RETRY_MAX_ATTEMPTS", "0")]);
        assert_eq!(e.setting, "ACKD_RETRY_MAX_ATTEMPTS");
        let e = err(&[
            ("ACKD_ON_FAILURE", "dead-letter"),
            ("ACKD_DEAD_LETTER_TOPIC", "orders"),
        ]);
        assert!(e.problem.contains("ACKD_TOPICS"), "{e}");
        let s = Settings::from_vars(vars(&[
            ("ACKD_ON_FAILURE", "dead-letter"),
            ("ACKD_DEAD_LETTER_TOPIC", "orders.dlq"),
        ]))
        .unwrap();
        assert_eq!(s.failure.dead_letter_topic.as_deref(), Some("orders.dlq"));
        assert_eq!(s.failure.retry.max_attempts, 5);
    }
}
