//! Schema Registry decoding (`ACKD_VALUE_FORMAT`, `ACKD_KEY_FORMAT`,
//! `ACKD_SCHEMA_REGISTRY_*`), parsed; the decoding is src/processors/schema_registry/.

use std::fmt;

use crate::settings::kafka_url::percent_decode;
use crate::settings::raw::RawSettings;
use crate::settings::secret::Secret;
use crate::settings::security::{pems, Tls};
use crate::settings::SettingError;

use super::http_endpoint::shown_url;

/// How a key or a value is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The bytes as they are (today's behaviour, the default).
    Raw,
    /// The Confluent wire format, decoded with the schema its id names: of the kind the
    /// registry states for the id (`None`), or only of this one.
    Registry(Option<SchemaKind>),
}

/// A Schema Registry schema type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaKind {
    Avro,
    Protobuf,
    JsonSchema,
}

impl SchemaKind {
    /// As the registry's `schemaType` says it (absent: AVRO).
    pub fn registry_name(self) -> &'static str {
        match self {
            SchemaKind::Avro => "AVRO",
            SchemaKind::Protobuf => "PROTOBUF",
            SchemaKind::JsonSchema => "JSON",
        }
    }
}

impl Format {
    pub const ALLOWED: &'static str =
        "raw, schema-registry (the schema type the registry states for the id), avro, protobuf or json-schema";

    fn parse(text: &str) -> Option<Format> {
        Some(match text.to_ascii_lowercase().as_str() {
            "raw" => Format::Raw,
            "schema-registry" => Format::Registry(None),
            "avro" => Format::Registry(Some(SchemaKind::Avro)),
            "protobuf" => Format::Registry(Some(SchemaKind::Protobuf)),
            "json-schema" => Format::Registry(Some(SchemaKind::JsonSchema)),
            _ => return None,
        })
    }
}

/// The decoding's settings; `None` in [`super::Settings`] when key and value are raw.
/// `Debug` shows no password.
#[derive(Debug, Clone)]
pub struct SchemaSettings {
    /// `ACKD_VALUE_FORMAT`.
    pub value: Format,
    /// `ACKD_KEY_FORMAT`.
    pub key: Format,
    /// `ACKD_SCHEMA_REGISTRY_URL`: tried in order; user info taken out into `auth`.
    pub urls: Vec<RegistryUrl>,
    /// Basic auth: from the URL's user info, or `ACKD_SCHEMA_REGISTRY_USER`/`_PASSWORD`.
    pub auth: Option<(Secret, Secret)>,
    /// `ACKD_SCHEMA_RAW_BYTES`: the raw bytes beside the decoded JSON too.
    pub raw_bytes: bool,
    /// The brokers' PEM settings, for an https:// registry: the CA as an extra root, the
    /// client certificate and key as its identity.
    pub tls: Option<RegistryTls>,
}

/// PEMs for the registry's client.
#[derive(Clone)]
pub struct RegistryTls {
    pub trusted: Option<String>,
    pub client: Option<(String, Secret)>,
}

impl fmt::Debug for RegistryTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RegistryTls { .. }")
    }
}

/// A registry URL without user info. `Debug` is the URL.
#[derive(Clone, PartialEq, Eq)]
pub struct RegistryUrl(pub reqwest::Url);

impl fmt::Debug for RegistryUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.as_str())
    }
}

impl SchemaSettings {
    /// Every setting of the decoding, checked whether or not it is on.
    pub(super) fn parse(
        raw: &RawSettings,
        tls: Option<&Tls>,
    ) -> Result<Option<SchemaSettings>, SettingError> {
        let format = |key: &'static str| {
            Format::parse(raw.get(key))
                .ok_or_else(|| raw.error(key, format!("expected {}", Format::ALLOWED)))
        };
        let value = format("value_format")?;
        let key = format("key_format")?;
        let raw_bytes = raw.boolean("schema_raw_bytes")?;
        let (urls, url_auth) = urls(raw)?;
        let auth = auth(raw, url_auth)?;
        if value == Format::Raw && key == Format::Raw {
            return Ok(None);
        }
        if urls.is_empty() {
            let on = if value != Format::Raw {
                "ACKD_VALUE_FORMAT"
            } else {
                "ACKD_KEY_FORMAT"
            };
            return Err(SettingError::new(
                "ACKD_SCHEMA_REGISTRY_URL",
                None,
                format!("is required when {on} is not raw: the Schema Registry's http:// or https:// URL(s), comma-separated"),
            ));
        }
        Ok(Some(SchemaSettings {
            value,
            key,
            urls,
            auth,
            raw_bytes,
            tls: tls.map(registry_tls),
        }))
    }

    /// What no line may show: the password and the user name (an API key).
    pub fn never_shown(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some((user, password)) = &self.auth {
            out.push(user.expose().to_string());
            out.push(password.expose().to_string());
        }
        out
    }
}

/// The brokers' PEMs ([`pems`] lists the CAs first, the client's pair last).
fn registry_tls(tls: &Tls) -> RegistryTls {
    let all = pems(tls);
    let trusted = tls.trusted.as_ref().map(|_| all[0].to_string());
    let client = tls.client.as_ref().map(|_| {
        let n = all.len();
        (all[n - 2].to_string(), Secret::new(all[n - 1]))
    });
    RegistryTls { trusted, client }
}

/// `ACKD_SCHEMA_REGISTRY_URL`: comma-separated http(s) URLs; the user info of the first
/// that has one. A value with credentials is never shown in an error.
fn urls(raw: &RawSettings) -> Result<(Vec<RegistryUrl>, Option<UserInfo>), SettingError> {
    const KEY: &str = "schema_registry_url";
    let text = raw.get(KEY);
    let hide = |mut e: SettingError| {
        if text.contains('@') {
            e.value = None;
        }
        e
    };
    let mut urls = Vec::new();
    let mut auth = None;
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let mut url = reqwest::Url::parse(part).map_err(|e| {
            hide(raw.error(KEY, format!("`{}` is not a URL ({e}): expected http://host[:port][/path] or https://…, comma-separated", if part.contains('@') { "…" } else { part })))
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(hide(raw.error(
                KEY,
                format!(
                    "`{}`: expected an http:// or https:// URL with a host",
                    shown_url(&url)
                ),
            )));
        }
        if !url.username().is_empty() && auth.is_none() {
            let decode = |s: &str| percent_decode(s).map_err(|p| hide(raw.error(KEY, p)));
            auth = Some((
                decode(url.username())?,
                decode(url.password().unwrap_or(""))?,
            ));
        }
        let _ = url.set_username("");
        let _ = url.set_password(None);
        // The API's paths are relative to it: a base without a trailing slash would
        // lose its last segment on join.
        if !url.path().ends_with('/') {
            let path = format!("{}/", url.path());
            url.set_path(&path);
        }
        urls.push(RegistryUrl(url));
    }
    Ok((urls, auth))
}

/// A user name and password, decoded.
type UserInfo = (String, String);

/// Basic auth: the URL's user info or the two settings (both or neither), not both.
fn auth(
    raw: &RawSettings,
    from_url: Option<UserInfo>,
) -> Result<Option<(Secret, Secret)>, SettingError> {
    let user = raw.get("schema_registry_user");
    let password = raw.get("schema_registry_password");
    let from_settings = match (user.is_empty(), password.is_empty()) {
        (true, true) => None,
        (false, false) => Some((user.to_string(), password.to_string())),
        (true, false) => {
            return Err(SettingError::new(
                "ACKD_SCHEMA_REGISTRY_USER",
                None,
                "is required with ACKD_SCHEMA_REGISTRY_PASSWORD (both or neither: the registry's API key and secret)",
            ))
        }
        (false, true) => {
            return Err(SettingError::new(
                "ACKD_SCHEMA_REGISTRY_PASSWORD",
                None,
                "is required with ACKD_SCHEMA_REGISTRY_USER (both or neither: the registry's API key and secret)",
            ))
        }
    };
    match (from_url, from_settings) {
        (Some(_), Some(_)) => Err(SettingError::new(
            "ACKD_SCHEMA_REGISTRY_USER",
            None,
            "credentials are given both in ACKD_SCHEMA_REGISTRY_URL and in ACKD_SCHEMA_REGISTRY_USER/PASSWORD: give them once",
        )),
        (a, b) => Ok(a.or(b).map(|(u, p)| (Secret::new(u), Secret::new(p)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::test_vars::{err, vars};
    use crate::settings::Settings;

    #[test]
    fn raw_by_default_and_the_registry_only_when_a_format_asks() {
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert!(s.schemas.is_none());
        // A URL alone decodes nothing.
        let s = Settings::from_vars(vars(&[("ACKD_SCHEMA_REGISTRY_URL", "http://r:8081")]));
        assert!(s.unwrap().schemas.is_none());
        let s = Settings::from_vars(vars(&[
            ("ACKD_VALUE_FORMAT", "Avro"),
            ("ACKD_KEY_FORMAT", "schema-registry"),
            (
                "ACKD_SCHEMA_REGISTRY_URL",
                "https://key%2F1:s%40cret@a.example.com/apis/ccompat/v7, http://b:8081",
            ),
        ]))
        .unwrap();
        let r = s.schemas.unwrap();
        assert_eq!(r.value, Format::Registry(Some(SchemaKind::Avro)));
        assert_eq!(r.key, Format::Registry(None));
        let urls: Vec<&str> = r.urls.iter().map(|u| u.0.as_str()).collect();
        assert_eq!(
            urls,
            ["https://a.example.com/apis/ccompat/v7/", "http://b:8081/"]
        );
        let (user, password) = r.auth.unwrap();
        assert_eq!((user.expose(), password.expose()), ("key/1", "s@cret"));
    }

    #[test]
    fn bad_values_name_the_setting_and_what_is_allowed() {
        let e = err(&[("ACKD_VALUE_FORMAT", "avro2")]);
        assert_eq!(e.setting, "ACKD_VALUE_FORMAT");
        assert!(e.problem.contains("json-schema"), "{}", e.problem);
        let e = err(&[("ACKD_KEY_FORMAT", "protobuf")]);
        assert_eq!(e.setting, "ACKD_SCHEMA_REGISTRY_URL");
        assert!(e.problem.contains("ACKD_KEY_FORMAT"), "{}", e.problem);
        let e = err(&[("ACKD_SCHEMA_REGISTRY_URL", "ftp://r")]);
        assert_eq!(e.setting, "ACKD_SCHEMA_REGISTRY_URL");
        let e = err(&[("ACKD_SCHEMA_REGISTRY_URL", "http://u:hunter2@r:8081 x")]);
        assert_eq!(e.value, None, "a value with credentials is not shown");
        let e = err(&[("ACKD_SCHEMA_REGISTRY_USER", "key")]);
        assert_eq!(e.setting, "ACKD_SCHEMA_REGISTRY_PASSWORD");
        let e = err(&[
            ("ACKD_SCHEMA_REGISTRY_URL", "http://u:p@r:8081"),
            ("ACKD_SCHEMA_REGISTRY_USER", "key"),
            ("ACKD_SCHEMA_REGISTRY_PASSWORD", "secret"),
        ]);
        assert!(e.problem.contains("once"), "{}", e.problem);
    }

    #[test]
    fn credentials_are_never_shown() {
        let s = Settings::from_vars(vars(&[
            ("ACKD_VALUE_FORMAT", "avro"),
            ("ACKD_SCHEMA_REGISTRY_URL", "http://r:8081"),
            ("ACKD_SCHEMA_REGISTRY_USER", "APIKEY123"),
            ("ACKD_SCHEMA_REGISTRY_PASSWORD", "hunter2secret"),
        ]))
        .unwrap();
        let hidden = s.never_shown();
        assert!(hidden.iter().any(|v| v == "hunter2secret"));
        assert!(hidden.iter().any(|v| v == "APIKEY123"));
        assert!(!format!("{s:?}").contains("hunter2secret"));
        let in_vars = crate::settings::never_shown_in_vars(vars(&[
            ("ACKD_SCHEMA_REGISTRY_URL", "http://u:pw%21x@r:8081"),
            ("ACKD_SCHEMA_REGISTRY_PASSWORD", "hunter3"),
        ]));
        for v in ["pw%21x", "pw!x", "hunter3"] {
            assert!(in_vars.iter().any(|h| h == v), "{v} in {in_vars:?}");
        }
    }
}
