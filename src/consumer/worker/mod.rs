//! The partition worker: one tokio task per assigned partition.
//!
//! It reads its partition's own librdkafka queue (so a slow processor stops only that
//! partition's fetching: librdkafka stops prefetching once the queue holds
//! `queued.max.messages.kbytes`), hands each message to the processor in offset order,
//! and publishes the committable offset after every ack. When told to stop it finishes
//! the message in hand and returns; it never starts a new one.
//!
//! Its parts: `task` (its configuration, spawning it, the state machine, the read loop,
//! a single message's call and batches), `concurrent` (the read loop of
//! `ACKD_ORDERING=key`/`none`), `handler` (the processor call, its retries and the
//! failure policy), `progress` (offsets between queue and commit, gaps and fetch errors
//! included, and the offset tracker that computes the committable offset), `shared`
//! (what the supervisor, the commits and the health endpoint read, the hold, and the
//! dispatch limit each commit records).
//! What the previous owner left behind (where it resumes, what it skips and flags) is
//! src/consumer/handover/'s.

mod concurrent;
mod handler;
mod progress;
mod shared;
mod task;

pub use progress::{OffsetTracker, TrackerError};
pub use shared::{LimitPolicy, WorkerShared};
pub use task::{spawn, Batching, Concurrency, Predecessor, WorkerConfig, WorkerHandle};
