//! The failure policy: retries, then what happens to a message that still fails.

use crate::config::error::SettingError;
use crate::config::failure::{OnFailure, RetryPolicy};
use crate::config::settings::raw::RawSettings;
use crate::config::settings::with_prefix;

use super::kafka::{valid_topic, Connection};

/// The failure policy, validated.
pub(super) struct FailurePolicy {
    pub(super) retry: RetryPolicy,
    pub(super) on_failure: OnFailure,
    /// Full topic name: `KAFKA_PREFIX` applied.
    pub(super) dead_letter_topic: Option<String>,
}

impl RawSettings {
    /// The retries, `ACKD_ON_FAILURE` and `ACKD_DEAD_LETTER_TOPIC`, which must not be
    /// one of the `connection`'s topics.
    pub(super) fn failure_policy(
        &self,
        connection: &Connection,
    ) -> Result<FailurePolicy, SettingError> {
        let retry = self.retry_policy()?;
        let on_failure = OnFailure::parse(&self.get("on_failure").to_ascii_lowercase())
            .ok_or_else(|| self.error("on_failure", format!("expected {}", OnFailure::ALLOWED)))?;
        let dead_letter_topic = match self.get("dead_letter_topic") {
            "" => None,
            t if valid_topic(t) => Some(with_prefix(connection.kafka_prefix.as_deref(), t)),
            t => {
                return Err(self.error(
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
            return Err(self.error(
                "dead_letter_topic",
                "is also in ACKD_TOPICS: dead letters would be consumed again",
            ));
        }
        Ok(FailurePolicy {
            retry,
            on_failure,
            dead_letter_topic,
        })
    }

    /// `ACKD_RETRY_INITIAL_MS`, `ACKD_RETRY_MAX_MS` and `ACKD_RETRY_MAX_ATTEMPTS`.
    fn retry_policy(&self) -> Result<RetryPolicy, SettingError> {
        let retry = RetryPolicy {
            initial: self.millis("retry_initial_ms", 1, 3_600_000)?,
            max: self.millis("retry_max_ms", 1, 3_600_000)?,
            max_attempts: match self.get("retry_max_attempts").parse::<u32>() {
                Ok(n) if n >= 1 => n,
                _ => {
                    return Err(self.error(
                        "retry_max_attempts",
                        "expected a whole number of attempts, 1 or more (1: no retry)",
                    ))
                }
            },
        };
        if retry.max < retry.initial {
            return Err(self.error(
                "retry_max_ms",
                format!(
                    "is below ACKD_RETRY_INITIAL_MS ({} ms): the longest wait cannot be shorter than the first",
                    retry.initial.as_millis()
                ),
            ));
        }
        Ok(retry)
    }
}

#[cfg(test)]
mod tests {
    use crate::config::settings::test_vars::{err, vars};
    use crate::config::settings::Settings;

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
        assert_eq!(s.dead_letter_topic.as_deref(), Some("orders.dlq"));
        assert_eq!(s.retry.max_attempts, 5);
    }
}
