//! The synchronous commit, with each partition's own answer.

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::{IsError, KafkaError};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::commit::{CommitOffset, Reason};
use crate::consumer::handover::{metadata, raw_metadata};

/// Commits `offsets` synchronously, each with its `ranges` in the metadata (none at all
/// where `bare`); returns each partition's answer, in order.
///
/// The broker answers an OffsetCommit per partition, but librdkafka (2.12) reports one
/// error for the whole commit (the last refused partition's) and, before it hands the
/// list back, writes that error on every partition the broker accepted too. So the
/// commit goes through `rd_kafka_commit_queue`, whose list keeps the refused
/// partitions' own errors, and when a refusal can be one partition's
/// ([`partition_scoped`]) the group's committed offsets are read back: a partition
/// whose committed offset is the one just sent was accepted.
pub(super) fn commit_sync<X: Consumer<C>, C: ConsumerContext>(
    consumer: &X,
    offsets: &[&CommitOffset],
    ranges: &[Option<String>],
    bare: &[bool],
    reason: Reason,
) -> Vec<Result<(), KafkaError>> {
    let (tpl, sent) = commit_list(offsets, ranges, bare, reason);
    let (overall, answer) = commit_queue(consumer, &tpl);
    if !overall.is_error() {
        return offsets.iter().map(|_| Ok(())).collect();
    }
    let accepted: Vec<bool> = if offsets.len() > 1 && partition_scoped(overall.into()) {
        // The metadata must be there too, but for a release's (its mark alone refused
        // leaves the offset committed, which is what counts): a periodic commit's
        // carries the dispatch limit the worker goes by once it is accepted.
        let whole = ranges
            .iter()
            .zip(&sent)
            .map(|(r, m)| r.is_some() || (!reason.releases() && !m.is_empty()))
            .collect::<Vec<_>>();
        read_back(consumer, tpl, offsets, &sent, &whole)
    } else {
        vec![false; offsets.len()]
    };
    offsets
        .iter()
        .zip(accepted)
        .map(|(c, accepted)| {
            if accepted {
                return Ok(());
            }
            let own = answer
                .errors
                .get(&(c.tp.0.to_string(), c.tp.1))
                .copied()
                .filter(|e| e.is_error())
                .unwrap_or(overall);
            Err(KafkaError::ConsumerCommit(own.into()))
        })
        .collect()
}

/// The list to commit: each offset with its metadata; and the metadata of each, in
/// order.
fn commit_list(
    offsets: &[&CommitOffset],
    ranges: &[Option<String>],
    bare: &[bool],
    reason: Reason,
) -> (TopicPartitionList, Vec<String>) {
    let mut tpl = TopicPartitionList::with_capacity(offsets.len());
    let mut sent = Vec::with_capacity(offsets.len());
    for ((c, r), bare) in offsets.iter().zip(ranges).zip(bare) {
        let mut e = tpl.add_partition(&c.tp.0, c.tp.1);
        // Offsets come from the tracker: always >= 0, so this cannot fail.
        let _ = e.set_offset(Offset::Offset(c.offset));
        let m = match bare {
            true => String::new(),
            false => metadata(c.offset, c.processed, c.limit, r.as_deref(), reason),
        };
        e.set_metadata(m.clone());
        sent.push(m);
    }
    (tpl, sent)
}

/// Sends `tpl` through `rd_kafka_commit_queue` and waits for its answer: the overall
/// error, and each partition's own.
fn commit_queue<X: Consumer<C>, C: ConsumerContext>(
    consumer: &X,
    tpl: &TopicPartitionList,
) -> (rdsys::rd_kafka_resp_err_t, PerPartition) {
    let mut answer = PerPartition::default();
    // SAFETY: with no queue, rd_kafka_commit_queue blocks until the commit is answered
    // and calls `per_partition` on this thread before it returns, so `answer` outlives
    // every use of the pointer; `tpl` is copied by librdkafka.
    let overall = unsafe {
        rdsys::rd_kafka_commit_queue(
            consumer.client().native_ptr(),
            tpl.ptr(),
            std::ptr::null_mut(),
            Some(per_partition),
            (&mut answer as *mut PerPartition).cast::<c_void>(),
        )
    };
    (overall, answer)
}

/// Which of `offsets` the group has committed now, as sent (`sent`: their metadata),
/// read back after a commit refused for some partitions; none if that read fails.
fn read_back<X: Consumer<C>, C: ConsumerContext>(
    consumer: &X,
    tpl: TopicPartitionList,
    offsets: &[&CommitOffset],
    sent: &[String],
    whole: &[bool],
) -> Vec<bool> {
    match consumer.committed_offsets(tpl, READ_BACK_TIMEOUT) {
        // Where `whole`, the metadata too: a commit of the offset already committed
        // with new ranges or a new limit is accepted only if they are there.
        Ok(now) => {
            let elements = now.elements();
            let now: Vec<_> = elements.iter().zip(raw_metadata(&now)).collect();
            offsets
                .iter()
                .zip(sent.iter().zip(whole))
                .map(|(c, (m, whole))| {
                    now.iter().any(|(e, got)| {
                        e.topic() == &*c.tp.0
                            && e.partition() == c.tp.1
                            && e.offset() == Offset::Offset(c.offset)
                            && (!whole || got.as_deref().unwrap_or_default() == m.as_bytes())
                    })
                })
                .collect()
        }
        Err(e) => {
            tracing::warn!(at = "commit_unknown", error = %e, "could not read back which partitions the refused commit committed: all are counted as not committed");
            vec![false; offsets.len()]
        }
    }
}

/// How long reading back a partly refused commit may take.
const READ_BACK_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether a commit error can be one partition's alone (the others may be committed).
/// Errors about the group, the member or the coordinator refuse the whole request, as
/// do librdkafka's own (negative) codes.
fn partition_scoped(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as E;
    (code as i32) > 0
        && !matches!(
            code,
            E::NotCoordinator
                | E::CoordinatorNotAvailable
                | E::CoordinatorLoadInProgress
                | E::IllegalGeneration
                | E::UnknownMemberId
                | E::RebalanceInProgress
                | E::FencedInstanceId
                | E::GroupAuthorizationFailed
                | E::StaleMemberEpoch
                | E::InvalidGroupId
                | E::RequestTimedOut
                | E::NetworkException
        )
}

/// Each partition's error as librdkafka's commit callback reported it.
#[derive(Default)]
struct PerPartition {
    errors: HashMap<(String, i32), rdsys::rd_kafka_resp_err_t>,
}

unsafe extern "C" fn per_partition(
    _rk: *mut rdsys::rd_kafka_t,
    _err: rdsys::rd_kafka_resp_err_t,
    offsets: *mut rdsys::rd_kafka_topic_partition_list_t,
    opaque: *mut c_void,
) {
    // SAFETY: `opaque` is the `PerPartition` of `commit_sync`, alive while it blocks;
    // `offsets` (maybe null) is librdkafka's list, valid during the call.
    let answer = &mut *opaque.cast::<PerPartition>();
    let Some(list) = offsets.as_ref() else {
        return;
    };
    for i in 0..usize::try_from(list.cnt).unwrap_or(0) {
        let e = &*list.elems.add(i);
        if e.topic.is_null() {
            continue;
        }
        let topic = CStr::from_ptr(e.topic).to_string_lossy().into_owned();
        answer.errors.insert((topic, e.partition), e.err);
    }
}
