//! A throwaway PKI for the TLS and SASL tests, made with the openssl CLI each run (keys
//! that protect nothing, valid for two days): a CA, an unrelated CA, a server certificate
//! for `ec2-1.compute.amazonaws.com` (which does not match 127.0.0.1, like Heroku's broker
//! certificates do not match their hosts), a client certificate whose key is PKCS#1 RSA,
//! as Heroku hands them out, and a client certificate of the unrelated CA
//! (`other-client.pem`, `other-client.key`).
//!
//! The broker reads its side as PEM files (`ssl.keystore.type=PEM`,
//! `ssl.truststore.type=PEM`); ackd gets the PEM contents in Heroku's variables.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::spawn::log_dir;
use super::topics::unique_name;

/// The server certificate's only name.
pub const SERVER_NAME: &str = "ec2-1.compute.amazonaws.com";

/// The generated PEM files (in `dir`) and the contents ackd is given.
pub struct Pki {
    pub dir: PathBuf,
    pub ca: String,
    pub other_ca: String,
    pub client_cert: String,
    pub client_key: String,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl (scripts/install-build-deps installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Pki {
    /// Makes a new PKI in a directory of its own under `target/tmp`.
    pub fn generate() -> Pki {
        let dir = log_dir().join(unique_name("pki"));
        std::fs::create_dir_all(&dir).expect("create the PKI directory");
        let ec = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"];
        for (key, cn) in [("ca", "ackd test CA"), ("other-ca", "unrelated CA")] {
            openssl(
                &dir,
                &[&["genpkey"][..], &ec, &["-out", &format!("{key}.key")]].concat(),
            );
            openssl(
                &dir,
                &[
                    "req",
                    "-x509",
                    "-key",
                    &format!("{key}.key"),
                    "-out",
                    &format!("{key}.pem"),
                    "-days",
                    "2",
                    "-subj",
                    &format!("/CN={cn}"),
                    "-addext",
                    "basicConstraints=critical,CA:TRUE",
                    "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign",
                ],
            );
        }
        std::fs::write(
            dir.join("server.ext"),
            format!("subjectAltName=DNS:{SERVER_NAME}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"),
        )
        .expect("write server.ext");
        std::fs::write(
            dir.join("client.ext"),
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        )
        .expect("write client.ext");
        // PKCS#8, which Kafka's PEM key store requires.
        openssl(
            &dir,
            &[&["genpkey"][..], &ec, &["-out", "server.key"]].concat(),
        );
        openssl(
            &dir,
            &["genrsa", "-traditional", "-out", "client.key", "2048"],
        );
        openssl(
            &dir,
            &[&["genpkey"][..], &ec, &["-out", "other-client.key"]].concat(),
        );
        for (name, cn, serial, ca) in [
            ("server", SERVER_NAME, "2", "ca"),
            ("client", "ackd-client", "3", "ca"),
            ("other-client", "other-client", "4", "other-ca"),
        ] {
            openssl(
                &dir,
                &[
                    "req",
                    "-new",
                    "-key",
                    &format!("{name}.key"),
                    "-subj",
                    &format!("/CN={cn}"),
                    "-out",
                    &format!("{name}.csr"),
                ],
            );
            openssl(
                &dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &format!("{name}.csr"),
                    "-CA",
                    &format!("{ca}.pem"),
                    "-CAkey",
                    &format!("{ca}.key"),
                    "-set_serial",
                    serial,
                    "-days",
                    "2",
                    "-extfile",
                    if name == "server" {
                        "server.ext"
                    } else {
                        "client.ext"
                    },
                    "-out",
                    &format!("{name}.pem"),
                ],
            );
        }
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("read a generated PEM");
        // The broker's key store: its key and certificate in one PEM file.
        std::fs::write(
            dir.join("server-keystore.pem"),
            format!("{}{}", read("server.key"), read("server.pem")),
        )
        .expect("write server-keystore.pem");
        let client_key = read("client.key");
        assert!(client_key.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
        Pki {
            ca: read("ca.pem"),
            other_ca: read("other-ca.pem"),
            client_cert: read("client.pem"),
            client_key,
            dir,
        }
    }

    /// A file of the PKI (`ca.pem`, `other-ca.pem`, `client.pem`, `client.key`,
    /// `other-client.pem`, `other-client.key`, `server.key`, ...).
    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// Every PEM body line (keys and certificates): none may appear in ackd's output.
    pub fn body_lines(&self) -> Vec<String> {
        let server_key = std::fs::read_to_string(self.dir.join("server.key")).unwrap_or_default();
        [
            &self.ca,
            &self.other_ca,
            &self.client_cert,
            &self.client_key,
            &server_key,
        ]
        .iter()
        .flat_map(|pem| pem.lines())
        .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        .map(str::to_string)
        .collect()
    }

    /// `server.properties` lines for the broker's TLS client listener (`SSL` or
    /// `SASL_SSL`): the server certificate, and with `client_ca` (a file of the PKI) a
    /// client certificate signed by it required (mutual TLS).
    pub fn broker_tls(&self, client_ca: Option<&str>) -> Vec<(String, String)> {
        let mut props = vec![
            ("ssl.keystore.type", "PEM".to_string()),
            ("ssl.keystore.location", self.path("server-keystore.pem")),
        ];
        match client_ca {
            Some(ca) => props.extend([
                ("ssl.truststore.type", "PEM".to_string()),
                ("ssl.truststore.location", self.path(ca)),
                ("ssl.client.auth", "required".into()),
            ]),
            None => props.push(("ssl.client.auth", "none".into())),
        }
        props.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// librdkafka properties for the harness's own clients on that listener: the CA, no
    /// host-name check (the certificate is for [`SERVER_NAME`]), and with
    /// `client_cert` the client certificate. `security.protocol` is the caller's.
    pub fn client_tls(&self, client_cert: bool) -> Vec<(String, String)> {
        let mut props = vec![
            ("ssl.ca.location", self.path("ca.pem")),
            ("ssl.endpoint.identification.algorithm", "none".into()),
        ];
        if client_cert {
            props.extend([
                ("ssl.certificate.location", self.path("client.pem")),
                ("ssl.key.location", self.path("client.key")),
            ]);
        }
        props.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }
}
