//! Settings: every setting, typed and validated (this file, `keys.rs`, `raw.rs`,
//! `validate/`), the error a setting gets ([`SettingError`]), the broker address
//! ([`kafka_url`]), librdkafka pass-through properties ([`rdkafka_env`]), TLS and SASL
//! ([`security`]), the secrets no line may show ([`secret`], `secrets.rs`), the failure
//! policy (`validate/failure.rs`), and the translation of all of it into librdkafka properties
//! (`client_config`). Knows nothing of tasks or processing.
//!
//! Every setting, typed and validated once at start.
//!
//! Layers, later wins: `config/default.toml` (compiled in), the TOML file named by
//! `ACKD_CONFIG_FILE`, then the environment (`raw`). Errors name the environment
//! variable, show the bad value (never a secret) and say what is allowed; the binary
//! turns them into exit code 78 (EX_CONFIG). The keys and their `--help` lines are in
//! `keys` (their defaults in `config/default.toml`), each concern's part of [`Settings`]
//! with its parse and checks a file of `validate`, the pass-through properties in
//! `properties`, and what no line may show in `secrets`.

pub(crate) mod client_config;
pub mod kafka_url;
pub mod rdkafka_env;
pub mod secret;
pub mod security;
pub mod test_delay;

mod keys;
mod properties;
mod raw;
mod secrets;
mod validate;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::settings::kafka_url::Brokers;
use security::{Sasl, Tls};

pub use crate::settings::rdkafka_env::is_secret_property;
pub use keys::{documented, help_line, rdkafka_defaults, DefaultValue, DEFAULT_TOML};
pub use properties::{
    PassThrough, CLASSIC_ONLY_PROPERTIES, MEMORY_BUDGET_PROPERTIES, OWNED_PROPERTIES,
};
pub use secrets::{is_secret_variable, never_shown_in_vars, variable_name, SECRET_VARIABLES};
pub use validate::exec::{ExecSettings, MAX_EXEC_LINE_BYTES};
pub use validate::failure::{FailureSettings, OnFailure, RetryPolicy};
pub use validate::group::{GroupProtocol, GroupSettings, StartFrom};
pub(crate) use validate::http_endpoint::shown_url;
pub use validate::http_endpoint::{ConcurrencyMode, HttpBody, HttpSettings, HttpUrl};
pub use validate::memory_budget::{MemorySetting, MAX_MEMORY_MB};
pub use validate::processing::{
    BatchSettings, ConcurrencySettings, ProcessingOrder, MAX_BATCH, MAX_BATCH_BYTES,
    MAX_CONCURRENCY, MAX_PENDING,
};
pub use validate::retry_topics::{NextTier, RetryTiers};
pub use validate::schemas::{Format, RegistryTls, RegistryUrl, SchemaKind, SchemaSettings};
pub use validate::telemetry::{HealthSettings, LoggingSettings, LOG_LEVELS};

use raw::RawSettings;

/// The smallest `ACKD_REDELIVERY_WINDOW_MAX`, and the least the dispatch limit runs
/// ahead of the work (src/consumer/worker/shared.rs).
pub const MIN_REDELIVERY_WINDOW: usize = 1_000;
/// The largest `ACKD_REDELIVERY_WINDOW_MAX`.
pub const MAX_REDELIVERY_WINDOW: usize = 100_000_000;

/// ackd's settings: what it connects to and consumes at the top, each other concern a
/// part of its own, parsed and checked in its file of `validate`. `Debug` shows no
/// secret.
#[derive(Debug, Clone)]
pub struct Settings {
    pub brokers: Brokers,
    /// Full topic names: `KAFKA_PREFIX` applied.
    pub topics: Vec<String>,
    /// The full group name: `KAFKA_PREFIX` applied.
    pub group_id: String,
    /// `KAFKA_PREFIX` (multi-tenant Heroku Kafka): in front of every topic and the group.
    pub kafka_prefix: Option<String>,
    /// TLS, for `kafka+ssl://` and `kafka+sasl-ssl://` brokers.
    pub tls: Option<Tls>,
    /// SASL, for `kafka+sasl-ssl://` brokers.
    pub sasl: Option<Sasl>,
    /// `ACKD_PROCESSOR`, lower-cased.
    pub processor: String,
    pub commit_interval: Duration,
    /// `ACKD_REDELIVERY_WINDOW_MAX`: how far (messages) a partition may start beyond its
    /// last accepted commit's dispatch limit window at most.
    pub redelivery_window_max: usize,
    pub shutdown_timeout: Duration,
    /// Stop (commit, leave, exit 0) once every assigned partition reached its end.
    pub stop_at_end: bool,
    /// Wait for topics of `topics` that do not exist yet (saying so periodically)
    /// instead of stopping with exit 78.
    pub wait_for_topics: bool,
    /// Where a partition starts, the group protocol, static membership.
    pub group: GroupSettings,
    /// librdkafka properties from `[rdkafka]` and `ACKD_RDKAFKA_*`, validated by
    /// librdkafka itself when the consumer is created.
    pub rdkafka: BTreeMap<String, PassThrough>,
    /// The log level, per-message lines, metric names and summaries.
    pub logging: LoggingSettings,
    /// Retries, then what happens to a message that still fails.
    pub failure: FailureSettings,
    /// Messages per processor call.
    pub batching: BatchSettings,
    /// The order of a partition's messages, and how many run at once.
    pub concurrency: ConcurrencySettings,
    /// The `exec` processor's; `None` without `ACKD_EXEC_COMMAND`.
    pub exec: Option<ExecSettings>,
    /// The `http` processor's; `None` without `ACKD_HTTP_URL`.
    pub http: Option<HttpSettings>,
    /// The health endpoint.
    pub health: HealthSettings,
    /// `ACKD_MEMORY_MB`: the memory budget of the process, divided among the
    /// partitions of the topics (src/consumer/memory.rs).
    pub memory: MemorySetting,
    /// Schema Registry decoding of keys and values; `None` when both are raw.
    pub schemas: Option<SchemaSettings>,
    /// Per-message delay of the testkit's `slow` processor (fixed, or a random range).
    #[cfg(feature = "testkit")]
    pub test_delay: crate::settings::test_delay::Delay,
}

/// `name` with `prefix` in front, unless it already starts with it (so a name given
/// in full is not prefixed twice).
pub fn with_prefix(prefix: Option<&str>, name: &str) -> String {
    match prefix {
        Some(p) if !name.starts_with(p) => format!("{p}{name}"),
        _ => name.to_string(),
    }
}

impl Settings {
    /// The topics ackd subscribes to: `ACKD_TOPICS`, then their retry tiers
    /// (`ACKD_RETRY_TOPICS`), all in its group.
    pub fn consumed_topics(&self) -> Vec<String> {
        let tiers = self.failure.retry_tiers.topics();
        self.topics.iter().chain(tiers).cloned().collect()
    }

    /// How long in-flight messages may take to finish after SIGTERM: the shutdown deadline
    /// less [`commit_reserve`]. Processor timeouts and the dead-letter delivery fit in it.
    pub fn drain_budget(&self) -> Duration {
        self.shutdown_timeout - commit_reserve(self.shutdown_timeout)
    }

    /// How long a processor call may run before `/live` reports its partition stuck:
    /// `ACKD_HEALTH_STUCK_MS`, else the processor's own timeout (exec, http) plus 5 s (it
    /// should have ended the call by then), else the drain budget (a call longer than
    /// that could not finish in a graceful stop either).
    pub fn health_stuck_after(&self) -> Duration {
        if let Some(d) = self.health.stuck {
            return d;
        }
        let processor_timeout = match self.processor.as_str() {
            "exec" => self.exec.as_ref().map(|e| e.timeout),
            "http" => self.http.as_ref().map(|h| h.timeout),
            _ => None,
        };
        match processor_timeout {
            Some(timeout) => timeout + Duration::from_secs(5),
            None => self.drain_budget(),
        }
    }

    /// The full broker-side name of a topic or group: `KAFKA_PREFIX` applied once.
    /// Every topic and group name ackd uses goes through this.
    pub fn prefixed(&self, name: &str) -> String {
        with_prefix(self.kafka_prefix.as_deref(), name)
    }

    /// Every value no line may show, for [`crate::settings::secret::register`]: credentials, the
    /// private key, and the PEMs (public, but never printed).
    pub fn never_shown(&self) -> Vec<String> {
        let mut values: Vec<String> = Vec::new();
        if let Some(sasl) = &self.sasl {
            values.push(sasl.password.expose().to_string());
            values.push(sasl.username.expose().to_string());
        }
        if let Some(tls) = &self.tls {
            values.extend(security::pems(tls).into_iter().map(str::to_string));
        }
        values.extend(
            self.rdkafka
                .iter()
                .filter(|(k, _)| is_secret_property(k))
                .map(|(_, v)| v.value.clone()),
        );
        if let Some(http) = &self.http {
            values.extend(http.headers.iter().map(|(_, v)| v.expose().to_string()));
            values.extend(http.url.0.password().map(str::to_string));
        }
        if let Some(schemas) = &self.schemas {
            values.extend(schemas.never_shown());
        }
        values
    }

    /// Loads settings from the process environment.
    pub fn from_env() -> Result<Settings, SettingError> {
        Self::from_vars(std::env::vars())
    }

    /// Loads settings from the given variables (the environment, or a test's map).
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, SettingError> {
        let vars: HashMap<String, String> = vars.into_iter().collect();
        validate::validate(&RawSettings::layer(&vars)?)
    }

    /// The pass-through properties as `k=v,…`, secrets redacted, for the start line.
    pub fn rdkafka_shown(&self) -> String {
        self.rdkafka
            .iter()
            .map(|(k, v)| format!("{k}={}", v.shown(k)))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// What a graceful stop keeps of its deadline for the final commit and leaving the group:
/// a fifth, at most 5 s. In-flight messages get the rest ([`Settings::drain_budget`]).
pub fn commit_reserve(budget: Duration) -> Duration {
    (budget / 5).min(Duration::from_secs(5))
}

// The error every setting's validation returns, and the one line it gets.

/// A setting that is missing or invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingError {
    /// The environment variable (or file key) to fix.
    pub setting: String,
    /// The value given, when it may be shown; `None` when missing or secret.
    pub value: Option<String>,
    /// What is wrong and what is allowed.
    pub problem: String,
}

impl SettingError {
    pub(crate) fn new(
        setting: impl Into<String>,
        value: Option<&str>,
        problem: impl Into<String>,
    ) -> Self {
        SettingError {
            setting: setting.into(),
            value: value.map(str::to_string),
            problem: problem.into(),
        }
    }
}

impl std::fmt::Display for SettingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}={:?}: {}", self.setting, v, self.problem),
            None => write!(f, "{}: {}", self.setting, self.problem),
        }
    }
}

impl std::error::Error for SettingError {}

/// The one line a configuration error gets.
pub(crate) fn report_setting_error(e: &SettingError) {
    tracing::error!(
        at = "config_error",
        setting = &e.setting,
        value = e.value.as_deref(),
        problem = &e.problem,
        "invalid configuration; fix the setting and start again"
    );
}

/// The variables unit tests of the settings start from: a valid minimal set.
#[cfg(test)]
mod test_vars {
    use super::{SettingError, Settings};

    pub(super) fn vars(extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = [
            ("KAFKA_URL", "kafka://127.0.0.1:9092"),
            ("ACKD_TOPICS", "orders, payments"),
            ("ACKD_GROUP_ID", "billing"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        for (k, val) in extra {
            v.retain(|(name, _)| name != k);
            v.push((k.to_string(), val.to_string()));
        }
        v
    }

    pub(super) fn err(extra: &[(&str, &str)]) -> SettingError {
        Settings::from_vars(vars(extra)).expect_err("accepted")
    }
}
