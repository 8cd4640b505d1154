//! Per-core counters, summed on read. Each core writes only its own cache-padded slot, so the
//! hot path never contends; readers (the control plane) add the slots up.

use crossbeam_utils::CachePadded;
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// One core's counters of one subject (the whole server, or one backend).
#[derive(Debug, Default)]
pub struct CoreCounters {
    pub total_connections: AtomicU64,
    pub active_connections: AtomicI64,
    /// Bytes written towards proxy clients (downstream).
    pub bytes_sent: AtomicU64,
    /// Bytes read from proxy clients (upstream direction).
    pub bytes_received: AtomicU64,
    /// Of the tunnel bytes above (both directions), those moved by `splice(2)`, never copied
    /// through user space.
    pub bytes_spliced: AtomicU64,
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    /// Sum of connect latencies in microseconds, with `connects`, for an average.
    pub connect_latency_us: AtomicU64,
    pub connects: AtomicU64,
    /// Requests by protocol: HTTP, CONNECT, SOCKS5 (index = [`Protocol`] order).
    pub requests_by_protocol: [AtomicU64; 3],
    /// Answers by status class: 1xx … 5xx (index 1–5; 0 = no status, e.g. SOCKS5 failures).
    pub responses_by_class: [AtomicU64; 6],
}

/// Counters of one subject across all cores.
#[derive(Debug)]
pub struct Counters {
    cores: Box<[CachePadded<CoreCounters>]>,
}

/// A consistent-enough sum of all cores' counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CounterTotals {
    pub total_connections: u64,
    pub active_connections: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub bytes_spliced: u64,
    pub requests: u64,
    pub errors: u64,
    /// Average connect latency in milliseconds (0 before the first connect).
    pub latency_ms: u64,
    pub requests_by_protocol: [u64; 3],
    pub responses_by_class: [u64; 6],
}

impl Counters {
    pub fn new(cores: usize) -> Self {
        let cores = (0..cores.max(1))
            .map(|_| CachePadded::new(CoreCounters::default()))
            .collect();
        Self { cores }
    }

    /// The slot of `core`; out-of-range cores share the last slot rather than panic.
    pub fn core(&self, core: usize) -> &CoreCounters {
        let last = self.cores.len() - 1;
        &self.cores[core.min(last)]
    }

    pub fn totals(&self) -> CounterTotals {
        let mut t = CounterTotals::default();
        let mut active: i64 = 0;
        let (mut lat, mut n) = (0u64, 0u64);
        for c in self.cores.iter() {
            t.total_connections += c.total_connections.load(Relaxed);
            active += c.active_connections.load(Relaxed);
            t.bytes_sent += c.bytes_sent.load(Relaxed);
            t.bytes_received += c.bytes_received.load(Relaxed);
            t.bytes_spliced += c.bytes_spliced.load(Relaxed);
            t.requests += c.requests.load(Relaxed);
            t.errors += c.errors.load(Relaxed);
            lat += c.connect_latency_us.load(Relaxed);
            for (t, c) in t
                .requests_by_protocol
                .iter_mut()
                .zip(&c.requests_by_protocol)
            {
                *t += c.load(Relaxed);
            }
            for (t, c) in t.responses_by_class.iter_mut().zip(&c.responses_by_class) {
                *t += c.load(Relaxed);
            }
            n += c.connects.load(Relaxed);
        }
        // A connection may open on one core's count and close on... the same core: it never
        // migrates, so the sum is exact; clamp anyway in case of a torn read.
        t.active_connections = active.max(0) as u64;
        t.latency_ms = lat.checked_div(n).map_or(0, |us| us / 1000);
        t
    }
}

impl Counters {
    /// Connections open across all cores (one read of each core's slot).
    pub fn active_total(&self) -> u64 {
        let sum: i64 = self
            .cores
            .iter()
            .map(|c| c.active_connections.load(Relaxed))
            .sum();
        sum.max(0) as u64
    }

    /// Connections open on every core but `core`.
    pub fn active_except(&self, core: usize) -> u64 {
        let own = core.min(self.cores.len() - 1);
        let sum: i64 = self
            .cores
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != own)
            .map(|(_, c)| c.active_connections.load(Relaxed))
            .sum();
        sum.max(0) as u64
    }
}

/// How old a core's estimate of the other cores' open connections may get.
pub const OTHERS_REFRESH: Duration = Duration::from_millis(1);
/// How close to the limit (at least; an eighth of it when that is more) every check reads the
/// exact sum, so a small limit is always checked exactly.
pub const NEAR_LIMIT_MIN: u64 = 64;

/// One core's estimate of the connections open on the other cores, for the connection limit.
/// Summing every core's count on every accept reads a line each of them writes on every open
/// and close: on N cores, N - 1 cache misses per accepted connection, and a miss for each owner
/// on its next write. The estimate is read again only when it is older than
/// [`OTHERS_REFRESH`] or when the total comes within an eighth of the limit (or
/// [`NEAR_LIMIT_MIN`]), where the check reads the exact sum every time as before. Far from the
/// limit it can miss only what the other cores opened in the last millisecond.
#[derive(Debug, Default)]
pub struct LimitView {
    others: Cell<u64>,
    read_at: Cell<Option<Instant>>,
}

impl LimitView {
    /// Whether more than `limit` connections are open, this `core`'s own counted exactly.
    pub fn over(&self, counters: &Counters, core: usize, limit: u64, now: Instant) -> bool {
        let own = counters.core(core).active_connections.load(Relaxed).max(0) as u64;
        let stale = self
            .read_at
            .get()
            .is_none_or(|at| now.saturating_duration_since(at) >= OTHERS_REFRESH);
        let margin = (limit / 8).max(NEAR_LIMIT_MIN);
        if stale || own + self.others.get() >= limit.saturating_sub(margin) {
            self.others.set(counters.active_except(core));
            self.read_at.set(Some(now));
        }
        own + self.others.get() > limit
    }
}

/// One core's share of the load, for per-core metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CoreLoad {
    pub active_connections: u64,
    pub total_connections: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub requests: u64,
}

impl Counters {
    /// Each core's load, in core order (slot index = data-plane core index).
    pub fn per_core(&self) -> Vec<CoreLoad> {
        self.cores
            .iter()
            .map(|c| CoreLoad {
                active_connections: c.active_connections.load(Relaxed).max(0) as u64,
                total_connections: c.total_connections.load(Relaxed),
                bytes_sent: c.bytes_sent.load(Relaxed),
                bytes_received: c.bytes_received.load(Relaxed),
                requests: c.requests.load(Relaxed),
            })
            .collect()
    }
}

impl CoreCounters {
    pub fn opened(&self) {
        self.total_connections.fetch_add(1, Relaxed);
        self.active_connections.fetch_add(1, Relaxed);
    }
    pub fn closed(&self) {
        self.active_connections.fetch_sub(1, Relaxed);
    }
    pub fn add_sent(&self, n: u64) {
        self.bytes_sent.fetch_add(n, Relaxed);
    }
    pub fn add_received(&self, n: u64) {
        self.bytes_received.fetch_add(n, Relaxed);
    }
    pub fn add_spliced(&self, n: u64) {
        self.bytes_spliced.fetch_add(n, Relaxed);
    }
    pub fn request(&self, protocol: crate::events::Protocol, status: u16) {
        self.requests.fetch_add(1, Relaxed);
        // the client's VPN flows have no slot here (the metrics label the three proxy protocols)
        if let Some(n) = self.requests_by_protocol.get(protocol as usize) {
            n.fetch_add(1, Relaxed);
        }
        let class = usize::from(status / 100).min(5);
        self.responses_by_class[class].fetch_add(1, Relaxed);
    }
    pub fn connected_in(&self, d: std::time::Duration) {
        self.connect_latency_us
            .fetch_add(d.as_micros().min(u64::MAX as u128) as u64, Relaxed);
        self.connects.fetch_add(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_cores() {
        let c = Counters::new(2);
        c.core(0).opened();
        c.core(1).opened();
        c.core(1).closed();
        c.core(0).add_sent(10);
        c.core(1).add_sent(5);
        c.core(7).add_received(3); // clamps to the last core
        let t = c.totals();
        assert_eq!(t.total_connections, 2);
        assert_eq!(t.active_connections, 1);
        assert_eq!(t.bytes_sent, 15);
        assert_eq!(t.bytes_received, 3);
        assert_eq!(c.active_total(), 1);
    }

    #[test]
    fn per_core_load() {
        let c = Counters::new(2);
        c.core(1).opened();
        c.core(1).add_sent(7);
        let l = c.per_core();
        assert_eq!(l.len(), 2);
        assert_eq!(l[0], CoreLoad::default());
        assert_eq!(
            (
                l[1].active_connections,
                l[1].total_connections,
                l[1].bytes_sent
            ),
            (1, 1, 7)
        );
    }

    #[test]
    fn the_limit_reads_the_other_cores_rarely_far_from_it_and_always_near_it() {
        let c = Counters::new(2);
        let view = LimitView::default();
        let t0 = Instant::now();
        c.core(0).opened();
        assert!(!view.over(&c, 0, 1000, t0));
        // Core 1 opens 500 connections: a fresh estimate far from the limit is not read again.
        for _ in 0..500 {
            c.core(1).opened();
        }
        assert!(!view.over(&c, 0, 1000, t0));
        assert_eq!(view.others.get(), 0);
        // A millisecond later it is.
        assert!(!view.over(&c, 0, 1000, t0 + OTHERS_REFRESH));
        assert_eq!(view.others.get(), 500);
        // Within an eighth of the limit every check reads the exact sum.
        for _ in 0..450 {
            c.core(1).opened();
        }
        let t1 = t0 + OTHERS_REFRESH;
        assert!(!view.over(&c, 0, 1000, t1)); // 1 + 500 (stale, far): not read
        for _ in 0..400 {
            c.core(0).opened();
        }
        // own 401 + 500 ≥ 875: read again, 401 + 950 > 1000
        assert!(view.over(&c, 0, 1000, t1));
        assert_eq!(view.others.get(), 950);
        // Small limits are always near: exact every time.
        let small = LimitView::default();
        let c = Counters::new(2);
        c.core(0).opened();
        assert!(!small.over(&c, 0, 2, t0));
        c.core(1).opened();
        c.core(1).opened();
        assert!(small.over(&c, 0, 2, t0));
        c.core(1).closed();
        assert!(!small.over(&c, 0, 2, t0));
    }

    #[test]
    fn average_latency() {
        let c = Counters::new(1);
        c.core(0).connected_in(std::time::Duration::from_millis(10));
        c.core(0).connected_in(std::time::Duration::from_millis(30));
        assert_eq!(c.totals().latency_ms, 20);
    }
}
