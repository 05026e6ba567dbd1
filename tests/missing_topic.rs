//! A topic in ACKD_TOPICS that does not exist on the brokers: ackd
//! never idles silently. By default it stops at once, exit 78, one `at=config_error
//! setting=ACKD_TOPICS` line naming the missing topic(s); with ACKD_WAIT_FOR_TOPICS=true
//! it says it waits (and again periodically) and consumes once the topic appears. ackd
//! never creates the topic (the test broker auto-creates topics for clients that ask).

mod common;

use std::time::{Duration, Instant};

use common::{accounting::*, ackd::*, lines::*, offsets::*, produce::*, topics::*};

const WAIT: Duration = Duration::from_secs(60);

#[test]
fn a_missing_topic_stops_ackd_with_78_naming_it() {
    let present = unique_name("present");
    let missing = unique_name("ordres");
    let group = unique_name("g-missing");
    create_topic(&present, 1);
    produce_keyed(&present, 5, 0);

    let started = Instant::now();
    let ackd = AckdBuilder::new(&format!("{present},{missing}"), &group).spawn();
    let code = ackd.wait_exit(WAIT);
    let lines = ackd.lines();
    let all = lines.join("\n");
    eprintln!("exit {code} after {:?}", started.elapsed());
    assert_eq!(code, 78, "{all}");
    let errors = all_at(&lines, "config_error");
    assert_eq!(errors.len(), 1, "{all}");
    assert_eq!(field(errors[0], "setting").as_deref(), Some("ACKD_TOPICS"));
    assert_eq!(
        field(errors[0], "topics").as_deref(),
        Some(missing.as_str())
    );
    assert!(errors[0].contains("ACKD_WAIT_FOR_TOPICS"), "{}", errors[0]);
    assert!(processed(&lines).is_empty(), "{all}");
    assert!(committed_offset(&group, &present, 0).is_none());
    assert!(!topic_exists(&missing), "ackd created {missing}");
    assert!(topic_exists(&present));
}

#[test]
fn waiting_for_a_topic_consumes_it_once_it_is_created() {
    let topic = unique_name("later");
    let group = unique_name("g-later");
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_WAIT_FOR_TOPICS", "true")
        .spawn();
    let waiting = ackd.wait_for_line(|l| at(l, "waiting_for_topics"), WAIT);
    assert_eq!(field(&waiting, "topics").as_deref(), Some(topic.as_str()));
    assert!(!topic_exists(&topic), "ackd created {topic}");

    create_topic(&topic, 3);
    let delivered = produce_keyed(&topic, 30, 0);
    ackd.wait_for_line(|l| at(l, "topics_available"), WAIT);
    ackd.wait_for_count(is_processed, delivered.len(), WAIT);
    ackd.sigterm();
    let code = ackd.wait_exit(WAIT);
    let lines = ackd.lines();
    assert_eq!(code, 0, "{}", lines.join("\n"));
    let t = tally(&delivered, &processed(&lines), &lines);
    eprintln!(
        "delivered {} processed {} lost {} duplicated {}",
        delivered.len(),
        processed(&lines).len(),
        t.lost.len(),
        t.duplicated.len()
    );
    assert!(t.lost.is_empty() && t.duplicated.is_empty(), "{t:?}");
    assert_committed_to_ends(&group, &topic, 3, &log_ends(&delivered));
}

#[test]
fn sigterm_while_waiting_for_a_topic_exits_0() {
    let topic = unique_name("never");
    let group = unique_name("g-never");
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_WAIT_FOR_TOPICS", "true")
        .spawn();
    ackd.wait_for_line(|l| at(l, "waiting_for_topics"), WAIT);
    let asked = Instant::now();
    ackd.sigterm();
    let code = ackd.wait_exit(WAIT);
    eprintln!("exit {code} {:?} after SIGTERM", asked.elapsed());
    assert_eq!(code, 0, "{}", ackd.lines().join("\n"));
    assert!(ackd.lines().iter().any(|l| at(l, "exit")));
    assert!(!topic_exists(&topic), "ackd created {topic}");
}
