//! Bad input never takes the daemon down: null keys and values, empty and non-UTF-8 keys,
//! keys with spaces, quotes and newlines, a value near the broker's limit, odd headers
//! (empty names, null values, non-UTF-8 bytes, repeated names). Each is processed once,
//! committed, and logged on exactly one line whose `key=` reads back as produced.

mod common;

use std::time::Duration;

use common::{ackd::*, broker::*, lines::*, offsets::*, produce::*, topics::*};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;

const WAIT: Duration = Duration::from_secs(60);

struct Case {
    name: &'static str,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Option<OwnedHeaders>,
    /// What `key=` must read back as (`None`: no `key=` field).
    shown: Option<&'static str>,
}

fn case(
    name: &'static str,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    shown: Option<&'static str>,
) -> Case {
    Case {
        name,
        key: key.map(<[u8]>::to_vec),
        value: value.map(<[u8]>::to_vec),
        headers: None,
        shown,
    }
}

fn odd_headers() -> OwnedHeaders {
    OwnedHeaders::new()
        .insert(Header {
            key: "",
            value: Some("empty name"),
        })
        .insert(Header {
            key: "null",
            value: None::<&[u8]>,
        })
        .insert(Header {
            key: "bytes",
            value: Some(&[0xff, 0x00, 0xfe, b'\n'][..]),
        })
        .insert(Header {
            key: "dup",
            value: Some("1"),
        })
        .insert(Header {
            key: "dup",
            value: Some("2"),
        })
        .insert(Header {
            key: "with space\nand newline",
            value: Some(""),
        })
}

#[test]
fn odd_keys_values_and_headers_are_processed_once_and_logged_on_one_line() {
    // One partition: offsets are the produce order.
    let (topic, group) = fresh_topic("bad-input", 1);

    let big = vec![b'x'; 900 * 1024];
    let mut cases = vec![
        case("null key", None, Some(b"v"), None),
        case("null value", Some(b"tombstone"), None, Some("tombstone")),
        case("null key and value", None, None, None),
        case("empty value", Some(b"empty"), Some(b""), Some("empty")),
        case("empty key", Some(b""), Some(b"v"), Some("")),
        case(
            "non-UTF-8 key",
            Some(&[0xff, 0xfe, b'a']),
            Some(b"v"),
            Some(r"\xff\xfea"),
        ),
        case(
            "key with spaces, quotes, = and a newline",
            Some(b"a \"quoted\" key=1\nsecond line\\"),
            Some(b"v"),
            Some("a \"quoted\" key=1\nsecond line\\"),
        ),
        case(
            "key with control characters",
            Some(b"tab\there\r\x1b[31mred"),
            Some(b"v"),
            Some("tab\there\r\\u{001b}[31mred"),
        ),
        case("900 KB value", Some(b"big"), Some(&big), Some("big")),
        case(
            "newline in the value",
            Some(b"nl"),
            Some(b"line 1\nline 2\n"),
            Some("nl"),
        ),
    ];
    let mut with_headers = case("odd headers", Some(b"headers"), Some(b"v"), Some("headers"));
    with_headers.headers = Some(odd_headers());
    cases.push(with_headers);

    let producer = producer_for(&broker().bootstrap());
    let mut offsets = Vec::new();
    for c in &cases {
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&topic);
        if let Some(k) = &c.key {
            record = record.key(k.as_slice());
        }
        if let Some(v) = &c.value {
            record = record.payload(v.as_slice());
        }
        if let Some(h) = &c.headers {
            record = record.headers(h.clone());
        }
        let delivery = futures::executor::block_on(producer.send(record, Duration::from_secs(30)))
            .unwrap_or_else(|(e, _)| panic!("{}: produce failed: {e}", c.name));
        assert_eq!(delivery.partition, 0);
        offsets.push(delivery.offset);
    }
    assert_eq!(offsets, (0..cases.len() as i64).collect::<Vec<_>>());

    let ackd = AckdBuilder::new(&topic, &group).spawn();
    ackd.wait_for_count(is_processed, cases.len(), WAIT);
    let lines = ackd.stop(0, WAIT);

    // Every line is one whole logfmt line: a raw newline in a value would leave a piece
    // of a line that starts with neither `at=`, `level=` nor a metric.
    for l in &lines {
        let pairs = logfmt::parse(l);
        let first = pairs.first().map(|p| p.key.as_str()).unwrap_or("");
        assert!(
            first == "at" || first == "level" || first.starts_with("count#"),
            "not a whole ackd line: {l:?}"
        );
    }
    let per_message: Vec<&String> = lines.iter().filter(|l| is_processed(l)).collect();
    assert_eq!(
        per_message.len(),
        cases.len(),
        "each once:\n{}",
        lines.join("\n")
    );
    for (c, l) in cases.iter().zip(&per_message) {
        assert_eq!(
            field(l, "offset"),
            Some(offsets[cases.iter().position(|x| x.name == c.name).unwrap()].to_string()),
            "{}: {l}",
            c.name
        );
        assert_eq!(field(l, "key").as_deref(), c.shown, "{}: {l}", c.name);
    }
    assert!(!lines
        .iter()
        .any(|l| at(l, "process_failed") || at(l, "fetch_error")));
    assert_eq!(
        committed_offset(&group, &topic, 0),
        Some(cases.len() as i64),
        "committed = log end"
    );
    eprintln!(
        "bad input: {} odd messages (largest {} bytes) processed once each, one line each, committed {}",
        cases.len(),
        big.len(),
        cases.len()
    );
}
