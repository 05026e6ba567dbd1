//! The group: where it starts, its protocol, and static membership.

use std::collections::BTreeMap;

use crate::settings::properties::{PassThrough, CLASSIC_ONLY_PROPERTIES};
use crate::settings::raw::RawSettings;
use crate::settings::SettingError;

/// How this member joins its group (`ACKD_GROUP_ID` is with the connection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSettings {
    /// `ACKD_START_FROM`: where a partition without a committed offset starts.
    pub start_from: StartFrom,
    /// `ACKD_GROUP_PROTOCOL`: classic (the default) or consumer (KIP-848).
    pub protocol: GroupProtocol,
    /// With `ACKD_STATIC_MEMBERSHIP=true`: librdkafka's `group.instance.id`, from `DYNO`,
    /// else the host name. `None`: dynamic membership (the default).
    pub instance_id: Option<String>,
}

/// Where a group without a committed offset starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    Earliest,
    Latest,
}

impl StartFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            StartFrom::Earliest => "earliest",
            StartFrom::Latest => "latest",
        }
    }
}

/// The consumer group protocol (`ACKD_GROUP_PROTOCOL`, librdkafka's `group.protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupProtocol {
    /// JoinGroup/SyncGroup: the client-side assignor, session and heartbeat settings.
    Classic,
    /// KIP-848 (Kafka 4.0+): the broker assigns partitions (incrementally) and sets the
    /// session timeout and heartbeat interval.
    Consumer,
}

impl GroupProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupProtocol::Classic => "classic",
            GroupProtocol::Consumer => "consumer",
        }
    }
}

impl GroupSettings {
    /// `ACKD_START_FROM`, `ACKD_GROUP_PROTOCOL` and `ACKD_STATIC_MEMBERSHIP`; and the
    /// pass-through properties as the protocol takes them.
    pub(super) fn parse(
        raw: &RawSettings,
    ) -> Result<(GroupSettings, BTreeMap<String, PassThrough>), SettingError> {
        let start_from = start_from(raw)?;
        let (protocol, rdkafka) = protocol(raw)?;
        let group = GroupSettings {
            start_from,
            protocol,
            instance_id: instance_id(raw)?,
        };
        Ok((group, rdkafka))
    }
}

/// `ACKD_START_FROM`.
fn start_from(raw: &RawSettings) -> Result<StartFrom, SettingError> {
    match raw.get("start_from").to_ascii_lowercase().as_str() {
        "earliest" => Ok(StartFrom::Earliest),
        "latest" => Ok(StartFrom::Latest),
        _ => Err(raw.error("start_from", "expected earliest or latest")),
    }
}

/// `ACKD_GROUP_PROTOCOL`, and the pass-through properties that go with it. Under
/// `consumer`, ackd's own default assignor is dropped, and a classic-only property
/// the user passed is an error here (librdkafka's refusal would otherwise stop ackd
/// at the consumer's creation, naming no setting).
fn protocol(
    raw: &RawSettings,
) -> Result<(GroupProtocol, BTreeMap<String, PassThrough>), SettingError> {
    let protocol = match raw.get("group_protocol").to_ascii_lowercase().as_str() {
        "classic" => GroupProtocol::Classic,
        "consumer" => GroupProtocol::Consumer,
        _ => return Err(raw.error(
            "group_protocol",
            "expected classic (JoinGroup, the default) or consumer (KIP-848, Kafka 4.0 or later)",
        )),
    };
    let mut rdkafka = raw.rdkafka.clone();
    match protocol {
        GroupProtocol::Consumer => {
            for (property, instead) in CLASSIC_ONLY_PROPERTIES {
                match rdkafka.get(*property) {
                    Some(_) if raw.rdkafka_defaults.iter().any(|p| p == property) => {
                        rdkafka.remove(*property);
                    }
                    Some(pass) => {
                        return Err(SettingError::new(
                            &pass.origin,
                            Some(pass.shown(property)),
                            format!("sets `{property}`, which librdkafka refuses with ACKD_GROUP_PROTOCOL=consumer: {instead}. Remove it, or use ACKD_GROUP_PROTOCOL=classic"),
                        ));
                    }
                    None => {}
                }
            }
        }
        GroupProtocol::Classic => {
            if let Some(pass) = rdkafka.get("group.remote.assignor") {
                return Err(SettingError::new(
                    &pass.origin,
                    Some(pass.shown("group.remote.assignor")),
                    "sets `group.remote.assignor`, the broker's assignor, which only ACKD_GROUP_PROTOCOL=consumer uses: set that too, or choose a client-side assignor with ACKD_RDKAFKA_PARTITION_ASSIGNMENT_STRATEGY",
                ));
            }
        }
    }
    Ok((protocol, rdkafka))
}

/// `ACKD_STATIC_MEMBERSHIP`: the member's `group.instance.id`, or `None` (dynamic
/// membership).
fn instance_id(raw: &RawSettings) -> Result<Option<String>, SettingError> {
    if raw.boolean("static_membership")? {
        Ok(Some(instance_id_from(raw, read_hostname)?))
    } else {
        Ok(None)
    }
}

/// A static member's `group.instance.id`: `DYNO` (Heroku's `consumer.1`), else
/// `HOSTNAME`, else the kernel's host name. Used as it is: the broker scopes instance
/// ids by group, so the group id need not be part of it.
fn instance_id_from(
    raw: &RawSettings,
    read_hostname: impl FnOnce() -> Option<String>,
) -> Result<String, SettingError> {
    let nonempty = |v: &Option<String>| {
        v.as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let (source, id) = if let Some(id) = nonempty(&raw.dyno) {
        ("DYNO", id)
    } else if let Some(id) = nonempty(&raw.hostname) {
        ("HOSTNAME", id)
    } else if let Some(id) = nonempty(&read_hostname()) {
        ("the host name", id)
    } else {
        return Err(raw.error(
            "static_membership",
            "needs an instance id: set DYNO (Heroku sets it), or HOSTNAME",
        ));
    };
    // Kafka's rule for group.instance.id (it refuses other ids at JoinGroup).
    let valid = id.len() <= 249
        && id != "."
        && id != ".."
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !valid {
        return Err(raw.error(
            "static_membership",
            format!("takes group.instance.id from {source}, whose value `{id}` is not a valid instance id: up to 249 of a-z A-Z 0-9 . _ -"),
        ));
    }
    Ok(id)
}

/// The kernel's host name (Linux), for static members without `DYNO` or `HOSTNAME`.
fn read_hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname").ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::test_vars::{err, vars};
    use crate::settings::Settings;

    #[test]
    fn static_membership_is_off_by_default_and_takes_dyno_then_the_host_name() {
        let s = Settings::from_vars(vars(&[("DYNO", "consumer.1")])).unwrap();
        assert_eq!(s.group.instance_id, None, "opt-in only");

        let on = [("ACKD_STATIC_MEMBERSHIP", "true")];
        let s = Settings::from_vars(vars(&[on[0], ("DYNO", "consumer.1"), ("HOSTNAME", "h1")]))
            .unwrap();
        assert_eq!(s.group.instance_id.as_deref(), Some("consumer.1"));
        let s = Settings::from_vars(vars(&[on[0], ("HOSTNAME", "worker-7.internal")])).unwrap();
        assert_eq!(s.group.instance_id.as_deref(), Some("worker-7.internal"));
        // Neither: the kernel's host name.
        let s = Settings::from_vars(vars(&on)).unwrap();
        assert_eq!(
            s.group.instance_id,
            read_hostname().map(|h| h.trim().to_string())
        );

        let e = err(&[on[0], ("DYNO", "consumer 1")]);
        assert_eq!(e.setting, "ACKD_STATIC_MEMBERSHIP", "{e}");
        assert!(
            e.problem.contains("DYNO") && e.problem.contains("`consumer 1`"),
            "{e}"
        );
        let e = err(&[("ACKD_STATIC_MEMBERSHIP", "sometimes")]);
        assert!(e.problem.contains("true or false"), "{e}");
    }

    #[test]
    fn static_membership_maps_to_group_instance_id_which_ackd_owns() {
        let s = Settings::from_vars(vars(&[
            ("ACKD_STATIC_MEMBERSHIP", "true"),
            ("DYNO", "consumer.2"),
        ]))
        .unwrap();
        let config = crate::settings::client_config::consumer_config(&s);
        assert_eq!(config.get("group.instance.id"), Some("consumer.2"));
        let dynamic = Settings::from_vars(vars(&[("DYNO", "consumer.2")])).unwrap();
        assert_eq!(
            crate::settings::client_config::consumer_config(&dynamic).get("group.instance.id"),
            None
        );

        let e = err(&[("ACKD_RDKAFKA_GROUP_INSTANCE_ID", "me")]);
        assert_eq!(e.setting, "ACKD_RDKAFKA_GROUP_INSTANCE_ID");
        assert!(e.problem.contains("ACKD_STATIC_MEMBERSHIP"), "{e}");
    }

    #[test]
    fn the_group_protocol_is_classic_by_default_and_consumer_on_request() {
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert_eq!(s.group.protocol, GroupProtocol::Classic);
        let s = Settings::from_vars(vars(&[("ACKD_GROUP_PROTOCOL", "Consumer")])).unwrap();
        assert_eq!(s.group.protocol, GroupProtocol::Consumer);
        // ackd's own default assignor gives way: the broker assigns.
        assert!(!s.rdkafka.contains_key("partition.assignment.strategy"));
        assert_eq!(s.rdkafka["client.id"].value, "ackd");
        let s = Settings::from_vars(vars(&[
            ("ACKD_GROUP_PROTOCOL", "consumer"),
            ("ACKD_RDKAFKA_GROUP_REMOTE_ASSIGNOR", "uniform"),
        ]))
        .unwrap();
        assert_eq!(s.rdkafka["group.remote.assignor"].value, "uniform");

        let e = err(&[("ACKD_GROUP_PROTOCOL", "kip848")]);
        assert_eq!(e.setting, "ACKD_GROUP_PROTOCOL");
        assert_eq!(e.value.as_deref(), Some("kip848"));
        assert!(
            e.problem.contains("classic") && e.problem.contains("consumer"),
            "{e}"
        );
        // The pass-through cannot set what the setting sets.
        let e = err(&[("ACKD_RDKAFKA_GROUP_PROTOCOL", "consumer")]);
        assert_eq!(e.setting, "ACKD_RDKAFKA_GROUP_PROTOCOL");
        assert!(e.problem.contains("use ACKD_GROUP_PROTOCOL"), "{e}");
    }

    #[test]
    fn classic_only_properties_are_refused_under_the_consumer_protocol() {
        for (var, value, property, hint) in [
            (
                "ACKD_RDKAFKA_PARTITION_ASSIGNMENT_STRATEGY",
                "cooperative-sticky",
                "partition.assignment.strategy",
                "ACKD_RDKAFKA_GROUP_REMOTE_ASSIGNOR",
            ),
            (
                "ACKD_RDKAFKA_SESSION_TIMEOUT_MS",
                "6000",
                "session.timeout.ms",
                "group.consumer.session.timeout.ms",
            ),
            (
                "ACKD_RDKAFKA_HEARTBEAT_INTERVAL_MS",
                "300",
                "heartbeat.interval.ms",
                "group.consumer.heartbeat.interval.ms",
            ),
            (
                "ACKD_RDKAFKA_GROUP_PROTOCOL_TYPE",
                "consumer",
                "group.protocol.type",
                "classic protocol only",
            ),
        ] {
            let e = err(&[("ACKD_GROUP_PROTOCOL", "consumer"), (var, value)]);
            assert_eq!(e.setting, var);
            assert_eq!(e.value.as_deref(), Some(value));
            assert!(e.problem.contains(&format!("`{property}`")), "{e}");
            assert!(e.problem.contains(hint), "{e}");
            assert!(e.problem.contains("ACKD_GROUP_PROTOCOL=classic"), "{e}");
            // The same property is fine under classic.
            Settings::from_vars(vars(&[(var, value)])).unwrap();
        }
        // A file's assignor is the user's, not ackd's default: refused too, naming the file.
        let dir = std::env::temp_dir().join(format!("ackd-protocol-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ackd.toml");
        std::fs::write(
            &path,
            "[rdkafka]\n\"partition.assignment.strategy\" = \"range\"\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        let e = err(&[("ACKD_CONFIG_FILE", p), ("ACKD_GROUP_PROTOCOL", "consumer")]);
        assert_eq!(
            e.setting,
            format!("[rdkafka] \"partition.assignment.strategy\" in {p}")
        );
        // A file that sets other properties leaves ackd's default assignor a default.
        std::fs::write(&path, "[rdkafka]\n\"fetch.min.bytes\" = 10\n").unwrap();
        let s = Settings::from_vars(vars(&[
            ("ACKD_CONFIG_FILE", p),
            ("ACKD_GROUP_PROTOCOL", "consumer"),
        ]))
        .unwrap();
        assert!(!s.rdkafka.contains_key("partition.assignment.strategy"));
        let _ = std::fs::remove_dir_all(dir);
        // The broker's assignor means nothing to the classic protocol.
        let e = err(&[("ACKD_RDKAFKA_GROUP_REMOTE_ASSIGNOR", "uniform")]);
        assert_eq!(e.setting, "ACKD_RDKAFKA_GROUP_REMOTE_ASSIGNOR");
        assert!(e.problem.contains("ACKD_GROUP_PROTOCOL=consumer"), "{e}");
    }
}
