//! `ACKD_STOP_AT_END=true`: consume to the end of every assigned partition, commit,
//! leave, exit 0. Backfills and one-off jobs rely on it, and the benchmark times it.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{ackd::*, lines::*, offsets::*, produce::*, topics::*};

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
