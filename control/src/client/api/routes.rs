//! Client routes: list, create, delete (each saved to the configuration and published to the
//! data plane) and `routes/test`, which answers with the same compiled matcher the engine uses.

use super::S;
use crate::api::error::{ApiError, ApiJson};
use crate::api::routes::{host_of, TestQuery};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use switchyard_api::client::{
    ClientRoute, ClientRouteCreate, ClientRouteCreated, ClientRouteRemoved, RouteTestResult,
};
use switchyard_config::client::{ClientConfig, ClientRouteConfig, RouteAction};
use switchyard_proto::route_matcher::{RouteEntry, RouteTable};

fn view(r: &ClientRouteConfig) -> ClientRoute {
    ClientRoute {
        name: r.name.clone(),
        patterns: r.patterns.clone(),
        action: r.action.as_str().to_owned(),
        priority: r.priority,
    }
}

#[utoipa::path(get, path = "/api/v1/routes", tag = "routes", responses((status = 200, body = [ClientRoute])))]
pub async fn list(State(state): State<S>) -> Json<Vec<ClientRoute>> {
    Json(
        state
            .config
            .load()
            .routing
            .routes
            .iter()
            .map(view)
            .collect(),
    )
}

#[utoipa::path(post, path = "/api/v1/routes", tag = "routes", request_body = ClientRouteCreate,
    responses((status = 201, body = ClientRouteCreated),
              (status = 400, description = "bad pattern, action or name", body = switchyard_api::ErrorBody),
              (status = 409, description = "a route of this name exists", body = switchyard_api::ErrorBody)))]
pub async fn create(
    State(state): State<S>,
    ApiJson(body): ApiJson<ClientRouteCreate>,
) -> Result<Response, ApiError> {
    let action = RouteAction::parse(&body.action).ok_or_else(|| {
        ApiError::bad_request(
            "INVALID_ACTION",
            format!("action {:?}: use direct or server", body.action),
        )
    })?;
    if body.name.trim().is_empty() {
        return Err(ApiError::bad_request(
            "INVALID_NAME",
            "a route needs a name",
        ));
    }
    if body.domains.is_empty() {
        return Err(ApiError::bad_request(
            "INVALID_PATTERN",
            "at least one domain pattern is required (`*` matches all)",
        ));
    }
    for d in &body.domains {
        switchyard_config::validate::check_domain_pattern(d)
            .map_err(|e| ApiError::bad_request("INVALID_PATTERN", e))?;
    }
    let _guard = state.config_write.lock().await;
    let mut cfg: ClientConfig = (*state.config.load_full()).clone();
    if cfg.routing.routes.iter().any(|r| r.name == body.name) {
        return Err(ApiError::conflict(
            "ROUTE_EXISTS",
            format!("route {} exists", body.name),
        ));
    }
    cfg.routing.routes.push(ClientRouteConfig {
        name: body.name.clone(),
        patterns: body.domains.clone(),
        action,
        priority: body.priority,
    });
    if let Err(e) = state.apply_config(cfg, true) {
        return Ok(e.into_response());
    }
    tracing::info!(route = %body.name, action = action.as_str(), "route created");
    Ok((
        axum::http::StatusCode::CREATED,
        Json(ClientRouteCreated {
            status: "created".into(),
            route: body.name,
            domains: body.domains,
            action: action.as_str().to_owned(),
        }),
    )
        .into_response())
}

#[utoipa::path(delete, path = "/api/v1/routes/{name}", tag = "routes", params(("name" = String, Path)),
    responses((status = 200, body = ClientRouteRemoved), (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn remove(
    State(state): State<S>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let _guard = state.config_write.lock().await;
    let mut cfg: ClientConfig = (*state.config.load_full()).clone();
    let before = cfg.routing.routes.len();
    cfg.routing.routes.retain(|r| r.name != name);
    if cfg.routing.routes.len() == before {
        return Err(ApiError::not_found(
            "ROUTE_NOT_FOUND",
            format!("no route named {name}"),
        ));
    }
    if let Err(e) = state.apply_config(cfg, true) {
        return Ok(e.into_response());
    }
    tracing::info!(route = %name, "route removed");
    Ok(Json(ClientRouteRemoved {
        status: "removed".into(),
        route: name,
    })
    .into_response())
}

/// The action for `domain` under the configured routes (whether or not connected).
pub fn decide(cfg: &ClientConfig, domain: &str) -> RouteTestResult {
    let entries = cfg
        .routing
        .routes
        .iter()
        .map(|r| RouteEntry {
            patterns: r.patterns.clone(),
            priority: r.priority,
            value: (r.name.clone(), r.action),
        })
        .collect();
    // Routes in a running configuration are valid; a bad pattern would never match anyway.
    let (table, _) = RouteTable::build_lenient(entries);
    match table.lookup(host_of(domain)) {
        Some((name, action)) => RouteTestResult {
            domain: domain.to_owned(),
            action: action.as_str().to_owned(),
            matched_route: Some(name.clone()),
        },
        None => RouteTestResult {
            domain: domain.to_owned(),
            action: cfg.routing.default_action.as_str().to_owned(),
            matched_route: None,
        },
    }
}

#[utoipa::path(get, path = "/api/v1/routes/test", tag = "routes", params(TestQuery),
    responses((status = 200, body = RouteTestResult), (status = 400, body = switchyard_api::ErrorBody)))]
pub async fn test(
    State(state): State<S>,
    Query(q): Query<TestQuery>,
) -> Result<Json<RouteTestResult>, ApiError> {
    Ok(Json(decide(&state.config.load(), &q.domain()?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decide_follows_priority_and_default() {
        let mut cfg = ClientConfig::default();
        cfg.routing.routes = vec![
            ClientRouteConfig {
                name: "corp".into(),
                patterns: vec!["*.corp.example".into()],
                action: RouteAction::Server,
                priority: 0,
            },
            ClientRouteConfig {
                name: "wiki".into(),
                patterns: vec!["wiki.corp.example".into()],
                action: RouteAction::Direct,
                priority: 10,
            },
        ];
        cfg.routing.default_action = RouteAction::Direct;
        let r = decide(&cfg, "wiki.corp.example:443");
        assert_eq!(
            (r.action.as_str(), r.matched_route.as_deref()),
            ("direct", Some("wiki"))
        );
        let r = decide(&cfg, "git.corp.example");
        assert_eq!(
            (r.action.as_str(), r.matched_route.as_deref()),
            ("server", Some("corp"))
        );
        let r = decide(&cfg, "example.org");
        assert_eq!((r.action.as_str(), r.matched_route), ("direct", None));
    }
}
