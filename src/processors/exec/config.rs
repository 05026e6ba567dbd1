//! What the exec processor is configured with, from `ACKD_EXEC_*`.

use std::time::Duration;

use crate::config::error::SettingError;
use crate::config::settings::Settings;

/// What the exec processor is configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecConfig {
    /// Run with `sh -c`.
    pub command: String,
    /// Children in the pool.
    pub concurrency: usize,
    /// Requests one child holds at once (`ACKD_EXEC_IN_FLIGHT`).
    pub in_flight: usize,
    /// How long a child may take to answer one message (writing it included).
    pub timeout: Duration,
    /// The longest line read from a child's stdout or stderr, newline excluded.
    pub max_line_bytes: usize,
    /// `ACKD_EXEC_PASS_SECRETS`: the secret variables children get anyway.
    pub pass_secrets: Vec<String>,
}

impl ExecConfig {
    /// From `ACKD_EXEC_*`; `ACKD_EXEC_COMMAND` is required.
    pub fn from_settings(settings: &Settings) -> Result<ExecConfig, SettingError> {
        let command = settings.exec_command.clone().ok_or_else(|| SettingError {
            setting: "ACKD_EXEC_COMMAND".into(),
            value: None,
            problem: "is required with ACKD_PROCESSOR=exec: the command line of the handler, run with sh -c (e.g. \"python3 handler.py\")".into(),
        })?;
        Ok(ExecConfig {
            command,
            concurrency: settings.exec_concurrency,
            in_flight: settings.exec_in_flight,
            timeout: settings.exec_timeout,
            max_line_bytes: settings.exec_max_line_bytes,
            pass_secrets: settings.exec_pass_secrets.clone(),
        })
    }
}
