//! The limit on connections served at once: a new one beyond it closes the oldest.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// Connections served at once. A new one beyond them closes the oldest (see
/// [`Connections`]) rather than being refused: idle connections cannot starve a probe.
pub(super) const MAX_CONNECTIONS: usize = 32;

/// The connections being served, oldest first, each with the signal that closes it.
///
/// At [`MAX_CONNECTIONS`] a new connection closes the oldest one instead of being
/// refused. Refusing it let 32 idle connections fail every probe; not counting idle
/// connections at all would let them take every file descriptor. The oldest goes
/// because a probe is the newest (it sends its request as it connects) and a connection
/// between requests may be closed at any time in HTTP/1.1 (clients reconnect); one
/// that is answering finishes its answer first (`CLOSE_GRACE`, in `server`).
#[derive(Default)]
pub(super) struct Connections {
    open: Mutex<VecDeque<(u64, Arc<Notify>)>>,
    next_id: AtomicU64,
}

/// One connection's place in [`Connections`], left when dropped.
pub(super) struct Admitted {
    connections: Arc<Connections>,
    id: u64,
    /// Notified when a newer connection needs the place.
    pub(super) close: Arc<Notify>,
}

impl Connections {
    fn open(&self) -> MutexGuard<'_, VecDeque<(u64, Arc<Notify>)>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a place for a new connection; at the limit, tells the oldest to close.
    pub(super) fn admit(self: &Arc<Self>) -> Admitted {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let close = Arc::new(Notify::new());
        let mut open = self.open();
        if open.len() >= MAX_CONNECTIONS {
            if let Some((_, oldest)) = open.pop_front() {
                // Kept as a permit if the connection is not waiting for it yet.
                oldest.notify_one();
            }
        }
        open.push_back((id, close.clone()));
        Admitted {
            connections: self.clone(),
            id,
            close,
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.connections.open().retain(|(id, _)| *id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_connection_beyond_the_limit_closes_the_oldest() {
        use futures::FutureExt as _;
        let connections = Arc::new(Connections::default());
        let mut admitted: Vec<Admitted> =
            (0..MAX_CONNECTIONS).map(|_| connections.admit()).collect();
        let told_to_close = |a: &Admitted| a.close.notified().now_or_never().is_some();
        assert!(!admitted.iter().any(told_to_close));
        admitted.push(connections.admit());
        assert!(told_to_close(&admitted[0]), "the oldest makes room");
        assert!(!admitted[1..].iter().any(told_to_close));
        assert_eq!(connections.open().len(), MAX_CONNECTIONS);
        // One that ends leaves its place: the next one closes no other.
        drop(admitted.remove(5));
        admitted.push(connections.admit());
        assert!(!admitted[1..].iter().any(told_to_close));
        drop(admitted);
        assert!(connections.open().is_empty());
    }
}
