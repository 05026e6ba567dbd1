//! TLS against a real TLS endpoint, as on Heroku: stunnel terminates TLS in front of the
//! test broker (Tansu speaks no TLS, TANSU.md), requires a client certificate signed by a
//! CA this test generates, and presents a server certificate for
//! `ec2-1.compute.amazonaws.com`, which does not match `127.0.0.1` (Heroku's broker
//! certificates do not match the broker host names either).
//!
//! The broker advertises stunnel's port, so every client goes through TLS: ackd, and the
//! harness's producer and committed-offsets reader too (with the same client certificate;
//! a plain client would be sent to the TLS port by the metadata).
//!
//! Also here: the configuration errors of the TLS and SASL settings (exit 78). SASL itself
//! cannot be exercised against Tansu (TANSU.md); its mapping to librdkafka is unit-tested
//! in src/client_config.rs and src/security.rs.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use common::*;

const WAIT: Duration = Duration::from_secs(60);
/// How long an authentication failure may take to stop ackd.
const AUTH_FAILURE_BOUND: Duration = Duration::from_secs(30);
const PREFIX: &str = "tenant-x.";

/// The generated PKI (PEM files and their contents).
struct Pki {
    dir: PathBuf,
    ca: String,
    other_ca: String,
    client_cert: String,
    client_key: String,
}

impl Pki {
    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// Every PEM body line: none may appear in ackd's output.
    fn body_lines(&self) -> Vec<String> {
        [
            &self.ca,
            &self.other_ca,
            &self.client_cert,
            &self.client_key,
        ]
        .iter()
        .flat_map(|pem| pem.lines())
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .map(str::to_string)
        .collect()
    }
}

/// The TLS endpoint in front of the broker.
struct TlsEndpoint {
    pki: Pki,
    port: u16,
    broker_port: u16,
    stunnel: Mutex<Child>,
    /// Tests share the endpoint; the one that changes it takes it exclusively.
    users: RwLock<()>,
}

impl TlsEndpoint {
    /// For a test that uses the endpoint as it is.
    fn shared(&self) -> RwLockReadGuard<'_, ()> {
        self.users.read().unwrap_or_else(|e| e.into_inner())
    }

    /// For a test that changes the endpoint (and restores it).
    fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.users.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Restarts stunnel so that it accepts client certificates signed by `client_ca`.
    fn restart_stunnel(&self, client_ca: &str) {
        let mut child = self.stunnel.lock().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
        *child = start_stunnel(&self.pki, self.port, self.broker_port, client_ca);
    }
}

fn tls() -> &'static TlsEndpoint {
    static TLS: OnceLock<TlsEndpoint> = OnceLock::new();
    TLS.get_or_init(start_tls)
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl (scripts/install-tansu installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate whose names do not match 127.0.0.1, a client certificate
/// (an RSA key in PKCS#1 form, as Heroku hands them out), and an unrelated CA.
fn generate_pki() -> Pki {
    let dir = log_dir().join(format!("tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the PKI directory");
    let ec = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"];
    for (key, cn) in [("ca", "ackd test CA"), ("other-ca", "unrelated CA")] {
        openssl(
            &dir,
            &[&["genpkey"][..], &ec, &["-out", &format!("{key}.key")]].concat(),
        );
        openssl(
            &dir,
            &[
                "req",
                "-x509",
                "-key",
                &format!("{key}.key"),
                "-out",
                &format!("{key}.pem"),
                "-days",
                "2",
                "-subj",
                &format!("/CN={cn}"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
    }
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:ec2-1.compute.amazonaws.com\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("client.ext"),
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    openssl(
        &dir,
        &[&["genpkey"][..], &ec, &["-out", "server.key"]].concat(),
    );
    openssl(
        &dir,
        &["genrsa", "-traditional", "-out", "client.key", "2048"],
    );
    for (name, cn, serial) in [
        ("server", "ec2-1.compute.amazonaws.com", "2"),
        ("client", "ackd-client", "3"),
    ] {
        openssl(
            &dir,
            &[
                "req",
                "-new",
                "-key",
                &format!("{name}.key"),
                "-subj",
                &format!("/CN={cn}"),
                "-out",
                &format!("{name}.csr"),
            ],
        );
        openssl(
            &dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-set_serial",
                serial,
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.pem"),
            ],
        );
    }
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("read a generated PEM");
    let client_key = read("client.key");
    assert!(client_key.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
    Pki {
        ca: read("ca.pem"),
        other_ca: read("other-ca.pem"),
        client_cert: read("client.pem"),
        client_key,
        dir,
    }
}

/// `stunnel4` (Debian's name) or `stunnel` on PATH.
fn stunnel_bin() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in ["stunnel4", "stunnel"] {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!("stunnel not found on PATH: run scripts/install-tansu (or scripts/test), which installs stunnel4");
}

fn start_tls() -> TlsEndpoint {
    let started = Instant::now();
    let pki = generate_pki();
    let port = free_port();
    // The broker advertises stunnel's port; the harness's clients use TLS like ackd.
    let b = broker_with(BrokerOptions {
        advertised_port: Some(port),
        client_config: vec![
            ("security.protocol".into(), "ssl".into()),
            ("ssl.ca.location".into(), pki.path("ca.pem")),
            ("ssl.certificate.location".into(), pki.path("client.pem")),
            ("ssl.key.location".into(), pki.path("client.key")),
            (
                "ssl.endpoint.identification.algorithm".into(),
                "none".into(),
            ),
        ],
    });
    let child = start_stunnel(&pki, port, b.port(), "ca.pem");
    eprintln!(
        "tls: PKI, broker and stunnel on 127.0.0.1:{port} ready in {:?}",
        started.elapsed(),
    );
    TlsEndpoint {
        pki,
        port,
        broker_port: b.port(),
        stunnel: Mutex::new(child),
        users: RwLock::new(()),
    }
}

/// stunnel: TLS on `port` with the server certificate, requiring a client certificate
/// signed by `client_ca` (a file of the PKI), forwarding to the broker. Returns once
/// `port` accepts connections.
fn start_stunnel(pki: &Pki, port: u16, broker_port: u16, client_ca: &str) -> Child {
    let conf = pki.dir.join(format!("stunnel-{client_ca}.conf"));
    std::fs::write(
        &conf,
        format!(
            "foreground = yes\npid =\n[kafka]\naccept = 127.0.0.1:{port}\nconnect = 127.0.0.1:{broker_port}\n\
             cert = {}\nkey = {}\nCAfile = {}\nverifyChain = yes\n",
            pki.path("server.pem"),
            pki.path("server.key"),
            pki.path(client_ca),
        ),
    )
    .unwrap();
    let log_path = log_dir().join(format!("stunnel-{}-{port}.log", std::process::id()));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .expect("open the stunnel log");
    let mut cmd = Command::new(stunnel_bin());
    cmd.arg(&conf)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    let mut child = spawn_tied(cmd).expect("spawn stunnel");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().expect("try_wait on stunnel") {
            panic!(
                "stunnel exited with {status}; log {}:\n{}",
                log_path.display(),
                read_lossy(&log_path)
            );
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return child;
        }
        assert!(
            Instant::now() < deadline,
            "stunnel did not accept on {addr}; log {}:\n{}",
            log_path.display(),
            read_lossy(&log_path)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// ackd against the TLS endpoint with `topic` and `group` as given (unprefixed).
fn ackd(topic: &str, group: &str) -> AckdBuilder {
    let t = tls();
    AckdBuilder::new(topic, group).env("KAFKA_URL", format!("kafka+ssl://127.0.0.1:{}", t.port))
}

/// Heroku's variables for mutual TLS.
fn heroku(builder: AckdBuilder) -> AckdBuilder {
    let pki = &tls().pki;
    builder
        .env("KAFKA_TRUSTED_CERT", &pki.ca)
        .env("KAFKA_CLIENT_CERT", &pki.client_cert)
        .env("KAFKA_CLIENT_CERT_KEY", &pki.client_key)
}

/// No PEM content and no test password anywhere in the output.
#[track_caller]
fn assert_no_secret(lines: &[String]) {
    let all = lines.join("\n");
    for body in tls().pki.body_lines() {
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
    let _endpoint = tls().shared();
    let pki = &tls().pki;
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
    ackd.sigterm();
    assert_eq!(ackd.wait_exit(WAIT), 0, "{}", ackd.lines().join("\n"));
    let lines = ackd.lines();

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
}

/// Runs ackd expecting an authentication failure: exit 77 within the bound, one
/// `at=auth_failed` line naming the broker with `reason` in it. Returns that line.
#[track_caller]
fn assert_auth_failure(builder: AckdBuilder, reason: &str) -> String {
    let ackd = builder.spawn();
    let code = ackd.wait_exit(AUTH_FAILURE_BOUND);
    let lines = ackd.lines();
    let all = lines.join("\n");
    assert_eq!(code, 77, "{all}");
    assert!(ackd.elapsed() < AUTH_FAILURE_BOUND);
    let failed = at(&lines, "auth_failed");
    assert_eq!(failed.len(), 1, "one line, not one per retry:\n{all}");
    let line = failed[0].clone();
    assert_eq!(field(&line, "level").as_deref(), Some("error"), "{line}");
    assert_eq!(
        field(&line, "broker"),
        Some(format!("127.0.0.1:{}", tls().port)),
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
    line
}

#[test]
fn without_the_client_certificate_the_broker_refuses_and_ackd_exits_77() {
    let _endpoint = tls().shared();
    let builder =
        ackd(&unique_name("t"), &unique_name("g")).env("KAFKA_TRUSTED_CERT", &tls().pki.ca);
    let line = assert_auth_failure(builder, "certificate required");
    assert!(
        field(&line, "hint").is_some_and(|h| h.contains("KAFKA_CLIENT_CERT")),
        "{line}"
    );
}

#[test]
fn with_the_wrong_trusted_ca_ackd_refuses_the_broker_and_exits_77() {
    let _endpoint = tls().shared();
    let builder = heroku(ackd(&unique_name("t"), &unique_name("g")))
        .env("KAFKA_TRUSTED_CERT", &tls().pki.other_ca);
    let line = assert_auth_failure(builder, "certificate verify failed");
    assert!(
        field(&line, "hint").is_some_and(|h| h.contains("KAFKA_TRUSTED_CERT")),
        "{line}"
    );
}

#[test]
fn without_a_trusted_cert_the_system_roots_verify_the_broker_and_refuse_a_private_ca() {
    let _endpoint = tls().shared();
    let builder =
        heroku(ackd(&unique_name("t"), &unique_name("g"))).env_remove("KAFKA_TRUSTED_CERT");
    assert_auth_failure(builder, "certificate verify failed");
}

#[test]
fn the_host_name_check_is_what_a_pinned_ca_turns_off() {
    let _endpoint = tls().shared();
    // The server certificate is for ec2-1.compute.amazonaws.com: with the check turned
    // back on over the right CA, the connection to 127.0.0.1 fails.
    let builder = heroku(ackd(&unique_name("t"), &unique_name("g"))).env(
        "ACKD_RDKAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM",
        "https",
    );
    assert_auth_failure(builder, "certificate verify failed");
}

#[test]
fn a_tls_broker_that_is_down_is_retried_not_fatal() {
    let _endpoint = tls().shared();
    let ackd = heroku(ackd(&unique_name("t"), &unique_name("g")))
        .env(
            "KAFKA_URL",
            format!("kafka+ssl://127.0.0.1:{}", free_port()),
        )
        .spawn();
    // librdkafka reports the refused connections as "all brokers down", over and over;
    // ackd says so once (at=brokers_unreachable, repeated only every 30 s).
    let down = |l: &str| {
        field(l, "level").as_deref() == Some("error")
            && field(l, "at").as_deref() == Some("brokers_unreachable")
    };
    ackd.wait_for_count(down, 1, WAIT);
    // An observation window, not a readiness wait: an authentication failure stops ackd
    // within a fraction of a second (the tests above); a broker that is down must not
    // stop it, however long that lasts.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(ackd.try_exit_code(), None, "{}", ackd.lines().join("\n"));
    ackd.sigterm();
    assert_eq!(ackd.wait_exit(WAIT), 0);
    let lines = ackd.lines();
    assert!(at(&lines, "auth_failed").is_empty(), "{}", lines.join("\n"));
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
    let _endpoint = tls().shared();
    let pki = &tls().pki;
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

/// Puts stunnel back as the other tests expect it, also when the test fails.
struct RestoreStunnel;

impl Drop for RestoreStunnel {
    fn drop(&mut self) {
        tls().restart_stunnel("ca.pem");
    }
}

#[test]
fn when_the_broker_stops_accepting_the_certificate_at_run_time_ackd_stops_with_77() {
    let t = tls();
    let _endpoint = t.exclusive();
    let topic = unique_name("rotated");
    let group = unique_name("g-rotated");
    create_topic(&topic, 2);
    let delivered = produce_keyed(&topic, 20, 0);
    let ackd = heroku(ackd(&topic, &group))
        // Only the stop commits: what was acked is still to commit when the failure comes.
        .env("ACKD_COMMIT_INTERVAL_MS", "600000")
        .spawn();
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);

    // The broker side now trusts another CA only (a revoked or rotated client
    // certificate): open connections drop, every reconnect is refused.
    let _restore = RestoreStunnel;
    let changed = Instant::now();
    t.restart_stunnel("other-ca.pem");
    let code = ackd.wait_exit(AUTH_FAILURE_BOUND);
    let lines = ackd.lines();
    let all = lines.join("\n");
    assert_eq!(code, 77, "{all}");
    assert!(changed.elapsed() < AUTH_FAILURE_BOUND);
    let failed = at(&lines, "auth_failed");
    assert_eq!(failed.len(), 1, "{all}");
    assert_eq!(
        field(failed[0], "broker"),
        Some(format!("127.0.0.1:{}", t.port)),
        "{}",
        failed[0]
    );
    assert!(
        field(failed[0], "reason").is_some_and(|r| r.contains("certificate required")),
        "{}",
        failed[0]
    );
    // It stopped the graceful way: the stop sequence ran and said what it could not commit.
    assert_eq!(at(&lines, "shutdown_begun").len(), 1, "{all}");
    assert!(!at(&lines, "commit_failed").is_empty(), "{all}");
    assert_no_secret(&lines);
}
