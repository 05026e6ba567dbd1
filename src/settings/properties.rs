//! librdkafka properties passed through (`[rdkafka]`, `ACKD_RDKAFKA_*`): the ones ackd
//! owns or the memory budget sets, the classic protocol's, and a property as passed.

use std::fmt;

use crate::settings::rdkafka_env::is_secret_property;

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
