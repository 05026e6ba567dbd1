//! Messages with known timestamps (CreateTime, set by the producer), and the lag in
//! seconds ackd reports for them, checked against the truth.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::producer::FutureRecord;

use super::{broker::*, lines::*, produce::*};

/// This host's wall clock in ms since the epoch: the time base of message timestamps.
pub fn epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

/// The wall clock (ms since the epoch) at `instant`, a moment of the past.
pub fn epoch_ms_at(instant: Instant) -> i64 {
    epoch_ms() - instant.elapsed().as_millis() as i64
}

/// Produces one message per timestamp of `stamps` to `partition` of a fresh `topic`,
/// in order: offsets 0, 1, ...
pub fn produce_at(topic: &str, partition: i32, stamps: &[i64]) {
    let producer = producer_on(broker());
    for (i, ts) in stamps.iter().enumerate() {
        let key = format!("k{i}");
        let record = FutureRecord::to(topic)
            .partition(partition)
            .key(key.as_bytes())
            .payload("v")
            .timestamp(*ts);
        let d = futures::executor::block_on(producer.send(record, Duration::from_secs(10)))
            .map_err(|(e, _)| e)
            .unwrap_or_else(|e| panic!("produce to {topic}: {e}"));
        assert_eq!((d.partition, d.offset), (partition, i as i64));
    }
}

/// How far the lag in seconds ackd reports may be from the truth.
pub const WITHIN_SECONDS: f64 = 1.0;

/// Checks every `at=lag` line (and the summary's `lag.seconds.max`) of a one-partition
/// topic whose messages (offsets 0..) have timestamps `stamps`, all in the log before
/// ackd started: a line saying `L` messages behind names the message at
/// `stamps.len() - L` as the next to process, whose age when the line arrived is the
/// truth (the line was written a little before). Returns how many lines with a lag and
/// a lag in seconds were checked.
pub fn assert_lag_seconds(lines: &[(Instant, String)], stamps: &[i64]) -> usize {
    let mut checked = 0;
    for (arrived, line) in lines {
        let (lag, seconds) = if at(line, "lag") {
            (
                field(line, "sample#ackd.lag"),
                field(line, "sample#ackd.lag.seconds"),
            )
        } else if at(line, "summary") {
            let lag = field(line, "sample#ackd.lag.total");
            (lag, field(line, "sample#ackd.lag.seconds.max"))
        } else {
            continue;
        };
        let (Some(lag), Some(seconds)) = (lag, seconds) else {
            continue;
        };
        let lag: usize = lag.parse().unwrap();
        let seconds: f64 = seconds.parse().unwrap();
        if lag == 0 {
            assert_eq!(seconds, 0.0, "caught up: {line}");
            continue;
        }
        let next = stamps.len() - lag;
        let truth = (epoch_ms_at(*arrived) - stamps[next]) as f64 / 1e3;
        assert!(
            (seconds - truth).abs() <= WITHIN_SECONDS,
            "{line}: the message at offset {next} was {truth} s old"
        );
        checked += 1;
    }
    checked
}
