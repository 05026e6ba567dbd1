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
//! the others' commit a failure (see [`sync_commit::commit_sync`]).
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
//! the process halves its budget for ranges ([`shared::RANGES_BUDGET`]) each time, so it
//! soon writes what the broker keeps.
//!
//! One concept a file: what a commit is (commit.rs), the handle and its thread
//! ([`Committer`], thread.rs), one job on that thread (job.rs), the synchronous commit
//! (sync_commit.rs) and its retry without ranges (refused_ranges.rs), what the handle
//! and the thread share (shared.rs), and the ledger the committer records in
//! ([`CommitLedger`], ledger.rs).

mod commit;
mod job;
mod ledger;
mod refused_ranges;
mod shared;
mod sync_commit;
mod thread;

pub(crate) use commit::{CommitError, CommitOffset, Reason};
pub(crate) use ledger::{Accepted, CommitLedger, Limit, CONFIRM_EVERY};
pub(crate) use thread::Committer;
