//! The raw layer: settings as strings, from `config/default.toml`, the file named by
//! `ACKD_CONFIG_FILE` and the environment, later wins; and the accessors validation
//! reads them with.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use config::{Config, Environment, File, FileFormat};

use crate::settings::rdkafka_env;
use crate::settings::SettingError;

use super::keys::{self, env_name, DEFAULT_ORIGIN, KAFKA_VARS, KEYS};
use super::properties::{PassThrough, OWNED_PROPERTIES};

/// Settings as strings, layered, before validation.
pub(super) struct RawSettings {
    pub(super) values: HashMap<&'static str, String>,
    /// The file named by `ACKD_CONFIG_FILE`, if any.
    pub(super) file: Option<String>,
    /// Keys that the environment set (errors name the variable either way, but a value
    /// from a file says which file).
    pub(super) from_env: Vec<&'static str>,
    pub(super) rdkafka: BTreeMap<String, PassThrough>,
    /// The `rdkafka` properties that are ackd's compiled-in defaults, unchanged.
    pub(super) rdkafka_defaults: Vec<String>,
    /// [`KAFKA_VARS`] as given.
    pub(super) kafka_vars: HashMap<&'static str, String>,
    /// `DYNO` and `HOSTNAME` from the variables: where a static member's id comes from.
    pub(super) dyno: Option<String>,
    pub(super) hostname: Option<String>,
}

/// The variables ackd reads, sorted: `ACKD_` settings by key (and `KAFKA_URL` as
/// `kafka_url`), and `ACKD_RDKAFKA_` properties by their variable suffix.
struct AckdVars {
    settings: HashMap<String, String>,
    rdkafka: Vec<(String, String)>,
}

impl RawSettings {
    pub(super) fn layer(vars: &HashMap<String, String>) -> Result<RawSettings, SettingError> {
        let ackd_vars = sort_vars(vars)?;
        let file = ackd_vars.settings.get("config_file").cloned();
        let config = layered_config(&ackd_vars.settings, file.as_deref())?;
        refuse_unknown_keys(&config, file.as_deref())?;

        let mut values = HashMap::new();
        for key in KEYS.iter().map(|k| k.key) {
            if let Ok(v) = config.get_string(key) {
                values.insert(key, v);
            }
        }
        let from_env = KEYS
            .iter()
            .map(|k| k.key)
            .filter(|k| ackd_vars.settings.contains_key(*k))
            .collect();

        let (mut rdkafka, mut rdkafka_defaults) = file_pass_through(&config, file.as_deref())?;
        for (suffix, value) in ackd_vars.rdkafka {
            let (property, pass) = env_pass_through(suffix, value)?;
            rdkafka_defaults.retain(|p| *p != property);
            rdkafka.insert(property, pass);
        }
        refuse_owned_properties(&rdkafka)?;

        let kafka_vars = KAFKA_VARS
            .iter()
            .filter_map(|(k, _)| vars.get(*k).map(|v| (*k, v.clone())))
            .collect();

        Ok(RawSettings {
            values,
            file,
            from_env,
            rdkafka,
            rdkafka_defaults,
            kafka_vars,
            dyno: vars.get("DYNO").cloned(),
            hostname: vars.get("HOSTNAME").cloned(),
        })
    }

    /// The error for `key`, naming its variable and, if it came from a file, the file.
    pub(super) fn error(&self, key: &'static str, problem: impl Into<String>) -> SettingError {
        let mut setting = env_name(key);
        if !self.from_env.contains(&key) {
            if let Some(file) = &self.file {
                setting = format!("{setting} (`{key}` in {file})");
            }
        }
        SettingError::new(setting, self.values.get(key).map(String::as_str), problem)
    }

    pub(super) fn required(&self, key: &'static str, what: &str) -> Result<&str, SettingError> {
        match self.values.get(key).map(|v| v.trim()) {
            Some(v) if !v.is_empty() => Ok(v),
            _ => Err(SettingError::new(
                env_name(key),
                None,
                format!("is required: {what}"),
            )),
        }
    }

    pub(super) fn get(&self, key: &'static str) -> &str {
        self.values.get(key).map(|v| v.trim()).unwrap_or("")
    }

    pub(super) fn millis(
        &self,
        key: &'static str,
        min: u64,
        max: u64,
    ) -> Result<Duration, SettingError> {
        let problem = || format!("expected a whole number of milliseconds from {min} to {max}");
        match self.get(key).parse::<u64>() {
            Ok(ms) if (min..=max).contains(&ms) => Ok(Duration::from_millis(ms)),
            _ => Err(self.error(key, problem())),
        }
    }

    /// A whole number in `allowed`; otherwise the error `problem`.
    pub(super) fn whole(
        &self,
        key: &'static str,
        allowed: std::ops::RangeInclusive<usize>,
        problem: impl Into<String>,
    ) -> Result<usize, SettingError> {
        match self.get(key).parse::<usize>() {
            Ok(n) if allowed.contains(&n) => Ok(n),
            _ => Err(self.error(key, problem)),
        }
    }

    pub(super) fn boolean(&self, key: &'static str) -> Result<bool, SettingError> {
        match self.get(key).to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err(self.error(key, "expected true or false")),
        }
    }
}

/// The variables ackd reads, apart; an `ACKD_` variable that is no setting is an error.
fn sort_vars(vars: &HashMap<String, String>) -> Result<AckdVars, SettingError> {
    let mut settings: HashMap<String, String> = HashMap::new();
    let mut rdkafka: Vec<(String, String)> = Vec::new();
    for (name, value) in vars {
        if let Some(suffix) = name.strip_prefix(rdkafka_env::PREFIX) {
            rdkafka.push((suffix.to_string(), value.clone()));
        } else if let Some(key) = name.strip_prefix("ACKD_") {
            let key = key.to_ascii_lowercase();
            if key == "kafka_url" || keys::key(&key).is_none() {
                return Err(SettingError::new(
                    name,
                    None,
                    format!("is not a setting of ackd; known settings: KAFKA_URL, {}, and ACKD_RDKAFKA_<property>",
                        KEYS.iter().filter(|k| k.key != "kafka_url").map(|k| env_name(k.key)).collect::<Vec<_>>().join(", ")),
                ));
            }
            settings.insert(key, value.clone());
        }
    }
    if let Some(url) = vars.get("KAFKA_URL") {
        settings.insert("kafka_url".into(), url.clone());
    }
    Ok(AckdVars { settings, rdkafka })
}

/// The layers, later wins: the compiled-in defaults, `file`, the environment.
fn layered_config(
    settings: &HashMap<String, String>,
    file: Option<&str>,
) -> Result<Config, SettingError> {
    let mut builder = Config::builder();
    // Always there: the compiled-in defaults parse (the unit tests read them).
    if let Some(defaults) = keys::default_config() {
        builder = builder.add_source(defaults.clone());
    }
    if let Some(path) = file {
        if !std::path::Path::new(path).is_file() {
            return Err(SettingError::new(
                "ACKD_CONFIG_FILE",
                Some(path),
                "names no readable file: give the path of a TOML file",
            ));
        }
        builder = builder.add_source(File::new(path, FileFormat::Toml));
    }
    let env_map: config::Map<String, String> = settings.clone().into_iter().collect();
    builder = builder.add_source(Environment::default().source(Some(env_map)));
    builder.build().map_err(|e| {
        SettingError::new(
            "ACKD_CONFIG_FILE",
            file,
            format!("cannot be read as TOML: {e}"),
        )
    })
}

/// A key in a file that is no setting is an error (a typo would otherwise do nothing).
fn refuse_unknown_keys(config: &Config, file: Option<&str>) -> Result<(), SettingError> {
    let table = config
        .clone()
        .try_deserialize::<HashMap<String, config::Value>>()
        .unwrap_or_default();
    for key in table.keys() {
        if key != "rdkafka" && keys::key(key).is_none() {
            return Err(SettingError::new(
                format!("`{key}` in {}", file.unwrap_or("config/default.toml")),
                None,
                "is not a setting of ackd (see config/default.toml for the keys)",
            ));
        }
    }
    Ok(())
}

/// The `[rdkafka]` properties of the layered files, and which of them are ackd's
/// defaults: errors name those as such, and they give way where they do not apply
/// (ACKD_GROUP_PROTOCOL=consumer).
fn file_pass_through(
    config: &Config,
    file: Option<&str>,
) -> Result<(BTreeMap<String, PassThrough>, Vec<String>), SettingError> {
    // The [rdkafka] properties the file itself sets.
    let file_rdkafka: Vec<String> = file
        .and_then(|path| {
            Config::builder()
                .add_source(File::new(path, FileFormat::Toml))
                .build()
                .ok()
        })
        .and_then(|c| c.get_table("rdkafka").ok())
        .map(|t| t.into_keys().collect())
        .unwrap_or_default();
    let mut rdkafka = BTreeMap::new();
    let mut rdkafka_defaults = Vec::new();
    if let Ok(props) = config.get_table("rdkafka") {
        for (property, value) in props {
            let from = match file {
                Some(f) if file_rdkafka.contains(&property) => f,
                _ => {
                    rdkafka_defaults.push(property.clone());
                    DEFAULT_ORIGIN
                }
            };
            let origin = format!("[rdkafka] \"{property}\" in {from}");
            let value = value.into_string().map_err(|_| {
                SettingError::new(&origin, None, "must be a string, number or boolean")
            })?;
            rdkafka.insert(property, PassThrough { value, origin });
        }
    }
    Ok((rdkafka, rdkafka_defaults))
}

/// The property `ACKD_RDKAFKA_<suffix>` names, passed through.
fn env_pass_through(suffix: String, value: String) -> Result<(String, PassThrough), SettingError> {
    let origin = format!("{}{suffix}", rdkafka_env::PREFIX);
    let property = rdkafka_env::property_from_env(&suffix).map_err(|problem| {
        SettingError::new(
            &origin,
            None,
            format!("{problem} (librdkafka property upper-cased, `.` -> `_`, `_` -> `__`, `-` -> `___`)"),
        )
    })?;
    Ok((property, PassThrough { value, origin }))
}

/// A property ackd sets itself cannot be passed through: say which setting to use.
fn refuse_owned_properties(rdkafka: &BTreeMap<String, PassThrough>) -> Result<(), SettingError> {
    for (property, pass) in rdkafka {
        if let Some((_, instead)) = OWNED_PROPERTIES.iter().find(|(p, _)| p == property) {
            return Err(SettingError::new(
                &pass.origin,
                None,
                format!("sets `{property}`, which ackd owns: use {instead}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::test_vars::{err, vars};
    use crate::settings::{Settings, StartFrom};

    #[test]
    fn defaults_come_from_default_toml() {
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert_eq!(s.topics, vec!["orders", "payments"]);
        assert_eq!(s.batching.max_bytes, 0);
        assert_eq!(s.group_id, "billing");
        assert_eq!(s.processor, "log");
        assert_eq!(s.commit_interval, Duration::from_millis(5000));
        assert_eq!(s.shutdown_timeout, Duration::from_millis(25000));
        assert_eq!(s.group.start_from, StartFrom::Earliest);
        assert_eq!(s.logging.metric_prefix, "ackd");
        assert!(s.logging.log_messages);
        assert_eq!(s.logging.log_level, "info");
        assert_eq!(s.exec, None);
        let exec = Settings::from_vars(vars(&[("ACKD_EXEC_COMMAND", "cat")]))
            .unwrap()
            .exec
            .unwrap();
        assert_eq!(exec.command, "cat");
        assert_eq!(exec.concurrency, 1);
        assert_eq!(exec.timeout, Duration::from_millis(15000));
        assert_eq!(exec.max_line_bytes, 65536);
        assert_eq!(s.batching.max_messages, 1);
        assert_eq!(s.batching.max_wait, Duration::from_millis(100));
        assert_eq!(
            s.rdkafka["partition.assignment.strategy"].value,
            "cooperative-sticky"
        );
    }

    #[test]
    fn environment_overrides_defaults() {
        let s = Settings::from_vars(vars(&[
            ("ACKD_COMMIT_INTERVAL_MS", "250"),
            ("ACKD_START_FROM", "latest"),
            ("ACKD_LOG_MESSAGES", "false"),
            ("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "6000"),
            ("ACKD_RDKAFKA_PARTITION_ASSIGNMENT_STRATEGY", "range"),
        ]))
        .unwrap();
        assert_eq!(s.commit_interval, Duration::from_millis(250));
        assert_eq!(s.group.start_from, StartFrom::Latest);
        assert!(!s.logging.log_messages);
        assert_eq!(s.rdkafka["session.timeout.ms"].value, "6000");
        assert_eq!(
            s.rdkafka["session.timeout.ms"].origin,
            "ACKD_RDKAFKA_SESSION_TIMEOUT_MS"
        );
        assert_eq!(s.rdkafka["partition.assignment.strategy"].value, "range");
    }

    #[test]
    fn unknown_ackd_variables_are_refused() {
        let e = err(&[("ACKD_COMMIT_INTERVAL", "100")]);
        assert_eq!(e.setting, "ACKD_COMMIT_INTERVAL");
        assert!(e.problem.contains("ACKD_COMMIT_INTERVAL_MS"), "{e}");
    }

    #[test]
    fn owned_properties_cannot_be_passed_through() {
        let e = err(&[("ACKD_RDKAFKA_ENABLE_AUTO_COMMIT", "true")]);
        assert_eq!(e.setting, "ACKD_RDKAFKA_ENABLE_AUTO_COMMIT");
        assert!(e.problem.contains("ackd owns"), "{e}");
        let e = err(&[("ACKD_RDKAFKA_GROUP_ID", "x")]);
        assert!(e.problem.contains("ACKD_GROUP_ID"), "{e}");
        let e = err(&[("ACKD_RDKAFKA_SESSION____TIMEOUT", "1")]);
        assert!(e.problem.contains("underscores"), "{e}");
    }

    #[test]
    fn a_config_file_is_layered_between_defaults_and_environment() {
        let dir = std::env::temp_dir().join(format!("ackd-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ackd.toml");
        std::fs::write(
        &path,
        "commit_interval_ms = 1000\nstart_from = \"latest\"\n[rdkafka]\n\"fetch.min.bytes\" = 10\n",
    )
    .unwrap();
        let p = path.to_str().unwrap();
        let s = Settings::from_vars(vars(&[
            ("ACKD_CONFIG_FILE", p),
            ("ACKD_START_FROM", "earliest"),
        ]))
        .unwrap();
        assert_eq!(s.commit_interval, Duration::from_millis(1000));
        assert_eq!(s.group.start_from, StartFrom::Earliest);
        assert_eq!(s.rdkafka["fetch.min.bytes"].value, "10");
        // The defaults' table is kept where the file's table does not say otherwise.
        assert_eq!(s.rdkafka["client.id"].value, "ackd");

        std::fs::write(&path, "commit_interval_ms = \"soon\"\n").unwrap();
        let e = err(&[("ACKD_CONFIG_FILE", p)]);
        assert!(
            e.setting
                .starts_with("ACKD_COMMIT_INTERVAL_MS (`commit_interval_ms` in"),
            "{e}"
        );
        std::fs::write(&path, "comit_interval_ms = 5\n").unwrap();
        assert!(err(&[("ACKD_CONFIG_FILE", p)])
            .setting
            .contains("comit_interval_ms"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
