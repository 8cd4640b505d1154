//! Health, version, status and statistics.

use crate::server::ServerState;
use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use std::sync::Arc;
use switchyard_api::{BackendCounts, HealthResponse, ServerStats, ServerStatus, VersionInfo};

/// Measured health: `degraded` while a data-plane core is down or not responding (no heartbeat
/// for over 3 s), or an enabled backend is
/// unhealthy (its connects keep failing, its health checks fail, its tunnel's peer is lost, or
/// its type is unavailable in this build), with one line per reason in `problems`.
#[utoipa::path(get, path = "/api/v1/health", tag = "system", security(()),
    responses((status = 200, body = HealthResponse)))]
pub async fn health(State(state): State<Arc<ServerState>>) -> Json<HealthResponse> {
    let cores = state.core_health.states();
    let mut problems = state.core_health.problems();
    let snapshot = state.snapshot.load();
    let cfg = state.config.load();
    for b in snapshot.backends.iter().filter(|b| b.enabled) {
        // A provider backend's reason is its provider's (unresolved, list refresh failed).
        let provider = state.providers.view(&cfg, &b.name);
        if let Some(p) = provider.as_ref().filter(|p| p.resolved.is_none()) {
            problems.push(format!(
                "backend {} ({}) is unhealthy: {}",
                b.name,
                p.provider,
                p.error.as_deref().unwrap_or("not resolved")
            ));
        } else if !super::backends::is_healthy(b) {
            problems.push(format!(
                "backend {} ({}) is unhealthy: {}",
                b.name,
                b.type_name(),
                match &b.kind {
                    switchyard_dataplane::snapshot::BackendKind::Unavailable { .. } =>
                        "not available in this build",
                    switchyard_dataplane::snapshot::BackendKind::Openvpn(link)
                        if link.0.current().is_none() =>
                        "its OpenVPN tunnel is not connected",
                    _ => b.health.verdict().reason(),
                }
            ));
        }
    }
    Json(HealthResponse::measured(
        problems,
        cores.iter().filter(|c| c.serving()).count(),
        cores.len(),
    ))
}

pub fn version_info() -> VersionInfo {
    let epoch = env!("SWITCHYARD_BUILD_EPOCH").parse::<i64>().unwrap_or(0);
    VersionInfo {
        version: env!("CARGO_PKG_VERSION").into(),
        git_commit: env!("SWITCHYARD_GIT_COMMIT").into(),
        build_time: DateTime::from_timestamp(epoch, 0).unwrap_or_default(),
        go_version: env!("SWITCHYARD_RUSTC_VERSION").into(),
        platform: format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    }
}

#[utoipa::path(get, path = "/api/v1/version", tag = "system", responses((status = 200, body = VersionInfo)))]
pub async fn version() -> Json<VersionInfo> {
    Json(version_info())
}

#[utoipa::path(get, path = "/api/v1/status", tag = "system", responses((status = 200, body = ServerStatus)))]
pub async fn status(State(state): State<Arc<ServerState>>) -> Json<ServerStatus> {
    Json(ServerStatus {
        status: "running".into(),
        time: Utc::now(),
        version: env!("CARGO_PKG_VERSION").into(),
        backends: state.snapshot.load().backends.len() as u64,
    })
}

#[utoipa::path(get, path = "/api/v1/quic", tag = "system", responses((status = 200, body = switchyard_api::server::QuicStatus)))]
pub async fn quic(
    State(state): State<Arc<ServerState>>,
) -> Json<switchyard_api::server::QuicStatus> {
    use std::sync::atomic::Ordering::Relaxed;
    let Some(q) = &state.quic else {
        return Json(switchyard_api::server::QuicStatus {
            enabled: false,
            listen: String::new(),
            fingerprint: String::new(),
            self_signed: false,
            connections_active: 0,
            connections_total: 0,
            streams_total: 0,
            datagrams_received: 0,
            refused: 0,
            retries: 0,
            refused_by_limits: 0,
            streams_refused_before_hello: 0,
        });
    };
    Json(switchyard_api::server::QuicStatus {
        enabled: true,
        listen: q.local_addr.to_string(),
        fingerprint: q.fingerprint.clone(),
        self_signed: q.self_signed,
        connections_active: q.stats.connections_active.load(Relaxed),
        connections_total: q.stats.connections_total.load(Relaxed),
        streams_total: q.stats.streams_total.load(Relaxed),
        datagrams_received: q.stats.datagrams_in.load(Relaxed),
        refused: q.stats.refused.load(Relaxed),
        retries: q.stats.retries.load(Relaxed),
        refused_by_limits: q.stats.refused_by_limits.load(Relaxed),
        streams_refused_before_hello: q.stats.streams_refused_before_hello.load(Relaxed),
    })
}

#[utoipa::path(get, path = "/api/v1/stats", tag = "system", responses((status = 200, body = ServerStats)))]
pub async fn stats(State(state): State<Arc<ServerState>>) -> Json<ServerStats> {
    let totals = state.counters.totals();
    let snapshot = state.snapshot.load();
    let healthy = snapshot
        .backends
        .iter()
        .filter(|b| super::backends::is_healthy(b))
        .count();
    Json(ServerStats {
        total_connections: totals.total_connections,
        active_connections: totals.active_connections,
        bytes_sent: totals.bytes_sent,
        bytes_received: totals.bytes_received,
        backends: BackendCounts {
            total: snapshot.backends.len() as u64,
            healthy: healthy as u64,
        },
        time: Utc::now(),
    })
}
