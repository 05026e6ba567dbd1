//! A partition's offsets between its queue and the commit: what was handed to the
//! processor, what was acknowledged, what may be committed, and the acknowledged ranges
//! above it published for the commit's metadata; the offsets with no message that
//! reached ackd (gaps, counted and logged at a bounded rate), and fetch errors on the
//! queue with the offsets they may leave unread; and the offset tracker
//! ([`OffsetTracker`]), pure and property-tested, which computes the committable offset.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use super::handler::Acks;
use super::shared::WorkerShared;
use super::task::WorkerConfig;
use crate::consumer::handover::Skip;
use crate::output::metrics::{self, PartitionMetrics};
use crate::processors::processor::{FetchedMessage, Kafka, Message};
use crate::settings::OnFailure;

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
    /// The timestamps of the messages handed out behind an older one not yet
    /// acknowledged, by offset, ascending (only with concurrent ordering).
    pub(super) stamps: VecDeque<(i64, i64)>,
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
            stamps: VecDeque::new(),
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

    /// `offset`, of timestamp `timestamp_ms`, goes to the processor. `Err(at)`
    /// (logged): it may not, and the partition must not be committed past `at`.
    #[inline]
    pub(super) fn dispatch(&mut self, offset: i64, timestamp_ms: Option<i64>) -> Result<(), i64> {
        self.stamp(offset, timestamp_ms);
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
            Ok(Some(next)) => {
                self.shared.committable.store(next, Ordering::Release);
                self.passed(next);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::error!(at = "tracker_error", topic = self.topic, partition = self.partition, offset, error = %e)
            }
        }
    }

    /// Notes the timestamp of the message at `offset`, about to be handed out. With
    /// nothing else outstanding (always, in order) it is the oldest not processed:
    /// published at once, and not kept (the hot path: one store). Otherwise kept for
    /// when the ones before it are acknowledged.
    #[inline]
    fn stamp(&mut self, offset: i64, timestamp_ms: Option<i64>) {
        let ts = timestamp_ms.unwrap_or(super::shared::NONE);
        if self.tracker.outstanding() == 0 {
            self.shared.oldest_timestamp_ms.store(ts, Ordering::Relaxed);
        } else {
            self.stamps.push_back((offset, ts));
        }
    }

    /// The committable offset is `committable`: the oldest message not processed is now
    /// the first kept at or above it, if one was.
    #[inline]
    fn passed(&mut self, committable: i64) {
        if self.stamps.is_empty() {
            return;
        }
        while self.stamps.front().is_some_and(|(o, _)| *o < committable) {
            self.stamps.pop_front();
        }
        if let Some((_, ts)) = self.stamps.front() {
            self.shared
                .oldest_timestamp_ms
                .store(*ts, Ordering::Relaxed);
        }
    }

    /// Offsets `from..to` are missing after a fetch error: they may be messages
    /// librdkafka could not read and moved past. The failure policy decides: with
    /// `skip` they are passed (a line says so), else the partition halts at `from`.
    fn unread(&mut self, from: i64, to: i64, error: &KafkaError) -> Result<(), i64> {
        let skipped = (to - from) as u64;
        if self.on_failure == OnFailure::Skip {
            self.shared.metrics.offsets_skipped(skipped);
            self.shared.metrics.skipped();
            tracing::warn!(
                at = "skipped",
                topic = self.topic,
                partition = self.partition,
                offset = from,
                to,
                skipped,
                error = %error,
                "offsets left unread after a fetch error, passed without processing (ACKD_ON_FAILURE=skip)"
            );
            return Ok(());
        }
        self.fetch_halt(from, Some(to), error);
        Err(from)
    }

    /// The line of a partition halted by a fetch error at `offset`.
    fn fetch_halt(&self, offset: i64, to: Option<i64>, error: &KafkaError) {
        tracing::error!(
            at = "fetch_failed",
            topic = self.topic,
            partition = self.partition,
            offset,
            to,
            on_failure = self.on_failure.as_str(),
            error = %error,
            "messages from this offset could not be read: partition halted, its offset is not committed past them (a corrupt batch halts whatever ACKD_ON_FAILURE says; nothing unreadable can be dead-lettered)"
        );
    }

    /// A fetch error on the partition's queue. A batch that fails its CRC check
    /// (`check.crcs=true`) halts the partition at once, whatever `ACKD_ON_FAILURE` says:
    /// librdkafka fetches that batch again and again and never delivers what follows,
    /// so there is nothing to skip to (and nothing to dead-letter). Any other error is
    /// logged, and the offsets missing before the next message are then treated as
    /// unread ([`Progress::unread`]: an unsupported format, which librdkafka does move
    /// past, is skipped with `skip` and halts the partition otherwise). `Err(at)`: halt
    /// at `at`.
    pub(super) fn fetch_failed(&mut self, error: KafkaError) -> Result<(), i64> {
        // The end of the log is no error, and no message is missing after it.
        if let KafkaError::PartitionEOF(_) = error {
            return Ok(());
        }
        if matches!(
            error,
            KafkaError::MessageConsumption(RDKafkaErrorCode::BadMessage)
        ) {
            // Without a known position (no message yet, no committed offset) nothing
            // can be committed by this worker anyway.
            let at = self.expected().unwrap_or(0);
            self.fetch_halt(at, None, &error);
            return Err(at);
        }
        tracing::warn!(
            at = "fetch_error",
            topic = self.topic,
            partition = self.partition,
            expected_offset = self.expected(),
            error = %error,
            "offsets missing before the next message are treated as unread (ACKD_ON_FAILURE applies)"
        );
        self.fetch_error = Some(error);
        Ok(())
    }
}

impl Acks for Progress<'_> {
    fn ack(&mut self, _index: usize, view: &Message<'_>, processed: bool) {
        Progress::ack(self, view, processed);
    }
}

/// How often a partition writes an `at=offset_gap` line at most (see [`GapLines::gap`]).
const GAP_LINE_EVERY: Duration = Duration::from_secs(10);

/// The rate limit of a partition's `at=offset_gap` lines.
#[derive(Default)]
pub(super) struct GapLines {
    last_line: Option<Instant>,
    /// Gaps, and offsets in them, since the last line that had no line of their own.
    unlogged: u64,
    unlogged_skipped: u64,
    /// The offsets those gaps lie between: the first one's first missing offset, the
    /// last one's next message.
    unlogged_span: Option<(i64, i64)>,
}

/// What an `at=offset_gap` line says of its gaps.
const GAP_MSG: &str = "no message at these offsets reached ackd: the committed offset passes them. Compaction, transaction markers and aborted transactions (read_committed) leave such gaps, so do retention and an offset reset; any other cause is a defect of ackd (a message skipped): report it with these offsets";

impl GapLines {
    /// Offsets `from..to` hold no message that reached ackd, and no fetch error came
    /// before them: compaction, transaction markers and aborted transactions
    /// (`isolation.level=read_committed`) leave such gaps as a matter of course;
    /// retention passing the position, an offset reset (`ACKD_START_FROM`) or a
    /// truncated log leave them too. ackd cannot tell those from a message it skipped
    /// itself, which would be a defect: every gap is counted (`count#offsets.skipped`)
    /// and named by a warning. A busy transactional topic leaves a gap per transaction,
    /// so a partition writes at most one line every [`GAP_LINE_EVERY`]: the gaps in
    /// between are named by the next line (`earlier_from`, `earlier_to`), or at the
    /// worker's end ([`GapLines::flush`]).
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
        if self
            .last_line
            .is_some_and(|t| now.duration_since(t) < GAP_LINE_EVERY)
        {
            self.unlogged += 1;
            self.unlogged_skipped += skipped;
            self.unlogged_span = Some(self.unlogged_span.map_or((from, to), |(f, _)| (f, to)));
            tracing::debug!(at = "offset_gap", topic, partition, from, to, skipped);
            return;
        }
        let (earlier_from, earlier_to) = self.unlogged_span.unzip();
        tracing::warn!(
            at = "offset_gap",
            topic,
            partition,
            from,
            to,
            skipped,
            earlier_gaps = self.unlogged,
            earlier_skipped = self.unlogged_skipped,
            earlier_from,
            earlier_to,
            "{GAP_MSG}"
        );
        *self = GapLines {
            last_line: Some(now),
            ..GapLines::default()
        };
    }

    /// The worker ends: the gaps no line named yet get one (`from` the first's first
    /// missing offset, `to` the last's next message, `gaps` how many).
    pub(super) fn flush(&mut self, (topic, partition): (&str, i32)) {
        let Some((from, to)) = self.unlogged_span.take() else {
            return;
        };
        tracing::warn!(
            at = "offset_gap",
            topic,
            partition,
            from,
            to,
            skipped = self.unlogged_skipped,
            gaps = self.unlogged,
            "{GAP_MSG}"
        );
        *self = GapLines::default();
    }
}

// The offset tracker: which offset of one partition may be committed.
//
// Pure data, no I/O and no clock, so it can be tested exhaustively. Offsets are handed out
// in the order the broker delivered them (ascending, but not necessarily consecutive:
// compaction and transaction markers leave gaps) and may be acknowledged in any order.
// The committable offset is Kafka's "next offset to read": one past the highest offset
// below which every handed-out offset has been acknowledged. This is the only place in
// ackd that does the `+ 1`.

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
/// use ackd::consumer::OffsetTracker;
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

    /// A partition's progress from the committed offset 0, with `on_failure`.
    fn progress<'a>(shared: &'a WorkerShared, on_failure: OnFailure) -> Progress<'a> {
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
            stamps: VecDeque::new(),
        }
    }

    /// The timestamp published is the oldest message's not acknowledged, whatever order
    /// the acks come in; once all are, the last one's stays.
    #[test]
    fn the_oldest_message_not_acknowledged_gives_the_timestamp() {
        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Halt);
        let ack = |p: &mut Progress<'_>, o| p.ack(&Message::new("t", 0, o, None, None, None), true);
        assert_eq!(shared.oldest_timestamp_ms(), None);
        for (o, ts) in [(0, 1_000), (1, 1_100), (2, 1_200), (4, 1_400)] {
            assert_eq!(p.dispatch(o, Some(ts)), Ok(()));
        }
        assert_eq!(shared.oldest_timestamp_ms(), Some(1_000));
        ack(&mut p, 1);
        assert_eq!(shared.oldest_timestamp_ms(), Some(1_000), "0 is still out");
        ack(&mut p, 0);
        assert_eq!(shared.oldest_timestamp_ms(), Some(1_200));
        ack(&mut p, 2);
        assert_eq!(shared.oldest_timestamp_ms(), Some(1_400), "past the gap");
        ack(&mut p, 4);
        assert_eq!(shared.oldest_timestamp_ms(), Some(1_400));
        assert!(p.stamps.is_empty());
        // In order, one at a time: each message's own, on reading it.
        assert_eq!(p.dispatch(5, Some(1_500)), Ok(()));
        assert_eq!(shared.oldest_timestamp_ms(), Some(1_500));
        ack(&mut p, 5);
        assert_eq!(p.dispatch(6, None), Ok(()));
        assert_eq!(shared.oldest_timestamp_ms(), None, "no timestamp: unknown");
    }

    /// Offsets passed and messages skipped, as counted since the last call.
    fn counted(shared: &WorkerShared) -> (u64, u64) {
        let mut i = metrics::Interval::default();
        shared.metrics.take_into(&mut i);
        (i.offsets_skipped, i.skipped)
    }

    /// The previous owner's ranges stay published until this owner passes them, merged
    /// with its own acks.
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

    /// However many ranges are pending, what is published (and then copied by each
    /// commit) is what the metadata can hold.
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

    fn transient() -> KafkaError {
        KafkaError::MessageConsumption(RDKafkaErrorCode::UnknownTopicOrPartition)
    }

    #[test]
    fn offsets_missing_after_a_fetch_error_halt_the_partition_unless_skip() {
        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Halt);
        assert_eq!(p.dispatch(0, None), Ok(()));
        assert_eq!(p.dispatch(1, None), Ok(()));
        assert_eq!(p.fetch_failed(transient()), Ok(()));
        assert_eq!(
            p.dispatch(5, None),
            Err(2),
            "halted at the first unread offset"
        );

        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::DeadLetter);
        assert_eq!(p.fetch_failed(transient()), Ok(()));
        assert_eq!(
            p.dispatch(3, None),
            Err(0),
            "unread from the committed offset"
        );

        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Skip);
        assert_eq!(p.dispatch(0, None), Ok(()));
        assert_eq!(p.fetch_failed(transient()), Ok(()));
        assert_eq!(p.dispatch(4, None), Ok(()));
        assert_eq!(counted(&shared), (3, 1), "3 offsets passed, as one skip");
    }

    #[test]
    fn a_fetch_error_with_nothing_missing_after_it_is_forgotten() {
        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Halt);
        assert_eq!(p.dispatch(0, None), Ok(()));
        assert_eq!(p.fetch_failed(transient()), Ok(()));
        assert_eq!(p.dispatch(1, None), Ok(()));
        // A later gap is an ordinary one.
        assert_eq!(p.dispatch(9, None), Ok(()));
        assert_eq!(counted(&shared), (7, 0));
    }

    #[test]
    fn a_corrupt_batch_halts_at_the_next_offset_whatever_the_policy() {
        for policy in [OnFailure::Halt, OnFailure::Skip, OnFailure::DeadLetter] {
            let shared = WorkerShared::new();
            let mut p = progress(&shared, policy);
            assert_eq!(p.dispatch(0, None), Ok(()));
            let crc = KafkaError::MessageConsumption(RDKafkaErrorCode::BadMessage);
            assert_eq!(p.fetch_failed(crc), Err(1), "{policy:?}");
        }
        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Halt);
        assert_eq!(p.fetch_failed(KafkaError::PartitionEOF(0)), Ok(()));
        assert_eq!(p.dispatch(0, None), Ok(()));
        assert_eq!(
            p.dispatch(3, None),
            Ok(()),
            "the end of the log is no fetch error"
        );
    }

    #[test]
    fn every_gap_is_named_at_a_bounded_rate() {
        let shared = WorkerShared::new();
        let mut p = progress(&shared, OnFailure::Halt);
        // The first message's distance from the committed offset: counted, no gap line
        // (at=offset_reset says it).
        assert_eq!(p.dispatch(2, None), Ok(()));
        assert!(p.gaps.last_line.is_none());
        // A single offset (a transaction's marker, or a message skipped): a line.
        assert_eq!(p.dispatch(4, None), Ok(()));
        assert!(p.gaps.last_line.is_some());
        // The next ones within GAP_LINE_EVERY wait for the next line, which names
        // where they lie.
        assert_eq!(p.dispatch(6, None), Ok(()));
        assert_eq!(p.dispatch(20, None), Ok(()));
        assert_eq!((p.gaps.unlogged, p.gaps.unlogged_skipped), (2, 14));
        assert_eq!(p.gaps.unlogged_span, Some((5, 20)));
        assert_eq!(counted(&shared), (2 + 1 + 1 + 13, 0));
        // The worker's end names them.
        p.gaps.flush(("t", 0));
        assert_eq!(p.gaps.unlogged_span, None);
        assert_eq!((p.gaps.unlogged, p.gaps.unlogged_skipped), (0, 0));
    }
}

#[cfg(test)]
mod tracker_tests {
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
