//! `/api/v1/mesh/networks/...`: the mesh registry (networks, peer registration and leases,
//! heartbeats, per-network peer events). Authorisation is the API's (the protected router);
//! the events WebSocket follows the `/api/v1/ws` Origin/Host rules and shares its client
//! slots. With `mesh.registry.enabled: false` (the default) every endpoint answers 503.

use super::error::{ApiError, ApiJson};
use super::ws;
use crate::mesh::store::RegistryError;
use crate::mesh::Registry;
use crate::server::ServerState;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::net::SocketAddr;
use std::sync::Arc;
use switchyard_api::{
    MeshHeartbeat, MeshNetwork, MeshNetworkCreate, MeshNetworkList, MeshPeer, MeshPeerList,
    MeshPeerUpdate, MeshRegisterRequest, MeshRegisterResponse,
};

type S = State<Arc<ServerState>>;

fn registry(state: &ServerState) -> Result<&Arc<Registry>, ApiError> {
    state.mesh.as_ref().ok_or_else(|| {
        ApiError::unavailable(
            "MESH_REGISTRY_DISABLED",
            "the mesh registry is off; set mesh.registry.enabled: true in the server configuration (restart needed)",
        )
    })
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        let message = e.to_string();
        match e {
            RegistryError::Invalid(_) => ApiError::bad_request("INVALID_FIELD", message),
            RegistryError::UnknownNetwork(_) => ApiError::not_found("NETWORK_NOT_FOUND", message),
            RegistryError::UnknownPeer { .. } => ApiError::not_found("PEER_NOT_FOUND", message),
            RegistryError::NetworkExists(_) => ApiError::conflict("NETWORK_EXISTS", message),
            RegistryError::NoLease { .. } => ApiError::conflict("NO_LEASE", message),
            RegistryError::KeyMismatch { .. } => ApiError::conflict("PUBLIC_KEY_MISMATCH", message),
            RegistryError::NetworkFull { .. } => ApiError::conflict("NETWORK_FULL", message),
            RegistryError::Db(_) | RegistryError::Corrupt(_) => {
                tracing::error!(error = %message, "mesh registry request failed");
                ApiError::internal(message)
            }
        }
    }
}

#[utoipa::path(get, path = "/api/v1/mesh/networks", tag = "mesh",
    responses((status = 200, body = MeshNetworkList),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn list_networks(State(state): S) -> Result<Json<MeshNetworkList>, ApiError> {
    let networks = registry(&state)?.list_networks().await?;
    Ok(Json(MeshNetworkList { networks }))
}

#[utoipa::path(post, path = "/api/v1/mesh/networks", tag = "mesh", request_body = MeshNetworkCreate,
    responses((status = 201, description = "created (peer_count 0)", body = MeshNetwork),
              (status = 400, description = "a field is invalid (the message names it)", body = switchyard_api::ErrorBody),
              (status = 409, description = "a network with this id exists", body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn create_network(
    State(state): S,
    ApiJson(body): ApiJson<MeshNetworkCreate>,
) -> Result<(StatusCode, Json<MeshNetwork>), ApiError> {
    let created = registry(&state)?.create_network(&body).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

#[utoipa::path(get, path = "/api/v1/mesh/networks/{networkID}", tag = "mesh",
    params(("networkID" = String, Path)),
    responses((status = 200, body = MeshNetwork), (status = 404, body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn get_network(
    State(state): S,
    Path(network): Path<String>,
) -> Result<Json<MeshNetwork>, ApiError> {
    Ok(Json(registry(&state)?.network(&network).await?))
}

#[utoipa::path(delete, path = "/api/v1/mesh/networks/{networkID}", tag = "mesh",
    params(("networkID" = String, Path)),
    responses((status = 204, description = "deleted with its peers (each leased peer's peer.left is sent, then the network's event streams end)"),
              (status = 404, body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn delete_network(
    State(state): S,
    Path(network): Path<String>,
) -> Result<StatusCode, ApiError> {
    registry(&state)?.delete_network(&network).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/api/v1/mesh/networks/{networkID}/peers", tag = "mesh",
    params(("networkID" = String, Path)), request_body = MeshRegisterRequest,
    responses((status = 201, description = "registered: a new lease (peer.joined)", body = MeshRegisterResponse),
              (status = 200, description = "registered again with the same public key: the held address is kept and its lease renewed", body = MeshRegisterResponse),
              (status = 400, description = "a field is invalid (the message names it)", body = switchyard_api::ErrorBody),
              (status = 404, description = "unknown network", body = switchyard_api::ErrorBody),
              (status = 409, description = "NETWORK_FULL: no free address; PUBLIC_KEY_MISMATCH: the id holds a lease with another key", body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn register(
    State(state): S,
    Path(network): Path<String>,
    ApiJson(body): ApiJson<MeshRegisterRequest>,
) -> Result<(StatusCode, Json<MeshRegisterResponse>), ApiError> {
    let done = registry(&state)?.register(&network, &body).await?;
    let status = if done.joined {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(MeshRegisterResponse {
            success: true,
            virtual_ip: done.virtual_ip.to_string(),
            network_cidr: done.cidr.to_string(),
            lease_expires: done.lease_expires,
            peers: done.others,
        }),
    ))
}

#[utoipa::path(get, path = "/api/v1/mesh/networks/{networkID}/peers", tag = "mesh",
    params(("networkID" = String, Path)),
    responses((status = 200, description = "the peers holding a lease", body = MeshPeerList),
              (status = 404, body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn list_peers(
    State(state): S,
    Path(network): Path<String>,
) -> Result<Json<MeshPeerList>, ApiError> {
    let peers = registry(&state)?.peers(&network).await?;
    Ok(Json(MeshPeerList { peers }))
}

#[utoipa::path(get, path = "/api/v1/mesh/networks/{networkID}/peers/{peerID}", tag = "mesh",
    params(("networkID" = String, Path), ("peerID" = String, Path)),
    responses((status = 200, body = MeshPeer),
              (status = 404, description = "unknown network or peer", body = switchyard_api::ErrorBody),
              (status = 415, description = "a body that is not sent as application/json", body = switchyard_api::ErrorBody),
              (status = 409, description = "NO_LEASE: the peer's lease expired; it must register again", body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn get_peer(
    State(state): S,
    Path((network, peer)): Path<(String, String)>,
) -> Result<Json<MeshPeer>, ApiError> {
    Ok(Json(registry(&state)?.peer(&network, &peer).await?))
}

#[utoipa::path(patch, path = "/api/v1/mesh/networks/{networkID}/peers/{peerID}", tag = "mesh",
    params(("networkID" = String, Path), ("peerID" = String, Path)), request_body = MeshPeerUpdate,
    responses((status = 200, description = "updated (peer.updated is sent); absent fields stay", body = MeshPeer),
              (status = 400, description = "a field is invalid (the message names it)", body = switchyard_api::ErrorBody),
              (status = 404, description = "unknown network or peer", body = switchyard_api::ErrorBody),
              (status = 415, description = "a body that is not sent as application/json", body = switchyard_api::ErrorBody),
              (status = 409, description = "NO_LEASE: the peer's lease expired; it must register again", body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn update_peer(
    State(state): S,
    Path((network, peer)): Path<(String, String)>,
    ApiJson(body): ApiJson<MeshPeerUpdate>,
) -> Result<Json<MeshPeer>, ApiError> {
    Ok(Json(
        registry(&state)?
            .update_peer(&network, &peer, &body)
            .await?,
    ))
}

#[utoipa::path(delete, path = "/api/v1/mesh/networks/{networkID}/peers/{peerID}", tag = "mesh",
    params(("networkID" = String, Path), ("peerID" = String, Path)),
    responses((status = 204, description = "deleted; its address is free (peer.left is sent when it held a lease)"),
              (status = 404, description = "unknown network or peer", body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn delete_peer(
    State(state): S,
    Path((network, peer)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    registry(&state)?.delete_peer(&network, &peer).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/api/v1/mesh/networks/{networkID}/peers/{peerID}/heartbeat", tag = "mesh",
    params(("networkID" = String, Path), ("peerID" = String, Path)),
    request_body(content = Option<MeshHeartbeat>, description = "none, or the peer's own figures (shown in the peer resource)"),
    responses((status = 204, description = "last seen updated and lease renewed"),
              (status = 400, description = "the optional body is not a heartbeat report", body = switchyard_api::ErrorBody),
              (status = 404, description = "unknown network or peer", body = switchyard_api::ErrorBody),
              (status = 415, description = "a body that is not sent as application/json", body = switchyard_api::ErrorBody),
              (status = 409, description = "NO_LEASE: the lease expired (its address may be leased again); register again (not transient)", body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn heartbeat(
    State(state): S,
    Path((network, peer)): Path<(String, String)>,
    super::body::TypedBody(body, _): super::body::JsonBytes,
) -> Result<StatusCode, ApiError> {
    let registry = registry(&state)?;
    let report = if body.iter().all(u8::is_ascii_whitespace) {
        MeshHeartbeat::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request("INVALID_JSON", format!("heartbeat body: {e}")))?
    };
    registry.heartbeat(&network, &peer, &report).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/v1/mesh/networks/{networkID}/events", tag = "mesh",
    params(("networkID" = String, Path),
           ("token" = Option<String>, Query, description = "API token, for clients that cannot send a header")),
    responses(
        (status = 101, description = "WebSocket of `{type, timestamp, data}` text messages: peer.joined {peer_id, name, virtual_ip}, peer.left {peer_id, name}, peer.updated {peer_id, endpoints}; send the text `ping` to get `pong`; closed after api.ws_read_timeout without a message from the client, and when the network is deleted", body = switchyard_api::EventEnvelope),
        (status = 400, description = "not a WebSocket upgrade request", body = switchyard_api::ErrorBody),
        (status = 401, description = "API token required", body = switchyard_api::ErrorBody),
        (status = 403, description = "Origin or Host refused (see api.allowed_origins)", body = switchyard_api::ErrorBody),
        (status = 404, description = "unknown network", body = switchyard_api::ErrorBody),
        (status = 503, description = "already 100 event-stream clients, or mesh.registry.enabled is false", body = switchyard_api::ErrorBody),
    ))]
pub async fn events(
    State(state): S,
    Path(network): Path<String>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let admitted = match ws::admit(&state, peer, &headers, upgrade) {
        Ok(a) => a,
        Err(refused) => return refused.into_response(),
    };
    let registry = match registry(&state) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = registry.network(&network).await {
        return ApiError::from(e).into_response();
    }
    let events = registry.events.subscribe(&network);
    admitted.serve(&state, events, "/api/v1/mesh/networks/{networkID}/events")
}
