//! Duplicate suppression for flooded packets: a bounded, ageing set of (origin, id) keys.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

/// Keys are kept this long (a flood crosses the mesh in well under a second).
pub const SEEN_TTL: Duration = Duration::from_secs(30);
/// At most this many keys; the oldest go first (a peer flooding faster than this per
/// [`SEEN_TTL`] only risks duplicates, never unbounded memory).
pub const SEEN_CAPACITY: usize = 8192;

/// The (origin, id) pairs of floods already delivered here.
#[derive(Debug, Default)]
pub struct SeenCache {
    keys: HashSet<(String, u64)>,
    order: VecDeque<((String, u64), Instant)>,
}

impl SeenCache {
    /// Records the key; true when it was not seen before (deliver), false for a duplicate.
    pub fn insert(&mut self, origin: &str, id: u64, now: Instant) -> bool {
        self.expire(now);
        let key = (origin.to_owned(), id);
        if self.keys.contains(&key) {
            return false;
        }
        while self.order.len() >= SEEN_CAPACITY {
            match self.order.pop_front() {
                Some((old, _)) => {
                    self.keys.remove(&old);
                }
                None => break,
            }
        }
        self.keys.insert(key.clone());
        self.order.push_back((key, now));
        true
    }

    /// How many keys are held.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn expire(&mut self, now: Instant) {
        while let Some((_, at)) = self.order.front() {
            if now.saturating_duration_since(*at) < SEEN_TTL {
                break;
            }
            if let Some((key, _)) = self.order.pop_front() {
                self.keys.remove(&key);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_are_refused_until_they_age_out() {
        let t0 = Instant::now();
        let mut c = SeenCache::default();
        assert!(c.insert("a", 1, t0));
        assert!(!c.insert("a", 1, t0 + Duration::from_secs(1)));
        assert!(c.insert("b", 1, t0), "the origin is part of the key");
        assert!(c.insert("a", 2, t0), "the id is part of the key");
        assert!(c.insert("a", 1, t0 + SEEN_TTL), "aged out");
    }

    #[test]
    fn capacity_is_bounded() {
        let t0 = Instant::now();
        let mut c = SeenCache::default();
        for id in 0..(SEEN_CAPACITY as u64 + 100) {
            assert!(c.insert("a", id, t0));
        }
        assert_eq!(c.len(), SEEN_CAPACITY);
        assert!(c.insert("a", 0, t0), "the oldest key was evicted");
    }
}
