//! Offsets a partition's previous owner acknowledged above its committed offset (named
//! in the commit's metadata): acknowledged again on resume, not processed again.

/// The ranges to skip, consumed as the partition's offsets come in ascending order.
#[derive(Debug, Default)]
pub(super) struct Skip {
    /// Inclusive ranges, ascending, not yet passed.
    ranges: std::collections::VecDeque<(i64, i64)>,
    /// Offsets skipped since the last `at=resume_skipped` line.
    skipped: u64,
    /// Offsets skipped in this assignment.
    total: u64,
}

impl Skip {
    pub(super) fn new(ranges: Vec<(i64, i64)>) -> Self {
        let mut ranges: Vec<(i64, i64)> = ranges.into_iter().filter(|(a, b)| a <= b).collect();
        ranges.sort_unstable();
        Skip {
            ranges: ranges.into(),
            skipped: 0,
            total: 0,
        }
    }

    /// Offsets skipped in this assignment.
    pub(super) fn total_skipped(&self) -> u64 {
        self.total
    }

    /// Nothing (left) to skip.
    pub(super) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The ranges not passed yet, ascending (the first one may have been passed in part).
    pub(super) fn remaining(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.ranges.iter().copied()
    }

    /// Forgets the ranges, unskipped: the partition resumed behind its committed offset
    /// (out of range, reset by the start policy), so they may name other messages now.
    pub(super) fn discard(&mut self, topic: &str, partition: i32) {
        let dropped = Vec::from(std::mem::take(&mut self.ranges));
        if dropped.is_empty() {
            return;
        }
        tracing::warn!(
            at = "resume_skip_dropped",
            topic,
            partition,
            offsets = crate::consumer::handover::count_offsets(&dropped),
            "the committed offset was out of range: the offsets its metadata named as acknowledged are processed, not skipped"
        );
    }

    /// Whether `offset` (ascending from call to call) is to be skipped. Logs once, when
    /// the last range is passed, how many offsets were.
    pub(super) fn take(&mut self, offset: i64, topic: &str, partition: i32) -> bool {
        while self.ranges.front().is_some_and(|&(_, end)| end < offset) {
            self.ranges.pop_front();
        }
        let hit = self
            .ranges
            .front()
            .is_some_and(|&(start, _)| start <= offset);
        if hit {
            self.skipped += 1;
            self.total += 1;
            if self.ranges.front().is_some_and(|&(_, end)| end == offset) {
                self.ranges.pop_front();
            }
        }
        if self.ranges.is_empty() && self.skipped > 0 {
            tracing::info!(
                at = "resume_skipped",
                topic,
                partition,
                skipped = self.skipped,
                "offsets the previous owner acknowledged above its commit (commit metadata) were not processed again"
            );
            self.skipped = 0;
        }
        hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_exactly_the_ranges_as_offsets_pass() {
        let mut s = Skip::new(vec![(7, 7), (3, 5)]);
        let skipped: Vec<i64> = (0..10).filter(|&o| s.take(o, "t", 0)).collect();
        assert_eq!(skipped, vec![3, 4, 5, 7]);
        assert!(s.is_empty());
    }

    #[test]
    fn discarded_ranges_skip_nothing() {
        let mut s = Skip::new(vec![(3, 5)]);
        s.discard("t", 0);
        assert!(s.is_empty());
        assert!(!(0..10).any(|o| s.take(o, "t", 0)));
    }

    #[test]
    fn offsets_missing_from_the_log_pass_their_range() {
        // Compacted away: 4 and 5 never come.
        let mut s = Skip::new(vec![(4, 5), (9, 9)]);
        assert!(!s.take(3, "t", 0));
        assert!(!s.take(6, "t", 0));
        assert!(s.take(9, "t", 0));
        assert!(s.is_empty());
    }
}
