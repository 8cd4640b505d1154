//! Counters behind `/health/details` and `/metrics` (Prometheus text format).
//!
//! Metric names: `switchyard_pkgcache_requests_total{method,status}`,
//! `switchyard_pkgcache_received_bytes_total`, `switchyard_pkgcache_sent_bytes_total`,
//! `switchyard_pkgcache_cache_hits_total`, `switchyard_pkgcache_cache_misses_total`,
//! `switchyard_pkgcache_uploads_total{result}`, `switchyard_pkgcache_storage_packages`,
//! `switchyard_pkgcache_storage_bytes`. A hit is a HEAD or GET answered 200, a miss one
//! answered 404 (vcpkg's precheck is a HEAD).

use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

/// All counters of one server.
pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub received: IntCounter,
    pub sent: IntCounter,
    pub hits: IntCounter,
    pub misses: IntCounter,
    pub uploads: IntCounterVec,
    pub packages: IntGauge,
    pub bytes: IntGauge,
}

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let p = |n: &str| format!("switchyard_pkgcache_{n}");
        let requests = IntCounterVec::new(
            Opts::new(p("requests_total"), "HTTP requests by method and status"),
            &["method", "status"],
        )?;
        let received = IntCounter::new(p("received_bytes_total"), "package bytes uploaded")?;
        let sent = IntCounter::new(p("sent_bytes_total"), "package bytes served")?;
        let hits = IntCounter::new(p("cache_hits_total"), "HEAD/GET of a stored package")?;
        let misses = IntCounter::new(p("cache_misses_total"), "HEAD/GET of an absent package")?;
        let uploads =
            IntCounterVec::new(Opts::new(p("uploads_total"), "PUT results"), &["result"])?;
        let packages = IntGauge::new(p("storage_packages"), "packages in the store")?;
        let bytes = IntGauge::new(p("storage_bytes"), "bytes of packages in the store")?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(received.clone()))?;
        registry.register(Box::new(sent.clone()))?;
        registry.register(Box::new(hits.clone()))?;
        registry.register(Box::new(misses.clone()))?;
        registry.register(Box::new(uploads.clone()))?;
        registry.register(Box::new(packages.clone()))?;
        registry.register(Box::new(bytes.clone()))?;
        Ok(Metrics {
            registry,
            requests,
            received,
            sent,
            hits,
            misses,
            uploads,
            packages,
            bytes,
        })
    }

    /// Text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!("encoding metrics: {e}");
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// A package was added (`+size`) or removed.
    pub fn stored(&self, size: u64) {
        self.packages.inc();
        self.bytes.add(i64::try_from(size).unwrap_or(i64::MAX));
    }

    pub fn removed(&self, size: u64) {
        self.packages.dec();
        self.bytes.sub(i64::try_from(size).unwrap_or(i64::MAX));
    }
}

/// `hits / (hits + misses)` as `NN.N%` (`0.0%` before any lookup).
pub fn hit_rate(hits: u64, misses: u64) -> String {
    let total = hits + misses;
    if total == 0 {
        return "0.0%".into();
    }
    format!("{:.1}%", hits as f64 * 100.0 / total as f64)
}

/// `3d 4h 5m 6s` style uptime.
pub fn human_duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if d > 0 {
        out.push_str(&format!("{d}d "));
    }
    if d > 0 || h > 0 {
        out.push_str(&format!("{h}h "));
    }
    if d > 0 || h > 0 || m > 0 {
        out.push_str(&format!("{m}m "));
    }
    out.push_str(&format!("{s}s"));
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_durations() {
        assert_eq!(hit_rate(0, 0), "0.0%");
        assert_eq!(hit_rate(1, 2), "33.3%");
        assert_eq!(hit_rate(5, 0), "100.0%");
        assert_eq!(human_duration(0), "0s");
        assert_eq!(human_duration(61), "1m 1s");
        assert_eq!(human_duration(3600), "1h 0m 0s");
        assert_eq!(human_duration(90061), "1d 1h 1m 1s");
    }

    #[test]
    fn renders_text_format() {
        let m = Metrics::new().unwrap();
        m.requests.with_label_values(&["GET", "200"]).inc();
        m.stored(10);
        let text = m.render();
        assert!(
            text.contains("switchyard_pkgcache_requests_total{method=\"GET\",status=\"200\"} 1")
        );
        assert!(text.contains("switchyard_pkgcache_storage_bytes 10"));
    }
}
