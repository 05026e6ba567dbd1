//! The dead-letter topic: where `ACKD_ON_FAILURE=dead-letter` puts messages the
//! processor gave up on, with what is needed to find and replay them.
//!
//! The copy keeps the key, value and headers, and adds headers naming the source topic,
//! partition, offset and the error. ackd acknowledges the original only after the broker
//! confirmed the copy (acks=all, idempotent producer): a message never goes nowhere.

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

use crate::processors::processor::{Message, ProcessError};

/// Header names added to a dead-lettered copy.
pub const SOURCE_TOPIC: &str = "ackd.source.topic";
pub const SOURCE_PARTITION: &str = "ackd.source.partition";
pub const SOURCE_OFFSET: &str = "ackd.source.offset";
pub const ERROR: &str = "ackd.error";

/// A producer for the dead-letter topic.
pub struct DeadLetter {
    producer: FutureProducer,
    topic: String,
    timeout: Duration,
}

impl DeadLetter {
    /// `base` is the client configuration shared with the consumer (brokers, security).
    /// A delivery not acknowledged within `timeout` fails (and the message with it); the
    /// daemon passes the drain budget, so a dead letter under way at SIGTERM is settled
    /// before the final commit.
    pub fn new(
        mut base: ClientConfig,
        topic: String,
        timeout: Duration,
    ) -> Result<DeadLetter, KafkaError> {
        base.set("acks", "all")
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", timeout.as_millis().to_string());
        Ok(DeadLetter {
            producer: base.create()?,
            topic,
            timeout,
        })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Produces the copy and waits for the broker's acknowledgement; returns where it went.
    pub async fn send(
        &self,
        message: &Message<'_>,
        error: &ProcessError,
    ) -> Result<(i32, i64), KafkaError> {
        let partition = message.partition().to_string();
        let offset = message.offset().to_string();
        let reason = error.to_string();
        let mut headers = OwnedHeaders::new();
        for h in message.headers() {
            headers = headers.insert(Header {
                key: h.name,
                value: h.value,
            });
        }
        let added = [
            (SOURCE_TOPIC, message.topic()),
            (SOURCE_PARTITION, partition.as_str()),
            (SOURCE_OFFSET, offset.as_str()),
            (ERROR, reason.as_str()),
        ];
        for (key, value) in added {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&self.topic).headers(headers);
        if let Some(k) = message.key() {
            record = record.key(k);
        }
        if let Some(v) = message.payload() {
            record = record.payload(v);
        }
        if let Some(ts) = message.timestamp_ms() {
            record = record.timestamp(ts);
        }
        match self.producer.send(record, self.timeout).await {
            Ok(delivery) => Ok((delivery.partition, delivery.offset)),
            Err((e, _)) => Err(e),
        }
    }
}
