//! logfmt encoding: the one place that decides how a value is written on a line.
//!
//! A value is written bare when it is non-empty and holds no space, `=`, `"`, or control
//! character; otherwise it is double-quoted with `\"`, `\\`, `\n`, `\r`, `\t` and `\u{..}`
//! escapes, which is what logfmt parsers (and l2met) read back. Bytes that are not UTF-8
//! (message keys may be anything) are written as `\xNN`, so a line is always valid UTF-8
//! and never carries a raw control byte into the log drain.

use std::fmt::Write;

/// Appends `value` to `out`, quoted and escaped when logfmt needs it.
///
/// ```
/// let mut line = String::new();
/// ackd::logfmt::write_pair(&mut line, "key", "k-1");
/// ackd::logfmt::write_pair(&mut line, "error", "said \"no\"");
/// assert_eq!(line, r#"key=k-1 error="said \"no\"""#);
/// ```
pub fn write_str(out: &mut String, value: &str) {
    if needs_quotes(value) {
        out.push('"');
        escape_into(out, value);
        out.push('"');
    } else {
        out.push_str(value);
    }
}

/// Appends arbitrary bytes as a logfmt value: UTF-8 runs as text, other bytes as `\xNN`.
pub fn write_bytes(out: &mut String, value: &[u8]) {
    match std::str::from_utf8(value) {
        Ok(s) => write_str(out, s),
        Err(_) => {
            out.push('"');
            for chunk in value.utf8_chunks() {
                escape_into(out, chunk.valid());
                for b in chunk.invalid() {
                    let _ = write!(out, "\\x{b:02x}");
                }
            }
            out.push('"');
        }
    }
}

/// Appends `key=value`, with a leading space unless `out` is empty.
pub fn write_pair(out: &mut String, key: &str, value: &str) {
    if !out.is_empty() {
        out.push(' ');
    }
    out.push_str(key);
    out.push('=');
    write_str(out, value);
}

/// What `value` becomes inside double quotes (without them): the form a secret takes on a
/// line when its value is quoted, which the scrubber looks for too.
pub fn escaped(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    escape_into(&mut out, value);
    out
}

/// Whether `value` is empty or holds a space, `=`, `"`, `\` or a control character
/// (`char::is_control`: U+0000-U+001F, U+007F-U+009F). By bytes, through a table, rather
/// than by chars: every per-message line checks its topic, source and key here. The
/// controls above ASCII, U+0080-U+009F, are 0xC2 followed by 0x80-0x9F in UTF-8.
fn needs_quotes(value: &str) -> bool {
    let bytes = value.as_bytes();
    bytes.is_empty()
        || bytes
            .iter()
            .enumerate()
            .any(|(i, &b)| match QUOTED[usize::from(b)] {
                Quoted::No => false,
                Quoted::Yes => true,
                Quoted::IfC1 => matches!(bytes.get(i + 1), Some(0x80..=0x9f)),
            })
}

#[derive(Clone, Copy)]
enum Quoted {
    No,
    Yes,
    /// 0xC2: the first byte of U+0080-U+00BF, of which U+0080-U+009F are controls.
    IfC1,
}

/// What each byte of a value means for [`needs_quotes`].
const QUOTED: [Quoted; 256] = {
    let mut table = [Quoted::No; 256];
    let mut b = 0;
    while b < 256 {
        if b <= b' ' as usize || b == 0x7f {
            table[b] = Quoted::Yes;
        }
        b += 1;
    }
    table[b'=' as usize] = Quoted::Yes;
    table[b'"' as usize] = Quoted::Yes;
    table[b'\\' as usize] = Quoted::Yes;
    table[0xc2] = Quoted::IfC1;
    table
};

fn escape_into(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:04x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> String {
        let mut out = String::new();
        write_str(&mut out, v);
        out
    }

    fn b(v: &[u8]) -> String {
        let mut out = String::new();
        write_bytes(&mut out, v);
        out
    }

    #[test]
    fn plain_values_stay_bare() {
        assert_eq!(s("k-17"), "k-17");
        assert_eq!(s("orders.v1"), "orders.v1");
        assert_eq!(s("ünïcode"), "ünïcode");
    }

    #[test]
    fn spaces_equals_and_quotes_are_quoted() {
        assert_eq!(s("a b"), r#""a b""#);
        assert_eq!(s("a=b"), r#""a=b""#);
        assert_eq!(s(r#"say "hi""#), r#""say \"hi\"""#);
        assert_eq!(s(""), r#""""#);
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(s("a\nb"), r#""a\nb""#);
        assert_eq!(s("tab\there"), r#""tab\there""#);
        assert_eq!(s("back\\slash"), r#""back\\slash""#);
        assert_eq!(s("\u{1b}[31m"), r#""\u{001b}[31m""#);
        assert_eq!(s("del\u{7f}"), r#""del\u{007f}""#);
        // C1 controls (two bytes in UTF-8) are controls too; the letters beside them not.
        assert_eq!(s("nel\u{85}"), r#""nel\u{0085}""#);
        assert_eq!(s("\u{9f}"), r#""\u{009f}""#);
        assert_eq!(s("\u{a0}\u{c0}x"), "\u{a0}\u{c0}x"); // 0xC2 0xA0, 0xC3 0x80
        assert_eq!(s("\u{80}"), r#""\u{0080}""#);
    }

    #[test]
    fn non_utf8_bytes_are_hex_escaped() {
        assert_eq!(b(b"plain"), "plain");
        assert_eq!(b(&[0xff, b'a', 0xfe]), r#""\xffa\xfe""#);
        assert_eq!(b(&[b'a', b' ', 0x80]), r#""a \x80""#);
    }

    #[test]
    fn pairs_are_space_separated() {
        let mut out = String::new();
        write_pair(&mut out, "at", "assigned");
        write_pair(&mut out, "topic", "a b");
        assert_eq!(out, r#"at=assigned topic="a b""#);
    }
}
