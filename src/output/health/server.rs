//! The HTTP/1 server: the port bound, connections accepted and served (at most
//! [`MAX_CONNECTIONS`] at once: a new one beyond it closes the oldest), each request
//! answered.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::Notify;

use super::state::Health;

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

/// Binds the endpoint's port: done before connecting to Kafka, so that a port in use is
/// a configuration error at start and `/ready` answers (503) while ackd connects.
pub fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

impl Health {
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
    super::start_clock()?;
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

/// Connections served at once. A new one beyond them closes the oldest (see
/// [`Connections`]) rather than being refused: idle connections cannot starve a probe.
const MAX_CONNECTIONS: usize = 32;

/// The connections being served, oldest first, each with the signal that closes it.
///
/// At [`MAX_CONNECTIONS`] a new connection closes the oldest one instead of being
/// refused. Refusing it would let 32 idle connections fail every probe; not counting idle
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
