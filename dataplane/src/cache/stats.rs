//! Cache counters and the seven `proxy_cache_*` metrics. The collectors live as long as the
//! store; the control plane registers them into each scrape's registry.
//!
//! Domain labels are bounded: after [`MAX_DOMAIN_LABELS`] distinct hosts, further hosts are
//! counted under `other`, so a scan of random hostnames cannot grow the metrics without limit.
//!
//! The per-request path takes no lock: the resolved per-domain counters sit in an immutable
//! map behind an `ArcSwap` (one atomic load and a hash lookup per hit or miss); a host seen for
//! the first time is added by copy-and-swap (`rcu`), at most [`MAX_DOMAIN_LABELS`] times per
//! process. The scrape only reads the prometheus collectors.

use super::store::{EvictReason, Tier};
use arc_swap::ArcSwap;
use prometheus::core::Collector;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

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
    /// Domain label → its counters (resolved once: a hit costs one map lookup, no lock).
    domains: ArcSwap<HashMap<String, Arc<DomainCounters>>>,
    /// The counters of hosts past the label limit.
    other: std::sync::OnceLock<Arc<DomainCounters>>,
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

/// One domain label's counters, resolved from the metric vectors once.
struct DomainCounters {
    label: String,
    hits: IntCounter,
    /// Miss reason → counter; reasons are a small fixed set of static labels.
    misses: ArcSwap<Vec<(&'static str, IntCounter)>>,
}

impl DomainCounters {
    fn new(stats: &CacheStats, label: &str) -> Self {
        DomainCounters {
            label: label.to_owned(),
            hits: stats.hits_total.with_label_values(&[label]),
            misses: ArcSwap::from_pointee(Vec::new()),
        }
    }

    fn miss(&self, stats: &CacheStats, reason: &'static str) -> IntCounter {
        if let Some((_, c)) = self.misses.load().iter().find(|(r, _)| *r == reason) {
            return c.clone();
        }
        let counter = stats
            .misses_total
            .with_label_values(&[self.label.as_str(), reason]);
        self.misses.rcu(|known| {
            if known.iter().any(|(r, _)| *r == reason) {
                return known.clone();
            }
            let mut next = Vec::clone(known);
            next.push((reason, counter.clone()));
            Arc::new(next)
        });
        counter
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
            domains: ArcSwap::from_pointee(HashMap::new()),
            other: std::sync::OnceLock::new(),
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

    /// The counters of `host`'s label: the host itself for the first [`MAX_DOMAIN_LABELS`]
    /// hosts seen (hit or miss), then `other`.
    fn domain(&self, host: &str) -> Arc<DomainCounters> {
        let known = self.domains.load();
        if let Some(c) = known.get(host) {
            return c.clone();
        }
        if known.len() >= MAX_DOMAIN_LABELS {
            return self.other();
        }
        drop(known);
        let fresh = Arc::new(DomainCounters::new(self, host));
        let mut chosen = None;
        self.domains.rcu(|known| {
            if let Some(c) = known.get(host) {
                chosen = Some(c.clone());
                return known.clone();
            }
            if known.len() >= MAX_DOMAIN_LABELS {
                chosen = None;
                return known.clone();
            }
            chosen = Some(fresh.clone());
            let mut next = HashMap::clone(known);
            next.insert(host.to_owned(), fresh.clone());
            Arc::new(next)
        });
        chosen.unwrap_or_else(|| self.other())
    }

    fn other(&self) -> Arc<DomainCounters> {
        self.other
            .get_or_init(|| Arc::new(DomainCounters::new(self, "other")))
            .clone()
    }

    pub fn hit(&self, host: &str) {
        self.hits.fetch_add(1, Relaxed);
        self.domain(host).hits.inc();
    }

    pub fn miss(&self, host: &str, reason: &'static str) {
        self.misses.fetch_add(1, Relaxed);
        self.domain(host).miss(self, reason).inc();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn value(stats: &CacheStats, name: &str, labels: &[(&str, &str)]) -> u64 {
        stats
            .collectors()
            .iter()
            .flat_map(|c| c.collect())
            .filter(|f| f.name() == name)
            .flat_map(|f| f.get_metric().to_vec())
            .filter(|m| {
                labels.iter().all(|(n, v)| {
                    m.get_label()
                        .iter()
                        .any(|l| l.name() == *n && l.value() == *v)
                })
            })
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }

    #[test]
    fn domains_are_counted_and_bounded() {
        let stats = CacheStats::new();
        stats.hit("a.test");
        stats.hit("a.test");
        stats.miss("a.test", "not_cached");
        stats.miss("a.test", "not_cached");
        stats.miss("a.test", "no_length");
        for i in 0..MAX_DOMAIN_LABELS + 5 {
            stats.hit(&format!("h{i}.test"));
        }
        assert_eq!(
            value(&stats, "proxy_cache_hits_total", &[("domain", "a.test")]),
            2
        );
        let misses = |reason| {
            value(
                &stats,
                "proxy_cache_misses_total",
                &[("domain", "a.test"), ("reason", reason)],
            )
        };
        assert_eq!((misses("not_cached"), misses("no_length")), (2, 1));
        // a.test took one label: 511 more hosts got their own, the rest count as `other`.
        assert_eq!(
            value(&stats, "proxy_cache_hits_total", &[("domain", "other")]),
            6
        );
        assert_eq!(stats.hits.load(Relaxed), MAX_DOMAIN_LABELS as u64 + 7);
    }
}
