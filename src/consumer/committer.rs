//! The committer: one thread that sends every commit of this process, one at a time.
//!
//! librdkafka's synchronous commit has no timeout (it waits for the broker however long
//! that takes), so it never runs on the supervisor's thread; and async commits made by
//! hand report no result. One thread in FIFO order gives all three properties ackd needs:
//! the supervisor never blocks on a dead broker, every commit's result and duration is
//! known (and logged), and a periodic commit queued before a revoke's final commit is
//! sent before it, so the broker never sees an older offset after a newer one.
//!
//! **A commit is never sent for a partition this process has released.** A caller that
//! stops waiting (its deadline passed) cannot take its commit back from the queue, and
//! one that librdkafka already holds cannot be recalled at all; sent late, it would carry
//! this member's *current* generation and overwrite the newer offset of the partition's
//! next owner. So every partition is registered while owned ([`Committer::acquire`],
//! with an epoch per assignment), each queued offset carries the epoch it was queued
//! under, and under one lock the thread drops what is no longer owned (or whose waiter's
//! deadline passed) and marks what it sends; [`Committer::release`] waits until no send
//! holds the partition, then unregisters it. Once `release` returned, nothing queued
//! for the partition can be sent. The wait is bounded by librdkafka itself: a commit
//! waits for a coordinator at most `session.timeout.ms`, and its request
//! `socket.timeout.ms`.
//!
//! A commit is accounted for per partition: a partition the broker refused does not make
//! the others' commit a failure (see [`commit_sync`]).
//!
//! Each commit carries metadata `ackd/3:o=O;p=H;l=L;end`
//! ([`crate::consumer::handover::metadata`]): the offset committed, the highest offset
//! this process had acknowledged on that partition, its dispatch limit, and `;r` when it
//! is a revoke's or a stop's commit, after which this process processes nothing more of
//! the partition. The next owner reads it back: after a release it knows exactly how much
//! it redelivers; after a periodic commit (the owner crashed, or was fenced or lost the
//! partition, before releasing it) its dispatch limit bounds what may have been handed
//! to a processor.
//!
//! With concurrent ordering, the metadata also lists the offsets acknowledged above the
//! committed one (`;a=2-4,7`, relative to it), which the next owner skips, only beside
//! the offset `o=` names (src/consumer/handover/commit_metadata.rs). A broker that
//! refuses the metadata as too large (`offset.metadata.max.bytes`) gets that partition's
//! commit again at once without the ranges (`at=commit_metadata_dropped`): the offset is
//! committed and those messages are redelivered after a crash, as without the ranges;
//! the process halves its budget for ranges ([`RANGES_BUDGET`]) each time, so it
//! soon writes what the broker keeps.
//!
//! In this file, in order: what a commit is ([`CommitOffset`], [`Reason`],
//! [`CommitError`]); the handle and its thread ([`Committer`]); what the handle and the
//! thread share; one job on the thread; what each commit carries, read from the group's
//! owned partitions (periodic: [`Group::uncommitted`]; asked for by a worker at its
//! dispatch limit; a release's; a confirming one), what the group records of an
//! accepted commit, and which refusals put the membership in doubt; the synchronous
//! commit with each partition's own answer; and the commit again without what the
//! broker refused of its metadata. The metadata's format is
//! src/consumer/handover/commit_metadata.rs; the membership a commit proves or doubts,
//! src/consumer/membership.rs.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::{IsError, KafkaError};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use crate::consumer::group::{Group, Owned};
use crate::consumer::handover::{encode_ranges, metadata, raw_metadata, RANGES_MAX_BYTES};
use crate::consumer::membership;
use crate::consumer::worker::WorkerShared;
use crate::output::metrics::millis;
use crate::output::metrics::CommitMetrics;
use crate::output::TopicPartition;

/// What to commit for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitOffset {
    pub tp: TopicPartition,
    /// The next offset to read.
    pub offset: i64,
    /// For the metadata: the highest offset acknowledged or, in a release, the highest
    /// handed to the processor (finished or not).
    pub processed: Option<i64>,
    /// The dispatch limit this commit records (src/consumer/worker/shared.rs): once it
    /// is accepted, the partition's worker may start offsets up to it.
    pub limit: Option<i64>,
    /// Offsets acknowledged above `offset`, inclusive ranges, ascending, for the metadata
    /// (empty unless the ordering is concurrent).
    pub acked: Vec<(i64, i64)>,
}

/// Why a commit is sent; named on its `at=committed` lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Periodic,
    Revoke,
    Shutdown,
    /// While the membership is in doubt: a commit whose acceptance proves it
    /// (src/consumer/membership.rs).
    Confirm,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Periodic => "periodic",
            Reason::Revoke => "revoke",
            Reason::Shutdown => "shutdown",
            Reason::Confirm => "confirm",
        }
    }

    /// A release's commit: this process processes nothing more of the partition.
    pub fn releases(self) -> bool {
        matches!(self, Reason::Revoke | Reason::Shutdown)
    }
}

/// How a waited-for commit ended.
#[derive(Debug)]
pub enum CommitError {
    /// The broker (or librdkafka) refused at least one partition; the error of the first.
    /// The partitions it accepted are committed (and logged `at=committed`).
    Refused(KafkaError),
    /// Not answered before the deadline. If it was still queued it is never sent; if
    /// librdkafka had it already, it may still be committed.
    TimedOut,
    /// Not sent for some partitions: their waiter's deadline passed in the queue, or they
    /// were released meanwhile.
    NotSent,
    /// The consumer is gone.
    Closed,
}

impl std::fmt::Display for CommitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommitError::Refused(e) => write!(f, "{e}"),
            CommitError::TimedOut => f.write_str("no answer before the deadline"),
            CommitError::NotSent => f.write_str("not sent: given up before its turn"),
            CommitError::Closed => f.write_str("the consumer is closed"),
        }
    }
}

// The handle and its thread.

/// How often [`Committer::commit`] reads its deadline again while it waits.
const DEADLINE_CHECK: Duration = Duration::from_millis(50);
/// How often the thread looks for a confirming commit or a lease renewal due (each
/// paced by its own clock): well within the shortest lease a renewal must precede.
const WAKE: Duration = Duration::from_millis(100);

/// A handle on the committer thread; clones share it.
#[derive(Clone)]
pub struct Committer {
    jobs: mpsc::Sender<Job>,
    periodic_queued: Arc<AtomicBool>,
    shared: Arc<Shared>,
}

impl Committer {
    /// Starts the thread. It holds the consumer weakly: the consumer (and with it the
    /// context holding a handle) can always be dropped.
    pub fn start<X, C>(
        consumer: Weak<X>,
        group: Arc<Mutex<Group>>,
        metrics: Arc<CommitMetrics>,
    ) -> std::io::Result<Committer>
    where
        X: Consumer<C> + Send + Sync + 'static,
        C: ConsumerContext + 'static,
    {
        let (jobs, rx) = mpsc::channel::<Job>();
        let periodic_queued = Arc::new(AtomicBool::new(false));
        let queued = periodic_queued.clone();
        let shared = Arc::new(Shared::default());
        let on_thread = shared.clone();
        membership::watch_stalls(Arc::downgrade(&group))?;
        std::thread::Builder::new()
            .name("ackd-committer".into())
            .spawn(move || loop {
                // Woken at least every WAKE: while the membership is in doubt, this
                // thread sends the commits that can prove it, and otherwise renews its
                // lease when nothing else did.
                match rx.recv_timeout(WAKE) {
                    Ok(job) => {
                        if job.reason == Reason::Periodic {
                            queued.store(false, Ordering::Release);
                        }
                        let result = match consumer.upgrade() {
                            Some(c) => run(&*c, &job, &on_thread, &group, &metrics),
                            None => Err(CommitError::Closed),
                        };
                        if let Some(reply) = job.reply {
                            let _ = reply.send(result);
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
                confirm_if_due(&consumer, &on_thread, &group, &metrics);
            })?;
        Ok(Committer {
            jobs,
            periodic_queued,
            shared,
        })
    }

    /// Registers `tp` as owned under a new assignment: commits queued for it before (a
    /// previous assignment of it) are not sent.
    pub fn acquire(&self, tp: &TopicPartition) {
        let mut o = self.shared.lock();
        o.last_epoch += 1;
        let epoch = o.last_epoch;
        o.owned.insert(tp.clone(), epoch);
        o.queued.remove(tp);
    }

    /// Unregisters `tps`, once no commit holding one of them is inside librdkafka. When
    /// this returns, no commit for them will be sent, queued or not.
    pub fn release(&self, tps: &[TopicPartition]) {
        let o = self.shared.lock();
        let mut o = self
            .shared
            .sent
            .wait_while(o, |o| o.sending.iter().any(|tp| tps.contains(tp)))
            .unwrap_or_else(|e| e.into_inner());
        for tp in tps {
            o.owned.remove(tp);
            o.queued.remove(tp);
        }
    }

    fn tag(&self, offsets: Vec<CommitOffset>) -> Vec<(CommitOffset, u64)> {
        tag(&self.shared, offsets)
    }

    /// Queues a periodic commit of `offsets` as given unless one is already waiting: the
    /// committer's order and ownership, without a round's choice of partitions.
    #[cfg(test)]
    pub fn periodic(&self, offsets: Vec<CommitOffset>) {
        if offsets.is_empty() || self.periodic_queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = self.jobs.send(Job {
            offsets: self.tag(offsets),
            reason: Reason::Periodic,
            deadline: None,
            reply: None,
        });
    }

    /// The commit interval's round: queues a periodic commit of what changed in
    /// `group`'s partitions ([`Group::round`]) unless one is already waiting (the next
    /// one will carry newer offsets anyway).
    pub fn periodic_round(&self, group: &Group) {
        if self.periodic_queued.swap(true, Ordering::AcqRel) {
            return;
        }
        if !self.queue_round(group, false) {
            self.periodic_queued.store(false, Ordering::Release);
        }
    }

    /// Queues a commit of the partitions whose workers wait for (or will soon reach)
    /// their dispatch limit, even while a periodic one waits: that one may not carry
    /// their new limit. A partition whose commit is queued already is left to it: the
    /// one accepted raises its limit, or its worker asks again.
    pub fn limits_round(&self, group: &Group) {
        self.queue_round(group, true);
    }

    /// Writes the `at=commits` line of the periodic and confirming commits answered since
    /// the last one, if any: one line per commit interval, however many partitions.
    pub fn log_rounds(&self) {
        let r = std::mem::take(&mut *self.shared.rounds.lock().unwrap_or_else(|e| e.into_inner()));
        if r.rounds > 0 {
            tracing::info!(
                at = "commits",
                rounds = r.rounds,
                partitions = r.tally.partitions,
                offsets_moved = r.tally.moved,
                duration_ms = millis(r.took)
            );
        }
    }

    /// Queues a round of `group`'s partitions whose offset or limit must change beyond
    /// what the commits queued and unanswered carry (`limits`: only those whose worker
    /// wants its limit raised), nobody waiting for its answer; false if there was none.
    /// The caller holds the group's lock: no answer changes it meanwhile.
    fn queue_round(&self, group: &Group, limits: bool) -> bool {
        let mut o = self.shared.lock();
        let offsets = group.round(&o.queued, limits);
        if offsets.is_empty() {
            return false;
        }
        let offsets: Vec<(CommitOffset, u64)> = offsets
            .into_iter()
            .map(|c| {
                let epoch = o.owned.get(&c.tp).copied().unwrap_or(0);
                o.queued.entry(c.tp.clone()).or_default().add(&c);
                (c, epoch)
            })
            .collect();
        let _ = self.jobs.send(Job {
            offsets,
            reason: Reason::Periodic,
            deadline: None,
            reply: None,
        });
        true
    }

    /// Commits and waits for the broker's answer until `deadline()`. A commit still
    /// queued at the deadline is dropped, never sent. The deadline may come sooner while
    /// it waits (a revoke's, when the stop begins): it is read every [`DEADLINE_CHECK`];
    /// a commit given up on then, still queued, is dropped once its partitions are
    /// released.
    pub fn commit(
        &self,
        offsets: Vec<CommitOffset>,
        reason: Reason,
        deadline: &dyn Fn() -> Instant,
    ) -> Result<(), CommitError> {
        if offsets.is_empty() {
            return Ok(());
        }
        let (reply, answer) = mpsc::sync_channel(1);
        self.jobs
            .send(Job {
                offsets: self.tag(offsets),
                reason,
                deadline: Some(deadline()),
                reply: Some(reply),
            })
            .map_err(|_| CommitError::Closed)?;
        loop {
            let now = Instant::now();
            let end = deadline();
            if now >= end {
                return answer.try_recv().unwrap_or(Err(CommitError::TimedOut));
            }
            match answer.recv_timeout((end - now).min(DEADLINE_CHECK)) {
                Ok(result) => return result,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(CommitError::Closed),
            }
        }
    }
}

/// While the membership is in doubt, a confirming commit when one is due
/// ([`membership::confirmation_due`]), sent and accounted for as any other; else, when
/// the membership lease wants renewing ([`membership::renewal_due`]), a read of one
/// partition's committed offset. The consumer is upgraded only then: this thread must
/// not hold it past the supervisor's close.
fn confirm_if_due<X: Consumer<C>, C: ConsumerContext>(
    consumer: &Weak<X>,
    shared: &Shared,
    group: &Mutex<Group>,
    metrics: &CommitMetrics,
) {
    let (confirm, renew) = {
        let mut group = group.lock().unwrap_or_else(|e| e.into_inner());
        match membership::confirmation_due(&mut *group) {
            Some(offsets) => (Some(offsets), None),
            None => (None, membership::renewal_due(&mut *group)),
        }
    };
    if confirm.is_none() && renew.is_none() {
        return;
    }
    let Some(consumer) = consumer.upgrade() else {
        return;
    };
    if let Some(offsets) = confirm {
        let job = Job {
            offsets: tag(shared, offsets),
            reason: Reason::Confirm,
            deadline: None,
            reply: None,
        };
        let _ = run(&*consumer, &job, shared, group, metrics);
    } else if let Some((tp, timeout)) = renew {
        renew_lease(&*consumer, group, &tp, timeout);
    }
}

/// Reads `tp`'s committed offset from the coordinator: an answer without an error
/// renews the lease from when it was asked (a read writes nothing, unlike a commit).
fn renew_lease<X: Consumer<C>, C: ConsumerContext>(
    consumer: &X,
    group: &Mutex<Group>,
    tp: &TopicPartition,
    timeout: Duration,
) {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&tp.0, tp.1);
    let sent_at = Instant::now();
    match consumer.committed_offsets(tpl, timeout) {
        Ok(answer) if answer.elements().iter().all(|e| e.error().is_ok()) => membership::renewed(
            &mut *group.lock().unwrap_or_else(|e| e.into_inner()),
            sent_at,
        ),
        Ok(_) => tracing::debug!(
            at = "lease_not_renewed",
            "the partition's offset was refused"
        ),
        Err(e) => tracing::debug!(at = "lease_not_renewed", error = %e),
    }
}

// What the handle and the thread share.

/// The partitions commits may be sent for; see the module's documentation.
#[derive(Default)]
struct Ownership {
    /// Owned partitions and the epoch of their current assignment.
    owned: HashMap<TopicPartition, u64>,
    last_epoch: u64,
    /// The partitions of the commit being sent right now (inside librdkafka).
    sending: Vec<TopicPartition>,
    /// Partitions whose metadata the broker refused even without ranges: their commits
    /// carry none (no dispatch limit either) from then on.
    bare: HashSet<TopicPartition>,
    /// The periodic commits (rounds) of each partition queued and not yet answered.
    queued: HashMap<TopicPartition, Queued>,
}

/// One partition's periodic commits queued and not yet answered: a round leaves the
/// partition out unless its offset or ranges moved past the latest of them, and leaves
/// its limit to them (the one accepted raises it, or the worker asks again).
#[derive(Debug, Default)]
pub struct Queued {
    jobs: u32,
    /// The latest one's offset and `a=` ranges.
    offset: i64,
    acked: Vec<(i64, i64)>,
}

impl Queued {
    fn add(&mut self, c: &CommitOffset) {
        self.jobs += 1;
        self.offset = c.offset;
        self.acked = c.acked.clone();
    }
}

impl Ownership {
    /// A round carrying `sent` was answered (or not sent): those partitions' commits
    /// queued are one fewer.
    fn answered(&mut self, sent: &[&CommitOffset]) {
        for c in sent {
            if let Some(q) = self.queued.get_mut(&c.tp) {
                q.jobs = q.jobs.saturating_sub(1);
                if q.jobs == 0 {
                    self.queued.remove(&c.tp);
                }
            }
        }
    }
}

struct Shared {
    ownership: Mutex<Ownership>,
    /// Notified when a send ends.
    sent: Condvar,
    /// The most bytes of `a=` ranges a commit's metadata carries: lowered each time
    /// the broker refuses metadata with ranges as too large.
    ranges_budget: AtomicUsize,
    /// What the periodic and confirming commits did since the last `at=commits` line.
    rounds: Mutex<Rounds>,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            ownership: Mutex::default(),
            sent: Condvar::new(),
            ranges_budget: AtomicUsize::new(RANGES_BUDGET),
            rounds: Mutex::default(),
        }
    }
}

/// Periodic and confirming commits answered since the last `at=commits` line.
#[derive(Debug, Default)]
struct Rounds {
    rounds: u64,
    /// Partition-commits accepted, and how far they moved the committed offsets.
    tally: Tally,
    took: Duration,
}

/// The partitions of one commit the broker accepted, and the offsets they moved.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    partitions: u64,
    moved: u64,
}

/// Up to this many partitions owned, each partition a periodic or confirming commit
/// carries gets its `at=committed` line at info (a small deployment reads them); above,
/// at debug: the `at=commits` line sums them up once per commit interval, so that the
/// log does not grow with partitions. Releases and refusals keep their lines.
pub const COMMITTED_LINES_UP_TO: usize = 16;

/// The bytes of `a=` ranges a commit carries at first (see [`RANGES_MAX_BYTES`]).
pub const RANGES_BUDGET: usize = RANGES_MAX_BYTES;

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Ownership> {
        self.ownership.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Tags each offset with the epoch of its partition's assignment (0: not owned).
fn tag(shared: &Shared, offsets: Vec<CommitOffset>) -> Vec<(CommitOffset, u64)> {
    let o = shared.lock();
    offsets
        .into_iter()
        .map(|c| {
            let epoch = o.owned.get(&c.tp).copied().unwrap_or(0);
            (c, epoch)
        })
        .collect()
}

// One job on the thread.

struct Job {
    /// Each offset with the epoch of the assignment it was queued under (0: not owned).
    offsets: Vec<(CommitOffset, u64)>,
    reason: Reason,
    /// When the waiter gives up: a job still queued then is dropped, never sent.
    deadline: Option<Instant>,
    reply: Option<mpsc::SyncSender<Result<(), CommitError>>>,
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
fn run<X: Consumer<C>, C: ConsumerContext>(
    consumer: &X,
    job: &Job,
    shared: &Shared,
    group: &Mutex<Group>,
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
        let mut tally = Tally::default();
        let first_error = account(
            &mut group, &answered, &to_send, &carried, answers, &mut tally,
        );
        // Under the group's lock: a round built after this answer sees it.
        if job.reason == Reason::Periodic {
            shared.lock().answered(&to_send);
        }
        if !job.reason.releases() {
            let mut r = shared.rounds.lock().unwrap_or_else(|e| e.into_inner());
            r.rounds += 1;
            r.tally.partitions += tally.partitions;
            r.tally.moved += tally.moved;
            r.took += took;
        }
        first_error
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

/// Accounts for each partition's answer (`carried`: what its metadata carried); returns
/// the first refusal. An acceptance proves the membership; a refusal for the member (of
/// a periodic or confirming commit) puts it in doubt (src/consumer/membership.rs).
fn account(
    group: &mut Group,
    answered: &Answered,
    sent: &[&CommitOffset],
    carried: &Carried<'_>,
    answers: Vec<Result<(), KafkaError>>,
    tally: &mut Tally,
) -> Option<KafkaError> {
    let mut first_error = None;
    let mut accepted = false;
    let each_at_info = answered.reason.releases() || group.owned.len() <= COMMITTED_LINES_UP_TO;
    for (i, (c, answer)) in sent.iter().zip(answers).enumerate() {
        match answer {
            Ok(()) => {
                accepted = true;
                let limit = c.limit.filter(|_| !carried.bare[i]);
                log_committed(answered, c, limit, each_at_info);
                let before = group.owned.get(&c.tp).and_then(|p| p.committed);
                tally.partitions += 1;
                tally.moved += before.map_or(0, |b| c.offset.saturating_sub(b).max(0) as u64);
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
                group.commit_accepted(c, &accepted);
            }
            Err(e) => {
                log_refused(answered.reason, c, &e);
                first_error.get_or_insert(e);
            }
        }
    }
    if accepted {
        membership::confirmed_by_commit(group, answered.sent_at);
    }
    if let Some(e) = first_error.as_ref() {
        if answered.reason == Reason::Confirm {
            tracing::warn!(at = "membership_unconfirmed", partitions = sent.len(), error = %e,
                "the confirming commit was refused: the partitions stay held until a commit is accepted or the group revokes them");
        }
        // A release's refusal is the release's to retry or give up (GroupContext::
        // commit_owned): the partitions go either way.
        if doubted_by(e) && !answered.reason.releases() {
            membership::doubt(group, membership::Cause::Refused(e));
        }
    }
    first_error
}

/// The `at=committed` line of a partition the broker accepted: at info, or at debug when
/// the `at=commits` line sums it up ([`COMMITTED_LINES_UP_TO`]).
fn log_committed(answered: &Answered, c: &CommitOffset, limit: Option<i64>, at_info: bool) {
    let (topic, partition, offset) = (&*c.tp.0, c.tp.1, c.offset);
    let (reason, duration_ms) = (answered.reason.as_str(), answered.duration_ms);
    if at_info {
        tracing::info!(
            at = "committed",
            topic,
            partition,
            offset,
            limit,
            reason,
            duration_ms
        );
    } else {
        tracing::debug!(
            at = "committed",
            topic,
            partition,
            offset,
            limit,
            reason,
            duration_ms
        );
    }
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

// What a commit carries, read from the group's owned partitions; what an accepted
// commit records in them; which refusals doubt the membership.

/// How often a confirming commit is sent while the membership is in doubt
/// (src/consumer/membership.rs).
pub const CONFIRM_EVERY: Duration = Duration::from_millis(500);

/// Whether a commit refused with `error` means the member may no longer own its
/// partitions: the broker does not know it (its session expired), fenced it, or knows
/// a newer epoch or generation of the group than it does.
fn doubted_by(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::UnknownMemberId
                | RDKafkaErrorCode::FencedMemberEpoch
                | RDKafkaErrorCode::StaleMemberEpoch
                | RDKafkaErrorCode::IllegalGeneration
        )
    )
}

/// What an accepted commit of one partition carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Accepted {
    /// It was a release's (revoke, stop).
    released: bool,
    /// Its `a=` ranges were committed with it.
    with_ranges: bool,
    limit: Limit,
}

/// The dispatch limit an accepted commit recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    /// This one: offsets up to it may start.
    Recorded(i64),
    /// The commit named none (the limit stays as it was).
    Unchanged,
    /// It carried no metadata at all (the broker refuses it): no limit can be recorded,
    /// so none holds the partition back.
    None,
}

impl Group {
    /// Acknowledged offsets not yet committed, for `only` (all owned if `None`).
    pub fn uncommitted(&self, only: Option<&[TopicPartition]>) -> Vec<CommitOffset> {
        self.pending(only, false)
    }

    /// What a round sends ([`Committer::periodic`]): the partitions whose offset, ranges
    /// or dispatch limit must change beyond what their commits `queued` carry; with
    /// `limits` (asked for by workers at their dispatch limit), only those whose worker
    /// wants its limit raised (src/consumer/worker/shared.rs): the others keep to the
    /// commit interval.
    pub fn round(
        &self,
        queued: &HashMap<TopicPartition, Queued>,
        limits: bool,
    ) -> Vec<CommitOffset> {
        self.owned
            .iter()
            .filter(|(_, p)| !limits || p.worker.shared.dispatch.wanted())
            .filter_map(|(tp, p)| p.to_commit_beyond(tp, false, queued.get(tp)))
            .collect()
    }

    /// What releasing `only` commits: [`Group::uncommitted`], and the offsets last
    /// committed periodically again, as released.
    pub fn to_release(&self, only: &[TopicPartition]) -> Vec<CommitOffset> {
        self.pending(Some(only), true)
    }

    /// What a commit that proves the membership sends: per owned partition, what is
    /// acknowledged and not committed, else the offset committed already (with the
    /// ranges it carries); none for a partition with neither.
    pub fn confirming(&self) -> Vec<CommitOffset> {
        self.owned
            .iter()
            .filter_map(|(tp, p)| {
                p.to_commit(tp, false).or_else(|| {
                    Some(CommitOffset {
                        tp: tp.clone(),
                        offset: p.committed?,
                        processed: p.worker.shared.highest_acked(),
                        // While in doubt the limit stays: only a confirmed member may
                        // start more.
                        limit: p.worker.shared.dispatch.accepted(),
                        acked: p.committed_acked.clone(),
                    })
                })
            })
            .collect()
    }

    /// Whether releasing `tp` commits nothing but the release mark: its acknowledged
    /// offset and ranges are committed already (periodically), and only the metadata's
    /// `;r` is not.
    pub fn only_the_mark_left(&self, tp: &TopicPartition) -> bool {
        self.owned
            .get(tp)
            .is_some_and(|p| p.to_commit(tp, true).is_some_and(|c| only_the_mark(p, &c)))
    }

    fn pending(&self, only: Option<&[TopicPartition]>, releasing: bool) -> Vec<CommitOffset> {
        self.owned
            .iter()
            .filter(|(tp, _)| only.is_none_or(|o| o.contains(tp)))
            .filter_map(|(tp, p)| p.to_commit(tp, releasing))
            .collect()
    }

    /// The broker accepted `c` (with what [`Accepted`] says): what the group has for its
    /// partition, if still owned; its worker may start offsets up to the limit recorded.
    fn commit_accepted(&mut self, c: &CommitOffset, accepted: &Accepted) {
        if let Some(p) = self.owned.get_mut(&c.tp) {
            p.committed = Some(c.offset);
            p.released = accepted.released;
            p.committed_acked = if accepted.with_ranges {
                c.acked.clone()
            } else {
                Vec::new()
            };
            let limit = &p.worker.shared.dispatch;
            match accepted.limit {
                Limit::Recorded(l) => limit.accept(l),
                Limit::Unchanged => {}
                Limit::None => limit.lift(),
            }
        }
    }
}

impl Owned {
    /// What to commit, if the acknowledged offset moved past the committed one; on a
    /// release (`releasing`), also the same offset again when this process's last commit
    /// of it was periodic, or there was none since the assignment, so that the metadata
    /// says it was released and what was handed over unfinished (the next owner then
    /// flags exactly that). Running, also when the worker wants its dispatch
    /// limit raised (src/consumer/worker/shared.rs): a commit carries the next one.
    fn to_commit(&self, tp: &TopicPartition, releasing: bool) -> Option<CommitOffset> {
        self.to_commit_beyond(tp, releasing, None)
    }

    /// [`Owned::to_commit`], beyond the commits of it `queued` and not yet answered: the
    /// offset must move past theirs (or the ranges grow), and the limit is left to them.
    fn to_commit_beyond(
        &self,
        tp: &TopicPartition,
        releasing: bool,
        queued: Option<&Queued>,
    ) -> Option<CommitOffset> {
        let dispatch = &self.worker.shared.dispatch;
        let limit_wanted = !releasing && dispatch.wanted() && queued.is_none();
        let Some(acked) = self.worker.shared.committable() else {
            let wanted = limit_wanted || (releasing && !self.released);
            return wanted.then(|| self.limit_only(tp, releasing)).flatten();
        };
        let acked = self.cap.map_or(acked, |cap| acked.min(cap));
        // After a reset to before the committed offset (it was out of range), that
        // offset is no baseline: what was acknowledged since is what must be committed.
        let first = self.worker.shared.first_offset();
        let reset_back = matches!((first, self.resume_from), (Some(f), Some(a)) if f < a);
        let baseline = if reset_back && self.committed == self.resume_from {
            None
        } else {
            self.committed
        };
        let mark = releasing && !self.released && self.committed == Some(acked);
        // Offsets acknowledged above it (concurrent ordering), for the metadata; none
        // when capped: the cap is a message that could not be accounted for.
        let above: Vec<(i64, i64)> = match self.cap {
            Some(_) => Vec::new(),
            None => self
                .worker
                .shared
                .acked_above()
                .into_iter()
                .filter_map(|(a, b)| Some((a.max(acked.checked_add(1)?), b)))
                .filter(|(a, b)| a <= b)
                .collect(),
        };
        // The same offset again when only the ranges grew: a slow message holding the
        // offset back must not leave everything acknowledged after it to a crash.
        let more_acked = match queued {
            Some(q) => q.offset == acked && above != q.acked,
            None => self.committed == Some(acked) && above != self.committed_acked,
        };
        let processed = highest(&self.worker.shared, &above, releasing);
        let moved = match queued {
            Some(q) => acked > q.offset && baseline.is_none_or(|c| acked > c),
            None => baseline.is_none_or(|c| acked > c),
        };
        (mark || more_acked || limit_wanted || moved).then(|| CommitOffset {
            tp: tp.clone(),
            offset: acked,
            processed,
            limit: Some(dispatch.propose(acked)),
            acked: above,
        })
    }

    /// A commit before anything is acknowledged: at the first offset read (where the
    /// partition really resumes: the committed offset, or where the start policy or an
    /// out-of-range reset put it), else at the committed one. A new owner's first
    /// commit, before its first call, which only raises the dispatch limit; or a
    /// release's, which says what was handed over unfinished (a first message in its
    /// retry's backoff, or halted).
    fn limit_only(&self, tp: &TopicPartition, releasing: bool) -> Option<CommitOffset> {
        let shared = &self.worker.shared;
        let offset = shared
            .first_offset()
            .or_else(|| shared.dispatch.read())
            .or(self.committed)?;
        // The ranges inherited beside the committed offset stay named while it does.
        let acked = match self.committed == Some(offset) {
            true => self.committed_acked.clone(),
            false => Vec::new(),
        };
        Some(CommitOffset {
            tp: tp.clone(),
            offset,
            processed: highest(shared, &acked, releasing),
            limit: Some(shared.dispatch.propose(offset)),
            acked,
        })
    }
}

/// The metadata's `p=`, so that the ranges `above` (acknowledged, some perhaps inherited
/// from the previous owner) never reach past it: the highest of them, or if higher, on
/// a release the highest offset a processor may have been handed
/// ([`WorkerShared::handed_through`]: what the next owner flags), else the highest
/// acknowledged (the dispatch limit bounds what was handed over).
fn highest(shared: &WorkerShared, above: &[(i64, i64)], releasing: bool) -> Option<i64> {
    let own = match releasing {
        true => shared.handed_through(),
        false => shared.highest_acked(),
    };
    own.max(above.last().map(|r| r.1))
}

/// Whether committing `c` for `p` only marks it released: what it carries is committed
/// already, and nothing handed to the processor at or above the committed offset is left
/// unfinished (a release's `processed` is the highest offset handed over), so not
/// committing it loses no acknowledgement and no message is redelivered.
pub(crate) fn only_the_mark(p: &Owned, c: &CommitOffset) -> bool {
    p.committed == Some(c.offset)
        && p.committed_acked == c.acked
        && c.processed.is_none_or(|handed| handed < c.offset)
}

// The synchronous commit, with each partition's own answer.

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
fn commit_sync<X: Consumer<C>, C: ConsumerContext>(
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

// A commit whose metadata the broker refused as too large: again without it.

/// Commits again at once, without their ranges, the partitions whose metadata with
/// `a=` ranges the broker refused as too large (`offset.metadata.max.bytes`): the
/// offset matters, the ranges only spare redelivery. Halves the budget for ranges so
/// that later commits fit. `ranges` and `answers` are updated in place.
fn without_refused_ranges<X: Consumer<C>, C: ConsumerContext>(
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
fn without_refused_metadata<X: Consumer<C>, C: ConsumerContext>(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::handover::read_metadata;
    use rdkafka::consumer::{BaseConsumer, CommitMode, DefaultConsumerContext};
    use rdkafka::mocking::MockCluster;
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};

    const TOPIC: &str = "t";

    fn tp(partition: i32) -> TopicPartition {
        (Arc::from(TOPIC), partition)
    }

    fn offset(partition: i32, offset: i64) -> CommitOffset {
        CommitOffset {
            tp: tp(partition),
            offset,
            processed: Some(offset - 1),
            limit: Some(offset + 999),
            acked: Vec::new(),
        }
    }

    /// A consumer of group `g` on `bootstrap` that never subscribes, with a coordinator
    /// already found (so that a later slow broker delays only what the test sends).
    fn consumer(bootstrap: &str) -> Arc<BaseConsumer> {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "g")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(TOPIC, 1);
        c.committed_offsets(tpl, Duration::from_secs(30)).unwrap();
        Arc::new(c)
    }

    fn committed_offset(c: &BaseConsumer, partition: i32) -> Offset {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(TOPIC, partition);
        let got = c.committed_offsets(tpl, Duration::from_secs(30)).unwrap();
        let offset = got.elements()[0].offset();
        offset
    }

    /// A fixed deadline `d` from now, as [`Committer::commit`] takes it.
    fn deadline_in(d: Duration) -> impl Fn() -> Instant {
        let at = Instant::now() + d;
        move || at
    }

    fn start(
        mock: &MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    ) -> (Arc<BaseConsumer>, Committer, Arc<CommitMetrics>) {
        mock.create_topic(TOPIC, 2, 1).unwrap();
        let c = consumer(&mock.bootstrap_servers());
        let metrics = Arc::new(CommitMetrics::default());
        let committer = Committer::start::<BaseConsumer, DefaultConsumerContext>(
            Arc::downgrade(&c),
            Arc::new(Mutex::new(Group::default())),
            metrics.clone(),
        )
        .unwrap();
        committer.acquire(&tp(0));
        committer.acquire(&tp(1));
        (c, committer, metrics)
    }

    /// A revoke's commit that waits in the queue past its deadline (the committer thread
    /// busy with a slow commit) is never sent: by its turn the partition is released, and
    /// it would overwrite the next owner's newer offset.
    #[test]
    fn a_commit_given_up_in_the_queue_is_never_sent() {
        let mock = MockCluster::new(1).unwrap();
        let (_c, committer, metrics) = start(&mock);
        let next_owner = consumer(&mock.bootstrap_servers());
        // Every answer of the broker now comes 3 s late (requests are applied at once).
        mock.broker_round_trip_time(1, Duration::from_secs(3))
            .unwrap();
        // A periodic commit of partition 1 holds the committer thread for 3 s...
        committer.periodic(vec![offset(1, 2)]);
        // ... while partition 0's revoke commit waits behind it; its waiter gives up.
        let given_up = committer.commit(
            vec![offset(0, 5)],
            Reason::Revoke,
            &deadline_in(Duration::from_millis(300)),
        );
        assert!(
            matches!(given_up, Err(CommitError::TimedOut)),
            "{given_up:?}"
        );
        // The partition is released, and its next owner commits further.
        committer.release(&[tp(0)]);
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(TOPIC, 0, Offset::Offset(20))
            .unwrap();
        next_owner.commit(&tpl, CommitMode::Sync).unwrap();
        // Everything queued before it has had its turn once this commit is answered.
        committer
            .commit(
                vec![offset(1, 3)],
                Reason::Periodic,
                &deadline_in(Duration::from_secs(60)),
            )
            .unwrap();
        mock.broker_round_trip_time(1, Duration::ZERO).unwrap();
        assert_eq!(committed_offset(&next_owner, 0), Offset::Offset(20));
        assert_eq!(committed_offset(&next_owner, 1), Offset::Offset(3));
        // Sent: the two commits of partition 1; not the one of partition 0.
        assert_eq!(metrics.counts(), (2, 0));
    }

    /// A commit already inside librdkafka cannot be recalled: the release waits for its
    /// answer, so it is never sent after the release returned.
    #[test]
    fn a_release_waits_for_the_commit_being_sent() {
        let mock = MockCluster::new(1).unwrap();
        let (_c, committer, metrics) = start(&mock);
        mock.broker_round_trip_time(1, Duration::from_secs(2))
            .unwrap();
        committer.periodic(vec![offset(0, 5)]);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !committer.shared.lock().sending.contains(&tp(0)) {
            assert!(Instant::now() < deadline, "the commit was never sent");
            std::thread::sleep(Duration::from_millis(1));
        }
        committer.release(&[tp(0)]);
        // Recorded right after the broker answered, before the release could go on.
        assert_eq!(metrics.counts(), (1, 0));
        mock.broker_round_trip_time(1, Duration::ZERO).unwrap();
    }

    /// Commits for a partition assigned again are those of the new assignment only.
    #[test]
    fn a_commit_queued_under_a_previous_assignment_is_not_sent() {
        let mock = MockCluster::new(1).unwrap();
        let (c, committer, metrics) = start(&mock);
        // Long enough that the job below is still queued when the test releases.
        mock.broker_round_trip_time(1, Duration::from_secs(3))
            .unwrap();
        committer.periodic(vec![offset(1, 2)]);
        // Queued behind it, under the first assignment of partition 0.
        let (reply, answer) = mpsc::sync_channel(1);
        committer
            .jobs
            .send(Job {
                offsets: committer.tag(vec![offset(0, 5)]),
                reason: Reason::Periodic,
                deadline: None,
                reply: Some(reply),
            })
            .unwrap();
        committer.release(&[tp(0)]);
        committer.acquire(&tp(0));
        assert!(matches!(
            answer.recv_timeout(Duration::from_secs(60)),
            Ok(Err(CommitError::NotSent))
        ));
        mock.broker_round_trip_time(1, Duration::ZERO).unwrap();
        assert_eq!(committed_offset(&c, 0), Offset::Invalid);
        assert_eq!(metrics.counts(), (1, 0));
    }

    fn committed_metadata(c: &BaseConsumer, partition: i32) -> (Offset, Option<Vec<u8>>) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(TOPIC, partition);
        let got = c.committed_offsets(tpl, Duration::from_secs(30)).unwrap();
        let meta = raw_metadata(&got).remove(0);
        (got.elements()[0].offset(), meta)
    }

    /// Metadata the broker refuses as too large costs the ranges, never the
    /// offset: the partition is committed again at once without them, and later commits
    /// carry ranges within half the refused length.
    #[test]
    fn a_commit_whose_ranges_are_refused_is_committed_without_them() {
        use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
        let mock = MockCluster::new(1).unwrap();
        let (c, committer, metrics) = start(&mock);
        let with_ranges = |offset: i64, acked: Vec<(i64, i64)>| CommitOffset {
            tp: tp(0),
            offset,
            processed: acked.last().map(|r| r.1),
            limit: None,
            acked,
        };
        // 1000 single offsets: the ranges fill the whole budget.
        let many: Vec<(i64, i64)> = (1..=1000).map(|i| (10 + 2 * i, 10 + 2 * i)).collect();
        mock.request_errors(
            RDKafkaApiKey::OffsetCommit,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE],
        );
        committer
            .commit(
                vec![with_ranges(10, many.clone())],
                Reason::Periodic,
                &deadline_in(Duration::from_secs(60)),
            )
            .unwrap();
        assert_eq!(
            committed_metadata(&c, 0),
            (
                Offset::Offset(10),
                Some(b"ackd/3:o=10;p=2010;l=2010;end".to_vec())
            )
        );
        // Refused once, then accepted: counted as one commit that succeeded.
        assert_eq!(metrics.counts(), (1, 0));
        let budget = committer.shared.ranges_budget.load(Ordering::Relaxed);
        assert!(budget <= RANGES_BUDGET / 2 && budget > 0, "{budget}");
        // The next commit carries the lowest ranges within the new budget.
        committer
            .commit(
                vec![with_ranges(10, many)],
                Reason::Periodic,
                &deadline_in(Duration::from_secs(60)),
            )
            .unwrap();
        let (offset, meta) = committed_metadata(&c, 0);
        assert_eq!(offset, Offset::Offset(10));
        let p = read_metadata(&meta.unwrap(), Some(10)).previous.unwrap();
        let skipped = p.acked_above(10);
        assert!(
            skipped.first() == Some(&(12, 12)) && skipped.len() > 10,
            "{skipped:?}"
        );
        assert_eq!(
            skipped,
            (1..=skipped.len() as i64)
                .map(|i| (10 + 2 * i, 10 + 2 * i))
                .collect::<Vec<_>>()
        );
    }

    /// Metadata the broker refuses even without ranges (an
    /// `offset.metadata.max.bytes` below what ackd writes) costs the metadata, never the
    /// offset: committed again at once with none, and none from then on.
    #[test]
    fn a_commit_whose_metadata_is_refused_is_committed_without_any() {
        use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
        let mock = MockCluster::new(1).unwrap();
        let (c, committer, metrics) = start(&mock);
        mock.request_errors(
            RDKafkaApiKey::OffsetCommit,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE],
        );
        let deadline = deadline_in(Duration::from_secs(60));
        committer
            .commit(vec![offset(0, 10)], Reason::Periodic, &deadline)
            .unwrap();
        let (committed, meta) = committed_metadata(&c, 0);
        assert_eq!(committed, Offset::Offset(10));
        assert!(meta.unwrap_or_default().is_empty(), "no metadata");
        assert_eq!(metrics.counts(), (1, 0));
        assert!(committer.shared.lock().bare.contains(&tp(0)));
        committer
            .commit(vec![offset(0, 20)], Reason::Periodic, &deadline)
            .unwrap();
        let (committed, meta) = committed_metadata(&c, 0);
        assert_eq!(committed, Offset::Offset(20));
        assert!(meta.unwrap_or_default().is_empty(), "none from then on");
    }

    #[test]
    fn refusals_for_the_member_put_it_in_doubt_others_do_not() {
        use RDKafkaErrorCode as E;
        let cases = [
            (E::UnknownMemberId, true),
            (E::FencedMemberEpoch, true),
            (E::StaleMemberEpoch, true),
            (E::IllegalGeneration, true),
            (E::RebalanceInProgress, false),
            (E::CoordinatorLoadInProgress, false),
            (E::OffsetMetadataTooLarge, false),
            (E::RequestTimedOut, false),
        ];
        for (code, doubted) in cases {
            assert_eq!(
                doubted_by(&KafkaError::ConsumerCommit(code)),
                doubted,
                "{code:?}"
            );
        }
    }
}
