//! The processor: the user's logic, behind one trait.
//!
//! ackd hands a processor one message at a time per partition, in offset order, and
//! commits the message's offset only after `process` returned `Ok`. The message borrows
//! librdkafka's buffer (no copy on the hot path); call [`Message::to_owned`] to keep it.
//!
//! That buffer is a `FetchedMessage`: a message as librdkafka fetched it, read straight
//! from librdkafka's memory and released when dropped. The partition workers take these
//! from their queue several at a time (`consumer::partition_queue`); the processors see
//! them through `Message`.

use std::borrow::Cow;
use std::ffi::CStr;
use std::future::Future;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::OnceLock;

use rdkafka::bindings as rdsys;
use rdkafka::error::{IsError, KafkaError};
use rdkafka::Timestamp;

/// A key or value decoded from the Schema Registry wire format (docs/schemas.md).
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedPart {
    /// The schema id of the wire format's header.
    pub schema_id: u32,
    /// The subject of the schema in the registry (docs/schemas.md says which when it has
    /// several); `None` when the registry could not tell.
    pub subject: Option<std::sync::Arc<str>>,
    /// The payload as JSON (docs/schemas.md states the mapping).
    pub json: serde_json::Value,
}

/// What decoding made of a message: its key and value, each `None` when it was not
/// decoded (its format is raw, or it is null).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decoded {
    pub key: Option<DecodedPart>,
    pub value: Option<DecodedPart>,
    /// `ACKD_SCHEMA_RAW_BYTES`: the processors' JSON carries the raw bytes too.
    pub raw_bytes: bool,
}

/// One Kafka message, borrowed for the duration of [`Processor::process`].
#[derive(Clone, Copy)]
pub struct Message<'a> {
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) key: Option<&'a [u8]>,
    pub(crate) payload: Option<&'a [u8]>,
    /// Read from `kafka` when there is one: most processors never ask, and librdkafka's
    /// accessor costs as much as the rest of the view.
    pub(crate) timestamp_ms: Option<i64>,
    pub(crate) kafka: Option<&'a Kafka<'a>>,
    /// See [`Message::redelivered`].
    pub(crate) redelivered: bool,
    /// See [`Message::attempt`].
    pub(crate) attempt: u32,
    /// See [`Message::decoded`], for a message without `kafka` (one from `kafka` keeps
    /// it there).
    pub(crate) decoded: Option<&'a Decoded>,
}

/// What a partition's queue hands out: a message, or a fetch error. The error is boxed
/// (errors are rare): a message is then 16 bytes, moved in registers, where the 80 of
/// a `KafkaResult` went through memory at each step from the queue to the processor.
pub(crate) type Fetched<'q> = Result<FetchedMessage<'q>, Box<KafkaError>>;

/// One fetched message, owned: librdkafka's `rd_kafka_message_t`, destroyed on drop. It
/// borrows (`'q`) the queue it came from, which keeps the consumer alive: librdkafka's
/// messages must not outlive their client.
pub(crate) struct FetchedMessage<'q> {
    message: NonNull<rdsys::rd_kafka_message_t>,
    queue: PhantomData<&'q ()>,
}

// SAFETY: a fetched message is never written after librdkafka hands it over, and
// librdkafka's message destructor may run on any thread (rust-rdkafka's own
// `BorrowedMessage` is Send and Sync on the same grounds).
unsafe impl Send for FetchedMessage<'_> {}
unsafe impl Sync for FetchedMessage<'_> {}

impl<'q> FetchedMessage<'q> {
    /// Takes ownership of a message from `rd_kafka_consume_batch_queue`: a message, or a
    /// fetch error (released here) as rust-rdkafka reports it, so that both read paths
    /// give the same errors.
    ///
    /// # Safety
    /// `message` is a live message that nothing else owns, of a consumer that outlives
    /// `'q`.
    #[inline]
    pub(crate) unsafe fn take(message: NonNull<rdsys::rd_kafka_message_t>) -> Fetched<'q> {
        let fetched = FetchedMessage {
            message,
            queue: PhantomData,
        };
        // SAFETY: live (above).
        let raw = unsafe { message.as_ref() };
        if !raw.err.is_error() {
            return Ok(fetched);
        }
        Err(Box::new(match raw.err {
            rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF => {
                KafkaError::PartitionEOF(raw.partition)
            }
            e => KafkaError::MessageConsumption(e.into()),
        }))
    }

    fn raw(&self) -> &rdsys::rd_kafka_message_t {
        // SAFETY: owned and live until drop.
        unsafe { self.message.as_ref() }
    }

    /// The message for librdkafka's C API (its headers); valid while `self` is.
    pub(crate) fn ptr(&self) -> *mut rdsys::rd_kafka_message_t {
        self.message.as_ptr()
    }

    /// Key and value bytes: what the message weighs against `ACKD_BATCH_MAX_BYTES`.
    pub fn size(&self) -> usize {
        key_and_value_bytes(self.raw())
    }

    pub fn partition(&self) -> i32 {
        self.raw().partition
    }

    pub fn offset(&self) -> i64 {
        self.raw().offset
    }

    pub fn key(&self) -> Option<&[u8]> {
        let raw = self.raw();
        // SAFETY: librdkafka keeps `key_len` bytes at `key` (NULL: no key) for as long
        // as the message lives, which the returned borrow of `self` cannot outlive.
        (!raw.key.is_null())
            .then(|| unsafe { std::slice::from_raw_parts(raw.key.cast::<u8>(), raw.key_len) })
    }

    pub fn payload(&self) -> Option<&[u8]> {
        let raw = self.raw();
        // SAFETY: as for `key`: `len` bytes at `payload`, NULL for a null value.
        (!raw.payload.is_null())
            .then(|| unsafe { std::slice::from_raw_parts(raw.payload.cast::<u8>(), raw.len) })
    }

    /// The timestamp in ms since the epoch, whichever its type, if it has one: one call
    /// into librdkafka (the lag in seconds reads it for every message).
    #[inline]
    pub fn timestamp_ms(&self) -> Option<i64> {
        // SAFETY: a live message; librdkafka takes a null type pointer.
        let ms = unsafe { rdsys::rd_kafka_message_timestamp(self.ptr(), std::ptr::null_mut()) };
        (ms != -1).then_some(ms)
    }

    pub fn timestamp(&self) -> Timestamp {
        let mut kind = rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: a live message and a valid out-pointer.
        let ms = unsafe { rdsys::rd_kafka_message_timestamp(self.ptr(), &mut kind) };
        match kind {
            _ if ms == -1 => Timestamp::NotAvailable,
            rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_CREATE_TIME => {
                Timestamp::CreateTime(ms)
            }
            rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME => {
                Timestamp::LogAppendTime(ms)
            }
            _ => Timestamp::NotAvailable,
        }
    }
}

/// A message's key and value bytes as librdkafka counts them (a null key or value: 0), for
/// `FetchedMessage::size` and for what the read-ahead takes before it wraps the messages.
pub(crate) fn key_and_value_bytes(raw: &rdsys::rd_kafka_message_t) -> usize {
    raw.key_len + raw.len
}

impl Drop for FetchedMessage<'_> {
    fn drop(&mut self) {
        // SAFETY: owned (`take`), destroyed once.
        unsafe { rdsys::rd_kafka_message_destroy(self.message.as_ptr()) }
    }
}

impl std::fmt::Debug for FetchedMessage<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FetchedMessage")
            .field("partition", &self.partition())
            .field("offset", &self.offset())
            .finish()
    }
}

/// A message from librdkafka, its headers parsed on first use: librdkafka parses them
/// (two allocations, even for a message without headers) when they are first asked for,
/// and most processors never ask. The cell makes that happen once, whichever thread asks.
pub(crate) struct Kafka<'a> {
    message: &'a FetchedMessage<'a>,
    headers: OnceLock<Vec<RawHeader<'a>>>,
    /// Set once by Schema Registry decoding; boxed, so that a raw message pays a pointer.
    decoded: OnceLock<Box<Decoded>>,
}

/// A header as librdkafka holds it: its name as text, its value (`None`: null).
type RawHeader<'a> = (Cow<'a, str>, Option<&'a [u8]>);

impl<'a> Kafka<'a> {
    #[inline]
    pub(crate) fn new(message: &'a FetchedMessage<'a>) -> Self {
        Kafka {
            message,
            headers: OnceLock::new(),
            decoded: OnceLock::new(),
        }
    }

    fn headers(&'a self) -> &'a [RawHeader<'a>] {
        self.headers.get_or_init(|| read_headers(self.message))
    }
}

/// The message's headers, in order, read through librdkafka's C API rather than
/// rust-rdkafka's `Headers`, which panics on a header name that is not UTF-8 (0.39:
/// `to_str().unwrap()`). Kafka's Java client only writes UTF-8 names, but the protocol
/// and librdkafka allow any bytes; such a name comes with its invalid bytes replaced by
/// U+FFFD, so one odd producer cannot halt a partition.
fn read_headers<'a>(message: &'a FetchedMessage<'a>) -> Vec<RawHeader<'a>> {
    let mut hdrs: *mut rdsys::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `message.ptr()` is the live rd_kafka_message_t that `message` borrows; the
    // headers it returns are owned by the message and live as long as it does.
    let err = unsafe { rdsys::rd_kafka_message_headers(message.ptr(), &mut hdrs) };
    if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || hdrs.is_null() {
        return Vec::new(); // _NOENT: no headers
    }
    // SAFETY: `hdrs` is valid for 'a (above).
    let count = unsafe { rdsys::rd_kafka_header_cnt(hdrs) };
    let mut headers = Vec::with_capacity(count);
    for idx in 0..count {
        let mut name: *const std::ffi::c_char = std::ptr::null();
        let mut value: *const std::ffi::c_void = std::ptr::null();
        let mut size = 0usize;
        // SAFETY: `idx` is below the count; the out-pointers are valid locals.
        let err =
            unsafe { rdsys::rd_kafka_header_get_all(hdrs, idx, &mut name, &mut value, &mut size) };
        if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            continue;
        }
        // SAFETY: librdkafka keeps each name NUL-terminated and each value `size` bytes
        // long (NULL for a null value), both in the message's memory, valid for 'a.
        let (name, value) = unsafe {
            (
                CStr::from_ptr(name).to_bytes(),
                (!value.is_null()).then(|| std::slice::from_raw_parts(value.cast::<u8>(), size)),
            )
        };
        headers.push((String::from_utf8_lossy(name), value));
    }
    headers
}

/// One message header. Kafka allows repeated names and null values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    pub name: &'a str,
    pub value: Option<&'a [u8]>,
}

impl<'a> Message<'a> {
    /// Builds a message from parts; for tests of processors and for embedding. It is a
    /// first delivery ([`Message::redelivered`] false, [`Message::attempt`] 1): see
    /// [`Message::with_redelivery`] for another.
    pub fn new(
        topic: &'a str,
        partition: i32,
        offset: i64,
        key: Option<&'a [u8]>,
        payload: Option<&'a [u8]>,
        timestamp_ms: Option<i64>,
    ) -> Self {
        Message {
            topic,
            partition,
            offset,
            key,
            payload,
            timestamp_ms,
            kafka: None,
            redelivered: false,
            attempt: 1,
            decoded: None,
        }
    }

    /// The same message, as ackd hands it over again: `redelivered` and `attempt` (see
    /// their getters; an attempt of 0 counts as 1). For tests of processors.
    pub fn with_redelivery(self, redelivered: bool, attempt: u32) -> Self {
        self.with_delivery(redelivered, attempt.max(1))
    }

    /// The same message with its delivery set: the consumer's view of it, or a retry.
    #[inline]
    pub(crate) fn with_delivery(mut self, redelivered: bool, attempt: u32) -> Self {
        self.redelivered = redelivered;
        self.attempt = attempt;
        self
    }

    #[inline]
    pub(crate) fn from_kafka(kafka: &'a Kafka<'a>, topic: &'a str) -> Self {
        let m = kafka.message;
        Message {
            topic,
            partition: m.partition(),
            offset: m.offset(),
            key: m.key(),
            payload: m.payload(),
            timestamp_ms: None,
            kafka: Some(kafka),
            redelivered: false,
            attempt: 1,
            decoded: None,
        }
    }

    pub fn topic(&self) -> &'a str {
        self.topic
    }
    pub fn partition(&self) -> i32 {
        self.partition
    }
    pub fn offset(&self) -> i64 {
        self.offset
    }
    /// The key; `None` for a null key.
    pub fn key(&self) -> Option<&'a [u8]> {
        self.key
    }
    /// The value; `None` for a null value (a tombstone).
    pub fn payload(&self) -> Option<&'a [u8]> {
        self.payload
    }
    /// The message timestamp in milliseconds since the epoch, when the broker has one.
    pub fn timestamp_ms(&self) -> Option<i64> {
        match self.kafka {
            Some(k) => k.message.timestamp().to_millis(),
            None => self.timestamp_ms,
        }
    }
    /// Whether this message may have been handed to a processor before: by a previous
    /// owner of the partition (after a crash: within the window its `at=assigned` line
    /// states), by this process in an earlier attempt, or ackd cannot know. False only
    /// when no processor can have seen it; true does not mean it was seen (a message in
    /// the window may be a first delivery). A handler that must not apply a message
    /// twice needs to look it up in its own store only when this is true.
    pub fn redelivered(&self) -> bool {
        self.redelivered
    }
    /// 1 on the first try in this process, one more each time ackd hands the message to
    /// a processor again: a retry after a failure, or the exec processor's re-sending it
    /// to a new child after its child died. In a batch every message has the batch's
    /// attempt. Counted per process: a new owner of the partition starts at 1 (with
    /// [`Message::redelivered`] saying whether it may be a repeat). A copy from a retry
    /// tier (`ACKD_RETRY_TOPICS`) counts on from the attempts its `ackd.attempts` header
    /// says were made, and is redelivered.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
    /// The headers, in the order they were produced.
    ///
    /// A name that is not UTF-8 (only non-Java producers can write one) comes with its
    /// invalid bytes replaced by U+FFFD.
    pub fn headers(&self) -> impl Iterator<Item = Header<'a>> + 'a {
        self.kafka
            .map(Kafka::headers)
            .unwrap_or_default()
            .iter()
            .map(|(name, value)| Header {
                name: name.as_ref(),
                value: *value,
            })
    }

    /// The key and value as Schema Registry decoding made them (`ACKD_VALUE_FORMAT`,
    /// `ACKD_KEY_FORMAT`, docs/schemas.md); `None` when neither is decoded.
    pub fn decoded(&self) -> Option<&'a Decoded> {
        match self.kafka {
            Some(k) => k.decoded.get().map(|d| &**d),
            None => self.decoded,
        }
    }
    /// The value decoded to JSON, when `ACKD_VALUE_FORMAT` decodes it (not for a null
    /// value): read it instead of parsing [`Message::payload`].
    pub fn decoded_value(&self) -> Option<&'a serde_json::Value> {
        self.decoded()?.value.as_ref().map(|p| &p.json)
    }
    /// The key decoded to JSON, when `ACKD_KEY_FORMAT` decodes it.
    pub fn decoded_key(&self) -> Option<&'a serde_json::Value> {
        self.decoded()?.key.as_ref().map(|p| &p.json)
    }
    /// The same message with `decoded` on it; for tests of processors.
    pub fn with_decoded(mut self, decoded: &'a Decoded) -> Self {
        self.decoded = Some(decoded);
        self
    }
    /// Puts `decoded` on a message from librdkafka, where it lives as long as the
    /// message; `Err` gives it back for a message built by hand (see [`Message::rebuilt`]).
    pub(crate) fn attach_decoded(&self, decoded: Decoded) -> Result<(), Decoded> {
        match self.kafka {
            Some(k) => {
                // Set at most once per fetched message: a retry finds it set.
                let _ = k.decoded.set(Box::new(decoded));
                Ok(())
            }
            None => Err(decoded),
        }
    }
    /// A copy for a shorter lifetime, without librdkafka's view: whole only for a message
    /// built by hand (one from librdkafka would lose its headers and timestamp).
    pub(crate) fn rebuilt<'b>(&self) -> Message<'b>
    where
        'a: 'b,
    {
        Message {
            topic: self.topic,
            partition: self.partition,
            offset: self.offset,
            key: self.key,
            payload: self.payload,
            timestamp_ms: self.timestamp_ms(),
            kafka: None,
            redelivered: self.redelivered,
            attempt: self.attempt,
            decoded: self.decoded,
        }
    }

    /// A copy that outlives the call, for processors that batch or hand messages on.
    pub fn to_owned(&self) -> OwnedMessage {
        OwnedMessage {
            topic: self.topic.to_string(),
            partition: self.partition,
            offset: self.offset,
            key: self.key.map(<[u8]>::to_vec),
            payload: self.payload.map(<[u8]>::to_vec),
            timestamp_ms: self.timestamp_ms(),
            headers: self
                .headers()
                .map(|h| (h.name.to_string(), h.value.map(<[u8]>::to_vec)))
                .collect(),
            redelivered: self.redelivered,
            attempt: self.attempt,
        }
    }
}

impl std::fmt::Debug for Message<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Payloads can be large and private: Debug names the message, not its contents.
        f.debug_struct("Message")
            .field("topic", &self.topic)
            .field("partition", &self.partition)
            .field("offset", &self.offset)
            .field("key_len", &self.key.map(<[u8]>::len))
            .field("payload_len", &self.payload.map(<[u8]>::len))
            .field("redelivered", &self.redelivered)
            .field("attempt", &self.attempt)
            .finish()
    }
}

/// A message copied out of librdkafka's buffers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedMessage {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub timestamp_ms: Option<i64>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// [`Message::redelivered`] of the message it copies.
    pub redelivered: bool,
    /// [`Message::attempt`] of the message it copies.
    pub attempt: u32,
}

/// Whether a failed message may succeed if tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// A passing condition (a timeout, a 503): try the same message again.
    Retryable,
    /// The message itself is the problem (bad input): trying again cannot help.
    Permanent,
}

/// Why a processor did not acknowledge a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessError {
    pub kind: FailureKind,
    pub reason: String,
    /// For a retryable failure: wait at least this long before the next attempt (an
    /// HTTP `Retry-After`). The worker waits the longer of this and its own backoff,
    /// capped at `ACKD_RETRY_MAX_MS`.
    pub retry_after: Option<std::time::Duration>,
}

impl ProcessError {
    pub fn retryable(reason: impl std::fmt::Display) -> Self {
        ProcessError {
            kind: FailureKind::Retryable,
            reason: reason.to_string(),
            retry_after: None,
        }
    }

    /// A retryable failure whose next attempt should come no sooner than `after`.
    pub fn retry_after(reason: impl std::fmt::Display, after: std::time::Duration) -> Self {
        ProcessError {
            retry_after: Some(after),
            ..ProcessError::retryable(reason)
        }
    }

    pub fn permanent(reason: impl std::fmt::Display) -> Self {
        ProcessError {
            kind: FailureKind::Permanent,
            reason: reason.to_string(),
            retry_after: None,
        }
    }
}

impl std::fmt::Display for ProcessError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            FailureKind::Retryable => "retryable",
            FailureKind::Permanent => "permanent",
        };
        write!(f, "{kind}: {}", self.reason)
    }
}

impl std::error::Error for ProcessError {}

/// Why a batch was not acknowledged as a whole: the first message that failed (its
/// offset), and how. The messages before it are acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchError {
    pub offset: i64,
    pub error: ProcessError,
}

impl BatchError {
    pub fn new(offset: i64, error: ProcessError) -> Self {
        BatchError { offset, error }
    }
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at offset {}: {}", self.offset, self.error)
    }
}

impl std::error::Error for BatchError {}

/// [`Processor::process`] on each message in turn, up to the first failure: the default
/// [`Processor::process_batch`], for processors that override it for some cases only.
pub async fn each<P: Processor + ?Sized>(
    processor: &P,
    messages: &[Message<'_>],
) -> Result<(), BatchError> {
    use futures::FutureExt as _;
    for m in messages {
        // A panic fails its own message, not the ones before it that succeeded.
        std::panic::AssertUnwindSafe(processor.process(m))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| Err(panicked(&panic)))
            .map_err(|error| BatchError::new(m.offset(), error))?;
    }
    Ok(())
}

/// A processor's panic as the permanent failure of its message.
pub(crate) fn panicked(panic: &Box<dyn std::any::Any + Send>) -> ProcessError {
    let reason = if let Some(s) = panic.downcast_ref::<&str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "panic"
    };
    ProcessError::permanent(format!("processor panicked: {reason}"))
}

/// A call waiting in the processor's own queue (for a child, a permit, a connection):
/// see [`queued`].
#[must_use = "take the call when it leaves the queue"]
pub struct Queued(Option<std::sync::Arc<crate::processors::call_start::CallStart>>);

impl Queued {
    /// Whether the call may start now: not while the membership is in doubt or the
    /// process just woke from a stall (its partition may be another's by now). Ask
    /// before taking it; while false, leave it queued (see [`Queued::startable`]).
    pub fn may_start(&self) -> bool {
        self.0.as_ref().is_none_or(|c| c.may_start())
    }

    /// Resolves once the call may start (at once outside a tracked call).
    pub async fn startable(&self) {
        if let Some(call) = &self.0 {
            call.startable().await;
        }
    }

    /// The processor takes the call now (a child or a permit is free): from here it
    /// counts as started, and the processor's own timeout should start here too. Keep
    /// the [`Taken`] while the call holds the child or permit, and drop it when the
    /// call frees them: the call counts as under way until then (or until its future
    /// returns). `None`: ackd dropped the call while it waited (a stop or a revoke
    /// began): do not run it; its message is redelivered to the partition's next reader.
    pub fn take(self) -> Option<Taken> {
        match self.0 {
            Some(call) => call.take().then_some(Taken(Some(call))),
            None => Some(Taken(None)),
        }
    }
}

/// A call the processor took (see [`Queued::take`]); dropping it ends the call for
/// ackd's count of calls under way (`ackd.in_flight`, `/live`) before its result reaches
/// the worker, so that the next call the freed child or permit takes is never counted
/// beside it.
#[must_use = "keep it while the call holds the child or permit"]
pub struct Taken(Option<std::sync::Arc<crate::processors::call_start::CallStart>>);

impl Drop for Taken {
    fn drop(&mut self) {
        if let Some(call) = &self.0 {
            call.end();
        }
    }
}

/// Says that the call being made waits in this processor's queue before it is served;
/// call it in the call's future, before it waits. Such a call counts as started only at
/// [`Queued::take`]; a call that never says so counts as started when its future is
/// first polled.
///
/// What that changes (with `ACKD_ORDERING=key` or `none`, where a partition has up to
/// `ACKD_CONCURRENCY` calls at once): a stop or a revoke waits only for the calls
/// started, and drops the others (unacknowledged, so redelivered); the health endpoint
/// counts a call's time from its start. With `ACKD_ORDERING=partition` the same holds
/// for a processor whose [`Processor::calls_may_wait`] says true. Outside such a call
/// (partition ordering with a processor that does not say so, a direct call) it does
/// nothing and `take` says true.
pub fn queued() -> Queued {
    Queued(crate::processors::call_start::CallStart::queue_current())
}

/// The user's logic. One call per message (or per batch, see
/// [`Processor::process_batch`]). With `ACKD_ORDERING=partition` (the default) calls for
/// one partition never overlap and come in offset order; with `key`, calls for one key
/// never overlap and come in offset order, while different keys' calls of a partition
/// overlap (up to `ACKD_CONCURRENCY`, as futures of the partition's one task: they run
/// in parallel only where they await); with `none` any call may overlap another.
/// Calls for different partitions run concurrently.
///
/// A call counts as started (a stop or a revoke waits for it, `/live` times it) once
/// its future was first polled, or, for a processor that queues calls before it serves
/// them (a pool, a limit on requests), from [`Queued::take`] (see [`queued`]; under
/// `ACKD_ORDERING=partition` only if [`Processor::calls_may_wait`] says true). A call
/// not started when a stop or a revoke begins is dropped: its future is dropped, its
/// message stays unacknowledged and goes to the partition's next reader.
///
/// Return `Ok(())` to acknowledge: the offset becomes committable. A message is never
/// committed before its call returned `Ok`, so work that must not be lost has to be done
/// (or durably handed off) before returning. A panic counts as a permanent failure of
/// that message, not of the daemon.
///
/// Calls run on tokio's worker threads (as many as cores). Await I/O rather than block
/// on it, and run CPU-heavy or blocking work in `tokio::task::spawn_blocking`: a
/// partition with a backlog gives its thread to the others only every 1024 messages it
/// did not have to wait for, so a call that blocks for long holds up other partitions,
/// the periodic commit and the signal handling on that thread.
pub trait Processor: Send + Sync + 'static {
    /// The name on the `at=start` line.
    fn name(&self) -> &str {
        "custom"
    }

    fn process(
        &self,
        message: &Message<'_>,
    ) -> impl Future<Output = Result<(), ProcessError>> + Send;

    /// The batch form, used instead of `process` when `ACKD_BATCH_MAX_MESSAGES` is above 1.
    /// `messages` is never empty and comes from one partition, in offset order (offsets
    /// may have gaps: compaction, transaction markers); batches of one partition never
    /// overlap and come in order.
    ///
    /// `Ok(())` acknowledges every message of the batch. A [`BatchError`] names the
    /// first message that failed: the ones before it are acknowledged, it gets the
    /// retry and failure policy, and the ones after it are handed over again (in a
    /// batch that starts at the failed message, or after it once the policy is done with
    /// it). The default calls [`Processor::process`] for each message in turn, stopping
    /// at the first failure.
    fn process_batch(
        &self,
        messages: &[Message<'_>],
    ) -> impl Future<Output = Result<(), BatchError>> + Send {
        each(self, messages)
    }

    /// Whether this processor's calls may wait for capacity of its own (a pool of
    /// children or connections, a limit on requests) before it serves them, saying so
    /// with [`queued`]. The default, false: calls are served as soon as they are made.
    ///
    /// With `ACKD_ORDERING=partition` (the default) ackd tracks when such a call starts
    /// only for a processor that says true: a stop or a revoke then drops a partition's
    /// call still waiting in the queue (its message is redelivered) instead of waiting
    /// for it, and `/live` times it from [`Queued::take`]. Saying true costs an
    /// allocation and a few atomic operations per call; false costs nothing, and
    /// [`queued`] then does nothing under partition ordering. With `key` or `none` every
    /// call is tracked, whatever this says.
    fn calls_may_wait(&self) -> bool {
        false
    }

    /// Called once on a graceful stop, after the final commit (no `process` call is in
    /// flight then, unless the drain ran out of time): release what the processor holds
    /// (children, connections) by `deadline`, the end of `ACKD_SHUTDOWN_TIMEOUT_MS`.
    /// ackd stops waiting for it at the deadline. The default does nothing.
    fn shutdown(&self, deadline: std::time::Instant) -> impl Future<Output = ()> + Send {
        let _ = deadline;
        async {}
    }
}
