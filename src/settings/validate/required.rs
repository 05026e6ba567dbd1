//! Required settings: every one missing, named in one error.

use crate::settings::OnFailure;
use crate::settings::SettingError;

use crate::settings::keys::{env_name, KEYS};
use crate::settings::raw::RawSettings;

/// Every required setting that is missing, in one error (one at a time makes a new
/// user start ackd once per setting). What a built-in processor or the dead-letter
/// policy requires counts too; alone, those are reported where they are checked.
pub(super) fn missing(raw: &RawSettings) -> Result<(), SettingError> {
    let mut missing: Vec<(String, String)> = KEYS
        .iter()
        .filter_map(|k| Some((k.key, k.required?)))
        .filter(|(key, _)| raw.get(key).is_empty())
        .map(|(key, what)| (env_name(key), what.to_string()))
        .collect();
    let required_always = missing.len();
    let processor = raw.get("processor").to_ascii_lowercase();
    for (processor_name, key, what) in [
        (
            "exec",
            "exec_command",
            "with ACKD_PROCESSOR=exec, the handler's command line",
        ),
        (
            "http",
            "http_url",
            "with ACKD_PROCESSOR=http, the URL messages are POSTed to",
        ),
    ] {
        if processor == processor_name && raw.get(key).is_empty() {
            missing.push((env_name(key), what.to_string()));
        }
    }
    if OnFailure::parse(&raw.get("on_failure").to_ascii_lowercase()) == Some(OnFailure::DeadLetter)
        && raw.get("dead_letter_topic").is_empty()
    {
        missing.push((
            env_name("dead_letter_topic"),
            "with ACKD_ON_FAILURE=dead-letter, the topic failed messages go to".into(),
        ));
    }
    match missing.len() {
        0 => Ok(()),
        // One alone: the same error as the check that finds it.
        1 if required_always == 1 => Err(SettingError::new(
            &missing[0].0,
            None,
            format!("is required: {}", missing[0].1),
        )),
        1 => Ok(()),
        _ => Err(SettingError::new(
            missing
                .iter()
                .map(|(name, _)| name.as_str())
                .collect::<Vec<_>>()
                .join(","),
            None,
            format!(
                "are required: {}",
                missing
                    .iter()
                    .map(|(name, what)| format!("{name}: {what}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use crate::settings::test_vars::{err, vars};
    use crate::settings::Settings;

    #[test]
    fn missing_required_settings_are_named() {
        for name in ["KAFKA_URL", "ACKD_TOPICS", "ACKD_GROUP_ID"] {
            let mut v = vars(&[]);
            v.retain(|(k, _)| k != name);
            let e = Settings::from_vars(v).unwrap_err();
            assert_eq!(e.setting, name);
            assert!(e.problem.contains("required"), "{e}");
        }
        assert_eq!(err(&[("ACKD_TOPICS", " , ")]).setting, "ACKD_TOPICS");
    }

    #[test]
    fn missing_required_settings_are_named_together() {
        let e = Settings::from_vars(Vec::new()).unwrap_err();
        assert_eq!(e.setting, "KAFKA_URL,ACKD_TOPICS,ACKD_GROUP_ID");
        assert_eq!(e.value, None);
        for name in ["KAFKA_URL: ", "ACKD_TOPICS: ", "ACKD_GROUP_ID: "] {
            assert!(e.problem.contains(name), "{e}");
        }
        let mut v = vars(&[("ACKD_PROCESSOR", "EXEC"), ("ACKD_EXEC_COMMAND", "  ")]);
        v.retain(|(k, _)| k != "ACKD_GROUP_ID");
        let e = Settings::from_vars(v).unwrap_err();
        assert_eq!(e.setting, "ACKD_GROUP_ID,ACKD_EXEC_COMMAND");
        // Alone, a processor's requirement is the processor's to report.
        assert!(Settings::from_vars(vars(&[("ACKD_PROCESSOR", "http")])).is_ok());
    }
}
