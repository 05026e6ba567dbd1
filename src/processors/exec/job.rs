//! A request for a child: what the dispatch hands out and a child serves.

use tokio::sync::oneshot;

use crate::processors::processor::{BatchError, Queued};

use super::protocol::Sent;

/// One request for a child (a message, or a batch), and where its answer goes.
pub(super) struct Job {
    pub(super) line: Vec<u8>,
    pub(super) sent: Sent,
    pub(super) reply: oneshot::Sender<Result<(), BatchError>>,
    /// The call starts when a child takes it, not while it waits for one.
    pub(super) queued: Queued,
}
