//! Processing: batches, the order of a partition's messages, and how many run at once.

use std::time::Duration;

use crate::config::error::SettingError;
use crate::config::settings::keys::{default_config, env_name};
use crate::config::settings::raw::RawSettings;
use crate::config::settings::{
    ProcessingOrder, Settings, MAX_BATCH, MAX_BATCH_BYTES, MAX_CONCURRENCY, MAX_PENDING,
};

/// How messages reach the processor, validated.
pub(super) struct Processing {
    pub(super) batch_max_messages: usize,
    pub(super) batch_max_wait: Duration,
    pub(super) ordering: ProcessingOrder,
    pub(super) concurrency: usize,
    pub(super) max_pending: usize,
    pub(super) batch_max_bytes: usize,
}

impl RawSettings {
    /// The batch limits, `ACKD_ORDERING`, `ACKD_CONCURRENCY` and `ACKD_MAX_PENDING`, each
    /// alone ([`ordering_fits_concurrency`] checks them together).
    pub(super) fn processing(&self) -> Result<Processing, SettingError> {
        Ok(Processing {
            batch_max_messages: self.whole(
                "batch_max_messages",
                1..=MAX_BATCH,
                format!("expected a whole number from 1 (no batches) to {MAX_BATCH}"),
            )?,
            batch_max_wait: self.millis("batch_max_wait_ms", 0, 60_000)?,
            ordering: self.ordering()?,
            concurrency: self.whole(
                "concurrency",
                1..=MAX_CONCURRENCY,
                format!("expected a whole number from 1 to {MAX_CONCURRENCY}"),
            )?,
            max_pending: self.whole(
                "max_pending",
                1..=MAX_PENDING,
                format!("expected a whole number from 1 to {MAX_PENDING}"),
            )?,
            batch_max_bytes: self.whole(
                "batch_max_bytes",
                0..=MAX_BATCH_BYTES,
                format!("expected a whole number of bytes from 0 (no limit) to {MAX_BATCH_BYTES}"),
            )?,
        })
    }

    /// `ACKD_ORDERING`.
    fn ordering(&self) -> Result<ProcessingOrder, SettingError> {
        match self.get("ordering").to_ascii_lowercase().as_str() {
            "partition" => Ok(ProcessingOrder::Partition),
            "key" => Ok(ProcessingOrder::Key),
            "none" => Ok(ProcessingOrder::None),
            _ => Err(self.error(
                "ordering",
                "expected partition (one message of a partition at a time, the default), key (each key in order, keys concurrently) or none",
            )),
        }
    }
}

/// Ordering and concurrency together: partition ordering is one call at a time, so a
/// concurrency set by hand would silently do nothing (a value equal to the default is
/// not "by hand"); and a partition must be able to hold as many messages as run at once.
pub(super) fn ordering_fits_concurrency(settings: &Settings) -> Result<(), SettingError> {
    let default_concurrency = default_config().and_then(|c| c.get_int("concurrency").ok());
    let by_partition = settings.ordering == ProcessingOrder::Partition;
    if by_partition && default_concurrency != Some(settings.concurrency as i64) {
        return Err(SettingError::new(
            env_name("concurrency"),
            Some(&settings.concurrency.to_string()),
            "needs ACKD_ORDERING=key or none: with ACKD_ORDERING=partition (the default) a partition processes one message at a time".to_string(),
        ));
    }
    if !by_partition && settings.max_pending < settings.concurrency {
        return Err(SettingError::new(
            env_name("max_pending"),
            Some(&settings.max_pending.to_string()),
            format!(
                "is below ACKD_CONCURRENCY={}: a partition could never have that many messages in flight",
                settings.concurrency
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::settings::test_vars::{err, vars};
    use crate::config::settings::Settings;

    #[test]
    fn batch_settings_are_checked() {
        let s = Settings::from_vars(vars(&[
            ("ACKD_BATCH_MAX_MESSAGES", "500"),
            ("ACKD_BATCH_MAX_WAIT_MS", "0"),
        ]))
        .unwrap();
        assert_eq!(
            (s.batch_max_messages, s.batch_max_wait),
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
        assert_eq!(s.batch_max_bytes, 1 << 20);
        for bad in ["-1", "1073741825", "1MB", ""] {
            let e = err(&[("ACKD_BATCH_MAX_BYTES", bad)]);
            assert_eq!(e.setting, "ACKD_BATCH_MAX_BYTES", "{bad:?}");
            assert!(e.problem.contains("0 (no limit) to 1073741824"), "{e}");
        }
        // A raw http body is one value: it cannot carry a batch.
        let s = Settings::from_vars(vars(&[
            ("ACKD_HTTP_URL", "http://127.0.0.1:1/"),
            ("ACKD_HTTP_BODY", "raw"),
            ("ACKD_BATCH_MAX_MESSAGES", "10"),
        ]))
        .unwrap();
        let e = crate::processors::http::HttpConfig::from_settings(&s).unwrap_err();
        assert_eq!(e.setting, "ACKD_HTTP_BODY");
        assert!(e.problem.contains("ACKD_BATCH_MAX_MESSAGES=10"), "{e}");
    }

    #[test]
    fn ordering_and_concurrency_are_validated_together() {
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert_eq!(
            (s.ordering, s.concurrency, s.max_pending),
            (ProcessingOrder::Partition, 16, 1000)
        );
        let s = Settings::from_vars(vars(&[
            ("ACKD_ORDERING", "KEY"),
            ("ACKD_CONCURRENCY", "100"),
            ("ACKD_MAX_PENDING", "100"),
        ]))
        .unwrap();
        assert_eq!(
            (s.ordering, s.concurrency, s.max_pending),
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
}
