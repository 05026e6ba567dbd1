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
//! - its lease lapsed ([`Lease`]): the group coordinator has not answered for most of
//!   the session timeout (a network cut: nothing answers, nothing is closed, and under
//!   KIP-848 librdkafka revokes nothing until the network heals);
//! - a periodic commit refused for the member
//!   (`doubted_by` in src/consumer/committer.rs: UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH,
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
use std::sync::{Mutex, MutexGuard, OnceLock, TryLockError, Weak};
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use tokio::sync::Notify;

use crate::consumer::committer::{CommitOffset, CONFIRM_EVERY};
use crate::consumer::group::Group;
use crate::output::metrics::millis;
use crate::output::TopicPartition;

/// How often the stall watch ticks.
const TICK: Duration = Duration::from_millis(100);
/// A gap between two ticks this long means the process did not run: a session may have
/// expired meanwhile. Below the shortest session a broker allows a classic member by
/// default (6 s) less its heartbeat interval (3 s); a false alarm costs one commit's
/// round trip of held partitions.
pub const STALL: Duration = Duration::from_secs(2);
/// With nothing to commit, how long a doubt lasts without a lost revoke.
const UNCONFIRMABLE_FOR: Duration = Duration::from_secs(10);

/// The membership lease: partitions may start messages only while the group
/// coordinator answered recently enough that the broker cannot have expired the session.
///
/// The broker expires a member `S` (the session timeout) after the last heartbeat it
/// *received*. librdkafka heartbeats every `H` on the coordinator's connection, the same
/// one that carries commits and committed-offset reads, in order: a request sent at `t`
/// and answered without an error means that every heartbeat sent before `t` arrived,
/// the last one at or after `t - H`, so the session lasts at least until `t - H + S`.
/// The lease is renewed to the *send* time of every accepted commit (ackd's own) and of
/// every renewal read answered (an error answer never renews it), and to the time of an
/// assignment or a revoke that is not lost (librdkafka heard from the group); it lapses
/// [`LeaseTerms::term`] (`4/5 S - H`) after that: before the broker can have expired
/// the session, with a fifth of it as margin for the watch's tick, a heartbeat sent
/// late, and an assignment's round trip. An idle member (no commit accepted lately)
/// reads one partition's committed offset (an OffsetFetch: nothing is written) once the
/// lease is a third of its term old. A lapse puts the membership in doubt (nothing new
/// starts); only the ways a doubt ends end it, not a later renewal.
#[derive(Debug, Default)]
pub struct Lease {
    /// None: no session known (a group without a consumer, in unit tests): no lease.
    terms: Option<LeaseTerms>,
    /// The latest proof that the coordinator had this member (its safe time).
    renewed: Option<Instant>,
    /// When the last renewal read was asked for.
    renewal_tried: Option<Instant>,
}

/// The session a member is under and the lease derived from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTerms {
    pub session: Duration,
    pub heartbeat: Duration,
    /// How long after its last renewal the lease lapses.
    pub term: Duration,
    /// How old the lease may get before an idle member renews it.
    pub renew_after: Duration,
}

impl LeaseTerms {
    pub fn new(session: Duration, heartbeat: Duration) -> LeaseTerms {
        // A heartbeat so long that nothing is left: a quarter of the session.
        let term = (session * 4 / 5).saturating_sub(heartbeat).max(session / 4);
        LeaseTerms {
            session,
            heartbeat,
            term,
            renew_after: term / 3,
        }
    }
}

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
    /// The coordinator has not answered for this long (the lease's terms).
    LeaseLapsed(Duration, LeaseTerms),
}

/// What the membership acts on: the partitions owned and the doubt (the consumer's
/// [`Group`] holds both). A trait so that the rules of the lease and the doubt are unit
/// tested on a member of one partition, without a partition worker to start.
pub trait Members {
    /// The doubt under way, if any.
    fn doubt_slot(&mut self) -> &mut Option<Doubt>;
    /// The membership lease.
    fn lease(&mut self) -> &mut Lease;
    /// Whether no partition is owned.
    fn owns_nothing(&self) -> bool;
    /// The partitions owned, in order.
    fn owned_partitions(&self) -> Vec<&TopicPartition>;
    /// Holds every owned partition (nothing new starts), or lifts the hold.
    fn hold_owned(&self, hold: bool);
    /// The offsets of every owned partition that has one: what a confirming commit sends.
    fn confirming(&self) -> Vec<CommitOffset>;
}

impl Members for Group {
    fn doubt_slot(&mut self) -> &mut Option<Doubt> {
        &mut self.doubt
    }

    fn lease(&mut self) -> &mut Lease {
        &mut self.lease
    }

    fn owns_nothing(&self) -> bool {
        self.owned.is_empty()
    }

    fn owned_partitions(&self) -> Vec<&TopicPartition> {
        self.owned.keys().collect()
    }

    fn hold_owned(&self, hold: bool) {
        for p in self.owned.values() {
            if hold {
                p.worker.shared.hold.hold();
            } else {
                p.worker.shared.hold.lift();
            }
        }
    }

    fn confirming(&self) -> Vec<CommitOffset> {
        Group::confirming(self)
    }
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
        Cause::LeaseLapsed(silent, terms) => tracing::warn!(
            at = "membership_in_doubt",
            reason = "lease_lapsed",
            silent_ms = millis(silent),
            lease_ms = millis(terms.term),
            session_timeout_ms = millis(terms.session),
            partitions,
            "the group coordinator has not answered for most of the session timeout (a network cut, a coordinator down): the broker may soon drop this member and give its partitions to another; they are held (nothing new starts) until a commit is accepted or the group revokes them"
        ),
    }
}

/// Sets the terms of the lease (the session this member is under).
pub fn lease_under<G: Members>(group: &mut G, terms: LeaseTerms) {
    group.lease().terms = Some(terms);
}

/// The coordinator had this member at `at` (an accepted commit's send time, a
/// rebalance): the lease runs from there, if that is later than what it had.
pub fn renewed<G: Members>(group: &mut G, at: Instant) {
    let lease = group.lease();
    lease.renewed = Some(lease.renewed.map_or(at, |r| r.max(at)));
}

/// Puts the membership in doubt if its lease has lapsed and something can confirm it: a
/// partition with no offset to commit has no dispatch limit accepted either, so it
/// starts nothing until a commit is accepted anyway.
fn check_lease<G: Members>(group: &mut G) {
    let now = Instant::now();
    if group.owns_nothing() || group.doubt_slot().is_some() {
        return;
    }
    let lease = group.lease();
    let Some(terms) = lease.terms else {
        return;
    };
    // Never renewed while owning partitions: as old as the process.
    let silent = lease
        .renewed
        .map_or(Duration::MAX, |r| now.saturating_duration_since(r));
    if silent >= terms.term && !group.confirming().is_empty() {
        let silent = silent.min(now.saturating_duration_since(started()));
        doubt(group, Cause::LeaseLapsed(silent, terms));
    }
}

/// When nothing else renewed the lease for [`LeaseTerms::renew_after`]: the partition
/// whose committed offset a renewal reads, and how long to wait for the answer.
pub fn renewal_due<G: Members>(group: &mut G) -> Option<(TopicPartition, Duration)> {
    let now = Instant::now();
    if group.owns_nothing() || group.doubt_slot().is_some() {
        return None;
    }
    let lease = group.lease();
    let terms = lease.terms?;
    let fresh = lease
        .renewed
        .is_some_and(|r| now.saturating_duration_since(r) < terms.renew_after);
    // A read not answered is asked again after CONFIRM_EVERY, or sooner under a short
    // lease: waiting longer than renew_after could let the lease lapse between reads.
    let retry = CONFIRM_EVERY.min(terms.renew_after);
    let tried = lease
        .renewal_tried
        .is_some_and(|t| now.saturating_duration_since(t) < retry);
    if fresh || tried {
        return None;
    }
    let tp = group.owned_partitions().first().copied()?.clone();
    group.lease().renewal_tried = Some(now);
    Some((tp, terms.renew_after))
}

/// When this process started watching (the age of a lease never renewed).
fn started() -> Instant {
    static STARTED: OnceLock<Instant> = OnceLock::new();
    *STARTED.get_or_init(Instant::now)
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
    renewed(group, sent_at);
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

/// Starts the thread that watches for stalls of the whole process and for the lease's
/// lapse; it ends with the group.
pub fn watch_stalls<G: Members + Send + 'static>(group: Weak<Mutex<G>>) -> std::io::Result<()> {
    watched();
    started();
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
                // Never waits for the group: a tick late would read as a stall. A lock
                // held past one tick delays the check to the next.
                match group.try_lock() {
                    Ok(mut g) => check_lease(&mut *g),
                    Err(TryLockError::Poisoned(e)) => check_lease(&mut *e.into_inner()),
                    Err(TryLockError::WouldBlock) => {}
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

    /// A member owning one partition, with `offset` committed (none: nothing to confirm).
    struct Member {
        doubt: Option<Doubt>,
        lease: Lease,
        owned: Vec<TopicPartition>,
        held: std::cell::Cell<bool>,
        offset: Option<i64>,
    }

    impl Members for Member {
        fn doubt_slot(&mut self) -> &mut Option<Doubt> {
            &mut self.doubt
        }
        fn lease(&mut self) -> &mut Lease {
            &mut self.lease
        }
        fn owns_nothing(&self) -> bool {
            self.owned.is_empty()
        }
        fn owned_partitions(&self) -> Vec<&TopicPartition> {
            self.owned.iter().collect()
        }
        fn hold_owned(&self, hold: bool) {
            self.held.set(hold);
        }
        fn confirming(&self) -> Vec<CommitOffset> {
            let tp = self.owned[0].clone();
            self.offset
                .map(|offset| CommitOffset {
                    tp,
                    offset,
                    processed: None,
                    limit: None,
                    acked: Vec::new(),
                })
                .into_iter()
                .collect()
        }
    }

    /// A 6 s session with a 500 ms heartbeat: a 4.3 s lease, renewed after 1.43 s.
    fn member(offset: Option<i64>, renewed_ago: Duration) -> Member {
        let terms = LeaseTerms::new(Duration::from_secs(6), Duration::from_millis(500));
        Member {
            doubt: None,
            lease: Lease {
                terms: Some(terms),
                renewed: Some(Instant::now() - renewed_ago),
                renewal_tried: None,
            },
            owned: vec![(std::sync::Arc::from("t"), 0)],
            held: Default::default(),
            offset,
        }
    }

    #[test]
    fn the_lease_lapses_before_the_broker_can_expire_the_session() {
        let terms = LeaseTerms::new(Duration::from_secs(6), Duration::from_millis(500));
        assert_eq!(terms.term, Duration::from_millis(4300));
        assert!(terms.term + terms.heartbeat + TICK < terms.session);
        assert_eq!(terms.renew_after, Duration::from_millis(4300) / 3);
        // Kafka's KIP-848 defaults: a 45 s session, a 5 s heartbeat.
        let terms = LeaseTerms::new(Duration::from_secs(45), Duration::from_secs(5));
        assert_eq!(terms.term, Duration::from_millis(31_000));
        // The tests' classic members: a 1 s session, a 300 ms heartbeat.
        let terms = LeaseTerms::new(Duration::from_secs(1), Duration::from_millis(300));
        assert_eq!(terms.term, Duration::from_millis(500));
        // A heartbeat as long as the session leaves a quarter of it.
        let terms = LeaseTerms::new(Duration::from_secs(4), Duration::from_secs(4));
        assert_eq!(terms.term, Duration::from_secs(1));
    }

    #[test]
    fn a_lapsed_lease_holds_the_partitions_until_a_commit_sent_since_is_accepted() {
        let mut m = member(Some(10), Duration::from_millis(4200));
        check_lease(&mut m);
        assert!(m.doubt.is_none() && !m.held.get(), "not lapsed yet");
        let mut m = member(Some(10), Duration::from_millis(4300));
        check_lease(&mut m);
        assert!(m.doubt.is_some() && m.held.get(), "lapsed: held");
        // A renewal that was sent before the lapse (answered late) ends nothing.
        let before = m.doubt.as_ref().unwrap().since - Duration::from_millis(1);
        confirmed_by_commit(&mut m, before);
        assert!(m.held.get());
        assert_eq!(confirmation_due(&mut m).map(|o| o.len()), Some(1));
        confirmed_by_commit(&mut m, Instant::now());
        assert!(m.doubt.is_none() && !m.held.get(), "confirmed");
        check_lease(&mut m);
        assert!(m.doubt.is_none(), "renewed by the confirming commit");
    }

    #[test]
    fn a_lapsed_lease_with_nothing_to_confirm_holds_nothing() {
        // No offset: no dispatch limit accepted either, so nothing starts anyway.
        let mut m = member(None, Duration::from_secs(60));
        check_lease(&mut m);
        assert!(m.doubt.is_none() && !m.held.get());
    }

    #[test]
    fn a_short_lease_is_renewed_again_before_it_lapses() {
        // The tests' classic members: a 500 ms lease, renewed after 166 ms. A renewal
        // answered at once must not keep the next one waiting past the lapse.
        let terms = LeaseTerms::new(Duration::from_secs(1), Duration::from_millis(300));
        let mut m = member(Some(10), Duration::ZERO);
        m.lease.terms = Some(terms);
        let asked = Instant::now() - terms.renew_after - Duration::from_millis(10);
        m.lease.renewed = Some(asked);
        m.lease.renewal_tried = Some(asked);
        assert!(
            renewal_due(&mut m).is_some(),
            "the previous read renewed the lease when it was asked; the next is due"
        );
    }

    #[test]
    fn an_idle_member_renews_its_lease_with_one_read() {
        let mut m = member(Some(10), Duration::from_millis(100));
        assert_eq!(renewal_due(&mut m), None, "fresh");
        let mut m = member(None, Duration::from_millis(1500));
        assert_eq!(
            renewal_due(&mut m),
            Some((
                (std::sync::Arc::from("t"), 0),
                Duration::from_millis(4300) / 3
            ))
        );
        assert_eq!(renewal_due(&mut m), None, "asked already");
        renewed(&mut m, Instant::now());
        m.lease.renewal_tried = None;
        assert_eq!(renewal_due(&mut m), None, "renewed");
        let mut m = member(Some(10), Duration::from_secs(2));
        m.doubt = Some(Doubt {
            since: Instant::now(),
            tried: None,
        });
        assert_eq!(
            renewal_due(&mut m),
            None,
            "in doubt: confirming commits instead"
        );
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
