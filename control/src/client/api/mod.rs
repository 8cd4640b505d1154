//! The client API (tokio + axum), default `127.0.0.1:7383`. Routes are registered through the
//! server API's [`Routes`](crate::api::Routes) so the OpenAPI test holds the router and the
//! document to the same list; authentication, the `token` query stripping and the error body are
//! the server API's, shared.

pub mod cache;
pub mod config;
pub mod debug;
pub mod mesh;
pub mod openapi;
pub mod routes;
pub mod system;
pub mod vpn;

use super::state::{ClientError, ClientState};
use crate::api::error::ApiError;
use crate::api::Routes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use std::sync::Arc;
use switchyard_api::client::{ConfigError, ConfigValidation};

type S = Arc<ClientState>;

/// Endpoints that need the API token (when one is configured).
fn protected() -> Routes<S> {
    Routes::new()
        .add("get", "/api/v1/version", get(system::version))
        .add("get", "/api/v1/status", get(system::status))
        .add("post", "/api/v1/connect", post(system::connect))
        .add("post", "/api/v1/disconnect", post(system::disconnect))
        .add("get", "/api/v1/servers", get(system::servers))
        .add("post", "/api/v1/server/select", post(system::select))
        .add(
            "post",
            "/api/v1/servers/{id}/select",
            post(system::select_by_id),
        )
        .add("get", "/api/v1/settings", get(system::settings))
        .add("post", "/api/v1/settings", post(system::update_settings))
        .add("get", "/api/v1/config", get(config::get))
        .add("put", "/api/v1/config", put(config::put))
        .add("post", "/api/v1/config/reload", post(config::reload))
        .add("post", "/api/v1/config/validate", post(config::validate))
        .add("get", "/api/v1/config/defaults", get(config::defaults))
        .add("post", "/api/v1/config/export", post(config::export))
        .add("post", "/api/v1/config/import", post(config::import))
        .add("get", "/api/v1/routes", get(routes::list))
        .add("post", "/api/v1/routes", post(routes::create))
        .add("delete", "/api/v1/routes/{name}", delete(routes::remove))
        .add("get", "/api/v1/routes/test", get(routes::test))
        .add("get", "/api/v1/debug/entries", get(debug::entries))
        .add("delete", "/api/v1/debug/entries", delete(debug::clear))
        .add(
            "get",
            "/api/v1/debug/entries/last/{count}",
            get(debug::last),
        )
        .add("get", "/api/v1/debug/errors", get(debug::errors))
        .add("get", "/api/v1/cache/stats", get(cache::stats))
        .add("get", "/api/v1/cache/entries", get(cache::entries))
        .add(
            "delete",
            "/api/v1/cache/entries/{key}",
            delete(cache::delete_entry),
        )
        .add("post", "/api/v1/cache/clear", post(cache::clear))
        .add("get", "/api/v1/vpn/status", get(vpn::status))
        .add("post", "/api/v1/vpn/enable", post(vpn::enable))
        .add("post", "/api/v1/vpn/disable", post(vpn::disable))
        .add("get", "/api/v1/vpn/connections", get(vpn::connections))
        .add("get", "/api/v1/vpn/split/rules", get(vpn::split_rules))
        .add("put", "/api/v1/vpn/split/mode", put(vpn::split_mode))
        .add("post", "/api/v1/vpn/split/apps", post(vpn::add_app))
        .add(
            "delete",
            "/api/v1/vpn/split/apps/{name}",
            delete(vpn::remove_app),
        )
        .add("post", "/api/v1/vpn/split/domains", post(vpn::add_domain))
        .add(
            "delete",
            "/api/v1/vpn/split/domains/{pattern}",
            delete(vpn::remove_domain),
        )
        .add("post", "/api/v1/vpn/split/ips", post(vpn::add_ip))
        .add(
            "delete",
            "/api/v1/vpn/split/ips/{cidr}",
            delete(vpn::remove_ip),
        )
        .add("get", "/api/v1/vpn/dns/cache", get(vpn::dns_cache))
        .add("get", "/api/v1/mesh/status", get(mesh::status))
        .add("get", "/api/v1/mesh/stats", get(mesh::stats))
        .add("post", "/api/v1/mesh/enable", post(mesh::enable))
        .add("post", "/api/v1/mesh/disable", post(mesh::disable))
        .add("get", "/api/v1/mesh/peers", get(mesh::peers))
        .add(
            "get",
            "/api/v1/mesh/peers/connected",
            get(mesh::connected_peers),
        )
        .add("get", "/api/v1/mesh/peers/{id}", get(mesh::peer))
        .add("get", "/api/v1/mesh/routes", get(mesh::routes))
        .add("get", "/api/v1/mesh/network", get(mesh::network))
        .add("get", "/api/v1/openapi.json", get(openapi::openapi_json))
}

/// Endpoints open to everyone.
fn open() -> Routes<S> {
    Routes::new()
        .add("get", "/api/v1/health", get(system::health))
        .add("post", "/api/v1/login", post(system::login))
        .add("post", "/api/v1/logout", post(system::logout))
}

#[cfg(test)]
pub fn served_routes() -> Vec<(&'static str, &'static str)> {
    let mut all = protected().served;
    all.extend(open().served);
    all.extend(switchyard_diagnostics::ROUTES.iter().copied());
    all
}

async fn require_token(State(state): State<S>, req: Request, next: Next) -> Response {
    let cfg = state.config.load();
    if !crate::api::auth::carries_token(cfg.api.token.as_deref(), &state.sessions, &req) {
        return crate::api::auth::refused(&req);
    }
    crate::api::auth::with_csrf_check(cfg.api.token.as_deref(), &state.sessions, req, next).await
}

pub fn router(state: S) -> Router {
    finish(routes(state.clone()), state)
}

/// Every route of the client API, without the layers [`finish`] adds.
pub fn routes(state: S) -> Router<S> {
    // The diagnostics endpoints (logs, logs/stream, debug/memory, /debug/pprof/*) sit behind
    // the same token check.
    let protected = protected()
        .router
        .merge(switchyard_diagnostics::routes(state.diagnostics.clone()))
        .route_layer(middleware::from_fn_with_state(state, require_token));
    open().router.merge(protected)
}

/// The fallback and the layers around `routes` (the client API's, with the web UI's pages
/// when served on the web UI listener), so the guard covers every one of them.
pub fn finish(routes: Router<S>, state: S) -> Router {
    routes
        .fallback(|| async {
            ApiError::not_found(
                "NO_SUCH_ENDPOINT",
                "no such endpoint; see /api/v1/openapi.json",
            )
        })
        .layer(DefaultBodyLimit::max(crate::api::BODY_LIMIT))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            crate::api::guard::guard::<ClientState>,
        ))
        .layer(middleware::map_request(crate::api::auth::strip_token_query))
        .with_state(state)
}

/// The validation body of an invalid configuration.
pub fn invalid(problems: &[switchyard_config::Problem]) -> ConfigValidation {
    ConfigValidation {
        valid: false,
        errors: problems
            .iter()
            .map(|p| ConfigError {
                section: p.section.clone(),
                message: format!("{}: {}", p.field, p.message),
            })
            .collect(),
        warnings: Vec::new(),
        message: Some(format!(
            "{} problem(s) in the configuration",
            problems.len()
        )),
    }
}

/// Errors of client operations, each with one status.
impl IntoResponse for ClientError {
    fn into_response(self) -> Response {
        match self {
            ClientError::UnknownServer(_) => {
                ApiError::not_found("SERVER_NOT_FOUND", self.to_string()).into_response()
            }
            ClientError::NoServer => {
                ApiError::conflict("NO_SERVER", self.to_string()).into_response()
            }
            ClientError::Invalid(problems) => {
                (StatusCode::BAD_REQUEST, Json(invalid(&problems))).into_response()
            }
            ClientError::Engine(message) => (
                StatusCode::BAD_REQUEST,
                Json(ConfigValidation {
                    valid: false,
                    errors: vec![ConfigError {
                        section: "routing".into(),
                        message: message.clone(),
                    }],
                    warnings: Vec::new(),
                    message: Some(message),
                }),
            )
                .into_response(),
            ClientError::Save { .. } => ApiError::internal(self.to_string()).into_response(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn router_and_openapi_document_agree() {
        crate::api::assert_router_matches_document(
            &super::openapi::document(),
            super::served_routes(),
        );
    }
}
