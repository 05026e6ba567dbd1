//! `ACKD_MEMORY_MB` against a real broker: with a backlog far larger than the budget
//! spread over many partitions, ackd's peak RSS stays under the budget plus a fixed
//! baseline, and every message is still processed once and committed.

mod common;

use std::time::{Duration, Instant};

use common::{
    accounting::*, ackd::*, broker::*, lines::*, offsets::*, produce::*, topics::*, wait::*,
};
use rdkafka::producer::FutureProducer;
use rdkafka::ClientConfig;

const WAIT: Duration = Duration::from_secs(120);

/// `n` messages of `size` bytes, keyed, values that do not compress.
fn sized_messages(n: usize, size: usize) -> Vec<(Option<Vec<u8>>, Vec<u8>)> {
    let mut rng = fastrand::Rng::with_seed(15);
    (0..n)
        .map(|i| {
            let value: Vec<u8> = (0..size).map(|_| rng.alphanumeric() as u8).collect();
            (Some(format!("k-{i}").into_bytes()), value)
        })
        .collect()
}

/// ackd's memory without prefetch (runtime, 40 partitions' workers and histograms, line
/// buffers): tests/metrics.rs measures 23 MiB with 200 partitions.
const BASELINE_MIB: u64 = 28;
const PARTITIONS: i32 = 40;
const MESSAGES: usize = 6000;
const SIZE: usize = 10 * 1024;
const BUDGET_MIB: u64 = 8;
/// The harness's 1 s session timeout is missed on a machine at a load of 30 (seen once
/// here): the assignment is then lost, uncommitted, and what these tests count is the
/// crash bound's, not the budget's. Members leave explicitly, so rebalances do not wait
/// for it.
const SESSION_TIMEOUT_MS: &str = "10000";

/// 40 partitions, 60 MiB of 10 KiB messages waiting, a processor that takes 10 ms per
/// message: without a budget each partition prefetches its whole backlog (1.5 MiB, under
/// the 16 MiB per partition of the defaults), with `ACKD_MEMORY_MB=8` 205 KiB.
#[test]
fn a_budget_bounds_peak_rss_whatever_the_backlog() {
    let (topic, group) = fresh_topic("memory", PARTITIONS);
    // Record batches of at most 16 KiB, as the Java client writes them by default: a
    // fetch returns at least one whole record batch, so a producer's batch is the least
    // a partition prefetches, whatever the budget (docs/performance.md).
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", broker().bootstrap())
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("batch.size", "16384")
        .set("queue.buffering.max.kbytes", "1048576")
        .create()
        .expect("create producer");
    let delivered = produce_with(&producer, &topic, &sized_messages(MESSAGES, SIZE));
    let ends = log_ends(&delivered);
    let started = Instant::now();
    let budget = std::env::var("ACKD_TEST_MEMORY_MB").unwrap_or(BUDGET_MIB.to_string());
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_MEMORY_MB", &budget)
        .env("ACKD_PROCESSOR", "slow")
        .env("ACKD_TEST_DELAY_MS", "10")
        .env("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", SESSION_TIMEOUT_MS)
        .spawn();
    // ACKD_TEST_MEMORY_MB=0 runs it without a budget: it must then fail on the bound.
    if budget != "0" {
        let line = ackd.wait_for_line(
            |l| at(l, "memory_budget") && field(l, "partitions").is_none(),
            WAIT,
        );
        assert_eq!(
            field(&line, "divided_among").as_deref(),
            Some("40"),
            "{line}"
        );
        assert_eq!(field(&line, "counted").as_deref(), Some("true"), "{line}");
        assert_eq!(
            field(&line, "share_kb").as_deref(),
            Some(&*((BUDGET_MIB << 10) / PARTITIONS as u64).to_string()),
            "{line}"
        );
        ackd.wait_for_line(
            |l| at(l, "memory_budget") && field(l, "partitions").as_deref() == Some("40"),
            WAIT,
        );
    }
    ackd.wait_for_count(is_processed, MESSAGES, WAIT);
    let processing = started.elapsed();
    let peak_kib = peak_rss_kib(ackd.pid());
    ackd.sigterm();
    let code = ackd.wait_exit(WAIT);
    let lines = ackd.lines();
    let t = tally(&delivered, &processed(&lines), &lines);
    eprintln!(
        "ACKD_MEMORY_MB={budget}: {PARTITIONS} partitions, {MESSAGES} messages of {SIZE} bytes; processed in {:.1} s, peak RSS {peak_kib} KiB (bound {} KiB); lost {}, duplicated {}, exit {code}",
        processing.as_secs_f64(),
        (BUDGET_MIB + BASELINE_MIB) << 10,
        t.lost.len(),
        t.duplicated.len()
    );
    assert_eq!(code, 0);
    assert!(t.lost.is_empty(), "lost {:?}", t.lost);
    assert!(t.duplicated.is_empty(), "duplicated {:?}", t.duplicated);
    assert_committed_to_ends(&group, &topic, PARTITIONS, &ends);
    assert!(
        peak_kib < (BUDGET_MIB + BASELINE_MIB) << 10,
        "peak RSS {peak_kib} KiB with ACKD_MEMORY_MB={budget}"
    );
}

/// A budget below 64 KiB per partition of the topics stops ackd before it consumes.
#[test]
fn a_budget_too_small_for_the_partitions_is_a_config_error() {
    let (topic, group) = fresh_topic("memory-small", 200);
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_MEMORY_MB", "8")
        .spawn();
    let line = ackd.assert_config_error("ACKD_MEMORY_MB", WAIT);
    assert!(line.contains("200 partitions"), "{line}");
    assert!(line.contains("13 or more"), "{line}");
    assert!(!ackd.lines().iter().any(|l| at(l, "assigned")));
}

/// The share follows nothing but the topics: a second member takes half the partitions,
/// each member says what it holds now, and the handoff loses and repeats nothing.
#[test]
fn assignment_changes_are_logged_and_the_handoff_is_exact() {
    let (topic, group) = fresh_topic("memory-rebalance", 8);
    let first = produce(&topic, &sized_messages(400, 1024));
    let member = || {
        AckdBuilder::new(&topic, &group)
            .env("ACKD_MEMORY_MB", "4")
            .env("ACKD_COMMIT_INTERVAL_MS", "500")
            .env("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", SESSION_TIMEOUT_MS)
            .spawn()
    };
    let is_held = |n: &'static str| {
        move |l: &str| at(l, "memory_budget") && field(l, "partitions").as_deref() == Some(n)
    };
    let a = member();
    a.wait_for_line(is_held("8"), WAIT);
    a.wait_for_count(is_processed, first.len(), WAIT);
    let b = member();
    // Cooperative-sticky: a gives up 4 (revoke), b gets them (assign).
    a.wait_for_line(is_held("4"), WAIT);
    let line = b.wait_for_line(is_held("4"), WAIT);
    assert_eq!(field(&line, "share_kb").as_deref(), Some("512"), "{line}");
    assert_eq!(
        field(&line, "prefetch_kb").as_deref(),
        Some("2048"),
        "{line}"
    );
    let second = produce(&topic, &sized_messages(400, 1024));
    wait_until(WAIT, || {
        processed(&a.lines()).len() + processed(&b.lines()).len() >= first.len() + second.len()
    });
    a.sigterm();
    b.sigterm();
    a.assert_exit(0, WAIT);
    b.assert_exit(0, WAIT);
    let (a_lines, b_lines) = (a.lines(), b.lines());
    let mut all = processed(&a_lines);
    all.extend(processed(&b_lines));
    let lines: Vec<String> = a_lines.into_iter().chain(b_lines).collect();
    let delivered: Vec<Delivered> = first.into_iter().chain(second).collect();
    let t = tally(&delivered, &all, &lines);
    eprintln!(
        "2 members, 8 partitions, {} messages: lost {}, duplicated {}",
        delivered.len(),
        t.lost.len(),
        t.duplicated.len()
    );
    assert!(t.lost.is_empty(), "lost {:?}", t.lost);
    assert!(t.duplicated.is_empty(), "duplicated {:?}", t.duplicated);
    let ends = log_ends(&delivered);
    let committed = committed(&group, &topic, 8);
    let behind: Vec<_> = ends
        .iter()
        .filter(|(p, end)| committed[p] != Some(**end))
        .collect();
    assert!(
        behind.is_empty(),
        "not committed to the end: {behind:?} (committed {committed:?}); lines:\n{}",
        lines
            .iter()
            .filter(|l| !is_processed(l))
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
