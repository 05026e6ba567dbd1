//! Secrets: values that must never reach a line.
//!
//! Two layers. [`Secret`] holds a credential (a SASL password, a private key) so that
//! `Debug` prints `[redacted]` and nothing but an explicit [`Secret::expose`] reads it.
//! And as a last line of defence, every line ackd writes passes through [`scrub`], which
//! replaces any registered secret value with `[redacted]`: whatever path a value takes
//! (an error message from librdkafka, its log callback, a panic), it does not reach the
//! log drain.

use std::fmt;
use std::sync::OnceLock;

/// What a secret is replaced with on a line.
pub const REDACTED: &str = "[redacted]";

/// A credential. `Debug` never shows it; there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value, for librdkafka's configuration only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// The values [`scrub`] removes, registered once at start.
static NEEDLES: OnceLock<Needles> = OnceLock::new();

/// Shortest PEM body line worth looking for (a PEM's short last line is skipped).
const MIN_PEM_LINE: usize = 16;

#[derive(Default)]
struct Needles {
    /// Passwords and the like: looked for in every line.
    plain: Vec<String>,
    /// PEM body lines (base64): looked for only in lines that hold a long enough run of
    /// base64 characters, which ordinary lines do not, so the hot per-message line pays
    /// one scan, not one search per PEM line.
    pem: Vec<String>,
}

/// Registers the values no line may carry: credentials, and PEMs (registered line by
/// line, so that a fragment is caught too). Values shorter than 4 characters are
/// ignored (they would redact ordinary words). Only the first call has an effect.
pub fn register(values: impl IntoIterator<Item = String>) {
    let mut needles = Needles::default();
    for value in values {
        if value.contains("-----BEGIN ") {
            for line in value.lines().map(str::trim) {
                if line.len() >= MIN_PEM_LINE
                    && !line.starts_with("-----")
                    && !line.contains(':')
                    && !needles.pem.iter().any(|n| n == line)
                {
                    needles.pem.push(line.to_string());
                }
            }
        } else if value.len() >= 4 && !needles.plain.contains(&value) {
            needles.plain.push(value);
        }
    }
    let _ = NEEDLES.set(needles);
}

/// Replaces every registered value in `line` with `[redacted]`.
pub fn scrub(line: &mut String) {
    let Some(needles) = NEEDLES.get() else {
        return;
    };
    for needle in &needles.plain {
        if line.contains(needle.as_str()) {
            *line = line.replace(needle.as_str(), REDACTED);
        }
    }
    if !needles.pem.is_empty() && has_base64_run(line, MIN_PEM_LINE) {
        for needle in &needles.pem {
            if line.contains(needle.as_str()) {
                *line = line.replace(needle.as_str(), REDACTED);
            }
        }
    }
}

/// Whether `line` holds `min` consecutive base64 characters.
fn has_base64_run(line: &str, min: usize) -> bool {
    let mut run = 0;
    for b in line.bytes() {
        if b.is_ascii_alphanumeric() || b == b'+' || b == b'/' {
            run += 1;
            if run >= min {
                return true;
            }
        } else {
            run = 0;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let s = Secret::new("hunter2");
        assert_eq!(format!("{s:?}"), "[redacted]");
        assert_eq!(format!("{:?}", Some(&s)), "Some([redacted])");
        assert_eq!(s.expose(), "hunter2");
    }

    #[test]
    fn registered_values_are_scrubbed_from_lines() {
        register([
            "hunter2-password".to_string(),
            "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49\nAwEHBG0wawIBAQQg\nKw==\n-----END PRIVATE KEY-----\n".to_string(),
            "ab".to_string(),
        ]);
        let mut line =
            "error=\"login as bob with hunter2-password failed\" key=\"-----BEGIN PRIVATE KEY-----\\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49\\nAwEHBG0wawIBAQQg\\nKw==\" tab".to_string();
        scrub(&mut line);
        assert_eq!(
            line,
            "error=\"login as bob with [redacted] failed\" key=\"-----BEGIN PRIVATE KEY-----\\n[redacted]\\n[redacted]\\nKw==\" tab"
        );
        let mut plain = "count#ackd.messages.processed=1 topic=orders key=ab".to_string();
        scrub(&mut plain);
        assert_eq!(plain, "count#ackd.messages.processed=1 topic=orders key=ab");
        assert!(has_base64_run("x=AwEHBG0wawIBAQQg", 16));
        assert!(!has_base64_run("topic=orders-events.v1 key=k-1", 16));
    }
}
