//! The baseline of `scripts/bench`: the consumer a user would write instead of running
//! ackd. A bare rdkafka group consumer: subscribe, read every assigned partition to its
//! end (partition EOF), store each message's offset, commit once, leave.
//!
//! ```text
//! bare_consumer --brokers 127.0.0.1:9092 --topic bench --group g1 [--print] [--batch N] [--session-timeout-ms 1000]
//! ```
//!
//! It uses the librdkafka properties ackd uses by default for a run to the end (the
//! `[rdkafka]` table of `config/default.toml`, as ackd's settings give it with
//! `ACKD_STOP_AT_END`), so that the benchmark compares the code around librdkafka, not
//! its settings. With
//! `--print` it writes the line ackd's `log` processor writes, one per message, to a
//! buffered stdout, as ackd writes it for a group with nothing committed (the bench's
//! fresh groups), where every message may be a repeat:
//! `count#ackd.messages.processed=1 source=T topic=T partition=P offset=O key=K redelivered=true`.
//!
//! With `--batch N` it reads the way librdkafka reads fastest
//! (`rd_kafka_consume_batch_queue` on the consumer's queue, up to N messages a call) and
//! stores each partition's last offset once per call: the floor of what a consumer of
//! librdkafka can do. It polls one message at a time until the first message (the
//! rebalance that assigns the partitions is served by that poll), then reads in batches:
//! a later rebalance, which the bench's one-member groups never see before the end,
//! would not be served (librdkafka's fallback unassigns everything).
//!
//! At the end it writes one line on stderr:
//! `at=bench_phases messages=N join_ms=J consume_ms=C commit_ms=K` (J: from the start
//! to the first message (Tansu pads it by session.timeout.ms/2); C: first message to
//! the last partition's end).

use std::collections::BTreeSet;
use std::ffi::CStr;
use std::io::{BufWriter, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdkafka::bindings as rdsys;
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::Message;

const USAGE: &str = "usage: bare_consumer --brokers HOST:PORT --topic TOPIC --group GROUP \
                     [--print] [--batch N] [--session-timeout-ms MS] [--timeout-s S] [--set PROPERTY=VALUE]...";

struct Args {
    brokers: String,
    topic: String,
    group: String,
    print: bool,
    /// `--batch N`: up to N messages per call into librdkafka (0: one `poll` per message).
    batch: usize,
    session_timeout_ms: u64,
    timeout: Duration,
    /// `--set PROPERTY=VALUE`: more librdkafka properties (they win), for experiments.
    extra: Vec<(String, String)>,
}

fn parse_args() -> Result<Args, String> {
    let mut brokers = None;
    let mut topic = None;
    let mut group = None;
    let mut print = false;
    let mut batch = 0;
    let mut session_timeout_ms = 1000;
    let mut timeout_s = 600;
    let mut extra = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--brokers" => brokers = Some(value()?),
            "--topic" => topic = Some(value()?),
            "--group" => group = Some(value()?),
            "--print" => print = true,
            "--batch" => {
                let v = value()?;
                batch = v.parse().map_err(|_| format!("not a number: {v}"))?;
            }
            "--session-timeout-ms" => {
                let v = value()?;
                session_timeout_ms = v.parse().map_err(|_| format!("not a number: {v}"))?;
            }
            "--timeout-s" => {
                let v = value()?;
                timeout_s = v.parse().map_err(|_| format!("not a number: {v}"))?;
            }
            "--set" => {
                let v = value()?;
                let (k, v) = v
                    .split_once('=')
                    .ok_or_else(|| format!("--set: expected PROPERTY=VALUE, got {v}"))?;
                extra.push((k.to_string(), v.to_string()));
            }
            other => return Err(format!("unknown argument: {other}")),
        }
    }
    Ok(Args {
        brokers: brokers.ok_or("--brokers is required")?,
        topic: topic.ok_or("--topic is required")?,
        group: group.ok_or("--group is required")?,
        print,
        batch,
        session_timeout_ms,
        timeout: Duration::from_secs(timeout_s),
        extra,
    })
}

/// The librdkafka properties ackd runs with by default when it reads to the end
/// (`ACKD_STOP_AT_END`, as this consumer does): ackd's own settings decide them.
fn ackd_rdkafka(args: &Args) -> Result<Vec<(String, String)>, String> {
    let vars = [
        ("KAFKA_URL", args.brokers.as_str()),
        ("ACKD_TOPICS", args.topic.as_str()),
        ("ACKD_GROUP_ID", args.group.as_str()),
        ("ACKD_STOP_AT_END", "true"),
    ];
    let settings = ackd::Settings::from_vars(vars.map(|(k, v)| (k.to_string(), v.to_string())))
        .map_err(|e| format!("ackd's settings: {e}"))?;
    Ok(settings
        .rdkafka
        .into_iter()
        .map(|(property, pass)| (property, pass.value))
        .collect())
}

/// librdkafka's own logs (and its `debug` output, with `--set debug=...`) on stderr.
struct Stderr;

impl ClientContext for Stderr {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        eprintln!("at=librdkafka level={level:?} facility={fac} msg={log_message:?}");
    }
}

impl ConsumerContext for Stderr {}

/// What the reading loop keeps: the messages read, the partitions at their end, the
/// per-message line's output.
struct Reading<W: Write> {
    out: W,
    print: bool,
    key: String,
    at_end: BTreeSet<i32>,
    messages: u64,
    first_message: Option<Instant>,
}

impl<W: Write> Reading<W> {
    /// One message: its line with `--print`, counted.
    fn message(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        key: Option<&[u8]>,
    ) -> Result<(), String> {
        self.first_message.get_or_insert_with(Instant::now);
        self.at_end.remove(&partition);
        if self.print {
            self.key.clear();
            if let Some(k) = key {
                self.key.push_str(" key=");
                ackd::logfmt::write_bytes(&mut self.key, k);
            }
            writeln!(
                self.out,
                "count#ackd.messages.processed=1 source={topic} topic={topic} partition={partition} offset={offset}{} redelivered=true",
                self.key,
            )
            .map_err(|e| format!("write: {e}"))?;
        }
        self.messages += 1;
        Ok(())
    }

    /// A partition's end: true once every assigned partition is at its end.
    fn end(&mut self, partition: i32, consumer: &BaseConsumer<Stderr>) -> Result<bool, String> {
        self.at_end.insert(partition);
        let assigned = consumer
            .assignment()
            .map_err(|e| format!("assignment: {e}"))?
            .count();
        Ok(assigned > 0 && self.at_end.len() >= assigned)
    }
}

fn run(args: &Args) -> Result<(), String> {
    let started = Instant::now();
    let consumer = create(args)?;
    consumer
        .subscribe(&[&args.topic])
        .map_err(|e| format!("subscribe: {e}"))?;

    let stdout = std::io::stdout();
    let mut reading = Reading {
        out: BufWriter::with_capacity(64 * 1024, stdout.lock()),
        print: args.print,
        key: String::new(),
        at_end: BTreeSet::new(),
        messages: 0,
        first_message: None,
    };
    let deadline = started + args.timeout;
    let mut done = false;
    while !done && (args.batch == 0 || reading.first_message.is_none()) {
        if Instant::now() >= deadline {
            return Err(timed_out(args, reading.messages));
        }
        done = poll_one(&consumer, &mut reading)?;
    }
    if !done {
        read_batches(&consumer, args, &mut reading, deadline)?;
    }
    let consumed = Instant::now();
    reading.out.flush().map_err(|e| format!("flush: {e}"))?;
    drop(reading.out);
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) | Err(KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => return Err(format!("commit: {e}")),
    }
    let committed = Instant::now();
    // Close: leaves the group, as ackd does.
    drop(consumer);
    let first = reading.first_message.unwrap_or(consumed);
    eprintln!(
        "at=bench_phases messages={} join_ms={} consume_ms={} commit_ms={} close_ms={}",
        reading.messages,
        first.duration_since(started).as_millis(),
        consumed.duration_since(first).as_millis(),
        committed.duration_since(consumed).as_millis(),
        committed.elapsed().as_millis(),
    );
    Ok(())
}

fn timed_out(args: &Args, messages: u64) -> String {
    format!(
        "not at the end of every partition after {:?} ({messages} messages)",
        args.timeout
    )
}

fn create(args: &Args) -> Result<BaseConsumer<Stderr>, String> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &args.brokers)
        .set("group.id", &args.group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("session.timeout.ms", args.session_timeout_ms.to_string())
        .set(
            "heartbeat.interval.ms",
            (args.session_timeout_ms / 3).max(1).to_string(),
        )
        .set("client.id", "bare");
    // ackd's defaults: the same fetching (and assignor) for both.
    for (k, v) in ackd_rdkafka(args)? {
        if k != "client.id" {
            config.set(k, v);
        }
    }
    for (k, v) in &args.extra {
        config.set(k, v);
        if k == "debug" {
            config.set_log_level(RDKafkaLogLevel::Debug);
        }
    }
    config
        .create_with_context(Stderr)
        .map_err(|e| format!("create consumer: {e}"))
}

/// One `poll`: a message (its offset stored), a partition's end, or nothing. True once
/// every assigned partition is at its end.
fn poll_one<W: Write>(
    consumer: &BaseConsumer<Stderr>,
    reading: &mut Reading<W>,
) -> Result<bool, String> {
    match consumer.poll(Duration::from_millis(100)) {
        None => {}
        Some(Ok(m)) => {
            reading.message(m.topic(), m.partition(), m.offset(), m.key())?;
            consumer
                .store_offset_from_message(&m)
                .map_err(|e| format!("store offset: {e}"))?;
        }
        Some(Err(KafkaError::PartitionEOF(p))) => return reading.end(p, consumer),
        Some(Err(e)) => eprintln!("level=warn at=kafka_error error=\"{e}\""),
    }
    Ok(false)
}

/// Reads the consumer's queue up to `--batch` messages a call until every assigned
/// partition is at its end; each call's last message of each partition has its offset
/// stored.
fn read_batches<W: Write>(
    consumer: &BaseConsumer<Stderr>,
    args: &Args,
    reading: &mut Reading<W>,
    deadline: Instant,
) -> Result<(), String> {
    // SAFETY: a live consumer; the handle is released below, before the consumer goes.
    let queue = unsafe { rdsys::rd_kafka_queue_get_consumer(consumer.client().native_ptr()) };
    if queue.is_null() {
        return Err("no consumer queue".into());
    }
    let mut taken: Vec<*mut rdsys::rd_kafka_message_t> = Vec::with_capacity(args.batch);
    let mut last: Vec<*mut rdsys::rd_kafka_message_t> = Vec::new();
    let mut topic = (std::ptr::null_mut(), String::new());
    let result = loop {
        if Instant::now() >= deadline {
            break Err(timed_out(args, reading.messages));
        }
        // SAFETY: a live queue, and room for `batch` pointers.
        let n = unsafe {
            rdsys::rd_kafka_consume_batch_queue(queue, 100, taken.as_mut_ptr(), args.batch)
        };
        // SAFETY: librdkafka wrote `n` message pointers, now ours.
        unsafe { taken.set_len(usize::try_from(n).unwrap_or(0).min(args.batch)) };
        match read_batch(consumer, &taken, &mut last, &mut topic, reading) {
            Ok(false) => {}
            done => break done.map(|_| ()),
        }
        for &m in &taken {
            // SAFETY: each taken message destroyed once, after its offset was stored.
            unsafe { rdsys::rd_kafka_message_destroy(m) };
        }
        taken.clear();
    };
    for &m in &taken {
        // SAFETY: as above: the messages of the last call.
        unsafe { rdsys::rd_kafka_message_destroy(m) };
    }
    // SAFETY: the handle from rd_kafka_queue_get_consumer, released once.
    unsafe { rdsys::rd_kafka_queue_destroy(queue) };
    result
}

/// One call's messages: each read, each partition's last one's offset stored. True once
/// every assigned partition is at its end.
fn read_batch<W: Write>(
    consumer: &BaseConsumer<Stderr>,
    taken: &[*mut rdsys::rd_kafka_message_t],
    last: &mut Vec<*mut rdsys::rd_kafka_message_t>,
    topic: &mut (*mut rdsys::rd_kafka_topic_t, String),
    reading: &mut Reading<W>,
) -> Result<bool, String> {
    let mut done = false;
    last.clear();
    for &ptr in taken {
        // SAFETY: a live message of this call.
        let m = unsafe { &*ptr };
        match m.err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR => {
                let key = (!m.key.is_null())
                    // SAFETY: key_len bytes at key, alive with the message.
                    .then(|| unsafe { std::slice::from_raw_parts(m.key as *const u8, m.key_len) });
                // The topic's name only for the line, read once per topic handle.
                if reading.print && topic.0 != m.rkt {
                    // SAFETY: a message's topic handle and its NUL-terminated name.
                    let name = unsafe { CStr::from_ptr(rdsys::rd_kafka_topic_name(m.rkt)) };
                    *topic = (m.rkt, name.to_string_lossy().into_owned());
                }
                reading.message(&topic.1, m.partition, m.offset, key)?;
                match last
                    .iter_mut()
                    .find(|l| unsafe { (***l).partition } == m.partition)
                {
                    Some(l) => *l = ptr,
                    None => last.push(ptr),
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__PARTITION_EOF => {
                done = reading.end(m.partition, consumer)?;
            }
            err => eprintln!("level=warn at=kafka_error error=\"{err:?}\""),
        }
    }
    for &ptr in last.iter() {
        // SAFETY: a live message; stores its offset + 1, as store_offset_from_message.
        let err = unsafe { rdsys::rd_kafka_offset_store_message(ptr) };
        if !err.is_null() {
            // SAFETY: an error librdkafka handed over: ours to destroy.
            unsafe { rdsys::rd_kafka_error_destroy(err) };
            return Err("store offset failed".into());
        }
    }
    Ok(done)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
