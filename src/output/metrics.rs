//! The metrics vocabulary and the periodic summary.
//!
//! Every metric ackd writes is named here, once, without the prefix: the formatter
//! (`output/lines.rs`) turns a field `count#x` into `count#<ACKD_METRIC_PREFIX>.x`, which is
//! l2met's vocabulary: `count#` values are summed, `measure#` values (with a unit) are
//! distributions, `sample#` values keep the last one. Counters live next to what they
//! count (each partition worker has its own, so the hot path shares no cache line) and
//! are taken, and reset, once per `ACKD_METRICS_INTERVAL_MS`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::output::TopicPartition;

/// The per-message line (when `ACKD_LOG_MESSAGES` is on): one per acknowledged message,
/// with `redelivered=true` when it went to the processor flagged as a possible repeat.
/// The same count is in the summary as `count#processed`: chart one of the two.
pub fn message_processed(
    source: &str,
    topic: &str,
    partition: i32,
    offset: i64,
    key: Option<&[u8]>,
    redelivered: bool,
) {
    if !tracing::enabled!(tracing::Level::INFO) {
        return;
    }
    let line = |line: &mut String, prefix: &str| {
        processed_line(
            line,
            prefix,
            (source, topic, partition, offset, key),
            redelivered,
        )
    };
    if crate::output::lines::write_direct(line) {
        return;
    }
    // Another subscriber than ackd's: the same fields through it. Two call sites: the
    // common line records no field more than before the flag.
    if redelivered {
        tracing::info!(
            "count#messages.processed" = 1,
            source,
            topic,
            partition,
            offset,
            key,
            redelivered = true
        );
    } else {
        tracing::info!(
            "count#messages.processed" = 1,
            source,
            topic,
            partition,
            offset,
            key
        );
    }
}

/// The per-message line as `Logfmt` renders the event above with metric prefix
/// `prefix` (a test of `output::lines` compares the two).
pub fn processed_line(
    line: &mut String,
    prefix: &str,
    (source, topic, partition, offset, key): (&str, &str, i32, i64, Option<&[u8]>),
    redelivered: bool,
) {
    for piece in ["count#", prefix, ".messages.processed=1 source="] {
        line.push_str(piece);
    }
    crate::logfmt::write_str(line, source);
    line.push_str(" topic=");
    crate::logfmt::write_str(line, topic);
    line.push_str(" partition=");
    line.push_str(itoa::Buffer::new().format(partition));
    line.push_str(" offset=");
    line.push_str(itoa::Buffer::new().format(offset));
    if let Some(key) = key {
        line.push_str(" key=");
        crate::logfmt::write_bytes(line, key);
    }
    if redelivered {
        line.push_str(" redelivered=true");
    }
}

/// Durations are recorded in microseconds, 1 µs to 1 hour, 2 significant digits (within
/// 1%: enough for a mean and a p99 in a log line). Every assigned partition has one, so
/// its size counts: 26 KiB (3 digits took 188 KiB, 37 MiB for 200 partitions).
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 2).expect("static histogram bounds are valid")
}

/// Processor calls that take at least this long are all timed: two clock reads and a
/// histogram update are nothing next to them.
const TIME_EVERY_CALL_FROM: Duration = Duration::from_micros(50);
/// Faster calls are timed one in this many, each timed one recorded with the weight of
/// the calls it stands for: timing every call of a fast processor cost more than
/// everything else ackd does per message. Counts stay exact; durations become a
/// systematic sample, as soon as one timed call takes longer, every call is timed again.
const SAMPLE_FAST_CALLS: u32 = 16;

/// Counters of one partition worker. They only grow: the summary line takes what they
/// grew by since its last look ([`PartitionMetrics::take_into`]), the health endpoint's
/// `/metrics` their totals ([`PartitionMetrics::counts`]): one count, two readers.
#[derive(Debug)]
pub struct PartitionMetrics {
    received: Count,
    processed: Count,
    failed: Count,
    retried: Count,
    skipped: Count,
    dead_lettered: Count,
    /// Offsets passed with no message at them (gaps), or unread after a fetch error.
    offsets_skipped: Count,
    /// The counts as the summary last took them (only the summary touches it).
    taken: Mutex<Counts>,
    durations: Mutex<Histogram<u64>>,
    /// The same timed calls as `durations`, in Prometheus's fixed buckets (lock-free,
    /// never reset).
    pub buckets: DurationBuckets,
    /// Calls to leave untimed before the next timed one, and how many calls that one
    /// will stand for. Written only by the partition's worker.
    untimed: AtomicU32,
    weight: AtomicU32,
}

/// A count only the partition's worker adds to (one task, so never two threads at
/// once), which others read: a load and a store where a locked add, twice a message,
/// was a tenth of ackd's own cost per message.
#[derive(Debug, Default)]
struct Count(AtomicU64);

impl Count {
    #[inline]
    fn add(&self, n: u64) {
        let c = &self.0;
        c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Times one processor call, or (in a run of fast calls) does not.
pub struct Stopwatch(Option<Instant>);

impl Stopwatch {
    #[inline]
    pub fn elapsed(&self) -> Took {
        Took(self.0.map(|started| started.elapsed()))
    }
}

/// How long a processor call took, if it was timed.
pub struct Took(Option<Duration>);

impl Took {
    /// A call that was not timed (or whose time is recorded elsewhere).
    pub const UNTIMED: Took = Took(None);
}

impl From<Duration> for Took {
    fn from(took: Duration) -> Self {
        Took(Some(took))
    }
}

impl Default for PartitionMetrics {
    fn default() -> Self {
        PartitionMetrics {
            received: Count::default(),
            processed: Count::default(),
            failed: Count::default(),
            retried: Count::default(),
            skipped: Count::default(),
            dead_lettered: Count::default(),
            offsets_skipped: Count::default(),
            taken: Mutex::new(Counts::default()),
            durations: Mutex::new(histogram()),
            buckets: DurationBuckets::default(),
            untimed: AtomicU32::new(0),
            weight: AtomicU32::new(1),
        }
    }
}

impl PartitionMetrics {
    pub fn received(&self) {
        self.received.add(1);
    }

    /// Starts timing a processor call (see [`SAMPLE_FAST_CALLS`]).
    #[inline]
    pub fn stopwatch(&self) -> Stopwatch {
        let untimed = self.untimed.load(Ordering::Relaxed);
        if untimed > 0 {
            self.untimed.store(untimed - 1, Ordering::Relaxed);
            return Stopwatch(None);
        }
        Stopwatch(Some(Instant::now()))
    }

    #[inline]
    pub fn processed(&self, took: impl Into<Took>) {
        self.processed_many(1, took);
    }

    /// `n` messages acknowledged by one processor call (a batch, or its part before
    /// the message that failed); the call's duration is recorded once.
    pub fn processed_many(&self, n: u64, took: impl Into<Took>) {
        self.processed.add(n);
        self.record(took.into());
    }

    /// Messages handed to the processor in one batch.
    pub fn received_many(&self, n: u64) {
        self.received.add(n);
    }

    pub fn failed(&self, took: impl Into<Took>) {
        self.failed.add(1);
        self.record(took.into());
    }

    pub fn retried(&self) {
        self.retried.add(1);
    }

    pub fn skipped(&self) {
        self.skipped.add(1);
    }

    pub fn dead_lettered(&self) {
        self.dead_lettered.add(1);
    }

    pub fn offsets_skipped(&self, n: u64) {
        self.offsets_skipped.add(n);
    }

    fn record(&self, took: Took) {
        let Took(Some(took)) = took else { return };
        let micros = (took.as_micros() as u64).clamp(1, 3_600_000_000);
        let weight = self.weight.load(Ordering::Relaxed);
        if let Ok(mut h) = self.durations.lock() {
            h.saturating_record_n(micros, u64::from(weight));
        }
        self.buckets.observe(micros, u64::from(weight));
        let (untimed, weight) = if took < TIME_EVERY_CALL_FROM {
            (SAMPLE_FAST_CALLS - 1, SAMPLE_FAST_CALLS)
        } else {
            (0, 1)
        };
        self.untimed.store(untimed, Ordering::Relaxed);
        self.weight.store(weight, Ordering::Relaxed);
    }

    /// Everything counted since the partition was assigned.
    pub fn counts(&self) -> Counts {
        Counts {
            received: self.received.get(),
            processed: self.processed.get(),
            failed: self.failed.get(),
            retried: self.retried.get(),
            skipped: self.skipped.get(),
            dead_lettered: self.dead_lettered.get(),
            offsets_skipped: self.offsets_skipped.get(),
        }
    }

    /// Adds what was counted since the last take to `into` and starts a new interval.
    pub fn take_into(&self, into: &mut Interval) {
        let now = self.counts();
        let mut taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        let since = now.minus(&taken);
        *taken = now;
        drop(taken);
        into.received += since.received;
        into.processed += since.processed;
        into.failed += since.failed;
        into.retried += since.retried;
        into.skipped += since.skipped;
        into.dead_lettered += since.dead_lettered;
        into.offsets_skipped += since.offsets_skipped;
        if let Ok(mut h) = self.durations.lock() {
            let _ = into.durations.add(&*h);
            h.reset();
        }
    }
}

/// Counters of the committer: per interval for the summary, and totals for `/metrics`.
#[derive(Debug)]
pub struct CommitMetrics {
    state: Mutex<(u64, u64, Histogram<u64>)>,
    pub commits_total: AtomicU64,
    pub failures_total: AtomicU64,
    pub buckets: DurationBuckets,
}

impl Default for CommitMetrics {
    fn default() -> Self {
        CommitMetrics {
            state: Mutex::new((0, 0, histogram())),
            commits_total: AtomicU64::new(0),
            failures_total: AtomicU64::new(0),
            buckets: DurationBuckets::default(),
        }
    }
}

impl CommitMetrics {
    pub fn record(&self, took: Duration, ok: bool) {
        let micros = (took.as_micros() as u64).clamp(1, 3_600_000_000);
        self.buckets.observe(micros, 1);
        let total = if ok {
            &self.commits_total
        } else {
            &self.failures_total
        };
        total.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut s) = self.state.lock() {
            if ok {
                s.0 += 1;
            } else {
                s.1 += 1;
            }
            s.2.saturating_record((took.as_micros() as u64).clamp(1, 3_600_000_000));
        }
    }

    /// Commits recorded and not yet summarized: (accepted, failed).
    #[cfg(test)]
    pub fn counts(&self) -> (u64, u64) {
        self.state.lock().map_or((0, 0), |s| (s.0, s.1))
    }

    fn take_into(&self, into: &mut Interval) {
        if let Ok(mut s) = self.state.lock() {
            into.commits += std::mem::take(&mut s.0);
            into.commit_failures += std::mem::take(&mut s.1);
            let _ = into.commit_durations.add(&s.2);
            s.2.reset();
        }
    }
}

/// A partition's counts at one moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub received: u64,
    pub processed: u64,
    pub failed: u64,
    pub retried: u64,
    pub skipped: u64,
    pub dead_lettered: u64,
    pub offsets_skipped: u64,
}

impl Counts {
    fn minus(&self, earlier: &Counts) -> Counts {
        Counts {
            received: self.received.saturating_sub(earlier.received),
            processed: self.processed.saturating_sub(earlier.processed),
            failed: self.failed.saturating_sub(earlier.failed),
            retried: self.retried.saturating_sub(earlier.retried),
            skipped: self.skipped.saturating_sub(earlier.skipped),
            dead_lettered: self.dead_lettered.saturating_sub(earlier.dead_lettered),
            offsets_skipped: self.offsets_skipped.saturating_sub(earlier.offsets_skipped),
        }
    }

    pub fn add(&mut self, other: &Counts) {
        self.received += other.received;
        self.processed += other.processed;
        self.failed += other.failed;
        self.retried += other.retried;
        self.skipped += other.skipped;
        self.dead_lettered += other.dead_lettered;
        self.offsets_skipped += other.offsets_skipped;
    }
}

/// Upper bounds of the `/metrics` duration buckets, in microseconds (Prometheus's `le`,
/// 1 ms to 10 s; `+Inf` above).
pub const BUCKET_BOUNDS_MICROS: [u64; 12] = [
    1_000, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_000_000,
];

/// Durations in fixed buckets, never reset: what a Prometheus histogram needs. Atomics,
/// so a scrape takes no lock a worker waits for.
#[derive(Debug, Default)]
pub struct DurationBuckets {
    /// Per bucket (not cumulative), the last one `+Inf`.
    counts: [AtomicU64; BUCKET_BOUNDS_MICROS.len() + 1],
    sum_micros: AtomicU64,
}

/// A [`DurationBuckets`] read at one moment.
#[derive(Debug, Default, Clone, Copy)]
pub struct BucketCounts {
    pub counts: [u64; BUCKET_BOUNDS_MICROS.len() + 1],
    pub sum_micros: u64,
}

impl DurationBuckets {
    fn observe(&self, micros: u64, weight: u64) {
        let i = BUCKET_BOUNDS_MICROS
            .iter()
            .position(|b| micros <= *b)
            .unwrap_or(BUCKET_BOUNDS_MICROS.len());
        self.counts[i].fetch_add(weight, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(micros.saturating_mul(weight), Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> BucketCounts {
        let mut out = BucketCounts::default();
        for (o, c) in out.counts.iter_mut().zip(&self.counts) {
            *o = c.load(Ordering::Relaxed);
        }
        out.sum_micros = self.sum_micros.load(Ordering::Relaxed);
        out
    }
}

impl BucketCounts {
    pub fn add(&mut self, other: &BucketCounts) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum_micros += other.sum_micros;
    }
}

/// One interval's totals, summed over partitions.
pub struct Interval {
    pub received: u64,
    pub processed: u64,
    pub failed: u64,
    pub retried: u64,
    pub skipped: u64,
    pub dead_lettered: u64,
    pub offsets_skipped: u64,
    pub durations: Histogram<u64>,
    pub commits: u64,
    pub commit_failures: u64,
    pub commit_durations: Histogram<u64>,
}

impl Default for Interval {
    fn default() -> Self {
        Interval {
            received: 0,
            processed: 0,
            failed: 0,
            retried: 0,
            skipped: 0,
            dead_lettered: 0,
            offsets_skipped: 0,
            durations: histogram(),
            commits: 0,
            commit_failures: 0,
            commit_durations: histogram(),
        }
    }
}

/// Milliseconds with a fraction, for duration fields.
pub fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// `3.214ms` from microseconds: l2met's number-with-unit form.
fn ms(micros: f64) -> String {
    format!("{:.3}ms", micros / 1000.0)
}

fn mean_p99(h: &Histogram<u64>) -> (Option<String>, Option<String>) {
    if h.is_empty() {
        return (None, None);
    }
    (
        Some(ms(h.mean())),
        Some(ms(h.value_at_quantile(0.99) as f64)),
    )
}

/// A processor's adaptive in-flight limit as it moves: stored by the processor, read
/// by the summary and the scrape, and no one waits. 0 while no limit adapts: the line
/// and the page leave it out.
pub struct LimitGauge(AtomicU64);

impl LimitGauge {
    const fn new() -> LimitGauge {
        LimitGauge(AtomicU64::new(0))
    }

    pub fn set(&self, limit: u64) {
        self.0.store(limit, Ordering::Relaxed);
    }

    /// The limit, when one adapts.
    pub fn get(&self) -> Option<u64> {
        Some(self.0.load(Ordering::Relaxed)).filter(|l| *l > 0)
    }
}

/// `ACKD_HTTP_CONCURRENCY_MODE=adaptive`: the summary's `sample#http.limit`,
/// `/metrics`' `<prefix>_http_limit`. Process-wide, as the processor is.
pub static HTTP_LIMIT: LimitGauge = LimitGauge::new();

/// `ACKD_EXEC_CONCURRENCY_MODE=adaptive`: the summary's `sample#exec.limit`,
/// `/metrics`' `<prefix>_exec_limit`.
pub static EXEC_LIMIT: LimitGauge = LimitGauge::new();

/// What the workers hold now.
#[derive(Debug, Clone, Copy, Default)]
pub struct InFlight {
    /// Processor calls under way.
    pub calls: usize,
    /// Messages read and not started (`None`: partition ordering, where none wait).
    pub waiting: Option<usize>,
}

/// The summary of one interval, as one line.
#[allow(clippy::too_many_arguments)]
pub fn emit_summary(
    interval: &mut Interval,
    commits: &CommitMetrics,
    source: &str,
    interval_ms: u64,
    partitions: usize,
    in_flight: InFlight,
    halted: usize,
    (lag_total, lag_seconds_max): (Option<i64>, Option<f64>),
    last: bool,
) {
    commits.take_into(interval);
    let (process_mean, process_p99) = mean_p99(&interval.durations);
    let (commit_mean, commit_p99) = mean_p99(&interval.commit_durations);
    tracing::info!(
        at = "summary",
        "count#received" = interval.received,
        "count#processed" = interval.processed,
        "count#failed" = interval.failed,
        "count#retried" = interval.retried,
        "count#skipped" = interval.skipped,
        "count#dead_lettered" = interval.dead_lettered,
        "count#offsets.skipped" = interval.offsets_skipped,
        "measure#process.duration.mean" = process_mean.as_deref(),
        "measure#process.duration.p99" = process_p99.as_deref(),
        "count#commits" = interval.commits,
        "count#commit_failures" = interval.commit_failures,
        "measure#commit.duration.mean" = commit_mean.as_deref(),
        "measure#commit.duration.p99" = commit_p99.as_deref(),
        "sample#in_flight" = in_flight.calls as u64,
        "sample#http.limit" = HTTP_LIMIT.get(),
        "sample#exec.limit" = EXEC_LIMIT.get(),
        "sample#waiting" = in_flight.waiting.map(|w| w as u64),
        "sample#partitions" = partitions as u64,
        "sample#partitions.halted" = halted as u64,
        "sample#lag.total" = lag_total.map(|l| l.max(0) as u64),
        "sample#lag.seconds.max" = lag_seconds_max,
        source,
        interval_ms,
        last
    );
    *interval = Interval::default();
}

/// One partition's lag: messages in the log after the next one to process, and that
/// message's age in seconds ([`lag_seconds`]; left out while unknown).
pub fn emit_lag(topic: &str, partition: i32, lag: i64, seconds: Option<f64>, source: &str) {
    tracing::info!(
        at = "lag",
        "sample#lag" = lag.max(0) as u64,
        "sample#lag.seconds" = seconds,
        source,
        topic,
        partition
    );
}

/// The lag lines chosen by [`LagLines::select`], each with its lag in seconds from
/// `lags` (every partition whose lag is known, in partition order).
pub fn emit_lags(lines: &[(TopicPartition, i64)], lags: &[(TopicPartition, Lag)], source: &str) {
    for (tp, lag) in lines {
        let i = lags.binary_search_by(|(t, _)| t.cmp(tp));
        let seconds = i.ok().and_then(|i| lags[i].1.seconds);
        emit_lag(&tp.0, tp.1, *lag, seconds, source);
    }
}

/// The most lag lines one summary writes: what a log drain receives stays bounded
/// whatever the partitions (the summary's `lag.total` and the health endpoint's
/// `/metrics` still cover every partition).
pub const LAG_LINES_MAX: usize = 100;

/// The lag lines left out of one summary by [`LAG_LINES_MAX`].
pub fn emit_lag_omitted(partitions: usize, source: &str) {
    tracing::info!(at = "lag_omitted", partitions, source);
}

/// Which partitions get a lag line: those with lag, and once more a partition whose last
/// line said it had some, when it has none any more (that line says 0). A caught-up
/// partition at rest writes none, so at rest the lines do not grow with the partitions.
#[derive(Debug, Default)]
pub struct LagLines {
    /// The partitions whose last lag line said they had lag.
    behind: HashSet<TopicPartition>,
    /// Those written by the last summary: among equal lags, the others go first, so a
    /// cap does not leave out the same partitions every time.
    last: HashSet<TopicPartition>,
}

impl LagLines {
    /// Of `lags` (every owned partition whose lag is known), the lines to write now, in
    /// `lags`' order: the largest lags first when more than [`LAG_LINES_MAX`] are due
    /// (among equal ones, those the last summary left out); and how many due were left
    /// out (they stay due).
    pub fn select(
        &mut self,
        lags: &[(TopicPartition, i64)],
    ) -> (Vec<(TopicPartition, i64)>, usize) {
        // Partitions no longer owned (or whose lag is unknown) start over.
        let known: HashSet<&TopicPartition> = lags.iter().map(|(tp, _)| tp).collect();
        self.behind.retain(|tp| known.contains(tp));
        let mut due: Vec<usize> = (0..lags.len())
            .filter(|&i| lags[i].1 != 0 || self.behind.contains(&lags[i].0))
            .collect();
        let omitted = due.len().saturating_sub(LAG_LINES_MAX);
        if omitted > 0 {
            due.sort_by_key(|&i| (std::cmp::Reverse(lags[i].1), self.last.contains(&lags[i].0)));
            due.truncate(LAG_LINES_MAX);
            due.sort_unstable();
        }
        let lines: Vec<_> = due.into_iter().map(|i| lags[i].clone()).collect();
        self.last = lines.iter().map(|(tp, _)| tp.clone()).collect();
        for (tp, lag) in &lines {
            if *lag != 0 {
                self.behind.insert(tp.clone());
            } else {
                self.behind.remove(tp);
            }
        }
        (lines, omitted)
    }
}

/// Lag from the high watermark (librdkafka's statistics, fed by fetch responses) and
/// the next offset to process; never negative, `None` while either is unknown.
pub fn lag(high_watermark: i64, next_to_process: Option<i64>) -> Option<i64> {
    if high_watermark < 0 {
        return None;
    }
    next_to_process.map(|n| (high_watermark - n).max(0))
}

/// One partition's lag, as a summary computed it: in messages, and in seconds
/// ([`lag_seconds`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lag {
    pub messages: i64,
    pub seconds: Option<f64>,
}

/// The lag in seconds of a partition `lag` messages behind (see [`lag`]): 0 when it is
/// caught up, else how old (by `now_ms`, this host's clock) the oldest message read and
/// not yet processed is, from its timestamp `oldest_ms` (CreateTime or LogAppendTime, as
/// the topic keeps them); between two messages, the one last processed (the next one
/// is not read yet). Never negative: a timestamp ahead of this host's clock gives 0.
/// `None` while it cannot be known (nothing read yet, or a message without a timestamp).
pub fn lag_seconds(lag: i64, oldest_ms: Option<i64>, now_ms: i64) -> Option<f64> {
    if lag <= 0 {
        return Some(0.0);
    }
    oldest_ms.map(|ts| now_ms.saturating_sub(ts).max(0) as f64 / 1000.0)
}

/// The `source=` of process-wide lines: `ACKD_METRIC_SOURCE`, else Heroku's `DYNO`, else
/// the host name.
pub fn process_source(configured: Option<&str>) -> String {
    if let Some(s) = configured.filter(|s| !s.is_empty()) {
        return s.to_string();
    }
    if let Ok(dyno) = std::env::var("DYNO") {
        if !dyno.is_empty() {
            return dyno;
        }
    }
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "ackd".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_never_negative_and_unknown_when_it_cannot_be_known() {
        assert_eq!(lag(100, Some(40)), Some(60));
        assert_eq!(lag(100, Some(100)), Some(0));
        assert_eq!(lag(90, Some(100)), Some(0));
        assert_eq!(lag(-1, Some(3)), None);
        assert_eq!(lag(10, None), None);
    }

    #[test]
    fn lag_in_seconds_is_the_age_of_the_oldest_message_and_never_negative() {
        assert_eq!(lag_seconds(0, Some(1_000), 9_000), Some(0.0), "caught up");
        assert_eq!(lag_seconds(0, None, 9_000), Some(0.0));
        assert_eq!(lag_seconds(3, Some(1_000), 13_345), Some(12.345));
        assert_eq!(
            lag_seconds(3, Some(20_000), 13_345),
            Some(0.0),
            "a timestamp ahead of this host's clock"
        );
        assert_eq!(lag_seconds(3, None, 13_345), None, "unknown");
    }

    #[test]
    fn intervals_take_and_reset() {
        let m = PartitionMetrics::default();
        m.received();
        m.received();
        m.processed(Duration::from_millis(2));
        m.failed(Duration::from_millis(4));
        let mut i = Interval::default();
        m.take_into(&mut i);
        assert_eq!((i.received, i.processed, i.failed), (2, 1, 1));
        assert_eq!(i.durations.len(), 2);
        let (mean, p99) = mean_p99(&i.durations);
        // HdrHistogram keeps 2 significant digits: 2 ms and 4 ms within 1%.
        let value = |s: Option<String>| {
            s.unwrap()
                .strip_suffix("ms")
                .unwrap()
                .parse::<f64>()
                .unwrap()
        };
        assert!((value(mean) - 3.0).abs() < 0.03);
        assert!((value(p99) - 4.0).abs() < 0.04);
        let mut again = Interval::default();
        m.take_into(&mut again);
        assert_eq!(
            (again.received, again.processed, again.durations.len()),
            (0, 0, 0)
        );
    }

    /// Each partition's histogram is a fixed array of counters: its size is what the
    /// memory table of docs/performance.md says.
    #[test]
    fn a_histogram_is_26_kib() {
        let bytes = histogram().distinct_values() * std::mem::size_of::<u64>();
        assert!((20_000..=27_000).contains(&bytes), "{bytes} bytes");
    }

    #[test]
    fn fast_calls_are_timed_one_in_sixteen_with_their_weight() {
        let m = PartitionMetrics::default();
        let mut timed = 0;
        for _ in 0..160 {
            let w = m.stopwatch();
            timed += usize::from(w.0.is_some());
            m.processed(Took(w.0.map(|_| Duration::from_micros(3))));
        }
        // The first call is timed, then one in 16 (calls 17, 33, ..., 145).
        assert_eq!(timed, 10);
        let mut i = Interval::default();
        m.take_into(&mut i);
        assert_eq!(i.processed, 160, "counts stay exact");
        // 1 + 9 × 16: each timed call stands for itself and the untimed ones before it.
        assert_eq!(i.durations.len(), 145);
        // Call 161 is timed; it is slow: from then on every call is timed.
        assert!(m.stopwatch().0.is_some());
        m.processed(Duration::from_millis(1));
        for _ in 0..3 {
            assert!(m.stopwatch().0.is_some());
            m.processed(Duration::from_millis(1));
        }
        let mut i = Interval::default();
        m.take_into(&mut i);
        assert_eq!((i.processed, i.durations.len()), (4, 16 + 3));
    }

    fn tp(partition: i32) -> TopicPartition {
        (std::sync::Arc::from("t"), partition)
    }

    #[test]
    fn lag_lines_while_behind_and_once_caught_up() {
        let mut lines = LagLines::default();
        let lags = |l: &[i64]| -> Vec<_> {
            l.iter()
                .enumerate()
                .map(|(p, &l)| (tp(p as i32), l))
                .collect()
        };
        let partitions = |s: (Vec<(TopicPartition, i64)>, usize)| -> (Vec<i32>, usize) {
            (s.0.iter().map(|(tp, _)| tp.1).collect(), s.1)
        };
        // Only the partition with lag, as long as it has some.
        assert_eq!(partitions(lines.select(&lags(&[0, 5, 0]))), (vec![1], 0));
        assert_eq!(partitions(lines.select(&lags(&[0, 5, 0]))), (vec![1], 0));
        // It caught up: its 0 once, then nothing.
        assert_eq!(partitions(lines.select(&lags(&[0, 0, 0]))), (vec![1], 0));
        assert_eq!(partitions(lines.select(&lags(&[0, 0, 0]))), (vec![], 0));
        // Partition 2 behind, revoked, back caught up: nothing to correct.
        assert_eq!(partitions(lines.select(&lags(&[0, 0, 3]))), (vec![2], 0));
        assert_eq!(partitions(lines.select(&lags(&[0, 0]))), (vec![], 0));
        assert_eq!(partitions(lines.select(&lags(&[0, 0, 0]))), (vec![], 0));
    }

    #[test]
    fn a_cap_takes_turns_among_equal_lags() {
        let mut lines = LagLines::default();
        let n = LAG_LINES_MAX as i32 + 50;
        let behind: Vec<_> = (0..n).map(|p| (tp(p), 7)).collect();
        let mut seen = HashSet::new();
        for _ in 0..2 {
            let (written, omitted) = lines.select(&behind);
            assert_eq!((written.len(), omitted), (LAG_LINES_MAX, 50));
            seen.extend(written.into_iter().map(|(tp, _)| tp.1));
        }
        assert_eq!(
            seen.len(),
            n as usize,
            "every partition within two summaries"
        );
    }

    #[test]
    fn lag_lines_are_capped_largest_first_and_the_rest_stay_due() {
        let mut lines = LagLines::default();
        let n = LAG_LINES_MAX as i32 + 50;
        // Lag on partition p is p + 1: the largest are written, in partition order.
        let behind: Vec<_> = (0..n).map(|p| (tp(p), i64::from(p) + 1)).collect();
        let (written, omitted) = lines.select(&behind);
        assert_eq!((written.len(), omitted), (LAG_LINES_MAX, 50));
        assert_eq!(written.first().map(|(tp, _)| tp.1), Some(50));
        assert!(written.windows(2).all(|w| w[0].0 .1 < w[1].0 .1));
        // All caught up: the 0 of those written, the others had no line to correct.
        let caught_up: Vec<_> = (0..n).map(|p| (tp(p), 0)).collect();
        let (written, omitted) = lines.select(&caught_up);
        assert_eq!((written.len(), omitted), (LAG_LINES_MAX, 0));
        assert!(written.iter().all(|(tp, lag)| tp.1 >= 50 && *lag == 0));
        assert_eq!(lines.select(&caught_up), (vec![], 0), "then at rest: none");
    }

    #[test]
    fn source_prefers_the_setting() {
        assert_eq!(process_source(Some("worker.1")), "worker.1");
        assert!(!process_source(None).is_empty());
    }
}
