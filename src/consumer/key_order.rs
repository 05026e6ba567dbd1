//! Which of a partition's waiting messages may start now (`ACKD_ORDERING=key`).
//!
//! Pure data, no I/O and no clock, so it is property-tested. Units (a message, or a
//! batch) arrive in offset order, each with the keys it holds; a unit may start once no
//! earlier unit that shares one of its keys is unfinished. So one key's messages are
//! processed one at a time, in offset order, while different keys run concurrently. A
//! unit with no keys (a null key, or `ACKD_ORDERING=none`) may start at once.
//!
//! Keys are held as 64-bit hashes: two keys that collide are merely ordered together
//! (less concurrency, never less order), and memory does not grow with key length.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};

/// A unit's place in the arrival order.
pub type UnitId = u64;

/// The hash a key is ordered by. Fixed seeds: the same key is the same hash in every
/// partition's scheduler (and every run), which makes collisions reproducible.
pub fn key_hash(key: &[u8]) -> u64 {
    let mut h =
        std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
            .build_hasher();
    h.write(key);
    h.finish()
}

struct Waiting<T> {
    item: T,
    keys: Vec<u64>,
    /// How many of its keys have an earlier unfinished unit.
    blocked: usize,
}

/// The units of one partition that arrived and have not finished, and their order.
pub struct KeyOrder<T> {
    /// Per key, the unfinished units that hold it, in arrival order: the front one is
    /// the only one of them that may run.
    queues: HashMap<u64, VecDeque<UnitId>>,
    /// Units not started yet.
    waiting: HashMap<UnitId, Waiting<T>>,
    /// Units that may start, by arrival (the oldest starts first).
    ready: BTreeMap<UnitId, T>,
    /// Units ready or started, and their keys, until they finish.
    running: HashMap<UnitId, Vec<u64>>,
    next_id: UnitId,
}

impl<T> Default for KeyOrder<T> {
    fn default() -> Self {
        KeyOrder {
            queues: HashMap::new(),
            waiting: HashMap::new(),
            ready: BTreeMap::new(),
            running: HashMap::new(),
            next_id: 0,
        }
    }
}

impl<T> KeyOrder<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// A unit arrives (after every unit added before it) holding `keys` (duplicates
    /// are fine). Returns its id.
    pub fn add(&mut self, mut keys: Vec<u64>, item: T) -> UnitId {
        keys.sort_unstable();
        keys.dedup();
        let id = self.next_id;
        self.next_id += 1;
        let mut blocked = 0;
        for k in &keys {
            let queue = self.queues.entry(*k).or_default();
            if !queue.is_empty() {
                blocked += 1;
            }
            queue.push_back(id);
        }
        if blocked == 0 {
            self.ready.insert(id, item);
            self.running.insert(id, keys);
        } else {
            self.waiting.insert(
                id,
                Waiting {
                    item,
                    keys,
                    blocked,
                },
            );
        }
        id
    }

    /// The oldest unit that may start now; it counts as running until [`finish`].
    ///
    /// [`finish`]: KeyOrder::finish
    pub fn start_next(&mut self) -> Option<(UnitId, T)> {
        self.ready.pop_first()
    }

    /// A started unit finished: the units its keys held back may start.
    pub fn finish(&mut self, id: UnitId) {
        let Some(keys) = self.running.remove(&id) else {
            return;
        };
        for k in keys {
            let Some(queue) = self.queues.get_mut(&k) else {
                continue;
            };
            debug_assert_eq!(queue.front(), Some(&id));
            queue.pop_front();
            let Some(&next) = queue.front() else {
                self.queues.remove(&k);
                continue;
            };
            let Some(w) = self.waiting.get_mut(&next) else {
                continue;
            };
            w.blocked -= 1;
            if w.blocked == 0 {
                let w = self.waiting.remove(&next).expect("present");
                self.ready.insert(next, w.item);
                self.running.insert(next, w.keys);
            }
        }
    }

    /// Units that arrived and have not started (ready or held back by a key).
    #[cfg(test)]
    pub fn not_started(&self) -> usize {
        self.waiting.len() + self.ready.len()
    }

    /// Units that arrived and have not finished.
    pub fn unfinished(&self) -> usize {
        self.waiting.len() + self.running.len()
    }

    /// Drops every unit not started yet (a stop: they stay unacknowledged, for the
    /// partition's next reader), keeping the order of the running ones.
    pub fn forget_not_started(&mut self) {
        let dropped: Vec<UnitId> = self
            .waiting
            .keys()
            .copied()
            .chain(self.ready.keys().copied())
            .collect();
        self.waiting.clear();
        self.ready.clear();
        for id in dropped {
            self.running.remove(&id);
        }
        for queue in self.queues.values_mut() {
            queue.retain(|id| self.running.contains_key(id));
        }
        self.queues.retain(|_, q| !q.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_key_runs_one_at_a_time_in_order() {
        let mut s = KeyOrder::new();
        let a = s.add(vec![1], "a0");
        let b = s.add(vec![1], "a1");
        s.add(vec![2], "b0");
        assert_eq!(s.start_next(), Some((a, "a0")));
        assert_eq!(s.start_next().map(|u| u.1), Some("b0"));
        assert_eq!(s.start_next(), None, "a1 waits for a0");
        s.finish(a);
        assert_eq!(s.start_next(), Some((b, "a1")));
    }

    #[test]
    fn units_without_keys_start_at_once() {
        let mut s = KeyOrder::new();
        s.add(vec![7], 0);
        s.add(vec![], 1);
        s.add(vec![], 2);
        s.add(vec![7], 3);
        let started: Vec<_> = std::iter::from_fn(|| s.start_next().map(|u| u.1)).collect();
        assert_eq!(started, vec![0, 1, 2]);
        assert_eq!(s.unfinished(), 4);
    }

    #[test]
    fn a_batch_waits_for_every_key_it_holds() {
        let mut s = KeyOrder::new();
        let a = s.add(vec![1], "a");
        let b = s.add(vec![2], "b");
        let ab = s.add(vec![1, 2, 1], "ab");
        s.add(vec![3], "c");
        assert_eq!(s.start_next().map(|u| u.1), Some("a"));
        assert_eq!(s.start_next().map(|u| u.1), Some("b"));
        assert_eq!(s.start_next().map(|u| u.1), Some("c"));
        s.finish(a);
        assert_eq!(s.start_next(), None, "still held by b");
        s.finish(b);
        assert_eq!(s.start_next(), Some((ab, "ab")));
    }

    #[test]
    fn forgetting_the_not_started_keeps_the_running() {
        let mut s = KeyOrder::new();
        let a = s.add(vec![1], 0);
        s.add(vec![1], 1);
        s.add(vec![2], 2);
        assert_eq!(s.start_next().map(|u| u.0), Some(a));
        s.forget_not_started();
        assert_eq!(s.not_started(), 0);
        assert_eq!(s.unfinished(), 1);
        s.finish(a);
        assert_eq!(s.unfinished(), 0);
        // A unit added afterwards is not held back by the forgotten ones.
        s.add(vec![1], 3);
        assert_eq!(s.start_next().map(|u| u.1), Some(3));
    }

    proptest! {
        /// For any keys and any order of completion: a unit never starts while an
        /// earlier unfinished unit shares a key with it; units of one key start in
        /// arrival order; every unit starts once everything before it finished; and up
        /// to a concurrency limit, whatever may run does.
        #[test]
        fn keys_are_never_run_out_of_order(
            units in prop::collection::vec(prop::collection::vec(0u64..6, 0..3), 1..80),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 200),
            limit in 1usize..8,
        ) {
            let mut s = KeyOrder::new();
            for (i, keys) in units.iter().enumerate() {
                s.add(keys.clone(), i);
            }
            let mut finished = vec![false; units.len()];
            let mut running: Vec<(UnitId, usize)> = Vec::new();
            let mut started = vec![false; units.len()];
            let mut picks = picks.into_iter();
            loop {
                while running.len() < limit {
                    let Some((id, i)) = s.start_next() else { break };
                    prop_assert_eq!(id as usize, i);
                    // Every earlier unit sharing a key has finished.
                    for (j, keys) in units[..i].iter().enumerate() {
                        if keys.iter().any(|k| units[i].contains(k)) {
                            prop_assert!(finished[j], "unit {} started before {} finished", i, j);
                        }
                    }
                    started[i] = true;
                    running.push((id, i));
                }
                if running.is_empty() {
                    break;
                }
                let pick = picks.next().map_or(0, |p| p.index(running.len()));
                let (id, i) = running.swap_remove(pick);
                s.finish(id);
                finished[i] = true;
            }
            prop_assert!(started.iter().all(|s| *s), "a unit never started");
            prop_assert_eq!(s.unfinished(), 0);
        }
    }
}
