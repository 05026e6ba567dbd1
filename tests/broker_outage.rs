//! Broker trouble: no broker at start, a broker that appears later, and a broker that
//! goes away mid-run and comes back. Each test runs a single-node Kafka cluster of its own
//! ([`common::broker::start_broker_on`] on a port ackd was given first, or [`common::broker::Broker::start`])
//! so that it can stop and start it. A Kafka node started again keeps its data: topics,
//! records and the group's committed offsets.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{
    accounting::*, ackd::*, broker::*, lines::*, offsets::*, produce::*, spawn::*, topics::*,
    wait::*,
};

const WAIT: Duration = Duration::from_secs(90);

fn url(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

/// Keys of the processed lines, in order.
fn processed_keys(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| is_processed(l))
        .map(|l| field(l, "key").expect("key"))
        .collect()
}

fn keys(delivered: &[Delivered]) -> BTreeSet<String> {
    delivered
        .iter()
        .map(|d| String::from_utf8(d.key.clone().unwrap()).unwrap())
        .collect()
}

#[test]
fn with_no_broker_it_waits_says_so_once_in_a_while_and_stops_on_sigterm() {
    let port = free_port();
    let ackd = AckdBuilder::on(&url(port), "nowhere", &unique_name("g-nowhere")).spawn();
    ackd.wait_for_line(|l| at(l, "brokers_unreachable"), WAIT);
    // An observation window, not a wait: librdkafka retries the connection tens of times
    // a second, and the log must not get a line per retry.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(ackd.try_exit_code(), None, "it keeps trying");
    let lines = ackd.lines();
    let waiting = lines.len();
    assert!(
        waiting <= 10,
        "{} lines in 5 s with no broker:\n{}",
        lines.len(),
        lines.join("\n")
    );
    assert_eq!(
        count_at(&lines, "brokers_unreachable"),
        1,
        "one line per outage (and a reminder every 30 s):\n{}",
        lines.join("\n")
    );

    let signalled = Instant::now();
    ackd.stop(0, WAIT);
    let took = signalled.elapsed();
    assert!(took < Duration::from_secs(5), "SIGTERM took {took:?}");
    let lines = ackd.lines();
    assert!(processed(&lines).is_empty());
    assert!(!lines
        .iter()
        .any(|l| at(l, "committed") || at(l, "commit_failed")));
    eprintln!(
        "no broker: {waiting} lines in the first 5 s ({} with the stop), exit 0 {took:?} after SIGTERM",
        lines.len()
    );
}

#[test]
fn a_broker_that_appears_after_the_start_is_consumed_from_and_committed_to() {
    let port = free_port();
    let topic = unique_name("late");
    let group = unique_name("g-late");
    let ackd = AckdBuilder::on(&url(port), &topic, &group).spawn();
    ackd.wait_for_line(|l| at(l, "brokers_unreachable"), WAIT);
    // The topic check gave up (it would otherwise find the topic missing and exit 78).
    ackd.wait_for_line(|l| at(l, "topics_unchecked"), WAIT);

    let broker = start_broker_on(port);
    create_topic_on(&broker, &topic, 3);
    let delivered = produce_with(
        &producer_for(&broker.bootstrap()),
        &topic,
        &keyed_messages(100, 0),
    );
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);
    ackd.wait_for_line(|l| at(l, "brokers_reachable"), WAIT);
    let lines = ackd.stop(0, WAIT);
    let t = tally(&delivered, &processed(&lines), &lines);
    assert!(t.lost.is_empty() && t.duplicated.is_empty(), "{t:?}");
    let committed = committed_on(&broker.bootstrap(), &group, &topic, 3);
    for (p, end) in log_ends(&delivered) {
        assert_eq!(committed[&p], Some(end), "partition {p}");
    }
    eprintln!(
        "late broker: {} messages processed once each, committed = log ends",
        delivered.len()
    );
}

#[test]
fn a_broker_stopped_and_started_again_is_reconnected_to() {
    let broker = Broker::start(BrokerOptions::default());
    let (topic, group) = fresh_topic_on(&broker, "again", 3);
    let producer = producer_for(&broker.bootstrap());
    let batch1 = produce_with(&producer, &topic, &keyed_messages(90, 0));
    let ackd = AckdBuilder::on(&broker.bootstrap(), &topic, &group)
        .env("ACKD_COMMIT_INTERVAL_MS", "500")
        // ackd may rejoin the second broker before the test has created the topic there:
        // it is then assigned nothing, and librdkafka looks for the topic again only at
        // the next metadata refresh (every 5 min by default).
        .env("ACKD_RDKAFKA_TOPIC_METADATA_REFRESH_INTERVAL_MS", "1000")
        .spawn();
    ackd.wait_for_count(is_processed, batch1.len(), WAIT);
    // Batch 1 committed before the broker goes: the restarted broker keeps those commits.
    let ends1 = log_ends(&batch1);
    wait_until(WAIT, || {
        let c = committed_on(&broker.bootstrap(), &group, &topic, 3);
        ends1.iter().all(|(p, e)| c[p] == Some(*e))
    });

    let before = ackd.line_count();
    let stopped = Instant::now();
    broker.stop_node(0);
    ackd.wait_for_line_from(before, |l| at(l, "brokers_unreachable"), WAIT);
    // The outage outlasts session.timeout.ms (1 s here): librdkafka gives the
    // assignment up as lost, and ackd commits nothing for it.
    let lost = ackd.wait_for_line_from(before, |l| at(l, "revoked"), WAIT);
    assert_eq!(field(&lost, "lost").as_deref(), Some("true"), "{lost}");
    assert_eq!(ackd.try_exit_code(), None, "ackd rides through the outage");

    // The same node, its data kept: topic, records and the group's commits.
    let restarted = Instant::now();
    broker.start_node(0);
    broker.wait_node_ready(0);
    let restart_took = restarted.elapsed();
    let batch2 = produce_with(&producer, &topic, &keyed_messages(60, 1000));
    let all: Vec<Delivered> = batch1.iter().chain(&batch2).cloned().collect();
    let want = keys(&all);
    wait_until(WAIT, || {
        let got: BTreeSet<String> = processed_keys(&ackd.lines()).into_iter().collect();
        got.is_superset(&want)
    });
    let outage = stopped.elapsed();
    let lines = ackd.stop(0, WAIT);
    let after = &lines[before..];
    let reachable = after
        .iter()
        .find(|l| at(l, "brokers_reachable"))
        .unwrap_or_else(|| panic!("no brokers_reachable line:\n{}", after.join("\n")));
    // Back, ackd resumes every partition where batch 1 was committed before the stop.
    let resumed: Vec<(i32, i64)> = after
        .iter()
        .filter(|l| at(l, "assigned"))
        .map(|l| {
            assert_eq!(field(l, "from").as_deref(), Some("committed"), "{l}");
            (
                field(l, "partition").unwrap().parse().unwrap(),
                field(l, "offset").unwrap().parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        resumed
            .iter()
            .copied()
            .collect::<std::collections::BTreeMap<_, _>>(),
        ends1,
        "resumed at batch 1's commits"
    );
    // Batch 1 before the outage, batch 2 after it, each processed once: nothing lost,
    // nothing redelivered.
    let t = tally(&all, &processed(&lines), &lines);
    assert!(t.lost.is_empty() && t.duplicated.is_empty(), "{t:?}");
    assert_eq!(
        keys_of(&processed_keys(after)),
        keys(&batch2),
        "after the outage"
    );
    let committed = committed_on(&broker.bootstrap(), &group, &topic, 3);
    for (p, end) in log_ends(&all) {
        assert_eq!(committed[&p], Some(end), "partition {p}");
    }
    let failed = count_at(after, "commit_failed");
    eprintln!(
        "broker restart: batch 1 {} and batch 2 {} processed once each (lost 0, duplicated 0), committed = log ends; node back in {restart_took:?}, outage to caught up {outage:?}, {reachable}; commit_failed lines during the outage: {failed}; node started in {:?} at first, peak RSS {} MiB after its restart",
        batch1.len(),
        batch2.len(),
        broker.started_in(),
        broker.node_peak_rss_kib(0).unwrap_or(0) / 1024,
    );
}

fn keys_of(keys: &[String]) -> BTreeSet<String> {
    keys.iter().cloned().collect()
}

/// Commit failures: the broker refuses periodic commits for a while. Each refusal is
/// logged with the offsets not committed, the next commit retries them, and nothing is
/// lost. The first refused is the partition's first commit, which names where it
/// resumes and its dispatch limit: nothing starts until a commit is accepted. On librdkafka's mock cluster, whose fault injection makes the broker answer
/// OffsetCommit with an error (a real broker cannot be told to).
#[test]
fn refused_commits_are_logged_with_their_offsets_and_retried() {
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    use rdkafka::ClientConfig;

    let mock = MockCluster::new(1).unwrap();
    let bootstrap = mock.bootstrap_servers();
    let (topic, group) = ("refused", "g-refused");
    mock.create_topic(topic, 1, 1).unwrap();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let send = |from: usize, n: usize| {
        for i in from..from + n {
            let key = format!("k-{i}");
            producer
                .send(BaseRecord::to(topic).key(&key).payload("v").partition(0))
                .unwrap();
        }
        producer.flush(Duration::from_secs(10)).unwrap();
    };
    send(0, 10);
    // The next three commits are refused: an error librdkafka hands to the application
    // instead of retrying it itself (an ACL being rolled out, say).
    let refusal = RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED;
    mock.request_errors(RDKafkaApiKey::OffsetCommit, &[refusal; 3]);

    let ackd = AckdBuilder::on(&bootstrap, topic, group)
        .env("ACKD_COMMIT_INTERVAL_MS", "300")
        // The mock coordinator, like Kafka, refuses sessions under 6 s.
        .env("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "6000")
        .spawn();
    ackd.wait_for_count(is_processed, 10, WAIT);
    let lines = ackd.lines();
    let failed = all_at(&lines, "commit_failed");
    assert_eq!(
        failed.len(),
        3,
        "refused before the first call: {}",
        lines.join("\n")
    );
    let first_processed = lines.iter().position(|l| is_processed(l)).unwrap();
    let first_accepted = lines.iter().position(|l| at(l, "committed")).unwrap();
    assert!(first_accepted < first_processed, "{}", lines.join("\n"));
    for l in &failed {
        assert_eq!(field(l, "partition").as_deref(), Some("0"), "{l}");
        assert_eq!(field(l, "offset").as_deref(), Some("0"), "{l}");
    }
    send(10, 5);
    // Retried until accepted, and later acks join the retry.
    ackd.wait_for_line(
        |l| at(l, "committed") && field(l, "offset").as_deref() == Some("15"),
        WAIT,
    );
    let lines = ackd.stop(0, WAIT);
    let refused = all_at(&lines, "commit_failed");
    assert_eq!(refused.len(), 3, "{}", lines.join("\n"));
    for l in &refused {
        assert!(field(l, "offset").is_some(), "{l}");
        assert_eq!(field(l, "reason").as_deref(), Some("periodic"), "{l}");
    }
    assert_eq!(processed(&lines).len(), 15, "each once");
    assert_eq!(committed_on(&bootstrap, group, topic, 1)[&0], Some(15));
    eprintln!(
        "refused commits: {} refusals logged with offsets {:?}, then committed 15",
        refused.len(),
        refused
            .iter()
            .filter_map(|l| field(l, "offset"))
            .collect::<Vec<_>>()
    );
}

/// A stop whose only commit left is the release mark: a periodic commit covered
/// everything acknowledged, then the broker went away, then SIGTERM. The stop commits
/// the same offsets again, marked released (`;r`), and nobody answers. Nothing
/// acknowledged is lost or redelivered: what is lost is the mark, so the next owner
/// takes the stop for a crash (`released=false`) and flags what comes within its
/// window. The stop's lines must say that, not that messages will be redelivered.
#[test]
fn a_stop_that_loses_only_the_release_mark_says_nothing_is_redelivered() {
    let broker = Broker::start(BrokerOptions::default());
    let (topic, group) = fresh_topic_on(&broker, "mark", 2);
    let producer = producer_for(&broker.bootstrap());
    let batch1 = produce_with(&producer, &topic, &keyed_messages(40, 0));
    let ends = log_ends(&batch1);
    let ackd = AckdBuilder::on(&broker.bootstrap(), &topic, &group)
        .env("ACKD_COMMIT_INTERVAL_MS", "300")
        .env("ACKD_SHUTDOWN_TIMEOUT_MS", "5000")
        // The session outlives the broker's stop: librdkafka must not give the
        // assignment up as lost before SIGTERM (a lost partition commits nothing).
        .env("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "10000")
        .env("ACKD_RDKAFKA_HEARTBEAT_INTERVAL_MS", "1000")
        .spawn();
    ackd.wait_for_count(is_processed, batch1.len(), WAIT);
    // Every log end committed periodically, and ackd knows it (its own line).
    for (p, end) in &ends {
        ackd.wait_for_line(
            |l| {
                at(l, "committed")
                    && field(l, "partition") == Some(p.to_string())
                    && field(l, "offset") == Some(end.to_string())
            },
            WAIT,
        );
    }
    broker.stop_node(0);
    ackd.sigterm();
    let code = ackd.wait_exit(WAIT);
    let lines = ackd.lines();
    let all = lines.join("\n");
    // Nothing was acknowledged past what is committed: no line may say otherwise.
    for what in ["commit_failed", "uncommitted", "not_committed"] {
        assert_eq!(count_at(&lines, what), 0, "at={what}:\n{all}");
    }
    for (p, end) in &ends {
        let unmarked: Vec<&String> = all_at(&lines, "release_unmarked")
            .into_iter()
            .filter(|l| field(l, "partition") == Some(p.to_string()))
            .collect();
        assert!(!unmarked.is_empty(), "partition {p}:\n{all}");
        for l in unmarked {
            assert_eq!(field(l, "offset"), Some(end.to_string()), "{l}");
        }
    }
    assert_eq!(code, 1, "the stop did not release its partitions:\n{all}");

    // The next owner: resumes at the log ends, redelivers nothing, but reads no release
    // and flags what comes within the window.
    broker.start_node(0);
    broker.wait_node_ready(0);
    let next = AckdBuilder::on(&broker.bootstrap(), &topic, &group).spawn();
    next.wait_for_count(|l| at(l, "assigned"), ends.len(), WAIT);
    let batch2 = produce_with(&producer, &topic, &keyed_messages(10, 1000));
    next.wait_for_count(is_processed, batch2.len(), WAIT);
    let after = next.stop(0, WAIT);
    let all2 = after.join("\n");
    for l in all_at(&after, "assigned") {
        let p: i32 = field(l, "partition").unwrap().parse().unwrap();
        assert_eq!(field(l, "offset"), Some(ends[&p].to_string()), "{l}");
        assert_eq!(field(l, "released").as_deref(), Some("false"), "{l}");
    }
    let t = tally(&batch2, &processed(&after), &after);
    assert!(
        t.lost.is_empty() && t.duplicated.is_empty(),
        "{t:?}\n{all2}"
    );
    let flagged = after
        .iter()
        .filter(|l| is_processed(l) && field(l, "redelivered").as_deref() == Some("true"))
        .count();
    // Within the previous owner's dispatch window: first deliveries, flagged all the same.
    assert_eq!(flagged, batch2.len(), "{all2}");
    eprintln!(
        "release mark lost: exit {code}, {} release_unmarked lines, no commit_failed/uncommitted; next owner resumed at {ends:?} with released=false, {flagged} of {} new messages flagged redelivered",
        count_at(&lines, "release_unmarked"),
        batch2.len()
    );
}
