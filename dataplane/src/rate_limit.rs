//! Token buckets shared by all cores without locks: a fixed table of atomic buckets indexed by a
//! hash of the client address. Each bucket packs its tokens and its last refill time into one
//! `AtomicU64` updated by compare-and-swap, so a client whose connections land on different cores
//! still sees one budget. Two clients that hash to the same slot share it (the table is large, so
//! that is rare and only ever makes the limit stricter).
//!
//! The limiters outlive configuration snapshots: a reload hands the previous snapshot's limiter
//! to the new one and changes its rate, burst and mode in place ([`RequestLimiter::carry_over`]),
//! so a reload never grants a client a fresh budget, and connections still holding an older
//! snapshot spend from the same buckets under the new settings.

use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
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
    rate: AtomicU64,
    /// Bucket capacity in token units.
    burst: AtomicU64,
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
            rate: AtomicU64::new(rate.max(1)),
            burst: AtomicU64::new(burst),
            epoch: Instant::now(),
            hasher: Default::default(),
        }
    }

    /// New rate and burst for every bucket; tokens already in a bucket stay (capped at the new
    /// burst on the next take).
    pub fn reconfigure(&self, rate: u64, burst: u64) {
        self.rate.store(rate.max(1), Ordering::Relaxed);
        self.burst
            .store(burst.clamp(1, TOKEN_MAX), Ordering::Relaxed);
    }

    fn burst(&self) -> u64 {
        self.burst.load(Ordering::Relaxed)
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

    /// Tokens `key` could take now, without taking any.
    pub fn available(&self, key: Option<IpAddr>) -> u64 {
        let current = self.slot(key).load(Ordering::Relaxed);
        let (tokens, then) = (current >> TIME_BITS, current & TIME_MASK);
        let elapsed = self.now_ms().wrapping_sub(then) & TIME_MASK;
        let refill = elapsed.saturating_mul(self.rate.load(Ordering::Relaxed)) / 1000;
        tokens.saturating_add(refill).min(self.burst())
    }

    /// Takes `amount` tokens for `key` (None = one global bucket). Amounts above the burst are
    /// clamped to it, so a large write is never refused forever.
    pub fn take(&self, key: Option<IpAddr>, amount: u64) -> Take {
        let (rate, burst) = (self.rate.load(Ordering::Relaxed), self.burst());
        let amount = amount.min(burst);
        let slot = self.slot(key);
        let now = self.now_ms();
        let mut current = slot.load(Ordering::Relaxed);
        loop {
            let tokens = current >> TIME_BITS;
            let then = current & TIME_MASK;
            let elapsed = now.wrapping_sub(then) & TIME_MASK;
            let refill = elapsed.saturating_mul(rate) / 1000;
            let available = tokens.saturating_add(refill).min(burst);
            let (next, result) = if available >= amount {
                (available - amount, Take::Granted)
            } else {
                let missing = amount - available;
                let wait_ms = (missing.saturating_mul(1000)).div_ceil(rate).max(1);
                (available, Take::Wait(Duration::from_millis(wait_ms)))
            };
            // Only advance the clock by what the refill actually credited, so fractional tokens
            // are not lost between frequent takes.
            let credited_ms = if refill == 0 { 0 } else { elapsed };
            let new_time = if available == burst {
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

/// A table's settings that can change on reload: on/off and per client address or global.
#[derive(Debug)]
struct Mode {
    enabled: AtomicBool,
    per_ip: AtomicBool,
}

impl Mode {
    fn new(per_ip: bool) -> Self {
        Self {
            enabled: AtomicBool::new(true),
            per_ip: AtomicBool::new(per_ip),
        }
    }

    /// The bucket key for `client`, or `None` when limiting is off.
    fn key(&self, client: IpAddr) -> Option<Option<IpAddr>> {
        self.enabled
            .load(Ordering::Relaxed)
            .then(|| self.per_ip.load(Ordering::Relaxed).then_some(client))
    }

    fn set(&self, enabled: bool, per_ip: bool) {
        self.per_ip.store(per_ip, Ordering::Relaxed);
        self.enabled.store(enabled, Ordering::Relaxed);
    }
}

/// Hands `previous` on, reconfigured, when there is one; otherwise builds a limiter only when
/// `wanted`. A limiter turned off stays in the snapshot (disabled) so turning it back on keeps
/// the budgets too.
fn carry<L>(
    previous: Option<&Arc<L>>,
    wanted: bool,
    reconfigure: impl FnOnce(&L),
    build: impl FnOnce() -> L,
) -> Option<Arc<L>> {
    match previous {
        Some(l) => {
            reconfigure(l);
            Some(l.clone())
        }
        None => wanted.then(|| Arc::new(build())),
    }
}

/// The request-rate limiter: `requests_per_second` with `burst_size`, per client IP or global.
#[derive(Debug)]
pub struct RequestLimiter {
    table: BucketTable,
    mode: Mode,
}

/// Milli-requests per request, so fractional rates (0.5 rps) work.
const MILLI: u64 = 1000;
/// One slot is enough for a global limit, but the mode can change to per-IP on reload.
const REQUEST_SLOTS: usize = 65_536;
const BANDWIDTH_SLOTS: usize = 16_384;

fn request_units(requests_per_second: f64, burst: u32) -> (u64, u64) {
    let rate = (requests_per_second.max(0.001) * MILLI as f64) as u64;
    (rate, u64::from(burst.max(1)) * MILLI)
}

impl RequestLimiter {
    pub fn new(requests_per_second: f64, burst: u32, per_ip: bool) -> Self {
        let (rate, burst) = request_units(requests_per_second, burst);
        Self {
            table: BucketTable::new(REQUEST_SLOTS, rate, burst),
            mode: Mode::new(per_ip),
        }
    }

    /// The limiter of the next snapshot: `previous` reconfigured in place (budgets kept), or a
    /// new one; `None` while rate limiting was never on.
    pub fn carry_over(
        previous: Option<&Arc<Self>>,
        enabled: bool,
        requests_per_second: f64,
        burst: u32,
        per_ip: bool,
    ) -> Option<Arc<Self>> {
        let enabled = enabled && requests_per_second > 0.0;
        carry(
            previous,
            enabled,
            |l| {
                let (rate, burst) = request_units(requests_per_second, burst);
                l.table.reconfigure(rate, burst);
                l.mode.set(enabled, per_ip);
            },
            || Self::new(requests_per_second, burst, per_ip),
        )
    }

    /// True when the request may proceed now.
    pub fn admit(&self, client: IpAddr) -> bool {
        match self.mode.key(client) {
            Some(key) => self.table.take(key, MILLI) == Take::Granted,
            None => true,
        }
    }
}

/// Bandwidth shaping in bytes per second, per client IP or global; one second of burst.
#[derive(Debug)]
pub struct BandwidthLimiter {
    table: BucketTable,
    mode: Mode,
}

impl BandwidthLimiter {
    pub fn new(bytes_per_second: u64, per_ip: bool) -> Self {
        Self {
            table: BucketTable::new(BANDWIDTH_SLOTS, bytes_per_second, bytes_per_second),
            mode: Mode::new(per_ip),
        }
    }

    /// Like [`RequestLimiter::carry_over`]; a rate of 0 means unlimited.
    pub fn carry_over(
        previous: Option<&Arc<Self>>,
        enabled: bool,
        bytes_per_second: u64,
        per_ip: bool,
    ) -> Option<Arc<Self>> {
        let enabled = enabled && bytes_per_second > 0;
        carry(
            previous,
            enabled,
            |l| {
                l.table.reconfigure(bytes_per_second, bytes_per_second);
                l.mode.set(enabled, per_ip);
            },
            || Self::new(bytes_per_second, per_ip),
        )
    }

    pub fn take(&self, client: IpAddr, bytes: u64) -> Take {
        match self.mode.key(client) {
            Some(key) => self.table.take(key, bytes),
            None => Take::Granted,
        }
    }

    /// The largest single grant, so callers can split writes into chunks that will be granted.
    pub fn max_chunk(&self) -> u64 {
        self.table.burst()
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
    fn carried_over_limiters_keep_budgets_and_take_new_settings() {
        let first = RequestLimiter::carry_over(None, true, 0.01, 2, true).expect("limiter");
        let a = ip("10.0.0.9");
        assert!(first.admit(a) && first.admit(a) && !first.admit(a));
        // Same settings: the budget is not reset.
        let second = RequestLimiter::carry_over(Some(&first), true, 0.01, 2, true).expect("kept");
        assert!(!second.admit(a));
        // Turned off: old holders are not limited either; turned on again: budget still spent.
        let off = RequestLimiter::carry_over(Some(&second), false, 0.01, 2, true).expect("kept");
        assert!(first.admit(a) && off.admit(a));
        let on = RequestLimiter::carry_over(Some(&off), true, 0.01, 2, true).expect("kept");
        assert!(!on.admit(a) && !first.admit(a));
        assert!(RequestLimiter::carry_over(None, false, 1.0, 1, true).is_none());
        let bw = BandwidthLimiter::carry_over(None, true, 4096, false).expect("limiter");
        assert_eq!(bw.take(a, 4096), Take::Granted);
        let bw2 = BandwidthLimiter::carry_over(Some(&bw), true, 8192, false).expect("kept");
        assert_eq!(bw2.max_chunk(), 8192);
        assert!(matches!(bw.take(a, 8192), Take::Wait(_)));
    }

    #[test]
    fn available_does_not_take() {
        let t = BucketTable::new(4, 1, 5);
        let k = Some(ip("10.0.0.3"));
        assert_eq!(t.available(k), 5);
        assert_eq!(t.available(k), 5);
        assert_eq!(t.take(k, 3), Take::Granted);
        assert_eq!(t.available(k), 2);
    }

    #[test]
    fn bandwidth_chunk_bound() {
        let b = BandwidthLimiter::new(4096, false);
        assert_eq!(b.max_chunk(), 4096);
        assert_eq!(b.take(ip("1.2.3.4"), 4096), Take::Granted);
        assert!(matches!(b.take(ip("1.2.3.4"), 4096), Take::Wait(_)));
    }
}
