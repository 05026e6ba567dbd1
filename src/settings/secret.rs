//! Secrets: values that must never reach a line.
//!
//! Two layers. [`Secret`] holds a credential (a SASL password, a private key) so that
//! `Debug` prints `[redacted]` and nothing but an explicit [`Secret::expose`] reads it.
//! And as a last line of defence, every line ackd writes passes through [`scrub`], which
//! replaces any registered secret value with `[redacted]`: whatever path a value takes
//! (an error message from librdkafka, its log callback, a panic), it does not reach the
//! log drain.
//!
//! A value reaches a line in the form the line's encoding gave it: as it is, logfmt-
//! escaped inside quotes (a `"`, `\` or control character), and perhaps Debug- or
//! JSON-escaped before that (an error message quoting it). Each of these forms is
//! registered, so the scrub after the line is rendered finds it in any of them.
//!
//! A secret of 1 to 3 characters would match inside ordinary words (and the places it
//! is redacted would point at it): it is replaced only where it is a field's whole
//! value (`user=bob`), and one made of digits alone not at all (`partition=7`). Longer
//! secrets are replaced wherever they stand. docs/deploying.md ("Security") says so.

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

/// Characters a secret needs to be looked for anywhere in a line.
const MIN_ANYWHERE: usize = 4;

/// Shortest PEM body line worth looking for (a PEM's short last line is skipped).
const MIN_PEM_LINE: usize = 16;

#[derive(Default)]
struct Needles {
    /// Passwords and the like, in every form they can take on a line: looked for in
    /// every line.
    plain: Vec<String>,
    /// Secrets shorter than [`MIN_ANYWHERE`], as logfmt writes them as a value, after
    /// `=`: replaced only where they are a whole value (up to a space or the line's end).
    whole_values: Vec<String>,
    /// PEM body lines (base64): looked for only in lines that hold a long enough run of
    /// base64 characters, which ordinary lines do not, so the hot per-message line pays
    /// one scan, not one search per PEM line.
    pem: Vec<String>,
}

/// Registers the values no line may carry: credentials, and PEMs (registered line by
/// line, so that a fragment is caught too). Values shorter than 4 characters are
/// matched only as a whole value (see the module docs). Only the first call has an
/// effect.
pub fn register(values: impl IntoIterator<Item = String>) {
    let _ = NEEDLES.set(Needles::new(values));
}

/// Replaces every registered value in `line` with `[redacted]`.
pub fn scrub(line: &mut String) {
    if let Some(needles) = NEEDLES.get() {
        needles.scrub(line);
    }
}

impl Needles {
    fn new(values: impl IntoIterator<Item = String>) -> Needles {
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
            } else if value.chars().count() >= MIN_ANYWHERE {
                for form in forms(&value) {
                    if !needles.plain.contains(&form) {
                        needles.plain.push(form);
                    }
                }
            } else if !value.is_empty() && !value.bytes().all(|b| b.is_ascii_digit()) {
                let mut shown = String::from("=");
                crate::logfmt::write_str(&mut shown, &value);
                if !needles.whole_values.contains(&shown) {
                    needles.whole_values.push(shown);
                }
            }
        }
        // Longest first: a secret that holds another is replaced whole, not around it.
        needles.plain.sort_by_key(|n| std::cmp::Reverse(n.len()));
        needles
    }

    fn scrub(&self, line: &mut String) {
        for needle in &self.plain {
            if line.contains(needle.as_str()) {
                *line = line.replace(needle.as_str(), REDACTED);
            }
        }
        for pattern in &self.whole_values {
            redact_whole_values(line, pattern);
        }
        if !self.pem.is_empty() && has_base64_run(line, MIN_PEM_LINE) {
            for needle in &self.pem {
                if line.contains(needle.as_str()) {
                    *line = line.replace(needle.as_str(), REDACTED);
                }
            }
        }
    }
}

/// Every form `value` can take on a line: as it is, Debug- and JSON-escaped (an error
/// message quoting it), and each of these logfmt-escaped (a quoted value).
fn forms(value: &str) -> Vec<String> {
    let quoted_body = |s: String| s[1..s.len() - 1].to_string();
    let mut forms = vec![value.to_string()];
    let debug = quoted_body(format!("{value:?}"));
    let json = serde_json::to_string(value)
        .map(quoted_body)
        .unwrap_or_default();
    for form in [debug, json] {
        if !form.is_empty() && !forms.contains(&form) {
            forms.push(form);
        }
    }
    for form in forms.clone() {
        let escaped = crate::logfmt::escaped(&form);
        if !forms.contains(&escaped) {
            forms.push(escaped);
        }
    }
    forms
}

/// Replaces the value of `pattern` (`=value`) where it is a whole value on `line`: up
/// to a space or the end.
fn redact_whole_values(line: &mut String, pattern: &str) {
    let mut from = 0;
    while let Some(i) = line[from..].find(pattern) {
        let start = from + i + 1;
        let end = from + i + pattern.len();
        if line[end..].is_empty() || line[end..].starts_with(' ') {
            line.replace_range(start..end, REDACTED);
            from = start + REDACTED.len();
        } else {
            from = start;
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
        let needles = Needles::new([
            "hunter2-password".to_string(),
            "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49\nAwEHBG0wawIBAQQg\nKw==\n-----END PRIVATE KEY-----\n".to_string(),
        ]);
        let mut line =
            "error=\"login as bob with hunter2-password failed\" key=\"-----BEGIN PRIVATE KEY-----\\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49\\nAwEHBG0wawIBAQQg\\nKw==\" tab".to_string();
        needles.scrub(&mut line);
        assert_eq!(
            line,
            "error=\"login as bob with [redacted] failed\" key=\"-----BEGIN PRIVATE KEY-----\\n[redacted]\\n[redacted]\\nKw==\" tab"
        );
        let nested = Needles::new(["s3cr".to_string(), "s3cr3t-longer".to_string()]);
        let mut line = "at=x error=\"s3cr3t-longer\"".to_string();
        nested.scrub(&mut line);
        assert_eq!(line, "at=x error=\"[redacted]\"");
        let mut plain = "count#ackd.messages.processed=1 topic=orders key=ab".to_string();
        needles.scrub(&mut plain);
        assert_eq!(plain, "count#ackd.messages.processed=1 topic=orders key=ab");
        assert!(has_base64_run("x=AwEHBG0wawIBAQQg", 16));
        assert!(!has_base64_run("topic=orders-events.v1 key=k-1", 16));
    }

    /// A line as ackd renders it: `at=x` and `key=value`, logfmt-escaped.
    fn rendered(key: &str, value: &str) -> String {
        let mut line = String::new();
        crate::logfmt::write_pair(&mut line, "at", "x");
        crate::logfmt::write_pair(&mut line, key, value);
        line
    }

    /// A secret with `"`, `\` or a control character reaches a line escaped (logfmt, and
    /// before that perhaps Debug or JSON): every form is scrubbed.
    #[test]
    fn escaped_forms_of_a_secret_are_scrubbed_too() {
        let secret = "pa\"ss\\w\u{1b}\trd";
        let needles = Needles::new([secret.to_string()]);
        for value in [
            format!("login with {secret} failed"),
            format!("login failed: {:?}", format!("with {secret}")),
            format!("body {}", serde_json::to_string(secret).unwrap()),
            secret.to_string(),
        ] {
            let mut line = rendered("error", &value);
            needles.scrub(&mut line);
            assert!(line.contains(REDACTED), "{line}");
            for fragment in ["pa", "ss", "rd"] {
                assert!(!line.contains(fragment), "{fragment} in {line}");
            }
        }
    }

    /// A secret of 1 to 3 characters would match inside ordinary words: it is scrubbed
    /// only where it is a field's whole value, and a numeric one not at all (every equal
    /// number redacted would point at it).
    #[test]
    fn short_secrets_are_scrubbed_where_they_are_a_whole_value() {
        let needles = Needles::new(["bob".to_string(), "q\"".to_string(), "7".to_string()]);
        for (line, expect) in [
            ("at=x user=bob", "at=x user=[redacted]"),
            ("user=bob at=x", "user=[redacted] at=x"),
            ("at=x user=\"q\\\"\" n=1", "at=x user=[redacted] n=1"),
            (
                "at=x key=bobby msg=\"hi bob\"",
                "at=x key=bobby msg=\"hi bob\"",
            ),
            ("at=x partition=7 offset=77", "at=x partition=7 offset=77"),
        ] {
            let mut line = line.to_string();
            needles.scrub(&mut line);
            assert_eq!(line, expect);
        }
    }
}
