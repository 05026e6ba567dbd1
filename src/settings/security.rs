//! TLS and SASL settings, and what librdkafka is told for them.
//!
//! - `kafka+ssl://` and `kafka+sasl-ssl://` brokers use TLS. With `KAFKA_TRUSTED_CERT`
//!   the broker's chain must lead to one of exactly those certificates (librdkafka's
//!   `ssl.ca.pem`: every certificate in it, and nothing else) and the host name is not
//!   checked, because Heroku's broker certificates do not carry the brokers' names: the
//!   pinned private CA is the protection. Without it, the system's roots verify the
//!   chain and the host name must match (`ssl.endpoint.identification.algorithm=https`).
//! - `KAFKA_CLIENT_CERT` + `KAFKA_CLIENT_CERT_KEY`: the client certificate (mutual TLS).
//! - `ACKD_SASL_MECHANISM` with `ACKD_SASL_USERNAME`/`ACKD_SASL_PASSWORD` or the URL's
//!   `user:password@`: SASL over TLS.
//!
//! PEMs go to librdkafka in memory, never to a file. They are checked here first, so that
//! a malformed one is an error naming its variable; no error ever shows a PEM's content.

use crate::settings::kafka_url::{Brokers, Security};
use crate::settings::secret::Secret;
use crate::settings::SettingError;

/// TLS for `kafka+ssl://` and `kafka+sasl-ssl://`.
#[derive(Debug, Clone)]
pub struct Tls {
    /// `KAFKA_TRUSTED_CERT`: the only CAs trusted; `None`: the system roots.
    pub trusted: Option<TrustedCerts>,
    /// `KAFKA_CLIENT_CERT` and `KAFKA_CLIENT_CERT_KEY`.
    pub client: Option<ClientCert>,
}

/// The pinned CA certificates (PEM). Public, but long: `Debug` shows only the count.
#[derive(Clone)]
pub struct TrustedCerts {
    pem: String,
    pub count: usize,
}

impl std::fmt::Debug for TrustedCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TrustedCerts({} certificates)", self.count)
    }
}

/// The client certificate (PEM, may carry its chain) and its private key.
#[derive(Clone)]
pub struct ClientCert {
    cert: String,
    key: Secret,
}

impl std::fmt::Debug for ClientCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientCert { key: [redacted] }")
    }
}

/// Every PEM in `tls` (CAs, client certificate, private key), for
/// [`crate::settings::secret::register`].
pub fn pems(tls: &Tls) -> Vec<&str> {
    let mut out = Vec::new();
    if let Some(t) = &tls.trusted {
        out.push(t.pem.as_str());
    }
    if let Some(c) = &tls.client {
        out.push(c.cert.as_str());
        out.push(c.key.expose());
    }
    out
}

/// A SASL mechanism ackd supports (librdkafka's built-in ones that need no extra library).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Plain,
    ScramSha256,
    ScramSha512,
}

impl Mechanism {
    pub const NAMES: &'static [&'static str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }

    fn parse(s: &str) -> Option<Mechanism> {
        match s.trim().to_ascii_uppercase().as_str() {
            "PLAIN" => Some(Mechanism::Plain),
            "SCRAM-SHA-256" => Some(Mechanism::ScramSha256),
            "SCRAM-SHA-512" => Some(Mechanism::ScramSha512),
            _ => None,
        }
    }
}

/// SASL for `kafka+sasl-ssl://`. The user name counts as a secret too, as librdkafka
/// treats it (`sasl.username` is one of its sensitive properties).
#[derive(Debug, Clone)]
pub struct Sasl {
    pub mechanism: Mechanism,
    pub username: Secret,
    pub password: Secret,
    /// Where the credentials came from: `KAFKA_URL` or `ACKD_SASL_USERNAME/PASSWORD`.
    pub credentials_from: &'static str,
}

/// The raw inputs: `KAFKA_*` variables and the `ACKD_SASL_*` settings as given.
#[derive(Default)]
pub struct Inputs<'a> {
    pub trusted_cert: Option<&'a str>,
    pub client_cert: Option<&'a str>,
    pub client_key: Option<&'a str>,
    pub sasl_mechanism: Option<&'a str>,
    pub sasl_username: Option<&'a str>,
    pub sasl_password: Option<&'a str>,
}

pub const TRUSTED_CERT: &str = "KAFKA_TRUSTED_CERT";
pub const CLIENT_CERT: &str = "KAFKA_CLIENT_CERT";
pub const CLIENT_KEY: &str = "KAFKA_CLIENT_CERT_KEY";
pub const SASL_MECHANISM: &str = "ACKD_SASL_MECHANISM";
pub const SASL_USERNAME: &str = "ACKD_SASL_USERNAME";
pub const SASL_PASSWORD: &str = "ACKD_SASL_PASSWORD";

fn err(setting: &str, problem: impl Into<String>) -> SettingError {
    SettingError {
        setting: setting.to_string(),
        value: None,
        problem: problem.into(),
    }
}

/// Checks the TLS and SASL inputs against the URL's scheme and each other.
pub fn validate(
    brokers: &Brokers,
    inputs: &Inputs<'_>,
) -> Result<(Option<Tls>, Option<Sasl>), SettingError> {
    refuse_inputs_the_scheme_ignores(brokers.security, inputs)?;
    let tls = if brokers.security.tls() {
        Some(tls(inputs)?)
    } else {
        None
    };
    let sasl = if brokers.security == Security::SaslSsl {
        Some(sasl(brokers, inputs)?)
    } else {
        None
    };
    Ok((tls, sasl))
}

/// TLS inputs with a plaintext URL, or SASL inputs without `kafka+sasl-ssl://`, would
/// be silently ignored: an error instead.
fn refuse_inputs_the_scheme_ignores(
    security: Security,
    inputs: &Inputs<'_>,
) -> Result<(), SettingError> {
    let given = |v: Option<&str>| v.is_some_and(|v| !v.trim().is_empty());
    if !security.tls() {
        for (name, value) in [
            (TRUSTED_CERT, inputs.trusted_cert),
            (CLIENT_CERT, inputs.client_cert),
            (CLIENT_KEY, inputs.client_key),
        ] {
            if given(value) {
                return Err(err(
                    name,
                    "is set but KAFKA_URL uses kafka:// (plaintext): use kafka+ssl://host:port (or kafka+sasl-ssl://) for TLS",
                ));
            }
        }
    }
    let sasl_inputs = [
        (SASL_MECHANISM, inputs.sasl_mechanism),
        (SASL_USERNAME, inputs.sasl_username),
        (SASL_PASSWORD, inputs.sasl_password),
    ];
    if security != Security::SaslSsl {
        for (name, value) in sasl_inputs {
            if given(value) {
                return Err(err(
                    name,
                    format!(
                        "is set but KAFKA_URL uses {}: SASL needs kafka+sasl-ssl://host:port",
                        security.scheme()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// TLS for a `kafka+ssl://` or `kafka+sasl-ssl://` URL: the trusted certificates, then
/// the client certificate and its key.
fn tls(inputs: &Inputs<'_>) -> Result<Tls, SettingError> {
    let trusted = match inputs.trusted_cert.filter(|v| !v.trim().is_empty()) {
        Some(pem) => Some(TrustedCerts {
            count: check_certificates(TRUSTED_CERT, pem)?,
            pem: pem.to_string(),
        }),
        None => None,
    };
    let client = client_cert(inputs)?;
    Ok(Tls { trusted, client })
}

/// `KAFKA_CLIENT_CERT` and `KAFKA_CLIENT_CERT_KEY`: both or neither.
fn client_cert(inputs: &Inputs<'_>) -> Result<Option<ClientCert>, SettingError> {
    match (
        inputs.client_cert.filter(|v| !v.trim().is_empty()),
        inputs.client_key.filter(|v| !v.trim().is_empty()),
    ) {
        (Some(cert), Some(key)) => {
            check_certificates(CLIENT_CERT, cert)?;
            check_key(CLIENT_KEY, key)?;
            Ok(Some(ClientCert {
                cert: cert.to_string(),
                key: Secret::new(key),
            }))
        }
        (Some(_), None) => Err(err(
            CLIENT_CERT,
            "is set without KAFKA_CLIENT_CERT_KEY: a client certificate needs its private key",
        )),
        (None, Some(_)) => Err(err(
            CLIENT_KEY,
            "is set without KAFKA_CLIENT_CERT: a private key needs its client certificate",
        )),
        (None, None) => Ok(None),
    }
}

/// SASL for a `kafka+sasl-ssl://` URL: the mechanism, then the credentials.
fn sasl(brokers: &Brokers, inputs: &Inputs<'_>) -> Result<Sasl, SettingError> {
    let mechanism = sasl_mechanism(inputs)?;
    let (username, password, from) = sasl_credentials(brokers, inputs)?;
    Ok(Sasl {
        mechanism,
        username,
        password,
        credentials_from: from,
    })
}

/// `ACKD_SASL_MECHANISM`: required with SASL.
fn sasl_mechanism(inputs: &Inputs<'_>) -> Result<Mechanism, SettingError> {
    match inputs.sasl_mechanism.filter(|v| !v.trim().is_empty()) {
        None => Err(err(
            SASL_MECHANISM,
            format!(
                "is required with kafka+sasl-ssl://: one of {}",
                Mechanism::NAMES.join(", ")
            ),
        )),
        Some(m) => Mechanism::parse(m).ok_or_else(|| SettingError {
            setting: SASL_MECHANISM.into(),
            value: Some(m.to_string()),
            problem: format!("expected one of {}", Mechanism::NAMES.join(", ")),
        }),
    }
}

/// The SASL user name and password, from the URL's user info or from
/// `ACKD_SASL_USERNAME` and `ACKD_SASL_PASSWORD` (once, and both), and where they came
/// from.
fn sasl_credentials(
    brokers: &Brokers,
    inputs: &Inputs<'_>,
) -> Result<(Secret, Secret, &'static str), SettingError> {
    let username = inputs.sasl_username.filter(|v| !v.is_empty());
    let password = inputs.sasl_password.filter(|v| !v.is_empty());
    match (&brokers.user_info, username, password) {
        (Some(info), None, None) => Ok((info.username.clone(), info.password.clone(), "KAFKA_URL")),
        (Some(_), u, _) => Err(err(
            if u.is_some() { SASL_USERNAME } else { SASL_PASSWORD },
            "is set but KAFKA_URL carries the credentials too (user:password@): give them once",
        )),
        (None, Some(u), Some(p)) => Ok((
            Secret::new(u),
            Secret::new(p),
            "ACKD_SASL_USERNAME/ACKD_SASL_PASSWORD",
        )),
        (None, Some(_), None) => Err(err(SASL_PASSWORD, "is required with ACKD_SASL_USERNAME")),
        (None, None, Some(_)) => Err(err(SASL_USERNAME, "is required with ACKD_SASL_PASSWORD")),
        (None, None, None) => Err(err(
            SASL_USERNAME,
            "is required with kafka+sasl-ssl:// (with ACKD_SASL_PASSWORD), unless KAFKA_URL carries user:password@",
        )),
    }
}

/// The librdkafka properties for `tls` and `sasl`, in the order they are set.
pub fn properties(tls: Option<&Tls>, sasl: Option<&Sasl>) -> Vec<(&'static str, String)> {
    let mut props = Vec::new();
    if let Some(tls) = tls {
        match &tls.trusted {
            Some(trusted) => {
                // Only these CAs (librdkafka loads no default paths when ssl.ca.pem is set),
                // and no host-name check: see the module docs.
                props.push(("ssl.ca.pem", trusted.pem.clone()));
                props.push(("ssl.endpoint.identification.algorithm", "none".into()));
            }
            None => props.push(("ssl.endpoint.identification.algorithm", "https".into())),
        }
        if let Some(client) = &tls.client {
            props.push(("ssl.certificate.pem", client.cert.clone()));
            props.push(("ssl.key.pem", client.key.expose().to_string()));
        }
    }
    if let Some(sasl) = sasl {
        props.push(("sasl.mechanism", sasl.mechanism.as_str().into()));
        props.push(("sasl.username", sasl.username.expose().to_string()));
        props.push(("sasl.password", sasl.password.expose().to_string()));
    }
    props
}

/// librdkafka properties that would contradict a setting given here, with that setting:
/// passing them through as well is an error.
pub fn claimed(tls: Option<&Tls>, sasl: Option<&Sasl>) -> Vec<(&'static str, &'static str)> {
    let mut claimed = Vec::new();
    if let Some(tls) = tls {
        if tls.trusted.is_some() {
            for p in ["ssl.ca.pem", "ssl.ca.location"] {
                claimed.push((p, TRUSTED_CERT));
            }
        }
        if tls.client.is_some() {
            for p in [
                "ssl.certificate.pem",
                "ssl.certificate.location",
                "ssl.key.pem",
                "ssl.key.location",
                "ssl.keystore.location",
            ] {
                claimed.push((p, "KAFKA_CLIENT_CERT/KAFKA_CLIENT_CERT_KEY"));
            }
        }
    }
    if sasl.is_some() {
        for p in [
            "sasl.mechanism",
            "sasl.mechanisms",
            "sasl.username",
            "sasl.password",
        ] {
            claimed.push((p, "ACKD_SASL_* or the KAFKA_URL user info"));
        }
    }
    claimed
}

/// The `tls=` field of the start line: which CAs, whether host names are checked,
/// whether a client certificate is presented. No PEM content.
pub fn tls_summary(tls: Option<&Tls>) -> Option<String> {
    let tls = tls?;
    let (ca, host_check) = match &tls.trusted {
        Some(t) => (format!("KAFKA_TRUSTED_CERT({})", t.count), "off"),
        None => ("system".to_string(), "on"),
    };
    Some(format!(
        "ca={ca},hostname_check={host_check},client_cert={}",
        if tls.client.is_some() { "on" } else { "off" }
    ))
}

/// The `sasl=` field of the start line: mechanism and where the credentials came from.
pub fn sasl_summary(sasl: Option<&Sasl>) -> Option<String> {
    let sasl = sasl?;
    Some(format!(
        "mechanism={},credentials={}",
        sasl.mechanism.as_str(),
        sasl.credentials_from
    ))
}

/// A PEM block: its label and whether its body is valid base64 DER.
struct Block {
    label: String,
    encrypted: bool,
}

/// Splits a PEM value into blocks. Text outside blocks is ignored (as OpenSSL does).
fn blocks(name: &str, value: &str) -> Result<Vec<Block>, SettingError> {
    if !value.contains('\n') && value.contains("\\n") {
        return Err(err(
            name,
            "holds `\\n` escapes instead of line breaks: set the PEM with real newlines (e.g. VAR=\"$(cat file.pem)\")",
        ));
    }
    let mut out = Vec::new();
    let mut open: Option<(String, String, bool)> = None;
    for line in value.lines().map(str::trim) {
        match &mut open {
            None => {
                if let Some(label) = line
                    .strip_prefix("-----BEGIN ")
                    .and_then(|l| l.strip_suffix("-----"))
                {
                    open = Some((label.to_string(), String::new(), false));
                }
            }
            Some((label, body, encrypted)) => {
                if let Some(end) = line
                    .strip_prefix("-----END ")
                    .and_then(|l| l.strip_suffix("-----"))
                {
                    check_block(name, out.len() + 1, label, end, body)?;
                    out.push(Block {
                        label: label.clone(),
                        encrypted: *encrypted,
                    });
                    open = None;
                } else if line.contains(':') {
                    // RFC 1421 headers: "Proc-Type: 4,ENCRYPTED", "DEK-Info: ...".
                    if line.contains("ENCRYPTED") {
                        *encrypted = true;
                    }
                } else {
                    body.push_str(line);
                }
            }
        }
    }
    if let Some((label, _, _)) = open {
        return Err(err(
            name,
            format!("is not a valid PEM: a BEGIN {label} line has no END line (cut off?)"),
        ));
    }
    Ok(out)
}

/// Block `n` of a PEM, at its END line: the END names the BEGIN's label, and the body
/// in between is base64-encoded DER.
fn check_block(
    name: &str,
    n: usize,
    label: &str,
    end: &str,
    body: &str,
) -> Result<(), SettingError> {
    if end != label {
        return Err(err(
            name,
            format!("is not a valid PEM: block {n} (BEGIN {label}) ends with END {end}"),
        ));
    }
    if !valid_der_base64(body) {
        return Err(err(
            name,
            format!("is not a valid PEM: block {n} ({label}) is not base64-encoded DER"),
        ));
    }
    Ok(())
}

/// Base64 (standard alphabet, padded) whose first decoded byte is 0x30, a DER SEQUENCE:
/// every certificate and key starts so, which base64 writes as `M`.
fn valid_der_base64(body: &str) -> bool {
    let trimmed = body.trim_end_matches('=');
    let padding = body.len() - trimmed.len();
    body.len() >= 4
        && body.len().is_multiple_of(4)
        && padding <= 2
        && body.starts_with('M')
        && trimmed
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}

/// One or more certificates and nothing else in PEM blocks; returns how many.
fn check_certificates(name: &str, value: &str) -> Result<usize, SettingError> {
    let blocks = blocks(name, value)?;
    if let Some(b) = blocks.iter().find(|b| b.label != "CERTIFICATE") {
        let problem = if b.label.contains("PRIVATE KEY") {
            format!("holds a {} block: it takes certificates only (the key goes in KAFKA_CLIENT_CERT_KEY)", b.label)
        } else {
            format!("holds a {} block: it takes certificates only", b.label)
        };
        return Err(err(name, problem));
    }
    if blocks.is_empty() {
        return Err(err(
            name,
            "is not a PEM certificate: no -----BEGIN CERTIFICATE----- block",
        ));
    }
    Ok(blocks.len())
}

/// Exactly one unencrypted private key.
fn check_key(name: &str, value: &str) -> Result<(), SettingError> {
    let blocks = blocks(name, value)?;
    const KEYS: &[&str] = &["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"];
    match blocks.as_slice() {
        [] => Err(err(
            name,
            "is not a PEM private key: no -----BEGIN PRIVATE KEY----- block",
        )),
        [b] if b.label == "ENCRYPTED PRIVATE KEY" || b.encrypted => Err(err(
            name,
            "is an encrypted private key: give it unencrypted (ackd takes no passphrase)",
        )),
        [b] if KEYS.contains(&b.label.as_str()) => Ok(()),
        [b] if b.label == "CERTIFICATE" => Err(err(
            name,
            "holds a certificate, not a private key (swapped with KAFKA_CLIENT_CERT?)",
        )),
        [b] => Err(err(
            name,
            format!("holds a {} block, not a private key", b.label),
        )),
        _ => Err(err(
            name,
            "holds more than one PEM block: give exactly one private key",
        )),
    }
}

/// librdkafka's own refusal of a PEM at consumer creation (e.g. a key that does not
/// match its certificate), as the setting it came from. Its message names properties and
/// OpenSSL reasons, never the PEM content.
pub fn creation_error(message: &str) -> Option<SettingError> {
    let setting = if message.contains("ssl.ca.pem") {
        TRUSTED_CERT
    } else if message.contains("ssl.certificate.pem") {
        CLIENT_CERT
    } else if message.contains("ssl.key.pem") || message.contains("rivate key") {
        CLIENT_KEY
    } else {
        return None;
    };
    Some(err(
        setting,
        format!("librdkafka refused it: {}", message.trim()),
    ))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::settings::kafka_url;

    /// Test-only certificates (tests/fixtures/tls, see its README).
    pub const CA: &str = include_str!("../../tests/fixtures/tls/ca.pem");
    pub const OTHER_CA: &str = include_str!("../../tests/fixtures/tls/other-ca.pem");
    pub const CLIENT: &str = include_str!("../../tests/fixtures/tls/client.pem");
    pub const CLIENT_KEY_PEM: &str = include_str!("../../tests/fixtures/tls/client.key");
    pub const OTHER_KEY: &str = include_str!("../../tests/fixtures/tls/other.key");

    fn brokers(url: &str) -> Brokers {
        kafka_url::parse(url).unwrap()
    }

    fn check(url: &str, inputs: Inputs<'_>) -> Result<(Option<Tls>, Option<Sasl>), SettingError> {
        validate(&brokers(url), &inputs)
    }

    #[track_caller]
    fn refused(url: &str, inputs: Inputs<'_>, setting: &str, problem: &str) {
        let e = check(url, inputs).expect_err("accepted");
        assert_eq!(e.setting, setting, "{e}");
        assert!(e.problem.contains(problem), "{e}");
        assert_eq!(e.value, None, "{e}");
        assert_no_content(&e.to_string());
    }

    /// No PEM body line of any fixture, and no test password, in `text`.
    #[track_caller]
    pub fn assert_no_content(text: &str) {
        for pem in [CA, OTHER_CA, CLIENT, CLIENT_KEY_PEM, OTHER_KEY] {
            for line in pem.lines().filter(|l| !l.starts_with("-----")) {
                assert!(!text.contains(line), "PEM content in: {text}");
            }
        }
        assert!(!text.contains("hunter2"), "password in: {text}");
    }

    #[test]
    fn pinned_ca_means_exactly_those_cas_and_no_host_name_check() {
        let bundle = format!("{OTHER_CA}\n{CA}");
        let (tls, sasl) = check(
            "kafka+ssl://ec2-1.compute.amazonaws.com:9096",
            Inputs {
                trusted_cert: Some(&bundle),
                client_cert: Some(CLIENT),
                client_key: Some(CLIENT_KEY_PEM),
                ..Inputs::default()
            },
        )
        .unwrap();
        assert!(sasl.is_none());
        let tls = tls.unwrap();
        assert_eq!(tls.trusted.as_ref().unwrap().count, 2);
        let props = properties(Some(&tls), None);
        let get = |k: &str| props.iter().find(|(p, _)| *p == k).map(|(_, v)| v.as_str());
        assert_eq!(get("ssl.ca.pem"), Some(bundle.as_str()));
        assert_eq!(get("ssl.endpoint.identification.algorithm"), Some("none"));
        assert_eq!(get("ssl.certificate.pem"), Some(CLIENT));
        assert_eq!(get("ssl.key.pem"), Some(CLIENT_KEY_PEM));
        assert_eq!(
            tls_summary(Some(&tls)).unwrap(),
            "ca=KAFKA_TRUSTED_CERT(2),hostname_check=off,client_cert=on"
        );
        let debug = format!("{tls:?}");
        assert!(
            !debug.contains("MII") && !debug.contains("BEGIN"),
            "{debug}"
        );
    }

    #[test]
    fn without_a_pinned_ca_the_system_roots_and_the_host_name_check_apply() {
        let (tls, _) = check("kafka+ssl://b:9093", Inputs::default()).unwrap();
        let tls = tls.unwrap();
        assert_eq!(
            properties(Some(&tls), None),
            vec![("ssl.endpoint.identification.algorithm", "https".to_string())]
        );
        assert_eq!(
            tls_summary(Some(&tls)).unwrap(),
            "ca=system,hostname_check=on,client_cert=off"
        );
        let (tls, sasl) = check("kafka://b:9092", Inputs::default()).unwrap();
        assert!(tls.is_none() && sasl.is_none());
    }

    #[test]
    fn half_given_or_mismatched_tls_settings_are_refused() {
        let ssl = "kafka+ssl://b:1";
        refused(
            ssl,
            Inputs {
                client_cert: Some(CLIENT),
                ..Inputs::default()
            },
            CLIENT_CERT,
            "without KAFKA_CLIENT_CERT_KEY",
        );
        refused(
            ssl,
            Inputs {
                client_key: Some(CLIENT_KEY_PEM),
                ..Inputs::default()
            },
            CLIENT_KEY,
            "without KAFKA_CLIENT_CERT",
        );
        refused(
            "kafka://b:1",
            Inputs {
                trusted_cert: Some(CA),
                ..Inputs::default()
            },
            TRUSTED_CERT,
            "kafka+ssl://",
        );
    }

    #[test]
    fn malformed_pems_name_the_variable_and_never_show_content() {
        let ssl = "kafka+ssl://b:1";
        let cut = &CA[..CA.len() / 2];
        let bad_base64 = CA.replacen("MII", "!!!", 1);
        let escaped = CA.replace('\n', "\\n");
        let no_end = CA.replace("-----END CERTIFICATE-----", "-----END PRIVATE KEY-----");
        for (pem, problem) in [
            ("hello", "no -----BEGIN CERTIFICATE----- block"),
            (cut, "no END line"),
            (bad_base64.as_str(), "not base64"),
            (escaped.as_str(), "`\\n` escapes"),
            (no_end.as_str(), "ends with END PRIVATE KEY"),
            (CLIENT_KEY_PEM, "takes certificates only"),
        ] {
            refused(
                ssl,
                Inputs {
                    trusted_cert: Some(pem),
                    ..Inputs::default()
                },
                TRUSTED_CERT,
                problem,
            );
        }
        let encrypted = CLIENT_KEY_PEM.replace("PRIVATE KEY", "ENCRYPTED PRIVATE KEY");
        let two_keys = format!("{CLIENT_KEY_PEM}{OTHER_KEY}");
        for (key, problem) in [
            ("MIIB", "no -----BEGIN PRIVATE KEY----- block"),
            (CLIENT, "holds a certificate"),
            (encrypted.as_str(), "encrypted"),
            (two_keys.as_str(), "more than one"),
        ] {
            refused(
                ssl,
                Inputs {
                    client_cert: Some(CLIENT),
                    client_key: Some(key),
                    ..Inputs::default()
                },
                CLIENT_KEY,
                problem,
            );
        }
    }

    #[test]
    fn sasl_from_settings_or_from_the_url() {
        let (tls, sasl) = check(
            "kafka+sasl-ssl://b:9092",
            Inputs {
                sasl_mechanism: Some("scram-sha-512"),
                sasl_username: Some("alice"),
                sasl_password: Some("hunter2"),
                ..Inputs::default()
            },
        )
        .unwrap();
        let sasl = sasl.unwrap();
        assert_eq!(sasl.mechanism, Mechanism::ScramSha512);
        let props = properties(tls.as_ref(), Some(&sasl));
        assert!(props.contains(&("sasl.mechanism", "SCRAM-SHA-512".into())));
        assert!(props.contains(&("sasl.username", "alice".into())));
        assert!(props.contains(&("sasl.password", "hunter2".into())));
        assert!(props.contains(&("ssl.endpoint.identification.algorithm", "https".into())));
        assert_eq!(
            sasl_summary(Some(&sasl)).unwrap(),
            "mechanism=SCRAM-SHA-512,credentials=ACKD_SASL_USERNAME/ACKD_SASL_PASSWORD"
        );
        let debug = format!("{sasl:?}");
        assert!(
            !debug.contains("hunter2") && !debug.contains("alice"),
            "{debug}"
        );

        let (_, sasl) = check(
            "kafka+sasl-ssl://bob:hunter2@b:9092",
            Inputs {
                sasl_mechanism: Some("PLAIN"),
                ..Inputs::default()
            },
        )
        .unwrap();
        let sasl = sasl.unwrap();
        assert_eq!(sasl.username.expose(), "bob");
        assert_eq!(sasl.password.expose(), "hunter2");
        assert_eq!(sasl.credentials_from, "KAFKA_URL");
    }

    #[test]
    fn half_given_or_mismatched_sasl_settings_are_refused() {
        let sasl = "kafka+sasl-ssl://b:1";
        let m = Some("PLAIN");
        refused(sasl, Inputs::default(), SASL_MECHANISM, "is required");
        refused(
            sasl,
            Inputs {
                sasl_mechanism: m,
                ..Inputs::default()
            },
            SASL_USERNAME,
            "is required",
        );
        refused(
            sasl,
            Inputs {
                sasl_mechanism: m,
                sasl_username: Some("u"),
                ..Inputs::default()
            },
            SASL_PASSWORD,
            "is required with ACKD_SASL_USERNAME",
        );
        refused(
            sasl,
            Inputs {
                sasl_mechanism: m,
                sasl_password: Some("hunter2"),
                ..Inputs::default()
            },
            SASL_USERNAME,
            "is required with ACKD_SASL_PASSWORD",
        );
        refused(
            "kafka+sasl-ssl://u:hunter2@b:1",
            Inputs {
                sasl_mechanism: m,
                sasl_password: Some("hunter2"),
                ..Inputs::default()
            },
            SASL_PASSWORD,
            "give them once",
        );
        refused(
            "kafka+ssl://b:1",
            Inputs {
                sasl_mechanism: m,
                ..Inputs::default()
            },
            SASL_MECHANISM,
            "kafka+sasl-ssl://",
        );
        refused(
            "kafka://b:1",
            Inputs {
                sasl_password: Some("hunter2"),
                ..Inputs::default()
            },
            SASL_PASSWORD,
            "kafka+sasl-ssl://",
        );
        let e = check(
            sasl,
            Inputs {
                sasl_mechanism: Some("GSSAPI"),
                sasl_username: Some("u"),
                sasl_password: Some("hunter2"),
                ..Inputs::default()
            },
        )
        .unwrap_err();
        assert_eq!(e.setting, SASL_MECHANISM);
        assert_eq!(e.value.as_deref(), Some("GSSAPI"));
        assert!(e.problem.contains("SCRAM-SHA-256"), "{e}");
    }

    #[test]
    fn librdkafka_creation_errors_map_back_to_the_variable() {
        let e = creation_error("ssl.key.pem failed: not in PEM format?").unwrap();
        assert_eq!(e.setting, CLIENT_KEY);
        let e = creation_error("Private key check failed: error:05800074:x509 certificate routines::key values mismatch").unwrap();
        assert_eq!(e.setting, CLIENT_KEY);
        assert_eq!(
            creation_error("ssl.ca.pem failed: x").unwrap().setting,
            TRUSTED_CERT
        );
        assert!(creation_error("Failed to create consumer").is_none());
    }
}
