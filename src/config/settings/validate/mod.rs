//! Validation: the raw settings, checked one concern at a time, become [`Settings`].
//! The steps run in the order ackd has always checked the settings in, so that of
//! several invalid settings the same one is named first.

mod exec;
mod failure;
mod group;
mod health;
mod http;
mod kafka;
mod logging;
mod memory;
mod processing;
mod required;
mod shutdown;

use crate::config::error::SettingError;

use super::raw::RawSettings;
use super::{Settings, MAX_REDELIVERY_WINDOW, MIN_REDELIVERY_WINDOW};

impl RawSettings {
    pub(super) fn validate(self) -> Result<Settings, SettingError> {
        self.missing()?;
        let connection = self.connection()?;
        // Which names are valid is the processors' business (an embedding app has its own).
        let processor = self.get("processor").to_ascii_lowercase();
        let start_from = self.start_from()?;
        let logging = self.logging()?;
        let failure = self.failure_policy(&connection)?;
        let (group_protocol, rdkafka) = self.group_protocol()?;
        let group_instance_id = self.group_instance_id()?;
        let metrics_interval = self.millis("metrics_interval_ms", 0, 3_600_000)?;
        let commit_interval = self.millis("commit_interval_ms", 1, 3_600_000)?;
        let redelivery_window_max = self.whole(
            "redelivery_window_max",
            MIN_REDELIVERY_WINDOW..=MAX_REDELIVERY_WINDOW,
            format!("expected a whole number of messages from {MIN_REDELIVERY_WINDOW} to {MAX_REDELIVERY_WINDOW}"),
        )?;
        let shutdown_timeout = self.millis("shutdown_timeout_ms", 1, 3_600_000)?;
        let log_messages = self.boolean("log_messages")?;
        let stop_at_end = self.boolean("stop_at_end")?;
        let processing = self.processing()?;
        let exec = self.exec()?;
        let http = self.http()?;
        let wait_for_topics = self.boolean("wait_for_topics")?;
        let (health_listen, health_stuck) = (self.health_listen()?, self.health_stuck()?);
        let memory = self.memory()?;
        let exec_pass_secrets = self.exec_pass_secrets()?;
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
            start_from,
            metric_prefix: logging.metric_prefix,
            metric_source: logging.metric_source,
            metrics_interval,
            log_messages,
            log_level: logging.log_level,
            stop_at_end,
            retry: failure.retry,
            on_failure: failure.on_failure,
            dead_letter_topic: failure.dead_letter_topic,
            group_instance_id,
            group_protocol,
            rdkafka,
            batch_max_messages: processing.batch_max_messages,
            ordering: processing.ordering,
            concurrency: processing.concurrency,
            max_pending: processing.max_pending,
            batch_max_wait: processing.batch_max_wait,
            batch_max_bytes: processing.batch_max_bytes,
            exec_command: exec.command,
            exec_concurrency: exec.concurrency,
            exec_in_flight: exec.in_flight,
            exec_timeout: exec.timeout,
            exec_max_line_bytes: exec.max_line_bytes,
            http_url: http.url,
            http_body: http.body,
            http_headers: http.headers,
            http_concurrency: http.concurrency,
            http_timeout: http.timeout,
            wait_for_topics,
            health_listen,
            health_stuck,
            memory,
            exec_pass_secrets,
            #[cfg(feature = "testkit")]
            test_delay: self.test_delay()?,
        };
        shutdown::processor_timeout_fits_the_drain(&settings)?;
        memory::budget_owns_the_prefetch_limits(&settings)?;
        processing::ordering_fits_concurrency(&settings)?;
        Ok(settings)
    }

    /// Per-message delay of the testkit's `slow` processor.
    #[cfg(feature = "testkit")]
    fn test_delay(&self) -> Result<crate::config::delay::Delay, SettingError> {
        if self.values.contains_key("test_delay_ms") {
            crate::config::delay::Delay::parse(self.get("test_delay_ms"), 3_600_000)
                .map_err(|problem| self.error("test_delay_ms", problem))
        } else {
            Ok(Default::default())
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::settings::test_vars::{err, vars};
    use std::time::Duration;

    use crate::config::settings::Settings;

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
        use crate::config::delay::Delay;
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
}
