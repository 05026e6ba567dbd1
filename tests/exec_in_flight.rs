//! `ACKD_EXEC_IN_FLIGHT` against the real broker and the real binary: one exec child
//! holding many requests at once and answering them in any order.
//!
//! docs/exec.md's asyncio Python handler and its Node.js handler run exactly as written
//! there (per-key order, every message once across a graceful stop, a SIGKILL of the
//! child mid-flight); test handlers of our own break the protocol, hang one request, and
//! answer batches out of order. Ground truth: ackd's per-message lines (a message is
//! acknowledged once at most: never a line for one the child did not answer) and the
//! committed offsets.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use common::accounting::tally;
use common::ackd::{exec_ackd, peak_rss_kib, AckdBuilder};
use common::lines::{at, field, is_processed, processed};
use common::offsets::{assert_committed_to_ends, committed, log_ends};
use common::produce::{produce, produce_keyed, Delivered, SteadyProducer};
use common::spawn::{fresh_dir, read_lossy};
use common::topics::fresh_topic;
use common::wait::wait_until;

const WAIT: Duration = Duration::from_secs(90);
/// Requests one child holds at once, and the calls a partition may have under way.
const IN_FLIGHT: usize = 100;

/// A handler of docs/exec.md's "Many requests in flight per child" section.
#[derive(Clone, Copy, Debug)]
enum DocsHandler {
    Python,
    Node,
}

impl DocsHandler {
    /// Its code block, exactly as the docs show it, written to `dir`; the command line
    /// that runs it.
    fn install(self, dir: &Path) -> String {
        let (fence, file, program) = match self {
            DocsHandler::Python => ("```python\n", "handler.py", "python3"),
            DocsHandler::Node => ("```js\n", "handler.js", "node"),
        };
        let heading = "## Many requests in flight per child";
        let code = common::docs::code_block("docs/exec.md", heading, fence, 1);
        let path = dir.join(file);
        std::fs::write(&path, code).unwrap();
        format!("{program} {}", path.display())
    }
}

/// ackd with exec, one child holding up to `in_flight` requests, key ordering with as
/// many calls per partition.
fn in_flight_ackd(topic: &str, group: &str, command: &str, in_flight: usize) -> AckdBuilder {
    exec_ackd(topic, group, command)
        .env("ACKD_EXEC_IN_FLIGHT", in_flight.to_string())
        .env("ACKD_ORDERING", "key")
        .env("ACKD_CONCURRENCY", in_flight.to_string())
}

/// `n` messages whose keys repeat (`keys` of them), spread by key over the partitions.
fn produce_repeating_keys(topic: &str, n: usize, keys: usize) -> Vec<Delivered> {
    let messages: Vec<(Option<Vec<u8>>, Vec<u8>)> = (0..n)
        .map(|i| {
            let key = format!("key-{}", i % keys).into_bytes();
            (Some(key), format!("message {i}").into_bytes())
        })
        .collect();
    produce(topic, &messages)
}

/// Every delivered message acknowledged exactly once in `lines`.
#[track_caller]
fn assert_each_once(delivered: &[Delivered], lines: &[String]) {
    let t = tally(delivered, &processed(lines), lines);
    assert!(t.lost.is_empty(), "never acknowledged: {:?}", t.lost);
    assert!(
        t.duplicated.is_empty(),
        "acknowledged twice: {:?}",
        t.duplicated
    );
}

/// The docs handler with 100 in flight: every message once, each key's messages
/// acknowledged in offset order, and replies out of offset order (so the child really
/// held many at once).
fn key_order_with(handler: DocsHandler) {
    let (topic, group) = fresh_topic("inflight-order", 2);
    let dir = fresh_dir("inflight-order");
    let delivered = produce_repeating_keys(&topic, 3000, 50);
    let ends = log_ends(&delivered);
    let ackd = in_flight_ackd(&topic, &group, &handler.install(&dir), IN_FLIGHT).spawn();
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);
    let lines = ackd.stop_exec_cleanly(WAIT);
    assert_each_once(&delivered, &lines);
    assert_committed_to_ends(&group, &topic, 2, &ends);

    let key_of: HashMap<(i32, i64), &[u8]> = delivered
        .iter()
        .map(|d| ((d.partition, d.offset), d.key.as_deref().unwrap()))
        .collect();
    let mut by_key: BTreeMap<&[u8], Vec<i64>> = BTreeMap::new();
    for m in processed(&lines) {
        by_key.entry(key_of[&m]).or_default().push(m.1);
    }
    for (key, offsets) in &by_key {
        assert!(
            offsets.windows(2).all(|w| w[0] < w[1]),
            "key {} acknowledged out of order: {offsets:?}",
            String::from_utf8_lossy(key)
        );
    }
    let acked = per_partition_order(&processed(&lines));
    assert!(
        acked.values().any(|o| o.windows(2).any(|w| w[0] > w[1])),
        "{handler:?}: every reply came in offset order, so the child never held two"
    );
    assert!(!lines.iter().any(|l| at(l, "exec_restart")), "a restart");
}

/// Offsets per partition in the order acknowledged.
fn per_partition_order(processed: &[(i32, i64)]) -> BTreeMap<i32, Vec<i64>> {
    let mut map: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for (p, o) in processed {
        map.entry(*p).or_default().push(*o);
    }
    map
}

#[test]
fn the_docs_asyncio_handler_answers_in_any_order_and_keys_keep_their_order() {
    key_order_with(DocsHandler::Python);
}

#[test]
fn the_docs_node_handler_answers_in_any_order_and_keys_keep_their_order() {
    key_order_with(DocsHandler::Node);
}

/// A SIGTERM while messages stream in: the child answers what it holds, gets EOF, ackd
/// exits 0 having committed exactly what was acknowledged; a second run takes the rest.
/// Across both, every message acknowledged exactly once: no redelivery on a graceful stop.
fn graceful_stop_with(handler: DocsHandler) {
    let (topic, group) = fresh_topic("inflight-stop", 2);
    let dir = fresh_dir("inflight-stop");
    let command = handler.install(&dir);
    let producer = SteadyProducer::start(&topic, 50, Duration::from_millis(5));
    let first = in_flight_ackd(&topic, &group, &command, IN_FLIGHT).spawn();
    first.wait_for_count(is_processed, 2000, WAIT);
    let mut lines = first.stop_exec_cleanly(WAIT);
    let delivered = producer.finish();
    let ends = log_ends(&delivered);
    let second = in_flight_ackd(&topic, &group, &command, IN_FLIGHT).spawn();
    wait_until(WAIT, || {
        let c = committed(&group, &topic, 2);
        ends.iter().all(|(p, end)| c[p] == Some(*end))
    });
    lines.extend(second.stop_exec_cleanly(WAIT));
    assert_each_once(&delivered, &lines);
    assert_committed_to_ends(&group, &topic, 2, &ends);
}

#[test]
fn the_docs_asyncio_handler_finishes_what_it_holds_on_sigterm_and_nothing_comes_twice() {
    graceful_stop_with(DocsHandler::Python);
}

#[test]
fn the_docs_node_handler_finishes_what_it_holds_on_sigterm_and_nothing_comes_twice() {
    graceful_stop_with(DocsHandler::Node);
}

/// A second member joins while the first one's child holds many requests: the partitions
/// taken from it are drained (its child answers what it holds, nothing new is sent for
/// them) and committed before the new owner starts them. Across both, every message
/// acknowledged exactly once: no redelivery on a rebalance.
#[test]
fn a_revoke_waits_for_what_the_child_holds_and_nothing_comes_twice() {
    let (topic, group) = fresh_topic("inflight-revoke", 4);
    let dir = fresh_dir("inflight-revoke");
    let command = DocsHandler::Python.install(&dir);
    let producer = SteadyProducer::start(&topic, 50, Duration::from_millis(5));
    let first = in_flight_ackd(&topic, &group, &command, IN_FLIGHT).spawn();
    first.wait_for_count(is_processed, 1000, WAIT);
    let second = in_flight_ackd(&topic, &group, &command, IN_FLIGHT).spawn();
    first.wait_for_line(|l| at(l, "revoked"), WAIT);
    second.wait_for_count(is_processed, 500, WAIT);
    let delivered = producer.finish();
    let ends = log_ends(&delivered);
    wait_until(WAIT, || {
        let c = committed(&group, &topic, 4);
        ends.iter().all(|(p, end)| c[p] == Some(*end))
    });
    let mut lines = first.stop_exec_cleanly(WAIT);
    lines.extend(second.stop_exec_cleanly(WAIT));
    assert_each_once(&delivered, &lines);
    assert_committed_to_ends(&group, &topic, 4, &ends);
}

/// The child's process group SIGKILLed while it holds many requests: none of them is
/// acknowledged by the dead child, all are retried on the next one, every message is
/// acknowledged exactly once and committed to the end.
fn child_killed_with(handler: DocsHandler) {
    let (topic, group) = fresh_topic("inflight-kill", 2);
    let dir = fresh_dir("inflight-kill");
    let delivered = produce_repeating_keys(&topic, 20_000, 1000);
    let ends = log_ends(&delivered);
    let ackd = in_flight_ackd(&topic, &group, &handler.install(&dir), IN_FLIGHT).spawn();
    let started = ackd.wait_for_line(|l| at(l, "exec_started"), WAIT);
    let pid: libc::pid_t = field(&started, "pid").unwrap().parse().unwrap();
    ackd.wait_for_count(is_processed, 500, WAIT);
    // SAFETY: kill(2) on the child's own process group (ackd starts it with
    // process_group(0)); no memory effects.
    assert_eq!(unsafe { libc::kill(-pid, libc::SIGKILL) }, 0);
    let restart = ackd.wait_for_line(|l| at(l, "exec_restart"), WAIT);
    let reason = field(&restart, "reason").unwrap();
    assert!(reason.contains("SIGKILL"), "{restart}");
    assert!(reason.contains("holding "), "it held several: {restart}");
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);
    let lines = ackd.stop_exec_cleanly(WAIT);
    assert_each_once(&delivered, &lines);
    assert_committed_to_ends(&group, &topic, 2, &ends);
    let retried = lines
        .iter()
        .filter(|l| at(l, "retry"))
        .filter(|l| field(l, "error").is_some_and(|e| e.contains("failed on this message")))
        .count();
    assert!(retried > 1, "the held requests were failed as retryable");
}

#[test]
fn the_docs_asyncio_handler_killed_mid_flight_has_what_it_held_retried() {
    child_killed_with(DocsHandler::Python);
}

#[test]
fn the_docs_node_handler_killed_mid_flight_has_what_it_held_retried() {
    child_killed_with(DocsHandler::Node);
}

/// A test handler of our own: asyncio, up to 10 requests in flight, each answered after
/// 0-20 ms. `misbehave(msg, write)` may write something else first and return True to
/// skip the proper reply; each line it writes is recorded in `replies`.
fn test_handler(dir: &Path, misbehave: &str) -> String {
    let code = format!(
        r#"import asyncio, json, os, random, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
DIR = {dir:?}
def once(name):
    try:
        os.close(os.open(os.path.join(DIR, name), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False
def write(reply):
    line = reply if isinstance(reply, str) else json.dumps(reply)
    with open(os.path.join(DIR, "replies"), "a") as f:
        f.write(line + "\n")
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
def misbehave(msg, write):
{misbehave}
async def answer(msg):
    await asyncio.sleep(random.uniform(0, 0.02))
    if misbehave(msg, write):
        return
    write(dict(ack=True, topic=msg["topic"], partition=msg["partition"], offset=msg["offset"]))
"#,
        dir = dir.display().to_string(),
    ) + ASYNCIO_MAIN;
    let path = dir.join("handler.py");
    std::fs::write(&path, code).unwrap();
    format!("python3 {}", path.display())
}

/// Acknowledgements the handler wrote: (partition, offset) of each `"ack":true` line
/// that named both.
fn acks_written(dir: &Path) -> Vec<(i32, i64)> {
    read_lossy(&dir.join("replies"))
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["ack"] == true)
        .filter_map(|v| Some((v["partition"].as_i64()? as i32, v["offset"].as_i64()?)))
        .collect()
}

/// A second reply to one message, a reply naming an offset never sent, one without
/// topic and partition, and junk: each replaces the child and retries what it held;
/// nothing is acknowledged that the handler did not acknowledge.
#[test]
fn every_protocol_error_replaces_the_child_and_retries_what_it_held() {
    let (topic, group) = fresh_topic("inflight-protocol", 1);
    let dir = fresh_dir("inflight-protocol");
    let misbehave = r#"    v, o = msg["value"], msg["offset"]
    named = dict(topic=msg["topic"], partition=msg["partition"])
    if v == "dup" and once("dup"):
        write(dict(ack=True, offset=o, **named))
        write(dict(ack=True, offset=o, **named))
        return True
    if v == "unknown" and once("unknown"):
        write(dict(ack=True, offset=o + 1000, **named))
        return True
    if v == "unnamed" and once("unnamed"):
        write(dict(ack=True, offset=o))
        return True
    if v == "junk" and once("junk"):
        write("ok")
        return True
    return False"#;
    let command = test_handler(&dir, misbehave);
    let values: Vec<String> = (0..200)
        .map(|i| match i {
            20 => "dup".to_string(),
            60 => "unknown".to_string(),
            100 => "unnamed".to_string(),
            140 => "junk".to_string(),
            i => format!("m-{i}"),
        })
        .collect();
    let messages: Vec<(Option<Vec<u8>>, Vec<u8>)> = values
        .iter()
        .enumerate()
        .map(|(i, v)| (Some(format!("k-{i}").into_bytes()), v.clone().into_bytes()))
        .collect();
    let delivered = produce(&topic, &messages);
    let ends = log_ends(&delivered);
    let ackd = in_flight_ackd(&topic, &group, &command, 10).spawn();
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);
    let lines = ackd.stop_exec_cleanly(WAIT);
    assert_each_once(&delivered, &lines);
    assert_committed_to_ends(&group, &topic, 1, &ends);

    let reasons: Vec<String> = lines
        .iter()
        .filter(|l| at(l, "exec_restart"))
        .filter_map(|l| field(l, "reason"))
        .collect();
    assert_eq!(
        reasons.len(),
        4,
        "one restart per protocol error: {reasons:#?}"
    );
    for expected in [
        "which this child does not hold",
        "offset 1060",
        "names no \"topic\"",
        "reply is not JSON",
    ] {
        assert!(
            reasons.iter().any(|r| r.contains(expected)),
            "no restart for {expected:?}: {reasons:#?}"
        );
    }
    let written = acks_written(&dir);
    for m in processed(&lines) {
        assert!(
            written.contains(&m),
            "{m:?} acknowledged, never acked by the handler"
        );
    }
}

/// One request never answered while the child answers the others: it times out on its
/// own clock, the child is replaced, the request is retried and acknowledged.
#[test]
fn a_request_times_out_on_its_own_clock_and_is_retried() {
    let (topic, group) = fresh_topic("inflight-timeout", 1);
    let dir = fresh_dir("inflight-timeout");
    let misbehave = r#"    return msg["value"] == "hang" and once("hang")"#;
    let command = test_handler(&dir, misbehave);
    let messages: Vec<(Option<Vec<u8>>, Vec<u8>)> = (0..100)
        .map(|i| {
            let value = if i == 30 {
                "hang".into()
            } else {
                format!("m-{i}")
            };
            (Some(format!("k-{i}").into_bytes()), value.into_bytes())
        })
        .collect();
    let delivered = produce(&topic, &messages);
    let ends = log_ends(&delivered);
    let ackd = in_flight_ackd(&topic, &group, &command, 10)
        .env("ACKD_EXEC_TIMEOUT_MS", "1500")
        .spawn();
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);
    let lines = ackd.stop_exec_cleanly(WAIT);
    assert_each_once(&delivered, &lines);
    assert_committed_to_ends(&group, &topic, 1, &ends);
    let restarts: Vec<&String> = lines.iter().filter(|l| at(l, "exec_restart")).collect();
    assert_eq!(restarts.len(), 1, "{restarts:#?}");
    let reason = field(restarts[0], "reason").unwrap();
    assert!(
        reason.contains("no reply within ACKD_EXEC_TIMEOUT_MS=1500 to topic")
            && reason.contains("offset 30"),
        "{reason}"
    );
    // The others kept being answered while it hung: acknowledged before the restart.
    let restart_at = lines.iter().position(|l| at(l, "exec_restart")).unwrap();
    let before = processed(&lines[..restart_at]);
    assert!(before.iter().any(|(_, o)| *o > 30), "{before:?}");
}

/// Batches with requests in flight: a child holds up to 4 batches (one per partition
/// under partition ordering) and answers them in any order; each message once.
#[test]
fn a_child_holds_up_to_its_limit_of_batches_answered_in_any_order() {
    let (topic, group) = fresh_topic("inflight-batches", 4);
    let dir = fresh_dir("inflight-batches");
    let code = format!(
        r#"import asyncio, json, os, random, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
DIR = {dir:?}
held = 0
async def answer(batch):
    global held
    held += 1
    with open(os.path.join(DIR, "held"), "a") as f:
        f.write("%d\n" % held)
    await asyncio.sleep(random.uniform(0.005, 0.03))
    held -= 1
    head = batch[0]
    reply = dict(ack=True, topic=head["topic"], partition=head["partition"], first=head["offset"], last=batch[-1]["offset"])
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
"#,
        dir = dir.display().to_string()
    ) + ASYNCIO_MAIN;
    let path = dir.join("batches.py");
    std::fs::write(&path, code).unwrap();
    let delivered = produce_keyed(&topic, 2000, 0);
    let ends = log_ends(&delivered);
    let ackd = exec_ackd(&topic, &group, &format!("python3 {}", path.display()))
        .env("ACKD_EXEC_IN_FLIGHT", "4")
        .batches(10)
        .spawn();
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);
    let lines = ackd.stop_exec_cleanly(WAIT);
    assert_each_once(&delivered, &lines);
    assert_committed_to_ends(&group, &topic, 4, &ends);
    let held: Vec<usize> = read_lossy(&dir.join("held"))
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let most = held.iter().copied().max().unwrap_or(0);
    eprintln!(
        "batches held at once, at most: {most} (of {} batches)",
        held.len()
    );
    assert!(most <= 4, "the child held {most} batches, the limit is 4");
    assert!(most >= 2, "the child never held two batches at once");
}

/// One partition, 100 requests in flight of 10 KiB messages, with a memory budget: ackd's peak RSS stays
/// under the budget plus a fixed baseline plus what `ACKD_MAX_PENDING` lets
/// each partition hold outside librdkafka's queue (docs/performance.md), every message once.
#[test]
fn a_hundred_in_flight_stay_within_the_memory_budget() {
    const BUDGET_MIB: u64 = 8;
    /// tests/memory.rs's 28 MiB, and the pages of this debug binary that the Schema
    /// Registry decoders' crates added: 33.3-33.9 MiB peak without them, 36.3-37.2 with
    /// (decoding off in both).
    const BASELINE_MIB: u64 = 31;
    /// ACKD_MAX_PENDING=100 × 10 KiB, for the one partition.
    const PENDING_MIB: u64 = 1;
    let (topic, group) = fresh_topic("inflight-memory", 1);
    let dir = fresh_dir("inflight-memory");
    let messages: Vec<(Option<Vec<u8>>, Vec<u8>)> = (0..4000)
        .map(|i| {
            let mut value = format!("message {i} ").into_bytes();
            value.resize(10 * 1024, b'x');
            (Some(format!("k-{}", i % 500).into_bytes()), value)
        })
        .collect();
    let delivered = produce(&topic, &messages);
    let ends = log_ends(&delivered);
    let ackd = in_flight_ackd(
        &topic,
        &group,
        &DocsHandler::Python.install(&dir),
        IN_FLIGHT,
    )
    .env("ACKD_MEMORY_MB", BUDGET_MIB.to_string())
    .env("ACKD_MAX_PENDING", IN_FLIGHT.to_string())
    .spawn();
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);
    let peak_kib = peak_rss_kib(ackd.pid());
    let lines = ackd.stop_exec_cleanly(WAIT);
    eprintln!(
        "ACKD_EXEC_IN_FLIGHT={IN_FLIGHT}, ACKD_MEMORY_MB={BUDGET_MIB}: peak RSS {peak_kib} KiB"
    );
    assert_each_once(&delivered, &lines);
    assert_committed_to_ends(&group, &topic, 1, &ends);
    assert!(
        peak_kib < (BUDGET_MIB + BASELINE_MIB + PENDING_MIB) << 10,
        "peak RSS {peak_kib} KiB with ACKD_MEMORY_MB={BUDGET_MIB}"
    );
}

/// A handler of capacity `per_child` requests at once per child: above that it answers
/// `{"retry":"full"}` at once (and says so on stderr), else it takes 5 ms plus 1 ms per
/// request it holds (its latency grows with load).
const CAPACITY_HANDLER: &str = r#"
import asyncio, json, signal, sys

signal.signal(signal.SIGTERM, signal.SIG_IGN)
CAPACITY = int(sys.argv[1])
busy = 0

async def answer(msg):
    global busy
    busy += 1
    try:
        if busy > CAPACITY:
            print("refused", file=sys.stderr, flush=True)
            reply = {"retry": "full"}
        else:
            await asyncio.sleep(0.005 + 0.001 * busy)
            reply = {"ack": True}
    finally:
        busy -= 1
    reply.update(topic=msg["topic"], partition=msg["partition"], offset=msg["offset"])
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
"#;

/// The end of the test handlers: `answer(request)` for each line read, concurrently, all
/// answered at EOF (docs/exec.md's asyncio handler's loop).
const ASYNCIO_MAIN: &str = r#"
async def main():
    stdin = asyncio.StreamReader(limit=1 << 24)
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    pending = set()
    while line := await stdin.readline():
        task = asyncio.create_task(answer(json.loads(line)))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)

asyncio.run(main())
"#;

/// `ACKD_EXEC_CONCURRENCY_MODE=adaptive` with 2 children of 32 requests each (a ceiling
/// of 64) and 64 calls wanted at once (4 partitions, 16 each), against a handler that
/// takes 5 requests per child (10 in all; `{"retry":…}` above, latency growing with
/// load): the limit on the summary lines settles near 10 (its median within 5 to 11
/// after its first second, never above 14), at most 1% of requests are refused,
/// `/metrics` shows the limit, and every message is acknowledged once and committed.
#[test]
fn adaptive_concurrency_settles_near_the_handlers_capacity() {
    let (topic, group) = fresh_topic("exec-adaptive", 4);
    let dir = fresh_dir("exec-adaptive");
    let path = dir.join("capacity.py");
    std::fs::write(&path, format!("{CAPACITY_HANDLER}{ASYNCIO_MAIN}")).unwrap();
    let n = 4000;
    let delivered = produce_keyed(&topic, n, 0);
    let health = common::spawn::free_port();
    let ackd = exec_ackd(&topic, &group, &format!("python3 {} 5", path.display()))
        .env("ACKD_EXEC_CONCURRENCY", "2")
        .env("ACKD_EXEC_IN_FLIGHT", "32")
        .env("ACKD_EXEC_CONCURRENCY_MODE", "adaptive")
        .env("ACKD_ORDERING", "none")
        .env("ACKD_CONCURRENCY", "16")
        .env("ACKD_HEALTH_PORT", health.to_string())
        .env("ACKD_HEALTH_ADDR", "127.0.0.1")
        .env("ACKD_METRICS_INTERVAL_MS", "250")
        .spawn();
    ackd.wait_for_count(is_processed, n, WAIT);
    let scraped = common::spawn::scraped_gauge(health, "ackd_exec_limit");
    assert!((1..=64).contains(&scraped), "{scraped}");
    let lines = ackd.stop_exec_cleanly(WAIT);
    let limits = common::lines::summary_samples(&lines, "sample#ackd.exec.limit");
    let refused = lines
        .iter()
        .filter(|l| at(l, "exec_stderr") && field(l, "line").as_deref() == Some("refused"))
        .count();
    let median = common::lines::median_after(&limits, 4);
    eprintln!(
        "exec adaptive: limits={limits:?} median={median} refused={refused} of {}",
        n + refused
    );
    assert!(limits.len() > 6, "{limits:?}");
    assert!((5..=11).contains(&median), "{limits:?}");
    assert!(
        limits[4..].iter().all(|l| *l <= 14),
        "never far above the capacity: {limits:?}"
    );
    assert!(
        refused * 100 <= n + refused,
        "{refused} of {} refused",
        n + refused
    );
    assert_each_once(&delivered, &lines);
    assert_committed_to_ends(&group, &topic, 4, &log_ends(&delivered));
}

/// An `ACKD_EXEC_CONCURRENCY_MODE` other than fixed or adaptive is a configuration
/// error naming it and what is allowed (exit 78).
#[test]
fn a_bad_exec_concurrency_mode_is_a_configuration_error() {
    let ackd = AckdBuilder::without_broker("t", "g")
        .env("ACKD_PROCESSOR", "exec")
        .env("ACKD_EXEC_COMMAND", "cat")
        .env("ACKD_EXEC_CONCURRENCY_MODE", "auto")
        .spawn();
    let line = ackd.assert_config_error("ACKD_EXEC_CONCURRENCY_MODE", WAIT);
    assert!(
        line.contains("fixed") && line.contains("adaptive"),
        "{line}"
    );
}

/// A handler of capacity 2 that hangs once it is given more (a wedged handler, not a
/// refusal): the request runs out of `ACKD_EXEC_TIMEOUT_MS`, which replaces the child
/// and counts as an overload, so the adaptive limit (starting at 4, bound 16) settles
/// at 2 to 3 (probed less and less often), and every message is acknowledged once and
/// committed.
#[test]
fn adaptive_concurrency_shrinks_on_timeouts() {
    // SIGTERM ends it at once: a hung child is replaced without the 2 s to SIGKILL.
    const HANGS_ABOVE_TWO: &str = r#"
import asyncio, json, sys

busy = 0

async def answer(msg):
    global busy
    busy += 1
    if busy > 2:
        await asyncio.sleep(3600)
    await asyncio.sleep(0.005)
    busy -= 1
    reply = dict(ack=True, topic=msg["topic"], partition=msg["partition"], offset=msg["offset"])
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
"#;
    let (topic, group) = fresh_topic("exec-adaptive-timeout", 4);
    let dir = fresh_dir("exec-adaptive-timeout");
    let path = dir.join("hangs.py");
    std::fs::write(&path, format!("{HANGS_ABOVE_TWO}{ASYNCIO_MAIN}")).unwrap();
    let n = 300;
    let delivered = produce_keyed(&topic, n, 0);
    let ackd = exec_ackd(&topic, &group, &format!("python3 {}", path.display()))
        .env("ACKD_EXEC_IN_FLIGHT", "16")
        .env("ACKD_EXEC_CONCURRENCY_MODE", "adaptive")
        .env("ACKD_EXEC_TIMEOUT_MS", "1000")
        .env("ACKD_RETRY_MAX_ATTEMPTS", "100")
        .env("ACKD_ORDERING", "none")
        .env("ACKD_CONCURRENCY", "4")
        .env("ACKD_METRICS_INTERVAL_MS", "250")
        .spawn();
    ackd.wait_for_count(is_processed, n, WAIT);
    let lines = ackd.stop_exec_cleanly(WAIT);
    let limits = common::lines::summary_samples(&lines, "sample#ackd.exec.limit");
    let timeouts = lines.iter().filter(|l| at(l, "exec_restart")).count();
    eprintln!("exec adaptive timeouts: limits={limits:?} restarts={timeouts}");
    assert!(timeouts >= 1, "no request ever timed out: {limits:?}");
    assert!(timeouts <= 15, "{timeouts} timeouts: {limits:?}");
    assert!(limits.len() > 4, "{limits:?}");
    assert!(common::lines::median_after(&limits, 4) <= 3, "{limits:?}");
    assert_each_once(&delivered, &lines);
    assert_committed_to_ends(&group, &topic, 4, &log_ends(&delivered));
}
