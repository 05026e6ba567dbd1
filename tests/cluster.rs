//! Broker faults on a 3-node Kafka cluster (every node a broker and a KRaft controller,
//! topics and `__consumer_offsets` replicated 3 times), as Heroku's maintenance does them:
//!
//! - a rolling restart: each node stopped (SIGTERM, controlled shutdown), started again
//!   and waited for in turn, under a steady stream, with one ackd and with two;
//! - the group coordinator's node killed (SIGKILL) mid-stream and started again later.
//!
//! ackd keeps consuming through it all and stops with SIGTERM: nothing lost, nothing
//! processed twice unless a refused commit (`at=commit_failed`) was logged for it, and the
//! group committed at every partition's log end. The producer rides through the restarts
//! ([`common::produce::producer_riding_restarts`]).
//!
//! Members use a 30 s session (librdkafka's default is 45 s): a coordinator moving takes
//! seconds, and the harness's 1 s session would make every move an eviction, which is a
//! different test (`broker_outage.rs`).
//!
//! One 3-node cluster at a time ([`one_at_a_time`]): the machine has 2 cores.

mod common;

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{
    accounting::*, ackd::*, broker::*, lines::*, offsets::*, produce::*, topics::*, wait::*,
};

const WAIT: Duration = Duration::from_secs(180);
const PARTITIONS: i32 = 6;

/// Serializes this binary's tests: each starts a cluster of three JVMs.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn three_nodes() -> Broker {
    Broker::start(BrokerOptions {
        nodes: 3,
        ..BrokerOptions::default()
    })
}

fn member(b: &Broker, topic: &str, group: &str) -> AckdProcess {
    AckdBuilder::on(&b.bootstrap(), topic, group)
        .env("ACKD_COMMIT_INTERVAL_MS", "1000")
        .env("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "30000")
        .env("ACKD_RDKAFKA_HEARTBEAT_INTERVAL_MS", "1000")
        .spawn()
}

fn all_processed(members: &[AckdProcess]) -> Vec<(i32, i64)> {
    members.iter().flat_map(|m| processed(&m.lines())).collect()
}

/// Waits until the members have processed `more` messages past `from`, and the
/// producer has delivered `more` past `delivered`: both sides go on.
fn wait_for_progress(members: &[AckdProcess], producer: &SteadyProducer, more: usize) {
    let (from, delivered) = (all_processed(members).len(), producer.count());
    wait_until(WAIT, || {
        producer.count() >= delivered + more && all_processed(members).len() >= from + more
    });
}

/// Waits until every delivered message was processed, stops the members with SIGTERM,
/// checks their exit codes, and accounts for everything: returns (tally, lines).
fn stop_and_tally(
    b: &Broker,
    members: &[AckdProcess],
    delivered: &[Delivered],
    topic: &str,
    group: &str,
) -> (Tally, Vec<String>) {
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    wait_until(WAIT, || {
        let seen: BTreeSet<_> = all_processed(members).into_iter().collect();
        seen.is_superset(&expected)
    });
    for m in members {
        m.sigterm();
    }
    for m in members {
        m.assert_exit(0, WAIT);
    }
    let lines: Vec<String> = members.iter().flat_map(|m| m.lines()).collect();
    let t = tally(delivered, &all_processed(members), &lines);
    assert!(t.lost.is_empty(), "lost {}: {:?}", t.lost.len(), t.lost);
    let per_member: Vec<Vec<String>> = members.iter().map(|m| m.lines()).collect();
    let refused = refused_ranges(&per_member);
    let unexplained = unexplained_repeats(&t.duplicated, &refused);
    assert!(
        unexplained.is_empty(),
        "processed twice with no refused commit that can explain them: {unexplained:?} (refused, as partition and [from, to): {refused:?})"
    );
    let committed = committed_on(&b.bootstrap(), group, topic, PARTITIONS);
    for (p, end) in log_ends(delivered) {
        assert_eq!(committed[&p], Some(end), "partition {p}");
    }
    (t, lines)
}

/// What each refused commit (`at=commit_failed`) can leave to process again, per member's
/// lines: (partition, from, to), the offsets from the group's commit then (the member's
/// last accepted commit of the partition, or where its assignment resumed) up to the
/// refused one. A repeat outside every such range is not explained by a refusal.
fn refused_ranges(per_member: &[Vec<String>]) -> Vec<(i32, i64, i64)> {
    let mut ranges = Vec::new();
    for lines in per_member {
        let mut base = std::collections::HashMap::new();
        for l in lines {
            let number = |k| field(l, k).and_then(|v| v.parse::<i64>().ok());
            let (Some(p), Some(o)) = (number("partition"), number("offset")) else {
                continue;
            };
            let p = p as i32;
            if at(l, "committed") || at(l, "assigned") {
                base.insert(p, o);
            } else if at(l, "commit_failed") {
                // Nothing known of the group's commit: any lower offset may come again.
                ranges.push((p, base.get(&p).copied().unwrap_or(i64::MIN), o));
            }
        }
    }
    ranges
}

/// The repeats (partition, offset) that no refused range of [`refused_ranges`] holds.
fn unexplained_repeats(duplicated: &[(i32, i64)], refused: &[(i32, i64, i64)]) -> Vec<(i32, i64)> {
    duplicated
        .iter()
        .filter(|(p, o)| !refused.iter().any(|r| r.0 == *p && (r.1..r.2).contains(o)))
        .copied()
        .collect()
}

/// A repeat below the group's commit when the refusal came is not the refusal's doing,
/// nor one at or above the refused offset, nor one on another partition.
#[test]
fn a_refused_commit_explains_only_the_offsets_above_the_commit_before_it() {
    let lines: Vec<String> = [
        "at=assigned topic=t partition=0 offset=0 from=committed",
        "at=committed topic=t partition=0 offset=10",
        "at=commit_failed topic=t partition=0 offset=20",
        "at=commit_failed topic=t partition=1 offset=5",
    ]
    .map(String::from)
    .to_vec();
    let refused = refused_ranges(&[lines]);
    assert_eq!(refused, vec![(0, 10, 20), (1, i64::MIN, 5)]);
    let repeats = [(0, 3), (0, 9), (0, 10), (0, 19), (0, 20), (1, 4), (2, 1)];
    assert_eq!(
        unexplained_repeats(&repeats, &refused),
        vec![(0, 3), (0, 9), (0, 20), (2, 1)]
    );
}

/// The refused commits' errors, each with how many lines gave it.
fn refusals(lines: &[String]) -> Vec<(String, usize)> {
    let mut by_error = std::collections::BTreeMap::new();
    for l in lines.iter().filter(|l| at(l, "commit_failed")) {
        *by_error
            .entry(field(l, "error").unwrap_or_default())
            .or_insert(0) += 1;
    }
    by_error.into_iter().collect()
}

fn peak_rss_mib(b: &Broker) -> Vec<u64> {
    (0..b.nodes())
        .filter_map(|i| b.node_peak_rss_kib(i).map(|k| k / 1024))
        .collect()
}

#[test]
fn a_rolling_restart_of_every_broker_loses_nothing_and_redelivers_nothing() {
    rolling_restart(1);
}

#[test]
fn a_rolling_restart_under_two_members_loses_nothing_and_redelivers_nothing() {
    rolling_restart(2);
}

fn rolling_restart(members: usize) {
    let _one = one_at_a_time();
    let began = Instant::now();
    let b = three_nodes();
    let (topic, group) = fresh_topic_on(&b, "rolling", PARTITIONS);
    // ~100 messages/s.
    let producer = SteadyProducer::start_with(
        producer_riding_restarts(&b),
        &topic,
        10,
        Duration::from_millis(100),
    );
    let live: Vec<AckdProcess> = (0..members).map(|_| member(&b, &topic, &group)).collect();
    for m in &live {
        m.wait_for_line(|l| at(l, "assigned"), WAIT);
    }
    wait_for_progress(&live, &producer, 50);

    let mut restarts = Vec::new();
    for i in 0..b.nodes() {
        let t = Instant::now();
        b.stop_node(i);
        let stopped_in = t.elapsed();
        // One node down: producing and consuming go on through the other two.
        wait_for_progress(&live, &producer, 50);
        let t = Instant::now();
        b.start_node(i);
        b.wait_node_ready(i);
        let started_in = t.elapsed();
        wait_for_full_isr(&b, WAIT);
        let in_sync_in = t.elapsed();
        wait_for_progress(&live, &producer, 50);
        eprintln!(
            "rolling restart ({members} member(s)): node {} stopped in {stopped_in:?}, started and ready in {started_in:?}, every replica in sync after {in_sync_in:?}",
            b.node_id(i)
        );
        restarts.push((stopped_in, started_in));
    }

    let delivered = producer.finish();
    let signalled = Instant::now();
    let (t, lines) = stop_and_tally(&b, &live, &delivered, &topic, &group);
    let kafka_errors = count_at(&lines, "kafka_error");
    eprintln!(
        "rolling restart ({members} member(s)): cluster started in {:?}, restarts {}, messages {}, processed {}, lost {}, duplicated {}, refused commits {:?}, kafka_error lines {kafka_errors}, exit codes 0, caught up and stopped {:?} after the producer, whole test {:?}, node peak RSS MiB {:?}",
        b.started_in(),
        restarts.len(),
        delivered.len(),
        all_processed(&live).len(),
        t.lost.len(),
        t.duplicated.len(),
        refusals(&lines),
        signalled.elapsed(),
        began.elapsed(),
        peak_rss_mib(&b),
    );
}

#[test]
fn the_group_coordinators_broker_killed_mid_stream_loses_nothing() {
    let _one = one_at_a_time();
    let began = Instant::now();
    let b = three_nodes();
    let (topic, group) = fresh_topic_on(&b, "coordinator", PARTITIONS);
    let producer = SteadyProducer::start_with(
        producer_riding_restarts(&b),
        &topic,
        10,
        Duration::from_millis(100),
    );
    let live = vec![member(&b, &topic, &group)];
    live[0].wait_for_line(|l| at(l, "assigned"), WAIT);
    wait_for_progress(&live, &producer, 50);

    let coordinator = b.coordinator_of(&group);
    let killed_at = live[0].line_count();
    let t = Instant::now();
    b.kill_node(coordinator);
    // ackd carries on (every producer batch spans all partitions: their leaders moved)...
    wait_for_progress(&live, &producer, 100);
    // ...and its commits land, on a new coordinator: the old one's node is dead.
    let cursor = live[0].line_count();
    let committed_line = live[0].wait_for_line_from(cursor, |l| at(l, "committed"), WAIT);
    let commits_again_in = t.elapsed();
    wait_for_progress(&live, &producer, 50);

    let t = Instant::now();
    b.start_node(coordinator);
    b.wait_node_ready(coordinator);
    let started_in = t.elapsed();
    wait_for_full_isr(&b, WAIT);
    wait_for_progress(&live, &producer, 50);
    let coordinator_after = b.coordinator_of(&group);

    let delivered = producer.finish();
    let (t, lines) = stop_and_tally(&b, &live, &delivered, &topic, &group);
    let after_kill = &lines[killed_at..];
    // A commit in flight when the node died waits for the new coordinator.
    let longest_commit_ms = after_kill
        .iter()
        .filter(|l| at(l, "committed"))
        .filter_map(|l| field(l, "duration_ms")?.parse::<f64>().ok())
        .fold(0.0, f64::max);
    let revoked_lost = after_kill
        .iter()
        .filter(|l| at(l, "revoked") && field(l, "lost").as_deref() == Some("true"))
        .count();
    eprintln!(
        "coordinator killed: node {} (coordinator afterwards: node {}), commits accepted again within {commits_again_in:?} of the kill ({committed_line}), longest commit after the kill {longest_commit_ms} ms, node back in {started_in:?}; cluster started in {:?}, messages {}, processed {}, lost {}, duplicated {}, refused commits {:?}, assignments lost {revoked_lost}, exit code 0, whole test {:?}",
        b.node_id(coordinator),
        b.node_id(coordinator_after),
        b.started_in(),
        delivered.len(),
        all_processed(&live).len(),
        t.lost.len(),
        t.duplicated.len(),
        refusals(&lines),
        began.elapsed(),
    );
}
