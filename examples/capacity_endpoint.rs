//! An HTTP endpoint of a fixed capacity, for `scripts/bench adaptive`: it serves
//! `--capacity` requests at once (default 20) and answers `429 Too Many Requests` to any
//! request beyond them, and each request it serves takes `--base-us` (default 5000)
//! plus `--per-request-us` (default 500) for every request in flight: its latency grows
//! with load, as a service's does when its workers share a CPU or a database.
//!
//! `GET /stats` answers what it counted so far, one line:
//! `requests=N refused=N ok=N first_us=N last_us=N` (microseconds since it started, of
//! the first POST it got and of the last answer it gave), and closes the connection.
//!
//! ```text
//! cargo run --release --example capacity_endpoint -- --port 8080 --capacity 20
//! ```
//!
//! Standard library only: a thread per connection, HTTP/1.1 keep-alive, bodies by
//! `Content-Length` (what ackd's client sends).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

struct Endpoint {
    capacity: usize,
    base: Duration,
    per_request: Duration,
    started: Instant,
    in_flight: AtomicUsize,
    requests: AtomicU64,
    refused: AtomicU64,
    ok: AtomicU64,
    /// Microseconds since `started`, plus one (0: not yet).
    first_us: AtomicU64,
    last_us: AtomicU64,
}

impl Endpoint {
    fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64 + 1
    }

    /// One POST: 429 above the capacity, else 200 after the time its load costs.
    fn serve(&self) -> (u16, &'static str) {
        self.requests.fetch_add(1, SeqCst);
        let _ = self
            .first_us
            .compare_exchange(0, self.now_us(), SeqCst, SeqCst);
        let n = self.in_flight.fetch_add(1, SeqCst) + 1;
        let answer = if n > self.capacity {
            self.refused.fetch_add(1, SeqCst);
            (429, "Too Many Requests")
        } else {
            thread::sleep(self.base + self.per_request * n as u32);
            self.ok.fetch_add(1, SeqCst);
            (200, "OK")
        };
        self.in_flight.fetch_sub(1, SeqCst);
        self.last_us.store(self.now_us(), SeqCst);
        answer
    }

    fn stats(&self) -> String {
        format!(
            "requests={} refused={} ok={} first_us={} last_us={}\n",
            self.requests.load(SeqCst),
            self.refused.load(SeqCst),
            self.ok.load(SeqCst),
            self.first_us.load(SeqCst),
            self.last_us.load(SeqCst)
        )
    }
}

/// Serves one connection's requests until it closes.
fn connection(endpoint: &Endpoint, stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header)?;
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body)?;
        if request_line.starts_with("GET /stats") {
            // Then closed: a shell reads it to the end (`cat </dev/tcp/…`).
            let text = endpoint.stats();
            let length = text.len();
            write!(
                writer,
                "HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n{text}"
            )?;
            return writer.flush();
        }
        let (status, reason) = endpoint.serve();
        write!(
            writer,
            "HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\n\r\n"
        )?;
        writer.flush()?;
    }
}

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}: a whole number, not {v}"))
        })
        .unwrap_or(default)
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let port = arg(&args, "--port", 0) as u16;
    let endpoint = Arc::new(Endpoint {
        capacity: arg(&args, "--capacity", 20) as usize,
        base: Duration::from_micros(arg(&args, "--base-us", 5000)),
        per_request: Duration::from_micros(arg(&args, "--per-request-us", 500)),
        started: Instant::now(),
        in_flight: AtomicUsize::new(0),
        requests: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        ok: AtomicU64::new(0),
        first_us: AtomicU64::new(0),
        last_us: AtomicU64::new(0),
    });
    let listener = TcpListener::bind(("127.0.0.1", port))?;
    println!("listening=127.0.0.1:{}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    for stream in listener.incoming() {
        let endpoint = endpoint.clone();
        let stream = stream?;
        thread::spawn(move || {
            let _ = connection(&endpoint, stream);
        });
    }
    Ok(())
}
