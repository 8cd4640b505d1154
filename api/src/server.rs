//! Server management API (`switchyard server`, default port 7082).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// `GET /api/v1/health`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct HealthResponse {
    /// `healthy` or `degraded`
    pub status: String,
    pub time: DateTime<Utc>,
    /// Why the status is `degraded`: one line per data-plane core that is down and per backend
    /// that is unhealthy (absent when healthy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// Data-plane cores running / configured (absent where a service has no data plane).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores_up: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores_total: Option<u64>,
}

impl HealthResponse {
    /// The health of a process with a data plane, from what was measured now: `degraded` exactly
    /// when there is a problem to report.
    pub fn measured(problems: Vec<String>, cores_up: usize, cores_total: usize) -> Self {
        Self {
            status: if problems.is_empty() {
                "healthy"
            } else {
                "degraded"
            }
            .into(),
            time: Utc::now(),
            problems,
            cores_up: Some(cores_up as u64),
            cores_total: Some(cores_total as u64),
        }
    }
}

/// `GET /api/v1/version`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct VersionInfo {
    pub version: String,
    pub git_commit: String,
    pub build_time: DateTime<Utc>,
    /// The spec's field name; holds the Rust compiler version of this build.
    pub go_version: String,
    /// `<os>/<arch>`
    pub platform: String,
}

/// `GET /api/v1/status`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ServerStatus {
    pub status: String,
    pub time: DateTime<Utc>,
    pub version: String,
    /// Number of configured backends.
    pub backends: u64,
}

/// `backends` of [`ServerStats`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct BackendCounts {
    pub total: u64,
    pub healthy: u64,
}

/// `GET /api/v1/stats`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ServerStats {
    pub total_connections: u64,
    pub active_connections: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub backends: BackendCounts,
    pub time: DateTime<Utc>,
}

/// Error body `{error, message, code}`: `error` is a short kind (`not_found`), `message` says
/// what is wrong in a sentence, `code` is a stable upper-case identifier (`BACKEND_NOT_FOUND`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ErrorBody {
    pub error: String,
    pub message: String,
    pub code: String,
}

/// Per-backend counters.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct BackendStats {
    pub active_connections: u64,
    pub total_connections: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

/// `GET /api/v1/backends/{name}/stats`: [`BackendStats`] plus errors and average connect latency.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct BackendStatsDetail {
    pub active_connections: u64,
    pub total_connections: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Failed connection attempts through this backend.
    pub errors: u64,
    /// Average connect latency in milliseconds.
    pub latency_ms: u64,
}

/// A backend as listed by `GET /api/v1/backends`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Backend {
    pub name: String,
    /// `direct`, `wireguard`, `openvpn`, `httpproxy`, `socks5`, or a provider's name
    /// (`nordvpn`, `mullvad`, `privateinternetaccess`, `protonvpn`)
    #[serde(rename = "type")]
    pub kind: String,
    pub healthy: bool,
    pub stats: BackendStats,
    /// Why the backend cannot carry traffic, or a problem it works around (provider list
    /// refresh failed, last good list in use).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Provider backends: what the backend resolved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderResolution>,
}

/// What a provider backend resolved to (`provider` of [`Backend`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ProviderResolution {
    /// `nordvpn`, `mullvad`, `privateinternetaccess` or `protonvpn`
    pub provider: String,
    /// `wireguard` or `openvpn`; absent while unresolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// The chosen server's identifier and host name, country, city and load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub country: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub city: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<u32>,
    /// WireGuard `host:port` or OpenVPN `remote:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<DateTime<Utc>>,
    /// When the server list in use was fetched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list_fetched_at: Option<DateTime<Utc>>,
    /// PIA port forwarding: the forwarded port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarded_port: Option<u16>,
    /// The generated `wireguard` or `openvpn` settings object, secrets masked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub settings: Option<serde_json::Value>,
}

/// One server list in the answer of the provider refresh endpoints.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ProviderListStatus {
    pub provider: String,
    /// Servers in the list in use (the last good one when the refresh failed).
    pub servers: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetched_at: Option<DateTime<Utc>>,
    /// Why the refresh failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `POST /api/v1/providers/refresh` and `/api/v1/providers/{provider}/refresh` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ProviderRefreshResult {
    /// `refreshed`, or `failed` when any list could not be fetched.
    pub status: String,
    pub lists: Vec<ProviderListStatus>,
    pub time: DateTime<Utc>,
}

/// Connection settings of `httpproxy` and `socks5` backends.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSettings {
    /// `host:port`
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

/// Connection settings of a `wireguard` backend (user-space WireGuard on the data plane).
/// Only documents the shape: the object travels as given and the configuration checks it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WireguardSettings {
    /// This side's X25519 private key, base64 (`wg genkey`). Masked in `GET /api/v1/config`.
    pub private_key: String,
    /// Interface address(es) inside the tunnel (`10.66.0.2/32`, or a list); flows leave from
    /// the first one of the destination's family.
    #[schema(value_type = Vec<String>)]
    pub address: serde_json::Value,
    /// The peer's public key, base64.
    pub public_key: String,
    /// The peer's UDP endpoint `host:port`; a name is resolved again when the tunnel restarts.
    pub endpoint: String,
    /// Destinations sent into the tunnel (CIDRs); default `0.0.0.0/0` and `::/0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_ips: Option<Vec<String>>,
    /// Optional preshared key, base64. Masked in `GET /api/v1/config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preshared_key: Option<String>,
    /// Keepalive interval in seconds; 0 (default) = off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_keepalive: Option<u16>,
    /// Tunnel MTU, default 1420.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u16>,
    /// DNS servers reached through the tunnel for destination names; empty = the host resolves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Vec<String>>,
}

/// Connection settings of an `openvpn` backend: a managed `openvpn` process whose TUN device
/// carries the backend's connections. Either `config_file` or `remote` (inline settings).
/// Only documents the shape: the object travels as given and the configuration checks it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenvpnSettings {
    /// Path of an OpenVPN client file (`.ovpn`); its relative paths are relative to it. Excludes
    /// the inline connection keys (`remote` … `peer_fingerprint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_file: Option<String>,
    /// Server host name or address (required without `config_file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    /// Server port, default 1194.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// `udp` (default) or `tcp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proto: Option<String>,
    /// CA certificate: PEM text or a file path (this holds for every PEM field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    /// Client certificate, PEM text or path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    /// Client private key, PEM text or path. Masked in `GET /api/v1/config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `tls-crypt` key, PEM text or path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_crypt: Option<String>,
    /// `tls-auth` key, PEM text or path (not with `tls_crypt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_auth: Option<String>,
    /// `key-direction` of `tls_auth`: 0 or 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_direction: Option<u8>,
    /// SHA-256 fingerprint(s) of the server certificate (`AB:CD:…`, several separated by
    /// commas): OpenVPN 2.6's self-signed mode instead of `ca`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_fingerprint: Option<String>,
    /// `auth-user-pass` user name (written with the password to a 0600 file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// `auth-user-pass` password. Masked in `GET /api/v1/config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// `data-ciphers`, in order of preference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_ciphers: Option<Vec<String>>,
    /// Extra directive lines. Scripts, plugins and the options switchyard manages (device,
    /// management, routes, logging) are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<Vec<String>>,
}

/// `POST /api/v1/backends` body. The settings object is named after the type.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackendCreate {
    pub name: String,
    /// `direct`, `wireguard`, `openvpn`, `httpproxy` (or `http_proxy`), `socks5` (or `socks5_proxy`)
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default = "default_true")]
    pub enabled: bool,
    #[serde(default, alias = "http_proxy", skip_serializing_if = "Option::is_none")]
    pub httpproxy: Option<UpstreamSettings>,
    #[serde(
        default,
        alias = "socks5_proxy",
        skip_serializing_if = "Option::is_none"
    )]
    pub socks5: Option<UpstreamSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub direct: Option<serde_json::Value>,
    /// Settings of a `wireguard` backend (checked by the configuration's validation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<WireguardSettings>)]
    pub wireguard: Option<serde_json::Value>,
    /// Settings of an `openvpn` backend (checked by the configuration's validation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<OpenvpnSettings>)]
    pub openvpn: Option<serde_json::Value>,
    /// Options of a provider backend (`type` `nordvpn`, `mullvad`, `privateinternetaccess` or
    /// `pia`, `protonvpn`): `country` (required), `city`, `protocol`, `auto_select`, and the
    /// provider's own keys; see the README section "Provider backends".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub config: Option<serde_json::Value>,
    /// Active health checks of the backend (any type); missing keys come from
    /// `server.health_check`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<HealthCheckSettings>)]
    pub health_check: Option<serde_json::Value>,
}

/// A backend's `health_check` object (shape only: the configuration reads and checks it).
/// Each check opens a real connection through the backend to `target`, as
/// `POST /api/v1/backends/{name}/test` does.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckSettings {
    /// Default true when the object is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Duration string, at least `1s`; default `server.health_check.interval` (10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    /// Duration string, shorter than `interval`; default `server.health_check.timeout` (5s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// `host:port`; default `server.health_check.target`, else `api.backend_test_target`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Consecutive failed checks that take the backend out (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_after: Option<u32>,
    /// Consecutive passed checks that bring it back (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_after: Option<u32>,
}

fn default_true() -> bool {
    true
}

/// `201` answer of `POST /api/v1/backends`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct BackendCreated {
    pub status: String,
    pub backend: String,
    #[serde(rename = "type")]
    pub kind: String,
}

/// `DELETE /api/v1/backends/{name}` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct BackendDeleted {
    pub status: String,
    pub backend: String,
}

/// `POST /api/v1/backends/{name}/test` body (optional).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct BackendTestRequest {
    /// `host:port`; default from `api.backend_test_target`.
    #[serde(default)]
    pub target: Option<String>,
    /// Duration string, default `10s`.
    #[serde(default)]
    pub timeout: Option<String>,
}

/// `POST /api/v1/backends/{name}/test` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct BackendTestResult {
    /// `ok` or `failed`
    pub status: String,
    pub backend: String,
    pub target: String,
    /// Duration string of the connection attempt.
    pub duration: String,
    pub healthy: bool,
    /// Why the attempt failed (absent on success).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A route as listed by `GET /api/v1/routes`: either `backend` or `backends` is present.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Route {
    pub name: String,
    pub domains: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backends: Option<Vec<String>>,
    pub enabled: bool,
    pub priority: i32,
}

/// `POST /api/v1/routes` body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteCreate {
    pub name: String,
    pub domains: Vec<String>,
    #[serde(default)]
    pub backend: Option<String>,
    #[serde(default)]
    pub backends: Option<Vec<String>>,
    #[serde(default = "default_true")]
    pub enabled: bool,
    #[serde(default)]
    pub priority: i32,
    /// `round_robin` (default) or `least_conn`
    #[serde(default)]
    pub load_balance: Option<String>,
}

/// `201` answer of `POST /api/v1/routes`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct RouteCreated {
    pub status: String,
    pub route: String,
    pub domains: Vec<String>,
    /// The backend, or the backends joined with commas.
    pub backend: String,
}

/// `GET /api/v1/routes/test?domain=` answer (not in the spec; the server's counterpart of the
/// client's route test): the route the running data plane gives the host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct RouteTest {
    pub domain: String,
    /// `routed`, or `refused` when no route matches (the proxy answers 403).
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_route: Option<String>,
    /// The route's backends (its load-balancing policy picks one per connection).
    pub backends: Vec<String>,
}

/// `DELETE /api/v1/routes/{name}` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct RouteDeleted {
    pub status: String,
    pub route: String,
}

/// One entry of the request log.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct RequestLogEntry {
    pub id: u64,
    pub timestamp: DateTime<Utc>,
    pub method: String,
    pub host: String,
    pub path: String,
    pub url: String,
    pub user_agent: String,
    pub client_ip: String,
    pub username: String,
    pub backend: String,
    pub status_code: u16,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    pub duration_ms: u64,
    pub error: String,
    /// `HTTP`, `CONNECT` or `SOCKS5`
    pub protocol: String,
}

/// `GET /api/v1/requests`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct RequestLogList {
    pub enabled: bool,
    pub requests: Vec<RequestLogEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct HostCount {
    pub host: String,
    pub count: u64,
}

/// `GET /api/v1/requests/stats`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct RequestLogStats {
    pub enabled: bool,
    pub count: u64,
    pub max_size: u64,
    pub total_requests: u64,
    pub total_bytes_sent: u64,
    pub total_bytes_recv: u64,
    pub requests_by_method: BTreeMap<String, u64>,
    pub requests_by_status: BTreeMap<String, u64>,
    pub top_hosts: Vec<HostCount>,
}

/// A plain `{message}` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct Message {
    pub message: String,
}

/// `{message, time}` answer (config reload).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct MessageWithTime {
    pub message: String,
    pub time: DateTime<Utc>,
}

/// A live proxied connection.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct Connection {
    pub id: String,
    pub client_ip: String,
    pub client_port: String,
    /// `host:port`
    pub host: String,
    pub backend: String,
    /// `HTTP`, `CONNECT` or `SOCKS5`
    pub protocol: String,
    pub start_time: DateTime<Utc>,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
}

/// `GET /api/v1/connections`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ConnectionList {
    pub connections: Vec<Connection>,
    pub count: u64,
    pub time: DateTime<Utc>,
}

/// A client with live connections.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ConnectedClient {
    pub client_ip: String,
    pub connections: u64,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    pub first_seen: DateTime<Utc>,
}

/// `GET /api/v1/connections/clients`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct ClientList {
    pub clients: Vec<ConnectedClient>,
    pub count: u64,
    pub time: DateTime<Utc>,
}

/// One entry of `GET /api/v1/config/meta`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ConfigSectionMeta {
    pub section: String,
    pub hot_reloadable: bool,
    pub description: String,
}

/// `{section, field, message}` of a save result.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct FieldError {
    pub section: String,
    pub field: String,
    pub message: String,
}

/// `PUT /api/v1/config` body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfigSaveRequest {
    /// A complete server configuration (the shape of `GET /api/v1/config/full`).
    #[schema(value_type = Object)]
    pub config: serde_json::Value,
    #[serde(default)]
    pub create_backup: bool,
}

/// `PUT /api/v1/config` answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ConfigSaveResult {
    pub success: bool,
    pub message: String,
    pub changed_sections: Vec<String>,
    pub hot_reloaded_sections: Vec<String>,
    pub restart_required_sections: Vec<String>,
    pub requires_restart: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_path: Option<String>,
    pub errors: Vec<FieldError>,
}

/// `{section, message}` of a validation result.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ValidationError {
    pub section: String,
    pub message: String,
}

/// `POST /api/v1/config/validate` answer (also the body of a refused save).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct ValidationResult {
    pub valid: bool,
    pub errors: Vec<ValidationError>,
    pub warnings: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct PluginAvailability {
    /// `available`, `build_disabled` or `unimplemented`
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct AuthPlugin {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub description: String,
    pub availability: PluginAvailability,
}

/// `GET /api/v1/auth/plugins`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct AuthPluginList {
    pub plugins: Vec<AuthPlugin>,
}

/// `POST /api/v1/login` body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    pub token: String,
}

/// WebSocket event envelope on `/api/v1/ws`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct EventEnvelope {
    /// `backend.health`, `connection.new`, `connection.close`, `config.reload`, `config.saved`,
    /// `stats.update`
    #[serde(rename = "type")]
    pub kind: String,
    pub timestamp: DateTime<Utc>,
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_field_names() {
        let s = ServerStats {
            total_connections: 1,
            active_connections: 2,
            bytes_sent: 3,
            bytes_received: 4,
            backends: BackendCounts {
                total: 1,
                healthy: 1,
            },
            time: DateTime::from_timestamp(0, 0).unwrap_or_default(),
        };
        let v = serde_json::to_value(&s).unwrap_or_default();
        for key in [
            "total_connections",
            "active_connections",
            "bytes_sent",
            "bytes_received",
            "backends",
            "time",
        ] {
            assert!(v.get(key).is_some(), "{key}");
        }
        assert_eq!(v["backends"]["healthy"], 1);
    }

    #[test]
    fn backend_create_accepts_both_spellings_and_rejects_unknown_fields() {
        let a: BackendCreate = serde_json::from_str(
            r#"{"name":"u","type":"httpproxy","http_proxy":{"address":"h:1"}}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.httpproxy.map(|s| s.address), Some("h:1".into()));
        assert!(a.enabled);
        assert!(
            serde_json::from_str::<BackendCreate>(r#"{"name":"u","type":"direct","x":1}"#).is_err()
        );
    }

    #[test]
    fn route_lists_backend_or_backends() {
        let r = Route {
            name: "r".into(),
            domains: vec!["*".into()],
            backend: Some("direct".into()),
            backends: None,
            enabled: true,
            priority: 0,
        };
        let v = serde_json::to_value(&r).unwrap_or_default();
        assert!(v.get("backends").is_none());
        assert_eq!(v["backend"], "direct");
    }
}

/// Sizes of one cache tier (`memory` / `disk` of [`CacheStats`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct CacheTierStats {
    pub entries: u64,
    pub size_bytes: u64,
    pub max_size_bytes: u64,
}

/// `GET /api/v1/cache/stats`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct CacheStats {
    pub enabled: bool,
    /// Hits / (hits + misses), 0 when nothing was asked yet.
    pub hit_rate: f64,
    pub total_requests: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// `memory`, `disk` or `tiered`.
    pub storage_type: String,
    pub rules_count: u64,
    pub memory: CacheTierStats,
    pub disk: CacheTierStats,
    /// Entries that could not be stored (disk full, unwritable directory, …).
    pub store_errors: u64,
    pub evictions: u64,
}

/// One stored response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct CacheEntry {
    pub key: String,
    pub url: String,
    pub host: String,
    /// Body bytes.
    pub size: u64,
    pub content_type: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// `memory` or `disk`.
    pub tier: String,
}

/// `GET /api/v1/cache/entries`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct CacheEntryList {
    pub entries: Vec<CacheEntry>,
    pub total: u64,
    pub offset: u64,
    pub limit: u64,
}

/// `DELETE /api/v1/cache/entries/{key}`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct CacheEntryDeleted {
    pub message: String,
    pub key: String,
}

/// `DELETE /api/v1/cache/domain/{domain}`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct CacheDomainDeleted {
    pub message: String,
    pub domain: String,
    pub deleted: u64,
}

/// A cache rule as the API shows it. `ttl` is a duration string (`8760h0m0s`); `preset` is set
/// when the rule comes from an enabled preset.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct CacheRule {
    pub name: String,
    pub domains: Vec<String>,
    pub enabled: bool,
    pub ttl: String,
    pub priority: i32,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub preset: Option<String>,
    pub ignore_query: bool,
    pub content_types: Vec<String>,
    pub respect_cache_control: bool,
    pub methods: Vec<String>,
    /// Largest cacheable body (size string); `0` is unlimited.
    pub max_size: String,
}

/// `GET /api/v1/cache/rules`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct CacheRuleList {
    pub rules: Vec<CacheRule>,
    pub count: u64,
}

/// `POST /api/v1/cache/rules` (omitted options take the config defaults) and
/// `PUT /api/v1/cache/rules/{name}` (every field optional; only those given change).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheRuleInput {
    pub name: Option<String>,
    pub domains: Option<Vec<String>>,
    pub enabled: Option<bool>,
    /// Duration string (`168h`, `30d`) or nanoseconds.
    #[schema(value_type = Option<String>)]
    pub ttl: Option<serde_json::Value>,
    pub priority: Option<i32>,
    pub ignore_query: Option<bool>,
    pub content_types: Option<Vec<String>>,
    pub respect_cache_control: Option<bool>,
    pub methods: Option<Vec<String>>,
    /// Size string (`2GB`) or bytes.
    #[schema(value_type = Option<String>)]
    pub max_size: Option<serde_json::Value>,
}

/// `{message, rule}` after a rule was created or changed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct CacheRuleSaved {
    pub message: String,
    pub rule: CacheRule,
}

/// `DELETE /api/v1/cache/rules/{name}`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct CacheRuleDeleted {
    pub message: String,
    pub rule: String,
}

/// A built-in preset; `enabled` says whether `cache.presets` lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct CachePreset {
    pub name: String,
    pub description: String,
    pub domains: Vec<String>,
    pub ttl: String,
    pub priority: i32,
    pub enabled: bool,
}

/// `GET /api/v1/cache/presets`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct CachePresetList {
    pub presets: Vec<CachePreset>,
    pub count: u64,
}

/// `POST /api/v1/cache/presets/{name}` body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CachePresetToggle {
    pub enabled: bool,
}

/// `{message, preset}` after a preset was enabled or disabled.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema)]
pub struct CachePresetChanged {
    pub message: String,
    pub preset: String,
    pub enabled: bool,
}
