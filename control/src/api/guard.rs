//! The browser-threat guard: one layer around the whole router of the server API (with the
//! dashboard and the PAC files), the client API and the client web UI. Each request's Host,
//! Origin, `Sec-Fetch-Site`, method and body type go to [`OriginPolicy::admit`] (the decision,
//! plain and unit-tested in `control/src/origin.rs`); a refusal is answered with the API's
//! error body (403, or 415 for a body type a page may send cross-site) and one warning line
//! naming the client and the reason. It stops:
//!
//! - DNS rebinding: a page whose name the attacker re-points at this listener sends its own
//!   name as Host; only IP literals, loopback names and `api.allowed_origins` entries pass.
//! - Cross-site writes: a page elsewhere can send any method with a `text/plain` or form body,
//!   or none, without a CORS preflight; it cannot hide its Origin (or `Sec-Fetch-Site`).
//!
//! Same-origin pages (the dashboards), and clients that send no Origin (curl, the mobile app,
//! mesh peers), pass.

use super::error::ApiError;
use crate::origin::{Refusal, RequestFacts};
use axum::body::HttpBody;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderName, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;
use std::sync::Arc;

/// A listener's state that can decide on a request: its origin policy and whether it serves
/// TLS (the Host's default port).
pub trait Guarded: Send + Sync + 'static {
    fn admit(&self, facts: &RequestFacts<'_>) -> Result<(), Refusal>;
    fn tls(&self) -> bool;
}

/// The layer: `middleware::from_fn_with_state(state, guard::<State>)` on the whole router.
pub async fn guard<T: Guarded>(State(api): State<Arc<T>>, req: Request, next: Next) -> Response {
    let refusal = {
        let headers = req.headers();
        let text = |name: HeaderName| {
            headers
                .get(name)
                .map(|v| v.to_str().unwrap_or("<not UTF-8>"))
        };
        // HTTP/2 carries the Host as the URI's authority.
        let host = text(header::HOST).or_else(|| req.uri().authority().map(|a| a.as_str()));
        let facts = RequestFacts {
            changes_state: super::auth::changes_state(req.method()),
            host,
            origin: text(header::ORIGIN),
            sec_fetch_site: text(HeaderName::from_static("sec-fetch-site")),
            content_type: text(header::CONTENT_TYPE),
            has_body: req.body().size_hint().exact() != Some(0),
            tls: api.tls(),
        };
        api.admit(&facts).err()
    };
    let Some(refusal) = refusal else {
        return next.run(req).await;
    };
    let client = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.to_string())
        .unwrap_or_else(|| "unknown".into());
    let (status, code) = refusal.status_and_code();
    tracing::warn!(client = %client, method = %req.method(), path = %req.uri().path(), status, reason = %refusal, "API request refused");
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN);
    ApiError::new(status, code, refusal.to_string()).into_response()
}

impl Guarded for crate::server::ServerState {
    fn admit(&self, facts: &RequestFacts<'_>) -> Result<(), Refusal> {
        self.origin_policy.admit(facts)
    }
    fn tls(&self) -> bool {
        self.api_tls
    }
}

/// The client's list can change with its configuration (it is applied with it).
impl Guarded for crate::client::state::ClientState {
    fn admit(&self, facts: &RequestFacts<'_>) -> Result<(), Refusal> {
        self.origin_policy.load().admit(facts)
    }
    fn tls(&self) -> bool {
        false
    }
}
