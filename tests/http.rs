//! The `http` processor against the real broker and the real binary, POSTing to an
//! endpoint written here: a small HTTP/1.1 server on a std `TcpListener` (a thread per
//! connection, keep-alive, `Content-Length` bodies, which is what ackd's client sends)
//! that records every request and answers what the test's responder says.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{ackd::*, lines::*, offsets::*, produce::*, spawn::*, topics::*, wait::*};

use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);
const TOKEN: &str = "Bearer s3cr3t-t0ken-4ckd";

/// One request the endpoint received.
#[derive(Debug, Clone)]
struct Request {
    path: String,
    /// Names lower-cased, in order.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    at: Instant,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// A raw body (metadata in Ackd-* headers) rather than a JSON one.
    fn is_raw(&self) -> bool {
        self.header("ackd-offset").is_some()
    }

    /// (partition, offset): from the Ackd-* headers of a raw body, else the JSON body.
    fn position(&self) -> (i32, i64) {
        if self.is_raw() {
            return (
                self.header("ackd-partition").unwrap().parse().unwrap(),
                self.header("ackd-offset").unwrap().parse().unwrap(),
            );
        }
        let v = self.json();
        // A batch is known by its first message.
        let v = if v.is_array() { &v[0] } else { &v };
        (
            v["partition"].as_i64().unwrap() as i32,
            v["offset"].as_i64().unwrap(),
        )
    }

    /// The offsets of a batch's messages (of a JSON array body).
    fn batch_offsets(&self) -> Vec<i64> {
        self.json()
            .as_array()
            .expect("a batch body is a JSON array")
            .iter()
            .map(|m| m["offset"].as_i64().unwrap())
            .collect()
    }

    /// The message value: the raw body, else the JSON body's `value`.
    fn value(&self) -> String {
        if self.is_raw() {
            return String::from_utf8_lossy(&self.body).into_owned();
        }
        self.json()["value"].as_str().unwrap_or("").to_string()
    }
}

/// What the endpoint answers.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
    /// How long the endpoint works on it before answering.
    delay: Duration,
}

fn ok() -> Response {
    status(200, "ok")
}

fn status(code: u16, body: &str) -> Response {
    Response {
        status: code,
        headers: Vec::new(),
        body: body.to_string(),
        delay: Duration::ZERO,
    }
}

/// The responder: the request, and how many requests for the same message (partition,
/// offset) came before it.
type Responder = dyn Fn(&Request, usize) -> Response + Send + Sync;

#[derive(Default)]
struct Recorded {
    requests: Mutex<Vec<Request>>,
    /// Requests so far per message (partition, offset): what the responder is told.
    counts: Mutex<std::collections::HashMap<(i32, i64), usize>>,
    changed: Condvar,
}

struct Endpoint {
    port: u16,
    recorded: Arc<Recorded>,
}

impl Endpoint {
    fn start(respond: impl Fn(&Request, usize) -> Response + Send + Sync + 'static) -> Endpoint {
        Self::start_on(TcpListener::bind("127.0.0.1:0").unwrap(), respond)
    }

    fn start_on(
        listener: TcpListener,
        respond: impl Fn(&Request, usize) -> Response + Send + Sync + 'static,
    ) -> Endpoint {
        let port = listener.local_addr().unwrap().port();
        let recorded = Arc::new(Recorded::default());
        let respond: Arc<Responder> = Arc::new(respond);
        let r = recorded.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (r, respond) = (r.clone(), respond.clone());
                thread::spawn(move || serve(conn, &r, &*respond));
            }
        });
        Endpoint { port, recorded }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/kafka/messages", self.port)
    }

    fn requests(&self) -> Vec<Request> {
        self.recorded.requests.lock().unwrap().clone()
    }
}

/// One keep-alive connection: requests until the client closes it.
fn serve(conn: TcpStream, recorded: &Recorded, respond: &Responder) {
    let mut writer = conn.try_clone().unwrap();
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let path = line.split(' ').nth(1).unwrap_or("").to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (n, v) = h.split_once(':').unwrap();
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        let len: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .map(|(_, v)| v.parse().unwrap())
            .unwrap_or(0);
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let request = Request {
            path,
            headers,
            body,
            at: Instant::now(),
        };
        let before = {
            let pos = request.position();
            let mut reqs = recorded.requests.lock().unwrap();
            let mut counts = recorded.counts.lock().unwrap();
            let seen = counts.entry(pos).or_default();
            let before = *seen;
            *seen += 1;
            reqs.push(request.clone());
            recorded.changed.notify_all();
            before
        };
        let response = respond(&request, before);
        thread::sleep(response.delay);
        let mut out = format!(
            "HTTP/1.1 {} X\r\ncontent-length: {}\r\n",
            response.status,
            response.body.len()
        );
        for (n, v) in &response.headers {
            out.push_str(&format!("{n}: {v}\r\n"));
        }
        out.push_str("\r\n");
        out.push_str(&response.body);
        if writer.write_all(out.as_bytes()).is_err() {
            return;
        }
    }
}

/// 1: 2 partitions, 40 messages, JSON bodies: each POSTed and acked once, in order per
/// partition, committed to the log end; the auth header arrived and is on no line.
#[test]
fn every_message_is_posted_once_in_order_with_the_auth_header_never_shown() {
    let (topic, group) = fresh_topic("http-all", 2);
    let endpoint = Endpoint::start(|_, _| ok());
    let delivered = produce_keyed(&topic, 40, 0);
    let ends = log_ends(&delivered);
    let ackd = http_ackd(&topic, &group, &endpoint.url())
        .env(
            "ACKD_HTTP_HEADERS",
            format!("Authorization: {TOKEN}\nX-Tenant: acme"),
        )
        .env("ACKD_HTTP_CONCURRENCY", "4")
        .spawn();
    ackd.wait_for_count(is_processed, 40, WAIT);
    let lines = ackd.stop(0, WAIT);

    let counts = processed_counts(&lines);
    assert_eq!(counts.len(), 40, "{}", lines.join("\n"));
    assert!(counts.values().all(|n| *n == 1), "each once: {counts:?}");
    let expected: BTreeMap<i32, Vec<i64>> =
        ends.iter().map(|(p, e)| (*p, (0..*e).collect())).collect();
    assert_eq!(offsets_by_partition(processed(&lines)), expected);
    let requests = endpoint.requests();
    assert_eq!(
        offsets_by_partition(requests.iter().map(Request::position)),
        expected,
        "the endpoint saw each partition in order, each message once"
    );
    for r in &requests {
        assert_eq!(r.path, "/kafka/messages");
        assert_eq!(r.header("authorization"), Some(TOKEN), "{r:?}");
        assert_eq!(r.header("x-tenant"), Some("acme"));
        assert_eq!(r.header("content-type"), Some("application/json"));
        let v = r.json();
        assert_eq!(v["topic"], topic.as_str());
        assert!(v["key"].as_str().unwrap().starts_with("k-"), "{v}");
        assert!(v["value"].as_str().unwrap().starts_with("message "), "{v}");
        assert!(v["timestamp_ms"].as_i64().is_some(), "{v}");
        assert_eq!(v["headers"], serde_json::json!([]));
    }
    assert_committed_to_ends(&group, &topic, 2, &ends);
    assert!(
        !lines.iter().any(|l| l.contains("s3cr3t-t0ken")),
        "{}",
        lines.join("\n")
    );
    let config = lines
        .iter()
        .find(|l| at(l, "http_processor"))
        .expect("at=http_processor");
    assert_eq!(
        field(config, "headers").as_deref(),
        Some("Authorization,X-Tenant")
    );
}

/// 2: a 500 twice, then 200: retried, then acked, order kept; the reason has the status
/// and the body, with the auth token the endpoint echoed redacted.
#[test]
fn a_500_is_retried_until_it_succeeds_and_order_is_kept() {
    let (topic, group) = fresh_topic("http-500", 1);
    let endpoint = Endpoint::start(|r, before| {
        if r.value() == "flaky" && before < 2 {
            let auth = r.header("authorization").unwrap_or("").to_string();
            status(500, &format!("database down; you sent {auth}"))
        } else {
            ok()
        }
    });
    produce_strs(&topic, &["a", "flaky", "b", "c"]);
    let ackd = http_ackd(&topic, &group, &endpoint.url())
        .env("ACKD_HTTP_HEADERS", format!("Authorization: {TOKEN}"))
        .spawn();
    ackd.wait_for_count(is_processed, 4, WAIT);
    let lines = ackd.stop(0, WAIT);
    let retries: Vec<_> = lines.iter().filter(|l| at_offset(l, "retry", 1)).collect();
    assert_eq!(retries.len(), 2, "{}", lines.join("\n"));
    let error = field(retries[0], "error").unwrap();
    assert!(
        error.contains("retryable: HTTP 500 Internal Server Error: database down"),
        "{error}"
    );
    assert!(
        error.contains("[redacted]") && !error.contains("s3cr3t"),
        "{error}"
    );
    assert_eq!(processed(&lines), vec![(0, 0), (0, 1), (0, 2), (0, 3)]);
    let seen: Vec<i64> = endpoint.requests().iter().map(|r| r.position().1).collect();
    assert_eq!(seen, vec![0, 1, 1, 1, 2, 3]);
    assert_committed(&group, &topic, 0, Some(4));
}

/// 3: a 429 with `Retry-After: 1`: the next attempt comes at least a second later,
/// though the worker's own backoff is 50 ms.
#[test]
fn a_429_with_retry_after_waits_that_long() {
    let (topic, group) = fresh_topic("http-429", 1);
    let endpoint = Endpoint::start(|r, before| {
        if r.value() == "busy" && before == 0 {
            let mut resp = status(429, "slow down");
            resp.headers.push(("Retry-After".into(), "1".into()));
            resp
        } else {
            ok()
        }
    });
    produce_strs(&topic, &["a", "busy", "b"]);
    let ackd = http_ackd(&topic, &group, &endpoint.url())
        .env("ACKD_RETRY_MAX_MS", "5000")
        .spawn();
    ackd.wait_for_count(is_processed, 3, WAIT);
    let lines = ackd.stop(0, WAIT);
    let busy: Vec<Request> = endpoint
        .requests()
        .into_iter()
        .filter(|r| r.position().1 == 1)
        .collect();
    assert_eq!(busy.len(), 2);
    let gap = busy[1].at - busy[0].at;
    assert!(gap >= Duration::from_secs(1), "retried after {gap:?}");
    let retry = lines
        .iter()
        .find(|l| at_offset(l, "retry", 1))
        .expect("at=retry");
    let delay: u64 = field(retry, "delay_ms").unwrap().parse().unwrap();
    assert!(delay >= 1000, "{retry}");
    assert!(
        field(retry, "error").unwrap().contains("HTTP 429"),
        "{retry}"
    );
    assert_eq!(processed(&lines), vec![(0, 0), (0, 1), (0, 2)]);
}

/// 4: a 400 is permanent: with skip the message is skipped at once and the others
/// acked; with halt (the default) the partition stops there and the exit code is 1.
#[test]
fn a_400_is_permanent_and_meets_the_failure_policy() {
    for policy in ["skip", "halt"] {
        let (topic, group) = fresh_topic("http-400", 1);
        let endpoint = Endpoint::start(|r, _| {
            if r.value() == "poison" {
                status(400, "bad message")
            } else {
                ok()
            }
        });
        produce_strs(&topic, &["a", "poison", "b"]);
        let mut builder = http_ackd(&topic, &group, &endpoint.url());
        if policy == "skip" {
            builder = builder.env("ACKD_ON_FAILURE", "skip");
        }
        let ackd = builder.spawn();
        if policy == "skip" {
            ackd.wait_for_count(is_processed, 2, WAIT);
            let lines = ackd.stop(0, WAIT);
            let skipped = lines
                .iter()
                .find(|l| at_offset(l, "skipped", 1))
                .expect("at=skipped");
            let error = field(skipped, "error").unwrap();
            assert!(
                error.contains("permanent: HTTP 400 Bad Request: bad message"),
                "{error}"
            );
            assert_eq!(field(skipped, "attempts").as_deref(), Some("1"));
            assert_eq!(processed(&lines), vec![(0, 0), (0, 2)]);
            assert_committed(&group, &topic, 0, Some(3));
            assert_eq!(endpoint.requests().len(), 3, "not retried");
        } else {
            ackd.wait_for_line(|l| at_offset(l, "process_failed", 1), WAIT);
            let lines = ackd.stop(1, WAIT);
            assert_eq!(processed(&lines), vec![(0, 0)]);
            assert_committed(&group, &topic, 0, Some(1));
            assert_eq!(endpoint.requests().len(), 2, "nothing past the poison");
        }
    }
}

/// 5: raw bodies: the value bytes as they are, the metadata in Ackd-* headers.
#[test]
fn raw_bodies_are_the_value_with_metadata_in_headers() {
    let (topic, group) = fresh_topic("http-raw", 1);
    let endpoint = Endpoint::start(|_, _| ok());
    produce_values(
        &topic,
        &[
            (
                Some(b"k-0"),
                b"{\"order\":1}",
                &[("trace", b"t-1"), ("trace", b"t-2")],
            ),
            (
                Some(&[0xff, 0xfe]),
                &[0x00, 0x9f, 0x92, 0x96],
                &[("bin", &[0xc3])],
            ),
        ],
    );
    let ackd = http_ackd(&topic, &group, &endpoint.url())
        .env("ACKD_HTTP_BODY", "raw")
        .spawn();
    ackd.wait_for_count(is_processed, 2, WAIT);
    ackd.stop(0, WAIT);
    let requests = endpoint.requests();
    assert_eq!(requests.len(), 2);
    let r0 = &requests[0];
    assert_eq!(r0.body, b"{\"order\":1}");
    assert_eq!(r0.header("content-type"), Some("application/octet-stream"));
    assert_eq!(r0.header("ackd-topic"), Some(topic.as_str()));
    assert_eq!(r0.header("ackd-partition"), Some("0"));
    assert_eq!(r0.header("ackd-offset"), Some("0"));
    assert_eq!(r0.header("ackd-key"), Some("k-0"));
    let ts: i64 = r0.header("ackd-timestamp-ms").unwrap().parse().unwrap();
    assert!(ts > 1_600_000_000_000);
    let h: Value = serde_json::from_str(r0.header("ackd-headers").unwrap()).unwrap();
    assert_eq!(
        h,
        serde_json::json!([{"name":"trace","value":"t-1"},{"name":"trace","value":"t-2"}])
    );
    let r1 = &requests[1];
    assert_eq!(r1.body, [0x00, 0x9f, 0x92, 0x96]);
    assert_eq!(r1.header("ackd-offset"), Some("1"));
    assert_eq!(r1.header("ackd-key"), None);
    assert_eq!(r1.header("ackd-key-base64"), Some("//4="));
    let h: Value = serde_json::from_str(r1.header("ackd-headers").unwrap()).unwrap();
    assert_eq!(h, serde_json::json!([{"name":"bin","value_base64":"ww=="}]));
    assert_committed(&group, &topic, 0, Some(2));
}

/// 6: SIGTERM with requests in flight to a slow endpoint: they complete, ackd exits 0,
/// and a second run resumes at the next message: nothing lost, nothing posted twice.
#[test]
fn sigterm_lets_requests_in_flight_finish_and_a_restart_resumes_after_them() {
    let (topic, group) = fresh_topic("http-stop", 2);
    let endpoint = Endpoint::start(|_, _| Response {
        delay: Duration::from_millis(200),
        ..ok()
    });
    let delivered = produce_keyed(&topic, 30, 0);
    let ends = log_ends(&delivered);
    let first = http_ackd(&topic, &group, &endpoint.url()).spawn();
    first.wait_for_count(is_processed, 4, WAIT);
    let lines_first = first.stop(0, WAIT);
    let acked_first = processed(&lines_first);
    assert!(acked_first.len() < 30, "stopped before the end");
    // Every request the endpoint got was answered and acknowledged: none abandoned.
    let posted_first: Vec<(i32, i64)> = endpoint.requests().iter().map(Request::position).collect();
    assert_eq!(
        offsets_by_partition(posted_first.clone()),
        offsets_by_partition(acked_first.clone())
    );
    let committed_first = committed(&group, &topic, 2);
    for (p, offsets) in offsets_by_partition(acked_first.clone()) {
        assert_eq!(
            committed_first[&p],
            Some(offsets.len() as i64),
            "partition {p}"
        );
    }

    let second = http_ackd(&topic, &group, &endpoint.url()).spawn();
    second.wait_for_count(is_processed, 30 - acked_first.len(), WAIT);
    let lines_second = second.stop(0, WAIT);
    let all: Vec<(i32, i64)> = acked_first
        .iter()
        .chain(processed(&lines_second).iter())
        .copied()
        .collect();
    let expected: BTreeMap<i32, Vec<i64>> =
        ends.iter().map(|(p, e)| (*p, (0..*e).collect())).collect();
    assert_eq!(
        offsets_by_partition(all),
        expected,
        "each acked once, in order"
    );
    assert_eq!(
        offsets_by_partition(endpoint.requests().iter().map(Request::position)),
        expected,
        "each posted once, in order"
    );
    assert_committed_to_ends(&group, &topic, 2, &ends);
}

/// 7: the endpoint is down (connection refused): retryable; once it is up, acked.
#[test]
fn a_refused_connection_is_retried_until_the_endpoint_is_up() {
    let (topic, group) = fresh_topic("http-down", 1);
    produce_strs(&topic, &["a", "b"]);
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/kafka/messages");
    let ackd = http_ackd(&topic, &group, &url)
        .env("ACKD_RETRY_MAX_ATTEMPTS", "1000")
        .spawn();
    let retry = ackd.wait_for_line(|l| at_offset(l, "retry", 0), WAIT);
    let error = field(&retry, "error").unwrap();
    assert!(error.contains("retryable: cannot connect"), "{error}");
    let endpoint = Endpoint::start_on(TcpListener::bind(("127.0.0.1", port)).unwrap(), |_, _| ok());
    ackd.wait_for_count(is_processed, 2, WAIT);
    let lines = ackd.stop(0, WAIT);
    assert_eq!(processed(&lines), vec![(0, 0), (0, 1)]);
    let seen: Vec<i64> = endpoint.requests().iter().map(|r| r.position().1).collect();
    assert_eq!(seen, vec![0, 1]);
    assert_committed(&group, &topic, 0, Some(2));
}

/// ACKD_PROCESSOR=http without a URL, and headers that cannot be parsed, are
/// configuration errors naming the setting and never showing a header value.
#[test]
fn bad_http_settings_are_configuration_errors_that_show_no_secret() {
    let ackd = AckdBuilder::without_broker("t", "g")
        .env("ACKD_PROCESSOR", "http")
        .spawn();
    ackd.assert_config_error("ACKD_HTTP_URL", WAIT);

    let ackd = AckdBuilder::without_broker("t", "g")
        .env("ACKD_PROCESSOR", "http")
        .env("ACKD_HTTP_URL", "http://127.0.0.1:1/")
        .env("ACKD_HTTP_HEADERS", "s3cr3t-t0ken-without-a-name")
        .spawn();
    let line = ackd.assert_config_error("ACKD_HTTP_HEADERS", WAIT);
    let lines = ackd.lines();
    assert!(!lines.iter().any(|l| l.contains("s3cr3t")), "{line}");
}

/// The Python endpoint of docs/http.md ("http processor"), exactly as written there.
fn readme_endpoint() -> String {
    common::docs::code_block("docs/http.md", "# http processor", "```python\n", 1)
}

/// docs/http.md's endpoint: text values are acked, a binary value gets its 400 (skipped
/// here), and a restart of nothing is needed: everything is committed.
#[test]
fn the_readme_endpoint_acks_text_and_refuses_binary_values() {
    let (topic, group) = fresh_topic("http-readme", 1);
    let dir = fresh_dir("http-readme");
    let script = dir.join("endpoint.py");
    std::fs::write(&script, readme_endpoint()).unwrap();
    let port = free_port();
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(&script)
        .env("PORT", port.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut python = spawn_tied(cmd).expect("run python3");
    wait_until(WAIT, || TcpStream::connect(("127.0.0.1", port)).is_ok());
    produce_values(
        &topic,
        &[
            (None, b"hello", &[]),
            (None, &[0xff, 0x00], &[]),
            (None, b"world", &[]),
        ],
    );
    let ackd = http_ackd(&topic, &group, &format!("http://127.0.0.1:{port}/"))
        .env("ACKD_ON_FAILURE", "skip")
        .spawn();
    ackd.wait_for_count(is_processed, 2, WAIT);
    let lines = ackd.stop(0, WAIT);
    let _ = python.kill();
    let _ = python.wait();
    assert_eq!(processed(&lines), vec![(0, 0), (0, 2)]);
    let skipped = lines
        .iter()
        .find(|l| at_offset(l, "skipped", 1))
        .expect("at=skipped");
    assert!(
        field(skipped, "error")
            .unwrap()
            .contains("HTTP 400 Bad Request: no text value"),
        "{skipped}"
    );
    assert_committed(&group, &topic, 0, Some(3));
}

/// No answer within ACKD_HTTP_TIMEOUT_MS is retryable: the retry is acked.
#[test]
fn a_request_that_times_out_is_retried() {
    let (topic, group) = fresh_topic("http-timeout", 1);
    let endpoint = Endpoint::start(|_, before| Response {
        delay: if before == 0 {
            Duration::from_millis(1500)
        } else {
            Duration::ZERO
        },
        ..ok()
    });
    produce_strs(&topic, &["a"]);
    let ackd = http_ackd(&topic, &group, &endpoint.url())
        .env("ACKD_HTTP_TIMEOUT_MS", "300")
        .spawn();
    ackd.wait_for_count(is_processed, 1, WAIT);
    let lines = ackd.stop(0, WAIT);
    let retry = lines
        .iter()
        .find(|l| at_offset(l, "retry", 0))
        .expect("at=retry");
    assert!(
        field(retry, "error")
            .unwrap()
            .contains("retryable: no response within ACKD_HTTP_TIMEOUT_MS=300"),
        "{retry}"
    );
    assert_eq!(endpoint.requests().len(), 2);
    assert_committed(&group, &topic, 0, Some(1));
}

/// A Retry-After longer than ACKD_RETRY_MAX_MS waits ACKD_RETRY_MAX_MS.
#[test]
fn retry_after_is_capped_at_the_retry_maximum() {
    let (topic, group) = fresh_topic("http-cap", 1);
    let endpoint = Endpoint::start(|_, before| {
        if before == 0 {
            let mut resp = status(503, "maintenance");
            resp.headers.push(("Retry-After".into(), "3600".into()));
            resp
        } else {
            ok()
        }
    });
    produce_strs(&topic, &["a"]);
    let ackd = http_ackd(&topic, &group, &endpoint.url())
        .env("ACKD_RETRY_MAX_MS", "300")
        .spawn();
    ackd.wait_for_count(is_processed, 1, WAIT);
    let lines = ackd.stop(0, WAIT);
    let retry = lines
        .iter()
        .find(|l| at_offset(l, "retry", 0))
        .expect("at=retry");
    assert_eq!(field(retry, "delay_ms").as_deref(), Some("300"), "{retry}");
    assert!(
        field(retry, "error")
            .unwrap()
            .contains("HTTP 503 Service Unavailable: maintenance (Retry-After 3600000 ms)"),
        "{retry}"
    );
}

// ---- batches: one POST per batch, its body a JSON array ----

/// 30 messages in batches of at most 5, under skip: every batch's first POST gets a 500
/// and is retried; the batch holding offset 12 is then refused with
/// a 400 with `Ackd-Failed-Offset: 12`: the ones before 12 in it are acknowledged, 12 is
/// skipped at once
/// (a 400 is permanent), and the rest comes again. Everything else is acknowledged once,
/// in order, and the commit reaches the end.
#[test]
fn http_batches_retry_a_500_and_skip_the_offset_a_400_names() {
    let (topic, group) = fresh_topic("http-batch", 1);
    let endpoint = Endpoint::start(|r, before| {
        if before == 0 {
            status(500, "warming up")
        } else if r.batch_offsets().contains(&12) {
            let mut refusal = status(400, r#"{"error":"bad row"}"#);
            refusal
                .headers
                .push(("Ackd-Failed-Offset".into(), "12".into()));
            refusal
        } else {
            ok()
        }
    });
    produce_numbered(&topic, 30);
    let ackd = http_ackd(&topic, &group, &endpoint.url())
        .batches(5)
        .env("ACKD_ON_FAILURE", "skip")
        .spawn();
    ackd.wait_for_count(is_processed, 29, WAIT);
    let lines = ackd.stop(0, WAIT);

    let requests = endpoint.requests();
    let bodies: Vec<Vec<i64>> = requests.iter().map(Request::batch_offsets).collect();
    assert!(
        bodies.iter().all(|b| (1..=5).contains(&b.len())),
        "{bodies:?}"
    );
    // Each distinct batch start was answered 500 once, then retried (and answered 2xx,
    // or the 400 for the one holding 12).
    let mut starts: Vec<i64> = bodies.iter().map(|b| b[0]).collect();
    starts.dedup();
    for start in &starts {
        let sent = bodies.iter().filter(|b| b[0] == *start).count();
        assert_eq!(sent, 2, "batch at {start}: {bodies:?}");
    }
    // The refused batch's successor starts right after 12.
    assert!(starts.contains(&13), "{bodies:?}");
    let skipped = all_at(&lines, "skipped");
    assert_eq!(skipped.len(), 1, "{}", lines.join("\n"));
    assert_eq!(field(skipped[0], "offset").as_deref(), Some("12"));
    assert_eq!(field(skipped[0], "attempts").as_deref(), Some("1"));
    assert!(
        field(skipped[0], "error").unwrap().contains("HTTP 400"),
        "{}",
        skipped[0]
    );
    let retries = count_at(&lines, "retry");
    assert_eq!(retries, starts.len(), "one retry per batch start");
    let expected: Vec<(i32, i64)> = (0..30).filter(|o| *o != 12).map(|o| (0, o)).collect();
    assert_eq!(processed(&lines), expected);
    assert_committed(&group, &topic, 0, Some(30));
}

/// A refusal that names no offset of the batch (no `Ackd-Failed-Offset`, one outside
/// the batch, one that is not a number) fails the batch's first message; under halt
/// nothing of the batch is committed.
#[test]
fn an_http_batch_refused_without_an_offset_of_its_own_fails_its_first_message() {
    for header in [None, Some("999"), Some("six")] {
        let (topic, group) = fresh_topic("http-batch-first", 1);
        let endpoint = Endpoint::start(move |r, _| {
            if r.position().1 == 0 {
                return ok();
            }
            let mut refusal = status(400, "bad request");
            if let Some(offset) = header {
                refusal
                    .headers
                    .push(("Ackd-Failed-Offset".into(), offset.into()));
            }
            refusal
        });
        produce_numbered(&topic, 8);
        let ackd = http_ackd(&topic, &group, &endpoint.url())
            .batches(4)
            .spawn();
        let failed = ackd.wait_for_line(|l| at(l, "process_failed"), WAIT);
        assert_eq!(
            field(&failed, "offset").as_deref(),
            Some("4"),
            "{header:?}: {failed}"
        );
        let lines = ackd.stop(1, WAIT);
        assert_eq!(
            processed(&lines),
            (0..4).map(|o| (0, o)).collect::<Vec<_>>()
        );
        assert_eq!(committed_offset(&group, &topic, 0), Some(4), "{header:?}");
    }
}

/// A refusal whose body is an ordinary error that happens to have an `"offset"` (of
/// the batch, even) acknowledges nothing: only ackd's own `Ackd-Failed-Offset` header
/// names the message that failed. Batches of 4, the second one always answered
/// `500 {"error":"x","offset":6}`: it is retried whole from 4 until the attempts run
/// out, then fails at 4 under halt, committed exactly up to 4.
#[test]
fn an_http_error_body_with_an_offset_acknowledges_nothing() {
    let (topic, group) = fresh_topic("http-batch-offset-body", 1);
    let endpoint = Endpoint::start(|r, _| {
        if r.position().1 == 0 {
            ok()
        } else {
            status(500, r#"{"error":"x","offset":6}"#)
        }
    });
    produce_numbered(&topic, 8);
    let ackd = http_ackd(&topic, &group, &endpoint.url())
        .batches(4)
        .env("ACKD_RETRY_MAX_ATTEMPTS", "3")
        .spawn();
    let failed = ackd.wait_for_line(|l| at(l, "process_failed"), WAIT);
    let lines = ackd.stop(1, WAIT);
    let bodies: Vec<Vec<i64>> = endpoint
        .requests()
        .iter()
        .map(Request::batch_offsets)
        .collect();
    let committed = committed_offset(&group, &topic, 0);
    eprintln!(
        "http offset body: requests={bodies:?} failed_offset={:?} committed={committed:?}",
        field(&failed, "offset")
    );
    assert_eq!(field(&failed, "offset").as_deref(), Some("4"), "{failed}");
    assert_eq!(
        bodies,
        vec![
            vec![0, 1, 2, 3],
            vec![4, 5, 6, 7],
            vec![4, 5, 6, 7],
            vec![4, 5, 6, 7]
        ],
        "the refused batch comes again whole"
    );
    assert_eq!(
        processed(&lines),
        (0..4).map(|o| (0, o)).collect::<Vec<_>>()
    );
    assert_eq!(committed, Some(4));
}

/// A 429 with `Retry-After: 1` on a batch: the batch comes again a second later at the
/// earliest, though the worker's own backoff is 50 ms.
#[test]
fn an_http_batch_answered_429_waits_for_retry_after() {
    let (topic, group) = fresh_topic("http-batch-429", 1);
    let endpoint = Endpoint::start(|_, before| {
        if before == 0 {
            let mut resp = status(429, "slow down");
            resp.headers.push(("Retry-After".into(), "1".into()));
            resp
        } else {
            ok()
        }
    });
    produce_numbered(&topic, 6);
    let ackd = http_ackd(&topic, &group, &endpoint.url())
        .batches(6)
        .env("ACKD_RETRY_MAX_MS", "5000")
        .spawn();
    ackd.wait_for_count(is_processed, 6, WAIT);
    let lines = ackd.stop(0, WAIT);
    let requests = endpoint.requests();
    assert_eq!(requests.len(), 2, "one batch, sent twice");
    assert_eq!(requests[0].batch_offsets(), (0..6).collect::<Vec<_>>());
    assert_eq!(requests[1].batch_offsets(), (0..6).collect::<Vec<_>>());
    let gap = requests[1].at - requests[0].at;
    assert!(gap >= Duration::from_secs(1), "retried after {gap:?}");
    let retry = lines.iter().find(|l| at(l, "retry")).expect("at=retry");
    assert_eq!(
        field(retry, "batch_messages").as_deref(),
        Some("6"),
        "{retry}"
    );
    assert!(field(retry, "delay_ms").unwrap().parse::<u64>().unwrap() >= 1000);
    assert_committed(&group, &topic, 0, Some(6));
}

/// With `ACKD_ORDERING=key` one partition keeps several requests in flight (one per key,
/// up to `ACKD_CONCURRENCY` and `ACKD_HTTP_CONCURRENCY`), and each key's messages are
/// still POSTed one at a time, in offset order: 60 messages of 6 keys, 100 ms each.
#[test]
fn key_ordering_keeps_requests_of_different_keys_in_flight_and_each_key_in_order() {
    let (topic, group) = fresh_topic("http-key", 1);
    let keys: Vec<String> = (0..60).map(|i| format!("k{}", i % 6)).collect();
    let vals: Vec<String> = (0..60).map(|i| format!("v{i}")).collect();
    let records: Vec<ValueRecord<'_>> = (0..60)
        .map(|i| (Some(keys[i].as_bytes()), vals[i].as_bytes(), &[][..]))
        .collect();
    produce_values(&topic, &records);
    let work = Duration::from_millis(100);
    let endpoint = Endpoint::start(move |_, _| Response {
        delay: work,
        ..ok()
    });
    let ackd = http_ackd(&topic, &group, &endpoint.url())
        .env("ACKD_ORDERING", "key")
        .env("ACKD_CONCURRENCY", "8")
        .env("ACKD_HTTP_CONCURRENCY", "8")
        .env("ACKD_STOP_AT_END", "true")
        .spawn();
    ackd.assert_exit(0, WAIT);
    let requests = endpoint.requests();
    let offsets: Vec<i64> = requests.iter().map(|r| r.position().1).collect();
    let mut sorted = offsets.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..60).collect::<Vec<i64>>(),
        "each message POSTed once"
    );
    // Each key's requests arrived in offset order, each after the previous one's answer.
    for k in 0..6 {
        let of_key: Vec<&Request> = requests
            .iter()
            .filter(|r| r.position().1 % 6 == k)
            .collect();
        let key_offsets: Vec<i64> = of_key.iter().map(|r| r.position().1).collect();
        assert!(
            key_offsets.windows(2).all(|w| w[0] < w[1]),
            "key k{k} out of order: {key_offsets:?}"
        );
        assert!(
            of_key.windows(2).all(|w| w[1].at >= w[0].at + work),
            "key k{k}: a request came before the previous one was answered"
        );
    }
    // Requests of one partition overlapped: the most that arrived within one request's work.
    let peak = requests
        .iter()
        .map(|r| {
            requests
                .iter()
                .filter(|o| o.at <= r.at && r.at < o.at + work)
                .count()
        })
        .max()
        .unwrap();
    eprintln!(
        "http key ordering: 60 messages, 6 keys, peak requests in flight {peak}, offsets {offsets:?}"
    );
    assert!(
        (3..=6).contains(&peak),
        "expected several requests of the partition in flight (at most one per key): {peak}"
    );
    assert_committed(&group, &topic, 0, Some(60));
}

/// An endpoint that takes 1 s a request until `fast` is set.
fn slow_until_fast(fast: &Arc<std::sync::atomic::AtomicBool>) -> Endpoint {
    let fast = fast.clone();
    Endpoint::start(move |_, _| Response {
        delay: if fast.load(std::sync::atomic::Ordering::SeqCst) {
            Duration::ZERO
        } else {
            Duration::from_secs(1)
        },
        ..ok()
    })
}

/// One permit for all calls, a 5 s drain.
fn one_permit(topic: &str, group: &str, url: &str) -> AckdBuilder {
    http_ackd(topic, group, url)
        .env("ACKD_HTTP_CONCURRENCY", "1")
        .env("ACKD_HTTP_TIMEOUT_MS", "3000")
        .env("ACKD_SHUTDOWN_TIMEOUT_MS", "5000")
}
/// Five messages in each of 6 partitions: `p{p}-{i}`.
fn produce_five_in_each_of_six(topic: &str) {
    let values: Vec<(i32, String)> = (0..6)
        .flat_map(|p| (0..5).map(move |i| (p, format!("p{p}-{i}"))))
        .collect();
    let records: Vec<common::produce::Record<'_>> = values
        .iter()
        .map(|(p, v)| (*p, None, v.as_bytes(), &[][..]))
        .collect();
    produce_records(topic, &records);
}

/// What a stopped run acknowledged (its `lines`), sorted: exactly what was `posted`.
fn acked_as_posted(lines: &[String], posted: &mut [(i32, i64)]) -> Vec<(i32, i64)> {
    let mut acked = processed(lines);
    acked.sort_unstable();
    posted.sort_unstable();
    assert_eq!(*posted, acked[..], "every request posted was acknowledged");
    acked
}

/// After a first run of [`produce_five_in_each_of_six`] stopped with `acked`
/// acknowledged: each partition's commit is what it acknowledged; then the endpoint
/// turns fast and `second` posts the rest: each of the 30 posted exactly once.
fn committed_as_acked_then_the_rest_once(
    group: &str,
    topic: &str,
    acked: &[(i32, i64)],
    fast: &std::sync::atomic::AtomicBool,
    second: AckdBuilder,
    endpoint: &Endpoint,
) {
    let committed_first = committed(group, topic, 6);
    for p in 0..6 {
        let n = acked.iter().filter(|a| a.0 == p).count() as i64;
        // (A partition with nothing acknowledged has its first commit, before its
        // first call: offset 0.)
        assert_eq!(committed_first[&p], Some(n), "partition {p}");
    }

    fast.store(true, std::sync::atomic::Ordering::SeqCst);
    let second = second.spawn();
    second.wait_for_count(is_processed, 30 - acked.len(), WAIT);
    second.stop(0, WAIT);
    let mut all: Vec<(i32, i64)> = endpoint.requests().iter().map(|r| r.position()).collect();
    all.sort_unstable();
    let expected: Vec<(i32, i64)> = (0..6).flat_map(|p| (0..5).map(move |o| (p, o))).collect();
    assert_eq!(all, expected, "each posted exactly once");
}

/// Starts `ackd`, and once 2 messages are processed (the rest waiting for the permit)
/// stops it: the drain completes (exit 0) and only the request under way is finished.
/// Returns its lines, the requests posted before SIGTERM, and all posted by then.
fn stop_with_requests_queued(
    ackd: AckdBuilder,
    endpoint: &Endpoint,
) -> (Vec<String>, usize, Vec<(i32, i64)>) {
    let first = ackd.spawn();
    first.wait_for_count(is_processed, 2, WAIT);
    let posted_before = endpoint.requests().len();
    let lines = first.stop(0, WAIT);
    assert!(
        lines
            .iter()
            .any(|l| at(l, "drained") && field(l, "complete").as_deref() == Some("true")),
        "{}",
        lines.join("\n")
    );
    let posted: Vec<(i32, i64)> = endpoint.requests().iter().map(|r| r.position()).collect();
    assert!(
        posted.len() <= posted_before + 1,
        "only the request under way was finished: {posted_before} before SIGTERM, {} after",
        posted.len()
    );
    (lines, posted_before, posted)
}

/// Requests waiting for a permit are not in flight: key ordering with 16 calls a
/// partition and `ACKD_HTTP_CONCURRENCY=1` against an endpoint that takes 1 s: on SIGTERM the drain (5 s) waits only for the
/// request under way, the ones waiting for the permit are dropped (exit 0, complete),
/// the commit covers exactly what was acknowledged, and a restart posts the rest: each
/// message posted once.
#[test]
fn sigterm_waits_for_the_request_under_way_not_for_those_waiting_for_a_permit() {
    let (topic, group) = fresh_topic("http-queued-stop", 1);
    let fast = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let endpoint = slow_until_fast(&fast);
    let keys: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
    let records: Vec<ValueRecord<'_>> = keys
        .iter()
        .map(|k| (Some(k.as_bytes()), k.as_bytes(), &[][..]))
        .collect();
    produce_values(&topic, &records);
    let queued = || {
        one_permit(&topic, &group, &endpoint.url())
            .env("ACKD_ORDERING", "key")
            .env("ACKD_CONCURRENCY", "16")
    };
    let (lines, posted_before, posted) = stop_with_requests_queued(queued(), &endpoint);
    let posted: Vec<i64> = posted.iter().map(|p| p.1).collect();
    let mut acked: Vec<i64> = processed(&lines).iter().map(|p| p.1).collect();
    acked.sort_unstable();
    assert_eq!(acked, (0..acked.len() as i64).collect::<Vec<_>>());
    let mut posted_sorted = posted.clone();
    posted_sorted.sort_unstable();
    assert_eq!(
        posted_sorted, acked,
        "every request posted was acknowledged"
    );
    assert_committed(&group, &topic, 0, Some(acked.len() as i64));

    fast.store(true, std::sync::atomic::Ordering::SeqCst);
    let second = queued().spawn();
    second.wait_for_count(is_processed, 30 - acked.len(), WAIT);
    second.stop(0, WAIT);
    let mut all: Vec<i64> = endpoint.requests().iter().map(|r| r.position().1).collect();
    all.sort_unstable();
    assert_eq!(all, (0..30).collect::<Vec<_>>(), "each posted exactly once");
    assert_committed(&group, &topic, 0, Some(30));
    eprintln!(
        "http queued stop: posted_before_sigterm={posted_before} posted_by_first={} acked_first={}",
        posted.len(),
        acked.len()
    );
}

/// The same under partition ordering (the default): 6 partitions share
/// `ACKD_HTTP_CONCURRENCY=1` against an endpoint that takes 1 s. On SIGTERM the drain
/// waits only for the request under way, not for one waiting request per partition in
/// turn (exit 0, complete); each partition's commit is what it acknowledged, and a
/// restart posts the rest: each message posted once.
#[test]
fn sigterm_under_partition_ordering_waits_for_the_request_under_way_not_for_other_partitions() {
    let (topic, group) = fresh_topic("http-partition-queued-stop", 6);
    let fast = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let endpoint = slow_until_fast(&fast);
    produce_five_in_each_of_six(&topic);
    let queued = || one_permit(&topic, &group, &endpoint.url()).env("ACKD_ORDERING", "partition");
    let (lines, posted_before, mut posted) = stop_with_requests_queued(queued(), &endpoint);
    let acked = acked_as_posted(&lines, &mut posted);
    committed_as_acked_then_the_rest_once(&group, &topic, &acked, &fast, queued(), &endpoint);
    let committed = committed(&group, &topic, 6);
    assert!(committed.values().all(|c| *c == Some(5)), "{committed:?}");
    eprintln!(
        "http partition queued stop: posted_before_sigterm={posted_before} posted_by_first={} acked_first={}",
        posted.len(),
        acked.len()
    );
}

// ---- redelivered and attempt (docs/http.md#redelivered-and-attempt) ----

/// A request's `Ackd-Redelivered` and `Ackd-Attempt` headers.
fn delivery_headers(r: &Request) -> (bool, u64) {
    let redelivered = match r.header("ackd-redelivered") {
        Some("true") => true,
        Some("false") => false,
        other => panic!("Ackd-Redelivered: {other:?}: {r:?}"),
    };
    let attempt = r.header("ackd-attempt").and_then(|a| a.parse().ok());
    (
        redelivered,
        attempt.unwrap_or_else(|| panic!("Ackd-Attempt: {r:?}")),
    )
}

/// The `"redelivered"` and `"attempt"` of each message of a JSON body (one, or a batch's).
fn delivery_fields(r: &Request) -> Vec<(bool, u64)> {
    let v = r.json();
    let messages = v.as_array().cloned().unwrap_or_else(|| vec![v]);
    messages
        .iter()
        .map(|m| (m["redelivered"].as_bool(), m["attempt"].as_u64()))
        .map(|d| match d {
            (Some(r), Some(a)) => (r, a),
            _ => panic!("no redelivered or attempt: {messages:?}"),
        })
        .collect()
}

/// ackd POSTing to `endpoint`, spawned, and assigned its partition: messages produced
/// now are new to every endpoint (not redelivered on a first try).
fn http_assigned(ackd: AckdBuilder) -> AckdProcess {
    let ackd = ackd.spawn();
    ackd.wait_for_line(|l| at(l, "assigned"), WAIT);
    ackd
}

/// A 503 for one message, in both body modes: every request has `Ackd-Redelivered` and
/// `Ackd-Attempt`, false and 1 on a first try, true and 2 on the retry; a json body
/// says the same in its object.
#[test]
fn every_request_says_whether_it_may_be_a_repeat_and_its_attempt() {
    for body in ["json", "raw"] {
        let (topic, group) = fresh_topic(&format!("http-attempt-{body}"), 1);
        let endpoint = Endpoint::start(|r, before| {
            if r.value() == "flaky" && before == 0 {
                status(503, "not yet")
            } else {
                ok()
            }
        });
        let ackd =
            http_assigned(http_ackd(&topic, &group, &endpoint.url()).env("ACKD_HTTP_BODY", body));
        produce_strs(&topic, &["a", "flaky", "b"]);
        ackd.wait_for_count(is_processed, 3, WAIT);
        ackd.stop(0, WAIT);
        let requests = endpoint.requests();
        let seen: Vec<(i64, (bool, u64))> = requests
            .iter()
            .map(|r| (r.position().1, delivery_headers(r)))
            .collect();
        assert_eq!(
            seen,
            vec![
                (0, (false, 1)),
                (1, (false, 1)),
                (1, (true, 2)),
                (2, (false, 1))
            ],
            "{body}"
        );
        for r in requests.iter().filter(|_| body == "json") {
            assert_eq!(delivery_fields(r), vec![delivery_headers(r)], "{r:?}");
        }
    }
}

/// Batches of 4, the one holding offset 5 answered 500 once: it comes again with
/// `Ackd-Redelivered: true` and `Ackd-Attempt: 2`, each of its messages saying so in
/// the body; every other request, and the first try, say false and 1.
#[test]
fn a_retried_http_batch_says_so_in_its_headers_and_for_each_message() {
    let (topic, group) = fresh_topic("http-attempt-batch", 1);
    let endpoint = Endpoint::start(|r, before| {
        if r.batch_offsets().contains(&5) && before == 0 {
            status(500, "not yet")
        } else {
            ok()
        }
    });
    let ackd = http_assigned(http_ackd(&topic, &group, &endpoint.url()).batches(4));
    produce_numbered(&topic, 10);
    ackd.wait_for_count(is_processed, 10, WAIT);
    let lines = ackd.stop(0, WAIT);
    assert_eq!(count_at(&lines, "retry"), 1, "{}", lines.join("\n"));
    let requests = endpoint.requests();
    let refused = requests
        .iter()
        .position(|r| r.batch_offsets().contains(&5))
        .expect("a batch held offset 5");
    let again = &requests[refused + 1];
    assert_eq!(again.batch_offsets(), requests[refused].batch_offsets());
    for (i, r) in requests.iter().enumerate() {
        let expected = if i == refused + 1 {
            (true, 2)
        } else {
            (false, 1)
        };
        assert_eq!(delivery_headers(r), expected, "{i}: {r:?}");
        let each = vec![expected; r.batch_offsets().len()];
        assert_eq!(delivery_fields(r), each, "{i}: {r:?}");
    }
    assert_eq!(
        processed(&lines),
        (0..10).map(|o| (0, o)).collect::<Vec<_>>()
    );
}

// ---- adaptive concurrency, Retry-After for the whole pool, trace context ----

/// An endpoint that serves 20 requests at once and answers 429 above that, each taking
/// 5 ms plus 0.5 ms per request in flight (its latency grows with load). With
/// `ACKD_HTTP_CONCURRENCY_MODE=adaptive` (up to 64) and 64 calls wanted at once (4
/// partitions, 16 each), the limit on the summary lines grows from its start (4) past 12
/// and settles at most near 20 (its median after the first second from 5 to 21: where
/// exactly is the machine's latency, a figure for the bench), at most 1% of requests get
/// a 429, and every message is processed once and committed.
#[test]
fn adaptive_concurrency_settles_near_the_endpoints_capacity() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let (topic, group) = fresh_topic("http-adaptive", 4);
    let (in_flight, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (busy, no) = (in_flight.clone(), refused.clone());
    let endpoint = Endpoint::start(move |_, _| {
        let n = busy.fetch_add(1, SeqCst) + 1;
        let response = if n > 20 {
            no.fetch_add(1, SeqCst);
            status(429, "full")
        } else {
            thread::sleep(Duration::from_micros(5_000 + 500 * n as u64));
            ok()
        };
        busy.fetch_sub(1, SeqCst);
        response
    });
    let n = 6000;
    let delivered = produce_keyed(&topic, n, 0);
    let health = free_port();
    let ackd = http_ackd(&topic, &group, &endpoint.url())
        .env("ACKD_HEALTH_PORT", health.to_string())
        .env("ACKD_HEALTH_ADDR", "127.0.0.1")
        .env("ACKD_HTTP_BODY", "raw")
        .env("ACKD_HTTP_CONCURRENCY", "64")
        .env("ACKD_HTTP_CONCURRENCY_MODE", "adaptive")
        .env("ACKD_ORDERING", "none")
        .env("ACKD_CONCURRENCY", "16")
        .env("ACKD_METRICS_INTERVAL_MS", "250")
        .spawn();
    ackd.wait_for_count(is_processed, n, Duration::from_secs(180));
    let scraped = scraped_gauge(health, "ackd_http_limit");
    // What the limit adapted to, not its ceiling (64).
    assert!((1..=24).contains(&scraped), "{scraped}");
    let lines = ackd.stop(0, WAIT);
    // The limit of each summary with requests answered in its interval.
    let limits = summary_samples(&lines, "sample#ackd.http.limit");
    assert!(limits.len() > 4, "{limits:?}");
    let settled = &limits[4..];
    let median = median_after(&limits, 4);
    let requests = endpoint.requests().len();
    let refused = refused.load(SeqCst);
    eprintln!(
        "adaptive: limits={limits:?} median={median} requests={requests} refused_429={refused}"
    );
    assert!(
        limits.iter().any(|l| *l >= 12),
        "the limit grew: {limits:?}"
    );
    assert!((5..=21).contains(&median), "{limits:?}");
    assert!(
        settled.iter().all(|l| *l <= 24),
        "never far above the capacity: {limits:?}"
    );
    assert!(
        refused * 100 <= requests,
        "{refused} of {requests} requests answered 429"
    );
    let counts = processed_counts(&lines);
    assert_eq!(counts.len(), n);
    assert!(counts.values().all(|c| *c == 1), "each processed once");
    assert_committed_to_ends(&group, &topic, 4, &log_ends(&delivered));
}

/// 4 partitions and 4 requests at once (fixed): one request, the 30th, gets a 429 with
/// `Retry-After: 1`. In the second after the endpoint answered it, only requests ackd
/// had sent before it read the answer arrive: at most one per other partition (each
/// has at most one in flight), none of the refused message's partition. Every message
/// is processed once.
#[test]
fn a_retry_after_holds_back_every_request_to_the_endpoint() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let (topic, group) = fresh_topic("http-pause", 4);
    let count = Arc::new(AtomicUsize::new(0));
    let refused_at: Arc<Mutex<Option<(Instant, i32)>>> = Arc::default();
    let (c, at_) = (count.clone(), refused_at.clone());
    let endpoint = Endpoint::start(move |r, _| {
        if c.fetch_add(1, SeqCst) == 29 {
            *at_.lock().unwrap() = Some((Instant::now(), r.position().0));
            let mut resp = status(429, "slow down");
            resp.headers.push(("Retry-After".into(), "1".into()));
            return resp;
        }
        Response {
            delay: Duration::from_millis(2),
            ..ok()
        }
    });
    let n = 200;
    let delivered = produce_keyed(&topic, n, 0);
    let ackd = http_ackd(&topic, &group, &endpoint.url())
        .env("ACKD_HTTP_CONCURRENCY", "4")
        .env("ACKD_RETRY_MAX_MS", "5000")
        .spawn();
    ackd.wait_for_count(is_processed, n, WAIT);
    let lines = ackd.stop(0, WAIT);
    let (refused, partition) = refused_at.lock().unwrap().expect("a 429 was sent");
    let within: Vec<(i32, i64)> = endpoint
        .requests()
        .iter()
        .filter(|r| r.at > refused && r.at < refused + Duration::from_secs(1))
        .map(Request::position)
        .collect();
    eprintln!("within the Retry-After: {within:?}");
    let mut partitions: Vec<i32> = within.iter().map(|p| p.0).collect();
    partitions.sort_unstable();
    partitions.dedup();
    assert!(
        within.len() <= 3 && partitions.len() == within.len(),
        "{within:?}"
    );
    assert!(!partitions.contains(&partition), "{within:?}");
    let counts = processed_counts(&lines);
    assert_eq!(counts.len(), n);
    assert!(counts.values().all(|c| *c == 1));
    assert_committed_to_ends(&group, &topic, 4, &log_ends(&delivered));
}

/// A message's `traceparent` and `tracestate` Kafka headers arrive as HTTP headers of
/// the same names, with raw and json bodies; a message without them sends none.
#[test]
fn trace_context_headers_become_http_headers() {
    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const STATE: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";
    for body in ["raw", "json"] {
        let (topic, group) = fresh_topic(&format!("http-trace-{body}"), 1);
        let endpoint = Endpoint::start(|_, _| ok());
        let traced: &[(&str, &[u8])] = &[
            ("traceparent", PARENT.as_bytes()),
            ("tracestate", STATE.as_bytes()),
        ];
        produce_values(&topic, &[(None, b"a", traced), (None, b"b", &[])]);
        let ackd = http_ackd(&topic, &group, &endpoint.url())
            .env("ACKD_HTTP_BODY", body)
            .spawn();
        ackd.wait_for_count(is_processed, 2, WAIT);
        ackd.stop(0, WAIT);
        let requests = endpoint.requests();
        assert_eq!(requests.len(), 2, "{body}");
        assert_eq!(requests[0].header("traceparent"), Some(PARENT), "{body}");
        assert_eq!(requests[0].header("tracestate"), Some(STATE), "{body}");
        assert_eq!(requests[1].header("traceparent"), None, "{body}");
        assert_eq!(requests[1].header("tracestate"), None, "{body}");
    }
}

/// Adaptive mode keeps the stop's promise: 6 partitions against an endpoint that holds
/// every request until the stop began, the limit at its start (4): 4 requests sent, 2
/// partitions' calls waiting for a permit. On SIGTERM the requests sent are answered,
/// acknowledged and committed (exit 0, drain complete); those waiting are dropped
/// unsent: no request is posted after the signal. A restart posts the rest: each
/// message posted once.
#[test]
fn sigterm_in_adaptive_mode_drains_the_requests_sent_and_drops_those_waiting() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let (topic, group) = fresh_topic("http-adaptive-stop", 6);
    let open = Arc::new(AtomicBool::new(false));
    let gate = open.clone();
    let endpoint = Endpoint::start(move |_, _| {
        while !gate.load(SeqCst) {
            thread::sleep(Duration::from_millis(5));
        }
        // Answered well after the stop began: the waiting calls were dropped by then.
        Response {
            delay: Duration::from_millis(100),
            ..ok()
        }
    });
    produce_five_in_each_of_six(&topic);
    let adaptive = || {
        http_ackd(&topic, &group, &endpoint.url())
            .env("ACKD_HTTP_CONCURRENCY_MODE", "adaptive")
            .env("ACKD_HTTP_CONCURRENCY", "64")
            .env("ACKD_HTTP_TIMEOUT_MS", "3000")
            .env("ACKD_SHUTDOWN_TIMEOUT_MS", "5000")
    };
    let first = adaptive().spawn();
    wait_until(WAIT, || endpoint.requests().len() >= 4);
    first.sigterm();
    first.wait_for_line(|l| at(l, "shutdown_begun"), WAIT);
    open.store(true, SeqCst);
    first.assert_exit(0, WAIT);
    let lines = first.lines();
    let all = lines.join("\n");
    assert!(
        lines
            .iter()
            .any(|l| at(l, "drained") && field(l, "complete").as_deref() == Some("true")),
        "{all}"
    );
    let mut posted: Vec<(i32, i64)> = endpoint.requests().iter().map(|r| r.position()).collect();
    assert_eq!(
        posted.len(),
        4,
        "only the 4 requests sent were finished: {posted:?}\n{all}"
    );
    let acked = acked_as_posted(&lines, &mut posted);
    committed_as_acked_then_the_rest_once(&group, &topic, &acked, &open, adaptive(), &endpoint);
}

/// An `ACKD_HTTP_CONCURRENCY_MODE` other than fixed or adaptive is a configuration
/// error naming it (exit 78).
#[test]
fn a_bad_concurrency_mode_is_a_configuration_error() {
    let ackd = AckdBuilder::without_broker("t", "g")
        .env("ACKD_PROCESSOR", "http")
        .env("ACKD_HTTP_URL", "http://127.0.0.1:1/")
        .env("ACKD_HTTP_CONCURRENCY_MODE", "auto")
        .spawn();
    let line = ackd.assert_config_error("ACKD_HTTP_CONCURRENCY_MODE", WAIT);
    assert!(line.contains("adaptive"), "{line}");
}
