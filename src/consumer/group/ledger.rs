//! The group as membership's members (src/consumer/membership.rs) and as the
//! committer's ledger ([`CommitLedger`]).

use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;

use super::Group;
use crate::consumer::committer::{Accepted, CommitLedger, CommitOffset, Limit};
use crate::consumer::membership;
use crate::topic_partition::TopicPartition;

impl membership::Members for Group {
    fn doubt_slot(&mut self) -> &mut Option<membership::Doubt> {
        &mut self.doubt
    }

    fn lease(&mut self) -> &mut membership::Lease {
        &mut self.lease
    }

    fn owns_nothing(&self) -> bool {
        self.owned.is_empty()
    }

    fn owned_partitions(&self) -> Vec<&TopicPartition> {
        self.owned.keys().collect()
    }

    fn hold_owned(&self, hold: bool) {
        for p in self.owned.values() {
            if hold {
                p.worker.shared.hold.hold();
            } else {
                p.worker.shared.hold.lift();
            }
        }
    }

    fn confirming(&self) -> Vec<CommitOffset> {
        Group::confirming(self)
    }
}

impl CommitLedger for Group {
    fn watch_stalls(group: Weak<Mutex<Group>>) -> std::io::Result<()> {
        membership::watch_stalls(group)
    }

    fn confirmation_due(&mut self) -> Option<Vec<CommitOffset>> {
        membership::confirmation_due(self)
    }

    fn renewal_due(&mut self) -> Option<(TopicPartition, Duration)> {
        membership::renewal_due(self)
    }

    fn renewed(&mut self, sent_at: Instant) {
        membership::renewed(self, sent_at);
    }

    fn accepted(&mut self, c: &CommitOffset, accepted: &Accepted) {
        if let Some(p) = self.owned.get_mut(&c.tp) {
            p.committed = Some(c.offset);
            p.released = accepted.released;
            p.committed_acked = if accepted.with_ranges {
                c.acked.clone()
            } else {
                Vec::new()
            };
            let limit = &p.worker.shared.dispatch;
            match accepted.limit {
                Limit::Recorded(l) => limit.accept(l),
                Limit::Unchanged => {}
                Limit::None => limit.lift(),
            }
        }
    }

    fn confirmed_by_commit(&mut self, sent_at: Instant) {
        membership::confirmed_by_commit(self, sent_at);
    }

    fn doubted(&mut self, error: &KafkaError) {
        membership::doubt(self, membership::Cause::Refused(error));
    }
}
