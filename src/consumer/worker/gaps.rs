//! Offsets with no message that reached ackd: counted, and logged at a bounded rate.

use std::time::{Duration, Instant};

use crate::output::metrics::PartitionMetrics;

/// How often a partition writes an `at=offset_gap` line at most (see [`GapLines::gap`]).
const GAP_LINE_EVERY: Duration = Duration::from_secs(10);

/// The rate limit of a partition's `at=offset_gap` lines.
#[derive(Default)]
pub(super) struct GapLines {
    last_line: Option<Instant>,
    /// Gaps, and offsets in them, since the last line that had no line of their own.
    unlogged: u64,
    unlogged_skipped: u64,
}

impl GapLines {
    /// Offsets `from..to` hold no message that reached ackd, and no fetch error came
    /// before them: compaction, transaction markers and aborted transactions
    /// (`isolation.level=read_committed`) leave such gaps as a matter of course;
    /// retention passing the position, an offset reset (`ACKD_START_FROM`) or a
    /// truncated log leave them too. Every gap is counted (`count#offsets.skipped`);
    /// one of a single offset (a transaction's marker) is a debug line; a longer one is
    /// an info line, at most one per partition every [`GAP_LINE_EVERY`], which counts
    /// the gaps since the previous line that had none.
    /// `metrics` and `(topic, partition)`: the partition's.
    pub(super) fn gap(
        &mut self,
        metrics: &PartitionMetrics,
        (topic, partition): (&str, i32),
        from: i64,
        to: i64,
    ) {
        let skipped = (to - from) as u64;
        metrics.offsets_skipped(skipped);
        let now = Instant::now();
        let quiet = skipped == 1
            || self
                .last_line
                .is_some_and(|t| now.duration_since(t) < GAP_LINE_EVERY);
        if quiet {
            self.unlogged += 1;
            self.unlogged_skipped += skipped;
            tracing::debug!(at = "offset_gap", topic, partition, from, to, skipped);
            return;
        }
        tracing::info!(
            at = "offset_gap",
            topic,
            partition,
            from,
            to,
            skipped,
            earlier_gaps = self.unlogged,
            earlier_skipped = self.unlogged_skipped,
            "no message at these offsets reached ackd (compacted, transaction markers, aborted transactions, deleted by retention, or passed by an offset reset): the committed offset passes them; none was a message that failed"
        );
        *self = GapLines {
            last_line: Some(now),
            unlogged: 0,
            unlogged_skipped: 0,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::super::progress::testing::{counted, progress};
    use super::super::shared::WorkerShared;
    use crate::config::failure::OnFailure;

    #[test]
    fn gaps_are_counted_and_single_offsets_are_quiet() {
        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Halt);
        // The first message's distance from the committed offset: counted, no gap line
        // (at=offset_reset says it).
        assert_eq!(p.dispatch(2), Ok(()));
        // Transaction markers: one offset each.
        assert_eq!(p.dispatch(4), Ok(()));
        assert_eq!(p.dispatch(6), Ok(()));
        assert!(p.gaps.last_line.is_none());
        assert_eq!((p.gaps.unlogged, p.gaps.unlogged_skipped), (2, 2));
        // A longer gap is a line, which counts the quiet ones before it.
        assert_eq!(p.dispatch(20), Ok(()));
        assert!(p.gaps.last_line.is_some());
        assert_eq!((p.gaps.unlogged, p.gaps.unlogged_skipped), (0, 0));
        // The next within GAP_LINE_EVERY waits for the next line.
        assert_eq!(p.dispatch(30), Ok(()));
        assert_eq!((p.gaps.unlogged, p.gaps.unlogged_skipped), (1, 9));
        assert_eq!(counted(&shared), (2 + 1 + 1 + 13 + 9, 0));
    }
}
