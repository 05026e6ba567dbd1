//! The health endpoint (`ACKD_HEALTH_PORT`): `/live`, `/ready` and `/metrics` over HTTP/1
//! for orchestrators (Kubernetes probes) and scrapers (Prometheus).
//!
//! It must never slow the consumer down: a request reads atomics the workers write
//! anyway, and takes only this module's own locks (the list of partitions, changed on
//! assignments; the lag of the last summary), never one a worker or the supervisor
//! waits on while it works.
//!
//! Progress without reading the clock per message: a thread ticks a coarse clock
//! ([`now_ms`], every [`crate::clock::TICK`]) while the endpoint is on; a worker stores its value
//! when a processor call begins and 0 when it ends ([`PartitionProbe::call_started_ms`]).
//! A call that has run longer than the stuck bound is a stuck partition. A worker waiting
//! for messages, for a retry or halted is in no call: live. The supervisor marks the
//! callbacks it serves (rebalances, statistics) the same way.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::Notify;

use crate::clock::now_ms;
use crate::output::metrics::{
    BucketCounts, CommitMetrics, Counts, PartitionMetrics, BUCKET_BOUNDS_MICROS,
};
use crate::topic_partition::TopicPartition;

/// What a supervisor callback may take beyond `ACKD_SHUTDOWN_TIMEOUT_MS`: a revoke drains
/// for that long, then commits (10 s at most) and waits 1 s for aborted workers.
pub const SUPERVISOR_MARGIN: Duration = Duration::from_secs(15);
/// Connections served at once. A new one beyond them closes the oldest (see
/// [`Connections`]) rather than being refused: idle connections cannot starve a probe.
const MAX_CONNECTIONS: usize = 32;
/// Sockets open at once, those being closed included: past it a new connection is
/// closed at once (a probe retries).
const MAX_SOCKETS: usize = 2 * MAX_CONNECTIONS;
/// How long a connection may take to send a request head, counted from its start and
/// again after each answer: a silent, slow or idle keep-alive connection is closed then.
const IDLE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one connection may stay open (keep-alive included).
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// How long a connection told to close may take to finish the answer it is writing.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Why the consumer is not ready, besides having no partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Running = 0,
    Stopping = 1,
    Fatal = 2,
}

/// What the supervisor thread is busy with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Busy {
    Assign = 1,
    Revoke = 2,
    Statistics = 3,
    /// Queuing the periodic commit (it waits for the group's lock).
    Commit = 4,
}

impl Busy {
    fn name(v: u8) -> &'static str {
        match v {
            1 => "assign",
            2 => "revoke",
            3 => "statistics",
            4 => "commit",
            _ => "unknown",
        }
    }
}

/// Marks the supervisor busy until dropped; then it is as busy as before (a callback
/// served inside another one does not end the outer one's time).
pub struct BusyGuard<'a> {
    health: &'a Health,
    since: u64,
    what: u8,
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        let h = self.health;
        h.supervisor_busy.store(self.what, Ordering::Relaxed);
        h.supervisor_since.store(self.since, Ordering::Relaxed);
    }
}

/// What the endpoint reads of a partition's worker (the consumer's `WorkerShared`):
/// atomics the worker writes anyway.
pub trait PartitionProbe: Send + Sync {
    /// When the oldest processor call under way began, on [`now_ms`]'s clock.
    fn call_started_ms(&self) -> Option<u64>;
    /// The first offset of that call.
    fn oldest_call_offset(&self) -> Option<i64>;
    /// Messages in processor calls under way.
    fn in_flight_count(&self) -> usize;
    /// Whether the partition is halted.
    fn halted(&self) -> bool;
    /// The partition's counters.
    fn metrics(&self) -> &PartitionMetrics;
}

/// The partitions a scrape sums over, and the counts of those that are gone.
#[derive(Default)]
struct Registry {
    live: BTreeMap<TopicPartition, Arc<dyn PartitionProbe>>,
    retired: Counts,
    retired_durations: BucketCounts,
}

impl Registry {
    fn retire(&mut self, shared: &dyn PartitionProbe) {
        self.retired.add(&shared.metrics().counts());
        self.retired_durations
            .add(&shared.metrics().buckets.snapshot());
    }
}

/// What the endpoint reports; the group and the supervisor keep it current.
pub struct Health {
    registry: Mutex<Registry>,
    /// Each partition's lag as the last summary computed it (`at=lag`).
    lags: Mutex<Vec<(TopicPartition, i64)>>,
    phase: AtomicU8,
    /// The group gave this member an assignment (perhaps an empty one): it is in the group.
    joined: AtomicBool,
    /// When the supervisor's current callback began (coarse clock), or 0.
    supervisor_since: AtomicU64,
    supervisor_busy: AtomicU8,
    commits: Arc<CommitMetrics>,
    /// A processor call running longer than this is stuck.
    stuck_after: Duration,
    /// A supervisor callback running longer than this is stuck.
    supervisor_after: Duration,
    /// `ACKD_METRIC_PREFIX` as a Prometheus name.
    prefix: String,
}

impl Health {
    pub fn new(
        commits: Arc<CommitMetrics>,
        stuck_after: Duration,
        supervisor_after: Duration,
        metric_prefix: &str,
    ) -> Health {
        Health {
            registry: Mutex::default(),
            lags: Mutex::default(),
            phase: AtomicU8::new(Phase::Running as u8),
            joined: AtomicBool::new(false),
            supervisor_since: AtomicU64::new(0),
            supervisor_busy: AtomicU8::new(0),
            commits,
            stuck_after,
            supervisor_after,
            prefix: prometheus_name(metric_prefix),
        }
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The group assigned this member its partitions, none perhaps (more members than
    /// partitions): it is in the group and consuming what it was given.
    pub fn joined(&self) {
        self.joined.store(true, Ordering::Release);
    }

    /// A partition got a worker.
    pub fn assigned(&self, tp: TopicPartition, shared: Arc<dyn PartitionProbe>) {
        let mut r = self.registry();
        if let Some(old) = r.live.insert(tp, shared) {
            r.retire(&*old);
        }
    }

    /// A partition left: its counts stay in the totals, in the same step (a scrape never
    /// sees them twice or not at all).
    pub fn released(&self, tp: &TopicPartition) {
        let mut r = self.registry();
        if let Some(old) = r.live.remove(tp) {
            r.retire(&*old);
        }
    }

    pub fn set_lags(&self, lags: Vec<(TopicPartition, i64)>) {
        *self.lags.lock().unwrap_or_else(|e| e.into_inner()) = lags;
    }

    /// The stop began (signal, end reached) or ackd cannot go on (`Phase::Fatal`).
    pub fn set_phase(&self, phase: Phase) {
        // A fatal error stays the reason even when the stop follows.
        let _ = self
            .phase
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                (p < phase as u8).then_some(phase as u8)
            });
    }

    /// Marks the supervisor busy with `what` until the guard is dropped.
    pub fn busy(&self, what: Busy) -> BusyGuard<'_> {
        let guard = BusyGuard {
            health: self,
            since: self.supervisor_since.load(Ordering::Relaxed),
            what: self.supervisor_busy.load(Ordering::Relaxed),
        };
        if guard.since == 0 {
            self.supervisor_busy.store(what as u8, Ordering::Relaxed);
            self.supervisor_since.store(now_ms(), Ordering::Relaxed);
        }
        guard
    }

    fn live_partitions(&self) -> Vec<(TopicPartition, Arc<dyn PartitionProbe>)> {
        self.registry()
            .live
            .iter()
            .map(|(tp, s)| (tp.clone(), s.clone()))
            .collect()
    }

    /// `/live`: 200, or 503 naming what is stuck.
    fn live(&self) -> (StatusCode, String) {
        let now = now_ms();
        let stuck_ms = self.stuck_after.as_millis() as u64;
        let mut stuck = Vec::new();
        let partitions = self.live_partitions();
        for (tp, s) in &partitions {
            if let Some(started) = s.call_started_ms() {
                let running = now.saturating_sub(started);
                if running > stuck_ms {
                    stuck.push(serde_json::json!({
                        "topic": &*tp.0,
                        "partition": tp.1,
                        "offset": s.oldest_call_offset(),
                        "in_call_ms": running,
                    }));
                }
            }
        }
        let since = self.supervisor_since.load(Ordering::Relaxed);
        let busy_ms = (since != 0).then(|| now.saturating_sub(since));
        let supervisor_stuck =
            busy_ms.is_some_and(|ms| ms > self.supervisor_after.as_millis() as u64);
        let live = stuck.is_empty() && !supervisor_stuck;
        let mut body = serde_json::json!({
            "live": live,
            "partitions": partitions.len(),
            "stuck_after_ms": stuck_ms,
            "stuck": stuck,
        });
        if let Some(ms) = busy_ms {
            body["supervisor"] = serde_json::json!({
                "busy": Busy::name(self.supervisor_busy.load(Ordering::Relaxed)),
                "busy_ms": ms,
                "stuck": supervisor_stuck,
            });
        }
        let status = if live {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        (status, format!("{body}\n"))
    }

    /// `/ready`: 200 once the group gave this member its assignment, until the stop
    /// begins. A member with no partition (more members than partitions) is ready: it is
    /// in the group, ready to take partitions over, and an orchestrator waiting for it
    /// (a rollout) must not wait forever.
    fn ready(&self) -> (StatusCode, String) {
        let partitions = self.registry().live.len();
        let reason = match self.phase.load(Ordering::Acquire) {
            p if p == Phase::Fatal as u8 => Some("fatal error"),
            p if p == Phase::Stopping as u8 => Some("stopping"),
            _ if !self.joined.load(Ordering::Acquire) => Some("not in the group yet"),
            _ => None,
        };
        let body = serde_json::json!({
            "ready": reason.is_none(),
            "partitions": partitions,
            "reason": reason,
        });
        let status = match reason {
            None => StatusCode::OK,
            Some(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        (status, format!("{body}\n"))
    }

    /// `/metrics`: the summary line's vocabulary in Prometheus's text format 0.0.4, as
    /// totals since start.
    fn metrics(&self) -> String {
        // One look at the list: the retired counts and the live partitions agree.
        let (mut counts, mut durations, owned, partitions) = {
            let r = self.registry();
            let owned: Vec<TopicPartition> = r.live.keys().cloned().collect();
            let live: Vec<Arc<dyn PartitionProbe>> = r.live.values().cloned().collect();
            (r.retired, r.retired_durations, owned, live)
        };
        let mut in_flight = 0u64;
        let mut halted = 0u64;
        for s in &partitions {
            counts.add(&s.metrics().counts());
            durations.add(&s.metrics().buckets.snapshot());
            in_flight += s.in_flight_count() as u64;
            halted += u64::from(s.halted());
        }
        let lags: Vec<(TopicPartition, i64)> = self
            .lags
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(tp, _)| owned.contains(tp))
            .cloned()
            .collect();
        let p = &self.prefix;
        let mut out = String::with_capacity(4096);
        let counters = [
            (
                "received",
                "Messages handed to the processor.",
                counts.received,
            ),
            (
                "processed",
                "Messages the processor acknowledged.",
                counts.processed,
            ),
            ("failed", "Processor calls that failed.", counts.failed),
            ("retried", "Retries of a failed message.", counts.retried),
            (
                "skipped",
                "Messages skipped after failing (ACKD_ON_FAILURE=skip).",
                counts.skipped,
            ),
            (
                "dead_lettered",
                "Messages sent to the dead-letter topic.",
                counts.dead_lettered,
            ),
            (
                "commits",
                "Commits the broker accepted.",
                self.commits.commits_total.load(Ordering::Relaxed),
            ),
            (
                "commit_failures",
                "Commits that failed.",
                self.commits.failures_total.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP {p}_{name}_total {help}");
            let _ = writeln!(out, "# TYPE {p}_{name}_total counter");
            let _ = writeln!(out, "{p}_{name}_total {value}");
        }
        histogram(
            &mut out,
            &format!("{p}_process_duration_seconds"),
            "Duration of processor calls (per batch with batches; fast calls sampled, weighted).",
            &durations,
        );
        histogram(
            &mut out,
            &format!("{p}_commit_duration_seconds"),
            "Duration of commits.",
            &self.commits.buckets.snapshot(),
        );
        let gauges = [
            (
                "in_flight",
                "Processor calls under way (at most one per partition, or ACKD_CONCURRENCY with key or none ordering).",
                in_flight,
            ),
            (
                "partitions",
                "Partitions assigned to this process.",
                partitions.len() as u64,
            ),
            (
                "partitions_halted",
                "Partitions stopped on a processor failure (ACKD_ON_FAILURE=halt).",
                halted,
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {p}_{name} {help}");
            let _ = writeln!(out, "# TYPE {p}_{name} gauge");
            let _ = writeln!(out, "{p}_{name} {value}");
        }
        let _ = writeln!(
            out,
            "# HELP {p}_lag Messages after the next one to process, per partition, as of the last summary."
        );
        let _ = writeln!(out, "# TYPE {p}_lag gauge");
        for ((topic, partition), lag) in lags {
            let _ = writeln!(
                out,
                "{p}_lag{{topic=\"{}\",partition=\"{partition}\"}} {}",
                label_value(&topic),
                lag.max(0)
            );
        }
        out
    }

    /// Answers one request.
    fn respond<B>(&self, request: &Request<B>) -> Response<Full<Bytes>> {
        if request.method() != Method::GET && request.method() != Method::HEAD {
            return reply(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain; charset=utf-8",
                "GET /live, /ready or /metrics\n".into(),
            );
        }
        let json = "application/json";
        match request.uri().path() {
            "/live" => {
                let (status, body) = self.live();
                reply(status, json, body)
            }
            "/ready" => {
                let (status, body) = self.ready();
                reply(status, json, body)
            }
            "/metrics" => reply(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                self.metrics(),
            ),
            _ => reply(
                StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                "not found: GET /live, /ready or /metrics\n".into(),
            ),
        }
    }
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, v);
    }
    response
}

/// A Prometheus histogram of `b`: cumulative buckets, sum and count.
fn histogram(out: &mut String, name: &str, help: &str, b: &BucketCounts) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    let mut cumulative = 0;
    for (bound, count) in BUCKET_BOUNDS_MICROS.iter().zip(&b.counts) {
        cumulative += count;
        let le = *bound as f64 / 1e6;
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
    }
    cumulative += b.counts[BUCKET_BOUNDS_MICROS.len()];
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
    let _ = writeln!(out, "{name}_sum {}", b.sum_micros as f64 / 1e6);
    let _ = writeln!(out, "{name}_count {cumulative}");
}

/// A label value with Prometheus's escapes (`\`, `"`, newline).
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `ACKD_METRIC_PREFIX` as a metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`, other characters as `_`.
fn prometheus_name(prefix: &str) -> String {
    let mut name: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    name
}

/// Binds the endpoint's port: done before connecting to Kafka, so that a port in use is
/// a configuration error at start and `/ready` answers (503) while ackd connects.
pub fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// The connections being served, oldest first, each with the signal that closes it.
///
/// At [`MAX_CONNECTIONS`] a new connection closes the oldest one instead of being
/// refused. Refusing it let 32 idle connections fail every probe; not counting idle
/// connections at all would let them take every file descriptor. The oldest goes
/// because a probe is the newest (it sends its request as it connects) and a connection
/// between requests may be closed at any time in HTTP/1.1 (clients reconnect); one
/// that is answering finishes its answer first ([`CLOSE_GRACE`]).
#[derive(Default)]
struct Connections {
    open: Mutex<VecDeque<(u64, Arc<Notify>)>>,
    next_id: AtomicU64,
}

/// One connection's place in [`Connections`], left when dropped.
struct Admitted {
    connections: Arc<Connections>,
    id: u64,
    /// Notified when a newer connection needs the place.
    close: Arc<Notify>,
}

impl Connections {
    fn open(&self) -> MutexGuard<'_, VecDeque<(u64, Arc<Notify>)>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a place for a new connection; at the limit, tells the oldest to close.
    fn admit(self: &Arc<Self>) -> Admitted {
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

/// Serves one connection until the client closes it, it is idle for [`IDLE_TIMEOUT`],
/// it has lived [`CONNECTION_LIFETIME`], or a newer one needs its place.
async fn serve_connection(stream: tokio::net::TcpStream, health: Arc<Health>, close: &Notify) {
    let service = hyper::service::service_fn(move |request| {
        let response = health.respond(&request);
        async move { Ok::<_, Infallible>(response) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        // hyper runs it from the connection's start and again after each answer: the
        // idle timeout as well.
        .header_read_timeout(IDLE_TIMEOUT)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => return,
        _ = close.notified() => {}
        _ = tokio::time::sleep(CONNECTION_LIFETIME) => {}
    }
    // Closes at once between requests; finishes an answer under way first.
    connection.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(CLOSE_GRACE, connection).await;
}

/// Serves the endpoint on the runtime until the process ends.
pub fn serve(listener: std::net::TcpListener, health: Arc<Health>) -> std::io::Result<()> {
    crate::clock::start_clock()?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let sockets = Arc::new(tokio::sync::Semaphore::new(MAX_SOCKETS));
    let connections = Arc::new(Connections::default());
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, typically: wait rather than spin.
                    tracing::warn!(at = "health_error", error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(socket) = sockets.clone().try_acquire_owned() else {
                continue; // dropped: closed
            };
            let admitted = connections.admit();
            let health = health.clone();
            tokio::spawn(async move {
                serve_connection(stream, health, &admitted.close).await;
                drop((admitted, socket));
            });
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::worker::WorkerShared;

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

    #[test]
    fn prefixes_become_metric_names() {
        assert_eq!(prometheus_name("ackd"), "ackd");
        assert_eq!(prometheus_name("my.app-1"), "my_app_1");
        assert_eq!(prometheus_name("1x"), "_1x");
        assert_eq!(prometheus_name(""), "_");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(label_value("a\nb"), "a\\nb");
    }

    #[test]
    fn histograms_are_cumulative() {
        let mut b = BucketCounts::default();
        b.counts[0] = 2;
        b.counts[3] = 1;
        b.counts[BUCKET_BOUNDS_MICROS.len()] = 1;
        b.sum_micros = 20_000_000;
        let mut out = String::new();
        histogram(&mut out, "x", "h", &b);
        assert!(out.contains("x_bucket{le=\"0.001\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.025\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"10\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("x_sum 20\n"), "{out}");
        assert!(out.contains("x_count 4\n"), "{out}");
    }

    /// The one test that sets the clock by hand (no ticker runs in unit tests).
    #[test]
    fn live_names_a_stuck_call_and_a_stuck_supervisor() {
        let h = Health::new(
            Arc::default(),
            Duration::from_millis(1000),
            Duration::from_millis(5000),
            "ackd",
        );
        crate::clock::CLOCK_MS.store(10_000, Ordering::Relaxed);
        let busy = Arc::new(WorkerShared::new());
        let idle = Arc::new(WorkerShared::new());
        h.assigned((Arc::from("t"), 0), idle);
        h.assigned((Arc::from("t"), 1), busy.clone());
        busy.call_begins();
        assert_eq!(h.live().0, StatusCode::OK);
        crate::clock::CLOCK_MS.store(11_001, Ordering::Relaxed);
        let (status, body) = h.live();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["stuck"].as_array().unwrap().len(), 1, "{body}");
        assert_eq!(body["stuck"][0]["partition"], 1);
        assert_eq!(body["stuck"][0]["in_call_ms"], 1001);
        busy.call_ended();
        assert_eq!(h.live().0, StatusCode::OK);

        // The supervisor: an inner callback does not restart the outer one's time.
        let outer = h.busy(Busy::Revoke);
        crate::clock::CLOCK_MS.store(14_000, Ordering::Relaxed);
        drop(h.busy(Busy::Statistics));
        crate::clock::CLOCK_MS.store(16_002, Ordering::Relaxed);
        let (status, body) = h.live();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(body.contains(r#""busy":"revoke""#), "{body}");
        drop(outer);
        let (status, body) = h.live();
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(!body.contains("supervisor"), "{body}");
    }

    #[test]
    fn ready_needs_an_assignment_and_no_stop() {
        let h = Health::new(
            Arc::default(),
            Duration::from_secs(1),
            Duration::from_secs(1),
            "ackd",
        );
        assert_eq!(h.ready().0, StatusCode::SERVICE_UNAVAILABLE);
        // An empty assignment: in the group, with nothing to do.
        h.joined();
        assert_eq!(h.ready().0, StatusCode::OK);
        let shared = Arc::new(WorkerShared::new());
        h.assigned((Arc::from("t"), 0), shared);
        assert_eq!(h.ready().0, StatusCode::OK);
        h.set_phase(Phase::Fatal);
        h.set_phase(Phase::Stopping);
        let (status, body) = h.ready();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("fatal error"), "{body}");
    }
}
