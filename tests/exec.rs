//! The `exec` processor against the real broker and the real binary: Python handlers
//! written into a temporary directory, talking ackd's JSON-lines protocol.
//!
//! Handlers record every message they handled in a file (`handled`: one
//! `partition offset pid` line, written before the reply), so that tests can tell what
//! the child did apart from what ackd acknowledged and committed. Markers that must
//! fire once (a retry, a crash, a hang) are files created with O_EXCL, so they survive
//! the child's restart.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use common::{
    ackd::*, docs::code_block, lines::*, offsets::*, produce::*, spawn::*, topics::*, wait::*,
};

const WAIT: Duration = Duration::from_secs(60);

/// The opening of most tests here: a fresh topic of `partitions` partitions named after
/// `name`, a fresh group, and a fresh directory for the handler and its files.
fn exec_case(name: &str, partitions: i32) -> (String, String, std::path::PathBuf) {
    let (topic, group) = fresh_topic(name, partitions);
    (topic, group, fresh_dir(name))
}

/// The `n`th (from 1) Python block of docs/exec.md ("exec processor"), exactly as
/// written there: 1 is the handler, 2 the batched handler.
fn readme_handler(n: usize) -> String {
    code_block("docs/exec.md", "# exec processor", "```python\n", n)
}

/// What every test handler starts with: SIGTERM ignored (as in docs/exec.md's), `DIR`,
/// `once(name)`, and the `handled` file.
const HANDLER_PREAMBLE: &str = r#"import json, os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
def once(name):
    try:
        os.close(os.open(os.path.join(DIR, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False
handled = open(os.path.join(DIR, "handled"), "a")
"#;

/// What every test handler ends with, once stdin ended: the `eof-<pid>` file.
const HANDLER_EPILOGUE: &str = r#"
with open(os.path.join(DIR, "eof-%d" % os.getpid()), "w") as f:
    f.write("eof\n")
"#;

/// Writes a handler of `body` between the preamble and the epilogue into `dir`; returns
/// the command that runs it.
fn write_handler(dir: &Path, body: &str) -> String {
    let dir_literal = format!("DIR = {:?}\n", dir.to_str().unwrap());
    let script = [
        dir_literal.as_str(),
        HANDLER_PREAMBLE,
        body,
        HANDLER_EPILOGUE,
    ]
    .concat();
    let path = dir.join("handler.py");
    std::fs::write(&path, script).unwrap();
    format!("python3 {}", path.display())
}

/// A test handler: `case` is Python run per message with `p`, `o`, `v` (partition,
/// offset, value or None), `reply` (preset to ack) and `once(name)` in scope. Its reply
/// names the message by its offset alone (the form handlers written before ackd required
/// it keep working with). It records each handled message in `handled` and each request line in `requests`,
/// and writes `eof-<pid>` when stdin ends. Like docs/exec.md's, it ignores SIGTERM.
fn test_handler(dir: &Path, case: &str) -> String {
    test_handler_with(dir, case, "")
}

/// [`test_handler`] with `at_eof` run after stdin ended, before `eof-<pid>` is written.
fn test_handler_with(dir: &Path, case: &str, at_eof: &str) -> String {
    let case: String = case.lines().map(|l| format!("    {l}\n")).collect();
    let body = format!(
        r#"requests = open(os.path.join(DIR, "requests"), "a")
for line in sys.stdin:
    requests.write(line); requests.flush()
    msg = json.loads(line)
    p, o, v = msg["partition"], msg["offset"], msg.get("value")
    reply = {{"ack": True}}
{case}
    reply.setdefault("offset", o)
    handled.write(f"{{p}} {{o}} {{os.getpid()}}\n"); handled.flush()
    print(json.dumps(reply), flush=True)
{at_eof}"#
    );
    write_handler(dir, &body)
}

/// The lines of three space-separated numbers a handler wrote to `dir/name` (none if it
/// wrote no such file).
fn triples<A: FromStr, B: FromStr, C: FromStr>(dir: &Path, name: &str) -> Vec<(A, B, C)>
where
    A::Err: Debug,
    B::Err: Debug,
    C::Err: Debug,
{
    std::fs::read_to_string(dir.join(name))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

/// (partition, offset, pid) of every message the handler recorded, in order.
fn handled(dir: &Path) -> Vec<(i32, i64, u32)> {
    triples(dir, "handled")
}

/// Spawns `ackd`, waits until it has processed `n` messages, and stops it cleanly
/// ([`AckdProcess::stop_exec_cleanly`]); returns its lines.
fn run_until_processed(ackd: AckdBuilder, n: usize) -> Vec<String> {
    let ackd = ackd.spawn();
    ackd.wait_for_count(is_processed, n, WAIT);
    ackd.stop_exec_cleanly(WAIT)
}

/// 1: docs/exec.md's handler, 2 partitions: every message acknowledged once, in order per
/// partition, committed to the log end; the child's stderr is in ackd's log, tagged.
#[test]
fn the_readme_handler_acks_everything_once_in_order_and_its_stderr_is_logged() {
    let (topic, group, dir) = exec_case("exec-readme", 2);
    let path = dir.join("handler.py");
    std::fs::write(&path, readme_handler(1)).unwrap();
    let delivered = produce_keyed(&topic, 40, 0);
    let ends = log_ends(&delivered);
    let lines = run_until_processed(
        exec_ackd(&topic, &group, &format!("python3 {}", path.display())),
        40,
    );

    let counts = processed_counts(&lines);
    assert_eq!(counts.len(), 40, "{}", lines.join("\n"));
    assert!(counts.values().all(|n| *n == 1), "each once: {counts:?}");
    for (p, offsets) in offsets_by_partition(processed(&lines)) {
        assert_eq!(offsets, (0..ends[&p]).collect::<Vec<_>>(), "partition {p}");
    }
    assert_committed_to_ends(&group, &topic, 2, &ends);
    // Every message's stderr line, tagged with the child.
    let stderr = all_at(&lines, "exec_stderr");
    assert_eq!(stderr.len(), 40, "{}", lines.join("\n"));
    for l in &stderr {
        assert_eq!(field(l, "child").as_deref(), Some("0"), "{l}");
        assert!(field(l, "pid").is_some(), "{l}");
        assert!(
            field(l, "line")
                .unwrap()
                .starts_with(&format!("got {topic}/")),
            "{l}"
        );
    }
    assert_eq!(count_at(&lines, "exec_started"), 1);
    assert!(!lines.iter().any(|l| at(l, "exec_restart")));
}

/// 2: a retry asked for once is retried, then acknowledged; the child is kept.
#[test]
fn a_retry_reply_is_retried_then_acknowledged() {
    let (topic, group, dir) = exec_case("exec-retry", 1);
    let command = test_handler(
        &dir,
        r#"if v == "retry-me" and once("retry-%d-%d" % (p, o)):
    reply = {"retry": "not yet"}"#,
    );
    produce_strs(&topic, &["ok", "retry-me", "ok"]);
    let lines = run_until_processed(exec_ackd(&topic, &group, &command), 3);
    let retries: Vec<_> = lines.iter().filter(|l| at_offset(l, "retry", 1)).collect();
    assert_eq!(retries.len(), 1, "{}", lines.join("\n"));
    assert!(field(retries[0], "error").unwrap().contains("not yet"));
    assert_eq!(processed(&lines), vec![(0, 0), (0, 1), (0, 2)]);
    assert!(!lines.iter().any(|l| at(l, "exec_restart")));
    // The handler saw offset 1 twice (the retry), the others once.
    let seen: Vec<i64> = handled(&dir).iter().map(|h| h.1).collect();
    assert_eq!(seen, vec![0, 1, 1, 2]);
    assert_committed(&group, &topic, 0, Some(3));
}

/// 3: a child that exits on a message is restarted; the message is retried, nothing lost.
#[test]
fn a_crashing_child_is_restarted_and_its_message_retried() {
    let (topic, group, dir) = exec_case("exec-crash", 1);
    let command = test_handler(
        &dir,
        r#"if v == "crash" and once("crash-%d-%d" % (p, o)):
    print("crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)"#,
    );
    produce_strs(&topic, &["ok", "ok", "crash", "ok", "ok"]);
    let ackd = exec_ackd(&topic, &group, &command).spawn();
    ackd.wait_for_count(is_processed, 5, WAIT);
    let lines = ackd.stop_exec_cleanly(WAIT);
    let restarts = all_at(&lines, "exec_restart");
    assert_eq!(restarts.len(), 1, "{}", lines.join("\n"));
    let r = restarts[0];
    assert!(
        field(r, "reason").unwrap().contains("exit status: 3"),
        "{r}"
    );
    assert!(field(r, "reason").unwrap().contains("offset 2"), "{r}");
    assert_eq!(field(r, "restarts").as_deref(), Some("1"), "{r}");
    assert_eq!(
        field(r, "count#ackd.exec.restarts").as_deref(),
        Some("1"),
        "{r}"
    );
    assert!(lines.iter().any(|l| at_offset(l, "retry", 2)));
    assert!(lines.iter().any(
        |l| at(l, "exec_stderr") && field(l, "line").as_deref() == Some("crashing on purpose")
    ));
    assert_eq!(count_at(&lines, "exec_started"), 2);
    assert_eq!(
        processed(&lines),
        (0..5).map(|o| (0, o)).collect::<Vec<_>>()
    );
    let seen: Vec<i64> = handled(&dir).iter().map(|h| h.1).collect();
    assert_eq!(seen, vec![0, 1, 2, 3, 4], "each handled once to the end");
    assert_committed(&group, &topic, 0, Some(5));
}

/// 4: a child that hangs past ACKD_EXEC_TIMEOUT_MS is killed and restarted; the
/// message is retried.
#[test]
fn a_hanging_child_times_out_is_restarted_and_its_message_retried() {
    let (topic, group, dir) = exec_case("exec-hang", 1);
    let command = test_handler(
        &dir,
        r#"if v == "hang" and once("hang-%d-%d" % (p, o)):
    time.sleep(3600)"#,
    );
    produce_strs(&topic, &["ok", "hang", "ok"]);
    let lines = run_until_processed(
        exec_ackd(&topic, &group, &command).env("ACKD_EXEC_TIMEOUT_MS", "1000"),
        3,
    );
    let restarts = all_at(&lines, "exec_restart");
    assert_eq!(restarts.len(), 1, "{}", lines.join("\n"));
    let reason = field(restarts[0], "reason").unwrap();
    assert!(
        reason.contains("no reply within ACKD_EXEC_TIMEOUT_MS=1000"),
        "{reason}"
    );
    // Killed by SIGTERM well inside the 2 s grace: it ran about the timeout.
    let ran: u64 = field(restarts[0], "ran_ms").unwrap().parse().unwrap();
    assert!(ran >= 1000, "ran_ms={ran}");
    let retry = lines
        .iter()
        .find(|l| at_offset(l, "retry", 1))
        .expect("at=retry for offset 1");
    assert!(
        field(retry, "error").unwrap().contains("no reply"),
        "{retry}"
    );
    assert_eq!(processed(&lines), vec![(0, 0), (0, 1), (0, 2)]);
    assert_committed(&group, &topic, 0, Some(3));
}

/// 5: a permanent failure meets ACKD_ON_FAILURE (skip here); the child is kept. Also:
/// what a request looks like for a message with headers and bytes that are not UTF-8.
#[test]
fn a_fail_reply_meets_the_failure_policy_and_requests_carry_binary_as_base64() {
    let (topic, group, dir) = exec_case("exec-fail", 1);
    let command = test_handler(
        &dir,
        r#"if v == "bad":
    reply = {"fail": "bad input"}"#,
    );
    produce_values(
        &topic,
        &[
            (Some(b"k-0"), b"ok", &[("trace", b"t-1"), ("trace", b"t-2")]),
            (Some(b"k-1"), b"bad", &[]),
            (
                Some(&[0xff, 0xfe]),
                &[0x00, 0x9f, 0x92, 0x96],
                &[("bin", &[0xc3])],
            ),
        ],
    );
    let ackd = exec_ackd(&topic, &group, &command)
        .env("ACKD_ON_FAILURE", "skip")
        .spawn();
    ackd.wait_for_line(|l| is_processed_at(l, 2), WAIT);
    let lines = ackd.stop_exec_cleanly(WAIT);
    let skipped = lines
        .iter()
        .find(|l| at_offset(l, "skipped", 1))
        .expect("at=skipped for offset 1");
    let error = field(skipped, "error").unwrap();
    assert!(
        error.contains("permanent") && error.contains("bad input"),
        "{skipped}"
    );
    assert_eq!(
        field(skipped, "attempts").as_deref(),
        Some("1"),
        "not retried"
    );
    assert_eq!(processed(&lines), vec![(0, 0), (0, 2)]);
    assert!(!lines.iter().any(|l| at(l, "exec_restart")));
    assert_committed(&group, &topic, 0, Some(3));

    let requests: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("requests"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(requests.len(), 3);
    let r0 = &requests[0];
    assert_eq!(r0["topic"], topic.as_str());
    assert_eq!(r0["partition"], 0);
    assert_eq!(r0["offset"], 0);
    assert!(
        r0["timestamp_ms"].as_i64().unwrap() > 1_600_000_000_000,
        "{r0}"
    );
    assert_eq!(r0["key"], "k-0");
    assert_eq!(r0["value"], "ok");
    assert_eq!(
        r0["headers"],
        serde_json::json!([{"name":"trace","value":"t-1"},{"name":"trace","value":"t-2"}])
    );
    let r2 = &requests[2];
    assert_eq!(r2["key_base64"], "//4=", "{r2}");
    assert_eq!(r2["value_base64"], "AJ+Slg==", "{r2}");
    assert!(r2.get("key").is_none() && r2.get("value").is_none(), "{r2}");
    assert_eq!(
        r2["headers"],
        serde_json::json!([{"name":"bin","value_base64":"ww=="}])
    );
}

/// A header name that is not UTF-8 (any non-Java producer can write one; rust-rdkafka's
/// own header API panics on it) reaches the handler with U+FFFD for the invalid byte,
/// and the message is acknowledged like any other.
#[test]
fn a_header_name_that_is_not_utf8_reaches_the_handler_replaced() {
    let (topic, group, dir) = exec_case("exec-hdr", 1);
    let command = test_handler(&dir, "");
    produce_with_raw_header_name(&topic, b"tr\xffce", b"t-1", b"odd");
    produce_strs(&topic, &["after"]);
    let lines = run_until_processed(exec_ackd(&topic, &group, &command), 2);
    assert_eq!(processed(&lines), vec![(0, 0), (0, 1)]);
    assert!(!lines
        .iter()
        .any(|l| at(l, "retry") || at(l, "process_failed")));
    let first: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(dir.join("requests"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first["value"], "odd");
    assert_eq!(
        first["headers"],
        serde_json::json!([{"name": "tr\u{fffd}ce", "value": "t-1"}])
    );
    assert_committed(&group, &topic, 0, Some(2));
}

/// 6: SIGTERM with a message in the child: it is finished and committed, the child gets
/// EOF (and says so), ackd exits 0, and a second run resumes exactly after it. The
/// SIGTERM goes to every process, as Heroku sends it: ackd, the child's `sh`, the handler.
#[test]
fn sigterm_finishes_the_message_in_flight_then_gives_the_child_eof() {
    let (topic, group, dir) = exec_case("exec-stop", 1);
    let command = test_handler(&dir, "time.sleep(0.1)");
    produce_numbered(&topic, 40);

    let first = exec_ackd(&topic, &group, &command).spawn();
    first.wait_for_count(is_processed, 5, WAIT);
    let sh: libc::pid_t = field(&first.wait_for_line(|l| at(l, "exec_started"), WAIT), "pid")
        .unwrap()
        .parse()
        .unwrap();
    let handler = handled(&dir)[0].2 as libc::pid_t;
    assert_ne!(sh, handler, "sh runs the handler as its child");
    for pid in [sh, handler] {
        // SAFETY: kill(2) on processes this test's ackd started; no memory effects.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    let lines = first.stop_exec_cleanly(WAIT);
    assert!(
        !lines.iter().any(|l| at(l, "exec_restart")),
        "sh's death is not the handler's"
    );
    let acked = assert_stopped_where_handled(&dir, &topic, &group, &lines, 40);
    let pid = handled(&dir)[0].2;
    assert!(
        dir.join(format!("eof-{pid}")).is_file(),
        "the child saw EOF"
    );
    assert_a_second_run_hands_over_the_rest(
        &dir,
        &topic,
        &group,
        (acked, 40),
        exec_ackd(&topic, &group, &command),
    );
}

/// After a graceful stop of the first run on a 1-partition topic of `total` messages
/// (its `lines`): it stopped before the end, and what the child handled is exactly what
/// was committed (the message or batch in flight at SIGTERM was finished and
/// acknowledged, none was started after it). Returns how many that is.
fn assert_stopped_where_handled(
    dir: &Path,
    topic: &str,
    group: &str,
    lines: &[String],
    total: i64,
) -> i64 {
    let acked = processed(lines).len() as i64;
    assert!(acked < total, "stopped before the end");
    let committed_first = committed_offset(group, topic, 0);
    assert_eq!(committed_first, Some(acked), "{}", lines.join("\n"));
    let seen: Vec<i64> = handled(dir).iter().map(|h| h.1).collect();
    assert_eq!(
        seen,
        (0..acked).collect::<Vec<_>>(),
        "handled is what was committed"
    );
    acked
}

/// A second run (`second`) after [`assert_stopped_where_handled`]: it resumes exactly
/// after the first, the child has handled each of the `total` messages exactly once, and
/// all are committed.
fn assert_a_second_run_hands_over_the_rest(
    dir: &Path,
    topic: &str,
    group: &str,
    (acked, total): (i64, i64),
    second: AckdBuilder,
) {
    let second = second.spawn();
    second.wait_for_count(is_processed, (total - acked) as usize, WAIT);
    let lines = second.stop_exec_cleanly(WAIT);
    assert_eq!(
        processed(&lines),
        (acked..total).map(|o| (0, o)).collect::<Vec<_>>(),
        "resumed exactly after the first run"
    );
    let seen: Vec<i64> = handled(dir).iter().map(|h| h.1).collect();
    assert_eq!(
        seen,
        (0..total).collect::<Vec<_>>(),
        "each handled exactly once"
    );
    assert_committed(group, topic, 0, Some(total));
}

/// 7: three children, four partitions: each partition's messages are handled in order,
/// each once, and the pool is used.
#[test]
fn a_pool_of_three_keeps_the_order_of_each_of_four_partitions() {
    let (topic, group, dir) = exec_case("exec-pool", 4);
    let command = test_handler(&dir, "time.sleep(0.01)");
    let delivered = produce_keyed(&topic, 120, 0);
    let ends = log_ends(&delivered);
    assert_eq!(ends.len(), 4, "keys spread over all partitions");
    let lines = run_until_processed(
        exec_ackd(&topic, &group, &command).env("ACKD_EXEC_CONCURRENCY", "3"),
        120,
    );

    let started: BTreeSet<String> = lines
        .iter()
        .filter(|l| at(l, "exec_started"))
        .map(|l| field(l, "child").unwrap())
        .collect();
    assert_eq!(started, ["0", "1", "2"].map(String::from).into());
    assert_eq!(count_at(&lines, "exec_stopped"), 3);
    let handled = handled(&dir);
    let by_child = offsets_by_partition(handled.iter().map(|h| (h.2 as i32, h.1)));
    assert!(by_child.len() >= 2, "the pool was used: {by_child:?}");
    let expected: BTreeMap<i32, Vec<i64>> =
        ends.iter().map(|(p, e)| (*p, (0..*e).collect())).collect();
    assert_eq!(
        offsets_by_partition(handled.iter().map(|h| (h.0, h.1))),
        expected,
        "the handlers saw each partition in order, each message once"
    );
    assert_eq!(offsets_by_partition(processed(&lines)), expected);
    assert_committed_to_ends(&group, &topic, 4, &ends);
}

/// A stray stdout line is a protocol error, never taken for a reply: the message is
/// retried on a new child, and the message after it is not acknowledged by mistake.
#[test]
fn a_stray_stdout_line_is_a_protocol_error_that_replaces_the_child() {
    let (topic, group, dir) = exec_case("exec-stray", 1);
    let command = test_handler(
        &dir,
        r#"if v == "chatty" and once("chatty-%d-%d" % (p, o)):
    print("debug: looking at", o, flush=True)"#,
    );
    produce_strs(&topic, &["ok", "chatty", "ok"]);
    let lines = run_until_processed(exec_ackd(&topic, &group, &command), 3);
    let restarts = all_at(&lines, "exec_restart");
    assert_eq!(restarts.len(), 1, "{}", lines.join("\n"));
    let reason = field(restarts[0], "reason").unwrap();
    assert!(
        reason.contains("reply is not JSON") && reason.contains("debug: looking at 1"),
        "{reason}"
    );
    assert!(lines.iter().any(|l| at_offset(l, "retry", 1)));
    assert_eq!(processed(&lines), vec![(0, 0), (0, 1), (0, 2)]);
    // Offset 1 was handled twice (its reply was lost with the replaced child), 2 once.
    let seen: Vec<i64> = handled(&dir).iter().map(|h| h.1).collect();
    assert_eq!(seen, vec![0, 1, 1, 2]);
    assert_committed(&group, &topic, 0, Some(3));
}

/// A child that does not exit at EOF gets SIGTERM halfway to the deadline; one that
/// ignores SIGTERM too gets SIGKILL just before it. ackd still exits 0 in time.
#[test]
fn children_that_outlive_eof_get_sigterm_then_sigkill_within_the_shutdown_timeout() {
    for (how, at_eof) in [
        (
            "sigterm",
            "signal.signal(signal.SIGTERM, signal.SIG_DFL)\ntime.sleep(3600)",
        ),
        ("sigkill", "time.sleep(3600)"),
    ] {
        let (topic, group, dir) = exec_case("exec-linger", 1);
        let command = test_handler_with(&dir, "", at_eof);
        produce_strs(&topic, &["ok"]);
        let ackd = exec_ackd(&topic, &group, &command)
            .env("ACKD_SHUTDOWN_TIMEOUT_MS", "3000")
            // It must fit in the drain's share of the deadline (2400 ms of 3000).
            .env("ACKD_EXEC_TIMEOUT_MS", "2000")
            .spawn();
        ackd.wait_for_count(is_processed, 1, WAIT);
        // In time by ackd's own clock: the child's end is logged before the exit, under
        // the 3 s deadline (a wall-clock bound here would time the machine instead).
        ackd.stop(0, WAIT);
        let lines = ackd.lines();
        let stopped = lines
            .iter()
            .find(|l| at(l, "exec_stopped"))
            .unwrap_or_else(|| panic!("no at=exec_stopped:\n{}", lines.join("\n")));
        assert_eq!(field(stopped, "how").as_deref(), Some(how), "{stopped}");
        let took: u64 = field(stopped, "duration_ms").unwrap().parse().unwrap();
        assert!((1000..3000).contains(&took), "{stopped}");
        // The handler is gone.
        let pid = handled(&dir)[0].2 as libc::pid_t;
        // Gone, or a zombie (its parent `sh` died first and whoever inherited it has not
        // reaped it yet).
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        });
        assert!(!alive, "handler {pid} still running after {how}");
        assert_committed(&group, &topic, 0, Some(1));
    }
}

/// ACKD_PROCESSOR=exec without a command is a configuration error naming the setting.
#[test]
fn exec_without_a_command_is_a_configuration_error() {
    let ackd = AckdBuilder::without_broker("t", "g")
        .env("ACKD_PROCESSOR", "exec")
        .spawn();
    ackd.assert_config_error("ACKD_EXEC_COMMAND", WAIT);
}

// ---- secrets: a handler is often third-party code ----

/// Secrets given to ackd in ways a plaintext broker accepts: two librdkafka secret
/// properties and an http token (unused by exec, but ackd's). Each value holds `Zq`.
const EXEC_SECRETS: &[(&str, &str)] = &[
    ("ACKD_RDKAFKA_SASL_PASSWORD", "exec-pw-Zq1"),
    ("ACKD_RDKAFKA_SSL_KEY_PASSWORD", "exec-kp-Zq2"),
    ("ACKD_HTTP_HEADERS", "Authorization: Bearer exec-tok-Zq3"),
];

/// Runs a handler that writes its environment (JSON) to `env` on the first message,
/// with [`EXEC_SECRETS`] and `extra` set; returns that environment.
fn child_environment(name: &str, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    let (topic, group) = fresh_topic(name, 1);
    produce_strs(&topic, &["one"]);
    let dir = fresh_dir(name);
    let command = test_handler(
        &dir,
        r#"if once("env"):
    with open(os.path.join(DIR, "env.tmp"), "w") as f:
        json.dump(dict(os.environ), f)
    os.rename(os.path.join(DIR, "env.tmp"), os.path.join(DIR, "env"))"#,
    );
    let mut builder = exec_ackd(&topic, &group, &command).env("ACKD_RDKAFKA_CLIENT_ID", "exec-env");
    for (k, v) in EXEC_SECRETS.iter().chain(extra) {
        builder = builder.env(*k, *v);
    }
    let ackd = builder.spawn();
    ackd.wait_for_count(is_processed, 1, WAIT);
    ackd.stop_exec_cleanly(WAIT);
    let text = std::fs::read_to_string(dir.join("env")).expect("the handler wrote env");
    serde_json::from_str(&text).expect("env is a JSON object")
}

/// exec children inherit none of ackd's credentials by default; ACKD_EXEC_PASS_SECRETS
/// names the ones a handler is given. What is no credential stays.
#[test]
fn exec_children_get_ackd_secrets_only_when_named() {
    let env = child_environment("exec-env", &[]);
    let leaked: Vec<_> = env.iter().filter(|(_, v)| v.contains("Zq")).collect();
    assert!(leaked.is_empty(), "the child got {leaked:?}");
    assert_eq!(
        env.get("ACKD_RDKAFKA_CLIENT_ID").map(String::as_str),
        Some("exec-env")
    );
    assert!(
        env.contains_key("ACKD_TOPICS") && env.contains_key("ACKD_EXEC_CHILD"),
        "{env:?}"
    );

    let env = child_environment(
        "exec-env-pass",
        &[(
            "ACKD_EXEC_PASS_SECRETS",
            "ACKD_RDKAFKA_SASL_PASSWORD,ACKD_HTTP_HEADERS",
        )],
    );
    let given: BTreeMap<&str, &str> = env
        .iter()
        .filter(|(_, v)| v.contains("Zq"))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        given,
        BTreeMap::from([
            ("ACKD_HTTP_HEADERS", "Authorization: Bearer exec-tok-Zq3"),
            ("ACKD_RDKAFKA_SASL_PASSWORD", "exec-pw-Zq1"),
        ])
    );
}

/// A secret with `"`, `\` and a control character, written by a handler to its stderr:
/// ackd's `at=exec_stderr` line escapes it, and the scrubber still finds it: it looks for
/// the escaped form too, not only the raw value.
#[test]
fn a_secret_with_quotes_and_backslashes_never_reaches_a_line() {
    const SECRET: &str = "q\"uo\\te\u{1}-Zq9x";
    const PYTHON_LITERAL: &str = r#""q\"uo\\te\x01-Zq9x""#;
    let (topic, group) = fresh_topic("exec-scrub", 1);
    produce_strs(&topic, &["one"]);
    let dir = fresh_dir("exec-scrub");
    let command = test_handler(
        &dir,
        &format!(
            "sys.stderr.write(\"login with %s failed\\n\" % {PYTHON_LITERAL}); sys.stderr.flush()"
        ),
    );
    let lines = run_until_processed(
        exec_ackd(&topic, &group, &command).env("ACKD_RDKAFKA_SASL_PASSWORD", SECRET),
        1,
    );
    let all = lines.join("\n");
    let stderr = lines
        .iter()
        .find(|l| at(l, "exec_stderr"))
        .unwrap_or_else(|| panic!("no at=exec_stderr: {all}"));
    assert!(stderr.contains("login with [redacted] failed"), "{stderr}");
    for fragment in ["Zq9", "\"uo", "uo\\"] {
        assert!(!all.contains(fragment), "{fragment} in {all}");
    }
}

// ---- batches: one JSON array per request line, one reply per batch ----

/// A batch handler: `case` is Python run per message of a batch with `p`, `o`, `v`,
/// `reply` (preset to ack) and `once(name)` in scope; it may set `reply` (with the
/// failing `"offset"`) and `break`, as docs/exec.md's batched handler does; the reply then
/// gets the batch's `"first"` and `"last"`. Each message
/// it went past is recorded in `handled`, each batch as `partition first count` in
/// `batches`.
fn batch_handler(dir: &Path, case: &str) -> String {
    let case: String = case.lines().map(|l| format!("        {l}\n")).collect();
    let body = format!(
        r#"batches = open(os.path.join(DIR, "batches"), "a")
for line in sys.stdin:
    batch = json.loads(line)
    assert isinstance(batch, list), line
    batches.write(f"{{batch[0]['partition']}} {{batch[0]['offset']}} {{len(batch)}}\n"); batches.flush()
    reply = {{"ack": True}}
    for msg in batch:
        p, o, v = msg["partition"], msg["offset"], msg.get("value")
{case}
        handled.write(f"{{p}} {{o}} {{os.getpid()}}\n"); handled.flush()
    reply.update(first=batch[0]["offset"], last=batch[-1]["offset"])
    print(json.dumps(reply), flush=True)"#
    );
    write_handler(dir, &body)
}

/// (partition, first offset, message count) of every batch the handler was sent.
fn batches_sent(dir: &Path) -> Vec<(i32, i64, usize)> {
    triples(dir, "batches")
}

/// Each batch is one partition's consecutive messages, no more than `max`, and the
/// batches of a partition follow each other without gap or overlap from 0 to its end.
fn assert_batches_tile(batches: &[(i32, i64, usize)], ends: &BTreeMap<i32, i64>, max: usize) {
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for &(p, first, n) in batches {
        assert!((1..=max).contains(&n), "batch of {n} (max {max})");
        let at = next.entry(p).or_insert(0);
        assert_eq!(first, *at, "partition {p}: {batches:?}");
        *at += n as i64;
    }
    assert_eq!(&next, ends, "{batches:?}");
}

/// Batches of 2, 3, 7 and 100 over 120 messages on 3 partitions: the handler gets each
/// message once, in order, in arrays of at most the maximum; ackd acknowledges each
/// once and commits to the log end.
#[test]
fn exec_batches_of_any_size_hand_over_and_commit_each_message_once() {
    for max in [2usize, 3, 7, 100] {
        let (topic, group) = fresh_topic(&format!("exec-batch{max}"), 3);
        let dir = fresh_dir("exec-batch");
        let command = batch_handler(&dir, "");
        let delivered = produce_keyed(&topic, 120, 0);
        let ends = log_ends(&delivered);
        assert_eq!(ends.len(), 3, "keys spread over all partitions");
        let lines = run_until_processed(exec_ackd(&topic, &group, &command).batches(max), 120);

        let batches = batches_sent(&dir);
        assert_batches_tile(&batches, &ends, max);
        // The backlog was there before the start: batches were filled, not sent a
        // message or two at a time (twice the fewest arrays possible leaves room for a
        // fetch ending in the middle of a batch).
        let fewest: usize = ends.values().map(|e| (*e as usize).div_ceil(max)).sum();
        assert!(
            batches.len() <= 2 * fewest,
            "max {max}: {} arrays for 120 messages, {fewest} would do",
            batches.len()
        );
        let expected: BTreeMap<i32, Vec<i64>> =
            ends.iter().map(|(p, e)| (*p, (0..*e).collect())).collect();
        let handled = handled(&dir);
        assert_eq!(
            offsets_by_partition(handled.iter().map(|h| (h.0, h.1))),
            expected
        );
        let counts = processed_counts(&lines);
        assert_eq!(counts.len(), 120, "max {max}");
        assert!(counts.values().all(|n| *n == 1), "each once: {counts:?}");
        assert_eq!(
            offsets_by_partition(processed(&lines)),
            expected,
            "max {max}"
        );
        let committed = committed(&group, &topic, 3);
        for (p, end) in &ends {
            assert_eq!(committed[p], Some(*end), "max {max}, partition {p}");
        }
    }
}

/// docs/exec.md's batched handler, exactly as written there, acknowledges everything.
#[test]
fn the_readme_batch_handler_acks_everything_once() {
    let (topic, group) = fresh_topic("exec-readme-batch", 2);
    let code = readme_handler(2);
    assert!(code.contains("batch = json.loads(line)"), "{code}");
    let dir = fresh_dir("exec-readme-batch");
    let path = dir.join("handler.py");
    std::fs::write(&path, code).unwrap();
    let delivered = produce_keyed(&topic, 40, 0);
    let ends = log_ends(&delivered);
    let lines = run_until_processed(
        exec_ackd(&topic, &group, &format!("python3 {}", path.display())).batches(10),
        40,
    );
    let counts = processed_counts(&lines);
    assert_eq!(counts.len(), 40, "{}", lines.join("\n"));
    assert!(counts.values().all(|n| *n == 1), "each once: {counts:?}");
    assert_committed_to_ends(&group, &topic, 2, &ends);
}

/// 20 messages, batches of 8; a permanent failure reported at offset 13 (the second
/// batch's sixth) under halt: 8..12 are acknowledged with the batch, 13 is where the
/// partition stops, nothing after it is acknowledged, and ackd exits 1.
#[test]
fn an_exec_batch_failing_at_an_offset_acks_the_ones_before_it_then_halts() {
    let (topic, group, dir) = exec_case("exec-batch-halt", 1);
    let command = batch_handler(
        &dir,
        r#"if o == 13:
    reply = {"fail": "bad row", "offset": o}
    break"#,
    );
    produce_numbered(&topic, 20);
    let ackd = exec_ackd(&topic, &group, &command).batches(8).spawn();
    let failed = ackd.wait_for_line(|l| at_offset(l, "process_failed", 13), WAIT);
    assert!(
        field(&failed, "error").unwrap().contains("bad row"),
        "{failed}"
    );
    let lines = ackd.stop(1, WAIT);
    assert_eq!(
        processed(&lines),
        (0..13).map(|o| (0, o)).collect::<Vec<_>>()
    );
    assert_eq!(batches_sent(&dir)[..2], [(0, 0, 8), (0, 8, 8)]);
    let seen: Vec<i64> = handled(&dir).iter().map(|h| h.1).collect();
    assert_eq!(seen, (0..13).collect::<Vec<_>>());
    assert_committed(&group, &topic, 0, Some(13));
}

/// A retry asked for at offset 13 of the batch 8..15: 8..12 are acknowledged, and 13
/// with the rest of the batch (13, 14, 15) comes again as a batch of its own.
#[test]
fn an_exec_batch_retry_at_an_offset_resends_from_there() {
    let (topic, group, dir) = exec_case("exec-batch-retry", 1);
    let command = batch_handler(
        &dir,
        r#"if o == 13 and once("retry-13"):
    reply = {"retry": "not yet", "offset": o}
    break"#,
    );
    produce_numbered(&topic, 16);
    let lines = run_until_processed(exec_ackd(&topic, &group, &command).batches(8), 16);
    let retries = all_at(&lines, "retry");
    assert_eq!(retries.len(), 1, "{}", lines.join("\n"));
    assert_eq!(field(retries[0], "offset").as_deref(), Some("13"));
    assert_eq!(
        field(retries[0], "batch_messages").as_deref(),
        Some("3"),
        "{}",
        retries[0]
    );
    assert!(field(retries[0], "error").unwrap().contains("not yet"));
    assert_eq!(
        batches_sent(&dir),
        vec![(0, 0, 8), (0, 8, 8), (0, 13, 3)],
        "13..15 sent again as a batch"
    );
    let seen: Vec<i64> = handled(&dir).iter().map(|h| h.1).collect();
    assert_eq!(seen, (0..16).collect::<Vec<_>>(), "each handled once");
    assert_eq!(
        processed(&lines),
        (0..16).map(|o| (0, o)).collect::<Vec<_>>()
    );
    assert!(!lines.iter().any(|l| at(l, "exec_restart")));
    assert_committed(&group, &topic, 0, Some(16));
}

/// A reply naming an offset that is not in the batch is a protocol error: the child is
/// replaced and the batch retried, nothing acknowledged by mistake.
#[test]
fn an_exec_batch_reply_with_an_offset_outside_the_batch_replaces_the_child() {
    let (topic, group, dir) = exec_case("exec-batch-outside", 1);
    let command = batch_handler(
        &dir,
        r#"if o == 5 and once("outside"):
    reply = {"retry": "confused", "offset": 999}
    break"#,
    );
    produce_numbered(&topic, 8);
    let lines = run_until_processed(exec_ackd(&topic, &group, &command).batches(8), 8);
    let restarts = all_at(&lines, "exec_restart");
    assert_eq!(restarts.len(), 1, "{}", lines.join("\n"));
    assert!(
        field(restarts[0], "reason").unwrap().contains("999"),
        "{}",
        restarts[0]
    );
    // The whole batch came again (nothing of it was acknowledged).
    assert_eq!(batches_sent(&dir), vec![(0, 0, 8), (0, 0, 8)]);
    let counts = processed_counts(&lines);
    assert_eq!(counts.len(), 8);
    assert!(counts.values().all(|n| *n == 1), "each once: {counts:?}");
    assert_committed(&group, &topic, 0, Some(8));
}

/// A child that dies in the middle of the batch 8..15 (after handling 8..11): the
/// batch is retried from 8 on a new child; the handler sees 8..11 twice (at least
/// once), ackd acknowledges every message once and commits to the end.
#[test]
fn an_exec_child_crashing_mid_batch_gets_the_batch_again() {
    let (topic, group, dir) = exec_case("exec-batch-crash", 1);
    let command = batch_handler(
        &dir,
        r#"if o == 12 and once("crash-12"):
    os._exit(3)"#,
    );
    produce_numbered(&topic, 20);
    let lines = run_until_processed(exec_ackd(&topic, &group, &command).batches(8), 20);
    let restarts = all_at(&lines, "exec_restart");
    assert_eq!(restarts.len(), 1, "{}", lines.join("\n"));
    assert!(
        field(restarts[0], "reason")
            .unwrap()
            .contains("exit status: 3"),
        "{}",
        restarts[0]
    );
    let retry = lines
        .iter()
        .find(|l| at(l, "retry"))
        .expect("at=retry for the batch");
    assert_eq!(field(retry, "offset").as_deref(), Some("8"), "{retry}");
    assert_eq!(field(retry, "batch_messages").as_deref(), Some("8"));
    assert_eq!(batches_sent(&dir)[..3], [(0, 0, 8), (0, 8, 8), (0, 8, 8)]);
    let seen: Vec<i64> = handled(&dir).iter().map(|h| h.1).collect();
    let expected: Vec<i64> = (0..12).chain(8..20).collect();
    assert_eq!(seen, expected, "8..11 handled twice, the rest once");
    assert_eq!(
        processed(&lines),
        (0..20).map(|o| (0, o)).collect::<Vec<_>>(),
        "acknowledged once each"
    );
    assert_committed(&group, &topic, 0, Some(20));
}

/// SIGTERM in the middle of 150 messages in batches of 5: the batch in the child is
/// finished and committed, none is started after it, and a second run hands over the
/// rest: the handler saw every message exactly once.
#[test]
fn sigterm_mid_stream_with_exec_batches_loses_and_repeats_nothing() {
    let (topic, group, dir) = exec_case("exec-batch-stop", 1);
    let command = batch_handler(&dir, "time.sleep(0.01)");
    produce_numbered(&topic, 150);

    let first = exec_ackd(&topic, &group, &command).batches(5).spawn();
    first.wait_for_count(is_processed, 20, WAIT);
    let lines = first.stop_exec_cleanly(WAIT);
    let acked = assert_stopped_where_handled(&dir, &topic, &group, &lines, 150);
    assert_a_second_run_hands_over_the_rest(
        &dir,
        &topic,
        &group,
        (acked, 150),
        exec_ackd(&topic, &group, &command).batches(5),
    );
}

/// ACKD_BATCH_MAX_BYTES=35 over messages of 10 bytes with one of 50 in the middle: three
/// to a batch; the message that would go over starts the next batch, and the big one is
/// a batch of its own. Every message is acknowledged once and committed.
#[test]
fn exec_batches_stop_at_the_byte_limit() {
    let (topic, group, dir) = exec_case("exec-batch-bytes", 1);
    let command = batch_handler(&dir, "");
    let values: Vec<Vec<u8>> = (0..20)
        .map(|i| {
            let len = if i == 10 { 50 } else { 10 };
            format!("{i:0>len$}").into_bytes()
        })
        .collect();
    let messages: Vec<ValueRecord<'_>> = values
        .iter()
        .map(|v| (None, v.as_slice(), &[][..]))
        .collect();
    produce_values(&topic, &messages);
    let lines = run_until_processed(
        exec_ackd(&topic, &group, &command)
            .batches(100)
            .env("ACKD_BATCH_MAX_BYTES", "35"),
        20,
    );
    let start = lines.iter().find(|l| at(l, "start")).expect("at=start");
    assert_eq!(field(start, "batch_max_bytes").as_deref(), Some("35"));
    let batches: Vec<(i64, usize)> = batches_sent(&dir).iter().map(|b| (b.1, b.2)).collect();
    assert_eq!(
        batches,
        vec![
            (0, 3),
            (3, 3),
            (6, 3),
            (9, 1),
            (10, 1),
            (11, 3),
            (14, 3),
            (17, 3)
        ]
    );
    assert_eq!(
        processed(&lines),
        (0..20).map(|o| (0, o)).collect::<Vec<_>>()
    );
    assert_committed(&group, &topic, 0, Some(20));
}

// ---- misbehaving handlers: no line acknowledges a message the handler did not answer ----

/// What ackd acknowledged that the handler never finished: acknowledged (partition,
/// offset) pairs missing from `handled`.
fn acked_unhandled(lines: &[String], dir: &Path) -> Vec<(i32, i64)> {
    let handled: BTreeSet<(i32, i64)> = handled(dir).iter().map(|h| (h.0, h.1)).collect();
    processed(lines)
        .into_iter()
        .filter(|m| !handled.contains(m))
        .collect()
}

/// One message per request; the handler misbehaves once at each of four offsets and
/// answers properly (naming topic, partition and offset) otherwise. At 2 a debug print
/// that looks like an unnamed ack, then it dies before doing the work; at 4 an answer
/// naming the previous offset (out of order), then it dies; at 6 no answer at all (the
/// timeout); at 8 an extra unnamed ack after the real reply. None of these lines
/// acknowledges anything: each is a protocol error (or a timeout) that replaces the
/// child, the message in flight comes again, and every acknowledged message was handled.
#[test]
fn misbehaving_handlers_never_ack_a_message_they_did_not_answer() {
    let (topic, group, dir) = exec_case("exec-misbehave", 1);
    let command = write_handler(
        &dir,
        r#"for line in sys.stdin:
    msg = json.loads(line)
    p, o = msg["partition"], msg["offset"]
    name = {"topic": msg["topic"], "partition": p, "offset": o}
    if o == 2 and once("debug-2"):
        print(json.dumps({"ack": True}), flush=True)
        time.sleep(0.5); os._exit(3)
    if o == 4 and once("stale-4"):
        print(json.dumps({"ack": True, "offset": o - 1}), flush=True)
        time.sleep(0.5); os._exit(3)
    if o == 6 and once("silent-6"):
        time.sleep(3600)
    handled.write(f"{p} {o} {os.getpid()}\n"); handled.flush()
    print(json.dumps({"ack": True, **name}), flush=True)
    if o == 8 and once("extra-8"):
        print(json.dumps({"ack": True}), flush=True)
"#,
    );
    produce_numbered(&topic, 10);
    let ackd = exec_ackd(&topic, &group, &command)
        .env("ACKD_EXEC_TIMEOUT_MS", "1500")
        .spawn();
    ackd.wait_for_line(|l| is_processed_at(l, 9), WAIT);
    let lines = ackd.stop_exec_cleanly(WAIT);
    let lost = acked_unhandled(&lines, &dir);
    let counts = processed_counts(&lines);
    let restarts = all_at(&lines, "exec_restart");
    eprintln!(
        "misbehaving handler: acknowledged {} messages ({} distinct), acknowledged but never handled {lost:?}, restarts {}, committed {:?}",
        processed(&lines).len(),
        counts.len(),
        restarts.len(),
        committed_offset(&group, &topic, 0)
    );
    assert_eq!(lost, vec![], "acknowledged without being handled");
    assert_eq!(
        processed(&lines),
        (0..10).map(|o| (0, o)).collect::<Vec<_>>(),
        "each once, in order"
    );
    for o in [2, 4, 6] {
        assert!(
            lines.iter().any(|l| at_offset(l, "retry", o)),
            "offset {o} retried:\n{}",
            lines.join("\n")
        );
    }
    assert_eq!(restarts.len(), 4, "{}", lines.join("\n"));
    assert_committed(&group, &topic, 0, Some(10));
}

/// Batches of 5 over 15 messages. The first batch is answered the way a handler that
/// works on its messages in parallel might: the last message's own answer first (naming
/// its offset), then it dies; the second is answered once per message with the
/// docs/exec.md's bare `{"ack": true}`, and it dies at the third. A batch is acknowledged only
/// by a reply naming its first and last offsets: nothing of either is acknowledged, both
/// come again, and every acknowledged message was handled.
#[test]
fn a_batch_answered_per_message_or_out_of_order_acks_nothing_it_did_not_answer() {
    let (topic, group, dir) = exec_case("exec-batch-misbehave", 1);
    let command = write_handler(
        &dir,
        r#"for line in sys.stdin:
    batch = json.loads(line)
    p, first, last = batch[0]["partition"], batch[0]["offset"], batch[-1]["offset"]
    if first == 0 and once("reordered"):
        handled.write(f"{p} {last} {os.getpid()}\n"); handled.flush()
        print(json.dumps({"ack": True, "partition": p, "offset": last}), flush=True)
        time.sleep(0.5); os._exit(3)
    if first == 5 and once("per-message"):
        for msg in batch:
            if msg["offset"] == first + 2:
                time.sleep(0.5); os._exit(3)
            handled.write(f"{p} {msg['offset']} {os.getpid()}\n"); handled.flush()
            print(json.dumps({"ack": True}), flush=True)
            time.sleep(0.2)
    for msg in batch:
        handled.write(f"{p} {msg['offset']} {os.getpid()}\n"); handled.flush()
    print(json.dumps({"ack": True, "partition": p, "first": first, "last": last}), flush=True)
"#,
    );
    produce_numbered(&topic, 15);
    let ackd = exec_ackd(&topic, &group, &command).batches(5).spawn();
    ackd.wait_for_line(|l| is_processed_at(l, 14), WAIT);
    let lines = ackd.stop_exec_cleanly(WAIT);
    let lost = acked_unhandled(&lines, &dir);
    let counts = processed_counts(&lines);
    let restarts = count_at(&lines, "exec_restart");
    eprintln!(
        "batch answered per message: acknowledged {} messages ({} distinct), acknowledged but never handled {lost:?}, restarts {restarts}, committed {:?}",
        processed(&lines).len(),
        counts.len(),
        committed_offset(&group, &topic, 0)
    );
    assert_eq!(lost, vec![], "acknowledged without being handled");
    assert_eq!(
        processed(&lines),
        (0..15).map(|o| (0, o)).collect::<Vec<_>>(),
        "each once, in order"
    );
    assert_eq!(restarts, 2, "{}", lines.join("\n"));
    assert_committed(&group, &topic, 0, Some(15));
}

/// A handler that writes a 32 MiB line to stderr and, once, a 32 MiB reply: the stderr
/// line is logged cut at ACKD_EXEC_MAX_LINE_BYTES (saying how much was dropped), the
/// reply is a protocol error (the message comes again), and ackd's peak memory grows by
/// far less than the size of one such line (a quarter of it) from before the first one.
#[test]
fn huge_handler_lines_are_cut_and_memory_stays_bounded() {
    let (topic, group, dir) = exec_case("exec-huge", 1);
    let command = write_handler(
        &dir,
        r#"HUGE = 32 * 1024 * 1024
for line in sys.stdin:
    msg = json.loads(line)
    p, o = msg["partition"], msg["offset"]
    while o == 1 and not os.path.exists(os.path.join(DIR, "go")):
        time.sleep(0.01)
    if o == 1 and once("stderr-1"):
        sys.stderr.write("e" * HUGE + "\n"); sys.stderr.flush()
    if o == 2 and once("stdout-2"):
        print(json.dumps({"ack": True, "offset": o, "pad": "x" * HUGE}), flush=True)
        continue
    handled.write(f"{p} {o} {os.getpid()}\n"); handled.flush()
    print(json.dumps({"ack": True, "offset": o}), flush=True)
"#,
    );
    produce_numbered(&topic, 4);
    let ackd = exec_ackd(&topic, &group, &command).spawn();
    // Running, offset 0 done, and the handler holds offset 1 back: memory before the lines.
    ackd.wait_for_line(|l| is_processed_at(l, 0), WAIT);
    let before_kib = peak_rss_kib(ackd.pid());
    std::fs::write(dir.join("go"), "").unwrap();
    ackd.wait_for_line(|l| is_processed_at(l, 3), WAIT);
    let peak_kib = peak_rss_kib(ackd.pid());
    let lines = ackd.stop_exec_cleanly(WAIT);
    let longest = lines.iter().map(String::len).max().unwrap_or(0);
    eprintln!(
        "huge lines: ackd's peak RSS {before_kib} KiB before them, {peak_kib} KiB after; longest log line {longest} bytes"
    );
    let stderr = lines
        .iter()
        .find(|l| at(l, "exec_stderr"))
        .expect("at=exec_stderr");
    let logged = field(stderr, "line").unwrap();
    assert_eq!(logged.len(), 65536, "cut at the default maximum");
    assert!(logged.bytes().all(|b| b == b'e'));
    assert_eq!(
        field(stderr, "truncated_bytes").as_deref(),
        Some((32 * 1024 * 1024 - 65536).to_string().as_str()),
        "{}",
        &stderr[stderr.len() - 100..]
    );
    let restarts = all_at(&lines, "exec_restart");
    assert_eq!(restarts.len(), 1, "the oversized reply replaced the child");
    assert!(
        field(restarts[0], "reason")
            .unwrap()
            .contains("longer than ACKD_EXEC_MAX_LINE_BYTES=65536"),
        "{}",
        restarts[0]
    );
    assert!(lines.iter().any(|l| at_offset(l, "retry", 2)));
    assert!(longest < 200_000, "longest log line {longest} bytes");
    assert!(
        peak_kib < before_kib + 8 * 1024,
        "peak RSS {peak_kib} KiB, {before_kib} KiB before the 32 MiB lines"
    );
    assert_eq!(acked_unhandled(&lines, &dir), vec![]);
    assert_eq!(
        processed(&lines),
        (0..4).map(|o| (0, o)).collect::<Vec<_>>()
    );
    assert_committed(&group, &topic, 0, Some(4));
}

/// A handler that takes 1 s a message until the file `fast` exists in `dir`.
fn slow_until_fast(dir: &Path) -> String {
    test_handler(
        dir,
        "time.sleep(0 if os.path.exists(os.path.join(DIR, 'fast')) else 1)",
    )
}

/// `n` messages to each of `partitions`, each with a key of its own (key ordering may
/// start them all at once).
fn produce_distinct_keys(topic: &str, partitions: i32, n: usize) {
    let keys: Vec<(i32, String)> = (0..partitions)
        .flat_map(|p| (0..n).map(move |i| (p, format!("p{p}-k{i}"))))
        .collect();
    let records: Vec<common::produce::Record<'_>> = keys
        .iter()
        .map(|(p, k)| (*p, Some(k.as_bytes()), k.as_bytes(), &[][..]))
        .collect();
    produce_records(topic, &records);
}

/// Key ordering with 16 calls a partition and one child (the defaults of both): the
/// calls the child has not taken wait in the pool. The drain may take 5 s.
fn queued_behind_one_child(topic: &str, group: &str, command: &str) -> AckdBuilder {
    exec_ackd(topic, group, command)
        .env("ACKD_ORDERING", "key")
        .env("ACKD_CONCURRENCY", "16")
        .env("ACKD_EXEC_CONCURRENCY", "1")
        .env("ACKD_EXEC_TIMEOUT_MS", "3000")
        .env("ACKD_SHUTDOWN_TIMEOUT_MS", "5000")
}

fn drained_complete(lines: &[String]) -> bool {
    lines
        .iter()
        .any(|l| at(l, "drained") && field(l, "complete").as_deref() == Some("true"))
}

/// Starts `ackd`, and once 2 messages are processed (the rest queued behind the child)
/// stops it: the drain completes, and only the call the child had finishes after
/// SIGTERM. Returns its lines and what was handled before and after SIGTERM.
fn stop_with_calls_queued(ackd: AckdBuilder, dir: &Path) -> (Vec<String>, usize, usize) {
    let first = ackd.spawn();
    first.wait_for_count(is_processed, 2, WAIT);
    let handled_before = handled(dir).len();
    let lines = first.stop_exec_cleanly(WAIT);
    assert!(drained_complete(&lines), "{}", lines.join("\n"));
    let handled_first = handled(dir).len();
    assert!(
        handled_first <= handled_before + 1,
        "only the call the child had finished after SIGTERM: {handled_before} before, {handled_first} after"
    );
    (lines, handled_before, handled_first)
}

/// Calls queued for a child are not in flight: SIGTERM with 15 calls queued behind the
/// one child (1 s each, a 5 s drain) finishes only the call the child has, drops the
/// queued ones, and the drain completes (exit 0); the commit covers exactly what was
/// acknowledged, and a restart handles the rest: each message handled once.
#[test]
fn sigterm_waits_for_the_call_the_child_has_not_for_those_queued_behind_it() {
    let (topic, group, dir) = exec_case("exec-queued-stop", 1);
    let command = slow_until_fast(&dir);
    produce_distinct_keys(&topic, 1, 30);

    let (lines, handled_before, handled_first) =
        stop_with_calls_queued(queued_behind_one_child(&topic, &group, &command), &dir);
    let acked = processed(&lines).len() as i64;
    let seen: Vec<i64> = handled(&dir).iter().map(|h| h.1).collect();
    assert_eq!(seen, (0..acked).collect::<Vec<_>>(), "handled is acked");
    assert_committed(&group, &topic, 0, Some(acked));

    std::fs::write(dir.join("fast"), "").unwrap();
    let second = queued_behind_one_child(&topic, &group, &command).spawn();
    second.wait_for_count(is_processed, (30 - acked) as usize, WAIT);
    let lines = second.stop_exec_cleanly(WAIT);
    let mut rest: Vec<i64> = processed(&lines).iter().map(|p| p.1).collect();
    rest.sort_unstable();
    assert_eq!(
        rest,
        (acked..30).collect::<Vec<_>>(),
        "the restart did the rest"
    );
    let mut seen: Vec<i64> = handled(&dir).iter().map(|h| h.1).collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..30).collect::<Vec<_>>(),
        "each handled exactly once"
    );
    assert_committed(&group, &topic, 0, Some(30));
    eprintln!(
        "queued stop: handled_before_sigterm={handled_before} handled_by_first={handled_first} acked_first={acked}"
    );
}

/// Nor at a revoke: a second member joins while calls are queued behind the first
/// member's one child; the revoke waits only for the call the child has, the queued
/// ones go to the new owner, and across both members each message is handled once.
#[test]
fn a_revoke_waits_for_the_call_the_child_has_not_for_those_queued_behind_it() {
    let (topic, group, dir) = exec_case("exec-queued-revoke", 2);
    let command = slow_until_fast(&dir);
    produce_distinct_keys(&topic, 2, 20);

    let a = queued_behind_one_child(&topic, &group, &command).spawn();
    a.wait_for_count(is_processed, 2, WAIT);
    let b = queued_behind_one_child(&topic, &group, &command).spawn();
    a.wait_for_line(|l| at(l, "revoked"), WAIT);
    let a_lines = a.lines();
    assert!(
        !a_lines.iter().any(|l| at(l, "drain_timeout")),
        "the revoke waited for queued calls:\n{}",
        a_lines.join("\n")
    );
    std::fs::write(dir.join("fast"), "").unwrap();
    wait_until(WAIT, || {
        let mut all: Vec<(i32, i64)> = handled(&dir).iter().map(|h| (h.0, h.1)).collect();
        all.sort_unstable();
        all.dedup();
        all.len() == 40
    });
    let (a_lines, b_lines) = (a.stop_exec_cleanly(WAIT), b.stop_exec_cleanly(WAIT));
    let mut seen: Vec<(i32, i64)> = handled(&dir).iter().map(|h| (h.0, h.1)).collect();
    seen.sort_unstable();
    let expected: Vec<(i32, i64)> = (0..2).flat_map(|p| (0..20).map(move |o| (p, o))).collect();
    assert_eq!(
        seen, expected,
        "each handled exactly once across both members"
    );
    let committed = committed(&group, &topic, 2);
    assert_eq!(committed[&0], Some(20));
    assert_eq!(committed[&1], Some(20));
    eprintln!(
        "queued revoke: a_processed={} b_processed={}",
        processed(&a_lines).len(),
        processed(&b_lines).len()
    );
}

/// Partition ordering (the default) with 6 partitions sharing one child (1 s a message,
/// a 5 s drain): each partition's one call waits for the child.
fn partitions_behind_one_child(topic: &str, group: &str, command: &str) -> AckdBuilder {
    exec_ackd(topic, group, command)
        .env("ACKD_ORDERING", "partition")
        .env("ACKD_EXEC_CONCURRENCY", "1")
        .env("ACKD_EXEC_TIMEOUT_MS", "3000")
        .env("ACKD_SHUTDOWN_TIMEOUT_MS", "5000")
}

/// Queued calls under partition ordering: SIGTERM while 5 partitions' calls wait for the
/// one child the sixth has: only that call finishes, the waiting ones are dropped (not
/// one per partition in turn), the drain completes (exit 0), each partition's commit is
/// what it acknowledged, and a restart handles the rest: each message handled once.
#[test]
fn sigterm_under_partition_ordering_waits_for_the_call_the_child_has_not_for_other_partitions() {
    let (topic, group, dir) = exec_case("exec-partition-queued-stop", 6);
    let command = slow_until_fast(&dir);
    produce_distinct_keys(&topic, 6, 5);

    let (lines, handled_before, handled_first) =
        stop_with_calls_queued(partitions_behind_one_child(&topic, &group, &command), &dir);
    let acked = offsets_by_partition(processed(&lines));
    let seen = offsets_by_partition(handled(&dir).iter().map(|h| (h.0, h.1)));
    assert_eq!(seen, acked, "handled is acked");
    let committed_first = committed(&group, &topic, 6);
    for p in 0..6 {
        let n = acked.get(&p).map_or(0, Vec::len) as i64;
        assert_eq!(
            acked.get(&p).cloned().unwrap_or_default(),
            (0..n).collect::<Vec<_>>()
        );
        // (A partition with nothing acknowledged has its first commit, before its
        // first call: offset 0.)
        assert_eq!(committed_first[&p], Some(n), "partition {p}");
    }

    std::fs::write(dir.join("fast"), "").unwrap();
    let total: usize = acked.values().map(Vec::len).sum();
    let second = partitions_behind_one_child(&topic, &group, &command).spawn();
    second.wait_for_count(is_processed, 30 - total, WAIT);
    second.stop_exec_cleanly(WAIT);
    let mut all: Vec<(i32, i64)> = handled(&dir).iter().map(|h| (h.0, h.1)).collect();
    all.sort_unstable();
    let expected: Vec<(i32, i64)> = (0..6).flat_map(|p| (0..5).map(move |o| (p, o))).collect();
    assert_eq!(all, expected, "each handled exactly once");
    let committed = committed(&group, &topic, 6);
    assert!(committed.values().all(|c| *c == Some(5)), "{committed:?}");
    eprintln!(
        "partition queued stop: handled_before_sigterm={handled_before} handled_by_first={handled_first} acked_first={total}"
    );
}

// ---- redelivered and attempt (docs/exec.md#redelivered-and-attempt) ----

/// One message of a request line: its offset, `"redelivered"` and `"attempt"`.
type Delivery = (i64, bool, u64);

/// The messages of each request line the handler recorded in `requests`, in order (one
/// for a message, a batch's in turn).
fn deliveries(dir: &Path) -> Vec<Vec<Delivery>> {
    let text = std::fs::read_to_string(dir.join("requests")).unwrap_or_default();
    text.lines()
        .map(|l| {
            let messages = match serde_json::from_str(l).unwrap() {
                serde_json::Value::Array(batch) => batch,
                one => vec![one],
            };
            messages
                .iter()
                .map(|m| {
                    let delivery = (
                        m["offset"].as_i64(),
                        m["redelivered"].as_bool(),
                        m["attempt"].as_u64(),
                    );
                    match delivery {
                        (Some(o), Some(r), Some(a)) => (o, r, a),
                        _ => panic!("no offset, redelivered or attempt: {m}"),
                    }
                })
                .collect()
        })
        .collect()
}

/// ackd with the exec processor running `command`, spawned, and assigned its partition:
/// messages produced now are new to every processor (not redelivered on a first try).
fn exec_assigned(topic: &str, group: &str, command: &str, batch: usize) -> AckdProcess {
    let mut ackd = exec_ackd(topic, group, command);
    if batch > 1 {
        ackd = ackd.batches(batch);
    }
    let ackd = ackd.spawn();
    ackd.wait_for_line(|l| at(l, "assigned"), WAIT);
    ackd
}

/// "ok", `middle`, "ok" produced once a handler running `case` (per message, as in
/// [`test_handler`]) was assigned the partition: ackd's lines, and the deliveries its
/// requests said, in order.
fn first_tries_and_again(name: &str, case: &str, middle: &str) -> (Vec<String>, Vec<Delivery>) {
    let (topic, group, dir) = exec_case(name, 1);
    let ackd = exec_assigned(&topic, &group, &test_handler(&dir, case), 1);
    produce_strs(&topic, &["ok", middle, "ok"]);
    ackd.wait_for_count(is_processed, 3, WAIT);
    let lines = ackd.stop_exec_cleanly(WAIT);
    (lines, deliveries(&dir).concat())
}

/// What [`first_tries_and_again`] hands over when the middle message fails once: each
/// first try says false and 1, the second try of the middle one true and 2.
const AGAIN_ONCE: [Delivery; 4] = [(0, false, 1), (1, false, 1), (1, true, 2), (2, false, 1)];

/// A `{"retry":…}` reply: the message comes again with `"redelivered":true` and
/// `"attempt":2`; the first try and the other messages say false and 1.
#[test]
fn a_retried_request_says_redelivered_and_its_attempt() {
    let (lines, deliveries) = first_tries_and_again(
        "exec-attempt",
        r#"if v == "retry-me" and once("retry-%d-%d" % (p, o)):
    reply = {"retry": "not yet"}"#,
        "retry-me",
    );
    assert_eq!(count_at(&lines, "retry"), 1, "{}", lines.join("\n"));
    assert_eq!(deliveries, AGAIN_ONCE);
}

/// A child killed (SIGKILL) while it holds a request: the request written to the new
/// child says `"redelivered":true` and `"attempt":2`.
#[test]
fn a_request_sent_again_after_its_child_was_killed_says_redelivered() {
    let (lines, deliveries) = first_tries_and_again(
        "exec-attempt-killed",
        r#"if v == "die" and once("die-%d-%d" % (p, o)):
    os.kill(os.getpid(), signal.SIGKILL)"#,
        "die",
    );
    assert_eq!(count_at(&lines, "exec_restart"), 1, "{}", lines.join("\n"));
    assert_eq!(deliveries, AGAIN_ONCE);
}

/// Batches of 4: the child is killed holding the batch with offset 5; that batch comes
/// again to the new child, each of its messages `"redelivered":true`, `"attempt":2`;
/// every other request's messages say false and 1.
#[test]
fn a_batch_sent_again_after_its_child_was_killed_says_so_for_each_message() {
    let (topic, group, dir) = exec_case("exec-attempt-batch", 1);
    let command = write_handler(
        &dir,
        r#"requests = open(os.path.join(DIR, "requests"), "a")
for line in sys.stdin:
    requests.write(line); requests.flush()
    batch = json.loads(line)
    if any(m["offset"] == 5 for m in batch) and once("die"):
        os.kill(os.getpid(), signal.SIGKILL)
    print(json.dumps({"ack": True, "first": batch[0]["offset"], "last": batch[-1]["offset"]}), flush=True)"#,
    );
    let ackd = exec_assigned(&topic, &group, &command, 4);
    produce_numbered(&topic, 10);
    ackd.wait_for_count(is_processed, 10, WAIT);
    let lines = ackd.stop_exec_cleanly(WAIT);
    assert_eq!(count_at(&lines, "exec_restart"), 1, "{}", lines.join("\n"));
    let requests = deliveries(&dir);
    let killed = requests
        .iter()
        .position(|r| r.iter().any(|d| d.0 == 5))
        .expect("a request held offset 5");
    let offsets = |r: &[Delivery]| r.iter().map(|d| d.0).collect::<Vec<_>>();
    let again = &requests[killed + 1];
    assert_eq!(offsets(again), offsets(&requests[killed]), "{requests:?}");
    assert!(
        again.iter().all(|d| (d.1, d.2) == (true, 2)),
        "{requests:?}"
    );
    for (i, r) in requests
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != killed + 1)
    {
        assert!(
            r.iter().all(|d| (d.1, d.2) == (false, 1)),
            "{i}: {requests:?}"
        );
    }
    assert_eq!(
        processed(&lines),
        (0..10).map(|o| (0, o)).collect::<Vec<_>>()
    );
}

/// The exec handler of docs/guarantees.md ("Writing an idempotent handler"), exactly as
/// written there.
fn idempotent_handler() -> String {
    let heading = "## Writing an idempotent handler";
    code_block("docs/guarantees.md", heading, "```python\n", 1)
}

/// Each (partition, offset) in the handler's `orders` table, with how many rows it has.
fn orders_in(db: &Path) -> BTreeMap<(i32, i64), usize> {
    let query = format!(
        "import sqlite3; [print(p, o, n) for p, o, n in sqlite3.connect({:?}).execute('SELECT part, offset, COUNT(*) FROM orders GROUP BY part, offset')]",
        db.to_str().unwrap()
    );
    let out = std::process::Command::new("python3")
        .args(["-c", &query])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<i64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
            ((f[0] as i32, f[1]), f[2] as usize)
        })
        .collect()
}

/// docs/guarantees.md's idempotent handler, exactly as written, while ackd is
/// SIGKILLed three times amid a steady producer: every message's effect is in its store
/// exactly once, its safety net never fired (no repeat came unflagged), and the repeats
/// the kills caused came flagged (`at=redelivered flagged=`).
#[test]
fn the_guides_idempotent_handler_applies_each_message_once_across_sigkills() {
    let (topic, group, dir) = exec_case("exec-idempotent", 2);
    let path = dir.join("handler.py");
    std::fs::write(&path, idempotent_handler()).unwrap();
    let db = dir.join("orders.db");
    let command = format!("python3 {}", path.display());
    let member = || {
        exec_ackd(&topic, &group, &command)
            .env("ORDERS_DB", db.to_str().unwrap())
            .env("ACKD_COMMIT_INTERVAL_MS", "300")
            .spawn()
    };
    let producer = SteadyProducer::start(&topic, 5, Duration::from_millis(20));
    let mut runs = Vec::new();
    for _ in 0..3 {
        let run = member();
        run.wait_for_count(is_processed, 40, WAIT);
        run.sigkill();
        run.assert_exit(128 + libc::SIGKILL, WAIT);
        runs.push(run.lines());
    }
    let last = member();
    let delivered = producer.finish();
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    wait_until(WAIT, || {
        let mut seen: BTreeSet<(i32, i64)> = runs.iter().flat_map(|l| processed(l)).collect();
        seen.extend(processed(&last.lines()));
        seen.is_superset(&expected)
    });
    runs.push(last.stop_exec_cleanly(WAIT));

    let lines: Vec<&String> = runs.iter().flatten().collect();
    let unflagged: Vec<&&String> = lines
        .iter()
        .filter(|l| l.contains("applied before, not flagged"))
        .collect();
    assert!(
        unflagged.is_empty(),
        "a repeat came unflagged: {unflagged:?}"
    );
    let orders = orders_in(&db);
    let twice: Vec<_> = orders.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "applied more than once: {twice:?}");
    let applied: BTreeSet<(i32, i64)> = orders.keys().copied().collect();
    assert_eq!(applied, expected, "every message applied");
    let flagged: u64 = lines
        .iter()
        .filter(|l| at(l, "redelivered"))
        .filter_map(|l| field(l, "flagged")?.parse::<u64>().ok())
        .sum();
    let delivered_twice = processed_counts(&lines.into_iter().cloned().collect::<Vec<_>>())
        .values()
        .filter(|n| **n > 1)
        .count();
    assert!(flagged > 0, "the kills left no flagged window");
    eprintln!(
        "idempotent handler: {} messages, 3 SIGKILLs, {delivered_twice} delivered twice (all flagged), {flagged} flagged, each applied once",
        expected.len()
    );
}
