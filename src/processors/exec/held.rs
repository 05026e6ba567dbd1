//! The requests one child holds: given to it, not answered yet, each with its own
//! timeout from the moment it was given.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::processors::processor::{BatchError, Taken};

use super::protocol::{named_request, parse_reply, shorten, RequestName, Sent};

/// A request a child holds, and where its answer goes.
pub(super) struct Held {
    pub(super) sent: Sent,
    reply: oneshot::Sender<Result<(), BatchError>>,
    /// The call counts as under way (a stop or a revoke waits for it) while held.
    taken: Taken,
    /// Tells this request's deadline from an earlier one of the same name.
    seq: u64,
}

impl Held {
    pub(super) fn new(
        sent: Sent,
        reply: oneshot::Sender<Result<(), BatchError>>,
        taken: Taken,
    ) -> Held {
        Held {
            sent,
            reply,
            taken,
            seq: 0,
        }
    }

    /// Its answer to the worker, which may have given up on it. The call ends first,
    /// so that the next call the child takes is never counted beside it.
    pub(super) fn send(self, result: Result<(), BatchError>) {
        let Held { reply, taken, .. } = self;
        drop(taken);
        let _ = reply.send(result);
    }
}

/// What one child holds.
pub(super) struct HeldRequests {
    by_name: HashMap<RequestName, Held>,
    /// When each request given runs out of time, in the order given (one timeout for
    /// all, so the front is the earliest); answered ones are skipped when they come up.
    deadlines: VecDeque<(Instant, u64, RequestName)>,
    timeout: Duration,
    /// `ACKD_EXEC_IN_FLIGHT=1`: a reply answers the one request held, naming its offset.
    one_at_a_time: bool,
    given: u64,
}

impl HeldRequests {
    pub(super) fn new(timeout: Duration, in_flight: usize) -> HeldRequests {
        HeldRequests {
            by_name: HashMap::with_capacity(in_flight.min(64)),
            deadlines: VecDeque::new(),
            timeout,
            one_at_a_time: in_flight <= 1,
            given: 0,
        }
    }

    /// The child was given `held` now.
    pub(super) fn give(&mut self, mut held: Held) {
        self.given += 1;
        held.seq = self.given;
        let name = RequestName::of(&held.sent);
        self.deadlines
            .push_back((Instant::now() + self.timeout, held.seq, name.clone()));
        // The same message again can only be one its worker gave up on (a drain that
        // ran out of time, then the partition came back): the later call gets the
        // answer, the earlier one's worker no longer listens.
        self.by_name.insert(name, held);
    }

    pub(super) fn len(&self) -> usize {
        self.by_name.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The earliest moment a held request runs out of time, and its name.
    pub(super) fn earliest_deadline(&mut self) -> Option<(Instant, RequestName)> {
        while let Some((at, seq, name)) = self.deadlines.front() {
            if self.by_name.get(name).is_some_and(|h| h.seq == *seq) {
                return Some((*at, name.clone()));
            }
            self.deadlines.pop_front();
        }
        None
    }

    /// The request `line` answers, taken out, and what the answer means. `Err`: the
    /// line answers nothing this child holds (a protocol error).
    pub(super) fn answer(&mut self, line: &str) -> Result<(Held, Result<(), BatchError>), String> {
        let name = if self.one_at_a_time {
            self.by_name.keys().next().cloned().ok_or_else(|| {
                format!(
                    "wrote to stdout with no message in flight: {}",
                    shorten(line)
                )
            })?
        } else {
            named_request(line)?
        };
        let Some(held) = self.by_name.get(&name) else {
            return Err(format!(
                "reply names {name}, which this child does not hold (answered already, timed out, or never sent): {}",
                shorten(line)
            ));
        };
        let result = parse_reply(line, &held.sent)?;
        let held = self.by_name.remove(&name).expect("held, looked up above");
        Ok((held, result))
    }

    /// Every request still held, oldest first.
    pub(super) fn drain(&mut self) -> Vec<Held> {
        let mut held: Vec<Held> = self.by_name.drain().map(|(_, h)| h).collect();
        held.sort_by_key(|h| h.seq);
        self.deadlines.clear();
        held
    }
}
