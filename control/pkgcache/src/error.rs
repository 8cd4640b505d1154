//! The crate's error type: each variant says whose fault it is and maps to exactly one status.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::key::KeyError;

/// Errors of package operations and the HTTP edge.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Client: the path is not a valid package address (400).
    #[error("{0}")]
    InvalidKey(#[from] KeyError),
    /// Client: no such package (404).
    #[error("package not found")]
    NotFound,
    /// Client: the package is already stored; packages are immutable (409).
    #[error("package already exists")]
    AlreadyExists,
    /// Client: another upload of this package is in progress on this server (409).
    #[error("an upload of this package is already in progress")]
    UploadInProgress,
    /// Client: the server mode forbids the operation (403).
    #[error("{0}")]
    ModeForbidden(&'static str),
    /// Client: a write without credentials from a non-loopback address while
    /// `auth.allow_anonymous_writes` is off (403).
    #[error("writes without credentials are accepted only from loopback: turn auth on, or set auth.allow_anonymous_writes")]
    AnonymousWrite,
    /// Client: credentials missing or wrong (401).
    #[error("authentication required")]
    Unauthorized,
    /// Client: the upload is larger than `limits.max_package_size` (413).
    #[error("package larger than the limit of {0} bytes")]
    TooLarge(u64),
    /// Client: the request body broke off (connection dropped, short body). Nothing was stored;
    /// retry is safe. Answered with 400 when the client is still there to read it.
    #[error("upload aborted by the client: {0}")]
    ClientAborted(String),
    /// Server: storing the upload failed (500); nothing was stored, retry is safe.
    #[error("upload failed: {0}")]
    UploadFailed(String),
    /// Server: the store could not be read or written (500).
    #[error("storage error: {0}")]
    Storage(String),
}

impl Error {
    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            Error::InvalidKey(_) | Error::ClientAborted(_) => StatusCode::BAD_REQUEST,
            Error::NotFound => StatusCode::NOT_FOUND,
            Error::AlreadyExists | Error::UploadInProgress => StatusCode::CONFLICT,
            Error::ModeForbidden(_) | Error::AnonymousWrite => StatusCode::FORBIDDEN,
            Error::Unauthorized => StatusCode::UNAUTHORIZED,
            Error::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Error::UploadFailed(_) | Error::Storage(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Whether retrying the same request may succeed.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            Error::UploadInProgress
                | Error::ClientAborted(_)
                | Error::UploadFailed(_)
                | Error::Storage(_)
        )
    }

    /// Short machine-readable code for the JSON error body.
    pub fn code(&self) -> &'static str {
        match self {
            Error::InvalidKey(_) => "invalid_path",
            Error::NotFound => "not_found",
            Error::AlreadyExists => "already_exists",
            Error::UploadInProgress => "upload_in_progress",
            Error::ModeForbidden(_) => "forbidden_by_mode",
            Error::AnonymousWrite => "anonymous_write_refused",
            Error::Unauthorized => "unauthorized",
            Error::TooLarge(_) => "too_large",
            Error::ClientAborted(_) => "client_aborted",
            Error::UploadFailed(_) => "upload_failed",
            Error::Storage(_) => "storage_error",
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": self.code(),
            "message": self.to_string(),
            "retryable": self.retryable(),
        });
        let mut resp = (self.status(), axum::Json(body)).into_response();
        if matches!(self, Error::Unauthorized) {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(
                    "Bearer realm=\"switchyard-pkgcache\", Basic realm=\"switchyard-pkgcache\"",
                ),
            );
        }
        resp
    }
}

/// An `Error` from an `io::Error` of a storage operation.
pub fn storage(e: impl std::fmt::Display) -> Error {
    Error::Storage(e.to_string())
}
