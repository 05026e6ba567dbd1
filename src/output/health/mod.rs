//! The health endpoint (`ACKD_HEALTH_PORT`): `/live`, `/ready` and `/metrics` over HTTP/1
//! for orchestrators (Kubernetes probes) and scrapers (Prometheus).
//!
//! It must never slow the consumer down: a request reads atomics the workers write
//! anyway, and takes only this module's own locks (the list of partitions, changed on
//! assignments; the lag of the last summary), never one a worker or the supervisor
//! waits on while it works.
//!
//! Progress without reading the clock per message: a thread ticks a coarse clock
//! ([`crate::clock::now_ms`], every [`crate::clock::TICK`]) while the endpoint is on; a
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
