//! Environment names for librdkafka properties, the convention of Confluent's images:
//! `ACKD_RDKAFKA_<NAME>` where NAME is the property upper-cased with `.` → `_`,
//! `_` → `__` and `-` → `___`. `ACKD_RDKAFKA_SESSION_TIMEOUT_MS` is `session.timeout.ms`.

/// The prefix of pass-through variables.
pub const PREFIX: &str = "ACKD_RDKAFKA_";

/// The properties librdkafka 2.12.1 marks `_RK_SENSITIVE` (src/rdkafka_conf.c; it
/// redacts them in its own configuration dumps), with the alias of one. ackd never shows
/// their values and registers them for scrubbing. Checked again on a librdkafka upgrade.
pub const SENSITIVE: &[&str] = &[
    "ssl.key.location",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl_key",
    "ssl.ca.pem",
    "ssl.keystore.password",
    "sasl.username",
    "sasl.password",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.assertion.private.key.file",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem",
];

/// Words that mark a property as a credential though [`SENSITIVE`] does not list it: a
/// property a later librdkafka adds, or one of a plugin. PEMs are never shown either.
const SENSITIVE_WORDS: &[&str] = &[
    "password",
    "passphrase",
    "secret",
    "token",
    "credential",
    "private",
    "jaas",
    "ssl.key",
    ".pem",
];

/// Whether a librdkafka property holds a credential and must never be shown.
pub fn is_secret_property(property: &str) -> bool {
    let p = property.to_ascii_lowercase();
    SENSITIVE.contains(&p.as_str()) || SENSITIVE_WORDS.iter().any(|w| p.contains(w))
}

/// The librdkafka property named by the part of a variable after [`PREFIX`].
pub fn property_from_env(suffix: &str) -> Result<String, String> {
    if suffix.is_empty() {
        return Err("names no property".into());
    }
    let mut property = String::with_capacity(suffix.len());
    let mut chars = suffix.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '_' {
            if !c.is_ascii_alphanumeric() {
                return Err(format!("holds `{c}`: use letters, digits and underscores"));
            }
            property.push(c.to_ascii_lowercase());
            continue;
        }
        let mut run = 1;
        while chars.next_if_eq(&'_').is_some() {
            run += 1;
        }
        property.push(match run {
            1 => '.',
            2 => '_',
            3 => '-',
            _ => {
                return Err(format!(
                    "has a run of {run} underscores: 1 is `.`, 2 `_`, 3 `-`"
                ))
            }
        });
    }
    if property.starts_with(['.', '_', '-']) || property.ends_with(['.', '_', '-']) {
        return Err("starts or ends with a separator".into());
    }
    Ok(property)
}

/// The variable that sets `property`.
pub fn env_for_property(property: &str) -> String {
    let mut name = String::from(PREFIX);
    for c in property.chars() {
        match c {
            '.' => name.push('_'),
            '_' => name.push_str("__"),
            '-' => name.push_str("___"),
            c => name.push(c.to_ascii_uppercase()),
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn confluent_convention() {
        for (env, prop) in [
            ("SESSION_TIMEOUT_MS", "session.timeout.ms"),
            (
                "PARTITION_ASSIGNMENT_STRATEGY",
                "partition.assignment.strategy",
            ),
            (
                "SSL_ENDPOINT_IDENTIFICATION_ALGORITHM",
                "ssl.endpoint.identification.algorithm",
            ),
            ("CLIENT_ID", "client.id"),
            ("FOO__BAR", "foo_bar"),
            ("FOO___BAR", "foo-bar"),
            ("A_B__C___D", "a.b_c-d"),
        ] {
            assert_eq!(property_from_env(env).unwrap(), prop);
            assert_eq!(env_for_property(prop), format!("{PREFIX}{env}"));
        }
    }

    #[test]
    fn malformed_names_are_refused() {
        for bad in ["", "_X", "X_", "A____B", "A-B", "SESSION.TIMEOUT"] {
            assert!(property_from_env(bad).is_err(), "{bad:?} accepted");
        }
    }

    proptest! {
        #[test]
        fn property_names_round_trip(prop in "[a-z0-9]+([._-][a-z0-9]+){0,5}") {
            let env = env_for_property(&prop);
            let suffix = env.strip_prefix(PREFIX).unwrap();
            prop_assert_eq!(property_from_env(suffix).unwrap(), prop);
        }
    }
}
