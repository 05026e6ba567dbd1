//! The wire protocol: a request line for a message or a batch, and what a reply
//! line to it means.

use serde_json::{Map, Value};

use crate::processors::processor::{BatchError, FailureKind, Message, ProcessError};

/// What a request carried, which its reply must name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub topic: String,
    pub partition: i32,
    pub offsets: Offsets,
}

/// The offsets a request carries, which its reply names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Offsets {
    /// One message: a JSON object.
    One(i64),
    /// A batch (`ACKD_BATCH_MAX_MESSAGES` above 1): a JSON array, these offsets in order.
    Batch(Vec<i64>),
}

impl Offsets {
    pub(super) fn first(&self) -> i64 {
        match self {
            Offsets::One(o) => *o,
            Offsets::Batch(v) => v.first().copied().unwrap_or(-1),
        }
    }

    pub(super) fn last(&self) -> i64 {
        match self {
            Offsets::One(o) => *o,
            Offsets::Batch(v) => v.last().copied().unwrap_or(-1),
        }
    }
}

/// What names one request among those a child holds: its topic, partition and first
/// offset (the message's, or the batch's first).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct RequestName {
    pub(super) topic: String,
    pub(super) partition: i32,
    pub(super) first: i64,
}

impl RequestName {
    pub(super) fn of(sent: &Sent) -> RequestName {
        RequestName {
            topic: sent.topic.clone(),
            partition: sent.partition,
            first: sent.offsets.first(),
        }
    }
}

impl std::fmt::Display for RequestName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "topic {:?} partition {} offset {}",
            self.topic, self.partition, self.first
        )
    }
}

/// The request a reply line names, when a child holds several (`ACKD_EXEC_IN_FLIGHT`
/// above 1): its `"topic"`, `"partition"` and `"offset"` (a batch's `"first"`), all
/// required. [`parse_reply`] then checks the rest against that request.
pub(super) fn named_request(line: &str) -> Result<RequestName, String> {
    let reply = reply_object(line)?;
    let missing = |what: &str| {
        format!(
            "reply names no {what}: with ACKD_EXEC_IN_FLIGHT above 1 every reply names \"topic\", \"partition\" and \"offset\" (a batch's \"first\" and \"last\"): {}",
            shorten(line)
        )
    };
    let topic = reply.get("topic").and_then(Value::as_str);
    let partition = reply
        .get("partition")
        .and_then(Value::as_i64)
        .and_then(|p| i32::try_from(p).ok());
    let first = reply
        .get("first")
        .or_else(|| reply.get("offset"))
        .and_then(Value::as_i64);
    Ok(RequestName {
        topic: topic.ok_or_else(|| missing("\"topic\""))?.to_string(),
        partition: partition.ok_or_else(|| missing("\"partition\""))?,
        first: first.ok_or_else(|| missing("\"offset\""))?,
    })
}

/// The request line for one message, `\n` included (the object of [`crate::processors::json`]).
pub fn request_line(m: &Message<'_>) -> Vec<u8> {
    let mut line = crate::processors::json::encode(m);
    line.push(b'\n');
    line
}

/// The request line for a batch: a JSON array of [`request_line`]'s objects, `\n`
/// included.
pub fn batch_line(messages: &[Message<'_>]) -> Vec<u8> {
    let mut line = crate::processors::json::encode_batch(messages);
    line.push(b'\n');
    line
}

/// What a reply line means. `Err`: not a reply to `sent` (a protocol error).
///
/// Every reply names the request it answers, so that no line a handler writes (an
/// extra one, a late one, a debug print, one answer per message of a batch) can answer
/// a request it was not written for:
/// - a message (a JSON object) by its `"offset"`;
/// - a batch (a JSON array) by `"first"` and `"last"`, its first and last offsets. `ack`
///   acknowledges all of it; `retry` and `fail` are for the message at `"offset"`,
///   which must be one of the batch (the ones before it are acknowledged), or for its
///   first message without one.
///
/// `"topic"` and `"partition"`, when given, must be the request's too.
pub fn parse_reply(line: &str, sent: &Sent) -> Result<Result<(), BatchError>, String> {
    let reply = reply_object(line)?;
    let outcome = outcome(&reply, line)?;
    check_topic_and_partition(&reply, sent, line)?;
    let failed_at = match &sent.offsets {
        Offsets::One(offset) => message_named(&reply, *offset, line)?,
        Offsets::Batch(batch) => batch_named(&reply, sent, batch, outcome.is_some(), line)?,
    };
    Ok(verdict(outcome, failed_at))
}

/// A reply's fields, if the line is a JSON object.
fn reply_object(line: &str) -> Result<Map<String, Value>, String> {
    let value: Value = serde_json::from_str(line.trim())
        .map_err(|e| format!("reply is not JSON ({e}): {}", shorten(line)))?;
    let Value::Object(o) = value else {
        return Err(format!("reply is not a JSON object: {}", shorten(line)));
    };
    Ok(o)
}

/// A failure and its reason, or `None` for an ack: exactly one of the three.
fn outcome<'a>(
    o: &'a Map<String, Value>,
    line: &str,
) -> Result<Option<(FailureKind, &'a Value)>, String> {
    match (o.get("ack"), o.get("retry"), o.get("fail")) {
        (Some(Value::Bool(true)), None, None) => Ok(None),
        (None, Some(reason), None) => Ok(Some((FailureKind::Retryable, reason))),
        (None, None, Some(reason)) => Ok(Some((FailureKind::Permanent, reason))),
        _ => Err(format!(
            "reply needs exactly one of \"ack\":true, \"retry\":reason, \"fail\":reason: {}",
            shorten(line)
        )),
    }
}

/// `"topic"` and `"partition"`, when given, are the request's.
fn check_topic_and_partition(
    o: &Map<String, Value>,
    sent: &Sent,
    line: &str,
) -> Result<(), String> {
    if let Some(topic) = o.get("topic") {
        if topic.as_str() != Some(sent.topic.as_str()) {
            return Err(format!(
                "reply is for topic {topic}, the request sent was from {:?}: {}",
                sent.topic,
                shorten(line)
            ));
        }
    }
    if let Some(partition) = o.get("partition") {
        if partition.as_i64() != Some(i64::from(sent.partition)) {
            return Err(format!(
                "reply is for partition {partition}, the request sent was from partition {}: {}",
                sent.partition,
                shorten(line)
            ));
        }
    }
    Ok(())
}

/// A field of the reply and its value as an offset, if it is one.
fn named<'a>(o: &'a Map<String, Value>, key: &str) -> Option<(&'a Value, Option<i64>)> {
    o.get(key).map(|v| (v, v.as_i64()))
}

/// The reply to one message names its `"offset"` (and no batch): that offset.
fn message_named(o: &Map<String, Value>, offset: i64, line: &str) -> Result<i64, String> {
    if o.contains_key("first") || o.contains_key("last") {
        return Err(format!(
            "reply names a batch (\"first\", \"last\"), the request sent was one message, offset {offset}: {}",
            shorten(line)
        ));
    }
    match named(o, "offset") {
        Some((_, Some(n))) if n == offset => Ok(offset),
        Some((v, _)) => Err(format!(
            "reply is for offset {v}, the message sent was offset {offset}: {}",
            shorten(line)
        )),
        None => Err(format!(
            "reply names no \"offset\" (it must name the message it answers, {{\"ack\":true,\"offset\":{offset}}}): {}",
            shorten(line)
        )),
    }
}

/// The reply to a batch names its `"first"` and `"last"`; a failure may name the
/// `"offset"` of one of its messages. The offset a failure is for.
fn batch_named(
    o: &Map<String, Value>,
    sent: &Sent,
    batch: &[i64],
    failed: bool,
    line: &str,
) -> Result<i64, String> {
    let (first, last) = (sent.offsets.first(), sent.offsets.last());
    match (named(o, "first"), named(o, "last")) {
        (Some((_, Some(f))), Some((_, Some(l)))) if f == first && l == last => {}
        (None, None) => {
            return Err(format!(
                "reply to a batch names no \"first\" and \"last\" (it must name the batch it answers, {{\"ack\":true,\"first\":{first},\"last\":{last}}}): {}",
                shorten(line)
            ))
        }
        _ => {
            return Err(format!(
                "reply is not for the batch sent ({first} to {last}): {}",
                shorten(line)
            ))
        }
    }
    match (named(o, "offset"), failed) {
        (None, _) => Ok(first),
        (Some((_, Some(n))), true) if batch.binary_search(&n).is_ok() => Ok(n),
        (Some(_), false) => Err(format!(
            "an ack of a batch is for all of it and names no \"offset\": {}",
            shorten(line)
        )),
        (Some((v, _)), true) => Err(format!(
            "reply names offset {v}, which is not in the batch sent ({first} to {last}): {}",
            shorten(line)
        )),
    }
}

/// What the worker is told: an ack, or the failure at `failed_at` with the handler's
/// reason.
fn verdict(outcome: Option<(FailureKind, &Value)>, failed_at: i64) -> Result<(), BatchError> {
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    match outcome {
        None => Ok(()),
        Some((FailureKind::Retryable, reason)) => Err(BatchError::new(
            failed_at,
            ProcessError::retryable(format!("handler: {}", text(reason))),
        )),
        Some((_, reason)) => Err(BatchError::new(
            failed_at,
            ProcessError::permanent(format!("handler: {}", text(reason))),
        )),
    }
}

pub(super) fn shorten(line: &str) -> String {
    let line = line.trim_end();
    match line.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn json(line: &[u8]) -> Value {
        assert_eq!(line.last(), Some(&b'\n'));
        serde_json::from_slice(line).unwrap()
    }

    #[test]
    fn requests_carry_text_as_text_and_other_bytes_as_base64() {
        let m = Message::new(
            "t",
            2,
            41,
            Some(b"k-1"),
            Some(b"hello"),
            Some(1_700_000_000_000),
        );
        assert_eq!(
            json(&request_line(&m)),
            json!({"topic":"t","partition":2,"offset":41,
                "timestamp_ms":1_700_000_000_000_i64,"key":"k-1","value":"hello","headers":[],
                "redelivered":false,"attempt":1})
        );
        let m = Message::new("t", 0, 0, None, Some(&[0xff, 0x00, 0x80]), None);
        let v = json(&request_line(&m));
        assert_eq!(v["key"], Value::Null);
        assert_eq!(v["timestamp_ms"], Value::Null);
        assert_eq!(v["value_base64"], "/wCA");
        assert!(v.get("value").is_none(), "{v}");
        let m = Message::new("t", 0, 0, Some(&[0xc3]), None, None);
        let v = json(&request_line(&m));
        assert_eq!(v["key_base64"], "ww==");
        assert_eq!(v["value"], Value::Null);
        // A newline in a value is escaped: one message is always one line.
        let line = request_line(&Message::new("t", 0, 0, None, Some(b"a\nb"), None));
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
    }

    fn one(offset: i64) -> Sent {
        Sent {
            topic: "t".into(),
            partition: 2,
            offsets: Offsets::One(offset),
        }
    }

    fn batch(offsets: &[i64]) -> Sent {
        Sent {
            topic: "t".into(),
            partition: 2,
            offsets: Offsets::Batch(offsets.to_vec()),
        }
    }

    #[test]
    fn replies_ack_retry_or_fail_the_message_they_name() {
        for ok in [
            "{\"ack\":true,\"offset\":5}\n",
            " {\"ack\": true, \"offset\": 5} ",
            "{\"ack\":true,\"topic\":\"t\",\"partition\":2,\"offset\":5}",
            "{\"offset\":5,\"ack\":true,\"note\":\"other keys are ignored\"}",
        ] {
            assert_eq!(parse_reply(ok, &one(5)), Ok(Ok(())), "{ok}");
        }
        let r = parse_reply("{\"retry\":\"db down\",\"offset\":5}", &one(5))
            .unwrap()
            .unwrap_err();
        assert_eq!((r.offset, r.error.kind), (5, FailureKind::Retryable));
        assert!(r.error.reason.contains("db down"));
        let r = parse_reply("{\"fail\":\"bad input\",\"offset\":5}", &one(5))
            .unwrap()
            .unwrap_err();
        assert_eq!((r.offset, r.error.kind), (5, FailureKind::Permanent));
        assert!(r.error.reason.contains("bad input"));
    }

    #[test]
    fn a_line_that_does_not_name_the_message_sent_is_a_protocol_error() {
        for bad in [
            "ok",
            "",
            "[1]",
            "{}",
            // Not naming the message: a debug print, an extra or a per-message line.
            "{\"ack\":true}",
            "{\"retry\":\"x\"}",
            "{\"fail\":\"x\"}",
            // Naming another one: a late or out-of-order answer.
            "{\"ack\":true,\"offset\":4}",
            "{\"ack\":true,\"offset\":\"5\"}",
            "{\"ack\":true,\"offset\":5,\"partition\":3}",
            "{\"ack\":true,\"offset\":5,\"topic\":\"u\"}",
            "{\"ack\":true,\"first\":5,\"last\":5}",
            "{\"ack\":false,\"offset\":5}",
            "{\"ack\":true,\"fail\":\"x\",\"offset\":5}",
        ] {
            assert!(parse_reply(bad, &one(5)).is_err(), "{bad:?} accepted");
        }
        let e = parse_reply("{\"ack\":true}", &one(5)).unwrap_err();
        assert!(e.contains("names no \"offset\""), "{e}");
    }

    #[test]
    fn with_several_in_flight_a_reply_names_topic_partition_and_offset() {
        let name = |t: &str, p: i32, o: i64| RequestName {
            topic: t.into(),
            partition: p,
            first: o,
        };
        assert_eq!(
            named_request("{\"ack\":true,\"topic\":\"t\",\"partition\":2,\"offset\":5}"),
            Ok(name("t", 2, 5))
        );
        assert_eq!(
            named_request(
                "{\"fail\":\"x\",\"topic\":\"t\",\"partition\":0,\"first\":10,\"last\":13,\"offset\":11}"
            ),
            Ok(name("t", 0, 10))
        );
        for bad in [
            "{\"ack\":true,\"offset\":5}",
            "{\"ack\":true,\"topic\":\"t\",\"offset\":5}",
            "{\"ack\":true,\"topic\":\"t\",\"partition\":\"2\",\"offset\":5}",
            "{\"ack\":true,\"topic\":\"t\",\"partition\":2}",
            "junk",
        ] {
            let e = named_request(bad).unwrap_err();
            assert!(
                e.contains("names no") || e.contains("not JSON"),
                "{bad}: {e}"
            );
        }
        let e = named_request("{\"ack\":true,\"offset\":5}").unwrap_err();
        assert!(e.contains("ACKD_EXEC_IN_FLIGHT"), "{e}");
    }

    #[test]
    fn a_batch_is_one_array_line() {
        let a = Message::new("t", 1, 7, Some(b"k"), Some(b"x\ny"), None);
        let b = Message::new("t", 1, 9, None, Some(&[0xff]), None);
        let line = batch_line(&[a, b]);
        assert_eq!(line.iter().filter(|c| **c == b'\n').count(), 1);
        let v = json(&line);
        assert_eq!(v.as_array().map(Vec::len), Some(2), "{v}");
        assert_eq!(v[0], json(&request_line(&a)));
        assert_eq!(v[1]["offset"], 9);
        assert_eq!(v[1]["value_base64"], "/w==");
    }

    #[test]
    fn a_batch_reply_names_the_batch_and_acks_all_or_the_ones_before_a_failure() {
        let sent = batch(&[10, 11, 13]);
        for ok in [
            "{\"ack\":true,\"first\":10,\"last\":13}",
            "{\"ack\":true,\"topic\":\"t\",\"partition\":2,\"first\":10,\"last\":13}",
        ] {
            assert_eq!(parse_reply(ok, &sent), Ok(Ok(())), "{ok}");
        }
        let e = parse_reply(
            "{\"retry\":\"later\",\"first\":10,\"last\":13,\"offset\":11}",
            &sent,
        )
        .unwrap()
        .unwrap_err();
        assert_eq!((e.offset, e.error.kind), (11, FailureKind::Retryable));
        let e = parse_reply(
            "{\"fail\":\"bad\",\"first\":10,\"last\":13,\"offset\":13}",
            &sent,
        )
        .unwrap()
        .unwrap_err();
        assert_eq!((e.offset, e.error.kind), (13, FailureKind::Permanent));
        // Without an offset, the failure is the batch's first message's.
        let e = parse_reply("{\"fail\":\"bad\",\"first\":10,\"last\":13}", &sent)
            .unwrap()
            .unwrap_err();
        assert_eq!(e.offset, 10);
        for bad in [
            // docs/exec.md's replies before replies named the batch, and per-message ones.
            "{\"ack\":true}",
            "{\"ack\":true,\"offset\":13}",
            "{\"ack\":true,\"offset\":10}",
            "{\"fail\":\"x\",\"offset\":10}",
            // Another batch, or half a name.
            "{\"ack\":true,\"first\":11,\"last\":13}",
            "{\"ack\":true,\"first\":10,\"last\":11}",
            "{\"ack\":true,\"first\":10}",
            "{\"ack\":true,\"first\":10,\"last\":13,\"partition\":1}",
            // An ack is for all of it; a failure's offset is one of the batch.
            "{\"ack\":true,\"first\":10,\"last\":13,\"offset\":13}",
            "{\"fail\":\"x\",\"first\":10,\"last\":13,\"offset\":12}",
            "{\"fail\":\"x\",\"first\":10,\"last\":13,\"offset\":14}",
            "[{\"ack\":true}]",
        ] {
            assert!(parse_reply(bad, &sent).is_err(), "{bad:?} accepted");
        }
    }
}
