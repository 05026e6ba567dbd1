//! SIGTERM while a revoke drains a stuck partition: the stop's deadline holds from the
//! signal, and the partitions that were not revoked get their final commit.
//!
//! Member `a` reads two topics: `keep` (3 partitions) and `move` (1 partition, whose
//! processor blocks on a message). Member `b` joins reading `move` only, so the
//! cooperative-sticky assignor (ackd's default) revokes exactly `move/0` from `a` and
//! leaves it `keep`: which partitions a rebalance moves is otherwise up to the assignor,
//! and the test needs the stuck one to be the revoked one. `a` gets SIGTERM right after
//! its revoke began; its periodic commit never runs (10 min), so everything it
//! acknowledged on `keep` is committed by the stop or not at all.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::{ackd::*, lines::*, offsets::*, produce::*, topics::*};

const WAIT: Duration = Duration::from_secs(90);
const SHUTDOWN_MS: u64 = 10_000;

/// (topic, partition, offset) of every processed line.
fn processed_in(lines: &[String]) -> Vec<(String, i32, i64)> {
    lines
        .iter()
        .filter(|l| is_processed(l))
        .map(|l| {
            let t = field(l, "topic").expect("topic");
            let p = field(l, "partition").and_then(|v| v.parse().ok());
            let o = field(l, "offset").and_then(|v| v.parse().ok());
            (t, p.expect("partition"), o.expect("offset"))
        })
        .collect()
}

#[test]
fn sigterm_during_a_slow_revoke_keeps_the_deadline_and_commits_the_rest() {
    let keep = unique_name("keep");
    let moved = unique_name("move");
    let group = unique_name("g-revoke-sigterm");
    create_topic(&keep, 3);
    create_topic(&moved, 1);
    let dir = std::env::temp_dir().join(unique_name("revoke-sigterm"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let release = dir.join("release");

    let keep_delivered = produce_keyed(&keep, 60, 0);
    let block = format!("block:{}", release.display());
    let mut move_messages: Vec<(Option<Vec<u8>>, Vec<u8>)> = (0..5)
        .map(|i| (None, format!("before {i}").into_bytes()))
        .collect();
    move_messages.push((None, block.into_bytes()));
    move_messages.extend((0..5).map(|i| (None, format!("after {i}").into_bytes())));
    let move_delivered = produce(&moved, &move_messages);

    let member = |topics: &str| {
        AckdBuilder::new(topics, &group)
            .env("ACKD_PROCESSOR", "faulty")
            .env("ACKD_COMMIT_INTERVAL_MS", "600000")
            .env("ACKD_SHUTDOWN_TIMEOUT_MS", SHUTDOWN_MS.to_string())
            .spawn()
    };
    let a = member(&format!("{keep},{moved}"));
    // a has everything of `keep` and `move` up to the blocking message acknowledged.
    a.wait_for_line(|l| at(l, "test_blocked"), WAIT);
    a.wait_for_count(is_processed, keep_delivered.len() + 5, WAIT);

    let b = member(&moved);
    a.wait_for_line(|l| at(l, "revoke_begun"), WAIT);
    a.sigterm();
    let signalled = Instant::now();
    let code = a.wait_exit(WAIT);
    let took = signalled.elapsed();
    let lines = a.lines();
    let all = lines.join("\n");
    eprintln!("a: exit {code} {took:?} after SIGTERM");

    // The deadline holds from the signal (with slack for a loaded machine's scheduling).
    assert!(
        took < Duration::from_millis(SHUTDOWN_MS + 2_000),
        "exit {took:?} after SIGTERM: {all}"
    );
    assert!(
        !lines.iter().any(|l| at(l, "shutdown_timeout")),
        "the final commit missed the deadline: {all}"
    );
    // Exactly `move/0` was revoked, and its stuck message is reported as not finished.
    let begun = lines.iter().find(|l| at(l, "revoke_begun")).unwrap();
    assert_eq!(field(begun, "partitions").as_deref(), Some("1"), "{begun}");
    assert!(
        lines.iter().any(|l| at(l, "drain_timeout")
            && field(l, "topic").as_deref() == Some(&moved)
            && field(l, "in_flight_offset").as_deref() == Some("5")),
        "{all}"
    );
    // Something in flight at the signal did not finish: the stop is incomplete.
    assert_eq!(code, 1, "{all}");

    // Every acknowledged offset of `keep` is committed by the stop: `final_commit` lines,
    // and the broker's committed offsets, equal to one past what a processed.
    let processed = processed_in(&lines);
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for (t, p, o) in &processed {
        if *t == keep {
            let e = next.entry(*p).or_insert(o + 1);
            *e = (*e).max(o + 1);
        }
    }
    assert_eq!(next, log_ends(&keep_delivered), "a processed all of keep");
    for (p, end) in &next {
        assert!(
            lines.iter().any(|l| at(l, "final_commit")
                && field(l, "topic").as_deref() == Some(&keep)
                && field(l, "partition") == Some(p.to_string())
                && field(l, "offset") == Some(end.to_string())),
            "no final_commit of {keep}/{p} at {end}: {all}"
        );
    }
    let keep_committed = committed(&group, &keep, 3);
    for (p, end) in &next {
        assert_eq!(keep_committed[p], Some(*end), "{keep}/{p} committed");
    }
    // `move/0`: what was acknowledged before the stuck message is committed by the revoke.
    assert_eq!(
        committed_offset(&group, &moved, 0),
        Some(5),
        "{moved}/0 committed"
    );

    // b gets `move/0` from offset 5: nothing lost, nothing processed twice.
    std::fs::write(&release, b"").expect("release the blocked message");
    b.wait_for_count(is_processed, 6, WAIT);
    b.stop(0, WAIT);
    let b_processed = processed_in(&b.lines());
    let mut seen = BTreeSet::new();
    let mut duplicated = 0;
    for m in processed.iter().chain(&b_processed) {
        if !seen.insert(m.clone()) {
            duplicated += 1;
        }
    }
    let expected: BTreeSet<(String, i32, i64)> = keep_delivered
        .iter()
        .map(|d| (keep.clone(), d.partition, d.offset))
        .chain(
            move_delivered
                .iter()
                .map(|d| (moved.clone(), d.partition, d.offset)),
        )
        .collect();
    let lost = expected.difference(&seen).count();
    eprintln!(
        "messages {}, lost {lost}, duplicated {duplicated}",
        expected.len()
    );
    assert_eq!(lost, 0);
    assert_eq!(duplicated, 0);
    let _ = std::fs::remove_dir_all(&dir);
}
