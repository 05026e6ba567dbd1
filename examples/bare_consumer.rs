//! The baseline of `scripts/bench`: the consumer a user would write instead of running
//! ackd. A bare rdkafka group consumer: subscribe, read every assigned partition to its
//! end (partition EOF), store each message's offset, commit once, leave.
//!
//! ```text
//! bare_consumer --brokers 127.0.0.1:9092 --topic bench --group g1 [--print] [--session-timeout-ms 1000]
//! ```
//!
//! It uses the librdkafka properties ackd uses by default (the `[rdkafka]` table of
//! `config/default.toml`, read at build time), so that the benchmark compares the code
//! around librdkafka, not its settings. With
//! `--print` it writes the line ackd's `log` processor writes, one per message, to a
//! buffered stdout, as ackd writes it for a group with nothing committed (the bench's
//! fresh groups), where every message may be a repeat:
//! `count#ackd.messages.processed=1 source=T topic=T partition=P offset=O key=K redelivered=true`.
//!
//! At the end it writes one line on stderr:
//! `at=bench_phases messages=N join_ms=J consume_ms=C commit_ms=K` (J: from the start
//! to the first message (Tansu pads it by session.timeout.ms/2); C: first message to
//! the last partition's end).

use std::collections::BTreeSet;
use std::io::{BufWriter, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::Message;

const USAGE: &str = "usage: bare_consumer --brokers HOST:PORT --topic TOPIC --group GROUP \
                     [--print] [--session-timeout-ms MS] [--timeout-s S] [--set PROPERTY=VALUE]...";

struct Args {
    brokers: String,
    topic: String,
    group: String,
    print: bool,
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
        session_timeout_ms,
        timeout: Duration::from_secs(timeout_s),
        extra,
    })
}

/// The `[rdkafka]` table of ackd's compiled-in defaults.
fn ackd_rdkafka_defaults() -> Result<Vec<(String, String)>, String> {
    use config::{Config, File, FileFormat};
    let defaults = Config::builder()
        .add_source(File::from_str(
            include_str!("../config/default.toml"),
            FileFormat::Toml,
        ))
        .build()
        .map_err(|e| format!("config/default.toml: {e}"))?;
    let table = defaults
        .get_table("rdkafka")
        .map_err(|e| format!("config/default.toml [rdkafka]: {e}"))?;
    table
        .into_iter()
        .map(|(k, v)| {
            let v = v
                .into_string()
                .map_err(|e| format!("config/default.toml [rdkafka] {k}: {e}"))?;
            Ok((k, v))
        })
        .collect()
}

/// librdkafka's own logs (and its `debug` output, with `--set debug=...`) on stderr.
struct Stderr;

impl ClientContext for Stderr {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        eprintln!("at=librdkafka level={level:?} facility={fac} msg={log_message:?}");
    }
}

impl ConsumerContext for Stderr {}

fn run(args: &Args) -> Result<(), String> {
    let started = Instant::now();
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
    for (k, v) in ackd_rdkafka_defaults()? {
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
    let consumer: BaseConsumer<Stderr> = config
        .create_with_context(Stderr)
        .map_err(|e| format!("create consumer: {e}"))?;
    consumer
        .subscribe(&[&args.topic])
        .map_err(|e| format!("subscribe: {e}"))?;

    let stdout = std::io::stdout();
    let mut out = BufWriter::with_capacity(64 * 1024, stdout.lock());
    let mut key = String::new();
    let mut at_end: BTreeSet<i32> = BTreeSet::new();
    let mut messages: u64 = 0;
    let mut first_message: Option<Instant> = None;
    let deadline = started + args.timeout;
    loop {
        if Instant::now() >= deadline {
            return Err(format!(
                "not at the end of every partition after {:?} ({messages} messages)",
                args.timeout
            ));
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Ok(m)) => {
                first_message.get_or_insert_with(Instant::now);
                at_end.remove(&m.partition());
                if args.print {
                    key.clear();
                    if let Some(k) = m.key() {
                        key.push_str(" key=");
                        ackd::logfmt::write_bytes(&mut key, k);
                    }
                    writeln!(
                        out,
                        "count#ackd.messages.processed=1 source={t} topic={t} partition={} offset={}{key} redelivered=true",
                        m.partition(),
                        m.offset(),
                        t = m.topic(),
                    )
                    .map_err(|e| format!("write: {e}"))?;
                }
                consumer
                    .store_offset_from_message(&m)
                    .map_err(|e| format!("store offset: {e}"))?;
                messages += 1;
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
                let assigned = consumer
                    .assignment()
                    .map_err(|e| format!("assignment: {e}"))?
                    .count();
                if assigned > 0 && at_end.len() >= assigned {
                    break;
                }
            }
            Some(Err(e)) => eprintln!("level=warn at=kafka_error error=\"{e}\""),
        }
    }
    let consumed = Instant::now();
    out.flush().map_err(|e| format!("flush: {e}"))?;
    drop(out);
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) | Err(KafkaError::ConsumerCommit(rdkafka::types::RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => return Err(format!("commit: {e}")),
    }
    let committed = Instant::now();
    // Close: leaves the group, as ackd does.
    drop(consumer);
    let first = first_message.unwrap_or(consumed);
    eprintln!(
        "at=bench_phases messages={messages} join_ms={} consume_ms={} commit_ms={} close_ms={}",
        first.duration_since(started).as_millis(),
        consumed.duration_since(first).as_millis(),
        committed.duration_since(consumed).as_millis(),
        committed.elapsed().as_millis(),
    );
    Ok(())
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
