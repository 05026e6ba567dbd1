//! Offsets acknowledged above a commit, written into that commit's metadata so that the
//! next owner of the partition skips them instead of processing them again after a
//! crash (issue 14: with concurrent ordering, messages finish out of order and the
//! committed offset, the contiguous watermark, stays behind the ones that finished).
//!
//! Pure text, no I/O, so it can be tested exhaustively.
//!
//! **Format**: the value of `a=` in `ackd/2:o=O;p=H;a=2-4,7,9-15[;r];end`.
//! Each item is an inclusive range *relative to the committed offset O* of the same
//! commit: `2-4` is O+2..=O+4, `7` is O+7 alone. Items are ascending, at least 1 apart
//! (never adjacent nor overlapping: adjacent ranges are one range), and start at 1 or
//! more: O itself is the next offset to read, never acknowledged. Relative numbers stay
//! short (they are bounded by how far the partition ran ahead of its oldest unfinished
//! message), and the ranges mean nothing without the offset they were committed with:
//! Kafka stores the two atomically, but tools can move one without the other, so the
//! metadata names it too (`o=`, see `read_metadata` in src/consumer/committer/metadata.rs).
//!
//! **Bound**: the value is at most [`MAX_BYTES`] bytes. Ranges that do not fit are left
//! out, the highest first: those messages are redelivered after a crash, as they would be
//! without the metadata. With the rest of ackd's metadata the whole stays under 1,100
//! bytes, well under the broker's default `offset.metadata.max.bytes` (4,096).
//!
//! **Decoding is strict**: anything that is not exactly what [`encode`] writes (a
//! malformed number, a range out of order, overlapping, adjacent or at O, an overflow,
//! longer than the bound) gives no ranges at all, so a reader never skips an offset its
//! writer did not acknowledge: the worst case is redelivery, never loss.

/// The longest `a=` value written or read, in bytes.
pub const MAX_BYTES: usize = 1024;

/// The `a=` value for `ranges` (absolute, inclusive, ascending) above the committed
/// offset `committed`, at most `max_bytes` long (and never more than [`MAX_BYTES`]);
/// `None` when nothing fits or there is nothing to write. Ranges (or parts of them) at or
/// below `committed` are left out; so are the highest ranges that do not fit.
pub fn encode(committed: i64, ranges: &[(i64, i64)], max_bytes: usize) -> Option<String> {
    let max_bytes = max_bytes.min(MAX_BYTES);
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

/// The absolute ranges an `a=` value written with [`encode`] for the committed offset
/// `committed` says; empty when the value is anything else (see the module's
/// documentation).
pub fn decode(committed: i64, value: &str) -> Vec<(i64, i64)> {
    decode_strict(committed, value).unwrap_or_default()
}

fn decode_strict(committed: i64, value: &str) -> Option<Vec<(i64, i64)>> {
    if value.is_empty() || value.len() > MAX_BYTES || committed < 0 {
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

/// A relative offset as encode writes it: decimal digits, no sign, no leading zero.
fn number(s: &str) -> Option<i64> {
    let canonical =
        !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    canonical.then(|| s.parse().ok()).flatten()
}

/// How many offsets `ranges` hold.
pub fn count(ranges: &[(i64, i64)]) -> i64 {
    ranges
        .iter()
        .map(|&(a, b)| b.saturating_sub(a).saturating_add(1))
        .fold(0i64, i64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn relative_readable_form() {
        assert_eq!(
            encode(100, &[(102, 104), (107, 107), (109, 115)], MAX_BYTES).as_deref(),
            Some("2-4,7,9-15")
        );
        assert_eq!(
            decode(100, "2-4,7,9-15"),
            vec![(102, 104), (107, 107), (109, 115)]
        );
        assert_eq!(encode(100, &[], MAX_BYTES), None);
        // At or below the commit: left out, or clipped.
        assert_eq!(
            encode(100, &[(90, 95), (99, 101)], MAX_BYTES).as_deref(),
            Some("1")
        );
        // Adjacent ranges are one.
        assert_eq!(
            encode(0, &[(1, 2), (3, 4)], MAX_BYTES).as_deref(),
            Some("1-4")
        );
        let adjacent = [(1, 2), (3, 4), (6, 6), (7, 7)];
        assert_eq!(encode(0, &adjacent, MAX_BYTES).as_deref(), Some("1-4,6-7"));
        // The merged "6-7" does not fit: "6" as it was written stays.
        assert_eq!(encode(0, &adjacent, 5).as_deref(), Some("1-4,6"));
    }

    #[test]
    fn what_does_not_fit_is_left_out_from_the_top() {
        // Singles 2, 4, 6, ...: "2,4,6" is 5 bytes.
        let ranges: Vec<(i64, i64)> = (1..=1000).map(|i| (2 * i, 2 * i)).collect();
        assert_eq!(encode(0, &ranges, 5).as_deref(), Some("2,4,6"));
        assert_eq!(encode(0, &ranges, 6).as_deref(), Some("2,4,6"));
        assert_eq!(encode(0, &ranges, 1).as_deref(), Some("2"));
        assert_eq!(encode(0, &ranges, 0), None);
        let full = encode(0, &ranges, usize::MAX).unwrap();
        assert!(
            full.len() <= MAX_BYTES && full.len() > MAX_BYTES - 6,
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
            assert_eq!(decode(10, bad), vec![], "{bad:?}");
        }
        assert_eq!(decode(10, &"1,".repeat(600)), vec![]);
        // Overflow of the absolute offset.
        assert_eq!(decode(i64::MAX - 5, "3-10"), vec![]);
        assert_eq!(decode(-1, "1"), vec![]);
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
            let written = encode(committed, &ranges, max_bytes);
            let read = written.as_deref().map_or_else(Vec::new, |w| decode(committed, w));
            if let Some(w) = &written {
                prop_assert!(w.len() <= max_bytes.min(MAX_BYTES));
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
            if full.len() <= max_bytes.min(MAX_BYTES) {
                prop_assert_eq!(&got, &offsets(&above));
            }
            prop_assert_eq!(count(&read), got.len() as i64);
        }

        /// Whatever the bytes, decoding never gives an offset at or below the commit, nor
        /// ranges out of order.
        #[test]
        fn decode_of_anything_is_above_the_commit_and_ascending(
            committed in 0i64..1_000_000,
            value in "[0-9,\\-]{0,40}",
        ) {
            let read = decode(committed, &value);
            prop_assert!(read.iter().all(|&(a, b)| a > committed && a <= b));
            prop_assert!(read.windows(2).all(|w| w[0].1 + 1 < w[1].0));
        }
    }
}
