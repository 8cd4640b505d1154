//! The server's mesh registry (`/api/v1/mesh/networks/...`): networks, peers, registration,
//! heartbeats and the per-network peer events. The mesh peer of `switchyard client` is the
//! main caller: it registers, keeps its lease with heartbeats and follows the events.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Mesh endpoint: where a peer can be reached (`type` `lan` is the spec's example).
pub use crate::client::MeshEndpointView as MeshEndpoint;

/// Mesh network.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MeshNetwork {
    pub id: String,
    pub name: String,
    /// IPv4 network the peers' virtual addresses are leased from, e.g. `10.100.0.0/24`.
    pub cidr: String,
    /// Peers holding a lease now.
    pub peer_count: u64,
    pub created: DateTime<Utc>,
}

/// `POST /api/v1/mesh/networks` body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MeshNetworkCreate {
    /// 1–64 of `A-Z a-z 0-9 . _ -`, starting with a letter or digit.
    pub id: String,
    pub name: String,
    /// IPv4 network address with prefix /8 … /30 (its network and broadcast addresses are
    /// never leased).
    pub cidr: String,
}

/// `GET /api/v1/mesh/networks`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MeshNetworkList {
    pub networks: Vec<MeshNetwork>,
}

/// Mesh peer (server registry): a peer holding a lease.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct MeshPeer {
    pub id: String,
    pub name: String,
    /// base64 of the peer's 32-byte X25519 public key.
    pub public_key: String,
    pub virtual_ip: String,
    pub endpoints: Vec<MeshEndpoint>,
    #[schema(value_type = Object)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// `connected` while the lease is held (peers without a lease are not listed).
    pub status: String,
    /// As the peer last reported it in a heartbeat (`direct`, `relayed`, `multi-hop`); absent
    /// until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_type: Option<String>,
    /// Milliseconds, as the peer last reported it; absent until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<f64>,
    pub last_seen: DateTime<Utc>,
    pub joined_at: DateTime<Utc>,
    /// When the lease ends unless a heartbeat renews it.
    pub lease_expires: DateTime<Utc>,
    /// Traffic totals as the peer last reported them in a heartbeat (the registry does not
    /// carry peer traffic itself); 0 until then.
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

/// `GET /api/v1/mesh/networks/{networkID}/peers`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct MeshPeerList {
    pub peers: Vec<MeshPeer>,
}

/// The `peer` of a registration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MeshPeerRegistration {
    /// Same format as a network id.
    pub id: String,
    #[serde(default)]
    pub name: String,
    /// base64 of a 32-byte X25519 public key. Re-registering a peer that holds a lease needs
    /// the same key (and keeps its address).
    pub public_key: String,
    #[serde(default)]
    pub endpoints: Vec<MeshEndpoint>,
    /// Free-form object (at most 4 KiB as JSON); default `{}`.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

/// `POST /api/v1/mesh/networks/{networkID}/peers` body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MeshRegisterRequest {
    /// Must equal the path's network when given.
    #[serde(default)]
    pub network_id: Option<String>,
    pub peer: MeshPeerRegistration,
}

/// Another member of the network, as a registration answer lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MeshPeerSummary {
    pub id: String,
    pub name: String,
    pub virtual_ip: String,
    /// For the session handshake's public-key verification.
    pub public_key: String,
    pub endpoints: Vec<MeshEndpoint>,
}

/// Registration answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MeshRegisterResponse {
    pub success: bool,
    /// The leased address (no prefix; the prefix is the network's).
    pub virtual_ip: String,
    pub network_cidr: String,
    /// When the lease ends unless a heartbeat renews it.
    pub lease_expires: DateTime<Utc>,
    /// The other peers holding a lease.
    pub peers: Vec<MeshPeerSummary>,
    /// This peer's own credential (Bearer) for its heartbeats, updates, peer list, events and
    /// later registrations: new when the registration was authorised by an enrollment key or
    /// the admin token (replacing any earlier one), the presented one otherwise. Keep it
    /// secret; the registry stores only its SHA-256. Absent from registries before issue 28.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_token: Option<String>,
}

/// `POST /api/v1/mesh/networks/{networkID}/enrollment-keys` body.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MeshEnrollmentKeyCreate {
    /// true: any number of registrations until it expires; false (default): consumed by the
    /// first registration that succeeds.
    #[serde(default)]
    pub reusable: bool,
    /// How long the key can be used, as a duration (`90s`, `30m`, `24h`; 1 s … 8760 h);
    /// default `24h`.
    #[serde(default)]
    pub ttl: Option<String>,
}

/// An enrollment key. `key` (the secret, `syek_` and 64 hex digits) is in the creation answer
/// only: the registry stores its SHA-256.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MeshEnrollmentKey {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub reusable: bool,
    pub expires_at: DateTime<Utc>,
    pub created: DateTime<Utc>,
}

/// `GET /api/v1/mesh/networks/{networkID}/enrollment-keys`: the keys that can still be used.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MeshEnrollmentKeyList {
    pub keys: Vec<MeshEnrollmentKey>,
}

/// `PATCH /api/v1/mesh/networks/{networkID}/peers/{peerID}` body: absent fields stay.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MeshPeerUpdate {
    #[serde(default)]
    pub endpoints: Option<Vec<MeshEndpoint>>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Optional body of a heartbeat: the peer's own measurements, shown in the peer resource.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MeshHeartbeat {
    #[serde(default)]
    pub connection_type: Option<String>,
    #[serde(default)]
    pub latency: Option<f64>,
    #[serde(default)]
    pub bytes_sent: Option<u64>,
    #[serde(default)]
    pub bytes_received: Option<u64>,
}
