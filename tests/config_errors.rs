//! Bad configuration: exit code 78, one logfmt line naming the setting, no panic, no
//! secret. Most cases need no broker (ackd stops before connecting); librdkafka's own
//! refusals are checked too, since they are found when the consumer is created.

mod common;

use std::process::{Command, Stdio};

use common::lines::{field, logfmt};

/// Runs the real binary with exactly `env` (plus PATH) and returns (code, output lines).
/// A configuration error ends ackd at once; one that does not is killed after 30 s so
/// the test fails instead of hanging.
fn run(env: &[(&str, &str)]) -> (i32, Vec<String>) {
    run_command(&[], env)
}

/// [`run`] with arguments (`check`).
fn run_command(args: &[&str], env: &[(&str, &str)]) -> (i32, Vec<String>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ackd"));
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = common::spawn::spawn_tied(cmd).expect("run ackd");
    let pid = child.id() as libc::pid_t;
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .is_err()
        {
            // SAFETY: plain kill(2) of our own child's pid.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output().expect("wait for ackd");
    let _ = done_tx.send(());
    let _ = watchdog.join();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (
        out.status.code().unwrap_or(-1),
        text.lines().map(str::to_string).collect(),
    )
}

const BASE: &[(&str, &str)] = &[
    ("KAFKA_URL", "127.0.0.1:1"),
    ("ACKD_TOPICS", "orders"),
    ("ACKD_GROUP_ID", "billing"),
];

fn with(
    extra: &[(&'static str, &'static str)],
    without: &[&str],
) -> Vec<(&'static str, &'static str)> {
    let mut env: Vec<_> = BASE
        .iter()
        .copied()
        .filter(|(k, _)| !without.contains(k))
        .collect();
    env.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
    env.extend_from_slice(extra);
    env
}

#[track_caller]
fn assert_config_error(env: &[(&str, &str)], setting: &str, mentions: &str) {
    config_error_lines(env, setting, mentions);
}

/// [`assert_config_error`], returning the run's lines.
#[track_caller]
fn config_error_lines(env: &[(&str, &str)], setting: &str, mentions: &str) -> Vec<String> {
    let (code, lines) = run(env);
    let all = lines.join("\n");
    assert_eq!(code, 78, "{all}");
    let errors: Vec<_> = lines
        .iter()
        .filter(|l| field(l, "at").as_deref() == Some("config_error"))
        .collect();
    assert_eq!(errors.len(), 1, "exactly one error line expected:\n{all}");
    let line = errors[0];
    assert_eq!(field(line, "level").as_deref(), Some("error"), "{line}");
    assert_eq!(field(line, "setting").as_deref(), Some(setting), "{line}");
    assert!(
        line.contains(mentions),
        "{line} should mention {mentions:?}"
    );
    assert!(!logfmt(line).is_empty());
    assert!(
        !all.contains("panicked") && !all.contains("RUST_BACKTRACE"),
        "{all}"
    );
    assert!(
        lines
            .iter()
            .any(|l| field(l, "at").as_deref() == Some("exit")
                && field(l, "code").as_deref() == Some("78")),
        "{all}"
    );
    lines
}

#[test]
fn missing_required_settings() {
    assert_config_error(&with(&[], &["KAFKA_URL"]), "KAFKA_URL", "required");
    assert_config_error(&with(&[], &["ACKD_TOPICS"]), "ACKD_TOPICS", "required");
    assert_config_error(&with(&[], &["ACKD_GROUP_ID"]), "ACKD_GROUP_ID", "required");
}

/// Every missing required setting is named in the one line, not one per run: a new user
/// fixes them all at once.
#[test]
fn missing_required_settings_are_reported_together() {
    assert_config_error(
        &[],
        "KAFKA_URL,ACKD_TOPICS,ACKD_GROUP_ID",
        "ACKD_GROUP_ID: ",
    );
    assert_config_error(
        &with(&[], &["ACKD_TOPICS", "ACKD_GROUP_ID"]),
        "ACKD_TOPICS,ACKD_GROUP_ID",
        "ACKD_TOPICS: ",
    );
    // What a processor or a failure policy requires is missing as well.
    assert_config_error(
        &[("ACKD_PROCESSOR", "exec")],
        "KAFKA_URL,ACKD_TOPICS,ACKD_GROUP_ID,ACKD_EXEC_COMMAND",
        "ACKD_EXEC_COMMAND: ",
    );
    assert_config_error(
        &with(&[("ACKD_PROCESSOR", "http")], &["KAFKA_URL"]),
        "KAFKA_URL,ACKD_HTTP_URL",
        "ACKD_HTTP_URL: ",
    );
    assert_config_error(
        &with(&[("ACKD_ON_FAILURE", "dead-letter")], &["ACKD_GROUP_ID"]),
        "ACKD_GROUP_ID,ACKD_DEAD_LETTER_TOPIC",
        "ACKD_DEAD_LETTER_TOPIC: ",
    );
}

#[test]
fn invalid_values_name_what_is_allowed() {
    assert_config_error(
        &with(&[("KAFKA_URL", "http://x:1")], &[]),
        "KAFKA_URL",
        "kafka+ssl://",
    );
    assert_config_error(
        &with(&[("ACKD_COMMIT_INTERVAL_MS", "5s")], &[]),
        "ACKD_COMMIT_INTERVAL_MS",
        "milliseconds",
    );
    assert_config_error(
        &with(&[("ACKD_START_FROM", "beginning")], &[]),
        "ACKD_START_FROM",
        "earliest or latest",
    );
    assert_config_error(
        &with(&[("ACKD_PROCESSOR", "nope")], &[]),
        "ACKD_PROCESSOR",
        "log",
    );
    assert_config_error(
        &with(&[("ACKD_LOG_MESSAGES", "sometimes")], &[]),
        "ACKD_LOG_MESSAGES",
        "true or false",
    );
    assert_config_error(
        &with(&[("ACKD_SHUTDOWN_TIMOUT_MS", "1")], &[]),
        "ACKD_SHUTDOWN_TIMOUT_MS",
        "ACKD_SHUTDOWN_TIMEOUT_MS",
    );
}

/// `ACKD_HEALTH_ADDR` must be an IP address (checked even while the endpoint is off),
/// and one this host has: an address it cannot listen on names ACKD_HEALTH_ADDR, not
/// the port.
#[test]
fn a_health_address_that_cannot_be_listened_on_is_refused_by_name() {
    for (addr, port) in [("localhost", "8080"), ("0.0.0.0:8080", "0")] {
        assert_config_error(
            &with(
                &[("ACKD_HEALTH_ADDR", addr), ("ACKD_HEALTH_PORT", port)],
                &[],
            ),
            "ACKD_HEALTH_ADDR",
            "expected an IP address",
        );
    }
    // TEST-NET-1 (RFC 5737): an address no host of this network has.
    assert_config_error(
        &with(
            &[
                ("ACKD_HEALTH_ADDR", "192.0.2.1"),
                ("ACKD_HEALTH_PORT", "8080"),
            ],
            &[],
        ),
        "ACKD_HEALTH_ADDR",
        "cannot listen on 192.0.2.1:8080",
    );
}

#[test]
fn batch_settings_out_of_range_or_that_a_processor_cannot_carry() {
    assert_config_error(
        &with(&[("ACKD_BATCH_MAX_MESSAGES", "0")], &[]),
        "ACKD_BATCH_MAX_MESSAGES",
        "from 1 (no batches) to 10000",
    );
    assert_config_error(
        &with(&[("ACKD_BATCH_MAX_WAIT_MS", "60001")], &[]),
        "ACKD_BATCH_MAX_WAIT_MS",
        "60000",
    );
    // A raw HTTP body is one message's value: it cannot carry a batch.
    assert_config_error(
        &with(
            &[
                ("ACKD_PROCESSOR", "http"),
                ("ACKD_HTTP_URL", "http://127.0.0.1:1/"),
                ("ACKD_HTTP_BODY", "raw"),
                ("ACKD_BATCH_MAX_MESSAGES", "10"),
            ],
            &[],
        ),
        "ACKD_HTTP_BODY",
        "cannot carry a batch",
    );
}

/// A processor that may take longer than the drain could leave a message in flight at
/// SIGTERM unfinished at the deadline: refused before anything starts.
#[test]
fn a_processor_timeout_that_does_not_fit_the_shutdown_is_refused() {
    assert_config_error(
        &with(
            &[
                ("ACKD_PROCESSOR", "http"),
                ("ACKD_HTTP_URL", "http://127.0.0.1:1/"),
                ("ACKD_HTTP_TIMEOUT_MS", "30000"),
            ],
            &[],
        ),
        "ACKD_HTTP_TIMEOUT_MS",
        "ACKD_SHUTDOWN_TIMEOUT_MS=25000",
    );
    assert_config_error(
        &with(
            &[
                ("ACKD_PROCESSOR", "exec"),
                ("ACKD_EXEC_COMMAND", "cat"),
                ("ACKD_SHUTDOWN_TIMEOUT_MS", "10000"),
                ("ACKD_EXEC_TIMEOUT_MS", "9000"),
            ],
            &[],
        ),
        "ACKD_EXEC_TIMEOUT_MS",
        "8000 ms",
    );
}

#[test]
fn pass_through_properties_librdkafka_or_ackd_refuse() {
    // librdkafka refuses: the error names the variable it came from.
    assert_config_error(
        &with(&[("ACKD_RDKAFKA_NO_SUCH_PROPERTY", "1")], &[]),
        "ACKD_RDKAFKA_NO_SUCH_PROPERTY",
        "no.such.property",
    );
    assert_config_error(
        &with(&[("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "soon")], &[]),
        "ACKD_RDKAFKA_SESSION_TIMEOUT_MS",
        "session.timeout.ms",
    );
    // ackd owns the offset store and commit.
    assert_config_error(
        &with(&[("ACKD_RDKAFKA_ENABLE_AUTO_OFFSET_STORE", "true")], &[]),
        "ACKD_RDKAFKA_ENABLE_AUTO_OFFSET_STORE",
        "ackd owns",
    );
}

/// A secret passed through beside a property librdkafka refuses: the error names the
/// refused one, and the secret is shown nowhere, `[redacted]` on the start line.
#[test]
fn secrets_in_refused_properties_are_not_shown() {
    let env = with(
        &[
            ("ACKD_RDKAFKA_SASL_PASSWORD", "hunter2-secret"),
            ("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "soon"),
        ],
        &[],
    );
    let lines = config_error_lines(
        &env,
        "ACKD_RDKAFKA_SESSION_TIMEOUT_MS",
        "librdkafka refused `session.timeout.ms`",
    );
    let all = lines.join("\n");
    assert!(!all.contains("hunter2-secret"), "{all}");
    let start = lines
        .iter()
        .find(|l| field(l, "at").as_deref() == Some("start"))
        .unwrap_or_else(|| panic!("no at=start: {all}"));
    assert!(start.contains("sasl.password=[redacted]"), "{start}");
}

/// ACKD_GROUP_PROTOCOL=consumer (KIP-848): the classic protocol's properties are refused
/// by name, with what to do instead; before ACKD_GROUP_PROTOCOL, asking librdkafka for the
/// consumer protocol ended in exit 70 over ackd's own default assignor.
#[test]
fn the_consumer_protocol_refuses_classic_only_properties_by_name() {
    for (var, value, mentions) in [
        (
            "ACKD_RDKAFKA_SESSION_TIMEOUT_MS",
            "6000",
            "group.consumer.session.timeout.ms",
        ),
        (
            "ACKD_RDKAFKA_HEARTBEAT_INTERVAL_MS",
            "300",
            "group.consumer.heartbeat.interval.ms",
        ),
        (
            "ACKD_RDKAFKA_PARTITION_ASSIGNMENT_STRATEGY",
            "range",
            "ACKD_RDKAFKA_GROUP_REMOTE_ASSIGNOR",
        ),
        (
            "ACKD_RDKAFKA_GROUP_PROTOCOL_TYPE",
            "consumer",
            "classic protocol only",
        ),
    ] {
        assert_config_error(
            &with(&[("ACKD_GROUP_PROTOCOL", "consumer"), (var, value)], &[]),
            var,
            mentions,
        );
    }
    assert_config_error(
        &with(&[("ACKD_GROUP_PROTOCOL", "848")], &[]),
        "ACKD_GROUP_PROTOCOL",
        "classic",
    );
    // The pass-through is refused in favour of the setting: a setting's error, not 70.
    assert_config_error(
        &with(&[("ACKD_RDKAFKA_GROUP_PROTOCOL", "consumer")], &[]),
        "ACKD_RDKAFKA_GROUP_PROTOCOL",
        "ACKD_GROUP_PROTOCOL",
    );
    assert_config_error(
        &with(&[("ACKD_RDKAFKA_GROUP_REMOTE_ASSIGNOR", "uniform")], &[]),
        "ACKD_RDKAFKA_GROUP_REMOTE_ASSIGNOR",
        "ACKD_GROUP_PROTOCOL=consumer",
    );
}

/// A `,` in KAFKA_URL's password: the user info is taken off before the URL is split on
/// `,`, or the piece of the password before the `,` would be shown as a port that is not
/// a number, by ackd and by `ackd check`. The error names KAFKA_URL and what it allows,
/// and nothing of the password or the user name.
#[test]
fn a_comma_in_the_kafka_url_password_never_shows_a_fragment_of_it() {
    for url in [
        "kafka+sasl-ssl://bob-the-user:s3cr3tpart,t41lpart@h:notaport",
        "kafka+sasl-ssl://bob-the-user:s3cr3tpart,t41lpart@h:9092,kafka+ssl://h2:9093",
        "kafka+ssl://bob-the-user:s3cr3tpart,t41lpart@h:9092",
    ] {
        for args in [&[][..], &["check"]] {
            let env = with(&[("KAFKA_URL", url), ("ACKD_SASL_MECHANISM", "PLAIN")], &[]);
            let (code, lines) = run_command(args, &env);
            let all = lines.join("\n");
            assert_eq!(code, 78, "{args:?} {url}: {all}");
            for fragment in ["s3cr3t", "t41l", "bob-the"] {
                assert!(
                    !all.contains(fragment),
                    "{args:?} {url}: {fragment} in {all}"
                );
            }
            let error = lines
                .iter()
                .find(|l| field(l, "at").as_deref() == Some("config_error"))
                .unwrap_or_else(|| panic!("no config_error: {all}"));
            assert_eq!(
                field(error, "setting").as_deref(),
                Some("KAFKA_URL"),
                "{error}"
            );
            assert!(
                error.contains("kafka+sasl-ssl://[user:password@]host:port"),
                "{error}"
            );
        }
    }
}

/// librdkafka's sensitive properties are never shown, whatever their name says: here
/// the refused property is one (this librdkafka build does not support it): its error
/// names it with `value=[redacted]`.
#[test]
fn a_refused_sensitive_property_is_not_shown_whatever_its_name() {
    const VAR: &str = "ACKD_RDKAFKA_SASL_OAUTHBEARER_ASSERTION_PRIVATE_KEY_PASSPHRASE";
    let env = with(&[(VAR, "pp-Zq81-phrase")], &[]);
    let lines = config_error_lines(
        &env,
        VAR,
        "librdkafka refused `sasl.oauthbearer.assertion.private.key.passphrase`",
    );
    let all = lines.join("\n");
    assert!(!all.contains("Zq81"), "{all}");
    let error = lines
        .iter()
        .find(|l| field(l, "at").as_deref() == Some("config_error"))
        .unwrap();
    assert_eq!(
        field(error, "value").as_deref(),
        Some("[redacted]"),
        "{error}"
    );
}
