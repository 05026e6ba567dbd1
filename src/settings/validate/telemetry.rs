//! What ackd tells its operator: log and metric lines (their level, names, source and
//! summaries) and the health endpoint (where it listens, when a call counts as stuck).

use std::net::SocketAddr;
use std::time::Duration;

use crate::settings::raw::RawSettings;
use crate::settings::SettingError;

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

/// The health endpoint (`/live`, `/ready`, `/metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthSettings {
    /// Where it listens (`ACKD_HEALTH_ADDR`:`ACKD_HEALTH_PORT`); `None`: off (the port
    /// unset or 0).
    pub listen: Option<SocketAddr>,
    /// `ACKD_HEALTH_STUCK_MS`; `None` (0): derived, see
    /// [`crate::settings::Settings::health_stuck_after`].
    pub stuck: Option<Duration>,
}

impl HealthSettings {
    /// `ACKD_HEALTH_PORT` (0 or unset: off), `ACKD_HEALTH_ADDR` and `ACKD_HEALTH_STUCK_MS`.
    pub(super) fn parse(raw: &RawSettings) -> Result<HealthSettings, SettingError> {
        let port = match raw.get("health_port").trim() {
            "" => 0,
            p => p.parse::<u16>().map_err(|_| {
                raw.error(
                    "health_port",
                    "expected a port number from 1 to 65535, or 0 (off)",
                )
            })?,
        };
        let addr: std::net::IpAddr = raw.get("health_addr").trim().parse().map_err(|_| {
            raw.error(
                "health_addr",
                "expected an IP address to listen on, e.g. 0.0.0.0 (every IPv4 interface), :: or 127.0.0.1",
            )
        })?;
        let stuck = raw.millis("health_stuck_ms", 0, 86_400_000)?;
        Ok(HealthSettings {
            listen: (port != 0).then_some(SocketAddr::new(addr, port)),
            stuck: Some(stuck).filter(|d| !d.is_zero()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::test_vars::{err, vars};
    use crate::settings::Settings;

    /// The health endpoint: off by default and with 0, on with a port; its address and
    /// stuck bound validated and derived.
    #[test]
    fn health_settings() {
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert_eq!(s.health.listen, None);
        assert_eq!(s.health_stuck_after(), s.drain_budget());
        let s = Settings::from_vars(vars(&[("ACKD_HEALTH_PORT", "0")])).unwrap();
        assert_eq!(s.health.listen, None);
        let s = Settings::from_vars(vars(&[("ACKD_HEALTH_PORT", "8080")])).unwrap();
        assert_eq!(s.health.listen, Some("0.0.0.0:8080".parse().unwrap()));
        let s = Settings::from_vars(vars(&[
            ("ACKD_HEALTH_PORT", "9000"),
            ("ACKD_HEALTH_ADDR", "::1"),
            ("ACKD_HEALTH_STUCK_MS", "2500"),
        ]))
        .unwrap();
        assert_eq!(s.health.listen, Some("[::1]:9000".parse().unwrap()));
        assert_eq!(s.health_stuck_after(), Duration::from_millis(2500));
        let s = Settings::from_vars(vars(&[
            ("ACKD_PROCESSOR", "exec"),
            ("ACKD_EXEC_COMMAND", "cat"),
            ("ACKD_EXEC_TIMEOUT_MS", "3000"),
        ]))
        .unwrap();
        assert_eq!(s.health_stuck_after(), Duration::from_millis(8000));
        for (key, value) in [
            ("ACKD_HEALTH_PORT", "70000"),
            ("ACKD_HEALTH_PORT", "http"),
            ("ACKD_HEALTH_PORT", "-1"),
            ("ACKD_HEALTH_ADDR", "localhost"),
            ("ACKD_HEALTH_STUCK_MS", "soon"),
        ] {
            let e = err(&[("ACKD_HEALTH_PORT", "8080"), (key, value)]);
            assert_eq!(e.setting, key, "{e}");
            assert_eq!(e.value.as_deref(), Some(value), "{e}");
        }
    }
}
