//! The server management API (tokio + axum). Routes are registered through [`Routes`], which
//! also records each (method, path) so a test can hold the router and the OpenAPI document to
//! the same list.

pub mod auth;
pub mod backends;
pub mod body;
pub mod cache;
pub mod config;
pub mod connections;
pub mod error;
pub mod guard;
pub mod mesh;
pub mod openapi;
pub mod providers;
pub mod requests;
pub mod routes;
pub mod system;
pub mod ws;

use crate::server::ServerState;
use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, patch, post, put, MethodRouter};
use axum::{middleware, Router};
use std::sync::Arc;

/// Largest JSON body the API reads.
pub const BODY_LIMIT: usize = 1 << 20;

type S = Arc<ServerState>;

/// A router under construction plus the (method, path) pairs it serves (the server API's, or
/// with another state type the client API's).
pub struct Routes<St = S> {
    pub(crate) router: Router<St>,
    pub served: Vec<(&'static str, &'static str)>,
}

impl<St: Clone + Send + Sync + 'static> Routes<St> {
    pub(crate) fn new() -> Self {
        Self {
            router: Router::new(),
            served: Vec::new(),
        }
    }

    pub(crate) fn add(
        mut self,
        method: &'static str,
        path: &'static str,
        handler: MethodRouter<St>,
    ) -> Self {
        self.served.push((method, path));
        self.router = self.router.route(path, handler);
        self
    }
}

/// Endpoints that need the API token (when one is configured).
fn protected() -> Routes {
    Routes::new()
        .add("get", "/api/v1/version", get(system::version))
        .add("get", "/api/v1/status", get(system::status))
        .add("get", "/api/v1/stats", get(system::stats))
        .add("get", "/api/v1/quic", get(system::quic))
        .add("get", "/api/v1/backends", get(backends::list))
        .add("post", "/api/v1/backends", post(backends::create))
        .add("get", "/api/v1/backends/{name}", get(backends::get_one))
        .add(
            "delete",
            "/api/v1/backends/{name}",
            delete(backends::delete),
        )
        .add("get", "/api/v1/backends/{name}/stats", get(backends::stats))
        .add("post", "/api/v1/backends/{name}/test", post(backends::test))
        .add("get", "/api/v1/routes", get(routes::list))
        .add("post", "/api/v1/routes", post(routes::create))
        .add("delete", "/api/v1/routes/{name}", delete(routes::delete))
        .add("get", "/api/v1/routes/test", get(routes::test))
        .add("get", "/api/v1/requests", get(requests::list))
        .add("delete", "/api/v1/requests", delete(requests::clear))
        .add("get", "/api/v1/requests/stats", get(requests::stats))
        .add("get", "/api/v1/connections", get(connections::list))
        .add(
            "get",
            "/api/v1/connections/clients",
            get(connections::clients),
        )
        .add("get", "/api/v1/config", get(config::get_sanitized))
        .add("put", "/api/v1/config", put(config::save))
        .add("get", "/api/v1/config/full", get(config::get_full))
        .add("get", "/api/v1/config/yaml", get(config::get_yaml))
        .add("put", "/api/v1/config/yaml", put(config::save_yaml))
        .add(
            "post",
            "/api/v1/config/yaml/validate",
            post(config::validate_yaml),
        )
        .add("get", "/api/v1/config/meta", get(config::meta))
        .add("post", "/api/v1/config/validate", post(config::validate))
        .add("post", "/api/v1/config/reload", post(config::reload))
        .add("get", "/api/v1/auth/plugins", get(config::auth_plugins))
        .add("get", "/api/v1/cache/stats", get(cache::stats))
        .add("get", "/api/v1/cache/entries", get(cache::entries))
        .add("delete", "/api/v1/cache/entries", delete(cache::clear))
        .add("get", "/api/v1/cache/entries/{key}", get(cache::entry))
        .add(
            "delete",
            "/api/v1/cache/entries/{key}",
            delete(cache::delete_entry),
        )
        .add(
            "delete",
            "/api/v1/cache/domain/{domain}",
            delete(cache::delete_domain),
        )
        .add("get", "/api/v1/cache/rules", get(cache::rules))
        .add("post", "/api/v1/cache/rules", post(cache::create_rule))
        .add("put", "/api/v1/cache/rules/{name}", put(cache::update_rule))
        .add(
            "delete",
            "/api/v1/cache/rules/{name}",
            delete(cache::delete_rule),
        )
        .add("get", "/api/v1/cache/presets", get(cache::presets_list))
        .add(
            "post",
            "/api/v1/cache/presets/{name}",
            post(cache::toggle_preset),
        )
        .add(
            "post",
            "/api/v1/cache/presets/{name}/enable",
            post(cache::enable_preset),
        )
        .add(
            "post",
            "/api/v1/cache/presets/{name}/disable",
            post(cache::disable_preset),
        )
        .add(
            "post",
            "/api/v1/providers/refresh",
            post(providers::refresh_all),
        )
        .add(
            "post",
            "/api/v1/providers/{provider}/refresh",
            post(providers::refresh_one),
        )
        .add("get", "/api/v1/mesh/networks", get(mesh::list_networks))
        .add("post", "/api/v1/mesh/networks", post(mesh::create_network))
        .add(
            "get",
            "/api/v1/mesh/networks/{networkID}",
            get(mesh::get_network),
        )
        .add(
            "delete",
            "/api/v1/mesh/networks/{networkID}",
            delete(mesh::delete_network),
        )
        .add(
            "get",
            "/api/v1/mesh/networks/{networkID}/peers",
            get(mesh::list_peers),
        )
        .add(
            "post",
            "/api/v1/mesh/networks/{networkID}/peers",
            post(mesh::register),
        )
        .add(
            "get",
            "/api/v1/mesh/networks/{networkID}/peers/{peerID}",
            get(mesh::get_peer),
        )
        .add(
            "patch",
            "/api/v1/mesh/networks/{networkID}/peers/{peerID}",
            patch(mesh::update_peer),
        )
        .add(
            "delete",
            "/api/v1/mesh/networks/{networkID}/peers/{peerID}",
            delete(mesh::delete_peer),
        )
        .add(
            "post",
            "/api/v1/mesh/networks/{networkID}/peers/{peerID}/heartbeat",
            post(mesh::heartbeat),
        )
        .add(
            "get",
            "/api/v1/mesh/networks/{networkID}/events",
            get(mesh::events),
        )
        .add(
            "post",
            "/api/v1/mesh/networks/{networkID}/enrollment-keys",
            post(mesh::create_enrollment_key),
        )
        .add(
            "get",
            "/api/v1/mesh/networks/{networkID}/enrollment-keys",
            get(mesh::list_enrollment_keys),
        )
        .add(
            "delete",
            "/api/v1/mesh/networks/{networkID}/enrollment-keys/{keyID}",
            delete(mesh::revoke_enrollment_key),
        )
        .add("get", "/api/v1/openapi.json", get(openapi::openapi_json))
        .add("get", "/api/v1/ws", get(ws::upgrade))
}

/// Endpoints open to everyone.
fn open() -> Routes {
    Routes::new()
        .add("get", "/api/v1/health", get(system::health))
        .add("get", "/proxy.pac", get(crate::pac::serve))
        .add("get", "/wpad.dat", get(crate::pac::serve_wpad))
        .add("post", "/api/v1/login", post(auth::login))
        .add("post", "/api/v1/logout", post(auth::logout))
}

/// Every (method, path) the router serves.
#[cfg(test)]
pub fn served_routes() -> Vec<(&'static str, &'static str)> {
    let mut all = protected().served;
    all.extend(open().served);
    all
}

pub fn router(state: S) -> Router {
    let protected = protected()
        .router
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ));
    open()
        .router
        .merge(protected)
        // The dashboard's static files: open (the page signs in through /api/v1/login).
        .merge(crate::web_ui::dashboard::DASHBOARD.router())
        .fallback(|| async {
            error::ApiError::not_found(
                "NO_SUCH_ENDPOINT",
                "no such endpoint; see /api/v1/openapi.json",
            )
        })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        // Every route, the dashboard and the PAC files included: Host, Origin, body type.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            guard::guard::<ServerState>,
        ))
        // Outermost: a `?token=` leaves the URL before anything else sees (or logs) it.
        .layer(middleware::map_request(auth::strip_token_query))
        .with_state(state)
}

/// Asserts that `doc` documents exactly the (method, path) pairs of `served`.
#[cfg(test)]
pub(crate) fn assert_router_matches_document(
    doc: &utoipa::openapi::OpenApi,
    served: Vec<(&'static str, &'static str)>,
) {
    use std::collections::BTreeSet;
    let mut documented = BTreeSet::new();
    for (path, item) in &doc.paths.paths {
        let methods = [
            ("get", item.get.is_some()),
            ("post", item.post.is_some()),
            ("put", item.put.is_some()),
            ("delete", item.delete.is_some()),
            ("patch", item.patch.is_some()),
        ];
        for (m, present) in methods {
            if present {
                documented.insert((m.to_owned(), path.clone()));
            }
        }
    }
    let served: BTreeSet<(String, String)> = served
        .into_iter()
        .map(|(m, p)| (m.to_owned(), p.to_owned()))
        .collect();
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let unserved: Vec<_> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty(),
        "served but not documented: {undocumented:?}"
    );
    assert!(
        unserved.is_empty(),
        "documented but not served: {unserved:?}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use utoipa::OpenApi;

    #[test]
    fn router_and_openapi_document_agree() {
        assert_router_matches_document(&openapi::ServerApiDoc::openapi(), served_routes());
    }
}
