//! The keys of the layered configuration: the compiled-in defaults, which keys exist,
//! which are required, and what `--help` says of each.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use config::{Config, File, FileFormat};

use crate::settings::kafka_url;
use crate::settings::rdkafka_env;
use crate::settings::security;

/// The defaults, compiled in so the binary behaves the same from any directory.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

/// Where an `[rdkafka]` property of ackd's compiled-in defaults comes from.
pub(super) const DEFAULT_ORIGIN: &str = "config/default.toml";

/// A setting of the layered configuration, declared once: its variable is `ACKD_` + the
/// key upper-cased (`kafka_url` comes from `KAFKA_URL`), its default is in
/// `config/default.toml`, and its field of [`super::Settings`] is set in `validate`.
pub(super) struct Key {
    pub(super) key: &'static str,
    /// `Some(what)`: no default, ackd does not start without it (`is required: <what>`).
    pub(super) required: Option<&'static str>,
    /// Its line in `ackd --help`; docs/settings.md has the long form.
    pub(super) help: &'static str,
}

/// Every key, in the order `--help` lists them (the testkit's are left out there).
pub(super) const KEYS: &[Key] = &[
    Key {
        key: "kafka_url",
        required: Some(kafka_url::ALLOWED),
        help: "brokers: kafka://, kafka+ssl:// or kafka+sasl-ssl://[user:password@]host:port, comma-separated",
    },
    Key {
        key: "topics",
        required: Some("comma-separated topic names"),
        help: "comma-separated topics to consume (KAFKA_PREFIX is added)",
    },
    Key {
        key: "group_id",
        required: Some("the consumer group that this app's consumers share"),
        help: "the consumer group every process of the app shares (KAFKA_PREFIX is added)",
    },
    Key {
        key: "processor",
        required: None,
        help: "log | noop | exec | http: what handles each message",
    },
    Key {
        key: "commit_interval_ms",
        required: None,
        help: "how often acknowledged offsets are committed; bounds crash redelivery",
    },
    Key {
        key: "redelivery_window_max",
        required: None,
        help: "messages a partition may start beyond its last accepted commit at most: bounds the window a crash flags as possible repeats (1000-100000000)",
    },
    Key {
        key: "shutdown_timeout_ms",
        required: None,
        help: "budget of a graceful stop (and of a revoked partition's drain)",
    },
    Key {
        key: "start_from",
        required: None,
        help: "earliest | latest: where a partition without a committed offset starts",
    },
    Key {
        key: "metric_prefix",
        required: None,
        help: "prefix of metric names (count#ackd.messages.processed)",
    },
    Key {
        key: "metric_source",
        required: None,
        help: "source= of metric lines; none: the topic, or DYNO / the host name",
    },
    Key {
        key: "metrics_interval_ms",
        required: None,
        help: "how often a summary line is written; 0: never",
    },
    Key {
        key: "log_messages",
        required: None,
        help: "one line per acknowledged message",
    },
    Key {
        key: "log_level",
        required: None,
        help: "error | warn | info | debug | trace (RUST_LOG wins when set)",
    },
    Key {
        key: "stop_at_end",
        required: None,
        help: "stop (commit, leave, exit 0) once every assigned partition reached its end",
    },
    Key {
        key: "retry_initial_ms",
        required: None,
        help: "first wait before a retryable failure is tried again; doubles",
    },
    Key {
        key: "retry_max_ms",
        required: None,
        help: "longest wait between attempts",
    },
    Key {
        key: "retry_max_attempts",
        required: None,
        help: "attempts in all, the first included (1: no retry)",
    },
    Key {
        key: "on_failure",
        required: None,
        help: "halt | skip | dead-letter: when attempts run out or a failure is permanent",
    },
    Key {
        key: "dead_letter_topic",
        required: None,
        help: "required with dead-letter: where failed messages go",
    },
    Key {
        key: "retry_topics",
        required: None,
        help: "delays of retry tiers, e.g. 10s,1m,10m: a retryable failure goes to <topic>.retry.<delay>, processed after the delay (empty: off, retries in place)",
    },
    Key {
        key: "static_membership",
        required: None,
        help: "true: group.instance.id = DYNO, else HOSTNAME, else the host name",
    },
    Key {
        key: "group_protocol",
        required: None,
        help: "classic (default) or consumer (KIP-848: the broker assigns and sets session and heartbeat)",
    },
    Key {
        key: "config_file",
        required: None,
        help: "a TOML file layered between the defaults and the environment",
    },
    Key {
        key: "sasl_mechanism",
        required: None,
        help: "PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512; required with kafka+sasl-ssl://",
    },
    Key {
        key: "sasl_username",
        required: None,
        help: "SASL user name (or user:password@ in KAFKA_URL); never shown",
    },
    Key {
        key: "sasl_password",
        required: None,
        help: "SASL password; never shown",
    },
    Key {
        key: "ordering",
        required: None,
        help: "partition (one message of a partition at a time), key (each key in order, keys concurrently) or none",
    },
    Key {
        key: "concurrency",
        required: None,
        help: "processor calls in flight per partition with ACKD_ORDERING=key or none (1-10000)",
    },
    Key {
        key: "max_pending",
        required: None,
        help: "messages a partition reads above its committable offset at most (key or none ordering)",
    },
    Key {
        key: "batch_max_messages",
        required: None,
        help: "messages per processor call at most (1: no batches; up to 10000)",
    },
    Key {
        key: "batch_max_wait_ms",
        required: None,
        help: "how long a batch waits for more once it has its first message",
    },
    Key {
        key: "batch_max_bytes",
        required: None,
        help: "key and value bytes per batch at most (0: no limit)",
    },
    Key {
        key: "delay_ms",
        required: None,
        help: "process a message no earlier than its timestamp plus this, its partition waiting in order (0: off; up to 604800000, 7 days)",
    },
    Key {
        key: "exec_command",
        required: None,
        help: "required with exec: the handler's command line, run with sh -c",
    },
    Key {
        key: "exec_concurrency",
        required: None,
        help: "exec: handler processes (1-256)",
    },
    Key {
        key: "exec_in_flight",
        required: None,
        help: "exec: requests one handler process holds at once, answered in any order (1-1000)",
    },
    Key {
        key: "exec_concurrency_mode",
        required: None,
        help: "exec: fixed | adaptive: a limit of requests in flight, up to concurrency x in_flight, that grows while the handler keeps up and shrinks on retry replies, timeouts or rising latency",
    },
    Key {
        key: "exec_timeout_ms",
        required: None,
        help: "exec: how long a handler may take to answer before it is restarted",
    },
    Key {
        key: "exec_max_line_bytes",
        required: None,
        help: "exec: the longest line read from a handler (a longer reply is a protocol error)",
    },
    Key {
        key: "exec_pass_secrets",
        required: None,
        help: "exec: comma-separated credential variables handlers get anyway (none by default)",
    },
    Key {
        key: "http_url",
        required: None,
        help: "required with http: the http:// or https:// URL each message is POSTed to",
    },
    Key {
        key: "http_body",
        required: None,
        help: "http: json | raw",
    },
    Key {
        key: "http_headers",
        required: None,
        help: "http: `Name: value` lines added to every request; values never shown",
    },
    Key {
        key: "http_concurrency",
        required: None,
        help: "http: requests in flight at most (1-1024); with adaptive, the limit's upper bound",
    },
    Key {
        key: "http_concurrency_mode",
        required: None,
        help: "http: fixed | adaptive: a limit that grows while the endpoint keeps up and shrinks on 429, 503, timeouts or rising latency",
    },
    Key {
        key: "http_timeout_ms",
        required: None,
        help: "http: how long one request may take",
    },
    Key {
        key: "value_format",
        required: None,
        help: "raw | schema-registry | avro | protobuf | json-schema: how values are read (decoded to JSON with the registry's schema)",
    },
    Key {
        key: "key_format",
        required: None,
        help: "raw | schema-registry | avro | protobuf | json-schema: how keys are read",
    },
    Key {
        key: "schema_registry_url",
        required: None,
        help: "required with a format other than raw: the Schema Registry's http(s) URL(s), comma-separated, [user:password@] allowed",
    },
    Key {
        key: "schema_registry_user",
        required: None,
        help: "the registry's basic-auth user (Confluent Cloud: the API key); never shown",
    },
    Key {
        key: "schema_registry_password",
        required: None,
        help: "the registry's basic-auth password (Confluent Cloud: the API secret); never shown",
    },
    Key {
        key: "schema_raw_bytes",
        required: None,
        help: "true: decoded keys and values come with their raw bytes too (value_raw_base64)",
    },
    Key {
        key: "wait_for_topics",
        required: None,
        help: "true: wait for topics that do not exist yet; false: exit 78 naming them",
    },
    Key {
        key: "health_port",
        required: None,
        help: "port of the HTTP endpoint /live, /ready, /metrics (0: off)",
    },
    Key {
        key: "health_addr",
        required: None,
        help: "address the health endpoint listens on",
    },
    Key {
        key: "health_stuck_ms",
        required: None,
        help: "a processor call longer than this fails /live (0: its timeout + 5 s, else the drain budget)",
    },
    Key {
        key: "memory_mb",
        required: None,
        help: "auto | off | MiB: memory budget of the process, shared by the topics' partitions (auto: a quarter of the cgroup's memory limit, else 320)",
    },
    #[cfg(feature = "testkit")]
    Key {
        key: "test_delay_ms",
        required: None,
        help: "",
    },
];

/// The platform's variables read as they are (not layered: they come from the
/// environment only, e.g. Heroku's Kafka add-on).
pub(super) const KAFKA_VARS: &[(&str, &str)] = &[
    (
        security::TRUSTED_CERT,
        "PEM CA certificate(s) the brokers' chain must lead to (no host-name check)",
    ),
    (
        security::CLIENT_CERT,
        "PEM client certificate for mutual TLS",
    ),
    (
        security::CLIENT_KEY,
        "its PEM private key, unencrypted; never shown",
    ),
    (
        "KAFKA_PREFIX",
        "put in front of every topic and the group (Heroku multi-tenant plans)",
    ),
];

/// The `--help` line of the pass-through, `ACKD_RDKAFKA_<NAME>`.
const RDKAFKA_HELP: &str =
    "any librdkafka consumer property: upper-cased, . -> _, _ -> __, - -> ___";

/// The environment variable for a configuration key.
pub(super) fn env_name(key: &str) -> String {
    if key == "kafka_url" {
        "KAFKA_URL".into()
    } else {
        format!("ACKD_{}", key.to_ascii_uppercase())
    }
}

/// A setting's default, for `ackd --help`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DefaultValue {
    /// No default: ackd does not start without it.
    Required,
    /// Unset (or empty) unless given.
    None,
    Value(String),
}

/// The key `name` names (lower case), if it is one.
pub(super) fn key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.key == name)
}

/// What to give for the required `key`, for `is required: <what>`.
pub(super) fn required_what(key: &str) -> &'static str {
    self::key(key).and_then(|k| k.required).unwrap_or("")
}

/// `config/default.toml`, parsed once: the defaults `--help` and the checks look up
/// (`None` if it did not parse, which the tests rule out).
pub(super) fn default_config() -> Option<&'static Config> {
    static DEFAULTS: OnceLock<Option<Config>> = OnceLock::new();
    DEFAULTS
        .get_or_init(|| {
            Config::builder()
                .add_source(File::from_str(DEFAULT_TOML, FileFormat::Toml))
                .build()
                .ok()
        })
        .as_ref()
}

/// Every setting a user can give (environment variable names), in the order `--help`
/// lists them, with its default as `config/default.toml` has it: the same source the
/// settings are layered on, so the list cannot drift from what ackd does. The
/// testkit's settings are left out; `ACKD_RDKAFKA_<NAME>` stands for the pass-through.
pub fn documented() -> Vec<(String, DefaultValue)> {
    let default_of = |key: &Key| -> DefaultValue {
        if key.required.is_some() {
            return DefaultValue::Required;
        }
        match default_config().and_then(|c| c.get_string(key.key).ok()) {
            Some(v) if !v.trim().is_empty() => DefaultValue::Value(v),
            _ => DefaultValue::None,
        }
    };
    let mut names: Vec<(String, DefaultValue)> = Vec::new();
    for key in KEYS.iter().filter(|k| k.key != "test_delay_ms") {
        names.push((env_name(key.key), default_of(key)));
        // The platform's variables right after the required ones, as in docs/settings.md.
        if key.key == "group_id" {
            names.extend(
                KAFKA_VARS
                    .iter()
                    .map(|(v, _)| (v.to_string(), DefaultValue::None)),
            );
        }
    }
    names.push((format!("{}<NAME>", rdkafka_env::PREFIX), DefaultValue::None));
    names
}

/// The `--help` line of a [`documented`] variable; `None` for any other name.
pub fn help_line(name: &str) -> Option<&'static str> {
    if name == format!("{}<NAME>", rdkafka_env::PREFIX) {
        return Some(RDKAFKA_HELP);
    }
    if let Some((_, help)) = KAFKA_VARS.iter().find(|(v, _)| *v == name) {
        return Some(help);
    }
    KEYS.iter()
        .find(|k| k.key != "test_delay_ms" && env_name(k.key) == name)
        .map(|k| k.help)
}

/// The librdkafka properties `config/default.toml` sets, with their values.
pub fn rdkafka_defaults() -> Vec<(String, String)> {
    default_config()
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
    use crate::settings::test_vars::vars;
    use crate::settings::Settings;

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
