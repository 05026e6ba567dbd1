//! Settings → librdkafka configuration. ackd's own properties first, then the
//! pass-through ones (which the settings already checked cannot override ackd's).

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::ClientConfig;

use crate::settings::security;
use crate::settings::Settings;

/// What every client of ackd shares: brokers, security, logging.
pub fn base_config(settings: &Settings) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", settings.brokers.bootstrap_servers())
        .set("security.protocol", settings.brokers.security.protocol());
    // TLS and SASL (PEMs in memory, never on disk), before the pass-through ones so that
    // e.g. the host-name check can be turned back on over a pinned CA.
    for (property, value) in security::properties(settings.tls.as_ref(), settings.sasl.as_ref()) {
        config.set(property, value);
    }
    // Pass-through properties that concern the connection apply to every client (the
    // dead-letter producer too); the rest are the consumer's.
    for (property, pass) in settings
        .rdkafka
        .iter()
        .filter(|(p, _)| is_connection_property(p))
    {
        config.set(property, &pass.value);
    }
    config.set_log_level(log_level(settings));
    config
}

/// A client that asks the brokers one thing at start and is dropped (the memory
/// budget's partition count, the session's terms): [`base_config`], connecting at once
/// to every broker the metadata names. librdkafka drops the bootstrap connection once
/// the brokers are named, failing a request under way on it, and by default opens one
/// first connection at a time, at most every `reconnect.backoff.ms` / 2 (at least
/// 11 ms): the request waited that long, on every start.
pub fn asking_config(settings: &Settings) -> ClientConfig {
    let mut config = base_config(settings);
    config.set("enable.sparse.connections", "false");
    config
}

fn is_connection_property(property: &str) -> bool {
    [
        "ssl.",
        "sasl.",
        "socket.",
        "broker.",
        "client.",
        "reconnect.",
    ]
    .iter()
    .any(|p| property.starts_with(p))
}

fn log_level(settings: &Settings) -> RDKafkaLogLevel {
    match settings.logging.log_level.as_str() {
        "error" => RDKafkaLogLevel::Error,
        "warn" => RDKafkaLogLevel::Warning,
        "info" => RDKafkaLogLevel::Notice,
        _ => RDKafkaLogLevel::Debug,
    }
}

/// The consumer's configuration.
pub fn consumer_config(settings: &Settings) -> ClientConfig {
    let mut config = base_config(settings);
    config
        .set("group.id", &settings.group_id)
        .set("auto.offset.reset", settings.group.start_from.as_str())
        // ackd commits only acknowledged, contiguous offsets, itself (src/consumer/committer.rs).
        .set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", settings.stop_at_end.to_string())
        .set(
            "statistics.interval.ms",
            settings.logging.metrics_interval.as_millis().to_string(),
        );
    // Static membership (ACKD_STATIC_MEMBERSHIP): a quick restart under the same id keeps
    // the partitions without a rebalance; a second live process with it is fenced.
    if let Some(id) = &settings.group.instance_id {
        config.set("group.instance.id", id);
    }
    // ACKD_GROUP_PROTOCOL. Under `consumer` the settings already dropped ackd's default
    // assignor and refused the classic-only properties, which librdkafka would refuse.
    config.set("group.protocol", settings.group.protocol.as_str());
    for (property, pass) in &settings.rdkafka {
        config.set(property, &pass.value);
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::security::tests::{CA, CLIENT, CLIENT_KEY_PEM, OTHER_CA, OTHER_KEY};
    use rdkafka::consumer::BaseConsumer;

    fn settings(vars: &[(&str, &str)]) -> Settings {
        let mut v: Vec<(String, String)> = vec![
            ("ACKD_TOPICS".into(), "orders".into()),
            ("ACKD_GROUP_ID".into(), "billing".into()),
        ];
        v.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Settings::from_vars(v).unwrap()
    }

    /// librdkafka accepts the configuration: creating a consumer loads the PEMs and checks
    /// every property (it does not connect).
    #[track_caller]
    fn accepted(config: &ClientConfig) {
        if let Err(e) = config.create::<BaseConsumer>() {
            panic!("librdkafka refused the configuration: {e}");
        }
    }

    fn get<'a>(config: &'a ClientConfig, key: &str) -> Option<&'a str> {
        config.get(key)
    }

    /// The reconnect backoff applies to every client, not only the consumer.
    #[test]
    fn every_client_has_the_reconnect_backoff() {
        let url = ("KAFKA_URL", "kafka://b.example.com:9092");
        let config = base_config(&settings(&[url]));
        assert_eq!(get(&config, "reconnect.backoff.ms"), Some("20"));
        let config = base_config(&settings(&[
            url,
            ("ACKD_RDKAFKA_RECONNECT_BACKOFF_MS", "50"),
        ]));
        assert_eq!(get(&config, "reconnect.backoff.ms"), Some("50"));
        assert_eq!(get(&config, "fetch.max.bytes"), None, "the consumer's own");
        // The clients that ask at start connect to every broker at once.
        let asking = asking_config(&settings(&[url]));
        assert_eq!(get(&asking, "enable.sparse.connections"), Some("false"));
        accepted(&asking);
    }

    #[test]
    fn heroku_mutual_tls_with_a_rotation_bundle() {
        let bundle = format!("{CA}{OTHER_CA}");
        let config = consumer_config(&settings(&[
            ("KAFKA_URL", "kafka+ssl://ec2-1.compute.amazonaws.com:9096"),
            ("KAFKA_TRUSTED_CERT", &bundle),
            ("KAFKA_CLIENT_CERT", CLIENT),
            ("KAFKA_CLIENT_CERT_KEY", CLIENT_KEY_PEM),
            ("KAFKA_PREFIX", "tenant-x."),
        ]));
        assert_eq!(get(&config, "security.protocol"), Some("ssl"));
        assert_eq!(get(&config, "ssl.ca.pem"), Some(bundle.as_str()));
        assert_eq!(
            get(&config, "ssl.endpoint.identification.algorithm"),
            Some("none")
        );
        assert_eq!(get(&config, "ssl.certificate.pem"), Some(CLIENT));
        assert_eq!(get(&config, "ssl.key.pem"), Some(CLIENT_KEY_PEM));
        assert_eq!(get(&config, "group.id"), Some("tenant-x.billing"));
        for file_property in [
            "ssl.ca.location",
            "ssl.certificate.location",
            "ssl.key.location",
        ] {
            assert_eq!(get(&config, file_property), None, "PEMs stay in memory");
        }
        accepted(&config);
    }

    #[test]
    fn system_roots_with_the_host_name_check() {
        let config = consumer_config(&settings(&[(
            "KAFKA_URL",
            "kafka+ssl://b.example.com:9093",
        )]));
        assert_eq!(get(&config, "security.protocol"), Some("ssl"));
        assert_eq!(get(&config, "ssl.ca.pem"), None);
        assert_eq!(get(&config, "ssl.ca.location"), None);
        assert_eq!(
            get(&config, "ssl.endpoint.identification.algorithm"),
            Some("https")
        );
        accepted(&config);
    }

    #[test]
    fn sasl_over_tls_for_each_mechanism() {
        for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
            let config = consumer_config(&settings(&[
                (
                    "KAFKA_URL",
                    "kafka+sasl-ssl://alice:hunter2%40x@b.example.com:9092",
                ),
                ("ACKD_SASL_MECHANISM", mechanism),
            ]));
            assert_eq!(get(&config, "security.protocol"), Some("sasl_ssl"));
            assert_eq!(get(&config, "sasl.mechanism"), Some(mechanism));
            assert_eq!(get(&config, "sasl.username"), Some("alice"));
            assert_eq!(get(&config, "sasl.password"), Some("hunter2@x"));
            assert_eq!(
                get(&config, "bootstrap.servers"),
                Some("b.example.com:9092")
            );
            accepted(&config);
        }
        let config = consumer_config(&settings(&[
            ("KAFKA_URL", "kafka+sasl-ssl://b.example.com:9092"),
            ("ACKD_SASL_MECHANISM", "SCRAM-SHA-512"),
            ("ACKD_SASL_USERNAME", "alice"),
            ("ACKD_SASL_PASSWORD", "hunter2"),
            ("KAFKA_TRUSTED_CERT", CA),
        ]));
        assert_eq!(get(&config, "sasl.username"), Some("alice"));
        assert_eq!(get(&config, "ssl.ca.pem"), Some(CA));
        accepted(&config);
    }

    #[test]
    fn librdkafka_accepts_the_consumer_protocol_with_the_brokers_assignor() {
        const URL: &str = "KAFKA_URL";
        let config = consumer_config(&settings(&[
            (URL, "kafka://127.0.0.1:9092"),
            ("ACKD_GROUP_PROTOCOL", "consumer"),
        ]));
        assert_eq!(get(&config, "group.protocol"), Some("consumer"));
        for classic_only in [
            "partition.assignment.strategy",
            "session.timeout.ms",
            "heartbeat.interval.ms",
            "group.protocol.type",
        ] {
            assert_eq!(get(&config, classic_only), None, "{classic_only}");
        }
        accepted(&config);
        let config = consumer_config(&settings(&[
            (URL, "kafka://127.0.0.1:9092"),
            ("ACKD_GROUP_PROTOCOL", "consumer"),
            ("ACKD_RDKAFKA_GROUP_REMOTE_ASSIGNOR", "range"),
            ("ACKD_STATIC_MEMBERSHIP", "true"),
            ("DYNO", "worker.1"),
        ]));
        assert_eq!(get(&config, "group.remote.assignor"), Some("range"));
        accepted(&config);
        // The default stays classic with ackd's assignor.
        let config = consumer_config(&settings(&[(URL, "kafka://127.0.0.1:9092")]));
        assert_eq!(get(&config, "group.protocol"), Some("classic"));
        assert_eq!(
            get(&config, "partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
        accepted(&config);
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused_by_librdkafka_and_named() {
        let config = consumer_config(&settings(&[
            ("KAFKA_URL", "kafka+ssl://b:9093"),
            ("KAFKA_CLIENT_CERT", CLIENT),
            ("KAFKA_CLIENT_CERT_KEY", OTHER_KEY),
        ]));
        let Err(e) = config.create::<BaseConsumer>() else {
            panic!("a mismatched key was accepted");
        };
        let message = e.to_string();
        let mapped = security::creation_error(&message)
            .unwrap_or_else(|| panic!("not mapped to a setting: {message}"));
        assert_eq!(mapped.setting, "KAFKA_CLIENT_CERT_KEY", "{message}");
        crate::settings::security::tests::assert_no_content(&message);
    }
}
