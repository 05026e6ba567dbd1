//! The group's description through librdkafka's admin API
//! (`rd_kafka_DescribeConsumerGroups`, librdkafka 2.12): it answers for classic groups
//! (DescribeGroups, the assignment decoded) and for KIP-848 groups (`group.protocol=
//! consumer`: ConsumerGroupDescribe), which the classic DescribeGroups behind
//! rust-rdkafka's `fetch_group_list` reports as a group that does not exist.
//! rust-rdkafka 0.39 has no safe wrapper for it, hence the FFI here, kept to copying
//! the answer out before the event that owns it is destroyed.
//!
//! [`describe_group`] falls back to the classic DescribeGroups when the admin API fails
//! (the members' assignments decoded here, `decode`); either way the answer is a
//! [`GroupDescription`].

use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::consumer::Consumer;
use rdkafka::types::RDKafkaErrorCode;

use rdkafka::error::KafkaError;

use super::connect::{Probe, REQUEST};

/// Copies a C string librdkafka owns; `""` for null.
///
/// # Safety
/// `p` is null or a valid NUL-terminated string.
unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// Describes `group`; `Err` carries librdkafka's reason.
pub fn describe(probe: &Probe, group: &str, timeout: Duration) -> Result<GroupDescription, String> {
    let group_c = CString::new(group).map_err(|_| "the group id holds a NUL byte".to_string())?;
    let rk = probe.client().native_ptr();
    let millis = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: rk lives as long as `probe`; every object created here is destroyed before
    // returning, and nothing that points into the event outlives it.
    unsafe {
        let queue = rd::rd_kafka_queue_new(rk);
        let options = rd::rd_kafka_AdminOptions_new(
            rk,
            rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBECONSUMERGROUPS,
        );
        let mut errstr = [0 as c_char; 256];
        rd::rd_kafka_AdminOptions_set_request_timeout(
            options,
            millis,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        let mut groups = [group_c.as_ptr()];
        rd::rd_kafka_DescribeConsumerGroups(rk, groups.as_mut_ptr(), 1, options, queue);
        // The request times out on its own; the poll waits a little longer for that answer.
        let event = rd::rd_kafka_queue_poll(queue, millis.saturating_add(2000));
        let result = if event.is_null() {
            Err("no answer to DescribeConsumerGroups".to_string())
        } else {
            let r = read(event);
            rd::rd_kafka_event_destroy(event);
            r
        };
        rd::rd_kafka_AdminOptions_destroy(options);
        rd::rd_kafka_queue_destroy(queue);
        result
    }
}

/// # Safety
/// `event` is a live DescribeConsumerGroups result event.
unsafe fn read(event: *mut rd::rd_kafka_event_t) -> Result<GroupDescription, String> {
    if rd::rd_kafka_event_error(event) != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return Err(text(rd::rd_kafka_event_error_string(event)));
    }
    let result = rd::rd_kafka_event_DescribeConsumerGroups_result(event);
    if result.is_null() {
        return Err("not a DescribeConsumerGroups result".to_string());
    }
    let mut count = 0usize;
    let groups = rd::rd_kafka_DescribeConsumerGroups_result_groups(result, &mut count);
    if groups.is_null() || count == 0 {
        return Err("no group in the answer".to_string());
    }
    let g = *groups;
    let error = rd::rd_kafka_ConsumerGroupDescription_error(g);
    if !error.is_null() {
        let code = RDKafkaErrorCode::from(rd::rd_kafka_error_code(error));
        if code == RDKafkaErrorCode::GroupIdNotFound {
            return Ok(GroupDescription {
                state: "Dead".to_string(),
                ..GroupDescription::default()
            });
        }
        return Err(text(rd::rd_kafka_error_string(error)));
    }
    let state = text(rd::rd_kafka_consumer_group_state_name(
        rd::rd_kafka_ConsumerGroupDescription_state(g),
    ));
    let kind = text(rd::rd_kafka_consumer_group_type_name(
        rd::rd_kafka_ConsumerGroupDescription_type(g),
    ));
    let mut members = Vec::new();
    for i in 0..rd::rd_kafka_ConsumerGroupDescription_member_count(g) {
        let m = rd::rd_kafka_ConsumerGroupDescription_member(g, i);
        if m.is_null() {
            continue;
        }
        let assignment = rd::rd_kafka_MemberDescription_assignment(m);
        let partitions = if assignment.is_null() {
            std::ptr::null()
        } else {
            rd::rd_kafka_MemberAssignment_partitions(assignment)
        };
        let assigned = (!partitions.is_null()).then(|| {
            let list = &*partitions;
            let mut by_topic: Vec<(String, Vec<i32>)> = Vec::new();
            for j in 0..usize::try_from(list.cnt).unwrap_or(0) {
                let e = &*list.elems.add(j);
                let topic = text(e.topic);
                match by_topic.iter_mut().find(|(t, _)| *t == topic) {
                    Some((_, ps)) => ps.push(e.partition),
                    None => by_topic.push((topic, vec![e.partition])),
                }
            }
            by_topic
        });
        members.push(Member {
            id: text(rd::rd_kafka_MemberDescription_consumer_id(m)),
            client_id: text(rd::rd_kafka_MemberDescription_client_id(m)),
            host: text(rd::rd_kafka_MemberDescription_host(m))
                .trim_start_matches('/')
                .to_string(),
            assignment: assigned,
        });
    }
    Ok(GroupDescription {
        state,
        protocol: text(rd::rd_kafka_ConsumerGroupDescription_partition_assignor(g)),
        kind,
        members,
    })
}

/// The group as the coordinator describes it: through librdkafka's admin API, which
/// knows classic and KIP-848 groups; if that fails, through the classic DescribeGroups
/// (members' assignments decoded here).
pub fn describe_group(probe: &Probe, group: &str) -> Result<GroupDescription, KafkaError> {
    match describe(probe, group, REQUEST) {
        Ok(view) => return Ok(view),
        Err(reason) => {
            tracing::debug!(
                at = "describe_fallback",
                reason,
                "DescribeConsumerGroups failed; trying DescribeGroups"
            )
        }
    }
    let list = probe.fetch_group_list(Some(group), REQUEST)?;
    // A group the coordinator does not know is not described at all: Kafka calls that Dead.
    let Some(info) = list
        .groups()
        .iter()
        .find(|g| g.name() == group && !g.state().is_empty())
    else {
        return Ok(GroupDescription {
            state: "Dead".to_string(),
            ..GroupDescription::default()
        });
    };
    let members = info
        .members()
        .iter()
        .map(|m| Member {
            id: m.id().to_string(),
            client_id: m.client_id().to_string(),
            host: m.client_host().trim_start_matches('/').to_string(),
            assignment: m.assignment().and_then(decode),
        })
        .collect();
    Ok(GroupDescription {
        state: info.state().to_string(),
        protocol: info.protocol().to_string(),
        kind: "Classic".to_string(),
        members,
    })
}

/// A consumer group's description.
#[derive(Debug, Default)]
pub struct GroupDescription {
    /// Stable, PreparingRebalance, CompletingRebalance, Empty, Dead (no such group);
    /// KIP-848 groups also Assigning, Reconciling.
    pub state: String,
    /// The assignor the members agreed on (e.g. cooperative-sticky; uniform or range for
    /// KIP-848 groups).
    pub protocol: String,
    /// Classic, or Consumer (KIP-848); empty when the group does not exist.
    pub kind: String,
    pub members: Vec<Member>,
}

#[derive(Debug)]
pub struct Member {
    pub id: String,
    pub client_id: String,
    pub host: String,
    /// topic → partitions; `None` when the bytes are no consumer-protocol assignment.
    pub assignment: Option<Vec<(String, Vec<i32>)>>,
}

impl GroupDescription {
    /// The member holding `topic`/`partition`.
    pub fn holder(&self, topic: &str, partition: i32) -> Option<&Member> {
        self.members.iter().find(|m| {
            m.assignment.as_ref().is_some_and(|a| {
                a.iter()
                    .any(|(t, ps)| t == topic && ps.contains(&partition))
            })
        })
    }
}

/// The classic consumer protocol's member assignment, as DescribeGroups returns it:
/// `ConsumerProtocolAssignment` (versions 0-3, never flexible): int16 version, an int32
/// count of topics, each an int16-length string and an int32 count of int32 partitions,
/// then user data (ignored). Anything malformed is `None`, never a panic.
///
/// topic → partitions, in the order the bytes give them.
fn decode(bytes: &[u8]) -> Option<Vec<(String, Vec<i32>)>> {
    let mut r = Reader(bytes);
    let version = r.i16()?;
    if version < 0 {
        return None;
    }
    let topics = r.count()?;
    let mut out = Vec::new();
    for _ in 0..topics {
        let len = usize::try_from(r.i16()?).ok()?;
        let name = String::from_utf8(r.take(len)?.to_vec()).ok()?;
        let n = r.count()?;
        let mut partitions = Vec::new();
        for _ in 0..n {
            partitions.push(r.i32()?);
        }
        out.push((name, partitions));
    }
    Some(out)
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    /// An array length: -1 (null) is empty; a count the bytes cannot hold is malformed
    /// (and must not make us allocate for it).
    fn count(&mut self) -> Option<usize> {
        let n = self.i32()?;
        if n < 0 {
            return Some(0);
        }
        let n = usize::try_from(n).ok()?;
        (n <= self.0.len()).then_some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(version: i16, topics: &[(&str, &[i32])], user_data: &[u8]) -> Vec<u8> {
        let mut b = version.to_be_bytes().to_vec();
        b.extend((topics.len() as i32).to_be_bytes());
        for (t, ps) in topics {
            b.extend((t.len() as i16).to_be_bytes());
            b.extend(t.as_bytes());
            b.extend((ps.len() as i32).to_be_bytes());
            for p in *ps {
                b.extend(p.to_be_bytes());
            }
        }
        b.extend((user_data.len() as i32).to_be_bytes());
        b.extend(user_data);
        b
    }

    #[test]
    fn decodes_every_version() {
        for v in 0..=3 {
            let b = encode(v, &[("orders", &[0, 2]), ("refunds", &[1])], b"x");
            assert_eq!(
                decode(&b),
                Some(vec![
                    ("orders".to_string(), vec![0, 2]),
                    ("refunds".to_string(), vec![1])
                ])
            );
        }
        assert_eq!(decode(&encode(0, &[], b"")), Some(vec![]));
    }

    #[test]
    fn malformed_bytes_are_none_not_a_panic() {
        let good = encode(1, &[("orders", &[0, 1, 2])], b"");
        for cut in 0..good.len() - 4 {
            assert_eq!(decode(&good[..cut]), None, "cut at {cut}");
        }
        assert_eq!(decode(&[0, 0, 0x7f, 0xff, 0xff, 0xff]), None);
        assert_eq!(decode(&[0xff, 0xff]), None);
        assert_eq!(decode(&[0, 0, 0, 0, 0, 1, 0, 2, 0xff, 0xfe]), None);
    }
}
