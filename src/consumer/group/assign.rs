//! An assignment: where each new partition resumes (its committed offset and the
//! metadata beside it, else the start policy), and its worker.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::generation::generation;
use super::{AckdConsumer, Group, GroupContext, Owned};
use crate::consumer::committer::{self, MetadataState, ReadMetadata};
use crate::consumer::membership;
use crate::consumer::worker;
use crate::processors::processor::Processor;
use crate::topic_partition::TopicPartition;

/// Where a partition resumes: its committed offset (`None`: the start policy applies)
/// and the offsets above it to skip.
struct ResumePoint {
    committed: Option<i64>,
    acked_above: Vec<(i64, i64)>,
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
        let generation = generation(base);
        let mut group = self.lock();
        // The group assigned to this member: it is one.
        membership::confirmed(&mut *group, "rebalance");
        for e in tpl.elements() {
            let tp: TopicPartition = (Arc::from(e.topic()), e.partition());
            let point = self.resume_point(&tp, resume.remove(&tp), generation);
            self.start_worker(&mut group, &consumer, tp, point);
        }
    }

    /// Where `tp` resumes, from what the group has committed for it (`None`: not known),
    /// logged `at=assigned`.
    fn resume_point(
        &self,
        tp: &TopicPartition,
        committed: Option<(Offset, ReadMetadata)>,
        generation: Option<i32>,
    ) -> ResumePoint {
        let (topic, partition) = (&*tp.0, tp.1);
        let mut acked_above = Vec::new();
        let committed = match committed {
            Some((Offset::Offset(o), read)) => {
                acked_above = resume_from_commit(topic, partition, o, &read, generation);
                Some(o)
            }
            Some(_) => {
                tracing::info!(
                    at = "assigned",
                    topic,
                    partition,
                    from = self.start_from.as_str(),
                    generation,
                    "no committed offset: the start policy applies"
                );
                None
            }
            None => {
                tracing::info!(
                    at = "assigned",
                    topic,
                    partition,
                    from = "unknown",
                    generation
                );
                None
            }
        };
        ResumePoint {
            committed,
            acked_above,
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
        let Some(queue) = consumer.split_partition_queue(&tp.0, partition) else {
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
            worker::Resume {
                committed: point.committed,
                acked: point.acked_above,
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
                committed: point.committed,
                assigned_at: point.committed,
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

/// The shutdown serves a rebalance to commit; what it gets now it will not process (its
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
        .flat_map(committer::committed_with_metadata)
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
                    consumer.upgrade()?.split_partition_queue(&topic, partition)
                }),
            }
        })
}

/// The `at=assigned` line of a partition resuming at its committed offset `o`, and the
/// offsets above it its previous owner acknowledged (concurrent ordering), to skip:
/// only when the metadata is this ackd's, written beside `o` itself. Otherwise nothing
/// is skipped, and `metadata=` says why.
fn resume_from_commit(
    topic: &str,
    partition: i32,
    o: i64,
    read: &ReadMetadata,
    generation: Option<i32>,
) -> Vec<(i64, i64)> {
    let previous = read.previous.as_ref();
    let acked_above = previous.map_or_else(Vec::new, |p| p.acked_above(o));
    let skipped = crate::consumer::acked_ranges::count(&acked_above);
    // Redelivery is visible: a previous owner that released the partition had processed
    // through `processed` and nothing after, so exactly the offsets from the resume
    // offset to it come again, but those it acknowledged above its commit. One that did
    // not release it (crashed, fenced, lost it) may have processed on after its last
    // commit, which left no trace: how much comes again is not known (the crash bound
    // in the README bounds it); nor is it when ackd's metadata does not describe `o`.
    let redelivery = match previous {
        Some(p) if p.released => Some(
            p.redelivery(o, skipped)
                .map_or_else(|| "unknown".to_string(), |n| n.to_string()),
        ),
        Some(_) => Some("unknown".to_string()),
        None => untrusted_metadata(read.state).map(|_| "unknown".to_string()),
    };
    tracing::info!(
        at = "assigned",
        topic,
        partition,
        offset = o,
        from = "committed",
        generation,
        metadata = read.state.as_str(),
        highest_processed = previous.map(|p| p.processed),
        released = previous.map(|p| p.released),
        redelivery = redelivery.as_deref(),
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
    acked_above
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
