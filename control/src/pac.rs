//! `GET /proxy.pac` and `/wpad.dat`: a PAC script generated from the running route table, so
//! browsers send hosts routed to non-direct backends through this proxy and everything else
//! straight out. The script uses the same pattern semantics as the data plane's router
//! (`switchyard_proto::pac`, tested against the route matcher on one table of cases).

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use switchyard_config::{BackendType, ServerConfig};
use switchyard_proto::pac::{try_generate_pac, PacRule};

use crate::server::ServerState;

pub fn rules(cfg: &ServerConfig) -> Vec<PacRule> {
    cfg.routes
        .iter()
        .filter(|r| r.enabled)
        .map(|r| PacRule {
            patterns: r.domains.clone(),
            priority: r.priority,
            direct: r.backend.iter().chain(r.backends.iter()).all(|name| {
                cfg.backends
                    .iter()
                    .find(|b| &b.name == name)
                    .is_some_and(|b| b.kind == BackendType::Direct)
            }),
        })
        .collect()
}

/// The `host:port` browsers should use: `server.pac.proxy_host` when set, else the host the
/// browser used to fetch the PAC file with the HTTP proxy's port.
fn proxy_address(cfg: &ServerConfig, headers: &HeaderMap, proxy_port: u16) -> Option<String> {
    if let Some(p) = &cfg.server.pac.proxy_host {
        return Some(
            switchyard_proto::pac::normalize_proxy(p)
                .unwrap_or_else(|_| format!("{p}:{proxy_port}")),
        );
    }
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) && !h.ends_with(':') => h,
        _ => host,
    };
    Some(format!("{host}:{proxy_port}"))
}

#[utoipa::path(get, path = "/proxy.pac", tag = "pac", security(()),
    responses((status = 200, description = "PAC script", content_type = "application/x-ns-proxy-autoconfig", body = String)))]
pub async fn serve(State(state): State<Arc<ServerState>>, headers: HeaderMap) -> Response {
    pac_response(&state, &headers)
}

#[utoipa::path(get, path = "/wpad.dat", tag = "pac", security(()),
    responses((status = 200, description = "PAC script (WPAD name)", content_type = "application/x-ns-proxy-autoconfig", body = String)))]
pub async fn serve_wpad(State(state): State<Arc<ServerState>>, headers: HeaderMap) -> Response {
    pac_response(&state, &headers)
}

fn pac_response(state: &ServerState, headers: &HeaderMap) -> Response {
    let cfg = state.config.load();
    let port = state.http_addr.map(|a| a.port()).unwrap_or(7080);
    let Some(proxy) = proxy_address(&cfg, headers, port) else {
        return (
            StatusCode::BAD_REQUEST,
            "no Host header and no server.pac.proxy_host configured\n",
        )
            .into_response();
    };
    match try_generate_pac(&rules(&cfg), &proxy) {
        Ok(script) => (
            [(header::CONTENT_TYPE, "application/x-ns-proxy-autoconfig")],
            script,
        )
            .into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn proxy_address_sources() {
        let mut cfg = ServerConfig::default();
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("gw.lan:7082"));
        assert_eq!(
            proxy_address(&cfg, &h, 7080).as_deref(),
            Some("gw.lan:7080")
        );
        h.insert(header::HOST, HeaderValue::from_static("[::1]:7082"));
        assert_eq!(proxy_address(&cfg, &h, 7080).as_deref(), Some("[::1]:7080"));
        cfg.server.pac.proxy_host = Some("proxy.lan".into());
        assert_eq!(
            proxy_address(&cfg, &h, 7080).as_deref(),
            Some("proxy.lan:7080")
        );
        cfg.server.pac.proxy_host = Some("proxy.lan:3128".into());
        assert_eq!(
            proxy_address(&cfg, &h, 7080).as_deref(),
            Some("proxy.lan:3128")
        );
    }

    #[test]
    fn rules_mark_direct_routes() {
        let cfg = ServerConfig::default();
        let r = rules(&cfg);
        assert_eq!(r.len(), 1);
        assert!(r[0].direct);
    }
}
