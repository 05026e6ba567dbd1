//! The probes: `/live` (no call or supervisor callback stuck) and `/ready` (in the
//! group, not stopping).

use std::sync::atomic::Ordering;

use hyper::StatusCode;

use crate::output::health::now_ms;

use super::state::{Busy, Health, Phase};

impl Health {
    /// `/live`: 200, or 503 naming what is stuck.
    pub(super) fn live(&self) -> (StatusCode, String) {
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
    pub(super) fn ready(&self) -> (StatusCode, String) {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    use crate::consumer::worker::WorkerShared;

    /// The one test that sets the clock by hand (no ticker runs in unit tests).
    #[test]
    fn live_names_a_stuck_call_and_a_stuck_supervisor() {
        let h = Health::new(
            Arc::default(),
            Duration::from_millis(1000),
            Duration::from_millis(5000),
            "ackd",
        );
        crate::output::health::CLOCK_MS.store(10_000, Ordering::Relaxed);
        let busy = Arc::new(WorkerShared::new());
        let idle = Arc::new(WorkerShared::new());
        h.assigned((Arc::from("t"), 0), idle);
        h.assigned((Arc::from("t"), 1), busy.clone());
        busy.call_begins();
        assert_eq!(h.live().0, StatusCode::OK);
        crate::output::health::CLOCK_MS.store(11_001, Ordering::Relaxed);
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
        crate::output::health::CLOCK_MS.store(14_000, Ordering::Relaxed);
        drop(h.busy(Busy::Statistics));
        crate::output::health::CLOCK_MS.store(16_002, Ordering::Relaxed);
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
