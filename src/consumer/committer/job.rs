//! One job on the committer thread: drop what may no longer be sent, send the rest,
//! account for each partition's answer.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Mutex};
use std::time::Instant;

use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::KafkaError;

use super::commit::{CommitError, CommitOffset, Reason};
use super::ledger::{doubted_by, Accepted, CommitLedger, Limit};
use super::refused_ranges::{without_refused_metadata, without_refused_ranges};
use super::shared::Shared;
use super::sync_commit::commit_sync;
use crate::clock::millis;
use crate::consumer::handover::encode_ranges;
use crate::output::metrics::CommitMetrics;

pub(super) struct Job {
    /// Each offset with the epoch of the assignment it was queued under (0: not owned).
    pub(super) offsets: Vec<(CommitOffset, u64)>,
    pub(super) reason: Reason,
    /// When the waiter gives up: a job still queued then is dropped, never sent.
    pub(super) deadline: Option<Instant>,
    pub(super) reply: Option<mpsc::SyncSender<Result<(), CommitError>>>,
}

/// A job's offsets, split under the ownership lock: those to send now, those dropped
/// (and why).
struct Claimed<'a> {
    to_send: Vec<&'a CommitOffset>,
    dropped: Vec<&'a CommitOffset>,
    why: &'static str,
}

/// One job on the committer thread: drop what may no longer be sent, send the rest,
/// account for each partition's answer.
pub(super) fn run<X: Consumer<C>, C: ConsumerContext, G: CommitLedger>(
    consumer: &X,
    job: &Job,
    shared: &Shared,
    group: &Mutex<G>,
    metrics: &CommitMetrics,
) -> Result<(), CommitError> {
    let Claimed {
        to_send,
        dropped,
        why,
    } = claim(job, shared);
    log_dropped(job.reason, &dropped, why);
    if to_send.is_empty() {
        return if dropped.is_empty() {
            Ok(())
        } else {
            Err(CommitError::NotSent)
        };
    }
    let started = Instant::now();
    let Sent {
        ranges,
        bare,
        answers,
    } = send(consumer, &to_send, job.reason, shared);
    let took = started.elapsed();
    metrics.record(took, answers.iter().all(Result::is_ok));
    let duration_ms = millis(took);
    let first_error = {
        let mut group = group.lock().unwrap_or_else(|e| e.into_inner());
        let answered = Answered {
            reason: job.reason,
            sent_at: started,
            duration_ms,
        };
        let carried = Carried {
            ranges: &ranges,
            bare: &bare,
        };
        account(&mut *group, &answered, &to_send, &carried, answers)
    };
    // The send is over: a release waiting for these partitions may go on.
    shared.lock().sending.clear();
    shared.sent.notify_all();
    match first_error {
        Some(e) => Err(CommitError::Refused(e)),
        None if dropped.is_empty() => Ok(()),
        None => Err(CommitError::NotSent),
    }
}

/// What of `job` may be sent, marked as being sent. Decided and marked under the lock
/// `release` takes: no release completes between the check and the send.
fn claim<'a>(job: &'a Job, shared: &Shared) -> Claimed<'a> {
    let mut o = shared.lock();
    let claimed = if job.deadline.is_some_and(|d| Instant::now() >= d) {
        Claimed {
            to_send: Vec::new(),
            dropped: job.offsets.iter().map(|(c, _)| c).collect(),
            why: "not sent: the deadline passed before its turn",
        }
    } else {
        let (send, drop): (Vec<_>, Vec<_>) = job
            .offsets
            .iter()
            .partition(|(c, epoch)| o.owned.get(&c.tp) == Some(epoch));
        Claimed {
            to_send: send.into_iter().map(|(c, _)| c).collect(),
            dropped: drop.into_iter().map(|(c, _)| c).collect(),
            why: "not sent: the partition was released before its turn",
        }
    };
    o.sending = claimed.to_send.iter().map(|c| c.tp.clone()).collect();
    claimed
}

/// The `at=commit_failed` line of each offset dropped from a job (`why`).
fn log_dropped(reason: Reason, dropped: &[&CommitOffset], why: &str) {
    // A confirming commit only asks; one for a partition released meanwhile is moot.
    for c in dropped.iter().filter(|_| reason != Reason::Confirm) {
        tracing::error!(
            at = "commit_failed",
            topic = &*c.tp.0,
            partition = c.tp.1,
            offset = c.offset,
            reason = reason.as_str(),
            error = why,
            "not committed: if the partition moves or the process stops first, messages from the last committed offset are redelivered"
        );
    }
}

/// What a send carried, and each partition's answer.
struct Sent {
    /// The `a=` ranges each carried.
    ranges: Vec<Option<String>>,
    /// Each carried no metadata at all (the broker refuses it).
    bare: Vec<bool>,
    answers: Vec<Result<(), KafkaError>>,
}

/// Sends `to_send`, each with its `a=` ranges within the budget (again without them
/// where the broker refused them as too large, and with no metadata where it refused
/// even that).
fn send<X: Consumer<C>, C: ConsumerContext>(
    consumer: &X,
    to_send: &[&CommitOffset],
    reason: Reason,
    shared: &Shared,
) -> Sent {
    let budget = shared.ranges_budget.load(Ordering::Relaxed);
    let mut bare: Vec<bool> = {
        let o = shared.lock();
        to_send.iter().map(|c| o.bare.contains(&c.tp)).collect()
    };
    let mut ranges: Vec<Option<String>> = to_send
        .iter()
        .zip(&bare)
        .map(|(c, bare)| encode_ranges(c.offset, &c.acked, budget).filter(|_| !bare))
        .collect();
    let mut answers = commit_sync(consumer, to_send, &ranges, &bare, reason);
    without_refused_ranges(
        consumer,
        to_send,
        &mut ranges,
        &mut answers,
        &bare,
        reason,
        shared,
    );
    without_refused_metadata(consumer, to_send, &mut answers, &mut bare, reason, shared);
    Sent {
        ranges,
        bare,
        answers,
    }
}

/// What each partition's commit carried in its metadata.
struct Carried<'a> {
    ranges: &'a [Option<String>],
    bare: &'a [bool],
}

/// A commit the broker answered.
struct Answered {
    reason: Reason,
    /// When it was sent: an acceptance proves the membership only from then on.
    sent_at: Instant,
    duration_ms: f64,
}

/// Accounts for each partition's answer (`ranges`: the `acked=` ranges each carried);
/// returns the first refusal. An acceptance proves the membership; a refusal for the
/// member (of a periodic or confirming commit) puts it in doubt (src/consumer/membership.rs).
fn account<G: CommitLedger>(
    group: &mut G,
    answered: &Answered,
    sent: &[&CommitOffset],
    carried: &Carried<'_>,
    answers: Vec<Result<(), KafkaError>>,
) -> Option<KafkaError> {
    let reason = answered.reason.as_str();
    let mut first_error = None;
    let mut accepted = false;
    for (i, (c, answer)) in sent.iter().zip(answers).enumerate() {
        match answer {
            Ok(()) => {
                accepted = true;
                tracing::info!(
                    at = "committed",
                    topic = &*c.tp.0,
                    partition = c.tp.1,
                    offset = c.offset,
                    reason,
                    duration_ms = answered.duration_ms
                );
                // FIFO: the last commit accepted is what the group has.
                let limit = match carried.bare[i] {
                    true => Limit::None,
                    false => c.limit.map_or(Limit::Unchanged, Limit::Recorded),
                };
                let accepted = Accepted {
                    released: answered.reason.releases(),
                    with_ranges: carried.ranges[i].is_some(),
                    limit,
                };
                group.accepted(c, &accepted);
            }
            Err(e) => {
                log_refused(answered.reason, c, &e);
                first_error.get_or_insert(e);
            }
        }
    }
    if accepted {
        group.confirmed_by_commit(answered.sent_at);
    }
    if let Some(e) = first_error.as_ref() {
        if answered.reason == Reason::Confirm {
            tracing::warn!(at = "membership_unconfirmed", partitions = sent.len(), error = %e,
                "the confirming commit was refused: the partitions stay held until a commit is accepted or the group revokes them");
        }
        // A release's refusal is the release's to retry or give up (GroupContext::
        // commit_owned): the partitions go either way.
        if doubted_by(e) && !answered.reason.releases() {
            group.doubted(e);
        }
    }
    first_error
}

/// The `at=commit_failed` line of a partition the broker refused (none for a confirming
/// commit: `at=membership_unconfirmed` says it once).
fn log_refused(reason: Reason, c: &CommitOffset, e: &KafkaError) {
    let (topic, partition, offset) = (&*c.tp.0, c.tp.1, c.offset);
    let reason_str = reason.as_str();
    if reason == Reason::Confirm {
        return;
    }
    if !doubted_by(e) || reason.releases() {
        tracing::error!(at = "commit_failed", topic, partition, offset, reason = reason_str, error = %e,
            "not committed: retried at the next commit; if the partition moves or the process stops first, messages from the last committed offset are redelivered");
    } else {
        tracing::error!(at = "commit_failed", topic, partition, offset, reason = reason_str, error = %e,
            "not committed: the broker refused it for this member, whose membership may be gone: the partitions are held (nothing new starts) until a commit is accepted or the group revokes them; if they moved, their next owner redelivers from the last committed offset");
    }
}
