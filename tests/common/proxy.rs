//! A TCP proxy between one client and the broker, to stage network faults: it can cut
//! (stop forwarding both ways, closing nothing: a network partition), heal, reset (close
//! every connection) and delay.
//!
//! The broker advertises the proxy's port on a listener of its own
//! ([`super::broker::BrokerOptions::proxied_port`]), so a client bootstrapped through the
//! proxy makes every connection (bootstrap, coordinator, fetch) through it too; the
//! proxy counts them ([`Proxy::connections`]).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// A listening proxy; forwarding starts with [`Proxy::forward_to`].
pub struct Proxy {
    listener: Mutex<Option<TcpListener>>,
    port: u16,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    connections: AtomicUsize,
}

#[derive(Default)]
struct State {
    cut: bool,
    delay: Duration,
    /// Both ends of every connection, for a reset.
    streams: Vec<TcpStream>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Proxy {
    /// Listens on a free loopback port; nothing is accepted until [`Proxy::forward_to`].
    pub fn listen() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy: bind 127.0.0.1:0");
        let port = listener.local_addr().expect("proxy: local addr").port();
        Proxy {
            listener: Mutex::new(Some(listener)),
            port,
            shared: Arc::default(),
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT` of the proxy, for `KAFKA_URL`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts accepting, each connection forwarded to `upstream`.
    pub fn forward_to(&self, upstream: SocketAddr) {
        let Some(listener) = self
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        let shared = self.shared.clone();
        thread::Builder::new()
            .name("proxy-accept".into())
            .spawn(move || {
                for client in listener.incoming().flatten() {
                    shared.connections.fetch_add(1, Ordering::AcqRel);
                    let Ok(server) = TcpStream::connect(upstream) else {
                        let _ = client.shutdown(Shutdown::Both);
                        continue;
                    };
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    {
                        let mut s = shared.lock();
                        s.streams.extend(client.try_clone().ok());
                        s.streams.extend(server.try_clone().ok());
                    }
                    pump(&shared, &client, &server);
                    pump(&shared, &server, &client);
                }
            })
            .expect("spawn proxy accept thread");
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::Acquire)
    }

    /// Stops forwarding both ways; nothing is closed (what is sent meanwhile waits).
    pub fn cut(&self) {
        self.shared.lock().cut = true;
    }

    /// Forwards again, what waited first.
    pub fn heal(&self) {
        self.shared.lock().cut = false;
        self.shared.changed.notify_all();
    }

    /// Closes every connection (both ends); new ones are accepted as before.
    pub fn reset(&self) {
        for s in std::mem::take(&mut self.shared.lock().streams) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Holds every chunk `delay` before forwarding it.
    pub fn delay(&self, delay: Duration) {
        self.shared.lock().delay = delay;
    }
}

/// A thread copying `from` to `to`, each chunk after the delay and only while not cut.
fn pump(shared: &Arc<Shared>, from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    let shared = shared.clone();
    let _ = thread::Builder::new()
        .name("proxy-pump".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let read_at = Instant::now();
                let delay = {
                    let s = shared.lock();
                    let s = shared
                        .changed
                        .wait_while(s, |s| s.cut)
                        .unwrap_or_else(|e| e.into_inner());
                    s.delay
                };
                if let Some(wait) = (read_at + delay).checked_duration_since(Instant::now()) {
                    thread::sleep(wait);
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        });
}
