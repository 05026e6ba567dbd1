//! The callbacks librdkafka makes on ackd's consumer: its log, its errors, its
//! statistics, and the rebalance.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaErrorCode;

use super::GroupContext;
use crate::consumer::membership;
use crate::output::health::Busy;
use crate::processors::processor::Processor;

impl<P: Processor> ClientContext for GroupContext<P> {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", facility = fac, "{log_message}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", facility = fac, "{log_message}")
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // An authentication failure gets its own line (once) and stops ackd.
        if self.auth.observe(&error, reason) {
            return;
        }
        // A partition's end (ACKD_STOP_AT_END) reaches its worker too, which says so; after
        // an authentication failure, unreachable brokers are its consequence, not news.
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::PartitionEOF) || self.auth.failed()
        {
            tracing::debug!(at = "kafka_error", error = %error, reason);
            return;
        }
        if !self.connectivity.error(&error, Some(reason)) {
            tracing::error!(at = "kafka_error", error = %error, reason);
        }
    }

    /// librdkafka's statistics arrive every `ACKD_METRICS_INTERVAL_MS`: they carry the
    /// high watermarks of fetch responses (lag), and they pace the summary.
    fn stats(&self, statistics: Statistics) {
        let _busy = self.health.busy(Busy::Statistics);
        if statistics.brokers.values().any(|b| b.state == "UP") {
            self.connectivity.reachable();
        }
        {
            let mut group = self.lock();
            for (topic, t) in &statistics.topics {
                for (partition, p) in &t.partitions {
                    if let Some(owned) = group
                        .owned
                        .get_mut(&(Arc::from(topic.as_str()), *partition))
                    {
                        owned.high_watermark = p.hi_offset;
                    }
                }
            }
        }
        self.summarize(false);
    }
}

impl<P: Processor> ConsumerContext for GroupContext<P> {
    fn pre_rebalance(&self, base: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let _busy = self.health.busy(Busy::Assign);
                // librdkafka heard from the group: the coordinator has this member.
                membership::renewed(&mut *self.lock(), Instant::now());
                self.assign(base, tpl);
                self.health.joined();
            }
            Rebalance::Revoke(tpl) => {
                let _busy = self.health.busy(Busy::Revoke);
                if !base.assignment_lost() && base.client().fatal_error().is_none() {
                    membership::renewed(&mut *self.lock(), Instant::now());
                }
                self.revoke(base, tpl)
            }
            Rebalance::Error(e) => tracing::error!(at = "rebalance_error", error = %e),
        }
        // What the prefetch may hold now (ACKD_MEMORY_MB), once the owned set changed.
        if let (Some(budget), Rebalance::Assign(_) | Rebalance::Revoke(_)) =
            (&self.memory, rebalance)
        {
            if !self.stopping.load(Ordering::Acquire) {
                budget.log(Some(self.lock().owned.len()));
            }
        }
    }
}
