//! `ACKD_STATIC_MEMBERSHIP=true`: `group.instance.id` from `DYNO`, else the host name.
//!
//! TANSU.md: Tansu accepts static members but gains nothing from them (each join costs
//! at least 6 s, a restart still rebalances), so against it this checks only "configured
//! and harmless". Fencing (FENCED_INSTANCE_ID) needs a broker that fences: librdkafka's mock
//! cluster does not (its classic group adds a second member with the same instance id
//! instead of fencing the first), so the test injects the broker's FENCED_INSTANCE_ID
//! answer into the member's heartbeats with the mock's fault injection. That is exactly
//! what a fenced member receives from Kafka; the member that fenced it is not staged.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const WAIT: Duration = Duration::from_secs(90);

#[test]
fn a_static_member_consumes_commits_and_stops_cleanly() {
    let topic = unique_name("static");
    let group = unique_name("g-static");
    create_topic(&topic, 2);
    let delivered = produce_keyed(&topic, 50, 0);

    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_STATIC_MEMBERSHIP", "true")
        .env("DYNO", "consumer.1")
        .spawn();
    let start = ackd.wait_for_line(|l| at(l, "start"), WAIT);
    assert_eq!(
        field(&start, "group_instance_id").as_deref(),
        Some("consumer.1"),
        "{start}"
    );
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);
    ackd.sigterm();
    assert_eq!(ackd.wait_exit(WAIT), 0, "{}", ackd.lines().join("\n"));

    let lines = ackd.lines();
    let t = tally(&delivered, &processed(&lines), &lines);
    assert!(t.lost.is_empty() && t.duplicated.is_empty(), "{t:?}");
    let committed = committed(&group, &topic, 2);
    for (p, end) in log_ends(&delivered) {
        assert_eq!(committed[&p], Some(end), "partition {p}");
    }
    eprintln!(
        "static member consumer.1: {} messages once each, committed, exit 0 in {:?}",
        delivered.len(),
        ackd.elapsed()
    );
}

fn mock_committed(bootstrap: &str, group: &str, topic: &str) -> Offset {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    let got = c.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
    got.find_partition(topic, 0).unwrap().offset()
}

#[test]
fn a_fenced_member_stops_with_69_and_commits_nothing_after_the_fence() {
    let mock = MockCluster::new(1).unwrap();
    let bootstrap = mock.bootstrap_servers();
    let (topic, group) = ("fence", "g-fence");
    mock.create_topic(topic, 1, 1).unwrap();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    for i in 0..10 {
        let key = format!("k-{i}");
        producer
            .send(BaseRecord::to(topic).key(&key).payload("v").partition(0))
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();

    let ackd = AckdBuilder::on(&bootstrap, topic, group)
        .env("ACKD_STATIC_MEMBERSHIP", "true")
        .env("DYNO", "consumer.1")
        // Only the stop would commit: the acks are all pending when the fence comes.
        .env("ACKD_COMMIT_INTERVAL_MS", "3600000")
        // The mock coordinator, like Kafka, refuses sessions under 6 s.
        .env("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "6000")
        .spawn();
    ackd.wait_for_count(is_processed, 10, WAIT);
    // The broker's answer to a member whose instance id a newer process took over.
    mock.request_errors(
        RDKafkaApiKey::Heartbeat,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID],
    );
    assert_eq!(
        ackd.wait_exit(WAIT),
        69,
        "a fenced member exits with EX_UNAVAILABLE:\n{}",
        ackd.lines().join("\n")
    );
    let lines = ackd.lines();
    let fatal = lines
        .iter()
        .position(|l| at(l, "kafka_fatal"))
        .unwrap_or_else(|| panic!("no at=kafka_fatal line:\n{}", lines.join("\n")));
    assert_eq!(
        field(&lines[fatal], "fenced").as_deref(),
        Some("true"),
        "{}",
        lines[fatal]
    );
    // No commit was attempted, before (none was due) or after the fence.
    let commits: Vec<_> = lines
        .iter()
        .filter(|l| {
            at(l, "committed")
                || at(l, "commit_failed")
                || (at(l, "final_commit") && field(l, "offset").is_some())
        })
        .collect();
    assert!(
        commits.is_empty(),
        "commit attempted:\n{}",
        lines.join("\n")
    );
    // What was acknowledged and left uncommitted is said, per partition.
    let not_committed: BTreeSet<_> = lines[fatal..]
        .iter()
        .filter(|l| {
            at(l, "not_committed")
                || (at(l, "revoked") && field(l, "lost").as_deref() == Some("true"))
        })
        .filter_map(|l| field(l, "partition"))
        .collect();
    assert_eq!(
        not_committed,
        BTreeSet::from(["0".to_string()]),
        "{}",
        lines.join("\n")
    );
    assert_eq!(mock_committed(&bootstrap, group, topic), Offset::Invalid);
    eprintln!(
        "fenced: exit 69, no commit attempted, lines after the fence: {}",
        lines[fatal..]
            .iter()
            .map(|l| field(l, "at").unwrap_or_default())
            .collect::<Vec<_>>()
            .join(",")
    );
}

/// KIP-848 turns static membership's fencing around: a second live process with the
/// same group.instance.id is refused (UNRELEASED_INSTANCE_ID, fatal in librdkafka)
/// instead of fencing the first. The newcomer stops with exit 69 having processed
/// nothing; the first goes on and stops cleanly; a replacement started after that takes
/// the partitions back at the committed offsets.
#[test]
fn under_the_consumer_protocol_a_second_process_with_the_same_id_is_refused_not_the_first() {
    let topic = unique_name("static848");
    let group = unique_name("g-static848");
    create_topic(&topic, 2);
    let mut delivered = produce_keyed(&topic, 50, 0);
    let static_member = || {
        AckdBuilder::new(&topic, &group)
            .consumer_protocol()
            .env("ACKD_STATIC_MEMBERSHIP", "true")
            .env("DYNO", "consumer.1")
            .spawn()
    };
    let first = static_member();
    first.wait_for_count(is_processed, 50, WAIT);
    let newcomer = static_member();
    let code = newcomer.wait_exit(WAIT);
    let newcomer_lines = newcomer.lines();
    assert_eq!(code, 69, "{}", newcomer_lines.join("\n"));
    let fatal = newcomer_lines
        .iter()
        .find(|l| at(l, "kafka_fatal"))
        .unwrap_or_else(|| panic!("no kafka_fatal line:\n{}", newcomer_lines.join("\n")));
    assert!(
        field(fatal, "error").is_some_and(|e| e.contains("UnreleasedInstanceId")),
        "{fatal}"
    );
    assert!(
        field(fatal, "msg").is_some_and(|m| m.contains("start this one after it has stopped")),
        "{fatal}"
    );
    assert_eq!(processed(&newcomer_lines).len(), 0, "{fatal}");

    delivered.extend(produce_keyed(&topic, 50, 50));
    first.wait_for_count(is_processed, 100, WAIT);
    first.sigterm();
    assert_eq!(first.wait_exit(WAIT), 0, "{}", first.lines().join("\n"));

    delivered.extend(produce_keyed(&topic, 50, 100));
    let replacement = static_member();
    replacement.wait_for_count(is_processed, 50, WAIT);
    replacement.sigterm();
    assert_eq!(
        replacement.wait_exit(WAIT),
        0,
        "{}",
        replacement.lines().join("\n")
    );
    let mut lines = first.lines();
    lines.extend(replacement.lines());
    let t = tally(&delivered, &processed(&lines), &lines);
    eprintln!(
        "static consumer.1 (consumer protocol): newcomer exit {code}, messages {}, lost {}, duplicated {}, replacement took {:?}",
        delivered.len(),
        t.lost.len(),
        t.duplicated.len(),
        replacement.elapsed()
    );
    assert!(t.lost.is_empty() && t.duplicated.is_empty(), "{t:?}");
    assert_committed_to_ends(&group, &topic, 2, &log_ends(&delivered));
}
