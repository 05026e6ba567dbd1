//! Broker reachability, as the log shows it: one line per outage, not one per failed
//! reconnect.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// How often a broker outage is reported again while it lasts.
const UNREACHABLE_REPEAT: Duration = Duration::from_secs(30);

/// Broker reachability as the log shows it. librdkafka reports every failed reconnect
/// (tens per second while no broker listens); the log gets one `at=brokers_unreachable`
/// line when all brokers are down, a reminder every [`UNREACHABLE_REPEAT`] while they
/// stay down (with the count of suppressed reports), and `at=brokers_reachable` once a
/// broker answers again. The suppressed reports are still there at debug level.
#[derive(Default)]
pub struct Connectivity(Mutex<Outage>);

#[derive(Default)]
struct Outage {
    /// When the current outage began; `None` while the brokers are reachable.
    since: Option<Instant>,
    last_report: Option<Instant>,
    suppressed: u64,
}

/// librdkafka errors that mean "cannot reach a broker" (it retries them by itself).
fn is_unreachable(code: Option<RDKafkaErrorCode>) -> bool {
    matches!(
        code,
        Some(
            RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::Resolve
        )
    )
}

impl Connectivity {
    fn lock(&self) -> MutexGuard<'_, Outage> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reports a librdkafka error (from the error callback, or the consumer's queue) if
    /// it is about reaching brokers; returns false, logging nothing, for other errors.
    pub fn error(&self, error: &KafkaError, reason: Option<&str>) -> bool {
        let code = error.rdkafka_error_code();
        if !is_unreachable(code) {
            return false;
        }
        let now = Instant::now();
        let mut outage = self.lock();
        let Some(since) = outage.since else {
            if code == Some(RDKafkaErrorCode::AllBrokersDown) {
                *outage = Outage {
                    since: Some(now),
                    last_report: Some(now),
                    suppressed: 0,
                };
                tracing::error!(
                    at = "brokers_unreachable",
                    error = %error,
                    reason,
                    "no broker can be reached; librdkafka keeps reconnecting. Acknowledged offsets are kept and committed once a broker is back, unless the outage outlasts session.timeout.ms: then the partitions are given up uncommitted (lost=true) and those messages are redelivered"
                );
            } else {
                // One broker's connection failed or closed; others may be fine.
                tracing::warn!(at = "kafka_error", error = %error, reason);
            }
            return true;
        };
        if outage
            .last_report
            .is_none_or(|r| now.duration_since(r) >= UNREACHABLE_REPEAT)
        {
            let suppressed = std::mem::take(&mut outage.suppressed);
            outage.last_report = Some(now);
            tracing::error!(
                at = "brokers_unreachable",
                down_ms = now.duration_since(since).as_millis() as u64,
                suppressed,
                error = %error,
                reason,
                "still no broker reachable; retrying"
            );
        } else {
            outage.suppressed += 1;
            tracing::debug!(at = "kafka_error", error = %error, reason, "suppressed while the brokers are unreachable");
        }
        true
    }

    /// A broker answered (an assignment, or statistics showing a broker up).
    pub fn reachable(&self) {
        let mut outage = self.lock();
        if let Some(since) = outage.since {
            tracing::info!(
                at = "brokers_reachable",
                down_ms = since.elapsed().as_millis() as u64,
                suppressed = outage.suppressed,
                "a broker answers again"
            );
            *outage = Outage::default();
        }
    }
}
