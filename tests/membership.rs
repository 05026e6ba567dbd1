//! Several processes in one group under a steady producer, members leaving and joining:
//! three members, each in turn stopped with SIGTERM and replaced by a new one (the next
//! rotation waits for the replacement's assignment), then all stopped. Every handoff is
//! graceful, so on Kafka nothing may be lost and nothing processed twice, and no commit
//! may be refused but periodic ones racing a classic rebalance ([`common::lines::split_refusals`]):
//! for each of the classic protocol's cooperative-sticky (ackd's default) and eager
//! (range) assignors, and the consumer protocol (KIP-848).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{accounting::*, ackd::*, lines::*, offsets::*, produce::*, topics::*, wait::*};

const WAIT: Duration = Duration::from_secs(120);
const PARTITIONS: i32 = 6;
const MEMBERS: usize = 3;

/// How the group assigns partitions.
#[derive(Debug, Clone, Copy)]
enum Assignment {
    /// The classic protocol with ackd's default assignor, cooperative-sticky.
    Cooperative,
    /// The classic protocol with an eager assignor (range).
    Eager,
    /// The consumer protocol (KIP-848): the broker assigns, incrementally.
    Consumer,
}

fn member(topic: &str, group: &str, assignment: Assignment) -> AckdProcess {
    let b = AckdBuilder::new(topic, group).env("ACKD_COMMIT_INTERVAL_MS", "1000");
    // Classic: the broker's KIP-848 session (broker.rs), so both protocols face the same
    // liveness bound on a loaded machine. A graceful stop leaves the group: no handoff
    // waits for it.
    let classic = |b: AckdBuilder| {
        b.env("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "6000")
            .env("ACKD_RDKAFKA_HEARTBEAT_INTERVAL_MS", "500")
    };
    match assignment {
        Assignment::Cooperative => classic(b),
        Assignment::Eager => classic(b).env("ACKD_RDKAFKA_PARTITION_ASSIGNMENT_STRATEGY", "range"),
        Assignment::Consumer => b.consumer_protocol(),
    }
    .spawn()
}

#[test]
fn three_members_rotated_one_by_one_under_load_lose_nothing_and_redeliver_nothing() {
    rotate(Assignment::Cooperative);
}

#[test]
fn three_eager_members_rotated_one_by_one_under_load_lose_nothing_and_redeliver_nothing() {
    rotate(Assignment::Eager);
}

#[test]
fn three_consumer_protocol_members_rotated_one_by_one_under_load_lose_nothing_and_redeliver_nothing(
) {
    rotate(Assignment::Consumer);
}

fn rotate(assignment: Assignment) {
    let started = std::time::Instant::now();
    let (topic, group) = fresh_topic("members", PARTITIONS);
    // ~200 messages/s.
    let producer = SteadyProducer::start(&topic, 10, Duration::from_millis(50));

    let mut live: Vec<AckdProcess> = (0..MEMBERS)
        .map(|_| member(&topic, &group, assignment))
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
        let new = member(&topic, &group, assignment);
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
        m.assert_exit(0, WAIT);
    }

    let ms: Vec<&AckdProcess> = stopped.iter().chain(&live).collect();
    let processed = all_processed(&ms);
    let lines: Vec<String> = ms.iter().flat_map(|m| m.lines()).collect();
    let protocol = match assignment {
        Assignment::Consumer => "consumer",
        _ => "classic",
    };
    assert_eq!(
        lines
            .iter()
            .filter(|l| at(l, "start") && field(l, "group_protocol").as_deref() == Some(protocol))
            .count(),
        ms.len(),
        "every process runs the {protocol} protocol"
    );
    let t = tally(&delivered, &processed, &lines);
    // Periodic commits racing a classic rebalance are refused by Kafka's design
    // (see split_refusals) and carried by the next commit; any other refusal fails.
    let (by_design, refused) = split_refusals(&lines, !matches!(assignment, Assignment::Consumer));
    let retries = count_at(&lines, "commit_retry");
    eprintln!(
        "membership {assignment:?}: members {MEMBERS} (processes {}), restarts {MEMBERS}, messages {}, processed {}, lost {}, duplicated {}, refused commits {} (+{} periodic during a classic rebalance), commit retries {retries}, {:.1} s",
        ms.len(),
        delivered.len(),
        processed.len(),
        t.lost.len(),
        t.duplicated.len(),
        refused.len(),
        by_design.len(),
        started.elapsed().as_secs_f64()
    );
    // Kafka refuses no revoke, shutdown or KIP-848 commit of a member that still owns
    // its partitions.
    assert_lost_nothing_repeated_nothing(&t, &refused);
    let resumes = assert_resumes_where_released(&lines, &Default::default());
    assert!(resumes > 0, "no partition changed hands");
    let committed = committed(&group, &topic, PARTITIONS);
    for (p, end) in log_ends(&delivered) {
        assert_eq!(committed[&p], Some(end), "partition {p}");
    }
}

/// A deployment that switches protocols the way Heroku rolls one out: three classic
/// cooperative-sticky members under a steady producer, then three consumer-protocol
/// members started beside them, then the classic ones stopped one by one with SIGTERM.
///
/// Kafka (4.4) converts the group to a consumer group when the first consumer-protocol
/// member joins, unless a classic member's last subscription carries assignor userData,
/// which librdkafka's cooperative-sticky fills with its previous assignment once it has
/// one: then the broker logs "Cannot upgrade classic group … userData from a custom
/// assignor would be lost" and the consumer-protocol members wait, unassigned, until the
/// classic ones are gone. Both happen (it depends on timing). Either way nothing may be
/// lost or processed twice.
#[test]
fn a_rolling_switch_from_cooperative_to_the_consumer_protocol_loses_nothing_and_redelivers_nothing()
{
    let started = std::time::Instant::now();
    let (topic, group) = fresh_topic("switch", PARTITIONS);
    let producer = SteadyProducer::start(&topic, 10, Duration::from_millis(50));
    let old: Vec<AckdProcess> = (0..MEMBERS)
        .map(|_| member(&topic, &group, Assignment::Cooperative))
        .collect();
    for m in &old {
        m.wait_for_line(|l| at(l, "assigned"), WAIT);
    }
    wait_until(WAIT, || {
        old.iter()
            .map(|m| processed(&m.lines()).len())
            .sum::<usize>()
            >= 100
    });
    let new: Vec<AckdProcess> = (0..MEMBERS)
        .map(|_| member(&topic, &group, Assignment::Consumer))
        .collect();
    for m in &new {
        m.wait_for_line(|l| at(l, "start"), WAIT);
    }
    for (i, m) in old.iter().enumerate() {
        let before = old
            .iter()
            .map(|m| processed(&m.lines()).len())
            .sum::<usize>()
            + new
                .iter()
                .map(|m| processed(&m.lines()).len())
                .sum::<usize>();
        // Under load: something was processed since the previous stop.
        wait_until(WAIT, || {
            old.iter()
                .map(|m| processed(&m.lines()).len())
                .sum::<usize>()
                + new
                    .iter()
                    .map(|m| processed(&m.lines()).len())
                    .sum::<usize>()
                > before + 10
        });
        m.sigterm();
        assert_eq!(
            m.wait_exit(WAIT),
            0,
            "old member {i}:\n{}",
            m.lines().join("\n")
        );
    }
    for m in &new {
        m.wait_for_line(|l| at(l, "assigned"), WAIT);
    }
    let delivered = producer.finish();
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    let all = || -> Vec<(i32, i64)> {
        old.iter()
            .chain(&new)
            .flat_map(|m| processed(&m.lines()))
            .collect()
    };
    wait_until(WAIT, || {
        all()
            .into_iter()
            .collect::<BTreeSet<_>>()
            .is_superset(&expected)
    });
    for m in &new {
        m.sigterm();
    }
    for m in &new {
        m.assert_exit(0, WAIT);
    }
    let new_processed: usize = new.iter().map(|m| processed(&m.lines()).len()).sum();
    let processed = all();
    let lines: Vec<String> = old.iter().chain(&new).flat_map(|m| m.lines()).collect();
    let t = tally(&delivered, &processed, &lines);
    let (by_design, refused) = split_refusals(&lines, true);
    eprintln!(
        "switch Cooperative -> Consumer: processes {}, messages {}, processed {} (by the consumer-protocol members {new_processed}), lost {}, duplicated {}, refused commits {} (+{} periodic during a classic rebalance), {:.1} s",
        old.len() + new.len(),
        delivered.len(),
        processed.len(),
        t.lost.len(),
        t.duplicated.len(),
        refused.len(),
        by_design.len(),
        started.elapsed().as_secs_f64()
    );
    assert_lost_nothing_repeated_nothing(&t, &refused);
    assert!(assert_resumes_where_released(&lines, &Default::default()) > 0);
    let committed = committed(&group, &topic, PARTITIONS);
    for (p, end) in log_ends(&delivered) {
        assert_eq!(committed[&p], Some(end), "partition {p}");
    }
}

/// A graceful rotation on Kafka: nothing lost, nothing processed twice, and no commit
/// refused but the periodic ones Kafka refuses by design (already split off).
#[track_caller]
fn assert_lost_nothing_repeated_nothing<R: std::fmt::Debug>(t: &Tally, refused: &[R]) {
    assert!(t.lost.is_empty(), "lost {}: {:?}", t.lost.len(), t.lost);
    assert!(
        t.duplicated.is_empty(),
        "processed twice {}: {:?}",
        t.duplicated.len(),
        t.duplicated
    );
    assert!(refused.is_empty(), "refused commits:\n{refused:#?}");
}
