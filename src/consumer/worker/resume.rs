//! Where a partition resumes: the committed offset and the ranges acknowledged above
//! it, and the line its first message writes.

use std::sync::atomic::Ordering;

use super::redelivery::RedeliveryWindow;
use super::shared::WorkerShared;
use super::skip::Skip;

/// Where a partition resumes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resume {
    /// The group's committed offset, if any.
    pub committed: Option<i64>,
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

/// The first message of the assignment: where the partition resumed, and whether that
/// is where its committed offset said.
pub(super) fn resumed(
    shared: &WorkerShared,
    topic: &str,
    partition: i32,
    resume: Option<i64>,
    offset: i64,
    skip: &mut Skip,
) {
    shared.first_offset.store(offset, Ordering::Release);
    tracing::info!(at = "resumed", topic, partition, offset);
    match resume {
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
            // messages at the offsets it named may be new ones; nor may commits name them.
            skip.discard(topic, partition);
            shared
                .acked_above
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
        }
        // Ahead of it: out of range and reset to the log end, or offsets that no longer
        // exist (retention, compaction, transaction markers).
        Some(committed) if offset > committed => tracing::warn!(
            at = "offset_reset",
            topic,
            partition,
            from = committed,
            to = offset,
            "the first message is past the committed offset: the offsets between were deleted, compacted, transaction markers, or reset by the start policy"
        ),
        _ => {}
    }
}
