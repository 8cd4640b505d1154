//! Bodies of the endpoints that read them as raw bytes (an optional JSON body, a YAML or JSON
//! file) with the same content-type rule as axum's `Json`: the body's declared type must be one
//! the endpoint reads, else 415 `UNSUPPORTED_MEDIA_TYPE`. A blank body (the optional bodies)
//! needs no type. Together with the guard's refusal of `text/plain` and form bodies, no
//! endpoint reads a body that a web page could have sent from another site without a preflight.

use super::error::ApiError;
use crate::origin::media_type;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use std::marker::PhantomData;

/// What an endpoint reads: its accepted media types and how to name them in an error.
pub trait BodyKind {
    const TYPES: &'static [&'static str];
    const WHAT: &'static str;
    /// Also any `application/…+json` (as axum's `Json` accepts).
    const PLUS_JSON: bool;
}

/// A JSON body: `application/json` (or `application/…+json`).
pub struct JsonKind;
impl BodyKind for JsonKind {
    const TYPES: &'static [&'static str] = &["application/json"];
    const WHAT: &'static str = "JSON: send it as application/json";
    const PLUS_JSON: bool = true;
}

/// A configuration file, YAML or JSON (JSON is YAML), or bytes as read from a file.
pub struct ConfigFileKind;
impl BodyKind for ConfigFileKind {
    const TYPES: &'static [&'static str] = &[
        "application/yaml",
        "application/x-yaml",
        "text/yaml",
        "text/x-yaml",
        "application/json",
        "application/octet-stream",
    ];
    const WHAT: &'static str =
        "a configuration file: send it as application/yaml, application/json or application/octet-stream";
    const PLUS_JSON: bool = false;
}

/// The raw body of an endpoint that reads `K`.
pub struct TypedBody<K>(pub Bytes, pub PhantomData<K>);

/// True when `content_type` is one `K` reads.
pub fn accepts<K: BodyKind>(content_type: Option<&str>) -> bool {
    let Some(media) = content_type.map(media_type) else {
        return false;
    };
    K::TYPES.contains(&media.as_str())
        || (K::PLUS_JSON && media.starts_with("application/") && media.ends_with("+json"))
}

impl<K: BodyKind, S: Send + Sync> FromRequest<S> for TypedBody<K> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap_or_default().to_owned());
        let body = Bytes::from_request(req, state).await.map_err(|r| {
            let code = if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                "BODY_TOO_LARGE"
            } else {
                "INVALID_BODY"
            };
            ApiError::new(r.status(), code, r.body_text())
        })?;
        if body.iter().all(u8::is_ascii_whitespace) || accepts::<K>(content_type.as_deref()) {
            return Ok(Self(body, PhantomData));
        }
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UNSUPPORTED_MEDIA_TYPE",
            format!(
                "Content-Type {}: the body is {}",
                content_type.as_deref().unwrap_or("missing"),
                K::WHAT
            ),
        ))
    }
}

/// An optional JSON body read as bytes.
pub type JsonBytes = TypedBody<JsonKind>;
/// A YAML or JSON configuration read as bytes.
pub type ConfigFileBytes = TypedBody<ConfigFileKind>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        for (ct, json, file) in [
            (Some("application/json"), true, true),
            (Some("Application/JSON; charset=utf-8"), true, true),
            (Some("application/merge-patch+json"), true, false),
            (Some("application/yaml"), false, true),
            (Some("text/yaml"), false, true),
            (Some("application/octet-stream"), false, true),
            (Some("text/plain"), false, false),
            (Some("text/plain+json"), false, false),
            (Some("application/x-www-form-urlencoded"), false, false),
            (Some("multipart/form-data; boundary=a"), false, false),
            (Some(""), false, false),
            (None, false, false),
        ] {
            assert_eq!(accepts::<JsonKind>(ct), json, "json {ct:?}");
            assert_eq!(accepts::<ConfigFileKind>(ct), file, "file {ct:?}");
        }
    }
}
