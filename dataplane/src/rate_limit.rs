//! Token buckets shared by all cores without locks: a fixed table of atomic buckets indexed by a
//! hash of the client address. Each bucket packs its tokens and its last refill time into one
//! `AtomicU64` updated by compare-and-swap, so a client whose connections land on different cores
//! still sees one budget. Two clients that hash to the same slot share it (the table is large, so
//! that is rare and only ever makes the limit stricter).

use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const TIME_BITS: u32 = 26; // milliseconds, wraps after ~18.6 h
const TIME_MASK: u64 = (1 << TIME_BITS) - 1;
const TOKEN_MAX: u64 = (1 << (64 - TIME_BITS)) - 1;

/// Outcome of taking tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    Granted,
    /// Not enough tokens; this long until they would be.
    Wait(Duration),
}

#[derive(Debug)]
pub struct BucketTable {
    slots: Box<[AtomicU64]>,
    /// Tokens added per second, in token units.
    rate: u64,
    /// Bucket capacity in token units.
    burst: u64,
    epoch: Instant,
    hasher: std::collections::hash_map::RandomState,
}

impl BucketTable {
    /// `rate` and `burst` are in token units (callers choose the unit: milli-requests, bytes).
    pub fn new(slots: usize, rate: u64, burst: u64) -> Self {
        let burst = burst.clamp(1, TOKEN_MAX);
        // A full bucket with time 0: the first take refills nothing and spends from the burst.
        let full = burst << TIME_BITS;
        Self {
            slots: (0..slots.max(1)).map(|_| AtomicU64::new(full)).collect(),
            rate: rate.max(1),
            burst,
            epoch: Instant::now(),
            hasher: Default::default(),
        }
    }

    fn now_ms(&self) -> u64 {
        (self.epoch.elapsed().as_millis() as u64) & TIME_MASK
    }

    fn slot(&self, key: Option<IpAddr>) -> &AtomicU64 {
        let index = match key {
            None => 0,
            Some(ip) => {
                let mut h = self.hasher.build_hasher();
                std::hash::Hash::hash(&ip, &mut h);
                (h.finish() as usize) % self.slots.len()
            }
        };
        &self.slots[index]
    }

    /// Takes `amount` tokens for `key` (None = one global bucket). Amounts above the burst are
    /// clamped to it, so a large write is never refused forever.
    pub fn take(&self, key: Option<IpAddr>, amount: u64) -> Take {
        let amount = amount.min(self.burst);
        let slot = self.slot(key);
        let now = self.now_ms();
        let mut current = slot.load(Ordering::Relaxed);
        loop {
            let tokens = current >> TIME_BITS;
            let then = current & TIME_MASK;
            let elapsed = now.wrapping_sub(then) & TIME_MASK;
            let refill = elapsed.saturating_mul(self.rate) / 1000;
            let available = tokens.saturating_add(refill).min(self.burst);
            let (next, result) = if available >= amount {
                (available - amount, Take::Granted)
            } else {
                let missing = amount - available;
                let wait_ms = (missing.saturating_mul(1000)).div_ceil(self.rate).max(1);
                (available, Take::Wait(Duration::from_millis(wait_ms)))
            };
            // Only advance the clock by what the refill actually credited, so fractional tokens
            // are not lost between frequent takes.
            let credited_ms = if refill == 0 { 0 } else { elapsed };
            let new_time = if available == self.burst {
                now
            } else {
                (then + credited_ms) & TIME_MASK
            };
            let packed = (next << TIME_BITS) | new_time;
            match slot.compare_exchange_weak(current, packed, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return result,
                Err(actual) => current = actual,
            }
        }
    }
}

/// The request-rate limiter: `requests_per_second` with `burst_size`, per client IP or global.
#[derive(Debug)]
pub struct RequestLimiter {
    table: BucketTable,
    per_ip: bool,
}

/// Milli-requests per request, so fractional rates (0.5 rps) work.
const MILLI: u64 = 1000;

impl RequestLimiter {
    pub fn new(requests_per_second: f64, burst: u32, per_ip: bool) -> Self {
        let rate = (requests_per_second.max(0.001) * MILLI as f64) as u64;
        let slots = if per_ip { 65_536 } else { 1 };
        Self {
            table: BucketTable::new(slots, rate, u64::from(burst.max(1)) * MILLI),
            per_ip,
        }
    }

    /// True when the request may proceed now.
    pub fn admit(&self, client: IpAddr) -> bool {
        let key = self.per_ip.then_some(client);
        self.table.take(key, MILLI) == Take::Granted
    }
}

/// Bandwidth shaping in bytes per second, per client IP or global; one second of burst.
#[derive(Debug)]
pub struct BandwidthLimiter {
    table: BucketTable,
    per_ip: bool,
}

impl BandwidthLimiter {
    pub fn new(bytes_per_second: u64, per_ip: bool) -> Self {
        let slots = if per_ip { 16_384 } else { 1 };
        Self {
            table: BucketTable::new(slots, bytes_per_second, bytes_per_second),
            per_ip,
        }
    }

    pub fn take(&self, client: IpAddr, bytes: u64) -> Take {
        self.table.take(self.per_ip.then_some(client), bytes)
    }

    /// The largest single grant, so callers can split writes into chunks that will be granted.
    pub fn max_chunk(&self) -> u64 {
        self.table.burst
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn burst_then_refuse() {
        let l = RequestLimiter::new(1.0, 3, true);
        let a = ip("10.0.0.1");
        assert!(l.admit(a));
        assert!(l.admit(a));
        assert!(l.admit(a));
        assert!(!l.admit(a));
    }

    #[test]
    fn per_ip_budgets_are_separate_global_is_shared() {
        let l = RequestLimiter::new(1.0, 1, true);
        // Distinct addresses: a collision in 65536 slots for these two is astronomically unlikely
        // but possible; pick several and require most to be admitted.
        let admitted = (1..=20)
            .filter(|i| l.admit(ip(&format!("10.0.1.{i}"))))
            .count();
        assert!(admitted >= 19);
        let g = RequestLimiter::new(1.0, 1, false);
        assert!(g.admit(ip("10.0.0.1")));
        assert!(!g.admit(ip("10.0.0.2")));
    }

    #[test]
    fn wait_reports_time_to_refill() {
        let t = BucketTable::new(1, 1000, 1000);
        assert_eq!(t.take(None, 1000), Take::Granted);
        match t.take(None, 500) {
            Take::Wait(d) => assert!(d <= Duration::from_millis(500) && d > Duration::ZERO),
            Take::Granted => panic!("bucket should be empty"),
        }
    }

    #[test]
    fn oversize_amount_is_clamped_to_burst() {
        let t = BucketTable::new(1, 10, 10);
        assert_eq!(t.take(None, 1_000_000), Take::Granted);
    }

    #[test]
    fn bandwidth_chunk_bound() {
        let b = BandwidthLimiter::new(4096, false);
        assert_eq!(b.max_chunk(), 4096);
        assert_eq!(b.take(ip("1.2.3.4"), 4096), Take::Granted);
        assert!(matches!(b.take(ip("1.2.3.4"), 4096), Take::Wait(_)));
    }
}
