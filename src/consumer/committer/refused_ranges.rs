//! A commit whose metadata the broker refused as too large: committed again without its
//! ranges, and the budget for ranges lowered; refused even without them, committed
//! again with no metadata at all (and none for that partition from then on).

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
    bare: &[bool],
    reason: Reason,
    shared: &Shared,
) {
    let refused: Vec<usize> = (0..offsets.len())
        .filter(|&i| ranges[i].is_some() && too_large(&answers[i]))
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
    let bare: Vec<bool> = refused.iter().map(|&i| bare[i]).collect();
    for (i, answer) in refused
        .into_iter()
        .zip(commit_sync(consumer, &again, &none, &bare, reason))
    {
        answers[i] = answer;
    }
}

/// Commits again at once, with no metadata, the partitions whose metadata the broker
/// refused as too large without ranges (`offset.metadata.max.bytes` below what ackd
/// writes): the offset matters more. From then on no commit of that partition carries
/// metadata, so no dispatch limit: its worker goes on unbounded (`bare` marks the
/// partitions whose accepted commit carried none), and after a crash the next owner,
/// finding no metadata, flags conservatively.
pub(super) fn without_refused_metadata<X: Consumer<C>, C: ConsumerContext>(
    consumer: &X,
    offsets: &[&CommitOffset],
    answers: &mut [Result<(), KafkaError>],
    bare: &mut [bool],
    reason: Reason,
    shared: &Shared,
) {
    let refused: Vec<usize> = (0..offsets.len())
        .filter(|&i| !bare[i] && too_large(&answers[i]))
        .collect();
    if refused.is_empty() {
        return;
    }
    {
        let mut o = shared.lock();
        for &i in &refused {
            let c = offsets[i];
            o.bare.insert(c.tp.clone());
            tracing::warn!(
                at = "commit_metadata_refused",
                topic = &*c.tp.0,
                partition = c.tp.1,
                offset = c.offset,
                "the broker refuses ackd's commit metadata even without ranges (offset.metadata.max.bytes): this partition's commits carry none from now on; no dispatch limit is recorded, so after a crash the next owner flags every message up to the log's end as a possible repeat"
            );
        }
    }
    let again: Vec<&CommitOffset> = refused.iter().map(|&i| offsets[i]).collect();
    let none = vec![None; again.len()];
    let all_bare = vec![true; again.len()];
    for (i, answer) in refused
        .into_iter()
        .zip(commit_sync(consumer, &again, &none, &all_bare, reason))
    {
        answers[i] = answer;
        bare[i] = true;
    }
}

fn too_large(answer: &Result<(), KafkaError>) -> bool {
    matches!(answer, Err(e) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::OffsetMetadataTooLarge))
}
