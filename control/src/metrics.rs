//! Prometheus metrics of `switchyard server` on `metrics.listen` (path `/metrics`, text
//! exposition format, no authentication), built with the `prometheus` crate.
//!
//! Collected on scrape: [`sample`] reads the data plane's per-core counters (summed), the
//! backends of the running snapshot, the reload and drop counters and the WebSocket clients;
//! [`render`] turns a [`Sample`] into a fresh registry's text, so a removed backend disappears
//! from the next scrape and nothing is kept between scrapes.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `switchyard_connections_total` / `switchyard_connections_active` | counter / gauge | |
//! | `switchyard_bytes_sent_total` / `switchyard_bytes_received_total` | counter | |
//! | `switchyard_relay_spliced_bytes_total` | counter | |
//! | `switchyard_requests_total` | counter | `protocol` (HTTP, CONNECT, SOCKS5) |
//! | `switchyard_responses_total` | counter | `class` (1xx … 5xx, `none` = no status) |
//! | `switchyard_backend_connections_total` / `_active` | counter / gauge | `backend` |
//! | `switchyard_backend_bytes_sent_total` / `_received_total` | counter | `backend` |
//! | `switchyard_backend_requests_total` / `switchyard_backend_errors_total` | counter | `backend` |
//! | `switchyard_backend_up` | gauge (1 healthy, 0 not: as `healthy` in `/api/v1/backends`) | `backend`, `type` |
//! | `switchyard_backend_health_check_duration_seconds` | histogram | `backend`, `result` (pass, fail) |
//! | `switchyard_config_reloads_total` | counter | |
//! | `switchyard_events_dropped_total` | counter | `queue` (events, request_log) |
//! | `switchyard_core_connections_active` / `_total`, `switchyard_core_requests_total` | gauge / counter | `core` |
//! | `switchyard_core_up` (1 running, 0 down) / `switchyard_core_failures_total` | gauge / counter | `core` |
//! | `switchyard_core_stalled` (1 up but not responding: no heartbeat for 3 s) / `switchyard_core_stalls_total` | gauge / counter | `core` |
//! | `switchyard_websocket_clients` | gauge | |
//! | `switchyard_uptime_seconds` | gauge | |
//! | `switchyard_mesh_networks` | gauge | |
//! | `switchyard_mesh_peers` / `switchyard_mesh_lease_addresses` (leased / leasable) | gauge | `network` |
//! | `switchyard_mesh_registrations_total` | counter | `result` (joined, renewed, refused) |
//! | `switchyard_mesh_heartbeats_total` | counter | `result` (renewed, no_lease, unknown, error) |
//! | `switchyard_mesh_leases_expired_total` | counter | |
//! | `switchyard_quic_connections_active` / `_total`, `switchyard_quic_streams_total`, `switchyard_quic_datagrams_received_total`, `switchyard_quic_refused_total`, `switchyard_quic_retries_total`, `switchyard_quic_refused_by_limits_total` | gauge / counter | |
//! | `proxy_cache_hits_total` | counter | `domain` |
//! | `proxy_cache_misses_total` | counter | `domain`, `reason` |
//! | `proxy_cache_bytes_served_total` | counter | `source` (cache, origin) |
//! | `proxy_cache_storage_size_bytes` / `proxy_cache_storage_entries` | gauge | `tier` |
//! | `proxy_cache_evictions_total` | counter | `tier`, `reason` |
//! | `proxy_cache_operation_duration_seconds` | histogram | `operation` |
//!
//! The mesh metrics appear when `mesh.registry.enabled`; the cache metrics when `cache.enabled`; at most 512 distinct `domain` values are kept
//! (later hosts count as `other`).

use crate::server::ServerState;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus::{
    Encoder, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use switchyard_dataplane::counters::{CoreLoad, CounterTotals};

/// Status-class labels, index = status / 100 (0 = no status, e.g. a failed SOCKS5 connect).
const CLASSES: [&str; 6] = ["none", "1xx", "2xx", "3xx", "4xx", "5xx"];
/// Protocol labels, in the counters' order.
const PROTOCOLS: [&str; 3] = ["HTTP", "CONNECT", "SOCKS5"];

pub struct BackendSample {
    pub name: String,
    pub kind: &'static str,
    pub totals: CounterTotals,
    pub healthy: bool,
}

/// Everything one scrape shows.
pub struct Sample {
    pub totals: CounterTotals,
    pub backends: Vec<BackendSample>,
    pub cores: Vec<CoreLoad>,
    /// Up/down and failures of each core, in core order.
    pub core_states: Vec<switchyard_dataplane::core_health::CoreState>,
    pub reloads: u64,
    pub events_dropped: u64,
    pub records_dropped: u64,
    pub websocket_clients: usize,
    pub uptime_secs: u64,
    /// The HTTP cache, whose long-lived `proxy_cache_*` collectors join each scrape.
    pub cache: Option<Arc<switchyard_dataplane::cache::CacheStore>>,
    /// Durations of the active health checks (long-lived, joins each scrape).
    pub health_checks: Option<prometheus::HistogramVec>,
    /// The mesh registry's collectors (long-lived, join each scrape) when it runs.
    pub mesh: Option<crate::mesh::MeshMetrics>,
    /// The QUIC listener's counters (`server.quic.listen`).
    pub quic: Option<Arc<switchyard_dataplane::quic::QuicListener>>,
}

pub fn sample(state: &ServerState) -> Sample {
    let snapshot = state.snapshot.load();
    Sample {
        totals: state.counters.totals(),
        backends: snapshot
            .backends
            .iter()
            .map(|b| BackendSample {
                name: b.name.clone(),
                kind: b.type_name(),
                totals: b.counters.totals(),
                healthy: crate::api::backends::is_healthy(b),
            })
            .collect(),
        cores: state.counters.per_core(),
        core_states: state.core_health.states(),
        reloads: state.reloads.load(Ordering::Relaxed),
        events_dropped: state.events.dropped(),
        records_dropped: state.requests.dropped(),
        websocket_clients: state.ws.connected(),
        uptime_secs: state.started.elapsed().as_secs(),
        cache: state.cache.clone(),
        health_checks: Some(state.health_checks.durations.clone()),
        mesh: state.mesh.as_ref().map(|m| m.metrics.clone()),
        quic: state.quic.clone(),
    }
}

fn gauge_value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Registers metrics on a registry as they are made.
struct Builder {
    registry: Registry,
}

impl Builder {
    fn counter(&self, name: &str, help: &str, value: u64) -> Result<(), prometheus::Error> {
        let c = IntCounter::new(name, help)?;
        c.inc_by(value);
        self.registry.register(Box::new(c))
    }

    fn gauge(&self, name: &str, help: &str, value: u64) -> Result<(), prometheus::Error> {
        let g = IntGauge::new(name, help)?;
        g.set(gauge_value(value));
        self.registry.register(Box::new(g))
    }

    fn counter_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<IntCounterVec, prometheus::Error> {
        let v = IntCounterVec::new(Opts::new(name, help), labels)?;
        self.registry.register(Box::new(v.clone()))?;
        Ok(v)
    }

    fn gauge_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<IntGaugeVec, prometheus::Error> {
        let v = IntGaugeVec::new(Opts::new(name, help), labels)?;
        self.registry.register(Box::new(v.clone()))?;
        Ok(v)
    }
}

/// The text exposition of `s`.
pub fn render(s: &Sample) -> Result<String, prometheus::Error> {
    let b = Builder {
        registry: Registry::new(),
    };
    let t = &s.totals;
    b.counter(
        "switchyard_connections_total",
        "proxied connections accepted since start",
        t.total_connections,
    )?;
    b.gauge(
        "switchyard_connections_active",
        "proxied connections open now",
        t.active_connections,
    )?;
    b.counter(
        "switchyard_bytes_sent_total",
        "bytes written to proxy clients",
        t.bytes_sent,
    )?;
    b.counter(
        "switchyard_bytes_received_total",
        "bytes read from proxy clients",
        t.bytes_received,
    )?;
    b.counter(
        "switchyard_relay_spliced_bytes_total",
        "tunnel bytes (both directions) relayed by splice(2), without a copy through user space",
        t.bytes_spliced,
    )?;
    let requests = b.counter_vec(
        "switchyard_requests_total",
        "proxied requests by protocol",
        &["protocol"],
    )?;
    for (label, n) in PROTOCOLS.iter().zip(t.requests_by_protocol) {
        requests.with_label_values(&[*label]).inc_by(n);
    }
    let responses = b.counter_vec(
        "switchyard_responses_total",
        "answers by status class (none = no HTTP status)",
        &["class"],
    )?;
    for (label, n) in CLASSES.iter().zip(t.responses_by_class) {
        responses.with_label_values(&[*label]).inc_by(n);
    }

    let be = ["backend"];
    let conns = b.counter_vec(
        "switchyard_backend_connections_total",
        "connections through the backend",
        &be,
    )?;
    let active = b.gauge_vec(
        "switchyard_backend_connections_active",
        "open connections through the backend",
        &be,
    )?;
    let sent = b.counter_vec(
        "switchyard_backend_bytes_sent_total",
        "bytes sent to clients via the backend",
        &be,
    )?;
    let received = b.counter_vec(
        "switchyard_backend_bytes_received_total",
        "bytes received from clients via the backend",
        &be,
    )?;
    let reqs = b.counter_vec(
        "switchyard_backend_requests_total",
        "requests routed to the backend",
        &be,
    )?;
    let errors = b.counter_vec(
        "switchyard_backend_errors_total",
        "failed connects and relays through the backend",
        &be,
    )?;
    let up = b.gauge_vec(
        "switchyard_backend_up",
        "1 when the backend is healthy (connects, tunnel probes and active health checks), else 0",
        &["backend", "type"],
    )?;
    for bk in &s.backends {
        let l = [bk.name.as_str()];
        conns
            .with_label_values(&l)
            .inc_by(bk.totals.total_connections);
        active
            .with_label_values(&l)
            .set(gauge_value(bk.totals.active_connections));
        sent.with_label_values(&l).inc_by(bk.totals.bytes_sent);
        received
            .with_label_values(&l)
            .inc_by(bk.totals.bytes_received);
        reqs.with_label_values(&l).inc_by(bk.totals.requests);
        errors.with_label_values(&l).inc_by(bk.totals.errors);
        up.with_label_values(&[bk.name.as_str(), bk.kind])
            .set(i64::from(bk.healthy));
    }

    b.counter(
        "switchyard_config_reloads_total",
        "successful configuration reloads (SIGHUP, API, saves)",
        s.reloads,
    )?;
    let dropped = b.counter_vec(
        "switchyard_events_dropped_total",
        "data-plane events and request records dropped because the queue to the control plane was full",
        &["queue"],
    )?;
    dropped
        .with_label_values(&["events"])
        .inc_by(s.events_dropped);
    dropped
        .with_label_values(&["request_log"])
        .inc_by(s.records_dropped);

    let core = ["core"];
    let core_active = b.gauge_vec(
        "switchyard_core_connections_active",
        "open connections per data-plane core",
        &core,
    )?;
    let core_total = b.counter_vec(
        "switchyard_core_connections_total",
        "connections accepted per data-plane core",
        &core,
    )?;
    let core_reqs = b.counter_vec(
        "switchyard_core_requests_total",
        "requests handled per data-plane core",
        &core,
    )?;
    for (i, c) in s.cores.iter().enumerate() {
        let l = [i.to_string()];
        let l = [l[0].as_str()];
        core_active
            .with_label_values(&l)
            .set(gauge_value(c.active_connections));
        core_total.with_label_values(&l).inc_by(c.total_connections);
        core_reqs.with_label_values(&l).inc_by(c.requests);
    }
    let core_up = b.gauge_vec(
        "switchyard_core_up",
        "1 while a data-plane core runs, 0 while it is down",
        &core,
    )?;
    let core_failures = b.counter_vec(
        "switchyard_core_failures_total",
        "times a data-plane core stopped (failed start, panic)",
        &core,
    )?;
    let core_stalled = b.gauge_vec(
        "switchyard_core_stalled",
        "1 while a data-plane core is up but has not run its heartbeat task for over 3 s",
        &core,
    )?;
    let core_stalls = b.counter_vec(
        "switchyard_core_stalls_total",
        "times a data-plane core stopped responding (heartbeat silent for over 3 s)",
        &core,
    )?;
    for c in &s.core_states {
        let l = [c.index.to_string()];
        let l = [l[0].as_str()];
        core_up.with_label_values(&l).set(i64::from(c.up));
        core_failures.with_label_values(&l).inc_by(c.failures);
        core_stalled
            .with_label_values(&l)
            .set(i64::from(c.stalled()));
        core_stalls.with_label_values(&l).inc_by(c.stalls);
    }

    b.gauge(
        "switchyard_websocket_clients",
        "clients connected to /api/v1/ws",
        s.websocket_clients as u64,
    )?;
    b.gauge(
        "switchyard_uptime_seconds",
        "seconds since the server started",
        s.uptime_secs,
    )?;

    if let Some(q) = &s.quic {
        let st = &q.stats;
        b.gauge(
            "switchyard_quic_connections_active",
            "QUIC client connections open now",
            st.connections_active.load(Ordering::Relaxed),
        )?;
        b.counter(
            "switchyard_quic_connections_total",
            "QUIC client connections accepted since start",
            st.connections_total.load(Ordering::Relaxed),
        )?;
        b.counter(
            "switchyard_quic_streams_total",
            "proxied TCP flows (streams) opened over QUIC",
            st.streams_total.load(Ordering::Relaxed),
        )?;
        b.counter(
            "switchyard_quic_datagrams_received_total",
            "QUIC datagrams (UDP flows) received from clients",
            st.datagrams_in.load(Ordering::Relaxed),
        )?;
        b.counter(
            "switchyard_quic_refused_total",
            "QUIC connections closed because their token or credentials were refused",
            st.refused.load(Ordering::Relaxed),
        )?;
        b.counter(
            "switchyard_quic_retries_total",
            "QUIC Initials answered with a Retry (address validation under handshake load)",
            st.retries.load(Ordering::Relaxed),
        )?;
        b.counter(
            "switchyard_quic_refused_by_limits_total",
            "QUIC connections refused by server.quic.max_connections or max_connections_per_client",
            st.refused_by_limits.load(Ordering::Relaxed),
        )?;
    }
    if let Some(cache) = &s.cache {
        for collector in cache.stats.collectors() {
            b.registry.register(collector)?;
        }
    }
    if let Some(checks) = &s.health_checks {
        b.registry.register(Box::new(checks.clone()))?;
    }
    if let Some(mesh) = &s.mesh {
        for collector in mesh.collectors() {
            b.registry.register(collector)?;
        }
    }

    let mut out = Vec::new();
    TextEncoder::new().encode(&b.registry.gather(), &mut out)?;
    String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
}

async fn scrape(
    axum::extract::State(state): axum::extract::State<Arc<ServerState>>,
) -> axum::response::Response {
    match render(&sample(&state)) {
        Ok(text) => ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "metrics: encoding failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("metrics encoding failed: {e}\n"),
            )
                .into_response()
        }
    }
}

/// Serves `/metrics` on `listener` until the process ends.
pub async fn serve(state: Arc<ServerState>, listener: tokio::net::TcpListener) {
    let app = Router::new()
        .route("/metrics", get(scrape))
        .fallback(|| async { (StatusCode::NOT_FOUND, "metrics are at /metrics\n") })
        .with_state(state);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "metrics listener failed; metrics are no longer served");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> Option<u64> {
        text.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn renders_every_family_with_values() {
        let totals = CounterTotals {
            total_connections: 7,
            active_connections: 2,
            bytes_sent: 1000,
            bytes_received: 50,
            requests: 5,
            requests_by_protocol: [3, 1, 1],
            responses_by_class: [1, 0, 3, 0, 1, 0],
            ..Default::default()
        };
        let s = Sample {
            totals,
            backends: vec![
                BackendSample {
                    name: "direct".into(),
                    kind: "direct",
                    totals,
                    healthy: true,
                },
                BackendSample {
                    name: "up\"stream".into(),
                    kind: "httpproxy",
                    totals: CounterTotals {
                        errors: 4,
                        ..Default::default()
                    },
                    healthy: false,
                },
            ],
            cores: vec![
                CoreLoad {
                    active_connections: 2,
                    total_connections: 5,
                    ..Default::default()
                },
                CoreLoad::default(),
            ],
            core_states: vec![
                switchyard_dataplane::core_health::CoreState {
                    index: 0,
                    cpu: Some(0),
                    up: true,
                    failures: 0,
                    last_failure: None,
                    silent_for: std::time::Duration::from_secs(5),
                    stalls: 3,
                },
                switchyard_dataplane::core_health::CoreState {
                    index: 1,
                    cpu: None,
                    up: false,
                    failures: 2,
                    last_failure: Some("panicked".into()),
                    silent_for: std::time::Duration::from_secs(5),
                    stalls: 0,
                },
            ],
            reloads: 3,
            events_dropped: 9,
            records_dropped: 1,
            websocket_clients: 4,
            uptime_secs: 12,
            cache: None,
            health_checks: None,
            mesh: None,
            quic: None,
        };
        let text = render(&s).unwrap();
        let checks = [
            ("switchyard_connections_total", 7),
            ("switchyard_connections_active", 2),
            ("switchyard_bytes_sent_total", 1000),
            ("switchyard_bytes_received_total", 50),
            ("switchyard_requests_total{protocol=\"HTTP\"}", 3),
            ("switchyard_requests_total{protocol=\"SOCKS5\"}", 1),
            ("switchyard_responses_total{class=\"2xx\"}", 3),
            ("switchyard_responses_total{class=\"none\"}", 1),
            (
                "switchyard_backend_connections_total{backend=\"direct\"}",
                7,
            ),
            (
                "switchyard_backend_errors_total{backend=\"up\\\"stream\"}",
                4,
            ),
            (
                "switchyard_backend_up{backend=\"direct\",type=\"direct\"}",
                1,
            ),
            (
                "switchyard_backend_up{backend=\"up\\\"stream\",type=\"httpproxy\"}",
                0,
            ),
            ("switchyard_config_reloads_total", 3),
            ("switchyard_events_dropped_total{queue=\"events\"}", 9),
            ("switchyard_events_dropped_total{queue=\"request_log\"}", 1),
            ("switchyard_core_connections_active{core=\"0\"}", 2),
            ("switchyard_core_connections_total{core=\"0\"}", 5),
            ("switchyard_core_connections_active{core=\"1\"}", 0),
            ("switchyard_core_up{core=\"0\"}", 1),
            ("switchyard_core_up{core=\"1\"}", 0),
            ("switchyard_core_failures_total{core=\"1\"}", 2),
            ("switchyard_core_stalled{core=\"0\"}", 1),
            ("switchyard_core_stalled{core=\"1\"}", 0),
            ("switchyard_core_stalls_total{core=\"0\"}", 3),
            ("switchyard_websocket_clients", 4),
            ("switchyard_uptime_seconds", 12),
        ];
        for (series, want) in checks {
            assert_eq!(value(&text, series), Some(want), "{series} in\n{text}");
        }
        assert!(text.contains("# TYPE switchyard_connections_total counter"));
        assert!(text.contains("# TYPE switchyard_connections_active gauge"));
    }
}
