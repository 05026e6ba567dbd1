//! The variables unit tests of the settings start from: a valid minimal set.

use crate::config::error::SettingError;
use crate::config::settings::Settings;

pub(super) fn vars(extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = [
        ("KAFKA_URL", "kafka://127.0.0.1:9092"),
        ("ACKD_TOPICS", "orders, payments"),
        ("ACKD_GROUP_ID", "billing"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (k, val) in extra {
        v.retain(|(name, _)| name != k);
        v.push((k.to_string(), val.to_string()));
    }
    v
}

pub(super) fn err(extra: &[(&str, &str)]) -> SettingError {
    Settings::from_vars(vars(extra)).expect_err("accepted")
}
