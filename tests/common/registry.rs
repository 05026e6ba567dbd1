//! The test Schema Registry: Apicurio Registry 3.x (in-memory storage, the Confluent API
//! at `/apis/ccompat/v7`), from the distribution `scripts/install-registry` unpacks into
//! `target/tools/apicurio-registry/`, one per test binary on a free loopback port, killed
//! with the test process; and the registry-aware producer (`tests/fixtures/
//! produce_registry.py`, confluent-kafka's serializers, installed by
//! `scripts/install-serializers`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::spawn::{free_port, installed, log_dir, passthrough_env, read_lossy, spawn_tied};

/// A cold Quarkus start on 2 busy cores: 2-6 s idle, much longer under load.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// The directory holding `quarkus-run.jar`: `$ACKD_TEST_REGISTRY_DIR`, else what
/// `scripts/install-registry` prints.
pub fn registry_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| installed("ACKD_TEST_REGISTRY_DIR", "scripts/install-registry"))
}

/// The python with confluent-kafka: `$ACKD_TEST_SERIALIZERS_PYTHON`, else what
/// `scripts/install-serializers` prints.
pub fn serializer_python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        installed(
            "ACKD_TEST_SERIALIZERS_PYTHON",
            "scripts/install-serializers",
        )
    })
}

/// A Java of 21 or newer (Apicurio 3.x needs one): `$ACKD_TEST_JAVA21`, else the first
/// JDK under /usr/lib/jvm whose name says 21 or more, else `java` on the PATH.
fn java() -> PathBuf {
    if let Some(j) = std::env::var_os("ACKD_TEST_JAVA21").filter(|v| !v.is_empty()) {
        return PathBuf::from(j);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/jvm")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            // The first number is the version (java-1.17.0-…: 1; temurin-25-…: 25).
            let major = name
                .split(|c: char| !c.is_ascii_digit())
                .find(|n| !n.is_empty())?
                .parse::<u32>()
                .ok()
                .filter(|n| *n >= 21)?;
            let java = e.path().join("bin/java");
            java.exists().then_some((major, java))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map_or_else(|| PathBuf::from("java"), |(_, j)| j)
}

/// A running registry.
pub struct Registry {
    port: u16,
    log: PathBuf,
    child: Mutex<Option<Child>>,
}

static REGISTRY: OnceLock<Registry> = OnceLock::new();

/// The test binary's registry, started on first use.
pub fn registry() -> &'static Registry {
    REGISTRY.get_or_init(Registry::start)
}

impl Registry {
    pub fn start() -> Registry {
        let started = Instant::now();
        let port = free_port();
        let log = log_dir().join(format!("apicurio-{}-{port}.log", std::process::id()));
        let out = std::fs::File::create(&log).expect("create the registry's log");
        let mut cmd = Command::new(java());
        cmd.current_dir(registry_dir())
            .env_clear()
            .envs(passthrough_env())
            .arg(format!("-Dquarkus.http.port={port}"))
            .arg("-Dquarkus.http.host=127.0.0.1")
            .args([
                "-Xmx384m",
                "-XX:TieredStopAtLevel=1",
                "-jar",
                "quarkus-run.jar",
            ])
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        let child = spawn_tied(cmd).expect("start Apicurio Registry");
        let registry = Registry {
            port,
            log,
            child: Mutex::new(Some(child)),
        };
        let deadline = started + START_TIMEOUT;
        while registry.get("/apis/ccompat/v7/subjects").map(|(s, _)| s) != Some(200) {
            let exited = registry
                .child
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            assert!(
                exited.is_none(),
                "Apicurio Registry exited with {exited:?}:\n{}",
                read_lossy(&registry.log)
            );
            assert!(
                Instant::now() < deadline,
                "Apicurio Registry did not answer within {START_TIMEOUT:?}:\n{}",
                read_lossy(&registry.log)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "harness: Apicurio Registry at {} ready in {:?} (log {})",
            registry.url(),
            started.elapsed(),
            registry.log.display()
        );
        registry
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The Confluent-compatible API's base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/apis/ccompat/v7", self.port)
    }

    /// A GET of `path`: the status and the body; `None` when nothing answers.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.port, path)
    }

    /// A request of the Confluent API (`path` under [`Registry::url`]) with a JSON body;
    /// panics unless it answers 2xx: the body.
    pub fn call(&self, method: &str, path: &str, body: &serde_json::Value) -> String {
        let full = format!("/apis/ccompat/v7/{path}");
        let (status, answer) = http_request(self.port, method, &full, &body.to_string())
            .unwrap_or_else(|| panic!("{method} {full}: the registry did not answer"));
        assert!(
            (200..300).contains(&status),
            "{method} {full}: {status} {answer}"
        );
        answer
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A plain HTTP/1.1 GET on 127.0.0.1:`port`.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_request(port, "GET", path, "")
}

/// A plain HTTP/1.1 request on 127.0.0.1:`port` with a JSON `body` (none when empty):
/// the status and the body; `None` when nothing answers.
pub fn http_request(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
         Content-Type: application/vnd.schemaregistry.v1+json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Some((status, body))
}

/// Produces `records` (`(key, value JSON)`) to `topic` through confluent-kafka's
/// serializer for `format` (`avro`, `json-schema`) with `schema`, registering it in
/// `registry_url`; the schema ids it used.
pub fn produce_with_serializer(
    bootstrap: &str,
    registry_url: &str,
    topic: &str,
    format: &str,
    schema: &str,
    records: &[(Option<&str>, serde_json::Value)],
) -> Vec<u32> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/produce_registry.py");
    let mut child = Command::new(serializer_python())
        .arg(script)
        .args([bootstrap, registry_url, topic, format, schema])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the serializer");
    let mut input = String::new();
    for (key, value) in records {
        input.push_str(&serde_json::json!({"key": key, "value": value}).to_string());
        input.push('\n');
    }
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the serializer failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|id| id.parse().unwrap())
        .collect()
}
