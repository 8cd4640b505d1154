//! `GET /api/v1/debug/memory`.

use crate::error::ApiError;
use crate::DiagnosticsState;
use axum::extract::State;
use axum::Json;
use switchyard_api::diagnostics::MemoryStats;

#[utoipa::path(get, path = "/api/v1/debug/memory", tag = "debug",
    responses((status = 200, body = MemoryStats,
        description = "allocator, stack and thread figures of this process under the Go field names \
                       (see the switchyard-diagnostics crate for the mapping; GC fields are 0)")))]
pub async fn memory(State(state): State<DiagnosticsState>) -> Result<Json<MemoryStats>, ApiError> {
    let subscribers = state.logs.subscriber_count();
    // Reads /proc files: off the async workers.
    tokio::task::spawn_blocking(move || crate::memory::collect(subscribers))
        .await
        .map(Json)
        .map_err(|e| {
            ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "INTERNAL",
                e.to_string(),
            )
        })
}
