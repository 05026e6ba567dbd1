//! A partition's offsets between its queue and the commit: what was handed to the
//! processor, what was acknowledged, what may be committed, and the acknowledged ranges
//! above it published for the commit's metadata.

use std::sync::atomic::Ordering;

use rdkafka::error::KafkaError;

use super::config::WorkerConfig;
use super::gaps::GapLines;
use super::handler::Acks;
use super::shared::WorkerShared;
use crate::config::failure::OnFailure;
use crate::consumer::handover::Skip;
use crate::consumer::tracker::OffsetTracker;
use crate::fetched_message::FetchedMessage;
use crate::output::metrics;
use crate::processors::processor::{Kafka, Message};

/// The most ranges a worker publishes for the commit metadata: each takes at least 2
/// of its [`crate::consumer::handover::RANGES_MAX_BYTES`] (a digit and a comma), so more never fit.
const PUBLISHED_RANGES_MAX: usize = crate::consumer::handover::RANGES_MAX_BYTES / 2 + 1;

/// The union of `a` and `b` (inclusive ranges, ascending, disjoint each), ascending,
/// overlapping and adjacent ones merged, into `out` (cleared first): the lowest `max`.
fn union_into(
    out: &mut Vec<(i64, i64)>,
    a: &[(i64, i64)],
    b: impl Iterator<Item = (i64, i64)>,
    max: usize,
) {
    out.clear();
    let mut b = b.peekable();
    let mut a = a.iter().copied().peekable();
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x <= y => a.next(),
            (Some(_), Some(_)) | (None, Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, None) => break,
        };
        let Some((start, end)) = next else { break };
        let full = out.len() >= max;
        match out.last_mut() {
            Some(last) if start <= last.1.saturating_add(1) => last.1 = last.1.max(end),
            _ if full => break,
            _ => out.push((start, end)),
        }
    }
}

/// A partition's offsets between its queue and the commit: what was handed to the
/// processor, what was acknowledged, what may be committed.
pub(super) struct Progress<'a> {
    pub(super) tracker: OffsetTracker,
    pub(super) shared: &'a WorkerShared,
    pub(super) topic: &'a str,
    pub(super) partition: i32,
    pub(super) source: &'a str,
    pub(super) log_messages: bool,
    /// The committed offset the assignment resumed from, if any.
    pub(super) resume_from: Option<i64>,
    pub(super) on_failure: OnFailure,
    /// A fetch error since the last message: offsets missing after it may be messages
    /// librdkafka could not read, not offsets that hold none.
    pub(super) fetch_error: Option<KafkaError>,
    pub(super) gaps: GapLines,
    /// Offsets the previous owner acknowledged above its commit: not processed again.
    pub(super) skip: Skip,
}

impl<'a> Progress<'a> {
    /// The partition's offsets as its assignment starts, from the committed offset
    /// `resume_from`; `acked`: the ranges its previous owner acknowledged above it.
    pub(super) fn new<P>(
        shared: &'a WorkerShared,
        (topic, partition): (&'a str, i32),
        source: &'a str,
        config: &WorkerConfig<P>,
        resume_from: Option<i64>,
        acked: Vec<(i64, i64)>,
    ) -> Self {
        Progress {
            tracker: OffsetTracker::new(),
            shared,
            topic,
            partition,
            source,
            log_messages: config.log_messages,
            resume_from,
            on_failure: config.on_failure,
            fetch_error: None,
            gaps: GapLines::default(),
            skip: Skip::new(acked),
        }
    }
}

impl Progress<'_> {
    /// The offset the next message should have: one past the last handed out, else the
    /// committed offset the assignment resumed from.
    pub(super) fn expected(&self) -> Option<i64> {
        self.tracker
            .last_dispatched()
            .map(|o| o + 1)
            .or(self.resume_from)
    }

    /// `offset` goes to the processor. `Err(at)` (logged): it may not, and the
    /// partition must not be committed past `at`.
    #[inline]
    pub(super) fn dispatch(&mut self, offset: i64) -> Result<(), i64> {
        let after_error = self.fetch_error.take();
        if let Some(from) = self.expected().filter(|&e| offset > e) {
            match after_error {
                Some(error) => self.unread(from, offset, &error)?,
                // The first message's distance from the committed offset is logged
                // by `resumed` (at=offset_reset).
                None if self.tracker.last_dispatched().is_none() => {
                    self.shared.metrics.offsets_skipped((offset - from) as u64)
                }
                None => self.gaps.gap(
                    &self.shared.metrics,
                    (self.topic, self.partition),
                    from,
                    offset,
                ),
            }
        }
        self.tracker.dispatch(offset).map_err(|e| {
            tracing::error!(at = "tracker_error", topic = self.topic, partition = self.partition, offset, error = %e);
            offset
        })
    }

    /// Whether `message` (just dispatched) is one the partition's previous owner
    /// acknowledged above its commit: if so it is acknowledged again, not processed.
    #[inline]
    pub(super) fn skip_acknowledged(&mut self, message: &FetchedMessage<'_>, topic: &str) -> bool {
        if self.skip.is_empty() || !self.skip.take(message.offset(), topic, self.partition) {
            return false;
        }
        let kafka = Kafka::new(message);
        self.ack(&Message::from_kafka(&kafka, topic), false);
        true
    }

    /// Publishes the offsets acknowledged above the committable one (for the commit's
    /// metadata), using `scratch` to compute them: this worker's acks, and the ranges
    /// the previous owner acknowledged that it has not passed yet. At most what the
    /// metadata can hold ([`PUBLISHED_RANGES_MAX`]): the work per call stays bounded
    /// however much is pending.
    pub(super) fn publish_acked_above(&mut self, scratch: &mut Vec<(i64, i64)>) {
        self.tracker
            .acked_ranges_into(scratch, PUBLISHED_RANGES_MAX);
        if !self.skip.is_empty() {
            let own = std::mem::take(scratch);
            union_into(scratch, &own, self.skip.remaining(), PUBLISHED_RANGES_MAX);
        }
        let mut published = self
            .shared
            .acked_above
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if *published != *scratch {
            published.clone_from(scratch);
        }
    }

    /// `view` is acknowledged: by the processor (`processed`: its per-message line), or
    /// by the failure policy (which wrote its own line).
    #[inline]
    pub(super) fn ack(&mut self, view: &Message<'_>, processed: bool) {
        let offset = view.offset();
        // The line first: a commit line that names this offset always follows it.
        if self.log_messages && processed {
            let (source, topic, key) = (self.source, self.topic, view.key());
            let redelivered = view.redelivered();
            metrics::message_processed(source, topic, self.partition, offset, key, redelivered);
        }
        // This task is its only writer: a load and a store, not a locked read-modify-write.
        let highest = &self.shared.highest_acked;
        if offset > highest.load(Ordering::Relaxed) {
            highest.store(offset, Ordering::Release);
        }
        match self.tracker.ack(offset) {
            Ok(Some(next)) => self.shared.committable.store(next, Ordering::Release),
            Ok(None) => {}
            Err(e) => {
                tracing::error!(at = "tracker_error", topic = self.topic, partition = self.partition, offset, error = %e)
            }
        }
    }
}

impl Acks for Progress<'_> {
    fn ack(&mut self, _index: usize, view: &Message<'_>, processed: bool) {
        Progress::ack(self, view, processed);
    }
}

#[cfg(test)]
pub(super) mod testing {
    //! Helpers of the tests of a partition's progress.
    use super::*;

    pub(in crate::consumer::worker) fn progress<'a>(
        shared: &'a WorkerShared,
        on_failure: OnFailure,
    ) -> Progress<'a> {
        Progress {
            tracker: OffsetTracker::new(),
            shared,
            topic: "t",
            partition: 0,
            source: "t",
            log_messages: false,
            resume_from: Some(0),
            on_failure,
            fetch_error: None,
            gaps: GapLines::default(),
            skip: Skip::default(),
        }
    }

    pub(in crate::consumer::worker) fn counted(shared: &WorkerShared) -> (u64, u64) {
        let mut i = metrics::Interval::default();
        shared.metrics.take_into(&mut i);
        (i.offsets_skipped, i.skipped)
    }
}

#[cfg(test)]
mod tests {
    use super::testing::progress;
    use super::*;

    /// Issue 19, item 16: the previous owner's ranges stay published until this owner
    /// passes them, merged with its own acks.
    #[test]
    fn published_ranges_keep_the_previous_owners_until_passed() {
        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Halt);
        p.skip = Skip::new(vec![(20, 29), (40, 49)]);
        let mut scratch = Vec::new();
        p.publish_acked_above(&mut scratch);
        assert_eq!(shared.acked_above(), vec![(20, 29), (40, 49)]);
        // 10 stuck; 11..=19 acknowledged; 20 and 21 skipped (acknowledged again).
        for o in 10..=21 {
            p.tracker.dispatch(o).unwrap();
        }
        for o in 11..=21 {
            p.tracker.ack(o).unwrap();
        }
        assert!(p.skip.take(20, "t", 0) && p.skip.take(21, "t", 0));
        p.publish_acked_above(&mut scratch);
        assert_eq!(shared.acked_above(), vec![(11, 29), (40, 49)]);
    }

    /// Issue 19, item 15: however many ranges are pending, what is published (and then
    /// copied by each commit) is what the metadata can hold.
    #[test]
    fn published_ranges_are_bounded_by_what_the_metadata_holds() {
        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Halt);
        for o in 0..10_000 {
            p.tracker.dispatch(o).unwrap();
        }
        for o in (1..10_000).step_by(2) {
            p.tracker.ack(o).unwrap();
        }
        p.skip = Skip::new(vec![(20_000, 20_010)]);
        let mut scratch = Vec::new();
        p.publish_acked_above(&mut scratch);
        let published = shared.acked_above();
        assert_eq!(published.len(), PUBLISHED_RANGES_MAX);
        assert_eq!(published[..2], [(1, 1), (3, 3)]);
    }

    #[test]
    fn union_merges_overlapping_and_adjacent_ranges() {
        let mut out = Vec::new();
        let own = [(1, 3), (10, 12), (30, 30)];
        union_into(&mut out, &own, [(4, 5), (11, 20), (40, 41)].into_iter(), 10);
        assert_eq!(out, vec![(1, 5), (10, 20), (30, 30), (40, 41)]);
        union_into(&mut out, &own, [(0, 0)].into_iter(), 2);
        assert_eq!(out, vec![(0, 3), (10, 12)]);
        union_into(&mut out, &[], std::iter::empty(), 2);
        assert!(out.is_empty());
    }
}
