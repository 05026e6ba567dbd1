//! The offset tracker: which offset of one partition may be committed.
//!
//! Pure data, no I/O and no clock, so it can be tested exhaustively. Offsets are handed out
//! in the order the broker delivered them (ascending, but not necessarily consecutive:
//! compaction and transaction markers leave gaps) and may be acknowledged in any order.
//! The committable offset is Kafka's "next offset to read": one past the highest offset
//! below which every handed-out offset has been acknowledged. This is the only place in
//! ackd that does the `+ 1`.

use std::collections::{BTreeMap, VecDeque};

/// Why the tracker refused an operation. Each is a bug in the caller, reported rather
/// than panicking so the daemon can log it and keep its committed offsets safe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrackerError {
    /// Offsets must be handed out in ascending order.
    NotAscending { offset: i64, last: i64 },
    /// An ack for an offset that was never handed out, or was already acknowledged.
    UnknownAck { offset: i64 },
}

impl std::fmt::Display for TrackerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrackerError::NotAscending { offset, last } => {
                write!(f, "offset {offset} handed out after {last}")
            }
            TrackerError::UnknownAck { offset } => {
                write!(f, "ack for offset {offset} which is not in flight")
            }
        }
    }
}

impl std::error::Error for TrackerError {}

/// Tracks the offsets of one partition between "handed to the processor" and "acked".
///
/// ```
/// use ackd::consumer::tracker::OffsetTracker;
///
/// let mut t = OffsetTracker::new();
/// t.dispatch(41).unwrap();
/// t.dispatch(42).unwrap();
/// assert_eq!(t.ack(42).unwrap(), None); // 41 is still in flight
/// assert_eq!(t.ack(41).unwrap(), Some(43)); // commit 43: the next offset to read
/// ```
#[derive(Debug, Default, Clone)]
pub struct OffsetTracker {
    /// Offsets handed out and not yet retired, ascending, with their ack state.
    pending: VecDeque<(i64, bool)>,
    /// The last offset ever handed out, to enforce ascending order.
    last_dispatched: Option<i64>,
    /// Next offset to read: one past the highest contiguously acked offset.
    committable: Option<i64>,
    /// The runs of acknowledged entries of `pending` (first offset → last offset), kept
    /// as acks come, so that listing them costs what they are, not what is pending.
    runs: BTreeMap<i64, i64>,
}

impl OffsetTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `offset` was handed to the processor.
    #[inline]
    pub fn dispatch(&mut self, offset: i64) -> Result<(), TrackerError> {
        if let Some(last) = self.last_dispatched {
            if offset <= last {
                return Err(TrackerError::NotAscending { offset, last });
            }
        }
        self.last_dispatched = Some(offset);
        self.pending.push_back((offset, false));
        Ok(())
    }

    /// Records that the processor acknowledged `offset`; returns the committable offset.
    #[inline]
    pub fn ack(&mut self, offset: i64) -> Result<Option<i64>, TrackerError> {
        // One offset in flight, acknowledged (partition ordering, every message): it
        // retires alone, and `runs` is empty (it holds only acknowledged entries).
        if self.pending.len() == 1 && self.pending.front() == Some(&(offset, false)) {
            self.pending.clear();
            self.committable = Some(offset + 1);
            return Ok(self.committable);
        }
        // The common case (in-order processing) acks the front: O(1).
        let index = match self.pending.front() {
            Some((front, false)) if *front == offset => 0,
            _ => match self.pending.binary_search_by_key(&offset, |(o, _)| *o) {
                Ok(i) if !self.pending[i].1 => i,
                _ => return Err(TrackerError::UnknownAck { offset }),
            },
        };
        self.pending[index].1 = true;
        if index > 0 || self.pending.get(1).is_some_and(|e| e.1) {
            self.join_runs(index);
        }
        if let Some(&(front, true)) = self.pending.front() {
            // The acknowledged prefix about to retire is the first run.
            self.runs.remove(&front);
        }
        while let Some(&(front, true)) = self.pending.front() {
            self.pending.pop_front();
            self.committable = Some(front + 1);
        }
        Ok(self.committable)
    }

    /// Records the entry at `index`, just acknowledged, in [`Self::runs`]: it joins the
    /// runs of its acknowledged neighbours.
    fn join_runs(&mut self, index: usize) {
        let offset = self.pending[index].0;
        let acked = |i: Option<usize>| {
            i.and_then(|i| self.pending.get(i))
                .filter(|e| e.1)
                .map(|e| e.0)
        };
        let (before, after) = (acked(index.checked_sub(1)), acked(index.checked_add(1)));
        let start = before
            .and_then(|b| self.runs.range(..=b).next_back().map(|(s, _)| *s))
            .unwrap_or(offset);
        let end = after.and_then(|a| self.runs.remove(&a)).unwrap_or(offset);
        self.runs.insert(start, end);
    }

    /// The last offset handed out, if any.
    pub fn last_dispatched(&self) -> Option<i64> {
        self.last_dispatched
    }

    /// The next offset to read, if anything was acknowledged contiguously.
    pub fn committable(&self) -> Option<i64> {
        self.committable
    }

    /// How many offsets are handed out and not yet retired (acked or not).
    pub fn in_flight(&self) -> usize {
        self.pending.iter().filter(|(_, acked)| !acked).count()
    }

    /// The offsets acknowledged above the committable one, as inclusive ranges,
    /// ascending, into `out` (cleared first), the lowest `max` ranges at most: what the
    /// commit metadata can hold, so the work does not grow with what is pending. A range
    /// spans offsets never handed out (gaps hold no message) but never an
    /// unacknowledged one.
    pub fn acked_ranges_into(&self, out: &mut Vec<(i64, i64)>, max: usize) {
        out.clear();
        out.extend(self.runs.iter().take(max).map(|(&a, &b)| (a, b)));
    }

    /// How many offsets are handed out and not yet retired: unacknowledged, or
    /// acknowledged above an unacknowledged one (what bounds the tracker's memory).
    pub fn outstanding(&self) -> usize {
        self.pending.len()
    }

    /// The lowest offset handed out and not yet acknowledged.
    pub fn oldest_unacked(&self) -> Option<i64> {
        self.pending
            .iter()
            .find(|(_, acked)| !acked)
            .map(|(o, _)| *o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nothing_committable_before_the_first_ack() {
        let mut t = OffsetTracker::new();
        t.dispatch(10).unwrap();
        assert_eq!(t.committable(), None);
        assert_eq!(t.in_flight(), 1);
    }

    #[test]
    fn in_order_acks_commit_the_next_offset() {
        let mut t = OffsetTracker::new();
        for o in 0..3 {
            t.dispatch(o).unwrap();
            assert_eq!(t.ack(o).unwrap(), Some(o + 1));
        }
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn a_gap_holds_back_later_acks() {
        let mut t = OffsetTracker::new();
        for o in 5..8 {
            t.dispatch(o).unwrap();
        }
        assert_eq!(t.ack(7).unwrap(), None);
        assert_eq!(t.ack(6).unwrap(), None);
        assert_eq!(t.oldest_unacked(), Some(5));
        assert_eq!(t.ack(5).unwrap(), Some(8));
    }

    #[test]
    fn offsets_with_holes_commit_past_the_last_acked() {
        // Compacted topics skip offsets: contiguity is over what was handed out.
        let mut t = OffsetTracker::new();
        t.dispatch(3).unwrap();
        t.dispatch(9).unwrap();
        t.ack(3).unwrap();
        assert_eq!(t.ack(9).unwrap(), Some(10));
    }

    #[test]
    fn misuse_is_reported_not_panicked() {
        let mut t = OffsetTracker::new();
        t.dispatch(4).unwrap();
        assert_eq!(
            t.dispatch(4),
            Err(TrackerError::NotAscending { offset: 4, last: 4 })
        );
        assert_eq!(t.ack(5), Err(TrackerError::UnknownAck { offset: 5 }));
        t.dispatch(6).unwrap();
        t.ack(6).unwrap();
        assert_eq!(t.ack(6), Err(TrackerError::UnknownAck { offset: 6 }));
    }

    /// The runs of acknowledged entries, found by walking every pending one.
    fn walked(t: &OffsetTracker) -> Vec<(i64, i64)> {
        let mut out = Vec::new();
        let mut run: Option<(i64, i64)> = None;
        for &(offset, acked) in &t.pending {
            if acked {
                run = Some((run.map_or(offset, |r| r.0), offset));
            } else {
                out.extend(run.take());
            }
        }
        out.extend(run);
        out
    }

    /// Ascending offsets with random gaps, and a random order to ack them in.
    fn offsets_and_ack_order() -> impl Strategy<Value = (Vec<i64>, Vec<usize>)> {
        (0i64..1_000, prop::collection::vec(1i64..4, 1..60)).prop_flat_map(|(start, gaps)| {
            let offsets: Vec<i64> = gaps
                .iter()
                .scan(start, |o, g| {
                    *o += g;
                    Some(*o)
                })
                .collect();
            let order = Just((0..offsets.len()).collect::<Vec<_>>()).prop_shuffle();
            (Just(offsets), order)
        })
    }

    proptest! {
        /// For any interleaving of acks, the committable offset never passes an unacked
        /// offset, never goes backwards, and reaches last + 1 once everything is acked.
        #[test]
        fn committable_never_passes_an_unacked_offset((offsets, order) in offsets_and_ack_order()) {
            let mut t = OffsetTracker::new();
            for &o in &offsets {
                t.dispatch(o).unwrap();
            }
            let mut acked = vec![false; offsets.len()];
            let mut previous = None;
            for &i in &order {
                let committable = t.ack(offsets[i]).unwrap();
                acked[i] = true;
                if let Some(c) = committable {
                    for (j, &o) in offsets.iter().enumerate() {
                        if o < c {
                            prop_assert!(acked[j], "offset {} committable past unacked {}", c, o);
                        }
                    }
                }
                prop_assert!(committable >= previous, "went backwards");
                // The ranges above it hold exactly the acked offsets past the prefix.
                let mut ranges = Vec::new();
                t.acked_ranges_into(&mut ranges, usize::MAX);
                for (j, &o) in offsets.iter().enumerate() {
                    let in_ranges = ranges.iter().any(|&(a, b)| a <= o && o <= b);
                    let above = committable.is_none_or(|c| o >= c);
                    prop_assert_eq!(in_ranges, acked[j] && above, "offset {} in {:?}", o, ranges);
                }
                prop_assert!(ranges.windows(2).all(|w| w[0].1 < w[1].0), "ascending, disjoint");
                prop_assert_eq!(&ranges, &walked(&t), "the runs kept are the runs walked");
                let mut capped = Vec::new();
                t.acked_ranges_into(&mut capped, 2);
                prop_assert_eq!(&capped[..], &ranges[..ranges.len().min(2)]);
                previous = committable;
                // The committable offset is exactly one past the longest acked prefix.
                let prefix = acked.iter().take_while(|a| **a).count();
                let expected = if prefix == 0 { None } else { Some(offsets[prefix - 1] + 1) };
                prop_assert_eq!(committable, expected);
            }
            prop_assert_eq!(t.committable(), Some(offsets[offsets.len() - 1] + 1));
            prop_assert_eq!(t.in_flight(), 0);
        }

        /// Dispatching and acking interleaved (as a worker with in-flight messages does).
        #[test]
        fn interleaved_dispatch_and_ack(ops in prop::collection::vec(any::<bool>(), 1..200)) {
            let mut t = OffsetTracker::new();
            let mut next = 0i64;
            let mut outstanding: VecDeque<i64> = VecDeque::new();
            for dispatch in ops {
                if dispatch || outstanding.is_empty() {
                    t.dispatch(next).unwrap();
                    outstanding.push_back(next);
                    next += 1;
                } else {
                    // Ack the newest outstanding one: the least favourable order.
                    let o = outstanding.pop_back().unwrap();
                    t.ack(o).unwrap();
                }
                let expected = match outstanding.front() {
                    Some(&0) => None,
                    Some(&oldest) => Some(oldest),
                    None if next == 0 => None,
                    None => Some(next),
                };
                // Before any ack nothing is committable even if offsets were retired.
                if let (Some(c), Some(e)) = (t.committable(), expected) {
                    prop_assert_eq!(c, e);
                }
                if let Some(oldest) = outstanding.front() {
                    prop_assert!(t.committable().is_none_or(|c| c <= *oldest));
                }
            }
        }
    }
}
