//! The partition worker on the real broker: a partition
//! that cannot read a message is not committed past it; every jump forward in a
//! partition's offsets is a line with from/to and a count; a partition that comes back
//! to this process while its previous worker is stuck is read only once that worker is
//! gone.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::{Offset, TopicPartitionList};

use common::{
    accounting::*, ackd::*, broker::*, lines::*, offsets::*, produce::*, spawn::*, topics::*,
};

const WAIT: Duration = Duration::from_secs(90);

fn partition_of(line: &str) -> i32 {
    field(line, "partition")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no partition= in {line}"))
}

fn partition_of_opt(line: &str) -> Option<i32> {
    field(line, "partition").and_then(|p| p.parse().ok())
}

fn number(line: &str, key: &str) -> i64 {
    field(line, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line}"))
}

/// Retention passes the position of a partition being consumed. librdkafka's
/// next fetch is out of range and resets to the log start (ACKD_START_FROM=earliest):
/// the offsets between are committed past, and the line says so, with from, to and the
/// count, as a gap (no message there), not as messages that failed.
#[test]
fn a_jump_forward_mid_stream_is_a_line_with_from_to_and_count() {
    let (topic, group) = fresh_topic("gap", 1);
    // One at a time: each message its own record batch, so that a fetch brings few.
    let bodies: Vec<Vec<u8>> = (0..300).map(|i| format!("m-{i}").into_bytes()).collect();
    let records: Vec<Record<'_>> = bodies
        .iter()
        .map(|b| (0, None, b.as_slice(), &[][..]))
        .collect();
    let delivered: Vec<Delivered> = produce_records(&topic, &records)
        .into_iter()
        .map(|(partition, offset)| Delivered {
            partition,
            offset,
            key: None,
        })
        .collect();
    const DELETE_BEFORE: i64 = 200;
    // Slow, and fetching a few messages at a time: the position stays far behind 200.
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "slow")
        .env("ACKD_TEST_DELAY_MS", "50")
        .env("ACKD_RDKAFKA_QUEUED_MIN_MESSAGES", "5")
        .env("ACKD_RDKAFKA_QUEUED_MAX_MESSAGES_KBYTES", "1")
        .env("ACKD_RDKAFKA_MAX_PARTITION_FETCH_BYTES", "512")
        .spawn();
    ackd.wait_for_count(is_processed, 10, WAIT);
    let admin: AdminClient<DefaultClientContext> =
        broker().client_config().create().expect("admin client");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Offset(DELETE_BEFORE))
        .unwrap();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    futures::executor::block_on(admin.delete_records(&tpl, &opts)).expect("delete records");
    let deleted_at = Instant::now();

    ackd.wait_for_line(|l| is_processed_at(l, 299), WAIT);
    ackd.sigterm();
    let code = ackd.wait_exit(WAIT);
    let lines = ackd.lines();
    assert_eq!(code, 0, "{}", lines.join("\n"));

    let seen = processed(&lines);
    let before: Vec<i64> = seen
        .iter()
        .map(|(_, o)| *o)
        .filter(|o| *o < DELETE_BEFORE)
        .collect();
    let last_before = *before.last().expect("processed before the deletion");
    assert!(
        last_before < DELETE_BEFORE - 1,
        "the position passed the deleted range before it was deleted: nothing to test"
    );
    // Everything before the jump, then everything from the log start: once each.
    let expected: Vec<i64> = (0..=last_before).chain(DELETE_BEFORE..300).collect();
    let got: Vec<i64> = seen.iter().map(|(_, o)| *o).collect();
    assert_eq!(got, expected, "processed offsets");

    let gaps: Vec<&String> = lines.iter().filter(|l| at(l, "offset_gap")).collect();
    assert_eq!(gaps.len(), 1, "one gap line: {gaps:?}");
    let gap = gaps[0];
    // A warning: ackd cannot tell retention from a message it skipped itself.
    assert_eq!(field(gap, "level").as_deref(), Some("warn"), "{gap}");
    assert_eq!(number(gap, "from"), last_before + 1, "{gap}");
    assert_eq!(number(gap, "to"), DELETE_BEFORE, "{gap}");
    assert_eq!(
        number(gap, "skipped"),
        DELETE_BEFORE - last_before - 1,
        "{gap}"
    );
    // Counted in the summary as well.
    let skipped_total: i64 = lines
        .iter()
        .filter(|l| at(l, "summary"))
        .filter_map(|l| field(l, "count#ackd.offsets.skipped"))
        .map(|v| v.parse::<i64>().unwrap())
        .sum();
    assert_eq!(skipped_total, DELETE_BEFORE - last_before - 1);
    // Committed at the log end: past the gap, and past nothing that was not processed.
    assert_committed_to_ends(&group, &topic, 1, &log_ends(&delivered));
    eprintln!(
        "gap: produced {}, deleted 0..{DELETE_BEFORE} at position {} ({:?} before the end), processed {}, lost before deletion 0, duplicated 0, gap line from={} to={DELETE_BEFORE} skipped={}, exit {code}",
        delivered.len(),
        last_before + 1,
        deleted_at.elapsed(),
        got.len(),
        last_before + 1,
        DELETE_BEFORE - last_before - 1
    );
}

/// A partition revoked while its processor is stuck in a blocking call (the
/// drain times out, the abort cannot take effect) comes back to the same process. Its
/// new worker must not read it while the old one still holds a handle on its queue:
/// when that handle finally drops, it unhooks the queue's wake-up, and a new worker
/// reading the queue already would stall for good.
#[test]
fn a_partition_that_comes_back_is_read_only_once_its_stuck_worker_ended() {
    let (topic, group) = fresh_topic("comeback", 2);
    let release = log_dir().join(unique_name("release"));
    let block = format!("block:{}", release.display());
    // A blocking message at the head of each partition: whichever partition moves,
    // its worker is stuck when it is revoked.
    let heads = produce_records(
        &topic,
        &[
            (0, None, block.as_bytes(), &[]),
            (1, None, block.as_bytes(), &[]),
        ],
    );
    let a = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "faulty")
        .env("ACKD_SHUTDOWN_TIMEOUT_MS", "2000")
        .env("ACKD_COMMIT_INTERVAL_MS", "500")
        // Two workers block their threads: leave the runtime threads to run the rest.
        .env("TOKIO_WORKER_THREADS", "4")
        .spawn();
    a.wait_for_count(|l| at(l, "test_blocked"), 2, WAIT);

    // b joins: one partition moves to it, with a's worker stuck in the processor. (b
    // may process the stuck message, or be stopped before it commits anything.)
    let b = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "log")
        .spawn();
    let revoked = a.wait_for_line(|l| at(l, "revoked"), WAIT);
    let moved = partition_of(&revoked);
    a.wait_for_line(|l| at(l, "worker_stuck") && partition_of(l) == moved, WAIT);
    b.wait_for_line(|l| at(l, "assigned") && partition_of(l) == moved, WAIT);
    // b leaves: the partition comes back to a, whose old worker is still stuck.
    b.stop(0, WAIT);
    let after_revoke = a
        .lines()
        .iter()
        .position(|l| at(l, "revoked"))
        .expect("revoked line");
    a.wait_for_line_from(
        after_revoke + 1,
        |l| at(l, "assigned") && partition_of(l) == moved,
        WAIT,
    );
    let head = heads.iter().find(|(p, _)| *p == moved).expect("head").1;
    // Messages for the partition while its old worker is still stuck: they wait.
    let early_bodies: Vec<Vec<u8>> = (0..5).map(|i| format!("early-{i}").into_bytes()).collect();
    let early: Vec<Record<'_>> = early_bodies
        .iter()
        .map(|b| (moved, None, b.as_slice(), &[][..]))
        .collect();
    let early = produce_records(&topic, &early);
    let seen = a.wait_for_line_from(
        after_revoke + 1,
        |l| {
            partition_of_opt(l) == Some(moved)
                && (at(l, "partition_waiting")
                    || at(l, "test_blocked")
                    || (is_processed(l) && number(l, "offset") > head))
        },
        WAIT,
    );
    // (Before the fix: if b stopped before it committed, the new worker resumed at the
    // stuck message and processed it too, beside the old worker: test_blocked again.)
    assert!(
        at(&seen, "partition_waiting"),
        "partition {moved} read by its new worker while the old one is stuck in it: {seen}\n{}",
        a.lines().join("\n")
    );

    // The old worker's processor returns: it acks into nothing and drops its queue.
    std::fs::write(&release, b"").expect("write release file");
    a.wait_for_line(
        |l| is_processed(l) && partition_of(l) == moved && number(l, "offset") == head,
        WAIT,
    );
    // Messages produced after that must reach the partition's new worker.
    let mut delivered: Vec<Delivered> = heads
        .iter()
        .chain(&early)
        .map(|&(partition, offset)| Delivered {
            partition,
            offset,
            key: None,
        })
        .collect();
    let mut records = Vec::new();
    let bodies: Vec<Vec<u8>> = (0..40).map(|i| format!("m-{i}").into_bytes()).collect();
    for (i, body) in bodies.iter().enumerate() {
        records.push(((i % 2) as i32, None, body.as_slice(), &[][..]));
    }
    for (partition, offset) in produce_records(&topic, &records) {
        delivered.push(Delivered {
            partition,
            offset,
            key: None,
        });
    }
    let expected: BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    let b_processed = processed(&b.lines());
    let deadline = Instant::now() + WAIT;
    loop {
        let mut seen: BTreeSet<(i32, i64)> = b_processed.iter().copied().collect();
        seen.extend(processed(&a.lines()));
        if seen.is_superset(&expected) {
            break;
        }
        let missing: Vec<_> = expected.difference(&seen).collect();
        assert!(
            Instant::now() < deadline,
            "partition {moved} stalled after it came back: {} of {} messages never processed: {missing:?}\n{}",
            missing.len(),
            expected.len(),
            a.lines().join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    a.sigterm();
    let code = a.wait_exit(WAIT);
    let a_lines = a.lines();
    assert_eq!(code, 0, "{}", a_lines.join("\n"));

    // The new worker read nothing before the old one was gone.
    let reassigned = after_revoke
        + 1
        + a_lines[after_revoke + 1..]
            .iter()
            .position(|l| at(l, "assigned") && partition_of(l) == moved)
            .unwrap();
    let released = a_lines
        .iter()
        .position(|l| at(l, "partition_released") && partition_of(l) == moved)
        .expect("at=partition_released: the new worker waited for the old one");
    let unblocked = a_lines
        .iter()
        .position(|l| at(l, "test_unblocked") && partition_of(l) == moved)
        .expect("test_unblocked");
    assert!(
        unblocked < released,
        "the new worker took the queue before the old worker's processor returned"
    );
    let first_new = a_lines[reassigned..]
        .iter()
        .position(|l| is_processed(l) && partition_of(l) == moved && number(l, "offset") > head)
        .map(|i| i + reassigned)
        .expect("the new worker processed the partition");
    assert!(
        released < first_new,
        "processed before the old worker ended"
    );

    // Nothing lost; the one duplicate is the stuck message: a's old worker finished it
    // after its partition was gone (that ack was dropped), and b or a's new worker
    // processed it again.
    let mut all = processed(&a_lines);
    all.extend(b_processed);
    let t = tally(&delivered, &all, &a_lines);
    assert!(t.lost.is_empty(), "lost: {:?}", t.lost);
    assert!(
        t.duplicated.iter().all(|&d| d == (moved, head)),
        "duplicated: {:?}",
        t.duplicated
    );
    let waited = field(&a_lines[released], "waited_ms").unwrap_or_default();
    eprintln!(
        "comeback: partition {moved} came back with its old worker stuck; produced {}, processed {}, lost 0, duplicated {:?}, new worker waited {waited} ms, exit codes a {code} b 0",
        delivered.len(),
        all.len(),
        t.duplicated
    );
}

/// A record batch on disk whose bytes no longer match its CRC (corrupted while
/// the broker was stopped; a clean restart does not re-check it). With `check.crcs=true`
/// librdkafka reports the batch as a fetch error (and, 2.12 does, fetches it again and
/// again). The partition must halt there and say so: the messages before it are
/// processed and committed, nothing after it is, the exit is not 0. (Before the fix:
/// a `level=warn at=fetch_error` line every fetch backoff, forever, and no halt.)
#[test]
fn a_batch_that_fails_its_crc_check_halts_the_partition_at_it() {
    let b = Broker::start(BrokerOptions::default());
    let (topic, group) = fresh_topic_on(&b, "crc", 1);
    let producer = producer_for(&b.bootstrap());
    const POISON: &str = "poison-0123456789";
    let mut bodies: Vec<String> = (0..20).map(|i| format!("m-{i}")).collect();
    bodies.push(POISON.to_string());
    bodies.extend((21..41).map(|i| format!("m-{i}")));
    // One at a time: one record batch each, so the corruption spoils only one.
    let delivered: Vec<Delivered> = bodies
        .iter()
        .flat_map(|body| produce_with(&producer, &topic, &[(None, body.clone().into_bytes())]))
        .collect();
    assert_eq!(delivered[20].offset, 20);
    drop(producer);

    b.stop_node(0);
    let segment_dir = b.data_dir(0).join(format!("{topic}-0"));
    let segment = std::fs::read_dir(&segment_dir)
        .expect("partition directory")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "log"))
        .expect("a .log segment");
    let mut bytes = std::fs::read(&segment).expect("read segment");
    let poison_at = bytes
        .windows(POISON.len())
        .position(|w| w == POISON.as_bytes())
        .expect("the poison payload in the segment");
    // One byte of the value: the batch's CRC no longer matches.
    bytes[poison_at + POISON.len() - 1] ^= 0x01;
    std::fs::write(&segment, &bytes).expect("write segment");
    b.start_node(0);
    b.wait_node_ready(0);

    let started = Instant::now();
    let ackd = AckdBuilder::on(&b.bootstrap(), &topic, &group)
        .env("ACKD_RDKAFKA_CHECK_CRCS", "true")
        .env("ACKD_METRICS_INTERVAL_MS", "300")
        .spawn();
    // Either the halt, or (the defect) the messages after the bad batch.
    let seen = ackd.wait_for_line(
        |l| at(l, "fetch_failed") || (is_processed(l) && number(l, "offset") > 20),
        WAIT,
    );
    assert!(
        at(&seen, "fetch_failed"),
        "processed past the unreadable batch: {seen}\n{}",
        ackd.lines().join("\n")
    );
    assert_eq!(number(&seen, "offset"), 20, "{seen}");
    assert_eq!(field(&seen, "level").as_deref(), Some("error"), "{seen}");
    // It keeps saying so while it runs.
    ackd.wait_for_line(|l| at(l, "halted") && number(l, "offset") == 20, WAIT);
    ackd.sigterm();
    let code = ackd.wait_exit(WAIT);
    let lines = ackd.lines();
    assert_eq!(code, 1, "a halted partition makes the exit non-zero");
    let got: Vec<i64> = processed(&lines).iter().map(|(_, o)| *o).collect();
    assert_eq!(got, (0..20).collect::<Vec<i64>>(), "processed offsets");
    let committed = committed_on(&b.bootstrap(), &group, &topic, 1);
    assert_eq!(
        committed[&0],
        Some(20),
        "committed up to the unreadable batch, not past it"
    );
    eprintln!(
        "crc: produced {}, batch at offset 20 corrupted on disk, processed {} (0..=19), committed 20, not processed 21 (the bad one and the 20 after it), exit {code}, {:?}",
        delivered.len(),
        got.len(),
        started.elapsed()
    );
}

/// Offsets without a message, the ordinary way: on a transactional topic every
/// transaction leaves a marker (one offset), and an aborted transaction's records are
/// never delivered (read_committed). Markers are counted, not a line each; the aborted transaction's
/// gap is one info line; everything committed is processed once and the commit ends
/// one past the last message.
#[test]
fn transaction_markers_are_counted_not_a_line_each() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let (topic, group) = fresh_topic("txn", 1);
    let producer: BaseProducer = broker()
        .client_config()
        .set("transactional.id", unique_name("txn-producer"))
        .set("linger.ms", "1")
        .create()
        .expect("transactional producer");
    let timeout = Duration::from_secs(30);
    producer
        .init_transactions(timeout)
        .expect("init transactions");
    const TRANSACTIONS: usize = 30;
    const ABORTED: usize = 10;
    let mut committed_bodies = Vec::new();
    for t in 0..TRANSACTIONS {
        producer.begin_transaction().expect("begin");
        let n = if t == ABORTED { 5 } else { 2 };
        for i in 0..n {
            let body = format!("t{t}-{i}");
            producer
                .send(BaseRecord::<(), _>::to(&topic).partition(0).payload(&body))
                .map_err(|(e, _)| e)
                .expect("send");
            if t != ABORTED {
                committed_bodies.push(body);
            }
        }
        // Written before the end of the transaction: an abort would purge the rest.
        producer.flush(timeout).expect("flush");
        if t == ABORTED {
            producer.abort_transaction(timeout).expect("abort");
        } else {
            producer.commit_transaction(timeout).expect("commit");
        }
    }
    // 29 transactions of 2 committed, one of 5 aborted: offsets 0..=91 with markers.
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_METRICS_INTERVAL_MS", "300")
        .spawn();
    ackd.wait_for_count(is_processed, committed_bodies.len(), WAIT);
    ackd.sigterm();
    let code = ackd.wait_exit(WAIT);
    let lines = ackd.lines();
    assert_eq!(code, 0, "{}", lines.join("\n"));
    let got: Vec<i64> = processed(&lines).iter().map(|(_, o)| *o).collect();
    // Transaction t (not the aborted one) holds offsets 3t and 3t+1 (its marker 3t+2),
    // but the aborted one takes 6 (5 records and its marker).
    let expected: Vec<i64> = (0..TRANSACTIONS as i64)
        .filter(|t| *t != ABORTED as i64)
        .flat_map(|t| {
            let base = if t < ABORTED as i64 { 3 * t } else { 3 * t + 3 };
            [base, base + 1]
        })
        .collect();
    assert_eq!(got, expected, "processed offsets");
    // Every gap named by a warning, at a bounded rate: each line names its own gap,
    // and where the gaps it had no line for lie.
    let gaps: Vec<&String> = lines.iter().filter(|l| at(l, "offset_gap")).collect();
    let mut named: Vec<(i64, i64)> = Vec::new();
    let mut counted = 0;
    for gap in &gaps {
        assert_eq!(field(gap, "level").as_deref(), Some("warn"), "{gap}");
        let (from, to) = (number(gap, "from"), number(gap, "to"));
        named.push((from, to));
        match field(gap, "gaps") {
            // The worker's last line: the gaps no line named yet.
            Some(n) => counted += n.parse::<i64>().unwrap(),
            None => {
                counted += 1 + number(gap, "earlier_gaps");
                if field(gap, "earlier_from").is_some() {
                    named.push((number(gap, "earlier_from"), number(gap, "earlier_to")));
                }
            }
        }
    }
    assert!(
        gaps.len() < TRANSACTIONS,
        "not a line per transaction: {gaps:?}"
    );
    let aborted_from = 3 * ABORTED as i64;
    assert!(
        named
            .iter()
            .any(|&(f, t)| f < aborted_from && t >= aborted_from + 6),
        "the aborted transaction's gap is named: {gaps:?}"
    );
    // A marker between each two committed transactions, the aborted one's gap among them.
    assert_eq!(counted, (TRANSACTIONS - 3) as i64 + 1, "{gaps:?}");
    let skipped_total: i64 = lines
        .iter()
        .filter(|l| at(l, "summary"))
        .filter_map(|l| field(l, "count#ackd.offsets.skipped"))
        .map(|v| v.parse::<i64>().unwrap())
        .sum();
    // A marker between each two committed transactions (28 pairs), one of which is
    // the aborted transaction's gap (7 offsets: a marker, 5 records, a marker).
    let markers = (TRANSACTIONS - 3) as i64;
    assert_eq!(skipped_total, markers + 7);
    let last = *expected.last().unwrap();
    let committed = committed(&group, &topic, 1);
    assert_eq!(committed[&0], Some(last + 1));
    eprintln!(
        "txn: {TRANSACTIONS} transactions ({} messages committed, 5 aborted), processed {}, lost 0, duplicated 0, gap lines {} naming {counted} gaps, offsets.skipped {skipped_total}, committed {}, exit {code}",
        committed_bodies.len(),
        got.len(),
        gaps.len(),
        last + 1
    );
}
