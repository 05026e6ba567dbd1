//! Shared harness for the integration tests (`mod common;` in each test binary).
//!
//! - [`broker`] (in `broker.rs`): one Apache Kafka broker (KRaft) per test binary, started
//!   lazily, killed with the process; [`broker_with`] starts it with [`BrokerOptions`]
//!   instead (TLS, SASL); [`Broker::start`] a cluster of a test's own (several nodes).
//! - [`create_topic`], [`unique_name`], [`produce`], [`produce_keyed`], [`log_ends`],
//!   [`committed`]: topic setup, ground truth from delivery reports, committed offsets.
//! - [`AckdBuilder`] / [`AckdProcess`]: runs the real `ackd` binary and collects its output.
//! - [`field`], [`processed`], [`wait_until`]: small helpers for assertions.
//!
//! Every test binary uses a subset, hence the `dead_code` allowances.
//!
//! Children (the broker, ackd) are spawned by one dedicated thread that never exits, with
//! `PR_SET_PDEATHSIG = SIGKILL`: the kernel delivers that signal when the *thread* that forked
//! the child exits, and libtest runs each test on its own short-lived thread.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

mod broker;
pub use broker::*;
/// A throwaway PKI for the TLS and SASL tests (`common::pki::Pki`).
pub mod pki;

// ---------------------------------------------------------------------------------------------
// Spawning children that die with the test process
// ---------------------------------------------------------------------------------------------

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `cmd` from the harness's spawner thread, with PDEATHSIG = SIGKILL.
pub fn spawn_tied(mut cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("harness-spawner".into())
            .spawn(move || {
                // This thread must outlive every child: PDEATHSIG fires when it exits.
                // The `static` sender is never dropped, so `recv` never fails, but park
                // forever just in case rather than returning.
                while let Ok((mut cmd, reply)) = rx.recv() {
                    let _ = reply.send(cmd.spawn());
                }
                loop {
                    thread::park();
                }
            })
            .expect("spawn harness-spawner thread");
        Mutex::new(tx)
    });

    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and only calls async-signal-safe
    // functions (prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }

    let (reply_tx, reply_rx) = mpsc::channel();
    tx.lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, reply_tx))
        .expect("harness-spawner thread is gone");
    reply_rx
        .recv()
        .expect("harness-spawner thread did not reply")
}

/// A port nothing listens on right now (bound to :0 and released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// Directory for logs: `<target>/tmp` (Cargo's CARGO_TARGET_TMPDIR), else the temp dir.
pub fn log_dir() -> PathBuf {
    let dir = option_env!("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

fn passthrough_env() -> Vec<(String, String)> {
    ["PATH", "HOME"]
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect()
}

pub fn read_lossy(path: &Path) -> String {
    let mut buf = Vec::new();
    match File::open(path).and_then(|mut f| f.read_to_end(&mut buf)) {
        Ok(_) => String::from_utf8_lossy(&buf).into_owned(),
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

// ---------------------------------------------------------------------------------------------
// Topics, producing, committed offsets
// ---------------------------------------------------------------------------------------------

/// `prefix-<pid>-<counter>-<nanos>`: unique per test binary run, a legal topic/group name.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{n}-{nanos}", std::process::id())
}

/// Creates `name` with `partitions` partitions on the test broker.
pub fn create_topic(name: &str, partitions: i32) {
    create_topic_on(broker(), name, partitions);
}

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

/// Per partition, the log end offset (max delivered offset + 1), from the producer's
/// delivery reports: the ground truth of what the broker holds.
pub fn log_ends(delivered: &[Delivered]) -> BTreeMap<i32, i64> {
    let mut ends = BTreeMap::new();
    for d in delivered {
        let e = ends.entry(d.partition).or_insert(0);
        *e = (*e).max(d.offset + 1);
    }
    ends
}

/// Asserts that `group` has committed every partition of `topic` (of `partitions`) at
/// its log end in `ends` (from [`log_ends`]): everything delivered was acknowledged.
#[track_caller]
pub fn assert_committed_to_ends(
    group: &str,
    topic: &str,
    partitions: i32,
    ends: &BTreeMap<i32, i64>,
) {
    let committed = committed(group, topic, partitions);
    for (p, end) in ends {
        assert_eq!(committed[p], Some(*end), "partition {p}");
    }
}

/// Committed offsets of `group` for partitions `0..partitions` of `topic`
/// (None where nothing is committed). Uses a consumer that never subscribes.
pub fn committed(group: &str, topic: &str, partitions: i32) -> BTreeMap<i32, Option<i64>> {
    committed_with(
        &broker().bootstrap(),
        broker().client_properties(),
        group,
        topic,
        partitions,
    )
}

/// [`committed`] on the brokers at `bootstrap`.
pub fn committed_on(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, Option<i64>> {
    committed_with(bootstrap, &[], group, topic, partitions)
}

/// [`committed`] on a cluster of the test's own, with its client properties (TLS, SASL).
pub fn committed_at(
    b: &Broker,
    group: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, Option<i64>> {
    committed_with(
        &b.bootstrap(),
        b.client_properties(),
        group,
        topic,
        partitions,
    )
}

fn committed_with(
    bootstrap: &str,
    extra: &[(String, String)],
    group: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, Option<i64>> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    for (k, v) in extra {
        config.set(k, v);
    }
    let consumer: BaseConsumer = config.create().expect("create committed-offsets consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    // The group's coordinator may be moving (a node restarting) or loading: the answer
    // then is an error that says to ask again, which librdkafka hands back as it is.
    let deadline = Instant::now() + Duration::from_secs(30);
    let tpl = loop {
        match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
            Ok(tpl) => break tpl,
            Err(e) if is_coordinator_moving(&e) && Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(100))
            }
            Err(e) => panic!("committed offsets of group {group} on {topic}: {e}"),
        }
    };
    tpl.elements()
        .iter()
        .map(|e| {
            let offset = match e.offset() {
                Offset::Offset(o) => Some(o),
                Offset::Invalid => None,
                other => panic!(
                    "unexpected committed offset {other:?} for {topic}/{}",
                    e.partition()
                ),
            };
            (e.partition(), offset)
        })
        .collect()
}

/// Commits `offset` for `topic`/`partition` in `group` on the (plaintext) brokers at
/// `bootstrap` with `metadata` as raw bytes (not necessarily UTF-8), from a consumer that
/// never subscribes, as a client in another language could: rust-rdkafka's
/// `set_metadata` takes only `&str`, so this sets librdkafka's `metadata` field through
/// the C API.
pub fn commit_raw_metadata_on(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partition: i32,
    offset: i64,
    metadata: &[u8],
) {
    use rdkafka::consumer::CommitMode;
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false");
    let consumer: BaseConsumer = config.create().expect("create committing consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))
        .expect("offset");
    // SAFETY: the list has one element, with no metadata yet; librdkafka frees the
    // malloc'd copy with the list.
    unsafe {
        let e = &mut *(*tpl.ptr()).elems;
        let buf = libc::malloc(metadata.len().max(1));
        assert!(!buf.is_null());
        std::ptr::copy_nonoverlapping(metadata.as_ptr(), buf.cast::<u8>(), metadata.len());
        e.metadata = buf;
        e.metadata_size = metadata.len();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match consumer.commit(&tpl, CommitMode::Sync) {
            Ok(()) => return,
            Err(e) if is_coordinator_moving(&e) && Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(100))
            }
            Err(e) => panic!("commit {topic}/{partition} for group {group}: {e}"),
        }
    }
}

/// The committed offset of `group` on `topic`/`partition` at the (plaintext) brokers at
/// `bootstrap`, and its metadata as the raw bytes the broker returned (rust-rdkafka's
/// `metadata()` panics when they are not UTF-8).
pub fn committed_raw_metadata_on(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partition: i32,
) -> (Option<i64>, Vec<u8>) {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group);
    let consumer: BaseConsumer = config.create().expect("create committed-offsets consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let got = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("committed offsets of group {group} on {topic}: {e}"));
    // SAFETY: one element, as asked; its metadata is `metadata_size` bytes (or null).
    let metadata = unsafe {
        let e = &*(*got.ptr()).elems;
        if e.metadata.is_null() {
            Vec::new()
        } else {
            std::slice::from_raw_parts(e.metadata.cast::<u8>(), e.metadata_size).to_vec()
        }
    };
    let offset = match got.elements()[0].offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    };
    (offset, metadata)
}

/// A process's peak resident memory (VmHWM of /proc/PID/status) in KiB.
pub fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in {status}"))
}

/// True for the errors a group's coordinator answers while it moves or loads.
pub fn is_coordinator_moving(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::CoordinatorLoadInProgress
                | RDKafkaErrorCode::CoordinatorNotAvailable
        )
    )
}

// ---------------------------------------------------------------------------------------------
// Running ackd
// ---------------------------------------------------------------------------------------------

/// Builds an `ackd` process (the real binary) against the test broker.
pub struct AckdBuilder {
    env: Vec<(String, Option<String>)>,
    args: Vec<String>,
}

impl AckdBuilder {
    pub fn new(topic: &str, group: &str) -> Self {
        Self::on(&broker().bootstrap(), topic, group)
    }

    /// Like [`AckdBuilder::new`], with `KAFKA_URL` = `bootstrap` (and the shared broker
    /// not started for it).
    pub fn on(bootstrap: &str, topic: &str, group: &str) -> Self {
        AckdBuilder {
            env: Vec::new(),
            args: Vec::new(),
        }
        .env("KAFKA_URL", bootstrap)
        .env("ACKD_TOPICS", topic)
        .env("ACKD_GROUP_ID", group)
        // A member that dies is replaced within a second (the broker allows it:
        // group.min.session.timeout.ms in broker.rs).
        .env("ACKD_RDKAFKA_SESSION_TIMEOUT_MS", "1000")
        .env("ACKD_RDKAFKA_HEARTBEAT_INTERVAL_MS", "300")
    }

    /// `ACKD_GROUP_PROTOCOL=consumer` (KIP-848): the broker sets the session timeout and
    /// heartbeat (broker.rs: 6 s, 500 ms), and librdkafka refuses the classic ones.
    pub fn consumer_protocol(self) -> Self {
        self.env("ACKD_GROUP_PROTOCOL", "consumer")
            .env_remove("ACKD_RDKAFKA_SESSION_TIMEOUT_MS")
            .env_remove("ACKD_RDKAFKA_HEARTBEAT_INTERVAL_MS")
    }

    /// Sets an environment variable (later values win).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), Some(value.into())));
        self
    }

    /// Removes an environment variable set earlier (e.g. a default).
    pub fn env_remove(mut self, key: impl Into<String>) -> Self {
        self.env.push((key.into(), None));
        self
    }

    /// Batches of at most `max` messages, with a wait long enough (2 s) that a backlog
    /// produced before the start fills them whole.
    pub fn batches(self, max: usize) -> Self {
        self.env("ACKD_BATCH_MAX_MESSAGES", max.to_string())
            .env("ACKD_BATCH_MAX_WAIT_MS", "2000")
    }

    /// Adds a command-line argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Whether `arg` is among the command-line arguments.
    pub fn has_arg(&self, arg: &str) -> bool {
        self.args.iter().any(|a| a == arg)
    }

    /// The environment the child gets (besides PATH and HOME).
    pub fn env_map(&self) -> BTreeMap<String, String> {
        let mut map = BTreeMap::new();
        for (k, v) in &self.env {
            match v {
                Some(v) => map.insert(k.clone(), v.clone()),
                None => map.remove(k),
            };
        }
        map
    }

    pub fn spawn(self) -> AckdProcess {
        let bin = env!("CARGO_BIN_EXE_ackd");
        let mut cmd = Command::new(bin);
        cmd.args(&self.args)
            .env_clear()
            .envs(passthrough_env())
            .envs(self.env_map())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = spawn_tied(cmd).unwrap_or_else(|e| panic!("spawn {bin}: {e}"));
        let output = Arc::new(Output::default());
        let echo = std::env::var_os("ACKD_TEST_ECHO").is_some();
        let pid = child.id();
        let readers = [
            reader(
                child.stdout.take().expect("stdout"),
                true,
                pid,
                echo,
                &output,
            ),
            reader(
                child.stderr.take().expect("stderr"),
                false,
                pid,
                echo,
                &output,
            ),
        ];
        AckdProcess {
            pid,
            started: Instant::now(),
            child: Mutex::new(child),
            status: Mutex::new(None),
            output,
            _readers: readers,
        }
    }
}

#[derive(Default)]
struct Output {
    lines: Mutex<Lines>,
    changed: Condvar,
}

#[derive(Default)]
struct Lines {
    all: Vec<String>,
    /// When each line of `all` arrived: orders lines across processes.
    arrived: Vec<Instant>,
    stdout: Vec<String>,
    closed: usize,
}

fn reader(
    stream: impl Read + Send + 'static,
    is_stdout: bool,
    pid: u32,
    echo: bool,
    output: &Arc<Output>,
) -> thread::JoinHandle<()> {
    let output = Arc::clone(output);
    thread::Builder::new()
        .name(format!(
            "ackd-{pid}-{}",
            if is_stdout { "stdout" } else { "stderr" }
        ))
        .spawn(move || {
            let mut r = BufReader::new(stream);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let line = String::from_utf8_lossy(&buf)
                            .trim_end_matches(['\n', '\r'])
                            .to_string();
                        if echo {
                            eprintln!("[ackd {pid}] {line}");
                        }
                        let mut l = output.lines.lock().unwrap_or_else(|e| e.into_inner());
                        if is_stdout {
                            l.stdout.push(line.clone());
                        }
                        l.all.push(line);
                        l.arrived.push(Instant::now());
                        output.changed.notify_all();
                    }
                }
            }
            let mut l = output.lines.lock().unwrap_or_else(|e| e.into_inner());
            l.closed += 1;
            output.changed.notify_all();
        })
        .expect("spawn ackd output reader")
}

/// A running `ackd`. Killed (SIGKILL) on drop if still running, and with the test process.
pub struct AckdProcess {
    pid: u32,
    started: Instant,
    child: Mutex<Child>,
    status: Mutex<Option<ExitStatus>>,
    output: Arc<Output>,
    _readers: [thread::JoinHandle<()>; 2],
}

impl AckdProcess {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// All output lines so far, stdout and stderr interleaved in arrival order.
    pub fn lines(&self) -> Vec<String> {
        self.lock_lines().all.clone()
    }

    /// All output lines so far with the time each arrived.
    pub fn timed_lines(&self) -> Vec<(Instant, String)> {
        let l = self.lock_lines();
        l.arrived
            .iter()
            .copied()
            .zip(l.all.iter().cloned())
            .collect()
    }

    /// Stdout lines so far.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.lock_lines().stdout.clone()
    }

    /// Number of lines so far (a cursor for [`AckdProcess::wait_for_line_from`]).
    pub fn line_count(&self) -> usize {
        self.lock_lines().all.len()
    }

    /// Waits for the first line matching `pred`; panics with all output after `timeout`,
    /// or as soon as ackd's output is closed without a match.
    #[track_caller]
    pub fn wait_for_line(&self, pred: impl Fn(&str) -> bool, timeout: Duration) -> String {
        self.wait_for_line_from(0, pred, timeout)
    }

    /// Like [`AckdProcess::wait_for_line`], looking only at lines with index >= `from`.
    #[track_caller]
    pub fn wait_for_line_from(
        &self,
        from: usize,
        pred: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> String {
        let mut found = self.wait_for_matches(from, &pred, 1, timeout, "a matching line");
        found.swap_remove(0)
    }

    /// Waits until `n` lines match `pred`; returns the first `n` matching lines.
    #[track_caller]
    pub fn wait_for_count(
        &self,
        pred: impl Fn(&str) -> bool,
        n: usize,
        timeout: Duration,
    ) -> Vec<String> {
        self.wait_for_matches(0, &pred, n, timeout, &format!("{n} matching lines"))
    }

    #[track_caller]
    fn wait_for_matches(
        &self,
        from: usize,
        pred: &dyn Fn(&str) -> bool,
        n: usize,
        timeout: Duration,
        what: &str,
    ) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut scanned = from;
        let mut found = Vec::new();
        let mut l = self.lock_lines();
        loop {
            while scanned < l.all.len() && found.len() < n {
                if pred(&l.all[scanned]) {
                    found.push(l.all[scanned].clone());
                }
                scanned += 1;
            }
            if found.len() >= n {
                return found;
            }
            let now = Instant::now();
            let reason = if l.closed >= 2 {
                Some("ackd's output closed (it exited)".to_string())
            } else if now >= deadline {
                Some(format!("timed out after {timeout:?}"))
            } else {
                None
            };
            if let Some(reason) = reason {
                let all = l.all.clone();
                drop(l);
                panic!(
                    "waiting for {what} (found {}): {reason}; ackd pid {} output ({} lines):\n{}",
                    found.len(),
                    self.pid,
                    all.len(),
                    all.join("\n")
                );
            }
            l = self
                .output
                .changed
                .wait_timeout(l, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sends `sig` unless the child has already been reaped.
    pub fn signal(&self, sig: libc::c_int) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        if status.is_none() {
            *status = child.try_wait().expect("try_wait on ackd");
        }
        if status.is_none() {
            // SAFETY: the child is not reaped (we hold its lock), so the pid is still ours.
            unsafe {
                libc::kill(self.pid as libc::pid_t, sig);
            }
        }
    }

    pub fn sigterm(&self) {
        self.signal(libc::SIGTERM);
    }

    pub fn sigkill(&self) {
        self.signal(libc::SIGKILL);
    }

    /// The exit code if ackd has exited (128+signo for a signal death).
    pub fn try_exit_code(&self) -> Option<i32> {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        if status.is_none() {
            *status = child.try_wait().expect("try_wait on ackd");
        }
        status.map(exit_code)
    }

    /// Waits for ackd to exit and for its output to be fully read; returns the exit code
    /// (128+signo for a signal death). On timeout kills it and panics with its output.
    #[track_caller]
    pub fn wait_exit(&self, timeout: Duration) -> i32 {
        let deadline = Instant::now() + timeout;
        let code = loop {
            if let Some(code) = self.try_exit_code() {
                break code;
            }
            if Instant::now() >= deadline {
                self.sigkill();
                let _ = self.child.lock().unwrap_or_else(|e| e.into_inner()).wait();
                panic!(
                    "ackd pid {} did not exit within {timeout:?} (killed it); output:\n{}",
                    self.pid,
                    self.lines().join("\n")
                );
            }
            thread::sleep(Duration::from_millis(10));
        };
        // Let the readers drain the pipes so that `lines()` is complete.
        let drain_deadline = Instant::now() + Duration::from_secs(5);
        let mut l = self.lock_lines();
        while l.closed < 2 {
            let now = Instant::now();
            if now >= drain_deadline {
                break;
            }
            l = self
                .output
                .changed
                .wait_timeout(l, drain_deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        code
    }

    /// Time since spawn.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    fn lock_lines(&self) -> std::sync::MutexGuard<'_, Lines> {
        self.output.lines.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => -1,
    }
}

impl Drop for AckdProcess {
    fn drop(&mut self) {
        if self.try_exit_code().is_none() {
            self.sigkill();
            let _ = self.child.lock().unwrap_or_else(|e| e.into_inner()).wait();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Assertion helpers
// ---------------------------------------------------------------------------------------------

/// Parses a logfmt line into (key, value) pairs: `k=v`, `k="quoted \"v\" \\"`, bare `k`
/// (value ""). Words without `=` (e.g. a level prefix) come out as bare keys.
pub fn logfmt(line: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return pairs;
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'=') {
            chars.next();
            if chars.peek() == Some(&'"') {
                chars.next();
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => match chars.next() {
                            Some('n') => value.push('\n'),
                            Some('t') => value.push('\t'),
                            Some('r') => value.push('\r'),
                            Some(q @ ('"' | '\\')) => value.push(q),
                            // Other escapes (\xNN, \u{..}) are kept as written.
                            Some(other) => {
                                value.push('\\');
                                value.push(other);
                            }
                            None => value.push('\\'),
                        },
                        c => value.push(c),
                    }
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() {
                        break;
                    }
                    value.push(c);
                    chars.next();
                }
            }
        }
        pairs.push((key, value));
    }
}

/// The value of `key` in a logfmt line (first occurrence), unquoted and unescaped.
pub fn field(line: &str, key: &str) -> Option<String> {
    logfmt(line)
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

/// The token that marks ackd's one-line-per-processed-message output.
pub const PROCESSED_TOKEN: &str = "count#ackd.messages.processed=1";

/// True for a per-message `count#ackd.messages.processed=1 ...` line.
pub fn is_processed(line: &str) -> bool {
    line.split_whitespace().any(|t| t == PROCESSED_TOKEN)
}

/// (partition, offset) of every per-message line, in output order.
pub fn processed(lines: &[String]) -> Vec<(i32, i64)> {
    lines
        .iter()
        .filter(|l| is_processed(l))
        .map(|l| {
            let p = field(l, "partition").and_then(|v| v.parse().ok());
            let o = field(l, "offset").and_then(|v| v.parse().ok());
            match (p, o) {
                (Some(p), Some(o)) => (p, o),
                _ => panic!("processed line without partition/offset: {l}"),
            }
        })
        .collect()
}

/// Counts per (partition, offset) of the processed lines: >1 means redelivered.
pub fn processed_counts(lines: &[String]) -> HashMap<(i32, i64), usize> {
    let mut counts = HashMap::new();
    for po in processed(lines) {
        *counts.entry(po).or_insert(0) += 1;
    }
    counts
}

/// Polls `cond` every 10 ms until it is true; panics (at the caller) after `timeout`.
#[track_caller]
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("condition not met within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------------------------
// Accounting across runs: lost, duplicated, refused commits
// ---------------------------------------------------------------------------------------------

/// True if the line's `at=` is `what`.
pub fn at(line: &str, what: &str) -> bool {
    field(line, "at").as_deref() == Some(what)
}

/// Partition -> highest offset whose commit a member logged as refused (`at=commit_failed`).
pub fn refused_commits(lines: &[String]) -> HashMap<i32, i64> {
    let mut refused = HashMap::new();
    for l in lines.iter().filter(|l| at(l, "commit_failed")) {
        if let (Some(p), Some(o)) = (field(l, "partition"), field(l, "offset")) {
            let (p, o): (i32, i64) = (p.parse().unwrap(), o.parse().unwrap());
            let e = refused.entry(p).or_insert(o);
            *e = (*e).max(o);
        }
    }
    refused
}

/// The refused commits (`at=commit_failed`) of `lines`, split in two: those Kafka refuses
/// by design while a classic-protocol group rebalances, and all others.
///
/// The first kind: a periodic commit that races a classic rebalance (JoinGroup/SyncGroup)
/// is refused with REBALANCE_IN_PROGRESS while the group completes the rebalance, or
/// ILLEGAL_GENERATION once it formed a generation this member has not joined yet (Kafka's
/// group coordinator, `ClassicGroup.validateOffsetCommit`; the Java client calls both
/// retriable: finish the rebalance, then commit again). With cooperative-sticky the
/// partitions that stay keep their periodic commits during a rebalance, so they meet it;
/// the next commit carries the same offsets, so nothing is redelivered. Under the
/// consumer protocol (KIP-848) there is no such group-wide barrier: none is expected.
pub fn split_refusals(lines: &[String], classic: bool) -> (Vec<String>, Vec<String>) {
    lines
        .iter()
        .filter(|l| at(l, "commit_failed"))
        .cloned()
        .partition(|l| {
            classic
                && field(l, "reason").as_deref() == Some("periodic")
                && field(l, "error").is_some_and(|e| {
                    e.contains("IllegalGeneration") || e.contains("RebalanceInProgress")
                })
        })
}

/// What a set of runs did with the delivered messages.
#[derive(Debug)]
pub struct Tally {
    /// Delivered, processed by no run.
    pub lost: Vec<(i32, i64)>,
    /// Processed more than once.
    pub duplicated: Vec<(i32, i64)>,
    /// Duplicated with no refused commit (for that partition, past that offset) logged:
    /// what a broker fault (tests/cluster.rs) cannot explain. Graceful handoffs allow no
    /// duplicate at all (tests/membership.rs, tests/rebalance.rs).
    pub unexplained: Vec<(i32, i64)>,
    /// Refused commits `lines` logged (see [`refused_commits`]).
    pub refused: HashMap<i32, i64>,
}

/// Compares `processed` (all runs) with `delivered`, and explains duplicates by `lines`'
/// refused commits.
pub fn tally(delivered: &[Delivered], processed: &[(i32, i64)], lines: &[String]) -> Tally {
    let expected: std::collections::BTreeSet<(i32, i64)> =
        delivered.iter().map(|d| (d.partition, d.offset)).collect();
    let mut counts: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for m in processed {
        *counts.entry(*m).or_default() += 1;
    }
    let lost = expected
        .iter()
        .filter(|m| !counts.contains_key(m))
        .copied()
        .collect();
    let duplicated: Vec<_> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(m, _)| *m)
        .collect();
    let refused = refused_commits(lines);
    let unexplained = duplicated
        .iter()
        .filter(|(p, o)| refused.get(p).is_none_or(|r| o >= r))
        .copied()
        .collect();
    Tally {
        lost,
        duplicated,
        unexplained,
        refused,
    }
}

/// Every resume point (`at=assigned from=committed`) is an offset some member released the
/// partition at (`at=revoked` or `at=final_commit`), never an older periodic commit. On a
/// partition with a refused commit the release may not have reached the broker, so there
/// the resume point must be an offset some member released it at or had accepted
/// (`at=committed`): never one no member committed. Returns how many resumes were checked.
#[track_caller]
pub fn assert_resumes_where_released(lines: &[String], refused: &HashMap<i32, i64>) -> usize {
    let offsets_at = |what: &[&str]| {
        let mut by_partition: HashMap<String, std::collections::BTreeSet<String>> = HashMap::new();
        for l in lines.iter().filter(|l| what.iter().any(|w| at(l, w))) {
            if let (Some(p), Some(o)) = (field(l, "partition"), field(l, "offset")) {
                by_partition.entry(p).or_default().insert(o);
            }
        }
        by_partition
    };
    let released = offsets_at(&["revoked", "final_commit"]);
    let accepted = offsets_at(&["revoked", "final_commit", "committed"]);
    let mut resumes = 0;
    for l in lines
        .iter()
        .filter(|l| at(l, "assigned") && field(l, "from").as_deref() == Some("committed"))
    {
        let (p, o) = (field(l, "partition").unwrap(), field(l, "offset").unwrap());
        let allowed = if refused.contains_key(&p.parse().unwrap()) {
            &accepted
        } else {
            &released
        };
        let ok = allowed.get(&p).is_some_and(|r| r.contains(&o));
        assert!(
            ok,
            "{l}: resumed where no member released it (released or accepted: {:?})",
            allowed.get(&p)
        );
        resumes += 1;
    }
    resumes
}

/// A producer thread that sends `batch` keyed messages every `every` until finished.
pub struct SteadyProducer {
    stop: Arc<std::sync::atomic::AtomicBool>,
    delivered: Arc<Mutex<Vec<Delivered>>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl SteadyProducer {
    pub fn start(topic: &str, batch: usize, every: Duration) -> SteadyProducer {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let delivered = Arc::new(Mutex::new(Vec::new()));
        let (topic, s, d) = (topic.to_string(), stop.clone(), delivered.clone());
        let thread = thread::Builder::new()
            .name("steady-producer".into())
            .spawn(move || {
                let mut next = 0;
                while !s.load(Ordering::Acquire) {
                    let got = produce_keyed(&topic, batch, next);
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

/// A daemon stopped by an authentication failure stopped at it: no 10 s topic check
/// waited out first (`at=topics_unchecked`), no outage line after it (the failure is the
/// cause, not an outage), and an exit well under that wait (a loose guard: the lines are
/// the check).
pub fn assert_stopped_at_the_auth_failure(lines: &[String]) {
    let all = lines.join("\n");
    assert!(!lines.iter().any(|l| at(l, "topics_unchecked")), "{all}");
    let failed = lines
        .iter()
        .position(|l| at(l, "auth_failed"))
        .unwrap_or_else(|| panic!("no at=auth_failed line:\n{all}"));
    assert!(
        !lines[failed..].iter().any(|l| at(l, "brokers_unreachable")),
        "an outage line after the authentication failure:\n{all}"
    );
    let exit = lines
        .iter()
        .find(|l| at(l, "exit"))
        .unwrap_or_else(|| panic!("no at=exit line:\n{all}"));
    let took: u64 = field(exit, "duration_ms")
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("no duration_ms: {exit}"));
    assert!(took < 8000, "{exit}\n{all}");
}
