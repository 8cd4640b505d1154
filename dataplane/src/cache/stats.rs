//! Cache counters and the seven `proxy_cache_*` metrics. The collectors live as long as the
//! store; the control plane registers them into each scrape's registry.
//!
//! Domain labels are bounded: after [`MAX_DOMAIN_LABELS`] distinct hosts, further hosts are
//! counted under `other`, so a scan of random hostnames cannot grow the metrics without limit.

use super::store::{EvictReason, Tier};
use parking_lot::Mutex;
use prometheus::core::Collector;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub const MAX_DOMAIN_LABELS: usize = 512;

/// Timed cache operations (`operation` label of the histogram).
#[derive(Debug, Clone, Copy)]
pub enum Operation {
    /// Index lookup of a request.
    Lookup,
    /// Serving a hit, head to last byte.
    ServeHit,
    /// A fill, origin response head to stored entry.
    Store,
}

impl Operation {
    fn label(self) -> &'static str {
        match self {
            Operation::Lookup => "lookup",
            Operation::ServeHit => "serve_hit",
            Operation::Store => "store",
        }
    }
}

pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub store_errors: AtomicU64,
    pub evictions: AtomicU64,
    /// Domain label → its hit counter (resolved once: a hit costs one map lookup).
    domains: Mutex<HashMap<String, IntCounter>>,
    hits_total: IntCounterVec,
    misses_total: IntCounterVec,
    bytes_served: IntCounterVec,
    storage_size: IntGaugeVec,
    storage_entries: IntGaugeVec,
    evictions_total: IntCounterVec,
    duration: HistogramVec,
    /// `bytes_served` children: [cache, origin].
    served_by_source: [IntCounter; 2],
    /// `duration` children per [`Operation`], resolved once.
    timings: [Histogram; 3],
}

impl Default for CacheStats {
    fn default() -> Self {
        Self::new()
    }
}

#[allow(clippy::expect_used)] // metric definitions are constants; a bad one is a programming error
impl CacheStats {
    pub fn new() -> Self {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "proxy_cache_operation_duration_seconds",
                "Latency of cache operations",
            )
            .buckets(vec![
                0.000_01, 0.000_05, 0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0,
                30.0,
            ]),
            &["operation"],
        )
        .expect("valid metric");
        let bytes_served = counter(
            "proxy_cache_bytes_served_total",
            "Response body bytes of cacheable requests, served from cache or from origin",
            &["source"],
        );
        CacheStats {
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            store_errors: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            domains: Mutex::new(HashMap::new()),
            hits_total: counter(
                "proxy_cache_hits_total",
                "Cache hits by domain",
                &["domain"],
            ),
            misses_total: counter(
                "proxy_cache_misses_total",
                "Cache misses by domain and reason",
                &["domain", "reason"],
            ),
            served_by_source: ["cache", "origin"]
                .map(|source| bytes_served.with_label_values(&[source])),
            bytes_served,
            storage_size: gauge(
                "proxy_cache_storage_size_bytes",
                "Bytes stored by tier",
                &["tier"],
            ),
            storage_entries: gauge(
                "proxy_cache_storage_entries",
                "Entries stored by tier",
                &["tier"],
            ),
            evictions_total: counter(
                "proxy_cache_evictions_total",
                "Entries removed by tier and reason",
                &["tier", "reason"],
            ),
            duration: duration.clone(),
            timings: [Operation::Lookup, Operation::ServeHit, Operation::Store]
                .map(|op| duration.with_label_values(&[op.label()])),
        }
    }

    /// The hit counter of `host`'s label: the host itself for the first [`MAX_DOMAIN_LABELS`]
    /// hosts seen (hit or miss), then `other`. Returns the label too.
    fn domain(&self, host: &str) -> (String, IntCounter) {
        let mut known = self.domains.lock();
        if let Some(counter) = known.get(host) {
            return (host.to_owned(), counter.clone());
        }
        if known.len() >= MAX_DOMAIN_LABELS {
            return (
                "other".to_owned(),
                self.hits_total.with_label_values(&["other"]),
            );
        }
        let counter = self.hits_total.with_label_values(&[host]);
        known.insert(host.to_owned(), counter.clone());
        (host.to_owned(), counter)
    }

    pub fn hit(&self, host: &str) {
        self.hits.fetch_add(1, Relaxed);
        if let Some(counter) = self.domains.lock().get(host) {
            counter.inc();
            return;
        }
        self.domain(host).1.inc();
    }

    pub fn miss(&self, host: &str, reason: &str) {
        self.misses.fetch_add(1, Relaxed);
        let (domain, _) = self.domain(host);
        self.misses_total
            .with_label_values(&[domain.as_str(), reason])
            .inc();
    }

    pub fn store_error(&self) {
        self.store_errors.fetch_add(1, Relaxed);
    }

    pub fn served(&self, from_cache: bool, bytes: u64) {
        self.served_by_source[usize::from(!from_cache)].inc_by(bytes);
    }

    pub fn evicted(&self, tier: Tier, reason: EvictReason) {
        self.evictions.fetch_add(1, Relaxed);
        self.evictions_total
            .with_label_values(&[tier.label(), reason.label()])
            .inc();
    }

    pub fn set_usage(&self, tier: Tier, entries: u64, bytes: u64) {
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.storage_entries
            .with_label_values(&[tier.label()])
            .set(clamp(entries));
        self.storage_size
            .with_label_values(&[tier.label()])
            .set(clamp(bytes));
    }

    pub fn observe(&self, op: Operation, started: std::time::Instant) {
        self.timings[op as usize].observe(started.elapsed().as_secs_f64());
    }

    /// The collectors, for registering into a scrape's registry.
    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.hits_total.clone()),
            Box::new(self.misses_total.clone()),
            Box::new(self.bytes_served.clone()),
            Box::new(self.storage_size.clone()),
            Box::new(self.storage_entries.clone()),
            Box::new(self.evictions_total.clone()),
            Box::new(self.duration.clone()),
        ]
    }
}
