//! API authentication: when `api.token` is set, every endpoint except health and the PAC file
//! needs it as `Authorization: Bearer <token>` or a `token` query parameter.

use super::error::ApiError;
use crate::server::ServerState;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn presented_token(req: &Request) -> Option<String> {
    if let Some(v) = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        if let Some((scheme, value)) = v.split_once(' ') {
            if scheme.eq_ignore_ascii_case("bearer") {
                return Some(value.trim().to_owned());
            }
        }
    }
    let query = req.uri().query()?;
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == "token").then(|| v.to_owned())
    })
}

pub async fn require_token(
    State(state): State<Arc<ServerState>>,
    req: Request,
    next: Next,
) -> Response {
    let cfg = state.config.load();
    let Some(expected) = cfg.api.token.as_deref() else {
        return next.run(req).await;
    };
    match presented_token(&req) {
        Some(t) if constant_time_eq(t.as_bytes(), expected.as_bytes()) => next.run(req).await,
        _ => {
            let mut r = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "UNAUTHORIZED",
                "a valid API token is required (Authorization: Bearer <token>)",
            )
            .into_response();
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"switchyard\""),
            );
            r
        }
    }
}
