//! Starting ackd: the start line, the dead-letter producer, the memory plan, the health
//! endpoint, the consumer and its subscription.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use signal_hook_tokio::Signals;
use tokio::sync::Notify;

use crate::consumer::committer::Committer;
use crate::consumer::copier::Copier;
use crate::consumer::group::{AckdConsumer, Group, GroupContext};
use crate::consumer::stop::stopped_while_waiting;
use crate::consumer::stop::StopClock;
use crate::consumer::worker::{Batching, Concurrency, LimitPolicy, WorkerConfig};
use crate::consumer::{auth, memory, topics};
use crate::exit;
use crate::output::health::{self, Health};
use crate::output::metrics::{self, CommitMetrics};
use crate::processors::processor::Processor;
use crate::settings::client_config::{base_config, consumer_config};
use crate::settings::security;
use crate::settings::OnFailure;
use crate::settings::{report_setting_error, SettingError};
use crate::settings::{ProcessingOrder, Settings};

/// The `at=start` line: the settings ackd runs with (none of them shows a secret).
pub(super) fn log_start<P: Processor>(
    settings: &Settings,
    processor: &P,
    memory: Option<&memory::Limit>,
) {
    let rdkafka = settings.rdkafka_shown();
    tracing::info!(
        at = "start",
        version = env!("CARGO_PKG_VERSION"),
        brokers = settings.brokers.bootstrap_servers(),
        security = settings.brokers.security.protocol(),
        topics = settings.topics.join(","),
        group = &settings.group_id,
        group_protocol = settings.group.protocol.as_str(),
        // TLS, SASL and KAFKA_PREFIX (none of them shows a secret).
        kafka_prefix = settings.kafka_prefix.as_deref(),
        tls = security::tls_summary(settings.tls.as_ref()),
        sasl = security::sasl_summary(settings.sasl.as_ref()),
        group_instance_id = settings.group.instance_id.as_deref(),
        processor = processor.name(),
        commit_interval_ms = settings.commit_interval.as_millis() as u64,
        shutdown_timeout_ms = settings.shutdown_timeout.as_millis() as u64,
        start_from = settings.group.start_from.as_str(),
        log_messages = settings.logging.log_messages,
        on_failure = settings.failure.on_failure.as_str(),
        retry_max_attempts = settings.failure.retry.max_attempts,
        ordering = settings.concurrency.ordering.as_str(),
        concurrency = (settings.concurrency.ordering != ProcessingOrder::Partition)
            .then_some(settings.concurrency.max_in_flight),
        max_pending = (settings.concurrency.ordering != ProcessingOrder::Partition)
            .then_some(settings.concurrency.max_pending),
        batch_max_messages = settings.batching.max_messages,
        batch_max_wait_ms = (settings.batching.max_messages > 1)
            .then_some(settings.batching.max_wait.as_millis() as u64),
        batch_max_bytes = (settings.batching.max_messages > 1 && settings.batching.max_bytes > 0)
            .then_some(settings.batching.max_bytes),
        dead_letter_topic = settings.failure.dead_letter_topic.as_deref(),
        retry_topics = (!settings.failure.retry_tiers.is_empty()).then(|| settings
            .failure
            .retry_tiers
            .topics()
            .join(",")),
        wait_for_topics = settings.wait_for_topics.then_some(true),
        // The budget and where it came from (src/consumer/memory.rs); off: neither.
        memory_mb = memory.map(|m| m.mb),
        memory_limit = memory.map_or("off", |m| m.source.as_str()),
        cgroup_limit_mb = memory.and_then(|m| m.source.cgroup_limit_mb()),
        rdkafka
    );
}

/// The producer of copies: with `ACKD_ON_FAILURE=dead-letter` and a topic, or with retry
/// tiers. `Err(code)`: librdkafka refused it.
pub(super) fn copier(settings: &Settings) -> Result<Option<Arc<Copier>>, i32> {
    let dead_letter_topic = match settings.failure.on_failure {
        OnFailure::DeadLetter => settings.failure.dead_letter_topic.clone(),
        _ => None,
    };
    if dead_letter_topic.is_none() && settings.failure.retry_tiers.is_empty() {
        return Ok(None);
    }
    match Copier::new(
        base_config(settings),
        dead_letter_topic,
        settings.drain_budget(),
    ) {
        Ok(c) => Ok(Some(Arc::new(c))),
        Err(e) => Err(report_client_error(settings, e)),
    }
}

/// The memory budget: librdkafka's limits are fixed when the consumer is created, so the
/// partitions it is divided among are counted first (src/consumer/memory.rs).
/// `Err(code)`: a signal came meanwhile, or the budget is too small.
pub(super) async fn plan_memory(
    settings: &Settings,
    limit: Option<memory::Limit>,
    signals: &mut Signals,
) -> Result<Option<memory::Budget>, i32> {
    let Some(limit) = limit else {
        return Ok(None);
    };
    let s = settings.clone();
    let count =
        tokio::task::spawn_blocking(move || memory::count_partitions(&s, Duration::from_secs(10)));
    let partitions = tokio::select! {
        c = count => c.ok().flatten(),
        s = signals.next() => return Err(stopped_while_waiting(s)),
    };
    match memory::Budget::plan(&limit, partitions, memory::Caps::of(settings)) {
        Ok(budget) => {
            budget.log(None);
            Ok(Some(budget))
        }
        Err(problem) => {
            report_setting_error(&SettingError {
                setting: "ACKD_MEMORY_MB".into(),
                value: Some(match limit.source {
                    memory::Source::Setting => limit.mb.to_string(),
                    _ => "auto".into(),
                }),
                problem,
            });
            Err(exit::CONFIG)
        }
    }
}

/// The membership lease's terms, from the session this member is under
/// (src/consumer/daemon/session.rs), set on the group before it owns anything.
/// `Err(code)`: a signal came meanwhile.
pub(super) async fn lease(
    settings: &Settings,
    parts: &Parts,
    signals: &mut Signals,
) -> Result<(), i32> {
    let s = settings.clone();
    let read = tokio::task::spawn_blocking(move || {
        super::session::lease_terms(&s, Duration::from_secs(5))
    });
    let terms = tokio::select! {
        t = read => t.map_err(|_| exit::SOFTWARE)?,
        s = signals.next() => return Err(stopped_while_waiting(s)),
    };
    crate::consumer::membership::lease_under(&mut *lock(&parts.group), terms);
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the daemon shares with the consumer's context and the supervisor.
pub(super) struct Parts {
    pub(super) group: Arc<Mutex<Group>>,
    pub(super) stop_clock: Arc<StopClock>,
    /// With `ACKD_STOP_AT_END`: notified when a partition reached its end.
    pub(super) at_end: Option<Arc<Notify>>,
    /// Notified when a worker wants its dispatch limit raised now: the supervisor commits.
    pub(super) commit_wanted: Arc<Notify>,
    pub(super) commit_metrics: Arc<CommitMetrics>,
    pub(super) health: Arc<Health>,
    pub(super) memory: Option<memory::Budget>,
}

impl Parts {
    pub(super) fn new(settings: &Settings, memory: Option<memory::Budget>) -> Self {
        let commit_metrics = Arc::new(CommitMetrics::default());
        Parts {
            group: Arc::new(Mutex::new(Group::default())),
            stop_clock: Arc::new(StopClock::default()),
            at_end: settings.stop_at_end.then(|| Arc::new(Notify::new())),
            commit_wanted: Arc::new(Notify::new()),
            health: Arc::new(Health::new(
                commit_metrics.clone(),
                settings.health_stuck_after(),
                settings.shutdown_timeout + health::SUPERVISOR_MARGIN,
                &settings.logging.metric_prefix,
            )),
            commit_metrics,
            memory,
        }
    }
}

/// The health endpoint, with `ACKD_HEALTH_PORT`: before connecting to Kafka, /ready
/// answers 503 while ackd connects and waits. `Err(code)`: it cannot listen.
pub(super) fn serve_health(settings: &Settings, health: &Arc<Health>) -> Result<(), i32> {
    let Some(addr) = settings.health.listen else {
        return Ok(());
    };
    match health::bind(addr).and_then(|l| health::serve(l, health.clone())) {
        Ok(()) => {
            tracing::info!(
                at = "health_listening",
                addr = %addr,
                stuck_after_ms = settings.health_stuck_after().as_millis() as u64,
                "GET /live, /ready, /metrics"
            );
            Ok(())
        }
        Err(e) => {
            report_setting_error(&health_listen_error(addr, &e));
            Err(exit::CONFIG)
        }
    }
}

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

/// What each partition's worker gets.
pub(super) fn worker_config<P: Processor>(
    settings: &Settings,
    processor: Arc<P>,
    parts: &Parts,
    copier: Option<Arc<Copier>>,
) -> WorkerConfig<P> {
    // What a worker may hold taken out of its queue under the budget (0: no budget).
    let taken = parts.memory.as_ref().map_or(0, memory::Budget::taken_bytes);
    WorkerConfig {
        processor,
        log_messages: settings.logging.log_messages,
        message_source: settings.logging.metric_source.as_deref().map(Arc::from),
        at_end: parts.at_end.clone(),
        retry: settings.failure.retry,
        on_failure: settings.failure.on_failure,
        copier,
        retry_tiers: Arc::new(settings.failure.retry_tiers.clone()),
        from_tier: false,
        batch: Batching {
            max_messages: settings.batching.max_messages,
            max_wait: settings.batching.max_wait,
            max_bytes: memory::Budget::batch_max_bytes(
                parts.memory.as_ref(),
                settings.batching.max_bytes,
            ),
        },
        concurrency: match settings.concurrency.ordering {
            ProcessingOrder::Partition => Concurrency::SEQUENTIAL,
            ordering => Concurrency {
                ordering,
                max_in_flight: settings.concurrency.max_in_flight,
                max_pending: settings.concurrency.max_pending,
                max_pending_bytes: taken,
            },
        },
        limits: LimitPolicy {
            window_max: i64::try_from(settings.redelivery_window_max).unwrap_or(i64::MAX),
            commit_interval: settings.commit_interval,
            commit_wanted: parts.commit_wanted.clone(),
        },
        taken_max_bytes: taken,
        delay_ms: settings.concurrency.delay.as_millis() as u64,
    }
}

/// The consumer's context: what its rebalance callbacks need.
fn group_context<P: Processor>(
    settings: &Settings,
    parts: &Parts,
    worker: WorkerConfig<P>,
) -> GroupContext<P> {
    GroupContext {
        consumer: OnceLock::new(),
        committer: OnceLock::new(),
        commit_metrics: parts.commit_metrics.clone(),
        source: metrics::process_source(settings.logging.metric_source.as_deref()),
        metrics_interval: settings.logging.metrics_interval,
        summaries_done: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
        health: parts.health.clone(),
        released_incomplete: AtomicBool::new(false),
        stop_clock: parts.stop_clock.clone(),
        workers_stopped: AtomicBool::new(false),
        connectivity: Default::default(),
        group: parts.group.clone(),
        runtime: tokio::runtime::Handle::current(),
        worker,
        drain_timeout: settings.shutdown_timeout,
        start_from: settings.group.start_from,
        memory: parts.memory.clone(),
        auth: auth::AuthFailures::new(settings.tls.as_ref().is_some_and(|t| t.client.is_some())),
    }
}

/// The consumer, with its committer thread. `Err(code)`: either could not be created.
pub(super) fn create_consumer<P: Processor>(
    settings: &Settings,
    parts: &Parts,
    worker: WorkerConfig<P>,
) -> Result<Arc<AckdConsumer<P>>, i32> {
    let context = group_context(settings, parts, worker);
    let mut config = consumer_config(settings);
    if let Some(budget) = &parts.memory {
        budget.apply(&mut config);
    }
    let consumer: Arc<AckdConsumer<P>> = match config.create_with_context(context) {
        Ok(c) => Arc::new(c),
        Err(e) => return Err(report_client_error(settings, e)),
    };
    let _ = consumer.context().consumer.set(Arc::downgrade(&consumer));
    match Committer::start(
        Arc::downgrade(&consumer),
        parts.group.clone(),
        parts.commit_metrics.clone(),
    ) {
        Ok(c) => {
            let _ = consumer.context().committer.set(c);
        }
        Err(e) => {
            tracing::error!(at = "start_failed", error = %e, "cannot start the committer thread");
            return Err(exit::SOFTWARE);
        }
    }
    Ok(consumer)
}

/// Subscribes to `ACKD_TOPICS` once they exist. A missing topic would leave ackd idle
/// forever: stop, or wait for it, first. An authentication failure meanwhile stops ackd
/// at once: nothing is consumed yet. `Err(code)`: ackd exits with `code`.
pub(super) async fn subscribe<P: Processor>(
    consumer: &Arc<AckdConsumer<P>>,
    settings: &Settings,
    signals: &mut Signals,
) -> Result<(), i32> {
    let auth_failed = auth::failed_before_subscribing(consumer, &consumer.context().auth);
    let checked = tokio::select! {
        checked = topics::wait_until_present(consumer, settings, signals) => checked,
        () = auth_failed => Err(exit::NOPERM),
    };
    checked?;
    size_copies(consumer, settings).await?;
    let consumed = settings.consumed_topics();
    let topics: Vec<&str> = consumed.iter().map(String::as_str).collect();
    if let Err(e) = consumer.subscribe(&topics) {
        tracing::error!(at = "config_error", setting = "ACKD_TOPICS", error = %e);
        return Err(exit::CONFIG);
    }
    Ok(())
}

/// The copies of failed messages sized to what their topics take, read once the
/// topics are known to exist. `Err(code)`: librdkafka refused the producer.
async fn size_copies<P: Processor>(
    consumer: &Arc<AckdConsumer<P>>,
    settings: &Settings,
) -> Result<(), i32> {
    let Some(copier) = consumer.context().worker.copier.clone() else {
        return Ok(());
    };
    let targets = copier.topics(settings.failure.retry_tiers.topics());
    let limits =
        topics::max_message_bytes(&base_config(settings), &targets, Duration::from_secs(10)).await;
    tracing::info!(
        at = "copy_limits",
        topics = targets.join(","),
        max_message_bytes = targets
            .iter()
            .map(|t| limits
                .get(t)
                .map_or_else(|| "unknown".to_string(), |b| b.to_string()))
            .collect::<Vec<_>>()
            .join(","),
        error_max_bytes = crate::consumer::copier::ERROR_MAX_BYTES
    );
    copier
        .size_to(limits)
        .map_err(|e| report_client_error(settings, e))
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
        if let Some(e) = crate::settings::security::creation_error(message) {
            report_setting_error(&e);
            return exit::CONFIG;
        }
    }
    tracing::error!(at = "start_failed", error = %error, "cannot create the Kafka consumer");
    exit::SOFTWARE
}
