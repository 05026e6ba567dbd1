//! `ACKD_STOP_AT_END=true`: consume to the end of every assigned partition, commit,
//! leave, exit 0. Backfills and one-off jobs rely on it, and the benchmark times it.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{ackd::*, lines::*, offsets::*, produce::*, topics::*, wait::*};

const WAIT: Duration = Duration::from_secs(60);

#[test]
fn it_stops_at_the_end_of_every_partition_with_everything_committed() {
    // More partitions than keys guarantee at least one empty partition.
    let (topic, group) = fresh_topic("end", 6);
    let delivered = produce_keyed(&topic, 3, 0);
    let more = produce_keyed(&topic, 400, 3);
    let delivered: Vec<_> = delivered.into_iter().chain(more).collect();

    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_STOP_AT_END", "true")
        .env("ACKD_PROCESSOR", "noop")
        .spawn();
    ackd.assert_exit(0, WAIT);
    let lines = ackd.lines();
    let processed: Vec<_> = processed(&lines);
    let expected: BTreeSet<_> = delivered.iter().map(|d| (d.partition, d.offset)).collect();
    assert_eq!(processed.len(), delivered.len(), "each message once");
    assert_eq!(processed.iter().copied().collect::<BTreeSet<_>>(), expected);
    let ends = log_ends(&delivered);
    let committed = committed(&group, &topic, 6);
    for p in 0..6 {
        assert_eq!(committed[&p], ends.get(&p).copied(), "partition {p}");
    }
    let ended = lines
        .iter()
        .filter(|l| field(l, "at").as_deref() == Some("end_of_partition"))
        .count();
    assert_eq!(
        ended, 6,
        "every partition, the empty ones too, reports its end"
    );
    assert!(lines
        .iter()
        .any(|l| field(l, "at").as_deref() == Some("end_reached")));
    // Reaching the end is the normal course of such a run: nothing may read as an error.
    let errors: Vec<_> = lines
        .iter()
        .filter(|l| field(l, "level").as_deref() == Some("error"))
        .collect();
    assert!(errors.is_empty(), "a normal run to the end: {errors:#?}");

    // A second run finds nothing new: it ends at once, having processed nothing.
    let again = AckdBuilder::new(&topic, &group)
        .env("ACKD_STOP_AT_END", "true")
        .spawn();
    again.assert_exit(0, WAIT);
    assert!(common::lines::processed(&again.lines()).is_empty());
}

/// The end is said once the last message the broker had is handed out, not with the
/// broker's answer to the next fetch, which it holds up to `fetch.wait.max.ms` when
/// nothing is new.
#[test]
fn the_end_is_said_without_waiting_for_the_brokers_hold() {
    let (topic, group) = fresh_topic("end-hold", 1);
    let delivered = produce_keyed(&topic, 200, 0);
    let hold = Duration::from_secs(40);
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_STOP_AT_END", "true")
        .env("ACKD_PROCESSOR", "noop")
        .env(
            "ACKD_RDKAFKA_FETCH_WAIT_MAX_MS",
            hold.as_millis().to_string(),
        )
        .spawn();
    // Long before the broker answers a fetch it holds.
    ackd.assert_exit(0, hold / 2);
    assert_eq!(
        processed(&ackd.lines()).len(),
        delivered.len(),
        "each message once"
    );
    let committed = committed(&group, &topic, 1);
    assert_eq!(committed[&0], log_ends(&delivered).get(&0).copied());
}

/// The daemon closes the consumer itself (the final revoke, LeaveGroup) rather than
/// through rust-rdkafka's drop: the close completes and says so, without an error. (How
/// long it takes is the benchmark's: `at=closed duration_ms=`.)
#[test]
fn the_close_completes_without_an_error() {
    let (topic, group) = fresh_topic("end-close", 2);
    produce_keyed(&topic, 20, 0);
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_STOP_AT_END", "true")
        .env("ACKD_PROCESSOR", "noop")
        .spawn();
    ackd.assert_exit(0, WAIT);
    let lines = ackd.lines();
    let closed = lines
        .iter()
        .find(|l| at(l, "closed"))
        .unwrap_or_else(|| panic!("no at=closed line:\n{}", lines.join("\n")));
    assert!(field(closed, "duration_ms").is_some(), "{closed}");
    assert!(field(closed, "error").is_none(), "{closed}");
}

/// A graceful stop leaves the group: the other member gets the partitions at once, not
/// after the session timeout (60 s here) in which the group would wait for a member
/// that vanished without a word.
#[test]
fn a_graceful_stop_leaves_the_group_so_the_partitions_move_at_once() {
    const SESSION: Duration = Duration::from_secs(60);
    let (topic, group) = fresh_topic("end-leave", 4);
    produce_keyed(&topic, 40, 0);
    let member = || {
        AckdBuilder::new(&topic, &group)
            .env(
                "ACKD_RDKAFKA_SESSION_TIMEOUT_MS",
                SESSION.as_millis().to_string(),
            )
            .env("ACKD_RDKAFKA_HEARTBEAT_INTERVAL_MS", "500")
            .spawn()
    };
    let holding = |lines: &[String]| {
        let mut held = BTreeSet::new();
        for l in lines {
            let p = field(l, "partition");
            if at(l, "assigned") {
                held.extend(p);
            } else if at(l, "revoked") {
                held.remove(&p.unwrap_or_default());
            }
        }
        held.len()
    };
    let a = member();
    a.wait_for_line(|l| at(l, "assigned"), WAIT);
    let b = member();
    wait_until(WAIT, || holding(&b.lines()) > 0 && holding(&a.lines()) < 4);
    let stopped = Instant::now();
    a.stop(0, WAIT);
    wait_until(SESSION / 3, || holding(&b.lines()) == 4);
    eprintln!(
        "b held all 4 partitions {:.1} s after a's stop",
        stopped.elapsed().as_secs_f64()
    );
    b.stop(0, WAIT);
}

/// A fresh group's partitions (nothing committed) start where the start policy says,
/// which ackd writes into the assignment itself (left to librdkafka, "nothing
/// committed" is an error it resets from only after a fixed 100 ms backoff):
/// `earliest` processes the whole log, `latest` none of what was there.
#[test]
fn a_partition_with_nothing_committed_starts_where_the_start_policy_says() {
    let (topic, group) = fresh_topic("end-fresh", 2);
    produce_keyed(&topic, 20, 0);
    let earliest = AckdBuilder::new(&topic, &group)
        .env("ACKD_STOP_AT_END", "true")
        .env("ACKD_PROCESSOR", "noop")
        .spawn();
    earliest.assert_exit(0, WAIT);
    let lines = earliest.lines();
    assert!(
        lines
            .iter()
            .filter(|l| at(l, "assigned"))
            .all(|l| field(l, "from").as_deref() == Some("earliest")),
        "{}",
        lines.join("\n")
    );
    assert_eq!(processed(&lines).len(), 20);
    let group = format!("{group}-latest");
    let latest = AckdBuilder::new(&topic, &group)
        .env("ACKD_STOP_AT_END", "true")
        .env("ACKD_START_FROM", "latest")
        .spawn();
    latest.assert_exit(0, WAIT);
    let lines = latest.lines();
    assert!(processed(&lines).is_empty(), "{}", lines.join("\n"));
}
