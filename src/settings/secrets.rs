//! The variables and values no line may show, known before the settings are valid.

use std::collections::HashMap;

use crate::settings::kafka_url;
use crate::settings::rdkafka_env::{self, is_secret_property};
use crate::settings::security;

use super::keys::env_name;
use super::raw::RawSettings;

/// The variables that carry one of ackd's credentials (KAFKA_URL, ACKD_HTTP_URL and
/// ACKD_SCHEMA_REGISTRY_URL only with `user:password@`), besides `ACKD_RDKAFKA_<NAME>` of a secret property: an exec
/// child gets none of them unless `ACKD_EXEC_PASS_SECRETS` names it.
pub const SECRET_VARIABLES: &[&str] = &[
    "KAFKA_URL",
    security::CLIENT_KEY,
    security::SASL_USERNAME,
    security::SASL_PASSWORD,
    "ACKD_HTTP_HEADERS",
    "ACKD_HTTP_URL",
    "ACKD_SCHEMA_REGISTRY_URL",
    "ACKD_SCHEMA_REGISTRY_USER",
    "ACKD_SCHEMA_REGISTRY_PASSWORD",
];

/// Whether the variable `name` = `value` carries one of ackd's credentials (see
/// [`SECRET_VARIABLES`]). Names are read as ackd reads them: `ACKD_` settings in any
/// case after the prefix.
pub fn is_secret_variable(name: &str, value: &str) -> bool {
    if let Some(suffix) = name.strip_prefix(rdkafka_env::PREFIX) {
        return rdkafka_env::property_from_env(suffix).is_ok_and(|p| is_secret_property(&p));
    }
    match variable_name(name).as_str() {
        "KAFKA_URL" | "ACKD_HTTP_URL" | "ACKD_SCHEMA_REGISTRY_URL" => value.contains('@'),
        name => SECRET_VARIABLES.contains(&name),
    }
}

/// The secrets of one `ACKD_HTTP_HEADERS` line: its value (the whole line if it has no
/// name), and of an `Authorization` header the credential without its scheme too (only
/// there: the last word of any other value may be an ordinary word).
fn header_secrets(line: &str) -> Vec<String> {
    let (name, value) = line.split_once(':').unwrap_or(("", line));
    let value = value.trim();
    let mut secrets = vec![value.to_string()];
    let name = name.trim().to_ascii_lowercase();
    if name == "authorization" || name == "proxy-authorization" {
        if let Some((_, credential)) = value.rsplit_once(' ') {
            secrets.push(credential.to_string());
        }
    }
    secrets
}

/// The name ackd reads `name` as: an `ACKD_` setting's in upper case (ackd takes any
/// case after the prefix), any other as it is.
pub fn variable_name(name: &str) -> String {
    match name.strip_prefix("ACKD_") {
        Some(key) if !name.starts_with(rdkafka_env::PREFIX) => env_name(&key.to_ascii_lowercase()),
        _ => name.to_string(),
    }
}

/// Every value no line may show that `vars` hold, whether or not they make valid
/// settings: [`crate::settings::secret::register`] gets them before validation, so that not even
/// a configuration error can show one. Values from a file (`ACKD_CONFIG_FILE`) count
/// when the file can be read.
pub fn never_shown_in_vars(vars: impl IntoIterator<Item = (String, String)>) -> Vec<String> {
    let vars: HashMap<String, String> = vars.into_iter().collect();
    let mut settings: HashMap<String, String> = HashMap::new();
    let mut rdkafka: Vec<(String, String)> = Vec::new();
    if let Ok(raw) = RawSettings::layer(&vars) {
        settings.extend(raw.values.iter().map(|(k, v)| (env_name(k), v.clone())));
        rdkafka.extend(raw.rdkafka.into_iter().map(|(p, v)| (p, v.value)));
    }
    for (name, value) in &vars {
        match name.strip_prefix(rdkafka_env::PREFIX) {
            Some(suffix) => {
                if let Ok(property) = rdkafka_env::property_from_env(suffix) {
                    rdkafka.push((property, value.clone()));
                }
            }
            None if is_secret_variable(name, value) => {
                settings.insert(variable_name(name), value.clone());
            }
            None => {}
        }
    }
    for pem in [security::TRUSTED_CERT, security::CLIENT_CERT] {
        if let Some(v) = vars.get(pem) {
            settings.insert(pem.to_string(), v.clone());
        }
    }
    let mut values = Vec::new();
    for (name, value) in &settings {
        values.extend(secrets_of_variable(name, value));
    }
    values.extend(
        rdkafka
            .into_iter()
            .filter(|(p, _)| is_secret_property(p))
            .map(|(_, v)| v),
    );
    values.retain(|v| !v.trim().is_empty());
    values.sort();
    values.dedup();
    values
}

/// The secret values one variable holds: the credentials of a URL (as written and
/// decoded), each header value (and its last word: a token without its scheme), or the
/// whole value.
fn secrets_of_variable(name: &str, value: &str) -> Vec<String> {
    match name {
        "KAFKA_URL" | "ACKD_SCHEMA_REGISTRY_URL" => kafka_url::user_info_texts(value),
        "ACKD_HTTP_URL" => match reqwest::Url::parse(value.trim()) {
            Ok(url) => url
                .password()
                .map(|p| [Some(p.to_string()), kafka_url::percent_decode(p).ok()])
                .into_iter()
                .flatten()
                .flatten()
                .collect(),
            Err(_) => kafka_url::user_info_texts(value),
        },
        "ACKD_HTTP_HEADERS" => value.lines().flat_map(header_secrets).collect(),
        name if name == security::TRUSTED_CERT
            || name == security::CLIENT_CERT
            || SECRET_VARIABLES.contains(&name) =>
        {
            vec![value.to_string()]
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::test_vars::vars;
    use crate::settings::Settings;

    #[test]
    fn secrets_never_show() {
        let s = Settings::from_vars(vars(&[("ACKD_RDKAFKA_SASL_PASSWORD", "hunter2")])).unwrap();
        let summary = s.rdkafka_shown();
        let debug = format!("{s:?}");
        assert!(!summary.contains("hunter2"), "{summary}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(summary.contains("sasl.password=[redacted]"));
    }

    /// Every property librdkafka 2.12.1 marks `_RK_SENSITIVE` (rdkafka_env::SENSITIVE):
    /// never shown, registered for scrubbing; the OAUTHBEARER assertion's passphrase and
    /// key file too, which no word of a property's name gives away.
    #[test]
    fn every_property_librdkafka_marks_sensitive_is_a_secret() {
        for listed in [
            "sasl.oauthbearer.assertion.private.key.passphrase",
            "sasl.oauthbearer.assertion.private.key.file",
        ] {
            assert!(rdkafka_env::SENSITIVE.contains(&listed), "{listed}");
        }
        for property in rdkafka_env::SENSITIVE {
            assert!(is_secret_property(property), "{property}");
            let var = rdkafka_env::env_for_property(property);
            let value = format!("Zq{}Zq", property.len());
            let s = Settings::from_vars(vars(&[(&var, &value)]))
                .unwrap_or_else(|e| panic!("{var}: {e}"));
            assert!(!s.rdkafka_shown().contains(&value), "{}", s.rdkafka_shown());
            assert!(s.never_shown().contains(&value), "{var}");
        }
        // The conservative fallback: a property a later librdkafka adds with a telling name.
        for property in [
            "sasl.some.new.passphrase",
            "https.client.private.key",
            "sasl.oauthbearer.token.new",
        ] {
            assert!(is_secret_property(property), "{property}");
        }
        for property in ["session.timeout.ms", "client.id", "sasl.mechanisms"] {
            assert!(!is_secret_property(property), "{property}");
        }
    }

    /// The variables an exec child does not get: ackd's own credentials; what is no
    /// credential stays.
    #[test]
    fn secret_variables_are_told_apart() {
        for (name, value) in [
            ("KAFKA_URL", "kafka+sasl-ssl://u:p@h:1"),
            ("ACKD_SASL_PASSWORD", "p"),
            ("ACKD_SASL_USERNAME", "u"),
            ("ACKD_sasl_password", "p"),
            ("KAFKA_CLIENT_CERT_KEY", "-----BEGIN PRIVATE KEY-----"),
            ("ACKD_HTTP_HEADERS", "Authorization: Bearer t"),
            ("ACKD_HTTP_URL", "https://u:p@h/"),
            ("ACKD_RDKAFKA_SASL_PASSWORD", "p"),
            (
                "ACKD_RDKAFKA_SASL_OAUTHBEARER_ASSERTION_PRIVATE_KEY_PASSPHRASE",
                "p",
            ),
        ] {
            assert!(is_secret_variable(name, value), "{name}");
        }
        for (name, value) in [
            ("KAFKA_URL", "kafka+ssl://h:1"),
            ("ACKD_HTTP_URL", "https://h/"),
            ("KAFKA_CLIENT_CERT", "-----BEGIN CERTIFICATE-----"),
            ("ACKD_TOPICS", "orders"),
            ("ACKD_RDKAFKA_CLIENT_ID", "x"),
            ("PATH", "/usr/bin"),
        ] {
            assert!(!is_secret_variable(name, value), "{name}");
        }
    }

    /// What can be known secret is known before validation, so that an error line cannot
    /// carry it either.
    #[test]
    fn secrets_are_known_even_when_the_settings_are_invalid() {
        let raw = vars(&[
            ("KAFKA_URL", "kafka+sasl-ssl://us%65r1:pa%22ss,w\\d@h:1,x"),
            ("ACKD_SASL_PASSWORD", "sasl-pw-1"),
            ("ACKD_sasl_username", "sasl-user-1"),
            (
                "ACKD_HTTP_HEADERS",
                "Authorization: Bearer tok-1\nX-Other: tok-2",
            ),
            ("ACKD_HTTP_URL", "https://u:url-pw-1@h/"),
            (
                "KAFKA_CLIENT_CERT_KEY",
                "-----BEGIN PRIVATE KEY-----\nAAAA\n",
            ),
            ("ACKD_RDKAFKA_SASL_OAUTHBEARER_CLIENT_SECRET", "oauth-1"),
            ("ACKD_RDKAFKA_CLIENT_ID", "not-secret"),
            ("ACKD_ORDERING", "sideways"),
        ]);
        assert!(Settings::from_vars(raw.clone()).is_err());
        let known = never_shown_in_vars(raw);
        for secret in [
            "user1",
            "us%65r1",
            "pa\"ss,w\\d",
            "pa%22ss,w\\d",
            "sasl-pw-1",
            "sasl-user-1",
            "Bearer tok-1",
            "tok-1",
            "tok-2",
            "url-pw-1",
            "oauth-1",
        ] {
            assert!(known.iter().any(|k| k == secret), "{secret}: {known:?}");
        }
        assert!(known.iter().any(|k| k.contains("AAAA")), "{known:?}");
        assert!(!known.iter().any(|k| k == "not-secret"), "{known:?}");
        let known =
            never_shown_in_vars(vars(&[("ACKD_HTTP_HEADERS", "User-Agent: ackd consumer")]));
        assert!(!known.iter().any(|k| k == "consumer"), "{known:?}");
    }
}
