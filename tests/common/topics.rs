//! Unique names and topics on the shared test broker.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{BaseConsumer, Consumer};

use super::broker::*;

/// `prefix-<pid>-<counter>-<nanos>`: unique per test binary run, a legal topic/group name.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{n}-{nanos}", std::process::id())
}

/// Creates `name` with `partitions` partitions on the test broker.
pub fn create_topic(name: &str, partitions: i32) {
    create_topic_on(broker(), name, partitions);
}

/// The opening of most tests: a fresh topic named after `prefix` with `partitions`
/// partitions, created on the test broker, and a fresh group for it (`g-<prefix>`).
pub fn fresh_topic(prefix: &str, partitions: i32) -> (String, String) {
    fresh_topic_on(broker(), prefix, partitions)
}

/// [`fresh_topic`] on a broker or cluster of the test's own.
pub fn fresh_topic_on(b: &Broker, prefix: &str, partitions: i32) -> (String, String) {
    let topic = unique_name(prefix);
    let group = unique_name(&format!("g-{prefix}"));
    create_topic_on(b, &topic, partitions);
    (topic, group)
}

/// Whether `topic` exists, from a metadata request for all topics (which never creates
/// one, whatever the broker's auto.create.topics.enable).
pub fn topic_exists(topic: &str) -> bool {
    let consumer: BaseConsumer = broker().client_config().create().expect("consumer");
    let md = consumer
        .fetch_metadata(None, Duration::from_secs(30))
        .expect("metadata");
    md.topics().iter().any(|t| t.name() == topic)
}
