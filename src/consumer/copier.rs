//! Copies of failed messages: to the dead-letter topic (`ACKD_ON_FAILURE=dead-letter`),
//! with what is needed to find and replay them, and to the retry tiers
//! (`ACKD_RETRY_TOPICS`), with when they are due. One producer makes both.
//!
//! A copy keeps the key, value and headers, and adds headers naming the source topic,
//! partition, offset and timestamp (those of the message as first consumed: a copy of a
//! copy keeps them), the attempts made and the last error; a retry copy also its due
//! time. ackd acknowledges the original only after the broker confirmed the copy
//! (acks=all, idempotent producer): a message never goes nowhere.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

use crate::processors::processor::{Message, ProcessError};

/// Header names added to a copy.
pub const SOURCE_TOPIC: &str = "ackd.source.topic";
pub const SOURCE_PARTITION: &str = "ackd.source.partition";
pub const SOURCE_OFFSET: &str = "ackd.source.offset";
/// The source message's timestamp, milliseconds since the epoch (absent if it had none).
pub const SOURCE_TIMESTAMP: &str = "ackd.source.timestamp";
/// Attempts made, all failed: the copy's next processing is attempt this + 1.
pub const ATTEMPTS: &str = "ackd.attempts";
pub const ERROR: &str = "ackd.error";
/// A retry copy's due time, milliseconds since the epoch: its timestamp plus its tier's
/// delay.
pub const DUE: &str = "ackd.due";

/// The headers ackd writes; a copy of a copy has them written anew, not twice.
const ADDED: [&str; 7] = [
    SOURCE_TOPIC,
    SOURCE_PARTITION,
    SOURCE_OFFSET,
    SOURCE_TIMESTAMP,
    ATTEMPTS,
    ERROR,
    DUE,
];

/// What a copy says of its message besides the message itself.
pub struct Copy<'a> {
    /// The last failure.
    pub error: &'a ProcessError,
    /// Attempts made in all, across tiers.
    pub attempts: u32,
    /// The message is itself a retry copy: its source headers name the source.
    pub from_tier: bool,
    /// A retry copy: its tier's delay (its timestamp is its produce time).
    pub delay: Option<Duration>,
}

/// The producer of copies: dead letters and retry copies.
pub struct Copier {
    producer: FutureProducer,
    /// `ACKD_DEAD_LETTER_TOPIC`, with `ACKD_ON_FAILURE=dead-letter`.
    dead_letter_topic: Option<String>,
    timeout: Duration,
}

impl Copier {
    /// `base` is the client configuration shared with the consumer (brokers, security).
    /// A delivery not acknowledged within `timeout` fails (and the message with it); the
    /// daemon passes the drain budget, so a copy under way at SIGTERM is settled before
    /// the final commit.
    pub fn new(
        mut base: ClientConfig,
        dead_letter_topic: Option<String>,
        timeout: Duration,
    ) -> Result<Copier, KafkaError> {
        base.set("acks", "all")
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", timeout.as_millis().to_string());
        Ok(Copier {
            producer: base.create()?,
            dead_letter_topic,
            timeout,
        })
    }

    pub fn dead_letter_topic(&self) -> Option<&str> {
        self.dead_letter_topic.as_deref()
    }

    /// Produces the copy of `message` to `topic` and waits for the broker's
    /// acknowledgement; returns where it went, and a retry copy's due time.
    pub async fn send(
        &self,
        topic: &str,
        message: &Message<'_>,
        copy: &Copy<'_>,
    ) -> Result<(i32, i64, Option<i64>), KafkaError> {
        let now = epoch_ms();
        let due = copy.delay.map(|d| now.saturating_add(d.as_millis() as i64));
        let added = added_headers(message, copy, due);
        let mut headers = OwnedHeaders::new();
        for h in message.headers().filter(|h| !ADDED.contains(&h.name)) {
            headers = headers.insert(Header {
                key: h.name,
                value: h.value,
            });
        }
        for (key, value) in &added {
            headers = headers.insert(Header {
                key,
                value: Some(value.as_str()),
            });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
        if let Some(k) = message.key() {
            record = record.key(k);
        }
        if let Some(v) = message.payload() {
            record = record.payload(v);
        }
        // A retry copy's timestamp is when it was produced: its tier's delay counts from
        // it. A dead letter keeps its message's.
        let timestamp = if due.is_some() {
            Some(now)
        } else {
            message.timestamp_ms()
        };
        if let Some(ts) = timestamp {
            record = record.timestamp(ts);
        }
        match self.producer.send(record, self.timeout).await {
            Ok(delivery) => Ok((delivery.partition, delivery.offset, due)),
            Err((e, _)) => Err(e),
        }
    }
}

/// The headers ackd adds to a copy of `message`.
fn added_headers(
    message: &Message<'_>,
    copy: &Copy<'_>,
    due: Option<i64>,
) -> Vec<(&'static str, String)> {
    // A copy of a copy names the message as first consumed (as far as its headers say).
    let source = |name: &str| {
        copy.from_tier
            .then(|| header(message, name))
            .flatten()
            .map(str::to_string)
    };
    let mut added = vec![
        (
            SOURCE_TOPIC,
            source(SOURCE_TOPIC).unwrap_or_else(|| message.topic().to_string()),
        ),
        (
            SOURCE_PARTITION,
            source(SOURCE_PARTITION).unwrap_or_else(|| message.partition().to_string()),
        ),
        (
            SOURCE_OFFSET,
            source(SOURCE_OFFSET).unwrap_or_else(|| message.offset().to_string()),
        ),
    ];
    let timestamp = source(SOURCE_TIMESTAMP).or_else(|| {
        (!copy.from_tier)
            .then(|| message.timestamp_ms().map(|t| t.to_string()))
            .flatten()
    });
    if let Some(ts) = timestamp {
        added.push((SOURCE_TIMESTAMP, ts));
    }
    added.push((ATTEMPTS, copy.attempts.to_string()));
    added.push((ERROR, copy.error.to_string()));
    if let Some(due) = due {
        added.push((DUE, due.to_string()));
    }
    added
}

/// The value of `message`'s last header `name`, as text.
fn header<'m>(message: &Message<'m>, name: &str) -> Option<&'m str> {
    message
        .headers()
        .filter(|h| h.name == name)
        .last()
        .and_then(|h| h.value)
        .and_then(|v| std::str::from_utf8(v).ok())
}

/// How a message of a retry tier is handed over: as the attempt after those its copy
/// says were made, a repeat (it was handed to a processor before). A copy without the
/// header (produced by hand) is an attempt after one.
pub fn tier_delivery<'m>(view: Message<'m>) -> Message<'m> {
    let made: u32 = header(&view, ATTEMPTS)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    view.with_delivery(true, made.saturating_add(1).max(2))
}

/// This host's wall clock, in milliseconds since the epoch: the time base of message
/// timestamps and due times.
pub(crate) fn epoch_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn added(copy: &Copy<'_>, due: Option<i64>) -> Vec<(&'static str, String)> {
        let m = Message::new("orders", 3, 41, None, None, Some(1_700_000_000_000));
        added_headers(&m, copy, due)
    }

    #[test]
    fn a_copy_names_its_source_attempts_error_and_due_time() {
        let error = ProcessError::retryable("busy");
        let copy = Copy {
            error: &error,
            attempts: 1,
            from_tier: false,
            delay: Some(Duration::from_secs(10)),
        };
        let h = added(&copy, Some(1_700_000_010_000));
        let get = |name: &str| h.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str());
        assert_eq!(get(SOURCE_TOPIC), Some("orders"));
        assert_eq!(get(SOURCE_PARTITION), Some("3"));
        assert_eq!(get(SOURCE_OFFSET), Some("41"));
        assert_eq!(get(SOURCE_TIMESTAMP), Some("1700000000000"));
        assert_eq!(get(ATTEMPTS), Some("1"));
        assert!(get(ERROR).unwrap().contains("busy"));
        assert_eq!(get(DUE), Some("1700000010000"));
        // A copy of a copy without source headers (produced by hand) names itself, and
        // has no source timestamp: the copy's own is not the original's.
        let copy = Copy {
            from_tier: true,
            delay: None,
            ..copy
        };
        let h = added(&copy, None);
        assert!(h.iter().all(|(k, _)| *k != SOURCE_TIMESTAMP && *k != DUE));
        assert!(h.contains(&(SOURCE_OFFSET, "41".to_string())));
    }

    #[test]
    fn a_tier_copy_without_its_header_is_the_second_attempt_and_a_repeat() {
        let m = tier_delivery(Message::new("orders.retry.10s", 0, 0, None, None, None));
        assert_eq!((m.redelivered(), m.attempt()), (true, 2));
    }
}
