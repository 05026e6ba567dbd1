//! Topics of `ACKD_TOPICS` that do not exist on the brokers.
//!
//! librdkafka subscribes to a missing topic without complaint and assigns nothing, so
//! a typo (`ordres`) would leave ackd idle forever and a SIGTERM would exit 0. Before
//! subscribing, ackd asks the brokers about each topic: a missing one stops ackd (exit
//! 78, the line names it), or with `ACKD_WAIT_FOR_TOPICS=true` ackd waits for it and
//! says so every 30 s. The retry tiers' topics (`ACKD_RETRY_TOPICS`) are checked with
//! them: a missing one names `ACKD_RETRY_TOPICS`. The metadata request never creates a topic: a consumer's
//! `allow.auto.create.topics` is false (tests/missing_topic.rs checks it against a broker
//! with `auto.create.topics.enable=true`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use signal_hook_tokio::Signals;

use crate::consumer::stop::stopped_while_waiting;
use crate::exit;
use crate::settings::Settings;

/// One metadata request may take this long (the brokers may still be starting).
const ATTEMPT: Duration = Duration::from_secs(10);
/// How often a wait asks again.
const RETRY: Duration = Duration::from_secs(1);
/// How often a wait says so.
const REPORT: Duration = Duration::from_secs(30);

/// The topics of `topics` that the brokers say do not exist. An error: the brokers
/// could not be asked.
pub fn missing<C: ConsumerContext>(
    consumer: &impl Consumer<C>,
    topics: &[String],
    timeout: Duration,
) -> Result<Vec<String>, KafkaError> {
    let mut missing = Vec::new();
    for topic in topics {
        // One topic per request: asking for all topics would list every topic of a
        // shared cluster.
        let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
        let unknown = match metadata.topics().iter().find(|t| t.name() == topic) {
            None => true,
            Some(t) => {
                t.error().map(RDKafkaErrorCode::from)
                    == Some(RDKafkaErrorCode::UnknownTopicOrPartition)
            }
        };
        if unknown {
            missing.push(topic.clone());
        }
    }
    Ok(missing)
}

/// Returns once every topic exists (or the brokers could not be asked: the poll loop
/// reports unreachable brokers); `Err(code)` when ackd must exit instead: a topic is
/// missing and waiting is off (78), or a signal came while waiting (0, nothing consumed).
pub async fn wait_until_present<C: Consumer<X> + Send + Sync + 'static, X: ConsumerContext>(
    consumer: &Arc<C>,
    settings: &Settings,
    signals: &mut Signals,
) -> Result<(), i32> {
    let started = Instant::now();
    let mut reported: Option<Instant> = None;
    loop {
        let (c, topics) = (consumer.clone(), settings.consumed_topics());
        let check = tokio::task::spawn_blocking(move || missing(&*c, &topics, ATTEMPT));
        let result = tokio::select! {
            r = check => r,
            s = signals.next() => return Err(stopped_while_waiting(s)),
        };
        let missing = match result {
            Ok(Ok(missing)) => missing,
            Ok(Err(e)) => {
                tracing::warn!(
                    at = "topics_unchecked",
                    error = %e,
                    "could not ask the brokers whether the topics exist; subscribing anyway"
                );
                return Ok(());
            }
            Err(_) => return Ok(()),
        };
        if missing.is_empty() {
            if reported.is_some() {
                tracing::info!(
                    at = "topics_available",
                    topics = settings.consumed_topics().join(","),
                    waited_ms = started.elapsed().as_millis() as u64
                );
            }
            return Ok(());
        }
        if !settings.wait_for_topics {
            report_missing_all(settings, &missing);
            return Err(exit::CONFIG);
        }
        if reported.is_none_or(|t| t.elapsed() >= REPORT) {
            tracing::warn!(
                at = "waiting_for_topics",
                topics = missing.join(","),
                waited_ms = started.elapsed().as_millis() as u64,
                "these topics do not exist yet (ACKD_WAIT_FOR_TOPICS=true): consuming once they do"
            );
            reported = Some(Instant::now());
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            s = signals.next() => return Err(stopped_while_waiting(s)),
        }
    }
}

/// The `at=config_error` lines for `missing` topics: those of `ACKD_TOPICS`, then the
/// retry tiers' (the daemon's, and `ackd check`'s).
pub fn report_missing_all(settings: &Settings, missing: &[String]) {
    let (sources, tiers): (Vec<&String>, Vec<&String>) =
        missing.iter().partition(|t| settings.topics.contains(t));
    if !sources.is_empty() {
        let names: Vec<&str> = sources.iter().map(|t| t.as_str()).collect();
        report_missing(settings, &names.join(","));
    }
    if !tiers.is_empty() {
        let names: Vec<&str> = tiers.iter().map(|t| t.as_str()).collect();
        report_missing_tiers(settings, &names.join(","));
    }
}

/// The `at=config_error setting=ACKD_RETRY_TOPICS` line for retry tier topics that do
/// not exist: ackd never creates them (like the dead-letter topic).
fn report_missing_tiers(settings: &Settings, missing: &str) {
    tracing::error!(
        at = "config_error",
        setting = "ACKD_RETRY_TOPICS",
        value = settings.failure.retry_tiers.topics().join(","),
        topics = missing,
        problem = "names retry tier topics (<topic>.retry.<delay>) that do not exist on the brokers: create them (as many partitions as you like); ACKD_WAIT_FOR_TOPICS=true waits for them",
        "invalid configuration; fix the setting and start again"
    );
}

/// The one `at=config_error setting=ACKD_TOPICS` line for topics that do not exist (the
/// daemon's, and `ackd check`'s and `ackd status`'s).
pub fn report_missing(settings: &Settings, missing: &str) {
    tracing::error!(
        at = "config_error",
        setting = "ACKD_TOPICS",
        value = settings.topics.join(","),
        topics = missing,
        problem = "names topics that do not exist on the brokers: check the names (KAFKA_PREFIX included) or create the topics; ACKD_WAIT_FOR_TOPICS=true waits for them",
        "invalid configuration; fix the setting and start again"
    );
}

/// The largest record batch each of `topics` takes (its `max.message.bytes`), asked of
/// the brokers with `base`'s connection; a topic left out could not be asked (missing
/// yet, the client may not describe its configuration, no answer within `timeout`).
/// The copies of failed messages are sized to it (src/consumer/copier.rs).
pub async fn max_message_bytes(
    base: &rdkafka::ClientConfig,
    topics: &[String],
    timeout: Duration,
) -> HashMap<String, usize> {
    use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    let mut limits = HashMap::new();
    let admin: AdminClient<DefaultClientContext> = match base.create() {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(at = "copy_limits_unknown", error = %e, "could not ask the brokers for the copy topics' max.message.bytes");
            return limits;
        }
    };
    let specs: Vec<ResourceSpecifier<'_>> =
        topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
    let opts = AdminOptions::new().request_timeout(Some(timeout));
    let answer = tokio::time::timeout(timeout, admin.describe_configs(&specs, &opts)).await;
    let results = match answer {
        Ok(Ok(results)) => results,
        Ok(Err(e)) => {
            tracing::warn!(at = "copy_limits_unknown", error = %e, "could not ask the brokers for the copy topics' max.message.bytes");
            return limits;
        }
        Err(_) => {
            tracing::warn!(
                at = "copy_limits_unknown",
                error = "no answer",
                "could not ask the brokers for the copy topics' max.message.bytes"
            );
            return limits;
        }
    };
    for (topic, result) in topics.iter().zip(results) {
        let limit = result.ok().and_then(|r| {
            r.get("max.message.bytes")
                .and_then(|e| e.value.as_deref())
                .and_then(|v| v.parse::<usize>().ok())
        });
        match limit {
            Some(bytes) => {
                limits.insert(topic.clone(), bytes);
            }
            None => tracing::warn!(
                at = "copy_limits_unknown",
                topic = topic.as_str(),
                "could not read this topic's max.message.bytes: a copy too large for it is refused by the broker instead"
            ),
        }
    }
    limits
}
