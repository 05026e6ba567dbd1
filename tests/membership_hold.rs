//! The membership hold (src/consumer/membership.rs) against the real broker and the real
//! binary, where the process is stopped (SIGSTOP) and woken:
//! - a message the worker takes from its queue as the hold starts is kept, not lost:
//!   every offset produced reaches the processor, and the commits reach the log ends;
//! - calls waiting in the processor (for an exec child, an http permit) when the
//!   process stalls past its session start only once the membership is confirmed:
//!   nothing the new owner handled is handled again by the woken member unflagged.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::{
    accounting::*, ackd::*, lines::*, offsets::*, produce::*, spawn::*, topics::*, wait::*,
};

const WAIT: Duration = Duration::from_secs(90);

/// Longer than `membership::STALL` (2 s): the woken process holds its partitions.
const STALL: Duration = Duration::from_millis(2400);

/// An exec handler that holds several requests at once (asyncio) and answers each
/// after 50-300 ms.
const OVERLAPPING_HANDLER: &str = r#"import asyncio, json, random, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
async def handle(msg):
    await asyncio.sleep(random.uniform(0.05, 0.3))
    reply = {"ack": True, "topic": msg["topic"], "partition": msg["partition"], "offset": msg["offset"]}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
async def main():
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks = set()
    while line := await reader.readline():
        t = asyncio.create_task(handle(json.loads(line)))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
asyncio.run(main())
"#;

/// `ACKD_ORDERING=key` with calls under way and steady traffic: the read loop selects
/// between the calls and the queue, and a call that ends drops the read wherever it
/// waits. The process is stopped for a little longer than a stall (shorter than its
/// session: no rebalance) several times; when it wakes, its read takes a message as
/// the hold starts while the exec children's answers come in. Every offset must reach
/// the processor, no offset be passed, and the commits reach the log ends.
#[test]
fn messages_read_as_the_hold_starts_all_reach_the_processor() {
    const PARTITIONS: i32 = 8;
    const STALLS: usize = 8;
    let started = Instant::now();
    let (topic, group) = fresh_topic("hold_read", PARTITIONS);
    let dir = fresh_dir("hold_read");
    let script = dir.join("handler.py");
    std::fs::write(&script, OVERLAPPING_HANDLER).unwrap();
    let ackd = exec_ackd(&topic, &group, &format!("python3 {}", script.display()))
        .env("ACKD_EXEC_CONCURRENCY", "2")
        .env("ACKD_EXEC_IN_FLIGHT", "4")
        .env("ACKD_ORDERING", "key")
        .env("ACKD_CONCURRENCY", "8")
        .env("ACKD_COMMIT_INTERVAL_MS", "1000")
        .env("ACKD_METRICS_INTERVAL_MS", "200")
        // Longer than the stalls: the membership is in doubt, never lost.
        .env("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "10000")
        .env("ACKD_RDKAFKA_HEARTBEAT_INTERVAL_MS", "1000")
        .spawn();
    ackd.wait_for_line(|l| at(l, "assigned"), WAIT);
    // ~40 messages a second over 100 keys.
    let producer = KeyedProducer::start(&topic, 100);
    for stall in 0..STALLS {
        // Busy again since the last stall: calls under way.
        let n = processed(&ackd.lines()).len();
        wait_until(WAIT, || processed(&ackd.lines()).len() >= n + 40);
        ackd.signal(libc::SIGSTOP);
        // 2.4-3.9 s.
        std::thread::sleep(STALL + Duration::from_millis(500 * (stall as u64 % 4)));
        ackd.signal(libc::SIGCONT);
        if lost_any(&ackd) {
            break;
        }
    }
    let delivered = producer.finish();
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    // A message lost is passed, never processed: wait for the rest only.
    wait_until(WAIT, || {
        let seen: BTreeSet<_> = processed(&ackd.lines()).into_iter().collect();
        let missing = expected.difference(&seen).count() as u64;
        missing == 0 || skipped(&ackd.lines()) >= missing
    });
    let lines = ackd.stop_exec_cleanly(WAIT);
    let t = tally(&delivered, &processed(&lines), &lines);
    let gaps: Vec<&String> = all_at(&lines, "offset_gap");
    let doubts = count_at(&lines, "membership_in_doubt");
    eprintln!(
        "hold read: {} messages, processed {}, lost {}, processed twice {}, offsets passed {}, gap lines {}, doubts {doubts}, {:.1} s",
        delivered.len(),
        processed(&lines).len(),
        t.lost.len(),
        t.duplicated.len(),
        skipped(&lines),
        gaps.len(),
        started.elapsed().as_secs_f64()
    );
    for l in lines.iter().filter(|l| at(l, "membership_confirmed")) {
        eprintln!("  {l}");
    }
    assert!(
        t.lost.is_empty(),
        "offsets never processed: {:?}\ngap lines: {gaps:?}",
        t.lost
    );
    assert!(gaps.is_empty(), "no gap on this topic: {gaps:?}");
    assert!(doubts >= 1, "a stall held the partitions");
    assert_committed_to_ends(&group, &topic, PARTITIONS, &log_ends(&delivered));
}

/// Offsets passed with no message (the summaries' `count#ackd.offsets.skipped`).
fn skipped(lines: &[String]) -> u64 {
    lines
        .iter()
        .filter(|l| at(l, "summary"))
        .filter_map(|l| field(l, "count#ackd.offsets.skipped")?.parse::<u64>().ok())
        .sum()
}

/// Whether the process passed an offset it never processed (a gap, on a topic that has
/// none): counted in the summaries, whatever the level of its line.
fn lost_any(ackd: &AckdProcess) -> bool {
    ackd.lines()
        .iter()
        .filter(|l| at(l, "summary"))
        .filter_map(|l| field(l, "count#ackd.offsets.skipped"))
        .any(|n| n != "0")
}

/// An exec handler that records every request it gets (partition, offset, whether it
/// came flagged `redelivered`, when: wall-clock seconds) in the file its argument
/// names, and acknowledges it after 20-200 ms.
const RECORDING_HANDLER: &str = r#"import json, random, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
out = open(sys.argv[1], "a")
for line in sys.stdin:
    msg = json.loads(line)
    out.write("%d %d %d %.6f\n" % (msg["partition"], msg["offset"], 1 if msg["redelivered"] else 0, time.time()))
    out.flush()
    time.sleep(random.uniform(0.02, 0.2))
    print(json.dumps({"ack": True, "topic": msg["topic"], "partition": msg["partition"], "offset": msg["offset"]}), flush=True)
"#;

/// What a recording handler got: (partition, offset) -> (redelivered, when, in
/// seconds since the epoch), the first time.
fn handled(path: &std::path::Path) -> BTreeMap<(i32, i64), (bool, f64)> {
    let mut got = BTreeMap::new();
    for l in read_lossy(path).lines() {
        let f: Vec<&str> = l.split(' ').collect();
        let [p, o, r, t] = f[..] else {
            continue;
        };
        let (Ok(p), Ok(o), Ok(t)) = (p.parse(), o.parse(), t.parse()) else {
            continue;
        };
        got.entry((p, o)).or_insert((r == "1", t));
    }
    got
}

fn epoch_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The exec processor at its defaults (one child, partition ordering) over many
/// partitions: each partition's call but one waits for the child. Member A is stopped
/// past its session; B takes the partitions and processes them from A's last commit
/// (flagging that window). When A wakes, its child must take none of the calls that
/// waited: B has handled those messages, and A would hand them over unflagged. A's
/// membership is in doubt from the moment it wakes (a stall), and stays so until the
/// group takes the partitions from it.
#[test]
fn calls_waiting_for_a_child_across_a_stall_do_not_start_unflagged() {
    let (topic, group) = fresh_topic("hold_queued", 10);
    let dir = fresh_dir("hold_queued");
    let script = dir.join("handler.py");
    std::fs::write(&script, RECORDING_HANDLER).unwrap();
    queued_across_a_stall(&topic, |name| {
        let file = dir.join(name);
        let command = format!("python3 {} {}", script.display(), file.display());
        (exec_ackd(&topic, &group, &command), file)
    });
}

/// An http endpoint (Python's threading server) that records every request as
/// [`RECORDING_HANDLER`] does, in the file its second argument names, and answers 200
/// after 20-200 ms; it listens on the port its first argument names.
const RECORDING_ENDPOINT: &str = r#"import http.server, json, random, sys, time
out = open(sys.argv[2], "a")
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        msg = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        r = 1 if msg["redelivered"] else 0
        out.write("%d %d %d %.6f\n" % (msg["partition"], msg["offset"], r, time.time()))
        out.flush()
        time.sleep(random.uniform(0.02, 0.2))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

/// The same with the http processor and one request in flight at a time: the calls
/// wait for the permit.
#[test]
fn calls_waiting_for_an_http_permit_across_a_stall_do_not_start_unflagged() {
    let (topic, group) = fresh_topic("hold_permit", 10);
    let dir = fresh_dir("hold_permit");
    let script = dir.join("endpoint.py");
    std::fs::write(&script, RECORDING_ENDPOINT).unwrap();
    let mut endpoints = Vec::new();
    queued_across_a_stall(&topic, |name| {
        let file = dir.join(name);
        let port = free_port();
        let mut cmd = std::process::Command::new("python3");
        cmd.arg(&script).arg(port.to_string()).arg(&file);
        endpoints.push(KillOnDrop(spawn_tied(cmd).expect("python3")));
        wait_until(WAIT, || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        let url = format!("http://127.0.0.1:{port}/");
        let ackd = http_ackd(&topic, &group, &url).env("ACKD_HTTP_CONCURRENCY", "1");
        (ackd, file)
    });
}

/// Kills the endpoint when the test ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A stopped past its session while its calls wait in the processor, B takes the
/// partitions, A wakes: `member(name)` gives an ackd to start, configured for its
/// processor, and the file its handler records requests in.
fn queued_across_a_stall(
    topic: &str,
    mut member: impl FnMut(&str) -> (AckdBuilder, std::path::PathBuf),
) {
    let started = Instant::now();
    let mut member = |name: &str| {
        let (ackd, file) = member(name);
        let ackd = ackd
            .env("ACKD_COMMIT_INTERVAL_MS", "1000")
            .env("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "6000")
            .env("ACKD_RDKAFKA_HEARTBEAT_INTERVAL_MS", "500")
            .spawn();
        (ackd, file)
    };
    // ~10 messages a second: about what one child handles, so calls queue for it.
    let producer = SteadyProducer::start(topic, 5, Duration::from_millis(500));
    let (a, a_file) = member("a");
    a.wait_for_line(|l| at(l, "assigned"), WAIT);
    wait_until(WAIT, || handled(&a_file).len() >= 40);
    a.signal(libc::SIGSTOP);
    let stopped_at = Instant::now();
    let (b, b_file) = member("b");
    // Past A's session: B owns every partition and handles what A had not committed.
    b.wait_for_line(|l| at(l, "assigned"), WAIT);
    wait_until(WAIT, || handled(&b_file).len() >= 40);
    // A sleeps for 12 s in all, twice its session.
    std::thread::sleep(Duration::from_secs(12).saturating_sub(stopped_at.elapsed()));
    let before_wake = a.line_count();
    let woke = epoch_secs();
    a.signal(libc::SIGCONT);
    // A hears that it lost its partitions, and joins again.
    a.wait_for_line_from(
        before_wake,
        |l| at(l, "revoke_begun") && field(l, "lost").as_deref() == Some("true"),
        WAIT,
    );
    a.wait_for_line_from(before_wake, |l| at(l, "assigned"), WAIT);
    let delivered = producer.finish();
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    wait_until(WAIT, || {
        let (a_got, b_got) = (handled(&a_file), handled(&b_file));
        expected
            .iter()
            .all(|m| a_got.contains_key(m) || b_got.contains_key(m))
    });
    let a_lines = a.stop(0, WAIT);
    b.stop(0, WAIT);
    let (a_got, b_got) = (handled(&a_file), handled(&b_file));
    // Started by A's processor after A woke, unflagged, though B had handled it before.
    let repeated: Vec<((i32, i64), f64)> = a_got
        .iter()
        .filter(|(m, (flagged, when))| {
            *when >= woke && !flagged && b_got.get(m).is_some_and(|(_, b_when)| b_when < when)
        })
        .map(|(m, (_, when))| (*m, when - woke))
        .collect();
    eprintln!(
        "hold queued ({topic}): {} messages, A handled {} ({} after waking), B {}, repeated unflagged by A after waking {}, {:.1} s",
        delivered.len(),
        a_got.len(),
        a_got.values().filter(|(_, w)| *w >= woke).count(),
        b_got.len(),
        repeated.len(),
        started.elapsed().as_secs_f64()
    );
    for l in a_lines[before_wake..]
        .iter()
        .filter(|l| !is_processed(l))
        .take(20)
    {
        eprintln!("  a: {l}");
    }
    assert!(
        repeated.is_empty(),
        "A's processor started calls after waking that B had handled, unflagged ((partition, offset), seconds after waking): {repeated:?}"
    );
    assert!(
        expected
            .iter()
            .all(|m| a_got.contains_key(m) || b_got.contains_key(m)),
        "every message handled"
    );
    assert!(
        count_at(&a_lines, "membership_in_doubt") >= 1,
        "A said its membership was in doubt"
    );
}

/// A producer thread that sends 4 messages every 100 ms, their keys cycling through
/// `keys` keys (a key's messages follow each other in its partition).
struct KeyedProducer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Delivered>>,
}

impl KeyedProducer {
    fn start(topic: &str, keys: usize) -> KeyedProducer {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (topic, s) = (topic.to_string(), stop.clone());
        let thread = std::thread::spawn(move || {
            let (mut delivered, mut n) = (Vec::new(), 0);
            while !s.load(std::sync::atomic::Ordering::Acquire) {
                let batch: Vec<(Option<Vec<u8>>, Vec<u8>)> = (n..n + 4)
                    .map(|i| {
                        let key = format!("k-{}", i % keys).into_bytes();
                        (Some(key), format!("message {i}").into_bytes())
                    })
                    .collect();
                n += 4;
                delivered.extend(produce(&topic, &batch));
                std::thread::sleep(Duration::from_millis(100));
            }
            delivered
        });
        KeyedProducer { stop, thread }
    }

    fn finish(self) -> Vec<Delivered> {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.thread.join().expect("producer thread")
    }
}
