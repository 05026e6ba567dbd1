//! Producing test messages (delivery reports as ground truth), reading them back, and a
//! steady producer thread.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::{broker::*, topics::*, wait::*};

/// One delivery report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
}

/// A producer for `bootstrap`, as the harness configures it.
pub fn producer_for(bootstrap: &str) -> FutureProducer {
    producer_with(bootstrap, &[])
}

/// [`producer_for`] with extra librdkafka properties (e.g. TLS for a proxy).
fn producer_with(bootstrap: &str, extra: &[(String, String)]) -> FutureProducer {
    producer_config(bootstrap, extra)
        .create()
        .expect("create test producer")
}

/// The test producers' settings: every message acknowledged by the broker.
fn producer_config(bootstrap: &str, extra: &[(String, String)]) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000")
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "1048576");
    for (k, v) in extra {
        config.set(k, v);
    }
    config
}

/// A producer for a cluster of the test's own, with its client properties (TLS, SASL).
pub fn producer_on(b: &Broker) -> FutureProducer {
    producer_with(&b.bootstrap(), b.client_properties())
}

fn producer() -> &'static FutureProducer {
    static PRODUCER: OnceLock<FutureProducer> = OnceLock::new();
    PRODUCER.get_or_init(|| producer_with(&broker().bootstrap(), broker().client_properties()))
}

/// Produces `messages` (key, value) to `topic` and waits for every delivery report.
/// Returns the reports in produce order; panics if any delivery fails.
pub fn produce(topic: &str, messages: &[(Option<Vec<u8>>, Vec<u8>)]) -> Vec<Delivered> {
    produce_with(producer(), topic, messages)
}

/// [`produce`] through a given producer (e.g. [`producer_for`] a test's own broker).
pub fn produce_with(
    producer: &FutureProducer,
    topic: &str,
    messages: &[(Option<Vec<u8>>, Vec<u8>)],
) -> Vec<Delivered> {
    let mut futures = Vec::with_capacity(messages.len());
    for (key, value) in messages {
        let mut record = FutureRecord::to(topic).payload(value.as_slice());
        if let Some(k) = key {
            record = record.key(k.as_slice());
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match producer.send_result(record) {
                Ok(f) => {
                    futures.push(f);
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r))
                    if Instant::now() < deadline =>
                {
                    record = r;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => panic!("produce to {topic}: enqueue failed: {e}"),
            }
        }
    }
    futures
        .into_iter()
        .zip(messages)
        .map(|(f, (key, _))| match futures::executor::block_on(f) {
            Ok(Ok(d)) => Delivered {
                partition: d.partition,
                offset: d.offset,
                key: key.clone(),
            },
            Ok(Err((e, _))) => panic!("produce to {topic}: delivery failed: {e}"),
            Err(_) => panic!("produce to {topic}: delivery report channel dropped"),
        })
        .collect()
}

/// A message with everything set by hand: partition, key (None: null), value, headers.
pub type Record<'a> = (i32, Option<&'a [u8]>, &'a [u8], &'a [(&'a str, &'a [u8])]);

/// Produces `records` one after the other (each waits for its delivery report, so
/// offsets follow the order given); returns where each went.
pub fn produce_records(topic: &str, records: &[Record<'_>]) -> Vec<(i32, i64)> {
    records
        .iter()
        .map(|(partition, key, value, headers)| {
            let mut h = OwnedHeaders::new();
            for (k, v) in *headers {
                h = h.insert(Header {
                    key: k,
                    value: Some(*v),
                });
            }
            let mut record = FutureRecord::to(topic)
                .partition(*partition)
                .payload(*value)
                .headers(h);
            if let Some(k) = key {
                record = record.key(*k);
            }
            let d = futures::executor::block_on(producer().send(record, Duration::from_secs(10)))
                .map_err(|(e, _)| e)
                .unwrap_or_else(|e| panic!("produce to {topic}: {e}"));
            (d.partition, d.offset)
        })
        .collect()
}

/// Produces one message (`payload`) to partition 0 of `topic` with one header whose name
/// is the raw bytes `name`. rust-rdkafka takes only `&str` names; this goes through
/// librdkafka's C API, as a producer in another language could.
pub fn produce_with_raw_header_name(topic: &str, name: &[u8], value: &[u8], payload: &[u8]) {
    use rdkafka::bindings as rdsys;
    use rdkafka::bindings::rd_kafka_vtype_t as vtype;
    use rdkafka::bindings::rd_kafka_vu_s__bindgen_ty_1 as Value;
    use rdkafka::producer::{BaseProducer, Producer};
    let producer: BaseProducer =
        producer_config(&broker().bootstrap(), broker().client_properties())
            .create()
            .expect("create raw producer");
    let topic_c = std::ffi::CString::new(topic).unwrap();
    let vu = |vtype, u| rdsys::rd_kafka_vu_t { vtype, u };
    // SAFETY: every pointer handed over is valid for the call; MSG_F_COPY makes librdkafka
    // copy the payload, and on success it owns (and frees) the headers.
    unsafe {
        let hdrs = rdsys::rd_kafka_headers_new(1);
        rdsys::rd_kafka_header_add(
            hdrs,
            name.as_ptr().cast(),
            name.len() as isize,
            value.as_ptr().cast(),
            value.len() as isize,
        );
        let vus = [
            vu(
                vtype::RD_KAFKA_VTYPE_TOPIC,
                Value {
                    cstr: topic_c.as_ptr(),
                },
            ),
            vu(vtype::RD_KAFKA_VTYPE_PARTITION, Value { i32_: 0 }),
            vu(
                vtype::RD_KAFKA_VTYPE_VALUE,
                Value {
                    mem: rdsys::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                        ptr: payload.as_ptr() as *mut _,
                        size: payload.len(),
                    },
                },
            ),
            vu(
                vtype::RD_KAFKA_VTYPE_MSGFLAGS,
                Value {
                    i: rdsys::RD_KAFKA_MSG_F_COPY,
                },
            ),
            vu(vtype::RD_KAFKA_VTYPE_HEADERS, Value { headers: hdrs }),
        ];
        let error =
            rdsys::rd_kafka_produceva(producer.client().native_ptr(), vus.as_ptr(), vus.len());
        assert!(error.is_null(), "rd_kafka_produceva to {topic} failed");
    }
    producer
        .flush(Duration::from_secs(10))
        .expect("flush the raw producer");
}

/// A message read back from a topic: key, value, headers (values lossily as text).
#[derive(Debug)]
pub struct ReadBack {
    pub offset: i64,
    /// Milliseconds since the epoch (CreateTime or LogAppendTime), if any.
    pub timestamp: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub headers: HashMap<String, String>,
}

/// Reads `n` messages of `topic`'s partition 0 from its beginning (a dead-letter topic,
/// say), waiting up to `timeout` for them.
pub fn read_back(topic: &str, n: usize, timeout: Duration) -> Vec<ReadBack> {
    use rdkafka::message::Headers as _;
    use rdkafka::Message as _;
    let reader: BaseConsumer = broker()
        .client_config()
        .set("group.id", unique_name("reader"))
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    reader.assign(&tpl).unwrap();
    let mut got = Vec::new();
    wait_until(timeout, || {
        if let Some(Ok(m)) = reader.poll(Duration::from_millis(100)) {
            let headers = m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| {
                            (
                                h.key.to_string(),
                                String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            got.push(ReadBack {
                offset: m.offset(),
                timestamp: m.timestamp().to_millis(),
                key: m.key().map(<[u8]>::to_vec),
                payload: m.payload().map(<[u8]>::to_vec),
                headers,
            });
        }
        got.len() >= n
    });
    got
}

/// Produces `n` messages without keys to partition 0, in order, values `v-<i>`: message
/// `i` at offset `i` of a new topic.
pub fn produce_numbered(topic: &str, n: usize) {
    let values: Vec<String> = (0..n).map(|i| format!("v-{i}")).collect();
    let records: Vec<Record<'_>> = values
        .iter()
        .map(|v| (0, None, v.as_bytes(), &[][..]))
        .collect();
    produce_records(topic, &records);
}

/// Produces `n` ~100-byte messages with keys `k-<i>`, i in `start..start+n`, spread over the
/// partitions by the default (key-hashing) partitioner.
pub fn produce_keyed(topic: &str, n: usize, start: usize) -> Vec<Delivered> {
    produce(topic, &keyed_messages(n, start))
}

/// The messages [`produce_keyed`] sends.
pub fn keyed_messages(n: usize, start: usize) -> Vec<(Option<Vec<u8>>, Vec<u8>)> {
    (start..start + n)
        .map(|i| {
            let key = format!("k-{i}").into_bytes();
            let mut value = format!("message {i} ").into_bytes();
            value.resize(100, b'.');
            (Some(key), value)
        })
        .collect()
}

/// A producer thread that sends `batch` keyed messages every `every` until finished.
pub struct SteadyProducer {
    stop: Arc<std::sync::atomic::AtomicBool>,
    delivered: Arc<Mutex<Vec<Delivered>>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl SteadyProducer {
    /// Starts the thread, producing through the shared producer of the test broker.
    pub fn start(topic: &str, batch: usize, every: Duration) -> SteadyProducer {
        SteadyProducer::start_with(producer().clone(), topic, batch, every)
    }

    /// How many messages were delivered so far.
    pub fn count(&self) -> usize {
        self.delivered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Stops after the batch in progress; returns every delivery report.
    pub fn finish(mut self) -> Vec<Delivered> {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.join().expect("producer thread panicked");
        }
        std::mem::take(&mut *self.delivered.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// A producer for a cluster of a test's own that rides through its nodes' restarts and
/// deaths: every message acknowledged by all in-sync replicas, idempotent (librdkafka's
/// retries, unbounded by count, write no duplicates), and up to 3 minutes per message
/// for a leader to move (a killed node is fenced after `broker.session.timeout.ms`).
pub fn producer_riding_restarts(b: &Broker) -> FutureProducer {
    let mut extra = b.client_properties().to_vec();
    extra.extend(
        [
            ("enable.idempotence", "true"),
            ("message.timeout.ms", "180000"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    producer_with(&b.bootstrap(), &extra)
}

impl SteadyProducer {
    /// Like [`SteadyProducer::start`], through `producer` (e.g. [`producer_riding_restarts`]
    /// for a cluster of the test's own).
    pub fn start_with(
        producer: FutureProducer,
        topic: &str,
        batch: usize,
        every: Duration,
    ) -> SteadyProducer {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let delivered = Arc::new(Mutex::new(Vec::new()));
        let (topic, s, d) = (topic.to_string(), stop.clone(), delivered.clone());
        let thread = thread::Builder::new()
            .name("steady-producer".into())
            .spawn(move || {
                let mut next = 0;
                while !s.load(Ordering::Acquire) {
                    let got = produce_with(&producer, &topic, &keyed_messages(batch, next));
                    next += batch;
                    d.lock().unwrap_or_else(|e| e.into_inner()).extend(got);
                    thread::sleep(every);
                }
            })
            .expect("spawn producer thread");
        SteadyProducer {
            stop,
            delivered,
            thread: Some(thread),
        }
    }
}

/// A message to produce to partition 0: key, value, headers.
pub type ValueRecord<'a> = (Option<&'a [u8]>, &'a [u8], &'a [(&'a str, &'a [u8])]);

/// Produces values (with optional key bytes and headers) to partition 0, in order.
pub fn produce_values(topic: &str, messages: &[ValueRecord<'_>]) {
    let records: Vec<Record<'_>> = messages.iter().map(|(k, v, h)| (0, *k, *v, *h)).collect();
    produce_records(topic, &records);
}

/// Produces `values` (no key, no headers) to partition 0, in order.
pub fn produce_strs(topic: &str, values: &[&str]) {
    let records: Vec<ValueRecord<'_>> = values
        .iter()
        .map(|v| (None, v.as_bytes(), &[][..]))
        .collect();
    produce_values(topic, &records);
}
