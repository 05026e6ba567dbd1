//! `ACKD_MEMORY_MB`: one prefetch budget for the whole process.
//!
//! librdkafka fetches ahead into one queue per assigned partition (ackd splits them), and
//! with split queues its limits (`queued.max.messages.kbytes`, `queued.min.messages`)
//! apply per partition: prefetch memory is partitions × limit. Those limits are fixed
//! when the consumer is created, so a share per *held* partition cannot follow the
//! assignment; pausing partitions instead purges what librdkafka had fetched for them
//! (each pause bumps the partition's fetch version) and races with revokes. So the
//! budget is divided among the partitions ackd *could* hold: every partition of
//! `ACKD_TOPICS`, counted when ackd starts. Whatever it is assigned, 1 or all, the
//! prefetch stays within the budget.
//!
//! Per partition, with share S = budget / partitions: the queue stops fetching at S/2
//! (`queued.max.messages.kbytes`), one fetch response may add up to S/4 on top
//! (`max.partition.fetch.bytes` = `fetch.max.bytes`), and a queued message keeps its
//! whole fetch response alive (librdkafka references responses, it does not copy
//! them), for which the last S/4 is left. Every limit is capped at ackd's defaults, so a
//! budget never raises the prefetch above what ackd does without one.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

use crate::config::settings::Settings;

/// The least share per partition: below it a partition fetches a few messages at a time.
pub const MIN_SHARE: u64 = 64 * 1024;
/// Partitions assumed when the brokers cannot tell how many the topics have.
pub const ASSUMED_PARTITIONS: u64 = 256;
/// ackd's defaults for librdkafka's limits (the `[rdkafka]` table of config/default.toml,
/// declared there only), which a budget only ever lowers.
struct DefaultLimits {
    queue_kbytes: u64,
    queue_messages: u64,
    fetch_bytes: u64,
}

impl DefaultLimits {
    fn read() -> DefaultLimits {
        let defaults = crate::config::settings::rdkafka_defaults();
        let limit = |property: &str| -> u64 {
            defaults
                .iter()
                .find(|(p, _)| p == property)
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or_else(|| panic!("config/default.toml sets {property} to a number"))
        };
        DefaultLimits {
            queue_kbytes: limit("queued.max.messages.kbytes"),
            queue_messages: limit("queued.min.messages"),
            fetch_bytes: limit("fetch.max.bytes"),
        }
    }
}
/// librdkafka's least `message.max.bytes`.
const MIN_FETCH_BYTES: u64 = 8 * 1024;

/// The budget and what it gives each partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub bytes: u64,
    /// The partitions it is divided among (those of the topics, or assumed).
    pub partitions: u64,
    /// Whether `partitions` was counted (false: [`ASSUMED_PARTITIONS`]).
    pub counted: bool,
    pub share: u64,
    pub queue_kbytes: u64,
    pub queue_messages: u64,
    pub fetch_bytes: u64,
}

impl Budget {
    /// Divides `memory_mb` among `partitions` (`None`: unknown). `Err`: the problem, for
    /// an `at=config_error setting=ACKD_MEMORY_MB` line.
    pub fn plan(memory_mb: u64, partitions: Option<u64>) -> Result<Budget, String> {
        let bytes = memory_mb << 20;
        let (partitions, counted) = match partitions {
            Some(p) => (p.max(1), true),
            // Unknown: assume many, but never a share below the minimum.
            None => ((bytes / MIN_SHARE).clamp(1, ASSUMED_PARTITIONS), false),
        };
        let share = bytes / partitions;
        if share < MIN_SHARE {
            let needed = (partitions * MIN_SHARE).div_ceil(1 << 20);
            return Err(format!(
                "gives {} KiB per partition to the {partitions} partitions of ACKD_TOPICS; at least {} KiB each: {needed} or more",
                share / 1024,
                MIN_SHARE / 1024
            ));
        }
        let most = DefaultLimits::read();
        let fetch_bytes = (share / 4).clamp(MIN_FETCH_BYTES, most.fetch_bytes);
        Ok(Budget {
            bytes,
            partitions,
            counted,
            share,
            queue_kbytes: (share / 2 / 1024).clamp(1, most.queue_kbytes),
            // librdkafka keeps a few hundred bytes per queued message besides its value:
            // bound the count too, for small messages.
            queue_messages: (share / 1024).clamp(16, most.queue_messages),
            fetch_bytes,
        })
    }

    /// Sets the librdkafka limits (over the defaults from config/default.toml).
    pub fn apply(&self, config: &mut ClientConfig) {
        config
            .set("queued.max.messages.kbytes", self.queue_kbytes.to_string())
            .set("queued.min.messages", self.queue_messages.to_string())
            .set("fetch.max.bytes", self.fetch_bytes.to_string())
            .set("max.partition.fetch.bytes", self.fetch_bytes.to_string())
            // fetch.max.bytes must be at least this (a producer's setting, unused here).
            .set(
                "message.max.bytes",
                self.fetch_bytes.min(1_000_000).to_string(),
            );
    }

    /// The `at=memory_budget` line, at start and whenever the assignment changes.
    pub fn log(&self, held: Option<usize>) {
        let over = held.is_some_and(|h| h as u64 > self.partitions);
        let prefetch_kb = held.map(|h| h as u64 * self.share / 1024);
        if over {
            tracing::warn!(
                at = "memory_budget",
                memory_mb = self.bytes >> 20,
                partitions = held,
                divided_among = self.partitions,
                share_kb = self.share / 1024,
                prefetch_kb,
                "more partitions than the budget was divided among (partitions added, or unknown at start): prefetch may exceed ACKD_MEMORY_MB until ackd restarts"
            );
        } else {
            tracing::info!(
                at = "memory_budget",
                memory_mb = self.bytes >> 20,
                partitions = held,
                divided_among = self.partitions,
                counted = self.counted,
                share_kb = self.share / 1024,
                prefetch_kb,
                queued_max_messages_kbytes = held.is_none().then_some(self.queue_kbytes),
                queued_min_messages = held.is_none().then_some(self.queue_messages),
                fetch_max_bytes = held.is_none().then_some(self.fetch_bytes),
            );
        }
    }
}

/// The partitions of `settings.topics`, from the brokers; `None` when they cannot be
/// asked (or a topic does not exist yet) within `timeout`.
pub fn count_partitions(settings: &Settings, timeout: Duration) -> Option<u64> {
    let consumer: BaseConsumer = crate::config::client_config::base_config(settings)
        .create()
        .ok()?;
    let mut total = 0;
    for topic in &settings.topics {
        let metadata = consumer.fetch_metadata(Some(topic), timeout).ok()?;
        let t = metadata.topics().iter().find(|t| t.name() == topic)?;
        if t.error().is_some() || t.partitions().is_empty() {
            return None;
        }
        total += t.partitions().len() as u64;
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divides_the_budget_among_the_partitions() {
        let b = Budget::plan(64, Some(200)).unwrap();
        assert_eq!(b.share, (64 << 20) / 200);
        assert_eq!(b.queue_kbytes, b.share / 2 / 1024);
        assert_eq!(b.fetch_bytes, b.share / 4);
        // Queue, one response on top, responses kept alive: within the share.
        assert!(b.queue_kbytes * 1024 + 2 * b.fetch_bytes <= b.share);
    }

    #[test]
    fn never_raises_the_defaults() {
        // config/default.toml's values: a copy of them kept 10000 messages after it became 5000.
        let b = Budget::plan(4096, Some(1)).unwrap();
        let most = DefaultLimits::read();
        assert_eq!(b.queue_kbytes, most.queue_kbytes);
        assert_eq!(b.queue_messages, most.queue_messages);
        assert_eq!(b.fetch_bytes, most.fetch_bytes);
    }

    #[test]
    fn too_small_a_share_is_refused_with_what_would_do() {
        let e = Budget::plan(8, Some(200)).unwrap_err();
        assert!(e.contains("200 partitions"), "{e}");
        assert!(e.contains("13 or more"), "{e}");
        assert!(Budget::plan(13, Some(200)).is_ok());
    }

    #[test]
    fn unknown_partitions_assume_many_within_the_minimum() {
        let b = Budget::plan(64, None).unwrap();
        assert_eq!(b.partitions, ASSUMED_PARTITIONS);
        assert!(!b.counted);
        let small = Budget::plan(4, None).unwrap();
        assert_eq!(small.share, MIN_SHARE);
    }

    #[test]
    fn librdkafka_accepts_the_limits() {
        for (mb, p) in [(1, Some(1)), (64, Some(200)), (13, Some(200)), (1024, None)] {
            let b = Budget::plan(mb, p).unwrap();
            let mut config = ClientConfig::new();
            config.set("group.id", "g");
            b.apply(&mut config);
            if let Err(e) = config.create::<BaseConsumer>() {
                panic!("{mb} MiB, {p:?}: {e}");
            }
        }
    }
}
