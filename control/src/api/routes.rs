//! `/api/v1/routes`: list, create, delete. Changes apply to new connections at once and live in
//! the running configuration (saved to disk only by `PUT /api/v1/config`).

use super::backends::mutate_error;
use super::error::{ApiError, ApiJson};
use crate::config_store::mutate;
use crate::server::ServerState;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use std::sync::Arc;
use switchyard_api::{Route, RouteCreate, RouteCreated, RouteDeleted};
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
