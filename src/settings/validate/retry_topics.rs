//! `ACKD_RETRY_TOPICS`: tiers of retry topics. A message that fails retryably is handed
//! to its topic's next tier (`<topic>.retry.<delay>`, e.g. `orders.retry.10s`) instead of
//! being retried in place; each tier's copies are processed no earlier than their
//! timestamp (the copy's produce time) plus the tier's delay.

use std::collections::HashMap;
use std::time::Duration;

use crate::settings::keys::default_config;
use crate::settings::raw::RawSettings;
use crate::settings::SettingError;

use super::kafka::valid_topic;
use super::processing::MAX_DELAY_MS;

/// Tiers at most: each is a topic per source topic, all consumed.
pub const MAX_TIERS: usize = 10;

/// The retry tiers of every source topic. Empty: off.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetryTiers {
    /// Each tier's delay, growing, and its name's suffix (`10s`).
    tiers: Vec<(Duration, String)>,
    /// Every tier topic (full name) → its source topic and tier index.
    by_topic: HashMap<String, (String, usize)>,
    /// The tier topics, source by source, tier by tier.
    topics: Vec<String>,
}

/// Where a failing message goes next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextTier<'a> {
    /// The tier topic.
    pub topic: &'a str,
    /// Its delay.
    pub delay: Duration,
}

impl RetryTiers {
    pub fn is_empty(&self) -> bool {
        self.tiers.is_empty()
    }

    /// The tier topics to consume, besides `ACKD_TOPICS`.
    pub fn topics(&self) -> &[String] {
        &self.topics
    }

    /// The delay of the tier `topic` is, if it is one.
    pub fn delay_of(&self, topic: &str) -> Option<Duration> {
        self.by_topic.get(topic).map(|(_, i)| self.tiers[*i].0)
    }

    /// Where a message of `topic` that failed retryably goes: the next tier of its source
    /// topic, or `None` after the last tier (the failure policy applies) or for a topic
    /// that is neither a source nor a tier.
    pub fn next(&self, topic: &str) -> Option<NextTier<'_>> {
        let (source, next) = match self.by_topic.get(topic) {
            Some((source, i)) => (source.as_str(), i + 1),
            None => (topic, 0),
        };
        let (delay, _) = self.tiers.get(next)?;
        let name = self.topics.iter().find(|t| {
            self.by_topic
                .get(t.as_str())
                .is_some_and(|(s, i)| s == source && *i == next)
        })?;
        Some(NextTier {
            topic: name,
            delay: *delay,
        })
    }

    /// The tiers of `sources` (full topic names) from `ACKD_RETRY_TOPICS`; each tier
    /// topic must be a valid name and not one of `taken` (the sources, the dead-letter
    /// topic).
    pub(super) fn parse(
        raw: &RawSettings,
        sources: &[String],
        taken: &[&str],
    ) -> Result<RetryTiers, SettingError> {
        if raw.get("retry_topics").is_empty() {
            return Ok(RetryTiers::default());
        }
        let mut tiers: Vec<(Duration, String)> = Vec::new();
        for part in raw.get("retry_topics").split(',').map(str::trim) {
            let Some(delay) = parse_delay(part) else {
                return Err(raw.error(
                    "retry_topics",
                    format!("`{part}` is not a delay: expected comma-separated delays with a unit, each from 1ms to 7d, e.g. 10s,1m,10m (units ms, s, m, h, d)"),
                ));
            };
            if tiers.last().is_some_and(|(d, _)| *d >= delay) {
                return Err(raw.error(
                    "retry_topics",
                    "expected growing delays (each tier's topic is named after its delay, so no two may be equal), e.g. 10s,1m,10m",
                ));
            }
            tiers.push((delay, label(delay)));
        }
        if tiers.len() > MAX_TIERS {
            return Err(raw.error(
                "retry_topics",
                format!("at most {MAX_TIERS} tiers (each is a topic per topic of ACKD_TOPICS)"),
            ));
        }
        let mut by_topic = HashMap::new();
        let mut topics = Vec::new();
        for source in sources {
            for (i, (_, label)) in tiers.iter().enumerate() {
                let name = format!("{source}.retry.{label}");
                if !valid_topic(&name) {
                    return Err(raw.error("retry_topics", format!("the tier topic `{name}` is not a valid topic name: up to 249 of a-z A-Z 0-9 . _ -")));
                }
                if taken.contains(&name.as_str()) || sources.contains(&name) {
                    return Err(raw.error("retry_topics", format!("the tier topic `{name}` is also in ACKD_TOPICS or ACKD_DEAD_LETTER_TOPIC: a topic is either consumed as a source, a tier, or a dead-letter topic")));
                }
                by_topic.insert(name.clone(), (source.clone(), i));
                topics.push(name);
            }
        }
        Ok(RetryTiers {
            tiers,
            by_topic,
            topics,
        })
    }
}

/// With retry topics the tiers are the retries: a retryable failure goes to the next
/// tier at once. An `ACKD_RETRY_MAX_ATTEMPTS` set by hand (not its default) would
/// silently do nothing, so it is an error.
pub(super) fn no_attempts_in_place(
    raw: &RawSettings,
    max_attempts: u32,
) -> Result<(), SettingError> {
    let default = default_config().and_then(|c| c.get_int("retry_max_attempts").ok());
    if default == Some(i64::from(max_attempts)) {
        return Ok(());
    }
    Err(raw.error(
        "retry_max_attempts",
        "cannot be combined with ACKD_RETRY_TOPICS: each tier is one more attempt, and a retryable failure goes to the next tier without retries in place; unset it, or unset ACKD_RETRY_TOPICS",
    ))
}

/// `10s`, `1m`, `1500ms`, `2h`, `1d`: from 1 ms to 7 days.
fn parse_delay(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = text.split_at(split);
    let n: u64 = n.parse().ok()?;
    let ms = n.checked_mul(match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    })?;
    (1..=MAX_DELAY_MS)
        .contains(&ms)
        .then(|| Duration::from_millis(ms))
}

/// A delay as a topic name's suffix: in the largest unit that divides it (`60s` and
/// `1m` name the same tier, `1m`).
fn label(delay: Duration) -> String {
    let ms = delay.as_millis() as u64;
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::test_vars::{err, vars};
    use crate::settings::Settings;

    #[test]
    fn delays_parse_and_name_their_tiers() {
        assert_eq!(parse_delay("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_delay("1500ms"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_delay("7d"), Some(Duration::from_secs(7 * 86_400)));
        for bad in ["8d", "0s", "10", "s", "1.5s", "-1s", "10 s"] {
            assert_eq!(parse_delay(bad), None, "{bad}");
        }
        assert_eq!(label(Duration::from_secs(60)), "1m");
        assert_eq!(label(Duration::from_millis(1500)), "1500ms");
        assert_eq!(label(Duration::from_secs(90)), "90s");
    }

    #[test]
    fn tiers_follow_each_other_then_end() {
        let s = Settings::from_vars(vars(&[
            ("ACKD_TOPICS", "orders,payments"),
            ("ACKD_RETRY_TOPICS", "10s, 60s,10m"),
        ]))
        .unwrap();
        let t = &s.failure.retry_tiers;
        assert_eq!(
            t.topics(),
            [
                "orders.retry.10s",
                "orders.retry.1m",
                "orders.retry.10m",
                "payments.retry.10s",
                "payments.retry.1m",
                "payments.retry.10m"
            ]
        );
        let next = t.next("orders").unwrap();
        assert_eq!(
            (next.topic, next.delay),
            ("orders.retry.10s", Duration::from_secs(10))
        );
        assert_eq!(
            t.next("payments.retry.10s").unwrap().topic,
            "payments.retry.1m"
        );
        assert_eq!(t.next("orders.retry.10m"), None);
        assert_eq!(t.delay_of("orders.retry.1m"), Some(Duration::from_secs(60)));
        assert_eq!(t.delay_of("orders"), None);
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert!(s.failure.retry_tiers.is_empty());
        assert_eq!(s.failure.retry_tiers.next("orders"), None);
    }

    #[test]
    fn bad_tiers_are_configuration_errors() {
        for bad in ["10s,5s", "10s,10s", "1x", "10s,,1m", "1,2,3"] {
            let e = err(&[("ACKD_RETRY_TOPICS", bad)]);
            assert_eq!(e.setting, "ACKD_RETRY_TOPICS", "{bad}: {e}");
        }
        let e = err(&[("ACKD_RETRY_TOPICS", "1s,2s,3s,4s,5s,6s,7s,8s,9s,10s,11s")]);
        assert!(e.problem.contains("at most 10"), "{e}");
        let e = err(&[
            ("ACKD_TOPICS", "orders,orders.retry.10s"),
            ("ACKD_RETRY_TOPICS", "10s"),
        ]);
        assert!(e.problem.contains("also in ACKD_TOPICS"), "{e}");
        let e = err(&[
            ("ACKD_RETRY_TOPICS", "10s"),
            ("ACKD_RETRY_MAX_ATTEMPTS", "3"),
        ]);
        assert_eq!(e.setting, "ACKD_RETRY_MAX_ATTEMPTS");
        assert!(e.problem.contains("ACKD_RETRY_TOPICS"), "{e}");
    }
}
