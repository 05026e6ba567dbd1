//! Produces demo messages with keys `k-<i>` and values `message <i>`.
//!
//! ```text
//! cargo run --example produce -- --brokers 127.0.0.1:9092 --topic demo --count 100 [--start 0] [--keys K] [--value-bytes 100]
//! ```
//!
//! `--keys K` cycles through K distinct keys instead (`k-<i mod K>`: message i has key
//! `k-<i mod K>`, so each key's messages are in offset order on one partition).
//! `--value-bytes B` pads each value with `.` to B bytes (the benchmark's ~100-byte messages).
//! `--batch-bytes B` sets the producer's `batch.size` (librdkafka's default is 1000000;
//! the Java client's is 16384): a consumer fetches whole record batches. `--timeout-ms T`:
//! how long a delivery may take (default 10000). `--rate R`: at most R messages a second,
//! evenly (every 10 ms), for a steady load instead of a backlog. `--partitions P`: create
//! the topic with P partitions (replication 1) first, unless it exists (a broker creates
//! topics on first use with its own `num.partitions`).
//!
//! Prints one logfmt line per partition once every delivery is confirmed:
//! `at=produced topic=demo partition=P first_offset=A last_offset=B count=N`.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;

const USAGE: &str =
    "usage: produce --brokers HOST:PORT --topic TOPIC --count N [--start I] [--keys K] [--value-bytes B] [--batch-bytes B] [--timeout-ms T] [--rate R] [--partitions P]";

struct Args {
    brokers: String,
    topic: String,
    count: u64,
    start: u64,
    keys: Option<u64>,
    value_bytes: usize,
    batch_bytes: Option<usize>,
    timeout_ms: u64,
    /// Messages a second at most (`None`: as fast as the producer takes them).
    rate: Option<u64>,
    /// Create the topic with this many partitions first.
    partitions: Option<i32>,
}

fn parse_args() -> Result<Args, String> {
    let mut brokers = None;
    let mut topic = None;
    let mut count = None;
    let mut start = 0;
    let mut keys = None;
    let mut value_bytes = 0;
    let mut batch_bytes = None;
    let mut timeout_ms = 10_000;
    let mut rate = None;
    let mut partitions = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        if name == "-h" || name == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match name.as_str() {
            "--brokers" => brokers = Some(value()?),
            "--topic" => topic = Some(value()?),
            "--count" => {
                let v = value()?;
                count = Some(
                    v.parse()
                        .map_err(|_| format!("--count: not a number: {v}"))?,
                );
            }
            "--start" => {
                let v = value()?;
                start = v
                    .parse()
                    .map_err(|_| format!("--start: not a number: {v}"))?;
            }
            "--keys" => {
                let v = value()?;
                keys = Some(
                    v.parse()
                        .ok()
                        .filter(|k| *k > 0)
                        .ok_or_else(|| format!("--keys: not a number above 0: {v}"))?,
                );
            }
            "--value-bytes" => {
                let v = value()?;
                value_bytes = v
                    .parse()
                    .map_err(|_| format!("--value-bytes: not a number: {v}"))?;
            }
            "--batch-bytes" => {
                let v = value()?;
                batch_bytes = Some(
                    v.parse()
                        .map_err(|_| format!("--batch-bytes: not a number: {v}"))?,
                );
            }
            "--timeout-ms" => {
                let v = value()?;
                timeout_ms = v
                    .parse()
                    .map_err(|_| format!("--timeout-ms: not a number: {v}"))?;
            }
            "--rate" => {
                let v = value()?;
                rate = Some(
                    v.parse()
                        .ok()
                        .filter(|&r: &u64| r > 0)
                        .ok_or_else(|| format!("--rate: not a number above 0: {v}"))?,
                );
            }
            "--partitions" => {
                let v = value()?;
                partitions = Some(
                    v.parse()
                        .ok()
                        .filter(|&p: &i32| p > 0)
                        .ok_or_else(|| format!("--partitions: not a number above 0: {v}"))?,
                );
            }
            other => return Err(format!("unknown argument: {other}")),
        }
    }
    Ok(Args {
        brokers: brokers.ok_or("--brokers is required")?,
        topic: topic.ok_or("--topic is required")?,
        count: count.ok_or("--count is required")?,
        start,
        keys,
        value_bytes,
        batch_bytes,
        timeout_ms,
        rate,
        partitions,
    })
}

/// Creates the topic with `partitions` partitions; one that exists already is left as it is.
fn create_topic(args: &Args, partitions: i32) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .create()
        .map_err(|e| format!("create admin client: {e}"))?;
    let topic = NewTopic::new(&args.topic, partitions, TopicReplication::Fixed(1));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = futures::executor::block_on(admin.create_topics([&topic], &opts))
        .map_err(|e| format!("create topic {}: {e}", args.topic))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => return Err(format!("create topic {t} ({partitions} partitions): {e}")),
        }
    }
    // A new topic's partitions get their leaders one by one (seconds for a thousand):
    // messages sent before would wait for them within the delivery timeout.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = admin
            .inner()
            .fetch_metadata(Some(&args.topic), Duration::from_secs(5))
            .is_ok_and(|md| {
                md.topics().iter().any(|t| {
                    t.error().is_none()
                        && !t.partitions().is_empty()
                        && t.partitions().iter().all(|p| p.leader() >= 0)
                })
            });
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{}: partitions without a leader after 60 s",
                args.topic
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn run(args: &Args) -> Result<BTreeMap<i32, (i64, i64, u64)>, String> {
    if let Some(p) = args.partitions {
        create_topic(args, p)?;
    }
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &args.brokers)
        .set("acks", "all")
        .set("linger.ms", "5")
        // Fail (rather than hang) when the broker is unreachable.
        .set("message.timeout.ms", args.timeout_ms.to_string());
    if let Some(b) = args.batch_bytes {
        config.set("batch.size", b.to_string());
    }
    let producer: FutureProducer = config
        .create()
        .map_err(|e| format!("create producer: {e}"))?;

    let mut pending = Vec::new();
    let started = Instant::now();
    for i in args.start..args.start + args.count {
        if let Some(rate) = args.rate {
            keep_to_rate(started, i - args.start, rate);
        }
        let key = format!("k-{}", args.keys.map_or(i, |k| i % k));
        let mut value = format!("message {i}");
        if value.len() < args.value_bytes {
            value.push(' ');
            value.extend(std::iter::repeat_n('.', args.value_bytes - value.len()));
        }
        let mut record = FutureRecord::to(&args.topic).key(&key).payload(&value);
        loop {
            match producer.send_result(record) {
                Ok(f) => break pending.push(f),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => return Err(format!("enqueue message {i}: {e}")),
            }
        }
    }

    // partition -> (first offset, last offset, count)
    let mut partitions: BTreeMap<i32, (i64, i64, u64)> = BTreeMap::new();
    for f in pending {
        match futures::executor::block_on(f) {
            Ok(Ok(d)) => {
                let e = partitions
                    .entry(d.partition)
                    .or_insert((d.offset, d.offset, 0));
                e.0 = e.0.min(d.offset);
                e.1 = e.1.max(d.offset);
                e.2 += 1;
            }
            Ok(Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut), _))) => {
                return Err(format!(
                    "no delivery to {} within {} ms: is a broker reachable at {}?",
                    args.topic, args.timeout_ms, args.brokers
                ))
            }
            Ok(Err((e, _))) => {
                return Err(format!(
                    "delivery to {} at {} failed: {e}",
                    args.topic, args.brokers
                ))
            }
            Err(_) => return Err("delivery report lost".to_string()),
        }
    }
    producer
        .flush(Duration::from_secs(10))
        .map_err(|e| format!("flush: {e}"))?;
    Ok(partitions)
}

/// Every 10 ms worth of messages at `rate` a second, waits until the `sent`th is due.
fn keep_to_rate(started: Instant, sent: u64, rate: u64) {
    let step = (rate / 100).max(1);
    if sent.is_multiple_of(step) {
        let due = started + Duration::from_secs_f64(sent as f64 / rate as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
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
        Ok(partitions) => {
            for (p, (first, last, count)) in partitions {
                println!(
                    "at=produced topic={} partition={p} first_offset={first} last_offset={last} count={count}",
                    args.topic
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
