//! The keys of the layered configuration: the compiled-in defaults, which keys exist,
//! which are required, and what `--help` says of each.

use std::collections::BTreeMap;

use config::{Config, File, FileFormat};

use crate::config::kafka_url;
use crate::config::rdkafka_env;
use crate::config::security;

/// The defaults, compiled in so the binary behaves the same from any directory.
pub const DEFAULT_TOML: &str = include_str!("../../../config/default.toml");

/// Where an `[rdkafka]` property of ackd's compiled-in defaults comes from.
pub(super) const DEFAULT_ORIGIN: &str = "config/default.toml";

/// Keys of the layered configuration (the env name is `ACKD_` + upper case), except
/// `kafka_url`, which comes from `KAFKA_URL`.
pub(super) const KEYS: &[&str] = &[
    "kafka_url",
    "topics",
    "group_id",
    "processor",
    "commit_interval_ms",
    "shutdown_timeout_ms",
    "start_from",
    "metric_prefix",
    "metric_source",
    "metrics_interval_ms",
    "log_messages",
    "log_level",
    "stop_at_end",
    "retry_initial_ms",
    "retry_max_ms",
    "retry_max_attempts",
    "on_failure",
    "dead_letter_topic",
    "static_membership",
    "group_protocol",
    "config_file",
    "sasl_mechanism",
    "sasl_username",
    "sasl_password",
    "ordering",
    "concurrency",
    "max_pending",
    "batch_max_messages",
    "batch_max_wait_ms",
    "batch_max_bytes",
    "exec_command",
    "exec_concurrency",
    "exec_timeout_ms",
    "exec_max_line_bytes",
    "exec_pass_secrets",
    "http_url",
    "http_body",
    "http_headers",
    "http_concurrency",
    "http_timeout_ms",
    "wait_for_topics",
    "health_port",
    "health_addr",
    "health_stuck_ms",
    "memory_mb",
    #[cfg(feature = "testkit")]
    "test_delay_ms",
];

/// The platform's variables read as they are (not layered: they come from the
/// environment only, e.g. Heroku's Kafka add-on).
pub(super) const KAFKA_VARS: &[&str] = &[
    security::TRUSTED_CERT,
    security::CLIENT_CERT,
    security::CLIENT_KEY,
    "KAFKA_PREFIX",
];

/// The environment variable for a configuration key.
pub(super) fn env_name(key: &str) -> String {
    if key == "kafka_url" {
        "KAFKA_URL".into()
    } else {
        format!("ACKD_{}", key.to_ascii_uppercase())
    }
}

/// The settings without a default, and what to give: `is required: <what>`.
pub(super) const REQUIRED: &[(&str, &str)] = &[
    ("kafka_url", kafka_url::ALLOWED),
    ("topics", "comma-separated topic names"),
    (
        "group_id",
        "the consumer group that this app's consumers share",
    ),
];

/// A setting's default, for `ackd --help`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DefaultValue {
    /// No default: ackd does not start without it.
    Required,
    /// Unset (or empty) unless given.
    None,
    Value(String),
}

/// Every setting a user can give (environment variable names), in the order `--help`
/// lists them, with its default as `config/default.toml` has it: the same source the
/// settings are layered on, so the list cannot drift from what ackd does. The
/// testkit's settings are left out; `ACKD_RDKAFKA_<NAME>` stands for the pass-through.
pub fn documented() -> Vec<(String, DefaultValue)> {
    let defaults = Config::builder()
        .add_source(File::from_str(DEFAULT_TOML, FileFormat::Toml))
        .build()
        .ok();
    let default_of = |key: &str| -> DefaultValue {
        if REQUIRED.iter().any(|(k, _)| *k == key) {
            return DefaultValue::Required;
        }
        match defaults.as_ref().and_then(|c| c.get_string(key).ok()) {
            Some(v) if !v.trim().is_empty() => DefaultValue::Value(v),
            _ => DefaultValue::None,
        }
    };
    let mut names: Vec<(String, DefaultValue)> = Vec::new();
    for key in KEYS.iter().copied().filter(|k| *k != "test_delay_ms") {
        names.push((env_name(key), default_of(key)));
        // The platform's variables right after the required ones, as in the README.
        if key == "group_id" {
            names.extend(
                KAFKA_VARS
                    .iter()
                    .map(|v| (v.to_string(), DefaultValue::None)),
            );
        }
    }
    names.push((format!("{}<NAME>", rdkafka_env::PREFIX), DefaultValue::None));
    names
}

/// The librdkafka properties `config/default.toml` sets, with their values.
pub fn rdkafka_defaults() -> Vec<(String, String)> {
    Config::builder()
        .add_source(File::from_str(DEFAULT_TOML, FileFormat::Toml))
        .build()
        .ok()
        .and_then(|c| c.get_table("rdkafka").ok())
        .map(|t| {
            t.into_iter()
                .filter_map(|(k, v)| v.into_string().ok().map(|v| (k, v)))
                .collect::<BTreeMap<_, _>>()
                .into_iter()
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::settings::test_vars::vars;
    use crate::config::settings::Settings;

    #[test]
    fn documented_defaults_are_the_defaults_in_force() {
        let documented = documented();
        let default = |name: &str| {
            documented
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, d)| d.clone())
                .unwrap_or_else(|| panic!("{name} not documented"))
        };
        assert_eq!(default("KAFKA_URL"), DefaultValue::Required);
        assert_eq!(default("KAFKA_PREFIX"), DefaultValue::None);
        assert_eq!(default("ACKD_METRIC_SOURCE"), DefaultValue::None);
        assert_eq!(
            default("ACKD_WAIT_FOR_TOPICS"),
            DefaultValue::Value("false".into())
        );
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert_eq!(
            default("ACKD_COMMIT_INTERVAL_MS"),
            DefaultValue::Value(s.commit_interval.as_millis().to_string())
        );
        assert!(!s.wait_for_topics);
        assert!(!documented.iter().any(|(n, _)| n == "ACKD_TEST_DELAY_MS"));
        assert!(rdkafka_defaults()
            .iter()
            .all(|(k, v)| s.rdkafka[k].value == *v));
    }
}
