//! The `exec` processor's settings (`ACKD_EXEC_*`), parsed; the processor is
//! src/processors/exec/.

use std::time::Duration;

use crate::settings::raw::RawSettings;
use crate::settings::rdkafka_env;
use crate::settings::secrets::{is_secret_variable, variable_name, SECRET_VARIABLES};
use crate::settings::validate::http_endpoint::ConcurrencyMode;
use crate::settings::SettingError;

/// The largest `ACKD_EXEC_MAX_LINE_BYTES`: 16 MiB (three lines of each child may be held).
pub const MAX_EXEC_LINE_BYTES: usize = 16 << 20;

/// The `exec` processor's settings, as it takes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecSettings {
    /// `ACKD_EXEC_COMMAND`: the command line the children run (`sh -c`).
    pub command: String,
    /// `ACKD_EXEC_CONCURRENCY`: children in the pool.
    pub concurrency: usize,
    /// `ACKD_EXEC_IN_FLIGHT`: requests one child holds at once (1: one at a time, the
    /// reply to each before the next request).
    pub in_flight: usize,
    /// `ACKD_EXEC_CONCURRENCY_MODE`: whether the limit of requests in flight across the
    /// children (at most `concurrency` × `in_flight`) finds the handler's capacity.
    pub concurrency_mode: ConcurrencyMode,
    /// `ACKD_EXEC_TIMEOUT_MS`: how long a child may take to answer one message (writing
    /// it included).
    pub timeout: Duration,
    /// `ACKD_EXEC_MAX_LINE_BYTES`: the longest line kept from a child's stdout or stderr,
    /// newline excluded.
    pub max_line_bytes: usize,
    /// `ACKD_EXEC_PASS_SECRETS`: the [`SECRET_VARIABLES`] children get anyway.
    pub pass_secrets: Vec<String>,
}

impl ExecSettings {
    /// `ACKD_EXEC_*`, each checked whether or not the exec processor runs; `None` without
    /// `ACKD_EXEC_COMMAND`.
    pub(super) fn parse(raw: &RawSettings) -> Result<Option<ExecSettings>, SettingError> {
        let command = raw.get("exec_command").to_string();
        let settings = ExecSettings {
            concurrency: raw.whole(
                "exec_concurrency",
                1..=256,
                "expected a whole number from 1 to 256",
            )?,
            in_flight: raw.whole(
                "exec_in_flight",
                1..=1000,
                "expected a whole number of requests from 1 to 1000",
            )?,
            concurrency_mode: ConcurrencyMode::parse(
                raw,
                "exec_concurrency_mode",
                "ACKD_EXEC_CONCURRENCY × ACKD_EXEC_IN_FLIGHT",
                "the handler's",
            )?,
            timeout: timeout(raw)?,
            max_line_bytes: raw.whole(
                "exec_max_line_bytes",
                256..=MAX_EXEC_LINE_BYTES,
                format!("expected a whole number of bytes from 256 to {MAX_EXEC_LINE_BYTES}"),
            )?,
            pass_secrets: pass_secrets(raw)?,
            command,
        };
        Ok(Some(settings).filter(|s| !s.command.is_empty()))
    }

    /// `ACKD_PROCESSOR=exec` without `ACKD_EXEC_COMMAND`: the processor's to report
    /// (validation names it only among other missing settings).
    pub fn command_required() -> SettingError {
        SettingError::new(
            "ACKD_EXEC_COMMAND",
            None,
            "is required with ACKD_PROCESSOR=exec: the command line of the handler, run with sh -c (e.g. \"python3 handler.py\")",
        )
    }
}

/// `ACKD_EXEC_TIMEOUT_MS`; the drain check reads it without a command too.
pub(super) fn timeout(raw: &RawSettings) -> Result<Duration, SettingError> {
    raw.millis("exec_timeout_ms", 1, 3_600_000)
}

/// `ACKD_EXEC_PASS_SECRETS`: comma-separated names of secret variables (see
/// [`SECRET_VARIABLES`]) that exec children get; any other name is a mistake.
fn pass_secrets(raw: &RawSettings) -> Result<Vec<String>, SettingError> {
    let names: Vec<String> = raw
        .get("exec_pass_secrets")
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(variable_name)
        .collect();
    match names.iter().find(|n| !is_secret_variable(n, "@")) {
        None => Ok(names),
        Some(name) => Err(raw.error(
            "exec_pass_secrets",
            format!(
                "names `{name}`, which ackd does not keep from exec children: expected comma-separated names among {} (the URLs when they carry user:password@) and {}<NAME> of a secret librdkafka property",
                SECRET_VARIABLES.join(", "),
                rdkafka_env::PREFIX
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use crate::settings::test_vars::{err, vars};
    use crate::settings::Settings;

    fn pass_secrets(extra: &[(&str, &str)]) -> Vec<String> {
        let mut v = vec![("ACKD_EXEC_COMMAND", "cat")];
        v.extend_from_slice(extra);
        Settings::from_vars(vars(&v))
            .unwrap()
            .exec
            .unwrap()
            .pass_secrets
    }

    #[test]
    fn exec_concurrency_mode_is_fixed_or_adaptive() {
        use crate::settings::ConcurrencyMode;
        let mode = |v: &[(&str, &str)]| {
            let mut all = vec![("ACKD_EXEC_COMMAND", "cat")];
            all.extend_from_slice(v);
            Settings::from_vars(vars(&all))
                .unwrap()
                .exec
                .unwrap()
                .concurrency_mode
        };
        assert_eq!(mode(&[]), ConcurrencyMode::Fixed);
        assert_eq!(
            mode(&[("ACKD_EXEC_CONCURRENCY_MODE", "ADAPTIVE")]),
            ConcurrencyMode::Adaptive
        );
        let e = err(&[("ACKD_EXEC_CONCURRENCY_MODE", "auto")]);
        assert_eq!(e.setting, "ACKD_EXEC_CONCURRENCY_MODE");
        assert!(
            e.problem.contains("fixed") && e.problem.contains("adaptive"),
            "{e}"
        );
        assert!(e.problem.contains("ACKD_EXEC_IN_FLIGHT"), "{e}");
    }

    #[test]
    fn exec_pass_secrets_names_secret_variables_only() {
        assert!(pass_secrets(&[]).is_empty());
        assert_eq!(
            pass_secrets(&[(
                "ACKD_EXEC_PASS_SECRETS",
                " KAFKA_URL, ACKD_RDKAFKA_SASL_PASSWORD ,",
            )]),
            ["KAFKA_URL", "ACKD_RDKAFKA_SASL_PASSWORD"]
        );
        // Named as ackd reads it: any case after ACKD_.
        assert_eq!(
            pass_secrets(&[("ACKD_EXEC_PASS_SECRETS", "ACKD_sasl_Password")]),
            ["ACKD_SASL_PASSWORD"]
        );
        for bad in [
            "KAFKA_URLL",
            "ACKD_TOPICS",
            "ACKD_RDKAFKA_CLIENT_ID",
            "PATH",
        ] {
            let e = err(&[("ACKD_EXEC_PASS_SECRETS", bad)]);
            assert_eq!(e.setting, "ACKD_EXEC_PASS_SECRETS", "{bad}");
            assert!(e.problem.contains("KAFKA_CLIENT_CERT_KEY"), "{e}");
        }
    }
}
