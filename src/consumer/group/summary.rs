//! The summary of each metrics interval, and the owned partitions' lag.

use std::sync::atomic::Ordering;

use super::GroupContext;
use crate::output::metrics;
use crate::processors::processor::Processor;

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
            if let Some(lag) = metrics::lag(p.high_watermark, p.next_to_process()) {
                *lag_total.get_or_insert(0) += lag;
                lags.push((tp.clone(), lag));
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
            lag_total,
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
        for ((topic, partition), lag) in &lag_lines {
            metrics::emit_lag(topic, *partition, *lag, &self.source);
        }
        if lag_omitted > 0 {
            metrics::emit_lag_omitted(lag_omitted, &self.source);
        }
        self.health.set_lags(lags);
    }
}
