//! The memory budget (`ACKD_MEMORY_MB`, src/consumer/memory.rs).

use crate::settings::keys::rdkafka_defaults;
use crate::settings::properties::MEMORY_BUDGET_PROPERTIES;
use crate::settings::raw::RawSettings;
use crate::settings::SettingError;
use crate::settings::Settings;

/// The largest `ACKD_MEMORY_MB`: 1 TiB.
pub const MAX_MEMORY_MB: usize = 1 << 20;

/// `ACKD_MEMORY_MB`: where the memory budget comes from (src/consumer/memory.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemorySetting {
    /// `auto`: from the memory limit of the process's cgroup, else a fixed default.
    Auto,
    /// `off` (or `0`): no budget; librdkafka's limits apply to each partition held.
    Off,
    /// This many MiB.
    MiB(u64),
}

impl MemorySetting {
    /// `ACKD_MEMORY_MB`: `auto`, `off` (or 0), or MiB.
    pub(super) fn parse(raw: &RawSettings) -> Result<MemorySetting, SettingError> {
        let value = raw.get("memory_mb").trim().to_ascii_lowercase();
        match value.as_str() {
            "auto" => return Ok(MemorySetting::Auto),
            "off" | "0" => return Ok(MemorySetting::Off),
            _ => {}
        }
        match value.parse::<u64>() {
            Ok(mb) if mb <= MAX_MEMORY_MB as u64 => Ok(MemorySetting::MiB(mb)),
            _ => Err(raw.error(
                "memory_mb",
                format!("expected auto (the container's memory limit, else a default), off, or a whole number of MiB from 1 to {MAX_MEMORY_MB}"),
            )),
        }
    }
}

/// A budget set in MiB sets librdkafka's prefetch limits itself: one set by hand as well
/// would be silently overridden (a value equal to ackd's default is not "by hand").
/// With `auto` a limit set by hand is a cap the budget keeps under.
pub(super) fn budget_owns_the_prefetch_limits(settings: &Settings) -> Result<(), SettingError> {
    let MemorySetting::MiB(mb) = settings.memory else {
        return Ok(());
    };
    let defaults = rdkafka_defaults();
    if let Some((property, pass)) = settings.rdkafka.iter().find(|(p, pass)| {
        MEMORY_BUDGET_PROPERTIES.contains(&p.as_str())
            && !defaults.iter().any(|(d, v)| d == *p && *v == pass.value)
    }) {
        return Err(SettingError::new(
            &pass.origin,
            Some(&pass.value),
            format!(
                "sets `{property}`, which ACKD_MEMORY_MB={mb} sets from the budget: use one or the other (or ACKD_MEMORY_MB=auto, which keeps under it)"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::settings::test_vars::{err, vars};
    use crate::settings::{MemorySetting, Settings};

    fn memory(value: &str) -> MemorySetting {
        Settings::from_vars(vars(&[("ACKD_MEMORY_MB", value)]))
            .unwrap()
            .memory
    }

    #[test]
    fn a_memory_budget_is_auto_by_default_and_off_only_when_asked() {
        assert_eq!(
            Settings::from_vars(vars(&[])).unwrap().memory,
            MemorySetting::Auto
        );
        assert_eq!(memory("64"), MemorySetting::MiB(64));
        assert_eq!(memory("off"), MemorySetting::Off);
        assert_eq!(memory("0"), MemorySetting::Off);
        assert_eq!(memory("AUTO"), MemorySetting::Auto);
        for bad in ["lots", "-1", "64MB", "2000000"] {
            let e = err(&[("ACKD_MEMORY_MB", bad)]);
            assert_eq!(e.setting, "ACKD_MEMORY_MB", "{bad}");
            assert!(e.problem.contains("auto"), "{e}");
        }
    }

    #[test]
    fn a_budget_in_mib_owns_the_prefetch_limits() {
        // A limit set by hand would be overridden silently: refused, naming both.
        let e = err(&[
            ("ACKD_MEMORY_MB", "64"),
            ("ACKD_RDKAFKA_QUEUED_MAX_MESSAGES_KBYTES", "4096"),
        ]);
        assert_eq!(e.setting, "ACKD_RDKAFKA_QUEUED_MAX_MESSAGES_KBYTES");
        assert!(e.problem.contains("ACKD_MEMORY_MB=64"), "{e}");
        // With auto or off it is an ordinary pass-through (auto keeps under it); ackd's
        // own default is no conflict.
        for m in ["auto", "off"] {
            assert!(Settings::from_vars(vars(&[
                ("ACKD_MEMORY_MB", m),
                ("ACKD_RDKAFKA_QUEUED_MAX_MESSAGES_KBYTES", "4096")
            ]))
            .is_ok());
        }
        assert!(Settings::from_vars(vars(&[
            ("ACKD_MEMORY_MB", "64"),
            ("ACKD_RDKAFKA_FETCH_MAX_BYTES", "1048576"),
        ]))
        .is_ok());
    }
}
