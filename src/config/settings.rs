//! Every setting, typed and validated once at start.
//!
//! Layers, later wins: `config/default.toml` (compiled in), the TOML file named by
//! `ACKD_CONFIG_FILE`, then the environment. Errors name the environment variable, show
//! the bad value (never a secret) and say what is allowed; the binary turns them into
//! exit code 78 (EX_CONFIG).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use config::{Config, Environment, File, FileFormat};

use crate::config::error::SettingError;
use crate::config::failure::{OnFailure, RetryPolicy};
use crate::config::http_settings::{HttpBody, HttpUrl};
use crate::config::kafka_url::{self, Brokers};
use crate::config::rdkafka_env;
use crate::config::secret::Secret;
use crate::config::security::{self, Sasl, Tls};

/// The defaults, compiled in so the binary behaves the same from any directory.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

/// librdkafka properties ackd sets itself, and the setting to use instead.
pub const OWNED_PROPERTIES: &[(&str, &str)] = &[
    ("bootstrap.servers", "KAFKA_URL"),
    ("metadata.broker.list", "KAFKA_URL"),
    (
        "security.protocol",
        "the KAFKA_URL scheme (kafka://, kafka+ssl:// or kafka+sasl-ssl://)",
    ),
    ("group.id", "ACKD_GROUP_ID"),
    ("auto.offset.reset", "ACKD_START_FROM"),
    (
        "enable.auto.commit",
        "nothing: ackd commits only acknowledged offsets",
    ),
    (
        "enable.auto.offset.store",
        "nothing: ackd stores only acknowledged offsets",
    ),
    ("auto.commit.interval.ms", "ACKD_COMMIT_INTERVAL_MS"),
    ("statistics.interval.ms", "ACKD_METRICS_INTERVAL_MS"),
    ("enable.partition.eof", "ACKD_STOP_AT_END"),
    (
        "group.instance.id",
        "ACKD_STATIC_MEMBERSHIP (the id is DYNO, else the host name)",
    ),
    (
        "group.protocol",
        "ACKD_GROUP_PROTOCOL (classic or consumer)",
    ),
];

/// The librdkafka properties the memory budget (`ACKD_MEMORY_MB`, src/consumer/memory.rs)
/// sets (setting one as well is an error).
pub const MEMORY_BUDGET_PROPERTIES: &[&str] = &[
    "queued.max.messages.kbytes",
    "queued.min.messages",
    "fetch.max.bytes",
    "max.partition.fetch.bytes",
    "fetch.message.max.bytes",
    "message.max.bytes",
];

/// librdkafka properties of the classic protocol only: with `group.protocol=consumer`
/// librdkafka refuses them (the broker runs sessions and assignments there), and what
/// to do instead.
pub const CLASSIC_ONLY_PROPERTIES: &[(&str, &str)] = &[
    (
        "partition.assignment.strategy",
        "the broker assigns partitions: choose its assignor with ACKD_RDKAFKA_GROUP_REMOTE_ASSIGNOR (uniform or range), or leave it to the broker",
    ),
    (
        "session.timeout.ms",
        "the broker sets the session timeout (its group.consumer.session.timeout.ms)",
    ),
    (
        "heartbeat.interval.ms",
        "the broker sets the heartbeat interval (its group.consumer.heartbeat.interval.ms)",
    ),
    (
        "group.protocol.type",
        "it applies to the classic protocol only",
    ),
];

/// Where an `[rdkafka]` property of ackd's compiled-in defaults comes from.
const DEFAULT_ORIGIN: &str = "config/default.toml";

/// Keys of the layered configuration (the env name is `ACKD_` + upper case), except
/// `kafka_url`, which comes from `KAFKA_URL`.
const KEYS: &[&str] = &[
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

/// The largest `ACKD_BATCH_MAX_MESSAGES`: a batch is held in memory whole.
pub const MAX_BATCH: usize = 10_000;
/// The largest `ACKD_BATCH_MAX_BYTES`: 1 GiB.
pub const MAX_BATCH_BYTES: usize = 1 << 30;
/// The largest `ACKD_EXEC_MAX_LINE_BYTES`: 16 MiB (three lines of each child may be held).
pub const MAX_EXEC_LINE_BYTES: usize = 16 << 20;

/// The largest `ACKD_MEMORY_MB`: 1 TiB.
pub const MAX_MEMORY_MB: usize = 1 << 20;

/// The largest `ACKD_CONCURRENCY`.
pub const MAX_CONCURRENCY: usize = 10_000;
/// The largest `ACKD_MAX_PENDING`.
pub const MAX_PENDING: usize = 1_000_000;

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

/// A librdkafka property passed through, with the setting it came from.
#[derive(Clone, PartialEq, Eq)]
pub struct PassThrough {
    pub value: String,
    /// `ACKD_RDKAFKA_…` or `[rdkafka] "…"` in a file: named in errors.
    pub origin: String,
}

impl PassThrough {
    /// The value as it may appear on a log line.
    pub fn shown(&self, property: &str) -> &str {
        if is_secret_property(property) {
            "[redacted]"
        } else {
            &self.value
        }
    }
}

impl fmt::Debug for PassThrough {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The property name is not known here, so a Debug print never shows a value.
        f.debug_struct("PassThrough")
            .field("value", &"[redacted]")
            .field("origin", &self.origin)
            .finish()
    }
}

pub use rdkafka_env::is_secret_property;

/// The variables that carry one of ackd's credentials (KAFKA_URL and ACKD_HTTP_URL only
/// with `user:password@`), besides `ACKD_RDKAFKA_<NAME>` of a secret property: an exec
/// child gets none of them unless `ACKD_EXEC_PASS_SECRETS` names it.
pub const SECRET_VARIABLES: &[&str] = &[
    "KAFKA_URL",
    security::CLIENT_KEY,
    security::SASL_USERNAME,
    security::SASL_PASSWORD,
    "ACKD_HTTP_HEADERS",
    "ACKD_HTTP_URL",
];

/// Whether the variable `name` = `value` carries one of ackd's credentials (see
/// [`SECRET_VARIABLES`]). Names are read as ackd reads them: `ACKD_` settings in any
/// case after the prefix.
pub fn is_secret_variable(name: &str, value: &str) -> bool {
    if let Some(suffix) = name.strip_prefix(rdkafka_env::PREFIX) {
        return rdkafka_env::property_from_env(suffix).is_ok_and(|p| is_secret_property(&p));
    }
    match variable_name(name).as_str() {
        "KAFKA_URL" | "ACKD_HTTP_URL" => value.contains('@'),
        name => SECRET_VARIABLES.contains(&name),
    }
}

/// The secrets of one `ACKD_HTTP_HEADERS` line: its value (the whole line if it has no
/// name), and of an `Authorization` header the credential without its scheme too (only
/// there: the last word of any other value may be an ordinary word).
fn header_secrets(line: &str) -> Vec<String> {
    let (name, value) = line.split_once(':').unwrap_or(("", line));
    let value = value.trim();
    let mut secrets = vec![value.to_string()];
    let name = name.trim().to_ascii_lowercase();
    if name == "authorization" || name == "proxy-authorization" {
        if let Some((_, credential)) = value.rsplit_once(' ') {
            secrets.push(credential.to_string());
        }
    }
    secrets
}

/// The name ackd reads `name` as: an `ACKD_` setting's in upper case (ackd takes any
/// case after the prefix), any other as it is.
pub fn variable_name(name: &str) -> String {
    match name.strip_prefix("ACKD_") {
        Some(key) if !name.starts_with(rdkafka_env::PREFIX) => env_name(&key.to_ascii_lowercase()),
        _ => name.to_string(),
    }
}

/// Every value no line may show that `vars` hold, whether or not they make valid
/// settings: [`crate::config::secret::register`] gets them before validation, so that not even
/// a configuration error can show one. Values from a file (`ACKD_CONFIG_FILE`) count
/// when the file can be read.
pub fn never_shown_in_vars(vars: impl IntoIterator<Item = (String, String)>) -> Vec<String> {
    let vars: HashMap<String, String> = vars.into_iter().collect();
    let mut settings: HashMap<String, String> = HashMap::new();
    let mut rdkafka: Vec<(String, String)> = Vec::new();
    if let Ok(raw) = RawSettings::layer(&vars) {
        settings.extend(raw.values.iter().map(|(k, v)| (env_name(k), v.clone())));
        rdkafka.extend(raw.rdkafka.into_iter().map(|(p, v)| (p, v.value)));
    }
    for (name, value) in &vars {
        match name.strip_prefix(rdkafka_env::PREFIX) {
            Some(suffix) => {
                if let Ok(property) = rdkafka_env::property_from_env(suffix) {
                    rdkafka.push((property, value.clone()));
                }
            }
            None if is_secret_variable(name, value) => {
                settings.insert(variable_name(name), value.clone());
            }
            None => {}
        }
    }
    for pem in [security::TRUSTED_CERT, security::CLIENT_CERT] {
        if let Some(v) = vars.get(pem) {
            settings.insert(pem.to_string(), v.clone());
        }
    }
    let mut values = Vec::new();
    for (name, value) in &settings {
        values.extend(secrets_of_variable(name, value));
    }
    values.extend(
        rdkafka
            .into_iter()
            .filter(|(p, _)| is_secret_property(p))
            .map(|(_, v)| v),
    );
    values.retain(|v| !v.trim().is_empty());
    values.sort();
    values.dedup();
    values
}

/// The secret values one variable holds: the credentials of a URL (as written and
/// decoded), each header value (and its last word: a token without its scheme), or the
/// whole value.
fn secrets_of_variable(name: &str, value: &str) -> Vec<String> {
    match name {
        "KAFKA_URL" => kafka_url::user_info_texts(value),
        "ACKD_HTTP_URL" => match reqwest::Url::parse(value.trim()) {
            Ok(url) => url
                .password()
                .map(|p| [Some(p.to_string()), kafka_url::percent_decode(p).ok()])
                .into_iter()
                .flatten()
                .flatten()
                .collect(),
            Err(_) => kafka_url::user_info_texts(value),
        },
        "ACKD_HTTP_HEADERS" => value.lines().flat_map(header_secrets).collect(),
        name if name == security::TRUSTED_CERT
            || name == security::CLIENT_CERT
            || SECRET_VARIABLES.contains(&name) =>
        {
            vec![value.to_string()]
        }
        _ => Vec::new(),
    }
}

/// The platform's variables read as they are (not layered: they come from the
/// environment only, e.g. Heroku's Kafka add-on).
const KAFKA_VARS: &[&str] = &[
    security::TRUSTED_CERT,
    security::CLIENT_CERT,
    security::CLIENT_KEY,
    "KAFKA_PREFIX",
];

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
    /// `ACKD_MEMORY_MB`: the prefetch budget of the process, divided among the
    /// partitions of the topics (src/consumer/memory.rs); 0: off, librdkafka's limits
    /// per partition as configured.
    pub memory_mb: u64,
    /// `ACKD_EXEC_PASS_SECRETS`: the [`SECRET_VARIABLES`] exec children get anyway.
    pub exec_pass_secrets: Vec<String>,
    /// Per-message delay of the testkit's `slow` processor (fixed, or a random range).
    #[cfg(feature = "testkit")]
    pub test_delay: crate::config::delay::Delay,
}

/// The environment variable for a configuration key.
fn env_name(key: &str) -> String {
    if key == "kafka_url" {
        "KAFKA_URL".into()
    } else {
        format!("ACKD_{}", key.to_ascii_uppercase())
    }
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

/// Settings as strings, layered, before validation.
struct RawSettings {
    values: HashMap<&'static str, String>,
    /// Keys that the environment set (errors name the variable either way, but a value
    /// from a file says which file).
    file: Option<String>,
    from_env: Vec<&'static str>,
    rdkafka: BTreeMap<String, PassThrough>,
    /// The `rdkafka` properties that are ackd's compiled-in defaults, unchanged.
    rdkafka_defaults: Vec<String>,
    /// [`KAFKA_VARS`] as given.
    kafka_vars: HashMap<&'static str, String>,
    /// `DYNO` and `HOSTNAME` from the variables: where a static member's id comes from.
    dyno: Option<String>,
    hostname: Option<String>,
}

impl RawSettings {
    fn layer(vars: &HashMap<String, String>) -> Result<RawSettings, SettingError> {
        let mut ackd_vars: HashMap<String, String> = HashMap::new();
        let mut rdkafka_vars: Vec<(String, String)> = Vec::new();
        for (name, value) in vars {
            if let Some(suffix) = name.strip_prefix(rdkafka_env::PREFIX) {
                rdkafka_vars.push((suffix.to_string(), value.clone()));
            } else if let Some(key) = name.strip_prefix("ACKD_") {
                let key = key.to_ascii_lowercase();
                if key == "kafka_url" || !KEYS.contains(&key.as_str()) {
                    return Err(SettingError::new(
                        name,
                        None,
                        format!("is not a setting of ackd; known settings: KAFKA_URL, {}, and ACKD_RDKAFKA_<property>",
                            KEYS.iter().filter(|k| **k != "kafka_url").map(|k| env_name(k)).collect::<Vec<_>>().join(", ")),
                    ));
                }
                ackd_vars.insert(key, value.clone());
            }
        }
        if let Some(url) = vars.get("KAFKA_URL") {
            ackd_vars.insert("kafka_url".into(), url.clone());
        }

        let file = ackd_vars.get("config_file").cloned();
        let mut builder =
            Config::builder().add_source(File::from_str(DEFAULT_TOML, FileFormat::Toml));
        if let Some(path) = &file {
            if !std::path::Path::new(path).is_file() {
                return Err(SettingError::new(
                    "ACKD_CONFIG_FILE",
                    Some(path),
                    "names no readable file: give the path of a TOML file",
                ));
            }
            builder = builder.add_source(File::new(path, FileFormat::Toml));
        }
        let env_map: config::Map<String, String> = ackd_vars.clone().into_iter().collect();
        builder = builder.add_source(Environment::default().source(Some(env_map)));
        let config = builder.build().map_err(|e| {
            SettingError::new(
                "ACKD_CONFIG_FILE",
                file.as_deref(),
                format!("cannot be read as TOML: {e}"),
            )
        })?;

        let table = config
            .clone()
            .try_deserialize::<HashMap<String, config::Value>>()
            .unwrap_or_default();
        for key in table.keys() {
            if key != "rdkafka" && !KEYS.contains(&key.as_str()) {
                return Err(SettingError::new(
                    format!(
                        "`{key}` in {}",
                        file.as_deref().unwrap_or("config/default.toml")
                    ),
                    None,
                    "is not a setting of ackd (see config/default.toml for the keys)",
                ));
            }
        }

        let mut values = HashMap::new();
        for key in KEYS {
            if let Ok(v) = config.get_string(key) {
                values.insert(*key, v);
            }
        }
        let from_env = KEYS
            .iter()
            .copied()
            .filter(|k| ackd_vars.contains_key(*k))
            .collect();

        // The [rdkafka] properties the file itself sets: the others are ackd's defaults,
        // which errors name as such and which give way where they do not apply
        // (ACKD_GROUP_PROTOCOL=consumer).
        let file_rdkafka: Vec<String> = file
            .as_deref()
            .and_then(|path| {
                Config::builder()
                    .add_source(File::new(path, FileFormat::Toml))
                    .build()
                    .ok()
            })
            .and_then(|c| c.get_table("rdkafka").ok())
            .map(|t| t.into_keys().collect())
            .unwrap_or_default();
        let mut rdkafka = BTreeMap::new();
        let mut rdkafka_defaults = Vec::new();
        if let Ok(props) = config.get_table("rdkafka") {
            for (property, value) in props {
                let from = match &file {
                    Some(f) if file_rdkafka.contains(&property) => f.as_str(),
                    _ => {
                        rdkafka_defaults.push(property.clone());
                        DEFAULT_ORIGIN
                    }
                };
                let origin = format!("[rdkafka] \"{property}\" in {from}");
                let value = value.into_string().map_err(|_| {
                    SettingError::new(&origin, None, "must be a string, number or boolean")
                })?;
                rdkafka.insert(property, PassThrough { value, origin });
            }
        }
        for (suffix, value) in rdkafka_vars {
            let origin = format!("{}{suffix}", rdkafka_env::PREFIX);
            let property = rdkafka_env::property_from_env(&suffix).map_err(|problem| {
                SettingError::new(
                    &origin,
                    None,
                    format!("{problem} (librdkafka property upper-cased, `.` -> `_`, `_` -> `__`, `-` -> `___`)"),
                )
            })?;
            rdkafka_defaults.retain(|p| *p != property);
            rdkafka.insert(property, PassThrough { value, origin });
        }
        for (property, pass) in &rdkafka {
            if let Some((_, instead)) = OWNED_PROPERTIES.iter().find(|(p, _)| p == property) {
                return Err(SettingError::new(
                    &pass.origin,
                    None,
                    format!("sets `{property}`, which ackd owns: use {instead}"),
                ));
            }
        }

        let kafka_vars = KAFKA_VARS
            .iter()
            .filter_map(|k| vars.get(*k).map(|v| (*k, v.clone())))
            .collect();

        Ok(RawSettings {
            values,
            file,
            from_env,
            rdkafka,
            rdkafka_defaults,
            kafka_vars,
            dyno: vars.get("DYNO").cloned(),
            hostname: vars.get("HOSTNAME").cloned(),
        })
    }

    /// The error for `key`, naming its variable and, if it came from a file, the file.
    fn error(&self, key: &'static str, problem: impl Into<String>) -> SettingError {
        let mut setting = env_name(key);
        if !self.from_env.contains(&key) {
            if let Some(file) = &self.file {
                setting = format!("{setting} (`{key}` in {file})");
            }
        }
        SettingError::new(setting, self.values.get(key).map(String::as_str), problem)
    }

    fn required(&self, key: &'static str, what: &str) -> Result<&str, SettingError> {
        match self.values.get(key).map(|v| v.trim()) {
            Some(v) if !v.is_empty() => Ok(v),
            _ => Err(SettingError::new(
                env_name(key),
                None,
                format!("is required: {what}"),
            )),
        }
    }

    fn get(&self, key: &'static str) -> &str {
        self.values.get(key).map(|v| v.trim()).unwrap_or("")
    }

    fn millis(&self, key: &'static str, min: u64, max: u64) -> Result<Duration, SettingError> {
        let problem = || format!("expected a whole number of milliseconds from {min} to {max}");
        match self.get(key).parse::<u64>() {
            Ok(ms) if (min..=max).contains(&ms) => Ok(Duration::from_millis(ms)),
            _ => Err(self.error(key, problem())),
        }
    }

    /// A whole number in `allowed`; otherwise the error `problem`.
    /// `ACKD_HEALTH_ADDR` and `ACKD_HEALTH_PORT` (0 or unset: off).
    fn health_listen(&self) -> Result<Option<std::net::SocketAddr>, SettingError> {
        let port = match self.get("health_port").trim() {
            "" => 0,
            p => p.parse::<u16>().map_err(|_| {
                self.error(
                    "health_port",
                    "expected a port number from 1 to 65535, or 0 (off)",
                )
            })?,
        };
        let addr: std::net::IpAddr = self.get("health_addr").trim().parse().map_err(|_| {
            self.error(
                "health_addr",
                "expected an IP address to listen on, e.g. 0.0.0.0 (every IPv4 interface), :: or 127.0.0.1",
            )
        })?;
        Ok((port != 0).then_some(std::net::SocketAddr::new(addr, port)))
    }

    fn whole(
        &self,
        key: &'static str,
        allowed: std::ops::RangeInclusive<usize>,
        problem: impl Into<String>,
    ) -> Result<usize, SettingError> {
        match self.get(key).parse::<usize>() {
            Ok(n) if allowed.contains(&n) => Ok(n),
            _ => Err(self.error(key, problem)),
        }
    }

    fn boolean(&self, key: &'static str) -> Result<bool, SettingError> {
        match self.get(key).to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err(self.error(key, "expected true or false")),
        }
    }

    /// A static member's `group.instance.id`: `DYNO` (Heroku's `consumer.1`), else
    /// `HOSTNAME`, else the kernel's host name. Used as it is: the broker scopes instance
    /// ids by group, so the group id need not be part of it.
    fn instance_id(
        &self,
        read_hostname: impl FnOnce() -> Option<String>,
    ) -> Result<String, SettingError> {
        let nonempty = |v: &Option<String>| {
            v.as_deref()
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        let (source, id) = if let Some(id) = nonempty(&self.dyno) {
            ("DYNO", id)
        } else if let Some(id) = nonempty(&self.hostname) {
            ("HOSTNAME", id)
        } else if let Some(id) = nonempty(&read_hostname()) {
            ("the host name", id)
        } else {
            return Err(self.error(
                "static_membership",
                "needs an instance id: set DYNO (Heroku sets it), or HOSTNAME",
            ));
        };
        // Kafka's rule for group.instance.id (it refuses other ids at JoinGroup).
        let valid = id.len() <= 249
            && id != "."
            && id != ".."
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !valid {
            return Err(self.error(
                "static_membership",
                format!("takes group.instance.id from {source}, whose value `{id}` is not a valid instance id: up to 249 of a-z A-Z 0-9 . _ -"),
            ));
        }
        Ok(id)
    }

    /// `ACKD_HTTP_URL`: an http:// or https:// URL. A URL with credentials is never
    /// shown in an error.
    fn http_url(&self) -> Result<Option<HttpUrl>, SettingError> {
        let raw = self.get("http_url");
        if raw.is_empty() {
            return Ok(None);
        }
        let hide = |mut e: SettingError| {
            if raw.contains('@') {
                e.value = None;
            }
            e
        };
        let url = reqwest::Url::parse(raw).map_err(|e| {
            hide(self.error(
                "http_url",
                format!("is not a URL ({e}): expected http://host[:port]/path or https://…"),
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(hide(self.error(
                "http_url",
                "expected an http:// or https:// URL with a host",
            )));
        }
        Ok(Some(HttpUrl(url)))
    }

    /// `ACKD_EXEC_PASS_SECRETS`: comma-separated names of secret variables (see
    /// [`SECRET_VARIABLES`]) that exec children get; any other name is a mistake.
    fn exec_pass_secrets(&self) -> Result<Vec<String>, SettingError> {
        let names: Vec<String> = self
            .get("exec_pass_secrets")
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(variable_name)
            .collect();
        match names.iter().find(|n| !is_secret_variable(n, "@")) {
            None => Ok(names),
            Some(name) => Err(self.error(
                "exec_pass_secrets",
                format!(
                    "names `{name}`, which ackd does not keep from exec children: expected comma-separated names among {} (the URLs when they carry user:password@) and {}<NAME> of a secret librdkafka property",
                    SECRET_VARIABLES.join(", "),
                    rdkafka_env::PREFIX
                ),
            )),
        }
    }

    /// `ACKD_HTTP_HEADERS`: one `Name: value` per line. Errors never show a value (nor
    /// a line, which may be a token without its name).
    fn http_headers(&self) -> Result<Vec<(String, Secret)>, SettingError> {
        let raw = self
            .values
            .get("http_headers")
            .map(String::as_str)
            .unwrap_or("");
        let fail = |problem: String| {
            let mut e = self.error("http_headers", problem);
            e.value = None;
            e
        };
        let mut headers = Vec::new();
        for (i, line) in raw.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let n = i + 1;
            let Some((name, value)) = line.split_once(':') else {
                return Err(fail(format!(
                    "line {n} has no `:`: expected one `Name: value` per line"
                )));
            };
            let (name, value) = (name.trim(), value.trim());
            if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(fail(format!(
                    "line {n}: the text before `:` is not a header name (letters, digits, - and the like)"
                )));
            }
            if reqwest::header::HeaderValue::from_str(value).is_err() {
                return Err(fail(format!(
                    "line {n} ({name}): the value is not a valid header value (printable ASCII)"
                )));
            }
            let lower = name.to_ascii_lowercase();
            if lower.starts_with("ackd-")
                || ["host", "content-length", "transfer-encoding", "connection"]
                    .contains(&lower.as_str())
            {
                return Err(fail(format!(
                    "line {n}: ackd sets {name} itself (and every Ackd-* header)"
                )));
            }
            headers.push((name.to_string(), Secret::new(value)));
        }
        Ok(headers)
    }

    /// Every required setting that is missing, in one error (one at a time makes a new
    /// user start ackd once per setting). What a built-in processor or the dead-letter
    /// policy requires counts too; alone, those are reported where they are checked.
    fn missing(&self) -> Result<(), SettingError> {
        let mut missing: Vec<(String, String)> = REQUIRED
            .iter()
            .filter(|(key, _)| self.get(key).is_empty())
            .map(|(key, what)| (env_name(key), what.to_string()))
            .collect();
        let required_always = missing.len();
        let processor = self.get("processor").to_ascii_lowercase();
        for (processor_name, key, what) in [
            (
                "exec",
                "exec_command",
                "with ACKD_PROCESSOR=exec, the handler's command line",
            ),
            (
                "http",
                "http_url",
                "with ACKD_PROCESSOR=http, the URL messages are POSTed to",
            ),
        ] {
            if processor == processor_name && self.get(key).is_empty() {
                missing.push((env_name(key), what.to_string()));
            }
        }
        if OnFailure::parse(&self.get("on_failure").to_ascii_lowercase())
            == Some(OnFailure::DeadLetter)
            && self.get("dead_letter_topic").is_empty()
        {
            missing.push((
                env_name("dead_letter_topic"),
                "with ACKD_ON_FAILURE=dead-letter, the topic failed messages go to".into(),
            ));
        }
        match missing.len() {
            0 => Ok(()),
            // One alone: the same error as the check that finds it.
            1 if required_always == 1 => Err(SettingError::new(
                &missing[0].0,
                None,
                format!("is required: {}", missing[0].1),
            )),
            1 => Ok(()),
            _ => Err(SettingError::new(
                missing
                    .iter()
                    .map(|(name, _)| name.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
                None,
                format!(
                    "are required: {}",
                    missing
                        .iter()
                        .map(|(name, what)| format!("{name}: {what}"))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            )),
        }
    }

    fn validate(self) -> Result<Settings, SettingError> {
        self.missing()?;
        let url = self.required("kafka_url", kafka_url::ALLOWED)?;
        let brokers = kafka_url::parse(url).map_err(|problem| {
            // A URL may carry credentials: show it only when it cannot.
            let mut e = self.error(
                "kafka_url",
                format!("{problem}; expected {}", kafka_url::ALLOWED),
            );
            if url.contains('@') {
                e.value = None;
            }
            e
        })?;

        let kafka_prefix = match self.kafka_vars.get("KAFKA_PREFIX").map(|p| p.trim()) {
            None | Some("") => None,
            Some(p) => {
                let valid = p.len() < 249
                    && p.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
                if !valid {
                    return Err(SettingError::new(
                        "KAFKA_PREFIX",
                        Some(p),
                        "expected the start of a topic name: a-z A-Z 0-9 . _ - (Heroku's ends with `.`)",
                    ));
                }
                Some(p.to_string())
            }
        };
        let prefix = kafka_prefix.as_deref();

        let topics_raw = self.required("topics", REQUIRED[1].1)?;
        let topics: Vec<String> = topics_raw
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| with_prefix(prefix, t))
            .collect();
        if topics.is_empty() {
            return Err(self.error("topics", "names no topic: give comma-separated topic names"));
        }
        for t in &topics {
            if !valid_topic(t) {
                return Err(self.error(
                    "topics",
                    format!("`{t}` is not a valid topic name: up to 249 of a-z A-Z 0-9 . _ - (KAFKA_PREFIX included)"),
                ));
            }
        }

        let group_id = with_prefix(prefix, self.required("group_id", REQUIRED[2].1)?);

        let value = |key: &'static str| self.values.get(key).map(String::as_str);
        let (tls, sasl) = security::validate(
            &brokers,
            &security::Inputs {
                trusted_cert: self
                    .kafka_vars
                    .get(security::TRUSTED_CERT)
                    .map(String::as_str),
                client_cert: self
                    .kafka_vars
                    .get(security::CLIENT_CERT)
                    .map(String::as_str),
                client_key: self
                    .kafka_vars
                    .get(security::CLIENT_KEY)
                    .map(String::as_str),
                sasl_mechanism: value("sasl_mechanism"),
                sasl_username: value("sasl_username"),
                sasl_password: value("sasl_password"),
            },
        )?;
        for (property, setting) in security::claimed(tls.as_ref(), sasl.as_ref()) {
            if let Some(pass) = self.rdkafka.get(property) {
                return Err(SettingError::new(
                    &pass.origin,
                    None,
                    format!("sets `{property}`, which ackd sets from {setting}: give it once"),
                ));
            }
        }

        // Which names are valid is the processors' business (an embedding app has its own).
        let processor = self.get("processor").to_ascii_lowercase();

        let start_from = match self.get("start_from").to_ascii_lowercase().as_str() {
            "earliest" => StartFrom::Earliest,
            "latest" => StartFrom::Latest,
            _ => return Err(self.error("start_from", "expected earliest or latest")),
        };

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

        let metric_source = match self.get("metric_source") {
            "" => None,
            s if s
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) =>
            {
                Some(s.to_string())
            }
            _ => {
                return Err(self.error(
                    "metric_source",
                    "expected a name of A-Z a-z 0-9 . _ - (an l2met source)",
                ))
            }
        };

        let retry = RetryPolicy {
            initial: self.millis("retry_initial_ms", 1, 3_600_000)?,
            max: self.millis("retry_max_ms", 1, 3_600_000)?,
            max_attempts: match self.get("retry_max_attempts").parse::<u32>() {
                Ok(n) if n >= 1 => n,
                _ => {
                    return Err(self.error(
                        "retry_max_attempts",
                        "expected a whole number of attempts, 1 or more (1: no retry)",
                    ))
                }
            },
        };
        if retry.max < retry.initial {
            return Err(self.error(
                "retry_max_ms",
                format!(
                    "is below ACKD_RETRY_INITIAL_MS ({} ms): the longest wait cannot be shorter than the first",
                    retry.initial.as_millis()
                ),
            ));
        }
        let on_failure = OnFailure::parse(&self.get("on_failure").to_ascii_lowercase())
            .ok_or_else(|| self.error("on_failure", format!("expected {}", OnFailure::ALLOWED)))?;
        let dead_letter_topic = match self.get("dead_letter_topic") {
            "" => None,
            t if valid_topic(t) => Some(with_prefix(prefix, t)),
            t => {
                return Err(self.error(
                    "dead_letter_topic",
                    format!("`{t}` is not a valid topic name: up to 249 of a-z A-Z 0-9 . _ -"),
                ))
            }
        };
        if on_failure == OnFailure::DeadLetter && dead_letter_topic.is_none() {
            return Err(SettingError::new(
                "ACKD_DEAD_LETTER_TOPIC",
                None,
                "is required with ACKD_ON_FAILURE=dead-letter: the topic failed messages go to",
            ));
        }
        if dead_letter_topic
            .as_ref()
            .is_some_and(|d| topics.contains(d))
        {
            return Err(self.error(
                "dead_letter_topic",
                "is also in ACKD_TOPICS: dead letters would be consumed again",
            ));
        }

        let (group_protocol, rdkafka) = self.group_protocol()?;

        let group_instance_id = if self.boolean("static_membership")? {
            Some(self.instance_id(read_hostname)?)
        } else {
            None
        };

        let settings = Settings {
            brokers,
            retry,
            on_failure,
            dead_letter_topic,
            group_instance_id,
            metric_source,
            metrics_interval: self.millis("metrics_interval_ms", 0, 3_600_000)?,
            topics,
            group_id,
            kafka_prefix,
            tls,
            sasl,
            processor,
            commit_interval: self.millis("commit_interval_ms", 1, 3_600_000)?,
            shutdown_timeout: self.millis("shutdown_timeout_ms", 1, 3_600_000)?,
            start_from,
            metric_prefix,
            log_messages: self.boolean("log_messages")?,
            stop_at_end: self.boolean("stop_at_end")?,
            log_level,
            batch_max_messages: self.whole(
                "batch_max_messages",
                1..=MAX_BATCH,
                format!("expected a whole number from 1 (no batches) to {MAX_BATCH}"),
            )?,
            batch_max_wait: self.millis("batch_max_wait_ms", 0, 60_000)?,
            ordering: match self.get("ordering").to_ascii_lowercase().as_str() {
                "partition" => ProcessingOrder::Partition,
                "key" => ProcessingOrder::Key,
                "none" => ProcessingOrder::None,
                _ => {
                    return Err(self.error(
                        "ordering",
                        "expected partition (one message of a partition at a time, the default), key (each key in order, keys concurrently) or none",
                    ))
                }
            },
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
            exec_command: Some(self.get("exec_command"))
                .filter(|c| !c.is_empty())
                .map(str::to_string),
            exec_concurrency: self.whole(
                "exec_concurrency",
                1..=256,
                "expected a whole number from 1 to 256",
            )?,
            exec_timeout: self.millis("exec_timeout_ms", 1, 3_600_000)?,
            exec_max_line_bytes: self.whole(
                "exec_max_line_bytes",
                256..=MAX_EXEC_LINE_BYTES,
                format!("expected a whole number of bytes from 256 to {MAX_EXEC_LINE_BYTES}"),
            )?,
            http_url: self.http_url()?,
            http_body: match self.get("http_body").to_ascii_lowercase().as_str() {
                "json" => HttpBody::Json,
                "raw" => HttpBody::Raw,
                _ => return Err(self.error("http_body", "expected json or raw")),
            },
            http_headers: self.http_headers()?,
            http_concurrency: self.whole(
                "http_concurrency",
                1..=1024,
                "expected a whole number from 1 to 1024",
            )?,
            http_timeout: self.millis("http_timeout_ms", 1, 3_600_000)?,
            wait_for_topics: self.boolean("wait_for_topics")?,
            health_listen: self.health_listen()?,
            health_stuck: Some(self.millis("health_stuck_ms", 0, 86_400_000)?)
                .filter(|d| !d.is_zero()),
            memory_mb: self.whole(
                "memory_mb",
                0..=MAX_MEMORY_MB,
                format!("expected a whole number of MiB from 0 (off) to {MAX_MEMORY_MB}"),
            )? as u64,
            exec_pass_secrets: self.exec_pass_secrets()?,
            #[cfg(feature = "testkit")]
            test_delay: if self.values.contains_key("test_delay_ms") {
                crate::config::delay::Delay::parse(self.get("test_delay_ms"), 3_600_000)
                    .map_err(|problem| self.error("test_delay_ms", problem))?
            } else {
                Default::default()
            },
            group_protocol,
            rdkafka,
        };
        // A message in flight when SIGTERM arrives must be able to finish inside the drain.
        let drain = settings.drain_budget();
        let processor_timeout = match settings.processor.as_str() {
            "exec" => Some(("exec_timeout_ms", settings.exec_timeout)),
            "http" => Some(("http_timeout_ms", settings.http_timeout)),
            _ => None,
        };
        if let Some((key, timeout)) = processor_timeout {
            if timeout > drain {
                return Err(SettingError::new(
                    env_name(key),
                    Some(&timeout.as_millis().to_string()),
                    format!(
                        "is longer than the {} ms that ACKD_SHUTDOWN_TIMEOUT_MS={} leaves in-flight messages \
                         to finish (the rest is kept for the final commit): a message in flight at SIGTERM \
                         could not finish before the deadline; lower it, or raise ACKD_SHUTDOWN_TIMEOUT_MS",
                        drain.as_millis(),
                        settings.shutdown_timeout.as_millis()
                    ),
                ));
            }
        }
        // The budget sets librdkafka's prefetch limits itself: one set by hand as well
        // would be silently overridden (a value equal to ackd's default is not "by hand").
        if settings.memory_mb > 0 {
            let defaults = rdkafka_defaults();
            if let Some((property, pass)) = settings.rdkafka.iter().find(|(p, pass)| {
                MEMORY_BUDGET_PROPERTIES.contains(&p.as_str())
                    && !defaults.iter().any(|(d, v)| d == *p && *v == pass.value)
            }) {
                return Err(SettingError::new(
                    &pass.origin,
                    Some(&pass.value),
                    format!(
                        "sets `{property}`, which ACKD_MEMORY_MB={} sets from the budget: use one or the other",
                        settings.memory_mb
                    ),
                ));
            }
        }
        // Partition ordering is one call at a time: a concurrency set by hand would
        // silently do nothing (a value equal to the default is not "by hand").
        let default_concurrency = Config::builder()
            .add_source(File::from_str(DEFAULT_TOML, FileFormat::Toml))
            .build()
            .ok()
            .and_then(|c| c.get_int("concurrency").ok());
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
        Ok(settings)
    }

    /// `ACKD_GROUP_PROTOCOL`, and the pass-through properties that go with it. Under
    /// `consumer`, ackd's own default assignor is dropped, and a classic-only property
    /// the user passed is an error here (librdkafka's refusal would otherwise stop ackd
    /// at the consumer's creation, naming no setting).
    fn group_protocol(
        &self,
    ) -> Result<(GroupProtocol, BTreeMap<String, PassThrough>), SettingError> {
        let protocol = match self.get("group_protocol").to_ascii_lowercase().as_str() {
            "classic" => GroupProtocol::Classic,
            "consumer" => GroupProtocol::Consumer,
            _ => {
                return Err(self.error(
                    "group_protocol",
                    "expected classic (JoinGroup, the default) or consumer (KIP-848, Kafka 4.0 or later)",
                ))
            }
        };
        let mut rdkafka = self.rdkafka.clone();
        match protocol {
            GroupProtocol::Consumer => {
                for (property, instead) in CLASSIC_ONLY_PROPERTIES {
                    match rdkafka.get(*property) {
                        Some(_) if self.rdkafka_defaults.iter().any(|p| p == property) => {
                            rdkafka.remove(*property);
                        }
                        Some(pass) => {
                            return Err(SettingError::new(
                                &pass.origin,
                                Some(pass.shown(property)),
                                format!("sets `{property}`, which librdkafka refuses with ACKD_GROUP_PROTOCOL=consumer: {instead}. Remove it, or use ACKD_GROUP_PROTOCOL=classic"),
                            ));
                        }
                        None => {}
                    }
                }
            }
            GroupProtocol::Classic => {
                if let Some(pass) = rdkafka.get("group.remote.assignor") {
                    return Err(SettingError::new(
                        &pass.origin,
                        Some(pass.shown("group.remote.assignor")),
                        "sets `group.remote.assignor`, the broker's assignor, which only ACKD_GROUP_PROTOCOL=consumer uses: set that too, or choose a client-side assignor with ACKD_RDKAFKA_PARTITION_ASSIGNMENT_STRATEGY",
                    ));
                }
            }
        }
        Ok((protocol, rdkafka))
    }
}

/// What a graceful stop keeps of its deadline for the final commit and leaving the group:
/// a fifth, at most 5 s. In-flight messages get the rest ([`Settings::drain_budget`]).
pub fn commit_reserve(budget: Duration) -> Duration {
    (budget / 5).min(Duration::from_secs(5))
}

/// The settings without a default, and what to give: `is required: <what>`.
const REQUIRED: &[(&str, &str)] = &[
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

/// Kafka's rule for topic names.
fn valid_topic(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 249
        && t != "."
        && t != ".."
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// The kernel's host name (Linux), for static members without `DYNO` or `HOSTNAME`.
fn read_hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname").ok()
}

/// Levels `ACKD_LOG_LEVEL` takes.
pub const LOG_LEVELS: &[&str] = &["error", "warn", "info", "debug", "trace"];

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(extra: &[(&str, &str)]) -> Vec<(String, String)> {
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

    fn err(extra: &[(&str, &str)]) -> SettingError {
        Settings::from_vars(vars(extra)).expect_err("accepted")
    }

    /// The health endpoint: off by default and with 0, on with a port; its address and
    /// stuck bound validated and derived.
    #[test]
    fn health_settings() {
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert_eq!(s.health_listen, None);
        assert_eq!(s.health_stuck_after(), s.drain_budget());
        let s = Settings::from_vars(vars(&[("ACKD_HEALTH_PORT", "0")])).unwrap();
        assert_eq!(s.health_listen, None);
        let s = Settings::from_vars(vars(&[("ACKD_HEALTH_PORT", "8080")])).unwrap();
        assert_eq!(s.health_listen, Some("0.0.0.0:8080".parse().unwrap()));
        let s = Settings::from_vars(vars(&[
            ("ACKD_HEALTH_PORT", "9000"),
            ("ACKD_HEALTH_ADDR", "::1"),
            ("ACKD_HEALTH_STUCK_MS", "2500"),
        ]))
        .unwrap();
        assert_eq!(s.health_listen, Some("[::1]:9000".parse().unwrap()));
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

    /// A message in flight at SIGTERM can finish: the defaults' processor timeouts fit in
    /// the drain's share of the shutdown deadline (they were 30 s against a 20 s drain).
    #[test]
    fn default_processor_timeouts_fit_in_the_drain() {
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert_eq!(s.drain_budget(), Duration::from_millis(20000));
        assert!(s.exec_timeout <= s.drain_budget(), "{:?}", s.exec_timeout);
        assert!(s.http_timeout <= s.drain_budget(), "{:?}", s.http_timeout);
        // Both processors start with their defaults.
        Settings::from_vars(vars(&[
            ("ACKD_PROCESSOR", "exec"),
            ("ACKD_EXEC_COMMAND", "cat"),
        ]))
        .unwrap();
        Settings::from_vars(vars(&[
            ("ACKD_PROCESSOR", "http"),
            ("ACKD_HTTP_URL", "http://127.0.0.1:1/"),
        ]))
        .unwrap();
        // The reserve for the commit: a fifth, at most 5 s.
        assert_eq!(
            commit_reserve(Duration::from_secs(5)),
            Duration::from_secs(1)
        );
        assert_eq!(
            commit_reserve(Duration::from_secs(60)),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn a_processor_timeout_longer_than_the_drain_is_refused() {
        let e = err(&[
            ("ACKD_PROCESSOR", "http"),
            ("ACKD_HTTP_URL", "http://127.0.0.1:1/"),
            ("ACKD_HTTP_TIMEOUT_MS", "30000"),
        ]);
        assert_eq!(e.setting, "ACKD_HTTP_TIMEOUT_MS", "{e}");
        assert!(e.problem.contains("20000 ms"), "{e}");
        assert!(e.problem.contains("ACKD_SHUTDOWN_TIMEOUT_MS=25000"), "{e}");
        let e = err(&[
            ("ACKD_PROCESSOR", "exec"),
            ("ACKD_EXEC_COMMAND", "cat"),
            ("ACKD_SHUTDOWN_TIMEOUT_MS", "5000"),
            ("ACKD_EXEC_TIMEOUT_MS", "4500"),
        ]);
        assert_eq!(e.setting, "ACKD_EXEC_TIMEOUT_MS", "{e}");
        assert!(e.problem.contains("4000 ms"), "{e}");
        // Exactly the drain's share is allowed; a processor that does not use it is not checked.
        Settings::from_vars(vars(&[
            ("ACKD_PROCESSOR", "exec"),
            ("ACKD_EXEC_COMMAND", "cat"),
            ("ACKD_SHUTDOWN_TIMEOUT_MS", "5000"),
            ("ACKD_EXEC_TIMEOUT_MS", "4000"),
        ]))
        .unwrap();
        Settings::from_vars(vars(&[("ACKD_SHUTDOWN_TIMEOUT_MS", "1000")])).unwrap();
    }

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
    fn defaults_come_from_default_toml() {
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert_eq!(s.topics, vec!["orders", "payments"]);
        assert_eq!(s.batch_max_bytes, 0);
        assert_eq!(s.group_id, "billing");
        assert_eq!(s.processor, "log");
        assert_eq!(s.commit_interval, Duration::from_millis(5000));
        assert_eq!(s.shutdown_timeout, Duration::from_millis(25000));
        assert_eq!(s.start_from, StartFrom::Earliest);
        assert_eq!(s.metric_prefix, "ackd");
        assert!(s.log_messages);
        assert_eq!(s.log_level, "info");
        assert_eq!(s.exec_command, None);
        assert_eq!(s.exec_concurrency, 1);
        assert_eq!(s.exec_timeout, Duration::from_millis(15000));
        assert_eq!(s.exec_max_line_bytes, 65536);
        assert_eq!(s.batch_max_messages, 1);
        assert_eq!(s.batch_max_wait, Duration::from_millis(100));
        assert_eq!(
            s.rdkafka["partition.assignment.strategy"].value,
            "cooperative-sticky"
        );
    }

    #[test]
    fn environment_overrides_defaults() {
        let s = Settings::from_vars(vars(&[
            ("ACKD_COMMIT_INTERVAL_MS", "250"),
            ("ACKD_START_FROM", "latest"),
            ("ACKD_LOG_MESSAGES", "false"),
            ("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "6000"),
            ("ACKD_RDKAFKA_PARTITION_ASSIGNMENT_STRATEGY", "range"),
        ]))
        .unwrap();
        assert_eq!(s.commit_interval, Duration::from_millis(250));
        assert_eq!(s.start_from, StartFrom::Latest);
        assert!(!s.log_messages);
        assert_eq!(s.rdkafka["session.timeout.ms"].value, "6000");
        assert_eq!(
            s.rdkafka["session.timeout.ms"].origin,
            "ACKD_RDKAFKA_SESSION_TIMEOUT_MS"
        );
        assert_eq!(s.rdkafka["partition.assignment.strategy"].value, "range");
    }

    #[test]
    fn missing_required_settings_are_named() {
        for name in ["KAFKA_URL", "ACKD_TOPICS", "ACKD_GROUP_ID"] {
            let mut v = vars(&[]);
            v.retain(|(k, _)| k != name);
            let e = Settings::from_vars(v).unwrap_err();
            assert_eq!(e.setting, name);
            assert!(e.problem.contains("required"), "{e}");
        }
        assert_eq!(err(&[("ACKD_TOPICS", " , ")]).setting, "ACKD_TOPICS");
    }

    #[test]
    fn missing_required_settings_are_named_together() {
        let e = Settings::from_vars(Vec::new()).unwrap_err();
        assert_eq!(e.setting, "KAFKA_URL,ACKD_TOPICS,ACKD_GROUP_ID");
        assert_eq!(e.value, None);
        for name in ["KAFKA_URL: ", "ACKD_TOPICS: ", "ACKD_GROUP_ID: "] {
            assert!(e.problem.contains(name), "{e}");
        }
        let mut v = vars(&[("ACKD_PROCESSOR", "EXEC"), ("ACKD_EXEC_COMMAND", "  ")]);
        v.retain(|(k, _)| k != "ACKD_GROUP_ID");
        let e = Settings::from_vars(v).unwrap_err();
        assert_eq!(e.setting, "ACKD_GROUP_ID,ACKD_EXEC_COMMAND");
        // Alone, a processor's requirement is the processor's to report.
        assert!(Settings::from_vars(vars(&[("ACKD_PROCESSOR", "http")])).is_ok());
    }

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

    #[test]
    fn invalid_values_name_the_setting_and_what_is_allowed() {
        for (name, value, allowed) in [
            ("ACKD_COMMIT_INTERVAL_MS", "5s", "milliseconds"),
            ("ACKD_COMMIT_INTERVAL_MS", "0", "from 1"),
            ("ACKD_SHUTDOWN_TIMEOUT_MS", "-1", "milliseconds"),
            ("ACKD_START_FROM", "beginning", "earliest or latest"),
            ("ACKD_LOG_MESSAGES", "maybe", "true or false"),
            ("ACKD_LOG_LEVEL", "loud", "info"),
            ("ACKD_EXEC_CONCURRENCY", "0", "from 1 to 256"),
            ("ACKD_EXEC_TIMEOUT_MS", "30s", "milliseconds"),
            ("ACKD_EXEC_MAX_LINE_BYTES", "64k", "from 256 to 16777216"),
            ("ACKD_EXEC_MAX_LINE_BYTES", "100", "bytes from 256"),
            ("ACKD_METRIC_PREFIX", "my app", "l2met"),
            ("ACKD_TOPICS", "ok,bad topic", "valid topic name"),
            ("KAFKA_URL", "localhost", "no port"),
        ] {
            let e = err(&[(name, value)]);
            assert_eq!(e.setting, name, "{e}");
            assert_eq!(e.value.as_deref(), Some(value), "{e}");
            assert!(e.problem.contains(allowed), "{e}");
        }
    }

    #[cfg(feature = "testkit")]
    #[test]
    fn test_delay_is_a_number_or_a_random_range() {
        use crate::config::delay::Delay;
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert_eq!(s.test_delay, Delay::default());
        let s = Settings::from_vars(vars(&[("ACKD_TEST_DELAY_MS", "400")])).unwrap();
        assert_eq!(s.test_delay, Delay::fixed(400));
        let s = Settings::from_vars(vars(&[("ACKD_TEST_DELAY_MS", "0-5")])).unwrap();
        assert_eq!(s.test_delay, Delay::parse("0-5", 5).unwrap());
        assert_eq!(s.test_delay.mean(), Duration::from_micros(2500));
        let e = err(&[("ACKD_TEST_DELAY_MS", "5-0")]);
        assert_eq!(e.setting, "ACKD_TEST_DELAY_MS", "{e}");
        assert!(e.problem.contains("MIN-MAX"), "{e}");
    }

    #[test]
    fn failure_policy_settings_are_checked_together() {
        let e = err(&[("ACKD_ON_FAILURE", "dead-letter")]);
        assert_eq!(e.setting, "ACKD_DEAD_LETTER_TOPIC");
        let e = err(&[("ACKD_ON_FAILURE", "drop")]);
        assert!(e.problem.contains("halt, skip or dead-letter"), "{e}");
        let e = err(&[
            ("ACKD_RETRY_INITIAL_MS", "5000"),
            ("ACKD_RETRY_MAX_MS", "100"),
        ]);
        assert_eq!(e.setting, "ACKD_RETRY_MAX_MS");
        let e = err(&[("ACKD_RETRY_MAX_ATTEMPTS", "0")]);
        assert_eq!(e.setting, "ACKD_RETRY_MAX_ATTEMPTS");
        let e = err(&[
            ("ACKD_ON_FAILURE", "dead-letter"),
            ("ACKD_DEAD_LETTER_TOPIC", "orders"),
        ]);
        assert!(e.problem.contains("ACKD_TOPICS"), "{e}");
        let s = Settings::from_vars(vars(&[
            ("ACKD_ON_FAILURE", "dead-letter"),
            ("ACKD_DEAD_LETTER_TOPIC", "orders.dlq"),
        ]))
        .unwrap();
        assert_eq!(s.dead_letter_topic.as_deref(), Some("orders.dlq"));
        assert_eq!(s.retry.max_attempts, 5);
    }

    #[test]
    fn static_membership_is_off_by_default_and_takes_dyno_then_the_host_name() {
        let s = Settings::from_vars(vars(&[("DYNO", "consumer.1")])).unwrap();
        assert_eq!(s.group_instance_id, None, "opt-in only");

        let on = [("ACKD_STATIC_MEMBERSHIP", "true")];
        let s = Settings::from_vars(vars(&[on[0], ("DYNO", "consumer.1"), ("HOSTNAME", "h1")]))
            .unwrap();
        assert_eq!(s.group_instance_id.as_deref(), Some("consumer.1"));
        let s = Settings::from_vars(vars(&[on[0], ("HOSTNAME", "worker-7.internal")])).unwrap();
        assert_eq!(s.group_instance_id.as_deref(), Some("worker-7.internal"));
        // Neither: the kernel's host name.
        let s = Settings::from_vars(vars(&on)).unwrap();
        assert_eq!(
            s.group_instance_id,
            read_hostname().map(|h| h.trim().to_string())
        );

        let e = err(&[on[0], ("DYNO", "consumer 1")]);
        assert_eq!(e.setting, "ACKD_STATIC_MEMBERSHIP", "{e}");
        assert!(
            e.problem.contains("DYNO") && e.problem.contains("`consumer 1`"),
            "{e}"
        );
        let e = err(&[("ACKD_STATIC_MEMBERSHIP", "sometimes")]);
        assert!(e.problem.contains("true or false"), "{e}");
    }

    #[test]
    fn static_membership_maps_to_group_instance_id_which_ackd_owns() {
        let s = Settings::from_vars(vars(&[
            ("ACKD_STATIC_MEMBERSHIP", "true"),
            ("DYNO", "consumer.2"),
        ]))
        .unwrap();
        let config = crate::config::client_config::consumer_config(&s);
        assert_eq!(config.get("group.instance.id"), Some("consumer.2"));
        let dynamic = Settings::from_vars(vars(&[("DYNO", "consumer.2")])).unwrap();
        assert_eq!(
            crate::config::client_config::consumer_config(&dynamic).get("group.instance.id"),
            None
        );

        let e = err(&[("ACKD_RDKAFKA_GROUP_INSTANCE_ID", "me")]);
        assert_eq!(e.setting, "ACKD_RDKAFKA_GROUP_INSTANCE_ID");
        assert!(e.problem.contains("ACKD_STATIC_MEMBERSHIP"), "{e}");
    }

    #[test]
    fn a_memory_budget_is_off_by_default_and_owns_the_prefetch_limits() {
        assert_eq!(Settings::from_vars(vars(&[])).unwrap().memory_mb, 0);
        let s = Settings::from_vars(vars(&[("ACKD_MEMORY_MB", "64")])).unwrap();
        assert_eq!(s.memory_mb, 64);
        let e = err(&[("ACKD_MEMORY_MB", "lots")]);
        assert_eq!(e.setting, "ACKD_MEMORY_MB");
        // A limit set by hand would be overridden silently: refused, naming both.
        let e = err(&[
            ("ACKD_MEMORY_MB", "64"),
            ("ACKD_RDKAFKA_QUEUED_MAX_MESSAGES_KBYTES", "4096"),
        ]);
        assert_eq!(e.setting, "ACKD_RDKAFKA_QUEUED_MAX_MESSAGES_KBYTES");
        assert!(e.problem.contains("ACKD_MEMORY_MB=64"), "{e}");
        // Without a budget it is an ordinary pass-through; ackd's own default is no conflict.
        assert!(
            Settings::from_vars(vars(&[("ACKD_RDKAFKA_QUEUED_MAX_MESSAGES_KBYTES", "4096")]))
                .is_ok()
        );
        assert!(Settings::from_vars(vars(&[
            ("ACKD_MEMORY_MB", "64"),
            ("ACKD_RDKAFKA_FETCH_MAX_BYTES", "1048576"),
        ]))
        .is_ok());
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

    #[test]
    fn unknown_ackd_variables_are_refused() {
        let e = err(&[("ACKD_COMMIT_INTERVAL", "100")]);
        assert_eq!(e.setting, "ACKD_COMMIT_INTERVAL");
        assert!(e.problem.contains("ACKD_COMMIT_INTERVAL_MS"), "{e}");
    }

    #[test]
    fn owned_properties_cannot_be_passed_through() {
        let e = err(&[("ACKD_RDKAFKA_ENABLE_AUTO_COMMIT", "true")]);
        assert_eq!(e.setting, "ACKD_RDKAFKA_ENABLE_AUTO_COMMIT");
        assert!(e.problem.contains("ackd owns"), "{e}");
        let e = err(&[("ACKD_RDKAFKA_GROUP_ID", "x")]);
        assert!(e.problem.contains("ACKD_GROUP_ID"), "{e}");
        let e = err(&[("ACKD_RDKAFKA_SESSION____TIMEOUT", "1")]);
        assert!(e.problem.contains("underscores"), "{e}");
    }

    #[test]
    fn secrets_never_show() {
        let s = Settings::from_vars(vars(&[("ACKD_RDKAFKA_SASL_PASSWORD", "hunter2")])).unwrap();
        let summary = s.rdkafka_shown();
        let debug = format!("{s:?}");
        assert!(!summary.contains("hunter2"), "{summary}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(summary.contains("sasl.password=[redacted]"));
    }

    /// Every property librdkafka 2.12.1 marks `_RK_SENSITIVE` (rdkafka_env::SENSITIVE):
    /// never shown, registered for scrubbing (issue 19, item 9). The passphrase and the
    /// key file of the OAUTHBEARER assertion were shown before: no word of the old list
    /// matched them.
    #[test]
    fn every_property_librdkafka_marks_sensitive_is_a_secret() {
        for listed in [
            "sasl.oauthbearer.assertion.private.key.passphrase",
            "sasl.oauthbearer.assertion.private.key.file",
        ] {
            assert!(rdkafka_env::SENSITIVE.contains(&listed), "{listed}");
        }
        for property in rdkafka_env::SENSITIVE {
            assert!(is_secret_property(property), "{property}");
            let var = rdkafka_env::env_for_property(property);
            let value = format!("Zq{}Zq", property.len());
            let s = Settings::from_vars(vars(&[(&var, &value)]))
                .unwrap_or_else(|e| panic!("{var}: {e}"));
            assert!(!s.rdkafka_shown().contains(&value), "{}", s.rdkafka_shown());
            assert!(s.never_shown().contains(&value), "{var}");
        }
        // The conservative fallback: a property a later librdkafka adds with a telling name.
        for property in [
            "sasl.some.new.passphrase",
            "https.client.private.key",
            "sasl.oauthbearer.token.new",
        ] {
            assert!(is_secret_property(property), "{property}");
        }
        for property in ["session.timeout.ms", "client.id", "sasl.mechanisms"] {
            assert!(!is_secret_property(property), "{property}");
        }
    }

    /// The variables an exec child does not get (issue 19, item 11): ackd's own
    /// credentials; what is no credential stays.
    #[test]
    fn secret_variables_are_told_apart() {
        for (name, value) in [
            ("KAFKA_URL", "kafka+sasl-ssl://u:p@h:1"),
            ("ACKD_SASL_PASSWORD", "p"),
            ("ACKD_SASL_USERNAME", "u"),
            ("ACKD_sasl_password", "p"),
            ("KAFKA_CLIENT_CERT_KEY", "-----BEGIN PRIVATE KEY-----"),
            ("ACKD_HTTP_HEADERS", "Authorization: Bearer t"),
            ("ACKD_HTTP_URL", "https://u:p@h/"),
            ("ACKD_RDKAFKA_SASL_PASSWORD", "p"),
            (
                "ACKD_RDKAFKA_SASL_OAUTHBEARER_ASSERTION_PRIVATE_KEY_PASSPHRASE",
                "p",
            ),
        ] {
            assert!(is_secret_variable(name, value), "{name}");
        }
        for (name, value) in [
            ("KAFKA_URL", "kafka+ssl://h:1"),
            ("ACKD_HTTP_URL", "https://h/"),
            ("KAFKA_CLIENT_CERT", "-----BEGIN CERTIFICATE-----"),
            ("ACKD_TOPICS", "orders"),
            ("ACKD_RDKAFKA_CLIENT_ID", "x"),
            ("PATH", "/usr/bin"),
        ] {
            assert!(!is_secret_variable(name, value), "{name}");
        }
    }

    #[test]
    fn exec_pass_secrets_names_secret_variables_only() {
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert!(s.exec_pass_secrets.is_empty());
        let s = Settings::from_vars(vars(&[(
            "ACKD_EXEC_PASS_SECRETS",
            " KAFKA_URL, ACKD_RDKAFKA_SASL_PASSWORD ,",
        )]))
        .unwrap();
        assert_eq!(
            s.exec_pass_secrets,
            ["KAFKA_URL", "ACKD_RDKAFKA_SASL_PASSWORD"]
        );
        // Named as ackd reads it: any case after ACKD_.
        let s =
            Settings::from_vars(vars(&[("ACKD_EXEC_PASS_SECRETS", "ACKD_sasl_Password")])).unwrap();
        assert_eq!(s.exec_pass_secrets, ["ACKD_SASL_PASSWORD"]);
        for bad in [
            "KAFKA_URLL",
            "ACKD_TOPICS",
            "ACKD_RDKAFKA_CLIENT_ID",
            "PATH",
        ] {
            let e = err(&[("ACKD_EXEC_PASS_SECRETS", bad)]);
            assert_eq!(e.setting, "ACKD_EXEC_PASS_SECRETS", "{bad}");
            assert!(e.problem.contains("KAFKA_CLIENT_CERT_KEY"), "{e}");
        }
    }

    /// What can be known secret is known before validation, so that an error line cannot
    /// carry it either (issue 19, item 10).
    #[test]
    fn secrets_are_known_even_when_the_settings_are_invalid() {
        let raw = vars(&[
            ("KAFKA_URL", "kafka+sasl-ssl://us%65r1:pa%22ss,w\\d@h:1,x"),
            ("ACKD_SASL_PASSWORD", "sasl-pw-1"),
            ("ACKD_sasl_username", "sasl-user-1"),
            (
                "ACKD_HTTP_HEADERS",
                "Authorization: Bearer tok-1\nX-Other: tok-2",
            ),
            ("ACKD_HTTP_URL", "https://u:url-pw-1@h/"),
            (
                "KAFKA_CLIENT_CERT_KEY",
                "-----BEGIN PRIVATE KEY-----\nAAAA\n",
            ),
            ("ACKD_RDKAFKA_SASL_OAUTHBEARER_CLIENT_SECRET", "oauth-1"),
            ("ACKD_RDKAFKA_CLIENT_ID", "not-secret"),
            ("ACKD_ORDERING", "sideways"),
        ]);
        assert!(Settings::from_vars(raw.clone()).is_err());
        let known = never_shown_in_vars(raw);
        for secret in [
            "user1",
            "us%65r1",
            "pa\"ss,w\\d",
            "pa%22ss,w\\d",
            "sasl-pw-1",
            "sasl-user-1",
            "Bearer tok-1",
            "tok-1",
            "tok-2",
            "url-pw-1",
            "oauth-1",
        ] {
            assert!(known.iter().any(|k| k == secret), "{secret}: {known:?}");
        }
        assert!(known.iter().any(|k| k.contains("AAAA")), "{known:?}");
        assert!(!known.iter().any(|k| k == "not-secret"), "{known:?}");
        let known =
            never_shown_in_vars(vars(&[("ACKD_HTTP_HEADERS", "User-Agent: ackd consumer")]));
        assert!(!known.iter().any(|k| k == "consumer"), "{known:?}");
    }

    #[test]
    fn http_settings_parse_and_header_values_never_show() {
        let s = Settings::from_vars(vars(&[
            ("ACKD_HTTP_URL", "https://hooks.example.com/kafka"),
            ("ACKD_HTTP_BODY", "RAW"),
            (
                "ACKD_HTTP_HEADERS",
                "Authorization: Bearer hunter2-token\r\n\nX-Tenant:  acme \n",
            ),
            ("ACKD_HTTP_CONCURRENCY", "4"),
            ("ACKD_HTTP_TIMEOUT_MS", "1500"),
        ]))
        .unwrap();
        assert_eq!(
            s.http_url.as_ref().unwrap().0.host_str(),
            Some("hooks.example.com")
        );
        assert_eq!(s.http_body, HttpBody::Raw);
        let names: Vec<&str> = s.http_headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["Authorization", "X-Tenant"]);
        assert_eq!(s.http_headers[0].1.expose(), "Bearer hunter2-token");
        assert_eq!(s.http_headers[1].1.expose(), "acme");
        assert_eq!(s.http_concurrency, 4);
        assert_eq!(s.http_timeout, Duration::from_millis(1500));
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(s
            .never_shown()
            .contains(&"Bearer hunter2-token".to_string()));
        // The defaults.
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert_eq!(
            (s.http_url.is_none(), s.http_body, s.http_headers.len()),
            (true, HttpBody::Json, 0)
        );
        assert_eq!(s.http_concurrency, 16);
        assert_eq!(s.http_timeout, Duration::from_secs(15));

        for bad in [
            "Bearer hunter2-token",
            "Bad Name: hunter2-token",
            "Ackd-Offset: hunter2-token",
            "Content-Length: 5",
        ] {
            let e = err(&[("ACKD_HTTP_HEADERS", bad)]);
            assert_eq!(e.setting, "ACKD_HTTP_HEADERS", "{bad}");
            assert_eq!(e.value, None);
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
        let e = err(&[("ACKD_HTTP_URL", "ftp://x/")]);
        assert_eq!(e.setting, "ACKD_HTTP_URL");
        let e = err(&[("ACKD_HTTP_URL", "https://u:hunter2@/")]);
        assert_eq!(e.value, None, "{e}");
        let s = Settings::from_vars(vars(&[("ACKD_HTTP_URL", "https://u:hunter2@h/")])).unwrap();
        assert!(s.never_shown().contains(&"hunter2".to_string()));
        assert!(!format!("{s:?}").contains("hunter2"));
        assert_eq!(err(&[("ACKD_HTTP_BODY", "xml")]).setting, "ACKD_HTTP_BODY");
        assert_eq!(
            err(&[("ACKD_HTTP_CONCURRENCY", "0")]).setting,
            "ACKD_HTTP_CONCURRENCY"
        );
    }

    #[test]
    fn kafka_prefix_goes_in_front_of_every_topic_and_the_group_once() {
        let s = Settings::from_vars(vars(&[
            ("KAFKA_PREFIX", "tenant-x."),
            ("ACKD_TOPICS", "orders, tenant-x.payments"),
        ]))
        .unwrap();
        assert_eq!(s.kafka_prefix.as_deref(), Some("tenant-x."));
        assert_eq!(s.topics, vec!["tenant-x.orders", "tenant-x.payments"]);
        assert_eq!(s.group_id, "tenant-x.billing");
        // Already prefixed: not prefixed twice (the dead-letter topic will use this too).
        assert_eq!(s.prefixed("tenant-x.dlq"), "tenant-x.dlq");
        assert_eq!(s.prefixed("dlq"), "tenant-x.dlq");
        assert_eq!(s.prefixed(&s.prefixed("dlq")), "tenant-x.dlq");
        assert_eq!(with_prefix(None, "dlq"), "dlq");
        let s = Settings::from_vars(vars(&[
            ("ACKD_GROUP_ID", "tenant-x.billing"),
            ("KAFKA_PREFIX", "tenant-x."),
        ]))
        .unwrap();
        assert_eq!(s.group_id, "tenant-x.billing");
        // Empty means none.
        let s = Settings::from_vars(vars(&[("KAFKA_PREFIX", " ")])).unwrap();
        assert_eq!(s.kafka_prefix, None);
        assert_eq!(s.topics, vec!["orders", "payments"]);

        let e = err(&[("KAFKA_PREFIX", "bad prefix.")]);
        assert_eq!(e.setting, "KAFKA_PREFIX");
        assert_eq!(e.value.as_deref(), Some("bad prefix."));
        let long = "p".repeat(200);
        let e = err(&[("KAFKA_PREFIX", &long), ("ACKD_TOPICS", &"t".repeat(60))]);
        assert_eq!(e.setting, "ACKD_TOPICS");
        assert!(e.problem.contains("KAFKA_PREFIX included"), "{e}");
        let s = Settings::from_vars(vars(&[
            ("KAFKA_PREFIX", "tenant-x."),
            ("ACKD_ON_FAILURE", "dead-letter"),
            ("ACKD_DEAD_LETTER_TOPIC", "orders.dlq"),
        ]))
        .unwrap();
        assert_eq!(s.dead_letter_topic.as_deref(), Some("tenant-x.orders.dlq"));
    }

    #[test]
    fn heroku_variables_configure_mutual_tls_without_showing_a_pem() {
        use crate::config::security::tests::{assert_no_content, CA, CLIENT, CLIENT_KEY_PEM};
        let s = Settings::from_vars(vars(&[
            ("KAFKA_URL", "kafka+ssl://ec2-1.compute.amazonaws.com:9096,kafka+ssl://ec2-2.compute.amazonaws.com:9096"),
            ("KAFKA_TRUSTED_CERT", CA),
            ("KAFKA_CLIENT_CERT", CLIENT),
            ("KAFKA_CLIENT_CERT_KEY", CLIENT_KEY_PEM),
        ]))
        .unwrap();
        let tls = s.tls.as_ref().unwrap();
        assert_eq!(tls.trusted.as_ref().unwrap().count, 1);
        assert!(tls.client.is_some());
        assert_no_content(&format!("{s:?}"));
        assert_no_content(&s.rdkafka_shown());
        assert!(s.never_shown().iter().any(|v| v == CLIENT_KEY_PEM));
        assert!(s.never_shown().iter().any(|v| v == CA));
        assert_eq!(
            security::tls_summary(s.tls.as_ref()).unwrap(),
            "ca=KAFKA_TRUSTED_CERT(1),hostname_check=off,client_cert=on"
        );
    }

    #[test]
    fn sasl_settings_are_redacted_everywhere() {
        let s = Settings::from_vars(vars(&[
            ("KAFKA_URL", "kafka+sasl-ssl://b1.example.com:9092"),
            ("ACKD_SASL_MECHANISM", "SCRAM-SHA-256"),
            ("ACKD_SASL_USERNAME", "alice-user"),
            ("ACKD_SASL_PASSWORD", "hunter2-pass"),
        ]))
        .unwrap();
        assert_eq!(s.brokers.security.protocol(), "sasl_ssl");
        let shown = format!(
            "{s:?} {} {:?}",
            s.rdkafka_shown(),
            security::sasl_summary(s.sasl.as_ref())
        );
        assert!(
            !shown.contains("hunter2-pass") && !shown.contains("alice-user"),
            "{shown}"
        );
        assert!(shown.contains("mechanism=SCRAM-SHA-256"), "{shown}");
        assert!(s.never_shown().contains(&"hunter2-pass".to_string()));
        // A mismatch is an error that shows no secret.
        let e = err(&[("ACKD_SASL_PASSWORD", "hunter2-pass")]);
        assert_eq!(e.setting, "ACKD_SASL_PASSWORD");
        assert_eq!(e.value, None);
        assert!(!e.to_string().contains("hunter2"), "{e}");
        // So is a URL with credentials that cannot be parsed.
        let e = err(&[("KAFKA_URL", "kafka+sasl-ssl://u:hunter2-pass@b:x")]);
        assert_eq!(e.setting, "KAFKA_URL");
        assert_eq!(e.value, None);
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn pass_through_properties_cannot_contradict_the_security_settings() {
        use crate::config::security::tests::CA;
        let e = err(&[
            ("KAFKA_URL", "kafka+ssl://b:1"),
            ("KAFKA_TRUSTED_CERT", CA),
            ("ACKD_RDKAFKA_SSL_CA_LOCATION", "/etc/ssl/certs"),
        ]);
        assert_eq!(e.setting, "ACKD_RDKAFKA_SSL_CA_LOCATION");
        assert!(e.problem.contains("KAFKA_TRUSTED_CERT"), "{e}");
        let e = err(&[
            ("KAFKA_URL", "kafka+sasl-ssl://u:p@b:1"),
            ("ACKD_SASL_MECHANISM", "PLAIN"),
            ("ACKD_RDKAFKA_SASL_PASSWORD", "hunter2"),
        ]);
        assert_eq!(e.setting, "ACKD_RDKAFKA_SASL_PASSWORD");
        assert_eq!(e.value, None);
        // Without a pinned CA, ssl.ca.location is yours to set; the host-name check can be
        // turned back on over a pinned CA.
        let s = Settings::from_vars(vars(&[
            ("KAFKA_URL", "kafka+ssl://b:1"),
            ("ACKD_RDKAFKA_SSL_CA_LOCATION", "/etc/ssl/certs"),
        ]))
        .unwrap();
        assert!(s.tls.unwrap().trusted.is_none());
        Settings::from_vars(vars(&[
            ("KAFKA_URL", "kafka+ssl://b:1"),
            ("KAFKA_TRUSTED_CERT", CA),
            (
                "ACKD_RDKAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM",
                "https",
            ),
        ]))
        .unwrap();
    }

    #[test]
    fn the_group_protocol_is_classic_by_default_and_consumer_on_request() {
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert_eq!(s.group_protocol, GroupProtocol::Classic);
        let s = Settings::from_vars(vars(&[("ACKD_GROUP_PROTOCOL", "Consumer")])).unwrap();
        assert_eq!(s.group_protocol, GroupProtocol::Consumer);
        // ackd's own default assignor gives way: the broker assigns.
        assert!(!s.rdkafka.contains_key("partition.assignment.strategy"));
        assert_eq!(s.rdkafka["client.id"].value, "ackd");
        let s = Settings::from_vars(vars(&[
            ("ACKD_GROUP_PROTOCOL", "consumer"),
            ("ACKD_RDKAFKA_GROUP_REMOTE_ASSIGNOR", "uniform"),
        ]))
        .unwrap();
        assert_eq!(s.rdkafka["group.remote.assignor"].value, "uniform");

        let e = err(&[("ACKD_GROUP_PROTOCOL", "kip848")]);
        assert_eq!(e.setting, "ACKD_GROUP_PROTOCOL");
        assert_eq!(e.value.as_deref(), Some("kip848"));
        assert!(
            e.problem.contains("classic") && e.problem.contains("consumer"),
            "{e}"
        );
        // The pass-through cannot set what the setting sets.
        let e = err(&[("ACKD_RDKAFKA_GROUP_PROTOCOL", "consumer")]);
        assert_eq!(e.setting, "ACKD_RDKAFKA_GROUP_PROTOCOL");
        assert!(e.problem.contains("use ACKD_GROUP_PROTOCOL"), "{e}");
    }

    #[test]
    fn classic_only_properties_are_refused_under_the_consumer_protocol() {
        for (var, value, property, hint) in [
            (
                "ACKD_RDKAFKA_PARTITION_ASSIGNMENT_STRATEGY",
                "cooperative-sticky",
                "partition.assignment.strategy",
                "ACKD_RDKAFKA_GROUP_REMOTE_ASSIGNOR",
            ),
            (
                "ACKD_RDKAFKA_SESSION_TIMEOUT_MS",
                "6000",
                "session.timeout.ms",
                "group.consumer.session.timeout.ms",
            ),
            (
                "ACKD_RDKAFKA_HEARTBEAT_INTERVAL_MS",
                "300",
                "heartbeat.interval.ms",
                "group.consumer.heartbeat.interval.ms",
            ),
            (
                "ACKD_RDKAFKA_GROUP_PROTOCOL_TYPE",
                "consumer",
                "group.protocol.type",
                "classic protocol only",
            ),
        ] {
            let e = err(&[("ACKD_GROUP_PROTOCOL", "consumer"), (var, value)]);
            assert_eq!(e.setting, var);
            assert_eq!(e.value.as_deref(), Some(value));
            assert!(e.problem.contains(&format!("`{property}`")), "{e}");
            assert!(e.problem.contains(hint), "{e}");
            assert!(e.problem.contains("ACKD_GROUP_PROTOCOL=classic"), "{e}");
            // The same property is fine under classic.
            Settings::from_vars(vars(&[(var, value)])).unwrap();
        }
        // A file's assignor is the user's, not ackd's default: refused too, naming the file.
        let dir = std::env::temp_dir().join(format!("ackd-protocol-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ackd.toml");
        std::fs::write(
            &path,
            "[rdkafka]\n\"partition.assignment.strategy\" = \"range\"\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        let e = err(&[("ACKD_CONFIG_FILE", p), ("ACKD_GROUP_PROTOCOL", "consumer")]);
        assert_eq!(
            e.setting,
            format!("[rdkafka] \"partition.assignment.strategy\" in {p}")
        );
        // A file that sets other properties leaves ackd's default assignor a default.
        std::fs::write(&path, "[rdkafka]\n\"fetch.min.bytes\" = 10\n").unwrap();
        let s = Settings::from_vars(vars(&[
            ("ACKD_CONFIG_FILE", p),
            ("ACKD_GROUP_PROTOCOL", "consumer"),
        ]))
        .unwrap();
        assert!(!s.rdkafka.contains_key("partition.assignment.strategy"));
        let _ = std::fs::remove_dir_all(dir);
        // The broker's assignor means nothing to the classic protocol.
        let e = err(&[("ACKD_RDKAFKA_GROUP_REMOTE_ASSIGNOR", "uniform")]);
        assert_eq!(e.setting, "ACKD_RDKAFKA_GROUP_REMOTE_ASSIGNOR");
        assert!(e.problem.contains("ACKD_GROUP_PROTOCOL=consumer"), "{e}");
    }

    #[test]
    fn a_config_file_is_layered_between_defaults_and_environment() {
        let dir = std::env::temp_dir().join(format!("ackd-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ackd.toml");
        std::fs::write(
            &path,
            "commit_interval_ms = 1000\nstart_from = \"latest\"\n[rdkafka]\n\"fetch.min.bytes\" = 10\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        let s = Settings::from_vars(vars(&[
            ("ACKD_CONFIG_FILE", p),
            ("ACKD_START_FROM", "earliest"),
        ]))
        .unwrap();
        assert_eq!(s.commit_interval, Duration::from_millis(1000));
        assert_eq!(s.start_from, StartFrom::Earliest);
        assert_eq!(s.rdkafka["fetch.min.bytes"].value, "10");
        // The defaults' table is kept where the file's table does not say otherwise.
        assert_eq!(s.rdkafka["client.id"].value, "ackd");

        std::fs::write(&path, "commit_interval_ms = \"soon\"\n").unwrap();
        let e = err(&[("ACKD_CONFIG_FILE", p)]);
        assert!(
            e.setting
                .starts_with("ACKD_COMMIT_INTERVAL_MS (`commit_interval_ms` in"),
            "{e}"
        );
        std::fs::write(&path, "comit_interval_ms = 5\n").unwrap();
        assert!(err(&[("ACKD_CONFIG_FILE", p)])
            .setting
            .contains("comit_interval_ms"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
