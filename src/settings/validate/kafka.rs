//! The connection: the brokers, `KAFKA_PREFIX`, the topics and the group, TLS and SASL.

use crate::settings::kafka_url::{self, Brokers};
use crate::settings::keys::required_what;
use crate::settings::raw::RawSettings;
use crate::settings::security::{self, Sasl, Tls};
use crate::settings::with_prefix;
use crate::settings::SettingError;

/// The settings of the connection, validated.
pub(super) struct Connection {
    pub(super) brokers: Brokers,
    /// Full topic names: `KAFKA_PREFIX` applied.
    pub(super) topics: Vec<String>,
    /// The full group name: `KAFKA_PREFIX` applied.
    pub(super) group_id: String,
    pub(super) kafka_prefix: Option<String>,
    pub(super) tls: Option<Tls>,
    pub(super) sasl: Option<Sasl>,
}

impl Connection {
    /// `KAFKA_URL`, `KAFKA_PREFIX`, `ACKD_TOPICS`, `ACKD_GROUP_ID`, then TLS and SASL.
    pub(super) fn parse(raw: &RawSettings) -> Result<Connection, SettingError> {
        let brokers = brokers(raw)?;
        let kafka_prefix = kafka_prefix(raw)?;
        let prefix = kafka_prefix.as_deref();
        let topics = topics(raw, prefix)?;
        let group_id = with_prefix(prefix, raw.required("group_id", required_what("group_id"))?);
        let (tls, sasl) = security(raw, &brokers)?;
        Ok(Connection {
            brokers,
            topics,
            group_id,
            kafka_prefix,
            tls,
            sasl,
        })
    }
}

/// `KAFKA_URL`: the brokers, and the scheme that says TLS or SASL.
fn brokers(raw: &RawSettings) -> Result<Brokers, SettingError> {
    let url = raw.required("kafka_url", kafka_url::ALLOWED)?;
    kafka_url::parse(url).map_err(|problem| {
        // A URL may carry credentials: show it only when it cannot.
        let mut e = raw.error(
            "kafka_url",
            format!("{problem}; expected {}", kafka_url::ALLOWED),
        );
        if url.contains('@') {
            e.value = None;
        }
        e
    })
}

/// `KAFKA_PREFIX` (multi-tenant Heroku Kafka): the start of every topic and group name.
fn kafka_prefix(raw: &RawSettings) -> Result<Option<String>, SettingError> {
    match raw.kafka_vars.get("KAFKA_PREFIX").map(|p| p.trim()) {
        None | Some("") => Ok(None),
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
            Ok(Some(p.to_string()))
        }
    }
}

/// `ACKD_TOPICS`: comma-separated names, `prefix` applied.
fn topics(raw: &RawSettings, prefix: Option<&str>) -> Result<Vec<String>, SettingError> {
    let topics_raw = raw.required("topics", required_what("topics"))?;
    let topics: Vec<String> = topics_raw
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| with_prefix(prefix, t))
        .collect();
    if topics.is_empty() {
        return Err(raw.error("topics", "names no topic: give comma-separated topic names"));
    }
    for t in &topics {
        if !valid_topic(t) {
            return Err(raw.error(
                "topics",
                format!("`{t}` is not a valid topic name: up to 249 of a-z A-Z 0-9 . _ - (KAFKA_PREFIX included)"),
            ));
        }
    }
    Ok(topics)
}

/// TLS and SASL for `brokers`; a pass-through property that ackd sets from them is
/// an error (it would be set twice).
fn security(
    raw: &RawSettings,
    brokers: &Brokers,
) -> Result<(Option<Tls>, Option<Sasl>), SettingError> {
    let value = |key: &'static str| raw.values.get(key).map(String::as_str);
    let kafka_var = |name: &str| raw.kafka_vars.get(name).map(String::as_str);
    let (tls, sasl) = security::validate(
        brokers,
        &security::Inputs {
            trusted_cert: kafka_var(security::TRUSTED_CERT),
            client_cert: kafka_var(security::CLIENT_CERT),
            client_key: kafka_var(security::CLIENT_KEY),
            sasl_mechanism: value("sasl_mechanism"),
            sasl_username: value("sasl_username"),
            sasl_password: value("sasl_password"),
        },
    )?;
    for (property, setting) in security::claimed(tls.as_ref(), sasl.as_ref()) {
        if let Some(pass) = raw.rdkafka.get(property) {
            return Err(SettingError::new(
                &pass.origin,
                None,
                format!("sets `{property}`, which ackd sets from {setting}: give it once"),
            ));
        }
    }
    Ok((tls, sasl))
}

/// Kafka's rule for topic names.
pub(super) fn valid_topic(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 249
        && t != "."
        && t != ".."
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::test_vars::{err, vars};
    use crate::settings::Settings;

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
        assert_eq!(
            s.failure.dead_letter_topic.as_deref(),
            Some("tenant-x.orders.dlq")
        );
    }

    #[test]
    fn heroku_variables_configure_mutual_tls_without_showing_a_pem() {
        use crate::settings::security::tests::{assert_no_content, CA, CLIENT, CLIENT_KEY_PEM};
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
        use crate::settings::security::tests::CA;
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
}
