//! A member cut off by the network: every connection of one of two members goes through
//! a TCP proxy ([`common::proxy::Proxy`]: the broker advertises the proxy's port on a
//! listener of its own), which stops forwarding both ways for twice the session timeout
//! without closing anything, then heals. Meanwhile the group gives the cut member's
//! partitions to the other member, which processes them.
//!
//! Under the consumer protocol (KIP-848) nothing tells the cut member during the cut
//! (its requests time out; the lost revoke comes only after the heal): its membership
//! lease lapses (src/consumer/membership.rs), so it starts nothing more of those
//! partitions, and after the heal nothing it fetches. Under the classic protocol
//! librdkafka's own session clock revokes them too. On both: nothing lost, every message
//! processed twice flagged `redelivered=true` where it came second, and beyond what the
//! cut member had processed and not committed when the cut began, at most a few dozen
//! repeats.
//!
//! Two members, 4 partitions, about 500 messages/s, a 6 s session (KIP-848: the
//! broker's `group.consumer.session.timeout.ms`, broker.rs; classic: the client's).
//! A cut shorter than the session is a false alarm: the partitions are held until the
//! heal, then go on (`cut_briefly`).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::{
    accounting::*, ackd::*, broker::*, deliveries::*, lines::*, produce::*, proxy::*, topics::*,
    wait::*,
};

const WAIT: Duration = Duration::from_secs(120);
const PARTITIONS: i32 = 4;
/// The session timeout on both protocols (broker.rs sets the KIP-848 one).
const SESSION: Duration = Duration::from_secs(6);
/// Repeats allowed beyond what the cut member held uncommitted when the cut began.
const REPEATS_MAX: usize = 40;

/// The binary's broker, with a listener advertised at the proxy's port, and the proxy.
struct Staged {
    broker: &'static Broker,
    proxy: Proxy,
}

fn staged() -> &'static Staged {
    static S: OnceLock<Staged> = OnceLock::new();
    S.get_or_init(|| {
        let proxy = Proxy::listen();
        let broker = broker_with(BrokerOptions {
            proxied_port: Some(proxy.port()),
            ..BrokerOptions::default()
        });
        proxy.forward_to(broker.proxied_addr());
        Staged { broker, proxy }
    })
}

/// One proxy for the binary: one test at a time cuts it.
static SERIAL: Mutex<()> = Mutex::new(());

fn member(bootstrap: &str, topic: &str, group: &str, consumer_protocol: bool) -> AckdProcess {
    let b = AckdBuilder::on(bootstrap, topic, group).env("ACKD_COMMIT_INTERVAL_MS", "1000");
    if consumer_protocol {
        b.consumer_protocol()
    } else {
        b.env(
            "ACKD_RDKAFKA_SESSION_TIMEOUT_MS",
            SESSION.as_millis().to_string(),
        )
        .env("ACKD_RDKAFKA_HEARTBEAT_INTERVAL_MS", "500")
    }
    .spawn()
}

#[test]
fn a_consumer_protocol_member_cut_off_by_the_network_starts_nothing_it_may_have_lost() {
    cut_off(true);
}

#[test]
fn a_classic_member_cut_off_by_the_network_starts_nothing_it_may_have_lost() {
    cut_off(false);
}

fn cut_off(consumer_protocol: bool) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let protocol = ["classic", "consumer"][usize::from(consumer_protocol)];
    let Staged { broker, proxy } = staged();
    let (topic, group) = fresh_topic_on(broker, "cut", PARTITIONS);
    // ~500 messages/s.
    let producer =
        SteadyProducer::start_with(producer_on(broker), &topic, 25, Duration::from_millis(50));
    let connections_before = proxy.connections();
    let cut = member(&proxy.bootstrap(), &topic, &group, consumer_protocol);
    let other = member(&broker.bootstrap(), &topic, &group, consumer_protocol);
    for m in [&cut, &other] {
        m.wait_for_line(|l| at(l, "assigned"), WAIT);
    }
    wait_until(WAIT, || {
        let (c, o) = (cut.lines(), other.lines());
        processed(&c).len() >= 300
            && processed(&o).len() >= 300
            && c.iter().any(|l| at(l, "committed"))
    });
    // Bootstrap, the broker as the metadata names it (fetches), the coordinator: each a
    // connection through the proxy, whose port is all the cut member was given.
    let through_proxy = proxy.connections() - connections_before;
    assert!(
        through_proxy >= 2,
        "{through_proxy} connection(s) through the proxy"
    );
    let owned = owned_partitions(&cut.lines());
    assert!(!owned.is_empty(), "the cut member owns no partition");

    let before_cut = cut.line_count();
    let other_before_cut = other.line_count();
    proxy.cut();
    let cut_at = Instant::now();
    // The other member takes the cut member's partitions (after the session) and works
    // on them; the cut lasts twice the session.
    wait_until(WAIT, || {
        let taken: BTreeSet<i32> = other.lines()[other_before_cut..]
            .iter()
            .filter(|l| at(l, "assigned"))
            .filter_map(|l| field(l, "partition")?.parse().ok())
            .collect();
        taken.is_superset(&owned) && cut_at.elapsed() >= 2 * SESSION
    });
    let before_heal = cut.line_count();
    let cut_for = cut_at.elapsed();
    proxy.heal();
    // It hears that it lost them (classic: librdkafka's own session clock revoked them
    // during the cut), and joins again.
    let lost_revoke =
        |l: &str| at(l, "revoke_begun") && field(l, "lost").as_deref() == Some("true");
    cut.wait_for_line_from(before_cut, lost_revoke, WAIT);
    let revoked_at = cut.lines()[before_cut..]
        .iter()
        .position(|l| lost_revoke(l))
        .map_or(before_cut, |i| before_cut + i);
    cut.wait_for_line_from(revoked_at, |l| at(l, "assigned"), WAIT);
    let delivered = producer.finish();
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    wait_until(WAIT, || {
        let seen: BTreeSet<_> = processed(&cut.lines())
            .into_iter()
            .chain(processed(&other.lines()))
            .collect();
        seen.is_superset(&expected)
    });
    for m in [&cut, &other] {
        m.sigterm();
    }
    let codes = [cut.wait_exit(WAIT), other.wait_exit(WAIT)];

    let (c, o) = (cut.lines(), other.lines());
    let ordered = in_arrival_order(&[&cut, &other]);
    let f = findings(&ordered);
    let held = held_uncommitted(&c[..before_cut]);
    let beyond: Vec<(i32, i64)> = f
        .repeats
        .iter()
        .map(|d| (d.partition, d.offset))
        .filter(|m| !held.contains(m))
        .collect();
    let all: Vec<(i32, i64)> = processed(&c).into_iter().chain(processed(&o)).collect();
    let lines: Vec<String> = c.iter().chain(&o).cloned().collect();
    let t = tally(&delivered, &all, &lines);
    let during_cut = processed(&c[before_cut..before_heal]);
    let after_heal = processed(&c[before_heal..revoked_at.max(before_heal)]);
    let doubts: Vec<&str> = c
        .iter()
        .filter(|l| at(l, "membership_in_doubt"))
        .map(String::as_str)
        .collect();
    eprintln!(
        "cut {protocol}: messages {}, processed {}, lost {}, repeats {} (unflagged {}; held uncommitted by the cut member at the cut {}, beyond it {}), cut for {:.1} s, the cut member processed {} during the cut and {} after the heal before its lost revoke, {through_proxy} connections through the proxy, exit codes {codes:?}, {:.1} s\n{}",
        delivered.len(),
        all.len(),
        t.lost.len(),
        f.repeats.len(),
        f.unflagged_repeats.len(),
        held.len(),
        beyond.len(),
        cut_for.as_secs_f64(),
        during_cut.len(),
        after_heal.len(),
        started.elapsed().as_secs_f64(),
        doubts.join("\n")
    );
    let lease = c
        .iter()
        .find(|l| at(l, "membership_lease"))
        .expect("no at=membership_lease line");
    eprintln!("  cut member: {lease}");
    for l in c[before_cut..].iter().filter(|l| !is_processed(l)).take(40) {
        eprintln!("  cut member: {l}");
    }
    assert!(t.lost.is_empty(), "lost {}: {:?}", t.lost.len(), t.lost);
    assert!(
        f.unflagged_repeats.is_empty(),
        "{} repeats without redelivered=true (run 0: the cut member): {:?}",
        f.unflagged_repeats.len(),
        f.unflagged_repeats
    );
    assert!(
        beyond.len() <= REPEATS_MAX,
        "processed twice beyond what the cut member held uncommitted: {} (at most {REPEATS_MAX}): {beyond:?}",
        beyond.len()
    );
    assert!(
        after_heal.is_empty(),
        "the cut member processed {} messages after the heal, before its lost revoke: {after_heal:?}",
        after_heal.len()
    );
    assert_eq!(codes, [0, 0], "exit codes (cut member, other)");
    // The session it is under: the broker's (read from it) or its own.
    let from = if consumer_protocol {
        ["group_config", "broker_config"]
    } else {
        ["client"; 2]
    };
    assert!(
        field(lease, "session_timeout_ms") == Some(SESSION.as_millis().to_string())
            && field(lease, "from").is_some_and(|f| from.contains(&f.as_str())),
        "{lease}"
    );
    assert!(
        doubts
            .iter()
            .any(|l| field(l, "reason").as_deref() == Some("lease_lapsed")),
        "the cut member's lease never lapsed"
    );
}

/// Every message handed to a processor by `members` (run = index), in the order their
/// lines arrived.
fn in_arrival_order(members: &[&AckdProcess]) -> Vec<Delivery> {
    let mut timed: Vec<(Instant, usize, String)> = members
        .iter()
        .enumerate()
        .flat_map(|(run, m)| m.timed_lines().into_iter().map(move |(t, l)| (t, run, l)))
        .filter(|(_, _, l)| is_processed(l))
        .collect();
    // Stable: each member's own lines keep their order.
    timed.sort_by_key(|(t, _, _)| *t);
    timed
        .iter()
        .flat_map(|(_, run, l)| from_processed_lines(*run, std::slice::from_ref(l)))
        .collect()
}

/// The partitions a process owns after `lines` (assigned, not revoked since).
fn owned_partitions(lines: &[String]) -> BTreeSet<i32> {
    let mut owned = BTreeSet::new();
    for l in lines {
        let partition = || field(l, "partition").and_then(|p| p.parse::<i32>().ok());
        if at(l, "assigned") {
            owned.extend(partition());
        } else if at(l, "revoked") {
            if let Some(p) = partition() {
                owned.remove(&p);
            }
        }
    }
    owned
}

/// What a process's `lines` processed at or above its last accepted commit of each
/// partition: the work its partitions' next owner processes again, by design.
fn held_uncommitted(lines: &[String]) -> BTreeSet<(i32, i64)> {
    let mut committed: BTreeMap<i32, i64> = BTreeMap::new();
    for l in lines.iter().filter(|l| at(l, "committed")) {
        if let (Some(p), Some(o)) = (field(l, "partition"), field(l, "offset")) {
            committed.insert(p.parse().unwrap(), o.parse().unwrap());
        }
    }
    processed(lines)
        .into_iter()
        .filter(|(p, o)| committed.get(p).is_none_or(|c| o >= c))
        .collect()
}

#[test]
fn a_consumer_protocol_member_cut_for_less_than_its_session_holds_then_goes_on() {
    cut_briefly(true);
}

#[test]
fn a_classic_member_cut_for_less_than_its_session_holds_then_goes_on() {
    cut_briefly(false);
}

/// One member, cut until its lease lapses (a false alarm: the session has not expired),
/// then healed at once: it holds its partitions meanwhile, a commit accepted after the
/// heal confirms its membership, and it goes on with the same partitions; nothing lost,
/// nothing processed twice.
fn cut_briefly(consumer_protocol: bool) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let protocol = ["classic", "consumer"][usize::from(consumer_protocol)];
    let Staged { broker, proxy } = staged();
    let (topic, group) = fresh_topic_on(broker, "brief-cut", PARTITIONS);
    let producer =
        SteadyProducer::start_with(producer_on(broker), &topic, 25, Duration::from_millis(50));
    let member = member(&proxy.bootstrap(), &topic, &group, consumer_protocol);
    member.wait_for_line(|l| at(l, "assigned"), WAIT);
    wait_until(WAIT, || {
        let l = member.lines();
        processed(&l).len() >= 300 && l.iter().any(|l| at(l, "committed"))
    });
    let before_cut = member.line_count();
    proxy.cut();
    let cut_at = Instant::now();
    let lapsed = member.wait_for_line_from(
        before_cut,
        |l| at(l, "membership_in_doubt") && field(l, "reason").as_deref() == Some("lease_lapsed"),
        WAIT,
    );
    let cut_for = cut_at.elapsed();
    proxy.heal();
    let confirmed = member.wait_for_line_from(before_cut, |l| at(l, "membership_confirmed"), WAIT);
    let delivered = producer.finish();
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    wait_until(WAIT, || {
        processed(&member.lines())
            .into_iter()
            .collect::<BTreeSet<_>>()
            .is_superset(&expected)
    });
    member.sigterm();
    let code = member.wait_exit(WAIT);
    let lines = member.lines();
    let t = tally(&delivered, &processed(&lines), &lines);
    eprintln!(
        "brief cut {protocol}: messages {}, lost {}, processed twice {}, cut for {:.1} s, exit code {code}\n{lapsed}\n{confirmed}",
        delivered.len(),
        t.lost.len(),
        t.duplicated.len(),
        cut_for.as_secs_f64()
    );
    assert!(cut_for < SESSION, "cut for {cut_for:?}: past the session");
    assert!(t.lost.is_empty(), "lost {}: {:?}", t.lost.len(), t.lost);
    assert!(
        t.duplicated.is_empty(),
        "processed twice: {:?}",
        t.duplicated
    );
    assert!(
        !lines[before_cut..].iter().any(|l| at(l, "revoke_begun")),
        "its partitions moved:\n{}",
        lines[before_cut..].join("\n")
    );
    assert_eq!(code, 0);
}

/// The proxy itself, in front of an echo server: it forwards, delays each way, cuts
/// without closing (what is sent meanwhile arrives after the heal), resets, and counts
/// connections.
#[test]
fn the_proxy_forwards_delays_cuts_heals_and_resets() {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let echo = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = echo.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in echo.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n @ 1..) = s.read(&mut buf) {
                    if s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    let proxy = Proxy::listen();
    proxy.forward_to(upstream);
    let mut client = TcpStream::connect(proxy.bootstrap()).unwrap();
    let round_trip = |c: &mut TcpStream, timeout: Duration| -> Option<Duration> {
        let start = Instant::now();
        c.set_read_timeout(Some(timeout)).unwrap();
        c.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        c.read_exact(&mut got).ok()?;
        assert_eq!(&got, b"ping");
        Some(start.elapsed())
    };
    assert!(round_trip(&mut client, WAIT).is_some(), "forwards");
    proxy.delay(Duration::from_millis(200));
    let delayed = round_trip(&mut client, WAIT).unwrap();
    assert!(
        delayed >= Duration::from_millis(400),
        "{delayed:?}: each way"
    );
    proxy.delay(Duration::ZERO);
    proxy.cut();
    assert_eq!(
        round_trip(&mut client, Duration::from_millis(500)),
        None,
        "nothing comes back through a cut"
    );
    proxy.heal();
    let mut got = [0u8; 4];
    client.set_read_timeout(Some(WAIT)).unwrap();
    client.read_exact(&mut got).unwrap();
    assert_eq!(
        &got, b"ping",
        "what was sent during the cut arrives after it"
    );
    proxy.reset();
    client.set_read_timeout(Some(WAIT)).unwrap();
    assert!(
        matches!(client.read(&mut got), Ok(0) | Err(_)),
        "a reset closes the connection"
    );
    let mut again = TcpStream::connect(proxy.bootstrap()).unwrap();
    assert!(round_trip(&mut again, WAIT).is_some(), "a new connection");
    assert_eq!(proxy.connections(), 2);
}
