//! The Schema Registry client: a schema by its id (`GET /schemas/ids/{id}`, references
//! through `GET /subjects/{subject}/versions/{version}`, the subjects that hold it through
//! `GET /schemas/ids/{id}/versions`), cached by id, with a timeout and a second round over
//! the URLs.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::processors::processor::ProcessError;
use crate::settings::{RegistryTls, SchemaKind, SchemaSettings, SettingError};

use super::avro::AvroSchema;
use super::protobuf::ProtoSchema;

/// Schemas kept at most: ids are few (one per schema version), but unbounded memory
/// must not depend on what producers write.
const CACHE_MAX: usize = 1000;
/// One request, answer included.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Rounds over the URLs before the message fails retryably.
const ROUNDS: usize = 2;
/// References followed at most, in depth (a cycle must not loop).
const MAX_REFERENCE_DEPTH: usize = 16;

/// A schema ready to decode with.
pub(crate) struct Schema {
    pub(crate) kind: SchemaKind,
    pub(crate) parsed: Parsed,
    /// The subjects the registry lists for the id, in its order; empty when it could not
    /// tell (the subject is informative: its absence fails nothing).
    pub(crate) subjects: Vec<Arc<str>>,
}

impl Schema {
    /// The subject to name for a `which` (`key` or `value`) of `topic`: the topic's own
    /// (`<topic>-<which>`, TopicNameStrategy), else one of the topic's
    /// (`<topic>-<record>`, TopicRecordNameStrategy), else the first listed.
    pub(crate) fn subject(&self, topic: &str, which: &str) -> Option<&Arc<str>> {
        fn of_topic<'s>(subject: &'s str, topic: &str) -> Option<&'s str> {
            subject.strip_prefix(topic)?.strip_prefix('-')
        }
        self.subjects
            .iter()
            .find(|s| of_topic(s, topic) == Some(which))
            .or_else(|| self.subjects.iter().find(|s| of_topic(s, topic).is_some()))
            .or_else(|| self.subjects.first())
    }
}

pub(crate) enum Parsed {
    Avro(Box<AvroSchema>),
    /// JSON Schema: the payload is JSON already.
    Json,
    Protobuf(Box<ProtoSchema>),
}

pub(crate) struct Registry {
    client: reqwest::Client,
    urls: Vec<reqwest::Url>,
    auth: Option<(String, String)>,
    cache: Mutex<Cache>,
}

/// Schemas by id, and the ids in the order they came (the oldest goes first).
type Cache = (HashMap<u32, Arc<Schema>>, VecDeque<u32>);

/// A request's outcome that is not a schema: worth another URL or round, or not.
enum Failure {
    Retry(String),
    Permanent(String),
}

impl Registry {
    pub(crate) fn new(settings: &SchemaSettings) -> Result<Registry, SettingError> {
        let mut builder = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .connect_timeout(TIMEOUT);
        if let Some(tls) = &settings.tls {
            builder = with_tls(builder, tls)?;
        }
        let client = builder.build().map_err(|e| {
            SettingError::new(
                "ACKD_SCHEMA_REGISTRY_URL",
                None,
                format!("the registry's HTTP client could not be built: {e}"),
            )
        })?;
        Ok(Registry {
            client,
            urls: settings.urls.iter().map(|u| u.0.clone()).collect(),
            auth: settings
                .auth
                .as_ref()
                .map(|(u, p)| (u.expose().to_string(), p.expose().to_string())),
            cache: Mutex::new((HashMap::new(), VecDeque::new())),
        })
    }

    /// The schema `id` names, from the cache or the registry. The registry unreachable,
    /// a 5xx, 401, 403 or 429: retryable; an unknown id or a schema that does not parse:
    /// permanent. Reasons name the id.
    pub(crate) async fn schema(&self, id: u32) -> Result<Arc<Schema>, ProcessError> {
        if let Some(s) = self.lock().0.get(&id) {
            return Ok(s.clone());
        }
        let body = match self.get(&format!("schemas/ids/{id}")).await {
            Ok(body) => body,
            Err(Failure::Retry(why)) => {
                return Err(ProcessError::retryable(format!("schema id {id}: {why}")))
            }
            Err(Failure::Permanent(why)) => {
                return Err(ProcessError::permanent(format!("schema id {id}: {why}")))
            }
        };
        let schema = self.parse(&body).await.map_err(|f| match f {
            Failure::Retry(why) => ProcessError::retryable(format!("schema id {id}: {why}")),
            Failure::Permanent(why) => ProcessError::permanent(format!("schema id {id}: {why}")),
        })?;
        let schema = Arc::new(Schema {
            subjects: self.subjects(id).await,
            ..schema
        });
        let mut cache = self.lock();
        if cache.0.len() >= CACHE_MAX {
            if let Some(old) = cache.1.pop_front() {
                cache.0.remove(&old);
            }
        }
        if cache.0.insert(id, schema.clone()).is_none() {
            cache.1.push_back(id);
        }
        Ok(schema)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The registry's answer (`schema`, `schemaType`, `references`) as a schema.
    async fn parse(&self, body: &Value) -> Result<Schema, Failure> {
        let text = body["schema"]
            .as_str()
            .ok_or_else(|| Failure::Permanent("the registry's answer has no schema".into()))?;
        let kind = match body["schemaType"].as_str().unwrap_or("AVRO") {
            "AVRO" => SchemaKind::Avro,
            "PROTOBUF" => SchemaKind::Protobuf,
            "JSON" => SchemaKind::JsonSchema,
            other => {
                return Err(Failure::Permanent(format!(
                    "the registry states an unknown schema type `{other}`"
                )))
            }
        };
        let mut references = Vec::new();
        if kind != SchemaKind::JsonSchema {
            self.references(body, 0, &mut references).await?;
        }
        let parsed = match kind {
            SchemaKind::Avro => {
                let texts: Vec<String> = references.into_iter().map(|(_, t)| t).collect();
                let avro = AvroSchema::parse(text, &texts).map_err(|e| {
                    Failure::Permanent(format!("its Avro schema does not parse: {e}"))
                })?;
                Parsed::Avro(Box::new(avro))
            }
            SchemaKind::JsonSchema => Parsed::Json,
            SchemaKind::Protobuf => {
                let proto = ProtoSchema::parse(text, &references).map_err(|e| {
                    Failure::Permanent(format!("its Protobuf schema does not compile: {e}"))
                })?;
                Parsed::Protobuf(Box::new(proto))
            }
        };
        Ok(Schema {
            kind,
            parsed,
            subjects: Vec::new(),
        })
    }

    /// The subjects holding schema `id`; none when the registry cannot tell (an older
    /// one without the endpoint, or a failure): kept so, as the subject only informs.
    async fn subjects(&self, id: u32) -> Vec<Arc<str>> {
        let Ok(body) = self.get(&format!("schemas/ids/{id}/versions")).await else {
            return Vec::new();
        };
        body.as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["subject"].as_str().map(Arc::from))
            .collect()
    }

    /// The schemas `body` references (the name it imports each by, and its text), each
    /// after its own references.
    async fn references(
        &self,
        body: &Value,
        depth: usize,
        out: &mut Vec<(String, String)>,
    ) -> Result<(), Failure> {
        let Some(refs) = body["references"].as_array().filter(|r| !r.is_empty()) else {
            return Ok(());
        };
        if depth >= MAX_REFERENCE_DEPTH {
            return Err(Failure::Permanent("its references nest too deep".into()));
        }
        for r in refs {
            let (Some(subject), Some(version)) = (r["subject"].as_str(), r["version"].as_i64())
            else {
                return Err(Failure::Permanent(
                    "a reference without subject or version".into(),
                ));
            };
            let path = format!("subjects/{}/versions/{version}", encode_segment(subject));
            let referenced = self.get(&path).await?;
            Box::pin(self.references(&referenced, depth + 1, out)).await?;
            let name = r["name"].as_str().unwrap_or(subject).to_string();
            if let Some(text) = referenced["schema"].as_str() {
                if !out.iter().any(|(n, _)| *n == name) {
                    out.push((name, text.to_string()));
                }
            }
        }
        Ok(())
    }

    /// GET `path` under each URL in turn, for [`ROUNDS`] rounds while the failures are
    /// worth another try.
    async fn get(&self, path: &str) -> Result<Value, Failure> {
        let mut last = String::new();
        for round in 0..ROUNDS {
            if round > 0 {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            for base in &self.urls {
                match self.get_one(base, path).await {
                    Ok(v) => return Ok(v),
                    Err(Failure::Retry(why)) => last = why,
                    Err(permanent) => return Err(permanent),
                }
            }
        }
        Err(Failure::Retry(last))
    }

    async fn get_one(&self, base: &reqwest::Url, path: &str) -> Result<Value, Failure> {
        let url = base
            .join(path)
            .map_err(|e| Failure::Permanent(format!("bad registry path {path}: {e}")))?;
        let mut request = self.client.get(url).header(
            "Accept",
            "application/vnd.schemaregistry.v1+json, application/json",
        );
        if let Some((user, password)) = &self.auth {
            request = request.basic_auth(user, Some(password));
        }
        let at = base.as_str();
        let response = request.send().await.map_err(|e| {
            Failure::Retry(format!("registry {at} unreachable: {}", without_url(&e)))
        })?;
        let status = response.status();
        match status.as_u16() {
            200..=299 => {
                let body = response.bytes().await.map_err(|e| {
                    Failure::Retry(format!("registry {at} unreachable: {}", without_url(&e)))
                })?;
                serde_json::from_slice(&body).map_err(|e| {
                    Failure::Retry(format!("registry {at} answered with no JSON: {e}"))
                })
            }
            404 => Err(Failure::Permanent(format!("not found in registry {at} (404)"))),
            401 | 403 => Err(Failure::Retry(format!(
                "registry {at} refused the credentials ({status}): check ACKD_SCHEMA_REGISTRY_USER/PASSWORD or the URL's user info"
            ))),
            408 | 429 | 500..=599 => Err(Failure::Retry(format!("registry {at} answered {status}"))),
            _ => Err(Failure::Permanent(format!("registry {at} answered {status}"))),
        }
    }
}

/// reqwest's error with its causes (the URL in it carries no credentials: they are
/// taken out of the settings' URLs).
fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A subject as one path segment.
fn encode_segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The brokers' CA as an extra root, their client certificate as the registry's.
fn with_tls(
    mut builder: reqwest::ClientBuilder,
    tls: &RegistryTls,
) -> Result<reqwest::ClientBuilder, SettingError> {
    let refused = |what: &str, e: reqwest::Error| {
        SettingError::new(
            what,
            None,
            format!("cannot be used for the Schema Registry's TLS: {e}"),
        )
    };
    if let Some(pem) = &tls.trusted {
        for cert in reqwest::Certificate::from_pem_bundle(pem.as_bytes())
            .map_err(|e| refused("KAFKA_TRUSTED_CERT", e))?
        {
            builder = builder.add_root_certificate(cert);
        }
    }
    if let Some((cert, key)) = &tls.client {
        let identity = reqwest::Identity::from_pkcs8_pem(cert.as_bytes(), key.expose().as_bytes())
            .map_err(|e| refused("KAFKA_CLIENT_CERT_KEY", e))?;
        builder = builder.identity(identity);
    }
    Ok(builder)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(subjects: &[&str]) -> Schema {
        Schema {
            kind: SchemaKind::JsonSchema,
            parsed: Parsed::Json,
            subjects: subjects.iter().map(|s| Arc::from(*s)).collect(),
        }
    }

    #[test]
    fn the_subject_named_is_the_topics_own_else_one_of_the_topics_else_the_first() {
        let s = listing(&["a-value", "orders-shop.Order", "orders-key", "orders-value"]);
        let name = |topic, which| s.subject(topic, which).map(|s| s.to_string());
        assert_eq!(name("orders", "value").as_deref(), Some("orders-value"));
        assert_eq!(name("orders", "key").as_deref(), Some("orders-key"));
        let s = listing(&["a-value", "orders-shop.Order"]);
        let name = |topic, which| s.subject(topic, which).map(|s| s.to_string());
        assert_eq!(
            name("orders", "value").as_deref(),
            Some("orders-shop.Order")
        );
        assert_eq!(name("other", "value").as_deref(), Some("a-value"));
        // A topic whose name another's begins with is not that one's.
        assert_eq!(name("order", "value").as_deref(), Some("a-value"));
        assert_eq!(listing(&[]).subject("orders", "value"), None);
    }
}
