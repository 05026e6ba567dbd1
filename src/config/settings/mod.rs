//! Every setting, typed and validated once at start.
//!
//! Layers, later wins: `config/default.toml` (compiled in), the TOML file named by
//! `ACKD_CONFIG_FILE`, then the environment (`raw`). Errors name the environment
//! variable, show the bad value (never a secret) and say what is allowed; the binary
//! turns them into exit code 78 (EX_CONFIG). The keys and their defaults are in `keys`,
//! the checks one concern a file in `validate`, the pass-through properties in
//! `properties`, and what no line may show in `secrets`.

mod keys;
mod properties;
mod raw;
mod secrets;
#[cfg(test)]
mod test_vars;
mod validate;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::config::error::SettingError;
use crate::config::failure::{OnFailure, RetryPolicy};
use crate::config::http_settings::{HttpBody, HttpUrl};
use crate::config::kafka_url::Brokers;
use crate::config::secret::Secret;
use crate::config::security::{self, Sasl, Tls};

pub use crate::config::rdkafka_env::is_secret_property;
pub use keys::{documented, help_line, rdkafka_defaults, DefaultValue, DEFAULT_TOML};
pub use properties::{
    PassThrough, CLASSIC_ONLY_PROPERTIES, MEMORY_BUDGET_PROPERTIES, OWNED_PROPERTIES,
};
pub use secrets::{is_secret_variable, never_shown_in_vars, variable_name, SECRET_VARIABLES};

use raw::RawSettings;

/// The largest `ACKD_BATCH_MAX_MESSAGES`: a batch is held in memory whole.
pub const MAX_BATCH: usize = 10_000;
/// The largest `ACKD_BATCH_MAX_BYTES`: 1 GiB.
pub const MAX_BATCH_BYTES: usize = 1 << 30;
/// The largest `ACKD_EXEC_MAX_LINE_BYTES`: 16 MiB (three lines of each child may be held).
pub const MAX_EXEC_LINE_BYTES: usize = 16 << 20;

/// The largest `ACKD_MEMORY_MB`: 1 TiB.
pub const MAX_MEMORY_MB: usize = 1 << 20;

/// `ACKD_MEMORY_MB`: where the memory budget comes from (src/consumer/memory.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemorySetting {
    /// `auto`: from the memory limit of the process's cgroup, else a fixed default.
    Auto,
    /// `off` (or `0`): no budget; librdkafka's limits apply to each partition held.
    Off,
    /// This many MiB.
    MiB(u64),
}

/// The largest `ACKD_CONCURRENCY`.
pub const MAX_CONCURRENCY: usize = 10_000;
/// The largest `ACKD_MAX_PENDING`.
pub const MAX_PENDING: usize = 1_000_000;
/// The smallest `ACKD_REDELIVERY_WINDOW_MAX`, and the least the dispatch limit runs
/// ahead of the work (src/consumer/dispatch_limit.rs).
pub const MIN_REDELIVERY_WINDOW: usize = 1_000;
/// The largest `ACKD_REDELIVERY_WINDOW_MAX`.
pub const MAX_REDELIVERY_WINDOW: usize = 100_000_000;

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

/// Where a group without a committed offset starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    Earliest,
    Latest,
}

impl StartFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            StartFrom::Earliest => "earliest",
            StartFrom::Latest => "latest",
        }
    }
}

/// The consumer group protocol (`ACKD_GROUP_PROTOCOL`, librdkafka's `group.protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupProtocol {
    /// JoinGroup/SyncGroup: the client-side assignor, session and heartbeat settings.
    Classic,
    /// KIP-848 (Kafka 4.0+): the broker assigns partitions (incrementally) and sets the
    /// session timeout and heartbeat interval.
    Consumer,
}

impl GroupProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupProtocol::Classic => "classic",
            GroupProtocol::Consumer => "consumer",
        }
    }
}

/// ackd's settings. `Debug` shows no secret.
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
    pub processor: String,
    pub commit_interval: Duration,
    /// `ACKD_REDELIVERY_WINDOW_MAX`: how far (messages) a partition may start beyond its
    /// last accepted commit's dispatch limit window at most.
    pub redelivery_window_max: usize,
    pub shutdown_timeout: Duration,
    pub start_from: StartFrom,
    pub metric_prefix: String,
    /// `source=` on metric lines; `None`: the topic, or `DYNO`/host for process lines.
    pub metric_source: Option<String>,
    /// Summary period; zero turns summaries (and librdkafka's statistics) off.
    pub metrics_interval: Duration,
    pub log_messages: bool,
    pub log_level: String,
    /// Stop (commit, leave, exit 0) once every assigned partition reached its end.
    pub stop_at_end: bool,
    pub retry: RetryPolicy,
    pub on_failure: OnFailure,
    /// Where `ACKD_ON_FAILURE=dead-letter` sends messages.
    pub dead_letter_topic: Option<String>,
    /// With `ACKD_STATIC_MEMBERSHIP=true`: librdkafka's `group.instance.id`, from `DYNO`,
    /// else the host name. `None`: dynamic membership (the default).
    pub group_instance_id: Option<String>,
    /// `ACKD_GROUP_PROTOCOL`: classic (the default) or consumer (KIP-848).
    pub group_protocol: GroupProtocol,
    /// librdkafka properties from `[rdkafka]` and `ACKD_RDKAFKA_*`, validated by
    /// librdkafka itself when the consumer is created.
    pub rdkafka: BTreeMap<String, PassThrough>,
    /// Messages per processor call at most; 1 (the default): one message per call
    /// (`Processor::process`), above 1: batches (`Processor::process_batch`).
    pub batch_max_messages: usize,
    /// `ACKD_ORDERING`: what order a partition's messages are processed in.
    pub ordering: ProcessingOrder,
    /// `ACKD_CONCURRENCY`: processor calls in flight per partition at most (with
    /// `key` or `none` ordering; `partition` ordering is one at a time).
    pub concurrency: usize,
    /// `ACKD_MAX_PENDING`: messages a partition reads above its committable offset at
    /// most: in calls, waiting for their key's turn, or finished above an unfinished one
    /// (`key` or `none` ordering); at the cap it stops reading.
    pub max_pending: usize,
    /// How long a batch waits for more messages once its first one is in hand; a
    /// backlog fills batches without waiting.
    pub batch_max_wait: Duration,
    /// Key and value bytes per batch at most; 0: no limit but `batch_max_messages`. A
    /// message bigger than this is a batch of its own.
    pub batch_max_bytes: usize,
    /// The `exec` processor: the command line its children run (`sh -c`); required
    /// with `ACKD_PROCESSOR=exec` (checked by the processor).
    pub exec_command: Option<String>,
    /// The `exec` processor: how many children serve messages.
    pub exec_concurrency: usize,
    /// The `exec` processor: how many requests one child holds at once (1: one at a
    /// time, the reply to each before the next request).
    pub exec_in_flight: usize,
    /// The `exec` processor: how long a child may take to answer one message.
    pub exec_timeout: Duration,
    /// The `exec` processor: the longest line kept from a child's stdout or stderr.
    pub exec_max_line_bytes: usize,
    /// The `http` processor: where each message is POSTed; required with
    /// `ACKD_PROCESSOR=http` (checked by the processor).
    pub http_url: Option<HttpUrl>,
    /// The `http` processor: the JSON object, or the raw value with metadata headers.
    pub http_body: HttpBody,
    /// The `http` processor: headers added to every request (`Name: value` lines).
    /// The values are secrets (an auth token): never shown.
    pub http_headers: Vec<(String, Secret)>,
    /// The `http` processor: requests in flight at most.
    pub http_concurrency: usize,
    /// The `http` processor: how long one request may take, response body included.
    pub http_timeout: Duration,
    /// Wait for topics of `topics` that do not exist yet (saying so periodically)
    /// instead of stopping with exit 78.
    pub wait_for_topics: bool,
    /// Where the health endpoint listens (`ACKD_HEALTH_ADDR`:`ACKD_HEALTH_PORT`); `None`:
    /// off (the port unset or 0).
    pub health_listen: Option<std::net::SocketAddr>,
    /// `ACKD_HEALTH_STUCK_MS`; `None` (0): derived, see [`Settings::health_stuck_after`].
    pub health_stuck: Option<Duration>,
    /// `ACKD_MEMORY_MB`: the memory budget of the process, divided among the
    /// partitions of the topics (src/consumer/memory.rs).
    pub memory: MemorySetting,
    /// `ACKD_EXEC_PASS_SECRETS`: the [`SECRET_VARIABLES`] exec children get anyway.
    pub exec_pass_secrets: Vec<String>,
    /// Per-message delay of the testkit's `slow` processor (fixed, or a random range).
    #[cfg(feature = "testkit")]
    pub test_delay: crate::config::delay::Delay,
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
        if let Some(d) = self.health_stuck {
            return d;
        }
        match self.processor.as_str() {
            "exec" => self.exec_timeout + Duration::from_secs(5),
            "http" => self.http_timeout + Duration::from_secs(5),
            _ => self.drain_budget(),
        }
    }

    /// The full broker-side name of a topic or group: `KAFKA_PREFIX` applied once.
    /// Every topic and group name ackd uses goes through this (ACKD_DEAD_LETTER_TOPIC
    /// will too).
    pub fn prefixed(&self, name: &str) -> String {
        with_prefix(self.kafka_prefix.as_deref(), name)
    }

    /// Every value no line may show, for [`crate::config::secret::register`]: credentials, the
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
        values.extend(
            self.http_headers
                .iter()
                .map(|(_, v)| v.expose().to_string()),
        );
        if let Some(password) = self.http_url.as_ref().and_then(|u| u.0.password()) {
            values.push(password.to_string());
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
        let raw = RawSettings::layer(&vars)?;
        raw.validate()
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

/// Levels `ACKD_LOG_LEVEL` takes.
pub const LOG_LEVELS: &[&str] = &["error", "warn", "info", "debug", "trace"];
