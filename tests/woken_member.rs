//! A member that wakes up after its session expired (SIGSTOP past the session, as a VM
//! pause or a stalled host does to a process) while the group gave its partitions to the
//! other member: from the moment it learns its membership may be gone (its own clock, a
//! refused commit) it starts nothing more on them until a commit is accepted or the
//! group revokes them.
//!
//! Two members, 6 partitions, about 600 messages/s; one stopped until the other has
//! taken over its partitions and worked through a few thousand of their messages (what
//! the sleeper would fetch on waking), then continued; then both stopped gracefully.
//! Nothing may be lost, and beyond what the sleeper held uncommitted when it was stopped
//! (which the other member processes again, by design) at most a few dozen messages may
//! be processed twice; after waking, the sleeper finishes at most the calls it had under
//! way and starts nothing on the partitions it lost.
//!
//! The broker heartbeats KIP-848 members every 5 s (Kafka's default) with a 10 s
//! session: a woken member hears that it was fenced only at its next heartbeat.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::{accounting::*, ackd::*, broker::*, lines::*, produce::*, topics::*, wait::*};

const WAIT: Duration = Duration::from_secs(90);
const PARTITIONS: i32 = 6;
/// Repeats allowed beyond the sleeper's uncommitted work.
const REPEATS_MAX: usize = 40;
/// Messages of the sleeper's partitions the other member processes while it sleeps.
const TAKEN_OVER: usize = 2000;

fn broker_heartbeating_slowly() -> &'static Broker {
    static B: std::sync::OnceLock<&'static Broker> = std::sync::OnceLock::new();
    B.get_or_init(|| {
        broker_with(BrokerOptions {
            server_config: [
                ("group.consumer.session.timeout.ms", "10000"),
                ("group.consumer.heartbeat.interval.ms", "5000"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .to_vec(),
            ..BrokerOptions::default()
        })
    })
}

fn member(topic: &str, group: &str, consumer_protocol: bool) -> AckdProcess {
    let b = AckdBuilder::on(&broker_heartbeating_slowly().bootstrap(), topic, group)
        .env("ACKD_COMMIT_INTERVAL_MS", "1000");
    if consumer_protocol {
        b.consumer_protocol()
    } else {
        b.env("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "6000")
            .env("ACKD_RDKAFKA_HEARTBEAT_INTERVAL_MS", "500")
    }
    .spawn()
}

#[test]
fn a_consumer_protocol_member_woken_after_its_session_expired_stops_processing_what_it_lost() {
    woken_after_session(true);
}

#[test]
fn a_classic_member_woken_after_its_session_expired_stops_processing_what_it_lost() {
    woken_after_session(false);
}

fn woken_after_session(consumer_protocol: bool) {
    let started = Instant::now();
    let protocol = if consumer_protocol {
        "consumer"
    } else {
        "classic"
    };
    let (topic, group) = fresh_topic_on(broker_heartbeating_slowly(), "woken", PARTITIONS);
    // ~600 messages/s.
    let producer = SteadyProducer::start_with(
        producer_on(broker_heartbeating_slowly()),
        &topic,
        30,
        Duration::from_millis(50),
    );
    let sleeper = member(&topic, &group, consumer_protocol);
    let other = member(&topic, &group, consumer_protocol);
    for m in [&sleeper, &other] {
        m.wait_for_line(|l| at(l, "assigned"), WAIT);
    }
    // Both members busy on their own partitions, the sleeper's committed at least once.
    wait_until(WAIT, || {
        let (s, o) = (sleeper.lines(), other.lines());
        processed(&s).len() >= 300
            && processed(&o).len() >= 300
            && s.iter().any(|l| at(l, "committed"))
    });

    // Lines ackd queued but had not yet written when it was stopped would reach us only
    // after it wakes, and read as messages processed after waking: stop it between the
    // producer's bursts, once its output has been quiet for a while (its writer writes
    // a line within 1 ms).
    until_quiet(&sleeper, Duration::from_millis(15));
    sleeper.signal(libc::SIGSTOP);
    let stopped_at = Instant::now();
    // Past the session: the other member works through the sleeper's partitions.
    let owned = owned_partitions(&sleeper.lines());
    let sleepers: BTreeMap<i32, i64> = highest_per_partition(&processed(&sleeper.lines()))
        .into_iter()
        .filter(|(p, _)| owned.contains(p))
        .collect();
    assert!(!sleepers.is_empty(), "the sleeper owns no partition");
    wait_until(WAIT, || {
        processed(&other.lines())
            .iter()
            .filter(|(p, o)| sleepers.get(p).is_some_and(|high| o > high))
            .count()
            >= TAKEN_OVER
    });
    let before_wake = sleeper.line_count();
    let slept = stopped_at.elapsed();
    sleeper.signal(libc::SIGCONT);
    // The sleeper hears it lost its partitions, and joins again.
    sleeper.wait_for_line_from(
        before_wake,
        |l| at(l, "revoke_begun") && field(l, "lost").as_deref() == Some("true"),
        WAIT,
    );
    sleeper.wait_for_line_from(before_wake, |l| at(l, "assigned"), WAIT);
    let delivered = producer.finish();
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    wait_until(WAIT, || {
        let seen: BTreeSet<_> = processed(&sleeper.lines())
            .into_iter()
            .chain(processed(&other.lines()))
            .collect();
        seen.is_superset(&expected)
    });
    for m in [&sleeper, &other] {
        m.sigterm();
    }
    let codes = [sleeper.wait_exit(WAIT), other.wait_exit(WAIT)];

    let (s, o) = (sleeper.lines(), other.lines());
    let held = held_uncommitted(&s[..before_wake]);
    let all: Vec<(i32, i64)> = processed(&s).into_iter().chain(processed(&o)).collect();
    let lines: Vec<String> = s.iter().chain(&o).cloned().collect();
    let t = tally(&delivered, &all, &lines);
    let beyond: Vec<(i32, i64)> = t
        .duplicated
        .iter()
        .filter(|m| !held.contains(m))
        .copied()
        .collect();
    // What the sleeper processed of the partitions it lost, after waking.
    let woken_lines = &s[before_wake..];
    let until_revoke = woken_lines
        .iter()
        .position(|l| at(l, "revoke_begun"))
        .unwrap_or(woken_lines.len());
    let zombie = processed(&woken_lines[..until_revoke]);
    let doubts: Vec<&str> = s
        .iter()
        .filter(|l| at(l, "membership_in_doubt"))
        .map(String::as_str)
        .collect();
    eprintln!(
        "woken {protocol}: messages {}, processed {}, lost {}, processed twice {} (held uncommitted by the sleeper {}, beyond it {}), slept {:.1} s, the sleeper processed {} after waking, exit codes {codes:?}, {:.1} s\n{}",
        delivered.len(),
        all.len(),
        t.lost.len(),
        t.duplicated.len(),
        held.len(),
        beyond.len(),
        slept.as_secs_f64(),
        processed(&s[before_wake..]).len(),
        started.elapsed().as_secs_f64(),
        doubts.join("\n")
    );
    // Which, and how the sleeper heard of it, for the record.
    eprintln!(
        "  beyond: {beyond:?}; the sleeper processed {zombie:?} after waking, before the revoke"
    );
    for l in s[before_wake..]
        .iter()
        .filter(|l| !is_processed(l))
        .take(30)
    {
        eprintln!("  sleeper: {l}");
    }
    assert!(t.lost.is_empty(), "lost {}: {:?}", t.lost.len(), t.lost);
    assert!(
        beyond.len() <= REPEATS_MAX,
        "processed twice beyond what the sleeper held uncommitted: {} (at most {REPEATS_MAX}): {beyond:?}\nthe sleeper after waking:\n{}",
        beyond.len(),
        s[before_wake..].iter().filter(|l| !is_processed(l)).cloned().collect::<Vec<_>>().join("\n")
    );
    // Only a call under way when it was stopped (one per partition: partition ordering)
    // may finish after it wakes; nothing new starts.
    assert!(
        zombie.len() <= sleepers.len(),
        "the sleeper processed {} messages of the partitions it lost after waking: {zombie:?}; its lines after waking, up to the revoke:\n{}",
        zombie.len(),
        woken_lines[..until_revoke].join("\n")
    );
    assert_eq!(codes, [0, 0], "exit codes (sleeper, other)");
    assert!(
        !doubts.is_empty(),
        "the sleeper never said its membership was in doubt"
    );
}

/// The partitions a process owns after `lines` (assigned, not revoked since).
fn owned_partitions(lines: &[String]) -> BTreeSet<i32> {
    let mut owned = BTreeSet::new();
    for l in lines {
        let partition = || field(l, "partition").and_then(|p| p.parse::<i32>().ok());
        if at(l, "assigned") {
            owned.extend(partition());
        } else if at(l, "revoked") {
            if let Some(p) = partition() {
                owned.remove(&p);
            }
        }
    }
    owned
}

/// The highest offset processed per partition.
fn highest_per_partition(processed: &[(i32, i64)]) -> BTreeMap<i32, i64> {
    let mut high = BTreeMap::new();
    for &(p, o) in processed {
        let h = high.entry(p).or_insert(o);
        *h = (*h).max(o);
    }
    high
}

/// Returns once `member` has written no line for `quiet`.
fn until_quiet(member: &AckdProcess, quiet: Duration) {
    let (mut count, mut since) = (member.line_count(), Instant::now());
    wait_until(WAIT, || {
        let now = member.line_count();
        if now != count {
            (count, since) = (now, Instant::now());
        }
        since.elapsed() >= quiet
    });
}

/// What a process's `lines` processed at or above its last accepted commit of each
/// partition: the work its partitions' next owner processes again, by design.
fn held_uncommitted(lines: &[String]) -> BTreeSet<(i32, i64)> {
    let mut committed: BTreeMap<i32, i64> = BTreeMap::new();
    for l in lines.iter().filter(|l| at(l, "committed")) {
        if let (Some(p), Some(o)) = (field(l, "partition"), field(l, "offset")) {
            committed.insert(p.parse().unwrap(), o.parse().unwrap());
        }
    }
    processed(lines)
        .into_iter()
        .filter(|(p, o)| committed.get(p).is_none_or(|c| o >= c))
        .collect()
}
