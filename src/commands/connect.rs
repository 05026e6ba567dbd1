//! The commands' client: created from the settings, it asks the brokers (metadata,
//! partitions) and never joins the group ([`connect`] waits for them to answer).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::metadata::Metadata;
use rdkafka::ClientConfig;

use crate::consumer::auth::AuthFailures;
use crate::exit;
use crate::settings::client_config::base_config;
use crate::settings::Settings;

/// How long the brokers may stay unreachable before a command gives up (exit 69).
pub const CONNECT_BOUND: Duration = Duration::from_secs(12);
/// One request's timeout once the brokers answered.
pub(crate) const REQUEST: Duration = Duration::from_secs(10);

/// The context of a command's client: authentication failures end the command (77);
/// other errors (a broker that is down) are only remembered, for the final line.
pub struct ProbeContext {
    auth: AuthFailures,
    last_error: Mutex<Option<String>>,
}

impl ClientContext for ProbeContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        // librdkafka's own lines would bury the one line per check: debug only.
        tracing::debug!(target: "librdkafka", ?level, facility = fac, "{log_message}");
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if !self.auth.observe(&error, reason) {
            tracing::debug!(at = "kafka_error", error = %error, reason);
            if let Ok(mut last) = self.last_error.lock() {
                *last = Some(reason.to_string());
            }
        }
    }
}

impl ConsumerContext for ProbeContext {}

pub type Probe = BaseConsumer<ProbeContext>;

/// A client for asking: the group's id (for committed offsets and its description), but
/// no subscription, no assignment, no commits.
pub fn probe_config(settings: &Settings, name: &str) -> ClientConfig {
    let mut config = base_config(settings);
    if config.get("client.id").is_none() {
        config.set("client.id", format!("ackd-{name}"));
    }
    config
        .set("group.id", &settings.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("allow.auto.create.topics", "false");
    config
}

/// Creates the client; an `Err` is the exit code (a configuration librdkafka refused:
/// 78, with the config_error line).
pub fn create(settings: &Settings, name: &str) -> Result<Probe, i32> {
    let context = ProbeContext {
        auth: AuthFailures::new(settings.tls.as_ref().is_some_and(|t| t.client.is_some())),
        last_error: Mutex::new(None),
    };
    probe_config(settings, name)
        .create_with_context(context)
        .map_err(|e| crate::consumer::daemon::report_client_error(settings, e))
}

/// Why the brokers could not be asked.
pub enum Unreached {
    /// Authentication failed (the `at=auth_failed` line was written): exit 77.
    Auth,
    /// No answer within [`CONNECT_BOUND`]: exit 69.
    Unavailable { waited: Duration, error: String },
}

impl Unreached {
    pub fn code(&self) -> i32 {
        match self {
            Unreached::Auth => exit::NOPERM,
            Unreached::Unavailable { .. } => exit::UNAVAILABLE,
        }
    }
}

/// Asks for `topic`'s metadata (one topic: a shared cluster's other topics are none of
/// ackd's business) until the brokers answer, authentication fails, or [`CONNECT_BOUND`]
/// passes. Short attempts with polls between them: librdkafka reports
/// authentication failures through the error callback, which only a poll serves.
pub fn connect(probe: &Probe, topic: Option<&str>) -> Result<(Metadata, Duration), Unreached> {
    let started = Instant::now();
    loop {
        let attempt = Duration::from_secs(1).min(CONNECT_BOUND.saturating_sub(started.elapsed()));
        let result = probe.fetch_metadata(topic, attempt);
        // Serves error events (auth failures); a message cannot come: nothing is assigned.
        let _ = probe.poll(Duration::ZERO);
        if probe.context().auth.failed() {
            return Err(Unreached::Auth);
        }
        match result {
            Ok(metadata) if !metadata.brokers().is_empty() => {
                return Ok((metadata, started.elapsed()))
            }
            Ok(_) => {}
            Err(e) => {
                if let Ok(mut last) = probe.context().last_error.lock() {
                    last.get_or_insert_with(|| e.to_string());
                }
            }
        }
        if started.elapsed() >= CONNECT_BOUND {
            let error = probe
                .context()
                .last_error
                .lock()
                .ok()
                .and_then(|l| l.clone())
                .unwrap_or_else(|| "no answer".to_string());
            return Err(Unreached::Unavailable {
                waited: started.elapsed(),
                error,
            });
        }
    }
}

/// A topic and its partitions; `None` when it does not exist.
pub type TopicPartitions = (String, Option<Vec<i32>>);

/// Partitions of each topic, in order of `topics`.
pub fn partitions(probe: &Probe, topics: &[String]) -> Result<Vec<TopicPartitions>, KafkaError> {
    let mut out = Vec::new();
    for topic in topics {
        // One topic per request: all topics of a shared cluster are none of ackd's business.
        let metadata = probe.fetch_metadata(Some(topic), REQUEST)?;
        let found = metadata.topics().iter().find(|t| t.name() == topic);
        let partitions = match found {
            Some(t) if t.error().is_none() => {
                let mut ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
                ids.sort_unstable();
                Some(ids)
            }
            _ => None,
        };
        out.push((topic.clone(), partitions));
    }
    Ok(out)
}
