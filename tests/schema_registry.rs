//! Schema Registry decoding against Apache Kafka and Apicurio Registry (one of each per
//! test binary): messages produced with confluent-kafka's registry-aware serializers reach
//! the handler as JSON; messages that cannot be decoded take the failure policy; a
//! registry that cannot answer holds the partition, and nothing is lost.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use common::broker::broker;
use common::proxy::Proxy;
use common::registry::{produce_with_serializer, registry};
use common::spawn::fresh_dir;
use common::{ackd::*, lines::*, offsets::*, produce::*, topics::*};

const WAIT: Duration = Duration::from_secs(90);

/// An order with a union, logical types and bytes: what docs/schemas.md shows decoded.
const ORDER_SCHEMA: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[
 {"name":"id","type":"long"},
 {"name":"note","type":["null","string"],"default":null},
 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},
 {"name":"placed_at","type":{"type":"long","logicalType":"timestamp-millis"}},
 {"name":"placed_at_us","type":{"type":"long","logicalType":"timestamp-micros"}},
 {"name":"day","type":{"type":"int","logicalType":"date"}},
 {"name":"ref","type":{"type":"string","logicalType":"uuid"}},
 {"name":"blob","type":"bytes"},
 {"name":"status","type":{"type":"enum","name":"Status","symbols":["NEW","PAID"]}}]}"#;

fn order(id: i64, note: Option<&str>) -> Value {
    json!({
        "id": id, "note": note, "amount": "1234.50", "placed_at": 1_700_000_000_123_i64,
        "placed_at_us": 1_700_000_000_123_456_i64, "day": 19_723,
        "ref": "5f0c2a7e-4a8e-4b7c-9c3e-3a4b5c6d7e8f", "blob": "\u{1}\u{2}", "status": "PAID"
    })
}

/// What the handler must get for [`order`].
fn decoded_order(id: i64, note: Option<&str>) -> Value {
    json!({
        "id": id, "note": note, "amount": "1234.50",
        "placed_at": "2023-11-14T22:13:20.123Z", "placed_at_us": "2023-11-14T22:13:20.123456Z",
        "day": "2024-01-01", "ref": "5f0c2a7e-4a8e-4b7c-9c3e-3a4b5c6d7e8f",
        "blob": "AQI=", "status": "PAID"
    })
}

fn avro(topic: &str, url: &str, schema: &str, records: &[(Option<&str>, Value)]) -> Vec<u32> {
    produce_with_serializer(&broker().bootstrap(), url, topic, "avro", schema, records)
}

/// An exec handler that writes every request line (a message, or a batch) to `requests`
/// and acks it.
fn recording_handler(dir: &std::path::Path) -> String {
    let path = dir.join("handler.py");
    let requests = dir.join("requests");
    std::fs::write(
        &path,
        format!(
            "import json, sys\nout = open({:?}, 'a')\nfor line in sys.stdin:\n    out.write(line); out.flush()\n    m = json.loads(line)\n    if isinstance(m, list):\n        reply = {{'ack': True, 'first': m[0]['offset'], 'last': m[-1]['offset']}}\n    else:\n        reply = {{'ack': True, 'offset': m['offset']}}\n    print(json.dumps(reply), flush=True)\n",
            requests.to_str().unwrap()
        ),
    )
    .unwrap();
    format!("python3 {}", path.display())
}

fn requests(dir: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("requests"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn an_avro_record_reaches_the_exec_handler_as_json() {
    let (topic, group) = fresh_topic("sr-avro", 1);
    // The same schema under a subject listed before the topic's own: the registry gives
    // the id both, and the topic's `<topic>-value` is the one named.
    registry().call(
        "POST",
        "subjects/0-shared-value/versions",
        &json!({ "schema": ORDER_SCHEMA }),
    );
    let ids = avro(
        &topic,
        &registry().url(),
        ORDER_SCHEMA,
        &[
            (Some("k-1"), order(1, Some("gift"))),
            (None, order(2, None)),
        ],
    );
    assert_eq!(ids.len(), 1, "one schema: {ids:?}");
    let dir = fresh_dir("sr-avro");
    let ackd = exec_ackd(&topic, &group, &recording_handler(&dir))
        .env("ACKD_VALUE_FORMAT", "avro")
        .env("ACKD_SCHEMA_REGISTRY_URL", registry().url())
        .env("ACKD_SCHEMA_RAW_BYTES", "true")
        .spawn();
    ackd.wait_for_line(|l| is_processed_at(l, 1), WAIT);
    ackd.stop(0, WAIT);
    let got = requests(&dir);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0]["value"], decoded_order(1, Some("gift")));
    assert_eq!(got[1]["value"], decoded_order(2, None));
    assert_eq!(got[0]["schema_id"], json!(ids[0]));
    let subject = format!("{topic}-value");
    assert_eq!(got[0]["subject"], json!(subject), "{}", got[0]);
    assert_eq!(got[1]["subject"], json!(subject), "{}", got[1]);
    assert_eq!(got[0]["key"], "k-1", "a raw key stays as it was");
    assert!(got[0].get("key_schema_id").is_none(), "{}", got[0]);
    assert!(got[0].get("key_subject").is_none(), "{}", got[0]);
    let raw = got[0]["value_raw_base64"]
        .as_str()
        .expect("raw bytes asked for");
    assert!(raw.starts_with("AAAAA"), "the wire format's header: {raw}");
    assert!(got[0].get("value_base64").is_none(), "{}", got[0]);
    assert_committed(&group, &topic, 0, Some(2));
}

#[test]
fn json_schema_values_come_through_in_batches() {
    let (topic, group) = fresh_topic("sr-json", 1);
    let schema =
        r#"{"type":"object","properties":{"sku":{"type":"string"},"qty":{"type":"integer"}}}"#;
    let records: Vec<(Option<&str>, Value)> = (0..3)
        .map(|i| (Some("k"), json!({"sku": format!("s-{i}"), "qty": i})))
        .collect();
    let ids = produce_with_serializer(
        &broker().bootstrap(),
        &registry().url(),
        &topic,
        "json-schema",
        schema,
        &records,
    );
    let dir = fresh_dir("sr-json");
    let ackd = exec_ackd(&topic, &group, &recording_handler(&dir))
        .env("ACKD_VALUE_FORMAT", "json-schema")
        .env("ACKD_SCHEMA_REGISTRY_URL", registry().url())
        .env("ACKD_BATCH_MAX_MESSAGES", "10")
        .env("ACKD_BATCH_MAX_WAIT_MS", "1000")
        .spawn();
    ackd.wait_for_line(|l| is_processed_at(l, 2), WAIT);
    ackd.stop(0, WAIT);
    let values: Vec<Value> = requests(&dir)
        .into_iter()
        .flat_map(|r| r.as_array().cloned().expect("a batch"))
        .collect();
    assert_eq!(values.len(), 3, "{values:?}");
    for (i, v) in values.iter().enumerate() {
        assert_eq!(v["value"], records[i].1, "{v}");
        assert_eq!(v["schema_id"], json!(ids[0]), "{v}");
    }
    assert_committed(&group, &topic, 0, Some(3));
}

#[test]
fn a_protobuf_message_of_the_second_type_reaches_the_handler_as_canonical_json() {
    let (topic, group) = fresh_topic("sr-proto", 1);
    let spec = json!({"name": "shop/order.proto", "package": "shop", "use": "Payment", "messages": [
        {"name": "Order", "fields": [["id", 1, "int64"]]},
        {"name": "Payment", "fields": [["order_id", 1, "int64"], ["paid", 2, "bool"], ["note", 3, "string"]]}]});
    let ids = produce_with_serializer(
        &broker().bootstrap(),
        &registry().url(),
        &topic,
        "protobuf",
        &spec.to_string(),
        &[(None, json!({"order_id": 42, "paid": true, "note": "ok"}))],
    );
    let dir = fresh_dir("sr-proto");
    let ackd = exec_ackd(&topic, &group, &recording_handler(&dir))
        .env("ACKD_VALUE_FORMAT", "protobuf")
        .env("ACKD_SCHEMA_REGISTRY_URL", registry().url())
        .spawn();
    ackd.wait_for_line(|l| is_processed_at(l, 0), WAIT);
    ackd.stop(0, WAIT);
    let got = requests(&dir);
    // Payment, the file's second message (index list [1]); proto3 JSON: camelCase names,
    // a 64-bit integer as a string.
    assert_eq!(
        got[0]["value"],
        json!({"orderId": "42", "paid": true, "note": "ok"})
    );
    assert_eq!(got[0]["schema_id"], json!(ids[0]));
}

/// Three versions of one subject, each the writer's schema of one message.
const EVOLVING_V1: &str = r#"{"type":"record","name":"Item","fields":[
 {"name":"id","type":"long"},{"name":"note","type":["null","string"],"default":null}]}"#;
/// v1 and a field with a default: compatible (BACKWARD).
const EVOLVING_V2: &str = r#"{"type":"record","name":"Item","fields":[
 {"name":"id","type":"long"},{"name":"note","type":["null","string"],"default":null},
 {"name":"extra","type":"int","default":0}]}"#;
/// `id` a string, `note` gone, a field without a default: incompatible.
const EVOLVING_V3: &str = r#"{"type":"record","name":"Item","fields":[
 {"name":"id","type":"string"},{"name":"label","type":"string"}]}"#;

#[test]
fn a_changed_schema_compatible_or_not_decodes_each_message_with_its_writers_schema() {
    let (topic, group) = fresh_topic("sr-evolve", 1);
    let r = registry();
    let subject = format!("{topic}-value");
    let config = format!("config/{subject}");
    r.call("PUT", &config, &json!({"compatibility": "BACKWARD"}));
    let v1 = avro(
        &topic,
        &r.url(),
        EVOLVING_V1,
        &[(None, json!({"id": 1, "note": "one"}))],
    );
    let v2_record = json!({"id": 2, "note": null, "extra": 7});
    let v2 = avro(&topic, &r.url(), EVOLVING_V2, &[(None, v2_record.clone())]);
    // The registry refuses v3 under BACKWARD: it is incompatible indeed.
    let refused = common::registry::http_request(
        r.port(),
        "POST",
        &format!("/apis/ccompat/v7/subjects/{subject}/versions"),
        &json!({ "schema": EVOLVING_V3 }).to_string(),
    );
    assert_eq!(refused.as_ref().map(|(s, _)| *s), Some(409), "{refused:?}");
    r.call("PUT", &config, &json!({"compatibility": "NONE"}));
    let v3_record = json!({"id": "three", "label": "third"});
    let v3 = avro(&topic, &r.url(), EVOLVING_V3, &[(None, v3_record.clone())]);
    let ids = [v1[0], v2[0], v3[0]];
    assert!(
        ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
        "{ids:?}"
    );
    let dir = fresh_dir("sr-evolve");
    let ackd = exec_ackd(&topic, &group, &recording_handler(&dir))
        .env("ACKD_VALUE_FORMAT", "avro")
        .env("ACKD_SCHEMA_REGISTRY_URL", r.url())
        .env("ACKD_ON_FAILURE", "skip")
        .spawn();
    ackd.wait_for_line(
        |l| is_processed_at(l, 2) || at_offset(l, "skipped", 2),
        WAIT,
    );
    let lines = ackd.stop(0, WAIT);
    assert_eq!(count_at(&lines, "skipped"), 0, "{lines:#?}");
    let got = requests(&dir);
    let values: Vec<&Value> = got.iter().map(|m| &m["value"]).collect();
    // Each as its own schema says: v1 without `extra`, v2 with it, v3 with its own fields.
    assert_eq!(
        values,
        [&json!({"id": 1, "note": "one"}), &v2_record, &v3_record],
        "{got:#?}"
    );
    let named: Vec<(&Value, &Value)> = got
        .iter()
        .map(|m| (&m["schema_id"], &m["subject"]))
        .collect();
    let want: Vec<(Value, Value)> = ids.iter().map(|id| (json!(id), json!(subject))).collect();
    assert_eq!(named, want.iter().map(|(a, b)| (a, b)).collect::<Vec<_>>());
    assert_committed(&group, &topic, 0, Some(3));
}

#[test]
fn undecodable_messages_take_the_failure_policy_and_the_rest_flows() {
    let topic = unique_name("sr-bad");
    let dlq = unique_name("sr-dlq");
    let group = unique_name("g-sr-bad");
    create_topic(&topic, 1);
    create_topic(&dlq, 1);
    let url = registry().url();
    // A real message first, to copy from. Cut before its last byte, a null union at the
    // end, it is one that apache-avro alone would read as complete (null).
    let tail = r#"{"type":"record","name":"Tail","fields":[{"name":"id","type":"long"},
        {"name":"note","type":["null","string"],"default":null}]}"#;
    avro(
        &topic,
        &url,
        tail,
        &[(None, json!({"id": 1, "note": null}))],
    );
    let real = read_back(&topic, 1, WAIT).remove(0).payload.unwrap();
    let truncated = real[..real.len() - 1].to_vec();
    let unknown_id = [&[0u8, 0x7f, 0xff, 0xff, 0xf0][..], &real[5..]].concat();
    produce(
        &topic,
        &[
            (None, unknown_id),             // offset 1
            (None, truncated),              // offset 2
            (None, b"plain text".to_vec()), // offset 3: wrong magic byte
            (None, vec![0, 0, 1]),          // offset 4: shorter than the header
        ],
    );
    avro(&topic, &url, ORDER_SCHEMA, &[(None, order(5, None))]); // offset 5
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "log")
        .env("ACKD_VALUE_FORMAT", "schema-registry")
        .env("ACKD_SCHEMA_REGISTRY_URL", &url)
        .env("ACKD_ON_FAILURE", "dead-letter")
        .env("ACKD_DEAD_LETTER_TOPIC", &dlq)
        .spawn();
    ackd.wait_for_line(|l| is_processed_at(l, 5), WAIT);
    let lines = ackd.stop(0, WAIT);
    assert_eq!(
        processed(&lines),
        [(0, 0), (0, 5)],
        "only the decodable ones"
    );
    assert_eq!(count_at(&lines, "dead_lettered"), 4, "{lines:#?}");
    assert_eq!(
        count_at(&lines, "retry"),
        0,
        "permanent failures: {lines:#?}"
    );
    assert_committed(&group, &topic, 0, Some(6));
    let dead = read_back(&dlq, 4, WAIT);
    let errors: Vec<&str> = dead
        .iter()
        .map(|d| d.headers["ackd.error"].as_str())
        .collect();
    let expect = [
        "schema id 2147483632",
        "does not match its Avro schema",
        "not the magic byte 0",
        "shorter than its 5-byte header",
    ];
    for (error, want) in errors.iter().zip(expect) {
        assert!(
            error.contains("permanent") && error.contains(want),
            "{want}: {error}"
        );
    }
    assert!(errors[0].contains("404"), "{}", errors[0]);
}

#[test]
fn the_registry_unreachable_mid_run_holds_the_partition_then_it_resumes() {
    let (topic, group) = fresh_topic("sr-outage", 1);
    let proxy = Proxy::listen();
    proxy.forward_to(([127, 0, 0, 1], registry().port()).into());
    let via_proxy = format!("http://127.0.0.1:{}/apis/ccompat/v7", proxy.port());
    avro(
        &topic,
        &registry().url(),
        ORDER_SCHEMA,
        &[(None, order(1, None))],
    );
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "log")
        .env("ACKD_VALUE_FORMAT", "avro")
        .env("ACKD_SCHEMA_REGISTRY_URL", &via_proxy)
        .env("ACKD_RETRY_INITIAL_MS", "100")
        .env("ACKD_RETRY_MAX_MS", "500")
        .env("ACKD_RETRY_MAX_ATTEMPTS", "1000")
        .spawn();
    ackd.wait_for_line(|l| is_processed_at(l, 0), WAIT);
    // A new schema version: its id is not cached yet, and the registry is cut off.
    proxy.cut();
    proxy.reset();
    let v2 = ORDER_SCHEMA.replace(
        r#"{"name":"id","type":"long"},"#,
        r#"{"name":"id","type":"long"},{"name":"extra","type":"int","default":0},"#,
    );
    let mut second = order(2, None);
    second["extra"] = json!(7);
    let ids = avro(&topic, &registry().url(), &v2, &[(None, second)]);
    let retry = ackd.wait_for_line(|l| at_offset(l, "retry", 1), WAIT);
    let error = field(&retry, "error").unwrap_or_default();
    assert!(
        error.starts_with("retryable") && error.contains(&format!("schema id {}", ids[0])),
        "{retry}"
    );
    assert!(error.contains("unreachable"), "{retry}");
    proxy.heal();
    ackd.wait_for_line(|l| is_processed_at(l, 1), WAIT);
    let lines = ackd.stop(0, WAIT);
    assert_eq!(processed(&lines), [(0, 0), (0, 1)], "nothing skipped");
    assert_committed(&group, &topic, 0, Some(2));
}

/// A registry that answers 401 to everything, recording each Authorization header.
fn refusing_registry() -> (u16, Arc<Mutex<Vec<String>>>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let auth = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let (a, c) = (auth.clone(), count.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                if line.to_ascii_lowercase().starts_with("authorization:") {
                    a.lock()
                        .unwrap()
                        .push(line["authorization:".len()..].trim().to_string());
                }
                line.clear();
            }
            c.fetch_add(1, Ordering::SeqCst);
            let mut s = stream;
            let _ = s.write_all(
                b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    (port, auth, count)
}

#[test]
fn a_401_from_the_registry_says_so_and_holds_without_showing_the_secret() {
    let (topic, group) = fresh_topic("sr-401", 1);
    let (port, auth, count) = refusing_registry();
    produce(&topic, &[(None, vec![0, 0, 0, 0, 1, 2])]);
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "log")
        .env("ACKD_VALUE_FORMAT", "avro")
        .env(
            "ACKD_SCHEMA_REGISTRY_URL",
            format!("http://127.0.0.1:{port}"),
        )
        .env("ACKD_SCHEMA_REGISTRY_USER", "APIKEY")
        .env("ACKD_SCHEMA_REGISTRY_PASSWORD", "s3cret-hunter2")
        .env("ACKD_RETRY_INITIAL_MS", "100")
        .env("ACKD_RETRY_MAX_ATTEMPTS", "1000")
        .spawn();
    let retry = ackd.wait_for_line(|l| at_offset(l, "retry", 0), WAIT);
    let lines = ackd.stop(0, WAIT);
    assert!(
        retry.contains("401") && retry.contains("ACKD_SCHEMA_REGISTRY_USER"),
        "{retry}"
    );
    assert!(retry.contains("schema id 1"), "{retry}");
    assert!(processed(&lines).is_empty(), "held: {lines:#?}");
    let committed = committed_offset(&group, &topic, 0);
    assert!(
        committed.unwrap_or(0) == 0,
        "nothing past the message: {committed:?}"
    );
    assert!(count.load(Ordering::SeqCst) >= 1);
    // Basic auth as Confluent Cloud takes it: base64 of APIKEY:s3cret-hunter2.
    assert!(
        auth.lock()
            .unwrap()
            .iter()
            .all(|a| a == "Basic QVBJS0VZOnMzY3JldC1odW50ZXIy"),
        "{:?}",
        auth.lock().unwrap()
    );
    let all = lines.join("\n");
    assert!(
        !all.contains("s3cret-hunter2") && !all.contains("APIKEY"),
        "{all}"
    );
}

/// A registry that answers each request's path with `answer`'s status and JSON body.
fn scripted_registry(answer: fn(&str) -> (u16, String)) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let path = line.split(' ').nth(1).unwrap_or_default().to_string();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let (status, body) = answer(&path);
            let mut s = stream;
            let _ = write!(
                s,
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

#[test]
fn a_subject_the_registry_cannot_tell_is_left_out_and_the_message_goes_through() {
    let (topic, group) = fresh_topic("sr-nosubject", 1);
    let port = scripted_registry(|path| match path {
        "/schemas/ids/9" => (
            200,
            json!({"schemaType": "JSON", "schema": "{}"}).to_string(),
        ),
        _ => (500, r#"{"error_code":50001}"#.into()),
    });
    produce(
        &topic,
        &[(None, [&[0u8, 0, 0, 0, 9][..], br#"{"a":1}"#].concat())],
    );
    let dir = fresh_dir("sr-nosubject");
    let ackd = exec_ackd(&topic, &group, &recording_handler(&dir))
        .env("ACKD_VALUE_FORMAT", "json-schema")
        .env(
            "ACKD_SCHEMA_REGISTRY_URL",
            format!("http://127.0.0.1:{port}"),
        )
        .env("ACKD_ON_FAILURE", "skip")
        .spawn();
    ackd.wait_for_line(
        |l| is_processed_at(l, 0) || at_offset(l, "skipped", 0),
        WAIT,
    );
    let lines = ackd.stop(0, WAIT);
    assert_eq!(processed(&lines), [(0, 0)], "{lines:#?}");
    assert_eq!(count_at(&lines, "retry"), 0, "{lines:#?}");
    let got = requests(&dir);
    assert_eq!(got[0]["value"], json!({"a": 1}));
    assert_eq!(got[0]["schema_id"], 9);
    assert!(got[0].get("subject").is_none(), "{}", got[0]);
}

#[test]
fn the_registry_unreachable_at_start_holds_the_partition_naming_the_id() {
    let (topic, group) = fresh_topic("sr-down", 1);
    let nothing = common::spawn::free_port();
    produce(&topic, &[(None, vec![0, 0, 0, 0, 3, 2])]);
    let ackd = AckdBuilder::new(&topic, &group)
        .env("ACKD_PROCESSOR", "log")
        .env("ACKD_VALUE_FORMAT", "avro")
        .env(
            "ACKD_SCHEMA_REGISTRY_URL",
            format!("http://127.0.0.1:{nothing}, http://127.0.0.1:{nothing}/second"),
        )
        .env("ACKD_RETRY_INITIAL_MS", "100")
        .env("ACKD_RETRY_MAX_ATTEMPTS", "1000")
        .spawn();
    let retry = ackd.wait_for_line(|l| at_offset(l, "retry", 0), WAIT);
    let lines = ackd.stop(0, WAIT);
    let error = field(&retry, "error").unwrap_or_default();
    assert!(error.starts_with("retryable: schema id 3:"), "{retry}");
    assert!(error.contains("unreachable"), "{retry}");
    assert!(processed(&lines).is_empty(), "held: {lines:#?}");
}

#[test]
fn a_bad_format_or_a_missing_url_exits_78_naming_the_setting() {
    for (env, setting) in [
        (vec![("ACKD_VALUE_FORMAT", "avro2")], "ACKD_VALUE_FORMAT"),
        (
            vec![("ACKD_KEY_FORMAT", "avro")],
            "ACKD_SCHEMA_REGISTRY_URL",
        ),
    ] {
        let mut b = AckdBuilder::new("t", "g");
        for (k, v) in env {
            b = b.env(k, v);
        }
        let ackd = b.spawn();
        assert_eq!(ackd.wait_exit(WAIT), 78);
        let lines = ackd.lines();
        assert!(
            lines
                .iter()
                .any(|l| at(l, "config_error") && field(l, "setting").as_deref() == Some(setting)),
            "{lines:#?}"
        );
    }
}
