//! The requests one child holds: given to it, not answered yet, each with its own
//! timeout from the moment it was given.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::processors::processor::{BatchError, FailureKind, Taken};

use super::protocol::{named_request, parse_reply, shorten, RequestName, Sent};

/// What an answer says of the children's load: the adaptive limit's input
/// (`ACKD_EXEC_CONCURRENCY_MODE=adaptive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Load {
    /// `{"ack":…}`: the handler kept up; its latency counts.
    Answered,
    /// `{"retry":…}`, or no reply within `ACKD_EXEC_TIMEOUT_MS`: the handler is full.
    Overloaded,
    /// A `{"fail":…}`, a crash, a protocol error, a stop: says nothing of its load.
    Unknown,
}

impl Load {
    /// What a reply the child wrote says.
    pub(super) fn of(result: &Result<(), BatchError>) -> Load {
        match result {
            Ok(()) => Load::Answered,
            Err(e) if e.error.kind == FailureKind::Retryable => Load::Overloaded,
            Err(_) => Load::Unknown,
        }
    }
}

/// A request's answer, what it says of the load, and how long the child had it.
pub(super) type Reply = (Result<(), BatchError>, Load, Duration);

/// A request a child holds, and where its answer goes.
pub(super) struct Held {
    pub(super) sent: Sent,
    reply: oneshot::Sender<Reply>,
    /// The call counts as under way (a stop or a revoke waits for it) while held.
    taken: Taken,
    /// When it runs out of time, and the order it was given in: its key in
    /// [`HeldRequests::deadlines`].
    deadline: (Instant, u64),
    /// When the child was given it: its latency is the handler's from there, not the
    /// time it waited for a child (one being restarted, say).
    given: Instant,
}

impl Held {
    pub(super) fn new(sent: Sent, reply: oneshot::Sender<Reply>, taken: Taken) -> Held {
        Held {
            sent,
            reply,
            taken,
            deadline: (Instant::now(), 0),
            given: Instant::now(),
        }
    }

    /// When the child was given it.
    pub(super) fn given(&self) -> Instant {
        self.given
    }

    /// Its answer to the worker, which may have given up on it. The call ends first,
    /// so that the next call the child takes is never counted beside it.
    pub(super) fn send(self, result: Result<(), BatchError>, load: Load) {
        let Held {
            reply,
            taken,
            given,
            ..
        } = self;
        drop(taken);
        let _ = reply.send((result, load, given.elapsed()));
    }
}

/// What one child holds.
pub(super) struct HeldRequests {
    by_name: HashMap<RequestName, Held>,
    /// When each request held runs out of time: as many entries as requests held.
    deadlines: BTreeMap<(Instant, u64), RequestName>,
    timeout: Duration,
    /// `ACKD_EXEC_IN_FLIGHT=1`: a reply answers the one request held, naming its offset.
    one_at_a_time: bool,
    given: u64,
}

impl HeldRequests {
    pub(super) fn new(timeout: Duration, in_flight: usize) -> HeldRequests {
        HeldRequests {
            by_name: HashMap::with_capacity(in_flight.min(64)),
            deadlines: BTreeMap::new(),
            timeout,
            one_at_a_time: in_flight <= 1,
            given: 0,
        }
    }

    /// The child was given `held` now. Returns a request of the same name it held, if
    /// any: that can only be one its worker gave up on (a drain that ran out of time,
    /// then the partition came back), so the later call gets the answer.
    pub(super) fn give(&mut self, mut held: Held) -> Option<Held> {
        self.given += 1;
        held.given = Instant::now();
        held.deadline = (held.given + self.timeout, self.given);
        let name = RequestName::of(&held.sent);
        self.deadlines.insert(held.deadline, name.clone());
        let displaced = self.by_name.insert(name, held)?;
        self.deadlines.remove(&displaced.deadline);
        Some(displaced)
    }

    pub(super) fn len(&self) -> usize {
        self.by_name.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The earliest moment a held request runs out of time, and its name.
    pub(super) fn earliest_deadline(&self) -> Option<(Instant, RequestName)> {
        self.deadlines
            .first_key_value()
            .map(|((at, _), name)| (*at, name.clone()))
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
        self.deadlines.remove(&held.deadline);
        Ok((held, result))
    }

    /// Every request still held, oldest first.
    pub(super) fn drain(&mut self) -> Vec<Held> {
        let mut held: Vec<Held> = self.by_name.drain().map(|(_, h)| h).collect();
        held.sort_by_key(|h| h.deadline);
        self.deadlines.clear();
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::exec::protocol::Offsets;
    use crate::processors::processor::queued;

    fn held(partition: i32, offset: i64) -> (Held, oneshot::Receiver<Reply>) {
        let (reply, answer) = oneshot::channel();
        let sent = Sent {
            topic: "t".into(),
            partition,
            offsets: Offsets::One(offset),
        };
        let taken = queued().take().expect("not dropped");
        (Held::new(sent, reply, taken), answer)
    }

    fn ack(partition: i32, offset: i64) -> String {
        format!("{{\"ack\":true,\"topic\":\"t\",\"partition\":{partition},\"offset\":{offset}}}")
    }

    #[test]
    fn replies_answer_the_request_they_name_once_in_any_order() {
        let mut requests = HeldRequests::new(Duration::from_secs(5), 10);
        let mut answers = Vec::new();
        for (p, o) in [(0, 7), (1, 7), (0, 8)] {
            let (h, a) = held(p, o);
            assert!(requests.give(h).is_none());
            answers.push(a);
        }
        // The earliest deadline is the first given; answered, it is the next one's.
        assert_eq!(requests.earliest_deadline().unwrap().1.partition, 0);
        let (h, result) = requests.answer(&ack(0, 7)).unwrap();
        assert_eq!((h.sent.partition, result), (0, Ok(())));
        h.send(Ok(()), Load::Answered);
        let next = requests.earliest_deadline().unwrap().1;
        assert_eq!((next.partition, next.first), (1, 7));
        // Out of order, then a second reply to the same one: not held any more.
        assert!(requests.answer(&ack(0, 8)).is_ok());
        let e = requests.answer(&ack(0, 8)).err().unwrap();
        assert!(e.contains("does not hold"), "{e}");
        // Never sent, or without its partition.
        assert!(requests.answer(&ack(2, 7)).is_err());
        assert!(requests.answer("{\"ack\":true,\"offset\":7}").is_err());
        assert_eq!(requests.len(), 1);
        assert_eq!(requests.drain().len(), 1);
        assert!(requests.is_empty() && requests.earliest_deadline().is_none());
        let (result, load, _latency) = answers[0].try_recv().unwrap();
        assert_eq!((result, load), (Ok(()), Load::Answered));
    }

    #[test]
    fn only_an_ack_and_a_retry_say_something_of_the_load() {
        use crate::processors::processor::ProcessError;
        let failed = |e| Err(BatchError::new(3, e));
        assert_eq!(Load::of(&Ok(())), Load::Answered);
        let retry = failed(ProcessError::retryable("full"));
        assert_eq!(Load::of(&retry), Load::Overloaded);
        let fail = failed(ProcessError::permanent("bad input"));
        assert_eq!(Load::of(&fail), Load::Unknown);
    }

    #[test]
    fn one_at_a_time_a_reply_answers_the_one_request_held_by_its_offset() {
        let mut requests = HeldRequests::new(Duration::from_secs(5), 1);
        let e = requests
            .answer("{\"ack\":true,\"offset\":3}")
            .err()
            .unwrap();
        assert!(e.contains("no message in flight"), "{e}");
        let (h, _answer) = held(0, 3);
        requests.give(h);
        assert!(requests.answer("{\"ack\":true,\"offset\":4}").is_err());
        assert!(requests.answer("{\"ack\":true,\"offset\":3}").is_ok());
    }

    #[test]
    fn the_same_message_given_again_displaces_the_one_its_worker_gave_up_on() {
        let mut requests = HeldRequests::new(Duration::from_secs(5), 10);
        let (first, _gone) = held(0, 5);
        requests.give(first);
        let (again, _answer) = held(0, 5);
        assert!(requests.give(again).is_some());
        assert_eq!(requests.len(), 1);
        assert!(requests.answer(&ack(0, 5)).is_ok());
        assert!(
            requests.earliest_deadline().is_none(),
            "no deadline left behind"
        );
    }
}
