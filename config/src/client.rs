//! Configuration of `switchyard client`, the user-side agent: local HTTP and SOCKS5 proxies, the
//! server list, client routes (`direct` | `server`), the client API and web UI listeners, the
//! VPN and mesh sections (their features come with later issues; their keys are here so a
//! configuration can carry them), the local HTTP cache and logging.
//!
//! Same loading rules as the server configuration: `${NAME}` expansion, strict YAML (unknown keys
//! are errors naming their path), defaults for every missing key. Field names equal the YAML keys,
//! so the JSON of a [`ClientConfig`] (as `GET /api/v1/config` returns it) can be edited and sent
//! back. Durations are Go-style strings both ways; a bare number on input is nanoseconds.
//! `config/examples/client.yaml` documents every key. [`validate_client`] reports semantic
//! problems; [`restart_fields`] names the changed keys that only apply after a restart.

use serde::{Deserialize, Serialize};

use crate::cache::CacheConfig;
use crate::listen::parse_listen;
use crate::model::{null_default, LoggingConfig};
use crate::units::Duration;
use crate::validate::{check_domain_pattern, check_host_port, Problem};

/// The whole `switchyard client` configuration file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientConfig {
    #[serde(deserialize_with = "null_default")]
    pub proxy: ClientProxyConfig,
    /// How the client talks to its servers (timeouts, probing, auto-connect).
    #[serde(deserialize_with = "null_default")]
    pub server: ServerConnectionConfig,
    /// The servers the client can use; one is selected at a time.
    #[serde(deserialize_with = "null_default")]
    pub servers: Vec<ClientServerConfig>,
    #[serde(deserialize_with = "null_default")]
    pub routing: RoutingConfig,
    #[serde(deserialize_with = "null_default")]
    pub api: ClientApiConfig,
    #[serde(deserialize_with = "null_default")]
    pub web_ui: WebUiConfig,
    #[serde(deserialize_with = "null_default")]
    pub vpn: VpnConfig,
    #[serde(deserialize_with = "null_default")]
    pub mesh: MeshConfig,
    #[serde(deserialize_with = "null_default")]
    pub cache: CacheConfig,
    #[serde(deserialize_with = "null_default")]
    pub logging: LoggingConfig,
}

crate::load::strict_yaml_entry_points!(ClientConfig);

/// `proxy:` — the local listeners.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientProxyConfig {
    pub http: ProxyListenerConfig,
    pub socks5: ProxyListenerConfig,
    /// Data-plane cores (0 = every CPU this process may use).
    pub cores: usize,
    pub read_timeout: Duration,
    pub write_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Default for ClientProxyConfig {
    fn default() -> Self {
        ClientProxyConfig {
            http: ProxyListenerConfig {
                enabled: true,
                listen: "127.0.0.1:7380".into(),
            },
            socks5: ProxyListenerConfig {
                enabled: true,
                listen: "127.0.0.1:7381".into(),
            },
            cores: 1,
            read_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(120),
            idle_timeout: Duration::from_secs(120),
        }
    }
}

/// One local listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyListenerConfig {
    pub enabled: bool,
    pub listen: String,
}

impl Default for ProxyListenerConfig {
    fn default() -> Self {
        ProxyListenerConfig {
            enabled: true,
            listen: String::new(),
        }
    }
}

/// `server:` — the connection to the selected server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConnectionConfig {
    /// Connect to the selected server at start (otherwise everything goes `direct` until
    /// `POST /api/v1/connect`).
    pub auto_connect: bool,
    /// Dial timeout towards a server.
    pub connect_timeout: Duration,
    /// How often every listed server is probed (latency and reachability).
    pub probe_interval: Duration,
    /// A probe slower than this marks the server `busy`.
    pub busy_latency: Duration,
}

impl Default for ServerConnectionConfig {
    fn default() -> Self {
        ServerConnectionConfig {
            auto_connect: true,
            connect_timeout: Duration::from_secs(10),
            probe_interval: Duration::from_secs(10),
            busy_latency: Duration::from_secs(1),
        }
    }
}

/// Protocol the client speaks to a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum ServerProtocol {
    /// HTTP proxy (CONNECT tunnels).
    #[default]
    #[serde(rename = "HTTP", alias = "http")]
    Http,
    #[serde(rename = "SOCKS5", alias = "socks5")]
    Socks5,
    /// The server's QUIC listener (`server.quic.listen`): one connection carries every flow.
    #[serde(rename = "QUIC", alias = "quic")]
    Quic,
}

impl ServerProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            ServerProtocol::Http => "HTTP",
            ServerProtocol::Socks5 => "SOCKS5",
            ServerProtocol::Quic => "QUIC",
        }
    }
}

/// One entry of `servers:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientServerConfig {
    pub name: String,
    /// Stable identifier for `POST /api/v1/servers/{id}/select`; defaults to `name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `host:port` of the server's HTTP proxy or SOCKS5 listener.
    pub address: String,
    pub protocol: ServerProtocol,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Selected at start when no other selection is stored.
    pub is_default: bool,
    /// QUIC: the SHA-256 fingerprint (hex, colons allowed) of the server's certificate, as the
    /// server prints it. Required for `protocol: QUIC` (the connection is pinned to it).
    #[serde(skip_serializing_if = "Option::is_none", alias = "pin_sha256")]
    pub fingerprint: Option<String>,
    /// QUIC: the server's `server.quic.token`, presented instead of (or with) the credentials.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// QUIC: where flows go when the QUIC handshake fails (UDP blocked): the server's HTTP or
    /// SOCKS5 proxy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<ServerFallback>,
}

/// `servers[].fallback:` — a TCP proxy of the same server used while QUIC cannot connect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerFallback {
    /// `host:port` of the server's HTTP proxy or SOCKS5 listener.
    pub address: String,
    /// `HTTP` or `SOCKS5`.
    pub protocol: ServerProtocol,
}

impl Default for ClientServerConfig {
    fn default() -> Self {
        ClientServerConfig {
            name: String::new(),
            id: None,
            address: String::new(),
            protocol: ServerProtocol::Http,
            username: None,
            password: None,
            is_default: false,
            fingerprint: None,
            token: None,
            fallback: None,
        }
    }
}

impl ClientServerConfig {
    /// The id used in API paths: `id` when given, else `name`.
    pub fn id(&self) -> &str {
        self.id.as_deref().unwrap_or(&self.name)
    }
}

/// Where a destination goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteAction {
    Direct,
    #[default]
    Server,
}

impl RouteAction {
    pub fn as_str(self) -> &'static str {
        match self {
            RouteAction::Direct => "direct",
            RouteAction::Server => "server",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "direct" => Some(RouteAction::Direct),
            "server" => Some(RouteAction::Server),
            _ => None,
        }
    }
}

/// What destinations whose route says `server` get while no server is connected (the client
/// never connected, or after `POST /api/v1/disconnect`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WhenDisconnected {
    /// They go direct (fail open; the default, the client's behaviour before the switch).
    #[default]
    Direct,
    /// They are refused (fail closed: the kill switch); `direct` routes keep working.
    Block,
}

/// `routing:`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoutingConfig {
    /// Action for destinations no route matches (default `server`).
    pub default_action: RouteAction,
    /// `direct` (default) or `block`: see [`WhenDisconnected`].
    pub when_disconnected: WhenDisconnected,
    #[serde(deserialize_with = "null_default")]
    pub routes: Vec<ClientRouteConfig>,
}

/// One client route.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientRouteConfig {
    pub name: String,
    /// Domain patterns (exact, `*.name`, `cdn*.name`, `*`).
    pub patterns: Vec<String>,
    pub action: RouteAction,
    /// Higher first; equal priority keeps list order.
    pub priority: i32,
}

/// `api:` — the client API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientApiConfig {
    pub enabled: bool,
    pub listen: String,
    /// When set, every endpoint but `GET /api/v1/health` needs it (Bearer header, `token`
    /// query or the session cookie of `POST /api/v1/login`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Host names and origins the API and web UI accept besides IP literals, `localhost` and
    /// same-origin pages (the server's `api.allowed_origins` rules); applied with the
    /// configuration.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_origins: Vec<String>,
}

impl Default for ClientApiConfig {
    fn default() -> Self {
        ClientApiConfig {
            enabled: true,
            listen: "127.0.0.1:7383".into(),
            token: None,
            allowed_origins: Vec::new(),
        }
    }
}

/// `web_ui:` — the client web UI (`control/src/web_ui/client.rs`), off by default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebUiConfig {
    pub enabled: bool,
    pub listen: String,
}

impl Default for WebUiConfig {
    fn default() -> Self {
        WebUiConfig {
            enabled: false,
            listen: "127.0.0.1:7384".into(),
        }
    }
}

/// `vpn:` — TUN mode with split tunnelling and DNS interception (issue 12).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VpnConfig {
    pub enabled: bool,
    /// `tun`.
    pub mode: String,
    pub interface_name: String,
    pub mtu: u32,
    pub tun: VpnTunConfig,
    pub dns: VpnDnsConfig,
    pub split: VpnSplitConfig,
    /// Linux: the cgroup v2 directory whose processes the split tunnel classifies (absolute, or
    /// relative to the cgroup2 mount); empty = the whole cgroup2 hierarchy. Not in the spec.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub scope_cgroup: String,
    /// Linux: `auto` (eBPF, else the nftables fallback), `ebpf` or `nftables`; empty = `auto`.
    /// Not in the spec.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub classifier: String,
    /// Linux, eBPF classifier: tunnelled TCP goes from `connect(2)` straight to the data
    /// plane's loopback listener, past the TUN (the TUN still carries UDP and ping); `false`
    /// carries TCP through the TUN too. Not in the spec.
    pub tcp_redirect: bool,
    /// Linux (issue 36): the split tunnel's routing, marks and classifier stay installed when
    /// the client exits or is killed — tunnelled apps have no network (not the direct one) until
    /// the client is back or `switchyard client vpn-unlock` runs. Not in the spec.
    pub lockdown: bool,
}

impl Default for VpnConfig {
    fn default() -> Self {
        VpnConfig {
            enabled: false,
            mode: "tun".into(),
            interface_name: "switchyard0".into(),
            mtu: 1420,
            tun: VpnTunConfig::default(),
            dns: VpnDnsConfig::default(),
            split: VpnSplitConfig::default(),
            scope_cgroup: String::new(),
            classifier: String::new(),
            tcp_redirect: true,
            lockdown: false,
        }
    }
}

/// `vpn.tun:` — the TUN device's addresses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VpnTunConfig {
    /// Address of the device, CIDR form.
    pub address: String,
    pub gateway: String,
    /// The device's IPv6 address (CIDR form, a unique local address by default): IPv6 flows
    /// are carried like IPv4 ones. Empty: no IPv6 through the tunnel (tunnelled IPv6 is
    /// refused, never sent outside it).
    pub address6: String,
    pub gateway6: String,
}

impl Default for VpnTunConfig {
    fn default() -> Self {
        VpnTunConfig {
            address: "10.255.0.2/24".into(),
            gateway: "10.255.0.1".into(),
            address6: "fd7a:5359:5400::2/64".into(),
            gateway6: "fd7a:5359:5400::1".into(),
        }
    }
}

/// `vpn.dns:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VpnDnsConfig {
    pub enabled: bool,
    pub servers: Vec<String>,
    pub cache_ttl: Duration,
    pub intercept_port: u16,
}

impl Default for VpnDnsConfig {
    fn default() -> Self {
        VpnDnsConfig {
            enabled: true,
            servers: Vec::new(),
            cache_ttl: Duration::from_secs(300),
            intercept_port: 53,
        }
    }
}

/// `exclude`: everything uses the VPN except matches; `include`: only matches do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitMode {
    #[default]
    Exclude,
    Include,
}

impl SplitMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SplitMode::Exclude => "exclude",
            SplitMode::Include => "include",
        }
    }
}

/// `vpn.split:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VpnSplitConfig {
    pub mode: SplitMode,
    pub apps: Vec<SplitApp>,
    pub domains: Vec<String>,
    pub ips: Vec<String>,
    pub always_bypass: Vec<String>,
    /// The directly connected networks never go into the tunnel (true); false tunnels them like
    /// any other destination (an untrusted LAN), the server's own addresses still excepted. Not
    /// in the spec.
    pub allow_lan: bool,
}

impl Default for VpnSplitConfig {
    fn default() -> Self {
        VpnSplitConfig {
            mode: SplitMode::default(),
            apps: Vec::new(),
            domains: Vec::new(),
            ips: Vec::new(),
            always_bypass: Vec::new(),
            allow_lan: true,
        }
    }
}

/// One app of `vpn.split.apps`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SplitApp {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bundle_id: Option<String>,
    /// Linux: every process of this cgroup v2 directory (absolute, or relative to the cgroup2
    /// mount) is the app. Not in the spec.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
}

/// `mesh:` — the mesh peer (issue 13). Disabled by default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshConfig {
    pub enabled: bool,
    pub network_id: String,
    pub network_cidr: String,
    pub peer_name: String,
    pub device: MeshDeviceConfig,
    pub discovery: MeshDiscoveryConfig,
    pub stun: MeshStunConfig,
    pub turn: MeshTurnConfig,
    pub connection: MeshConnectionConfig,
    pub routing: MeshRoutingConfig,
}

impl Default for MeshConfig {
    fn default() -> Self {
        MeshConfig {
            enabled: false,
            network_id: String::new(),
            network_cidr: "10.100.0.0/24".into(),
            peer_name: String::new(),
            device: MeshDeviceConfig::default(),
            discovery: MeshDiscoveryConfig::default(),
            stun: MeshStunConfig::default(),
            turn: MeshTurnConfig::default(),
            connection: MeshConnectionConfig::default(),
            routing: MeshRoutingConfig::default(),
        }
    }
}

/// `mesh.device:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshDeviceConfig {
    /// `tun` (layer 3) or `tap` (layer 2).
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    pub mtu: u32,
    /// Generated when empty.
    pub mac_address: String,
}

impl Default for MeshDeviceConfig {
    fn default() -> Self {
        MeshDeviceConfig {
            kind: "tun".into(),
            name: "symesh0".into(),
            mtu: 1400,
            mac_address: String::new(),
        }
    }
}

/// `mesh.discovery:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshDiscoveryConfig {
    /// Discovery (registry) server: the server's management API, `https://host:port` or
    /// `http://host:port` (`host:port` is read as http). Plain http is refused off loopback
    /// unless `insecure` is true: it would carry the peer's credential in clear text.
    pub server: String,
    /// The server API's token (`api.token` of the server), for a peer the registry's admin
    /// runs: every registry call carries it. Members use `enrollment_key` instead. Secret:
    /// masked in GET /api/v1/config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// An enrollment key of the network (`POST /api/v1/mesh/networks/{id}/enrollment-keys`
    /// on the server), used for the first registration only: the registry's answer carries
    /// the peer's own credential, kept (mode 0600) as `mesh.peer-token` in the data
    /// directory and used from then on. Secret: masked in GET /api/v1/config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enrollment_key: Option<String>,
    /// Allows a plain `http://` registry that is not on loopback (credentials in clear text).
    pub insecure: bool,
    /// SHA-256 fingerprint of an `https://` registry's certificate (the QUIC transport's form:
    /// 64 hex digits, colons allowed). When set, that certificate is the only one accepted (a
    /// self-signed one works; no CA check); when absent, the system's CA roots decide. The
    /// REST calls and the event stream (wss://) are checked alike.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    pub heartbeat_interval: Duration,
    pub peer_timeout: Duration,
}

impl Default for MeshDiscoveryConfig {
    fn default() -> Self {
        MeshDiscoveryConfig {
            server: String::new(),
            token: None,
            enrollment_key: None,
            insecure: false,
            fingerprint: None,
            heartbeat_interval: Duration::from_secs(30),
            peer_timeout: Duration::from_secs(120),
        }
    }
}

/// `mesh.stun:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshStunConfig {
    /// `stun:host:port` URLs.
    pub servers: Vec<String>,
    pub timeout: Duration,
}

impl Default for MeshStunConfig {
    fn default() -> Self {
        MeshStunConfig {
            servers: Vec::new(),
            timeout: Duration::from_secs(5),
        }
    }
}

/// `mesh.turn:`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshTurnConfig {
    pub servers: Vec<TurnServer>,
}

/// One TURN relay.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TurnServer {
    pub url: String,
    pub username: String,
    pub password: String,
}

/// `mesh.connection:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshConnectionConfig {
    pub direct_connect: bool,
    pub relay_enabled: bool,
    pub relay_via_peers: bool,
    pub connect_timeout: Duration,
    /// The spec's key tables spell it both ways; `keepalive_interval` is read too.
    #[serde(alias = "keepalive_interval")]
    pub keep_alive_interval: Duration,
    /// UDP port of the mesh socket; 0 = pick one on the first start and keep it (saved in the
    /// data directory) across restarts.
    pub listen_port: u16,
    /// The network's pre-shared key (base64 of 32 bytes, the WireGuard PSK), every peer of
    /// the network the same; empty = none. Secret: masked in GET /api/v1/config.
    pub preshared_key: String,
}

impl Default for MeshConnectionConfig {
    fn default() -> Self {
        MeshConnectionConfig {
            direct_connect: true,
            relay_enabled: true,
            relay_via_peers: false,
            connect_timeout: Duration::from_secs(30),
            keep_alive_interval: Duration::from_secs(25),
            listen_port: 0,
            preshared_key: String::new(),
        }
    }
}

/// `mesh.routing:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshRoutingConfig {
    pub max_hops: u32,
    pub route_timeout: Duration,
    pub split_horizon: bool,
}

impl Default for MeshRoutingConfig {
    fn default() -> Self {
        MeshRoutingConfig {
            max_hops: 8,
            route_timeout: Duration::from_secs(300),
            split_horizon: true,
        }
    }
}

/// Keys whose change only applies after a restart (the spec's list).
pub const RESTART_FIELDS: [&str; 8] = [
    "proxy.http.listen",
    "proxy.socks5.listen",
    "web_ui.listen",
    "api.listen",
    "vpn.enabled",
    "vpn.tun",
    "mesh.enabled",
    "mesh.device",
];

/// The restart-requiring keys that differ between `old` and `new`, in [`RESTART_FIELDS`] order.
pub fn restart_fields(old: &ClientConfig, new: &ClientConfig) -> Vec<String> {
    let changed = [
        old.proxy.http.listen != new.proxy.http.listen,
        old.proxy.socks5.listen != new.proxy.socks5.listen,
        old.web_ui.listen != new.web_ui.listen,
        old.api.listen != new.api.listen,
        old.vpn.enabled != new.vpn.enabled,
        old.vpn.tun != new.vpn.tun,
        old.mesh.enabled != new.mesh.enabled,
        old.mesh.device != new.mesh.device,
    ];
    RESTART_FIELDS
        .iter()
        .zip(changed)
        .filter(|(_, c)| *c)
        .map(|(f, _)| f.to_string())
        .collect()
}

/// Applies a partial configuration (a JSON object holding only the keys to change) onto `base`:
/// objects merge key by key, everything else (arrays included) replaces. Unknown keys and wrong
/// types are errors naming the key path.
pub use crate::secrets::MASKED;

/// The configuration as GET /api/v1/config shows it: every secret masked (servers' passwords
/// and tokens, the API token, the mesh's registry token, pre-shared key and TURN passwords).
pub fn masked(cfg: &ClientConfig) -> ClientConfig {
    fn mask(secret: &mut String) {
        if !secret.is_empty() {
            *secret = MASKED.into();
        }
    }
    let mut cfg = cfg.clone();
    let optional = cfg
        .servers
        .iter_mut()
        .flat_map(|s| [&mut s.password, &mut s.token])
        .chain([
            &mut cfg.api.token,
            &mut cfg.mesh.discovery.token,
            &mut cfg.mesh.discovery.enrollment_key,
        ]);
    for secret in optional.flatten() {
        mask(secret);
    }
    mask(&mut cfg.mesh.connection.preshared_key);
    for turn in &mut cfg.mesh.turn.servers {
        mask(&mut turn.password);
    }
    cfg
}

/// Checks that `mesh.discovery.server` protects the credentials it is sent: https, or plain
/// http to a loopback host, or `insecure: true`. Empty (not configured) passes.
pub fn registry_transport(cfg: &MeshDiscoveryConfig) -> Result<(), String> {
    let server = cfg.server.trim();
    if server.is_empty() || cfg.insecure {
        return Ok(());
    }
    let lower = server.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Ok(());
    }
    let rest = lower.strip_prefix("http://").unwrap_or(&lower);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit('@').next().unwrap_or_default();
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host_port.split(':').next().unwrap_or_default(),
    };
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback {
        return Ok(());
    }
    Err(format!(
        "{server:?} is plain HTTP to a host that is not on loopback: the registry credentials \
         and the event stream would cross the network in clear text; use https:// (or set \
         mesh.discovery.insecure: true to accept that)"
    ))
}

/// `mesh.discovery.fingerprint` decoded; `Ok(None)` when absent or empty. A pin needs an
/// `https://` registry (over plain http it would protect nothing).
pub fn registry_pin(cfg: &MeshDiscoveryConfig) -> Result<Option<[u8; 32]>, String> {
    let Some(text) = cfg
        .fingerprint
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
    else {
        return Ok(None);
    };
    let pin = parse_fingerprint(text)?;
    if !cfg
        .server
        .trim()
        .to_ascii_lowercase()
        .starts_with("https://")
    {
        return Err(format!(
            "a certificate pin needs an https:// registry, not {:?}",
            cfg.server.trim()
        ));
    }
    Ok(Some(pin))
}

/// `mesh.connection.preshared_key` decoded; `Ok(None)` when empty.
pub fn mesh_preshared_key(cfg: &MeshConnectionConfig) -> Result<Option<[u8; 32]>, String> {
    use base64::Engine as _;
    let text = cfg.preshared_key.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("not base64: {e}"))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map(Some)
        .map_err(|_| format!("{} bytes, a pre-shared key has 32", bytes.len()))
}

pub fn merge_partial(
    base: &ClientConfig,
    partial: &serde_json::Value,
) -> Result<ClientConfig, String> {
    fn merge(into: &mut serde_json::Value, from: &serde_json::Value) {
        match (into, from) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    match a.get_mut(k) {
                        Some(slot) => merge(slot, v),
                        None => {
                            a.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            // a masked secret sent back unchanged (GET → edit → PUT) keeps its value
            (serde_json::Value::String(_), serde_json::Value::String(v)) if v == MASKED => {}
            // lists replace, with the masked secrets of their entries back (matched by name)
            (slot, v) => {
                let mut v = v.clone();
                crate::secrets::unmask(&mut v, slot);
                *slot = v;
            }
        }
    }
    if !partial.is_object() {
        return Err("the configuration must be a JSON object".into());
    }
    let mut value = serde_json::to_value(base).map_err(|e| e.to_string())?;
    merge(&mut value, partial);
    ClientConfig::from_json_value(&value).map_err(|e| e.to_string())
}

/// Every semantic problem of `cfg`; empty means valid.
/// A SHA-256 fingerprint written as 64 hex digits, optionally separated by colons.
pub fn parse_fingerprint(text: &str) -> Result<[u8; 32], String> {
    let hex: String = text.chars().filter(|c| *c != ':').collect();
    let bad = || format!("`{text}` is not a SHA-256 fingerprint (64 hex digits, colons allowed)");
    if hex.len() != 64 || !hex.is_ascii() {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16)
            .map_err(|_| bad())?;
    }
    Ok(out)
}

pub fn validate_client(cfg: &ClientConfig) -> Vec<Problem> {
    let mut out = Vec::new();
    let mut problem = |field: String, message: String| {
        let section = field
            .split(['.', '['])
            .next()
            .unwrap_or_default()
            .to_string();
        out.push(Problem {
            section,
            field,
            message,
        });
    };
    let listeners = [
        (
            "proxy.http.listen",
            &cfg.proxy.http.listen,
            cfg.proxy.http.enabled,
        ),
        (
            "proxy.socks5.listen",
            &cfg.proxy.socks5.listen,
            cfg.proxy.socks5.enabled,
        ),
        ("api.listen", &cfg.api.listen, cfg.api.enabled),
        ("web_ui.listen", &cfg.web_ui.listen, cfg.web_ui.enabled),
    ];
    let mut bound: Vec<(&str, crate::listen::ListenAddr)> = Vec::new();
    for (field, value, enabled) in listeners {
        match parse_listen(value) {
            Err(e) => problem(field.into(), e.to_string()),
            Ok(addr) if enabled && addr.port != 0 => {
                if let Some((other, _)) = bound.iter().find(|(_, a)| a.port == addr.port) {
                    problem(
                        field.into(),
                        format!("port {} is also used by {other}", addr.port),
                    );
                }
                bound.push((field, addr));
            }
            Ok(_) => {}
        }
    }
    if let Err(errors) = crate::origin::AllowedOrigins::parse(&cfg.api.allowed_origins) {
        for (i, e) in errors {
            let field = match i {
                Some(i) => format!("api.allowed_origins[{i}]"),
                None => "api.allowed_origins".into(),
            };
            problem(field, e.to_string());
        }
    }
    if cfg.server.connect_timeout.is_zero() {
        problem(
            "server.connect_timeout".into(),
            "must be greater than 0".into(),
        );
    }
    if cfg.server.probe_interval.is_zero() {
        problem(
            "server.probe_interval".into(),
            "must be greater than 0".into(),
        );
    }
    let mut names: Vec<&str> = Vec::new();
    let mut ids: Vec<&str> = Vec::new();
    for (i, s) in cfg.servers.iter().enumerate() {
        let base = format!("servers[{i}]");
        if s.name.trim().is_empty() {
            problem(format!("{base}.name"), "a server needs a name".into());
        } else if names.contains(&s.name.as_str()) {
            problem(
                format!("{base}.name"),
                format!("duplicate server name `{}`", s.name),
            );
        }
        names.push(&s.name);
        if ids.contains(&s.id()) && s.id.is_some() {
            problem(
                format!("{base}.id"),
                format!("duplicate server id `{}`", s.id()),
            );
        }
        ids.push(s.id());
        if s.protocol == ServerProtocol::Quic {
            match s.fingerprint.as_deref().map(parse_fingerprint) {
                None => problem(
                    format!("{base}.fingerprint"),
                    "a QUIC server needs the SHA-256 fingerprint of its certificate (the \
                     server prints it at start)"
                        .into(),
                ),
                Some(Err(e)) => problem(format!("{base}.fingerprint"), e),
                Some(Ok(_)) => {}
            }
        }
        if let Some(f) = &s.fallback {
            if f.protocol == ServerProtocol::Quic {
                problem(
                    format!("{base}.fallback.protocol"),
                    "the fallback is a TCP proxy: HTTP or SOCKS5".into(),
                );
            }
            if let Err(e) = check_host_port(&f.address) {
                problem(format!("{base}.fallback.address"), e);
            }
        }
        if let Err(e) = check_host_port(&s.address) {
            problem(format!("{base}.address"), e);
        }
    }
    if cfg.servers.iter().filter(|s| s.is_default).count() > 1 {
        problem(
            "servers".into(),
            "more than one server has is_default: true".into(),
        );
    }
    let mut route_names: Vec<&str> = Vec::new();
    for (i, r) in cfg.routing.routes.iter().enumerate() {
        let base = format!("routing.routes[{i}]");
        if r.name.trim().is_empty() {
            problem(format!("{base}.name"), "a route needs a name".into());
        } else if route_names.contains(&r.name.as_str()) {
            problem(
                format!("{base}.name"),
                format!("duplicate route name `{}`", r.name),
            );
        }
        route_names.push(&r.name);
        if r.patterns.is_empty() {
            problem(
                format!("{base}.patterns"),
                "at least one domain pattern is required (`*` matches all)".into(),
            );
        }
        for (j, p) in r.patterns.iter().enumerate() {
            if let Err(e) = check_domain_pattern(p) {
                problem(format!("{base}.patterns[{j}]"), e);
            }
        }
    }
    if cfg.vpn.mode != "tun" {
        problem(
            "vpn.mode".into(),
            format!("unknown mode {:?} (only `tun`)", cfg.vpn.mode),
        );
    }
    if !matches!(
        cfg.vpn.classifier.as_str(),
        "" | "auto" | "ebpf" | "nftables"
    ) {
        problem(
            "vpn.classifier".into(),
            format!(
                "unknown classifier {:?} (auto, ebpf or nftables)",
                cfg.vpn.classifier
            ),
        );
    }
    if !(576..=65535).contains(&cfg.vpn.mtu) {
        problem("vpn.mtu".into(), "must be between 576 and 65535".into());
    }
    // IPv6 through the tunnel: both addresses, or an empty address6 for none
    let tun6 = &cfg.vpn.tun;
    if !tun6.address6.is_empty() {
        let (ip, prefix) = tun6
            .address6
            .split_once('/')
            .unwrap_or((&tun6.address6, "128"));
        let cidr = ip.trim().parse::<std::net::Ipv6Addr>().is_ok()
            && prefix.trim().parse::<u8>().is_ok_and(|p| p <= 128);
        if !cidr {
            problem(
                "vpn.tun.address6".into(),
                "must be an IPv6 CIDR (or empty for no IPv6)".into(),
            );
        }
        if tun6.gateway6.parse::<std::net::Ipv6Addr>().is_err() {
            problem("vpn.tun.gateway6".into(), "must be an IPv6 address".into());
        }
    }
    if let Err(e) = mesh_preshared_key(&cfg.mesh.connection) {
        problem("mesh.connection.preshared_key".into(), e);
    }
    if let Err(e) = registry_transport(&cfg.mesh.discovery) {
        problem("mesh.discovery.server".into(), e);
    }
    if let Err(e) = registry_pin(&cfg.mesh.discovery) {
        problem("mesh.discovery.fingerprint".into(), e);
    }
    if !matches!(cfg.mesh.device.kind.as_str(), "tun" | "tap") {
        problem(
            "mesh.device.type".into(),
            format!(
                "unknown device type {:?} (`tun` or `tap`)",
                cfg.mesh.device.kind
            ),
        );
    }
    if !crate::model::LOG_LEVELS.contains(&cfg.logging.level.as_str()) {
        problem(
            "logging.level".into(),
            format!(
                "unknown level {:?} (one of {})",
                cfg.logging.level,
                crate::model::LOG_LEVELS.join(", ")
            ),
        );
    }
    out.extend(crate::validate::validate_cache(&cfg.cache));
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_the_default_and_valid() {
        let cfg = ClientConfig::from_yaml_str("", &|_| None).unwrap();
        assert_eq!(cfg, ClientConfig::default());
        assert!(validate_client(&cfg).is_empty());
        assert_eq!(cfg.proxy.http.listen, "127.0.0.1:7380");
        assert_eq!(cfg.api.listen, "127.0.0.1:7383");
    }

    #[test]
    fn durations_are_strings_both_ways_and_numbers_are_nanoseconds() {
        let partial = serde_json::json!({"mesh": {"stun": {"timeout": 1_500_000_000u64},
            "connection": {"keep_alive_interval": "1m30s"}}});
        let cfg = merge_partial(&ClientConfig::default(), &partial).unwrap();
        assert_eq!(cfg.mesh.stun.timeout.as_std().as_millis(), 1500);
        let json = serde_json::to_value(&cfg).unwrap();
        assert_eq!(json["mesh"]["stun"]["timeout"], "1.5s");
        assert_eq!(json["mesh"]["connection"]["keep_alive_interval"], "1m30s");
        assert_eq!(json["vpn"]["dns"]["cache_ttl"], "5m0s");
    }

    #[test]
    fn a_plain_http_registry_is_refused_off_loopback_unless_insecure() {
        let check = |server: &str, insecure: bool| {
            registry_transport(&MeshDiscoveryConfig {
                server: server.into(),
                insecure,
                ..MeshDiscoveryConfig::default()
            })
        };
        for ok in [
            "",
            "https://reg.example",
            "HTTPS://10.0.0.1:7082/",
            "http://127.0.0.1:7082",
            "127.0.0.2:7082",
            "http://localhost:7082/",
            "http://[::1]:7082",
            "http://user@127.0.0.1:1",
        ] {
            assert_eq!(check(ok, false), Ok(()), "{ok}");
        }
        for refused in [
            "http://10.0.0.1:7082",
            "10.0.0.1:7082",
            "http://reg.example",
            "http://[2001:db8::1]:7082",
            "http://127.0.0.1.evil.example:80",
            "http://127.0.0.1@10.0.0.1:80",
        ] {
            assert!(check(refused, false).is_err(), "{refused}");
            assert_eq!(check(refused, true), Ok(()), "{refused} with insecure");
        }
        let mut cfg = ClientConfig::default();
        cfg.mesh.discovery.server = "http://192.0.2.1:7082".into();
        assert!(validate_client(&cfg)
            .iter()
            .any(|p| p.field == "mesh.discovery.server"));
    }

    #[test]
    fn a_registry_pin_is_a_sha256_fingerprint_of_an_https_registry() {
        let check = |server: &str, fingerprint: Option<&str>| {
            registry_pin(&MeshDiscoveryConfig {
                server: server.into(),
                fingerprint: fingerprint.map(str::to_owned),
                ..MeshDiscoveryConfig::default()
            })
        };
        let colons = ["AB"; 32].join(":");
        assert_eq!(check("https://reg.example", None), Ok(None));
        assert_eq!(check("https://reg.example", Some(" ")), Ok(None));
        assert_eq!(
            check("https://reg.example", Some(&colons)),
            Ok(Some([0xab; 32]))
        );
        assert_eq!(
            check("HTTPS://10.0.0.1:7082", Some(&"cd".repeat(32))),
            Ok(Some([0xcd; 32]))
        );
        assert!(check("https://reg.example", Some("abcd")).is_err());
        let plain = check("http://127.0.0.1:7082", Some(&colons)).expect_err("http");
        assert!(plain.contains("https://"), "{plain}");
        let mut cfg = ClientConfig::default();
        cfg.mesh.discovery.server = "https://reg.example".into();
        cfg.mesh.discovery.fingerprint = Some("zz".into());
        let problems = validate_client(&cfg);
        assert!(
            problems
                .iter()
                .any(|p| p.field == "mesh.discovery.fingerprint" && p.message.contains("SHA-256")),
            "{problems:?}"
        );
    }

    #[test]
    fn mesh_secrets_are_masked_and_a_masked_value_sent_back_keeps_the_secret() {
        let mut cfg = ClientConfig::default();
        cfg.mesh.discovery.token = Some("registry-token".into());
        cfg.mesh.discovery.enrollment_key = Some("syek_0".into());
        cfg.mesh.connection.preshared_key = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=".into();
        assert_eq!(
            mesh_preshared_key(&cfg.mesh.connection).unwrap(),
            Some([1; 32])
        );
        let shown = serde_json::to_value(masked(&cfg)).unwrap();
        assert_eq!(shown["mesh"]["discovery"]["token"], MASKED);
        assert_eq!(shown["mesh"]["discovery"]["enrollment_key"], MASKED);
        assert_eq!(shown["mesh"]["connection"]["preshared_key"], MASKED);
        let back = merge_partial(&cfg, &shown).unwrap();
        assert_eq!(back, cfg, "the masked values keep the secrets");
        let changed = merge_partial(
            &cfg,
            &serde_json::json!({"mesh": {"connection": {"preshared_key": "short"}}}),
        )
        .unwrap();
        assert!(validate_client(&changed)
            .iter()
            .any(|p| p.field == "mesh.connection.preshared_key"));
        assert!(validate_client(&cfg).is_empty());
    }

    #[test]
    fn partial_merge_keeps_other_keys_and_names_bad_paths() {
        let base = ClientConfig::default();
        let cfg = merge_partial(
            &base,
            &serde_json::json!({"proxy": {"http": {"listen": "127.0.0.1:9"}}}),
        )
        .unwrap();
        assert_eq!(cfg.proxy.http.listen, "127.0.0.1:9");
        assert_eq!(cfg.proxy.socks5, base.proxy.socks5);
        assert_eq!(restart_fields(&base, &cfg), ["proxy.http.listen"]);
        let err = merge_partial(&base, &serde_json::json!({"proxy": {"htp": {}}})).unwrap_err();
        assert!(err.contains("proxy"), "{err}");
        let err = merge_partial(
            &base,
            &serde_json::json!({"routing": {"default_action": "vpn"}}),
        )
        .unwrap_err();
        assert!(err.contains("routing.default_action"), "{err}");
    }

    #[test]
    fn vpn_lockdown_defaults_to_off() {
        assert!(!ClientConfig::default().vpn.lockdown);
        let cfg = ClientConfig::from_yaml_str("vpn: {lockdown: true}", &|_| None).unwrap();
        assert!(cfg.vpn.lockdown);
    }

    #[test]
    fn when_disconnected_defaults_to_direct_takes_block_and_names_a_bad_value() {
        assert_eq!(
            ClientConfig::default().routing.when_disconnected,
            WhenDisconnected::Direct
        );
        let cfg =
            ClientConfig::from_yaml_str("routing: {when_disconnected: block}", &|_| None).unwrap();
        assert_eq!(cfg.routing.when_disconnected, WhenDisconnected::Block);
        let err = ClientConfig::from_yaml_str("routing: {when_disconnected: drop}", &|_| None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("routing.when_disconnected") && err.contains("block"),
            "{err}"
        );
        let err = merge_partial(
            &ClientConfig::default(),
            &serde_json::json!({"routing": {"when_disconnected": "off"}}),
        )
        .unwrap_err();
        assert!(err.contains("routing.when_disconnected"), "{err}");
    }

    #[test]
    fn validation_reports_bad_patterns_servers_and_duplicates() {
        let yaml = r#"
servers:
  - {name: a, address: "127.0.0.1:7080", is_default: true}
  - {name: a, address: "nope", is_default: true}
routing:
  routes:
    - {name: r, patterns: ["bad pattern"], action: direct}
"#;
        let cfg = ClientConfig::from_yaml_str(yaml, &|_| None).unwrap();
        let fields: Vec<String> = validate_client(&cfg).into_iter().map(|p| p.field).collect();
        assert!(
            fields.contains(&"servers[1].name".to_string()),
            "{fields:?}"
        );
        assert!(
            fields.contains(&"servers[1].address".to_string()),
            "{fields:?}"
        );
        assert!(fields.contains(&"servers".to_string()), "{fields:?}");
        assert!(
            fields.contains(&"routing.routes[0].patterns[0]".to_string()),
            "{fields:?}"
        );
    }

    #[test]
    fn the_tuns_ipv6_addresses_are_checked_unless_ipv6_is_off() {
        let fields = |yaml: &str| -> Vec<String> {
            let cfg = ClientConfig::from_yaml_str(yaml, &|_| None).unwrap();
            validate_client(&cfg).into_iter().map(|p| p.field).collect()
        };
        assert!(fields("{}").is_empty(), "the defaults are valid");
        assert!(fields("vpn: {tun: {address6: ''}}").is_empty());
        assert_eq!(
            fields("vpn: {tun: {address6: 10.0.0.1/24, gateway6: fd00::1}}"),
            ["vpn.tun.address6"]
        );
        assert_eq!(
            fields("vpn: {tun: {address6: 'fd00::2/64', gateway6: 10.0.0.1}}"),
            ["vpn.tun.gateway6"]
        );
    }

    #[test]
    fn quic_servers_need_a_valid_pin_and_a_tcp_fallback() {
        let pin = "AB:".repeat(31) + "AB";
        let yaml = format!(
            "servers: [{{name: q, address: 'h:7443', protocol: QUIC, pin_sha256: '{pin}', \
             token: t, fallback: {{address: 'h:7080', protocol: HTTP}}}}]"
        );
        let cfg = ClientConfig::from_yaml_str(&yaml, &|_| None).unwrap();
        assert!(
            validate_client(&cfg).is_empty(),
            "{:?}",
            validate_client(&cfg)
        );
        assert_eq!(parse_fingerprint(&pin).unwrap(), [0xab; 32]);
        let mut bad = cfg.clone();
        bad.servers[0].fingerprint = None;
        bad.servers[0].fallback = Some(ServerFallback {
            address: "h:1".into(),
            protocol: ServerProtocol::Quic,
        });
        let fields: Vec<String> = validate_client(&bad).into_iter().map(|p| p.field).collect();
        assert!(
            fields.contains(&"servers[0].fingerprint".to_string()),
            "{fields:?}"
        );
        assert!(
            fields.contains(&"servers[0].fallback.protocol".to_string()),
            "{fields:?}"
        );
        assert!(parse_fingerprint("abcd").is_err());
        assert!(parse_fingerprint(&"zz".repeat(32)).is_err());
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(ClientConfig::from_yaml_str("proxy: {htp: {}}", &|_| None).is_err());
        assert!(ClientConfig::from_yaml_str(
            "servers: [{name: a, protocol: QUIC, pin: x}]",
            &|_| None
        )
        .is_err());
    }
}
