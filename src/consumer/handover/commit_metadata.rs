//! What a commit hands to the partition's next owner: the commit metadata
//! `ackd/3:o=O;p=H;l=L[;a=R][;r];end`, as the committer writes it and the next owner reads
//! it back beside the committed offset (version 2, without `l=`, is read too), and the
//! acknowledged ranges `R` in it. docs/guarantees.md describes both to operators
//! ("What a resume says about redelivery", "Commit metadata: acknowledged offsets above
//! the commit"); a unit test below keeps its quoted format the one written here.
//!
//! **The ranges** (`a=`): with concurrent ordering messages finish out of order and the
//! committed offset, the contiguous watermark, stays behind the ones that finished; the
//! next owner skips the offsets they name instead of processing them again after a
//! crash. Pure text, no I/O, so it can be tested exhaustively. Each item is an inclusive
//! range *relative to the committed offset O* of the same commit: `2-4` is O+2..=O+4,
//! `7` is O+7 alone. Items are ascending, at least 1 apart (never adjacent nor
//! overlapping: adjacent ranges are one range), and start at 1 or more: O itself is the
//! next offset to read, never acknowledged. Relative numbers stay short (they are
//! bounded by how far the partition ran ahead of its oldest unfinished message), and the
//! ranges mean nothing without the offset they were committed with: Kafka stores the two
//! atomically, but tools can move one without the other, so the metadata names it too
//! (`o=`, see [`read_metadata`]).
//!
//! **Bound**: the value is at most [`RANGES_MAX_BYTES`] bytes. Ranges that do not fit are
//! left out, the highest first: those messages are redelivered after a crash, as they
//! would be without the metadata. With the rest of ackd's metadata the whole stays under
//! 1,100 bytes, well under the broker's default `offset.metadata.max.bytes` (4,096).
//!
//! **Decoding is strict**: anything that is not exactly what [`encode_ranges`] writes (a
//! malformed number, a range out of order, overlapping, adjacent or at O, an overflow,
//! longer than the bound) gives no ranges at all, so a reader never skips an offset its
//! writer did not acknowledge: the worst case is redelivery, never loss.

use std::sync::Arc;

use rdkafka::{Offset, TopicPartitionList};

use crate::consumer::committer::Reason;
use crate::output::TopicPartition;

/// The version of the metadata format this ackd writes. A later format (new fields)
/// bumps it: see [`metadata`].
pub const METADATA_VERSION: u32 = 3;

/// The previous version (no `l=`), still read: its ranges are trusted as before, and
/// without a dispatch limit a crashed owner's redelivery is not known.
const PREVIOUS_VERSION: u32 = 2;

/// The metadata a commit of `offset` carries, and how it is read back: `ackd/3:o=O;p=H;l=L`
/// (`O` the offset committed, `H` the highest offset processed, or on a release the
/// highest handed to a processor, finished or not (`WorkerShared::handed_through`), `L`
/// the dispatch limit: the highest offset this process may start before its next commit
/// is accepted, see src/consumer/worker/shared.rs), then `;a=R` (`acked`: the ranges
/// as [`encode_ranges`] writes them, if any), then `;r` for a release, then `;end`.
///
/// Grammar: `ackd/V:` then fields separated by `;`, the last one `end`. `V` is the
/// format's version: a reader reads only its own version, so a field is added by
/// bumping it (an older ackd then skips nothing, never something wrong). Names are one
/// letter: the metadata is bounded (and some brokers keep little). `o=` is
/// the offset committed with this metadata: ranges are relative to it, and a reader
/// trusts them only beside that very offset (a tool that moves an offset and keeps its
/// metadata, as MirrorMaker 2's offset sync does, leaves them meaningless). `end` marks
/// the string whole: one cut short (by a broker, a tool) is not read as fewer ranges.
///
/// Nothing processed yet (a first commit, which carries only a limit): `H` is `O - 1`.
/// No limit and nothing processed: no metadata at all.
///
/// An older ackd's release names the highest offset *acknowledged* as `H`; reading a
/// release's `H` as handed over, it flags more, never less, so the version stays.
pub fn metadata(
    offset: i64,
    processed: Option<i64>,
    limit: Option<i64>,
    acked: Option<&str>,
    reason: Reason,
) -> String {
    if processed.is_none() && limit.is_none() {
        return String::new();
    }
    let h = processed.unwrap_or(offset.saturating_sub(1));
    let l = limit.unwrap_or(h).max(h);
    let mut m = format!("ackd/{METADATA_VERSION}:o={offset};p={h};l={l}");
    if let Some(r) = acked {
        m.push_str(";a=");
        m.push_str(r);
    }
    if reason.releases() {
        m.push_str(";r");
    }
    m.push_str(";end");
    m
}

/// What a commit's metadata is, read beside the offset it was committed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataState {
    /// No metadata.
    Absent,
    /// This ackd's format, written beside this very offset: its ranges are skipped.
    Current,
    /// This ackd's format written beside another offset (the metadata was copied or the
    /// offset moved by a tool): nothing is skipped.
    Stale,
    /// An older ackd's format (`ackd:processed=`), which does not say which offset it
    /// was written beside: nothing is skipped.
    OldFormat,
    /// A later ackd's format (`ackd/N:`, N above [`METADATA_VERSION`]): nothing is
    /// skipped.
    NewerFormat,
    /// Anything else: another client's, or ackd's damaged (cut short, malformed).
    Foreign,
}

impl MetadataState {
    /// As logged (`metadata=`).
    pub fn as_str(self) -> &'static str {
        match self {
            MetadataState::Absent => "none",
            MetadataState::Current => "current",
            MetadataState::Stale => "stale",
            MetadataState::OldFormat => "old_format",
            MetadataState::NewerFormat => "newer_format",
            MetadataState::Foreign => "foreign",
        }
    }
}

/// What a commit's metadata written by [`metadata`] says about the process that made it,
/// once it is known to describe the offset beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Previous {
    /// The highest offset it had processed when it committed; on a release, the
    /// highest it had handed to a processor, finished or not (an older ackd's release
    /// says the highest acknowledged).
    pub processed: i64,
    /// Its dispatch limit: it started nothing above it (`None`: version 2, no limit).
    pub limit: Option<i64>,
    /// It committed on releasing the partition: it handed nothing over after.
    pub released: bool,
    /// The offsets it had acknowledged above the committed one, relative to it
    /// (`(1, 1)` is the committed offset + 1), as [`decode_ranges`] read them.
    acked: Vec<(i64, i64)>,
}

impl Previous {
    /// The acknowledged offsets above `committed` (the offset this metadata was
    /// committed with), inclusive ranges, ascending; none if they reach above
    /// `processed`, which no ackd writes.
    pub fn acked_above(&self, committed: i64) -> Vec<(i64, i64)> {
        let shifted: Option<Vec<_>> = self
            .acked
            .iter()
            .map(|&(a, b)| Some((committed.checked_add(a)?, committed.checked_add(b)?)))
            .collect();
        shifted
            .filter(|r| r.last().is_none_or(|&(_, b)| b <= self.processed))
            .unwrap_or_default()
    }

    /// The last offset that it may have handed to a processor: what it had handed over
    /// when it released the partition, else its dispatch limit; `None`: not known (an
    /// older ackd that crashed).
    pub fn window_end(&self) -> Option<i64> {
        if self.released {
            Some(self.processed)
        } else {
            self.limit.map(|l| l.max(self.processed))
        }
    }
}

/// Commit metadata as read: what it is, and what it says when it is ackd's own,
/// written beside the offset it sits beside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadMetadata {
    pub state: MetadataState,
    /// `Some` exactly when `state` is [`MetadataState::Current`].
    pub previous: Option<Previous>,
}

/// Reads the metadata `raw` found beside the committed offset `committed` (`None`: no
/// offset committed). Its ranges are trusted only when it is this version's and was
/// written beside `committed`; anything doubtful skips nothing: the worst case is
/// redelivery, never loss. Trailing NUL bytes (some clients store the metadata
/// NUL-terminated) are not part of it.
pub fn read_metadata(raw: &[u8], committed: Option<i64>) -> ReadMetadata {
    let (state, previous) = match parse_metadata(trim_trailing_nuls(raw)) {
        Parsed::Absent => (MetadataState::Absent, None),
        Parsed::OldFormat => (MetadataState::OldFormat, None),
        Parsed::Newer => (MetadataState::NewerFormat, None),
        Parsed::Foreign => (MetadataState::Foreign, None),
        Parsed::Ackd { base, previous } if Some(base) == committed => {
            (MetadataState::Current, Some(previous))
        }
        Parsed::Ackd { .. } => (MetadataState::Stale, None),
    };
    ReadMetadata { state, previous }
}

fn trim_trailing_nuls(raw: &[u8]) -> &[u8] {
    let end = raw.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    &raw[..end]
}

/// Commit metadata, parsed but not yet compared with the offset beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Parsed {
    Absent,
    /// This version's, written beside `base`.
    Ackd {
        base: i64,
        previous: Previous,
    },
    OldFormat,
    Newer,
    Foreign,
}

/// Parses metadata written by [`metadata`], strictly: the fields in the order written,
/// each at most once, `end` last. Ranges that are malformed, or reach above `processed`
/// (which no ackd writes), are ignored: no skip is better than a wrong one. Metadata is
/// bytes to Kafka: another client's may be anything, UTF-8 or not.
fn parse_metadata(metadata: &[u8]) -> Parsed {
    if metadata.is_empty() {
        return Parsed::Absent;
    }
    if metadata.starts_with(b"ackd:processed=") {
        return Parsed::OldFormat;
    }
    let Some(rest) = metadata.strip_prefix(b"ackd/") else {
        return Parsed::Foreign;
    };
    let Some((version, fields)) = std::str::from_utf8(rest)
        .ok()
        .and_then(|r| r.split_once(':'))
    else {
        return Parsed::Foreign;
    };
    match version.parse::<u32>() {
        Ok(v @ (PREVIOUS_VERSION | METADATA_VERSION)) if canonical_number(version) => {
            parse_fields(fields, v == METADATA_VERSION).map_or(
                Parsed::Foreign,
                |(base, previous)| Parsed::Ackd { base, previous },
            )
        }
        Ok(v) if v > METADATA_VERSION && canonical_number(version) => Parsed::Newer,
        _ => Parsed::Foreign,
    }
}

/// The fields of this version, `o=O;p=H;l=L[;a=R][;r];end`, or (`with_limit` false)
/// of the previous one, `o=O;p=H[;a=R][;r];end`.
fn parse_fields(fields: &str, with_limit: bool) -> Option<(i64, Previous)> {
    let mut fields = fields.split(';');
    let base = signed(fields.next()?.strip_prefix("o=")?)?;
    let processed = signed(fields.next()?.strip_prefix("p=")?)?;
    let limit = match with_limit {
        true => Some(signed(fields.next()?.strip_prefix("l=")?)?),
        false => None,
    };
    let mut next = fields.next()?;
    let acked = match next.strip_prefix("a=") {
        Some(value) => {
            next = fields.next()?;
            // Malformed ranges: none are skipped, the rest still reads.
            decode_ranges(0, value)
        }
        None => Vec::new(),
    };
    let released = next == "r";
    if released {
        next = fields.next()?;
    }
    (base >= 0 && next == "end" && fields.next().is_none()).then_some((
        base,
        Previous {
            processed,
            limit,
            released,
            acked,
        },
    ))
}

/// A decimal number as [`metadata`] writes it (an optional `-`, no leading zero).
fn signed(s: &str) -> Option<i64> {
    canonical_number(s.strip_prefix('-').unwrap_or(s))
        .then(|| s.parse().ok())
        .flatten()
}

fn canonical_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()) && (s == "0" || !s.starts_with('0'))
}

/// Each partition of `tpl` (committed offsets, as librdkafka returned them) with its
/// offset and what its metadata says beside it. Reads the metadata as the bytes it is:
/// rust-rdkafka's `metadata()` panics when they are not UTF-8.
pub fn committed_with_metadata(
    tpl: &TopicPartitionList,
) -> Vec<(TopicPartition, Offset, ReadMetadata)> {
    tpl.elements()
        .iter()
        .zip(raw_metadata(tpl))
        .map(|(e, raw)| {
            let committed = match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            };
            let read = read_metadata(raw.as_deref().unwrap_or_default(), committed);
            ((Arc::from(e.topic()), e.partition()), e.offset(), read)
        })
        .collect()
}

/// Each element's metadata bytes (`None`: empty), in the order of `tpl.elements()`.
pub fn raw_metadata(tpl: &TopicPartitionList) -> Vec<Option<Vec<u8>>> {
    // SAFETY: `tpl` owns its list for the duration of the borrow; `elements()` and the
    // raw array are the same `cnt` elements in the same order, and each element's
    // metadata is `metadata_size` bytes at `metadata` (or null).
    unsafe {
        let list = &*tpl.ptr();
        (0..usize::try_from(list.cnt).unwrap_or(0))
            .map(|i| {
                let e = &*list.elems.add(i);
                if e.metadata.is_null() || e.metadata_size == 0 {
                    return None;
                }
                Some(std::slice::from_raw_parts(e.metadata.cast::<u8>(), e.metadata_size).to_vec())
            })
            .collect()
    }
}

// The acknowledged ranges: the value of `a=`.

/// The longest `a=` value written or read, in bytes.
pub const RANGES_MAX_BYTES: usize = 1024;

/// The `a=` value for `ranges` (absolute, inclusive, ascending) above the committed
/// offset `committed`, at most `max_bytes` long (and never more than [`RANGES_MAX_BYTES`]);
/// `None` when nothing fits or there is nothing to write. Ranges (or parts of them) at or
/// below `committed` are left out; so are the highest ranges that do not fit.
pub fn encode_ranges(committed: i64, ranges: &[(i64, i64)], max_bytes: usize) -> Option<String> {
    let max_bytes = max_bytes.min(RANGES_MAX_BYTES);
    let mut out = String::new();
    let mut item = String::new();
    // The last range written, relative, still open to merging with an adjacent one, and
    // where it starts in `out` (its comma excluded).
    let mut last: Option<(i64, i64)> = None;
    let mut last_at = 0;
    for &(a, b) in ranges {
        let a = a.max(committed.saturating_add(1));
        if a > b {
            continue;
        }
        let (Some(ra), Some(rb)) = (a.checked_sub(committed), b.checked_sub(committed)) else {
            continue;
        };
        let (na, nb, at) = match last {
            // Ascending input is the contract; anything else is skipped rather than
            // written out of order.
            Some((_, pb)) if ra <= pb => continue,
            // Adjacent: the last range grows, written again in its place.
            Some((pa, pb)) if ra == pb + 1 => (pa, rb, last_at),
            _ => (ra, rb, out.len()),
        };
        item.clear();
        push_range(&mut item, na, nb);
        if at + usize::from(at > 0) + item.len() > max_bytes {
            break;
        }
        out.truncate(at);
        if at > 0 {
            out.push(',');
        }
        out.push_str(&item);
        last = Some((na, nb));
        last_at = at;
    }
    (!out.is_empty()).then_some(out)
}

fn push_range(out: &mut String, a: i64, b: i64) {
    use std::fmt::Write;
    let _ = if a == b {
        write!(out, "{a}")
    } else {
        write!(out, "{a}-{b}")
    };
}

/// The absolute ranges an `a=` value written with [`encode_ranges`] for the committed offset
/// `committed` says; empty when the value is anything else (see the module's
/// documentation).
pub fn decode_ranges(committed: i64, value: &str) -> Vec<(i64, i64)> {
    decode_ranges_strict(committed, value).unwrap_or_default()
}

fn decode_ranges_strict(committed: i64, value: &str) -> Option<Vec<(i64, i64)>> {
    if value.is_empty() || value.len() > RANGES_MAX_BYTES || committed < 0 {
        return None;
    }
    let mut ranges: Vec<(i64, i64)> = Vec::new();
    let mut previous_end = 0i64;
    for item in value.split(',') {
        let (a, b) = match item.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (number(a)?, number(b)?);
                // `a-a` is not what encode writes.
                if a >= b {
                    return None;
                }
                (a, b)
            }
            None => {
                let a = number(item)?;
                (a, a)
            }
        };
        // At least 1 past the committed offset, and past the previous range with a gap.
        if a < 1 || a <= previous_end.checked_add(1)? && !ranges.is_empty() {
            return None;
        }
        previous_end = b;
        ranges.push((committed.checked_add(a)?, committed.checked_add(b)?));
    }
    Some(ranges)
}

/// A relative offset as [`encode_ranges`] writes it: decimal digits, no sign, no leading
/// zero.
fn number(s: &str) -> Option<i64> {
    canonical_number(s).then(|| s.parse().ok()).flatten()
}

/// How many offsets `ranges` hold.
pub fn count_offsets(ranges: &[(i64, i64)]) -> i64 {
    ranges
        .iter()
        .map(|&(a, b)| b.saturating_sub(a).saturating_add(1))
        .fold(0i64, i64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// docs/guarantees.md quotes the format operators read off the broker: its example
    /// must be what this code writes, and the versions it says are written and read must
    /// be these, so that neither changes without the other.
    #[test]
    fn the_guarantees_quote_the_format_written() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/guarantees.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let example = metadata(
            10,
            Some(299),
            Some(100_299),
            Some("1-139,141-289"),
            Reason::Revoke,
        );
        assert!(
            doc.lines().any(|l| l == example),
            "docs/guarantees.md quotes no line `{example}`"
        );
        let words = doc.split_whitespace().collect::<Vec<_>>().join(" ");
        let says = format!(
            "This ackd writes version {METADATA_VERSION} and reads {METADATA_VERSION} and {PREVIOUS_VERSION}"
        );
        assert!(
            words.contains(&says),
            "docs/guarantees.md does not say `{says}`"
        );
        // Every format quoted with its fields is one this ackd writes or reads.
        for (at, _) in doc.match_indices("ackd/") {
            let rest = &doc[at + "ackd/".len()..];
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if !rest[digits..].starts_with(":o=") {
                continue;
            }
            let version: u32 = rest[..digits].parse().unwrap();
            assert!(
                [METADATA_VERSION, PREVIOUS_VERSION].contains(&version),
                "docs/guarantees.md quotes ackd/{version}"
            );
        }
    }

    #[test]
    fn metadata_round_trips_and_ignores_foreign_metadata() {
        let read = |processed, released| ReadMetadata {
            state: MetadataState::Current,
            previous: Some(Previous {
                processed,
                limit: Some(60),
                released,
                acked: Vec::new(),
            }),
        };
        let written = |reason| metadata(30, Some(41), Some(60), None, reason);
        assert_eq!(written(Reason::Periodic), "ackd/3:o=30;p=41;l=60;end");
        assert_eq!(
            read_metadata(written(Reason::Periodic).as_bytes(), Some(30)),
            read(41, false)
        );
        assert_eq!(
            read_metadata(written(Reason::Shutdown).as_bytes(), Some(30)),
            read(41, true)
        );
        assert_eq!(
            read_metadata(written(Reason::Revoke).as_bytes(), Some(30)),
            read(41, true)
        );
        assert_eq!(metadata(30, None, None, None, Reason::Shutdown), "");
        // A first commit: nothing processed yet, only a limit.
        assert_eq!(
            metadata(30, None, Some(1029), None, Reason::Periodic),
            "ackd/3:o=30;p=29;l=1029;end"
        );
        // The previous version (no limit) is still read.
        let v2 = read_metadata(b"ackd/2:o=30;p=41;r;end", Some(30));
        assert_eq!(v2.state, MetadataState::Current);
        let v2 = v2.previous.unwrap();
        assert_eq!((v2.processed, v2.limit, v2.released), (41, None, true));
        assert_eq!(v2.window_end(), Some(41), "released: what it processed");
        let crashed_v2 = read_metadata(b"ackd/2:o=30;p=41;end", Some(30)).previous;
        assert_eq!(crashed_v2.unwrap().window_end(), None, "crashed, no limit");
        let crashed = read_metadata(written(Reason::Periodic).as_bytes(), Some(30)).previous;
        assert_eq!(
            crashed.unwrap().window_end(),
            Some(60),
            "crashed: its limit"
        );
        let state = |m: &[u8], committed| read_metadata(m, committed).state;
        assert_eq!(state(b"", Some(30)), MetadataState::Absent);
        // Beside another offset than it was written with, or none.
        assert_eq!(
            state(written(Reason::Revoke).as_bytes(), Some(5)),
            MetadataState::Stale
        );
        assert_eq!(
            state(written(Reason::Revoke).as_bytes(), None),
            MetadataState::Stale
        );
        // An older ackd's metadata, a later one's, another client's, damaged ones.
        assert_eq!(
            state(b"ackd:processed=41;released", Some(30)),
            MetadataState::OldFormat
        );
        assert_eq!(
            state(b"ackd/4:whatever=1;end", Some(30)),
            MetadataState::NewerFormat
        );
        assert_eq!(state(b"ackd/12:x", Some(30)), MetadataState::NewerFormat);
        for foreign in [
            &b"written by another tool"[..],
            b"\xff\xfe\x00binary",
            b"ackd/2:o=30;p=\xff;end",
            b"ackd/1:o=30;p=41;end",
            b"ackd/02:o=30;p=41;end",
            b"ackd/x:o=30;p=41;end",
            b"ackd/2:p=41;o=30;end",
            b"ackd/2:o=30;p=41;r;a=1;end",
            b"ackd/2:o=30;p=41;r;r;end",
            b"ackd/2:o=30;p=41;end;",
            b"ackd/2:o=30;p=41;end\0x",
            b"ackd/2:o=-1;p=41;end",
            b"ackd/2:o=030;p=41;end",
            b"ackd/2:o=30;p=41;x=1;end",
            b"ackd/3:o=30;p=41;end",
            b"ackd/3:o=30;l=50;p=41;end",
            b"ackd/3:o=30;p=41;l=x;end",
            b"ackd/2:o=30;p=41;l=50;end",
        ] {
            assert_eq!(
                state(foreign, Some(30)),
                MetadataState::Foreign,
                "{}",
                String::from_utf8_lossy(foreign)
            );
        }
    }

    /// Metadata cut short never reads as fewer ranges, and trailing NULs (some clients
    /// NUL-terminate what they store) are not part of it.
    #[test]
    fn cut_short_metadata_skips_nothing_and_trailing_nuls_are_trimmed() {
        let m = metadata(
            100,
            Some(115),
            Some(200),
            Some("2-4,7,9-15"),
            Reason::Revoke,
        );
        assert_eq!(m, "ackd/3:o=100;p=115;l=200;a=2-4,7,9-15;r;end");
        for cut in 0..m.len() {
            let read = read_metadata(&m.as_bytes()[..cut], Some(100));
            assert_eq!(read.previous, None, "{:?}", &m[..cut]);
        }
        let mut nul = m.clone().into_bytes();
        nul.extend_from_slice(b"\0\0");
        assert_eq!(
            read_metadata(&nul, Some(100)),
            read_metadata(m.as_bytes(), Some(100))
        );
        let read = read_metadata(&nul, Some(100)).previous.unwrap();
        assert!(read.released);
        assert_eq!(
            read.acked_above(100),
            vec![(102, 104), (107, 107), (109, 115)]
        );
        // An older ackd's NUL-terminated metadata is still an older ackd's.
        assert_eq!(
            read_metadata(b"ackd:processed=29;acked=1-9;released\0", Some(5)).state,
            MetadataState::OldFormat
        );
        assert_eq!(read_metadata(b"\0", Some(5)).state, MetadataState::Absent);
    }

    /// The offsets acknowledged above the commit, relative to it, read back as absolute
    /// offsets for the offset they were committed with.
    #[test]
    fn acked_ranges_round_trip_and_anything_doubtful_skips_nothing() {
        let read = |m: &[u8], committed| read_metadata(m, Some(committed)).previous.unwrap();
        let m = metadata(100, Some(115), None, Some("2-4,7,9-15"), Reason::Revoke);
        let p = read(m.as_bytes(), 100);
        assert_eq!((p.processed, p.released), (115, true));
        assert_eq!(p.acked_above(100), vec![(102, 104), (107, 107), (109, 115)]);
        let periodic = read(b"ackd/2:o=100;p=107;a=2-4,7;end", 100);
        assert!(!periodic.released);
        assert_eq!(periodic.acked_above(100), vec![(102, 104), (107, 107)]);
        // Nothing to skip: malformed ranges, ranges above the highest processed offset
        // (no ackd writes that), an overflow.
        for doubtful in [
            &b"ackd/2:o=100;p=115;a=2-4,3;end"[..],
            b"ackd/2:o=100;p=115;a=0-4;end",
            b"ackd/2:o=100;p=115;a=;end",
            b"ackd/2:o=100;p=103;a=2-4;end",
            b"ackd/2:o=100;p=115;a=x;r;end",
        ] {
            assert_eq!(
                read(doubtful, 100).acked_above(100),
                vec![],
                "{}",
                String::from_utf8_lossy(doubtful)
            );
        }
        assert!(read(b"ackd/2:o=100;p=115;a=x;r;end", 100).released);
        assert_eq!(
            read_metadata(b"ackd/2:o=100;p=115;a=2;a=4;end", Some(100)).state,
            MetadataState::Foreign
        );
        let top = i64::MAX - 2;
        let m = format!("ackd/2:o={top};p=9223372036854775807;a=5;end");
        assert_eq!(read(m.as_bytes(), top).acked_above(top), vec![]);
    }

    #[test]
    fn relative_readable_form() {
        assert_eq!(
            encode_ranges(100, &[(102, 104), (107, 107), (109, 115)], RANGES_MAX_BYTES).as_deref(),
            Some("2-4,7,9-15")
        );
        assert_eq!(
            decode_ranges(100, "2-4,7,9-15"),
            vec![(102, 104), (107, 107), (109, 115)]
        );
        assert_eq!(encode_ranges(100, &[], RANGES_MAX_BYTES), None);
        // At or below the commit: left out, or clipped.
        assert_eq!(
            encode_ranges(100, &[(90, 95), (99, 101)], RANGES_MAX_BYTES).as_deref(),
            Some("1")
        );
        // Adjacent ranges are one.
        assert_eq!(
            encode_ranges(0, &[(1, 2), (3, 4)], RANGES_MAX_BYTES).as_deref(),
            Some("1-4")
        );
        let adjacent = [(1, 2), (3, 4), (6, 6), (7, 7)];
        assert_eq!(
            encode_ranges(0, &adjacent, RANGES_MAX_BYTES).as_deref(),
            Some("1-4,6-7")
        );
        // The merged "6-7" does not fit: "6" as it was written stays.
        assert_eq!(encode_ranges(0, &adjacent, 5).as_deref(), Some("1-4,6"));
    }

    #[test]
    fn what_does_not_fit_is_left_out_from_the_top() {
        // Singles 2, 4, 6, ...: "2,4,6" is 5 bytes.
        let ranges: Vec<(i64, i64)> = (1..=1000).map(|i| (2 * i, 2 * i)).collect();
        assert_eq!(encode_ranges(0, &ranges, 5).as_deref(), Some("2,4,6"));
        assert_eq!(encode_ranges(0, &ranges, 6).as_deref(), Some("2,4,6"));
        assert_eq!(encode_ranges(0, &ranges, 1).as_deref(), Some("2"));
        assert_eq!(encode_ranges(0, &ranges, 0), None);
        let full = encode_ranges(0, &ranges, usize::MAX).unwrap();
        assert!(
            full.len() <= RANGES_MAX_BYTES && full.len() > RANGES_MAX_BYTES - 6,
            "{}",
            full.len()
        );
        assert!(full.starts_with("2,4,6,8,"));
    }

    #[test]
    fn anything_malformed_decodes_to_nothing() {
        for bad in [
            "",
            "0",
            "0-3",
            "3-3",
            "4-2",
            "1,1",
            "2,1",
            "1,2",
            "1-3,4",
            "1-3,2-5",
            "01",
            "+1",
            "-1",
            "1-",
            "-",
            "1,,3",
            "1,",
            ",1",
            " 1",
            "1 ",
            "a",
            "1-b",
            "1.5",
            "99999999999999999999",
            "9223372036854775807",
        ] {
            assert_eq!(decode_ranges(10, bad), vec![], "{bad:?}");
        }
        assert_eq!(decode_ranges(10, &"1,".repeat(600)), vec![]);
        // Overflow of the absolute offset.
        assert_eq!(decode_ranges(i64::MAX - 5, "3-10"), vec![]);
        assert_eq!(decode_ranges(-1, "1"), vec![]);
    }

    /// Ascending, disjoint ranges, as a worker reports them (adjacent ones too, which
    /// it does not, but encode must merge).
    fn ranges() -> impl Strategy<Value = (i64, Vec<(i64, i64)>)> {
        (
            0i64..1_000_000_000_000,
            prop::collection::vec((0i64..50, 0i64..20), 0..300),
            -100i64..100,
        )
            .prop_map(|(base, steps, shift)| {
                let mut at = base;
                let ranges = steps
                    .into_iter()
                    .map(|(gap, len)| {
                        let a = at + gap + 1;
                        at = a + len;
                        (a, a + len)
                    })
                    .collect();
                // The committed offset: at, a bit above or below the first range.
                ((base + shift).max(0), ranges)
            })
    }

    fn offsets(ranges: &[(i64, i64)]) -> std::collections::BTreeSet<i64> {
        ranges.iter().flat_map(|&(a, b)| a..=b).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// What is read back is acknowledged (a subset of what was written), above the
        /// commit, the lowest ones first, all of it when it fits, and within the bound.
        #[test]
        fn decode_of_encode_is_a_bounded_lower_subset(
            (committed, ranges) in ranges(),
            max_bytes in 0usize..1500,
        ) {
            let written = encode_ranges(committed, &ranges, max_bytes);
            let read = written.as_deref().map_or_else(Vec::new, |w| decode_ranges(committed, w));
            if let Some(w) = &written {
                prop_assert!(w.len() <= max_bytes.min(RANGES_MAX_BYTES));
                prop_assert!(!read.is_empty(), "{} unreadable", w);
            }
            let (all, got) = (offsets(&ranges), offsets(&read));
            prop_assert!(got.is_subset(&all));
            prop_assert!(got.iter().all(|o| *o > committed));
            // Nothing acknowledged above the commit is skipped below what was kept.
            if let Some(top) = got.last() {
                prop_assert!(all.range(committed + 1..=*top).all(|o| got.contains(o)));
            }
            let above: Vec<(i64, i64)> = ranges
                .iter()
                .filter(|r| r.1 > committed)
                .map(|&(a, b)| (a.max(committed + 1), b))
                .collect();
            let full = above.iter().map(|&(a, b)| {
                let (ra, rb) = (a - committed, b - committed);
                if ra == rb { ra.to_string() } else { format!("{ra}-{rb}") }
            }).collect::<Vec<_>>().join(",");
            if full.len() <= max_bytes.min(RANGES_MAX_BYTES) {
                prop_assert_eq!(&got, &offsets(&above));
            }
            prop_assert_eq!(count_offsets(&read), got.len() as i64);
        }

        /// Whatever the bytes, decoding never gives an offset at or below the commit, nor
        /// ranges out of order.
        #[test]
        fn decode_of_anything_is_above_the_commit_and_ascending(
            committed in 0i64..1_000_000,
            value in "[0-9,\\-]{0,40}",
        ) {
            let read = decode_ranges(committed, &value);
            prop_assert!(read.iter().all(|&(a, b)| a > committed && a <= b));
            prop_assert!(read.windows(2).all(|w| w[0].1 + 1 < w[1].0));
        }
    }
}
