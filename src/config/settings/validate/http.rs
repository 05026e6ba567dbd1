//! The `http` processor's settings.

use std::time::Duration;

use crate::config::error::SettingError;
use crate::config::http_settings::{HttpBody, HttpUrl};
use crate::config::secret::Secret;
use crate::config::settings::raw::RawSettings;

/// The `http` processor's settings, validated (see [`crate::config::settings::Settings`]).
pub(super) struct Http {
    pub(super) url: Option<HttpUrl>,
    pub(super) body: HttpBody,
    pub(super) headers: Vec<(String, Secret)>,
    pub(super) concurrency: usize,
    pub(super) timeout: Duration,
}

impl RawSettings {
    /// `ACKD_HTTP_URL`, `ACKD_HTTP_BODY`, `ACKD_HTTP_HEADERS`, `ACKD_HTTP_CONCURRENCY` and
    /// `ACKD_HTTP_TIMEOUT_MS`.
    pub(super) fn http(&self) -> Result<Http, SettingError> {
        Ok(Http {
            url: self.http_url()?,
            body: match self.get("http_body").to_ascii_lowercase().as_str() {
                "json" => HttpBody::Json,
                "raw" => HttpBody::Raw,
                _ => return Err(self.error("http_body", "expected json or raw")),
            },
            headers: self.http_headers()?,
            concurrency: self.whole(
                "http_concurrency",
                1..=1024,
                "expected a whole number from 1 to 1024",
            )?,
            timeout: self.millis("http_timeout_ms", 1, 3_600_000)?,
        })
    }

    /// `ACKD_HTTP_URL`: an http:// or https:// URL. A URL with credentials is never
    /// shown in an error.
    fn http_url(&self) -> Result<Option<HttpUrl>, SettingError> {
        let raw = self.get("http_url");
        if raw.is_empty() {
            return Ok(None);
        }
        let hide = |mut e: SettingError| {
            if raw.contains('@') {
                e.value = None;
            }
            e
        };
        let url = reqwest::Url::parse(raw).map_err(|e| {
            hide(self.error(
                "http_url",
                format!("is not a URL ({e}): expected http://host[:port]/path or https://…"),
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(hide(self.error(
                "http_url",
                "expected an http:// or https:// URL with a host",
            )));
        }
        Ok(Some(HttpUrl(url)))
    }

    /// `ACKD_HTTP_HEADERS`: one `Name: value` per line. Errors never show a value (nor
    /// a line, which may be a token without its name).
    fn http_headers(&self) -> Result<Vec<(String, Secret)>, SettingError> {
        let raw = self
            .values
            .get("http_headers")
            .map(String::as_str)
            .unwrap_or("");
        let fail = |problem: String| {
            let mut e = self.error("http_headers", problem);
            e.value = None;
            e
        };
        let mut headers = Vec::new();
        for (i, line) in raw.lines().enumerate() {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::settings::test_vars::{err, vars};
    use crate::config::settings::Settings;

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
            ("ACKD_HTTP_TIMEOUT_MS", "1500"),
        ]))
        .unwrap();
        assert_eq!(
            s.http_url.as_ref().unwrap().0.host_str(),
            Some("hooks.example.com")
        );
        assert_eq!(s.http_body, HttpBody::Raw);
        let names: Vec<&str> = s.http_headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["Authorization", "X-Tenant"]);
        assert_eq!(s.http_headers[0].1.expose(), "Bearer hunter2-token");
        assert_eq!(s.http_headers[1].1.expose(), "acme");
        assert_eq!(s.http_concurrency, 4);
        assert_eq!(s.http_timeout, Duration::from_millis(1500));
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(s
            .never_shown()
            .contains(&"Bearer hunter2-token".to_string()));
        // The defaults.
        let s = Settings::from_vars(vars(&[])).unwrap();
        assert_eq!(
            (s.http_url.is_none(), s.http_body, s.http_headers.len()),
            (true, HttpBody::Json, 0)
        );
        assert_eq!(s.http_concurrency, 16);
        assert_eq!(s.http_timeout, Duration::from_secs(15));

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
    }
}
