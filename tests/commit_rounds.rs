//! Commits proportional to what changed, on a real broker: with many partitions and
//! traffic on a few, a commit round carries only the partitions whose offset or dispatch
//! limit must change. One partition's request for a higher limit commits no other
//! partition again, and no partition is committed with the offset and limit it has.
//! Past 16 partitions the periodic commits' lines are summed up, once per interval.
//! (What the broker does with each partition's commit: `tests/commits.rs`.)

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::producer::FutureRecord;

use common::{ackd::*, broker::*, lines::*, offsets::*, produce::*, topics::*, wait::*};

const WAIT: Duration = Duration::from_secs(90);
const PARTITIONS: i32 = 48;
/// Partitions 0 and 1 get this many messages; every other one a single message.
const BUSY: i64 = 3_000;

/// Produces `n` messages to `partition`, pipelined.
fn produce_to(topic: &str, partition: i32, n: i64) {
    let producer = producer_for(&broker().bootstrap());
    let futures: Vec<_> = (0..n)
        .map(|i| {
            let value = format!("message {i}");
            let record: FutureRecord<'_, (), _> =
                FutureRecord::to(topic).partition(partition).payload(&value);
            producer.send_result(record).expect("queued")
        })
        .collect();
    for f in futures {
        futures::executor::block_on(f)
            .expect("delivery report")
            .expect("delivered");
    }
}

#[test]
fn a_round_commits_only_the_partitions_whose_offset_or_limit_changes() {
    let (topic, group) = fresh_topic("commit-rounds", PARTITIONS);
    for p in 0..PARTITIONS {
        produce_to(&topic, p, if p < 2 { BUSY } else { 1 });
    }
    // The busy partitions read past the middle of their window (1,000 messages, the
    // least) several times each: each time a commit is asked for at once.
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "noop")
        .env("ACKD_COMMIT_INTERVAL_MS", "200")
        .env("ACKD_REDELIVERY_WINDOW_MAX", "1000")
        // Each partition's periodic commit is a debug line past 16 partitions.
        .env("ACKD_LOG_LEVEL", "debug")
        .spawn();
    let ends: BTreeMap<i32, Option<i64>> = (0..PARTITIONS)
        .map(|p| (p, Some(if p < 2 { BUSY } else { 1 })))
        .collect();
    wait_until(WAIT, || committed(&group, &topic, PARTITIONS) == ends);
    // The next commit interval's line sums up what was committed.
    ackd.wait_for_line(|l| at(l, "commits"), WAIT);
    let lines = ackd.stop(0, WAIT);
    let all = lines.join("\n");

    // Each partition's periodic commits, (offset, limit), in order.
    let mut commits: BTreeMap<i32, Vec<(i64, i64)>> = BTreeMap::new();
    for l in lines
        .iter()
        .filter(|l| at(l, "committed") && field(l, "reason").as_deref() == Some("periodic"))
    {
        let int = |k: &str| -> i64 {
            field(l, k)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {k}= in {l}"))
        };
        commits
            .entry(int("partition") as i32)
            .or_default()
            .push((int("offset"), int("limit")));
    }
    for (p, c) in &commits {
        assert!(
            c.windows(2).all(|w| w[0] != w[1]),
            "partition {p} committed again with its offset and limit unchanged: {c:?}\n{all}"
        );
    }
    // A quiet partition: its first limit (before its message), then its offset 1, at
    // most; never again for another partition's window.
    let quiet: Vec<usize> = (2..PARTITIONS)
        .map(|p| commits.get(&p).map_or(0, Vec::len))
        .collect();
    assert!(
        quiet.iter().all(|n| *n <= 2),
        "periodic commits of each quiet partition: {quiet:?}"
    );
    // At info, one line per commit interval sums them up.
    let periodic = lines
        .iter()
        .filter(|l| at(l, "committed") && field(l, "reason").as_deref() == Some("periodic"));
    assert!(
        periodic
            .clone()
            .all(|l| field(l, "level").as_deref() == Some("debug")),
        "{all}"
    );
    let summed: u64 = all_at(&lines, "commits")
        .iter()
        .map(|l| field(l, "partitions").unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(
        summed > 0 && summed <= periodic.count() as u64,
        "at=commits lines sum up {summed} partition-commits:\n{all}"
    );
    let busy: Vec<usize> = (0..2)
        .map(|p| commits.get(&p).map_or(0, Vec::len))
        .collect();
    eprintln!(
        "{PARTITIONS} partitions, {BUSY} messages in 2 of them: {} periodic partition-commits, \
         the busy partitions' {busy:?}, the quiet ones' at most {}",
        commits.values().map(Vec::len).sum::<usize>(),
        quiet.iter().max().unwrap_or(&0)
    );
}
