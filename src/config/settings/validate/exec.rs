//! The `exec` processor's settings.

use std::time::Duration;

use crate::config::error::SettingError;
use crate::config::rdkafka_env;
use crate::config::settings::raw::RawSettings;
use crate::config::settings::secrets::{is_secret_variable, variable_name, SECRET_VARIABLES};
use crate::config::settings::MAX_EXEC_LINE_BYTES;

/// The `exec` processor's settings, validated (see [`crate::config::settings::Settings`]).
pub(super) struct Exec {
    pub(super) command: Option<String>,
    pub(super) concurrency: usize,
    pub(super) in_flight: usize,
    pub(super) timeout: Duration,
    pub(super) max_line_bytes: usize,
}

impl RawSettings {
    /// `ACKD_EXEC_COMMAND`, `ACKD_EXEC_CONCURRENCY`, `ACKD_EXEC_IN_FLIGHT`,
    /// `ACKD_EXEC_TIMEOUT_MS` and `ACKD_EXEC_MAX_LINE_BYTES`.
    pub(super) fn exec(&self) -> Result<Exec, SettingError> {
        Ok(Exec {
            command: Some(self.get("exec_command"))
                .filter(|c| !c.is_empty())
                .map(str::to_string),
            concurrency: self.whole(
                "exec_concurrency",
                1..=256,
                "expected a whole number from 1 to 256",
            )?,
            in_flight: self.whole(
                "exec_in_flight",
                1..=1000,
                "expected a whole number of requests from 1 to 1000",
            )?,
            timeout: self.millis("exec_timeout_ms", 1, 3_600_000)?,
            max_line_bytes: self.whole(
                "exec_max_line_bytes",
                256..=MAX_EXEC_LINE_BYTES,
                format!("expected a whole number of bytes from 256 to {MAX_EXEC_LINE_BYTES}"),
            )?,
        })
    }

    /// `ACKD_EXEC_PASS_SECRETS`: comma-separated names of secret variables (see
    /// [`SECRET_VARIABLES`]) that exec children get; any other name is a mistake.
    pub(super) fn exec_pass_secrets(&self) -> Result<Vec<String>, SettingError> {
        let names: Vec<String> = self
            .get("exec_pass_secrets")
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(variable_name)
            .collect();
        match names.iter().find(|n| !is_secret_variable(n, "@")) {
            None => Ok(names),
            Some(name) => Err(self.error(
                "exec_pass_secrets",
                format!(
                    "names `{name}`, which ackd does not keep from exec children: expected comma-separated names among {} (the URLs when they carry user:password@) and {}<NAME> of a secret librdkafka property",
                    SECRET_VARIABLES.join(", "),
                    rdkafka_env::PREFIX
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::settings::test_vars::{err, vars};
    use crate::config::settings::Settings;

    #[test]
    fn exec_pass_secrets_names_secret_variables_only() {
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert!(s.exec_pass_secrets.is_empty());
        let s = Settings::from_vars(vars(&[(
            "ACKD_EXEC_PASS_SECRETS",
            " KAFKA_URL, ACKD_RDKAFKA_SASL_PASSWORD ,",
        )]))
        .unwrap();
        assert_eq!(
            s.exec_pass_secrets,
            ["KAFKA_URL", "ACKD_RDKAFKA_SASL_PASSWORD"]
        );
        // Named as ackd reads it: any case after ACKD_.
        let s =
            Settings::from_vars(vars(&[("ACKD_EXEC_PASS_SECRETS", "ACKD_sasl_Password")])).unwrap();
        assert_eq!(s.exec_pass_secrets, ["ACKD_SASL_PASSWORD"]);
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
