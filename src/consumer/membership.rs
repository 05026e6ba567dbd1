//! Whether this process is still a member of its group, as far as it can tell.
//!
//! The broker drops a member whose heartbeats stop for its session timeout and gives
//! its partitions to others; the member itself hears of it only at its next heartbeat
//! (under KIP-848 the broker's heartbeat interval, 5 s by default), and librdkafka then
//! revokes its partitions as lost. A process that was stopped (SIGSTOP, a paused VM, a
//! stalled host) past its session wakes up with a full queue of its former partitions'
//! messages and would process them meanwhile, though the new owner has already
//! processed (and committed) them.
//!
//! So the membership is *in doubt* as soon as the process has a sign that it may be
//! gone:
//! - its own clock: a thread that ticks every [`TICK`] saw a gap of [`STALL`] or more
//!   (the whole process did not run: it was stopped or paused);
//! - a periodic commit refused for the member
//!   (`doubted_by` in src/consumer/committer/ledger.rs: UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH,
//!   STALE_MEMBER_EPOCH, ILLEGAL_GENERATION). A revoke's or the
//!   stop's commit retries or gives up on its own (`GroupContext::commit_owned`): its
//!   partitions are released either way.
//!
//! While in doubt every owned partition is held: its worker starts no new processor
//! call (the calls under way finish; their acknowledgements are committed only by a
//! commit the broker accepts, which it refuses to a member it dropped). The committer
//! sends a confirming commit every [`CONFIRM_EVERY`] ([`confirmation_due`]): the
//! offsets acknowledged, or those committed already. The doubt ends with
//! - a commit the broker accepted (`at=membership_confirmed how=commit_accepted`): the
//!   member and its assignment are current, the partitions go on;
//! - an assignment or a revoke that is not lost: librdkafka heard from the group that
//!   this member is in it (`how=rebalance`);
//! - a lost revoke: the partitions were someone else's (`at=revoke_begun lost=true`),
//!   and librdkafka joins again;
//! - with nothing to commit (no partition has an offset yet), after
//!   [`UNCONFIRMABLE_FOR`] without a lost revoke (`how=no_revoke`): librdkafka's
//!   heartbeats would have heard by then that the member is gone.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use tokio::sync::Notify;

use crate::clock::millis;
use crate::consumer::committer::{CommitOffset, CONFIRM_EVERY};
use crate::topic_partition::TopicPartition;

/// How often the stall watch ticks.
const TICK: Duration = Duration::from_millis(100);
/// A gap between two ticks this long means the process did not run: a session may have
/// expired meanwhile. Below the shortest session a broker allows a classic member by
/// default (6 s) less its heartbeat interval (3 s); a false alarm costs one commit's
/// round trip of held partitions.
pub const STALL: Duration = Duration::from_secs(2);
/// With nothing to commit, how long a doubt lasts without a lost revoke.
const UNCONFIRMABLE_FOR: Duration = Duration::from_secs(10);

/// A doubt under way.
#[derive(Debug)]
pub struct Doubt {
    since: Instant,
    /// When the last confirming commit was sent.
    tried: Option<Instant>,
}

/// What put the membership in doubt.
pub enum Cause<'a> {
    /// The process did not run for this long.
    Stalled(Duration),
    /// A commit was refused so.
    Refused(&'a KafkaError),
}

/// What the membership acts on: the partitions owned and the doubt (the consumer's
/// `Group` holds both).
pub trait Members {
    /// The doubt under way, if any.
    fn doubt_slot(&mut self) -> &mut Option<Doubt>;
    /// Whether no partition is owned.
    fn owns_nothing(&self) -> bool;
    /// The partitions owned, in order.
    fn owned_partitions(&self) -> Vec<&TopicPartition>;
    /// Holds every owned partition (nothing new starts), or lifts the hold.
    fn hold_owned(&self, hold: bool);
    /// The offsets of every owned partition that has one: what a confirming commit sends.
    fn confirming(&self) -> Vec<CommitOffset>;
}

/// Puts the membership in doubt (if it is not already): every owned partition is held.
pub fn doubt<G: Members>(group: &mut G, cause: Cause<'_>) {
    if group.doubt_slot().is_some() || group.owns_nothing() {
        return;
    }
    group.hold_owned(true);
    *group.doubt_slot() = Some(Doubt {
        since: Instant::now(),
        tried: None,
    });
    let partitions = partitions(group);
    match cause {
        Cause::Stalled(gap) => tracing::warn!(
            at = "membership_in_doubt",
            reason = "stalled",
            stalled_ms = millis(gap),
            partitions,
            "this process did not run for a while (stopped, paused): its session may have expired and its partitions moved; they are held (nothing new starts) until a commit is accepted or the group revokes them"
        ),
        Cause::Refused(error) => tracing::warn!(
            at = "membership_in_doubt",
            reason = "commit_refused",
            error = %error,
            partitions,
            "the broker refused a commit for this member: its partitions may be another's; they are held (nothing new starts) until a commit is accepted or the group revokes them"
        ),
    }
}

/// The membership is proven (`how`): the held partitions go on.
pub fn confirmed<G: Members>(group: &mut G, how: &str) {
    let Some(doubt) = group.doubt_slot().take() else {
        return;
    };
    group.hold_owned(false);
    tracing::info!(
        at = "membership_confirmed",
        how,
        in_doubt_ms = millis(doubt.since.elapsed()),
        partitions = partitions(group),
    );
}

/// A commit sent at `sent_at` was accepted: it proves the membership if it was sent
/// after the doubt began (one sent before a stall may have been answered before it).
pub fn confirmed_by_commit<G: Members>(group: &mut G, sent_at: Instant) {
    if group
        .doubt_slot()
        .as_ref()
        .is_some_and(|d| d.since <= sent_at)
    {
        confirmed(group, "commit_accepted");
    }
}

/// The doubt ends without a proof: the partitions were revoked as lost.
pub fn ended<G: Members>(group: &mut G) {
    if group.owns_nothing() {
        *group.doubt_slot() = None;
    }
}

/// In doubt, when a confirming commit is due: what it sends (the offsets of every owned
/// partition that has one). Ends a doubt that nothing can confirm after
/// [`UNCONFIRMABLE_FOR`].
pub fn confirmation_due<G: Members>(group: &mut G) -> Option<Vec<CommitOffset>> {
    let now = Instant::now();
    let doubt = group.doubt_slot().as_ref()?;
    if doubt.tried.is_some_and(|t| now < t + CONFIRM_EVERY) {
        return None;
    }
    let since = doubt.since;
    let offsets = group.confirming();
    if offsets.is_empty() {
        if now >= since + UNCONFIRMABLE_FOR {
            confirmed(group, "no_revoke");
        }
        return None;
    }
    if let Some(d) = group.doubt_slot().as_mut() {
        d.tried = Some(now);
    }
    Some(offsets)
}

/// Starts the thread that watches for stalls of the whole process; it ends with the
/// group.
pub fn watch_stalls<G: Members + Send + 'static>(group: Weak<Mutex<G>>) -> std::io::Result<()> {
    watched();
    std::thread::Builder::new()
        .name("ackd-stall-watch".into())
        .spawn(move || {
            let mut last = Instant::now();
            loop {
                std::thread::sleep(TICK);
                let now = Instant::now();
                let gap = now.saturating_duration_since(last);
                last = now;
                let Some(group) = group.upgrade() else {
                    // No watch, no stall to wait for (another group's watch, if any,
                    // sets it again at its next tick).
                    WATCHED_MS.store(0, Ordering::Release);
                    ticks().notify_waiters();
                    return;
                };
                if gap >= STALL {
                    doubt(&mut *lock(&group), Cause::Stalled(gap));
                }
                // Only now: a worker that saw the stall first waits for the hold.
                watched();
            }
        })
        .map(|_| ())
}

/// When the stall watch last ticked, on [`coarse_ms`]; 0: it does not run.
static WATCHED_MS: AtomicU64 = AtomicU64::new(0);

fn ticks() -> &'static Notify {
    static TICKS: OnceLock<Notify> = OnceLock::new();
    TICKS.get_or_init(Notify::new)
}

/// The stall watch ticked, after putting the membership in doubt if it saw a stall.
fn watched() {
    WATCHED_MS.store(coarse_ms(), Ordering::Release);
    ticks().notify_waiters();
}

/// Whether the stall watch is overdue by [`STALL`]: the process was stopped and the
/// watch has not run since it woke. Read before every message (an atomic load and a
/// coarse clock read): a worker that wakes before the watch starts nothing until the
/// watch has held the partitions.
#[inline]
pub fn stall_unseen() -> bool {
    let watched = WATCHED_MS.load(Ordering::Acquire);
    watched != 0 && coarse_ms().saturating_sub(watched) >= STALL.as_millis() as u64
}

/// Resolves once the stall watch has seen the stall (at once if none is unseen).
pub async fn stall_seen() {
    loop {
        let notified = ticks().notified();
        tokio::pin!(notified);
        // Registered before the check: a tick in between still wakes us.
        notified.as_mut().enable();
        if !stall_unseen() {
            return;
        }
        notified.await;
    }
}

/// A monotonic clock in ms, cheap enough to read per message: Linux's coarse one (a
/// few ms of resolution, no system call).
#[inline]
fn coarse_ms() -> u64 {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec for the call to fill.
        if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } == 0 {
            return (ts.tv_sec as u64) * 1000 + (ts.tv_nsec as u64) / 1_000_000;
        }
    }
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

fn lock<G>(group: &Mutex<G>) -> MutexGuard<'_, G> {
    group.lock().unwrap_or_else(|e| e.into_inner())
}

/// `topic/partition,...` of the owned partitions.
fn partitions<G: Members>(group: &G) -> String {
    group
        .owned_partitions()
        .into_iter()
        .map(|(t, p)| format!("{t}/{p}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::group::Group;

    fn in_doubt_since(since: Instant) -> Group {
        let mut group = Group::default();
        group.doubt = Some(Doubt { since, tried: None });
        group
    }

    #[test]
    fn only_a_commit_sent_after_the_doubt_began_confirms_the_membership() {
        let began = Instant::now();
        let mut group = in_doubt_since(began);
        confirmed_by_commit(&mut group, began - Duration::from_millis(1));
        assert!(group.doubt.is_some(), "sent before the stall: no proof");
        confirmed_by_commit(&mut group, began);
        assert!(
            group.doubt.is_none(),
            "sent since: the membership is proven"
        );
    }

    #[test]
    fn with_nothing_to_commit_a_doubt_ends_only_after_its_time() {
        let mut group = in_doubt_since(Instant::now());
        assert_eq!(confirmation_due(&mut group), None);
        assert!(group.doubt.is_some(), "nothing can confirm it yet");
        let mut group = in_doubt_since(Instant::now() - UNCONFIRMABLE_FOR);
        assert_eq!(confirmation_due(&mut group), None);
        assert!(group.doubt.is_none(), "no lost revoke came: it ends");
    }

    #[test]
    fn a_process_that_owns_nothing_has_nothing_to_doubt() {
        let mut group = Group::default();
        doubt(&mut group, Cause::Stalled(STALL));
        assert!(group.doubt.is_none());
        let mut group = in_doubt_since(Instant::now());
        ended(&mut group);
        assert!(
            group.doubt.is_none(),
            "revoked as lost: nothing left in doubt"
        );
    }
}
