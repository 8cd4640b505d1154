//! Client management API (`switchyard client`, default port 7383). Health, version, error and
//! cache-entry bodies are shared with the server API ([`crate::server`]).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `{status}` answers: `connected`, `disconnected`, `ok`, `updated`, `reloaded`, `cleared`,
/// `enabled`, `disabled`, `added`, `removed`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct StatusReply {
    pub status: String,
}

impl StatusReply {
    pub fn new(status: &str) -> Self {
        Self {
            status: status.into(),
        }
    }
}

/// `GET /api/v1/status`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ClientStatus {
    /// `running`, or `blocked: not connected` while `routing.when_disconnected: block` refuses
    /// what the server would carry (no server connected).
    pub status: String,
    pub version: String,
    pub server_connected: bool,
    /// `host:port` of the selected server (empty when none).
    pub server_address: String,
    /// Address of the local HTTP proxy (empty when off).
    pub http_proxy: String,
    /// Address of the local SOCKS5 proxy (empty when off).
    pub socks5_proxy: String,
    pub vpn_enabled: bool,
    pub vpn_status: String,
    /// Debug entries held in the ring.
    pub debug_entries: u64,
    /// Duration string since the client started.
    pub uptime: String,
    /// Bytes written back to local proxy clients since start (both listeners).
    pub bytes_sent: u64,
    /// Bytes read from local proxy clients since start (both listeners).
    pub bytes_received: u64,
    /// Proxy connections being served across both listeners.
    pub active_connections: u64,
    pub timestamp: DateTime<Utc>,
}

/// One entry of `GET /api/v1/servers`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ServerEntry {
    /// The older form's identifier, used by `POST /api/v1/servers/{id}/select`.
    pub id: String,
    pub name: String,
    /// `host:port`.
    pub address: String,
    /// `HTTP`, `SOCKS5` or `QUIC`.
    pub protocol: String,
    pub is_default: bool,
    /// Connect latency of the last probe (0 when it failed or none ran yet).
    pub latency_ms: u64,
    /// `connected` (selected and connected), `online`, `busy` (slow probe) or `offline`.
    pub status: String,
    /// `QUIC` servers (an extension): why the last connection attempt failed or the
    /// connection ended (wrong pin, refused token, no answer), while not connected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `POST /api/v1/server/select` body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct SelectServer {
    pub server: String,
}

/// `POST /api/v1/server/select` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ServerSelected {
    /// `selected`.
    pub status: String,
    pub server: String,
}

/// Quick settings, `GET`/`POST /api/v1/settings` (persisted in the data directory).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default, ToSchema)]
#[serde(default)]
pub struct QuickSettings {
    pub auto_connect: bool,
    pub start_minimized: bool,
    pub show_notifications: bool,
    pub vpn_enabled: bool,
    pub system_proxy_enabled: bool,
    /// Name of the selected server (empty when none).
    pub current_server: String,
}

/// `PUT /api/v1/config` and `POST /api/v1/config/import` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ConfigUpdated {
    /// `updated` or `imported`.
    pub status: String,
    pub restart_required: bool,
    /// Changed keys that apply after a restart (from the spec's list).
    pub restart_fields: Vec<String>,
    pub warnings: Vec<String>,
}

/// One validation error.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ConfigError {
    pub section: String,
    pub message: String,
}

/// `POST /api/v1/config/validate` answer; also the 400 body of an invalid PUT or import.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ConfigValidation {
    pub valid: bool,
    pub errors: Vec<ConfigError>,
    pub warnings: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One client route.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ClientRoute {
    pub name: String,
    pub patterns: Vec<String>,
    /// `direct` or `server`.
    pub action: String,
    pub priority: i32,
}

/// `POST /api/v1/routes` body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ClientRouteCreate {
    pub name: String,
    pub domains: Vec<String>,
    pub action: String,
    #[serde(default)]
    pub priority: i32,
}

/// `POST /api/v1/routes` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ClientRouteCreated {
    /// `created`.
    pub status: String,
    pub route: String,
    pub domains: Vec<String>,
    pub action: String,
}

/// `DELETE /api/v1/routes/{name}` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ClientRouteRemoved {
    /// `removed`.
    pub status: String,
    pub route: String,
}

/// `GET /api/v1/routes/test` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct RouteTestResult {
    pub domain: String,
    pub action: String,
    /// Omitted when no route matched and the default action applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matched_route: Option<String>,
}

/// One debug entry (a proxied request as the data plane recorded it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct DebugEntry {
    pub timestamp: DateTime<Utc>,
    pub method: String,
    /// `host` or `host:port`.
    pub host: String,
    pub path: String,
    /// 0 for a SOCKS5 connection or a request that never got an answer.
    pub status_code: u16,
    /// Duration string.
    pub duration: String,
    /// `direct` or `server`.
    pub action: String,
    /// `direct` or the server's name.
    pub backend: String,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    /// Empty when the request succeeded.
    pub error: String,
}

/// `{message}` answers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MessageReply {
    pub message: String,
}

/// `GET /api/v1/cache/stats` (client form).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ClientCacheStats {
    pub enabled: bool,
    pub storage_type: String,
    pub entries: u64,
    pub total_size_bytes: u64,
    pub max_size_bytes: u64,
    pub used_percent: f64,
    pub hit_count: u64,
    pub miss_count: u64,
    pub hit_rate: f64,
    pub eviction_count: u64,
    pub store_error_count: u64,
    pub rules_count: u64,
    pub presets_count: u64,
    pub custom_rules_count: u64,
}

/// `GET /api/v1/vpn/status`. Both spellings of the address fields are sent.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct VpnStatus {
    /// `disabled`, `connecting`, `connected` or `error`.
    pub status: String,
    pub enabled: bool,
    pub tunnel_type: String,
    pub interface_name: String,
    pub mtu: u32,
    pub port: u16,
    pub encryption: String,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub gateway: String,
    pub ip: String,
    pub local_ip: String,
    /// The TUN's IPv6 address (`vpn.tun.address6` without its prefix); empty without IPv6
    /// (extension).
    #[serde(default)]
    pub ip6: String,
    /// The TUN's IPv6 gateway (`vpn.tun.gateway6`); empty without IPv6 (extension).
    #[serde(default)]
    pub gateway6: String,
    pub dns: Vec<String>,
    pub dns_servers: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connected_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connected_since: Option<DateTime<Utc>>,
    /// How split-tunnel traffic is classified while enabled: `ebpf` or `nftables` (extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mechanism: Option<String>,
    /// Why eBPF is not in use when the nftables fallback was chosen (extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<String>,
    /// Why the VPN is in `error` (extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// TCP and UDP flows in the TUN path's NAT right now (extension).
    #[serde(default)]
    pub flows: u64,
    /// TCP flows the eBPF classifier sent from `connect(2)` straight to the client since start,
    /// past the TUN (`vpn.tcp_redirect`); their bytes are in `bytes_sent` / `bytes_received`
    /// (extension).
    #[serde(default)]
    pub tcp_redirected: u64,
    /// Packets the TUN path dropped since start — what it does not translate (ICMP, IPv6, IP
    /// fragments), stray segments, a full NAT, loops — plus UDP datagrams its relay dropped (a
    /// route that cannot carry UDP, full flow queues or tables) (extension).
    #[serde(default)]
    pub dropped: u64,
    /// How the TUN path answered ICMP echo requests (ping) since start (extension).
    #[serde(default)]
    pub icmp: VpnIcmpStats,
    /// The nftables classifier's exec watch, which moves apps by name or path into the apps
    /// cgroup at exec; absent with eBPF or where fanotify permission events are unavailable
    /// (extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_execs: Option<VpnAppExecs>,
    /// What the kill switch (`routing.when_disconnected: block`) refused since start
    /// (extension).
    #[serde(default)]
    pub blocked: VpnBlockedStats,
}

/// Execs the exec watch answered and processes it moved into the apps cgroup at their exec,
/// since the VPN came up (extension of `GET /api/v1/vpn/status`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct VpnAppExecs {
    pub seen: u64,
    pub moved: u64,
}

/// Traffic of the VPN refused because its route was blocked — meant for the server while none
/// is connected (extension of `GET /api/v1/vpn/status`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct VpnBlockedStats {
    /// TCP flows reset.
    pub tcp_flows: u64,
    /// UDP datagrams dropped (also counted in `dropped`).
    pub udp_datagrams: u64,
    /// DNS questions answered REFUSED by the VPN's resolver (never forwarded).
    pub dns_refused: u64,
}

/// ICMP echo requests (ping) that entered the TUN: each probed over its destination's route
/// and answered as the probe said, or not at all (extension of `GET /api/v1/vpn/status`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct VpnIcmpStats {
    /// Echo requests handed to the data plane's cores.
    pub echo_requests: u64,
    /// Echo replies (the destination was reachable over its route).
    pub echo_answered: u64,
    /// Answered "destination host unreachable" (the route's server or socket says so).
    pub echo_unreachable: u64,
    /// Answered "administratively prohibited" (no route, or none that carries it).
    pub echo_prohibited: u64,
    /// Not answered: the probe had no verdict within its bound (ping counts a loss).
    pub echo_dropped: u64,
    /// Not answered: over the probe bounds (probes in flight, waiting requests, starts per
    /// second).
    pub echo_limited: u64,
}

/// One VPN connection.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct VpnConnection {
    pub id: String,
    pub remote_addr: String,
    pub local_addr: String,
    pub protocol: String,
    pub started_at: DateTime<Utc>,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

/// One app of the split-tunnel rules.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct SplitAppEntry {
    pub name: String,
    #[serde(default)]
    pub path: String,
    /// Linux: a cgroup v2 directory whose processes are the app (extension; not in the spec).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cgroup: String,
}

/// `GET /api/v1/vpn/split/rules`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct SplitRules {
    /// `exclude` or `include`.
    pub mode: String,
    pub apps: Vec<SplitAppEntry>,
    pub domains: Vec<String>,
    pub ips: Vec<String>,
    pub always_bypass: Vec<String>,
    /// `vpn.split.allow_lan`: the directly connected LAN bypasses the VPN (true, the default) or
    /// goes through it like any other destination (false). Extension; not in the spec.
    #[serde(default = "lan_allowed")]
    pub allow_lan: bool,
}

fn lan_allowed() -> bool {
    true
}

/// `PUT /api/v1/vpn/split/mode` body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct SplitModeBody {
    pub mode: String,
}

/// `PUT /api/v1/vpn/split/mode` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct SplitModeUpdated {
    /// `updated`.
    pub status: String,
    pub mode: String,
}

/// `POST /api/v1/vpn/split/domains` body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct SplitDomainBody {
    pub pattern: String,
}

/// `POST /api/v1/vpn/split/ips` body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct SplitIpBody {
    pub cidr: String,
}

/// `GET /api/v1/vpn/dns/cache` (the interception resolver's cache).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct DnsCacheView {
    pub enabled: bool,
    pub entries: Vec<DnsCacheEntry>,
    pub count: u64,
}

/// One cached DNS answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct DnsCacheEntry {
    pub domain: String,
    pub addresses: Vec<String>,
    pub expires_at: DateTime<Utc>,
}

/// `GET /api/v1/mesh/status`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MeshStatus {
    /// `disabled` until the mesh peer runs.
    pub status: String,
    pub enabled: bool,
    pub peer_id: String,
    pub virtual_ip: String,
    pub network_id: String,
    pub network_cidr: String,
    pub peer_name: String,
    pub peer_count: u64,
    pub connected_peers: u64,
    pub direct_connections: u64,
    pub relayed_connections: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub packets_sent: u64,
    pub packets_received: u64,
    pub uptime: String,
    /// Why the peer is in `error`, e.g. the registry's certificate is not trusted
    /// (extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Mesh endpoint.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MeshEndpointView {
    pub address: String,
    pub port: u16,
    #[serde(rename = "type")]
    pub kind: String,
    pub priority: i32,
}

/// Mesh peer (client view).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MeshPeerView {
    pub id: String,
    pub name: String,
    pub virtual_ip: String,
    pub virtual_mac: String,
    pub public_key: String,
    pub status: String,
    pub connection_type: String,
    pub latency_ms: u64,
    pub last_seen: DateTime<Utc>,
    pub joined_at: DateTime<Utc>,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub endpoints: Vec<MeshEndpointView>,
    #[schema(value_type = Object)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

/// Mesh route.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MeshRouteView {
    pub dest_peer_id: String,
    pub dest_ip: String,
    pub next_hop: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub metric: u64,
    pub latency_ms: u64,
    pub hop_count: u64,
    pub last_updated: DateTime<Utc>,
    pub active: bool,
}

/// `GET /api/v1/mesh/network`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MeshNetworkInfo {
    pub network_id: String,
    pub network_cidr: String,
    pub peer_name: String,
    pub local_peer_id: String,
    pub virtual_ip: String,
}

/// `GET /api/v1/mesh/stats`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MeshStats {
    pub enabled: bool,
    pub peer_count: u64,
    pub connected_peers: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub packets_sent: u64,
    pub packets_received: u64,
    /// Broadcast, multicast and anycast traffic (the spec leaves the stats body open).
    #[serde(default)]
    pub traffic_modes: MeshTrafficModes,
    /// Datagrams of other members' sessions this peer passed on in relay envelopes
    /// (`relay_via_peers`; it cannot read them).
    #[serde(default)]
    pub relayed_datagrams: u64,
    /// Datagrams and packets the mesh refused, by reason.
    #[serde(default)]
    pub drops: MeshDrops,
}

/// What the mesh data plane refused, by reason (counts since the mesh started).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MeshDrops {
    /// Datagrams of no known kind or session, or failing authentication; decrypted packets
    /// whose source the sending peer may not use.
    pub invalid: u64,
    /// Handshakes from a key the registry does not list.
    pub unknown_key: u64,
    /// Handshake initiations refused before any key work (mac1 not keyed to this peer, or no
    /// cookie while under load).
    pub handshakes_refused: u64,
    /// Cookie replies sent to handshake initiations beyond the rate (100/s) this peer takes.
    pub handshake_cookies: u64,
    /// Packets for a virtual IP without a usable session.
    pub no_route: u64,
    /// Packets for another member that a session carried in plaintext (a relay passes on only
    /// end-to-end envelopes), and envelopes this peer does not pass on (`relay_via_peers` off,
    /// TTL spent, a source no member holds).
    #[serde(default)]
    pub relay_refused: u64,
    /// IPv4 packets with "don't fragment" larger than a way through a relaying member carries
    /// (the device MTU less 60 bytes of envelope): answered with ICMP "fragmentation needed"
    /// from the relay's virtual IP, so the sender's path MTU adapts.
    #[serde(default)]
    pub too_big_for_relay: u64,
    /// Packets lost to a full queue or device.
    pub overflow: u64,
    /// Routing control messages refused (malformed, stale, from a non-neighbour, a flood
    /// message: floods travel end to end as copies in their origin's own session).
    pub control_dropped: u64,
    /// Route announcement entries naming an id the registry does not list, or another
    /// virtual IP than the registry gives that id (a route never changes who owns an address).
    pub route_claims_refused: u64,
    /// TAP mode: frames from a member with a source MAC learnt behind another member that is
    /// still active (it may move once its owner was quiet for 5 min); not written to the
    /// device.
    #[serde(default)]
    pub mac_claims_refused: u64,
    /// STUN and TURN datagrams NAT traversal did not take.
    pub ice_dropped: u64,
}

/// Packets of the mesh traffic modes other than unicast, and this peer's memberships.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct MeshTrafficModes {
    /// Broadcast packets from the device flooded to every peer (TAP: broadcast and
    /// unknown-unicast frames).
    pub broadcast_packets_sent: u64,
    /// Flooded broadcast packets from other peers written to the device.
    pub broadcast_packets_received: u64,
    /// Multicast packets from the device flooded to the group's members.
    pub multicast_packets_sent: u64,
    /// Multicast packets for a group this peer joined written to the device.
    pub multicast_packets_received: u64,
    /// Anycast packets from the device sent to the closest member.
    pub anycast_packets_sent: u64,
    /// Packets for one of this peer's anycast addresses written to the device.
    pub anycast_packets_received: u64,
    /// Multicast groups joined on the mesh device (IGMP).
    pub multicast_groups: u64,
    /// Anycast addresses of the mesh device.
    pub anycast_addresses: u64,
}
