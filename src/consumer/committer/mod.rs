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
//! Each commit carries metadata `ackd/2:o=O;p=H;end` ([`metadata`]): the offset committed,
//! the highest offset this process had acknowledged on that partition, and `;r` when it
//! is a revoke's or a stop's commit, after which this process processes nothing more of
//! the partition. The next
//! owner reads it back: after a release it knows exactly how much it redelivers; after a
//! periodic commit (the owner crashed, or was fenced or lost the partition, before
//! releasing it) it cannot, because what was processed after that commit left no trace.
//!
//! With concurrent ordering, the metadata also lists the offsets acknowledged above the
//! committed one (`;a=2-4,7`, relative to it: see [`crate::consumer::acked_ranges`]), which
//! the next owner skips, only beside the offset `o=` names ([`read_metadata`]). A broker that refuses the metadata as too large
//! (`offset.metadata.max.bytes`) gets that partition's commit again at once without the
//! ranges (`at=commit_metadata_dropped`): the offset is committed and those messages are
//! redelivered after a crash, as without the ranges; the process halves its budget for
//! ranges ([`RANGES_BUDGET`]) each time, so it soon writes what the broker keeps.

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::{IsError, KafkaError};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use crate::clock::millis;
use crate::consumer::acked_ranges;
use crate::output::metrics::CommitMetrics;
use crate::topic_partition::TopicPartition;

/// What to commit for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitOffset {
    pub tp: TopicPartition,
    /// The next offset to read.
    pub offset: i64,
    /// The highest offset acknowledged, for the metadata.
    pub processed: Option<i64>,
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

struct Job {
    /// Each offset with the epoch of the assignment it was queued under (0: not owned).
    offsets: Vec<(CommitOffset, u64)>,
    reason: Reason,
    /// When the waiter gives up: a job still queued then is dropped, never sent.
    deadline: Option<Instant>,
    reply: Option<mpsc::SyncSender<Result<(), CommitError>>>,
}

/// The partitions commits may be sent for; see the module's documentation.
#[derive(Default)]
struct Ownership {
    /// Owned partitions and the epoch of their current assignment.
    owned: HashMap<TopicPartition, u64>,
    last_epoch: u64,
    /// The partitions of the commit being sent right now (inside librdkafka).
    sending: Vec<TopicPartition>,
}

struct Shared {
    ownership: Mutex<Ownership>,
    /// Notified when a send ends.
    sent: Condvar,
    /// The most bytes of `a=` ranges a commit's metadata carries: lowered each time
    /// the broker refuses metadata with ranges as too large.
    ranges_budget: AtomicUsize,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            ownership: Mutex::default(),
            sent: Condvar::new(),
            ranges_budget: AtomicUsize::new(RANGES_BUDGET),
        }
    }
}

/// The bytes of `a=` ranges a commit carries at first (see [`acked_ranges::MAX_BYTES`]).
pub const RANGES_BUDGET: usize = acked_ranges::MAX_BYTES;

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Ownership> {
        self.ownership.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The version of the metadata format this ackd writes, and the only one whose ranges
/// it trusts. A later format (new fields) bumps it: see [`metadata`].
pub const METADATA_VERSION: u32 = 2;

/// The metadata a commit of `offset` carries, and how it is read back: `ackd/2:o=O;p=H`
/// (`O` the offset committed, `H` the highest offset processed), then `;a=R` (`acked`:
/// the [`acked_ranges::encode`]d ranges, if any), then `;r` for a release, then `;end`.
///
/// Grammar: `ackd/V:` then fields separated by `;`, the last one `end`. `V` is the
/// format's version: a reader reads only its own version, so a field is added by
/// bumping it (an older ackd then skips nothing, never something wrong). Names are one
/// letter: the metadata is bounded (and some brokers keep little). `o=` is
/// the offset committed with this metadata: ranges are relative to it, and a reader
/// trusts them only beside that very offset (a tool that moves an offset and keeps its
/// metadata, as MirrorMaker 2's offset sync does, leaves them meaningless). `end` marks
/// the string whole: one cut short (by a broker, a tool) is not read as fewer ranges.
pub fn metadata(
    offset: i64,
    processed: Option<i64>,
    acked: Option<&str>,
    reason: Reason,
) -> String {
    let Some(h) = processed else {
        return String::new();
    };
    let mut m = format!("ackd/{METADATA_VERSION}:o={offset};p={h}");
    if let Some(r) = acked {
        m.push_str(";a=");
        m.push_str(r);
    }
    if reason.releases() {
        m.push_str(";r");
    }
    m.push_str(";end");
    m
}

/// What a commit's metadata is, read beside the offset it was committed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataState {
    /// No metadata.
    Absent,
    /// This ackd's format, written beside this very offset: its ranges are skipped.
    Current,
    /// This ackd's format written beside another offset (the metadata was copied or the
    /// offset moved by a tool): nothing is skipped.
    Stale,
    /// An older ackd's format (`ackd:processed=`), which does not say which offset it
    /// was written beside: nothing is skipped.
    OldFormat,
    /// A later ackd's format (`ackd/N:`, N above [`METADATA_VERSION`]): nothing is
    /// skipped.
    NewerFormat,
    /// Anything else: another client's, or ackd's damaged (cut short, malformed).
    Foreign,
}

impl MetadataState {
    /// As logged (`metadata=`).
    pub fn as_str(self) -> &'static str {
        match self {
            MetadataState::Absent => "none",
            MetadataState::Current => "current",
            MetadataState::Stale => "stale",
            MetadataState::OldFormat => "old_format",
            MetadataState::NewerFormat => "newer_format",
            MetadataState::Foreign => "foreign",
        }
    }
}

/// What a commit's metadata written by [`metadata`] says about the process that made it,
/// once it is known to describe the offset beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Previous {
    /// The highest offset it had processed when it committed.
    pub processed: i64,
    /// It committed on releasing the partition: it processed nothing after.
    pub released: bool,
    /// The offsets it had acknowledged above the committed one, relative to it
    /// (`(1, 1)` is the committed offset + 1), as [`acked_ranges::decode`] read them.
    acked: Vec<(i64, i64)>,
}

impl Previous {
    /// The acknowledged offsets above `committed` (the offset this metadata was
    /// committed with), inclusive ranges, ascending; none if they reach above
    /// `processed`, which no ackd writes.
    pub fn acked_above(&self, committed: i64) -> Vec<(i64, i64)> {
        let shifted: Option<Vec<_>> = self
            .acked
            .iter()
            .map(|&(a, b)| Some((committed.checked_add(a)?, committed.checked_add(b)?)))
            .collect();
        shifted
            .filter(|r| r.last().is_none_or(|&(_, b)| b <= self.processed))
            .unwrap_or_default()
    }

    /// How many messages come again after this release at `committed`, having skipped
    /// `skipped`: `processed + 1 - committed - skipped`, at least 0; `None` when the
    /// broker-supplied numbers overflow (they are anyone's to write).
    pub fn redelivery(&self, committed: i64, skipped: i64) -> Option<i64> {
        let n = self
            .processed
            .checked_add(1)?
            .checked_sub(committed)?
            .checked_sub(skipped)?;
        Some(n.max(0))
    }
}

/// Commit metadata as read: what it is, and what it says when it is ackd's own,
/// written beside the offset it sits beside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadMetadata {
    pub state: MetadataState,
    /// `Some` exactly when `state` is [`MetadataState::Current`].
    pub previous: Option<Previous>,
}

/// Reads the metadata `raw` found beside the committed offset `committed` (`None`: no
/// offset committed). Its ranges are trusted only when it is this version's and was
/// written beside `committed`; anything doubtful skips nothing: the worst case is
/// redelivery, never loss. Trailing NUL bytes (some clients store the metadata
/// NUL-terminated) are not part of it.
pub fn read_metadata(raw: &[u8], committed: Option<i64>) -> ReadMetadata {
    let (state, previous) = match parse_metadata(trim_trailing_nuls(raw)) {
        Parsed::Absent => (MetadataState::Absent, None),
        Parsed::OldFormat => (MetadataState::OldFormat, None),
        Parsed::Newer => (MetadataState::NewerFormat, None),
        Parsed::Foreign => (MetadataState::Foreign, None),
        Parsed::Ackd { base, previous } if Some(base) == committed => {
            (MetadataState::Current, Some(previous))
        }
        Parsed::Ackd { .. } => (MetadataState::Stale, None),
    };
    ReadMetadata { state, previous }
}

fn trim_trailing_nuls(raw: &[u8]) -> &[u8] {
    let end = raw.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    &raw[..end]
}

/// Commit metadata, parsed but not yet compared with the offset beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Parsed {
    Absent,
    /// This version's, written beside `base`.
    Ackd {
        base: i64,
        previous: Previous,
    },
    OldFormat,
    Newer,
    Foreign,
}

/// Parses metadata written by [`metadata`], strictly: the fields in the order written,
/// each at most once, `end` last. Ranges that are malformed, or reach above `processed`
/// (which no ackd writes), are ignored: no skip is better than a wrong one. Metadata is
/// bytes to Kafka: another client's may be anything, UTF-8 or not.
fn parse_metadata(metadata: &[u8]) -> Parsed {
    if metadata.is_empty() {
        return Parsed::Absent;
    }
    if metadata.starts_with(b"ackd:processed=") {
        return Parsed::OldFormat;
    }
    let Some(rest) = metadata.strip_prefix(b"ackd/") else {
        return Parsed::Foreign;
    };
    let Some((version, fields)) = std::str::from_utf8(rest)
        .ok()
        .and_then(|r| r.split_once(':'))
    else {
        return Parsed::Foreign;
    };
    match version.parse::<u32>() {
        Ok(v) if v == METADATA_VERSION && canonical_number(version) => {
            parse_fields(fields).map_or(Parsed::Foreign, |(base, previous)| Parsed::Ackd {
                base,
                previous,
            })
        }
        Ok(v) if v > METADATA_VERSION && canonical_number(version) => Parsed::Newer,
        _ => Parsed::Foreign,
    }
}

/// The fields of this version: `o=O;p=H[;a=R][;r];end`.
fn parse_fields(fields: &str) -> Option<(i64, Previous)> {
    let mut fields = fields.split(';');
    let base = signed(fields.next()?.strip_prefix("o=")?)?;
    let processed = signed(fields.next()?.strip_prefix("p=")?)?;
    let mut next = fields.next()?;
    let acked = match next.strip_prefix("a=") {
        Some(value) => {
            next = fields.next()?;
            // Malformed ranges: none are skipped, the rest still reads.
            acked_ranges::decode(0, value)
        }
        None => Vec::new(),
    };
    let released = next == "r";
    if released {
        next = fields.next()?;
    }
    (base >= 0 && next == "end" && fields.next().is_none()).then_some((
        base,
        Previous {
            processed,
            released,
            acked,
        },
    ))
}

/// A decimal number as [`metadata`] writes it (an optional `-`, no leading zero).
fn signed(s: &str) -> Option<i64> {
    canonical_number(s.strip_prefix('-').unwrap_or(s))
        .then(|| s.parse().ok())
        .flatten()
}

fn canonical_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()) && (s == "0" || !s.starts_with('0'))
}

/// Each partition of `tpl` (committed offsets, as librdkafka returned them) with its
/// offset and what its metadata says beside it. Reads the metadata as the bytes it is:
/// rust-rdkafka's `metadata()` panics when they are not UTF-8.
pub fn committed_with_metadata(
    tpl: &TopicPartitionList,
) -> Vec<(TopicPartition, Offset, ReadMetadata)> {
    tpl.elements()
        .iter()
        .zip(raw_metadata(tpl))
        .map(|(e, raw)| {
            let committed = match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            };
            let read = read_metadata(raw.as_deref().unwrap_or_default(), committed);
            ((Arc::from(e.topic()), e.partition()), e.offset(), read)
        })
        .collect()
}

/// Each element's metadata bytes (`None`: empty), in the order of `tpl.elements()`.
fn raw_metadata(tpl: &TopicPartitionList) -> Vec<Option<Vec<u8>>> {
    // SAFETY: `tpl` owns its list for the duration of the borrow; `elements()` and the
    // raw array are the same `cnt` elements in the same order, and each element's
    // metadata is `metadata_size` bytes at `metadata` (or null).
    unsafe {
        let list = &*tpl.ptr();
        (0..usize::try_from(list.cnt).unwrap_or(0))
            .map(|i| {
                let e = &*list.elems.add(i);
                if e.metadata.is_null() || e.metadata_size == 0 {
                    return None;
                }
                Some(std::slice::from_raw_parts(e.metadata.cast::<u8>(), e.metadata_size).to_vec())
            })
            .collect()
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

/// How often a confirming commit is sent while the membership is in doubt
/// (src/consumer/membership.rs).
pub const CONFIRM_EVERY: Duration = Duration::from_millis(500);

/// Whether a commit refused with `error` means the member may no longer own its
/// partitions: the broker does not know it (its session expired), fenced it, or knows
/// a newer epoch or generation of the group than it does.
pub fn doubted_by(error: &KafkaError) -> bool {
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

/// What the committer reads from and records in the group it commits for (the
/// consumer's `Group`, which keeps the membership: src/consumer/membership.rs).
pub trait CommitLedger: Send + 'static {
    /// Starts the thread that watches for stalls of the whole process; it ends with the
    /// ledger.
    fn watch_stalls(ledger: Weak<Mutex<Self>>) -> std::io::Result<()>
    where
        Self: Sized;
    /// In doubt, when a confirming commit is due: what it sends.
    fn confirmation_due(&mut self) -> Option<Vec<CommitOffset>>;
    /// The broker accepted `c` (`released`: by a release; `with_ranges`: its `a=` ranges
    /// were committed with it): what the group has for its partition, if still owned.
    fn accepted(&mut self, c: &CommitOffset, released: bool, with_ranges: bool);
    /// A commit sent at `sent_at` was accepted: it may prove the membership.
    fn confirmed_by_commit(&mut self, sent_at: Instant);
    /// A periodic or confirming commit was refused with `error`, [`doubted_by`] it: the
    /// membership is in doubt.
    fn doubted(&mut self, error: &KafkaError);
}

/// How often [`Committer::commit`] reads its deadline again while it waits.
const DEADLINE_CHECK: Duration = Duration::from_millis(50);

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
    pub fn start<X, C, G: CommitLedger>(
        consumer: Weak<X>,
        group: Arc<Mutex<G>>,
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
        G::watch_stalls(Arc::downgrade(&group))?;
        std::thread::Builder::new()
            .name("ackd-committer".into())
            .spawn(move || loop {
                // Woken at least every CONFIRM_EVERY: while the membership is in doubt,
                // this thread sends the commits that can prove it.
                match rx.recv_timeout(CONFIRM_EVERY) {
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
        }
    }

    fn tag(&self, offsets: Vec<CommitOffset>) -> Vec<(CommitOffset, u64)> {
        tag(&self.shared, offsets)
    }

    /// Queues a periodic commit unless one is already waiting (the next one will carry
    /// newer offsets anyway).
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
/// ([`CommitLedger::confirmation_due`]), sent and accounted for as any other. The
/// consumer is upgraded only then: this thread must not hold it past the supervisor's
/// close.
fn confirm_if_due<X: Consumer<C>, C: ConsumerContext, G: CommitLedger>(
    consumer: &Weak<X>,
    shared: &Shared,
    group: &Mutex<G>,
    metrics: &CommitMetrics,
) {
    let due = group
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .confirmation_due();
    let (Some(offsets), Some(consumer)) = (due, consumer.upgrade()) else {
        return;
    };
    let job = Job {
        offsets: tag(shared, offsets),
        reason: Reason::Confirm,
        deadline: None,
        reply: None,
    };
    let _ = run(&*consumer, &job, shared, group, metrics);
}

/// One job on the committer thread: drop what may no longer be sent, send the rest,
/// account for each partition's answer.
fn run<X: Consumer<C>, C: ConsumerContext, G: CommitLedger>(
    consumer: &X,
    job: &Job,
    shared: &Shared,
    group: &Mutex<G>,
    metrics: &CommitMetrics,
) -> Result<(), CommitError> {
    let reason = job.reason.as_str();
    // Decided and marked under the lock `release` takes: no release completes between
    // the check and the send.
    let (to_send, dropped, why) = {
        let mut o = shared.lock();
        let (to_send, dropped, why): (Vec<&CommitOffset>, Vec<&CommitOffset>, _) =
            if job.deadline.is_some_and(|d| Instant::now() >= d) {
                let all = job.offsets.iter().map(|(c, _)| c).collect();
                (
                    Vec::new(),
                    all,
                    "not sent: the deadline passed before its turn",
                )
            } else {
                let (send, drop): (Vec<_>, Vec<_>) = job
                    .offsets
                    .iter()
                    .partition(|(c, epoch)| o.owned.get(&c.tp) == Some(epoch));
                (
                    send.into_iter().map(|(c, _)| c).collect(),
                    drop.into_iter().map(|(c, _)| c).collect(),
                    "not sent: the partition was released before its turn",
                )
            };
        o.sending = to_send.iter().map(|c| c.tp.clone()).collect();
        (to_send, dropped, why)
    };
    // A confirming commit only asks; one for a partition released meanwhile is moot.
    for c in dropped.iter().filter(|_| job.reason != Reason::Confirm) {
        tracing::error!(
            at = "commit_failed",
            topic = &*c.tp.0,
            partition = c.tp.1,
            offset = c.offset,
            reason,
            error = why,
            "not committed: if the partition moves or the process stops first, messages from the last committed offset are redelivered"
        );
    }
    if to_send.is_empty() {
        return if dropped.is_empty() {
            Ok(())
        } else {
            Err(CommitError::NotSent)
        };
    }
    let started = Instant::now();
    let budget = shared.ranges_budget.load(Ordering::Relaxed);
    let mut ranges: Vec<Option<String>> = to_send
        .iter()
        .map(|c| acked_ranges::encode(c.offset, &c.acked, budget))
        .collect();
    let mut answers = commit_sync(consumer, &to_send, &ranges, job.reason);
    without_refused_ranges(
        consumer,
        &to_send,
        &mut ranges,
        &mut answers,
        job.reason,
        shared,
    );
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
        account(&mut *group, &answered, &to_send, &ranges, answers)
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
    ranges: &[Option<String>],
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
                group.accepted(c, answered.reason.releases(), ranges[i].is_some());
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

/// Commits again at once, without their ranges, the partitions whose metadata with
/// `a=` ranges the broker refused as too large (`offset.metadata.max.bytes`): the
/// offset matters, the ranges only spare redelivery. Halves the budget for ranges so
/// that later commits fit. `ranges` and `answers` are updated in place.
fn without_refused_ranges<X: Consumer<C>, C: ConsumerContext>(
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

/// Commits `offsets` synchronously, each with its `ranges` in the metadata; returns each
/// partition's answer, in order.
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
    reason: Reason,
) -> Vec<Result<(), KafkaError>> {
    let mut tpl = TopicPartitionList::with_capacity(offsets.len());
    let mut sent = Vec::with_capacity(offsets.len());
    for (c, r) in offsets.iter().zip(ranges) {
        let mut e = tpl.add_partition(&c.tp.0, c.tp.1);
        // Offsets come from the tracker: always >= 0, so this cannot fail.
        let _ = e.set_offset(Offset::Offset(c.offset));
        let m = metadata(c.offset, c.processed, r.as_deref(), reason);
        e.set_metadata(m.clone());
        sent.push(m);
    }
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
    if !overall.is_error() {
        return offsets.iter().map(|_| Ok(())).collect();
    }
    let accepted: Vec<bool> = if offsets.len() > 1 && partition_scoped(overall.into()) {
        match consumer.committed_offsets(tpl, READ_BACK_TIMEOUT) {
            // With ranges, the metadata too: a commit of the offset already committed
            // with new ranges is accepted only if they are there (else it is retried
            // without them). A release mark refused alone leaves the offset committed,
            // which is what counts.
            Ok(now) => {
                let elements = now.elements();
                let now: Vec<_> = elements.iter().zip(raw_metadata(&now)).collect();
                offsets
                    .iter()
                    .zip(sent.iter().zip(ranges))
                    .map(|(c, (m, r))| {
                        now.iter().any(|(e, got)| {
                            e.topic() == &*c.tp.0
                                && e.partition() == c.tp.1
                                && e.offset() == Offset::Offset(c.offset)
                                && (r.is_none()
                                    || got.as_deref().unwrap_or_default() == m.as_bytes())
                        })
                    })
                    .collect()
            }
            Err(e) => {
                tracing::warn!(at = "commit_unknown", error = %e, "could not read back which partitions the refused commit committed: all are counted as not committed");
                vec![false; offsets.len()]
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::group::Group;
    use rdkafka::consumer::{BaseConsumer, CommitMode, DefaultConsumerContext};
    use rdkafka::mocking::MockCluster;
    use rdkafka::ClientConfig;

    const TOPIC: &str = "t";

    fn tp(partition: i32) -> TopicPartition {
        (Arc::from(TOPIC), partition)
    }

    fn offset(partition: i32, offset: i64) -> CommitOffset {
        CommitOffset {
            tp: tp(partition),
            offset,
            processed: Some(offset - 1),
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
        let committer = Committer::start::<BaseConsumer, DefaultConsumerContext, Group>(
            Arc::downgrade(&c),
            Arc::new(Mutex::new(Group::default())),
            metrics.clone(),
        )
        .unwrap();
        committer.acquire(&tp(0));
        committer.acquire(&tp(1));
        (c, committer, metrics)
    }

    /// Issue 13, item 8: a revoke's commit that waited in the queue past its deadline (the
    /// committer thread was busy with a slow commit) was sent once its turn came, after
    /// the partition had been released, and overwrote the next owner's newer offset.
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

    #[test]
    fn metadata_round_trips_and_ignores_foreign_metadata() {
        let read = |processed, released| ReadMetadata {
            state: MetadataState::Current,
            previous: Some(Previous {
                processed,
                released,
                acked: Vec::new(),
            }),
        };
        let written = |reason| metadata(30, Some(41), None, reason);
        assert_eq!(written(Reason::Periodic), "ackd/2:o=30;p=41;end");
        assert_eq!(
            read_metadata(written(Reason::Periodic).as_bytes(), Some(30)),
            read(41, false)
        );
        assert_eq!(
            read_metadata(written(Reason::Shutdown).as_bytes(), Some(30)),
            read(41, true)
        );
        assert_eq!(
            read_metadata(written(Reason::Revoke).as_bytes(), Some(30)),
            read(41, true)
        );
        assert_eq!(metadata(30, None, None, Reason::Shutdown), "");
        let state = |m: &[u8], committed| read_metadata(m, committed).state;
        assert_eq!(state(b"", Some(30)), MetadataState::Absent);
        // Beside another offset than it was written with, or none.
        assert_eq!(
            state(written(Reason::Revoke).as_bytes(), Some(5)),
            MetadataState::Stale
        );
        assert_eq!(
            state(written(Reason::Revoke).as_bytes(), None),
            MetadataState::Stale
        );
        // An older ackd's metadata, a later one's, another client's, damaged ones.
        assert_eq!(
            state(b"ackd:processed=41;released", Some(30)),
            MetadataState::OldFormat
        );
        assert_eq!(
            state(b"ackd/3:whatever=1;end", Some(30)),
            MetadataState::NewerFormat
        );
        assert_eq!(state(b"ackd/12:x", Some(30)), MetadataState::NewerFormat);
        for foreign in [
            &b"written by another tool"[..],
            b"\xff\xfe\x00binary",
            b"ackd/2:o=30;p=\xff;end",
            b"ackd/1:o=30;p=41;end",
            b"ackd/02:o=30;p=41;end",
            b"ackd/x:o=30;p=41;end",
            b"ackd/2:p=41;o=30;end",
            b"ackd/2:o=30;p=41;r;a=1;end",
            b"ackd/2:o=30;p=41;r;r;end",
            b"ackd/2:o=30;p=41;end;",
            b"ackd/2:o=30;p=41;end\0x",
            b"ackd/2:o=-1;p=41;end",
            b"ackd/2:o=030;p=41;end",
            b"ackd/2:o=30;p=41;x=1;end",
        ] {
            assert_eq!(
                state(foreign, Some(30)),
                MetadataState::Foreign,
                "{}",
                String::from_utf8_lossy(foreign)
            );
        }
    }

    /// Issue 19, items 1 and 2: metadata cut short never reads as fewer ranges, and
    /// trailing NULs (some clients NUL-terminate what they store) are not part of it.
    #[test]
    fn cut_short_metadata_skips_nothing_and_trailing_nuls_are_trimmed() {
        let m = metadata(100, Some(115), Some("2-4,7,9-15"), Reason::Revoke);
        assert_eq!(m, "ackd/2:o=100;p=115;a=2-4,7,9-15;r;end");
        for cut in 0..m.len() {
            let read = read_metadata(&m.as_bytes()[..cut], Some(100));
            assert_eq!(read.previous, None, "{:?}", &m[..cut]);
        }
        let mut nul = m.clone().into_bytes();
        nul.extend_from_slice(b"\0\0");
        assert_eq!(
            read_metadata(&nul, Some(100)),
            read_metadata(m.as_bytes(), Some(100))
        );
        let read = read_metadata(&nul, Some(100)).previous.unwrap();
        assert!(read.released);
        assert_eq!(
            read.acked_above(100),
            vec![(102, 104), (107, 107), (109, 115)]
        );
        // An older ackd's NUL-terminated metadata is still an older ackd's.
        assert_eq!(
            read_metadata(b"ackd:processed=29;acked=1-9;released\0", Some(5)).state,
            MetadataState::OldFormat
        );
        assert_eq!(read_metadata(b"\0", Some(5)).state, MetadataState::Absent);
    }

    /// Issue 14: the offsets acknowledged above the commit, relative to it, read back
    /// as absolute offsets for the offset they were committed with.
    #[test]
    fn acked_ranges_round_trip_and_anything_doubtful_skips_nothing() {
        let read = |m: &[u8], committed| read_metadata(m, Some(committed)).previous.unwrap();
        let m = metadata(100, Some(115), Some("2-4,7,9-15"), Reason::Revoke);
        let p = read(m.as_bytes(), 100);
        assert_eq!((p.processed, p.released), (115, true));
        assert_eq!(p.acked_above(100), vec![(102, 104), (107, 107), (109, 115)]);
        let periodic = read(b"ackd/2:o=100;p=107;a=2-4,7;end", 100);
        assert!(!periodic.released);
        assert_eq!(periodic.acked_above(100), vec![(102, 104), (107, 107)]);
        // Nothing to skip: malformed ranges, ranges above the highest processed offset
        // (no ackd writes that), an overflow.
        for doubtful in [
            &b"ackd/2:o=100;p=115;a=2-4,3;end"[..],
            b"ackd/2:o=100;p=115;a=0-4;end",
            b"ackd/2:o=100;p=115;a=;end",
            b"ackd/2:o=100;p=103;a=2-4;end",
            b"ackd/2:o=100;p=115;a=x;r;end",
        ] {
            assert_eq!(
                read(doubtful, 100).acked_above(100),
                vec![],
                "{}",
                String::from_utf8_lossy(doubtful)
            );
        }
        assert!(read(b"ackd/2:o=100;p=115;a=x;r;end", 100).released);
        assert_eq!(
            read_metadata(b"ackd/2:o=100;p=115;a=2;a=4;end", Some(100)).state,
            MetadataState::Foreign
        );
        let top = i64::MAX - 2;
        let m = format!("ackd/2:o={top};p=9223372036854775807;a=5;end");
        assert_eq!(read(m.as_bytes(), top).acked_above(top), vec![]);
    }

    /// Issue 19, item 1: the redelivery a release implies, from numbers anyone can write.
    #[test]
    fn redelivery_from_broker_supplied_numbers_never_overflows() {
        let p = |processed| Previous {
            processed,
            released: true,
            acked: Vec::new(),
        };
        assert_eq!(p(29).redelivery(5, 9), Some(16));
        assert_eq!(p(3).redelivery(5, 0), Some(0));
        assert_eq!(p(i64::MAX).redelivery(0, 0), None);
        assert_eq!(p(i64::MIN).redelivery(2, 0), None);
        assert_eq!(p(0).redelivery(i64::MIN, 0), None);
        assert_eq!(p(-5).redelivery(100, 0), Some(0));
        assert_eq!(p(10).redelivery(0, i64::MIN), None);
        assert_eq!(p(10).redelivery(0, i64::MAX), Some(0));
    }

    fn committed_metadata(c: &BaseConsumer, partition: i32) -> (Offset, Option<Vec<u8>>) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(TOPIC, partition);
        let got = c.committed_offsets(tpl, Duration::from_secs(30)).unwrap();
        let meta = raw_metadata(&got).remove(0);
        (got.elements()[0].offset(), meta)
    }

    /// Issue 14: metadata the broker refuses as too large costs the ranges, never the
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
            (Offset::Offset(10), Some(b"ackd/2:o=10;p=2010;end".to_vec()))
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
}
