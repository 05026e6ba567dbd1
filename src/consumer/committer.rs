//! The committer: one thread that sends every commit of this process, one at a time.
//!
//! librdkafka's synchronous commit has no timeout (it waits for the broker however long
//! that takes), so it never runs on the supervisor's thread; and async commits made by
//! hand report no result. One thread in FIFO order gives all three properties ackd needs:
//! the supervisor never blocks on a dead broker, every commit's result and duration is
//! known (and logged), and a periodic commit queued before a revoke's final commit is
//! sent before it, so the broker never sees an older offset after a newer one.
//!
//! Each commit carries metadata `ackd:processed=H`, the highest offset this process had
//! acknowledged on that partition, and `;released` when it is a revoke's or a stop's
//! commit, after which this process processes nothing more of the partition. The next
//! owner reads it back: after a release it knows exactly how much it redelivers; after a
//! periodic commit (the owner crashed, or was fenced or lost the partition, before
//! releasing it) it cannot, because what was processed after that commit left no trace.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use crate::group::{Group, Tp};
use crate::metrics::CommitMetrics;

/// What to commit for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitOffset {
    pub tp: Tp,
    /// The next offset to read.
    pub offset: i64,
    /// The highest offset acknowledged, for the metadata.
    pub processed: Option<i64>,
}

/// Why a commit is sent; named on its `at=committed` lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Periodic,
    Revoke,
    Shutdown,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Periodic => "periodic",
            Reason::Revoke => "revoke",
            Reason::Shutdown => "shutdown",
        }
    }
}

/// How a waited-for commit ended.
#[derive(Debug)]
pub enum CommitError {
    Refused(KafkaError),
    /// Not answered before the deadline (the commit may still happen later).
    TimedOut,
    /// The consumer is gone.
    Closed,
}

impl std::fmt::Display for CommitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommitError::Refused(e) => write!(f, "{e}"),
            CommitError::TimedOut => f.write_str("no answer before the deadline"),
            CommitError::Closed => f.write_str("the consumer is closed"),
        }
    }
}

struct Job {
    offsets: Vec<CommitOffset>,
    reason: Reason,
    reply: Option<mpsc::SyncSender<Result<(), CommitError>>>,
}

/// The metadata a commit carries, and how it is read back.
pub fn metadata(processed: Option<i64>, reason: Reason) -> String {
    match (processed, reason) {
        (None, _) => String::new(),
        (Some(h), Reason::Periodic) => format!("ackd:processed={h}"),
        (Some(h), Reason::Revoke | Reason::Shutdown) => format!("ackd:processed={h};released"),
    }
}

/// What a commit's metadata written by [`metadata`] says about the process that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Previous {
    /// The highest offset it had processed when it committed.
    pub processed: i64,
    /// It committed on releasing the partition: it processed nothing after.
    pub released: bool,
}

/// Reads commit metadata written by [`metadata`] (`None` for anything else). Metadata
/// without `;released` (a periodic commit, or an older ackd's) is not a release.
pub fn parse_metadata(metadata: &str) -> Option<Previous> {
    let rest = metadata.strip_prefix("ackd:processed=")?;
    let (processed, released) = match rest.split_once(';') {
        Some((h, flags)) => (h, flags.split(';').any(|f| f == "released")),
        None => (rest, false),
    };
    Some(Previous {
        processed: processed.parse().ok()?,
        released,
    })
}

/// A handle on the committer thread; clones share it.
#[derive(Clone)]
pub struct Committer {
    jobs: mpsc::Sender<Job>,
    periodic_queued: Arc<AtomicBool>,
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
        std::thread::Builder::new()
            .name("ackd-committer".into())
            .spawn(move || {
                for job in rx {
                    if job.reason == Reason::Periodic {
                        queued.store(false, Ordering::Release);
                    }
                    let result = match consumer.upgrade() {
                        Some(c) => send(&*c, &job, &group, &metrics),
                        None => Err(CommitError::Closed),
                    };
                    if let Some(reply) = job.reply {
                        let _ = reply.send(result);
                    }
                }
            })?;
        Ok(Committer {
            jobs,
            periodic_queued,
        })
    }

    /// Queues a periodic commit unless one is already waiting (the next one will carry
    /// newer offsets anyway).
    pub fn periodic(&self, offsets: Vec<CommitOffset>) {
        if offsets.is_empty() || self.periodic_queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = self.jobs.send(Job {
            offsets,
            reason: Reason::Periodic,
            reply: None,
        });
    }

    /// Commits and waits for the broker's answer until `deadline`.
    pub fn commit(
        &self,
        offsets: Vec<CommitOffset>,
        reason: Reason,
        deadline: Instant,
    ) -> Result<(), CommitError> {
        if offsets.is_empty() {
            return Ok(());
        }
        let (reply, answer) = mpsc::sync_channel(1);
        self.jobs
            .send(Job {
                offsets,
                reason,
                reply: Some(reply),
            })
            .map_err(|_| CommitError::Closed)?;
        match answer.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(result) => result,
            Err(mpsc::RecvTimeoutError::Timeout) => Err(CommitError::TimedOut),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(CommitError::Closed),
        }
    }
}

fn send<X: Consumer<C>, C: ConsumerContext>(
    consumer: &X,
    job: &Job,
    group: &Mutex<Group>,
    metrics: &CommitMetrics,
) -> Result<(), CommitError> {
    let mut tpl = TopicPartitionList::with_capacity(job.offsets.len());
    for c in &job.offsets {
        let mut e = tpl.add_partition(&c.tp.0, c.tp.1);
        // Offsets come from the tracker: always >= 0, so this cannot fail.
        let _ = e.set_offset(Offset::Offset(c.offset));
        e.set_metadata(metadata(c.processed, job.reason));
    }
    let started = Instant::now();
    let result = consumer.commit(&tpl, CommitMode::Sync);
    let took = started.elapsed();
    drop(tpl);
    metrics.record(took, result.is_ok());
    let reason = job.reason.as_str();
    let duration_ms = millis(took);
    match result {
        Ok(()) => {
            let mut group = group.lock().unwrap_or_else(|e| e.into_inner());
            for c in &job.offsets {
                tracing::info!(
                    at = "committed",
                    topic = &*c.tp.0,
                    partition = c.tp.1,
                    offset = c.offset,
                    reason,
                    duration_ms
                );
                if let Some(p) = group.owned.get_mut(&c.tp) {
                    // FIFO: the last commit sent is what the group has.
                    p.committed = Some(c.offset);
                    p.released = job.reason != Reason::Periodic;
                }
            }
            Ok(())
        }
        Err(e) => {
            for c in &job.offsets {
                tracing::error!(
                    at = "commit_failed",
                    topic = &*c.tp.0,
                    partition = c.tp.1,
                    offset = c.offset,
                    reason,
                    error = %e,
                    "not committed: retried at the next commit; if the partition moves or the process stops first, messages from the last committed offset are redelivered"
                );
            }
            Err(CommitError::Refused(e))
        }
    }
}

/// Milliseconds with a fraction, for duration fields.
pub fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_and_ignores_foreign_metadata() {
        let read = |processed, released| {
            Some(Previous {
                processed,
                released,
            })
        };
        assert_eq!(
            parse_metadata(&metadata(Some(41), Reason::Periodic)),
            read(41, false)
        );
        assert_eq!(
            parse_metadata(&metadata(Some(41), Reason::Shutdown)),
            read(41, true)
        );
        assert_eq!(
            parse_metadata(&metadata(Some(41), Reason::Revoke)),
            read(41, true)
        );
        // An older ackd's metadata, and flags a newer one may add.
        assert_eq!(parse_metadata("ackd:processed=41"), read(41, false));
        assert_eq!(
            parse_metadata("ackd:processed=41;x;released"),
            read(41, true)
        );
        assert_eq!(metadata(None, Reason::Shutdown), "");
        assert_eq!(parse_metadata(""), None);
        assert_eq!(parse_metadata("ackd:processed=x;released"), None);
        assert_eq!(parse_metadata("written by another tool"), None);
    }
}
