//! VPN endpoints over [`crate::client::vpn::VpnManager`]: status (measured bytes, the classifier
//! in use), enable/disable, the TUN path's live flows, and the split-tunnel rules — which are
//! configuration (`vpn.split.*`, saved to the configuration file) and, while the VPN is on, are
//! applied to the running split tunnel at once.

use super::S;
use crate::api::error::{ApiError, ApiJson};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use switchyard_api::client::{
    DnsCacheView, SplitAppEntry, SplitDomainBody, SplitIpBody, SplitModeBody, SplitModeUpdated,
    SplitRules, StatusReply, VpnConnection, VpnStatus,
};
use switchyard_config::client::{ClientConfig, SplitApp, SplitMode, VpnSplitConfig};

#[utoipa::path(get, path = "/api/v1/vpn/status", tag = "vpn", responses((status = 200, body = VpnStatus)))]
pub async fn status(State(state): State<S>) -> Json<VpnStatus> {
    Json(state.vpn.status(&state.config.load()))
}

#[utoipa::path(post, path = "/api/v1/vpn/enable", tag = "vpn",
    responses((status = 200, body = StatusReply),
        (status = 500, description = "a step failed; the VPN is in `error` and nothing it created is left", body = switchyard_api::ErrorBody)))]
pub async fn enable(State(state): State<S>) -> Response {
    let cfg = state.config.load_full();
    let server = state.server_in_use();
    match state.vpn.enable(&cfg, server.as_ref()).await {
        Ok(()) => Json(StatusReply::new("enabled")).into_response(),
        Err(reason) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "VPN_ENABLE_FAILED",
            reason,
        )
        .into_response(),
    }
}

#[utoipa::path(post, path = "/api/v1/vpn/disable", tag = "vpn",
    responses((status = 200, body = StatusReply), (status = 500, body = switchyard_api::ErrorBody)))]
pub async fn disable(State(state): State<S>) -> Response {
    match state.vpn.disable().await {
        Ok(()) => Json(StatusReply::new("disabled")).into_response(),
        Err(reason) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "VPN_DISABLE_INCOMPLETE",
            format!("{reason} (the next start undoes the rest)"),
        )
        .into_response(),
    }
}

#[utoipa::path(get, path = "/api/v1/vpn/connections", tag = "vpn", responses((status = 200, body = [VpnConnection])))]
pub async fn connections(State(state): State<S>) -> Json<Vec<VpnConnection>> {
    Json(state.vpn.connections())
}

fn rules_view(s: &VpnSplitConfig) -> SplitRules {
    SplitRules {
        mode: s.mode.as_str().into(),
        apps: s
            .apps
            .iter()
            .map(|a| SplitAppEntry {
                name: a.name.clone(),
                path: a.path.clone().unwrap_or_default(),
                cgroup: a.cgroup.clone().unwrap_or_default(),
            })
            .collect(),
        domains: s.domains.clone(),
        ips: s.ips.clone(),
        always_bypass: s.always_bypass.clone(),
        allow_lan: s.allow_lan,
    }
}

#[utoipa::path(get, path = "/api/v1/vpn/split/rules", tag = "vpn", responses((status = 200, body = SplitRules)))]
pub async fn split_rules(State(state): State<S>) -> Json<SplitRules> {
    Json(rules_view(&state.config.load().vpn.split))
}

/// Applies `change` to `vpn.split`, to the running split tunnel (live) and saves; the change's
/// error answers as is. A rule the split tunnel refuses is neither applied nor saved.
async fn edit_split(
    state: &S,
    change: impl FnOnce(&mut VpnSplitConfig) -> Result<(), ApiError>,
) -> Result<(), Response> {
    let _guard = state.config_write.lock().await;
    let mut cfg: ClientConfig = (*state.config.load_full()).clone();
    change(&mut cfg.vpn.split).map_err(IntoResponse::into_response)?;
    if let Err(e) = state.vpn.apply_split(&cfg.vpn.split).await {
        let old = state.config.load_full();
        // put the previous rules back so the split tunnel matches the saved configuration
        if let Err(back) = state.vpn.apply_split(&old.vpn.split).await {
            tracing::warn!(error = %back, "putting the previous split rules back failed: the running split tunnel may differ from the saved rules until the VPN is enabled again");
        }
        return Err(ApiError::bad_request("SPLIT_RULE_REFUSED", e).into_response());
    }
    state
        .apply_config(cfg, true)
        .map(|_| ())
        .map_err(IntoResponse::into_response)
}

#[utoipa::path(put, path = "/api/v1/vpn/split/mode", tag = "vpn", request_body = SplitModeBody,
    responses((status = 200, body = SplitModeUpdated), (status = 400, body = switchyard_api::ErrorBody)))]
pub async fn split_mode(State(state): State<S>, ApiJson(body): ApiJson<SplitModeBody>) -> Response {
    let mode = match body.mode.trim().to_ascii_lowercase().as_str() {
        "exclude" => SplitMode::Exclude,
        "include" => SplitMode::Include,
        other => {
            return ApiError::bad_request(
                "INVALID_MODE",
                format!("mode {other:?}: use exclude or include"),
            )
            .into_response()
        }
    };
    match edit_split(&state, |s| {
        s.mode = mode;
        Ok(())
    })
    .await
    {
        Ok(()) => Json(SplitModeUpdated {
            status: "updated".into(),
            mode: mode.as_str().into(),
        })
        .into_response(),
        Err(r) => r,
    }
}

fn added(result: Result<(), Response>, status: &str) -> Response {
    match result {
        Ok(()) => Json(StatusReply::new(status)).into_response(),
        Err(r) => r,
    }
}

#[utoipa::path(post, path = "/api/v1/vpn/split/apps", tag = "vpn", request_body = SplitAppEntry,
    responses((status = 200, body = StatusReply), (status = 400, body = switchyard_api::ErrorBody), (status = 409, body = switchyard_api::ErrorBody)))]
pub async fn add_app(State(state): State<S>, ApiJson(body): ApiJson<SplitAppEntry>) -> Response {
    let r = edit_split(&state, |s| {
        if body.name.trim().is_empty() {
            return Err(ApiError::bad_request("INVALID_APP", "an app needs a name"));
        }
        if s.apps.iter().any(|a| a.name == body.name) {
            return Err(ApiError::conflict(
                "APP_EXISTS",
                format!("app {} is listed", body.name),
            ));
        }
        s.apps.push(SplitApp {
            name: body.name.clone(),
            path: (!body.path.is_empty()).then(|| body.path.clone()),
            bundle_id: None,
            cgroup: (!body.cgroup.is_empty()).then(|| body.cgroup.clone()),
        });
        Ok(())
    })
    .await;
    added(r, "added")
}

/// Removes `key` from one split list (404 when absent).
async fn remove_from(
    state: &S,
    what: &'static str,
    key: String,
    pick: fn(&mut VpnSplitConfig, &str) -> bool,
) -> Response {
    let r = edit_split(state, |s| {
        if pick(s, &key) {
            Ok(())
        } else {
            Err(ApiError::not_found("NOT_FOUND", format!("no {what} {key}")))
        }
    })
    .await;
    added(r, "removed")
}

fn remove_matching(list: &mut Vec<String>, key: &str) -> bool {
    let before = list.len();
    list.retain(|x| x != key);
    list.len() != before
}

#[utoipa::path(delete, path = "/api/v1/vpn/split/apps/{name}", tag = "vpn", params(("name" = String, Path)),
    responses((status = 200, body = StatusReply), (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn remove_app(State(state): State<S>, Path(name): Path<String>) -> Response {
    remove_from(&state, "app", name, |s, k| {
        let before = s.apps.len();
        s.apps.retain(|a| a.name != k);
        s.apps.len() != before
    })
    .await
}

#[utoipa::path(post, path = "/api/v1/vpn/split/domains", tag = "vpn", request_body = SplitDomainBody,
    responses((status = 200, body = StatusReply), (status = 400, body = switchyard_api::ErrorBody)))]
pub async fn add_domain(
    State(state): State<S>,
    ApiJson(body): ApiJson<SplitDomainBody>,
) -> Response {
    let r = edit_split(&state, |s| {
        switchyard_config::validate::check_domain_pattern(&body.pattern)
            .map_err(|e| ApiError::bad_request("INVALID_PATTERN", e))?;
        if !s.domains.contains(&body.pattern) {
            s.domains.push(body.pattern.clone());
        }
        Ok(())
    })
    .await;
    added(r, "added")
}

#[utoipa::path(delete, path = "/api/v1/vpn/split/domains/{pattern}", tag = "vpn", params(("pattern" = String, Path)),
    responses((status = 200, body = StatusReply), (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn remove_domain(State(state): State<S>, Path(pattern): Path<String>) -> Response {
    remove_from(&state, "domain", pattern, |s, k| {
        remove_matching(&mut s.domains, k)
    })
    .await
}

/// A single IP or a CIDR (IPv4 or IPv6).
fn check_cidr(s: &str) -> Result<(), String> {
    let (ip, prefix) = match s.split_once('/') {
        Some((ip, p)) => (ip, Some(p)),
        None => (s, None),
    };
    let ip: std::net::IpAddr = ip
        .parse()
        .map_err(|_| format!("{s:?} is not an IP address or CIDR"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    match prefix.map(str::parse::<u8>) {
        None => Ok(()),
        Some(Ok(p)) if p <= max => Ok(()),
        _ => Err(format!("{s:?}: prefix length must be 0–{max}")),
    }
}

#[utoipa::path(post, path = "/api/v1/vpn/split/ips", tag = "vpn", request_body = SplitIpBody,
    responses((status = 200, body = StatusReply), (status = 400, body = switchyard_api::ErrorBody)))]
pub async fn add_ip(State(state): State<S>, ApiJson(body): ApiJson<SplitIpBody>) -> Response {
    let r = edit_split(&state, |s| {
        check_cidr(&body.cidr).map_err(|e| ApiError::bad_request("INVALID_CIDR", e))?;
        if !s.ips.contains(&body.cidr) {
            s.ips.push(body.cidr.clone());
        }
        Ok(())
    })
    .await;
    added(r, "added")
}

#[utoipa::path(delete, path = "/api/v1/vpn/split/ips/{cidr}", tag = "vpn", params(("cidr" = String, Path)),
    responses((status = 200, body = StatusReply), (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn remove_ip(State(state): State<S>, Path(cidr): Path<String>) -> Response {
    remove_from(&state, "ip", cidr, |s, k| remove_matching(&mut s.ips, k)).await
}

#[utoipa::path(get, path = "/api/v1/vpn/dns/cache", tag = "vpn", responses((status = 200, body = DnsCacheView)))]
pub async fn dns_cache(State(state): State<S>) -> Json<DnsCacheView> {
    Json(state.vpn.dns_cache().await)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cidrs() {
        for ok in ["10.0.0.1", "10.0.0.0/8", "fd00::/8", "::1"] {
            assert!(super::check_cidr(ok).is_ok(), "{ok}");
        }
        for bad in ["10.0.0.0/33", "x", "10.0.0/8", "fd00::/129", ""] {
            assert!(super::check_cidr(bad).is_err(), "{bad}");
        }
    }
}
