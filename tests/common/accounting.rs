//! Accounting across runs: lost, duplicated, refused commits, where members resumed.

use std::collections::{BTreeMap, HashMap};

use super::{lines::*, produce::*};

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
