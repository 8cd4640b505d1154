//! `/api/v1/routes`: list, create, delete. Changes apply to new connections at once and live in
//! the running configuration (saved to disk only by `PUT /api/v1/config`). `routes/test` asks the
//! running data plane's route table which route a host takes.

use super::backends::mutate_error;
use super::error::{ApiError, ApiJson};
use crate::config_store::mutate;
use crate::server::ServerState;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use std::sync::Arc;
use switchyard_api::{Route, RouteCreate, RouteCreated, RouteDeleted, RouteTest};
use switchyard_config::{LoadBalance, RouteConfig};

fn view(r: &RouteConfig) -> Route {
    // A single backend is listed as `backend`, several as `backends`.
    let names: Vec<String> = r.backend_names().into_iter().map(str::to_owned).collect();
    let (backend, backends) = if names.len() == 1 {
        (names.into_iter().next(), None)
    } else {
        (None, Some(names))
    };
    Route {
        name: r.name.clone(),
        domains: r.domains.clone(),
        backend,
        backends,
        enabled: r.enabled,
        priority: r.priority,
    }
}

#[utoipa::path(get, path = "/api/v1/routes", tag = "routes", responses((status = 200, body = [Route])))]
pub async fn list(State(state): State<Arc<ServerState>>) -> Json<Vec<Route>> {
    Json(state.config.load().routes.iter().map(view).collect())
}

#[utoipa::path(post, path = "/api/v1/routes", tag = "routes", request_body = RouteCreate,
    responses((status = 201, body = RouteCreated), (status = 400, body = switchyard_api::ErrorBody),
              (status = 409, body = switchyard_api::ErrorBody)))]
pub async fn create(
    State(state): State<Arc<ServerState>>,
    ApiJson(body): ApiJson<RouteCreate>,
) -> Result<(StatusCode, Json<RouteCreated>), ApiError> {
    let load_balance = match body.load_balance.as_deref() {
        None | Some("round_robin") => LoadBalance::RoundRobin,
        Some("least_conn") => LoadBalance::LeastConn,
        Some(other) => {
            return Err(ApiError::bad_request(
                "INVALID_ROUTE",
                format!("load_balance {other:?} is not round_robin or least_conn"),
            ))
        }
    };
    let route = RouteConfig {
        name: body.name,
        domains: body.domains,
        backend: body.backend,
        backends: body.backends.unwrap_or_default(),
        enabled: body.enabled,
        priority: body.priority,
        load_balance,
    };
    let created = RouteCreated {
        status: "created".into(),
        route: route.name.clone(),
        domains: route.domains.clone(),
        backend: route.backend_names().join(","),
    };
    mutate(&state, |cfg| {
        if cfg.routes.iter().any(|r| r.name == route.name) {
            return Err(ApiError::conflict(
                "ROUTE_EXISTS",
                format!("route {} already exists", route.name),
            ));
        }
        cfg.routes.push(route);
        Ok(())
    })
    .await
    .map_err(|e| mutate_error(e, "INVALID_ROUTE"))?;
    tracing::info!(route = %created.route, "route created through the API");
    Ok((StatusCode::CREATED, Json(created)))
}

#[utoipa::path(delete, path = "/api/v1/routes/{name}", tag = "routes", params(("name" = String, Path)),
    responses((status = 200, body = RouteDeleted), (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn delete(
    State(state): State<Arc<ServerState>>,
    Path(name): Path<String>,
) -> Result<Json<RouteDeleted>, ApiError> {
    mutate(&state, |cfg| {
        let Some(i) = cfg.routes.iter().position(|r| r.name == name) else {
            return Err(ApiError::not_found(
                "ROUTE_NOT_FOUND",
                format!("route {name} does not exist"),
            ));
        };
        cfg.routes.remove(i);
        Ok(())
    })
    .await
    .map_err(|e| mutate_error(e, "INVALID_ROUTE"))?;
    tracing::info!(route = %name, "route deleted through the API");
    Ok(Json(RouteDeleted {
        status: "deleted".into(),
        route: name,
    }))
}

/// `?domain=` of a route test (server and client API).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct TestQuery {
    /// Host name (a `:port` suffix is ignored).
    domain: Option<String>,
}

impl TestQuery {
    /// The domain as given, trimmed; 400 when missing or blank.
    pub fn domain(self) -> Result<String, ApiError> {
        self.domain
            .map(|d| d.trim().to_owned())
            .filter(|d| !d.is_empty())
            .ok_or_else(|| {
                ApiError::bad_request("DOMAIN_REQUIRED", "query parameter domain is required")
            })
    }
}

/// The host a route table matches for `domain`: without a `:port` suffix or IPv6 brackets.
pub fn host_of(domain: &str) -> &str {
    if let Some(rest) = domain.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(host, _)| host);
    }
    // a bare IPv6 address has no port
    if domain.matches(':').count() > 1 {
        return domain;
    }
    domain
        .rsplit_once(':')
        .filter(|(_, p)| p.parse::<u16>().is_ok())
        .map_or(domain, |(h, _)| h)
}

/// Which route the running data plane gives `domain` (its live route table, so exactly what a
/// new connection would get), or `refused` when none matches (the proxy answers 403).
#[utoipa::path(get, path = "/api/v1/routes/test", tag = "routes", params(TestQuery),
    responses((status = 200, body = RouteTest), (status = 400, body = switchyard_api::ErrorBody)))]
pub async fn test(
    State(state): State<Arc<ServerState>>,
    Query(q): Query<TestQuery>,
) -> Result<Json<RouteTest>, ApiError> {
    let domain = q.domain()?;
    let snapshot = state.snapshot.load();
    let matched = snapshot.routes.lookup(host_of(&domain));
    Ok(Json(RouteTest {
        action: if matched.is_some() {
            "routed"
        } else {
            "refused"
        }
        .into(),
        matched_route: matched.map(|r| r.name.clone()),
        backends: matched
            .into_iter()
            .flat_map(|r| &r.backends)
            .filter_map(|i| snapshot.backends.get(*i))
            .map(|b| b.name.clone())
            .collect(),
        domain,
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn host_of_drops_the_port_and_brackets() {
        for (domain, host) in [
            ("example.org", "example.org"),
            ("example.org:8443", "example.org"),
            ("[2001:db8::1]:443", "2001:db8::1"),
            ("2001:db8::1", "2001:db8::1"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("example.org:http", "example.org:http"),
        ] {
            assert_eq!(super::host_of(domain), host, "{domain}");
        }
    }
}
