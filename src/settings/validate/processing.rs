//! Processing: batches, the order of a partition's messages, how many run at once, and
//! how long after its timestamp a message may start.

use std::time::Duration;

use crate::settings::keys::{default_config, env_name};
use crate::settings::raw::RawSettings;
use crate::settings::SettingError;

/// The largest `ACKD_BATCH_MAX_MESSAGES`: a batch is held in memory whole.
pub const MAX_BATCH: usize = 10_000;
/// The largest `ACKD_BATCH_MAX_BYTES`: 1 GiB.
pub const MAX_BATCH_BYTES: usize = 1 << 30;
/// The largest `ACKD_CONCURRENCY`.
pub const MAX_CONCURRENCY: usize = 10_000;
/// The largest `ACKD_MAX_PENDING`.
pub const MAX_PENDING: usize = 1_000_000;
/// The largest `ACKD_DELAY_MS`: 7 days, Kafka's default retention (a longer delay would
/// wait for messages the broker has deleted).
pub const MAX_DELAY_MS: u64 = 7 * 24 * 3_600_000;

/// How many messages one processor call gets (`ACKD_BATCH_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSettings {
    /// `ACKD_BATCH_MAX_MESSAGES`: messages per processor call at most; 1 (the default):
    /// one message per call (`Processor::process`), above 1: batches
    /// (`Processor::process_batch`).
    pub max_messages: usize,
    /// `ACKD_BATCH_MAX_WAIT_MS`: how long a batch waits for more messages once its first
    /// one is in hand; a backlog fills batches without waiting.
    pub max_wait: Duration,
    /// `ACKD_BATCH_MAX_BYTES`: key and value bytes per batch at most; 0: no limit but
    /// `max_messages`. A message bigger than this is a batch of its own.
    pub max_bytes: usize,
}

/// In what order a partition's messages are processed, how many at once, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConcurrencySettings {
    /// `ACKD_ORDERING`.
    pub ordering: ProcessingOrder,
    /// `ACKD_CONCURRENCY`: processor calls in flight per partition at most (with `key` or
    /// `none` ordering; `partition` ordering is one at a time).
    pub max_in_flight: usize,
    /// `ACKD_MAX_PENDING`: messages a partition reads above its committable offset at
    /// most: in calls, waiting for their key's turn, or finished above an unfinished one
    /// (`key` or `none` ordering); at the cap it stops reading.
    pub max_pending: usize,
    /// `ACKD_DELAY_MS`: a message starts no earlier than its timestamp plus this; zero:
    /// off.
    pub delay: Duration,
}

/// In what order one partition's messages are processed (`ACKD_ORDERING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessingOrder {
    /// One message (or batch) of a partition at a time, in offset order.
    Partition,
    /// Messages with the same key in offset order, one at a time; different keys (and
    /// null keys) concurrently, up to `ACKD_CONCURRENCY` per partition.
    Key,
    /// Any order, up to `ACKD_CONCURRENCY` per partition.
    None,
}

impl ProcessingOrder {
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessingOrder::Partition => "partition",
            ProcessingOrder::Key => "key",
            ProcessingOrder::None => "none",
        }
    }
}

/// The batch limits, `ACKD_ORDERING`, `ACKD_CONCURRENCY`, `ACKD_MAX_PENDING` and
/// `ACKD_DELAY_MS`, each checked alone (ordering and concurrency together later).
pub(super) fn parse(
    raw: &RawSettings,
) -> Result<(BatchSettings, ConcurrencySettings), SettingError> {
    let max_messages = raw.whole(
        "batch_max_messages",
        1..=MAX_BATCH,
        format!("expected a whole number from 1 (no batches) to {MAX_BATCH}"),
    )?;
    let max_wait = raw.millis("batch_max_wait_ms", 0, 60_000)?;
    let concurrency = ConcurrencySettings {
        ordering: ordering(raw)?,
        max_in_flight: raw.whole(
            "concurrency",
            1..=MAX_CONCURRENCY,
            format!("expected a whole number from 1 to {MAX_CONCURRENCY}"),
        )?,
        max_pending: raw.whole(
            "max_pending",
            1..=MAX_PENDING,
            format!("expected a whole number from 1 to {MAX_PENDING}"),
        )?,
        delay: delay(raw)?,
    };
    let batching = BatchSettings {
        max_messages,
        max_wait,
        max_bytes: raw.whole(
            "batch_max_bytes",
            0..=MAX_BATCH_BYTES,
            format!("expected a whole number of bytes from 0 (no limit) to {MAX_BATCH_BYTES}"),
        )?,
    };
    Ok((batching, concurrency))
}

/// `ACKD_ORDERING`.
fn ordering(raw: &RawSettings) -> Result<ProcessingOrder, SettingError> {
    match raw.get("ordering").to_ascii_lowercase().as_str() {
        "partition" => Ok(ProcessingOrder::Partition),
        "key" => Ok(ProcessingOrder::Key),
        "none" => Ok(ProcessingOrder::None),
        _ => Err(raw.error(
            "ordering",
            "expected partition (one message of a partition at a time, the default), key (each key in order, keys concurrently) or none",
        )),
    }
}

/// `ACKD_DELAY_MS`.
fn delay(raw: &RawSettings) -> Result<Duration, SettingError> {
    match raw.get("delay_ms").parse::<u64>() {
        Ok(ms) if ms <= MAX_DELAY_MS => Ok(Duration::from_millis(ms)),
        _ => Err(raw.error(
            "delay_ms",
            format!(
                "expected a whole number of milliseconds from 0 (off) to {MAX_DELAY_MS} (7 days)"
            ),
        )),
    }
}

/// Ordering and concurrency together: partition ordering is one call at a time, so a
/// concurrency set by hand would silently do nothing (a value equal to the default is
/// not "by hand"); and a partition must be able to hold as many messages as run at once.
pub(super) fn ordering_fits_concurrency(c: &ConcurrencySettings) -> Result<(), SettingError> {
    let default_concurrency = default_config().and_then(|c| c.get_int("concurrency").ok());
    let by_partition = c.ordering == ProcessingOrder::Partition;
    if by_partition && default_concurrency != Some(c.max_in_flight as i64) {
        return Err(SettingError::new(
            env_name("concurrency"),
            Some(&c.max_in_flight.to_string()),
            "needs ACKD_ORDERING=key or none: with ACKD_ORDERING=partition (the default) a partition processes one message at a time".to_string(),
        ));
    }
    if !by_partition && c.max_pending < c.max_in_flight {
        return Err(SettingError::new(
            env_name("max_pending"),
            Some(&c.max_pending.to_string()),
            format!(
                "is below ACKD_CONCURRENCY={}: a partition could never have that many messages in flight",
                c.max_in_flight
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::test_vars::{err, vars};
    use crate::settings::Settings;

    #[test]
    fn batch_settings_are_checked() {
        let s = Settings::from_vars(vars(&[
            ("ACKD_BATCH_MAX_MESSAGES", "500"),
            ("ACKD_BATCH_MAX_WAIT_MS", "0"),
        ]))
        .unwrap();
        assert_eq!(
            (s.batching.max_messages, s.batching.max_wait),
            (500, Duration::ZERO)
        );
        for bad in ["0", "-1", "10001", "many", ""] {
            let e = err(&[("ACKD_BATCH_MAX_MESSAGES", bad)]);
            assert_eq!(e.setting, "ACKD_BATCH_MAX_MESSAGES", "{bad:?}");
            assert!(e.problem.contains("1 (no batches) to 10000"), "{e}");
        }
        let e = err(&[("ACKD_BATCH_MAX_WAIT_MS", "60001")]);
        assert_eq!(e.setting, "ACKD_BATCH_MAX_WAIT_MS");
        let s = Settings::from_vars(vars(&[("ACKD_BATCH_MAX_BYTES", "1048576")])).unwrap();
        assert_eq!(s.batching.max_bytes, 1 << 20);
        for bad in ["-1", "1073741825", "1MB", ""] {
            let e = err(&[("ACKD_BATCH_MAX_BYTES", bad)]);
            assert_eq!(e.setting, "ACKD_BATCH_MAX_BYTES", "{bad:?}");
            assert!(e.problem.contains("0 (no limit) to 1073741824"), "{e}");
        }
        // A raw http body is one value: it cannot carry a batch.
        let raw_batch = [
            ("ACKD_PROCESSOR", "http"),
            ("ACKD_HTTP_URL", "http://127.0.0.1:1/"),
            ("ACKD_HTTP_BODY", "raw"),
            ("ACKD_BATCH_MAX_MESSAGES", "10"),
        ];
        let e = err(&raw_batch);
        assert_eq!(e.setting, "ACKD_HTTP_BODY");
        assert_eq!(e.value.as_deref(), Some("raw"));
        assert!(e.problem.contains("ACKD_BATCH_MAX_MESSAGES=10"), "{e}");
        // Only the http processor's body counts; without a URL the processor names that.
        assert!(Settings::from_vars(vars(&[
            ("ACKD_PROCESSOR", "log"),
            raw_batch[1],
            raw_batch[2],
            raw_batch[3]
        ]))
        .is_ok());
        assert!(Settings::from_vars(vars(&[raw_batch[0], raw_batch[2], raw_batch[3]])).is_ok());
    }

    #[test]
    fn ordering_and_concurrency_are_validated_together() {
        let s = Settings::from_vars(vars(&[])).unwrap();
        let c = s.concurrency;
        assert_eq!(
            (c.ordering, c.max_in_flight, c.max_pending),
            (ProcessingOrder::Partition, 16, 1000)
        );
        let s = Settings::from_vars(vars(&[
            ("ACKD_ORDERING", "KEY"),
            ("ACKD_CONCURRENCY", "100"),
            ("ACKD_MAX_PENDING", "100"),
        ]))
        .unwrap();
        let c = s.concurrency;
        assert_eq!(
            (c.ordering, c.max_in_flight, c.max_pending),
            (ProcessingOrder::Key, 100, 100)
        );
        assert_eq!(err(&[("ACKD_ORDERING", "random")]).setting, "ACKD_ORDERING");
        for bad in ["0", "10001", "many"] {
            let e = err(&[("ACKD_ORDERING", "none"), ("ACKD_CONCURRENCY", bad)]);
            assert_eq!(e.setting, "ACKD_CONCURRENCY", "{bad}");
        }
        // Partition ordering is one call at a time: a concurrency by hand would do nothing.
        let e = err(&[("ACKD_CONCURRENCY", "50")]);
        assert_eq!(e.setting, "ACKD_CONCURRENCY");
        assert!(e.problem.contains("ACKD_ORDERING=key or none"), "{e}");
        // The cap on held messages must leave room for the calls.
        let e = err(&[
            ("ACKD_ORDERING", "key"),
            ("ACKD_CONCURRENCY", "50"),
            ("ACKD_MAX_PENDING", "10"),
        ]);
        assert_eq!(e.setting, "ACKD_MAX_PENDING");
        assert!(e.problem.contains("ACKD_CONCURRENCY=50"), "{e}");
    }

    #[test]
    fn delay_is_checked() {
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert_eq!(s.concurrency.delay, Duration::ZERO);
        let s = Settings::from_vars(vars(&[("ACKD_DELAY_MS", "1500")])).unwrap();
        assert_eq!(s.concurrency.delay, Duration::from_millis(1500));
        let s = Settings::from_vars(vars(&[("ACKD_DELAY_MS", "604800000")])).unwrap();
        assert_eq!(s.concurrency.delay, Duration::from_secs(7 * 24 * 3600));
        for bad in ["-1", "604800001", "1s", "", "1.5"] {
            let e = err(&[("ACKD_DELAY_MS", bad)]);
            assert_eq!(e.setting, "ACKD_DELAY_MS", "{bad:?}");
            assert!(e.problem.contains("0 (off) to 604800000 (7 days)"), "{e}");
        }
    }
}
