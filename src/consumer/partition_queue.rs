//! A partition's own librdkafka queue, split from the consumer's, and its worker's
//! reading of it several messages at a time.
//!
//! rust-rdkafka's partition streams take one message per call, and each call pays for
//! what librdkafka does around a poll: two clock reads, the poll-interval bookkeeping on
//! the consumer's shared state (a lock every partition's worker takes), the queue's lock,
//! and an event to allocate. Taking up to [`READ_AHEAD`] messages per call
//! (`rd_kafka_consume_batch_queue`) pays for it once per call instead.

use std::ffi::{c_void, CString};
use std::marker::PhantomData;
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use futures::Stream;
use rdkafka::bindings as rdsys;
use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::{IsError, KafkaError};
use rdkafka::TopicPartitionList;

use crate::processors::processor::{key_and_value_bytes, Fetched, FetchedMessage};

/// At most this many messages taken from librdkafka's queue in one call, ...
pub const READ_AHEAD: usize = 64;
/// ... and about this many bytes of them: what a worker has taken out of librdkafka's
/// queue is beyond the queue's own bound (`queued.max.messages.kbytes`, which librdkafka
/// refills), so large messages are taken one at a time.
///
/// A call takes a count, and librdkafka cannot show the sizes of what it would take, so
/// the count is judged by the messages taken before: by the largest of recent calls,
/// halved at each call that had nothing as large (the first call takes one). After a
/// large message the count grows back over about ten calls, so sizes that alternate
/// are taken a few at a time. Where large messages follow a run of small ones, the
/// call at the change may still take up to [`READ_AHEAD`] of them: the true bound of
/// one call is 64 messages and what the queue held (its bound plus one fetch
/// response), which the memory budget counts (src/consumer/memory.rs).
pub const READ_AHEAD_BYTES: usize = 16 * 1024;

/// How many messages to take next, when recent calls' messages had up to `largest`
/// key and value bytes ([`Recent::largest`]).
pub fn read_ahead(largest: usize) -> usize {
    (READ_AHEAD_BYTES / largest.max(1)).clamp(1, READ_AHEAD)
}

/// The size the next call is judged by: the largest message of recent calls.
#[derive(Debug, Clone, Copy)]
pub struct Recent {
    largest: usize,
}

impl Default for Recent {
    /// Nothing taken yet: the first call takes one message.
    fn default() -> Self {
        Recent {
            largest: READ_AHEAD_BYTES,
        }
    }
}

impl Recent {
    /// After a call whose largest message had `largest` bytes (0: it took none, or only
    /// errors, which say nothing of sizes).
    pub fn took(&mut self, largest: usize) {
        if largest > 0 {
            self.largest = largest.max(self.largest / 2);
        }
    }

    pub fn largest(&self) -> usize {
        self.largest
    }
}

/// One partition's queue, no longer forwarded to the consumer's: what librdkafka fetches
/// for the partition waits here for its worker, which is woken when it becomes non-empty.
pub struct PartitionQueue<C: ConsumerContext + 'static> {
    queue: NonNull<rdsys::rd_kafka_queue_t>,
    /// The partition, to pause its fetching while its worker holds a large message.
    partition: Pausable,
    /// The worker's waker, woken by librdkafka's broker thread (`wake`); the queue holds
    /// a pointer to it until `drop` unhooks it.
    waker: Arc<AtomicWaker>,
    /// Keeps the client alive while the queue, or a message read from it, is.
    _consumer: Arc<StreamConsumer<C>>,
}

// SAFETY: librdkafka's queues may be used from any thread; the waker is Sync.
unsafe impl<C: ConsumerContext> Send for PartitionQueue<C> {}
unsafe impl<C: ConsumerContext> Sync for PartitionQueue<C> {}

/// Called by librdkafka, on the thread that enqueued, when the queue becomes non-empty.
unsafe extern "C" fn wake(_: *mut rdsys::rd_kafka_t, waker: *mut c_void) {
    // SAFETY: `waker` is the `AtomicWaker` the queue holds (`split`), alive until `drop`
    // has unhooked this callback.
    unsafe { (*(waker as *const AtomicWaker)).wake() }
}

impl<C: ConsumerContext + 'static> PartitionQueue<C> {
    /// Splits `topic`/`partition`'s queue from the consumer's. `None`: librdkafka has no
    /// such partition. Like rust-rdkafka's `split_partition_queue`, every handle is on the
    /// same librdkafka queue, and dropping one unhooks the wake-up of every other.
    pub fn split(consumer: &Arc<StreamConsumer<C>>, name: &str, partition: i32) -> Option<Self> {
        let topic = CString::new(name).ok()?;
        let client = consumer.client().native_ptr();
        // SAFETY: a live client and a NUL-terminated topic name.
        let queue =
            unsafe { rdsys::rd_kafka_queue_get_partition(client, topic.as_ptr(), partition) };
        let queue = NonNull::new(queue)?;
        let waker = Arc::new(AtomicWaker::new());
        // SAFETY: `queue` is live; `waker` outlives the hook (see `drop`).
        unsafe {
            rdsys::rd_kafka_queue_forward(queue.as_ptr(), std::ptr::null_mut());
            rdsys::rd_kafka_queue_cb_event_enable(
                queue.as_ptr(),
                Some(wake),
                Arc::as_ptr(&waker) as *mut c_void,
            );
        }
        Some(PartitionQueue {
            queue,
            partition: Pausable {
                client,
                topic,
                number: partition,
                list: {
                    let mut list = TopicPartitionList::with_capacity(1);
                    list.add_partition(name, partition);
                    list
                },
            },
            waker,
            _consumer: consumer.clone(),
        })
    }

    /// The partition's messages (and fetch errors) in offset order. With `large` > 0 (the
    /// memory budget's bound on what a worker holds taken out of its queue), a call that
    /// takes a message larger than `large` pauses the partition's fetching until every
    /// message it took was handed out and the worker asks for more. With `ends`
    /// (`ACKD_STOP_AT_END`), the end of the log is said (`PartitionEOF`) as soon as the
    /// queue is empty and the last message handed out was the last the broker had.
    pub(crate) fn messages(&self, large: usize, ends: bool) -> Messages<'_> {
        Messages {
            queue: self.queue,
            partition: &self.partition,
            large,
            paused: false,
            ends,
            after_last: None,
            waker: &self.waker,
            taken: Vec::with_capacity(READ_AHEAD),
            next: 0,
            recent: Recent::default(),
            owns: PhantomData,
        }
    }
}

impl<C: ConsumerContext + 'static> Drop for PartitionQueue<C> {
    fn drop(&mut self) {
        // SAFETY: unhooked under the queue's lock, so no call of `wake` runs or starts
        // after this returns and the waker may go; then the handle is released.
        unsafe {
            rdsys::rd_kafka_queue_cb_event_enable(self.queue.as_ptr(), None, std::ptr::null_mut());
            rdsys::rd_kafka_queue_destroy(self.queue.as_ptr());
        }
    }
}

/// A partition to pause and resume: librdkafka fetches ahead a whole record batch at
/// least, so a partition of messages larger than its share of the memory budget would
/// hold two of them (the one its worker took, the one fetched behind it) however low its
/// queue's limits. Pausing drops what librdkafka had fetched for the partition (it
/// fetches again from the last message taken on resume): with large messages that is
/// rarely anything, as the queue held only the message just taken.
struct Pausable {
    client: *mut rdsys::rd_kafka_t,
    topic: CString,
    number: i32,
    /// The one partition, as librdkafka's pause and resume take it.
    list: TopicPartitionList,
}

impl Pausable {
    fn set(&self, pause: bool) {
        // SAFETY: the client outlives the queue (`_consumer`); librdkafka only reads the
        // list (each element's error field aside, which nothing else reads).
        let err = unsafe {
            if pause {
                rdsys::rd_kafka_pause_partitions(self.client, self.list.ptr())
            } else {
                rdsys::rd_kafka_resume_partitions(self.client, self.list.ptr())
            }
        };
        if err.is_error() {
            let action = if pause { "pause" } else { "resume" };
            for e in self.list.elements() {
                tracing::warn!(at = "pause_failed", topic = e.topic(), partition = e.partition(), action, error = ?err);
            }
        }
    }

    /// The log's end offset as the last fetch response said it (librdkafka's copy: no
    /// request); `None` before any response.
    fn log_end(&self) -> Option<i64> {
        let (mut low, mut high) = (-1, -1);
        // SAFETY: the client outlives the queue; the topic is NUL-terminated.
        let err = unsafe {
            rdsys::rd_kafka_get_watermark_offsets(
                self.client,
                self.topic.as_ptr(),
                self.number,
                &mut low,
                &mut high,
            )
        };
        (!err.is_error() && high >= 0).then_some(high)
    }
}

/// A partition's messages, taken from its queue up to [`READ_AHEAD`] at a time; the
/// ones taken and not yet read are released unread when this is dropped (they were
/// never started, so they are redelivered like anything left in librdkafka's queue).
pub(crate) struct Messages<'q> {
    queue: NonNull<rdsys::rd_kafka_queue_t>,
    partition: &'q Pausable,
    /// Above this (0: never), a taken message pauses the partition's fetching.
    large: usize,
    paused: bool,
    /// Say the end of the log when the queue runs dry there (`ACKD_STOP_AT_END`).
    ends: bool,
    /// The offset after the last message taken, until the end was said there.
    after_last: Option<i64>,
    waker: &'q AtomicWaker,
    /// What the last `rd_kafka_consume_batch_queue` took (ours to destroy from `next` on),
    /// and its out-array next time: 8 bytes a message, allocated once.
    taken: Vec<*mut rdsys::rd_kafka_message_t>,
    /// The index in `taken` of the next message to hand out.
    next: usize,
    /// The sizes of recent calls' messages (see [`read_ahead`]).
    recent: Recent,
    /// The messages from `next` on are owned here, as `FetchedMessage`s borrowing `'q`.
    owns: PhantomData<FetchedMessage<'q>>,
}

// SAFETY: the queue handle may be used from any thread, and the messages are Send.
unsafe impl Send for Messages<'_> {}

impl Messages<'_> {
    /// Takes what the queue has now, without waiting; false when it had nothing. Called
    /// only once every message taken before was handed out.
    fn take(&mut self) -> bool {
        if self.paused {
            // The worker is done with the large message: fetch the next.
            self.partition.set(false);
            self.paused = false;
        }
        let wanted = read_ahead(self.recent.largest());
        self.taken.clear();
        self.next = 0;
        // SAFETY: the queue is live while `'q` is, and the array has room for `wanted`.
        let n = unsafe {
            rdsys::rd_kafka_consume_batch_queue(
                self.queue.as_ptr(),
                0,
                self.taken.as_mut_ptr(),
                wanted,
            )
        };
        let n = usize::try_from(n).unwrap_or(0).min(wanted);
        // SAFETY: librdkafka wrote `n` live message pointers, now ours.
        unsafe { self.taken.set_len(n) };
        self.taken.retain(|m| !m.is_null());
        if self.ends {
            if let Some(&last) = self.taken.iter().rev().find(|&&m| !is_error(m)) {
                // SAFETY: a live message just taken.
                self.after_last = Some(unsafe { (*last).offset } + 1);
            }
        }
        let largest = self.taken.iter().map(|&m| size(m)).max().unwrap_or(0);
        self.recent.took(largest);
        if self.large > 0 && largest > self.large {
            self.partition.set(true);
            self.paused = true;
        }
        !self.taken.is_empty()
    }
}

/// A taken message's key and value bytes (0 for a fetch error).
fn size(message: *mut rdsys::rd_kafka_message_t) -> usize {
    if is_error(message) {
        0
    } else {
        // SAFETY: a live message from `rd_kafka_consume_batch_queue`.
        key_and_value_bytes(unsafe { &*message })
    }
}

/// Whether a taken message is a fetch error (an end of partition included).
fn is_error(message: *mut rdsys::rd_kafka_message_t) -> bool {
    // SAFETY: a live message from `rd_kafka_consume_batch_queue`.
    unsafe { (*message).err.is_error() }
}

impl Messages<'_> {
    /// With `ends`, the queue being empty: whether the last message handed out was the
    /// log's last when the broker last answered a fetch. Said once per end reached.
    /// librdkafka says it too, but only with the next fetch's answer, which the broker
    /// holds up to `fetch.wait.max.ms` when nothing is left.
    fn at_end(&mut self) -> bool {
        let Some(after_last) = self.after_last.filter(|_| self.ends) else {
            return false;
        };
        let ended = self
            .partition
            .log_end()
            .is_some_and(|end| after_last >= end);
        if ended {
            self.after_last = None;
        }
        ended
    }
}

impl<'q> Stream for Messages<'q> {
    type Item = Fetched<'q>;

    /// Never ends: `Ready(None)` is not returned.
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.next == self.taken.len() && !self.take() {
            // Registered before looking again: a message enqueued in between wakes us.
            self.waker.register(cx.waker());
            if !self.take() {
                return match self.at_end() {
                    true => {
                        let end = KafkaError::PartitionEOF(self.partition.number);
                        Poll::Ready(Some(Err(Box::new(end))))
                    }
                    false => Poll::Pending,
                };
            }
        }
        let message = self.taken[self.next];
        self.next += 1;
        // SAFETY: not null (`take` keeps no null), live and ours, handed out once; the
        // client outlives 'q.
        Poll::Ready(Some(unsafe {
            FetchedMessage::take(NonNull::new_unchecked(message))
        }))
    }
}

impl Drop for Messages<'_> {
    fn drop(&mut self) {
        // Never left paused: a later assignment of the partition must fetch it.
        if self.paused {
            self.partition.set(false);
        }
        for &message in &self.taken[self.next..] {
            // SAFETY: taken, never handed out: ours to destroy, once.
            unsafe { rdsys::rd_kafka_message_destroy(message) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_about_read_ahead_bytes_and_at_least_one() {
        assert_eq!(read_ahead(0), READ_AHEAD);
        assert_eq!(read_ahead(106), READ_AHEAD, "the bench's 100-byte messages");
        assert_eq!(read_ahead(1024), 16);
        assert_eq!(read_ahead(READ_AHEAD_BYTES), 1, "the first call");
        assert_eq!(read_ahead(1 << 20), 1, "a large message goes alone");
    }

    /// The counts a run of calls takes, each call taking messages of the given sizes
    /// (as many as it asks for), and the bytes of the largest call.
    fn run(sizes: impl Iterator<Item = usize>, calls: usize) -> (Vec<usize>, usize) {
        let mut sizes = sizes.peekable();
        let mut recent = Recent::default();
        let (mut counts, mut most) = (Vec::new(), 0);
        for _ in 0..calls {
            let taken: Vec<usize> = sizes.by_ref().take(read_ahead(recent.largest())).collect();
            counts.push(taken.len());
            most = most.max(taken.iter().sum());
            recent.took(taken.iter().copied().max().unwrap_or(0));
        }
        (counts, most)
    }

    #[test]
    fn sizes_that_alternate_are_taken_a_few_at_a_time() {
        // A topic of small messages with a large one every 16: judged by the previous
        // call alone, every call after a small one took 64, and with them up to four
        // of the large ones (1 MiB at once).
        let sizes = (0..).map(|i| if i % 16 == 15 { 256 * 1024 } else { 100 });
        let (counts, most) = run(sizes, 200);
        assert!(
            most <= 2 * 256 * 1024 + READ_AHEAD_BYTES,
            "a call took {most} bytes: {counts:?}"
        );
    }

    #[test]
    fn after_a_large_message_the_count_grows_back() {
        let sizes = std::iter::once(1 << 20).chain(std::iter::repeat(100));
        let (counts, _) = run(sizes, 16);
        assert_eq!(counts[..3], [1, 1, 1]);
        assert_eq!(*counts.last().unwrap(), READ_AHEAD, "{counts:?}");
    }
}
