//! The health endpoint (`ACKD_HEALTH_PORT`): `/live`, `/ready` and `/metrics` over HTTP/1
//! for orchestrators (Kubernetes probes) and scrapers (Prometheus).
//!
//! It must never slow the consumer down: a request reads atomics the workers write
//! anyway, and takes only this module's own locks (the list of partitions, changed on
//! assignments; the lag of the last summary), never one a worker or the supervisor
//! waits on while it works.
//!
//! Progress without reading the clock per message: a thread ticks a coarse clock
//! ([`now_ms`], every [`TICK`]; below) while the endpoint is on; a
//! worker stores its value when a processor call begins and 0 when it ends
//! ([`PartitionProbe::call_started_ms`]).
//! A call that has run longer than the stuck bound is a stuck partition. A worker waiting
//! for messages, for a retry or halted is in no call: live. The supervisor marks the
//! callbacks it serves (rebalances, statistics) the same way.

mod probes;
mod prometheus;
mod server;
mod state;

pub(crate) use server::{bind, serve};
pub(crate) use state::{Busy, Health, PartitionProbe, Phase, SUPERVISOR_MARGIN};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

// The coarse clock the endpoint starts (server.rs), which workers read when a processor
// call begins.

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
