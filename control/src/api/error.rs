//! API errors: one status each, with the `{error, message, code}` body.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::Json;

pub use switchyard_api::http_error::ApiError;

/// `Json<T>` whose rejections (wrong types, missing fields, bad syntax, wrong content type,
/// oversized body) are answered with the API's error body instead of axum's plain text.
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    Json<T>: FromRequest<S, Rejection = JsonRejection>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Self(v)),
            Err(rejection) => {
                let status = rejection.status();
                let code = match status {
                    StatusCode::PAYLOAD_TOO_LARGE => "BODY_TOO_LARGE",
                    StatusCode::UNSUPPORTED_MEDIA_TYPE => "UNSUPPORTED_MEDIA_TYPE",
                    _ => "INVALID_JSON",
                };
                // Wrong types and missing fields come back as 422 from axum; the API answers 400.
                let status = if status == StatusCode::UNPROCESSABLE_ENTITY {
                    StatusCode::BAD_REQUEST
                } else {
                    status
                };
                Err(ApiError::new(status, code, rejection.body_text()))
            }
        }
    }
}
