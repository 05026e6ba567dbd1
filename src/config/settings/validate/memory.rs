//! The memory budget (`ACKD_MEMORY_MB`, src/consumer/memory.rs).

use crate::config::error::SettingError;
use crate::config::settings::keys::rdkafka_defaults;
use crate::config::settings::properties::MEMORY_BUDGET_PROPERTIES;
use crate::config::settings::raw::RawSettings;
use crate::config::settings::{Settings, MAX_MEMORY_MB};

impl RawSettings {
    /// `ACKD_MEMORY_MB`: 0 is off.
    pub(super) fn memory_mb(&self) -> Result<u64, SettingError> {
        Ok(self.whole(
            "memory_mb",
            0..=MAX_MEMORY_MB,
            format!("expected a whole number of MiB from 0 (off) to {MAX_MEMORY_MB}"),
        )? as u64)
    }
}

/// The budget sets librdkafka's prefetch limits itself: one set by hand as well would be
/// silently overridden (a value equal to ackd's default is not "by hand").
pub(super) fn budget_owns_the_prefetch_limits(settings: &Settings) -> Result<(), SettingError> {
    if settings.memory_mb == 0 {
        return Ok(());
    }
    let defaults = rdkafka_defaults();
    if let Some((property, pass)) = settings.rdkafka.iter().find(|(p, pass)| {
        MEMORY_BUDGET_PROPERTIES.contains(&p.as_str())
            && !defaults.iter().any(|(d, v)| d == *p && *v == pass.value)
    }) {
        return Err(SettingError::new(
            &pass.origin,
            Some(&pass.value),
            format!(
                "sets `{property}`, which ACKD_MEMORY_MB={} sets from the budget: use one or the other",
                settings.memory_mb
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::settings::test_vars::{err, vars};
    use crate::config::settings::Settings;

    #[test]
    fn a_memory_budget_is_off_by_default_and_owns_the_prefetch_limits() {
        assert_eq!(Settings::from_vars(vars(&[])).unwrap().memory_mb, 0);
        let s = Settings::from_vars(vars(&[("ACKD_MEMORY_MB", "64")])).unwrap();
        assert_eq!(s.memory_mb, 64);
        let e = err(&[("ACKD_MEMORY_MB", "lots")]);
        assert_eq!(e.setting, "ACKD_MEMORY_MB");
        // A limit set by hand would be overridden silently: refused, naming both.
        let e = err(&[
            ("ACKD_MEMORY_MB", "64"),
            ("ACKD_RDKAFKA_QUEUED_MAX_MESSAGES_KBYTES", "4096"),
        ]);
        assert_eq!(e.setting, "ACKD_RDKAFKA_QUEUED_MAX_MESSAGES_KBYTES");
        assert!(e.problem.contains("ACKD_MEMORY_MB=64"), "{e}");
        // Without a budget it is an ordinary pass-through; ackd's own default is no conflict.
        assert!(
            Settings::from_vars(vars(&[("ACKD_RDKAFKA_QUEUED_MAX_MESSAGES_KBYTES", "4096")]))
                .is_ok()
        );
        assert!(Settings::from_vars(vars(&[
            ("ACKD_MEMORY_MB", "64"),
            ("ACKD_RDKAFKA_FETCH_MAX_BYTES", "1048576"),
        ]))
        .is_ok());
    }
}
