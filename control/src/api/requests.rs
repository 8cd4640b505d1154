//! `/api/v1/requests`: the request log, its statistics, and clearing it.

use crate::request_log::Page;
use crate::server::ServerState;
use axum::extract::{Query, State};
use axum::Json;
use serde::Deserialize;
use std::sync::Arc;
use switchyard_api::{Message, RequestLogList, RequestLogStats};

const MAX_PAGE: usize = 10_000;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct RequestQuery {
    /// Entries per page (default 100).
    limit: Option<usize>,
    /// Only entries with an id greater than this.
    since: Option<u64>,
    /// Entries to skip, newest first (default 0).
    offset: Option<usize>,
}

#[utoipa::path(get, path = "/api/v1/requests", tag = "requests", params(RequestQuery),
    responses((status = 200, body = RequestLogList), (status = 400, body = switchyard_api::ErrorBody)))]
pub async fn list(
    State(state): State<Arc<ServerState>>,
    query: Result<Query<RequestQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<RequestLogList>, super::error::ApiError> {
    let Query(q) =
        query.map_err(|e| super::error::ApiError::bad_request("INVALID_QUERY", e.body_text()))?;
    let page = Page {
        limit: q.limit.unwrap_or(100).min(MAX_PAGE),
        offset: q.offset.unwrap_or(0),
        since: q.since,
    };
    Ok(Json(RequestLogList {
        enabled: state.config.load().api.enable_request_log,
        requests: state.request_log.page(&page),
    }))
}

#[utoipa::path(get, path = "/api/v1/requests/stats", tag = "requests", responses((status = 200, body = RequestLogStats)))]
pub async fn stats(State(state): State<Arc<ServerState>>) -> Json<RequestLogStats> {
    Json(
        state
            .request_log
            .stats(state.config.load().api.enable_request_log),
    )
}

#[utoipa::path(delete, path = "/api/v1/requests", tag = "requests", responses((status = 200, body = Message)))]
pub async fn clear(State(state): State<Arc<ServerState>>) -> Json<Message> {
    state.request_log.clear();
    Json(Message {
        message: "request log cleared".into(),
    })
}
