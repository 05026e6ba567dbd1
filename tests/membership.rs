//! Several processes in one group under a steady producer, members leaving and joining:
//! three members, each in turn stopped with SIGTERM and replaced by a new one (the next
//! rotation waits for the replacement's assignment), then all stopped. Every handoff is
//! graceful, so nothing may be lost and nothing redelivered, except where the broker is
//! at fault, which the logs show: a member logged a refused commit (`at=commit_failed`,
//! TANSU.md's ILLEGAL_GENERATION during rebalances; see [`common::tally`]), or Tansu let
//! two members own a partition at once, one of them from a generation it had silently
//! left (see [`common::DoubleOwnership`]). Both are counted and printed.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;

const WAIT: Duration = Duration::from_secs(120);
const PARTITIONS: i32 = 6;
const MEMBERS: usize = 3;

fn member(topic: &str, group: &str, strategy: Option<&str>) -> AckdProcess {
    let mut b = AckdBuilder::new(topic, group)
        .env("ACKD_COMMIT_INTERVAL_MS", "1000")
        // Tansu answers a group's other requests slowly (~0.5 s) while it holds a join;
        // at the harness's 1000 ms a heartbeat can then miss the session and the member is
        // evicted (its commits refused with UNKNOWN_MEMBER_ID, exit 1, as it must be).
        // Joins are padded to 1 s at 2000 too: same pace, twice the margin. This test is
        // about graceful handoffs, not evictions.
        .env("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "2000");
    if let Some(s) = strategy {
        b = b.env("ACKD_RDKAFKA_PARTITION_ASSIGNMENT_STRATEGY", s);
    }
    b.spawn()
}

#[test]
fn three_members_rotated_one_by_one_under_load_lose_nothing_and_redeliver_nothing() {
    rotate(None);
}

#[test]
fn three_eager_members_rotated_one_by_one_under_load_lose_nothing_and_redeliver_nothing() {
    rotate(Some("range"));
}

/// `strategy`: the assignor (`None`: ackd's default, cooperative-sticky).
fn rotate(strategy: Option<&str>) {
    let topic = unique_name("members");
    let group = unique_name("g-members");
    create_topic(&topic, PARTITIONS);
    // ~200 messages/s.
    let producer = SteadyProducer::start(&topic, 10, Duration::from_millis(50));

    let mut live: Vec<AckdProcess> = (0..MEMBERS)
        .map(|_| member(&topic, &group, strategy))
        .collect();
    for m in &live {
        m.wait_for_line(|l| at(l, "assigned"), WAIT);
    }
    wait_until(WAIT, || {
        live.iter()
            .map(|m| processed(&m.lines()).len())
            .sum::<usize>()
            >= 100
    });

    let mut stopped: Vec<AckdProcess> = Vec::new();
    for rotation in 0..MEMBERS {
        let old = live.remove(0);
        old.sigterm();
        assert_eq!(
            old.wait_exit(WAIT),
            0,
            "rotation {rotation}:\n{}",
            old.lines().join("\n")
        );
        stopped.push(old);
        let new = member(&topic, &group, strategy);
        new.wait_for_line(|l| at(l, "assigned"), WAIT);
        // Under load: the replacement is working before the next member goes.
        new.wait_for_count(is_processed, 10, WAIT);
        live.push(new);
    }

    let delivered = producer.finish();
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    let all_processed = |ms: &[&AckdProcess]| -> Vec<(i32, i64)> {
        ms.iter().flat_map(|m| processed(&m.lines())).collect()
    };
    wait_until(WAIT, || {
        let ms: Vec<&AckdProcess> = stopped.iter().chain(&live).collect();
        let seen: BTreeSet<_> = all_processed(&ms).into_iter().collect();
        seen.is_superset(&expected)
    });
    for m in &live {
        m.sigterm();
    }
    for m in &live {
        assert_eq!(m.wait_exit(WAIT), 0, "{}", m.lines().join("\n"));
    }

    let ms: Vec<&AckdProcess> = stopped.iter().chain(&live).collect();
    let processed = all_processed(&ms);
    let lines: Vec<String> = ms.iter().flat_map(|m| m.lines()).collect();
    let mut t = tally(&delivered, &processed, &lines);
    let doubles = double_ownerships(&ms);
    t.explain_by(&doubles);
    assert!(t.lost.is_empty(), "lost {}: {:?}", t.lost.len(), t.lost);
    assert!(
        t.unexplained.is_empty(),
        "processed twice with no refused commit logged for them: {:?} (refused: {:?}, owned twice by the broker: {doubles:?})",
        t.unexplained,
        t.refused
    );
    let resumes = assert_resumes_where_released(&lines, &t.refused);
    assert!(resumes > 0, "no partition changed hands");
    let committed = committed(&group, &topic, PARTITIONS);
    for (p, end) in log_ends(&delivered) {
        assert_eq!(committed[&p], Some(end), "partition {p}");
    }
    let refused_lines = lines.iter().filter(|l| at(l, "commit_failed")).count();
    eprintln!(
        "membership {strategy:?}: members {MEMBERS} (processes {}), restarts {MEMBERS}, messages {}, processed {}, lost {}, duplicated {}, refused commits {refused_lines} {:?}, owned twice by the broker {doubles:?}, resumes checked {resumes}",
        ms.len(),
        delivered.len(),
        processed.len(),
        t.lost.len(),
        t.duplicated.len(),
        t.refused
    );
}
