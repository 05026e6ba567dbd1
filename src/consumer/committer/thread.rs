//! The committer's handle ([`Committer`]) and its thread, which sends the jobs queued to
//! it one at a time, and the confirming commits while the membership is in doubt.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::TopicPartitionList;

use super::commit::{CommitError, CommitOffset, Reason};
use super::job::{run, Job};
use super::ledger::CommitLedger;
use super::shared::{tag, Shared};
use crate::output::metrics::CommitMetrics;
use crate::topic_partition::TopicPartition;

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
        self.queue_periodic(offsets);
    }

    /// Queues a commit of partitions whose workers wait for (or will soon reach) their
    /// dispatch limit, even while a periodic one waits: that one may not carry their new
    /// limit. Each worker asks once per limit accepted, so these do not pile up.
    pub fn limits(&self, offsets: Vec<CommitOffset>) {
        if !offsets.is_empty() {
            self.queue_periodic(offsets);
        }
    }

    /// Queues `offsets` as a periodic commit, nobody waiting for its answer.
    fn queue_periodic(&self, offsets: Vec<CommitOffset>) {
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
/// ([`CommitLedger::confirmation_due`]), sent and accounted for as any other; else, when
/// the membership lease wants renewing ([`CommitLedger::renewal_due`]), a read of one
/// partition's committed offset. The consumer is upgraded only then: this thread must
/// not hold it past the supervisor's close.
fn confirm_if_due<X: Consumer<C>, C: ConsumerContext, G: CommitLedger>(
    consumer: &Weak<X>,
    shared: &Shared,
    group: &Mutex<G>,
    metrics: &CommitMetrics,
) {
    let (confirm, renew) = {
        let mut group = group.lock().unwrap_or_else(|e| e.into_inner());
        match group.confirmation_due() {
            Some(offsets) => (Some(offsets), None),
            None => (None, group.renewal_due()),
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
fn renew_lease<X: Consumer<C>, C: ConsumerContext, G: CommitLedger>(
    consumer: &X,
    group: &Mutex<G>,
    tp: &TopicPartition,
    timeout: Duration,
) {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&tp.0, tp.1);
    let sent_at = Instant::now();
    match consumer.committed_offsets(tpl, timeout) {
        Ok(answer) if answer.elements().iter().all(|e| e.error().is_ok()) => group
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .renewed(sent_at),
        Ok(_) => tracing::debug!(
            at = "lease_not_renewed",
            "the partition's offset was refused"
        ),
        Err(e) => tracing::debug!(at = "lease_not_renewed", error = %e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::committer::shared::RANGES_BUDGET;
    use crate::consumer::group::Group;
    use crate::consumer::handover::{raw_metadata, read_metadata};
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

    /// Issue 23: metadata the broker refuses even without ranges (an
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
}
