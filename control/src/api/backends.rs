//! `/api/v1/backends`: list, create, get, delete, stats, and a real connection test.

use super::error::{ApiError, ApiJson};
use crate::config_store::{mutate, MutateError};
use crate::server::ServerState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use std::sync::Arc;
use std::time::Duration;
use switchyard_api::{
    Backend, BackendCreate, BackendCreated, BackendDeleted, BackendStats, BackendStatsDetail,
    BackendTestRequest, BackendTestResult, UpstreamSettings,
};
use switchyard_config::{BackendConfig, BackendType, UpstreamProxyConfig};
use switchyard_dataplane::commands::{Command, TestPurpose};
use switchyard_dataplane::snapshot::{self, BackendKind};

/// Healthy = enabled, available in this build, and its measured verdict (connects, tunnel
/// probe, active health checks) is healthy.
pub fn is_healthy(b: &snapshot::Backend) -> bool {
    b.enabled && !matches!(b.kind, BackendKind::Unavailable { .. }) && b.health.is_healthy()
}

fn view(state: &ServerState, b: &snapshot::Backend) -> Backend {
    let t = b.counters.totals();
    let mut view = Backend {
        name: b.name.clone(),
        kind: b.type_name().into(),
        healthy: is_healthy(b),
        stats: BackendStats {
            active_connections: t.active_connections,
            total_connections: t.total_connections,
            bytes_sent: t.bytes_sent,
            bytes_received: t.bytes_received,
        },
        error: None,
        provider: None,
    };
    super::providers::describe(state, &mut view);
    view
}

fn find(state: &ServerState, name: &str) -> Result<Arc<snapshot::Backend>, ApiError> {
    state
        .snapshot
        .load()
        .backends
        .iter()
        .find(|b| b.name == name)
        .cloned()
        .ok_or_else(|| {
            ApiError::not_found(
                "BACKEND_NOT_FOUND",
                format!("backend {name} does not exist"),
            )
        })
}

pub fn problems_to_error(problems: &[switchyard_config::Problem], code: &'static str) -> ApiError {
    let list: Vec<String> = problems
        .iter()
        .map(|p| format!("{}: {}", p.field, p.message))
        .collect();
    ApiError::bad_request(code, list.join("; "))
}

pub fn mutate_error(e: MutateError<ApiError>, code: &'static str) -> ApiError {
    match e {
        MutateError::Refused(e) => e,
        MutateError::Invalid(problems) => problems_to_error(&problems, code),
        MutateError::Apply(e) => ApiError::internal(e.to_string()),
    }
}

#[utoipa::path(get, path = "/api/v1/backends", tag = "backends", responses((status = 200, body = [Backend])))]
pub async fn list(State(state): State<Arc<ServerState>>) -> Json<Vec<Backend>> {
    Json(
        state
            .snapshot
            .load()
            .backends
            .iter()
            .map(|b| view(&state, b))
            .collect(),
    )
}

fn settings(s: UpstreamSettings) -> UpstreamProxyConfig {
    UpstreamProxyConfig {
        address: s.address,
        username: s.username,
        password: s.password,
    }
}

fn to_config(body: BackendCreate) -> Result<BackendConfig, ApiError> {
    let kind = BackendType::from_name(&body.kind).ok_or_else(|| {
        ApiError::bad_request(
            "INVALID_BACKEND_TYPE",
            format!(
                "unknown backend type {:?}; use one of {}",
                body.kind,
                BackendType::ACCEPTED_NAMES.join(", ")
            ),
        )
    })?;
    let settings_for_other_type = match kind {
        BackendType::HttpProxy => body.socks5.is_some(),
        BackendType::Socks5 => body.httpproxy.is_some(),
        BackendType::Provider(_) => {
            body.httpproxy.is_some()
                || body.socks5.is_some()
                || body.wireguard.is_some()
                || body.openvpn.is_some()
        }
        _ => body.httpproxy.is_some() || body.socks5.is_some() || body.config.is_some(),
    };
    if settings_for_other_type {
        return Err(ApiError::bad_request(
            "INVALID_BACKEND",
            match kind {
                BackendType::Provider(_) => {
                    format!("a {kind} backend takes its options in `config`")
                }
                _ => format!(
                    "the settings object must be named after the type ({})",
                    kind.api_name()
                ),
            },
        ));
    }
    let other = match kind {
        BackendType::Wireguard => body.wireguard,
        BackendType::Openvpn => body.openvpn,
        BackendType::Provider(_) => body.config,
        _ => None,
    };
    let health_check = body
        .health_check
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| ApiError::bad_request("INVALID_HEALTH_CHECK", format!("health_check: {e}")))?;
    Ok(BackendConfig {
        name: body.name,
        kind,
        enabled: body.enabled,
        http_proxy: body.httpproxy.map(settings),
        socks5: body.socks5.map(settings),
        other,
        health_check,
    })
}

#[utoipa::path(post, path = "/api/v1/backends", tag = "backends", request_body = BackendCreate,
    responses((status = 201, body = BackendCreated), (status = 400, body = switchyard_api::ErrorBody),
              (status = 409, body = switchyard_api::ErrorBody)))]
pub async fn create(
    State(state): State<Arc<ServerState>>,
    ApiJson(body): ApiJson<BackendCreate>,
) -> Result<(StatusCode, Json<BackendCreated>), ApiError> {
    let backend = to_config(body)?;
    let (name, kind) = (backend.name.clone(), backend.kind);
    mutate(&state, |cfg| {
        if cfg.backends.iter().any(|b| b.name == backend.name) {
            return Err(ApiError::conflict(
                "BACKEND_EXISTS",
                format!("backend {} already exists", backend.name),
            ));
        }
        cfg.backends.push(backend);
        Ok(())
    })
    .await
    .map_err(|e| mutate_error(e, "INVALID_BACKEND"))?;
    tracing::info!(backend = %name, r#type = kind.api_name(), "backend created through the API");
    Ok((
        StatusCode::CREATED,
        Json(BackendCreated {
            status: "created".into(),
            backend: name,
            kind: kind.api_name().into(),
        }),
    ))
}

#[utoipa::path(get, path = "/api/v1/backends/{name}", tag = "backends", params(("name" = String, Path)),
    responses((status = 200, body = Backend), (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn get_one(
    State(state): State<Arc<ServerState>>,
    Path(name): Path<String>,
) -> Result<Json<Backend>, ApiError> {
    Ok(Json(view(&state, &*find(&state, &name)?)))
}

#[utoipa::path(delete, path = "/api/v1/backends/{name}", tag = "backends", params(("name" = String, Path)),
    responses((status = 200, body = BackendDeleted), (status = 404, body = switchyard_api::ErrorBody),
              (status = 409, description = "routes still use the backend", body = switchyard_api::ErrorBody)))]
pub async fn delete(
    State(state): State<Arc<ServerState>>,
    Path(name): Path<String>,
) -> Result<Json<BackendDeleted>, ApiError> {
    mutate(&state, |cfg| {
        let Some(i) = cfg.backends.iter().position(|b| b.name == name) else {
            return Err(ApiError::not_found(
                "BACKEND_NOT_FOUND",
                format!("backend {name} does not exist"),
            ));
        };
        let users: Vec<&str> = cfg
            .routes
            .iter()
            .filter(|r| r.backend_names().contains(&name.as_str()))
            .map(|r| r.name.as_str())
            .collect();
        if !users.is_empty() {
            return Err(ApiError::conflict(
                "BACKEND_IN_USE",
                format!(
                    "backend {name} is used by routes {}; delete or change them first",
                    users.join(", ")
                ),
            ));
        }
        cfg.backends.remove(i);
        Ok(())
    })
    .await
    .map_err(|e| mutate_error(e, "INVALID_BACKEND"))?;
    // Live connections through it keep their snapshot and finish; new ones cannot pick it.
    tracing::info!(backend = %name, "backend deleted through the API");
    Ok(Json(BackendDeleted {
        status: "deleted".into(),
        backend: name,
    }))
}

#[utoipa::path(get, path = "/api/v1/backends/{name}/stats", tag = "backends", params(("name" = String, Path)),
    responses((status = 200, body = BackendStatsDetail), (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn stats(
    State(state): State<Arc<ServerState>>,
    Path(name): Path<String>,
) -> Result<Json<BackendStatsDetail>, ApiError> {
    let t = find(&state, &name)?.counters.totals();
    Ok(Json(BackendStatsDetail {
        active_connections: t.active_connections,
        total_connections: t.total_connections,
        bytes_sent: t.bytes_sent,
        bytes_received: t.bytes_received,
        errors: t.errors,
        latency_ms: t.latency_ms,
    }))
}

const MAX_TEST_TIMEOUT: Duration = Duration::from_secs(120);

#[utoipa::path(post, path = "/api/v1/backends/{name}/test", tag = "backends", params(("name" = String, Path)),
    request_body(content = Option<BackendTestRequest>),
    responses((status = 200, body = BackendTestResult), (status = 400, body = switchyard_api::ErrorBody),
              (status = 404, body = switchyard_api::ErrorBody),
              (status = 415, description = "a body that is not sent as application/json", body = switchyard_api::ErrorBody)))]
pub async fn test(
    State(state): State<Arc<ServerState>>,
    Path(name): Path<String>,
    super::body::TypedBody(body, _): super::body::JsonBytes,
) -> Result<Json<BackendTestResult>, ApiError> {
    let backend = find(&state, &name)?;
    // The body is optional: empty means every default.
    let req: BackendTestRequest = if body.iter().all(u8::is_ascii_whitespace) {
        BackendTestRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request("INVALID_JSON", e.to_string()))?
    };
    let target = req
        .target
        .unwrap_or_else(|| state.config.load().api.backend_test_target.clone());
    let (host, port) = crate::health_checks::split_target(&target).ok_or_else(|| {
        ApiError::bad_request(
            "INVALID_TARGET",
            format!("target {target:?} is not host:port"),
        )
    })?;
    let timeout = match req.timeout {
        Some(t) => {
            switchyard_config::Duration::parse(&t)
                .map_err(|e| ApiError::bad_request("INVALID_TIMEOUT", e.to_string()))?
                .0
        }
        None => Duration::from_secs(10),
    };
    if timeout.is_zero() || timeout > MAX_TEST_TIMEOUT {
        return Err(ApiError::bad_request(
            "INVALID_TIMEOUT",
            "timeout must be between 1ns and 2m",
        ));
    }
    let (reply, answer) = futures::channel::oneshot::channel();
    state
        .commands
        .try_send(Command::TestBackend {
            backend: backend.clone(),
            purpose: TestPurpose::Manual,
            host,
            port,
            timeout,
            reply,
        })
        .map_err(|_| {
            ApiError::unavailable("BUSY", "the data plane's command queue is full; try again")
        })?;
    let outcome = tokio::time::timeout(timeout + Duration::from_secs(2), answer)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "TEST_TIMEOUT",
                "the data plane did not answer",
            )
        })?
        .map_err(|_| ApiError::internal("the data plane dropped the test"))?;
    let (duration, result) = outcome;
    let (status, error) = match result {
        Ok(()) => ("ok", None),
        Err(e) => ("failed", Some(e)),
    };
    Ok(Json(BackendTestResult {
        status: status.into(),
        backend: name,
        target,
        duration: format!("{}", switchyard_config::Duration(duration)),
        healthy: error.is_none(),
        error,
    }))
}
