//! `GET /api/v1/logs` (a page of the captured log) and `GET /api/v1/logs/stream` (server-sent
//! events: `{"type":"connected"}` first, then every new entry).

use crate::error::ApiError;
use crate::log_ring::PageQuery;
use crate::log_stream::{Removal, SubscribeError};
use crate::DiagnosticsState;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Json;
use futures::{Stream, StreamExt as _};
use serde::Deserialize;
use std::convert::Infallible;
use switchyard_api::diagnostics::{LogLevel, LogPage, LogStreamConnected};

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct LogQuery {
    /// Entries per page (default 100, at most the retained capacity).
    limit: Option<usize>,
    /// Entries to skip, newest first (default 0).
    offset: Option<usize>,
    /// Minimum level: `debug`, `info`, `warn` or `error` (`warn` returns warn and error).
    level: Option<String>,
}

/// Parses the query into a page request, bounded by the ring's capacity.
pub fn page_query(q: &LogQuery, capacity: usize) -> Result<PageQuery, ApiError> {
    let min_level = match q.level.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(l) => Some(LogLevel::parse(l).ok_or_else(|| {
            ApiError::bad_request(
                "INVALID_LEVEL",
                format!("level must be debug, info, warn or error, not {l:?}"),
            )
        })?),
    };
    Ok(PageQuery {
        limit: q.limit.unwrap_or(100).min(capacity),
        offset: q.offset.unwrap_or(0),
        min_level,
    })
}

#[utoipa::path(get, path = "/api/v1/logs", tag = "logs", params(LogQuery),
    responses((status = 200, body = LogPage), (status = 400, body = switchyard_api::ErrorBody)))]
pub async fn list(
    State(state): State<DiagnosticsState>,
    query: Result<Query<LogQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<LogPage>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request("INVALID_QUERY", e.body_text()))?;
    let page = page_query(&q, state.logs.capacity())?;
    Ok(Json(state.logs.page(&page)))
}

#[utoipa::path(get, path = "/api/v1/logs/stream", tag = "logs",
    responses(
        (status = 200, content_type = "text/event-stream",
         description = "`data: {\"type\":\"connected\"}` first, then one `data: <LogEntry JSON>` per log entry. \
                        A subscriber more than 100 messages behind is dropped (its stream ends)."),
        (status = 503, body = switchyard_api::ErrorBody,
         description = "the stream already has its 100 subscribers (code LOG_STREAM_FULL)")))]
pub async fn stream(
    State(state): State<DiagnosticsState>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let mut sub = state.logs.subscribe().map_err(|e| match e {
        SubscribeError::TooManySubscribers { .. } => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "LOG_STREAM_FULL",
            e.to_string(),
        ),
    })?;
    let id = sub.id();
    if let Some(notice) = sub.removal_notice() {
        let buffer = state.logs.stream_limits().buffer;
        // Logged here, on its own task, never from inside the capture layer.
        tokio::spawn(async move {
            if notice.wait().await == Removal::TooSlow {
                tracing::warn!(
                    subscriber = id,
                    buffer,
                    "log stream subscriber dropped: it fell more than {buffer} messages behind"
                );
            }
        });
    }
    let connected = serde_json::to_string(&LogStreamConnected::new())
        .unwrap_or_else(|_| r#"{"type":"connected"}"#.into());
    let first = futures::stream::once(async move { Ok(Event::default().data(connected)) });
    let entries = futures::stream::unfold(sub, |mut sub| async move {
        let message = sub.recv().await?;
        Some((Ok(Event::default().data(&*message)), sub))
    });
    Ok(Sse::new(first.chain(entries)).keep_alive(KeepAlive::default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(limit: Option<usize>, offset: Option<usize>, level: Option<&str>) -> LogQuery {
        LogQuery {
            limit,
            offset,
            level: level.map(str::to_owned),
        }
    }

    #[test]
    fn defaults_and_bounds() {
        let p = page_query(&q(None, None, None), 1000).expect("valid");
        assert_eq!((p.limit, p.offset, p.min_level), (100, 0, None));
        let p = page_query(&q(Some(5000), Some(7), Some("WARNING")), 1000).expect("valid");
        assert_eq!(
            (p.limit, p.offset, p.min_level),
            (1000, 7, Some(LogLevel::Warn))
        );
        assert_eq!(
            page_query(&q(None, None, Some("")), 10)
                .expect("valid")
                .min_level,
            None
        );
        let bad = page_query(&q(None, None, Some("loud")), 10).expect_err("invalid level");
        assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    }
}
