//! `ACKD_STATIC_MEMBERSHIP=true`: `group.instance.id` from `DYNO`, else the host name, on
//! Apache Kafka:
//! - a static member consumes, commits and stops cleanly;
//! - a static member restarted within the session timeout gets its partitions back with
//!   no rebalance: the others' assignments and the group generation do not change, and it
//!   resumes exactly at its final commit;
//! - two live processes with one instance id: the broker fences the first
//!   (FENCED_INSTANCE_ID), which stops with 69 and commits nothing more, while the
//!   second consumes on;
//! - Heroku's restart, the replacement started while the old process drains: the old one
//!   is fenced during its drain and says so the same way.
//!
//! The mock-cluster test that injected FENCED_INSTANCE_ID into heartbeats (the mock does
//! not fence) is gone: the fence on a real broker shows everything it showed, and more.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{
    accounting::*, ackd::*, lines::*, offsets::*, produce::*, spawn::*, topics::*, wait::*,
};

const WAIT: Duration = Duration::from_secs(90);

#[test]
fn a_static_member_consumes_commits_and_stops_cleanly() {
    let (topic, group) = fresh_topic("static", 2);
    let delivered = produce_keyed(&topic, 50, 0);

    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_STATIC_MEMBERSHIP", "true")
        .env("DYNO", "consumer.1")
        .spawn();
    let start = ackd.wait_for_line(|l| at(l, "start"), WAIT);
    assert_eq!(
        field(&start, "group_instance_id").as_deref(),
        Some("consumer.1"),
        "{start}"
    );
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);
    let lines = ackd.stop(0, WAIT);
    let t = tally(&delivered, &processed(&lines), &lines);
    assert!(t.lost.is_empty() && t.duplicated.is_empty(), "{t:?}");
    let committed = committed(&group, &topic, 2);
    for (p, end) in log_ends(&delivered) {
        assert_eq!(committed[&p], Some(end), "partition {p}");
    }
    eprintln!(
        "static member consumer.1: {} messages once each, committed, exit 0 in {:?}",
        delivered.len(),
        ackd.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// On Apache Kafka: a restart that moves nothing, and a fence
// ---------------------------------------------------------------------------------------------

/// A static member under DYNO `dyno`. A static member sends no LeaveGroup when it stops,
/// so its partitions wait for it for the session timeout: 10 s covers a restart here.
fn static_member(topic: &str, group: &str, dyno: &str, commit_interval_ms: u64) -> AckdProcess {
    AckdBuilder::new(topic, group)
        .env("ACKD_STATIC_MEMBERSHIP", "true")
        .env("DYNO", dyno)
        .env("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "10000")
        .env("ACKD_COMMIT_INTERVAL_MS", commit_interval_ms.to_string())
        .spawn()
}

fn int(line: &str, key: &str) -> Option<i64> {
    field(line, key).and_then(|v| v.parse().ok())
}

/// The partitions a process holds after `lines`: assigned and not revoked since.
fn holding(lines: &[String]) -> BTreeSet<i32> {
    let mut held = BTreeSet::new();
    for l in lines {
        let Some(p) = int(l, "partition") else {
            continue;
        };
        if at(l, "assigned") {
            held.insert(p as i32);
        } else if at(l, "revoked") || at(l, "final_commit") {
            held.remove(&(p as i32));
        }
    }
    held
}

/// Per partition, the value of `key` on a process's `at=what` lines (the last one).
fn per_partition(lines: &[String], what: &str, key: &str) -> BTreeMap<i32, i64> {
    lines
        .iter()
        .filter(|l| at(l, what))
        .filter_map(|l| Some((int(l, "partition")? as i32, int(l, key)?)))
        .collect()
}

/// Per partition, the offsets a process processed.
fn processed_by_partition(lines: &[String]) -> BTreeMap<i32, Vec<i64>> {
    let mut out: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for (p, o) in processed(lines) {
        out.entry(p).or_default().push(o);
    }
    out
}

#[test]
fn a_static_member_restarted_within_the_session_timeout_moves_no_partition() {
    const PARTITIONS: i32 = 6;
    let (topic, group) = fresh_topic("static-restart", PARTITIONS);
    let producer = SteadyProducer::start(&topic, 6, Duration::from_millis(50));

    let m1 = static_member(&topic, &group, "consumer.1", 500);
    let m2 = static_member(&topic, &group, "consumer.2", 500);
    let m3 = static_member(&topic, &group, "consumer.3", 500);
    // A stable group: two partitions each (cooperative-sticky balances), all six owned.
    wait_until(WAIT, || {
        let held: Vec<_> = [&m1, &m2, &m3]
            .iter()
            .map(|m| holding(&m.lines()))
            .collect();
        held.iter().all(|h| h.len() == 2)
            && held.iter().flatten().collect::<BTreeSet<_>>().len() == PARTITIONS as usize
    });
    // Each member is consuming: it committed each of its partitions.
    for m in [&m1, &m2, &m3] {
        wait_until(WAIT, || {
            let lines = m.lines();
            let committed = per_partition(&lines, "committed", "offset");
            holding(&lines).iter().all(|p| committed.contains_key(p))
        });
    }
    let m2_held = holding(&m2.lines());
    // The generation the group is in: the last assignment any member logged.
    let generation = [&m1, &m2, &m3]
        .iter()
        .flat_map(|m| m.lines())
        .filter(|l| at(l, "assigned"))
        .filter_map(|l| int(&l, "generation"))
        .max()
        .expect("assigned lines carry generation=");
    let (from1, from3) = (m1.line_count(), m3.line_count());

    let restart = std::time::Instant::now();
    let m2_lines = m2.stop(0, WAIT);
    let final_commits = per_partition(&m2_lines, "final_commit", "offset");
    assert_eq!(
        final_commits.keys().copied().collect::<BTreeSet<_>>(),
        m2_held,
        "consumer.2 committed each of its partitions on the way out:\n{}",
        m2_lines.join("\n")
    );
    let m2b = static_member(&topic, &group, "consumer.2", 500);
    // Its partitions come back to it: same partitions, same generation (no rebalance),
    // resuming exactly at the final commit.
    wait_until(WAIT, || holding(&m2b.lines()) == m2_held);
    let m2b_processed = |lines: &[String]| {
        let by = processed_by_partition(lines);
        m2_held.iter().all(|p| by.contains_key(p))
    };
    wait_until(WAIT, || m2b_processed(&m2b.lines()));
    let resumed_after = restart.elapsed();
    let m2b_lines = m2b.lines();
    for l in m2b_lines.iter().filter(|l| at(l, "assigned")) {
        let p = int(l, "partition").unwrap() as i32;
        assert_eq!(field(l, "from").as_deref(), Some("committed"), "{l}");
        assert_eq!(int(l, "offset"), Some(final_commits[&p]), "{l}");
        assert_eq!(
            int(l, "generation"),
            Some(generation),
            "a rebalance happened: {l}"
        );
    }
    for (p, offsets) in processed_by_partition(&m2b_lines) {
        assert_eq!(
            offsets[0], final_commits[&p],
            "partition {p}: first processed"
        );
    }
    // The others went on meanwhile (processed after consumer.2 resumed) and never
    // changed their assignment.
    let (n1, n3) = (m1.line_count(), m3.line_count());
    for (m, from) in [(&m1, n1), (&m3, n3)] {
        m.wait_for_line_from(from, is_processed, WAIT);
    }
    for (name, m, from) in [("consumer.1", &m1, from1), ("consumer.3", &m3, from3)] {
        let during: Vec<String> = m.lines()[from..]
            .iter()
            .filter(|l| at(l, "assigned") || at(l, "revoked"))
            .cloned()
            .collect();
        assert!(
            during.is_empty(),
            "{name} saw its assignment change during consumer.2's restart:\n{}",
            during.join("\n")
        );
    }

    let delivered = producer.finish();
    let runs = [&m1, &m2, &m2b, &m3];
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    wait_until(WAIT, || {
        let seen: BTreeSet<_> = runs.iter().flat_map(|r| processed(&r.lines())).collect();
        seen.is_superset(&expected)
    });
    for m in [&m1, &m2b, &m3] {
        m.sigterm();
    }
    for m in [&m1, &m2b, &m3] {
        m.assert_exit(0, WAIT);
    }
    let lines: Vec<String> = runs.iter().flat_map(|r| r.lines()).collect();
    let all: Vec<(i32, i64)> = runs.iter().flat_map(|r| processed(&r.lines())).collect();
    let t = tally(&delivered, &all, &lines);
    assert!(t.lost.is_empty() && t.duplicated.is_empty(), "{t:?}");
    assert_committed_to_ends(&group, &topic, PARTITIONS, &log_ends(&delivered));
    eprintln!(
        "static restart: members 3, restarts 1 (consumer.2, SIGTERM exit 0, back in {resumed_after:?}), \
         partitions {m2_held:?} resumed at {final_commits:?} in generation {generation}; \
         consumer.1/consumer.3 assignment changes during it 0; messages {}, processed {}, lost 0, duplicated 0",
        delivered.len(),
        all.len()
    );
}

#[test]
fn a_second_live_process_with_the_same_instance_id_fences_the_first() {
    const PARTITIONS: i32 = 2;
    let (topic, group) = fresh_topic("static-fence", PARTITIONS);
    let producer = SteadyProducer::start(&topic, 4, Duration::from_millis(50));

    let first = static_member(&topic, &group, "consumer.1", 500);
    first.wait_for_line(|l| at(l, "committed"), WAIT);
    let so_far = processed(&first.lines()).len();
    first.wait_for_count(is_processed, so_far + 20, WAIT);
    // The second commits only when it stops: until then every commit the group holds
    // is the first one's.
    let second = static_member(&topic, &group, "consumer.1", 3_600_000);
    let code = first.wait_exit(WAIT);
    let first_lines = first.lines();
    assert_eq!(
        code,
        69,
        "a fenced member exits with EX_UNAVAILABLE:\n{}",
        first_lines.join("\n")
    );
    let fatal = first_lines
        .iter()
        .position(|l| at(l, "kafka_fatal"))
        .unwrap_or_else(|| panic!("no at=kafka_fatal line:\n{}", first_lines.join("\n")));
    assert_eq!(
        field(&first_lines[fatal], "fenced").as_deref(),
        Some("true"),
        "{}",
        first_lines[fatal]
    );
    let after_fence = &first_lines[fatal..];
    assert!(
        !after_fence.iter().any(|l| at(l, "committed")),
        "committed after the fence:\n{}",
        first_lines.join("\n")
    );

    // The second owns both partitions, resuming where the first's last accepted commit
    // left them; the group's offsets are still those (nothing the first processed after
    // that was committed, before or after the fence).
    wait_until(WAIT, || {
        holding(&second.lines()).len() == PARTITIONS as usize
    });
    let resumed = per_partition(&second.lines(), "assigned", "offset");
    let first_committed = per_partition(&first_lines, "committed", "offset");
    let group_committed = committed(&group, &topic, PARTITIONS);
    let first_processed = processed_by_partition(&first_lines);
    let mut processed_uncommitted = 0;
    for p in 0..PARTITIONS {
        assert_eq!(
            group_committed[&p],
            resumed.get(&p).copied(),
            "partition {p}: {}",
            second
                .lines()
                .iter()
                .filter(|l| !is_processed(l))
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert_eq!(
            first_committed.get(&p),
            resumed.get(&p),
            "partition {p}: the first's last accepted commit is where the second resumed"
        );
        let c = resumed.get(&p).copied().unwrap_or(0);
        processed_uncommitted += first_processed
            .get(&p)
            .map_or(0, |o| o.iter().filter(|o| **o >= c).count());
    }
    assert!(
        processed_uncommitted > 0,
        "the first processed nothing past its last commit: the fence proved nothing"
    );
    let not_committed = per_partition(after_fence, "not_committed", "acked_offset");

    // The second goes on and consumes everything.
    let delivered = producer.finish();
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    wait_until(WAIT, || {
        let mut seen: BTreeSet<_> = processed(&first_lines).into_iter().collect();
        seen.extend(processed(&second.lines()));
        seen.is_superset(&expected)
    });
    let second_lines = second.stop(0, WAIT);
    let all: Vec<(i32, i64)> = processed(&first_lines)
        .into_iter()
        .chain(processed(&second_lines))
        .collect();
    let lines: Vec<String> = first_lines.iter().chain(&second_lines).cloned().collect();
    let t = tally(&delivered, &all, &lines);
    assert!(t.lost.is_empty(), "lost {:?}", t.lost);
    // Every duplicate is a message the fenced one processed past its last commit.
    assert_eq!(t.duplicated.len(), processed_uncommitted, "{t:?}");
    assert_committed_to_ends(&group, &topic, PARTITIONS, &log_ends(&delivered));
    eprintln!(
        "fence: two live processes as consumer.1; the first exit 69 after {} lines, kafka_fatal fenced=true, \
         commits after the fence 0, group offsets stayed at its last commit {resumed:?}, not_committed {not_committed:?}; \
         the second resumed there and consumed on (exit 0). Messages {}, lost 0, duplicated {} (= processed by the \
         fenced one past its last commit); lines after the fence: {}",
        first_lines.len(),
        delivered.len(),
        t.duplicated.len(),
        after_fence
            .iter()
            .filter_map(|l| field(l, "at"))
            .collect::<Vec<_>>()
            .join(",")
    );
}

/// Heroku's restart of a dyno: SIGTERM to the old `consumer.1`, and the new `consumer.1`
/// started while the old one still drains its in-flight message. The old one's handler
/// (exec) holds that message until the test has seen the new one take the partition over,
/// so the fence always comes during the drain.
#[test]
fn a_replacement_started_while_the_old_process_drains_fences_it() {
    let (topic, group) = fresh_topic("static-drain", 1);
    let hold = log_dir().join(format!("{}.hold", unique_name("static-drain")));
    let handler = format!(
        // Replies name the offset they answer (the exec protocol).
        "while read -r line; do off=$(printf '%s' \"$line\" | sed -n 's/.*\"offset\":\\([0-9]*\\).*/\\1/p'); if [ -f '{h}' ]; then echo held >&2; while [ -f '{h}' ]; do sleep 0.05; done; fi; echo \"{{\\\"ack\\\":true,\\\"offset\\\":$off}}\"; done",
        h = hold.display()
    );
    let mut delivered = produce_keyed(&topic, 20, 0);
    let old = AckdBuilder::new(&topic, &group)
        .env("ACKD_STATIC_MEMBERSHIP", "true")
        .env("DYNO", "consumer.1")
        .env("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "10000")
        .env("ACKD_COMMIT_INTERVAL_MS", "500")
        .env("ACKD_PROCESSOR", "exec")
        .env("ACKD_EXEC_COMMAND", &handler)
        .spawn();
    old.wait_for_line(
        |l| at(l, "committed") && field(l, "offset").as_deref() == Some("20"),
        WAIT,
    );
    // The next message stays in flight until the hold is lifted.
    std::fs::write(&hold, b"").unwrap();
    delivered.extend(produce_keyed(&topic, 10, 20));
    old.wait_for_line(|l| at(l, "exec_stderr"), WAIT);
    old.sigterm();
    old.wait_for_line(|l| at(l, "shutdown_begun"), WAIT);
    // It commits only when it stops: until then the group's offset is the old one's.
    let new = static_member(&topic, &group, "consumer.1", 3_600_000);
    let assigned = new.wait_for_line(|l| at(l, "assigned"), WAIT);
    std::fs::remove_file(&hold).unwrap();
    let code = old.wait_exit(WAIT);
    let old_lines = old.lines();
    let all_old = old_lines.join("\n");
    assert_eq!(code, 69, "fenced while draining:\n{all_old}");
    let fatal = old_lines
        .iter()
        .position(|l| at(l, "kafka_fatal"))
        .unwrap_or_else(|| panic!("no at=kafka_fatal line:\n{all_old}"));
    assert_eq!(
        field(&old_lines[fatal], "fenced").as_deref(),
        Some("true"),
        "{all_old}"
    );
    let signal = old_lines.iter().position(|l| at(l, "signal")).unwrap();
    assert!(
        !old_lines[signal..].iter().any(|l| at(l, "committed")),
        "committed while fenced:\n{all_old}"
    );
    // The in-flight message finished (acknowledged: offset 21 is next) but is not committed.
    let not_committed = per_partition(&old_lines[fatal..], "not_committed", "acked_offset");
    assert_eq!(not_committed, BTreeMap::from([(0, 21)]), "{all_old}");
    assert!(processed(&old_lines).contains(&(0, 20)), "{all_old}");
    assert_eq!(int(&assigned, "offset"), Some(20), "{assigned}");
    assert_committed(&group, &topic, 0, Some(20));

    new.wait_for_count(is_processed, 10, WAIT);
    let new_lines = new.stop(0, WAIT);
    let all: Vec<(i32, i64)> = processed(&old_lines)
        .into_iter()
        .chain(processed(&new_lines))
        .collect();
    let lines: Vec<String> = old_lines.iter().chain(&new_lines).cloned().collect();
    let t = tally(&delivered, &all, &lines);
    assert!(t.lost.is_empty(), "lost {:?}", t.lost);
    assert_eq!(
        t.duplicated,
        vec![(0, 20)],
        "the message in flight at the fence"
    );
    assert_committed_to_ends(&group, &topic, 1, &log_ends(&delivered));
    eprintln!(
        "fenced while draining: old consumer.1 exit {code} (kafka_fatal fenced=true, not_committed acked_offset=21, \
         group offset stayed 20), new consumer.1 resumed at 20, exit 0; messages {}, lost 0, duplicated 1 (offset 20); \
         old lines after SIGTERM: {}",
        delivered.len(),
        old_lines[signal..]
            .iter()
            .filter_map(|l| field(l, "at"))
            .collect::<Vec<_>>()
            .join(",")
    );
}

/// KIP-848 turns static membership's fencing around: a second live process with the
/// same group.instance.id is refused (UNRELEASED_INSTANCE_ID, fatal in librdkafka)
/// instead of fencing the first. The newcomer stops with exit 69 having processed
/// nothing; the first goes on and stops cleanly; a replacement started after that takes
/// the partitions back at the committed offsets.
#[test]
fn under_the_consumer_protocol_a_second_process_with_the_same_id_is_refused_not_the_first() {
    let (topic, group) = fresh_topic("static848", 2);
    let mut delivered = produce_keyed(&topic, 50, 0);
    let static_member = || {
        AckdBuilder::new(&topic, &group)
            .consumer_protocol()
            .env("ACKD_STATIC_MEMBERSHIP", "true")
            .env("DYNO", "consumer.1")
            .spawn()
    };
    let first = static_member();
    first.wait_for_count(is_processed, 50, WAIT);
    let newcomer = static_member();
    let code = newcomer.wait_exit(WAIT);
    let newcomer_lines = newcomer.lines();
    assert_eq!(code, 69, "{}", newcomer_lines.join("\n"));
    let fatal = newcomer_lines
        .iter()
        .find(|l| at(l, "kafka_fatal"))
        .unwrap_or_else(|| panic!("no kafka_fatal line:\n{}", newcomer_lines.join("\n")));
    assert!(
        field(fatal, "error").is_some_and(|e| e.contains("UnreleasedInstanceId")),
        "{fatal}"
    );
    assert!(
        field(fatal, "msg").is_some_and(|m| m.contains("start this one after it has stopped")),
        "{fatal}"
    );
    assert_eq!(processed(&newcomer_lines).len(), 0, "{fatal}");

    delivered.extend(produce_keyed(&topic, 50, 50));
    first.wait_for_count(is_processed, 100, WAIT);
    first.stop(0, WAIT);

    delivered.extend(produce_keyed(&topic, 50, 100));
    let replacement = static_member();
    replacement.wait_for_count(is_processed, 50, WAIT);
    replacement.stop(0, WAIT);
    let mut lines = first.lines();
    lines.extend(replacement.lines());
    let t = tally(&delivered, &processed(&lines), &lines);
    eprintln!(
        "static consumer.1 (consumer protocol): newcomer exit {code}, messages {}, lost {}, duplicated {}, replacement took {:?}",
        delivered.len(),
        t.lost.len(),
        t.duplicated.len(),
        replacement.elapsed()
    );
    assert!(t.lost.is_empty() && t.duplicated.is_empty(), "{t:?}");
    assert_committed_to_ends(&group, &topic, 2, &log_ends(&delivered));
}
