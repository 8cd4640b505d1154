//! `/api/v1/mesh/networks/...`: the mesh registry (networks, peer registration and leases,
//! heartbeats, per-network peer events, enrollment keys). Authentication is the API's (the
//! protected router), which also admits a peer credential on the routes a peer may use and
//! hands each handler the [`Caller`]; the registry decides what the caller may do (a peer acts
//! on itself and reads its own network only). The events WebSocket follows the `/api/v1/ws` Origin/Host rules and shares its client
//! slots. With `mesh.registry.enabled: false` (the default) every endpoint answers 503.

use super::error::{ApiError, ApiJson};
use super::ws;
use crate::mesh::credential::{Caller, Denied};
use crate::mesh::store::{EnrollmentKeyRow, RegistryError};
use crate::mesh::Registry;
use crate::server::ServerState;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{ConnectInfo, Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::net::SocketAddr;
use std::sync::Arc;
use switchyard_api::{
    MeshEnrollmentKey, MeshEnrollmentKeyCreate, MeshEnrollmentKeyList, MeshHeartbeat, MeshNetwork,
    MeshNetworkCreate, MeshNetworkList, MeshPeer, MeshPeerList, MeshPeerUpdate,
    MeshRegisterRequest, MeshRegisterResponse,
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
            RegistryError::PublicKeyInUse { .. } => {
                ApiError::conflict("PUBLIC_KEY_IN_USE", message)
            }
            RegistryError::UnknownEnrollmentKey { .. } => {
                ApiError::not_found("ENROLLMENT_KEY_NOT_FOUND", message)
            }
            RegistryError::Denied(denied) => denied.into(),
            RegistryError::NetworkFull { .. } => ApiError::conflict("NETWORK_FULL", message),
            RegistryError::Db(_) | RegistryError::Corrupt(_) | RegistryError::NoRandomness(_) => {
                tracing::error!(error = %message, "mesh registry request failed");
                ApiError::internal(message)
            }
        }
    }
}

impl From<Denied> for ApiError {
    fn from(denied: Denied) -> Self {
        match denied {
            Denied::Unauthenticated(m) => {
                ApiError::new(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", m)
            }
            Denied::Forbidden(m) => ApiError::new(StatusCode::FORBIDDEN, "FORBIDDEN", m),
        }
    }
}

/// Longest and shortest enrollment key lifetime.
const MAX_KEY_TTL: std::time::Duration = std::time::Duration::from_secs(8760 * 3600);
const DEFAULT_KEY_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

fn key_ttl(ttl: Option<&str>) -> Result<std::time::Duration, ApiError> {
    let Some(text) = ttl else {
        return Ok(DEFAULT_KEY_TTL);
    };
    let invalid = |why: String| ApiError::bad_request("INVALID_FIELD", format!("ttl: {why}"));
    let ttl = text
        .parse::<switchyard_config::Duration>()
        .map_err(|e| invalid(e.to_string()))?
        .as_std();
    if ttl < std::time::Duration::from_secs(1) || ttl > MAX_KEY_TTL {
        return Err(invalid(format!("{text:?} is not between 1s and 8760h")));
    }
    Ok(ttl)
}

fn key_view(row: EnrollmentKeyRow, key: Option<String>) -> MeshEnrollmentKey {
    MeshEnrollmentKey {
        id: row.id,
        key,
        reusable: row.reusable,
        expires_at: row.expires_at,
        created: row.created,
    }
}

#[utoipa::path(post, path = "/api/v1/mesh/networks/{networkID}/enrollment-keys", tag = "mesh",
    params(("networkID" = String, Path)), request_body = MeshEnrollmentKeyCreate,
    responses((status = 201, description = "created; `key` is shown this once (the registry keeps its SHA-256)", body = MeshEnrollmentKey),
              (status = 400, description = "ttl is not a duration of 1s … 8760h", body = switchyard_api::ErrorBody),
              (status = 403, description = "a peer credential (the admin token only)", body = switchyard_api::ErrorBody),
              (status = 404, description = "unknown network", body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn create_enrollment_key(
    State(state): S,
    Path(network): Path<String>,
    ApiJson(body): ApiJson<MeshEnrollmentKeyCreate>,
) -> Result<(StatusCode, Json<MeshEnrollmentKey>), ApiError> {
    let ttl = key_ttl(body.ttl.as_deref())?;
    let (row, key) = registry(&state)?
        .create_enrollment_key(&network, body.reusable, ttl)
        .await?;
    Ok((StatusCode::CREATED, Json(key_view(row, Some(key)))))
}

#[utoipa::path(get, path = "/api/v1/mesh/networks/{networkID}/enrollment-keys", tag = "mesh",
    params(("networkID" = String, Path)),
    responses((status = 200, description = "the keys that can still be used (unexpired, not consumed, not revoked), without their secrets", body = MeshEnrollmentKeyList),
              (status = 403, description = "a peer credential (the admin token only)", body = switchyard_api::ErrorBody),
              (status = 404, description = "unknown network", body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn list_enrollment_keys(
    State(state): S,
    Path(network): Path<String>,
) -> Result<Json<MeshEnrollmentKeyList>, ApiError> {
    let keys = registry(&state)?.enrollment_keys(&network).await?;
    Ok(Json(MeshEnrollmentKeyList {
        keys: keys.into_iter().map(|k| key_view(k, None)).collect(),
    }))
}

#[utoipa::path(delete, path = "/api/v1/mesh/networks/{networkID}/enrollment-keys/{keyID}", tag = "mesh",
    params(("networkID" = String, Path), ("keyID" = String, Path)),
    responses((status = 204, description = "revoked: registrations with it are refused (401); peers it enrolled keep their credentials"),
              (status = 403, description = "a peer credential (the admin token only)", body = switchyard_api::ErrorBody),
              (status = 404, description = "unknown network or key", body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn revoke_enrollment_key(
    State(state): S,
    Path((network, key)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    registry(&state)?
        .revoke_enrollment_key(&network, &key)
        .await?;
    Ok(StatusCode::NO_CONTENT)
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
              (status = 401, description = "no admin token, peer credential or valid enrollment key of this network (unknown, expired, revoked, or a consumed single-use key)", body = switchyard_api::ErrorBody),
              (status = 403, description = "an existing peer id registered with an enrollment key (it needs its own credential or the admin token), or another peer's credential", body = switchyard_api::ErrorBody),
              (status = 404, description = "unknown network", body = switchyard_api::ErrorBody),
              (status = 409, description = "NETWORK_FULL: no free address; PUBLIC_KEY_MISMATCH: the id holds a lease with another key; PUBLIC_KEY_IN_USE: another peer of the network holds this key", body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn register(
    State(state): S,
    Extension(caller): Extension<Caller>,
    Path(network): Path<String>,
    ApiJson(body): ApiJson<MeshRegisterRequest>,
) -> Result<(StatusCode, Json<MeshRegisterResponse>), ApiError> {
    let (done, peer_token) = registry(&state)?.register(&caller, &network, &body).await?;
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
            peer_token: Some(peer_token),
        }),
    ))
}

#[utoipa::path(get, path = "/api/v1/mesh/networks/{networkID}/peers", tag = "mesh",
    params(("networkID" = String, Path)),
    responses((status = 200, description = "the peers holding a lease", body = MeshPeerList),
              (status = 403, description = "a peer credential of another network", body = switchyard_api::ErrorBody),
              (status = 404, body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn list_peers(
    State(state): S,
    Extension(caller): Extension<Caller>,
    Path(network): Path<String>,
) -> Result<Json<MeshPeerList>, ApiError> {
    let peers = registry(&state)?.peers(&caller, &network).await?;
    Ok(Json(MeshPeerList { peers }))
}

#[utoipa::path(get, path = "/api/v1/mesh/networks/{networkID}/peers/{peerID}", tag = "mesh",
    params(("networkID" = String, Path), ("peerID" = String, Path)),
    responses((status = 200, body = MeshPeer),
              (status = 403, description = "another peer's credential (a peer credential acts on its own peer, and reads its own network)", body = switchyard_api::ErrorBody),
              (status = 404, description = "unknown network or peer", body = switchyard_api::ErrorBody),
              (status = 415, description = "a body that is not sent as application/json", body = switchyard_api::ErrorBody),
              (status = 409, description = "NO_LEASE: the peer's lease expired; it must register again", body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn get_peer(
    State(state): S,
    Extension(caller): Extension<Caller>,
    Path((network, peer)): Path<(String, String)>,
) -> Result<Json<MeshPeer>, ApiError> {
    Ok(Json(
        registry(&state)?.peer(&caller, &network, &peer).await?,
    ))
}

#[utoipa::path(patch, path = "/api/v1/mesh/networks/{networkID}/peers/{peerID}", tag = "mesh",
    params(("networkID" = String, Path), ("peerID" = String, Path)), request_body = MeshPeerUpdate,
    responses((status = 200, description = "updated (peer.updated is sent); absent fields stay", body = MeshPeer),
              (status = 400, description = "a field is invalid (the message names it)", body = switchyard_api::ErrorBody),
              (status = 403, description = "another peer's credential (a peer credential acts on its own peer, and reads its own network)", body = switchyard_api::ErrorBody),
              (status = 404, description = "unknown network or peer", body = switchyard_api::ErrorBody),
              (status = 415, description = "a body that is not sent as application/json", body = switchyard_api::ErrorBody),
              (status = 409, description = "NO_LEASE: the peer's lease expired; it must register again", body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn update_peer(
    State(state): S,
    Extension(caller): Extension<Caller>,
    Path((network, peer)): Path<(String, String)>,
    ApiJson(body): ApiJson<MeshPeerUpdate>,
) -> Result<Json<MeshPeer>, ApiError> {
    Ok(Json(
        registry(&state)?
            .update_peer(&caller, &network, &peer, &body)
            .await?,
    ))
}

#[utoipa::path(delete, path = "/api/v1/mesh/networks/{networkID}/peers/{peerID}", tag = "mesh",
    params(("networkID" = String, Path), ("peerID" = String, Path)),
    responses((status = 204, description = "deleted; its address is free (peer.left is sent when it held a lease)"),
              (status = 403, description = "another peer's credential (a peer credential acts on its own peer, and reads its own network)", body = switchyard_api::ErrorBody),
              (status = 404, description = "unknown network or peer", body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn delete_peer(
    State(state): S,
    Extension(caller): Extension<Caller>,
    Path((network, peer)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    registry(&state)?
        .delete_peer(&caller, &network, &peer)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/api/v1/mesh/networks/{networkID}/peers/{peerID}/heartbeat", tag = "mesh",
    params(("networkID" = String, Path), ("peerID" = String, Path)),
    request_body(content = Option<MeshHeartbeat>, description = "none, or the peer's own figures (shown in the peer resource)"),
    responses((status = 204, description = "last seen updated and lease renewed"),
              (status = 400, description = "the optional body is not a heartbeat report", body = switchyard_api::ErrorBody),
              (status = 403, description = "another peer's credential (a peer credential acts on its own peer, and reads its own network)", body = switchyard_api::ErrorBody),
              (status = 404, description = "unknown network or peer", body = switchyard_api::ErrorBody),
              (status = 415, description = "a body that is not sent as application/json", body = switchyard_api::ErrorBody),
              (status = 409, description = "NO_LEASE: the lease expired (its address may be leased again); register again (not transient)", body = switchyard_api::ErrorBody),
              (status = 503, description = "mesh.registry.enabled is false", body = switchyard_api::ErrorBody)))]
pub async fn heartbeat(
    State(state): S,
    Extension(caller): Extension<Caller>,
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
    registry
        .heartbeat(&caller, &network, &peer, &report)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/v1/mesh/networks/{networkID}/events", tag = "mesh",
    params(("networkID" = String, Path),
           ("token" = Option<String>, Query, description = "API token, for clients that cannot send a header")),
    responses(
        (status = 101, description = "WebSocket of `{type, timestamp, data}` text messages: peer.joined {peer_id, name, virtual_ip}, peer.left {peer_id, name}, peer.updated {peer_id, endpoints}; send the text `ping` to get `pong`; closed after api.ws_read_timeout without a message from the client, and when the network is deleted", body = switchyard_api::EventEnvelope),
        (status = 400, description = "not a WebSocket upgrade request", body = switchyard_api::ErrorBody),
        (status = 401, description = "API token or a peer credential of the network required", body = switchyard_api::ErrorBody),
        (status = 403, description = "Origin or Host refused (see api.allowed_origins), or a peer credential of another network", body = switchyard_api::ErrorBody),
        (status = 404, description = "unknown network", body = switchyard_api::ErrorBody),
        (status = 503, description = "already 100 event-stream clients, or mesh.registry.enabled is false", body = switchyard_api::ErrorBody),
    ))]
pub async fn events(
    State(state): S,
    Extension(caller): Extension<Caller>,
    Path(network): Path<String>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    if let Err(denied) = caller.may_read(&network) {
        return ApiError::from(denied).into_response();
    }
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
