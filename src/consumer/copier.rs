//! Copies of failed messages: to the dead-letter topic (`ACKD_ON_FAILURE=dead-letter`),
//! with what is needed to find and replay them, and to the retry tiers
//! (`ACKD_RETRY_TOPICS`), with when they are due. One producer makes both.
//!
//! A copy keeps the key, value and headers, and adds headers naming the source topic,
//! partition, offset and timestamp (those of the message as first consumed: a copy of a
//! copy keeps them), the attempts made and the last error; a retry copy also its due
//! time. ackd acknowledges the original only after the broker confirmed the copy
//! (acks=all, idempotent producer): a message never goes nowhere.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
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
    /// Replaced once the copy topics' limits are known, and after a fatal error of the
    /// idempotent producer, which fails every later produce of that instance.
    producer: Mutex<Arc<FutureProducer>>,
    /// The producer's configuration, to make it again.
    config: Mutex<ClientConfig>,
    /// `ACKD_DEAD_LETTER_TOPIC`, with `ACKD_ON_FAILURE=dead-letter`.
    dead_letter_topic: Option<String>,
    timeout: Duration,
    /// Each copy topic's `max.message.bytes`, read at start (a topic not in it: not
    /// known, the broker alone judges).
    limits: OnceLock<HashMap<String, usize>>,
}

/// The broker's own default `max.message.bytes`: what a copy topic whose limit could
/// not be read is taken to allow, for the producer's `message.max.bytes`.
const BROKER_DEFAULT_MAX: usize = 1_048_588;
/// librdkafka's largest `message.max.bytes`.
const PRODUCER_MAX: usize = 1_000_000_000;
/// The `ackd.error` header's text is cut to this many bytes (a handler's traceback can
/// be long; the copy must stay within what its topic takes).
pub const ERROR_MAX_BYTES: usize = 4096;

/// Why a copy was not made.
#[derive(Debug)]
pub enum CopyError {
    /// The copy (its record batch) is larger than its topic takes: it never will be.
    TooLarge { bytes: usize, max: usize },
    /// The producer's error.
    Kafka(KafkaError),
}

impl CopyError {
    /// Whether trying again cannot help: the copy is too large for its topic (as sized
    /// here, or as the producer or the broker said).
    pub fn too_large(&self) -> bool {
        match self {
            CopyError::TooLarge { .. } => true,
            CopyError::Kafka(e) => matches!(
                e.rdkafka_error_code(),
                Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidRecord)
            ),
        }
    }
}

impl std::fmt::Display for CopyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CopyError::TooLarge { bytes, max } => write!(
                f,
                "the copy takes {bytes} bytes, more than the topic's max.message.bytes of {max}"
            ),
            CopyError::Kafka(e) => write!(f, "{e}"),
        }
    }
}

impl Copier {
    /// `base` is the client configuration shared with the consumer (brokers, security).
    /// A delivery not acknowledged within `timeout` fails (and the message with it); the
    /// daemon passes the drain budget, so a copy under way at SIGTERM is settled before
    /// the final commit. `limits`: the copy topics' `max.message.bytes`
    /// ([`crate::consumer::topics::max_message_bytes`]).
    pub fn new(
        mut base: ClientConfig,
        dead_letter_topic: Option<String>,
        timeout: Duration,
    ) -> Result<Copier, KafkaError> {
        // librdkafka reads 0 as "never time out": a timeout under 1 ms is 1 ms.
        let timeout = timeout.max(Duration::from_millis(1));
        base.set("acks", "all")
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", timeout.as_millis().to_string())
            .set("message.max.bytes", BROKER_DEFAULT_MAX.to_string())
            .set("queue.buffering.max.kbytes", queue_kbytes(0).to_string());
        Ok(Copier {
            producer: Mutex::new(Arc::new(base.create()?)),
            config: Mutex::new(base),
            dead_letter_topic,
            timeout,
            limits: OnceLock::new(),
        })
    }

    /// Sizes the copies to what their topics take (`limits`, their `max.message.bytes`:
    /// [`crate::consumer::topics::max_message_bytes`]), before the first copy: the
    /// producer's own limit never refuses what a topic takes, and its batches never
    /// exceed what the smallest topic takes (the broker refuses a batch whole).
    pub fn size_to(&self, limits: HashMap<String, usize>) -> Result<(), KafkaError> {
        let largest = limits.values().copied().max().unwrap_or(0);
        let max = largest.clamp(BROKER_DEFAULT_MAX, PRODUCER_MAX);
        let mut config = self.config.lock().unwrap_or_else(|e| e.into_inner());
        config.set("message.max.bytes", max.to_string()).set(
            "queue.buffering.max.kbytes",
            queue_kbytes(largest).to_string(),
        );
        if let Some(smallest) = limits.values().copied().min() {
            let batch = smallest.saturating_sub(BATCH_OVERHEAD).clamp(1, max);
            config.set("batch.size", batch.to_string());
        }
        let fresh = config.create::<FutureProducer>()?;
        *self.producer.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(fresh);
        let _ = self.limits.set(limits);
        Ok(())
    }

    /// The topics copies go to: the dead-letter topic and `tiers`.
    pub fn topics(&self, tiers: &[String]) -> Vec<String> {
        self.dead_letter_topic
            .iter()
            .chain(tiers)
            .cloned()
            .collect()
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
    ) -> Result<(i32, i64, Option<i64>), CopyError> {
        let now = epoch_ms();
        let due = copy.delay.map(|d| now.saturating_add(d.as_millis() as i64));
        let added = added_headers(message, copy, due);
        let kept: Vec<(&str, Option<&[u8]>)> = message
            .headers()
            .filter(|h| !ADDED.contains(&h.name))
            .map(|h| (h.name, h.value))
            .chain(added.iter().map(|(k, v)| (*k, Some(v.as_bytes()))))
            .collect();
        if let Some(&max) = self.limits.get().and_then(|l| l.get(topic)) {
            let bytes = batch_size(message.key(), message.payload(), &kept);
            if bytes > max {
                return Err(CopyError::TooLarge { bytes, max });
            }
        }
        let mut headers = OwnedHeaders::new_with_capacity(kept.len());
        for (key, value) in &kept {
            headers = headers.insert(Header { key, value: *value });
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
        let producer = self.producer();
        match producer.send(record, self.timeout).await {
            Ok(delivery) => Ok((delivery.partition, delivery.offset, due)),
            Err((e, _)) => {
                self.renew_if_fatal(&producer);
                Err(CopyError::Kafka(e))
            }
        }
    }

    fn producer(&self) -> Arc<FutureProducer> {
        self.producer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// After a fatal error of the idempotent producer (e.g. authorization refused) every
    /// later produce of it fails: a new one takes its place (once, for the copies that
    /// failed together), and the copy is tried again like any failed one.
    fn renew_if_fatal(&self, failed: &Arc<FutureProducer>) {
        let Some((code, reason)) = failed.client().fatal_error() else {
            return;
        };
        let mut current = self.producer.lock().unwrap_or_else(|e| e.into_inner());
        if !Arc::ptr_eq(&current, failed) {
            return;
        }
        let made = self
            .config
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .create::<FutureProducer>();
        match made {
            Ok(fresh) => {
                *current = Arc::new(fresh);
                tracing::warn!(at = "copier_recreated", error = ?code, reason = %reason,
                    "the producer of copies had a fatal error: a new one makes the next copies");
            }
            Err(e) => {
                tracing::error!(at = "copier_recreated", error = %e, "the producer of copies had a fatal error and a new one could not be made: copies keep failing");
            }
        }
    }

    /// Test only: what a fatal error of the producer does (librdkafka's own test hook).
    #[cfg(test)]
    fn fail_fatally(&self) {
        let producer = self.producer();
        // SAFETY: a live client; librdkafka copies the reason.
        unsafe {
            rdkafka::bindings::rd_kafka_test_fatal_error(
                producer.client().native_ptr(),
                rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED,
                c"test: fatal".as_ptr(),
            );
        }
    }
}

/// The producer's queue, in KiB: the memory budget's share for it
/// ([`crate::consumer::memory::COPIER_QUEUE`]), or one copy of the `largest` a topic
/// takes if more (a copy larger than the queue would never be taken).
fn queue_kbytes(largest: usize) -> u64 {
    let one = largest as u64 + (64 << 10);
    crate::consumer::memory::COPIER_QUEUE
        .max(one)
        .div_ceil(1024)
}

/// A record batch's fixed part (its header), in bytes.
const BATCH_OVERHEAD: usize = 61;

/// The bytes of a record batch holding one record with `key`, `value` and `headers`
/// (uncompressed; magic 2): what the broker compares with `max.message.bytes`.
fn batch_size(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(&str, Option<&[u8]>)],
) -> usize {
    let field =
        |b: Option<&[u8]>| b.map_or(varint_len(-1), |b| varint_len(b.len() as i64) + b.len());
    // attributes, timestamp delta 0, offset delta 0
    let mut record = 1 + 1 + 1 + field(key) + field(value) + varint_len(headers.len() as i64);
    for (name, v) in headers {
        record += field(Some(name.as_bytes())) + field(*v);
    }
    BATCH_OVERHEAD + varint_len(record as i64) + record
}

/// The length of `n` as a zigzag varint.
fn varint_len(n: i64) -> usize {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    let mut len = 1;
    while z >= 0x80 {
        z >>= 7;
        len += 1;
    }
    len
}

/// `text` cut to at most [`ERROR_MAX_BYTES`] bytes, at a character boundary, saying
/// how much was cut.
fn cut_error(text: String) -> String {
    if text.len() <= ERROR_MAX_BYTES {
        return text;
    }
    let cut = text.len();
    let mut end = ERROR_MAX_BYTES - 40;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} ... ({} bytes cut)", &text[..end], cut - end)
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
    added.push((ERROR, cut_error(copy.error.to_string())));
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
    fn a_long_error_is_cut_to_its_stated_size() {
        let long = "é".repeat(100_000);
        let cut = cut_error(long.clone());
        assert!(cut.len() <= ERROR_MAX_BYTES, "{}", cut.len());
        assert!(cut.ends_with("bytes cut)"), "{cut}");
        assert_eq!(cut_error("short".into()), "short");
        let error = ProcessError::retryable(long);
        let copy = Copy {
            error: &error,
            attempts: 1,
            from_tier: false,
            delay: None,
        };
        let h = added(&copy, None);
        let text = &h.iter().find(|(k, _)| *k == ERROR).unwrap().1;
        assert!(text.len() <= ERROR_MAX_BYTES);
    }

    #[test]
    fn a_batch_of_one_record_is_sized_as_the_broker_counts_it() {
        assert_eq!(varint_len(-1), 1);
        assert_eq!(varint_len(63), 1);
        assert_eq!(varint_len(64), 2);
        // No key, 10 bytes of value, no headers: 1 + 1 + 1 + 1 + (1 + 10) + 1 = 16
        // bytes of record, 1 of its length, 61 of the batch.
        assert_eq!(batch_size(None, Some(&[0; 10]), &[]), 78);
        let h: &[(&str, Option<&[u8]>)] = &[("a", Some(b"bc"))];
        assert_eq!(batch_size(None, Some(&[0; 10]), h), 78 + 1 + 1 + 1 + 2);
    }

    /// A fatal error of the idempotent producer (librdkafka's test hook; a real broker
    /// stages it only with ACLs) fails the copy under way; the next one is made by a new
    /// producer.
    #[tokio::test]
    async fn a_fatal_error_of_the_producer_is_followed_by_a_new_one() {
        let mock = rdkafka::mocking::MockCluster::new(1).unwrap();
        mock.create_topic("copies", 1, 1).unwrap();
        let mut base = ClientConfig::new();
        base.set("bootstrap.servers", mock.bootstrap_servers());
        let copier = Copier::new(base, None, Duration::from_secs(10)).unwrap();
        let error = ProcessError::retryable("busy");
        let copy = Copy {
            error: &error,
            attempts: 1,
            from_tier: false,
            delay: None,
        };
        let m = Message::new("orders", 0, 1, None, Some(b"v"), None);
        copier
            .send("copies", &m, &copy)
            .await
            .expect("the first copy");
        let before = copier.producer();
        copier.fail_fatally();
        assert!(copier.send("copies", &m, &copy).await.is_err());
        assert!(!Arc::ptr_eq(&before, &copier.producer()), "a new producer");
        copier
            .send("copies", &m, &copy)
            .await
            .expect("made by the new producer");
    }

    #[test]
    fn a_timeout_under_a_millisecond_never_means_none() {
        // ACKD_SHUTDOWN_TIMEOUT_MS=1 leaves a drain budget of 0.8 ms; librdkafka reads
        // message.timeout.ms=0 as "never time out".
        let copier = Copier::new(ClientConfig::new(), None, Duration::from_micros(800)).unwrap();
        let config = copier.config.lock().unwrap();
        assert_eq!(config.get("message.timeout.ms"), Some("1"));
        // Its queue is bounded, by the memory budget's share for it.
        assert_eq!(config.get("queue.buffering.max.kbytes"), Some("2048"));
    }

    #[test]
    fn a_tier_copy_without_its_header_is_the_second_attempt_and_a_repeat() {
        let m = tier_delivery(Message::new("orders.retry.10s", 0, 0, None, None, None));
        assert_eq!((m.redelivered(), m.attempt()), (true, 2));
    }
}
