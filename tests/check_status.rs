//! `ackd check` and `ackd status` against the real broker: the
//! lines they print, their exit codes (the daemon's for the same problem), and that they
//! never join the group, never commit, never create a topic. Status figures are compared
//! with what the harness knows: the offsets it produced and the group's committed offsets
//! read by a consumer of its own.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{
    accounting::*, ackd::*, broker::*, lines::*, offsets::*, produce::*, spawn::*, stamped::*,
    topics::*, wait::*,
};
use rdkafka::consumer::{BaseConsumer, Consumer};

const WAIT: Duration = Duration::from_secs(60);

/// Runs `ackd <command>` to its end; its exit code, lines and duration.
fn run(builder: AckdBuilder, command: &str) -> (i32, Vec<String>, Duration) {
    let ackd = builder.arg(command).spawn();
    let code = ackd.wait_exit(WAIT);
    let took = ackd.elapsed();
    let lines = ackd.lines();
    eprintln!("ackd {command}: exit {code} in {took:?}");
    (code, lines, took)
}

fn checks<'a>(lines: &'a [String], name: &str) -> Vec<&'a String> {
    lines
        .iter()
        .filter(|l| at(l, "check") && field(l, "check").as_deref() == Some(name))
        .collect()
}

/// The group's state and member count as the broker describes it.
fn group_state(group: &str) -> (String, usize) {
    let consumer: BaseConsumer = broker().client_config().create().expect("consumer");
    let list = consumer
        .fetch_group_list(Some(group), Duration::from_secs(30))
        .expect("describe group");
    match list.groups().first() {
        Some(g) if !g.state().is_empty() => (g.state().to_string(), g.members().len()),
        _ => ("Dead".to_string(), 0),
    }
}

/// `at=status` lines by partition: (committed, end, lag, member, processed).
type StatusRow = (Option<i64>, i64, i64, String, Option<i64>);

fn status_rows(lines: &[String], topic: &str) -> BTreeMap<i32, StatusRow> {
    lines
        .iter()
        .filter(|l| at(l, "status") && field(l, "topic").as_deref() == Some(topic))
        .map(|l| {
            let num = |k: &str| field(l, k).and_then(|v| v.parse::<i64>().ok());
            let p = num("partition").expect("partition") as i32;
            (
                p,
                (
                    num("committed"),
                    num("end").expect("end"),
                    num("lag").expect("lag"),
                    field(l, "member").expect("member"),
                    num("processed"),
                ),
            )
        })
        .collect()
}

#[test]
fn check_on_a_good_config_passes_every_check_and_joins_nothing() {
    let topic = unique_name("chk-good");
    let other = unique_name("chk-good2");
    let group = unique_name("g-chk-good");
    create_topic(&topic, 3);
    create_topic(&other, 2);

    let (code, lines, took) = run(
        AckdBuilder::new(&format!("{topic},{other}"), &group),
        "check",
    );
    let all = lines.join("\n");
    assert_eq!(code, 0, "{all}");
    let check_lines = all_at(&lines, "check");
    for l in &check_lines {
        assert_eq!(field(l, "ok").as_deref(), Some("true"), "{l}");
    }
    // settings, brokers, auth, two topics, group: one line each.
    assert_eq!(check_lines.len(), 6, "{all}");
    assert_eq!(checks(&lines, "settings").len(), 1);
    assert_eq!(
        field(checks(&lines, "brokers")[0], "brokers").as_deref(),
        Some("1")
    );
    assert_eq!(
        field(checks(&lines, "auth")[0], "security").as_deref(),
        Some("plaintext")
    );
    let topics: BTreeMap<String, String> = checks(&lines, "topic")
        .iter()
        .map(|l| (field(l, "topic").unwrap(), field(l, "partitions").unwrap()))
        .collect();
    assert_eq!(topics[&topic], "3");
    assert_eq!(topics[&other], "2");
    let g = checks(&lines, "group")[0];
    assert_eq!(field(g, "group").as_deref(), Some(group.as_str()));
    assert_eq!(field(g, "members").as_deref(), Some("0"), "{g}");
    assert_eq!(field(g, "state").as_deref(), Some("Dead"), "{g}");
    eprintln!(
        "check lines ({took:?}):\n{}",
        check_lines
            .iter()
            .map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    // It never joined, never committed.
    assert_eq!(group_state(&group).1, 0);
    assert!(committed(&group, &topic, 3).values().all(Option::is_none));
    assert!(
        !lines.iter().any(|l| at(l, "assigned") || is_processed(l)),
        "{all}"
    );
}

#[test]
fn check_with_a_missing_topic_exits_78_like_the_daemon_and_creates_nothing() {
    let present = unique_name("chk-present");
    let missing = unique_name("chk-ordres");
    let group = unique_name("g-chk-missing");
    create_topic(&present, 1);

    let (code, lines, _) = run(
        AckdBuilder::new(&format!("{present},{missing}"), &group),
        "check",
    );
    let all = lines.join("\n");
    assert_eq!(code, 78, "{all}");
    let topic_lines = checks(&lines, "topic");
    assert_eq!(topic_lines.len(), 2, "{all}");
    for l in topic_lines {
        let ok = field(l, "topic").as_deref() == Some(present.as_str());
        assert_eq!(
            field(l, "ok").as_deref(),
            Some(if ok { "true" } else { "false" }),
            "{l}"
        );
    }
    let errors = all_at(&lines, "config_error");
    assert_eq!(errors.len(), 1, "{all}");
    assert_eq!(field(errors[0], "setting").as_deref(), Some("ACKD_TOPICS"));
    assert_eq!(
        field(errors[0], "topics").as_deref(),
        Some(missing.as_str())
    );
    // The other checks still ran and passed.
    assert_eq!(
        field(checks(&lines, "group")[0], "ok").as_deref(),
        Some("true"),
        "{all}"
    );
    assert!(!topic_exists(&missing), "ackd check created {missing}");
}

#[test]
fn check_and_status_give_up_on_unreachable_brokers_with_69_in_bounded_time() {
    let nobody = format!("kafka://127.0.0.1:{}", free_port());
    for command in ["check", "status"] {
        let (code, lines, took) = run(AckdBuilder::on(&nobody, "orders", "billing"), command);
        let all = lines.join("\n");
        assert_eq!(code, 69, "{all}");
        // The bound is 12 s; a loaded machine may start the process slowly.
        assert!(took < Duration::from_secs(30), "took {took:?}");
        assert!(
            took >= Duration::from_secs(11),
            "gave up after {took:?}: {all}"
        );
        if command == "check" {
            let b = checks(&lines, "brokers");
            assert_eq!(b.len(), 1, "{all}");
            assert_eq!(field(b[0], "ok").as_deref(), Some("false"));
            assert!(checks(&lines, "group").is_empty(), "{all}");
        } else {
            assert!(lines.iter().any(|l| at(l, "unavailable")), "{all}");
            assert!(!lines.iter().any(|l| at(l, "status")), "{all}");
        }
    }
}

#[test]
fn a_bad_setting_fails_check_with_78_before_any_connection() {
    let (code, lines, _) = run(
        AckdBuilder::new("orders", "billing").env("ACKD_COMMIT_INTERVAL_MS", "soon"),
        "check",
    );
    let all = lines.join("\n");
    assert_eq!(code, 78, "{all}");
    let errors = all_at(&lines, "config_error");
    assert_eq!(errors.len(), 1, "{all}");
    assert_eq!(
        field(errors[0], "setting").as_deref(),
        Some("ACKD_COMMIT_INTERVAL_MS")
    );
    let s = checks(&lines, "settings");
    assert_eq!(field(s[0], "ok").as_deref(), Some("false"), "{all}");
    assert!(checks(&lines, "brokers").is_empty(), "{all}");
}

/// The processor's settings are settings too: the daemon refuses them with 78, so does
/// check (without starting the handler).
#[test]
fn check_validates_the_processor_settings_as_the_daemon_does() {
    let (code, lines, _) = run(
        AckdBuilder::new("orders", "billing").env("ACKD_PROCESSOR", "exec"),
        "check",
    );
    let all = lines.join("\n");
    assert_eq!(code, 78, "{all}");
    let errors = all_at(&lines, "config_error");
    assert_eq!(errors.len(), 1, "{all}");
    assert_eq!(
        field(errors[0], "setting").as_deref(),
        Some("ACKD_EXEC_COMMAND"),
        "{all}"
    );
    let s = checks(&lines, "settings");
    assert_eq!(s.len(), 1, "{all}");
    assert_eq!(field(s[0], "ok").as_deref(), Some("false"), "{all}");
    assert!(checks(&lines, "brokers").is_empty(), "{all}");
}

/// Status while ackd holds the partitions, then after it left: the numbers equal what
/// the harness produced and what the group committed; members shown, then "-".
#[test]
fn status_shows_committed_end_lag_and_the_member_holding_each_partition() {
    let (topic, group) = fresh_topic("st", 3);
    let delivered = produce_keyed(&topic, 60, 0);
    let ends = log_ends(&delivered);

    // Before anyone consumed: nothing committed, the whole log is lag (earliest).
    let (code, lines, _) = run(AckdBuilder::new(&topic, &group), "status");
    assert_eq!(code, 0, "{}", lines.join("\n"));
    let rows = status_rows(&lines, &topic);
    assert_eq!(rows.len(), 3, "{}", lines.join("\n"));
    for (p, (c, end, lag, member, _)) in &rows {
        assert_eq!(
            (*c, *end, *lag, member.as_str()),
            (None, ends[p], ends[p], "-")
        );
    }

    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_COMMIT_INTERVAL_MS", "200")
        .spawn();
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);
    wait_until(WAIT, || {
        committed(&group, &topic, 3)
            .iter()
            .all(|(p, c)| *c == Some(ends[p]))
    });
    wait_until(WAIT, || group_state(&group) == ("Stable".to_string(), 1));

    let (code, lines, took) = run(AckdBuilder::new(&topic, &group), "status");
    let all = lines.join("\n");
    assert_eq!(code, 0, "{all}");
    let rows = status_rows(&lines, &topic);
    let members: Vec<&String> = rows.values().map(|r| &r.3).collect();
    eprintln!(
        "status with ackd running ({took:?}):\n{}",
        lines
            .iter()
            .filter(|l| at(l, "status") || at(l, "status_total"))
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(rows.len(), 3, "{all}");
    for (p, (c, end, lag, member, _)) in &rows {
        assert_eq!(*c, Some(ends[p]), "partition {p}");
        assert_eq!(*end, ends[p], "partition {p}");
        assert_eq!(*lag, 0, "partition {p}");
        assert_ne!(member, "-", "partition {p}: {all}");
    }
    // One ackd holds all three; the member id is the one the broker describes.
    let described: BaseConsumer = broker().client_config().create().expect("consumer");
    let list = described
        .fetch_group_list(Some(&group), WAIT)
        .expect("describe group");
    let member_id = list.groups()[0].members()[0].id().to_string();
    assert!(
        members.iter().all(|m| **m == member_id),
        "{member_id}: {all}"
    );
    let total = lines
        .iter()
        .find(|l| at(l, "status_total"))
        .expect("total line");
    assert_eq!(field(total, "state").as_deref(), Some("Stable"), "{total}");
    assert_eq!(field(total, "members").as_deref(), Some("1"), "{total}");
    assert_eq!(field(total, "lag").as_deref(), Some("0"), "{total}");
    let line = lines.iter().find(|l| at(l, "status")).unwrap();
    assert!(field(line, "host").is_some_and(|h| !h.is_empty()), "{line}");
    // check describes the classic group ackd runs.
    let (code, lines, _) = run(AckdBuilder::new(&topic, &group), "check");
    let all = lines.join("\n");
    assert_eq!(code, 0, "{all}");
    let g = checks(&lines, "group")[0];
    eprintln!("check with ackd running: {g}");
    assert_eq!(field(g, "state").as_deref(), Some("Stable"), "{g}");
    assert_eq!(field(g, "kind").as_deref(), Some("Classic"), "{g}");
    assert_eq!(
        field(g, "protocol").as_deref(),
        Some("cooperative-sticky"),
        "{g}"
    );
    assert_eq!(field(g, "members").as_deref(), Some("1"), "{g}");
    // Status and check joined nothing: the running ackd was not disturbed by a rebalance.
    assert_eq!(group_state(&group), ("Stable".to_string(), 1));
    assert!(
        !ackd.lines().iter().any(|l| at(l, "revoked")),
        "{}",
        ackd.lines().join("\n")
    );

    ackd.stop(0, WAIT);
    let t = tally(&delivered, &processed(&ackd.lines()), &ackd.lines());
    assert!(t.lost.is_empty() && t.duplicated.is_empty(), "{t:?}");

    // No member any more, and a backlog: committed stays, end and lag grow.
    let more = produce_keyed(&topic, 30, 60);
    let new_ends = log_ends(&[delivered.clone(), more.clone()].concat());
    // The lines are status's output, not log lines: a quiet log level keeps them.
    let (code, lines, _) = run(
        AckdBuilder::new(&topic, &group).env("ACKD_LOG_LEVEL", "error"),
        "status",
    );
    let all = lines.join("\n");
    assert_eq!(code, 0, "{all}");
    eprintln!(
        "status with no members:\n{}",
        lines
            .iter()
            .filter(|l| at(l, "status") || at(l, "status_total"))
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let rows = status_rows(&lines, &topic);
    let harness = committed(&group, &topic, 3);
    assert_eq!(rows.len(), 3, "{all}");
    for (p, (c, end, lag, member, processed)) in &rows {
        assert_eq!(*c, harness[p], "partition {p}");
        assert_eq!(*c, Some(ends[p]), "partition {p}");
        assert_eq!(*end, new_ends[p], "partition {p}");
        assert_eq!(*lag, new_ends[p] - ends[p], "partition {p}");
        assert_eq!(member, "-", "partition {p}");
        // The commit's metadata: the last offset processed before the release.
        assert_eq!(*processed, Some(ends[p] - 1), "partition {p}");
    }
    let total = lines
        .iter()
        .find(|l| at(l, "status_total"))
        .expect("total line");
    assert_eq!(field(total, "members").as_deref(), Some("0"), "{total}");
    assert_eq!(field(total, "state").as_deref(), Some("Empty"), "{total}");
    assert_eq!(
        field(total, "lag").as_deref(),
        Some(more.len().to_string().as_str()),
        "{total}"
    );
    // Status committed nothing.
    assert_eq!(committed(&group, &topic, 3), harness);

    // On a terminal (util-linux `script` gives it a pseudo-terminal): the same figures as
    // a table.
    let table = status_on_a_terminal(AckdBuilder::new(&topic, &group));
    eprintln!("status on a terminal:\n{table}");
    assert!(
        table.contains("state Empty  members 0  partitions 3  lag 30"),
        "{table}"
    );
    let header = table
        .lines()
        .find(|l| l.starts_with("TOPIC"))
        .expect("header");
    assert!(
        header.contains("PARTITION  COMMITTED  END  LAG  MEMBER"),
        "{table}"
    );
    for (p, end) in &new_ends {
        let row = table
            .lines()
            .find(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                cells.first() == Some(&topic.as_str())
                    && cells.get(1) == Some(&p.to_string().as_str())
            })
            .unwrap_or_else(|| panic!("no row for partition {p}: {table}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        let expected = [
            ends[p].to_string(),
            end.to_string(),
            (end - ends[p]).to_string(),
        ];
        assert_eq!(
            cells[2..5],
            expected.each_ref().map(String::as_str),
            "{row}"
        );
        assert_eq!(cells[5], "-", "{row}");
    }
    assert!(!table.contains("at=status"), "{table}");
}

/// `ackd status` with its stdout on a pseudo-terminal; what the terminal showed.
fn status_on_a_terminal(builder: AckdBuilder) -> String {
    let bin = env!("CARGO_BIN_EXE_ackd");
    let output = std::process::Command::new("script")
        .args(["-qec", &format!("{bin} status"), "/dev/null"])
        .env_clear()
        .envs(std::env::var("PATH").map(|p| ("PATH".to_string(), p)))
        .envs(builder.env_map())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run script (util-linux)");
    let shown = String::from_utf8_lossy(&output.stdout).replace('\r', "");
    assert!(output.status.success(), "{:?}: {shown}", output.status);
    shown
}

/// A KIP-848 group (`group.protocol=consumer`, another client than ackd): the classic
/// DescribeGroups does not know it; `ackd status` and `ackd check` still show its state,
/// its member and what it holds (librdkafka's DescribeConsumerGroups).
#[test]
fn status_and_check_describe_a_kip848_group_too() {
    use rdkafka::consumer::CommitMode;
    use rdkafka::Message as _;

    let (topic, group) = fresh_topic("st848", 3);
    let delivered = produce_keyed(&topic, 30, 0);
    let ends = log_ends(&delivered);
    let mut config = broker().client_config();
    config
        .set("group.id", &group)
        .set("group.protocol", "consumer")
        .set("client.id", "kip848-consumer")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest");
    let consumer: BaseConsumer = config.create().expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    let mut read = 0;
    wait_until(WAIT, || {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            read += 1;
            consumer
                .store_offset(m.topic(), m.partition(), m.offset())
                .expect("store offset");
        }
        read == delivered.len()
    });
    consumer
        .commit_consumer_state(CommitMode::Sync)
        .expect("commit");
    // SAFETY: the handle is live; the string librdkafka allocates is copied, then freed.
    let member_id = unsafe {
        let rk = consumer.client().native_ptr();
        let p = rdkafka::bindings::rd_kafka_memberid(rk);
        (!p.is_null()).then(|| {
            let id = std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned();
            rdkafka::bindings::rd_kafka_mem_free(rk, p.cast());
            id
        })
    };
    assert!(member_id.is_some(), "the consumer has no member id");

    // The consumer keeps polling (heartbeats) while ackd runs.
    let mut outputs = Vec::new();
    for command in ["status", "check"] {
        let ackd = AckdBuilder::new(&topic, &group).arg(command).spawn();
        while ackd.try_exit_code().is_none() {
            let _ = consumer.poll(Duration::from_millis(50));
        }
        let code = ackd.wait_exit(WAIT);
        assert_eq!(code, 0, "{}", ackd.lines().join("\n"));
        outputs.push(ackd.lines());
    }
    let (status, check) = (&outputs[0], &outputs[1]);
    eprintln!("{}\n{}", status.join("\n"), check.join("\n"));
    let rows = status_rows(status, &topic);
    assert_eq!(rows.len(), 3, "{}", status.join("\n"));
    for (p, (c, end, lag, member, _)) in &rows {
        assert_eq!(
            (*c, *end, *lag),
            (Some(ends[p]), ends[p], 0),
            "partition {p}"
        );
        assert_eq!(Some(member.clone()), member_id, "partition {p}");
    }
    let total = status.iter().find(|l| at(l, "status_total")).unwrap();
    assert_eq!(field(total, "state").as_deref(), Some("Stable"), "{total}");
    assert_eq!(field(total, "members").as_deref(), Some("1"), "{total}");
    let g = checks(check, "group")[0];
    assert_eq!(field(g, "kind").as_deref(), Some("Consumer"), "{g}");
    assert_eq!(field(g, "members").as_deref(), Some("1"), "{g}");
}

/// A member's client id is the broker's to report, anyone's to set: `ackd status` on a
/// terminal shows its control characters escaped, never raw.
#[test]
fn status_on_a_terminal_escapes_control_characters_of_a_member() {
    let (topic, group) = fresh_topic("st-esc", 1);
    let mut config = broker().client_config();
    config
        .set("group.id", &group)
        .set("client.id", "evil\u{1b}]0;owned\u{7}\u{1b}[2J")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest");
    let consumer: BaseConsumer = config.create().expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    wait_until(WAIT, || {
        let _ = consumer.poll(Duration::from_millis(100));
        consumer.assignment().is_ok_and(|a| a.count() == 1)
    });
    let table = status_on_a_terminal(AckdBuilder::new(&topic, &group));
    eprintln!("status on a terminal: {table:?}");
    assert!(
        !table.contains('\u{1b}') && !table.contains('\u{7}'),
        "{table:?}"
    );
    assert!(
        table.contains(r"evil\u{001b}]0;owned\u{0007}\u{001b}[2J"),
        "{table:?}"
    );
}

/// The lag in seconds from the committed offsets: how old the first message not
/// committed is, by its timestamp (each message an hour older than the next, so that
/// the neighbour of the right one is an hour off), 0 when caught up, and 0, not less,
/// for a timestamp ahead of this host's clock.
#[test]
fn status_shows_the_age_of_the_first_message_not_committed() {
    const HOUR: i64 = 3_600_000;
    let (topic, group) = fresh_topic("st-secs", 3);
    let now = epoch_ms();
    let old: Vec<i64> = (0..5).map(|i| now - (10 - i) * HOUR).collect();
    produce_at(&topic, 0, &old);
    produce_at(&topic, 1, &old[..3]);
    // Half an hour ahead: within the broker's log.message.timestamp.after.max.ms.
    produce_at(&topic, 2, &[now + HOUR / 2, now + HOUR / 2 + 1]);
    let bootstrap = broker().bootstrap();
    commit_raw_metadata_on(&bootstrap, &group, &topic, 0, 2, b"");
    commit_raw_metadata_on(&bootstrap, &group, &topic, 1, 3, b"");

    let before = epoch_ms();
    let (code, lines, took) = run(AckdBuilder::new(&topic, &group), "status");
    let after = epoch_ms();
    let all = lines.join("\n");
    assert_eq!(code, 0, "{all}");
    eprintln!("status in {took:?}:\n{all}");
    let seconds = |p: i32| -> f64 {
        let line = lines
            .iter()
            .find(|l| at(l, "status") && field(l, "partition") == Some(p.to_string()))
            .unwrap_or_else(|| panic!("no line for partition {p}: {all}"));
        field(line, "lag_seconds")
            .unwrap_or_else(|| panic!("no lag_seconds: {line}"))
            .parse()
            .unwrap()
    };
    // Partition 0: committed at 2, the truth is its message's age while status ran.
    let (low, high) = (
        (before - old[2]) as f64 / 1e3,
        (after - old[2]) as f64 / 1e3,
    );
    let p0 = seconds(0);
    assert!(
        p0 >= low - 1.0 && p0 <= high + 1.0,
        "partition 0: {p0} s, the truth between {low} and {high}: {all}"
    );
    assert_eq!(seconds(1), 0.0, "caught up: {all}");
    assert_eq!(seconds(2), 0.0, "a timestamp from the future: {all}");
    let total = lines.iter().find(|l| at(l, "status_total")).unwrap();
    assert_eq!(
        field(total, "lag_seconds_max").map(|v| v.parse::<f64>().unwrap()),
        Some(p0),
        "{total}"
    );
    // Status committed nothing, and read where the group had not committed.
    assert_eq!(
        committed(&group, &topic, 3),
        BTreeMap::from([(0, Some(2)), (1, Some(3)), (2, None)])
    );
}
