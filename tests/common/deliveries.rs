//! Every delivery a processor saw, with its `redelivered` flag and `attempt`:
//! read from the `log` processor's per-message lines or from a file an `exec` handler
//! ([`recorder_command`]) appends to, and checked against what `at=assigned` stated.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::lines::*;

/// One message handed to a processor: by which run (an index the test gives its ackd
/// processes), where, and what the request said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    pub run: usize,
    pub partition: i32,
    pub offset: i64,
    pub redelivered: bool,
    pub attempt: u64,
}

/// The deliveries of run `run` from its `log` processor's per-message lines, in order:
/// `redelivered=true attempt=N` only when flagged (absent: false, attempt 1).
pub fn from_processed_lines(run: usize, lines: &[String]) -> Vec<Delivery> {
    lines
        .iter()
        .filter(|l| is_processed(l))
        .map(|l| {
            let int = |k: &str| field(l, k).and_then(|v| v.parse::<i64>().ok());
            let (Some(partition), Some(offset)) = (int("partition"), int("offset")) else {
                panic!("processed line without partition/offset: {l}");
            };
            let redelivered = match field(l, "redelivered").as_deref() {
                None | Some("false") => false,
                Some("true") => true,
                Some(other) => panic!("redelivered={other}: {l}"),
            };
            Delivery {
                run,
                partition: partition as i32,
                offset,
                redelivered,
                attempt: int("attempt").map_or(1, |a| a as u64),
            }
        })
        .collect()
}

/// An exec handler that appends `run partition offset redelivered attempt` for every
/// message of every request (a message, or a batch's in turn) to `file` (one unbuffered
/// `write` per request on an `O_APPEND` descriptor, so that the
/// file's order is the order in which the deliveries happened, across processes) before
/// it acknowledges the message. `dir` gets the script. It ignores SIGTERM and stops at
/// EOF, like docs/exec.md's.
pub fn recorder_command(dir: &Path, file: &Path, run: usize) -> String {
    let script = dir.join("recorder.py");
    if !script.exists() {
        std::fs::write(&script, RECORDER).unwrap_or_else(|e| panic!("write {script:?}: {e}"));
    }
    format!("python3 {} {} {run}", script.display(), file.display())
}

/// [`recorder_command`] whose handler, after recording a message whose value starts with
/// `hold`, answers it only once the file `release` exists.
pub fn holding_recorder_command(dir: &Path, file: &Path, run: usize, release: &Path) -> String {
    format!("{} {}", recorder_command(dir, file, run), release.display())
}

const RECORDER: &str = r#"import json, os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
run = sys.argv[2]
for line in sys.stdin:
    req = json.loads(line)
    batch = req if isinstance(req, list) else [req]
    os.write(fd, "".join(
        f"{run} {m['partition']} {m['offset']} {'true' if m['redelivered'] else 'false'} {m['attempt']}\n"
        for m in batch).encode())
    while len(sys.argv) > 3 and any((m.get("value") or "").startswith("hold") for m in batch) and not os.path.exists(sys.argv[3]):
        time.sleep(0.05)
    reply = {"ack": True, "topic": batch[0]["topic"], "partition": batch[0]["partition"]}
    if isinstance(req, list):
        reply.update(first=batch[0]["offset"], last=batch[-1]["offset"])
    else:
        reply.update(offset=req["offset"])
    print(json.dumps(reply), flush=True)
"#;

/// The deliveries [`recorder_command`]'s handlers wrote to `file`, in order (a last
/// line still being written, without its newline, is left for the next read).
pub fn from_file(file: &Path) -> Vec<Delivery> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let whole = text.rfind('\n').map_or("", |end| &text[..end]);
    whole
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let parsed = (f.len() == 5).then(|| {
                Some(Delivery {
                    run: f[0].parse().ok()?,
                    partition: f[1].parse().ok()?,
                    offset: f[2].parse().ok()?,
                    redelivered: f[3].parse().ok()?,
                    attempt: f[4].parse().ok()?,
                })
            });
            parsed
                .flatten()
                .unwrap_or_else(|| panic!("{}: bad line {l:?}", file.display()))
        })
        .collect()
}

/// A fresh file for a recorder's deliveries, in a fresh directory named after `name`.
pub fn deliveries_file(name: &str) -> (PathBuf, PathBuf) {
    let dir = super::spawn::fresh_dir(name);
    let file = dir.join("deliveries");
    (dir, file)
}

/// What one `at=assigned` line stated: the partition resumes at `offset` (None: no
/// committed offset), and at most `at_most` messages (None: `unknown`) of `from..=through`
/// may come again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stated {
    pub partition: i32,
    pub offset: Option<i64>,
    pub at_most: Option<i64>,
    pub from: Option<i64>,
    pub through: Option<i64>,
    pub line: String,
}

/// Every `at=assigned` line of `lines` as [`Stated`]; panics on one without
/// `redelivery_at_most=`, or with a positive one and no `flagged_through=`.
pub fn stated(lines: &[String]) -> Vec<Stated> {
    all_at(lines, "assigned")
        .into_iter()
        .map(|l| {
            let int = |k: &str| field(l, k).and_then(|v| v.parse::<i64>().ok());
            let at_most = match field(l, "redelivery_at_most") {
                Some(v) if v == "unknown" => None,
                Some(v) => Some(v.parse().unwrap_or_else(|_| panic!("{l}"))),
                None => panic!("at=assigned without redelivery_at_most: {l}"),
            };
            let through = int("flagged_through");
            assert!(
                at_most.is_none_or(|n| n == 0) || through.is_some(),
                "redelivery_at_most > 0 without flagged_through: {l}"
            );
            Stated {
                partition: int("partition").unwrap_or_else(|| panic!("{l}")) as i32,
                offset: int("offset"),
                at_most,
                from: int("flagged_from").or(int("offset")),
                through,
                line: l.clone(),
            }
        })
        .collect()
}

/// Whether `offset` lies in the window `s` stated (`unknown` with no window: any offset
/// at or above where it resumed).
fn in_window(s: &Stated, offset: i64) -> bool {
    let from = s.from.unwrap_or(i64::MIN);
    match (s.at_most, s.through) {
        (Some(0), _) => false,
        (_, Some(t)) => (from..=t).contains(&offset),
        (None, None) => offset >= from,
        (Some(_), None) => false,
    }
}

/// What a set of deliveries, in the order they happened, shows.
#[derive(Debug, Default)]
pub struct Findings {
    pub deliveries: usize,
    /// Distinct messages delivered.
    pub messages: usize,
    /// Deliveries of a message delivered before.
    pub repeats: Vec<Delivery>,
    /// Of them, those that said `redelivered=false`: what must never happen.
    pub unflagged_repeats: Vec<Delivery>,
    /// First deliveries flagged all the same (a window's message the previous owner never
    /// started, or one where ackd could not know).
    pub flagged_first: usize,
}

/// Walks `ordered` (every delivery, in the order they happened).
pub fn findings(ordered: &[Delivery]) -> Findings {
    let mut seen = BTreeSet::new();
    let mut f = Findings {
        deliveries: ordered.len(),
        ..Findings::default()
    };
    for d in ordered {
        if seen.insert((d.partition, d.offset)) {
            f.flagged_first += usize::from(d.redelivered);
        } else {
            f.repeats.push(*d);
            if !d.redelivered {
                f.unflagged_repeats.push(*d);
            }
        }
    }
    f.messages = seen.len();
    f
}

/// Per run after the first and partition: the messages it delivered that an earlier run
/// had delivered, and the sum of what its `at=assigned` lines for that partition stated.
#[derive(Debug)]
pub struct RunRepeats {
    pub run: usize,
    pub partition: i32,
    pub repeats: usize,
    /// None: some assignment said `unknown`.
    pub stated: Option<i64>,
    /// Repeated offsets outside every window the run stated for the partition.
    pub outside: Vec<i64>,
}

/// [`RunRepeats`] of every run `r` >= 1 of `runs` (each run's deliveries and lines; runs
/// one after the other, each taking over from the one before).
pub fn run_repeats(runs: &[(Vec<Delivery>, Vec<String>)]) -> Vec<RunRepeats> {
    let mut earlier: BTreeSet<(i32, i64)> = BTreeSet::new();
    let mut out = Vec::new();
    for (r, (deliveries, lines)) in runs.iter().enumerate() {
        let stated = stated(lines);
        let mut again: BTreeMap<i32, BTreeSet<i64>> = BTreeMap::new();
        for d in deliveries
            .iter()
            .filter(|d| earlier.contains(&(d.partition, d.offset)))
        {
            again.entry(d.partition).or_default().insert(d.offset);
        }
        let partitions: BTreeSet<i32> = stated.iter().map(|s| s.partition).collect();
        for p in partitions.iter().copied().filter(|_| r > 0) {
            let mine: Vec<&Stated> = stated.iter().filter(|s| s.partition == p).collect();
            let repeated = again.remove(&p).unwrap_or_default();
            out.push(RunRepeats {
                run: r,
                partition: p,
                repeats: repeated.len(),
                stated: mine.iter().map(|s| s.at_most).sum(),
                outside: repeated
                    .iter()
                    .copied()
                    .filter(|o| !mine.iter().any(|s| in_window(s, *o)))
                    .collect(),
            });
        }
        assert!(
            r == 0 || again.is_empty(),
            "run {r} repeated messages of partitions it was never assigned: {again:?}\n{}",
            lines.join("\n")
        );
        earlier.extend(deliveries.iter().map(|d| (d.partition, d.offset)));
    }
    out
}

/// Asserts docs/guarantees.md's redelivery guarantee on `runs` (each run's deliveries in order, and its
/// lines): no repeat without the flag, nothing lost, per run and partition no more
/// repeats than stated and none outside the stated window, and `at=redelivered` counts
/// that agree with the deliveries ([`redelivered_line_problems`]). Every violation is
/// reported at once, then every run's lines. Returns the findings and the per-run rows.
#[track_caller]
pub fn assert_flagged(
    runs: &[(Vec<Delivery>, Vec<String>)],
    ordered: &[Delivery],
    expected: &BTreeSet<(i32, i64)>,
) -> (Findings, Vec<RunRepeats>) {
    let f = findings(ordered);
    let mut problems = Vec::new();
    if !f.unflagged_repeats.is_empty() {
        problems.push(format!(
            "{} repeats without redelivered=true: {:?}",
            f.unflagged_repeats.len(),
            f.unflagged_repeats
        ));
    }
    let delivered: BTreeSet<(i32, i64)> = ordered.iter().map(|d| (d.partition, d.offset)).collect();
    let lost: Vec<_> = expected.difference(&delivered).collect();
    if !lost.is_empty() {
        problems.push(format!("lost {}: {lost:?}", lost.len()));
    }
    for (r, (deliveries, lines)) in runs.iter().enumerate() {
        problems.extend(redelivered_line_problems(
            r,
            deliveries,
            lines,
            r + 1 == runs.len(),
        ));
    }
    let rows = run_repeats(runs);
    for row in &rows {
        let over = row.stated.is_some_and(|n| row.repeats as i64 > n);
        if over || !row.outside.is_empty() {
            problems.push(format!(
                "run {} partition {}: {} repeats, stated at most {:?}, repeated outside the stated window: {:?}; its at=assigned lines:\n{}",
                row.run,
                row.partition,
                row.repeats,
                row.stated,
                row.outside,
                stated(&runs[row.run].1)
                    .iter()
                    .filter(|s| s.partition == row.partition)
                    .map(|s| s.line.as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            ));
        }
    }
    if !problems.is_empty() {
        let all_lines: Vec<String> = runs
            .iter()
            .enumerate()
            .map(|(r, (_, l))| format!("---- run {r}\n{}", l.join("\n")))
            .collect();
        panic!(
            "{}\n{SUMMARY_HEADER}\n{}\n==== every run's lines:\n{}",
            problems.join("\n"),
            summary("(this case)", runs.len() - 1, &f, &rows),
            all_lines.join("\n")
        );
    }
    (f, rows)
}

/// Each `at=redelivered ... complete=true` line of a run (its window passed) counts
/// `flagged=K` messages handed over flagged from the window its `at=assigned` stated for
/// that partition: at least the flagged deliveries recorded in that window, exactly as
/// many in a run that finished its calls (`exact`: a graceful stop). Partitions assigned
/// more than once in the run are left out. Returns what disagrees.
pub fn redelivered_line_problems(
    run: usize,
    deliveries: &[Delivery],
    lines: &[String],
    exact: bool,
) -> Vec<String> {
    let stated = stated(lines);
    let mut problems = Vec::new();
    for l in all_at(lines, "redelivered") {
        let int = |k: &str| field(l, k).and_then(|v| v.parse::<i64>().ok());
        let (Some(p), Some(k)) = (int("partition"), int("flagged")) else {
            problems.push(format!("at=redelivered without partition or flagged: {l}"));
            continue;
        };
        let mine: Vec<&Stated> = stated.iter().filter(|s| s.partition == p as i32).collect();
        let ([s], Some("true")) = (mine.as_slice(), field(l, "complete").as_deref()) else {
            continue;
        };
        let recorded = deliveries
            .iter()
            .filter(|d| d.partition == s.partition && d.redelivered && in_window(s, d.offset))
            .count() as i64;
        if (exact && recorded != k) || recorded > k {
            problems.push(format!(
                "run {run}: {recorded} deliveries flagged in the window, the line says flagged={k}:\n{}\n{l}",
                s.line
            ));
        }
    }
    problems
}

/// A summary table of the runs: one line per case.
pub fn summary(case: &str, kills: usize, f: &Findings, rows: &[RunRepeats]) -> String {
    let stated: i64 = rows.iter().filter_map(|r| r.stated).sum();
    let unknown = rows.iter().filter(|r| r.stated.is_none()).count();
    let per_run: Vec<String> = rows
        .iter()
        .filter(|r| r.repeats > 0 || r.stated.is_none_or(|n| n > 0))
        .map(|r| {
            let n = r.stated.map_or("unknown".into(), |n| n.to_string());
            format!("r{}p{} {}/{n}", r.run, r.partition, r.repeats)
        })
        .collect();
    format!(
        "| {case} | {kills} | {} | {} | {} | {} | {stated}{} | {} |\n  per run and partition (repeats/stated): {}",
        f.messages,
        f.deliveries,
        f.repeats.len(),
        f.unflagged_repeats.len(),
        if unknown > 0 {
            format!(" (+{unknown} unknown)")
        } else {
            String::new()
        },
        f.flagged_first,
        per_run.join(", ")
    )
}

/// The header of [`summary`]'s table.
pub const SUMMARY_HEADER: &str = "| case | kills | messages | deliveries | repeats | unflagged repeats | stated bounds (sum) | flagged first deliveries |\n|---|---|---|---|---|---|---|---|";
