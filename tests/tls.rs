//! TLS on the test broker's own client listener, as on Heroku: the broker (Apache Kafka,
//! tests/common/broker.rs) requires a client certificate signed by a CA this test generates
//! each run (tests/common/pki.rs), and presents a server certificate for
//! `ec2-1.compute.amazonaws.com`, which does not match `127.0.0.1` (Heroku's broker
//! certificates do not match the broker host names either).
//!
//! The broker's only client listener is TLS, so every client goes through it: ackd, and
//! the harness's producer and committed-offsets reader too (with the same client
//! certificate). Brokers replicate over a plaintext listener of their own.
//!
//! Also here: the configuration errors of the TLS and SASL settings (exit 78). SASL against
//! the broker is tests/sasl.rs.

mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use common::pki::Pki;
use common::{
    accounting::*, ackd::*, broker::*, lines::*, offsets::*, produce::*, spawn::*, topics::*,
    wait::*,
};

const WAIT: Duration = Duration::from_secs(60);
/// How long an authentication failure may take to stop ackd.
const AUTH_FAILURE_BOUND: Duration = Duration::from_secs(30);
const PREFIX: &str = "tenant-x.";

/// The broker whose client listener uses [`pki`].
struct TlsBroker {
    broker: &'static Broker,
}

/// The test binary's PKI (without starting the shared broker, which tests on a cluster
/// of their own do not need).
fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(Pki::generate)
}

/// Mutual TLS: the server certificate, a client certificate signed by `ca.pem` required.
fn mtls_options(pki: &Pki) -> BrokerOptions {
    let mut client_config = vec![("security.protocol".to_string(), "ssl".to_string())];
    client_config.extend(pki.client_tls(true));
    BrokerOptions {
        security_protocol: "SSL".into(),
        server_config: pki.broker_tls(Some("ca.pem")),
        client_config,
        ..BrokerOptions::default()
    }
}

fn tls() -> &'static TlsBroker {
    static TLS: OnceLock<TlsBroker> = OnceLock::new();
    TLS.get_or_init(|| {
        let started = Instant::now();
        let pki = pki();
        let broker = broker_with(mtls_options(pki));
        eprintln!(
            "tls: PKI and TLS broker on 127.0.0.1:{} ready in {:?}",
            broker.port(),
            started.elapsed(),
        );
        TlsBroker { broker }
    })
}

/// `kafka+ssl://` for a broker.
fn ssl_url(b: &Broker) -> String {
    format!("kafka+ssl://127.0.0.1:{}", b.port())
}

/// ackd against the TLS broker with `topic` and `group` as given (unprefixed).
fn ackd(topic: &str, group: &str) -> AckdBuilder {
    // tls() first: it starts the TLS broker, which AckdBuilder::new would start plain.
    AckdBuilder::on(&ssl_url(tls().broker), topic, group)
}

/// Heroku's variables for mutual TLS.
fn heroku(builder: AckdBuilder) -> AckdBuilder {
    let pki = pki();
    builder
        .env("KAFKA_TRUSTED_CERT", &pki.ca)
        .env("KAFKA_CLIENT_CERT", &pki.client_cert)
        .env("KAFKA_CLIENT_CERT_KEY", &pki.client_key)
}

/// No PEM content and no test password anywhere in the output.
#[track_caller]
fn assert_no_secret(lines: &[String]) {
    let all = lines.join("\n");
    for body in pki().body_lines() {
        assert!(
            !all.contains(&body),
            "PEM content `{body}` in the output:\n{all}"
        );
    }
    assert!(!all.contains("hunter2"), "a password in the output:\n{all}");
}

fn at<'a>(lines: &'a [String], at: &str) -> Vec<&'a String> {
    lines
        .iter()
        .filter(|l| field(l, "at").as_deref() == Some(at))
        .collect()
}

#[test]
fn heroku_variables_consume_and_commit_over_mutual_tls_with_the_prefixed_names() {
    // The TLS broker first: create_topic would start the shared broker plain.
    tls();
    let pki = pki();
    let topic = unique_name("orders");
    let group = unique_name("billing");
    let (full_topic, full_group) = (format!("{PREFIX}{topic}"), format!("{PREFIX}{group}"));
    create_topic(&full_topic, 3);
    let delivered = produce_keyed(&full_topic, 60, 0);

    // A CA rotation: the unrelated CA first, the broker's second; every one is trusted.
    let bundle = format!("{}{}", pki.other_ca, pki.ca);
    let ackd = heroku(ackd(&topic, &group))
        .env("KAFKA_TRUSTED_CERT", bundle)
        .env("KAFKA_PREFIX", PREFIX)
        // librdkafka's own debug logs (configuration dump, TLS, broker) go through tracing:
        // they must not carry a secret either.
        .env("ACKD_LOG_LEVEL", "debug")
        .env("ACKD_RDKAFKA_DEBUG", "conf,security,broker")
        .spawn();
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);
    let lines = ackd.stop(0, WAIT);

    let start = at(&lines, "start");
    assert_eq!(start.len(), 1);
    let start = start[0];
    assert_eq!(field(start, "security").as_deref(), Some("ssl"), "{start}");
    assert_eq!(field(start, "topics"), Some(full_topic.clone()), "{start}");
    assert_eq!(field(start, "group"), Some(full_group.clone()), "{start}");
    assert_eq!(
        field(start, "kafka_prefix").as_deref(),
        Some(PREFIX),
        "{start}"
    );
    assert_eq!(
        field(start, "tls").as_deref(),
        Some("ca=KAFKA_TRUSTED_CERT(2),hostname_check=off,client_cert=on"),
        "{start}"
    );
    let assigned = at(&lines, "assigned");
    assert_eq!(assigned.len(), 3, "{}", lines.join("\n"));
    for l in assigned {
        assert_eq!(field(l, "topic"), Some(full_topic.clone()), "{l}");
    }
    let processed = processed(&lines);
    assert_eq!(processed.len(), delivered.len());
    for l in lines.iter().filter(|l| is_processed(l)) {
        assert_eq!(field(l, "topic"), Some(full_topic.clone()), "{l}");
    }

    // On the broker: the prefixed group committed the prefixed topic to its log end.
    let committed_offsets = committed(&full_group, &full_topic, 3);
    for (p, end) in log_ends(&delivered) {
        assert_eq!(committed_offsets[&p], Some(end), "partition {p}");
    }
    assert!(
        committed(&group, &full_topic, 3)
            .values()
            .all(Option::is_none),
        "the unprefixed group must not be used"
    );
    assert!(
        lines.iter().any(|l| l.contains("at=librdkafka")),
        "librdkafka's debug logs should be in the output"
    );
    assert_no_secret(&lines);
    eprintln!(
        "heroku: {} delivered, {} processed, committed to the log ends of 3 partitions, exit 0 after {:?}",
        delivered.len(),
        processed.len(),
        ackd.elapsed()
    );
}

/// Runs ackd expecting an authentication failure: exit 77 within the bound, one
/// `at=auth_failed` line naming the broker with `reason` in it. Returns that line.
#[track_caller]
fn assert_auth_failure(builder: AckdBuilder, reason: &str) -> String {
    assert_auth_failure_lines(builder, reason).0
}

/// [`assert_auth_failure`], also returning every line of the run.
#[track_caller]
fn assert_auth_failure_lines(builder: AckdBuilder, reason: &str) -> (String, Vec<String>) {
    let ackd = builder.spawn();
    // Within the bound: wait_exit fails otherwise.
    let code = ackd.wait_exit(AUTH_FAILURE_BOUND);
    let lines = ackd.lines();
    let all = lines.join("\n");
    assert_eq!(code, 77, "{all}");
    let failed = at(&lines, "auth_failed");
    assert_eq!(failed.len(), 1, "one line, not one per retry:\n{all}");
    let line = failed[0].clone();
    assert_eq!(field(&line, "level").as_deref(), Some("error"), "{line}");
    assert_eq!(
        field(&line, "broker"),
        Some(format!("127.0.0.1:{}", tls().broker.port())),
        "{line}"
    );
    assert!(
        field(&line, "reason").is_some_and(|r| r.contains(reason)),
        "{line} should give the reason {reason:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| field(l, "at").as_deref() == Some("exit")
                && field(l, "code").as_deref() == Some("77")),
        "{all}"
    );
    assert_no_secret(&lines);
    assert_stopped_at_the_auth_failure(&lines);
    eprintln!(
        "auth failure: exit {code} after {:?}: {line}",
        ackd.elapsed()
    );
    (line, lines)
}

#[test]
fn without_the_client_certificate_the_broker_refuses_and_ackd_exits_77() {
    let builder = ackd(&unique_name("t"), &unique_name("g")).env("KAFKA_TRUSTED_CERT", &pki().ca);
    // Kafka (Java) answers a missing client certificate with a bad_certificate alert, not
    // TLS 1.3's certificate_required.
    let line = assert_auth_failure(builder, "alert bad certificate");
    assert_eq!(
        field(&line, "hint").as_deref(),
        Some("the broker requires a client certificate: set KAFKA_CLIENT_CERT and KAFKA_CLIENT_CERT_KEY"),
        "{line}"
    );
}

#[test]
fn with_the_wrong_trusted_ca_ackd_refuses_the_broker_and_exits_77() {
    let builder = heroku(ackd(&unique_name("t"), &unique_name("g")))
        .env("KAFKA_TRUSTED_CERT", &pki().other_ca);
    let line = assert_auth_failure(builder, "certificate verify failed");
    assert!(
        field(&line, "hint").is_some_and(|h| h.contains("KAFKA_TRUSTED_CERT")),
        "{line}"
    );
}

/// librdkafka's TLS debug lines: which CAs it loads, whether it checks the host name.
fn with_tls_debug(builder: AckdBuilder) -> AckdBuilder {
    builder
        .env("ACKD_RDKAFKA_DEBUG", "security")
        .env("ACKD_LOG_LEVEL", "debug")
}

/// Whether a librdkafka line of `lines` contains `text`.
fn librdkafka_says(lines: &[String], text: &str) -> bool {
    at(lines, "librdkafka").iter().any(|l| l.contains(text))
}

const HOST_NAME_CHECKED: &str = "Enabled endpoint identification using hostname 127.0.0.1";

#[test]
fn without_a_trusted_cert_the_system_roots_verify_the_broker_and_refuse_a_private_ca() {
    let builder =
        heroku(ackd(&unique_name("t"), &unique_name("g"))).env_remove("KAFKA_TRUSTED_CERT");
    let (_, lines) =
        assert_auth_failure_lines(with_tls_debug(builder), "certificate verify failed");
    let all = lines.join("\n");
    // No CA of ackd's: librdkafka's default, the system's roots, with the host name checked.
    let start = at(&lines, "start")[0];
    assert!(
        start.contains("tls=\"ca=system,hostname_check=on,"),
        "{start}"
    );
    assert!(!librdkafka_says(&lines, "CA certificate(s) from"), "{all}");
    assert!(librdkafka_says(&lines, HOST_NAME_CHECKED), "{all}");
}

#[test]
fn the_host_name_check_is_what_a_pinned_ca_turns_off() {
    // The server certificate is for ec2-1.compute.amazonaws.com. Over the right CA,
    // pinned, ackd connects (the check is off)...
    // The TLS broker first: create_topic would start the shared broker plain.
    tls();
    let topic = unique_name("pinned");
    create_topic(&topic, 1);
    let pinned = || heroku(ackd(&topic, &unique_name("g")));
    let connected = pinned().spawn();
    connected.wait_for_line(|l| field(l, "at").as_deref() == Some("assigned"), WAIT);
    connected.stop(0, WAIT);
    // ...and with only the check turned back on, the connection to 127.0.0.1 fails.
    let builder = pinned().env(
        "ACKD_RDKAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM",
        "https",
    );
    let (_, lines) =
        assert_auth_failure_lines(with_tls_debug(builder), "certificate verify failed");
    let all = lines.join("\n");
    assert!(
        librdkafka_says(&lines, "Loaded 1 CA certificate(s) from string"),
        "{all}"
    );
    assert!(librdkafka_says(&lines, HOST_NAME_CHECKED), "{all}");
}

#[test]
fn a_tls_broker_that_is_down_is_retried_until_it_comes_up() {
    let pki = pki();
    // ackd starts first, on a port where a TLS broker comes up only later: until then every
    // connection is refused, which must be retried, not taken for an authentication failure.
    let port = free_port();
    let topic = unique_name("late");
    let group = unique_name("g-late");
    let ackd = heroku(AckdBuilder::on(
        &format!("kafka+ssl://127.0.0.1:{port}"),
        &topic,
        &group,
    ))
    .spawn();
    // librdkafka reports the refused connections as "all brokers down", over and over;
    // ackd says so once (at=brokers_unreachable, repeated only every 30 s).
    let down = |l: &str| {
        field(l, "level").as_deref() == Some("error")
            && field(l, "at").as_deref() == Some("brokers_unreachable")
    };
    ackd.wait_for_count(down, 1, WAIT);
    // The topic check gave up (it would otherwise find the topic missing and exit 78).
    ackd.wait_for_line(
        |l| field(l, "at").as_deref() == Some("topics_unchecked"),
        WAIT,
    );
    let down_since = Instant::now();
    let b = Broker::start(BrokerOptions {
        port: Some(port),
        ..mtls_options(pki)
    });
    let down_for = down_since.elapsed();
    assert_eq!(ackd.try_exit_code(), None, "{}", ackd.lines().join("\n"));
    create_topic_on(&b, &topic, 2);
    let delivered = produce_with(&producer_on(&b), &topic, &keyed_messages(30, 0));
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);
    ackd.sigterm();
    let code = ackd.wait_exit(WAIT);
    let lines = ackd.lines();
    let all = lines.join("\n");
    assert_eq!(code, 0, "{all}");
    assert!(at(&lines, "auth_failed").is_empty(), "{all}");
    let processed = processed(&lines);
    let t = tally(&delivered, &processed, &lines);
    assert!(t.lost.is_empty() && t.duplicated.is_empty(), "{t:?}\n{all}");
    let committed_offsets = committed_at(&b, &group, &topic, 2);
    for (p, end) in log_ends(&delivered) {
        assert_eq!(committed_offsets[&p], Some(end), "partition {p}");
    }
    assert_no_secret(&lines);
    eprintln!(
        "down: broker down {down_for:?} while ackd retried; then {} delivered, {} processed, lost {}, duplicated {}, exit {code}",
        delivered.len(),
        processed.len(),
        t.lost.len(),
        t.duplicated.len()
    );
}

/// Runs ackd expecting a configuration error naming `setting`, with no PEM or password.
#[track_caller]
fn assert_config_error(builder: AckdBuilder, setting: &str, mentions: &str) {
    let ackd = builder.spawn();
    let code = ackd.wait_exit(Duration::from_secs(30));
    let lines = ackd.lines();
    let all = lines.join("\n");
    assert_eq!(code, 78, "{all}");
    let errors = at(&lines, "config_error");
    assert_eq!(errors.len(), 1, "{all}");
    assert_eq!(
        field(errors[0], "setting").as_deref(),
        Some(setting),
        "{all}"
    );
    assert!(
        errors[0].contains(mentions),
        "{} should mention {mentions:?}",
        errors[0]
    );
    assert!(field(errors[0], "value").is_none(), "{}", errors[0]);
    assert_no_secret(&lines);
}

#[test]
fn tls_and_sasl_configuration_errors_name_the_variable_without_its_content() {
    let pki = pki();
    // Each ends at its configuration: no broker is started for them.
    let ackd = |topic, group| AckdBuilder::on(&format!("kafka+ssl://{CLOSED_PORT}"), topic, group);
    let base = || heroku(ackd("t", "g"));
    assert_config_error(
        base().env_remove("KAFKA_CLIENT_CERT_KEY"),
        "KAFKA_CLIENT_CERT",
        "without KAFKA_CLIENT_CERT_KEY",
    );
    assert_config_error(
        base().env_remove("KAFKA_CLIENT_CERT"),
        "KAFKA_CLIENT_CERT_KEY",
        "without KAFKA_CLIENT_CERT",
    );
    let cut = pki.client_key[..pki.client_key.len() / 2].to_string();
    assert_config_error(
        base().env("KAFKA_CLIENT_CERT_KEY", cut),
        "KAFKA_CLIENT_CERT_KEY",
        "no END line",
    );
    let mangled = pki.ca.replacen("MI", "M!", 1);
    assert_config_error(
        base().env("KAFKA_TRUSTED_CERT", mangled),
        "KAFKA_TRUSTED_CERT",
        "not base64",
    );
    assert_config_error(
        base().env("KAFKA_CLIENT_CERT", &pki.client_key),
        "KAFKA_CLIENT_CERT",
        "certificates only",
    );
    // A key that is not the certificate's: librdkafka finds it; ackd names the variable.
    let other_key = std::fs::read_to_string(pki.dir.join("server.key")).unwrap();
    assert_config_error(
        base().env("KAFKA_CLIENT_CERT_KEY", other_key),
        "KAFKA_CLIENT_CERT_KEY",
        "librdkafka refused",
    );
    // SASL: half-given, or not matching the URL's scheme.
    let sasl = || {
        ackd("t", "g")
            .env("KAFKA_URL", "kafka+sasl-ssl://127.0.0.1:1")
            .env("ACKD_SASL_MECHANISM", "SCRAM-SHA-512")
    };
    assert_config_error(
        sasl().env("ACKD_SASL_USERNAME", "alice"),
        "ACKD_SASL_PASSWORD",
        "is required",
    );
    assert_config_error(
        sasl().env("ACKD_SASL_PASSWORD", "hunter2-secret"),
        "ACKD_SASL_USERNAME",
        "is required",
    );
    assert_config_error(
        sasl()
            .env(
                "KAFKA_URL",
                "kafka+sasl-ssl://alice:hunter2-secret@127.0.0.1:1",
            )
            .env("ACKD_SASL_PASSWORD", "hunter2-secret"),
        "ACKD_SASL_PASSWORD",
        "give them once",
    );
    assert_config_error(
        ackd("t", "g")
            .env("ACKD_SASL_MECHANISM", "PLAIN")
            .env("ACKD_SASL_USERNAME", "alice")
            .env("ACKD_SASL_PASSWORD", "hunter2-secret"),
        "ACKD_SASL_MECHANISM",
        "kafka+sasl-ssl://",
    );
    assert_config_error(
        ackd("t", "g").env("KAFKA_URL", "kafka+ssl://alice:hunter2-secret@127.0.0.1:1"),
        "KAFKA_URL",
        "only for kafka+sasl-ssl://",
    );
}

#[test]
fn when_the_broker_stops_accepting_the_certificate_at_run_time_ackd_stops_with_77() {
    let pki = pki();
    // A cluster of this test's own, restarted with another truststore.
    let b = Broker::start(mtls_options(pki));
    let (topic, group) = fresh_topic_on(&b, "rotated", 2);
    let delivered = produce_with(&producer_on(&b), &topic, &keyed_messages(20, 0));
    let ackd = heroku(AckdBuilder::on(&ssl_url(&b), &topic, &group))
        // Only the stop commits: what was acked is still to commit when the failure comes.
        .env("ACKD_COMMIT_INTERVAL_MS", "600000")
        // The group outlives the broker's restart (the harness's 1 s would give the
        // partitions up as lost while the node is down, leaving nothing to commit).
        .env("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "45000")
        .env("ACKD_RDKAFKA_HEARTBEAT_INTERVAL_MS", "3000")
        // The stop spends its budget on a final commit that no broker will take: 5 s
        // instead of 25 keeps the test short.
        .env("ACKD_SHUTDOWN_TIMEOUT_MS", "5000")
        .spawn();
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);

    // The broker now trusts another CA only (a revoked or rotated client certificate):
    // its restart drops the open connections, and every reconnect is refused.
    b.rewrite_server_config(&[("ssl.truststore.location".into(), pki.path("other-ca.pem"))]);
    b.stop_node(0);
    b.start_node(0);
    b.wait_node_listening(0);
    // Listening is not serving yet: the broker answers once its start is done. A client
    // with a certificate of the new CA tells when (ackd may be first to see it).
    let mut other_client = ClientConfig::new();
    other_client
        .set("bootstrap.servers", b.bootstrap())
        .set("security.protocol", "ssl")
        .set("ssl.ca.location", pki.path("ca.pem"))
        .set("ssl.endpoint.identification.algorithm", "none")
        .set("ssl.certificate.location", pki.path("other-client.pem"))
        .set("ssl.key.location", pki.path("other-client.key"));
    let other_client: BaseConsumer = other_client.create().expect("create a metadata client");
    wait_until(WAIT, || {
        ackd.try_exit_code().is_some()
            || other_client
                .fetch_metadata(None, Duration::from_secs(2))
                .is_ok()
    });
    let serving = Instant::now();
    let code = ackd.wait_exit(AUTH_FAILURE_BOUND);
    let stopped_in = serving.elapsed();
    let lines = ackd.lines();
    let all = lines.join("\n");
    assert_eq!(code, 77, "{all}");
    assert!(stopped_in < AUTH_FAILURE_BOUND, "{stopped_in:?}");
    let failed = at(&lines, "auth_failed");
    assert_eq!(failed.len(), 1, "{all}");
    assert_eq!(
        field(failed[0], "broker"),
        Some(format!("127.0.0.1:{}", b.port())),
        "{}",
        failed[0]
    );
    let reason = field(failed[0], "reason").unwrap_or_default();
    assert!(
        ["unknown ca", "bad certificate", "certificate unknown"]
            .iter()
            .any(|r| reason.contains(r)),
        "{}",
        failed[0]
    );
    assert_eq!(
        field(failed[0], "hint").as_deref(),
        Some("the broker refused the client certificate (KAFKA_CLIENT_CERT)"),
        "{}",
        failed[0]
    );
    // It stopped the graceful way: the stop sequence ran and said what it could not commit.
    assert_eq!(at(&lines, "shutdown_begun").len(), 1, "{all}");
    assert!(!at(&lines, "commit_failed").is_empty(), "{all}");
    assert_no_secret(&lines);
    eprintln!(
        "rotated: {} processed before the restart, exit {code} {stopped_in:?} after the broker served again",
        processed(&lines).len()
    );
}
