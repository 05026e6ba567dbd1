//! The offsets of a partition that its previous owner may have handed to a processor
//! (read at assignment from the commit's metadata: src/consumer/group/assign.rs): each
//! message up to the window's end goes to the processor flagged `redelivered`, and the
//! line `at=redelivered` says, once the window is passed (or the partition released
//! before), how many this owner handed on again.

/// The window a new owner flags, as the assignment found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedeliveryWindow {
    /// Messages at offsets up to this one are flagged (-1: none; `i64::MAX`: every
    /// one, when not even a bound is known).
    pub through: i64,
    /// How many of them the previous owner may have processed, as `at=assigned` stated
    /// it (`None`: unknown).
    pub at_most: Option<i64>,
}

impl RedeliveryWindow {
    /// Nothing to flag: the previous owner released the partition having processed
    /// everything below the committed offset, or the start is at the log's end.
    pub const NONE: RedeliveryWindow = RedeliveryWindow {
        through: -1,
        at_most: Some(0),
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

/// A worker's count of the messages it read inside its window.
#[derive(Debug)]
pub(super) struct Flagging {
    pub(super) window: RedeliveryWindow,
    /// Messages read inside the window (those then skipped as acknowledged included).
    read: u64,
    reported: bool,
}

impl Flagging {
    pub(super) fn new(window: RedeliveryWindow) -> Self {
        let nothing = window.at_most == Some(0) && window.through < 0;
        Flagging {
            window,
            read: 0,
            reported: nothing,
        }
    }

    /// A message read at `offset`: counted inside the window; the first one past it
    /// reports the window (`skipped`: the window's messages acknowledged by the
    /// previous owner, not handed on).
    pub(super) fn read(&mut self, offset: i64, skipped: u64, topic: &str, partition: i32) {
        if self.window.covers(offset) {
            self.read += 1;
        } else if !self.reported {
            self.report(true, skipped, topic, partition);
        }
    }

    /// The worker ends: a window not passed yet is reported as such.
    pub(super) fn finish(&mut self, skipped: u64, topic: &str, partition: i32) {
        if !self.reported {
            self.report(false, skipped, topic, partition);
        }
    }

    fn report(&mut self, complete: bool, skipped: u64, topic: &str, partition: i32) {
        self.reported = true;
        let flagged = self.read.saturating_sub(skipped);
        let at_most = self.window.at_most;
        tracing::info!(
            at = "redelivered",
            topic,
            partition,
            flagged,
            redelivery_at_most = at_most.map_or_else(|| "unknown".to_string(), |n| n.to_string()),
            complete,
            "messages the previous owner may have processed, handed to the processor again flagged redelivered"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_covers_up_to_its_end() {
        let w = RedeliveryWindow {
            through: 41,
            at_most: Some(12),
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
}
