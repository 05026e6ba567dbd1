//! The crash bound: after SIGKILL the next owner redelivers at most what the killed
//! process had acknowledged since its last successful commit, plus the message it had in
//! flight (one per partition: a partition's messages are processed one at a time).
//!
//! Per partition the bound is computed from the killed process's own lines: C = the
//! offset of its last `at=committed` line (or of its `at=assigned` line if it committed
//! nothing), L = its last processed offset. Redelivered messages (processed by the killed
//! run and again by a later one) must number at most L + 1 - C; the message in flight at
//! the kill has no processed line, so it is not counted (docs/guarantees.md's bound adds it).
//! Nothing may be lost.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{accounting::*, ackd::*, lines::*, offsets::*, produce::*, topics::*, wait::*};

const WAIT: Duration = Duration::from_secs(90);
const PARTITIONS: i32 = 4;

fn member(topic: &str, group: &str) -> AckdProcess {
    AckdBuilder::new(topic, group)
        .env("ACKD_COMMIT_INTERVAL_MS", "500")
        .spawn()
}

/// Per partition: the last committed offset C and the last processed offset L of a run.
fn commit_and_last(lines: &[String]) -> BTreeMap<i32, (i64, Option<i64>)> {
    let int = |l: &str, k: &str| field(l, k).and_then(|v| v.parse::<i64>().ok());
    let mut out: BTreeMap<i32, (i64, Option<i64>)> = BTreeMap::new();
    for l in lines {
        let Some(p) = int(l, "partition").map(|p| p as i32) else {
            continue;
        };
        if at(l, "assigned") {
            // A fresh topic: the start policy (earliest) begins at 0.
            out.insert(p, (int(l, "offset").unwrap_or(0), None));
        } else if at(l, "committed") {
            let o = int(l, "offset").unwrap();
            let e = out.get_mut(&p).expect("commit before assignment");
            e.0 = e.0.max(o);
        } else if is_processed(l) {
            let o = int(l, "offset").unwrap();
            let e = out.get_mut(&p).expect("message before assignment");
            e.1 = Some(e.1.map_or(o, |x| x.max(o)));
        }
    }
    out
}

/// Whether a run committed past where some partition resumed.
fn committed_progress(lines: &[String]) -> bool {
    let mut resumed: BTreeMap<i32, i64> = BTreeMap::new();
    lines.iter().any(|l| {
        let int = |k: &str| field(l, k).and_then(|v| v.parse::<i64>().ok());
        let Some(p) = int("partition").map(|p| p as i32) else {
            return false;
        };
        if at(l, "assigned") {
            resumed.insert(p, int("offset").unwrap_or(0));
        }
        at(l, "committed") && int("offset") > resumed.get(&p).copied()
    })
}

fn crash_restarts(kills: usize) {
    let (topic, group) = fresh_topic("crash", PARTITIONS);
    // ~200 messages/s, ~50 per partition and second.
    let producer = SteadyProducer::start(&topic, 10, Duration::from_millis(50));

    let mut runs: Vec<AckdProcess> = Vec::new();
    for _ in 0..kills {
        let run = member(&topic, &group);
        // Mid-stream: it has committed progress at least once (not only its first commit,
        // which names where it resumed) and keeps processing.
        wait_until(WAIT, || committed_progress(&run.lines()));
        let so_far = processed(&run.lines()).len();
        run.wait_for_count(is_processed, so_far + 60, WAIT);
        run.sigkill();
        run.assert_exit(128 + libc::SIGKILL, WAIT);
        runs.push(run);
    }
    let last = member(&topic, &group);
    last.wait_for_count(is_processed, 50, WAIT);
    let delivered = producer.finish();
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    let killed_processed: Vec<(i32, i64)> =
        runs.iter().flat_map(|r| processed(&r.lines())).collect();
    wait_until(WAIT, || {
        let mut seen: BTreeSet<_> = killed_processed.iter().copied().collect();
        seen.extend(processed(&last.lines()));
        seen.is_superset(&expected)
    });
    last.stop(0, WAIT);
    runs.push(last);

    let per_run: Vec<Vec<(i32, i64)>> = runs.iter().map(|r| processed(&r.lines())).collect();
    let all: Vec<(i32, i64)> = per_run.iter().flatten().copied().collect();
    let lines: Vec<String> = runs.iter().flat_map(|r| r.lines()).collect();
    let t = tally(&delivered, &all, &lines);
    assert!(t.lost.is_empty(), "lost {}: {:?}", t.lost.len(), t.lost);

    let mut total_redelivered = 0;
    for k in 0..kills {
        let later: BTreeSet<(i32, i64)> = per_run[k + 1..].iter().flatten().copied().collect();
        let next_assigned: BTreeMap<i32, i64> = runs[k + 1]
            .lines()
            .iter()
            .filter(|l| at(l, "assigned"))
            .filter_map(|l| {
                let p = field(l, "partition")?.parse().ok()?;
                Some((p, field(l, "offset")?.parse().ok()?))
            })
            .collect();
        let mut report = Vec::new();
        let (mut redelivered, mut bound) = (0, 0);
        for (p, (c, last)) in commit_and_last(&runs[k].lines()) {
            let b = last.map_or(0, |l| l + 1 - c);
            let r = per_run[k]
                .iter()
                .filter(|(q, o)| *q == p && later.contains(&(p, *o)))
                .count() as i64;
            assert!(
                r <= b,
                "run {k} partition {p}: {r} redelivered, bound {b} (committed {c}, last processed {last:?})"
            );
            // The next run resumed at or past the last commit this one logged.
            if let Some(a) = next_assigned.get(&p) {
                assert!(
                    *a >= c,
                    "run {k} partition {p}: next run resumed at {a} < committed {c}"
                );
            }
            report.push(format!("p{p} {r}/{b}"));
            redelivered += r;
            bound += b;
        }
        total_redelivered += redelivered;
        eprintln!(
            "crash run {k} (SIGKILL, commit interval 500 ms): redelivered {redelivered}, bound {bound} (+ up to {PARTITIONS} in flight) [{}]",
            report.join(", ")
        );
    }
    assert_eq!(
        t.duplicated.len() as i64,
        total_redelivered,
        "every duplicate is a redelivery after a kill"
    );
    let committed = committed(&group, &topic, PARTITIONS);
    for (p, end) in log_ends(&delivered) {
        assert_eq!(committed[&p], Some(end), "partition {p}");
    }
    eprintln!(
        "crash: restarts after SIGKILL {kills}, messages {}, processed {}, lost 0, duplicated {}",
        delivered.len(),
        all.len(),
        t.duplicated.len()
    );
}

#[test]
fn after_a_sigkill_redelivery_is_at_most_what_was_acked_since_the_last_commit() {
    crash_restarts(1);
}

#[test]
fn two_sigkills_in_a_row_each_stay_within_the_bound() {
    crash_restarts(2);
}
