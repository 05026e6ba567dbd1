//! Logging and metrics: the metric names and source, the summaries, the log level.

use std::time::Duration;

use crate::config::error::SettingError;
use crate::config::settings::raw::RawSettings;

/// Levels `ACKD_LOG_LEVEL` takes.
pub const LOG_LEVELS: &[&str] = &["error", "warn", "info", "debug", "trace"];

/// What log and metric lines are named, and how much is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggingSettings {
    /// `ACKD_LOG_LEVEL`: one of [`LOG_LEVELS`].
    pub log_level: String,
    /// `ACKD_LOG_MESSAGES`: one line per acknowledged message.
    pub log_messages: bool,
    /// `ACKD_METRIC_PREFIX`: in front of every metric name.
    pub metric_prefix: String,
    /// `ACKD_METRIC_SOURCE`: `source=` on metric lines; `None`: the topic, or `DYNO`/host
    /// for process lines.
    pub metric_source: Option<String>,
    /// `ACKD_METRICS_INTERVAL_MS`: the summary period; zero turns summaries (and
    /// librdkafka's statistics) off.
    pub metrics_interval: Duration,
}

impl LoggingSettings {
    /// `ACKD_METRIC_PREFIX`, `ACKD_LOG_LEVEL`, `ACKD_METRIC_SOURCE`,
    /// `ACKD_METRICS_INTERVAL_MS` and `ACKD_LOG_MESSAGES`.
    pub(super) fn parse(raw: &RawSettings) -> Result<LoggingSettings, SettingError> {
        let metric_prefix = raw.get("metric_prefix").to_string();
        let prefix_ok = !metric_prefix.is_empty()
            && metric_prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !prefix_ok {
            return Err(raw.error(
                "metric_prefix",
                "expected a non-empty name of A-Z a-z 0-9 . _ - (l2met metric names)",
            ));
        }

        let log_level = raw.get("log_level").to_ascii_lowercase();
        if !LOG_LEVELS.contains(&log_level.as_str()) {
            return Err(raw.error(
                "log_level",
                format!("expected one of: {}", LOG_LEVELS.join(", ")),
            ));
        }

        Ok(LoggingSettings {
            metric_prefix,
            log_level,
            metric_source: metric_source(raw)?,
            metrics_interval: raw.millis("metrics_interval_ms", 0, 3_600_000)?,
            log_messages: raw.boolean("log_messages")?,
        })
    }
}

/// `ACKD_METRIC_SOURCE`: `source=` on metric lines; empty: derived.
fn metric_source(raw: &RawSettings) -> Result<Option<String>, SettingError> {
    match raw.get("metric_source") {
        "" => Ok(None),
        s if s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) =>
        {
            Ok(Some(s.to_string()))
        }
        _ => Err(raw.error(
            "metric_source",
            "expected a name of A-Z a-z 0-9 . _ - (an l2met source)",
        )),
    }
}
