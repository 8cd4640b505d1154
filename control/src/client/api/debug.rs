//! Debug entries: the proxied requests the data plane recorded, newest last.

use super::S;
use crate::api::error::ApiError;
use axum::extract::{Path, State};
use axum::Json;
use switchyard_api::client::{DebugEntry, MessageReply};

#[utoipa::path(get, path = "/api/v1/debug/entries", tag = "debug", responses((status = 200, body = [DebugEntry])))]
pub async fn entries(State(state): State<S>) -> Json<Vec<DebugEntry>> {
    Json(state.debug.all())
}

#[utoipa::path(get, path = "/api/v1/debug/entries/last/{count}", tag = "debug", params(("count" = u32, Path)),
    responses((status = 200, body = [DebugEntry]), (status = 400, body = switchyard_api::ErrorBody)))]
pub async fn last(
    State(state): State<S>,
    Path(count): Path<String>,
) -> Result<Json<Vec<DebugEntry>>, ApiError> {
    let count: usize = count.parse().map_err(|_| {
        ApiError::bad_request("INVALID_COUNT", "count must be a non-negative integer")
    })?;
    Ok(Json(state.debug.last(count)))
}

#[utoipa::path(delete, path = "/api/v1/debug/entries", tag = "debug", responses((status = 200, body = MessageReply)))]
pub async fn clear(State(state): State<S>) -> Json<MessageReply> {
    state.debug.clear();
    Json(MessageReply {
        message: "debug entries cleared".into(),
    })
}

#[utoipa::path(get, path = "/api/v1/debug/errors", tag = "debug", responses((status = 200, body = [DebugEntry])))]
pub async fn errors(State(state): State<S>) -> Json<Vec<DebugEntry>> {
    Json(state.debug.errors())
}
