//! The failure policy: retries, then what happens to a message that still fails.

use crate::settings::error::SettingError;
use crate::settings::failure::{OnFailure, RetryPolicy};
use crate::settings::raw::RawSettings;
use crate::settings::with_prefix;

use super::kafka::{valid_topic, Connection};

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
}

impl FailureSettings {
    /// The retries, `ACKD_ON_FAILURE` and `ACKD_DEAD_LETTER_TOPIC`, which must not be
    /// one of the `connection`'s topics.
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
        Ok(FailureSettings {
            retry,
            on_failure,
            dead_letter_topic,
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
