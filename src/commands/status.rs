//! `ackd status`: where the group is, per partition of the configured topics: the
//! committed offset, the log end (high watermark), the lag between them, how old the
//! first message not committed is (read at the committed offset), and the member
//! holding the partition (from the group's description). What `kafka-consumer-groups
//! --describe` shows, in ackd's vocabulary: logfmt lines (`at=status ...`, then one
//! `at=status_total`) when stdout is no terminal, a table when it is. Never joins the
//! group, never commits.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Instant;

use rdkafka::consumer::Consumer;
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::consumer::handover::{committed_with_metadata, ReadMetadata};
use crate::exit;
use crate::settings::{Settings, StartFrom};

use super::connect::{connect, create, partitions, Probe, TopicPartitions, Unreached, REQUEST};
use super::describe::{describe_group, GroupDescription};

/// One partition's line.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub topic: String,
    pub partition: i32,
    /// The group's committed offset (the next to read); `None`: never committed.
    pub committed: Option<i64>,
    /// The log end: the offset the next produced message gets.
    pub end: i64,
    /// Messages the group has yet to process: end - committed; without a commit, what
    /// ackd would read under ACKD_START_FROM (earliest: the whole retained log, latest: 0).
    pub lag: i64,
    /// The lag in seconds: how old (this host's clock minus its timestamp) the first
    /// message not committed is, 0 without lag; `None` when it could not be read.
    pub lag_seconds: Option<f64>,
    /// `p=H` of the last commit's metadata (`ackd/3:o=O;p=H;l=L;…`, beside its own
    /// offset): the highest offset the committing process had processed.
    pub processed: Option<i64>,
    /// `l=L` of that metadata: the highest offset the committing process may start
    /// before its next commit (src/consumer/worker/shared.rs).
    pub dispatch_limit: Option<i64>,
    /// How many offsets above the committed one that metadata names as acknowledged
    /// (`;a=`, concurrent ordering): the next owner skips them.
    pub acked_above: Option<i64>,
    /// consumer id, client id, host of the member holding it.
    pub member: Option<(String, String, String)>,
}

pub fn run(settings: &Settings) -> i32 {
    match gather(settings) {
        Ok((group, rows)) => {
            // SAFETY: isatty only reads the descriptor's state.
            if unsafe { libc::isatty(1) } == 1 {
                let mut out = std::io::stdout().lock();
                let _ = out
                    .write_all(table(settings, &group, &rows).as_bytes())
                    .and_then(|()| out.flush());
            } else {
                log_lines(settings, &group, &rows);
            }
            exit::OK
        }
        Err(code) => code,
    }
}

/// Asks the brokers; `Err` is the exit code, its line written.
fn gather(settings: &Settings) -> Result<(GroupDescription, Vec<Row>), i32> {
    let probe = create(settings, "status")?;
    reach_brokers(settings, &probe)?;
    let topics = existing_topics(settings, &probe)?;
    let group =
        describe_group(&probe, &settings.group_id).map_err(|e| unavailable("the group", e))?;
    let committed = committed_offsets(&probe, &topics)?;
    let mut rows = Vec::new();
    // Where each partition's first message not committed is (for its lag in seconds).
    let mut firsts = TopicPartitionList::new();
    // Metadata read as bytes: another client's need not be UTF-8.
    for ((topic, partition), offset, read) in committed_with_metadata(&committed) {
        let (low, end) = probe
            .fetch_watermarks(&topic, partition, REQUEST)
            .map_err(|e| unavailable("the log ends", e))?;
        let row = row(
            settings,
            &group,
            (topic.to_string(), partition),
            offset,
            read,
            (low, end),
        );
        if row.lag > 0 {
            // The committed offset, not below the log's start (retention may have
            // passed it); without a commit, the log's start (ACKD_START_FROM=earliest).
            let from = row.committed.map_or(low, |c| c.max(low));
            let _ = firsts.add_partition_offset(&topic, partition, Offset::Offset(from));
        }
        rows.push(row);
    }
    rows.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    let ages = first_message_ages(&probe, &firsts);
    for r in &mut rows {
        r.lag_seconds = if r.lag == 0 {
            Some(0.0)
        } else {
            ages.get(&(r.topic.clone(), r.partition)).copied().flatten()
        };
    }
    Ok((group, rows))
}

/// How old the first message at or after each offset of `firsts` is (its timestamp
/// against this host's clock when it arrived, never negative), read by assigning the
/// client there: never a commit, never a group join. Those that did not arrive within
/// one request's timeout (an open transaction under read_committed) are left out.
fn first_message_ages(
    probe: &Probe,
    firsts: &TopicPartitionList,
) -> HashMap<(String, i32), Option<f64>> {
    let mut ages = HashMap::new();
    if firsts.count() == 0 || probe.assign(firsts).is_err() {
        return ages;
    }
    let deadline = Instant::now() + REQUEST;
    while ages.len() < firsts.count() && Instant::now() < deadline {
        let Some(Ok(m)) = probe.poll(std::time::Duration::from_millis(100)) else {
            continue;
        };
        let now = crate::consumer::copier::epoch_ms();
        // A message without a timestamp (an old format) has no age.
        let age = m.timestamp().to_millis();
        let age = age.map(|ts| now.saturating_sub(ts).max(0) as f64 / 1000.0);
        ages.entry((m.topic().to_string(), m.partition()))
            .or_insert(age);
    }
    let _ = probe.unassign();
    ages
}

/// The brokers answer and accept ackd's credentials; `Err` is the exit code.
fn reach_brokers(settings: &Settings, probe: &Probe) -> Result<(), i32> {
    match connect(probe, settings.topics.first().map(String::as_str)) {
        Ok(_) => Ok(()),
        Err(Unreached::Auth) => Err(exit::NOPERM),
        Err(e @ Unreached::Unavailable { .. }) => {
            if let Unreached::Unavailable { waited, error } = &e {
                tracing::error!(
                    at = "unavailable",
                    bootstrap = settings.brokers.bootstrap_servers(),
                    waited_ms = waited.as_millis() as u64,
                    error = error.as_str(),
                    "no broker answered"
                );
            }
            Err(e.code())
        }
    }
}

/// The configured topics' partitions; `Err` if one of them does not exist.
fn existing_topics(settings: &Settings, probe: &Probe) -> Result<Vec<TopicPartitions>, i32> {
    let topics = partitions(probe, &settings.topics).map_err(|e| unavailable("the topics", e))?;
    let missing: Vec<&str> = topics
        .iter()
        .filter(|(_, p)| p.is_none())
        .map(|(t, _)| t.as_str())
        .collect();
    if !missing.is_empty() {
        crate::consumer::topics::report_missing(settings, &missing.join(","));
        return Err(exit::CONFIG);
    }
    Ok(topics)
}

/// The group's committed offsets, with their metadata, of every partition of `topics`.
fn committed_offsets(probe: &Probe, topics: &[TopicPartitions]) -> Result<TopicPartitionList, i32> {
    let mut tpl = TopicPartitionList::new();
    for (topic, ps) in topics {
        for p in ps.iter().flatten() {
            tpl.add_partition(topic, *p);
        }
    }
    probe
        .committed_offsets(tpl, REQUEST)
        .map_err(|e| unavailable("the committed offsets", e))
}

/// One partition's row: its commit and its log's `(low, end)` watermarks.
fn row(
    settings: &Settings,
    group: &GroupDescription,
    (topic, partition): (String, i32),
    offset: Offset,
    read: ReadMetadata,
    (low, end): (i64, i64),
) -> Row {
    // Only ackd's metadata written beside this very offset says anything about it.
    let previous = read.previous;
    let committed = match offset {
        Offset::Offset(o) => Some(o),
        _ => None,
    };
    let lag = match (committed, settings.group.start_from) {
        (Some(c), _) => end - c,
        (None, StartFrom::Earliest) => end - low,
        (None, StartFrom::Latest) => 0,
    }
    .max(0);
    let member = group
        .holder(&topic, partition)
        .map(|m| (m.id.clone(), m.client_id.clone(), m.host.clone()));
    Row {
        topic,
        partition,
        committed,
        end,
        lag,
        lag_seconds: None,
        acked_above: committed
            .zip(previous.as_ref())
            .map(|(c, p)| crate::consumer::handover::count_offsets(&p.acked_above(c)))
            .filter(|n| *n > 0),
        processed: previous.as_ref().map(|p| p.processed),
        dispatch_limit: previous.as_ref().and_then(|p| p.limit),
        member,
    }
}

/// A question the brokers did not answer: its line, and the exit code.
fn unavailable(what: &str, e: rdkafka::error::KafkaError) -> i32 {
    tracing::error!(at = "unavailable", error = %e, "could not ask for {what}");
    exit::UNAVAILABLE
}

fn shown(v: Option<i64>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// A lag in seconds as the table shows it: to the tenth, `-` when unknown.
fn seconds(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |s| format!("{s:.1}"))
}

fn log_lines(settings: &Settings, group: &GroupDescription, rows: &[Row]) {
    for r in rows {
        let (member, client_id, host) = match &r.member {
            Some((m, c, h)) => (m.as_str(), Some(c.as_str()), Some(h.as_str())),
            None => ("-", None, None),
        };
        tracing::info!(
            at = "status",
            topic = r.topic.as_str(),
            partition = r.partition,
            committed = shown(r.committed),
            end = r.end,
            lag = r.lag,
            lag_seconds = r.lag_seconds,
            member,
            client_id,
            host,
            processed = r.processed,
            dispatch_limit = r.dispatch_limit,
            acked_above = r.acked_above
        );
    }
    tracing::info!(
        at = "status_total",
        group = &settings.group_id,
        state = group.state.as_str(),
        members = group.members.len(),
        partitions = rows.len(),
        lag = rows.iter().map(|r| r.lag).sum::<i64>(),
        lag_seconds_max = rows.iter().filter_map(|r| r.lag_seconds).reduce(f64::max)
    );
}

/// `text` safe to print on a terminal: what the brokers report (member and client ids,
/// hosts) is anyone's to set, and a control character or a bidi override in it would
/// drive the terminal. Escaped as on ackd's lines (`\u{001b}`, `\\`), bidi overrides
/// too (`\u{202e}`), so that what is shown reads back unambiguously.
pub fn terminal_safe(text: &str) -> String {
    let is_bidi = |c: char| matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    let mut out = String::with_capacity(text.len());
    let mut rest = 0; // where the text not yet written starts
    for (i, c) in text.char_indices().filter(|(_, c)| is_bidi(*c)) {
        out.push_str(&crate::logfmt::escaped(&text[rest..i]));
        let _ = write!(out, "\\u{{{:04x}}}", c as u32);
        rest = i + c.len_utf8();
    }
    out.push_str(&crate::logfmt::escaped(&text[rest..]));
    out
}

/// The table for a terminal.
pub fn table(settings: &Settings, group: &GroupDescription, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "group {}  state {}  members {}  partitions {}  lag {}  lag-seconds {}\n",
        terminal_safe(&settings.group_id),
        terminal_safe(&group.state),
        group.members.len(),
        rows.len(),
        rows.iter().map(|r| r.lag).sum::<i64>(),
        seconds(rows.iter().filter_map(|r| r.lag_seconds).reduce(f64::max)),
    );
    let mut cells = vec![[
        "TOPIC",
        "PARTITION",
        "COMMITTED",
        "END",
        "LAG",
        "MEMBER",
        "HOST",
        "CLIENT-ID",
        "LAG-SECONDS",
    ]
    .map(String::from)];
    for r in rows {
        let (m, c, h) = r
            .member
            .clone()
            .unwrap_or_else(|| ("-".into(), "-".into(), "-".into()));
        cells.push([
            terminal_safe(&r.topic),
            r.partition.to_string(),
            shown(r.committed),
            r.end.to_string(),
            r.lag.to_string(),
            terminal_safe(&m),
            terminal_safe(&h),
            terminal_safe(&c),
            seconds(r.lag_seconds),
        ]);
    }
    let widths: Vec<usize> = (0..9)
        .map(|i| {
            cells
                .iter()
                .map(|c| c[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in &cells {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Broker-supplied member ids, client ids and hosts reach a terminal: no control
    /// character of theirs may.
    #[test]
    fn the_table_shows_control_characters_escaped() {
        let settings = Settings::from_vars(
            [
                ("KAFKA_URL", "127.0.0.1:9092"),
                ("ACKD_TOPICS", "orders"),
                ("ACKD_GROUP_ID", "billing"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        )
        .unwrap();
        let group = GroupDescription {
            state: "Stable\u{7}".into(),
            ..GroupDescription::default()
        };
        let row = Row {
            topic: "orders".into(),
            partition: 0,
            committed: Some(1),
            end: 2,
            lag: 1,
            lag_seconds: Some(2.5),
            processed: None,
            dispatch_limit: None,
            acked_above: None,
            member: Some((
                "m-1\u{1b}[2J".into(),
                "red\u{1b}]0;title\u{7}\r\n\u{9b}31m\u{202e}".into(),
                "h\\ost\u{0}".into(),
            )),
        };
        let table = table(&settings, &group, &[row]);
        assert!(
            !table
                .chars()
                .any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'),
            "{table:?}"
        );
        for shown in [
            "m-1\\u{001b}[2J",
            "red\\u{001b}]0;title\\u{0007}\\r\\n\\u{009b}31m\\u{202e}",
            "h\\\\ost\\u{0000}",
            "Stable\\u{0007}",
        ] {
            assert!(table.contains(shown), "{shown} not in {table}");
        }
        // The columns still line up: widths count what is shown.
        let lines: Vec<&str> = table.lines().skip(2).collect();
        let host_column = lines[0].find("HOST").unwrap();
        assert_eq!(lines[1].find("h\\\\ost"), Some(host_column), "{table}");
    }
}
