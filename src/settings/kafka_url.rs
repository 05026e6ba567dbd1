//! `KAFKA_URL`: the broker list as Heroku and most platforms hand it out.
//!
//! Accepted: comma-separated `kafka://host:port`, `kafka+ssl://host:port`,
//! `kafka+sasl-ssl://[user:password@]host:port` or bare `host:port`; whitespace around
//! entries is ignored; IPv6 hosts in brackets (`[::1]:9092`). All brokers must share one
//! security protocol, since librdkafka applies `security.protocol` to the whole client.
//! User info (SASL credentials, percent-decoded) is only for `kafka+sasl-ssl://`, and is
//! never echoed in an error.

use std::fmt;

use crate::settings::secret::Secret;

/// How ackd talks to the brokers, decided by the URL scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    /// `kafka://` or no scheme.
    Plaintext,
    /// `kafka+ssl://`.
    Ssl,
    /// `kafka+sasl-ssl://`: SASL authentication over TLS.
    SaslSsl,
}

impl Security {
    /// librdkafka's `security.protocol` value.
    pub fn protocol(self) -> &'static str {
        match self {
            Security::Plaintext => "plaintext",
            Security::Ssl => "ssl",
            Security::SaslSsl => "sasl_ssl",
        }
    }

    /// Whether the connection is TLS.
    pub fn tls(self) -> bool {
        matches!(self, Security::Ssl | Security::SaslSsl)
    }

    /// The URL scheme, for messages.
    pub fn scheme(self) -> &'static str {
        match self {
            Security::Plaintext => "kafka://",
            Security::Ssl => "kafka+ssl://",
            Security::SaslSsl => "kafka+sasl-ssl://",
        }
    }
}

/// SASL credentials given in the URL (`user:password@`), percent-decoded.
#[derive(Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub username: Secret,
    pub password: Secret,
}

impl fmt::Debug for UserInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UserInfo([redacted])")
    }
}

/// The parsed broker list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Brokers {
    pub security: Security,
    /// `host:port` each, IPv6 hosts bracketed: librdkafka's `bootstrap.servers` form.
    pub addresses: Vec<String>,
    /// Credentials from the URL (`kafka+sasl-ssl://user:password@host:port`).
    pub user_info: Option<UserInfo>,
}

impl Brokers {
    /// The `bootstrap.servers` value.
    pub fn bootstrap_servers(&self) -> String {
        self.addresses.join(",")
    }
}

/// What `KAFKA_URL` allows, for error messages.
pub const ALLOWED: &str = "comma-separated brokers, each kafka://host:port, kafka+ssl://host:port, kafka+sasl-ssl://[user:password@]host:port or host:port (IPv6 as [addr]:port)";

/// Parses a `KAFKA_URL` value. The error says what is wrong with which entry, without
/// echoing anything that could be a credential.
pub fn parse(input: &str) -> Result<Brokers, String> {
    // With user info anywhere in the value, no entry is quoted: a password may hold
    // `,` and `scheme://`, so where one entry ends cannot be told for sure.
    parse_entries(input).map_err(|e| match e {
        EntryError::Quoting(_) if input.contains('@') => CREDENTIALS_NOT_QUOTED.to_string(),
        EntryError::Quoting(e) | EntryError::Plain(e) => e,
    })
}

/// What an entry's error becomes when the value carries user info.
const CREDENTIALS_NOT_QUOTED: &str = "has an entry that is not a broker (not quoted: the value carries user info); write kafka+sasl-ssl://user:password@host:port, with any `,` `@` `:` `/` of the password percent-encoded (%2C %40 %3A %2F)";

/// An error of [`parse_entries`]: `Quoting` ones show a piece of the value.
enum EntryError {
    Quoting(String),
    Plain(String),
}

impl From<String> for EntryError {
    fn from(e: String) -> Self {
        EntryError::Plain(e)
    }
}

impl From<&str> for EntryError {
    fn from(e: &str) -> Self {
        EntryError::Plain(e.to_string())
    }
}

fn parse_entries(input: &str) -> Result<Brokers, EntryError> {
    let mut security = None;
    let mut addresses = Vec::new();
    let mut user_info: Option<UserInfo> = None;
    for entry in entries(input)
        .into_iter()
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let (entry_security, rest) = split_scheme(entry).map_err(EntryError::Quoting)?;
        match security {
            None => security = Some(entry_security),
            Some(s) if s != entry_security => {
                return Err(
                    "mixes schemes (kafka://, kafka+ssl://, kafka+sasl-ssl://); use one scheme for every broker".into(),
                );
            }
            Some(_) => {}
        }
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let rest = match rest.rsplit_once('@') {
            Some((info, hostport)) => {
                if entry_security != Security::SaslSsl {
                    return Err(
                        "user info (user:password@) is only for kafka+sasl-ssl:// (SASL) brokers"
                            .into(),
                    );
                }
                let info = parse_user_info(info)?;
                match &user_info {
                    Some(seen) if *seen != info => {
                        return Err("brokers carry different user info (user:password@); give the credentials once".into());
                    }
                    _ => user_info = Some(info),
                }
                hostport
            }
            None => rest,
        };
        addresses.push(parse_host_port(rest).map_err(EntryError::Quoting)?);
    }
    match security {
        Some(security) => Ok(Brokers {
            security,
            addresses,
            user_info,
        }),
        None => Err("is empty: name at least one broker".into()),
    }
}

/// The entries of the list. A `,` is a sub-delimiter RFC 3986 allows in user info, so
/// the list is not simply split on `,`: a piece followed by one holding `@` (user info
/// ends there; a host never holds one) before the next `scheme://` is joined with it.
/// Split first, a password's first part would be taken for a host and port and shown.
fn entries(input: &str) -> Vec<&str> {
    let pieces: Vec<&str> = input.split(',').collect();
    let starts_entry = |piece: &str| piece.contains("://");
    let mut entries = Vec::new();
    let mut start = 0; // byte offset of the current entry in `input`
    let mut i = 0;
    while i < pieces.len() {
        // The piece holding this entry's `@`, if one comes before the next entry.
        let last = if pieces[i].contains('@') {
            i
        } else {
            (i + 1..pieces.len())
                .take_while(|&j| !starts_entry(pieces[j]))
                .find(|&j| pieces[j].contains('@'))
                .unwrap_or(i)
        };
        let len = pieces[i..=last].iter().map(|p| p.len() + 1).sum::<usize>() - 1;
        entries.push(&input[start..start + len]);
        start += len + 1;
        i = last + 1;
    }
    entries
}

/// `user:password`, each percent-decoded. Errors never show either part.
fn parse_user_info(info: &str) -> Result<UserInfo, String> {
    let Some((user, password)) = info.split_once(':') else {
        return Err("user info has a user name but no password: write kafka+sasl-ssl://user:password@host:port".into());
    };
    let username = percent_decode(user)?;
    let password = percent_decode(password)?;
    if username.is_empty() || password.is_empty() {
        return Err("user info has an empty user name or password".into());
    }
    Ok(UserInfo {
        username: Secret::new(username),
        password: Secret::new(password),
    })
}

/// The user info `input` carries, user and password apart, as written and
/// percent-decoded: what the scrubber must know, whether or not the URL is valid.
pub fn user_info_texts(input: &str) -> Vec<String> {
    let mut texts = Vec::new();
    for entry in entries(input).into_iter().map(str::trim) {
        let rest = entry.split_once("://").map_or(entry, |(_, rest)| rest);
        let Some((info, _)) = rest.rsplit_once('@') else {
            continue;
        };
        let parts = match info.split_once(':') {
            Some((user, password)) => vec![user, password],
            None => vec![info],
        };
        for part in parts {
            texts.push(part.to_string());
            texts.extend(percent_decode(part));
        }
    }
    texts
}

/// Decodes `%XX` escapes (RFC 3986). The result must be UTF-8 without NUL (librdkafka
/// takes C strings).
pub(crate) fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            match hex {
                Some(b) => out.push(b),
                None => {
                    return Err(
                        "user info has a `%` that does not start a %XX escape (write % as %25)"
                            .into(),
                    )
                }
            }
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    if out.contains(&0) {
        return Err("user info decodes to a NUL character".into());
    }
    String::from_utf8(out).map_err(|_| "user info does not decode to UTF-8".to_string())
}

fn split_scheme(entry: &str) -> Result<(Security, &str), String> {
    let Some((scheme, rest)) = entry.split_once("://") else {
        return Ok((Security::Plaintext, entry));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "kafka" => Ok((Security::Plaintext, rest)),
        "kafka+ssl" => Ok((Security::Ssl, rest)),
        "kafka+sasl-ssl" => Ok((Security::SaslSsl, rest)),
        // Shown only when it looks like a scheme: text before `://` may be user info.
        _ if scheme.len() <= 20
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')) =>
        {
            Err(format!(
                "has an unsupported scheme `{scheme}://`; use kafka://, kafka+ssl:// or kafka+sasl-ssl://"
            ))
        }
        _ => Err(
            "has an unsupported scheme; use kafka://, kafka+ssl:// or kafka+sasl-ssl://".into(),
        ),
    }
}

fn parse_host_port(hostport: &str) -> Result<String, String> {
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let Some((addr, after)) = rest.split_once(']') else {
            return Err(format!(
                "`{hostport}` opens an IPv6 bracket it never closes"
            ));
        };
        let Some(port) = after.strip_prefix(':') else {
            return Err(format!("`{hostport}` has no port: write [{addr}]:9092"));
        };
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("`{addr}` is not an IPv6 address"));
        }
        (format!("[{addr}]"), port)
    } else {
        let Some((host, port)) = hostport.rsplit_once(':') else {
            return Err(format!("`{hostport}` has no port: write {hostport}:9092"));
        };
        if host.contains(':') {
            return Err(format!(
                "`{hostport}` looks like an IPv6 address: put it in brackets, as [{host}]:{port}"
            ));
        }
        let valid = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
        if !valid {
            return Err(format!("`{host}` is not a valid host name"));
        }
        (host.to_string(), port)
    };
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(format!("{host}:{p}")),
        _ => Err(format!("`{port}` is not a port number (1 to 65535)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(input: &str) -> Brokers {
        parse(input).unwrap_or_else(|e| panic!("{input:?} rejected: {e}"))
    }

    #[test]
    fn heroku_style_list() {
        let b = ok("kafka+ssl://ec2-1.compute.amazonaws.com:9096,kafka+ssl://ec2-2.compute.amazonaws.com:9096");
        assert_eq!(b.security, Security::Ssl);
        assert_eq!(
            b.bootstrap_servers(),
            "ec2-1.compute.amazonaws.com:9096,ec2-2.compute.amazonaws.com:9096"
        );
    }

    #[test]
    fn bare_and_plain_schemes_with_whitespace() {
        let b = ok(" kafka://a:9092 , b:9093 ,");
        assert_eq!(b.security, Security::Plaintext);
        assert_eq!(b.addresses, vec!["a:9092", "b:9093"]);
        assert_eq!(ok("KAFKA://h:1/").addresses, vec!["h:1"]);
    }

    #[test]
    fn ipv6_in_brackets() {
        assert_eq!(ok("[::1]:9092").addresses, vec!["[::1]:9092"]);
        assert_eq!(
            ok("kafka+ssl://[2001:db8::7]:9096").addresses,
            vec!["[2001:db8::7]:9096"]
        );
    }

    #[test]
    fn errors_say_what_is_wrong() {
        for (input, expect) in [
            ("", "empty"),
            (" , ", "empty"),
            ("localhost", "no port"),
            ("::1:9092", "brackets"),
            ("[::1]", "no port"),
            ("[::1:9092", "never closes"),
            ("[zz]:9092", "not an IPv6"),
            ("h:0", "port number"),
            ("h:99999", "port number"),
            ("h:abc", "port number"),
            ("http://h:1", "unsupported scheme"),
            ("kafka://a:1,kafka+ssl://b:2", "mixes"),
            ("bad host:1", "host name"),
            ("kafka://user:secret@h:1", "user info"),
            ("kafka+ssl://user:secret@h:1", "only for kafka+sasl-ssl"),
            ("kafka+sasl-ssl://secret@h:1", "no password"),
            ("kafka+sasl-ssl://:secret@h:1", "empty"),
            ("kafka+sasl-ssl://u:secret%zz@h:1", "%XX"),
            ("kafka+sasl-ssl://u:secret%00@h:1", "NUL"),
            ("kafka+sasl-ssl://u:secret%ff@h:1", "UTF-8"),
            (
                "kafka+sasl-ssl://u:secret@h:1,kafka+sasl-ssl://u:secret2@h:2",
                "different",
            ),
            ("kafka+sasl-ssl://u:secret@h:1,kafka+ssl://h:2", "mixes"),
        ] {
            let err = parse(input).expect_err(input);
            assert!(err.contains(expect), "{input:?}: {err}");
            assert!(
                !err.contains("secret"),
                "{input:?} leaked a credential: {err}"
            );
        }
    }

    /// A password holding `,` and `scheme://` looks like the start of another entry:
    /// the entry before it is not quoted either (proptest found `,://`).
    #[test]
    fn a_password_holding_a_comma_and_a_scheme_is_never_quoted() {
        for password in [",://", "x,a://y", "ab,kafka://cd"] {
            let input = format!("kafka+sasl-ssl://QqUserQq:ZZ{password}ZZ@broker.example:9092");
            let err = parse(&input).expect_err("not a broker list");
            assert!(
                !err.contains("ZZ") && !err.contains("QqUserQq"),
                "{input:?}: {err}"
            );
            assert!(err.contains("percent-encoded"), "{err}");
        }
    }

    #[test]
    fn sasl_user_info_is_percent_decoded_and_never_debug_printed() {
        let b = ok("kafka+sasl-ssl://api%2Bkey:p%40ss%3Aw%2Fo%25rd@b1.example.com:9092, kafka+sasl-ssl://b2.example.com:9092");
        assert_eq!(b.security, Security::SaslSsl);
        assert_eq!(b.security.protocol(), "sasl_ssl");
        assert_eq!(
            b.bootstrap_servers(),
            "b1.example.com:9092,b2.example.com:9092"
        );
        let info = b.user_info.as_ref().unwrap();
        assert_eq!(info.username.expose(), "api+key");
        assert_eq!(info.password.expose(), "p@ss:w/o%rd");
        let debug = format!("{b:?}");
        assert!(!debug.contains("api"), "{debug}");
        assert!(!debug.contains("p@ss"), "{debug}");
        // An unencoded `@` in the password is taken as part of it.
        let b = ok("kafka+sasl-ssl://u:a@b@h:1");
        assert_eq!(b.user_info.unwrap().password.expose(), "a@b");
        // The same credentials on every entry are fine.
        assert!(ok("kafka+sasl-ssl://u:p@h:1,kafka+sasl-ssl://u:p@h:2")
            .user_info
            .is_some());
        assert_eq!(ok("kafka+sasl-ssl://h:1").user_info, None);
    }

    /// A `,` is allowed in user info (RFC 3986 sub-delims): it must not split the entry,
    /// and no error may show a fragment of the user info.
    #[test]
    fn a_comma_in_the_user_info_stays_in_it_and_no_error_shows_a_fragment() {
        let b = ok("kafka+sasl-ssl://bob:s3cr3tpart,rest@h:9092");
        assert_eq!(b.addresses, vec!["h:9092"]);
        assert_eq!(
            b.user_info.as_ref().unwrap().password.expose(),
            "s3cr3tpart,rest"
        );
        let b = ok("kafka+sasl-ssl://bob:a,b@h1:1, kafka+sasl-ssl://bob:a,b@h2:2");
        assert_eq!(b.addresses, vec!["h1:1", "h2:2"]);
        assert_eq!(b.user_info.unwrap().password.expose(), "a,b");
        for input in [
            "kafka+sasl-ssl://bob:s3cr3tpart,t41lpart@h:notaport",
            "kafka+sasl-ssl://bob:s3cr3tpart,t41lpart@h:1,kafka+sasl-ssl://bob:other@h:2",
            "kafka+ssl://bob:s3cr3tpart,t41lpart@h:1",
            "kafka://a:1,bob:s3cr3tpart,t41lpart@h:2",
            "bob:s3cr3tpart,t41lpart@h:1",
            "kafka+sasl-ssl://bob:s3cr3tpart,t41lpart@h:1,h2:2",
            "kafka+sasl-ssl://bob:s3cr3tpart,,t41lpart%zz@h:1",
        ] {
            let err = parse(input).expect_err(input);
            for fragment in ["s3cr3t", "t41l", "bob"] {
                assert!(
                    !err.contains(fragment),
                    "{input:?} leaked {fragment}: {err}"
                );
            }
        }
    }

    proptest! {
        /// Whatever a password holds (`,`, `@`, `:`, `/`), no error shows a piece of it.
        #[test]
        fn no_error_shows_a_piece_of_any_password(
            password in "[a-zA-Z0-9,@:/!~*]{1,24}",
            port in prop::sample::select(vec!["9092", "x", ""]),
            tail in prop::sample::select(vec!["", ",kafka+sasl-ssl://h2:9093", ",h3:1", ",kafka+ssl://h4:1"]),
        ) {
            let input = format!("kafka+sasl-ssl://QqUserQq:ZZ{password}ZZ@broker.example:{port}{tail}");
            if let Err(err) = parse(&input) {
                prop_assert!(!err.contains("ZZ") && !err.contains("QqUserQq"), "{input:?}: {err}");
            }
        }
        /// Any list of valid brokers, written in any accepted form, parses back to itself.
        #[test]
        fn any_valid_list_round_trips(
            hosts in prop::collection::vec(("[a-z][a-z0-9-]{0,10}(\\.[a-z]{2,5}){0,2}", 1u16..), 1..5),
            ssl in any::<bool>(),
            bare in any::<bool>(),
        ) {
            let scheme = match (ssl, bare) { (true, _) => "kafka+ssl://", (false, true) => "", (false, false) => "kafka://" };
            let input = hosts.iter().map(|(h, p)| format!(" {scheme}{h}:{p} ")).collect::<Vec<_>>().join(",");
            let parsed = parse(&input).unwrap();
            let expected: Vec<String> = hosts.iter().map(|(h, p)| format!("{h}:{p}")).collect();
            prop_assert_eq!(parsed.addresses, expected);
            prop_assert_eq!(parsed.security, if ssl { Security::Ssl } else { Security::Plaintext });
        }
    }
}
