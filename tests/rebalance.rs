//! Partitions moving between members of one group under a steady producer: revoked
//! partitions are drained and committed before they are released, so the member that
//! gets them resumes at exactly the next message: nothing lost, nothing processed twice,
//! no commit refused but periodic ones racing a classic rebalance
//! ([`common::lines::split_refusals`]). The classic protocol with the cooperative-sticky default and an
//! eager assignor (range), and the consumer protocol (KIP-848).

mod common;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use common::{accounting::*, ackd::*, lines::*, offsets::*, produce::*, topics::*, wait::*};

const WAIT: Duration = Duration::from_secs(90);
const PARTITIONS: i32 = 4;

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

fn handoff(assignment: Assignment) {
    let started = std::time::Instant::now();
    let (topic, group) = fresh_topic("rebalance", PARTITIONS);

    let producer_topic = topic.clone();
    let producer = std::thread::spawn(move || {
        let mut all = Vec::new();
        for batch in 0..60 {
            all.extend(produce_keyed(&producer_topic, 20, batch * 20));
            std::thread::sleep(Duration::from_millis(100));
        }
        all
    });
    let member = || {
        let b = AckdBuilder::new(&topic, &group).env("ACKD_COMMIT_INTERVAL_MS", "1000");
        match assignment {
            Assignment::Cooperative => b,
            Assignment::Eager => b.env("ACKD_RDKAFKA_PARTITION_ASSIGNMENT_STRATEGY", "range"),
            Assignment::Consumer => b.consumer_protocol(),
        }
        .spawn()
    };

    let a = member();
    a.wait_for_count(is_processed, 50, WAIT);
    // A second member joins: some of a's partitions move to b.
    let b = member();
    b.wait_for_line(|l| at(l, "assigned"), WAIT);
    a.wait_for_line(|l| at(l, "revoked"), WAIT);
    b.wait_for_count(is_processed, 20, WAIT);
    // a leaves gracefully: b takes everything.
    a.stop(0, WAIT);
    let delivered = producer.join().expect("producer");
    let a_lines = a.lines();
    let a_processed = processed(&a_lines);
    b.wait_for_count(
        is_processed,
        delivered.len().saturating_sub(a_processed.len()),
        WAIT,
    );
    // b may still be catching up on redelivered messages: wait until it has them all.
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    wait_until(WAIT, || {
        let mut seen: BTreeSet<(i32, i64)> = a_processed.iter().copied().collect();
        seen.extend(processed(&b.lines()));
        seen.is_superset(&expected)
    });
    let b_lines = b.stop(0, WAIT);

    let mut all = a_processed.clone();
    all.extend(processed(&b_lines));
    let seen: BTreeSet<_> = all.iter().copied().collect();
    let lost: Vec<_> = expected.difference(&seen).collect();
    assert!(lost.is_empty(), "lost {}: {lost:?}", lost.len());

    let mut lines = a_lines.clone();
    lines.extend(b_lines.iter().cloned());
    // Periodic commits racing a classic rebalance are refused by Kafka's design
    // (see split_refusals) and carried by the next commit; any other refusal fails.
    let (by_design, refused) = split_refusals(&lines, !matches!(assignment, Assignment::Consumer));
    let mut counts: HashMap<(i32, i64), usize> = HashMap::new();
    for m in &all {
        *counts.entry(*m).or_default() += 1;
    }
    let duplicates: Vec<_> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(m, _)| *m)
        .collect();
    eprintln!(
        "handoff {assignment:?}: produced {}, processed {} (a {}, b {}), lost 0, duplicated {}, refused commits {} (+{} periodic during a classic rebalance), {:.1} s",
        delivered.len(),
        all.len(),
        a_processed.len(),
        all.len() - a_processed.len(),
        duplicates.len(),
        refused.len(),
        by_design.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        duplicates.is_empty(),
        "processed twice {}: {duplicates:?}",
        duplicates.len()
    );
    // Kafka refuses no revoke, shutdown or KIP-848 commit of a member that still owns
    // its partitions.
    assert!(refused.is_empty(), "refused commits:\n{refused:#?}");
    // Every resume point is an offset some member released the partition at: a revoke
    // or a final commit, never an older periodic commit.
    let resumes = assert_resumes_where_released(&lines, &Default::default());
    assert!(resumes > 0, "no partition changed hands");
    let committed = committed(&group, &topic, PARTITIONS);
    for (p, end) in log_ends(&delivered) {
        assert_eq!(committed[&p], Some(end), "partition {p}");
    }
}

#[test]
fn cooperative_handoff_loses_nothing_and_redelivers_nothing() {
    handoff(Assignment::Cooperative);
}

#[test]
fn eager_handoff_loses_nothing_and_redelivers_nothing() {
    handoff(Assignment::Eager);
}

#[test]
fn consumer_protocol_handoff_loses_nothing_and_redelivers_nothing() {
    handoff(Assignment::Consumer);
}
