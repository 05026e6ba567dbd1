//! The daemon: settings in, exit code out.
//!
//! It creates the consumer, hands it to the supervisor thread, drives the commit
//! schedule, and turns signals into the shutdown sequence:
//! - the first SIGTERM or SIGINT starts a graceful stop with a deadline of
//!   `ACKD_SHUTDOWN_TIMEOUT_MS`;
//! - more SIGTERMs are logged and ignored (Heroku may send several), and so is a first
//!   SIGINT after a SIGTERM (a process manager's SIGTERM and the terminal's Ctrl-C);
//! - a second SIGINT (Ctrl-C twice) exits at once, saying what was not committed;
//! - if the deadline passes, ackd exits non-zero with the same account.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook_tokio::Signals;
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::client_config::{base_config, consumer_config};
use crate::config::error::{report_setting_error, SettingError};
use crate::config::failure::OnFailure;
use crate::config::security;
use crate::config::settings::{ProcessingOrder, Settings};
use crate::consumer::committer::Committer;
use crate::consumer::dead_letter::DeadLetter;
use crate::consumer::group::{AckdConsumer, Group, GroupContext, StopClock};
use crate::consumer::supervisor::{self, Control};
use crate::consumer::worker::{Batching, Concurrency, WorkerConfig};
use crate::consumer::{auth, memory, topics};
use crate::exit;
use crate::output::health::{self, Health, Phase};
use crate::output::metrics::{self, CommitMetrics};
use crate::processors::processor::Processor;

/// Runs ackd until it is stopped; returns the process exit code.
pub fn run<P: Processor>(settings: Settings, processor: P) -> i32 {
    let started = Instant::now();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ackd-worker")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(at = "start_failed", error = %e, "cannot start the async runtime");
            return exit::SOFTWARE;
        }
    };
    let code = runtime.block_on(run_async(settings, processor));
    // Workers of an abandoned shutdown may still be parked; they must not hold up exit.
    runtime.shutdown_timeout(Duration::from_millis(100));
    let dropped = crate::output::lines::dropped_lines();
    tracing::info!(
        at = "exit",
        code,
        duration_ms = started.elapsed().as_millis() as u64,
        lines_dropped = (dropped > 0).then_some(dropped)
    );
    code
}

async fn run_async<P: Processor>(settings: Settings, processor: P) -> i32 {
    let rdkafka = settings.rdkafka_shown();
    tracing::info!(
        at = "start",
        version = env!("CARGO_PKG_VERSION"),
        brokers = settings.brokers.bootstrap_servers(),
        security = settings.brokers.security.protocol(),
        topics = settings.topics.join(","),
        group = &settings.group_id,
        group_protocol = settings.group_protocol.as_str(),
        // TLS, SASL and KAFKA_PREFIX (none of them shows a secret).
        kafka_prefix = settings.kafka_prefix.as_deref(),
        tls = security::tls_summary(settings.tls.as_ref()),
        sasl = security::sasl_summary(settings.sasl.as_ref()),
        group_instance_id = settings.group_instance_id.as_deref(),
        processor = processor.name(),
        commit_interval_ms = settings.commit_interval.as_millis() as u64,
        shutdown_timeout_ms = settings.shutdown_timeout.as_millis() as u64,
        start_from = settings.start_from.as_str(),
        log_messages = settings.log_messages,
        on_failure = settings.on_failure.as_str(),
        retry_max_attempts = settings.retry.max_attempts,
        ordering = settings.ordering.as_str(),
        concurrency =
            (settings.ordering != ProcessingOrder::Partition).then_some(settings.concurrency),
        max_pending =
            (settings.ordering != ProcessingOrder::Partition).then_some(settings.max_pending),
        batch_max_messages = settings.batch_max_messages,
        batch_max_wait_ms =
            (settings.batch_max_messages > 1).then_some(settings.batch_max_wait.as_millis() as u64),
        batch_max_bytes = (settings.batch_max_messages > 1 && settings.batch_max_bytes > 0)
            .then_some(settings.batch_max_bytes),
        dead_letter_topic = settings.dead_letter_topic.as_deref(),
        wait_for_topics = settings.wait_for_topics.then_some(true),
        rdkafka
    );

    // Signals first: a SIGTERM that arrives while we connect must not kill us.
    let mut signals = match Signals::new([SIGTERM, SIGINT]) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(at = "start_failed", error = %e, "cannot install signal handlers");
            return exit::SOFTWARE;
        }
    };

    // The daemon keeps a handle to call the processor's shutdown hook after the final commit.
    let processor = Arc::new(processor);
    let dead_letter = match (&settings.dead_letter_topic, settings.on_failure) {
        (Some(topic), OnFailure::DeadLetter) => {
            match DeadLetter::new(
                base_config(&settings),
                topic.clone(),
                settings.drain_budget(),
            ) {
                Ok(d) => Some(Arc::new(d)),
                Err(e) => return report_client_error(&settings, e),
            }
        }
        _ => None,
    };
    // ACKD_MEMORY_MB: librdkafka's limits are fixed when the consumer is created, so the
    // partitions the budget is divided among are counted first (src/consumer/memory.rs).
    let memory = if settings.memory_mb > 0 {
        let s = settings.clone();
        let count = tokio::task::spawn_blocking(move || {
            memory::count_partitions(&s, Duration::from_secs(10))
        });
        let partitions = tokio::select! {
            c = count => c.ok().flatten(),
            s = signals.next() => return topics::stopped_while_waiting(s),
        };
        match memory::Budget::plan(settings.memory_mb, partitions) {
            Ok(budget) => {
                budget.log(None);
                Some(budget)
            }
            Err(problem) => {
                report_setting_error(&SettingError {
                    setting: "ACKD_MEMORY_MB".into(),
                    value: Some(settings.memory_mb.to_string()),
                    problem,
                });
                return exit::CONFIG;
            }
        }
    } else {
        None
    };
    let group = Arc::new(Mutex::new(Group::default()));
    let stop_clock = Arc::new(StopClock::default());
    let at_end = settings
        .stop_at_end
        .then(|| Arc::new(tokio::sync::Notify::new()));
    let commit_metrics = Arc::new(CommitMetrics::default());
    let health = Arc::new(Health::new(
        commit_metrics.clone(),
        settings.health_stuck_after(),
        settings.shutdown_timeout + health::SUPERVISOR_MARGIN,
        &settings.metric_prefix,
    ));
    if let Some(addr) = settings.health_listen {
        // Before connecting to Kafka: /ready answers 503 while ackd connects and waits.
        match health::bind(addr).and_then(|l| health::serve(l, health.clone())) {
            Ok(()) => tracing::info!(
                at = "health_listening",
                addr = %addr,
                stuck_after_ms = settings.health_stuck_after().as_millis() as u64,
                "GET /live, /ready, /metrics"
            ),
            Err(e) => {
                report_setting_error(&health_listen_error(addr, &e));
                return exit::CONFIG;
            }
        }
    }
    let context = GroupContext {
        consumer: OnceLock::new(),
        committer: OnceLock::new(),
        commit_metrics: commit_metrics.clone(),
        source: metrics::process_source(settings.metric_source.as_deref()),
        metrics_interval: settings.metrics_interval,
        summaries_done: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
        health: health.clone(),
        released_incomplete: AtomicBool::new(false),
        stop_clock: stop_clock.clone(),
        workers_stopped: AtomicBool::new(false),
        connectivity: Default::default(),
        group: group.clone(),
        runtime: tokio::runtime::Handle::current(),
        worker: WorkerConfig {
            processor: processor.clone(),
            log_messages: settings.log_messages,
            message_source: settings.metric_source.as_deref().map(Arc::from),
            at_end: at_end.clone(),
            retry: settings.retry,
            on_failure: settings.on_failure,
            dead_letter,
            batch: Batching {
                max_messages: settings.batch_max_messages,
                max_wait: settings.batch_max_wait,
                max_bytes: settings.batch_max_bytes,
            },
            concurrency: match settings.ordering {
                ProcessingOrder::Partition => Concurrency::SEQUENTIAL,
                ordering => Concurrency {
                    ordering,
                    max_in_flight: settings.concurrency,
                    max_pending: settings.max_pending,
                },
            },
        },
        drain_timeout: settings.shutdown_timeout,
        start_from: settings.start_from,
        memory: memory.clone(),
        auth: auth::AuthFailures::new(settings.tls.as_ref().is_some_and(|t| t.client.is_some())),
    };
    let mut config = consumer_config(&settings);
    if let Some(budget) = &memory {
        budget.apply(&mut config);
    }
    let consumer: Arc<AckdConsumer<P>> = match config.create_with_context(context) {
        Ok(c) => Arc::new(c),
        Err(e) => return report_client_error(&settings, e),
    };
    let _ = consumer.context().consumer.set(Arc::downgrade(&consumer));
    match Committer::start(Arc::downgrade(&consumer), group.clone(), commit_metrics) {
        Ok(c) => {
            let _ = consumer.context().committer.set(c);
        }
        Err(e) => {
            tracing::error!(at = "start_failed", error = %e, "cannot start the committer thread");
            return exit::SOFTWARE;
        }
    }
    // A missing topic would leave ackd idle forever: stop, or wait for it, first. An
    // authentication failure meanwhile stops ackd at once: nothing is consumed yet.
    let auth_failed = auth::failed_before_subscribing(&consumer, &consumer.context().auth);
    let checked = tokio::select! {
        checked = topics::wait_until_present(&consumer, &settings, &mut signals) => checked,
        () = auth_failed => Err(exit::NOPERM),
    };
    if let Err(code) = checked {
        return code;
    }
    let topics: Vec<&str> = settings.topics.iter().map(String::as_str).collect();
    if let Err(e) = consumer.subscribe(&topics) {
        tracing::error!(at = "config_error", setting = "ACKD_TOPICS", error = %e);
        return exit::CONFIG;
    }

    let (tick_tx, commit_ticks) = mpsc::channel(1);
    let (shutdown_tx, shutdown) = watch::channel(None);
    let (committed_tx, committed_rx) = oneshot::channel();
    let (done_tx, mut done_rx) = oneshot::channel();
    let (fatal_tx, mut fatal_rx) = oneshot::channel();
    let control = Control {
        commit_ticks,
        at_end,
        shutdown,
        committed: committed_tx,
        fatal: Some(fatal_tx),
    };
    let timeout = settings.shutdown_timeout;
    let spawned = std::thread::Builder::new()
        .name("ackd-supervisor".into())
        .spawn(move || {
            let code = supervisor::run(consumer, control, timeout);
            let _ = done_tx.send(code);
        });
    if let Err(e) = spawned {
        tracing::error!(at = "start_failed", error = %e, "cannot start the supervisor thread");
        return exit::SOFTWARE;
    }

    let interval = settings.commit_interval;
    let ticker = tokio::spawn(async move {
        let mut every = tokio::time::interval(interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        loop {
            every.tick().await;
            // A full channel means a commit is already due: skipping the tick is right.
            if let Err(mpsc::error::TrySendError::Closed(_)) = tick_tx.try_send(()) {
                break;
            }
        }
    });

    // Running: until a signal, or the supervisor stops on its own (a fatal error: it says
    // so with its deadline first, then stops as after a signal).
    let (deadline, fatal_code, mut sigints) = tokio::select! {
        s = signals.next() => {
            let begun = Instant::now();
            let deadline = begun + settings.shutdown_timeout;
            // The clock before the line: a revoke holding the supervisor reads only the
            // clock, and writing a line may wait (at most lines::STALL) on a slow stdout.
            // The line before the watch: the supervisor's lines of the stop come after it.
            health.set_phase(Phase::Stopping);
            stop_clock.begin(begun, deadline);
            ticker.abort();
            tracing::info!(
                at = "signal",
                signal = signal_name(s),
                deadline_ms = settings.shutdown_timeout.as_millis() as u64,
                "graceful stop: stop fetching, finish in-flight messages, commit, leave the group"
            );
            let _ = shutdown_tx.send(Some(deadline));
            (deadline, None, SigintCount::after(s))
        }
        Ok((deadline, code)) = &mut fatal_rx => {
            ticker.abort();
            (deadline, Some(code), SigintCount::default())
        }
        code = &mut done_rx => {
            ticker.abort();
            stop_processor(processor, Instant::now() + settings.shutdown_timeout).await;
            return code.unwrap_or(exit::SOFTWARE);
        }
    };

    let mut committed_rx = committed_rx;
    let mut committed_code = None;
    // The processor's shutdown runs once the final commit is done, beside the close.
    let mut stopping = None;
    loop {
        tokio::select! {
            code = &mut done_rx => {
                match stopping.take() {
                    Some(task) => {
                        let _ = task.await;
                    }
                    None => stop_processor(processor, deadline).await,
                }
                return code.unwrap_or(exit::SOFTWARE);
            }
            code = &mut committed_rx, if committed_code.is_none() => {
                committed_code = Some(code.unwrap_or(exit::SOFTWARE));
                stopping = Some(tokio::spawn(stop_processor(processor.clone(), deadline)));
            }
            s = signals.next() => {
                if sigints.forces(s) {
                    tracing::warn!(at = "signal", signal = "SIGINT", "second SIGINT: exiting now");
                    log_uncommitted(&group);
                    return exit::FORCED;
                }
                tracing::info!(
                    at = "signal",
                    signal = signal_name(s),
                    "already stopping; a second SIGINT exits at once"
                );
            }
            _ = tokio::time::sleep_until(deadline.into()) => {
                return match committed_code {
                    // Committed; only the close (leaving the group) is slow. The group
                    // notices after session.timeout.ms instead.
                    Some(code) => {
                        tracing::warn!(at = "close_timeout", "leaving the group did not finish before the deadline; offsets are committed");
                        code
                    }
                    None => {
                        tracing::error!(at = "shutdown_timeout", "the deadline passed before the final commit");
                        log_uncommitted(&group);
                        // A fatal error's own code says more than "incomplete".
                        fatal_code.unwrap_or(exit::INCOMPLETE)
                    }
                };
            }
        }
    }
}

/// Only a second SIGINT forces the exit: a person pressing Ctrl-C again. A SIGTERM never
/// does (Heroku may send several), nor does a first SIGINT after a SIGTERM: a process
/// manager (honcho, overmind, foreman) sends SIGTERM to its children while the terminal's
/// Ctrl-C sends SIGINT to the same process group, and both arrive together.
#[derive(Debug, Default)]
struct SigintCount(u32);

impl SigintCount {
    /// The count once `first` started the stop.
    fn after(first: Option<i32>) -> Self {
        SigintCount(u32::from(first == Some(SIGINT)))
    }

    /// Counts a signal received while stopping; true if it forces the exit.
    fn forces(&mut self, signal: Option<i32>) -> bool {
        if signal == Some(SIGINT) {
            self.0 += 1;
        }
        self.0 >= 2
    }
}

/// The processor's shutdown hook, bounded by `deadline`. (Paths that give up at the
/// deadline skip it: what the processor holds is dropped with the runtime.)
/// Why the health endpoint cannot listen, naming the setting to fix: the address when
/// this host has no such address, else the port (in use, or privileged).
fn health_listen_error(addr: std::net::SocketAddr, e: &std::io::Error) -> SettingError {
    let (setting, value) = match e.kind() {
        std::io::ErrorKind::AddrNotAvailable => ("ACKD_HEALTH_ADDR", addr.ip().to_string()),
        _ => ("ACKD_HEALTH_PORT", addr.port().to_string()),
    };
    SettingError {
        setting: setting.into(),
        value: Some(value),
        problem: format!("cannot listen on {addr}: {e}"),
    }
}

async fn stop_processor<P: Processor>(processor: Arc<P>, deadline: Instant) {
    let _ = tokio::time::timeout_at(deadline.into(), processor.shutdown(deadline)).await;
}

fn signal_name(signal: Option<i32>) -> &'static str {
    match signal {
        Some(SIGTERM) => "SIGTERM",
        Some(SIGINT) => "SIGINT",
        _ => "unknown",
    }
}

/// Says, per partition, what was acknowledged and not committed: what will be redelivered.
fn log_uncommitted(group: &Mutex<Group>) {
    let Ok(group) = group.try_lock() else {
        tracing::error!(
            at = "uncommitted",
            "partition state is busy; see the lines above for the last commits"
        );
        return;
    };
    for ((topic, partition), p) in &group.owned {
        tracing::error!(
            at = "uncommitted",
            topic = &**topic,
            partition = *partition,
            acked_offset = p.worker.shared.committable(),
            committed_offset = p.committed,
            "redelivery starts at the committed offset"
        );
    }
}

/// librdkafka refused the configuration: name the setting it came from.
pub(crate) fn report_client_error(settings: &Settings, error: KafkaError) -> i32 {
    if let KafkaError::ClientConfig(_, description, property, _) = &error {
        let setting = settings
            .rdkafka
            .get(property)
            .map(|p| p.origin.clone())
            .unwrap_or_else(|| property.clone());
        let e = SettingError {
            setting,
            value: settings
                .rdkafka
                .get(property)
                .map(|p| p.shown(property).to_string()),
            problem: format!("librdkafka refused `{property}`: {description}"),
        };
        report_setting_error(&e);
        return exit::CONFIG;
    }
    // A PEM librdkafka refused (e.g. a key that is not the certificate's): name its variable.
    if let KafkaError::ClientCreation(message) = &error {
        if let Some(e) = crate::config::security::creation_error(message) {
            report_setting_error(&e);
            return exit::CONFIG;
        }
    }
    tracing::error!(at = "start_failed", error = %error, "cannot create the Kafka consumer");
    exit::SOFTWARE
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The signals received, the first one starting the stop: whether the last forced it.
    fn forced(signals: &[i32]) -> bool {
        let mut count = SigintCount::after(Some(signals[0]));
        signals[1..].iter().any(|&s| count.forces(Some(s)))
    }

    #[test]
    fn only_a_second_sigint_forces_the_exit() {
        assert!(forced(&[SIGINT, SIGINT]));
        assert!(forced(&[SIGINT, SIGTERM, SIGINT]));
        assert!(forced(&[SIGTERM, SIGINT, SIGINT]));
        assert!(!forced(&[SIGTERM, SIGINT]));
        assert!(!forced(&[SIGINT, SIGTERM]));
        assert!(!forced(&[SIGTERM, SIGTERM, SIGTERM]));
    }
}
