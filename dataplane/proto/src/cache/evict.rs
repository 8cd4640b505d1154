//! The eviction index of one storage tier: which entries it holds, their sizes, and which go
//! first when room is needed. Bookkeeping only — the store deletes the victims' data.
//!
//! * [`EvictPolicy::Lru`]: least recently inserted-or-hit first (a slab-backed doubly linked
//!   list: O(1) insert, hit, remove, evict).
//! * [`EvictPolicy::Fifo`]: oldest insert first; hits don't matter (same list, hits don't move).
//! * [`EvictPolicy::Lfu`]: fewest hits first (an insert counts as one use); among equal counts
//!   the one used longest ago goes first (a `BTreeMap<(uses, sequence), key>`: O(log n)).
//!   Counts only grow, so a once-popular entry can outlive newer ones: that is what LFU means
//!   for a download cache where the same big files are fetched again and again.
//!
//! Limits: `max_bytes` (sum of sizes) and `max_entries` (0 = no entry limit). An entry larger
//! than `max_bytes` never fits ([`EvictionIndex::fits`]).

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// Which entry leaves first when a tier is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum EvictPolicy {
    /// Least recently used.
    #[default]
    Lru,
    /// Least frequently used, oldest use first among equals.
    Lfu,
    /// First in, first out.
    Fifo,
}

impl EvictPolicy {
    /// `lru`, `lfu` or `fifo` (the configuration value).
    pub const fn name(self) -> &'static str {
        match self {
            EvictPolicy::Lru => "lru",
            EvictPolicy::Lfu => "lfu",
            EvictPolicy::Fifo => "fifo",
        }
    }
}

const NIL: usize = usize::MAX;

/// A slot of the linked list (LRU / FIFO).
#[derive(Debug, Clone)]
struct Slot<K> {
    key: Option<K>,
    prev: usize,
    next: usize,
}

/// Where an entry sits in the policy's order.
#[derive(Debug, Clone, Copy)]
enum Position {
    /// Slab index of its list slot.
    Slot(usize),
    /// (uses, sequence) key of the LFU map.
    Lfu(u64, u64),
}

#[derive(Debug, Clone, Copy)]
struct Node {
    size: u64,
    position: Position,
}

/// The entries of one tier, in eviction order, with byte and entry limits. See the
/// [module docs](self).
#[derive(Debug, Clone)]
pub struct EvictionIndex<K: Hash + Eq + Clone> {
    policy: EvictPolicy,
    max_bytes: u64,
    max_entries: u64,
    bytes: u64,
    nodes: HashMap<K, Node>,
    // LRU / FIFO: slab-backed list, head = next victim, tail = most recent.
    slots: Vec<Slot<K>>,
    free: Vec<usize>,
    head: usize,
    tail: usize,
    // LFU
    by_use: BTreeMap<(u64, u64), K>,
    sequence: u64,
}

impl<K: Hash + Eq + Clone> EvictionIndex<K> {
    /// An empty index. `max_entries` 0 means no entry limit.
    pub fn new(policy: EvictPolicy, max_bytes: u64, max_entries: u64) -> Self {
        EvictionIndex {
            policy,
            max_bytes,
            max_entries: if max_entries == 0 {
                u64::MAX
            } else {
                max_entries
            },
            bytes: 0,
            nodes: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            by_use: BTreeMap::new(),
            sequence: 0,
        }
    }

    /// The policy.
    pub fn policy(&self) -> EvictPolicy {
        self.policy
    }

    /// The byte limit.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Whether an entry of `size` bytes can be held at all (after evicting everything else).
    pub fn fits(&self, size: u64) -> bool {
        size <= self.max_bytes
    }

    /// Records `key` with `size` bytes as the most recent entry and returns the entries
    /// evicted to make room, oldest-first by the policy; the caller deletes their data.
    ///
    /// Re-inserting a present key replaces its size and counts as a new insert (its old
    /// record is dropped, not returned). An entry that doesn't [fit](Self::fits) is not
    /// kept: nothing else is evicted and the result is `[(key, size)]`, so the caller drops
    /// it like any victim.
    pub fn insert(&mut self, key: K, size: u64) -> Vec<(K, u64)> {
        self.remove(&key);
        if !self.fits(size) {
            return vec![(key, size)];
        }
        let mut victims = Vec::new();
        while self.bytes.saturating_add(size) > self.max_bytes
            || self.len() as u64 >= self.max_entries
        {
            match self.evict_one() {
                Some(v) => victims.push(v),
                None => break,
            }
        }
        let position = match self.policy {
            EvictPolicy::Lru | EvictPolicy::Fifo => Position::Slot(self.push_back(key.clone())),
            EvictPolicy::Lfu => {
                let seq = self.next_sequence();
                self.by_use.insert((1, seq), key.clone());
                Position::Lfu(1, seq)
            }
        };
        self.bytes = self.bytes.saturating_add(size);
        self.nodes.insert(key, Node { size, position });
        victims
    }

    /// Records a hit on `key` (no-op for an absent key, and for FIFO).
    pub fn touch(&mut self, key: &K) {
        let Some(node) = self.nodes.get(key).copied() else {
            return;
        };
        match (self.policy, node.position) {
            (EvictPolicy::Lru, Position::Slot(i)) => {
                self.unlink(i);
                self.link_back(i);
            }
            (EvictPolicy::Lfu, Position::Lfu(uses, seq)) => {
                if let Some(k) = self.by_use.remove(&(uses, seq)) {
                    let seq = self.next_sequence();
                    let uses = uses.saturating_add(1);
                    self.by_use.insert((uses, seq), k);
                    if let Some(n) = self.nodes.get_mut(key) {
                        n.position = Position::Lfu(uses, seq);
                    }
                }
            }
            _ => {}
        }
    }

    /// Forgets `key`; returns its size if it was present.
    pub fn remove(&mut self, key: &K) -> Option<u64> {
        let node = self.nodes.remove(key)?;
        match node.position {
            Position::Slot(i) => {
                self.unlink(i);
                if let Some(slot) = self.slots.get_mut(i) {
                    slot.key = None;
                }
                self.free.push(i);
            }
            Position::Lfu(uses, seq) => {
                self.by_use.remove(&(uses, seq));
            }
        }
        self.bytes = self.bytes.saturating_sub(node.size);
        Some(node.size)
    }

    /// Removes and returns the next victim by the policy (for freeing space on demand, e.g.
    /// when the disk fills up), or `None` when empty.
    pub fn evict_one(&mut self) -> Option<(K, u64)> {
        let key = match self.policy {
            EvictPolicy::Lru | EvictPolicy::Fifo => {
                self.slots.get(self.head).and_then(|s| s.key.clone())?
            }
            EvictPolicy::Lfu => self.by_use.values().next().cloned()?,
        };
        let size = self.remove(&key)?;
        Some((key, size))
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &K) -> bool {
        self.nodes.contains_key(key)
    }

    /// The recorded size of `key`.
    pub fn size_of(&self, key: &K) -> Option<u64> {
        self.nodes.get(key).map(|n| n.size)
    }

    /// Sum of the entries' sizes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The keys, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.nodes.keys()
    }

    fn next_sequence(&mut self) -> u64 {
        self.sequence = self.sequence.wrapping_add(1);
        self.sequence
    }

    /// Stores `key` in a free slot, linked at the tail; returns the slot index.
    fn push_back(&mut self, key: K) -> usize {
        let slot = Slot {
            key: Some(key),
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                if let Some(s) = self.slots.get_mut(i) {
                    *s = slot;
                }
                i
            }
            None => {
                self.slots.push(slot);
                self.slots.len() - 1
            }
        };
        self.link_back(i);
        i
    }

    fn link_back(&mut self, i: usize) {
        let old_tail = self.tail;
        if let Some(s) = self.slots.get_mut(i) {
            s.prev = old_tail;
            s.next = NIL;
        }
        match self.slots.get_mut(old_tail) {
            Some(t) => t.next = i,
            None => self.head = i,
        }
        self.tail = i;
    }

    fn unlink(&mut self, i: usize) {
        let Some((prev, next)) = self.slots.get(i).map(|s| (s.prev, s.next)) else {
            return;
        };
        match self.slots.get_mut(prev) {
            Some(p) => p.next = next,
            None => self.head = next,
        }
        match self.slots.get_mut(next) {
            Some(n) => n.prev = prev,
            None => self.tail = prev,
        }
        if let Some(s) = self.slots.get_mut(i) {
            s.prev = NIL;
            s.next = NIL;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn names(v: Vec<(&'static str, u64)>) -> Vec<&'static str> {
        v.into_iter().map(|(k, _)| k).collect()
    }

    #[test]
    fn lru_order() {
        let mut ix = EvictionIndex::new(EvictPolicy::Lru, 30, 0);
        assert!(ix.insert("a", 10).is_empty());
        assert!(ix.insert("b", 10).is_empty());
        assert!(ix.insert("c", 10).is_empty());
        ix.touch(&"a");
        assert_eq!(names(ix.insert("d", 10)), ["b"]);
        ix.touch(&"c");
        assert_eq!(names(ix.insert("e", 20)), ["a", "d"]);
        assert_eq!(ix.bytes(), 30);
        assert_eq!(ix.len(), 2);
        let mut keys: Vec<_> = ix.keys().copied().collect();
        keys.sort();
        assert_eq!(keys, ["c", "e"]);
    }

    #[test]
    fn fifo_ignores_hits() {
        let mut ix = EvictionIndex::new(EvictPolicy::Fifo, 30, 0);
        ix.insert("a", 10);
        ix.insert("b", 10);
        ix.insert("c", 10);
        ix.touch(&"a");
        ix.touch(&"a");
        assert_eq!(names(ix.insert("d", 10)), ["a"]);
        assert_eq!(names(ix.insert("e", 15)), ["b", "c"]);
    }

    #[test]
    fn lfu_counts_then_age() {
        let mut ix = EvictionIndex::new(EvictPolicy::Lfu, 40, 0);
        ix.insert("a", 10);
        ix.insert("b", 10);
        ix.insert("c", 10);
        ix.insert("d", 10);
        ix.touch(&"a"); // a: 2 uses
        ix.touch(&"a"); // a: 3
        ix.touch(&"c"); // c: 2
        ix.touch(&"b"); // b: 2, used after c
                        // d has 1 use → first; then among b and c (2 uses each) c was used longer ago
        assert_eq!(names(ix.insert("e", 20)), ["d", "c"]);
        // e (1 use) is the least used now
        assert_eq!(names(ix.insert("f", 20)), ["e"]);
        assert_eq!(names(ix.insert("g", 30)), ["f", "b"]);
        assert!(ix.contains(&"a") && ix.contains(&"g"));
    }

    #[test]
    fn entry_limit() {
        for policy in [EvictPolicy::Lru, EvictPolicy::Lfu, EvictPolicy::Fifo] {
            let mut ix = EvictionIndex::new(policy, 1000, 2);
            ix.insert(1, 1);
            ix.insert(2, 1);
            assert_eq!(ix.insert(3, 1), vec![(1, 1)], "{policy:?}");
            assert_eq!(ix.len(), 2);
        }
    }

    #[test]
    fn too_large_is_refused_and_reinsert_replaces() {
        let mut ix = EvictionIndex::new(EvictPolicy::Lru, 100, 0);
        ix.insert("a", 60);
        assert!(!ix.fits(101));
        assert!(ix.fits(100));
        assert_eq!(ix.insert("big", 101), vec![("big", 101)]);
        assert_eq!(ix.len(), 1, "nothing evicted for a refused entry");
        assert!(!ix.contains(&"big"));
        // re-insert with a new size: the old record goes silently
        assert!(ix.insert("a", 70).is_empty());
        assert_eq!(ix.bytes(), 70);
        assert_eq!(ix.size_of(&"a"), Some(70));
        // an entry of exactly max_bytes evicts everything else
        assert_eq!(ix.insert("full", 100), vec![("a", 70)]);
        // a refused re-insert drops the old record too
        assert_eq!(ix.insert("full", 200), vec![("full", 200)]);
        assert!(ix.is_empty());
        assert_eq!(ix.bytes(), 0);
    }

    #[test]
    fn remove_touch_absent_and_evict_one() {
        let mut ix = EvictionIndex::new(EvictPolicy::Lru, 100, 0);
        assert_eq!(ix.remove(&"x"), None);
        ix.touch(&"x");
        assert_eq!(ix.evict_one(), None);
        ix.insert("a", 1);
        ix.insert("b", 2);
        ix.insert("c", 3);
        assert_eq!(ix.remove(&"b"), Some(2));
        assert_eq!(ix.remove(&"b"), None);
        ix.insert("d", 4); // reuses b's slot
        assert_eq!(ix.evict_one(), Some(("a", 1)));
        assert_eq!(ix.evict_one(), Some(("c", 3)));
        assert_eq!(ix.evict_one(), Some(("d", 4)));
        assert_eq!(ix.evict_one(), None);
        assert_eq!(ix.bytes(), 0);
        assert_eq!(EvictPolicy::Lfu.name(), "lfu");
        assert_eq!(ix.policy(), EvictPolicy::Lru);
        assert_eq!(ix.max_bytes(), 100);
    }

    /// The obvious O(n) implementation, to compare against.
    struct Model {
        policy: EvictPolicy,
        max_bytes: u64,
        max_entries: u64,
        /// (key, size, uses, last-use sequence, insert sequence)
        entries: Vec<(u32, u64, u64, u64, u64)>,
        seq: u64,
    }

    impl Model {
        fn victim(&self) -> Option<usize> {
            let rank = |e: &(u32, u64, u64, u64, u64)| match self.policy {
                EvictPolicy::Lru => (0, e.3),
                EvictPolicy::Fifo => (0, e.4),
                EvictPolicy::Lfu => (e.2, e.3),
            };
            (0..self.entries.len()).min_by_key(|&i| rank(&self.entries[i]))
        }

        fn remove(&mut self, k: u32) -> Option<u64> {
            let i = self.entries.iter().position(|e| e.0 == k)?;
            Some(self.entries.remove(i).1)
        }

        fn insert(&mut self, k: u32, size: u64) -> Vec<(u32, u64)> {
            self.remove(k);
            if size > self.max_bytes {
                return vec![(k, size)];
            }
            let mut out = Vec::new();
            let limit = if self.max_entries == 0 {
                u64::MAX
            } else {
                self.max_entries
            };
            while self.entries.iter().map(|e| e.1).sum::<u64>() + size > self.max_bytes
                || self.entries.len() as u64 >= limit
            {
                let v = self.victim().unwrap();
                let e = self.entries.remove(v);
                out.push((e.0, e.1));
            }
            self.seq += 1;
            self.entries.push((k, size, 1, self.seq, self.seq));
            out
        }

        fn touch(&mut self, k: u32) {
            if self.policy == EvictPolicy::Fifo {
                return;
            }
            self.seq += 1;
            let seq = self.seq;
            if let Some(e) = self.entries.iter_mut().find(|e| e.0 == k) {
                e.2 += 1;
                e.3 = seq;
            }
        }
    }

    #[test]
    fn randomized_against_a_naive_model() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for policy in [EvictPolicy::Lru, EvictPolicy::Lfu, EvictPolicy::Fifo] {
            for round in 0..20 {
                let max_bytes = 50 + rnd(200);
                let max_entries = if round % 2 == 0 { 0 } else { 1 + rnd(12) };
                let mut ix = EvictionIndex::new(policy, max_bytes, max_entries);
                let mut model = Model {
                    policy,
                    max_bytes,
                    max_entries,
                    entries: Vec::new(),
                    seq: 0,
                };
                for _ in 0..2000 {
                    let k = rnd(40) as u32;
                    match rnd(10) {
                        0..=3 => {
                            let size = rnd(max_bytes + 20);
                            assert_eq!(ix.insert(k, size), model.insert(k, size), "{policy:?}");
                        }
                        4..=7 => {
                            ix.touch(&k);
                            model.touch(k);
                        }
                        8 => assert_eq!(ix.remove(&k), model.remove(k)),
                        _ => {
                            let want = model.victim().map(|v| {
                                let e = model.entries.remove(v);
                                (e.0, e.1)
                            });
                            assert_eq!(ix.evict_one(), want, "{policy:?}");
                        }
                    }
                    assert_eq!(ix.len(), model.entries.len());
                    assert_eq!(ix.bytes(), model.entries.iter().map(|e| e.1).sum::<u64>());
                    assert!(ix.bytes() <= max_bytes);
                }
            }
        }
    }
}
