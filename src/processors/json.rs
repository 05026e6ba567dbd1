//! The JSON object a message is handed on as: the `exec` processor's request line and
//! the `http` processor's `json` body (docs/exec.md).
//!
//! `{"topic":"t","partition":0,"offset":41,"timestamp_ms":1700000000000,"key":"k-1","value":"hello","headers":[{"name":"trace","value":"t-1"}],"redelivered":false,"attempt":1}`
//! where a key, value or header value that is not UTF-8 comes as `key_base64`,
//! `value_base64` (standard alphabet, padded) instead, and a null one as JSON null;
//! `redelivered` and `attempt` are [`Message::redelivered`] and [`Message::attempt`].
//! A key or value decoded from the Schema Registry wire format (docs/schemas.md) comes as
//! its JSON under `key`/`value`, with `key_schema_id`/`schema_id` and, when the registry
//! told it, `key_subject`/`subject`, and its raw bytes as
//! `key_raw_base64`/`value_raw_base64` with `ACKD_SCHEMA_RAW_BYTES`.

use base64::Engine as _;
use serde_json::{Map, Value};

use crate::processors::processor::{DecodedPart, Message};

/// The message as one JSON object (no trailing newline).
pub fn encode(m: &Message<'_>) -> Vec<u8> {
    let mut o = Map::new();
    o.insert("topic".into(), m.topic().into());
    o.insert("partition".into(), m.partition().into());
    o.insert("offset".into(), m.offset().into());
    o.insert("timestamp_ms".into(), m.timestamp_ms().into());
    match m.decoded() {
        None => {
            put_bytes(&mut o, "key", m.key());
            put_bytes(&mut o, "value", m.payload());
        }
        Some(d) => {
            put_decoded(&mut o, "key", "key_", d.key.as_ref(), m.key(), d.raw_bytes);
            put_decoded(
                &mut o,
                "value",
                "",
                d.value.as_ref(),
                m.payload(),
                d.raw_bytes,
            );
        }
    }
    o.insert("headers".into(), headers(m));
    o.insert("redelivered".into(), m.redelivered().into());
    o.insert("attempt".into(), m.attempt().into());
    serde_json::to_vec(&Value::Object(o)).unwrap_or_else(|_| b"{}".to_vec())
}

/// A batch as one JSON array of [`encode`]'s objects (no trailing newline).
pub fn encode_batch(messages: &[Message<'_>]) -> Vec<u8> {
    let mut out = vec![b'['];
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&encode(m));
    }
    out.push(b']');
    out
}

/// The message's headers as the JSON array of [`encode`]'s `headers`.
pub fn headers(m: &Message<'_>) -> Value {
    let headers: Vec<Value> = m
        .headers()
        .map(|h| {
            let mut ho = Map::new();
            ho.insert("name".into(), h.name.into());
            put_bytes(&mut ho, "value", h.value);
            Value::Object(ho)
        })
        .collect();
    headers.into()
}

/// `name`: the decoded JSON, `{prefix}schema_id` its schema id and `{prefix}subject` its
/// subject when known (with the raw bytes as `name_raw_base64` when asked), or, not
/// decoded, the bytes as [`put_bytes`] puts them.
fn put_decoded(
    o: &mut Map<String, Value>,
    name: &str,
    prefix: &str,
    part: Option<&DecodedPart>,
    bytes: Option<&[u8]>,
    raw_bytes: bool,
) {
    let Some(part) = part else {
        return put_bytes(o, name, bytes);
    };
    o.insert(name.into(), part.json.clone());
    o.insert(format!("{prefix}schema_id"), part.schema_id.into());
    if let Some(subject) = &part.subject {
        o.insert(format!("{prefix}subject"), (**subject).into());
    }
    if raw_bytes {
        let b64 = base64::engine::general_purpose::STANDARD.encode(bytes.unwrap_or_default());
        o.insert(format!("{name}_raw_base64"), b64.into());
    }
}

/// `name`: the text, or null; bytes that are not UTF-8 go under `name_base64` instead.
pub(crate) fn put_bytes(o: &mut Map<String, Value>, name: &str, bytes: Option<&[u8]>) {
    match bytes.map(std::str::from_utf8) {
        None => {
            o.insert(name.into(), Value::Null);
        }
        Some(Ok(text)) => {
            o.insert(name.into(), text.into());
        }
        Some(Err(_)) => {
            let b64 = base64::engine::general_purpose::STANDARD.encode(bytes.unwrap_or_default());
            o.insert(format!("{name}_base64"), b64.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn headers_keep_order_repeats_and_nulls() {
        // The headers of a real message come from librdkafka; here the encoding itself.
        let mut o = Map::new();
        put_bytes(&mut o, "value", Some(b"t-1"));
        assert_eq!(Value::Object(o), json!({"value":"t-1"}));
        let mut o = Map::new();
        put_bytes(&mut o, "value", Some(&[0xfe]));
        assert_eq!(Value::Object(o), json!({"value_base64":"/g=="}));
        let mut o = Map::new();
        put_bytes(&mut o, "value", None);
        assert_eq!(Value::Object(o), json!({"value":null}));
    }

    #[test]
    fn a_decoded_value_comes_as_its_json_with_its_schema_id() {
        let decoded = crate::processors::processor::Decoded {
            key: None,
            value: Some(DecodedPart {
                schema_id: 7,
                subject: Some("t-value".into()),
                json: json!({"id": 1, "name": "a"}),
            }),
            raw_bytes: true,
        };
        let raw = [0, 0, 0, 0, 7, 2, 2, b'a'];
        let m = Message::new("t", 0, 7, Some(b"k"), Some(&raw), None).with_decoded(&decoded);
        let v: Value = serde_json::from_slice(&encode(&m)).unwrap();
        assert_eq!(v["value"], json!({"id": 1, "name": "a"}));
        assert_eq!(v["schema_id"], 7);
        assert_eq!(v["subject"], "t-value");
        assert_eq!(v["value_raw_base64"], "AAAAAAcCAmE=");
        assert_eq!(v["key"], "k", "a raw key stays as it was");
        assert!(v.get("key_schema_id").is_none());
        assert!(v.get("key_subject").is_none());
    }

    #[test]
    fn a_decoded_key_has_its_own_names_and_an_unknown_subject_is_left_out() {
        let decoded = crate::processors::processor::Decoded {
            key: Some(DecodedPart {
                schema_id: 6,
                subject: None,
                json: json!({"k": 1}),
            }),
            value: None,
            raw_bytes: false,
        };
        let m =
            Message::new("t", 0, 7, Some(b"\0\0\0\0\x06\x02"), None, None).with_decoded(&decoded);
        let v: Value = serde_json::from_slice(&encode(&m)).unwrap();
        assert_eq!(v["key"], json!({"k": 1}));
        assert_eq!(v["key_schema_id"], 6);
        assert!(v.get("key_subject").is_none(), "{v}");
        assert!(v.get("subject").is_none(), "{v}");
        assert!(v.get("key_raw_base64").is_none(), "{v}");
    }

    #[test]
    fn the_object_has_no_newline() {
        let m = Message::new("t", 0, 7, None, Some(b"a\nb"), None);
        let body = encode(&m);
        assert!(!body.contains(&b'\n'));
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["value"], "a\nb");
        assert_eq!(v["offset"], 7);
    }

    #[test]
    fn the_object_says_whether_the_message_may_be_a_repeat_and_its_attempt() {
        let m = Message::new("t", 0, 7, None, None, None);
        let v: Value = serde_json::from_slice(&encode(&m)).unwrap();
        assert_eq!(
            (&v["redelivered"], &v["attempt"]),
            (&json!(false), &json!(1))
        );
        let again = m.with_delivery(true, 3);
        let v: Value = serde_json::from_slice(&encode(&again)).unwrap();
        assert_eq!(
            (&v["redelivered"], &v["attempt"]),
            (&json!(true), &json!(3))
        );
        // In a batch, each message says so for itself.
        let batch = [
            m.with_delivery(true, 2),
            Message::new("t", 0, 8, None, None, None),
        ];
        let v: Value = serde_json::from_slice(&encode_batch(&batch)).unwrap();
        assert_eq!(v[0]["redelivered"], true);
        assert_eq!(v[0]["attempt"], 2);
        assert_eq!(v[1]["redelivered"], false);
        assert_eq!(v[1]["attempt"], 1);
    }
}
