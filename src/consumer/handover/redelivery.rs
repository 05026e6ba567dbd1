//! What the previous owner left behind, as the next owner uses it (read at assignment
//! from the commit's metadata: src/consumer/group/assign.rs): where the partition
//! resumes, the offsets it acknowledged above its commit (skipped: acknowledged again,
//! not processed again), and the offsets it may have handed to a processor (each message
//! up to the window's end goes to the processor flagged `redelivered`, and the line
//! `at=redelivered` says, once the window is passed or the partition released before,
//! how many this owner handed on again). docs/guarantees.md, "Commit metadata" and
//! "Redelivery after a crash", describes both to operators.

/// Where a partition resumes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resume {
    /// The group's committed offset at assignment, if any.
    pub resume_from: Option<i64>,
    /// Offsets above it that its previous owner acknowledged (read from the commit's
    /// metadata), as inclusive ranges, ascending: not processed again.
    pub acked: Vec<(i64, i64)>,
    /// The offsets a previous owner may have handed to a processor: flagged.
    pub window: RedeliveryWindow,
    /// The last of them that existed when the partition was assigned, if less than the
    /// window's end (a crashed owner's window reaches its dispatch limit, past the log):
    /// what this owner's release still names as possibly handed over before.
    pub existed_through: Option<i64>,
}

/// The first message of the assignment, at `offset`: where the partition resumed, and
/// whether that is where its committed offset (`resume_from`) said. True: it resumed
/// behind it, so the previous owner's acknowledged ranges (dropped from `skip`) no
/// longer name the same messages, and no commit may name them either.
pub(crate) fn resumed(
    topic: &str,
    partition: i32,
    resume_from: Option<i64>,
    offset: i64,
    skip: &mut Skip,
) -> bool {
    tracing::info!(at = "resumed", topic, partition, offset);
    match resume_from {
        // Behind the committed offset: librdkafka found it out of range and applied
        // auto.offset.reset (ACKD_START_FROM).
        Some(committed) if offset < committed => {
            tracing::warn!(
                at = "offset_reset",
                topic,
                partition,
                from = committed,
                to = offset,
                "the committed offset was out of range; the start policy applied: messages from here are processed again"
            );
            // The log is not the one the commit's metadata described (truncated): the
            // messages at the offsets it named may be new ones.
            skip.discard(topic, partition);
            true
        }
        // Ahead of it: out of range and reset to the log end, or offsets that no longer
        // exist (retention, compaction, transaction markers).
        Some(committed) if offset > committed => {
            tracing::warn!(
                at = "offset_reset",
                topic,
                partition,
                from = committed,
                to = offset,
                "the first message is past the committed offset: the offsets between were deleted, compacted, transaction markers, or reset by the start policy"
            );
            false
        }
        _ => false,
    }
}

/// Offsets a partition's previous owner acknowledged above its committed offset (named
/// in the commit's metadata), consumed as the partition's offsets come in ascending order.
#[derive(Debug, Default)]
pub(crate) struct Skip {
    /// Inclusive ranges, ascending, not yet passed.
    ranges: std::collections::VecDeque<(i64, i64)>,
    /// Offsets skipped since the last `at=resume_skipped` line.
    skipped: u64,
    /// Offsets skipped in this assignment.
    total: u64,
}

impl Skip {
    pub(crate) fn new(ranges: Vec<(i64, i64)>) -> Self {
        let mut ranges: Vec<(i64, i64)> = ranges.into_iter().filter(|(a, b)| a <= b).collect();
        ranges.sort_unstable();
        Skip {
            ranges: ranges.into(),
            skipped: 0,
            total: 0,
        }
    }

    /// Offsets skipped in this assignment.
    pub(crate) fn total_skipped(&self) -> u64 {
        self.total
    }

    /// Nothing (left) to skip.
    pub(crate) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The ranges not passed yet, ascending (the first one may have been passed in part).
    pub(crate) fn remaining(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.ranges.iter().copied()
    }

    /// Forgets the ranges, unskipped: the partition resumed behind its committed offset
    /// (out of range, reset by the start policy), so they may name other messages now.
    pub(crate) fn discard(&mut self, topic: &str, partition: i32) {
        let dropped = Vec::from(std::mem::take(&mut self.ranges));
        if dropped.is_empty() {
            return;
        }
        tracing::warn!(
            at = "resume_skip_dropped",
            topic,
            partition,
            offsets = super::count_offsets(&dropped),
            "the committed offset was out of range: the offsets its metadata named as acknowledged are processed, not skipped"
        );
    }

    /// Whether `offset` (ascending from call to call) is to be skipped. Logs once, when
    /// the last range is passed, how many offsets were.
    pub(crate) fn take(&mut self, offset: i64, topic: &str, partition: i32) -> bool {
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

/// The window a new owner flags, as the assignment found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedeliveryWindow {
    /// Messages at offsets up to this one are flagged (-1: none; `i64::MAX`: every
    /// one, when not even a bound is known).
    pub through: i64,
    /// How many of them the previous owner may have processed, as `at=assigned` stated
    /// it (`None`: unknown).
    pub at_most: Option<i64>,
    /// Flagged because no committed offset is known for the partition (a new group,
    /// offsets expired or deleted, a commit that could not be read): no previous owner
    /// is known.
    pub no_commit: bool,
}

impl RedeliveryWindow {
    /// Nothing to flag: the previous owner released the partition having processed
    /// everything below the committed offset, or the start is at the log's end.
    pub const NONE: RedeliveryWindow = RedeliveryWindow {
        through: -1,
        at_most: Some(0),
        no_commit: false,
    };

    /// Whether the message at `offset` may have been handed to a processor before.
    pub fn covers(&self, offset: i64) -> bool {
        offset <= self.through
    }
}

impl Default for RedeliveryWindow {
    fn default() -> Self {
        RedeliveryWindow::NONE
    }
}

/// What `at=redelivered` says of a window a previous owner left.
const PREVIOUS_OWNER: &str = "messages the previous owner may have processed, handed to the processor again flagged redelivered";
/// ... and of one flagged for want of a commit, where no previous owner is known.
const NO_COMMIT: &str = "no committed offset known for this partition (a new group, offsets expired or deleted, or a commit that could not be read): any message in the log may have been processed before, so each was handed to the processor flagged redelivered";

/// A worker's count of the messages it read inside its window.
#[derive(Debug)]
pub(crate) struct Flagging {
    pub(crate) window: RedeliveryWindow,
    /// Messages read inside the window (those then skipped as acknowledged included).
    read: u64,
    /// The highest offset read (-1: none): the window's last one read means it is
    /// complete, even when no message past it exists yet.
    last: i64,
    reported: bool,
}

impl Flagging {
    pub(crate) fn new(window: RedeliveryWindow) -> Self {
        let nothing = window.at_most == Some(0) && window.through < 0;
        Flagging {
            window,
            read: 0,
            last: -1,
            reported: nothing,
        }
    }

    /// A message read at `offset`: counted inside the window; the first one past it
    /// reports the window (`skipped`: the window's messages acknowledged by the
    /// previous owner, not handed on).
    pub(crate) fn read(&mut self, offset: i64, skipped: u64, topic: &str, partition: i32) {
        self.last = self.last.max(offset);
        if self.window.covers(offset) {
            self.read += 1;
        } else if !self.reported {
            self.report(true, skipped, topic, partition);
        }
    }

    /// The worker ends: a window not reported yet is, complete if its last offset was
    /// read (the log may end there: nothing past it came to report it earlier).
    pub(crate) fn finish(&mut self, skipped: u64, topic: &str, partition: i32) {
        if !self.reported {
            let complete = self.last >= self.window.through;
            self.report(complete, skipped, topic, partition);
        }
    }

    fn report(&mut self, complete: bool, skipped: u64, topic: &str, partition: i32) {
        self.reported = true;
        let flagged = self.read.saturating_sub(skipped);
        let at_most = self.window.at_most;
        let why = if self.window.no_commit {
            NO_COMMIT
        } else {
            PREVIOUS_OWNER
        };
        tracing::info!(
            at = "redelivered",
            topic,
            partition,
            flagged,
            redelivery_at_most = at_most.map_or_else(|| "unknown".to_string(), |n| n.to_string()),
            complete,
            "{why}"
        );
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

    #[test]
    fn the_window_covers_up_to_its_end() {
        let w = RedeliveryWindow {
            through: 41,
            at_most: Some(12),
            no_commit: false,
        };
        assert!(w.covers(30) && w.covers(41) && !w.covers(42));
        assert!(!RedeliveryWindow::NONE.covers(0));
        let mut f = Flagging::new(w);
        for o in 30..=45 {
            f.read(o, 2, "t", 0);
        }
        assert!(f.reported);
        assert_eq!(f.read, 12);
        assert!(
            Flagging::new(RedeliveryWindow::NONE).reported,
            "nothing to report"
        );
    }

    #[test]
    fn a_window_whose_last_offset_was_read_is_complete_at_the_end() {
        let w = RedeliveryWindow {
            through: 9,
            at_most: Some(10),
            no_commit: true,
        };
        let mut f = Flagging::new(w);
        for o in 0..=9 {
            f.read(o, 0, "t", 0);
        }
        assert!(!f.reported, "nothing past the window came");
        assert_eq!(f.last, 9);
        f.finish(0, "t", 0);
        assert!(f.reported);
        let mut f = Flagging::new(w);
        f.read(0, 0, "t", 0);
        assert!(
            f.last < f.window.through,
            "released inside its window: incomplete"
        );
    }
}
