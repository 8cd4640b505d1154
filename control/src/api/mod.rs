//! The server management API (tokio + axum): health, version, status, stats and the PAC file.
//! When `api.token` is set every endpoint but health and the PAC file needs it, as a Bearer
//! header or a `token` query parameter.

use crate::server::ServerState;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use std::sync::Arc;
use switchyard_api::{
    BackendCounts, ErrorBody, HealthResponse, ServerStats, ServerStatus, VersionInfo,
};

pub fn router(state: Arc<ServerState>, token: Option<String>) -> Router {
    let protected = Router::new()
        .route("/api/v1/version", get(version))
        .route("/api/v1/status", get(status))
        .route("/api/v1/stats", get(stats))
        .route_layer(middleware::from_fn_with_state(
            Arc::new(token),
            require_token,
        ));
    Router::new()
        .route("/api/v1/health", get(health))
        .route("/proxy.pac", get(crate::pac::serve))
        .route("/wpad.dat", get(crate::pac::serve))
        .merge(protected)
        .with_state(state)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn presented_token(req: &Request) -> Option<String> {
    if let Some(v) = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        if let Some((scheme, value)) = v.split_once(' ') {
            if scheme.eq_ignore_ascii_case("bearer") {
                return Some(value.trim().to_owned());
            }
        }
    }
    let query = req.uri().query()?;
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == "token").then(|| v.to_owned())
    })
}

async fn require_token(
    State(token): State<Arc<Option<String>>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(expected) = token.as_deref() else {
        return next.run(req).await;
    };
    match presented_token(&req) {
        Some(t) if constant_time_eq(t.as_bytes(), expected.as_bytes()) => next.run(req).await,
        _ => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer realm=\"switchyard\"")],
            Json(ErrorBody {
                error: "unauthorized".into(),
                message: "a valid API token is required (Authorization: Bearer <token>)".into(),
                code: "UNAUTHORIZED".into(),
            }),
        )
            .into_response(),
    }
}

async fn health() -> Json<HealthResponse> {
    Json(HealthResponse {
        status: "healthy".into(),
        time: Utc::now(),
    })
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

async fn version() -> Json<VersionInfo> {
    Json(version_info())
}

async fn status(State(state): State<Arc<ServerState>>) -> Json<ServerStatus> {
    Json(ServerStatus {
        status: "running".into(),
        time: Utc::now(),
        version: env!("CARGO_PKG_VERSION").into(),
        backends: state.snapshot.load().backends.len() as u64,
    })
}

async fn stats(State(state): State<Arc<ServerState>>) -> Json<ServerStats> {
    let totals = state.counters.totals();
    let snapshot = state.snapshot.load();
    // A backend counts as healthy when it is enabled and its transport exists in this build;
    // active health checks come with the backends API.
    let healthy = snapshot
        .backends
        .iter()
        .filter(|b| {
            b.enabled
                && !matches!(
                    b.kind,
                    switchyard_dataplane::snapshot::BackendKind::Unavailable { .. }
                )
        })
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
