//! A commit whose metadata the broker refused as too large: committed again without its
//! ranges, and the budget for ranges lowered.

use std::sync::atomic::Ordering;

use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use super::commit::{CommitOffset, Reason};
use super::shared::Shared;
use super::sync_commit::commit_sync;

/// Commits again at once, without their ranges, the partitions whose metadata with
/// `a=` ranges the broker refused as too large (`offset.metadata.max.bytes`): the
/// offset matters, the ranges only spare redelivery. Halves the budget for ranges so
/// that later commits fit. `ranges` and `answers` are updated in place.
pub(super) fn without_refused_ranges<X: Consumer<C>, C: ConsumerContext>(
    consumer: &X,
    offsets: &[&CommitOffset],
    ranges: &mut [Option<String>],
    answers: &mut [Result<(), KafkaError>],
    reason: Reason,
    shared: &Shared,
) {
    let refused: Vec<usize> = (0..offsets.len())
        .filter(|&i| {
            ranges[i].is_some()
                && matches!(&answers[i], Err(e) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::OffsetMetadataTooLarge))
        })
        .collect();
    if refused.is_empty() {
        return;
    }
    let shortest = refused
        .iter()
        .filter_map(|&i| ranges[i].as_ref().map(String::len))
        .min()
        .unwrap_or(0);
    let budget = shared
        .ranges_budget
        .fetch_min(shortest / 2, Ordering::Relaxed)
        .min(shortest / 2);
    for &i in &refused {
        let c = offsets[i];
        tracing::warn!(
            at = "commit_metadata_dropped",
            topic = &*c.tp.0,
            partition = c.tp.1,
            offset = c.offset,
            ranges_bytes = ranges[i].as_ref().map_or(0, String::len),
            ranges_budget = budget,
            "the broker refused the commit metadata as too large (offset.metadata.max.bytes): committed again without the acknowledged offsets above it, which a crash would redeliver"
        );
        ranges[i] = None;
    }
    let again: Vec<&CommitOffset> = refused.iter().map(|&i| offsets[i]).collect();
    let none = vec![None; again.len()];
    for (i, answer) in refused
        .into_iter()
        .zip(commit_sync(consumer, &again, &none, reason))
    {
        answers[i] = answer;
    }
}
