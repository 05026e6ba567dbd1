//! The callbacks librdkafka makes on ackd's consumer: its log, its errors, its
//! statistics (which pace the interval summary and carry the lag), and the rebalance
//! (assign: assign.rs; revoke: release.rs); and the group generation as librdkafka
//! knows it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use rdkafka::bindings as rdsys;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaErrorCode;

use super::GroupContext;
use crate::consumer::membership;
use crate::output::health::Busy;
use crate::output::metrics;
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

impl<P: Processor> GroupContext<P> {
    /// Writes the summary of the interval that ends now, and the lag of the partitions
    /// that have some or whose lag changed ([`metrics::LagLines`]).
    pub fn summarize(&self, last: bool) {
        if self.summaries_done.load(Ordering::Acquire) {
            return;
        }
        if last {
            self.summaries_done.store(true, Ordering::Release);
        }
        let mut group = self.lock();
        let mut interval = std::mem::take(&mut group.retired);
        let mut in_flight = 0;
        let mut waiting = None;
        let mut lag_total = None;
        let mut lags = Vec::new();
        let mut seconds = Vec::new();
        let now_ms = crate::consumer::copier::epoch_ms();
        let mut halted = Vec::new();
        for (tp, p) in &group.owned {
            p.worker.shared.metrics.take_into(&mut interval);
            if let Some(offset) = p.worker.shared.halted_at() {
                halted.push((tp.clone(), offset));
            }
            in_flight += p.worker.shared.in_flight_count();
            if let Some(w) = p.worker.shared.waiting() {
                *waiting.get_or_insert(0) += w;
            }
            // The timestamp is read before the offset: a message acknowledged between
            // the two reads gives an earlier message's age (a little high), never a
            // later one's.
            let oldest_ms = p.worker.shared.oldest_timestamp_ms();
            if let Some(lag) = metrics::lag(p.high_watermark, p.next_to_process()) {
                *lag_total.get_or_insert(0) += lag;
                lags.push((tp.clone(), lag));
                seconds.push(metrics::lag_seconds(lag, oldest_ms, now_ms));
            }
        }
        let partitions = group.owned.len();
        let (lag_lines, lag_omitted) = group.lag_lines.select(&lags);
        drop(group);
        metrics::emit_summary(
            &mut interval,
            &self.commit_metrics,
            &self.source,
            self.metrics_interval.as_millis() as u64,
            partitions,
            metrics::InFlight {
                calls: in_flight,
                waiting,
            },
            halted.len(),
            (
                lag_total,
                seconds.iter().flatten().copied().reduce(f64::max),
            ),
            last,
        );
        // Repeated every interval: a stopped partition must not look like a quiet one.
        for ((topic, partition), offset) in halted {
            tracing::error!(
                at = "halted",
                topic = &*topic,
                partition,
                offset,
                "partition stopped on a processor failure; nothing past this offset is processed or committed"
            );
        }
        let lags: Vec<_> = (lags.into_iter().zip(seconds))
            .map(|((tp, messages), seconds)| (tp, metrics::Lag { messages, seconds }))
            .collect();
        metrics::emit_lags(&lag_lines, &lags, &self.source);
        if lag_omitted > 0 {
            metrics::emit_lag_omitted(lag_omitted, &self.source);
        }
        self.health.set_lags(lags);
    }
}

/// The group generation this member is in, as librdkafka knows it: in an assignment the
/// one that made it, in an eager revoke the one being left. On `assigned`/`revoked`
/// lines, so that who owned a partition when can be read across processes' logs.
pub(super) fn generation<C: ConsumerContext>(base: &BaseConsumer<C>) -> Option<i32> {
    // SAFETY: rd_kafka_consumer_group_metadata returns a copy the caller owns (or null
    // when the consumer is in no group), destroyed right after reading it.
    unsafe {
        let metadata = rdsys::rd_kafka_consumer_group_metadata(base.client().native_ptr());
        if metadata.is_null() {
            return None;
        }
        let generation = rdsys::rd_kafka_consumer_group_metadata_generation_id(metadata);
        rdsys::rd_kafka_consumer_group_metadata_destroy(metadata);
        (generation >= 0).then_some(generation)
    }
}
