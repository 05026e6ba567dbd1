//! `KAFKA_URL`: the broker list as Heroku and most platforms hand it out.
//!
//! Accepted: comma-separated `kafka://host:port`, `kafka+ssl://host:port` or bare
//! `host:port`; whitespace around entries is ignored; IPv6 hosts in brackets
//! (`[::1]:9092`). All brokers must share one security protocol, since librdkafka
//! applies `security.protocol` to the whole client.

/// How ackd talks to the brokers, decided by the URL scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    /// `kafka://` or no scheme.
    Plaintext,
    /// `kafka+ssl://`.
    Ssl,
}

impl Security {
    /// librdkafka's `security.protocol` value.
    pub fn protocol(self) -> &'static str {
        match self {
            Security::Plaintext => "plaintext",
            Security::Ssl => "ssl",
        }
    }
}

/// The parsed broker list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Brokers {
    pub security: Security,
    /// `host:port` each, IPv6 hosts bracketed: librdkafka's `bootstrap.servers` form.
    pub addresses: Vec<String>,
}

impl Brokers {
    /// The `bootstrap.servers` value.
    pub fn bootstrap_servers(&self) -> String {
        self.addresses.join(",")
    }
}

/// What `KAFKA_URL` allows, for error messages.
pub const ALLOWED: &str = "comma-separated brokers, each kafka://host:port, kafka+ssl://host:port or host:port (IPv6 as [addr]:port)";

/// Parses a `KAFKA_URL` value. The error says what is wrong with which entry, without
/// echoing anything that could be a credential.
pub fn parse(input: &str) -> Result<Brokers, String> {
    let mut security = None;
    let mut addresses = Vec::new();
    for entry in input.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (entry_security, rest) = split_scheme(entry)?;
        match security {
            None => security = Some(entry_security),
            Some(s) if s != entry_security => {
                return Err(
                    "mixes plaintext and TLS brokers; use one scheme for every broker".into(),
                );
            }
            Some(_) => {}
        }
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('@') {
            return Err("user info (user:password@) is not supported in KAFKA_URL".into());
        }
        addresses.push(parse_host_port(rest)?);
    }
    match security {
        Some(security) => Ok(Brokers {
            security,
            addresses,
        }),
        None => Err("is empty: name at least one broker".into()),
    }
}

fn split_scheme(entry: &str) -> Result<(Security, &str), String> {
    let Some((scheme, rest)) = entry.split_once("://") else {
        return Ok((Security::Plaintext, entry));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "kafka" => Ok((Security::Plaintext, rest)),
        "kafka+ssl" => Ok((Security::Ssl, rest)),
        _ => Err(format!(
            "has an unsupported scheme `{scheme}://`; use kafka:// or kafka+ssl://"
        )),
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
        ] {
            let err = parse(input).expect_err(input);
            assert!(err.contains(expect), "{input:?}: {err}");
            assert!(
                !err.contains("secret"),
                "{input:?} leaked a credential: {err}"
            );
        }
    }

    proptest! {
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
