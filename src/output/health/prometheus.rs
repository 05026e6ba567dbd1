//! The `/metrics` page: the summary line's vocabulary in Prometheus's text format.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use crate::output::metrics::{BucketCounts, CommitMetrics, Counts, Lag, BUCKET_BOUNDS_MICROS};
use crate::output::TopicPartition;

/// What one scrape reports: totals since start, and the state of the partitions owned.
pub(super) struct Scrape<'a> {
    /// Summed over the partitions owned and those that are gone.
    pub(super) counts: Counts,
    pub(super) durations: BucketCounts,
    pub(super) commits: &'a CommitMetrics,
    pub(super) in_flight: u64,
    pub(super) partitions: u64,
    pub(super) halted: u64,
    /// Of the partitions owned, as of the last summary.
    pub(super) lags: Vec<(TopicPartition, Lag)>,
}

/// The `/metrics` page of `scrape`, every name under `prefix` (a Prometheus name):
/// format 0.0.4.
pub(super) fn page(prefix: &str, scrape: &Scrape<'_>) -> String {
    let p = prefix;
    let mut out = String::with_capacity(4096);
    counters(&mut out, p, scrape);
    histogram(
        &mut out,
        &format!("{p}_process_duration_seconds"),
        "Duration of processor calls (per batch with batches; fast calls sampled, weighted).",
        &scrape.durations,
    );
    histogram(
        &mut out,
        &format!("{p}_commit_duration_seconds"),
        "Duration of commits.",
        &scrape.commits.buckets.snapshot(),
    );
    gauges(&mut out, p, scrape);
    lags(&mut out, p, &scrape.lags);
    out
}

/// The totals since start, `{p}_…_total`.
fn counters(out: &mut String, p: &str, scrape: &Scrape<'_>) {
    let counts = &scrape.counts;
    let counters = [
        (
            "received",
            "Messages handed to the processor.",
            counts.received,
        ),
        (
            "processed",
            "Messages the processor acknowledged.",
            counts.processed,
        ),
        ("failed", "Processor calls that failed.", counts.failed),
        ("retried", "Retries of a failed message.", counts.retried),
        (
            "skipped",
            "Messages skipped after failing (ACKD_ON_FAILURE=skip).",
            counts.skipped,
        ),
        (
            "dead_lettered",
            "Messages sent to the dead-letter topic.",
            counts.dead_lettered,
        ),
        (
            "commits",
            "Commits the broker accepted.",
            scrape.commits.commits_total.load(Ordering::Relaxed),
        ),
        (
            "commit_failures",
            "Commits that failed.",
            scrape.commits.failures_total.load(Ordering::Relaxed),
        ),
    ];
    for (name, help, value) in counters {
        let _ = writeln!(out, "# HELP {p}_{name}_total {help}");
        let _ = writeln!(out, "# TYPE {p}_{name}_total counter");
        let _ = writeln!(out, "{p}_{name}_total {value}");
    }
}

/// What is under way now.
fn gauges(out: &mut String, p: &str, scrape: &Scrape<'_>) {
    let gauges = [
        (
            "in_flight",
            "Processor calls under way (at most one per partition, or ACKD_CONCURRENCY with key or none ordering).",
            scrape.in_flight,
        ),
        (
            "partitions",
            "Partitions assigned to this process.",
            scrape.partitions,
        ),
        (
            "partitions_halted",
            "Partitions stopped on a processor failure (ACKD_ON_FAILURE=halt).",
            scrape.halted,
        ),
    ];
    use crate::output::metrics::{EXEC_LIMIT, HTTP_LIMIT};
    let limits = [
        (
            "http_limit",
            "The http processor's in-flight limit as it adapts (ACKD_HTTP_CONCURRENCY_MODE=adaptive).",
            HTTP_LIMIT.get(),
        ),
        (
            "exec_limit",
            "The exec processor's in-flight limit across its children as it adapts (ACKD_EXEC_CONCURRENCY_MODE=adaptive).",
            EXEC_LIMIT.get(),
        ),
    ];
    let limits = limits
        .into_iter()
        .filter_map(|(name, help, l)| Some((name, help, l?)));
    for (name, help, value) in gauges.into_iter().chain(limits) {
        let _ = writeln!(out, "# HELP {p}_{name} {help}");
        let _ = writeln!(out, "# TYPE {p}_{name} gauge");
        let _ = writeln!(out, "{p}_{name} {value}");
    }
}

/// Each partition's lag, in messages and in seconds, labelled with its topic and number.
fn lags(out: &mut String, p: &str, lags: &[(TopicPartition, Lag)]) {
    let _ = writeln!(
        out,
        "# HELP {p}_lag Messages after the next one to process, per partition, as of the last summary."
    );
    let _ = writeln!(out, "# TYPE {p}_lag gauge");
    for ((topic, partition), lag) in lags {
        let _ = writeln!(
            out,
            "{p}_lag{{topic=\"{}\",partition=\"{partition}\"}} {}",
            label_value(topic),
            lag.messages.max(0)
        );
    }
    let _ = writeln!(
        out,
        "# HELP {p}_lag_seconds Age of the oldest message not yet processed (now minus its timestamp; 0 when caught up), per partition, as of the last summary."
    );
    let _ = writeln!(out, "# TYPE {p}_lag_seconds gauge");
    for ((topic, partition), lag) in lags {
        let Some(seconds) = lag.seconds else { continue };
        let _ = writeln!(
            out,
            "{p}_lag_seconds{{topic=\"{}\",partition=\"{partition}\"}} {seconds}",
            label_value(topic),
        );
    }
}

/// A Prometheus histogram of `b`: cumulative buckets, sum and count.
fn histogram(out: &mut String, name: &str, help: &str, b: &BucketCounts) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    let mut cumulative = 0;
    for (bound, count) in BUCKET_BOUNDS_MICROS.iter().zip(&b.counts) {
        cumulative += count;
        let le = *bound as f64 / 1e6;
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
    }
    cumulative += b.counts[BUCKET_BOUNDS_MICROS.len()];
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
    let _ = writeln!(out, "{name}_sum {}", b.sum_micros as f64 / 1e6);
    let _ = writeln!(out, "{name}_count {cumulative}");
}

/// A label value with Prometheus's escapes (`\`, `"`, newline).
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `ACKD_METRIC_PREFIX` as a metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`, other characters as `_`.
pub(super) fn prometheus_name(prefix: &str) -> String {
    let mut name: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_become_metric_names() {
        assert_eq!(prometheus_name("ackd"), "ackd");
        assert_eq!(prometheus_name("my.app-1"), "my_app_1");
        assert_eq!(prometheus_name("1x"), "_1x");
        assert_eq!(prometheus_name(""), "_");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(label_value("a\nb"), "a\\nb");
    }

    #[test]
    fn histograms_are_cumulative() {
        let mut b = BucketCounts::default();
        b.counts[0] = 2;
        b.counts[3] = 1;
        b.counts[BUCKET_BOUNDS_MICROS.len()] = 1;
        b.sum_micros = 20_000_000;
        let mut out = String::new();
        histogram(&mut out, "x", "h", &b);
        assert!(out.contains("x_bucket{le=\"0.001\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.025\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"10\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("x_sum 20\n"), "{out}");
        assert!(out.contains("x_count 4\n"), "{out}");
    }
}
