//! Errors of the diagnostics endpoints: one status each, with the API's `{error, message, code}`
//! body.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use switchyard_api::ErrorBody;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "invalid_request",
            StatusCode::CONFLICT => "conflict",
            StatusCode::NOT_IMPLEMENTED => "not_implemented",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable",
            _ => "internal_error",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.kind().into(),
            message: self.message,
            code: self.code.into(),
        };
        (self.status, Json(body)).into_response()
    }
}
