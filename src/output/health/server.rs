//! The HTTP/1 server: the port bound, connections accepted and served, each request
//! answered.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::Notify;

use super::connections::{Connections, MAX_CONNECTIONS};
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
