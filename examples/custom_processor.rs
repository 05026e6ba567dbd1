//! Embedding ackd: your own [`ackd::Processor`] behind the same daemon as the `ackd`
//! binary (same settings, same log lines, same exit codes).
//!
//! This one treats every payload as UTF-8 text, "stores" it in a stand-in for a database
//! and counts the bytes stored per partition. A payload that is not UTF-8 is a permanent
//! failure.
//!
//! Run it against a broker (`scripts/demo` shows how to start a local one):
//!
//! ```text
//! KAFKA_URL=127.0.0.1:9092 ACKD_TOPICS=demo ACKD_GROUP_ID=custom \
//!     cargo run --example custom_processor
//! ```
//!
//! Stop it with SIGTERM or Ctrl-C: it finishes the messages in hand, commits, leaves the
//! group and exits 0. Every setting of the binary applies (see `config/default.toml`),
//! except that `main` chooses the processor, not `ACKD_PROCESSOR`.
//!
//! What ackd guarantees a processor:
//! - calls for one partition come one at a time, in offset order; calls for different
//!   partitions run concurrently, so the processor is `Sync` (atomics, a mutex, a pool);
//! - an offset is committed only after `process` returned `Ok` for that message and for
//!   every earlier one of its partition: do the work (or hand it off durably) before
//!   returning `Ok`;
//! - delivery is at least once: after a crash the messages acknowledged since the last
//!   commit come again, so make the work idempotent (here: an upsert keyed by
//!   topic/partition/offset). A graceful stop redelivers nothing;
//! - a retryable `Err` is tried again with backoff (`ACKD_RETRY_*`); a permanent one (or a
//!   panic, or retries run out) meets `ACKD_ON_FAILURE`: `halt` (the default: nothing
//!   past the message is committed, the other partitions go on, exit code 1 at shutdown),
//!   `skip` or `dead-letter`;
//! - with `ACKD_BATCH_MAX_MESSAGES` above 1, `process_batch` gets up to that many
//!   messages of one partition at once (here: one "transaction" per batch).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use ackd::{BatchError, Message, ProcessError, Processor};

/// Stands in for a real database: rows keyed by (topic, partition, offset), so writing a
/// redelivered message again changes nothing.
#[derive(Default)]
struct Database {
    rows: Mutex<BTreeMap<(String, i32, i64), String>>,
}

impl Database {
    /// An idempotent write. A real one would be `INSERT ... ON CONFLICT DO NOTHING`,
    /// awaited on an async client; its connection errors are retryable failures.
    async fn upsert(&self, topic: &str, partition: i32, offset: i64, text: &str) -> bool {
        let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        rows.insert((topic.to_string(), partition, offset), text.to_string())
            .is_none()
    }
}

#[derive(Default)]
struct TextStore {
    db: Database,
    /// Bytes stored per partition. Partitions are processed concurrently, so shared
    /// state needs atomics or a lock; the per-message work never holds the lock long.
    bytes_per_partition: Mutex<BTreeMap<i32, u64>>,
    messages: AtomicU64,
}

impl Processor for TextStore {
    async fn process(&self, message: &Message<'_>) -> Result<(), ProcessError> {
        // A null value (a tombstone) is a valid, empty message here.
        let payload = message.payload().unwrap_or_default();
        let text = std::str::from_utf8(payload).map_err(|e| {
            // Trying again cannot make these bytes valid UTF-8: permanent. For a passing
            // condition (a timeout, a 503, a lost connection) return
            // `Err(ProcessError::retryable(e))` instead: the same message may succeed later.
            ProcessError::permanent(format!("payload is not UTF-8: {e}"))
        })?;

        let new = self
            .db
            .upsert(message.topic(), message.partition(), message.offset(), text)
            .await;

        let partition_bytes = {
            let mut bytes = self
                .bytes_per_partition
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let total = bytes.entry(message.partition()).or_default();
            if new {
                *total += text.len() as u64;
            }
            *total
        };
        let n = self.messages.fetch_add(1, Ordering::Relaxed) + 1;
        // Lines logged with `tracing` go through ackd's logfmt output (`at=` names the
        // module they come from).
        if n.is_multiple_of(100) {
            tracing::info!(
                messages = n,
                partition = message.partition(),
                partition_bytes,
                "stored"
            );
        }
        Ok(())
    }

    /// With batches: the rows before the first bad payload are written in one go (a real
    /// database: one multi-row INSERT in a transaction); the bad one is named, so ackd
    /// acknowledges those before it and applies the failure policy to it.
    async fn process_batch(&self, messages: &[Message<'_>]) -> Result<(), BatchError> {
        let mut failed = None;
        let mut stored = 0u64;
        for m in messages {
            let Ok(text) = std::str::from_utf8(m.payload().unwrap_or_default()) else {
                failed = Some(m.offset());
                break;
            };
            if self
                .db
                .upsert(m.topic(), m.partition(), m.offset(), text)
                .await
            {
                stored += text.len() as u64;
            }
        }
        if let Some(first) = messages.first() {
            let mut bytes = self
                .bytes_per_partition
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            *bytes.entry(first.partition()).or_default() += stored;
        }
        match failed {
            None => {
                self.messages
                    .fetch_add(messages.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            Some(offset) => Err(BatchError::new(
                offset,
                ProcessError::permanent("payload is not UTF-8"),
            )),
        }
    }
}

fn main() -> ExitCode {
    // `main_with` reads the settings from the environment, hands them to this closure
    // (use them to size a connection pool, say) and runs the daemon until it stops.
    ackd::main_with(|_settings| Ok(TextStore::default()))
}
