//! The crate's error type: an error code from the spec's table (plus a few documented
//! extensions), the message shown to the caller, and exactly one HTTP status per code. The
//! JSON body is `{success: false, error, code}` (with `job_id` once a job exists).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// Error codes. The first seven are the spec's table; the rest are extensions for cases the
/// spec does not cover, documented in the README.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// 400: invalid video URL.
    InvalidUrl,
    /// 400: key required but not provided.
    MissingApiKey,
    /// 400: unsupported language code.
    InvalidLanguage,
    /// 404: video not accessible.
    VideoNotFound,
    /// 500: speech transcription error.
    TranscriptionFailed,
    /// 500: language-model translation error.
    TranslationFailed,
    /// 502: external API error.
    ApiError,
    /// 400 (extension): the body is not a JSON object, a field has the wrong type, or `tier`
    /// is outside 1–4.
    InvalidRequest,
    /// 404 (extension): no job with this id.
    JobNotFound,
    /// 429 (extension): an optional rate limit was reached.
    RateLimited,
    /// 500 (extension): the service's own storage failed.
    InternalError,
    /// 404 (extension): no such endpoint.
    NotFound,
    /// Recorded on a job whose client disconnected (never sent: nobody is listening).
    Cancelled,
}

impl ErrorCode {
    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::InvalidUrl
            | ErrorCode::MissingApiKey
            | ErrorCode::InvalidLanguage
            | ErrorCode::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorCode::VideoNotFound | ErrorCode::JobNotFound | ErrorCode::NotFound => {
                StatusCode::NOT_FOUND
            }
            ErrorCode::TranscriptionFailed
            | ErrorCode::TranslationFailed
            | ErrorCode::InternalError
            | ErrorCode::Cancelled => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::ApiError => StatusCode::BAD_GATEWAY,
            ErrorCode::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// The code as written on the wire (`INVALID_URL`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidUrl => "INVALID_URL",
            ErrorCode::MissingApiKey => "MISSING_API_KEY",
            ErrorCode::InvalidLanguage => "INVALID_LANGUAGE",
            ErrorCode::VideoNotFound => "VIDEO_NOT_FOUND",
            ErrorCode::TranscriptionFailed => "TRANSCRIPTION_FAILED",
            ErrorCode::TranslationFailed => "TRANSLATION_FAILED",
            ErrorCode::ApiError => "API_ERROR",
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::JobNotFound => "JOB_NOT_FOUND",
            ErrorCode::RateLimited => "RATE_LIMITED",
            ErrorCode::InternalError => "INTERNAL_ERROR",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::Cancelled => "CANCELLED",
        }
    }
}

/// A failure with the code and message the caller gets. Messages never contain keys.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct Error {
    pub code: ErrorCode,
    pub message: String,
    /// Seconds the caller should wait (rate limit).
    pub retry_after: Option<u64>,
}

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn status(&self) -> StatusCode {
        self.code.status()
    }

    /// The `{success:false, error, code}` body, with `job_id` when there is one.
    pub fn body(&self, job_id: Option<&str>) -> serde_json::Value {
        let mut v = serde_json::json!({
            "success": false,
            "error": self.message,
            "code": self.code.as_str(),
        });
        if let (Some(id), Some(obj)) = (job_id, v.as_object_mut()) {
            obj.insert("job_id".into(), id.into());
        }
        v
    }

    /// The response with a job id in the body.
    pub fn into_response_for_job(self, job_id: &str) -> Response {
        let body = self.body(Some(job_id));
        (self.status(), axum::Json(body)).into_response()
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        tracing::error!("database: {e}");
        Error::new(ErrorCode::InternalError, "internal storage error")
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let body = self.body(None);
        let mut resp = (self.status(), axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            if let Ok(v) = axum::http::HeaderValue::from_str(&secs.to_string()) {
                resp.headers_mut()
                    .insert(axum::http::header::RETRY_AFTER, v);
            }
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_table_statuses() {
        let table = [
            (ErrorCode::InvalidUrl, 400, "INVALID_URL"),
            (ErrorCode::MissingApiKey, 400, "MISSING_API_KEY"),
            (ErrorCode::InvalidLanguage, 400, "INVALID_LANGUAGE"),
            (ErrorCode::VideoNotFound, 404, "VIDEO_NOT_FOUND"),
            (ErrorCode::TranscriptionFailed, 500, "TRANSCRIPTION_FAILED"),
            (ErrorCode::TranslationFailed, 500, "TRANSLATION_FAILED"),
            (ErrorCode::ApiError, 502, "API_ERROR"),
        ];
        for (code, status, name) in table {
            assert_eq!(code.status().as_u16(), status);
            assert_eq!(code.as_str(), name);
            assert_eq!(serde_json::to_value(code).ok(), Some(name.into()));
        }
        let body = Error::new(ErrorCode::ApiError, "provider said 401").body(Some("j1"));
        assert_eq!(
            body,
            serde_json::json!({"success": false, "error": "provider said 401", "code": "API_ERROR", "job_id": "j1"})
        );
    }
}
