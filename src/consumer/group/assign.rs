//! An assignment: where each new partition resumes (its committed offset and the
//! metadata beside it, else the start policy), and its worker.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::rdkafka_context::generation;
use super::{AckdConsumer, Group, GroupContext, Owned};
use crate::consumer::handover::{
    self, MetadataState, Previous, ReadMetadata, RedeliveryWindow, Resume,
};
use crate::consumer::membership;
use crate::consumer::partition_queue::PartitionQueue;
use crate::consumer::worker;
use crate::output::TopicPartition;
use crate::processors::processor::Processor;
use crate::settings::StartFrom;

/// Where a partition resumes: its committed offset (`None`: the start policy applies),
/// the offsets above it to skip, and those to flag as possible repeats.
struct ResumePoint {
    resume_from: Option<i64>,
    acked_above: Vec<(i64, i64)>,
    window: RedeliveryWindow,
    /// See [`Resume::existed_through`].
    existed_through: Option<i64>,
}

impl<P: Processor> GroupContext<P> {
    pub(super) fn assign(&self, base: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let Some(consumer) = self.consumer.get().and_then(Weak::upgrade) else {
            tracing::error!(at = "assign_error", "consumer is gone; ignoring assignment");
            return;
        };
        self.connectivity.reachable();
        if self.stopping.load(Ordering::Acquire) {
            ignore_while_stopping(tpl);
            return;
        }
        let mut resume = read_committed(base, tpl);
        // Asked before the lock is taken: the committer needs it meanwhile.
        let bounds = LogBounds::ask(base, tpl, &resume);
        self.start_where_nothing_is_committed(tpl, &resume, &bounds);
        let ends = crashed_log_ends(&bounds, &resume);
        let generation = generation(base);
        let mut group = self.lock();
        // The group assigned to this member: it is one.
        membership::confirmed(&mut *group, "rebalance");
        for e in tpl.elements() {
            let tp: TopicPartition = (Arc::from(e.topic()), e.partition());
            let mut point = self.resume_point(&bounds, &tp, resume.remove(&tp), generation);
            point.existed_through = ends.get(&tp).copied();
            self.start_worker(&mut group, &consumer, tp, point);
        }
    }

    /// Sets each partition that has no committed offset to start where the start policy
    /// says, as librdkafka would after reading the same commit again: it would treat
    /// "nothing committed" as an error and reset only after a fixed 100 ms backoff
    /// (`rd_kafka_offset_reset`), the longest step to a fresh group's first message. At
    /// the log's bound just read, when known (where the window was measured from, and
    /// librdkafka need not ask again; one since removed by retention is out of range,
    /// and librdkafka resets it by the same policy). A partition whose commit could not
    /// be read is left to librdkafka. A retry tier's partition starts at its beginning
    /// whatever the policy: its copies were made by this group, after their originals
    /// were acknowledged, and must not be skipped.
    fn start_where_nothing_is_committed(
        &self,
        tpl: &TopicPartitionList,
        resume: &HashMap<TopicPartition, (Offset, ReadMetadata)>,
        bounds: &LogBounds<'_, Self>,
    ) {
        for (tp, (offset, _)) in resume {
            if matches!(offset, Offset::Offset(_)) {
                continue;
            }
            let tier = self.worker.retry_tiers.delay_of(&tp.0).is_some();
            let earliest = tier || self.start_from == StartFrom::Earliest;
            let start = match (bounds.known.get(tp), earliest) {
                (Some((low, _)), true) => Offset::Offset(*low),
                (Some((_, high)), false) => Offset::Offset(*high),
                (None, true) => Offset::Beginning,
                (None, false) => Offset::End,
            };
            let Some(raw) = start.to_raw() else {
                continue;
            };
            let Ok(topic) = std::ffi::CString::new(&*tp.0) else {
                continue;
            };
            // SAFETY: librdkafka's list of this rebalance, alive for the call; it reads
            // each element's offset when the assignment is applied after this returns.
            unsafe {
                let e = rdkafka::bindings::rd_kafka_topic_partition_list_find(
                    tpl.ptr(),
                    topic.as_ptr(),
                    tp.1,
                );
                if !e.is_null() {
                    (*e).offset = raw;
                }
            }
        }
    }

    /// Where `tp` resumes, from what the group has committed for it (`None`: not known),
    /// logged `at=assigned`.
    fn resume_point(
        &self,
        bounds: &LogBounds<'_, Self>,
        tp: &TopicPartition,
        committed: Option<(Offset, ReadMetadata)>,
        generation: Option<i32>,
    ) -> ResumePoint {
        let (topic, partition) = (&*tp.0, tp.1);
        if let Some((Offset::Offset(o), read)) = committed {
            let (acked_above, window) = resume_from_commit(bounds, tp, o, &read, generation);
            return ResumePoint {
                resume_from: Some(o),
                acked_above,
                window,
                existed_through: None,
            };
        }
        // Nothing committed (or not known): whoever read the partition before may have
        // processed anything that exists now.
        // A retry tier starts at its beginning (`start_where_nothing_is_committed`).
        let tier = self.worker.retry_tiers.delay_of(topic).is_some();
        let start = match (&committed, self.start_from) {
            (None, _) | (Some(_), StartFrom::Earliest) => Start::Earliest,
            (Some(_), _) if tier => Start::Earliest,
            (Some(_), StartFrom::Latest) => Start::Latest,
        };
        let window = RedeliveryWindow {
            no_commit: true,
            ..bounded_by_log_end(bounds, tp, start)
        };
        let from = match committed {
            Some(_) if tier => StartFrom::Earliest.as_str(),
            Some(_) => self.start_from.as_str(),
            None => "unknown",
        };
        tracing::info!(
            at = "assigned",
            topic,
            partition,
            from,
            generation,
            redelivery_at_most = at_most_str(window),
            flagged_through = flagged_through(window),
            "no committed offset known: the start policy applies"
        );
        ResumePoint {
            resume_from: None,
            acked_above: Vec::new(),
            window,
            existed_through: None,
        }
    }

    /// Gives `tp` its own queue and a worker that resumes at `point`, and registers it
    /// as owned (with the committer, the health endpoint and the group).
    fn start_worker(
        &self,
        group: &mut Group,
        consumer: &Arc<AckdConsumer<P>>,
        tp: TopicPartition,
        point: ResumePoint,
    ) {
        let partition = tp.1;
        let predecessor = take_over(group, consumer, &tp);
        let Some(queue) = PartitionQueue::split(consumer, &tp.0, partition) else {
            tracing::error!(
                at = "assign_error",
                topic = &*tp.0,
                partition,
                "librdkafka gave no queue for this partition"
            );
            return;
        };
        let acked_above_inherited = point.acked_above.clone();
        let worker = worker::spawn(
            &self.runtime,
            queue,
            tp.0.clone(),
            partition,
            Resume {
                resume_from: point.resume_from,
                acked: point.acked_above,
                window: point.window,
                existed_through: point.existed_through,
            },
            self.worker.clone(),
            predecessor,
        );
        if let Some(c) = self.committer.get() {
            c.acquire(&tp);
        }
        self.health.assigned(tp.clone(), worker.shared.clone());
        group.owned.insert(
            tp,
            Owned {
                worker,
                committed: point.resume_from,
                resume_from: point.resume_from,
                cap: None,
                high_watermark: -1,
                released: false,
                // What the committed metadata names: a commit that names fewer
                // (with the same offset) is one to make.
                committed_acked: acked_above_inherited,
            },
        );
    }
}

/// The stop serves a rebalance to commit; what it gets now it will not process (its
/// acks could not be committed by a consumer that is closing).
fn ignore_while_stopping(tpl: &TopicPartitionList) {
    for e in tpl.elements() {
        tracing::info!(
            at = "assign_ignored",
            topic = e.topic(),
            partition = e.partition(),
            "stopping: not processed here; the next owner starts at the committed offset"
        );
    }
}

/// Where each partition resumes: the group's committed offset (and the metadata beside
/// it), else the policy; empty when they could not be read.
fn read_committed<C: rdkafka::consumer::ConsumerContext>(
    base: &BaseConsumer<C>,
    tpl: &TopicPartitionList,
) -> HashMap<TopicPartition, (Offset, ReadMetadata)> {
    let committed = base
        .committed_offsets(tpl.clone(), Duration::from_secs(10))
        .map_err(|e| tracing::warn!(at = "committed_unknown", error = %e, "could not read committed offsets"))
        .ok();
    committed
        .iter()
        .flat_map(handover::committed_with_metadata)
        .map(|(tp, offset, read)| (tp, (offset, read)))
        .collect()
}

/// What the new worker of `tp` waits for, if anything: its previous worker, when that
/// one has not ended and still holds a handle on the partition's queue.
fn take_over<P: Processor>(
    group: &mut Group,
    consumer: &Arc<AckdConsumer<P>>,
    tp: &TopicPartition,
) -> Option<worker::Predecessor<GroupContext<P>>> {
    // Assigned twice without a revoke in between: the old worker's acks belong to
    // a finished assignment and are dropped with it.
    if let Some(old) = group.owned.remove(tp) {
        old.worker.stop();
        old.worker.abort();
        group
            .lingering
            .insert(tp.clone(), old.worker.shared.clone());
    }
    // A previous worker of this partition that has not ended still holds a
    // handle on its queue: the new one must not read it before that is gone.
    let partition = tp.1;
    group
        .lingering
        .remove(tp)
        .filter(|s| !s.is_done())
        .map(|shared| {
            let (consumer, topic) = (Arc::downgrade(consumer), tp.0.clone());
            worker::Predecessor {
                shared,
                resplit: Box::new(move || {
                    PartitionQueue::split(&consumer.upgrade()?, &topic, partition)
                }),
            }
        })
}

/// The `at=assigned` line of a partition resuming at its committed offset `o`; the
/// offsets above it its previous owner acknowledged (concurrent ordering), to skip (only
/// when the metadata is this ackd's, written beside `o` itself), and the window of
/// offsets to flag as possible repeats. Otherwise nothing is skipped, and `metadata=`
/// says why.
fn resume_from_commit<C: rdkafka::consumer::ConsumerContext>(
    bounds: &LogBounds<'_, C>,
    tp: &TopicPartition,
    o: i64,
    read: &ReadMetadata,
    generation: Option<i32>,
) -> (Vec<(i64, i64)>, RedeliveryWindow) {
    let (topic, partition) = (&*tp.0, tp.1);
    let previous = read.previous.as_ref();
    let acked_above = previous.map_or_else(Vec::new, |p| p.acked_above(o));
    let skipped = crate::consumer::handover::count_offsets(&acked_above);
    // A previous owner that released the partition had processed through `processed`
    // and nothing after; one that crashed (or was fenced, or lost it) started nothing
    // above its dispatch limit. Either way exactly the offsets from `o` to there may
    // come again, but those it acknowledged above its commit. Without that (an older
    // ackd that crashed, metadata not this ackd's or not describing `o`), the bound is
    // what the log holds now.
    let window = previous
        .and_then(|p| window_from(p, o, skipped))
        .unwrap_or_else(|| bounded_by_log_end(bounds, tp, Start::At(o)));
    let released = previous.filter(|p| p.released);
    tracing::info!(
        at = "assigned",
        topic,
        partition,
        offset = o,
        from = "committed",
        generation,
        metadata = read.state.as_str(),
        highest_processed = previous.map(|p| p.processed),
        dispatch_limit = previous.and_then(|p| p.limit),
        released = previous.map(|p| p.released),
        redelivery = released.and(window.at_most),
        redelivery_at_most = at_most_str(window),
        flagged_through = flagged_through(window),
        acked_above = (skipped > 0).then_some(skipped)
    );
    if let Some(why) = untrusted_metadata(read.state) {
        tracing::warn!(
            at = "commit_metadata_ignored",
            topic,
            partition,
            offset = o,
            metadata = read.state.as_str(),
            "{why}: no offset above the committed one is skipped (messages the previous owner acknowledged above it may come again)"
        );
    }
    (acked_above, window)
}

/// The window `p` implies for a resume at `o`, having skipped `skipped`; `None` when it
/// does not say (no dispatch limit) or its numbers overflow.
fn window_from(p: &Previous, o: i64, skipped: i64) -> Option<RedeliveryWindow> {
    let through = p.window_end()?;
    let at_most = through
        .checked_add(1)?
        .checked_sub(o)?
        .checked_sub(skipped)?
        .max(0);
    Some(RedeliveryWindow {
        through,
        at_most: Some(at_most),
        no_commit: false,
    })
}

/// Where a partition without a usable commit starts.
#[derive(Debug, Clone, Copy)]
enum Start {
    At(i64),
    Earliest,
    Latest,
}

/// When nothing says what the previous owner started: every message the log holds now
/// may have been (nothing above it can have been: it did not exist). Asks the broker
/// for the log's bounds; if that fails, every message is flagged and the count unknown.
fn bounded_by_log_end<C: rdkafka::consumer::ConsumerContext>(
    bounds: &LogBounds<'_, C>,
    tp: &TopicPartition,
    start: Start,
) -> RedeliveryWindow {
    match bounds.of(tp) {
        Ok((low, high)) => {
            let from = match start {
                Start::At(o) => o,
                Start::Earliest => low,
                Start::Latest => high,
            };
            RedeliveryWindow {
                through: high.saturating_sub(1),
                at_most: Some(high.saturating_sub(from).max(0)),
                no_commit: false,
            }
        }
        Err(e) => {
            tracing::warn!(at = "watermarks_unknown", topic = &*tp.0, partition = tp.1, error = %e,
                "could not read the log's bounds: every message of this assignment is flagged as a possible repeat");
            RedeliveryWindow {
                through: i64::MAX,
                at_most: None,
                no_commit: false,
            }
        }
    }
}

/// The last offset of the log now of each partition whose previous owner crashed (its
/// metadata says so; those not known are left out). That owner handed nothing over
/// above it: it could only start messages that existed, and it stopped before this
/// assignment (a zombie of it, paused and woken, holds its partitions: *A member that
/// may be gone starts nothing new* in docs/guarantees.md). So a graceful release of
/// this owner passes the crashed owner's window on only that far.
fn crashed_log_ends<C: rdkafka::consumer::ConsumerContext>(
    bounds: &LogBounds<'_, C>,
    resume: &HashMap<TopicPartition, (Offset, ReadMetadata)>,
) -> HashMap<TopicPartition, i64> {
    resume
        .iter()
        .filter(|(_, (_, read))| crashed(read))
        .filter_map(|(tp, _)| {
            let (_, high) = bounds
                .of(tp)
                .map_err(|e| tracing::warn!(at = "watermarks_unknown", topic = &*tp.0, partition = tp.1, error = %e,
                    "could not read the log's end: a release of this partition names the whole window it inherited"))
                .ok()?;
            Some((tp.clone(), high - 1))
        })
        .collect()
}

/// Whether the previous owner's metadata says it crashed (or was fenced, or lost the
/// partition) rather than released it.
fn crashed(read: &ReadMetadata) -> bool {
    read.previous.as_ref().is_some_and(|p| !p.released)
}

/// How long reading the log's bounds at assignment may take.
const WATERMARKS_TIMEOUT: Duration = Duration::from_secs(10);

/// The log's bounds (first offset, end offset) of the new partitions whose window or
/// handover needs them, asked of the brokers together: one request per bound and
/// leader, where asking each partition took a round trip per partition, in the
/// rebalance callback, before anything is fetched. A partition missing (its answer
/// was an error, or it was thought not to need them) is asked alone.
struct LogBounds<'a, C: rdkafka::consumer::ConsumerContext> {
    base: &'a BaseConsumer<C>,
    known: HashMap<TopicPartition, (i64, i64)>,
}

impl<'a, C: rdkafka::consumer::ConsumerContext> LogBounds<'a, C> {
    fn ask(
        base: &'a BaseConsumer<C>,
        tpl: &TopicPartitionList,
        resume: &HashMap<TopicPartition, (Offset, ReadMetadata)>,
    ) -> Self {
        // Those resuming from a release that names its window need nothing of the log.
        let needs = |tp: &TopicPartition| match resume.get(tp) {
            Some((Offset::Offset(_), read)) => read
                .previous
                .as_ref()
                .is_none_or(|p| !p.released || p.window_end().is_none()),
            _ => true,
        };
        let wanted: Vec<TopicPartition> = tpl
            .elements()
            .iter()
            .map(|e| (Arc::from(e.topic()), e.partition()))
            .filter(needs)
            .collect();
        let mut known = HashMap::new();
        if !wanted.is_empty() {
            let low = offsets_at(base, &wanted, Offset::Beginning);
            let high = offsets_at(base, &wanted, Offset::End);
            for (tp, l) in low {
                if let Some(h) = high.get(&tp) {
                    known.insert(tp, (l, *h));
                }
            }
        }
        LogBounds { base, known }
    }

    fn of(&self, tp: &TopicPartition) -> rdkafka::error::KafkaResult<(i64, i64)> {
        match self.known.get(tp) {
            Some(b) => Ok(*b),
            None => self.base.fetch_watermarks(&tp.0, tp.1, WATERMARKS_TIMEOUT),
        }
    }
}

/// The offset of `at` (the log's beginning or end) of each of `tps` that has one, in a
/// ListOffsets request per leader.
fn offsets_at<C: rdkafka::consumer::ConsumerContext>(
    base: &BaseConsumer<C>,
    tps: &[TopicPartition],
    at: Offset,
) -> HashMap<TopicPartition, i64> {
    let mut tpl = TopicPartitionList::with_capacity(tps.len());
    for tp in tps {
        // A bound's special offset is what ListOffsets takes as its timestamp.
        let _ = tpl.add_partition_offset(&tp.0, tp.1, at);
    }
    let Ok(answer) = base.offsets_for_times(tpl, WATERMARKS_TIMEOUT) else {
        return HashMap::new();
    };
    answer
        .elements()
        .iter()
        .filter(|e| e.error().is_ok())
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some(((Arc::from(e.topic()), e.partition()), o)),
            _ => None,
        })
        .collect()
}

/// `redelivery_at_most=`: a count, or `unknown`.
fn at_most_str(w: RedeliveryWindow) -> String {
    w.at_most
        .map_or_else(|| "unknown".to_string(), |n| n.to_string())
}

/// `flagged_through=`: the window's last offset, when there is one.
fn flagged_through(w: RedeliveryWindow) -> Option<i64> {
    (w.at_most != Some(0) && w.through >= 0 && w.through < i64::MAX).then_some(w.through)
}

/// Why ackd's metadata beside a committed offset is not trusted (`None`: it is, or it
/// is not ackd's at all).
fn untrusted_metadata(state: MetadataState) -> Option<&'static str> {
    use MetadataState::*;
    match state {
        Stale => Some("ackd's metadata was written beside another offset (copied or moved by a tool: MirrorMaker 2's offset sync, kafka-consumer-groups, an admin client)"),
        OldFormat => Some("the metadata is an older ackd's format, which does not say which offset it was written beside"),
        NewerFormat => Some("the metadata is a later ackd's format"),
        Absent | Current | Foreign => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::handover::read_metadata;

    fn previous(m: &str, o: i64) -> Previous {
        read_metadata(m.as_bytes(), Some(o)).previous.unwrap()
    }

    /// The window a new owner flags, from numbers anyone can write.
    #[test]
    fn the_window_is_the_limit_or_the_release_and_never_overflows() {
        let crashed = previous("ackd/3:o=30;p=41;l=1040;a=2-4;end", 30);
        let w = window_from(&crashed, 30, 3).unwrap();
        assert_eq!((w.through, w.at_most), (1040, Some(1011 - 3)));
        let released = previous("ackd/3:o=30;p=41;l=1040;r;end", 30);
        let w = window_from(&released, 30, 0).unwrap();
        assert_eq!((w.through, w.at_most), (41, Some(12)));
        assert_eq!(
            window_from(&previous("ackd/2:o=30;p=41;end", 30), 30, 0),
            None
        );
        let top = format!("ackd/3:o=0;p=0;l={};end", i64::MAX);
        assert_eq!(window_from(&previous(&top, 0), 0, 0), None);
        let w = window_from(&previous("ackd/3:o=5;p=-5;l=-5;end", 5), 5, 0).unwrap();
        assert_eq!(w.at_most, Some(0));
        assert_eq!(flagged_through(w), None);
    }
}
