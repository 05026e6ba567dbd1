//! A message as librdkafka fetched it, read straight from librdkafka's memory and
//! released when dropped. The partition workers take these from their queue several at a
//! time (`consumer::partition_queue`); the processors see them through `Message`.

use std::marker::PhantomData;
use std::ptr::NonNull;

use rdkafka::bindings as rdsys;
use rdkafka::error::{IsError, KafkaError, KafkaResult};
use rdkafka::Timestamp;

/// One fetched message, owned: librdkafka's `rd_kafka_message_t`, destroyed on drop. It
/// borrows (`'q`) the queue it came from, which keeps the consumer alive: librdkafka's
/// messages must not outlive their client.
pub struct FetchedMessage<'q> {
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
    pub(crate) unsafe fn take(message: NonNull<rdsys::rd_kafka_message_t>) -> KafkaResult<Self> {
        let fetched = FetchedMessage {
            message,
            queue: PhantomData,
        };
        // SAFETY: live (above).
        let raw = unsafe { message.as_ref() };
        if !raw.err.is_error() {
            return Ok(fetched);
        }
        Err(match raw.err {
            rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF => {
                KafkaError::PartitionEOF(raw.partition)
            }
            e => KafkaError::MessageConsumption(e.into()),
        })
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
