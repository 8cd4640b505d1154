//! Mesh endpoints. The mesh peer comes with issue 13: until then the status is `disabled`,
//! enabling answers 501, and there are no peers or routes. The network info is the configured one.

use super::S;
use crate::api::error::ApiError;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use switchyard_api::client::{
    MeshNetworkInfo, MeshPeerView, MeshRouteView, MeshStats, MeshStatus, StatusReply,
};

#[utoipa::path(get, path = "/api/v1/mesh/status", tag = "mesh", responses((status = 200, body = MeshStatus)))]
pub async fn status(State(state): State<S>) -> Json<MeshStatus> {
    let cfg = state.config.load();
    Json(MeshStatus {
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
    })
}

#[utoipa::path(get, path = "/api/v1/mesh/stats", tag = "mesh", responses((status = 200, body = MeshStats)))]
pub async fn stats() -> Json<MeshStats> {
    Json(MeshStats {
        enabled: false,
        peer_count: 0,
        connected_peers: 0,
        bytes_sent: 0,
        bytes_received: 0,
        packets_sent: 0,
        packets_received: 0,
    })
}

#[utoipa::path(post, path = "/api/v1/mesh/enable", tag = "mesh",
    responses((status = 501, description = "the mesh peer is not in this build", body = switchyard_api::ErrorBody)))]
pub async fn enable() -> ApiError {
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "MESH_UNAVAILABLE",
        "the mesh peer is not in this build yet; mesh stays disabled",
    )
}

#[utoipa::path(post, path = "/api/v1/mesh/disable", tag = "mesh", responses((status = 200, body = StatusReply)))]
pub async fn disable() -> Json<StatusReply> {
    Json(StatusReply::new("disabled"))
}

#[utoipa::path(get, path = "/api/v1/mesh/peers", tag = "mesh", responses((status = 200, body = [MeshPeerView])))]
pub async fn peers() -> Json<Vec<MeshPeerView>> {
    Json(Vec::new())
}

#[utoipa::path(get, path = "/api/v1/mesh/peers/connected", tag = "mesh", responses((status = 200, body = [MeshPeerView])))]
pub async fn connected_peers() -> Json<Vec<MeshPeerView>> {
    Json(Vec::new())
}

#[utoipa::path(get, path = "/api/v1/mesh/peers/{id}", tag = "mesh", params(("id" = String, Path)),
    responses((status = 404, body = switchyard_api::ErrorBody)))]
pub async fn peer(Path(id): Path<String>) -> ApiError {
    ApiError::not_found(
        "PEER_NOT_FOUND",
        format!("no mesh peer {id} (mesh is disabled)"),
    )
}

#[utoipa::path(get, path = "/api/v1/mesh/routes", tag = "mesh", responses((status = 200, body = [MeshRouteView])))]
pub async fn routes() -> Json<Vec<MeshRouteView>> {
    Json(Vec::new())
}

#[utoipa::path(get, path = "/api/v1/mesh/network", tag = "mesh", responses((status = 200, body = MeshNetworkInfo)))]
pub async fn network(State(state): State<S>) -> Json<MeshNetworkInfo> {
    let cfg = state.config.load();
    Json(MeshNetworkInfo {
        network_id: cfg.mesh.network_id.clone(),
        network_cidr: cfg.mesh.network_cidr.clone(),
        peer_name: cfg.mesh.peer_name.clone(),
        local_peer_id: String::new(),
        virtual_ip: String::new(),
    })
}
