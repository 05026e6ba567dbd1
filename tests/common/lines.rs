//! Reading ackd's output lines: logfmt fields, processed messages, refused commits.

use std::collections::{BTreeMap, HashMap};

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

/// True for the line ackd writes when it has processed the message at `offset`.
pub fn is_processed_at(line: &str, offset: i64) -> bool {
    is_processed(line) && field(line, "offset") == Some(offset.to_string())
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

/// True if the line's `at=` is `what`.
pub fn at(line: &str, what: &str) -> bool {
    field(line, "at").as_deref() == Some(what)
}

/// The lines whose `at=` is `what`, in order.
pub fn all_at<'a>(lines: &'a [String], what: &str) -> Vec<&'a String> {
    lines.iter().filter(|l| at(l, what)).collect()
}

/// How many lines have `at=` `what`.
pub fn count_at(lines: &[String], what: &str) -> usize {
    lines.iter().filter(|l| at(l, what)).count()
}

/// True if the line's `at=` is `what` and its `offset=` is `offset`.
pub fn at_offset(line: &str, what: &str, offset: i64) -> bool {
    at(line, what) && field(line, "offset") == Some(offset.to_string())
}

/// Offsets per partition, in the order given.
pub fn offsets_by_partition(
    pairs: impl IntoIterator<Item = (i32, i64)>,
) -> BTreeMap<i32, Vec<i64>> {
    let mut map: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for (p, o) in pairs {
        map.entry(p).or_default().push(o);
    }
    map
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

/// The sample `name` (e.g. `sample#ackd.http.limit`) of each summary line with messages
/// processed in its interval, in order.
pub fn summary_samples(lines: &[String], name: &str) -> Vec<u64> {
    lines
        .iter()
        .filter(|l| at(l, "summary") && field(l, "count#ackd.processed").as_deref() != Some("0"))
        .filter_map(|l| field(l, name)?.parse().ok())
        .collect()
}

/// The median of `samples` from the `skip`-th on (0 if none).
pub fn median_after(samples: &[u64], skip: usize) -> u64 {
    let mut sorted = samples.get(skip..).unwrap_or_default().to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied().unwrap_or(0)
}
