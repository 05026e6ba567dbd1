//! The partition worker: one tokio task per assigned partition.
//!
//! It reads its partition's own librdkafka queue (so a slow processor stops only that
//! partition's fetching: librdkafka stops prefetching once the queue holds
//! `queued.max.messages.kbytes`), hands each message to the processor in offset order,
//! and publishes the committable offset after every ack. When told to stop it finishes
//! the message in hand and returns; it never starts a new one.
//!
//! Its parts: `start` (spawning it, after a predecessor that has not ended), `consume`
//! (the state machine: read, halt, end, stop), `read` (the queue, one message at a time),
//! `batch` (gathering batches), `concurrent` (`ACKD_ORDERING=key`/`none`), `handler` (the
//! processor call) and `failure` (retries and the failure policy), `progress` (offsets
//! between queue and commit, with `gaps` and `fetch_error`), `shared` (what the supervisor and health endpoint read), `hold`.

mod batch;
mod concurrent;
mod config;
mod consume;
mod failure;
mod fetch_error;
mod gaps;
mod handler;
pub(crate) mod hold;
mod latch;
mod progress;
mod read;
mod shared;
mod start;

pub use config::{Batching, Concurrency, WorkerConfig};
pub use shared::WorkerShared;
pub use start::{spawn, Predecessor, WorkerHandle};
