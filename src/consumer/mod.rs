//! The consumer core: the daemon (start, exit code), the graceful stop (signals, its
//! clock and sequence), the supervisor thread that owns the consumer, the group (what is
//! owned, assignments, the release that revokes and the stop share), one worker task per
//! assigned partition, the offset tracker, the committer thread, what a commit hands to
//! the next owner, and what a worker does when the processor fails (retry, retry
//! topics, halt, skip, dead letter).

pub(crate) mod auth;
pub(crate) mod committer;
pub(crate) mod copier;
pub(crate) mod daemon;
pub(crate) mod group;
pub(crate) mod handover;
pub(crate) mod key_order;
pub(crate) mod membership;
pub(crate) mod memory;
pub(crate) mod partition_queue;
pub(crate) mod stop;
pub(crate) mod supervisor;
pub(crate) mod topics;
pub(crate) mod worker;

pub use worker::{OffsetTracker, TrackerError};
