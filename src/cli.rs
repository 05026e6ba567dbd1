//! Command-line arguments. ackd is configured by its environment only; arguments never
//! start consuming. `--help` and `--version` answer and exit 0, anything else exits 64
//! (EX_USAGE) with the usage. The subcommands `ackd check` and `ackd status` ask the
//! brokers and exit; they take no options (settings come from the environment).
//!
//! Hand-rolled: two flags do not need a parser crate (nor its build time); once
//! subcommands take options, lexopt is the small step up.

use std::ffi::OsString;
use std::fmt::{self, Write as _};

use crate::config::settings::{self, DefaultValue};

/// What the arguments ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// No arguments: consume, with settings from the environment.
    Run,
    /// `--help`, `-h`: every setting with its default.
    Help,
    /// `--version`, `-V`.
    Version,
    /// `check`: validate the settings, connect, authenticate, look for every topic and
    /// the group; one line per check (src/commands/check.rs).
    Check,
    /// `status`: per partition the committed offset, the log end, the lag and the member
    /// holding it (src/commands/status.rs).
    Status,
}

/// Arguments ackd does not take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError {
    pub argument: String,
    pub problem: &'static str,
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} `{}`", self.problem, self.argument)
    }
}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, UsageError> {
    let mut args = args.into_iter();
    let Some(first) = args.next() else {
        return Ok(Command::Run);
    };
    let command = match first.to_str() {
        Some("--help" | "-h" | "help") => Command::Help,
        Some("--version" | "-V") => Command::Version,
        Some("check") => Command::Check,
        Some("status") => Command::Status,
        _ => {
            return Err(UsageError {
                argument: first.to_string_lossy().into_owned(),
                problem: "unknown argument",
            })
        }
    };
    match args.next() {
        None => Ok(command),
        Some(extra) => Err(UsageError {
            argument: extra.to_string_lossy().into_owned(),
            problem: "unexpected argument",
        }),
    }
}

/// The usage: what a wrong argument is answered with (on stderr), and the head of `--help`.
pub const USAGE: &str = "\
Usage: ackd             consume the topics the environment names, until SIGTERM
       ackd check       check the settings, the brokers, the credentials, the topics and
                        the group, one line each; exit 0, or 78 / 77 / 69 as ackd would
       ackd status      per partition: committed offset, log end, lag, the member holding it
       ackd --help      every setting with its default (also -h)
       ackd --version   the version (also -V)

ackd takes its settings from environment variables only; `ackd --help` lists them.";

/// `ackd --version`: ackd's version and the librdkafka it runs on.
pub fn version() -> String {
    let (_, rdkafka) = rdkafka::util::get_rdkafka_version();
    format!("ackd {} (librdkafka {rdkafka})", env!("CARGO_PKG_VERSION"))
}

/// `ackd --help`: the usage, then every setting with its default (from
/// `config/default.toml`, see [`settings::documented`]) and what it does.
pub fn help() -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "ackd {}: a Kafka consumer daemon; at-least-once, no redelivery after a graceful stop.\n",
        env!("CARGO_PKG_VERSION")
    );
    let _ = writeln!(out, "{USAGE}\n");
    let _ = writeln!(
        out,
        "Settings (a TOML file named by ACKD_CONFIG_FILE takes the same keys, lower-cased,\n\
         without ACKD_; the environment wins). NAME  DEFAULT  MEANING:"
    );
    let rows: Vec<(String, String, &str)> = settings::documented()
        .into_iter()
        .map(|(name, default)| {
            let default = match default {
                DefaultValue::Required => "required".to_string(),
                DefaultValue::None if name.ends_with("<NAME>") => "(below)".to_string(),
                DefaultValue::None => "none".to_string(),
                DefaultValue::Value(v) => v,
            };
            let meaning = meaning(&name).unwrap_or("");
            (name, default, meaning)
        })
        .collect();
    let name_width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let default_width = rows.iter().map(|r| r.1.len()).max().unwrap_or(0);
    for (name, default, meaning) in &rows {
        let _ = writeln!(
            out,
            "  {name:name_width$}  {default:default_width$}  {meaning}"
        );
    }
    let _ = writeln!(
        out,
        "\nlibrdkafka properties ackd sets unless ACKD_RDKAFKA_<NAME> or [rdkafka] does:"
    );
    for (property, value) in settings::rdkafka_defaults() {
        let _ = writeln!(out, "    {property}={value}");
    }
    let _ = writeln!(
        out,
        "\nThe README says more: guarantees, log lines, exit codes, the exec and http processors."
    );
    out
}

/// One line per setting for `--help`; the README's settings table has the long form.
fn meaning(name: &str) -> Option<&'static str> {
    MEANINGS.iter().find(|(n, _)| *n == name).map(|(_, m)| *m)
}

const MEANINGS: &[(&str, &str)] = &[
    ("KAFKA_URL", "brokers: kafka://, kafka+ssl:// or kafka+sasl-ssl://[user:password@]host:port, comma-separated"),
    ("ACKD_TOPICS", "comma-separated topics to consume (KAFKA_PREFIX is added)"),
    ("ACKD_GROUP_ID", "the consumer group every process of the app shares (KAFKA_PREFIX is added)"),
    ("KAFKA_TRUSTED_CERT", "PEM CA certificate(s) the brokers' chain must lead to (no host-name check)"),
    ("KAFKA_CLIENT_CERT", "PEM client certificate for mutual TLS"),
    ("KAFKA_CLIENT_CERT_KEY", "its PEM private key, unencrypted; never shown"),
    ("KAFKA_PREFIX", "put in front of every topic and the group (Heroku multi-tenant plans)"),
    ("ACKD_PROCESSOR", "log | noop | exec | http: what handles each message"),
    ("ACKD_COMMIT_INTERVAL_MS", "how often acknowledged offsets are committed; bounds crash redelivery"),
    ("ACKD_SHUTDOWN_TIMEOUT_MS", "budget of a graceful stop (and of a revoked partition's drain)"),
    ("ACKD_START_FROM", "earliest | latest: where a partition without a committed offset starts"),
    ("ACKD_METRIC_PREFIX", "prefix of metric names (count#ackd.messages.processed)"),
    ("ACKD_METRIC_SOURCE", "source= of metric lines; none: the topic, or DYNO / the host name"),
    ("ACKD_METRICS_INTERVAL_MS", "how often a summary line is written; 0: never"),
    ("ACKD_LOG_MESSAGES", "one line per acknowledged message"),
    ("ACKD_LOG_LEVEL", "error | warn | info | debug | trace (RUST_LOG wins when set)"),
    ("ACKD_STOP_AT_END", "stop (commit, leave, exit 0) once every assigned partition reached its end"),
    ("ACKD_RETRY_INITIAL_MS", "first wait before a retryable failure is tried again; doubles"),
    ("ACKD_RETRY_MAX_MS", "longest wait between attempts"),
    ("ACKD_RETRY_MAX_ATTEMPTS", "attempts in all, the first included (1: no retry)"),
    ("ACKD_ON_FAILURE", "halt | skip | dead-letter: when attempts run out or a failure is permanent"),
    ("ACKD_DEAD_LETTER_TOPIC", "required with dead-letter: where failed messages go"),
    ("ACKD_STATIC_MEMBERSHIP", "true: group.instance.id = DYNO, else HOSTNAME, else the host name"),
    ("ACKD_GROUP_PROTOCOL", "classic (default) or consumer (KIP-848: the broker assigns and sets session and heartbeat)"),
    ("ACKD_CONFIG_FILE", "a TOML file layered between the defaults and the environment"),
    ("ACKD_SASL_MECHANISM", "PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512; required with kafka+sasl-ssl://"),
    ("ACKD_SASL_USERNAME", "SASL user name (or user:password@ in KAFKA_URL); never shown"),
    ("ACKD_SASL_PASSWORD", "SASL password; never shown"),
    ("ACKD_ORDERING", "partition (one message of a partition at a time), key (each key in order, keys concurrently) or none"),
    ("ACKD_CONCURRENCY", "processor calls in flight per partition with ACKD_ORDERING=key or none (1-10000)"),
    ("ACKD_MAX_PENDING", "messages a partition reads above its committable offset at most (key or none ordering)"),
    ("ACKD_BATCH_MAX_MESSAGES", "messages per processor call at most (1: no batches; up to 10000)"),
    ("ACKD_BATCH_MAX_WAIT_MS", "how long a batch waits for more once it has its first message"),
    ("ACKD_BATCH_MAX_BYTES", "key and value bytes per batch at most (0: no limit)"),
    ("ACKD_EXEC_COMMAND", "required with exec: the handler's command line, run with sh -c"),
    ("ACKD_EXEC_CONCURRENCY", "exec: handler processes (1-256)"),
    ("ACKD_EXEC_TIMEOUT_MS", "exec: how long a handler may take to answer before it is restarted"),
    ("ACKD_EXEC_MAX_LINE_BYTES", "exec: the longest line read from a handler (a longer reply is a protocol error)"),
    ("ACKD_EXEC_PASS_SECRETS", "exec: comma-separated credential variables handlers get anyway (none by default)"),
    ("ACKD_HTTP_URL", "required with http: the http:// or https:// URL each message is POSTed to"),
    ("ACKD_HTTP_BODY", "http: json | raw"),
    ("ACKD_HTTP_HEADERS", "http: `Name: value` lines added to every request; values never shown"),
    ("ACKD_HTTP_CONCURRENCY", "http: requests in flight at most (1-1024)"),
    ("ACKD_HTTP_TIMEOUT_MS", "http: how long one request may take"),
    ("ACKD_MEMORY_MB", "prefetch budget of the process in MiB, shared by the topics' partitions (0: per-partition limits)"),
    ("ACKD_WAIT_FOR_TOPICS", "true: wait for topics that do not exist yet; false: exit 78 naming them"),
    ("ACKD_HEALTH_PORT", "port of the HTTP endpoint /live, /ready, /metrics (0: off)"),
    ("ACKD_HEALTH_ADDR", "address the health endpoint listens on"),
    ("ACKD_HEALTH_STUCK_MS", "a processor call longer than this fails /live (0: its timeout + 5 s, else the drain budget)"),
    ("ACKD_RDKAFKA_<NAME>", "any librdkafka consumer property: upper-cased, . -> _, _ -> __, - -> ___"),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn flags_and_errors() {
        assert_eq!(parse(args(&[])), Ok(Command::Run));
        for a in ["--help", "-h", "help"] {
            assert_eq!(parse(args(&[a])), Ok(Command::Help));
        }
        for a in ["--version", "-V"] {
            assert_eq!(parse(args(&[a])), Ok(Command::Version));
        }
        assert_eq!(parse(args(&["check"])), Ok(Command::Check));
        assert_eq!(parse(args(&["status"])), Ok(Command::Status));
        assert_eq!(
            parse(args(&["status", "--all"])).unwrap_err().problem,
            "unexpected argument"
        );
        for bad in [
            &["-x"][..],
            &["--version=1"],
            &["run"],
            &["-hV"],
            &[""],
            &["Check"],
        ] {
            assert_eq!(parse(args(bad)).unwrap_err().problem, "unknown argument");
        }
        let e = parse(args(&["--help", "more"])).unwrap_err();
        assert_eq!(e.to_string(), "unexpected argument `more`");
        // Not UTF-8: named as well as it can be, no panic.
        use std::os::unix::ffi::OsStringExt;
        let e = parse(vec![OsString::from_vec(vec![0x66, 0xff])]).unwrap_err();
        assert_eq!(e.argument, "f\u{fffd}");
    }

    /// Every setting has a meaning and every meaning a setting: a new setting cannot
    /// be left out of --help.
    #[test]
    fn every_setting_has_a_meaning() {
        let names: Vec<String> = settings::documented().into_iter().map(|(n, _)| n).collect();
        for name in &names {
            assert!(meaning(name).is_some(), "{name} has no line in MEANINGS");
        }
        for (name, _) in MEANINGS {
            assert!(names.iter().any(|n| n == name), "{name} is no setting");
        }
        let help = help();
        assert!(help.contains("ACKD_COMMIT_INTERVAL_MS"));
        assert!(help.contains("partition.assignment.strategy=cooperative-sticky"));
    }
}
