//! `/api/v1/providers/*`: refetch provider server lists now, and the provider part of the
//! backend views.

use super::error::ApiError;
use crate::providers::{ListStatus, Providers};
use crate::server::ServerState;
use axum::extract::{Path, State};
use axum::Json;
use std::sync::Arc;
use switchyard_api::{Backend, ProviderListStatus, ProviderRefreshResult, ProviderResolution};
use switchyard_config::provider::{ProviderKind, VpnProtocol};

fn answer(lists: Vec<ListStatus>) -> ProviderRefreshResult {
    let failed = lists.iter().any(|l| l.error.is_some());
    ProviderRefreshResult {
        status: if failed { "failed" } else { "refreshed" }.into(),
        lists: lists
            .into_iter()
            .map(|l| ProviderListStatus {
                provider: l.provider.name().into(),
                servers: l.servers,
                fetched_at: l.fetched_at,
                error: l.error,
            })
            .collect(),
        time: chrono::Utc::now(),
    }
}

async fn refresh(state: &ServerState, only: Option<ProviderKind>) -> ProviderRefreshResult {
    let cfg = state.config.load_full();
    let (changed, lists) = state.providers.refresh(&cfg, only).await;
    if changed {
        crate::providers::republish(state).await;
    }
    tracing::info!(provider = ?only.map(ProviderKind::name), lists = lists.len(), "provider server lists refreshed (API)");
    answer(lists)
}

#[utoipa::path(post, path = "/api/v1/providers/refresh", tag = "backends",
    responses((status = 200, description = "every provider list the configuration uses was fetched again; provider backends re-resolved", body = ProviderRefreshResult)))]
pub async fn refresh_all(State(state): State<Arc<ServerState>>) -> Json<ProviderRefreshResult> {
    Json(refresh(&state, None).await)
}

#[utoipa::path(post, path = "/api/v1/providers/{provider}/refresh", tag = "backends",
    params(("provider" = String, Path, description = "nordvpn, mullvad, privateinternetaccess (pia) or protonvpn")),
    responses((status = 200, body = ProviderRefreshResult),
              (status = 404, description = "unknown provider, or no backend uses it", body = switchyard_api::ErrorBody)))]
pub async fn refresh_one(
    State(state): State<Arc<ServerState>>,
    Path(provider): Path<String>,
) -> Result<Json<ProviderRefreshResult>, ApiError> {
    let kind = ProviderKind::from_name(&provider).ok_or_else(|| {
        ApiError::not_found(
            "PROVIDER_NOT_FOUND",
            format!("unknown provider {provider:?}; use nordvpn, mullvad, privateinternetaccess (pia) or protonvpn"),
        )
    })?;
    if !Providers::in_use(&state.config.load(), kind) {
        return Err(ApiError::not_found(
            "PROVIDER_NOT_CONFIGURED",
            format!("no backend uses provider {kind}"),
        ));
    }
    Ok(Json(refresh(&state, Some(kind)).await))
}

/// Fills the provider part of a backend view: the provider's name as `type`, the resolution,
/// and the reason it is not resolved.
pub fn describe(state: &ServerState, view: &mut Backend) {
    let cfg = state.config.load();
    let Some(p) = state.providers.view(&cfg, &view.name) else {
        return;
    };
    view.kind = p.provider.name().into();
    view.error = p.error;
    let r = p.resolved.as_ref();
    let endpoint = r.and_then(|r| match r.protocol {
        VpnProtocol::Wireguard => r.settings["endpoint"].as_str().map(str::to_owned),
        VpnProtocol::Openvpn => Some(format!(
            "{}:{}",
            r.settings["remote"].as_str().unwrap_or_default(),
            r.settings["port"]
        )),
    });
    view.provider = Some(ProviderResolution {
        provider: p.provider.name().into(),
        protocol: r.map(|r| r.protocol.name().into()),
        server_id: r.map(|r| r.server.id.clone()),
        hostname: r.map(|r| r.server.hostname.clone()),
        country: r.map(|r| r.server.country.clone()),
        city: r.map(|r| r.server.city.clone()).filter(|c| !c.is_empty()),
        load: r.and_then(|r| r.server.load),
        endpoint,
        resolved_at: r.map(|r| r.resolved_at),
        list_fetched_at: p.list_fetched_at,
        forwarded_port: r.and_then(|r| r.forward.as_ref().map(|(f, _)| f.port)),
        settings: r.map(|r| {
            let mut s = r.settings.clone();
            switchyard_config::secrets::mask_settings(&mut s);
            s
        }),
    });
    if r.is_none() {
        view.healthy = false;
    }
}
