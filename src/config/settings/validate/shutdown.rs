//! The graceful stop: a processor call must fit in the drain.

use crate::config::error::SettingError;
use crate::config::settings::keys::env_name;
use crate::config::settings::raw::RawSettings;
use crate::config::settings::Settings;

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
        "exec" => Some(("exec_timeout_ms", super::exec::timeout(raw)?)),
        "http" => Some(("http_timeout_ms", super::http::timeout(raw)?)),
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

#[cfg(test)]
mod tests {
    use crate::config::settings::test_vars::{err, vars};
    use std::time::Duration;

    use crate::config::settings::{commit_reserve, Settings};

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
