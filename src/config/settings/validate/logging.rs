//! Logging and metrics: the metric names, the source, the log level.

use crate::config::error::SettingError;
use crate::config::settings::raw::RawSettings;
use crate::config::settings::LOG_LEVELS;

/// What log and metric lines are named and how much is logged, validated.
pub(super) struct Logging {
    pub(super) metric_prefix: String,
    pub(super) log_level: String,
    pub(super) metric_source: Option<String>,
}

impl RawSettings {
    /// `ACKD_METRIC_PREFIX`, `ACKD_LOG_LEVEL` and `ACKD_METRIC_SOURCE`.
    pub(super) fn logging(&self) -> Result<Logging, SettingError> {
        let metric_prefix = self.get("metric_prefix").to_string();
        let prefix_ok = !metric_prefix.is_empty()
            && metric_prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !prefix_ok {
            return Err(self.error(
                "metric_prefix",
                "expected a non-empty name of A-Z a-z 0-9 . _ - (l2met metric names)",
            ));
        }

        let log_level = self.get("log_level").to_ascii_lowercase();
        if !LOG_LEVELS.contains(&log_level.as_str()) {
            return Err(self.error(
                "log_level",
                format!("expected one of: {}", LOG_LEVELS.join(", ")),
            ));
        }

        Ok(Logging {
            metric_prefix,
            log_level,
            metric_source: self.metric_source()?,
        })
    }

    /// `ACKD_METRIC_SOURCE`: `source=` on metric lines; empty: derived.
    fn metric_source(&self) -> Result<Option<String>, SettingError> {
        match self.get("metric_source") {
            "" => Ok(None),
            s if s
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) =>
            {
                Ok(Some(s.to_string()))
            }
            _ => Err(self.error(
                "metric_source",
                "expected a name of A-Z a-z 0-9 . _ - (an l2met source)",
            )),
        }
    }
}
