//! Retry topics (`ACKD_RETRY_TOPICS`) against the real broker, with the testkit's
//! `faulty` processor: a message whose payload is `attempts:N` fails retryably while
//! ackd hands it over as attempt N or less (its attempt continues across tiers, read
//! from the copy's header). Tiers are short (1 s, 2 s) to keep the file quick.
//!
//! Checked: each failing message goes through the tiers, each copy processed no earlier
//! than its due time (its timestamp, as the broker has it, plus its tier's delay) and
//! late by at most [`LATE_MS`]; the rest of its partition flows meanwhile; after the last
//! tier it is dead-lettered with its provenance; SIGTERM and SIGKILL while copies wait
//! in a tier lose nothing and flag repeats; bad settings and missing tier topics stop
//! ackd with exit 78.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{ackd::*, lines::*, offsets::*, produce::*, topics::*, wait::wait_until};

const WAIT: Duration = Duration::from_secs(60);
/// How late after its due time a copy may be processed here: it is fetched long before
/// it is due, so this is scheduling on a busy 2-core machine and the test's own clock.
const LATE_MS: i64 = 3_000;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

/// A source topic with `partitions`, its tiers `1s` and `2s` (one partition each) and a
/// dead-letter topic; returns (source, [tier 1, tier 2], dead-letter topic, group).
fn topics(prefix: &str, partitions: i32) -> (String, [String; 2], String, String) {
    topics_with(prefix, partitions, 1)
}

/// [`topics`], with `tier_partitions` partitions in each tier.
fn topics_with(
    prefix: &str,
    partitions: i32,
    tier_partitions: i32,
) -> (String, [String; 2], String, String) {
    let (topic, group) = fresh_topic(prefix, partitions);
    let tiers = [format!("{topic}.retry.1s"), format!("{topic}.retry.2s")];
    for t in &tiers {
        create_topic(t, tier_partitions);
    }
    let dlq = format!("{topic}.dlq");
    create_topic(&dlq, 1);
    (topic, tiers, dlq, group)
}

fn retrying_ackd(topic: &str, group: &str, dlq: &str) -> AckdBuilder {
    AckdBuilder::new(topic, group)
        .env("ACKD_PROCESSOR", "faulty")
        .env("ACKD_RETRY_TOPICS", "1s,2s")
        .env("ACKD_ON_FAILURE", "dead-letter")
        .env("ACKD_DEAD_LETTER_TOPIC", dlq)
        .env("ACKD_COMMIT_INTERVAL_MS", "500")
}

/// (topic, partition, offset) a line names.
fn place(line: &str) -> (String, i32, i64) {
    (
        field(line, "topic").expect("topic="),
        field(line, "partition").unwrap().parse().unwrap(),
        field(line, "offset").unwrap().parse().unwrap(),
    )
}

/// Whether `line` says ackd handled the message at `place`: processed it, failed it
/// over to a tier, or dead-lettered it.
fn handled(line: &str) -> bool {
    is_processed(line) || at(line, "retry_topic") || at(line, "dead_lettered")
}

/// One partition of ten messages: 2 fails on every attempt (through both tiers, then
/// dead-lettered), 5 once (processed in tier 1), 7 twice (processed in tier 2); the
/// others pass. `extra` settings on top. With batches (`exact` false) a call handed
/// over again counts as an attempt of every message in it, so where 5 and 7 end depends
/// on how the batches fell: only the rest is checked.
fn through_the_tiers(prefix: &str, extra: &[(&str, &str)], exact: bool) {
    let (topic, tiers, dlq, group) = topics(prefix, 1);
    let payloads: Vec<String> = (0..10)
        .map(|i| match i {
            2 => "attempts:9".to_string(),
            5 => "attempts:1".to_string(),
            7 => "attempts:2".to_string(),
            _ => "ok".to_string(),
        })
        .collect();
    let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    let trace: &[(&str, &[u8])] = &[("trace", b"t-2")];
    let records: Vec<Record<'_>> = (0..10)
        .map(|i| {
            let headers = if i == 2 { trace } else { &[] };
            (0, Some(keys[i].as_bytes()), payloads[i].as_bytes(), headers)
        })
        .collect();
    let mut builder = retrying_ackd(&topic, &group, &dlq);
    for (k, v) in extra {
        builder = builder.env(*k, *v);
    }
    let ackd = builder.spawn();
    ackd.wait_for_count(|l| at(l, "assigned"), 1, WAIT);
    let (anchor_ms, anchor) = (now_ms(), Instant::now());
    produce_records(&topic, &records);
    ackd.wait_for_line(|l| at(l, "dead_lettered"), WAIT);
    ackd.wait_for_count(is_processed, 9, WAIT);
    let timed = ackd.timed_lines();
    let lines = ackd.stop(0, WAIT);
    let all = lines.join("\n");
    let at_ms = |arrived: &Instant| anchor_ms + arrived.duration_since(anchor).as_millis() as i64;

    // Hops: 2 twice, 5 once, 7 twice, each from where the last left it.
    let hops: Vec<&(Instant, String)> =
        timed.iter().filter(|(_, l)| at(l, "retry_topic")).collect();
    let hopped: Vec<(String, i64)> = hops
        .iter()
        .map(|(_, l)| (field(l, "retry_topic").unwrap(), place(l).2))
        .collect();
    if exact {
        assert_eq!(hops.len(), 5, "{all}");
    }
    for t in &tiers {
        assert!(
            hopped.iter().any(|(to, _)| to == t),
            "nothing went to {t}: {all}"
        );
    }
    // Each copy, handled no earlier than its timestamp on the broker plus its tier, and
    // not much later; the due time it carries is that sum.
    let copies: BTreeMap<(String, i32, i64), i64> = tiers
        .iter()
        .zip([1_000, 2_000])
        .flat_map(|(t, delay)| {
            let n = hopped.iter().filter(|(to, _)| to == t).count();
            read_back(t, n, WAIT).into_iter().map(move |c| {
                let ts = c.timestamp.expect("a copy has a timestamp");
                assert_eq!(c.headers["ackd.due"], (ts + delay).to_string(), "{c:?}");
                ((t.clone(), 0, c.offset), ts + delay)
            })
        })
        .collect();
    assert_eq!(copies.len(), hops.len());
    for (arrived, line) in timed.iter().filter(|(_, l)| handled(l)) {
        let Some(due) = copies.get(&place(line)) else {
            continue;
        };
        let when = at_ms(arrived);
        assert!(when + 5 >= *due, "{} ms early: {line}", due - when);
        assert!(when <= due + LATE_MS, "{} ms late: {line}", when - due);
    }
    // The partition flowed past the failing message: all its other messages were
    // processed before the first copy was handled (not "before it was due": how long 9
    // messages take is the machine's speed, not a promise).
    let first_copy = timed
        .iter()
        .filter(|(_, l)| handled(l) && copies.contains_key(&place(l)))
        .map(|(arrived, _)| *arrived)
        .min()
        .expect("a copy was handled");
    for (arrived, line) in timed.iter().filter(|(_, l)| is_processed(l)) {
        if place(line).0 == topic {
            assert!(*arrived < first_copy, "waited for a retry: {line}");
        }
    }
    // Every message but 2 processed once, from its source or a tier; a tier's flagged
    // as a repeat (it was handed over before).
    let mut keys: Vec<String> = lines
        .iter()
        .filter(|l| is_processed(l))
        .map(|l| field(l, "key").unwrap())
        .collect();
    keys.sort();
    let expected: Vec<String> = [0, 1, 3, 4, 5, 6, 7, 8, 9]
        .iter()
        .map(|i| format!("k{i}"))
        .collect();
    assert_eq!(keys, expected, "{all}");
    let in_tiers = lines
        .iter()
        .filter(|l| is_processed(l) && place(l).0 != topic)
        .count();
    assert!(!exact || in_tiers == 2, "{all}");
    for line in lines
        .iter()
        .filter(|l| is_processed(l) && place(l).0 != topic)
    {
        assert_eq!(
            field(line, "redelivered").as_deref(),
            Some("true"),
            "{line}"
        );
        if exact {
            let key = field(line, "key").unwrap();
            let tier = if key == "k5" { 0 } else { 1 };
            assert!(key == "k5" || key == "k7", "{line}");
            assert_eq!(place(line).0, tiers[tier], "{line}");
        }
    }
    // The attempt went on across the tiers: the last failure was attempt 3.
    let dead = lines.iter().find(|l| at(l, "dead_lettered")).unwrap();
    assert_eq!(place(dead).0, tiers[1], "{dead}");
    let attempts = field(dead, "attempts").unwrap();
    if exact {
        assert_eq!(attempts, "3", "{dead}");
    }
    let source = read_back(&topic, 10, WAIT);
    let got = read_back(&dlq, 1, WAIT);
    let letter = &got[0];
    assert_eq!(letter.key.as_deref(), Some(&b"k2"[..]));
    assert_eq!(letter.payload.as_deref(), Some(&b"attempts:9"[..]));
    let h = &letter.headers;
    assert_eq!(
        h["trace"], "t-2",
        "the message's own headers are kept: {h:?}"
    );
    assert_eq!(h["ackd.source.topic"], topic, "{h:?}");
    assert_eq!(h["ackd.source.partition"], "0");
    assert_eq!(h["ackd.source.offset"], "2");
    assert_eq!(
        h["ackd.source.timestamp"],
        source[2].timestamp.unwrap().to_string()
    );
    assert_eq!(h["ackd.attempts"], attempts);
    assert!(
        h["ackd.error"].contains(&format!("attempt {attempts} of 9")),
        "{h:?}"
    );
    assert!(
        !h.contains_key("ackd.due"),
        "a dead letter is due for nothing: {h:?}"
    );
    assert_committed(&group, &topic, 0, Some(10));
    for t in &tiers {
        let n = hopped.iter().filter(|(to, _)| to == t).count() as i64;
        assert_committed(&group, t, 0, Some(n));
    }
}

#[test]
fn a_failing_message_goes_through_the_tiers_on_time_while_its_partition_flows() {
    through_the_tiers("retry-tiers", &[], true);
}

#[test]
fn the_tiers_hold_with_key_ordering_and_with_batches() {
    through_the_tiers("retry-tiers-key", &[("ACKD_ORDERING", "key")], true);
    through_the_tiers(
        "retry-tiers-batch",
        &[
            ("ACKD_BATCH_MAX_MESSAGES", "4"),
            ("ACKD_BATCH_MAX_WAIT_MS", "50"),
        ],
        false,
    );
}

/// 16 messages on 2 partitions, 6 failing once (processed in tier 1) and 2 always
/// (dead-lettered after tier 2). A SIGTERM while copies wait in tier 1, then a SIGKILL
/// while they wait in tier 2, then a run to the end: every message processed or
/// dead-lettered, each repeat flagged, everything committed. The killed run gets 4 more
/// messages and commits nothing past where it resumed (a 60 s interval, and too few
/// messages to ask for a dispatch limit): they come again in the last run, so the
/// check that repeats are flagged has repeats to check.
#[test]
fn sigterm_and_sigkill_while_copies_wait_lose_nothing() {
    let (topic, tiers, dlq, group) = topics("retry-stop", 2);
    let payload = |i: usize| match i % 8 {
        1 | 3 | 5 => "attempts:1",
        6 => "attempts:9",
        _ => "ok",
    };
    let keys: Vec<String> = (0..16).map(|i| format!("k{i}")).collect();
    let records: Vec<Record<'_>> = (0..16)
        .map(|i| {
            (
                (i / 8) as i32,
                Some(keys[i].as_bytes()),
                payload(i).as_bytes(),
                &[][..],
            )
        })
        .collect();
    let sent = produce_records(&topic, &records);
    let failing: BTreeSet<(i32, i64)> = (0..16)
        .filter(|i| payload(*i) != "ok")
        .map(|i| sent[i])
        .collect();
    let first = retrying_ackd(&topic, &group, &dlq).spawn();
    first.wait_for_count(|l| at(l, "retry_topic"), failing.len(), WAIT);
    let asked = Instant::now();
    let one = first.stop(0, WAIT);
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "waiting copies held up the stop: {}",
        one.join("\n")
    );
    // The sources are done: each hop's copy was acknowledged by the broker first.
    assert_committed(&group, &topic, 0, Some(8));
    assert_committed(&group, &topic, 1, Some(8));

    let more: Vec<Record<'_>> = (0..4).map(|i| (i % 2, None, &b"ok"[..], &[][..])).collect();
    let repeated = produce_records(&topic, &more);
    let second = retrying_ackd(&topic, &group, &dlq)
        .env("ACKD_COMMIT_INTERVAL_MS", "60000")
        .spawn();
    second.wait_for_line(
        |l| at(l, "retry_topic") && field(l, "retry_topic").as_deref() == Some(tiers[1].as_str()),
        WAIT,
    );
    // The source was committed through the first 16: only these 4 are processed.
    second.wait_for_count(
        |l| is_processed(l) && place(l).0 == topic,
        repeated.len(),
        WAIT,
    );
    second.sigkill();
    second.wait_exit(WAIT);
    let two = second.lines();

    // To the end: every partition, source and tier, committed to its log's end (a copy
    // being made keeps its message's tier, or source, behind).
    let third = retrying_ackd(&topic, &group, &dlq).spawn();
    let mut partitions: Vec<(&str, i32)> = vec![(&topic, 0), (&topic, 1)];
    partitions.extend(tiers.iter().map(|t| (t.as_str(), 0)));
    wait_until(WAIT, || {
        std::thread::sleep(Duration::from_millis(200));
        count_at(&third.lines(), "dead_lettered") >= 2
            && partitions
                .iter()
                .all(|(t, p)| committed_offset(&group, t, *p) == Some(log_end(t, *p)))
    });
    let three = third.stop(0, WAIT);

    // Every source message: processed (from the source or a tier) or dead-lettered.
    let mut done: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    let copies: BTreeMap<(String, i64), (i32, i64)> = tiers
        .iter()
        .flat_map(|t| {
            let n = log_end(t, 0) as usize;
            read_back(t, n, WAIT).into_iter().map(move |c| {
                let p: i32 = c.headers["ackd.source.partition"].parse().unwrap();
                let o: i64 = c.headers["ackd.source.offset"].parse().unwrap();
                ((t.clone(), c.offset), (p, o))
            })
        })
        .collect();
    let source_of = |line: &str| {
        let (t, p, o) = place(line);
        if t == topic {
            (p, o)
        } else {
            copies[&(t, o)]
        }
    };
    for run in [&one, &two, &three] {
        for line in run
            .iter()
            .filter(|l| is_processed(l) || at(l, "dead_lettered"))
        {
            *done.entry(source_of(line)).or_default() += 1;
            // Tier copies were handed over before; repeats of the source are flagged.
            if is_processed(line) && place(line).0 != topic {
                assert_eq!(
                    field(line, "redelivered").as_deref(),
                    Some("true"),
                    "{line}"
                );
            }
        }
    }
    let all: BTreeSet<(i32, i64)> = sent.iter().chain(&repeated).copied().collect();
    assert_eq!(
        done.keys().copied().collect::<BTreeSet<_>>(),
        all,
        "lost:\n{}\n--\n{}\n--\n{}",
        one.join("\n"),
        two.join("\n"),
        three.join("\n")
    );
    let flagged_repeats = [&one, &two, &three]
        .iter()
        .flat_map(|r| r.iter())
        .filter(|l| is_processed(l) && place(l).0 == topic)
        .fold(BTreeMap::<(i32, i64), Vec<bool>>::new(), |mut m, l| {
            let (_, p, o) = place(l);
            m.entry((p, o))
                .or_default()
                .push(field(l, "redelivered").as_deref() == Some("true"));
            m
        });
    for r in &repeated {
        assert!(
            flagged_repeats.get(r).is_some_and(|f| f.len() >= 2),
            "{r:?}, processed by the killed run before any commit, did not come again: {:?}",
            flagged_repeats
        );
    }
    for (at_, flags) in flagged_repeats {
        assert!(
            flags.iter().skip(1).all(|f| *f),
            "a repeat of {at_:?} was not flagged"
        );
    }
    let letters = read_back(&dlq, log_end(&dlq, 0) as usize, WAIT);
    let dead: BTreeSet<(i32, i64)> = letters
        .iter()
        .map(|l| {
            (
                l.headers["ackd.source.partition"].parse().unwrap(),
                l.headers["ackd.source.offset"].parse().unwrap(),
            )
        })
        .collect();
    let always: BTreeSet<(i32, i64)> = (0..16)
        .filter(|i| payload(*i) == "attempts:9")
        .map(|i| sent[i])
        .collect();
    assert_eq!(dead, always);
    for (t, p) in partitions {
        assert_committed(&group, t, p, Some(log_end(t, p)));
    }
}

/// The end of `topic`'s partition `partition`: its high watermark.
fn log_end(topic: &str, partition: i32) -> i64 {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let client: BaseConsumer = common::broker::broker()
        .client_config()
        .create()
        .expect("a client");
    client
        .fetch_watermarks(topic, partition, Duration::from_secs(10))
        .expect("watermarks")
        .1
}

#[test]
fn bad_retry_settings_and_missing_tier_topics_stop_ackd() {
    for bad in ["10s,5s", "10", "1s,1s"] {
        let ackd = AckdBuilder::without_broker("t", "g")
            .env("ACKD_RETRY_TOPICS", bad)
            .spawn();
        ackd.assert_config_error("ACKD_RETRY_TOPICS", WAIT);
    }
    let ackd = AckdBuilder::without_broker("t", "g")
        .env("ACKD_RETRY_TOPICS", "10s")
        .env("ACKD_RETRY_MAX_ATTEMPTS", "3")
        .spawn();
    let line = ackd.assert_config_error("ACKD_RETRY_MAX_ATTEMPTS", WAIT);
    assert!(line.contains("ACKD_RETRY_TOPICS"), "{line}");
    // The source exists, its 10s tier does not: nothing is consumed, and `ackd check`
    // says so the same way.
    let (topic, group) = fresh_topic("retry-missing", 1);
    create_topic(&format!("{topic}.retry.1s"), 1);
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_RETRY_TOPICS", "1s,10s")
        .spawn();
    let line = ackd.assert_config_error("ACKD_RETRY_TOPICS", WAIT);
    assert!(line.contains(&format!("{topic}.retry.10s")), "{line}");
    assert_eq!(field(&line, "topics"), Some(format!("{topic}.retry.10s")));
}

/// A tier partition the group never committed, with `ACKD_START_FROM=latest` (a crash
/// before its first commit leaves it so): ackd starts it at its beginning, since its
/// copies were made by this group after their originals were acknowledged; the copy
/// is processed, not skipped, as the attempt its header says.
#[test]
fn a_tier_without_a_commit_starts_at_its_beginning_whatever_the_start_policy() {
    let (topic, tiers, dlq, group) = topics("retry-latest", 1);
    let made: &[(&str, &[u8])] = &[("ackd.attempts", b"1"), ("ackd.source.topic", b"x")];
    let copy: [Record<'_>; 1] = [(0, Some(b"k-copy"), b"attempts:1", made)];
    produce_records(&tiers[0], &copy);
    let ackd = retrying_ackd(&topic, &group, &dlq)
        .env("ACKD_START_FROM", "latest")
        .spawn();
    let line = ackd.wait_for_line(|l| is_processed(l) && place(l).0 == tiers[0], WAIT);
    assert_eq!(place(&line).2, 0, "{line}");
    assert_eq!(
        field(&line, "redelivered").as_deref(),
        Some("true"),
        "{line}"
    );
    ackd.stop(0, WAIT);
    assert_committed(&group, &tiers[0], 0, Some(1));
}

/// A second member joins while copies wait in the tiers (two partitions each, so some
/// move): the revoked partitions release their waiting copies unstarted and commit;
/// every message is processed or dead-lettered, by one member or the other; the repeats
/// of source messages are flagged; everything is committed to its end.
#[test]
fn a_revoke_while_copies_wait_loses_nothing() {
    let (topic, tiers, dlq, group) = topics_with("retry-revoke", 2, 2);
    let payload = |i: usize| match i % 6 {
        1 | 4 => "attempts:1",
        2 => "attempts:2",
        5 if i < 6 => "attempts:9",
        _ => "ok",
    };
    let keys: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    let records: Vec<Record<'_>> = (0..12)
        .map(|i| {
            (
                (i % 2) as i32,
                Some(keys[i].as_bytes()),
                payload(i).as_bytes(),
                &[][..],
            )
        })
        .collect();
    let failing = (0..12).filter(|i| payload(*i) != "ok").count();
    let a = retrying_ackd(&topic, &group, &dlq).spawn();
    a.wait_for_count(|l| at(l, "assigned"), 6, WAIT);
    produce_records(&topic, &records);
    a.wait_for_count(|l| at(l, "retry_topic"), failing, WAIT);
    let b = retrying_ackd(&topic, &group, &dlq).spawn();
    a.wait_for_line(|l| at(l, "revoked"), WAIT);
    let mut partitions: Vec<(&str, i32)> = vec![(&topic, 0), (&topic, 1)];
    partitions.extend(
        tiers
            .iter()
            .flat_map(|t| [(t.as_str(), 0), (t.as_str(), 1)]),
    );
    let covered = |runs: &[Vec<String>]| -> BTreeSet<String> {
        runs.iter()
            .flatten()
            .filter(|l| is_processed(l) || at(l, "dead_lettered"))
            .filter_map(|l| field(l, "key"))
            .collect()
    };
    wait_until(WAIT, || {
        std::thread::sleep(Duration::from_millis(200));
        covered(&[a.lines(), b.lines()]).len() == keys.len()
            && partitions
                .iter()
                .all(|(t, p)| committed_offset(&group, t, *p) == Some(log_end(t, *p)))
    });
    let runs = [a.stop(0, WAIT), b.stop(0, WAIT)];
    assert_eq!(
        covered(&runs),
        keys.iter().cloned().collect::<BTreeSet<_>>(),
        "{}\n--\n{}",
        runs[0].join("\n"),
        runs[1].join("\n")
    );
    let mut seen: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for line in runs.iter().flatten().filter(|l| is_processed(l)) {
        let (t, p, o) = place(line);
        let repeat = t == topic && {
            let n = seen.entry((p, o)).or_default();
            *n += 1;
            *n > 1
        };
        if t != topic || repeat {
            assert_eq!(
                field(line, "redelivered").as_deref(),
                Some("true"),
                "{line}"
            );
        }
    }
    for (t, p) in partitions {
        assert_committed(&group, t, p, Some(log_end(t, p)));
    }
}

/// Produces one message of `payload` to partition 0 of `topic`, with a producer whose
/// own limit takes it (librdkafka's default, 1,000,000 bytes, is below the broker's).
fn produce_large(topic: &str, payload: &[u8]) {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = common::broker::broker()
        .client_config()
        .set("message.max.bytes", "2000000")
        .create()
        .expect("producer");
    let record: FutureRecord<'_, [u8], [u8]> =
        FutureRecord::to(topic).partition(0).payload(payload);
    futures::executor::block_on(producer.send(record, WAIT)).expect("the broker takes it");
}

/// Creates `name` (one partition) with `max.message.bytes` set to `max`.
fn create_topic_taking(name: &str, max: usize) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = common::broker::broker()
        .client_config()
        .create()
        .expect("admin");
    let max = max.to_string();
    let topic = NewTopic::new(name, 1, TopicReplication::Fixed(1)).set("max.message.bytes", &max);
    let results = futures::executor::block_on(admin.create_topics([&topic], &AdminOptions::new()))
        .expect("create topic");
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    common::broker::wait_for_leaders(common::broker::broker(), name, 1);
}

/// `attempts:1` padded to `len` bytes: fails once, then passes (from its tier).
fn failing_once(len: usize) -> Vec<u8> {
    let mut payload = b"attempts:1 ".to_vec();
    payload.resize(len, b'.');
    payload
}

/// A message the topic took (1,040,000 bytes, under the broker's default
/// `max.message.bytes` of 1,048,588) is copied to a tier topic with the same default:
/// its copy is not refused by the producer's own, lower limit. And a message too large
/// for its tier (20,000 bytes, the tier taking 10,000) is not retried as if the failure
/// were passing: one `at=copy_too_large` line, the partition halts, the stop exits 1;
/// and the same for a dead letter.
#[test]
fn copies_are_sized_to_what_their_topics_take() {
    let (topic, group) = fresh_topic("copy-size", 1);
    let tier = format!("{topic}.retry.1s");
    create_topic(&tier, 1);
    produce_large(&topic, &failing_once(1_040_000));
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "faulty")
        .env("ACKD_RETRY_TOPICS", "1s")
        .quick_retries()
        .spawn();
    ackd.wait_for_line(
        |l| is_processed(l) && field(l, "topic").as_deref() == Some(&*tier),
        WAIT,
    );
    let lines = ackd.stop(0, WAIT);
    let all = lines.join("\n");
    assert_eq!(count_at(&lines, "retry_topic"), 1, "{all}");
    assert_eq!(count_at(&lines, "retry_topic_retry"), 0, "{all}");

    let (topic, group) = fresh_topic("copy-too-large", 1);
    let tier = format!("{topic}.retry.1s");
    create_topic_taking(&tier, 10_000);
    produce_large(&topic, &failing_once(20_000));
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "faulty")
        .env("ACKD_RETRY_TOPICS", "1s")
        .quick_retries()
        .spawn();
    let line = ackd.wait_for_line(|l| at(l, "copy_too_large"), WAIT);
    assert_eq!(field(&line, "to").as_deref(), Some(&*tier), "{line}");
    let lines = ackd.stop(1, WAIT);
    let all = lines.join("\n");
    assert_eq!(
        count_at(&lines, "retry_topic_retry"),
        0,
        "not retried: {all}"
    );
    assert_eq!(count_at(&lines, "retry_topic"), 0, "{all}");
    assert!(count_at(&lines, "halted") >= 1, "{all}");

    // The same for a dead letter (no tiers), the dead-letter topic taking 10,000 bytes.
    let (topic, group) = fresh_topic("dead-letter-too-large", 1);
    let dlq = format!("{topic}.dlq");
    create_topic_taking(&dlq, 10_000);
    produce_large(&topic, &failing_once(20_000));
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "faulty")
        .env("ACKD_RETRY_MAX_ATTEMPTS", "1")
        .env("ACKD_ON_FAILURE", "dead-letter")
        .env("ACKD_DEAD_LETTER_TOPIC", &dlq)
        .spawn();
    let line = ackd.wait_for_line(|l| at(l, "copy_too_large"), WAIT);
    assert_eq!(field(&line, "to").as_deref(), Some(&*dlq), "{line}");
    let lines = ackd.stop(1, WAIT);
    let all = lines.join("\n");
    assert_eq!(
        count_at(&lines, "dead_letter_retry"),
        0,
        "not retried: {all}"
    );
    assert_eq!(count_at(&lines, "dead_lettered"), 0, "{all}");
}
