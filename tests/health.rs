//! The health endpoint (`ACKD_HEALTH_PORT`) as an orchestrator and a scraper see it,
//! against the real broker and the real binary, read with a plain HTTP/1.1 client over
//! `TcpStream`: `/ready` 503 before the first assignment and while stopping, 200 while
//! consuming; `/live` 200 while idle or consuming, 503 naming the partition whose
//! processor call is stuck, 200 again once it returns; `/metrics` parses as Prometheus
//! text (checked by a parser here) and counts exactly what was produced; and nothing
//! listens when the port is not set.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{ackd::*, lines::*, offsets::*, produce::*, spawn::*, stamped::*, topics::*, wait::*};

const WAIT: Duration = Duration::from_secs(60);

/// One response: status, head (status line and headers), body.
struct Reply {
    status: u16,
    head: String,
    body: String,
}

/// `GET path` on 127.0.0.1:`port`, one request per connection.
fn get(port: u16, path: &str) -> std::io::Result<Reply> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no end of head in {raw:?}")))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {head:?}")))?;
    Ok(Reply {
        status,
        head: head.to_string(),
        body: body.to_string(),
    })
}

#[track_caller]
fn get_ok(port: u16, path: &str) -> Reply {
    get(port, path).unwrap_or_else(|e| panic!("GET {path} on port {port}: {e}"))
}

fn json(reply: &Reply) -> serde_json::Value {
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("{}: {e}", reply.body))
}

/// One sample of the Prometheus text format.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the Prometheus text exposition format 0.0.4 strictly enough to fail on what a
/// scraper refuses: every sample's family declared by `# TYPE` before it, valid metric
/// and label names, quoted and escaped label values, numeric values, counters named
/// `_total`, histogram buckets cumulative and ending in `+Inf` = `_count`.
fn parse_prometheus(text: &str) -> (HashMap<String, String>, Vec<Sample>) {
    fn valid_name(n: &str) -> bool {
        let mut chars = n.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }
    assert!(text.ends_with('\n'), "the text ends with a newline");
    let mut types: HashMap<String, String> = HashMap::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(comment) = line.strip_prefix("# ") {
            let mut parts = comment.splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("TYPE"), Some(name), Some(kind)) => {
                    assert!(valid_name(name), "{line}");
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                        "{line}"
                    );
                    assert!(
                        types.insert(name.to_string(), kind.to_string()).is_none(),
                        "TYPE twice: {line}"
                    );
                }
                (Some("HELP"), Some(name), _) => assert!(valid_name(name), "{line}"),
                _ => {}
            }
            continue;
        }
        assert!(!line.is_empty(), "no empty lines");
        let (series, rest) = match line.find('{') {
            Some(_) => {
                let close = line.rfind('}').unwrap_or_else(|| panic!("{line}"));
                (&line[..=close], line[close + 1..].trim_start())
            }
            None => line.split_once(' ').unwrap_or_else(|| panic!("{line}")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, parse_labels(labels.trim_end_matches('}'), line)),
            None => (series, BTreeMap::new()),
        };
        assert!(valid_name(name), "bad metric name in {line}");
        let value = rest.split(' ').next().unwrap_or_default();
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        let family = types
            .keys()
            .filter(|f| {
                name == f.as_str()
                    || ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|s| name.strip_suffix(s) == Some(f.as_str()))
            })
            .max_by_key(|f| f.len())
            .unwrap_or_else(|| panic!("no TYPE before {line}"));
        if types[family] == "counter" {
            assert!(name.ends_with("_total"), "counter without _total: {line}");
            assert!(value >= 0.0, "{line}");
        }
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    for (family, _) in types.iter().filter(|(_, k)| *k == "histogram") {
        let buckets: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.name == format!("{family}_bucket"))
            .collect();
        assert!(!buckets.is_empty(), "{family} has no buckets");
        assert!(
            buckets.windows(2).all(|w| w[0].value <= w[1].value),
            "{family}: buckets are cumulative"
        );
        let last = buckets.last().unwrap();
        assert_eq!(last.labels.get("le").map(String::as_str), Some("+Inf"));
        let count = samples
            .iter()
            .find(|s| s.name == format!("{family}_count"))
            .unwrap_or_else(|| panic!("{family}_count"));
        assert_eq!(last.value, count.value, "{family}: +Inf bucket = count");
        assert!(samples.iter().any(|s| s.name == format!("{family}_sum")));
    }
    (types, samples)
}

fn parse_labels(text: &str, line: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (name, after) = rest
            .split_once("=\"")
            .unwrap_or_else(|| panic!("label in {line}"));
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    _ => panic!("bad escape in {line}"),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("unterminated label value in {line}"),
            }
        };
        labels.insert(name.to_string(), value);
        rest = after[end + 1..].trim_start_matches(',');
    }
    labels
}

fn sample(samples: &[Sample], name: &str) -> f64 {
    samples
        .iter()
        .find(|s| s.name == name && s.labels.is_empty())
        .unwrap_or_else(|| panic!("no {name}"))
        .value
}

/// Scrapes `/metrics`, checks its format, returns its samples.
fn scrape(port: u16) -> Vec<Sample> {
    let reply = get_ok(port, "/metrics");
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(
        reply
            .head
            .to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{}",
        reply.head
    );
    parse_prometheus(&reply.body).1
}

/// TCP ports `pid` listens on: its socket inodes (from /proc/<pid>/fd) in LISTEN state
/// in /proc/net/tcp{,6}.
fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("read ackd's fds")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for row in text.lines().skip(1) {
            let cols: Vec<&str> = row.split_whitespace().collect();
            if cols.len() > 9 && cols[3] == "0A" && inodes.contains(cols[9]) {
                let port = cols[1].rsplit(':').next().unwrap_or_default();
                ports.push(u16::from_str_radix(port, 16).expect("hex port"));
            }
        }
    }
    ports
}

/// `/ready` is 503 while ackd waits for its topic (no assignment yet) and 200 once it
/// consumes; `/live` is 200 throughout; `/metrics` counts every message produced, once,
/// and the summary lines (the l2met vocabulary) add up to the same numbers.
#[test]
fn ready_follows_the_assignment_and_metrics_count_what_was_produced() {
    let topic = unique_name("health-ready");
    let group = unique_name("g-health-ready");
    let port = free_port();
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "noop")
        .env("ACKD_WAIT_FOR_TOPICS", "true")
        .env("ACKD_HEALTH_PORT", port.to_string())
        .env("ACKD_HEALTH_ADDR", "127.0.0.1")
        .env("ACKD_METRICS_INTERVAL_MS", "500")
        .spawn();
    ackd.wait_for_line(|l| at(l, "health_listening"), WAIT);
    ackd.wait_for_line(|l| at(l, "waiting_for_topics"), WAIT);
    // The check that the default test relies on finds this listener.
    assert_eq!(listening_ports(ackd.pid()), vec![port]);

    let ready = get_ok(port, "/ready");
    assert_eq!(ready.status, 503, "{}", ready.body);
    assert_eq!(json(&ready)["reason"], "not in the group yet");
    let live = get_ok(port, "/live");
    assert_eq!(live.status, 200, "idle is live: {}", live.body);
    let before = scrape(port);
    assert_eq!(sample(&before, "ackd_processed_total"), 0.0);
    assert_eq!(sample(&before, "ackd_partitions"), 0.0);

    create_topic(&topic, 3);
    let started = Instant::now();
    wait_until(WAIT, || get(port, "/ready").is_ok_and(|r| r.status == 200));
    let became_ready = started.elapsed();
    // Lines reach us through a writer thread and a pipe, so the line may come after the
    // 200: it must come, though.
    ackd.wait_for_count(|l| at(l, "assigned"), 3, WAIT);
    assert_eq!(json(&get_ok(port, "/ready"))["partitions"], 3);

    let delivered = produce_keyed(&topic, 500, 0);
    wait_until(WAIT, || {
        sample(&scrape(port), "ackd_processed_total") == delivered.len() as f64
    });
    let live = get_ok(port, "/live");
    assert_eq!(live.status, 200, "{}", live.body);
    let m = scrape(port);
    assert_eq!(sample(&m, "ackd_received_total"), 500.0);
    assert_eq!(sample(&m, "ackd_failed_total"), 0.0);
    assert_eq!(sample(&m, "ackd_partitions"), 3.0);
    assert!(sample(&m, "ackd_process_duration_seconds_count") > 0.0);
    // Lag per partition, from the summaries' statistics: every partition, caught up.
    wait_until(WAIT, || {
        let m = scrape(port);
        let lags: Vec<&Sample> = m.iter().filter(|s| s.name == "ackd_lag").collect();
        lags.len() == 3
            && lags
                .iter()
                .all(|s| s.labels["topic"] == topic && s.value == 0.0)
    });
    wait_until(WAIT, || sample(&scrape(port), "ackd_commits_total") >= 1.0);
    // What a scraper saw, for the record (run with --nocapture).
    let seen = get_ok(port, "/metrics").body;
    let seen: Vec<&str> = seen
        .lines()
        .filter(|l| !l.starts_with('#') && !l.contains("_bucket"))
        .collect();
    eprintln!("health ready: /metrics samples:\n  {}", seen.join("\n  "));

    ackd.sigterm();
    let code = ackd.wait_exit(WAIT);
    assert_eq!(code, 0, "{}", ackd.lines().join("\n"));
    let lines = ackd.lines();
    let summarized: u64 = lines
        .iter()
        .filter(|l| at(l, "summary"))
        .filter_map(|l| field(l, "count#ackd.processed")?.parse::<u64>().ok())
        .sum();
    assert_eq!(summarized, 500, "the summaries count what /metrics counted");
    assert_committed_to_ends(&group, &topic, 3, &log_ends(&delivered));
    eprintln!(
        "health ready: produced=500 metrics_processed=500 summaries_processed={summarized} \
         ready_after_topic_ms={} exit={code}",
        became_ready.as_millis()
    );
}

/// A processor call that runs past `ACKD_HEALTH_STUCK_MS` makes `/live` 503 naming its
/// partition and offset (the other partition, idle, is not named); once the call returns
/// `/live` is 200 again. A SIGTERM during a stuck call makes `/ready` 503 (stopping) while
/// the drain waits for it; the call finishes and is committed: exit 0.
#[test]
fn a_stuck_processor_call_fails_live_naming_its_partition() {
    let (topic, group) = fresh_topic("health-stuck", 2);
    let port = free_port();
    let delay = Duration::from_millis(4000);
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "slow")
        .env("ACKD_TEST_DELAY_MS", delay.as_millis().to_string())
        .env("ACKD_HEALTH_PORT", port.to_string())
        .env("ACKD_HEALTH_ADDR", "127.0.0.1")
        .env("ACKD_HEALTH_STUCK_MS", "1000")
        .spawn();
    wait_until(WAIT, || {
        get(port, "/ready").is_ok_and(|r| r.status == 200 && json(&r)["partitions"] == 2)
    });
    let live = get_ok(port, "/live");
    assert_eq!(live.status, 200, "idle workers are live: {}", live.body);

    let stuck_on = |partition: i32, offset: i64| {
        move |r: &Reply| {
            r.status == 503
                && json(r)["stuck"].as_array().is_some_and(|s| {
                    s.len() == 1 && s[0]["partition"] == partition && s[0]["offset"] == offset
                })
        }
    };
    let produced_at = Instant::now();
    let first = produce_records(&topic, &[(1, Some(b"k"), b"slow one", &[])]);
    assert_eq!(first, vec![(1, 0)]);
    let mut stuck_body = String::new();
    wait_until(WAIT, || match get(port, "/live") {
        Ok(r) if stuck_on(1, 0)(&r) => {
            stuck_body = r.body;
            true
        }
        _ => false,
    });
    let stuck_seen = produced_at.elapsed();
    let body: serde_json::Value = serde_json::from_str(&stuck_body).unwrap();
    assert_eq!(body["stuck"][0]["topic"], topic.as_str());
    assert!(
        body["stuck"][0]["in_call_ms"].as_u64().unwrap() > 1000,
        "{stuck_body}"
    );
    // Back to live once the call returns (it acknowledges after the delay).
    wait_until(WAIT, || get(port, "/live").is_ok_and(|r| r.status == 200));
    let recovered = produced_at.elapsed();
    // Live again only once the call returned: not before its delay, and with its
    // message acknowledged (its line may reach us after the 200: it must come).
    assert!(recovered >= delay, "recovered after {recovered:?}");
    ackd.wait_for_line(
        |l| {
            is_processed(l)
                && field(l, "partition").as_deref() == Some("1")
                && field(l, "offset").as_deref() == Some("0")
        },
        WAIT,
    );

    // Stuck again, on partition 0; stop meanwhile.
    produce_records(&topic, &[(0, Some(b"k"), b"slow two", &[])]);
    wait_until(WAIT, || {
        get(port, "/live").is_ok_and(|r| stuck_on(0, 0)(&r))
    });
    ackd.sigterm();
    let mut stopping_seen = false;
    wait_until(WAIT, || match get(port, "/ready") {
        Ok(r) if r.status == 503 => {
            stopping_seen = json(&r)["reason"] == "stopping";
            true
        }
        Ok(_) => false,
        // Gone already: the check below fails.
        Err(_) => true,
    });
    assert!(stopping_seen, "/ready said stopping while the drain waited");
    let code = ackd.wait_exit(WAIT);
    assert_eq!(code, 0, "{}", ackd.lines().join("\n"));
    let committed = committed(&group, &topic, 2);
    assert_eq!(committed[&0], Some(1));
    assert_eq!(committed[&1], Some(1));
    eprintln!(
        "health stuck: delay_ms={} stuck_after_ms=1000 stuck_seen_after_ms={} live_again_after_ms={} \
         committed={committed:?} exit={code} live_body={}",
        delay.as_millis(),
        stuck_seen.as_millis(),
        recovered.as_millis(),
        stuck_body.trim()
    );
}

/// Off by default: without ACKD_HEALTH_PORT ackd listens on no port at all.
#[test]
fn nothing_listens_by_default() {
    let (topic, group) = fresh_topic("health-off", 1);
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "noop")
        .spawn();
    ackd.wait_for_line(|l| at(l, "assigned"), WAIT);
    assert_eq!(listening_ports(ackd.pid()), Vec::<u16>::new());
    assert!(!ackd.lines().iter().any(|l| at(l, "health_listening")));
    ackd.stop(0, WAIT);
}

/// A port that cannot be listened on is a configuration error naming the setting: exit
/// 78. (The port is bound once the partitions are counted: without a broker that count
/// waits 10 s first, so this test uses the broker.)
#[test]
fn a_port_in_use_is_a_config_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let ackd = AckdBuilder::new("any-topic", "any-group")
        .env("ACKD_HEALTH_PORT", port.to_string())
        .env("ACKD_HEALTH_ADDR", "127.0.0.1")
        .spawn();
    let line = ackd.assert_config_error("ACKD_HEALTH_PORT", WAIT);
    assert_eq!(field(&line, "value"), Some(port.to_string()));
    let bad = AckdBuilder::new("any-topic", "any-group")
        .env("ACKD_HEALTH_PORT", "70000")
        .spawn();
    bad.assert_config_error("ACKD_HEALTH_PORT", WAIT);
}

/// Counters survive a rebalance: when a second process joins and takes partitions away,
/// the first one's `/metrics` totals never go down (the revoked partitions' counts stay
/// in them), its `ackd_partitions` gauge drops, and the two processes' totals add up to
/// exactly what was produced (cooperative rebalance, committed on revoke: nothing twice).
#[test]
fn metrics_totals_survive_a_rebalance() {
    let (topic, group) = fresh_topic("health-rebalance", 4);
    let (port_a, port_b) = (free_port(), free_port());
    let spawn = |port: u16| {
        AckdBuilder::new(&topic, &group)
            .env("ACKD_PROCESSOR", "noop")
            .env("ACKD_HEALTH_PORT", port.to_string())
            .env("ACKD_HEALTH_ADDR", "127.0.0.1")
            .spawn()
    };
    let a = spawn(port_a);
    wait_until(WAIT, || {
        get(port_a, "/ready").is_ok_and(|r| r.status == 200 && json(&r)["partitions"] == 4)
    });
    let first = produce_keyed(&topic, 400, 0);
    wait_until(WAIT, || {
        sample(&scrape(port_a), "ackd_processed_total") == 400.0
    });

    let b = spawn(port_b);
    let mut last = 400.0;
    let mut scrapes = 0;
    wait_until(WAIT, || {
        let m = scrape(port_a);
        let processed = sample(&m, "ackd_processed_total");
        assert!(processed >= last, "went down from {last} to {processed}");
        last = processed;
        scrapes += 1;
        sample(&m, "ackd_partitions") < 4.0 && get(port_b, "/ready").is_ok_and(|r| r.status == 200)
    });
    let second = produce_keyed(&topic, 400, 400);
    let total = |port| sample(&scrape(port), "ackd_processed_total");
    wait_until(WAIT, || total(port_a) + total(port_b) == 800.0);
    let (on_a, on_b) = (total(port_a), total(port_b));
    assert!(on_b > 0.0, "the second process got messages");
    let revoked = a.lines().iter().filter(|l| at(l, "revoked")).count();
    a.sigterm();
    b.sigterm();
    a.assert_exit(0, WAIT);
    b.assert_exit(0, WAIT);
    let delivered: Vec<Delivered> = first.into_iter().chain(second).collect();
    assert_committed_to_ends(&group, &topic, 4, &log_ends(&delivered));
    eprintln!(
        "health rebalance: produced=800 process_a={on_a} process_b={on_b} \
         revoked_on_a={revoked} scrapes_during_rebalance={scrapes}"
    );
}

/// With more processes than partitions, the one the group gave nothing is ready too (it
/// is in the group, and takes partitions over when another leaves), so an orchestrator
/// waiting for every replica (a rollout) does not wait forever.
#[test]
fn a_member_without_partitions_is_ready() {
    let (topic, group) = fresh_topic("health-idle", 1);
    let member = |port: u16| {
        AckdBuilder::new(&topic, &group)
            .env("ACKD_PROCESSOR", "noop")
            .env("ACKD_HEALTH_PORT", port.to_string())
            .env("ACKD_HEALTH_ADDR", "127.0.0.1")
            .spawn()
    };
    let (port_a, port_b) = (free_port(), free_port());
    let a = member(port_a);
    a.wait_for_line(|l| at(l, "assigned"), WAIT);
    let b = member(port_b);
    // Both ready: one with the partition, one with none.
    wait_until(WAIT, || {
        [port_a, port_b]
            .iter()
            .all(|p| get(*p, "/ready").is_ok_and(|r| r.status == 200))
    });
    let partitions: Vec<serde_json::Value> = [port_a, port_b]
        .iter()
        .map(|p| json(&get_ok(*p, "/ready"))["partitions"].clone())
        .collect();
    let mut held: Vec<i64> = partitions.iter().map(|v| v.as_i64().unwrap()).collect();
    held.sort_unstable();
    assert_eq!(
        held,
        vec![0, 1],
        "one member holds the partition: {partitions:?}"
    );
    for p in [&a, &b] {
        p.sigterm();
    }
    a.assert_exit(0, WAIT);
    b.assert_exit(0, WAIT);
    eprintln!("health idle member: partitions held {held:?}, both ready, both exit 0");
}

/// ackd with the endpoint on 127.0.0.1:`port`, waiting for a topic that does not exist
/// (no broker work needed to keep the endpoint up).
fn endpoint_only(name: &str, port: u16) -> AckdProcess {
    let ackd = AckdBuilder::new(&unique_name(name), &unique_name(&format!("g-{name}")))
        .env("ACKD_PROCESSOR", "noop")
        .env("ACKD_WAIT_FOR_TOPICS", "true")
        .env("ACKD_HEALTH_PORT", port.to_string())
        .env("ACKD_HEALTH_ADDR", "127.0.0.1")
        .spawn();
    ackd.wait_for_line(|l| at(l, "health_listening"), WAIT);
    ackd
}

/// 40 connections that send nothing (more than the endpoint serves at once) do not
/// starve a probe: the new connection makes room by closing the oldest idle one, and
/// `/live` answers 200 while the other idle connections stay open.
#[test]
fn a_probe_is_answered_while_many_idle_connections_are_open() {
    let port = free_port();
    let ackd = endpoint_only("health-starve", port);
    let idle: Vec<TcpStream> = (0..40)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).expect("connect"))
        .collect();
    let asked = Instant::now();
    let probe = get(port, "/live");
    let answered_ms = asked.elapsed().as_millis();
    let seen = match &probe {
        Ok(r) => format!("status={}", r.status),
        Err(e) => format!("error={e}"),
    };
    eprintln!(
        "health starve: idle_connections={} probe {seen} after_ms={answered_ms}",
        idle.len()
    );
    let probe = probe.unwrap_or_else(|e| panic!("/live with 40 idle connections open: {e}"));
    assert_eq!(probe.status, 200, "{}", probe.body);
    drop(idle);
    ackd.stop(0, WAIT);
}

/// Reads until the server closes `s` (EOF or a reset), at most `bound`: what it sent,
/// and after how long it closed. Panics if it did not close within `bound`.
fn read_until_closed(s: &mut TcpStream, bound: Duration) -> (String, Duration) {
    let started = Instant::now();
    s.set_read_timeout(Some(bound)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("not closed within {bound:?}: {e}"),
        }
        assert!(started.elapsed() < bound, "not closed within {bound:?}");
    }
    (
        String::from_utf8_lossy(&got).into_owned(),
        started.elapsed(),
    )
}

/// The server closes a connection that sends nothing, one that dribbles a request head
/// a line at a time, and a keep-alive connection idle after its answer, each within a
/// few seconds (bounded here at 30 s; the line printed says how long each took).
#[test]
fn idle_and_slow_connections_are_closed_within_seconds() {
    let bound = Duration::from_secs(30);
    let port = free_port();
    let ackd = endpoint_only("health-idle-close", port);

    let mut silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (sent, silent_after) = read_until_closed(&mut silent, bound);
    assert!(
        !sent.contains(" 200 "),
        "nothing asked, nothing answered: {sent}"
    );

    let mut kept = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(kept, "GET /live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let (answer, kept_after) = read_until_closed(&mut kept, bound);
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");

    let mut slow = TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let started = Instant::now();
    write!(slow, "GET /live HTTP/1.1\r\n").unwrap();
    let mut buf = [0u8; 1024];
    let slow_after = loop {
        assert!(
            started.elapsed() < bound,
            "slow head not cut off within {bound:?}"
        );
        // A header line every half second: the head never ends.
        if write!(slow, "X-Slow: {}\r\n", started.elapsed().as_millis()).is_err() {
            break started.elapsed();
        }
        match slow.read(&mut buf) {
            Ok(0) => break started.elapsed(),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break started.elapsed(),
            // A 408 or the like before the close.
            Ok(_) | Err(_) => {}
        }
    };
    eprintln!(
        "health idle close: silent_closed_after_ms={} keep_alive_closed_after_ms={} \
         slow_head_closed_after_ms={}",
        silent_after.as_millis(),
        kept_after.as_millis(),
        slow_after.as_millis()
    );
    ackd.stop(0, WAIT);
}

/// An exec handler that takes `seconds` a message, in a fresh directory.
fn slow_exec_handler(name: &str, seconds: f64) -> String {
    let dir = fresh_dir(name);
    let handler = dir.join("handler.py");
    std::fs::write(
        &handler,
        format!("import json, sys, time\nfor line in sys.stdin:\n    m = json.loads(line)\n    time.sleep({seconds})\n    print(json.dumps({{\"ack\": True, \"offset\": m[\"offset\"]}}), flush=True)\n"),
    )
    .unwrap();
    format!("python3 {}", handler.display())
}

/// ackd with `command` on one exec child (a 1 s exec timeout: stuck after 6 s), its
/// health endpoint on `port`.
fn on_one_exec_child(topic: &str, group: &str, command: &str, port: u16) -> AckdBuilder {
    AckdBuilder::new(topic, group)
        .env("ACKD_PROCESSOR", "exec")
        .env("ACKD_EXEC_COMMAND", command)
        .env("ACKD_EXEC_TIMEOUT_MS", "1000")
        .env("ACKD_EXEC_CONCURRENCY", "1")
        .env("ACKD_HEALTH_PORT", port.to_string())
        .env("ACKD_HEALTH_ADDR", "127.0.0.1")
}

/// Once the endpoint listens, polls `/live` and `ackd_in_flight` until `n` messages are
/// acknowledged, then stops ackd (exit 0). `/live` must have answered 200 each time (a
/// refused or timed-out probe fails as a 503 would), at least once per message. Returns
/// the polls and the in-flight counts seen.
fn live_through_backlog(ackd: &AckdProcess, port: u16, n: usize) -> (usize, Vec<u64>) {
    ackd.wait_for_line(|l| at(l, "health_listening"), WAIT);
    let mut polls = 0;
    let mut not_live = Vec::new();
    let mut in_flight_seen = Vec::new();
    wait_until(WAIT, || {
        polls += 1;
        match get(port, "/live") {
            Ok(r) if r.status == 200 => {}
            Ok(r) => not_live.push(format!("{}: {}", r.status, r.body)),
            Err(e) => not_live.push(format!("no answer: {e}")),
        }
        in_flight_seen.push(sample(&scrape(port), "ackd_in_flight") as u64);
        ackd.lines().iter().filter(|l| is_processed(l)).count() == n
    });
    ackd.sigterm();
    let code = ackd.wait_exit(WAIT);
    assert_eq!(code, 0, "{}", ackd.lines().join("\n"));
    assert!(
        not_live.is_empty(),
        "/live failed {} of {polls}: {not_live:?}",
        not_live.len()
    );
    assert!(
        polls >= n,
        "/live polled {polls} times through {n} messages"
    );
    in_flight_seen.sort_unstable();
    in_flight_seen.dedup();
    (polls, in_flight_seen)
}

/// A backlog behind one exec child (key ordering, 16 calls a partition,
/// 0.5 s a message, a 1 s exec timeout: stuck after 6 s) is no stuck call: `/live` stays
/// 200 throughout a run of 30 messages (15 s), polled until the last is acknowledged.
#[test]
fn a_backlog_behind_one_exec_child_is_live_while_every_call_ends_in_time() {
    let (topic, group) = fresh_topic("health-backlog", 1);
    let command = slow_exec_handler("health-backlog", 0.5);
    let port = free_port();
    let keys: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
    let records: Vec<Record<'_>> = keys
        .iter()
        .map(|k| (0, Some(k.as_bytes()), k.as_bytes(), &[][..]))
        .collect();
    produce_records(&topic, &records);
    let ackd = on_one_exec_child(&topic, &group, &command, port)
        .env("ACKD_ORDERING", "key")
        .env("ACKD_CONCURRENCY", "16")
        .spawn();
    let (polls, in_flight_seen) = live_through_backlog(&ackd, port, 30);
    // In flight are the calls the child has: one at a time, the rest wait.
    assert!(
        in_flight_seen.contains(&1) && in_flight_seen.iter().all(|n| *n <= 1),
        "ackd_in_flight seen: {in_flight_seen:?}"
    );
    assert_committed(&group, &topic, 0, Some(30));
    eprintln!("health backlog: live_polls={polls} not_live=0");
}

/// The same under partition ordering (the default): 16 partitions share one exec
/// child (0.5 s a message, a 1 s exec timeout: stuck after 6 s), so each partition's
/// one call waits about 7.5 s for it. That wait is no stuck call: `/live` stays 200
/// throughout the run (32 messages), and in flight is the one call the child has.
#[test]
fn partitions_waiting_for_one_exec_child_are_live_while_every_call_ends_in_time() {
    let (topic, group) = fresh_topic("health-partition-backlog", 16);
    let command = slow_exec_handler("health-partition-backlog", 0.5);
    let port = free_port();
    let values: Vec<(i32, String)> = (0..16)
        .flat_map(|p| (0..2).map(move |i| (p, format!("p{p}-{i}"))))
        .collect();
    let records: Vec<Record<'_>> = values
        .iter()
        .map(|(p, v)| (*p, None, v.as_bytes(), &[][..]))
        .collect();
    produce_records(&topic, &records);
    let ackd = on_one_exec_child(&topic, &group, &command, port)
        .env("ACKD_ORDERING", "partition")
        .spawn();
    let (polls, in_flight_seen) = live_through_backlog(&ackd, port, 32);
    assert!(
        in_flight_seen.iter().all(|n| *n <= 1),
        "ackd_in_flight seen: {in_flight_seen:?}"
    );
    let committed = committed(&group, &topic, 16);
    assert!(committed.values().all(|c| *c == Some(2)), "{committed:?}");
    eprintln!("health partition backlog: live_polls={polls} not_live=0");
}

/// The lag in seconds, on the summary lines and on `/metrics`: a backlog whose messages
/// have known timestamps (an hour old, 100 ms apart), processed slowly one at a time:
/// every line is within a second of the age of the message it names as the next to
/// process, every scrape reports what a summary said, and both say 0 once caught up.
#[test]
fn lag_in_seconds_is_the_age_of_the_next_message_to_process() {
    let (topic, group) = fresh_topic("lag-secs", 1);
    let start = epoch_ms() - 3_600_000;
    let stamps: Vec<i64> = (0..30).map(|i| start + i * 100).collect();
    produce_at(&topic, 0, &stamps);
    let port = free_port();
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "slow")
        .env("ACKD_TEST_DELAY_MS", "150")
        .env("ACKD_METRICS_INTERVAL_MS", "200")
        .env("ACKD_HEALTH_PORT", port.to_string())
        .env("ACKD_HEALTH_ADDR", "127.0.0.1")
        .spawn();
    ackd.wait_for_line(|l| at(l, "health_listening"), WAIT);
    // Scraped while the backlog lasts: (messages, seconds) of the partition.
    let mut scraped = Vec::new();
    wait_until(WAIT, || {
        let m = scrape(port);
        let of = |name: &str| m.iter().find(|s| s.name == name).map(|s| s.value);
        if let (Some(lag), Some(seconds)) = (of("ackd_lag"), of("ackd_lag_seconds")) {
            scraped.push((lag, seconds));
        }
        scraped.last() == Some(&(0.0, 0.0))
    });
    let lines = ackd.timed_lines();
    let checked = assert_lag_seconds(&lines, &stamps);
    let behind: Vec<_> = scraped.iter().filter(|(lag, _)| *lag > 0.0).collect();
    eprintln!(
        "lag seconds: {checked} lines checked, {} scrapes behind, first {:?}",
        behind.len(),
        behind.first()
    );
    assert!(checked >= 5, "too few lines with a lag to check");
    assert!(!behind.is_empty(), "no scrape while behind: {scraped:?}");
    // Each scrape reports a summary's figures (checked above against the truth).
    let said: Vec<(f64, f64)> = lines
        .iter()
        .filter(|(_, l)| at(l, "lag"))
        .filter_map(|(_, l)| {
            let num = |k: &str| field(l, k)?.parse::<f64>().ok();
            Some((num("sample#ackd.lag")?, num("sample#ackd.lag.seconds")?))
        })
        .collect();
    for s in &behind {
        assert!(said.contains(s), "{s:?} is no summary's: {said:?}");
    }
    ackd.stop(0, WAIT);
}
