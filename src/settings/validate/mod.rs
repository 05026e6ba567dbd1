//! Validation: the raw settings, checked one concern at a time, become [`Settings`].
//! Each concern's file holds its part of [`Settings`], its parse and its checks; the
//! settings of the commit and the stop are read here, with the check that a processor
//! call fits in the stop's drain. The steps run in a fixed order, so that of several
//! invalid settings the same one is named first; the checks across concerns run last.

pub(super) mod exec;
pub(super) mod failure;
pub(super) mod group;
pub(super) mod http_endpoint;
mod kafka;
pub(super) mod memory_budget;
pub(super) mod processing;
mod required;
pub(super) mod retry_topics;
pub(super) mod schemas;
pub(super) mod telemetry;

use std::collections::BTreeMap;

use crate::settings::properties::PassThrough;
use crate::settings::SettingError;

use super::keys::env_name;
use super::raw::RawSettings;
use super::{Settings, MAX_REDELIVERY_WINDOW, MIN_REDELIVERY_WINDOW};
use exec::ExecSettings;
use failure::FailureSettings;
use group::GroupSettings;
use http_endpoint::HttpSettings;
use kafka::Connection;
use memory_budget::MemorySetting;
use schemas::SchemaSettings;
use telemetry::{HealthSettings, LoggingSettings};

/// The settings the raw layer makes, or the first setting that is wrong.
pub(super) fn validate(raw: &RawSettings) -> Result<Settings, SettingError> {
    required::missing(raw)?;
    let connection = Connection::parse(raw)?;
    // Which names are valid is the processors' business (an embedding app has its own).
    let processor = raw.get("processor").to_ascii_lowercase();
    let (group, rdkafka) = GroupSettings::parse(raw)?;
    let logging = LoggingSettings::parse(raw)?;
    let failure = FailureSettings::parse(raw, &connection)?;
    let commit_interval = raw.millis("commit_interval_ms", 1, 3_600_000)?;
    let redelivery_window_max = raw.whole(
        "redelivery_window_max",
        MIN_REDELIVERY_WINDOW..=MAX_REDELIVERY_WINDOW,
        format!("expected a whole number of messages from {MIN_REDELIVERY_WINDOW} to {MAX_REDELIVERY_WINDOW}"),
    )?;
    let shutdown_timeout = raw.millis("shutdown_timeout_ms", 1, 3_600_000)?;
    let stop_at_end = raw.boolean("stop_at_end")?;
    let mut rdkafka = rdkafka;
    if stop_at_end {
        hold_no_fetch(raw, &mut rdkafka);
    }
    let (batching, concurrency) = processing::parse(raw)?;
    let exec = ExecSettings::parse(raw)?;
    let http = HttpSettings::parse(raw)?;
    let wait_for_topics = raw.boolean("wait_for_topics")?;
    let health = HealthSettings::parse(raw)?;
    let memory = MemorySetting::parse(raw)?;
    let schemas = SchemaSettings::parse(raw, connection.tls.as_ref())?;
    let settings = Settings {
        brokers: connection.brokers,
        topics: connection.topics,
        group_id: connection.group_id,
        kafka_prefix: connection.kafka_prefix,
        tls: connection.tls,
        sasl: connection.sasl,
        processor,
        commit_interval,
        redelivery_window_max,
        shutdown_timeout,
        stop_at_end,
        wait_for_topics,
        group,
        rdkafka,
        logging,
        failure,
        batching,
        concurrency,
        exec,
        http,
        health,
        memory,
        schemas,
        #[cfg(feature = "testkit")]
        test_delay: test_delay(raw)?,
    };
    processor_timeout_fits_the_drain(raw, &settings)?;
    memory_budget::budget_owns_the_prefetch_limits(&settings)?;
    processing::ordering_fits_concurrency(&settings.concurrency)?;
    http_endpoint::body_fits_batching(&settings)?;
    Ok(settings)
}

/// `fetch.wait.max.ms` under `ACKD_STOP_AT_END`, unless set by hand: a run to the end
/// waits for no new message, so the broker need not hold a fetch for one. librdkafka has
/// one fetch per broker in flight, and one held for partitions at their end kept a
/// partition still reading (left out of that fetch while its queue was full) waiting
/// out the hold, 100 ms by ackd's default, each time. 10 ms is how soon such a
/// partition is fetched again anyway (`fetch.queue.backoff.ms`).
fn hold_no_fetch(raw: &RawSettings, rdkafka: &mut BTreeMap<String, PassThrough>) {
    const PROPERTY: &str = "fetch.wait.max.ms";
    if raw.rdkafka_defaults.iter().any(|p| p == PROPERTY) {
        rdkafka.insert(
            PROPERTY.into(),
            PassThrough {
                value: "10".into(),
                origin: env_name("stop_at_end"),
            },
        );
    }
}

/// A message in flight when SIGTERM arrives must be able to finish inside the drain: the
/// processor's timeout (exec, http) may not be longer than [`Settings::drain_budget`].
/// Checked whether or not the processor's required setting is given (the processor
/// reports that one).
pub(super) fn processor_timeout_fits_the_drain(
    raw: &RawSettings,
    settings: &Settings,
) -> Result<(), SettingError> {
    let drain = settings.drain_budget();
    let processor_timeout = match settings.processor.as_str() {
        "exec" => Some(("exec_timeout_ms", exec::timeout(raw)?)),
        "http" => Some(("http_timeout_ms", http_endpoint::timeout(raw)?)),
        _ => None,
    };
    if let Some((key, timeout)) = processor_timeout {
        if timeout > drain {
            return Err(SettingError::new(
                env_name(key),
                Some(&timeout.as_millis().to_string()),
                format!(
                    "is longer than the {} ms that ACKD_SHUTDOWN_TIMEOUT_MS={} leaves in-flight messages \
                     to finish (the rest is kept for the final commit): a message in flight at SIGTERM \
                     could not finish before the deadline; lower it, or raise ACKD_SHUTDOWN_TIMEOUT_MS",
                    drain.as_millis(),
                    settings.shutdown_timeout.as_millis()
                ),
            ));
        }
    }
    Ok(())
}

/// Per-message delay of the testkit's `slow` processor.
#[cfg(feature = "testkit")]
fn test_delay(raw: &RawSettings) -> Result<crate::settings::test_delay::Delay, SettingError> {
    if raw.values.contains_key("test_delay_ms") {
        crate::settings::test_delay::Delay::parse(raw.get("test_delay_ms"), 3_600_000)
            .map_err(|problem| raw.error("test_delay_ms", problem))
    } else {
        Ok(Default::default())
    }
}

#[cfg(test)]
mod tests {
    use crate::settings::test_vars::{err, vars};
    use std::time::Duration;

    use crate::settings::{commit_reserve, Settings};

    #[test]
    fn invalid_values_name_the_setting_and_what_is_allowed() {
        for (name, value, allowed) in [
            ("ACKD_COMMIT_INTERVAL_MS", "5s", "milliseconds"),
            ("ACKD_COMMIT_INTERVAL_MS", "0", "from 1"),
            ("ACKD_SHUTDOWN_TIMEOUT_MS", "-1", "milliseconds"),
            ("ACKD_START_FROM", "beginning", "earliest or latest"),
            ("ACKD_LOG_MESSAGES", "maybe", "true or false"),
            ("ACKD_LOG_LEVEL", "loud", "info"),
            ("ACKD_EXEC_CONCURRENCY", "0", "from 1 to 256"),
            ("ACKD_EXEC_IN_FLIGHT", "0", "from 1 to 1000"),
            ("ACKD_EXEC_IN_FLIGHT", "1001", "requests from 1 to 1000"),
            ("ACKD_EXEC_TIMEOUT_MS", "30s", "milliseconds"),
            ("ACKD_EXEC_MAX_LINE_BYTES", "64k", "from 256 to 16777216"),
            ("ACKD_EXEC_MAX_LINE_BYTES", "100", "bytes from 256"),
            ("ACKD_METRIC_PREFIX", "my app", "l2met"),
            ("ACKD_TOPICS", "ok,bad topic", "valid topic name"),
            ("KAFKA_URL", "localhost", "no port"),
        ] {
            let e = err(&[(name, value)]);
            assert_eq!(e.setting, name, "{e}");
            assert_eq!(e.value.as_deref(), Some(value), "{e}");
            assert!(e.problem.contains(allowed), "{e}");
        }
    }

    #[cfg(feature = "testkit")]
    #[test]
    fn test_delay_is_a_number_or_a_random_range() {
        use crate::settings::test_delay::Delay;
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert_eq!(s.test_delay, Delay::default());
        let s = Settings::from_vars(vars(&[("ACKD_TEST_DELAY_MS", "400")])).unwrap();
        assert_eq!(s.test_delay, Delay::fixed(400));
        let s = Settings::from_vars(vars(&[("ACKD_TEST_DELAY_MS", "0-5")])).unwrap();
        assert_eq!(s.test_delay, Delay::parse("0-5", 5).unwrap());
        assert_eq!(s.test_delay.mean(), Duration::from_micros(2500));
        let e = err(&[("ACKD_TEST_DELAY_MS", "5-0")]);
        assert_eq!(e.setting, "ACKD_TEST_DELAY_MS", "{e}");
        assert!(e.problem.contains("MIN-MAX"), "{e}");
    }

    /// A run to the end has the broker hold no fetch long, unless the hold is set by hand.
    #[test]
    fn stop_at_end_shortens_the_fetch_hold_unless_it_is_set() {
        let hold = |extra: &[(&str, &str)]| {
            let s = Settings::from_vars(vars(extra)).unwrap();
            s.rdkafka["fetch.wait.max.ms"].value.clone()
        };
        assert_eq!(hold(&[]), "100", "config/default.toml's");
        assert_eq!(hold(&[("ACKD_STOP_AT_END", "true")]), "10");
        let by_hand = [
            ("ACKD_STOP_AT_END", "true"),
            ("ACKD_RDKAFKA_FETCH_WAIT_MAX_MS", "250"),
        ];
        assert_eq!(hold(&by_hand), "250");
    }

    /// A message in flight at SIGTERM can finish: the defaults' processor timeouts fit in
    /// the drain's share of the shutdown deadline.
    #[test]
    fn default_processor_timeouts_fit_in_the_drain() {
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert_eq!(s.drain_budget(), Duration::from_millis(20000));
        // Both processors start with their defaults.
        let exec = Settings::from_vars(vars(&[
            ("ACKD_PROCESSOR", "exec"),
            ("ACKD_EXEC_COMMAND", "cat"),
        ]))
        .unwrap()
        .exec
        .unwrap();
        assert!(exec.timeout <= s.drain_budget(), "{:?}", exec.timeout);
        let http = Settings::from_vars(vars(&[
            ("ACKD_PROCESSOR", "http"),
            ("ACKD_HTTP_URL", "http://127.0.0.1:1/"),
        ]))
        .unwrap()
        .http
        .unwrap();
        assert!(http.timeout <= s.drain_budget(), "{:?}", http.timeout);
        // The reserve for the commit: a fifth, at most 5 s.
        assert_eq!(
            commit_reserve(Duration::from_secs(5)),
            Duration::from_secs(1)
        );
        assert_eq!(
            commit_reserve(Duration::from_secs(60)),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn a_processor_timeout_longer_than_the_drain_is_refused() {
        let e = err(&[
            ("ACKD_PROCESSOR", "http"),
            ("ACKD_HTTP_URL", "http://127.0.0.1:1/"),
            ("ACKD_HTTP_TIMEOUT_MS", "30000"),
        ]);
        assert_eq!(e.setting, "ACKD_HTTP_TIMEOUT_MS", "{e}");
        assert!(e.problem.contains("20000 ms"), "{e}");
        assert!(e.problem.contains("ACKD_SHUTDOWN_TIMEOUT_MS=25000"), "{e}");
        let e = err(&[
            ("ACKD_PROCESSOR", "exec"),
            ("ACKD_EXEC_COMMAND", "cat"),
            ("ACKD_SHUTDOWN_TIMEOUT_MS", "5000"),
            ("ACKD_EXEC_TIMEOUT_MS", "4500"),
        ]);
        assert_eq!(e.setting, "ACKD_EXEC_TIMEOUT_MS", "{e}");
        assert!(e.problem.contains("4000 ms"), "{e}");
        // Without its command the processor's timeout is checked all the same.
        let e = err(&[
            ("ACKD_PROCESSOR", "exec"),
            ("ACKD_EXEC_TIMEOUT_MS", "30000"),
        ]);
        assert_eq!(e.setting, "ACKD_EXEC_TIMEOUT_MS", "{e}");
        // Exactly the drain's share is allowed; a processor that does not use it is not checked.
        Settings::from_vars(vars(&[
            ("ACKD_PROCESSOR", "exec"),
            ("ACKD_EXEC_COMMAND", "cat"),
            ("ACKD_SHUTDOWN_TIMEOUT_MS", "5000"),
            ("ACKD_EXEC_TIMEOUT_MS", "4000"),
        ]))
        .unwrap();
        Settings::from_vars(vars(&[("ACKD_SHUTDOWN_TIMEOUT_MS", "1000")])).unwrap();
    }
}
