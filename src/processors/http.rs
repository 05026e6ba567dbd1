//! The `http` processor: every message POSTed to `ACKD_HTTP_URL`.
//!
//! - One [`reqwest::Client`] (a pool of keep-alive connections), at most
//!   `ACKD_HTTP_CONCURRENCY` requests in flight, or with
//!   `ACKD_HTTP_CONCURRENCY_MODE=adaptive` a limit up to it that follows the endpoint's
//!   capacity ([`RequestLimit`]). The partition workers send a message only after the
//!   previous one of its partition (or of its key, with `ACKD_ORDERING=key`) was
//!   answered, so that order holds with any concurrency.
//! - Body `json` (default): the object of [`super::json`] (the exec processor's request
//!   line), `Content-Type: application/json`. Body `raw`: the value bytes,
//!   `Content-Type: application/octet-stream`, metadata in `Ackd-*` headers (see
//!   [`raw_headers`]).
//! - Every request says whether it may be a repeat: `Ackd-Redelivered: true|false` and
//!   `Ackd-Attempt: N` ([`Delivery`]); a batch's, true if any of its messages may be,
//!   and the batch's attempt.
//! - `ACKD_HTTP_HEADERS` are added to every request; their values are secrets (marked
//!   sensitive, registered with [`crate::settings::secret`], redacted from failure reasons).
//! - A message's W3C trace context (`traceparent`, `tracestate` Kafka headers) goes
//!   as the request's headers of the same names ([`trace_headers`]), in both bodies.
//! - 2xx acks. 408, 429, 5xx, timeouts and connection errors are retryable, with the
//!   response's `Retry-After` (seconds or an HTTP-date) as the least wait; on a 429 or
//!   a 503 it also holds back every request to the endpoint, not only that message's. Any other
//!   status (other 4xx, and 3xx: redirects are not followed) fails permanently. A
//!   failure's reason is the status and at most 200 bytes of the response body.
//! - A batch's refusal names its failed message in an `Ackd-Failed-Offset` header (the
//!   ones before it are acknowledged); the body is never read for that.

use std::fmt;
use std::time::{Duration, SystemTime};

use crate::output::metrics::HTTP_LIMIT;
use crate::processors::processor::{queued, BatchError, Message, ProcessError};
use crate::processors::request_limit::{LimitSettings, Permit, RequestLimit};
use crate::settings::secret::REDACTED;
use crate::settings::SettingError;
use crate::settings::{shown_url, ConcurrencyMode, HttpBody, HttpSettings};
use base64::Engine as _;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};

/// Bytes of a response body a failure's reason shows at most.
const BODY_EXCERPT: usize = 200;
/// Bytes of a response body read (and dropped) so the connection can be reused.
const BODY_DRAIN: usize = 64 * 1024;

/// The `http` processor.
pub struct Http {
    client: reqwest::Client,
    settings: HttpSettings,
    /// `ACKD_HTTP_HEADERS`, ready to send (values marked sensitive).
    headers: HeaderMap,
    /// The values of `ACKD_HTTP_HEADERS`, removed from any failure reason.
    secrets: Vec<String>,
    limit: RequestLimit,
}

impl fmt::Debug for Http {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Http")
            .field("url", &self.settings.url)
            .field("body", &self.settings.body)
            .field("concurrency", &self.settings.concurrency)
            .field("concurrency_mode", &self.settings.concurrency_mode)
            .field("limit", &self.limit.current())
            .field("timeout", &self.settings.timeout)
            .finish()
    }
}

impl Http {
    pub fn new(settings: HttpSettings) -> Result<Http, SettingError> {
        let mut headers = HeaderMap::new();
        for (name, value) in &settings.headers {
            // Both were checked when the settings were read.
            let (Ok(n), Ok(mut v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value.expose()),
            ) else {
                continue;
            };
            v.set_sensitive(true);
            headers.append(n, v);
        }
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            // A POST that is redirected would become a GET: a redirect is a failure.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("ackd/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| SettingError {
                setting: "ACKD_HTTP_URL".into(),
                value: None,
                problem: format!("cannot set up the HTTP client: {e}"),
            })?;
        tracing::info!(
            at = "http_processor",
            url = shown_url(&settings.url.0),
            body = settings.body.as_str(),
            concurrency = settings.concurrency,
            concurrency_mode = settings.concurrency_mode.as_str(),
            timeout_ms = settings.timeout.as_millis() as u64,
            // Names only: the values are secrets.
            headers = settings
                .headers
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(",")
        );
        Ok(Http {
            client,
            secrets: settings
                .headers
                .iter()
                .map(|(_, v)| v.expose().to_string())
                .filter(|v| !v.is_empty())
                .collect(),
            headers,
            limit: RequestLimit::new(
                LimitSettings {
                    adaptive: settings.concurrency_mode == ConcurrencyMode::Adaptive,
                    max: settings.concurrency,
                    pause_max: settings.pause_max,
                },
                Some(&HTTP_LIMIT),
            ),
            settings,
        })
    }

    pub async fn process(&self, message: &Message<'_>) -> Result<(), ProcessError> {
        let raw = self.settings.body == HttpBody::Raw;
        let (content_type, mut metadata) = match raw {
            false => ("application/json", Vec::new()),
            true => ("application/octet-stream", raw_headers(message)),
        };
        metadata.extend(trace_headers(message));
        let body = || match raw {
            false => super::json::encode(message),
            true => message.payload().unwrap_or_default().to_vec(),
        };
        self.post(content_type, body, (Delivery::of(message), metadata))
            .await
            .map_err(|refused| refused.error)
    }

    /// A batch as one request: a JSON array of the `json` body's objects. A 2xx
    /// acknowledges all of it; a failure is for the message whose offset the response
    /// names in [`FAILED_OFFSET`] (N in the batch), else for its first.
    pub async fn process_batch(&self, messages: &[Message<'_>]) -> Result<(), BatchError> {
        let first = messages.first().map_or(-1, Message::offset);
        let body = || super::json::encode_batch(messages);
        let delivery = Delivery::of_batch(messages);
        self.post("application/json", body, (delivery, Vec::new()))
            .await
            .map_err(|refused| {
                let offset = refused
                    .offset
                    .filter(|o| messages.binary_search_by_key(o, Message::offset).is_ok())
                    .unwrap_or(first);
                BatchError::new(offset, refused.error)
            })
    }

    async fn post(
        &self,
        content_type: &'static str,
        body: impl FnOnce() -> Vec<u8>,
        metadata: (Delivery, Vec<(&'static str, HeaderValue)>),
    ) -> Result<(), Refused> {
        let refused = |error| Refused {
            error,
            offset: None,
        };
        // The call starts when it has a permit, not while it waits for one (or for a
        // Retry-After's pause to pass).
        let queued = queued();
        let permit = self.limit.acquire().await;
        // The wait for a permit may have spanned a stall, or the membership fallen in
        // doubt meanwhile: nothing starts until the partition may go on.
        queued.startable().await;
        // Declared after the permit, so dropped before it: the call ends before the
        // permit is free for the next one.
        let Some(_taken) = queued.take() else {
            return Err(refused(ProcessError::retryable(
                "dropped before it was sent: the partition is stopping",
            )));
        };
        // Rendered only with a permit: the calls waiting for one (one per partition behind
        // a slow endpoint) hold no copy of their messages.
        let request = self.request(content_type, body(), metadata);
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => {
                if e.is_timeout() {
                    permit.overloaded();
                }
                return Err(refused(ProcessError::retryable(
                    self.redact(self.describe(&e)),
                )));
            }
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        self.overload(&permit, status, retry_after);
        let failed_offset = failed_offset(response.headers());
        let body = read_start(response).await;
        if status.is_success() {
            permit.succeeded();
            return Ok(());
        }
        Err(Refused {
            error: self.refusal(status, &body, retry_after),
            offset: failed_offset,
        })
    }

    /// A 429 or a 503 says the endpoint is full: the limit shrinks, and its Retry-After
    /// holds back every request, not only the one it answered.
    fn overload(&self, permit: &Permit<'_>, status: reqwest::StatusCode, after: Option<Duration>) {
        if !matches!(status.as_u16(), 429 | 503) {
            return;
        }
        permit.overloaded();
        if let Some(after) = after {
            self.limit.pause(after);
        }
    }

    /// The POST of `body`: the configured headers, the request's own (`metadata`: its
    /// delivery, a raw body's metadata, the trace context, each replacing a configured
    /// header of its name), and `content_type` unless ACKD_HTTP_HEADERS gives one.
    fn request(
        &self,
        content_type: &'static str,
        body: Vec<u8>,
        (delivery, metadata): (Delivery, Vec<(&'static str, HeaderValue)>),
    ) -> reqwest::RequestBuilder {
        let mut own = HeaderMap::new();
        for (name, value) in delivery.headers().into_iter().chain(metadata) {
            own.insert(HeaderName::from_static(name), value);
        }
        let mut request = self
            .client
            .post(self.settings.url.0.clone())
            .headers(self.headers.clone())
            .headers(own);
        // ACKD_HTTP_HEADERS may give the bodies their own Content-Type.
        if !self.headers.contains_key(CONTENT_TYPE) {
            request = request.header(CONTENT_TYPE, content_type);
        }
        request.body(body)
    }

    /// What a response other than 2xx means: retryable for 408, 429 and 5xx (after its
    /// Retry-After, if it has one), permanent otherwise; the reason shows the status and
    /// the start of `body`, redacted.
    fn refusal(
        &self,
        status: reqwest::StatusCode,
        body: &[u8],
        retry_after: Option<Duration>,
    ) -> ProcessError {
        let mut reason = format!("HTTP {status}");
        let excerpt = excerpt(body);
        if !excerpt.is_empty() {
            reason.push_str(": ");
            reason.push_str(&excerpt);
        }
        let reason = self.redact(reason);
        let code = status.as_u16();
        if code == 408 || code == 429 || status.is_server_error() {
            match retry_after {
                Some(after) => ProcessError::retry_after(
                    format!("{reason} (Retry-After {} ms)", after.as_millis()),
                    after,
                ),
                None => ProcessError::retryable(reason),
            }
        } else {
            ProcessError::permanent(reason)
        }
    }

    /// Why a request got no response, without the URL (it may carry credentials).
    fn describe(&self, e: &reqwest::Error) -> String {
        if e.is_timeout() {
            return format!(
                "no response within ACKD_HTTP_TIMEOUT_MS={}",
                self.settings.timeout.as_millis()
            );
        }
        let what = if e.is_connect() {
            "cannot connect"
        } else {
            "request failed"
        };
        let mut reason = what.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            reason.push_str(": ");
            reason.push_str(&s.to_string());
            source = s.source();
        }
        reason
    }

    /// `reason` without any value of `ACKD_HTTP_HEADERS` (an endpoint may echo them).
    fn redact(&self, mut reason: String) -> String {
        for secret in &self.secrets {
            if reason.contains(secret.as_str()) {
                reason = reason.replace(secret.as_str(), REDACTED);
            }
        }
        reason
    }
}

/// Whether a request may carry a repeat, and its attempt: its `Ackd-Redelivered` and
/// `Ackd-Attempt` headers, in every body mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// [`Message::redelivered`]; for a batch, true if it is for any of its messages.
    pub redelivered: bool,
    /// [`Message::attempt`]; for a batch, the batch's (the highest of its messages').
    pub attempt: u32,
}

impl Delivery {
    pub fn of(m: &Message<'_>) -> Delivery {
        Delivery {
            redelivered: m.redelivered(),
            attempt: m.attempt(),
        }
    }

    pub fn of_batch(messages: &[Message<'_>]) -> Delivery {
        Delivery {
            redelivered: messages.iter().any(Message::redelivered),
            attempt: messages.iter().map(Message::attempt).max().unwrap_or(1),
        }
    }

    /// `Ackd-Redelivered: true|false` and `Ackd-Attempt: N`.
    pub fn headers(self) -> [(&'static str, HeaderValue); 2] {
        let redelivered = if self.redelivered { "true" } else { "false" };
        [
            ("ackd-redelivered", HeaderValue::from_static(redelivered)),
            ("ackd-attempt", HeaderValue::from(self.attempt)),
        ]
    }
}

/// A response that did not acknowledge the request, and the offset it named, if any.
struct Refused {
    error: ProcessError,
    offset: Option<i64>,
}

/// The response header naming the message of a batch that failed: those before it
/// are acknowledged. A header of ackd's own, so that an ordinary error (whose body may
/// well have an `"offset"` of something else) never acknowledges anything.
const FAILED_OFFSET: &str = "ackd-failed-offset";

/// The offset a refusal names in [`FAILED_OFFSET`], if it is a whole number.
fn failed_offset(headers: &HeaderMap) -> Option<i64> {
    headers
        .get(FAILED_OFFSET)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The first bytes of the response body (up to [`BODY_DRAIN`]); the rest is dropped.
async fn read_start(mut response: reqwest::Response) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < BODY_DRAIN {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body
}

/// At most `BODY_EXCERPT` (200) bytes of `body` as text (lossy, cut at a character), with
/// `…` if cut.
pub fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(BODY_EXCERPT * 2)]);
    let text = text.trim();
    if text.len() <= BODY_EXCERPT {
        return text.to_string();
    }
    let mut end = BODY_EXCERPT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// `Retry-After`: whole seconds, or an HTTP-date (a date in the past is 0).
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The metadata headers of a `raw` body:
/// - `Ackd-Topic`, `Ackd-Partition`, `Ackd-Offset`; `Ackd-Timestamp-Ms` when the message
///   has a timestamp;
/// - the key: `Ackd-Key` when it is printable ASCII without a space at either end,
///   else `Ackd-Key-Base64` (standard, padded); neither for a null key;
/// - `Ackd-Value-Null: true` for a null value (a tombstone; the body is empty);
/// - the Kafka headers, when there are any, as one `Ackd-Headers` header: the JSON
///   array of the `json` body's `headers` (order, repeats and nulls kept), non-ASCII
///   escaped as `\uXXXX` so that it is a valid header value.
///
/// [`Delivery`]'s `Ackd-Redelivered` and `Ackd-Attempt` come with them, as with every
/// request.
pub fn raw_headers(m: &Message<'_>) -> Vec<(&'static str, HeaderValue)> {
    let mut h = vec![
        ("ackd-topic", text_value(m.topic())),
        ("ackd-partition", HeaderValue::from(m.partition())),
        ("ackd-offset", HeaderValue::from(m.offset())),
    ];
    if let Some(ts) = m.timestamp_ms() {
        h.push(("ackd-timestamp-ms", HeaderValue::from(ts)));
    }
    if let Some(key) = m.key() {
        let printable = key.iter().all(|b| (0x20..0x7f).contains(b))
            && key.first() != Some(&b' ')
            && key.last() != Some(&b' ');
        match HeaderValue::from_bytes(key) {
            Ok(v) if printable => h.push(("ackd-key", v)),
            _ => {
                let b64 = base64::engine::general_purpose::STANDARD.encode(key);
                h.push(("ackd-key-base64", text_value(&b64)));
            }
        }
    }
    if m.payload().is_none() {
        h.push(("ackd-value-null", HeaderValue::from_static("true")));
    }
    if m.headers().next().is_some() {
        let json = super::json::headers(m).to_string();
        h.push(("ackd-headers", text_value(&ascii_json(&json))));
    }
    h
}

/// The W3C trace context headers a message's Kafka headers may carry.
const TRACE_HEADERS: [&str; 2] = ["traceparent", "tracestate"];

/// A message's W3C trace context as request headers: its first Kafka header named
/// `traceparent` (any case), and `tracestate`, each when it has a value that is a valid
/// HTTP header value, as it is (the endpoint's tracing judges it). A batch carries
/// none: its messages may belong to different traces, and each one's headers are in
/// the body.
pub fn trace_headers(m: &Message<'_>) -> Vec<(&'static str, HeaderValue)> {
    let mut out = Vec::new();
    for name in TRACE_HEADERS {
        let value = m
            .headers()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| h.value)
            .and_then(|v| HeaderValue::from_bytes(v).ok());
        if let Some(value) = value {
            out.push((name, value));
        }
    }
    out
}

/// A header value from text that is printable ASCII (topic names, base64, escaped JSON).
fn text_value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// JSON text with every non-ASCII character escaped (`\uXXXX`, surrogate pairs above
/// U+FFFF). Outside strings JSON is ASCII, so this keeps it valid and equal.
pub fn ascii_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::HttpUrl;

    #[test]
    fn a_url_password_never_shows() {
        let url = HttpUrl(reqwest::Url::parse("https://u:hunter2@h.example/x").unwrap());
        assert_eq!(format!("{url:?}"), "https://h.example/x");
    }

    #[test]
    fn retry_after_is_seconds_or_an_http_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after("1", now), Some(Duration::from_secs(1)));
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            parse_retry_after(&later, now),
            Some(Duration::from_secs(30))
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(parse_retry_after(&earlier, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-1", now), None);
    }

    #[test]
    fn excerpts_are_short_and_cut_at_a_character() {
        assert_eq!(excerpt(b"  oops \n"), "oops");
        let long = "é".repeat(300);
        let e = excerpt(long.as_bytes());
        assert!(e.ends_with('…'));
        assert!(e.len() <= BODY_EXCERPT + '…'.len_utf8(), "{}", e.len());
        assert_eq!(excerpt(&[0xff, b'a']), "\u{fffd}a");
    }

    #[test]
    fn only_ackds_own_header_names_a_failed_offset() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (n, v) in pairs {
                h.insert(*n, HeaderValue::from_static(v));
            }
            h
        };
        assert_eq!(
            failed_offset(&headers(&[("Ackd-Failed-Offset", " 42")])),
            Some(42)
        );
        assert_eq!(
            failed_offset(&headers(&[("ackd-failed-offset", "x")])),
            None
        );
        assert_eq!(failed_offset(&headers(&[("offset", "42")])), None);
        assert_eq!(failed_offset(&headers(&[])), None);
    }

    #[test]
    fn raw_headers_carry_the_metadata() {
        let get = |h: &[(&str, HeaderValue)], n: &str| {
            h.iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.to_str().unwrap().to_string())
        };
        let m = Message::new(
            "t",
            2,
            41,
            Some(b"k-1"),
            Some(b"v"),
            Some(1_700_000_000_000),
        );
        let h = raw_headers(&m);
        assert_eq!(get(&h, "ackd-topic").as_deref(), Some("t"));
        assert_eq!(get(&h, "ackd-partition").as_deref(), Some("2"));
        assert_eq!(get(&h, "ackd-offset").as_deref(), Some("41"));
        assert_eq!(
            get(&h, "ackd-timestamp-ms").as_deref(),
            Some("1700000000000")
        );
        assert_eq!(get(&h, "ackd-key").as_deref(), Some("k-1"));
        assert_eq!(get(&h, "ackd-value-null"), None);
        assert_eq!(get(&h, "ackd-headers"), None);
        let m = Message::new("t", 0, 0, Some(&[0xff, 0xfe]), None, None);
        let h = raw_headers(&m);
        assert_eq!(get(&h, "ackd-key"), None);
        assert_eq!(get(&h, "ackd-key-base64").as_deref(), Some("//4="));
        assert_eq!(get(&h, "ackd-value-null").as_deref(), Some("true"));
        assert_eq!(get(&h, "ackd-timestamp-ms"), None);
        let h = raw_headers(&Message::new("t", 0, 0, Some(b" padded"), None, None));
        assert_eq!(get(&h, "ackd-key-base64").as_deref(), Some("IHBhZGRlZA=="));
        let h = raw_headers(&Message::new("t", 0, 0, None, Some(b""), None));
        assert!(get(&h, "ackd-key").is_none() && get(&h, "ackd-key-base64").is_none());
    }

    #[test]
    fn the_delivery_headers_say_whether_a_request_may_be_a_repeat() {
        let shown = |d: Delivery| {
            d.headers()
                .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
                .join(", ")
        };
        let first = Message::new("t", 0, 4, None, None, None);
        assert_eq!(
            shown(Delivery::of(&first)),
            "ackd-redelivered: false, ackd-attempt: 1"
        );
        let again = first.with_delivery(true, 2);
        assert_eq!(
            shown(Delivery::of(&again)),
            "ackd-redelivered: true, ackd-attempt: 2"
        );
        // A batch: true if any message may be a repeat; the batch's attempt.
        let next = Message::new("t", 0, 5, None, None, None);
        assert_eq!(
            Delivery::of_batch(&[first, next]),
            Delivery {
                redelivered: false,
                attempt: 1
            }
        );
        assert_eq!(
            Delivery::of_batch(&[next, first.with_delivery(true, 1)]),
            Delivery {
                redelivered: true,
                attempt: 1
            }
        );
        assert_eq!(
            Delivery::of_batch(&[again, next.with_delivery(true, 2)]).attempt,
            2
        );
    }

    #[test]
    fn json_is_made_ascii_and_stays_equal() {
        let v = serde_json::json!([{"name":"é","value":"😀 x"}]);
        let ascii = ascii_json(&v.to_string());
        assert!(ascii.is_ascii(), "{ascii}");
        assert!(
            ascii.contains("\\u00e9") && ascii.contains("\\ud83d\\ude00"),
            "{ascii}"
        );
        let back: serde_json::Value = serde_json::from_str(&ascii).unwrap();
        assert_eq!(back, v);
    }
}
