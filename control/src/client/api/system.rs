//! Health, version, status, the server connection and selection, quick settings, login.

use super::S;
use crate::api::auth::{constant_time_eq, message, SESSION_TTL};
use crate::api::error::{ApiError, ApiJson};
use crate::client::state::ClientError;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::Utc;
use switchyard_api::client::{
    ClientStatus, QuickSettings, SelectServer, ServerEntry, ServerSelected, StatusReply,
};
use switchyard_api::{HealthResponse, LoginRequest, MessageWithTime, VersionInfo};

/// `healthy`, or `degraded` (with `problems`) while connected and the selected server cannot be
/// reached, while a data-plane core is down, or while the kill switch blocks (`blocked: not
/// connected`).
#[utoipa::path(get, path = "/api/v1/health", tag = "system", security(()),
    responses((status = 200, body = HealthResponse)))]
pub async fn health(State(state): State<S>) -> Json<HealthResponse> {
    let cores = state.core_health.states();
    let problems = state.problems();
    Json(HealthResponse::measured(
        problems,
        cores.iter().filter(|c| c.serving()).count(),
        cores.len(),
    ))
}

#[utoipa::path(get, path = "/api/v1/version", tag = "system", responses((status = 200, body = VersionInfo)))]
pub async fn version() -> Json<VersionInfo> {
    Json(crate::api::system::version_info())
}

#[utoipa::path(get, path = "/api/v1/status", tag = "system", responses((status = 200, body = ClientStatus)))]
pub async fn status(State(state): State<S>) -> Json<ClientStatus> {
    let totals = state.counters.totals();
    let server = state.selected_server();
    let uptime = std::time::Duration::from_secs(state.started.elapsed().as_secs());
    Json(ClientStatus {
        // the kill switch says so where every client of the API looks first
        status: state.blocked().unwrap_or_else(|| "running".into()),
        version: env!("CARGO_PKG_VERSION").into(),
        server_connected: state.is_connected() && server.is_some(),
        server_address: server.map(|s| s.address).unwrap_or_default(),
        http_proxy: state.http_addr.map(|a| a.to_string()).unwrap_or_default(),
        socks5_proxy: state.socks5_addr.map(|a| a.to_string()).unwrap_or_default(),
        vpn_enabled: state.vpn.phase().enabled(),
        vpn_status: state.vpn.phase().as_str().into(),
        debug_entries: state.debug.len() as u64,
        uptime: switchyard_config::Duration(uptime).to_string(),
        bytes_sent: totals.bytes_sent,
        bytes_received: totals.bytes_received,
        active_connections: totals.active_connections,
        timestamp: Utc::now(),
    })
}

/// Routes `server` destinations through the selected server.
#[utoipa::path(post, path = "/api/v1/connect", tag = "connection",
    responses((status = 200, body = StatusReply), (status = 409, description = "no server configured", body = switchyard_api::ErrorBody)))]
pub async fn connect(State(state): State<S>) -> Result<Json<StatusReply>, ClientError> {
    // The VPN's resolver moves to the server before the engine routes through it: a question
    // asked in between goes through the server or is refused (kill switch), never direct.
    if let Some(server) = state.selected_server() {
        state.vpn_follow(Some(&server)).await;
    }
    state.connect()?;
    state.vpn_follow_server().await;
    Ok(Json(StatusReply::new("connected")))
}

/// Every destination goes direct until the next connect — or, with
/// `routing.when_disconnected: block`, only `direct` routes work.
#[utoipa::path(post, path = "/api/v1/disconnect", tag = "connection",
    responses((status = 200, body = StatusReply)))]
pub async fn disconnect(State(state): State<S>) -> Result<Json<StatusReply>, ClientError> {
    state.disconnect()?;
    state.vpn_follow_server().await;
    Ok(Json(StatusReply::new("disconnected")))
}

#[utoipa::path(get, path = "/api/v1/servers", tag = "connection",
    responses((status = 200, body = [ServerEntry])))]
pub async fn servers(State(state): State<S>) -> Json<Vec<ServerEntry>> {
    Json(state.server_entries())
}

#[utoipa::path(post, path = "/api/v1/server/select", tag = "connection", request_body = SelectServer,
    responses((status = 200, body = ServerSelected), (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn select(
    State(state): State<S>,
    ApiJson(body): ApiJson<SelectServer>,
) -> Result<Json<ServerSelected>, ClientError> {
    let name = state.select(&body.server, false)?;
    state.vpn_follow_server().await;
    Ok(Json(ServerSelected {
        status: "selected".into(),
        server: name,
    }))
}

/// Selects by the older form's `id` (a server without one is addressed by its name).
#[utoipa::path(post, path = "/api/v1/servers/{id}/select", tag = "connection",
    params(("id" = String, Path)),
    responses((status = 200, body = StatusReply), (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn select_by_id(
    State(state): State<S>,
    Path(id): Path<String>,
) -> Result<Json<StatusReply>, ClientError> {
    state.select(&id, true)?;
    state.vpn_follow_server().await;
    Ok(Json(StatusReply::new("ok")))
}

#[utoipa::path(get, path = "/api/v1/settings", tag = "settings", responses((status = 200, body = QuickSettings)))]
pub async fn settings(State(state): State<S>) -> Json<QuickSettings> {
    Json(state.settings())
}

/// Stores the quick settings in the data directory; a different `current_server` selects it.
#[utoipa::path(post, path = "/api/v1/settings", tag = "settings", request_body = QuickSettings,
    responses((status = 200, body = StatusReply), (status = 404, description = "current_server names no server", body = switchyard_api::ErrorBody)))]
pub async fn update_settings(
    State(state): State<S>,
    ApiJson(body): ApiJson<QuickSettings>,
) -> Result<Json<StatusReply>, ClientError> {
    state.update_settings(body)?;
    state.vpn_follow_server().await;
    Ok(Json(StatusReply::new("updated")))
}

/// Exchanges the API token for a session cookie (as on the server API).
#[utoipa::path(post, path = "/api/v1/login", tag = "auth", security(()), request_body = LoginRequest,
    responses((status = 200, body = MessageWithTime), (status = 401, body = switchyard_api::ErrorBody)))]
pub async fn login(
    State(state): State<S>,
    ApiJson(body): ApiJson<LoginRequest>,
) -> Result<Response, ApiError> {
    let cfg = state.config.load();
    let Some(expected) = cfg.api.token.as_deref() else {
        return Ok(message("no API token is configured: the API needs no login").into_response());
    };
    if !constant_time_eq(body.token.as_bytes(), expected.as_bytes()) {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            "wrong API token",
        ));
    }
    let id = state
        .sessions
        .create()
        .map_err(|_| ApiError::internal("cannot create a session"))?;
    let mut r = message("logged in").into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        state
            .sessions
            .set_cookie(&id, SESSION_TTL.as_secs(), false)?,
    );
    Ok(r)
}

#[utoipa::path(post, path = "/api/v1/logout", tag = "auth", security(()),
    responses((status = 200, body = MessageWithTime)))]
pub async fn logout(State(state): State<S>, headers: HeaderMap) -> Result<Response, ApiError> {
    let ended = state
        .sessions
        .id_in(&headers)
        .is_some_and(|id| state.sessions.remove(id));
    let mut r = message(if ended { "logged out" } else { "no session" }).into_response();
    r.headers_mut()
        .insert(header::SET_COOKIE, state.sessions.set_cookie("", 0, false)?);
    Ok(r)
}
