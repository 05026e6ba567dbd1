//! SASL against the test broker's own SASL_SSL client listener (Apache Kafka,
//! tests/common/broker.rs): SCRAM-SHA-512 (users created when the storage is formatted,
//! as KRaft requires) and PLAIN (users in the listener's JAAS configuration), over TLS with
//! a CA this test generates each run (tests/common/pki.rs), no client certificate. ackd
//! offers SASL over TLS only (`kafka+sasl-ssl://`), so that is what is tested.
//!
//! Both credential sources are used: Heroku-style `kafka+sasl-ssl://user:password@` and
//! `ACKD_SASL_USERNAME`/`ACKD_SASL_PASSWORD`. Every run has librdkafka's debug logging on:
//! no password, no user name and no PEM may reach a line.

mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::pki::Pki;
use common::{accounting::*, ackd::*, broker::*, lines::*, offsets::*, produce::*, topics::*};

const WAIT: Duration = Duration::from_secs(60);
/// How long an authentication failure may take to stop ackd.
const AUTH_FAILURE_BOUND: Duration = Duration::from_secs(30);

// User names are JAAS option names (`user_<name>`) and passwords go through
// `kafka-storage format --add-scram`'s parser: letters and digits there. The PLAIN password
// has the characters a URL must percent-encode.
const SCRAM_USER: &str = "svcscram7d1q";
const SCRAM_PASSWORD: &str = "Scram7pw4Rq9zXk2";
const PLAIN_USER: &str = "svcplain3k8w";
const PLAIN_PASSWORD: &str = "pl@in:pw/5%Vk#tY";
const WRONG_PASSWORD: &str = "Wr0ngPassw0rdJq8";

struct SaslBroker {
    pki: Pki,
    broker: &'static Broker,
}

fn sasl() -> &'static SaslBroker {
    static SASL: OnceLock<SaslBroker> = OnceLock::new();
    SASL.get_or_init(|| {
        let started = Instant::now();
        let pki = Pki::generate();
        let mut server_config = pki.broker_tls(None);
        server_config.extend(
            [
                ("sasl.enabled.mechanisms", "SCRAM-SHA-512,PLAIN".to_string()),
                (
                    "listener.name.client.scram-sha-512.sasl.jaas.config",
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;".into(),
                ),
                (
                    "listener.name.client.plain.sasl.jaas.config",
                    format!(
                        "org.apache.kafka.common.security.plain.PlainLoginModule required user_{PLAIN_USER}=\"{PLAIN_PASSWORD}\";"
                    ),
                ),
            ]
            .map(|(k, v)| (k.to_string(), v)),
        );
        // The harness's own clients log in with SCRAM.
        let mut client_config: Vec<(String, String)> = [
            ("security.protocol", "sasl_ssl"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("sasl.username", SCRAM_USER),
            ("sasl.password", SCRAM_PASSWORD),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
        client_config.extend(pki.client_tls(false));
        let broker = broker_with(BrokerOptions {
            security_protocol: "SASL_SSL".into(),
            server_config,
            client_config,
            format_args: vec![
                "--add-scram".into(),
                format!("SCRAM-SHA-512=[name={SCRAM_USER},password={SCRAM_PASSWORD}]"),
            ],
            ..BrokerOptions::default()
        });
        eprintln!(
            "sasl: PKI and SASL_SSL broker on 127.0.0.1:{} ready in {:?}",
            broker.port(),
            started.elapsed(),
        );
        SaslBroker { pki, broker }
    })
}

/// Percent-encodes everything but ASCII letters and digits, for URL user info.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// ackd against the SASL_SSL listener with `credentials` (`user:password@`, encoded, or
/// empty) in the URL, trusting the test CA, with librdkafka's debug logging on.
fn ackd(topic: &str, group: &str, mechanism: &str, credentials: &str) -> AckdBuilder {
    let s = sasl();
    AckdBuilder::on(
        &format!(
            "kafka+sasl-ssl://{credentials}127.0.0.1:{}",
            s.broker.port()
        ),
        topic,
        group,
    )
    .env("ACKD_SASL_MECHANISM", mechanism)
    .env("KAFKA_TRUSTED_CERT", &s.pki.ca)
    // librdkafka's own debug logs (configuration dump, SASL, broker) go through tracing:
    // they must not carry a secret either.
    .env("ACKD_LOG_LEVEL", "debug")
    .env("ACKD_RDKAFKA_DEBUG", "conf,security,broker")
}

fn at<'a>(lines: &'a [String], at: &str) -> Vec<&'a String> {
    lines
        .iter()
        .filter(|l| field(l, "at").as_deref() == Some(at))
        .collect()
}

/// No password (right or wrong, raw or encoded), no user name, no PEM content anywhere.
#[track_caller]
fn assert_no_secret(lines: &[String]) {
    let all = lines.join("\n");
    for secret in [
        SCRAM_PASSWORD,
        PLAIN_PASSWORD,
        &encode(PLAIN_PASSWORD),
        WRONG_PASSWORD,
        SCRAM_USER,
        PLAIN_USER,
    ] {
        assert!(!all.contains(secret), "`{secret}` in the output:\n{all}");
    }
    for body in sasl().pki.body_lines() {
        assert!(
            !all.contains(&body),
            "PEM content `{body}` in the output:\n{all}"
        );
    }
}

/// The daemon's runs have librdkafka's debug logging on (`ACKD_RDKAFKA_DEBUG`), so that
/// [`assert_no_secret`] also reads what librdkafka writes. (`ackd check`'s client takes
/// only the connection's pass-through properties, not `debug`: its runs need not show
/// librdkafka's lines.)
#[track_caller]
fn assert_librdkafka_logged(lines: &[String]) {
    assert!(
        lines.iter().any(|l| l.contains("at=librdkafka")),
        "librdkafka's debug logs should be in the output"
    );
}

/// Consumes 60 messages on 3 partitions with `builder` (for `topic` and `group`), stops
/// it with SIGTERM and checks the count, the commits, exit 0, the start line's `sasl=`
/// summary and that no secret was written.
fn consume_and_stop(builder: AckdBuilder, topic: &str, group: &str, sasl_summary: &str) {
    let delivered = produce_keyed(topic, 60, 0);
    let ackd = builder.spawn();
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);
    ackd.sigterm();
    let code = ackd.wait_exit(WAIT);
    let lines = ackd.lines();
    let all = lines.join("\n");
    assert_eq!(code, 0, "{all}");
    let start = at(&lines, "start");
    assert_eq!(start.len(), 1, "{all}");
    assert_eq!(
        field(start[0], "security").as_deref(),
        Some("sasl_ssl"),
        "{}",
        start[0]
    );
    assert_eq!(
        field(start[0], "sasl").as_deref(),
        Some(sasl_summary),
        "{}",
        start[0]
    );
    assert!(at(&lines, "auth_failed").is_empty(), "{all}");
    let processed = processed(&lines);
    let t = tally(&delivered, &processed, &lines);
    assert!(t.lost.is_empty() && t.duplicated.is_empty(), "{t:?}\n{all}");
    assert_eq!(processed.len(), delivered.len());
    assert_committed_to_ends(group, topic, 3, &log_ends(&delivered));
    assert_no_secret(&lines);
    assert_librdkafka_logged(&lines);
    eprintln!(
        "{sasl_summary}: {} delivered, {} processed, lost {}, duplicated {}, committed to the log ends, exit {code} after {:?}",
        delivered.len(),
        processed.len(),
        t.lost.len(),
        t.duplicated.len(),
        ackd.elapsed()
    );
}

#[test]
fn scram_sha_512_with_the_credentials_in_a_heroku_style_url_consumes_and_commits() {
    let (topic, group) = (unique_name("scram"), unique_name("g-scram"));
    let builder = ackd(
        &topic,
        &group,
        "SCRAM-SHA-512",
        &format!("{SCRAM_USER}:{SCRAM_PASSWORD}@"),
    );
    create_topic(&topic, 3);
    consume_and_stop(
        builder,
        &topic,
        &group,
        "mechanism=SCRAM-SHA-512,credentials=KAFKA_URL",
    );
}

#[test]
fn plain_with_the_ackd_sasl_settings_consumes_and_commits() {
    let (topic, group) = (unique_name("plain"), unique_name("g-plain"));
    let builder = ackd(&topic, &group, "PLAIN", "")
        .env("ACKD_SASL_USERNAME", PLAIN_USER)
        .env("ACKD_SASL_PASSWORD", PLAIN_PASSWORD);
    create_topic(&topic, 3);
    consume_and_stop(
        builder,
        &topic,
        &group,
        "mechanism=PLAIN,credentials=ACKD_SASL_USERNAME/ACKD_SASL_PASSWORD",
    );
}

/// Runs ackd expecting the broker to refuse its login: exit 77 within the bound, one
/// `at=auth_failed` line naming the broker with the broker's `reason`, no secret.
/// Returns the lines.
#[track_caller]
fn assert_login_refused(builder: AckdBuilder, mechanism: &str, reason: &str) -> Vec<String> {
    let daemon = !builder.has_arg("check");
    let ackd = builder.spawn();
    let code = ackd.wait_exit(AUTH_FAILURE_BOUND);
    let lines = ackd.lines();
    let all = lines.join("\n");
    assert_eq!(code, 77, "{all}");
    assert!(ackd.elapsed() < AUTH_FAILURE_BOUND);
    let failed = at(&lines, "auth_failed");
    assert_eq!(failed.len(), 1, "one line, not one per retry:\n{all}");
    let line = failed[0];
    assert_eq!(field(line, "level").as_deref(), Some("error"), "{line}");
    assert_eq!(
        field(line, "broker"),
        Some(format!("127.0.0.1:{}", sasl().broker.port())),
        "{line}"
    );
    assert!(
        field(line, "reason")
            .is_some_and(|r| r.contains("SASL authentication error") && r.contains(reason)),
        "{line} should give the reason {reason:?}"
    );
    assert!(
        field(line, "hint").is_some_and(|h| h.contains("password")),
        "{line}"
    );
    assert!(lines.iter().any(|l| at_exit_with(l, 77)), "{all}");
    assert_no_secret(&lines);
    if daemon {
        assert_librdkafka_logged(&lines);
        assert_stopped_at_the_auth_failure(&lines);
    }
    eprintln!(
        "{mechanism} wrong password: exit {code} after {:?}: {line}",
        ackd.elapsed()
    );
    lines
}

fn at_exit_with(line: &str, code: i32) -> bool {
    field(line, "at").as_deref() == Some("exit") && field(line, "code") == Some(code.to_string())
}

#[test]
fn a_wrong_scram_password_is_one_auth_failed_line_and_exit_77() {
    let builder = ackd(&unique_name("t"), &unique_name("g"), "SCRAM-SHA-512", "")
        .env("ACKD_SASL_USERNAME", SCRAM_USER)
        .env("ACKD_SASL_PASSWORD", WRONG_PASSWORD);
    assert_login_refused(
        builder,
        "SCRAM-SHA-512",
        "invalid credentials with SASL mechanism SCRAM-SHA-512",
    );
}

#[test]
fn a_wrong_plain_password_is_one_auth_failed_line_and_exit_77() {
    let builder = ackd(
        &unique_name("t"),
        &unique_name("g"),
        "PLAIN",
        &format!("{PLAIN_USER}:{}@", encode(WRONG_PASSWORD)),
    );
    assert_login_refused(builder, "PLAIN", "Invalid username or password");
}

/// `ackd check` over SASL_SSL: the right password passes every check, a
/// wrong one is the daemon's `at=auth_failed` line, `check=auth ok=false` and exit 77.
#[test]
fn ackd_check_over_sasl_passes_with_the_right_password_and_exits_77_with_a_wrong_one() {
    let (topic, group) = (unique_name("chk"), unique_name("g-chk"));
    sasl(); // the SASL broker is the one create_topic uses: start it first
    create_topic(&topic, 2);
    let good = ackd(&topic, &group, "SCRAM-SHA-512", "")
        .env("ACKD_SASL_USERNAME", SCRAM_USER)
        .env("ACKD_SASL_PASSWORD", SCRAM_PASSWORD)
        .arg("check")
        .spawn();
    let code = good.wait_exit(WAIT);
    let lines = good.lines();
    let all = lines.join("\n");
    assert_eq!(code, 0, "{all}");
    let checks = at(&lines, "check");
    assert_eq!(checks.len(), 5, "{all}");
    assert!(
        checks
            .iter()
            .all(|l| field(l, "ok").as_deref() == Some("true")),
        "{all}"
    );
    let auth = checks
        .iter()
        .find(|l| field(l, "check").as_deref() == Some("auth"))
        .unwrap();
    assert_eq!(
        field(auth, "security").as_deref(),
        Some("sasl_ssl"),
        "{auth}"
    );
    assert_eq!(
        field(auth, "sasl").as_deref(),
        Some("mechanism=SCRAM-SHA-512,credentials=ACKD_SASL_USERNAME/ACKD_SASL_PASSWORD"),
        "{auth}"
    );
    assert_no_secret(&lines);

    let wrong = ackd(&topic, &group, "SCRAM-SHA-512", "")
        .env("ACKD_SASL_USERNAME", SCRAM_USER)
        .env("ACKD_SASL_PASSWORD", WRONG_PASSWORD)
        .arg("check");
    let lines = assert_login_refused(
        wrong,
        "SCRAM-SHA-512",
        "invalid credentials with SASL mechanism SCRAM-SHA-512",
    );
    let all = lines.join("\n");
    let checks = at(&lines, "check");
    let failed: Vec<_> = checks
        .iter()
        .filter(|l| field(l, "ok").as_deref() == Some("false"))
        .collect();
    assert_eq!(failed.len(), 1, "{all}");
    assert_eq!(field(failed[0], "check").as_deref(), Some("auth"), "{all}");
    assert!(
        !checks
            .iter()
            .any(|l| field(l, "check").as_deref() == Some("topic")),
        "{all}"
    );
}
