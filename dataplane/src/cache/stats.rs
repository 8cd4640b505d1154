//! Cache counters and the seven `proxy_cache_*` metrics. The collectors live as long as the
//! store; the control plane registers them into each scrape's registry.
//!
//! Domain labels are bounded: after [`MAX_DOMAIN_LABELS`] distinct hosts, further hosts are
//! counted under `other`, so a scan of random hostnames cannot grow the metrics without limit.
//!
//! Per core, so that a hit writes no line another core writes: every data-plane core counts
//! hits, misses, bytes served and operation timings in a cache-padded slot of its own (its own
//! atomics and its own children of the per-request metric vectors); threads that are not cores
//! (the control plane, tests) share one more slot. A scrape sums the slots into one series per
//! label set ([`Merged`]), so the metrics read as they did with one shared set. The resolved
//! per-domain counters sit in an immutable map per slot behind an `ArcSwap` (one atomic load
//! and a hash lookup per hit or miss); which hosts get a label of their own is decided once for
//! all slots, so every core labels a host alike.

use super::store::{EvictReason, Tier};
use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Histogram as HistogramData, Metric, MetricFamily, MetricType};
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
};
use std::collections::{HashMap, HashSet};
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
    /// One slot per possible data-plane core, then the slot of every other thread.
    cores: Box<[CachePadded<CoreStats>]>,
    /// Hosts with a label of their own (at most [`MAX_DOMAIN_LABELS`], the first seen).
    labels: ArcSwap<HashSet<String>>,
    pub store_errors: AtomicU64,
    pub evictions: AtomicU64,
    storage_size: IntGaugeVec,
    storage_entries: IntGaugeVec,
    evictions_total: IntCounterVec,
}

impl Default for CacheStats {
    fn default() -> Self {
        Self::new()
    }
}

/// What one core writes per request.
struct CoreStats {
    hits: AtomicU64,
    misses: AtomicU64,
    hits_total: IntCounterVec,
    misses_total: IntCounterVec,
    bytes_served: IntCounterVec,
    duration: HistogramVec,
    /// `bytes_served` children: [cache, origin].
    served_by_source: [IntCounter; 2],
    /// `duration` children per [`Operation`], resolved once.
    timings: [Histogram; 3],
    /// Domain label → this slot's counters (resolved once: a hit costs one map lookup, no lock).
    domains: ArcSwap<HashMap<String, Arc<DomainCounters>>>,
    /// This slot's counters of hosts past the label limit.
    other: std::sync::OnceLock<Arc<DomainCounters>>,
}

/// One domain label's counters in one slot, resolved from the slot's metric vectors once.
struct DomainCounters {
    label: String,
    hits: IntCounter,
    /// Miss reason → counter; reasons are a small fixed set of static labels.
    misses: ArcSwap<Vec<(&'static str, IntCounter)>>,
}

impl DomainCounters {
    fn new(core: &CoreStats, label: &str) -> Self {
        DomainCounters {
            label: label.to_owned(),
            hits: core.hits_total.with_label_values(&[label]),
            misses: ArcSwap::from_pointee(Vec::new()),
        }
    }

    fn miss(&self, core: &CoreStats, reason: &'static str) {
        if let Some((_, c)) = self.misses.load().iter().find(|(r, _)| *r == reason) {
            c.inc();
            return;
        }
        let counter = core
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
        counter.inc();
    }
}

#[allow(clippy::expect_used)] // metric definitions are constants; a bad one is a programming error
impl CoreStats {
    fn new() -> Self {
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
        CoreStats {
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
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
            timings: [Operation::Lookup, Operation::ServeHit, Operation::Store]
                .map(|op| duration.with_label_values(&[op.label()])),
            duration,
            domains: ArcSwap::from_pointee(HashMap::new()),
            other: std::sync::OnceLock::new(),
        }
    }

    /// Runs `count` on this slot's counters of `host`'s label (see [`CacheStats::label_of`]).
    fn with_domain(&self, stats: &CacheStats, host: &str, count: impl FnOnce(&DomainCounters)) {
        if let Some(c) = self.domains.load().get(host) {
            return count(c);
        }
        if !stats.label_of(host) {
            return count(self.other());
        }
        let fresh = Arc::new(DomainCounters::new(self, host));
        let mut chosen = fresh.clone();
        self.domains.rcu(|known| {
            if let Some(c) = known.get(host) {
                chosen = c.clone();
                return known.clone();
            }
            chosen = fresh.clone();
            let mut next = HashMap::clone(known);
            next.insert(host.to_owned(), fresh.clone());
            Arc::new(next)
        });
        count(&chosen)
    }

    fn other(&self) -> &DomainCounters {
        self.other
            .get_or_init(|| Arc::new(DomainCounters::new(self, "other")))
    }

    /// This slot's per-request collectors, in [`CacheStats::collectors`] order.
    fn collectors(&self) -> [Box<dyn Collector>; 4] {
        [
            Box::new(self.hits_total.clone()),
            Box::new(self.misses_total.clone()),
            Box::new(self.bytes_served.clone()),
            Box::new(self.duration.clone()),
        ]
    }
}

#[allow(clippy::expect_used)] // metric definitions are constants; a bad one is a programming error
fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
}

#[allow(clippy::expect_used)] // metric definitions are constants; a bad one is a programming error
impl CacheStats {
    pub fn new() -> Self {
        // Cores are pinned one per CPU of the affinity mask, so there are at most this many;
        // a core past them (never expected) counts in the shared slot.
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        Self::with_slots(cpus)
    }

    /// Stats with `cores` per-core slots and the shared one.
    fn with_slots(cores: usize) -> Self {
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric")
        };
        CacheStats {
            cores: (0..=cores)
                .map(|_| CachePadded::new(CoreStats::new()))
                .collect(),
            labels: ArcSwap::from_pointee(HashSet::new()),
            store_errors: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
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
        }
    }

    /// The calling thread's slot: its data-plane core's, or the shared last one.
    fn core(&self) -> &CoreStats {
        let shared = self.cores.len() - 1;
        let index = crate::cores::current().map_or(shared, |core| core.min(shared));
        &self.cores[index]
    }

    /// Whether `host` has a label of its own: the first [`MAX_DOMAIN_LABELS`] hosts seen (hit
    /// or miss, on any core) do, later ones count as `other`.
    fn label_of(&self, host: &str) -> bool {
        let known = self.labels.load();
        if known.contains(host) {
            return true;
        }
        if known.len() >= MAX_DOMAIN_LABELS {
            return false;
        }
        drop(known);
        let mut labelled = false;
        self.labels.rcu(|known| {
            labelled = known.contains(host) || known.len() < MAX_DOMAIN_LABELS;
            if known.contains(host) || !labelled {
                return known.clone();
            }
            let mut next = HashSet::clone(known);
            next.insert(host.to_owned());
            Arc::new(next)
        });
        labelled
    }

    /// Hits counted so far, all cores.
    pub fn hits(&self) -> u64 {
        self.cores.iter().map(|c| c.hits.load(Relaxed)).sum()
    }

    /// Misses counted so far, all cores.
    pub fn misses(&self) -> u64 {
        self.cores.iter().map(|c| c.misses.load(Relaxed)).sum()
    }

    pub fn hit(&self, host: &str) {
        let core = self.core();
        core.hits.fetch_add(1, Relaxed);
        core.with_domain(self, host, |d| d.hits.inc());
    }

    pub fn miss(&self, host: &str, reason: &'static str) {
        let core = self.core();
        core.misses.fetch_add(1, Relaxed);
        core.with_domain(self, host, |d| d.miss(core, reason));
    }

    pub fn store_error(&self) {
        self.store_errors.fetch_add(1, Relaxed);
    }

    pub fn served(&self, from_cache: bool, bytes: u64) {
        self.core().served_by_source[usize::from(!from_cache)].inc_by(bytes);
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
        self.core().timings[op as usize].observe(started.elapsed().as_secs_f64());
    }

    /// The collectors, for registering into a scrape's registry: one that sums the cores'
    /// slots, and the store-wide ones.
    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(Merged {
                parts: self.cores.iter().flat_map(|c| c.collectors()).collect(),
            }),
            Box::new(self.storage_size.clone()),
            Box::new(self.storage_entries.clone()),
            Box::new(self.evictions_total.clone()),
        ]
    }
}

/// The per-core collectors of the same metrics, read as one: families of the same name are
/// joined and series with the same labels summed.
struct Merged {
    /// Each slot's collectors in the same order, slot after slot.
    parts: Vec<Box<dyn Collector>>,
}

impl Collector for Merged {
    fn desc(&self) -> Vec<&Desc> {
        // Every slot has the same descriptions; the first slot's four name them all.
        self.parts.iter().take(4).flat_map(|c| c.desc()).collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        merge_families(self.parts.iter().flat_map(|c| c.collect()))
    }
}

/// Joins families of the same name, summing counters and histograms whose labels are equal.
fn merge_families(families: impl Iterator<Item = MetricFamily>) -> Vec<MetricFamily> {
    let mut merged: Vec<MetricFamily> = Vec::new();
    // (family index, label values) → index of the series in that family
    let mut series: HashMap<(usize, Vec<String>), usize> = HashMap::new();
    for mut family in families {
        let at = match merged.iter().position(|f| f.name() == family.name()) {
            Some(at) => at,
            None => {
                let mut empty = family.clone();
                empty.set_metric(Vec::new());
                merged.push(empty);
                merged.len() - 1
            }
        };
        let kind = family.get_field_type();
        for metric in family.take_metric() {
            let labels: Vec<String> = metric
                .get_label()
                .iter()
                .map(|l| l.value().to_owned())
                .collect();
            let into = &mut merged[at];
            match series.get(&(at, labels.clone())) {
                Some(&i) => add_into(&mut into.mut_metric()[i], &metric, kind),
                None => {
                    series.insert((at, labels), into.get_metric().len());
                    into.mut_metric().push(metric);
                }
            }
        }
    }
    merged
}

/// Adds `from`'s value to `into` (same metric, same labels, another slot).
fn add_into(into: &mut Metric, from: &Metric, kind: MetricType) {
    match kind {
        MetricType::COUNTER => {
            let mut sum = Counter::default();
            sum.set_value(into.get_counter().get_value() + from.get_counter().get_value());
            into.set_counter(sum);
        }
        MetricType::HISTOGRAM => {
            let (a, b) = (into.get_histogram(), from.get_histogram());
            let mut sum = HistogramData::default();
            sum.set_sample_count(a.get_sample_count() + b.get_sample_count());
            sum.set_sample_sum(a.get_sample_sum() + b.get_sample_sum());
            // Same bucket bounds in every slot: the cumulative counts add up bucket by bucket.
            let buckets = a
                .get_bucket()
                .iter()
                .zip(b.get_bucket())
                .map(|(x, y)| {
                    let mut bucket = x.clone();
                    bucket.set_cumulative_count(x.cumulative_count() + y.cumulative_count());
                    bucket
                })
                .collect();
            sum.set_bucket(buckets);
            into.set_histogram(sum);
        }
        // The per-core metrics are counters and histograms only.
        _ => {}
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
        assert_eq!(stats.hits(), MAX_DOMAIN_LABELS as u64 + 7);
    }

    /// Each core counts in its own slot (no line written by two cores per hit), and a scrape
    /// still reads one series per label set holding the sum of all cores.
    #[test]
    fn cores_count_in_their_own_slots_and_scrapes_read_the_sum() {
        let stats = Arc::new(CacheStats::with_slots(2));
        let on_core = |core: usize, hits: u64| {
            let stats = stats.clone();
            std::thread::spawn(move || {
                crate::cores::enter(core);
                for _ in 0..hits {
                    stats.hit("a.test");
                    stats.served(true, 10);
                    stats.observe(Operation::ServeHit, std::time::Instant::now());
                }
                stats.miss("a.test", "not_cached");
            })
        };
        for worker in [on_core(0, 3), on_core(1, 5)] {
            worker.join().expect("worker");
        }
        stats.hit("a.test"); // a thread that is no core: the shared slot
        let slot_hits: Vec<u64> = stats.cores.iter().map(|c| c.hits.load(Relaxed)).collect();
        assert_eq!(slot_hits, vec![3, 5, 1]);
        assert_eq!((stats.hits(), stats.misses()), (9, 2));

        let families: Vec<MetricFamily> = stats
            .collectors()
            .iter()
            .flat_map(|c| c.collect())
            .collect();
        let series = |name: &str| -> Vec<&Metric> {
            families
                .iter()
                .filter(|f| f.name() == name)
                .flat_map(|f| f.get_metric())
                .collect()
        };
        let hits = series("proxy_cache_hits_total");
        assert_eq!(hits.len(), 1, "one series per label set, not one per core");
        assert_eq!(hits[0].get_counter().get_value() as u64, 9);
        let misses = series("proxy_cache_misses_total");
        assert_eq!(misses.len(), 1);
        assert_eq!(misses[0].get_counter().get_value() as u64, 2);
        assert_eq!(
            value(
                &stats,
                "proxy_cache_bytes_served_total",
                &[("source", "cache")]
            ),
            80
        );
        let timings: Vec<&Metric> = series("proxy_cache_operation_duration_seconds")
            .into_iter()
            .filter(|m| m.get_label().iter().any(|l| l.value() == "serve_hit"))
            .collect();
        assert_eq!(timings.len(), 1);
        let histogram = timings[0].get_histogram();
        assert_eq!(histogram.get_sample_count(), 8);
        let last = histogram.get_bucket().last().expect("buckets");
        assert_eq!(last.cumulative_count(), 8);

        // The registry a scrape builds accepts the collectors (no duplicate descriptions).
        let registry = prometheus::Registry::new();
        for collector in stats.collectors() {
            registry.register(collector).expect("register");
        }
        assert_eq!(registry.gather().len(), 4);
    }
}
