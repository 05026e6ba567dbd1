//! Time as lines show it and as the hot path reads it: [`millis`], a duration as a
//! line's `duration_ms`-style field; and the coarse clock ([`now_ms`]) the health
//! endpoint starts (src/output/health/server.rs), which workers read when a processor
//! call begins.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How often the coarse clock ticks: the precision of "stuck for N ms".
pub const TICK: Duration = Duration::from_millis(50);

pub(crate) static CLOCK_MS: AtomicU64 = AtomicU64::new(0);
static CLOCK: OnceLock<Instant> = OnceLock::new();

/// The coarse clock, in ms since it started (at least 1); 0 while the endpoint is off.
pub fn now_ms() -> u64 {
    CLOCK_MS.load(Ordering::Relaxed)
}

/// Starts the coarse clock (once): a plain thread, so it keeps time even when every
/// runtime thread is blocked (then `/live` cannot answer, which a probe counts as dead).
pub(crate) fn start_clock() -> std::io::Result<()> {
    if CLOCK.set(Instant::now()).is_err() {
        return Ok(());
    }
    let tick = || {
        let start = CLOCK.get().copied().unwrap_or_else(Instant::now);
        CLOCK_MS.store(start.elapsed().as_millis() as u64 + 1, Ordering::Relaxed);
    };
    tick();
    std::thread::Builder::new()
        .name("ackd-health-clock".into())
        .spawn(move || loop {
            std::thread::sleep(TICK);
            tick();
        })
        .map(drop)
}

/// Milliseconds with a fraction, for duration fields.
pub fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}
