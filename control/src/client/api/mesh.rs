//! Mesh endpoints: the running peer's state ([`crate::client::mesh`]) with the data plane's
//! measurements. Enable and disable act at once (`mesh.enabled` in the configuration decides
//! only what happens at start).

use super::S;
use crate::api::error::ApiError;
use crate::client::mesh::{view, Live, MeshError, Phase};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use std::sync::atomic::Ordering::Relaxed;
use switchyard_api::client::{
    MeshDrops, MeshNetworkInfo, MeshPeerView, MeshRouteView, MeshStats, MeshStatus,
    MeshTrafficModes, StatusReply,
};

fn uptime(live: &Live) -> String {
    let secs = live.started.elapsed().as_secs();
    switchyard_config::Duration(std::time::Duration::from_secs(secs)).to_string()
}

/// (peer count, connected peers, of which direct, of which through a TURN relay): a peer
/// without a session of its own that is reached through others counts as connected only.
fn peer_counts(live: &Live) -> (u64, u64, u64, u64) {
    let info = live.info.lock();
    let r = view::reach(&info.peers, &info.counters, &live.shared.routes.load());
    (r.peers, r.connected(), r.direct, r.relayed)
}

#[utoipa::path(get, path = "/api/v1/mesh/status", tag = "mesh", responses((status = 200, body = MeshStatus)))]
pub async fn status(State(state): State<S>) -> Json<MeshStatus> {
    let cfg = state.config.load();
    let Some(live) = state.mesh.live() else {
        return Json(MeshStatus {
            status: "disabled".into(),
            enabled: false,
            peer_id: String::new(),
            virtual_ip: String::new(),
            network_id: cfg.mesh.network_id.clone(),
            network_cidr: cfg.mesh.network_cidr.clone(),
            peer_name: cfg.mesh.peer_name.clone(),
            peer_count: 0,
            connected_peers: 0,
            direct_connections: 0,
            relayed_connections: 0,
            bytes_sent: 0,
            bytes_received: 0,
            packets_sent: 0,
            packets_received: 0,
            uptime: "0s".into(),
            error: None,
        });
    };
    let (peer_count, connected, direct, relayed) = peer_counts(&live);
    let t = &live.shared.totals;
    let info = live.info.lock();
    // measured: a data plane that stopped turning is an error whatever the last step said
    let status = if info.phase == Phase::Connected
        && !live
            .shared
            .owner_alive(crate::client::mesh::peer::OWNER_LOST)
    {
        "error"
    } else {
        info.phase.as_str()
    };
    Json(MeshStatus {
        status: status.into(),
        enabled: true,
        peer_id: live.peer_id.clone(),
        virtual_ip: info.virtual_ip.map(|v| v.to_string()).unwrap_or_default(),
        network_id: live.network_id.clone(),
        network_cidr: info.network_cidr.clone(),
        peer_name: live.peer_name.clone(),
        peer_count,
        connected_peers: connected,
        direct_connections: direct,
        relayed_connections: relayed,
        bytes_sent: t.bytes_sent.load(Relaxed),
        bytes_received: t.bytes_received.load(Relaxed),
        packets_sent: t.packets_sent.load(Relaxed),
        packets_received: t.packets_received.load(Relaxed),
        uptime: uptime(&live),
        error: info.error.clone().filter(|_| status == "error"),
    })
}

#[utoipa::path(get, path = "/api/v1/mesh/stats", tag = "mesh", responses((status = 200, body = MeshStats)))]
pub async fn stats(State(state): State<S>) -> Json<MeshStats> {
    let Some(live) = state.mesh.live() else {
        return Json(MeshStats {
            enabled: false,
            peer_count: 0,
            connected_peers: 0,
            bytes_sent: 0,
            bytes_received: 0,
            packets_sent: 0,
            packets_received: 0,
            traffic_modes: MeshTrafficModes::default(),
            relayed_datagrams: 0,
            drops: MeshDrops::default(),
        });
    };
    let (peer_count, connected_peers, ..) = peer_counts(&live);
    let t = &live.shared.totals;
    let m = &t.modes;
    Json(MeshStats {
        enabled: true,
        peer_count,
        connected_peers,
        bytes_sent: t.bytes_sent.load(Relaxed),
        bytes_received: t.bytes_received.load(Relaxed),
        packets_sent: t.packets_sent.load(Relaxed),
        packets_received: t.packets_received.load(Relaxed),
        traffic_modes: MeshTrafficModes {
            broadcast_packets_sent: m.broadcast_sent.load(Relaxed),
            broadcast_packets_received: m.broadcast_received.load(Relaxed),
            multicast_packets_sent: m.multicast_sent.load(Relaxed),
            multicast_packets_received: m.multicast_received.load(Relaxed),
            anycast_packets_sent: m.anycast_sent.load(Relaxed),
            anycast_packets_received: m.anycast_received.load(Relaxed),
            multicast_groups: m.multicast_groups.load(Relaxed),
            anycast_addresses: m.anycast_addresses.load(Relaxed),
        },
        relayed_datagrams: t.relayed.load(Relaxed),
        drops: MeshDrops {
            invalid: t.invalid.load(Relaxed),
            unknown_key: t.unknown_key.load(Relaxed),
            handshakes_refused: t.handshakes_refused.load(Relaxed),
            handshake_cookies: t.handshake_cookies.load(Relaxed),
            no_route: t.no_route.load(Relaxed),
            relay_refused: t.relay_refused.load(Relaxed),
            too_big_for_relay: t.too_big_for_relay.load(Relaxed),
            overflow: t.overflow.load(Relaxed),
            control_dropped: t.control_dropped.load(Relaxed),
            route_claims_refused: t.route_claims_refused.load(Relaxed),
            mac_claims_refused: t.mac_claims_refused.load(Relaxed),
            ice_dropped: t.ice_dropped.load(Relaxed),
        },
    })
}

#[utoipa::path(post, path = "/api/v1/mesh/enable", tag = "mesh",
    responses((status = 200, body = StatusReply),
        (status = 400, description = "the configuration cannot run a mesh peer", body = switchyard_api::ErrorBody),
        (status = 500, description = "key file, UDP port or the registry's TLS set-up", body = switchyard_api::ErrorBody)))]
pub async fn enable(State(state): State<S>) -> Result<Json<StatusReply>, ApiError> {
    let cfg = state.config.load_full();
    state.mesh.enable(&cfg.mesh).await.map_err(|e| {
        let status = match e {
            MeshError::Missing { .. }
            | MeshError::Mac(_)
            | MeshError::PresharedKey(_)
            | MeshError::InsecureRegistry(_)
            | MeshError::RegistryPin(_) => StatusCode::BAD_REQUEST,
            MeshError::Identity(_) | MeshError::Bind { .. } | MeshError::Registry(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        ApiError::new(status, "MESH_NOT_STARTED", e.to_string())
    })?;
    Ok(Json(StatusReply::new("enabled")))
}

#[utoipa::path(post, path = "/api/v1/mesh/disable", tag = "mesh", responses((status = 200, body = StatusReply)))]
pub async fn disable(State(state): State<S>) -> Json<StatusReply> {
    state.mesh.disable().await;
    Json(StatusReply::new("disabled"))
}

fn all_peers(state: &S) -> Vec<MeshPeerView> {
    let Some(live) = state.mesh.live() else {
        return Vec::new();
    };
    let info = live.info.lock();
    let routes = live.shared.routes.load();
    info.peers
        .iter()
        .map(|p| {
            view::peer_view(
                p,
                info.counters.get(&p.id).map(|(_, c)| c.as_ref()),
                view::multi_hop_route(&routes, &p.id),
            )
        })
        .collect()
}

#[utoipa::path(get, path = "/api/v1/mesh/peers", tag = "mesh", responses((status = 200, body = [MeshPeerView])))]
pub async fn peers(State(state): State<S>) -> Json<Vec<MeshPeerView>> {
    Json(all_peers(&state))
}

#[utoipa::path(get, path = "/api/v1/mesh/peers/connected", tag = "mesh", responses((status = 200, body = [MeshPeerView])))]
pub async fn connected_peers(State(state): State<S>) -> Json<Vec<MeshPeerView>> {
    let mut list = all_peers(&state);
    list.retain(|p| p.status == "connected");
    Json(list)
}

#[utoipa::path(get, path = "/api/v1/mesh/peers/{id}", tag = "mesh", params(("id" = String, Path)),
    responses((status = 200, body = MeshPeerView), (status = 404, body = switchyard_api::ErrorBody)))]
pub async fn peer(
    State(state): State<S>,
    Path(id): Path<String>,
) -> Result<Json<MeshPeerView>, ApiError> {
    all_peers(&state)
        .into_iter()
        .find(|p| p.id == id)
        .map(Json)
        .ok_or_else(|| ApiError::not_found("PEER_NOT_FOUND", format!("no mesh peer {id}")))
}

#[utoipa::path(get, path = "/api/v1/mesh/routes", tag = "mesh", responses((status = 200, body = [MeshRouteView])))]
pub async fn routes(State(state): State<S>) -> Json<Vec<MeshRouteView>> {
    let Some(live) = state.mesh.live() else {
        return Json(Vec::new());
    };
    Json(
        live.shared
            .routes
            .load()
            .iter()
            .map(view::route_view)
            .collect(),
    )
}

#[utoipa::path(get, path = "/api/v1/mesh/network", tag = "mesh", responses((status = 200, body = MeshNetworkInfo)))]
pub async fn network(State(state): State<S>) -> Json<MeshNetworkInfo> {
    let cfg = state.config.load();
    let Some(live) = state.mesh.live() else {
        return Json(MeshNetworkInfo {
            network_id: cfg.mesh.network_id.clone(),
            network_cidr: cfg.mesh.network_cidr.clone(),
            peer_name: cfg.mesh.peer_name.clone(),
            local_peer_id: String::new(),
            virtual_ip: String::new(),
        });
    };
    let info = live.info.lock();
    Json(MeshNetworkInfo {
        network_id: live.network_id.clone(),
        network_cidr: info.network_cidr.clone(),
        peer_name: live.peer_name.clone(),
        local_peer_id: live.peer_id.clone(),
        virtual_ip: info.virtual_ip.map(|v| v.to_string()).unwrap_or_default(),
    })
}
