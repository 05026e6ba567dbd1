//! The `http` processor's settings (`ACKD_HTTP_*`), parsed; the processor is
//! src/processors/http.rs.

use std::fmt;
use std::time::Duration;

use crate::settings::raw::RawSettings;
use crate::settings::secret::Secret;
use crate::settings::SettingError;
use crate::settings::Settings;

/// The `http` processor's settings, as it takes them. `Debug` shows no header value and
/// no password.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// `ACKD_HTTP_URL`: where each message is POSTed.
    pub url: HttpUrl,
    /// `ACKD_HTTP_BODY`: the JSON object, or the raw value with metadata headers.
    pub body: HttpBody,
    /// `ACKD_HTTP_HEADERS`: added to every request (`Name: value` lines). The values are
    /// secrets (an auth token): never shown.
    pub headers: Vec<(String, Secret)>,
    /// `ACKD_HTTP_CONCURRENCY`: requests in flight at most (the adaptive limit's bound).
    pub concurrency: usize,
    /// `ACKD_HTTP_CONCURRENCY_MODE`: whether the limit finds the endpoint's capacity.
    pub concurrency_mode: ConcurrencyMode,
    /// `ACKD_RETRY_MAX_MS`: the longest a `Retry-After` holds every request back, as a
    /// message waits no longer for its own retry.
    pub pause_max: Duration,
    /// `ACKD_HTTP_TIMEOUT_MS`: how long one request may take, response body included.
    pub timeout: Duration,
}

/// `ACKD_HTTP_BODY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpBody {
    /// The JSON object of the exec processor's request line.
    Json,
    /// The value as it is, metadata in `Ackd-*` headers.
    Raw,
}

impl HttpBody {
    pub fn as_str(self) -> &'static str {
        match self {
            HttpBody::Json => "json",
            HttpBody::Raw => "raw",
        }
    }
}

/// `ACKD_HTTP_CONCURRENCY_MODE`, `ACKD_EXEC_CONCURRENCY_MODE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConcurrencyMode {
    /// The bound (`ACKD_HTTP_CONCURRENCY`; `ACKD_EXEC_CONCURRENCY` × `ACKD_EXEC_IN_FLIGHT`)
    /// requests in flight at most, always.
    Fixed,
    /// A limit that grows while the endpoint (the handler) keeps up and shrinks when it
    /// does not, up to the bound (src/processors/request_limit.rs).
    Adaptive,
}

impl ConcurrencyMode {
    /// `key` (`http_concurrency_mode`, `exec_concurrency_mode`): `fixed` or `adaptive`,
    /// any case; `bound` names what bounds the limit, `whose` whose capacity it finds.
    pub(super) fn parse(
        raw: &RawSettings,
        key: &'static str,
        bound: &str,
        whose: &str,
    ) -> Result<ConcurrencyMode, SettingError> {
        match raw.get(key).to_ascii_lowercase().as_str() {
            "fixed" => Ok(ConcurrencyMode::Fixed),
            "adaptive" => Ok(ConcurrencyMode::Adaptive),
            _ => Err(raw.error(
                key,
                format!("expected fixed ({bound} requests in flight) or adaptive (a limit that finds {whose} capacity, up to {bound})"),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ConcurrencyMode::Fixed => "fixed",
            ConcurrencyMode::Adaptive => "adaptive",
        }
    }
}

/// `ACKD_HTTP_URL`. `Debug` shows it without user info (a password may be in it).
#[derive(Clone, PartialEq, Eq)]
pub struct HttpUrl(pub reqwest::Url);

impl fmt::Debug for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&shown_url(&self.0))
    }
}

/// The URL without user info, for lines.
pub(crate) fn shown_url(url: &reqwest::Url) -> String {
    let mut url = url.clone();
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.to_string()
}

impl HttpSettings {
    /// `ACKD_HTTP_*`, each checked whether or not the http processor runs; `None` without
    /// `ACKD_HTTP_URL`.
    pub(super) fn parse(raw: &RawSettings) -> Result<Option<HttpSettings>, SettingError> {
        let url = url(raw)?;
        let body = match raw.get("http_body").to_ascii_lowercase().as_str() {
            "json" => HttpBody::Json,
            "raw" => HttpBody::Raw,
            _ => return Err(raw.error("http_body", "expected json or raw")),
        };
        let headers = headers(raw)?;
        let concurrency = raw.whole(
            "http_concurrency",
            1..=1024,
            "expected a whole number from 1 to 1024",
        )?;
        let concurrency_mode = ConcurrencyMode::parse(
            raw,
            "http_concurrency_mode",
            "ACKD_HTTP_CONCURRENCY",
            "the endpoint's",
        )?;
        let timeout = timeout(raw)?;
        // Checked with the failure settings; read here for the pause's cap.
        let pause_max = raw.millis("retry_max_ms", 1, 3_600_000)?;
        Ok(url.map(|url| HttpSettings {
            url,
            body,
            headers,
            concurrency,
            concurrency_mode,
            pause_max,
            timeout,
        }))
    }

    /// `ACKD_PROCESSOR=http` without `ACKD_HTTP_URL`: the processor's to report
    /// (validation names it only among other missing settings).
    pub fn url_required() -> SettingError {
        SettingError::new(
            "ACKD_HTTP_URL",
            None,
            "is required with ACKD_PROCESSOR=http: the URL every message is POSTed to (e.g. https://app.example.com/kafka)",
        )
    }
}

/// A raw body is one message's value: with the http processor it cannot carry a batch.
pub(super) fn body_fits_batching(settings: &Settings) -> Result<(), SettingError> {
    let Some(http) = settings
        .http
        .as_ref()
        .filter(|_| settings.processor == "http")
    else {
        return Ok(());
    };
    let max_messages = settings.batching.max_messages;
    if http.body == HttpBody::Raw && max_messages > 1 {
        return Err(SettingError::new(
            "ACKD_HTTP_BODY",
            Some("raw"),
            format!(
                "a raw body is one message's value and cannot carry a batch (ACKD_BATCH_MAX_MESSAGES={max_messages}): use json, or ACKD_BATCH_MAX_MESSAGES=1"
            ),
        ));
    }
    Ok(())
}

/// `ACKD_HTTP_TIMEOUT_MS`; the drain check reads it without a URL too.
pub(super) fn timeout(raw: &RawSettings) -> Result<Duration, SettingError> {
    raw.millis("http_timeout_ms", 1, 3_600_000)
}

/// `ACKD_HTTP_URL`: an http:// or https:// URL. A URL with credentials is never
/// shown in an error.
fn url(raw: &RawSettings) -> Result<Option<HttpUrl>, SettingError> {
    let text = raw.get("http_url");
    if text.is_empty() {
        return Ok(None);
    }
    let hide = |mut e: SettingError| {
        if text.contains('@') {
            e.value = None;
        }
        e
    };
    let url = reqwest::Url::parse(text).map_err(|e| {
        hide(raw.error(
            "http_url",
            format!("is not a URL ({e}): expected http://host[:port]/path or https://…"),
        ))
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(hide(raw.error(
            "http_url",
            "expected an http:// or https:// URL with a host",
        )));
    }
    Ok(Some(HttpUrl(url)))
}

/// `ACKD_HTTP_HEADERS`: one `Name: value` per line. Errors never show a value (nor
/// a line, which may be a token without its name).
fn headers(raw: &RawSettings) -> Result<Vec<(String, Secret)>, SettingError> {
    let text = raw
        .values
        .get("http_headers")
        .map(String::as_str)
        .unwrap_or("");
    let fail = |problem: String| {
        let mut e = raw.error("http_headers", problem);
        e.value = None;
        e
    };
    let mut headers = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let n = i + 1;
        let Some((name, value)) = line.split_once(':') else {
            return Err(fail(format!(
                "line {n} has no `:`: expected one `Name: value` per line"
            )));
        };
        let (name, value) = (name.trim(), value.trim());
        if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(fail(format!(
                "line {n}: the text before `:` is not a header name (letters, digits, - and the like)"
            )));
        }
        if reqwest::header::HeaderValue::from_str(value).is_err() {
            return Err(fail(format!(
                "line {n} ({name}): the value is not a valid header value (printable ASCII)"
            )));
        }
        let lower = name.to_ascii_lowercase();
        if lower.starts_with("ackd-")
            || ["host", "content-length", "transfer-encoding", "connection"]
                .contains(&lower.as_str())
        {
            return Err(fail(format!(
                "line {n}: ackd sets {name} itself (and every Ackd-* header)"
            )));
        }
        headers.push((name.to_string(), Secret::new(value)));
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::test_vars::{err, vars};
    use crate::settings::Settings;

    #[test]
    fn http_settings_parse_and_header_values_never_show() {
        let s = Settings::from_vars(vars(&[
            ("ACKD_HTTP_URL", "https://hooks.example.com/kafka"),
            ("ACKD_HTTP_BODY", "RAW"),
            (
                "ACKD_HTTP_HEADERS",
                "Authorization: Bearer hunter2-token\r\n\nX-Tenant:  acme \n",
            ),
            ("ACKD_HTTP_CONCURRENCY", "4"),
            ("ACKD_HTTP_CONCURRENCY_MODE", "Adaptive"),
            ("ACKD_HTTP_TIMEOUT_MS", "1500"),
            ("ACKD_RETRY_MAX_MS", "7000"),
        ]))
        .unwrap();
        let http = s.http.as_ref().unwrap();
        assert_eq!(http.url.0.host_str(), Some("hooks.example.com"));
        assert_eq!(http.body, HttpBody::Raw);
        let names: Vec<&str> = http.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["Authorization", "X-Tenant"]);
        assert_eq!(http.headers[0].1.expose(), "Bearer hunter2-token");
        assert_eq!(http.headers[1].1.expose(), "acme");
        assert_eq!(http.concurrency, 4);
        assert_eq!(http.concurrency_mode, ConcurrencyMode::Adaptive);
        assert_eq!(http.pause_max, Duration::from_secs(7));
        assert_eq!(http.timeout, Duration::from_millis(1500));
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(s
            .never_shown()
            .contains(&"Bearer hunter2-token".to_string()));
        // The defaults: no URL, no http settings.
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert!(s.http.is_none());
        let s = Settings::from_vars(vars(&[("ACKD_HTTP_URL", "http://127.0.0.1:1/")])).unwrap();
        let http = s.http.unwrap();
        assert_eq!((http.body, http.headers.len()), (HttpBody::Json, 0));
        assert_eq!(http.concurrency, 16);
        assert_eq!(http.concurrency_mode, ConcurrencyMode::Fixed);
        assert_eq!(http.timeout, Duration::from_secs(15));

        for bad in [
            "Bearer hunter2-token",
            "Bad Name: hunter2-token",
            "Ackd-Offset: hunter2-token",
            "Content-Length: 5",
        ] {
            let e = err(&[("ACKD_HTTP_HEADERS", bad)]);
            assert_eq!(e.setting, "ACKD_HTTP_HEADERS", "{bad}");
            assert_eq!(e.value, None);
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
        let e = err(&[("ACKD_HTTP_URL", "ftp://x/")]);
        assert_eq!(e.setting, "ACKD_HTTP_URL");
        let e = err(&[("ACKD_HTTP_URL", "https://u:hunter2@/")]);
        assert_eq!(e.value, None, "{e}");
        let s = Settings::from_vars(vars(&[("ACKD_HTTP_URL", "https://u:hunter2@h/")])).unwrap();
        assert!(s.never_shown().contains(&"hunter2".to_string()));
        assert!(!format!("{s:?}").contains("hunter2"));
        assert_eq!(err(&[("ACKD_HTTP_BODY", "xml")]).setting, "ACKD_HTTP_BODY");
        assert_eq!(
            err(&[("ACKD_HTTP_CONCURRENCY", "0")]).setting,
            "ACKD_HTTP_CONCURRENCY"
        );
        let e = err(&[("ACKD_HTTP_CONCURRENCY_MODE", "auto")]);
        assert_eq!(e.setting, "ACKD_HTTP_CONCURRENCY_MODE");
        assert!(e.to_string().contains("fixed") && e.to_string().contains("adaptive"));
    }
}
