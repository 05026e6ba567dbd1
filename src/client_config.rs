//! Settings → librdkafka configuration. ackd's own properties first, then the
//! pass-through ones (which the settings already checked cannot override ackd's).

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::ClientConfig;

use crate::settings::Settings;

/// The consumer's configuration.
pub fn consumer_config(settings: &Settings) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", settings.brokers.bootstrap_servers())
        .set("security.protocol", settings.brokers.security.protocol())
        .set("group.id", &settings.group_id)
        .set("auto.offset.reset", settings.start_from.as_str())
        // ackd commits only acknowledged, contiguous offsets, itself (src/committer.rs).
        .set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", settings.stop_at_end.to_string())
        .set(
            "statistics.interval.ms",
            settings.metrics_interval.as_millis().to_string(),
        );
    // Static membership (ACKD_STATIC_MEMBERSHIP): a quick restart under the same id keeps
    // the partitions without a rebalance; a second live process with it is fenced.
    if let Some(id) = &settings.group_instance_id {
        config.set("group.instance.id", id);
    }
    for (property, pass) in &settings.rdkafka {
        config.set(property, &pass.value);
    }
    config.set_log_level(match settings.log_level.as_str() {
        "error" => RDKafkaLogLevel::Error,
        "warn" => RDKafkaLogLevel::Warning,
        "info" => RDKafkaLogLevel::Notice,
        _ => RDKafkaLogLevel::Debug,
    });
    config
}
