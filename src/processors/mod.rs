//! The built-in processors, chosen with `ACKD_PROCESSOR` by people who deploy ackd
//! without writing Rust; the [`processor::Processor`] trait they and embedders implement;
//! and when a call counts as started (`call_start`, which [`processor::queued`] tells).

pub(crate) mod call_start;
pub mod exec;
pub mod http;
pub mod json;
pub mod processor;
pub(crate) mod request_limit;
pub mod schema_registry;

use std::sync::Arc;
use std::time::Instant;

use crate::processors::processor::{BatchError, Message, ProcessError, Processor};
use crate::settings::SettingError;
use crate::settings::{ExecSettings, HttpSettings, Settings};

/// Names `ACKD_PROCESSOR` accepts.
#[cfg(not(feature = "testkit"))]
pub const NAMES: &[&str] = &["log", "noop", "exec", "http"];
/// Names `ACKD_PROCESSOR` accepts, with the testkit's.
#[cfg(feature = "testkit")]
pub const NAMES: &[&str] = &["log", "noop", "exec", "http", "slow", "faulty"];

/// A built-in processor.
#[derive(Debug, Clone)]
pub enum Builtin {
    /// Acknowledges every message. With `ACKD_LOG_MESSAGES=true` (the default) each one
    /// shows as its `count#…messages.processed=1` line: a sink for trying ackd out and
    /// for watching a topic.
    Log,
    /// Acknowledges every message and does nothing else: what ackd itself costs, for
    /// benchmarks and for draining a topic.
    Noop,
    /// Hands every message to long-lived children running `ACKD_EXEC_COMMAND`, one JSON
    /// line each way (docs/exec.md).
    Exec(Arc<exec::Exec>),
    /// POSTs every message to `ACKD_HTTP_URL` (docs/http.md).
    Http(Arc<http::Http>),
    /// Testkit only: waits `ACKD_TEST_DELAY_MS` per message (`N` ms, or `MIN-MAX`: uniform
    /// at random), then acknowledges, so tests can have messages in flight when a signal
    /// arrives, or finishing out of order.
    #[cfg(feature = "testkit")]
    Slow(crate::settings::test_delay::Delay),
    /// Testkit only: fails on command, by payload: `fail` fails permanently, `panic`
    /// panics, `retry:N` fails retryably N times before it succeeds (its reason says the
    /// message's `redelivered` and `attempt`), `attempts:N` fails retryably while the
    /// message's `attempt` is N or less (counted by ackd: across retry tiers and
    /// restarts), `block:PATH` blocks
    /// its thread (never yielding, like a processor stuck in a blocking call) until the
    /// file PATH exists (two minutes at most), then acks; anything else acks.
    #[cfg(feature = "testkit")]
    Faulty(std::sync::Arc<std::sync::Mutex<std::collections::HashMap<(i32, i64), u32>>>),
}

impl Builtin {
    /// The processor `ACKD_PROCESSOR` names.
    pub fn from_settings(settings: &Settings) -> Result<Builtin, SettingError> {
        match settings.processor.as_str() {
            "log" => Ok(Builtin::Log),
            "noop" => Ok(Builtin::Noop),
            "exec" => {
                let exec = settings.exec.clone();
                let exec = exec.ok_or_else(ExecSettings::command_required)?;
                Ok(Builtin::Exec(Arc::new(exec::Exec::new(exec))))
            }
            "http" => {
                let http = settings.http.clone();
                let http = http.ok_or_else(HttpSettings::url_required)?;
                Ok(Builtin::Http(Arc::new(http::Http::new(http)?)))
            }
            #[cfg(feature = "testkit")]
            "slow" => Ok(Builtin::Slow(settings.test_delay)),
            #[cfg(feature = "testkit")]
            "faulty" => Ok(Builtin::Faulty(Default::default())),
            other => Err(SettingError {
                setting: "ACKD_PROCESSOR".into(),
                value: Some(other.to_string()),
                problem: format!("unknown processor; expected one of: {}", NAMES.join(", ")),
            }),
        }
    }
}

impl Processor for Builtin {
    fn name(&self) -> &str {
        match self {
            Builtin::Log => "log",
            Builtin::Noop => "noop",
            Builtin::Exec(_) => "exec",
            Builtin::Http(_) => "http",
            #[cfg(feature = "testkit")]
            Builtin::Slow(_) => "slow",
            #[cfg(feature = "testkit")]
            Builtin::Faulty(_) => "faulty",
        }
    }

    /// Exec calls wait for a free child, http calls for a permit; the rest never wait.
    fn calls_may_wait(&self) -> bool {
        matches!(self, Builtin::Exec(_) | Builtin::Http(_))
    }

    // Exec and http futures are boxed: unboxed, every call's future (noop's too) had their
    // size, 792 bytes that each message's call copied twice: 7% of noop's CPU.
    // One allocation is nothing next to a child's or a server's reply.
    async fn process(&self, _message: &Message<'_>) -> Result<(), ProcessError> {
        match self {
            Builtin::Log | Builtin::Noop => Ok(()),
            Builtin::Exec(exec) => Box::pin(exec.process(_message)).await,
            Builtin::Http(http) => Box::pin(http.process(_message)).await,
            #[cfg(feature = "testkit")]
            Builtin::Slow(delay) => {
                tokio::time::sleep(delay.sample(&mut fastrand::Rng::new())).await;
                Ok(())
            }
            #[cfg(feature = "testkit")]
            Builtin::Faulty(attempts) => {
                let payload = _message.payload().unwrap_or_default();
                match payload {
                    b"fail" => Err(ProcessError::permanent("the payload says fail")),
                    b"panic" => panic!("the payload says panic"),
                    p if p.starts_with(b"block:") => {
                        let path = std::path::Path::new(std::str::from_utf8(&p[6..]).unwrap_or(""));
                        tracing::info!(
                            at = "test_blocked",
                            partition = _message.partition(),
                            offset = _message.offset()
                        );
                        let until = Instant::now() + std::time::Duration::from_secs(120);
                        while !path.exists() && Instant::now() < until {
                            std::thread::sleep(std::time::Duration::from_millis(10));
                        }
                        tracing::info!(
                            at = "test_unblocked",
                            partition = _message.partition(),
                            offset = _message.offset()
                        );
                        Ok(())
                    }
                    p if p.starts_with(b"attempts:") => {
                        let failing: u32 = std::str::from_utf8(&p[9..])
                            .ok()
                            .and_then(|n| n.parse().ok())
                            .unwrap_or(1);
                        if _message.attempt() <= failing {
                            Err(ProcessError::retryable(format!(
                                "attempt {} of {failing} failing",
                                _message.attempt()
                            )))
                        } else {
                            Ok(())
                        }
                    }
                    p if p.starts_with(b"retry:") => {
                        let wanted: u32 = std::str::from_utf8(&p[6..])
                            .ok()
                            .and_then(|n| n.parse().ok())
                            .unwrap_or(1);
                        let mut seen = attempts.lock().unwrap_or_else(|e| e.into_inner());
                        let n = seen
                            .entry((_message.partition(), _message.offset()))
                            .or_default();
                        *n += 1;
                        if *n <= wanted {
                            // What the message said, for tests of the delivery fields.
                            Err(ProcessError::retryable(format!(
                                "attempt {n} of {wanted} failing (redelivered={} attempt={})",
                                _message.redelivered(),
                                _message.attempt()
                            )))
                        } else {
                            Ok(())
                        }
                    }
                    _ => Ok(()),
                }
            }
        }
    }

    async fn process_batch(&self, messages: &[Message<'_>]) -> Result<(), BatchError> {
        match self {
            Builtin::Exec(exec) => Box::pin(exec.process_batch(messages)).await,
            Builtin::Http(http) => Box::pin(http.process_batch(messages)).await,
            _ => crate::processors::processor::each(self, messages).await,
        }
    }

    async fn shutdown(&self, deadline: Instant) {
        if let Builtin::Exec(exec) = self {
            exec.shutdown(deadline).await;
        }
    }
}
