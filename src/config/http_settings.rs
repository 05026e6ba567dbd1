//! The http processor's settings that the validation of every setting builds
//! (`ACKD_HTTP_URL`, `ACKD_HTTP_BODY`); the processor is src/processors/http.rs.

use std::fmt;

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
