//! The crate's one error type and its mapping to exactly one HTTP status and a JSON body
//! `{"error": "message"}` (plus `details` for validation failures).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// One validation failure: which field, what is wrong (the message is shown to users).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldError {
    pub field: &'static str,
    pub message: String,
}

impl FieldError {
    pub fn new(field: &'static str, message: impl Into<String>) -> Self {
        FieldError {
            field,
            message: message.into(),
        }
    }
}

/// Everything a request can fail with. Client-side errors carry the message the caller sees;
/// `Internal` is logged and answered with a generic 500.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the request is malformed or a field is invalid.
    #[error("{0}")]
    BadRequest(String),
    /// 400 with per-field details; the first message is the `error`.
    #[error("validation failed")]
    Validation(Vec<FieldError>),
    /// 401: no valid session, or wrong credentials.
    #[error("{0}")]
    Unauthorized(String),
    /// 403: CSRF token missing or wrong.
    #[error("{0}")]
    Forbidden(String),
    /// 404: absent, or belonging to someone else (never 403, so nothing leaks).
    #[error("{0} not found")]
    NotFound(&'static str),
    /// 409: a unique value is taken.
    #[error("{0}")]
    Conflict(String),
    /// 413: body or upload too large.
    #[error("{0}")]
    TooLarge(String),
    /// 429: bruteforce limit; retry after this many seconds.
    #[error("too many attempts, retry in {0} s")]
    TooManyRequests(u64),
    /// 500: storage or another internal failure (not the caller's fault; may be retried).
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        ApiError::Internal(format!("database: {e}"))
    }
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::Validation(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Validation failure of one field.
    pub fn field(field: &'static str, message: impl Into<String>) -> Self {
        ApiError::Validation(vec![FieldError::new(field, message)])
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = match &self {
            ApiError::Validation(list) => serde_json::json!({
                "error": list.first().map(|f| f.message.as_str()).unwrap_or("Invalid input"),
                "details": list,
            }),
            ApiError::Internal(m) => {
                tracing::error!("{m}");
                serde_json::json!({"error": "Internal server error"})
            }
            ApiError::TooManyRequests(_) => {
                serde_json::json!({"error": "Too many attempts, try again later"})
            }
            other => serde_json::json!({"error": other.to_string()}),
        };
        let mut resp = (status, axum::Json(body)).into_response();
        if let ApiError::TooManyRequests(secs) = self {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        resp
    }
}
