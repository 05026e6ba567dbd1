//! The error every setting's validation returns, and the one line it gets.

use std::fmt;

/// A setting that is missing or invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingError {
    /// The environment variable (or file key) to fix.
    pub setting: String,
    /// The value given, when it may be shown; `None` when missing or secret.
    pub value: Option<String>,
    /// What is wrong and what is allowed.
    pub problem: String,
}

impl SettingError {
    pub(crate) fn new(
        setting: impl Into<String>,
        value: Option<&str>,
        problem: impl Into<String>,
    ) -> Self {
        SettingError {
            setting: setting.into(),
            value: value.map(str::to_string),
            problem: problem.into(),
        }
    }
}

impl fmt::Display for SettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}={:?}: {}", self.setting, v, self.problem),
            None => write!(f, "{}: {}", self.setting, self.problem),
        }
    }
}

impl std::error::Error for SettingError {}

/// The one line a configuration error gets.
pub(crate) fn report_setting_error(e: &SettingError) {
    tracing::error!(
        at = "config_error",
        setting = &e.setting,
        value = e.value.as_deref(),
        problem = &e.problem,
        "invalid configuration; fix the setting and start again"
    );
}
