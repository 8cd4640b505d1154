//! The server configuration model. Field names are the YAML keys of the spec.
//!
//! Every struct (de)serializes with the YAML key names, so the same types serve the config file
//! (YAML) and the management API (JSON). Deserialization is strict: unknown keys are errors.
//! Missing keys take the defaults documented on each `Default` impl.
//!
//! **Default backend and route.** A config with *neither* a `backends` key *nor* a `routes` key
//! (for example an empty file) gets one backend `{name: direct, type: direct}` and one route
//! `{name: default, domains: ["*"], backend: direct}`, so a bare install forwards everything
//! directly. An explicit list — even an empty one — is kept as written, and when only one of
//! the two keys is present the other one defaults to an empty list. [`ServerConfig::default()`]
//! equals loading an empty file, so it includes that backend and route too.

use serde::{Deserialize, Serialize};

use crate::cache::CacheConfig;
use crate::provider::ProviderKind;
use crate::units::{Duration, Size};

fn yes() -> bool {
    true
}

/// A section written with no content (`pac:` with only comments under it) is YAML null:
/// treat it like a missing section.
pub(crate) fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Root of `switchyard server` configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "RawServerConfig")]
pub struct ServerConfig {
    pub server: ServerSection,
    pub backends: Vec<BackendConfig>,
    pub routes: Vec<RouteConfig>,
    pub auth: AuthConfig,
    pub access_control: AccessControlConfig,
    pub rate_limit: RateLimitConfig,
    pub api: ApiConfig,
    pub logging: LoggingConfig,
    pub metrics: MetricsConfig,
    pub cache: CacheConfig,
    pub mesh: crate::mesh_registry::MeshSection,
}

impl Default for ServerConfig {
    /// The configuration of an empty file, including the `direct` backend and `default` route.
    fn default() -> Self {
        RawServerConfig::default().into()
    }
}

/// Deserialization shape of [`ServerConfig`]: tells an absent `backends`/`routes` key from an
/// empty list.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawServerConfig {
    #[serde(deserialize_with = "null_default")]
    server: ServerSection,
    backends: Option<Vec<BackendConfig>>,
    routes: Option<Vec<RouteConfig>>,
    #[serde(deserialize_with = "null_default")]
    auth: AuthConfig,
    #[serde(deserialize_with = "null_default")]
    access_control: AccessControlConfig,
    #[serde(deserialize_with = "null_default")]
    rate_limit: RateLimitConfig,
    #[serde(deserialize_with = "null_default")]
    api: ApiConfig,
    #[serde(deserialize_with = "null_default")]
    logging: LoggingConfig,
    #[serde(deserialize_with = "null_default")]
    metrics: MetricsConfig,
    #[serde(deserialize_with = "null_default")]
    cache: CacheConfig,
    #[serde(deserialize_with = "null_default")]
    mesh: crate::mesh_registry::MeshSection,
}

impl From<RawServerConfig> for ServerConfig {
    fn from(raw: RawServerConfig) -> Self {
        let (backends, routes) = match (raw.backends, raw.routes) {
            (None, None) => (
                vec![BackendConfig::direct("direct")],
                vec![RouteConfig {
                    name: "default".into(),
                    domains: vec!["*".into()],
                    backend: Some("direct".into()),
                    backends: Vec::new(),
                    enabled: true,
                    priority: 0,
                    load_balance: LoadBalance::RoundRobin,
                }],
            ),
            (b, r) => (b.unwrap_or_default(), r.unwrap_or_default()),
        };
        ServerConfig {
            server: raw.server,
            backends,
            routes,
            auth: raw.auth,
            access_control: raw.access_control,
            rate_limit: raw.rate_limit,
            api: raw.api,
            logging: raw.logging,
            metrics: raw.metrics,
            cache: raw.cache,
            mesh: raw.mesh,
        }
    }
}

/// `server:` — the proxy listeners.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSection {
    #[serde(deserialize_with = "null_default")]
    pub http: HttpListenerConfig,
    #[serde(deserialize_with = "null_default")]
    pub socks5: Socks5ListenerConfig,
    #[serde(deserialize_with = "null_default")]
    pub pac: PacConfig,
    /// Data-plane cores; 0 = all online cores.
    pub cores: usize,
    /// Most simultaneous client connections across all cores (0 = unlimited).
    pub max_connections: usize,
    /// Where the server keeps state it must find again after a restart (provider keys).
    /// Created when first needed.
    pub data_dir: String,
    /// Defaults of every backend's active health checks (off unless enabled here or per backend).
    #[serde(deserialize_with = "null_default")]
    pub health_check: crate::health_check::HealthCheckDefaults,
    /// The QUIC transport clients connect to (off unless `listen` is set).
    #[serde(deserialize_with = "null_default")]
    pub quic: QuicListenerConfig,
}

/// `server.quic:` — the QUIC listener that switchyard clients with `protocol: QUIC` use: one
/// connection per client carries every proxied flow as a stream (UDP flows as datagrams).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuicListenerConfig {
    /// UDP `host:port` (`:7443`); empty = no QUIC listener.
    pub listen: String,
    /// Certificate chain and key (PEM). Unset: a self-signed certificate is generated on first
    /// start and kept in `server.data_dir` (`quic-cert.pem`, `quic-key.pem`); clients pin its
    /// SHA-256 fingerprint, printed at start and shown by `GET /api/v1/quic`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<ApiTlsConfig>,
    /// A shared secret clients may present instead of proxy credentials. With neither a token
    /// nor `auth.mode`, any client is served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// QUIC connections the listener holds at once (further Initials are refused).
    pub max_connections: usize,
    /// QUIC connections one client IP address may hold at once.
    pub max_connections_per_client: usize,
}

impl Default for QuicListenerConfig {
    /// Off; 1024 connections, 16 per client address.
    fn default() -> Self {
        Self {
            listen: String::new(),
            tls: None,
            token: None,
            max_connections: 1024,
            max_connections_per_client: 16,
        }
    }
}

impl Default for ServerSection {
    /// cores 0 (all), max_connections 10000, data_dir `./data/server`.
    fn default() -> Self {
        ServerSection {
            http: HttpListenerConfig::default(),
            socks5: Socks5ListenerConfig::default(),
            pac: PacConfig::default(),
            cores: 0,
            max_connections: 10_000,
            data_dir: "./data/server".into(),
            health_check: crate::health_check::HealthCheckDefaults::default(),
            quic: QuicListenerConfig::default(),
        }
    }
}

/// `server.http:` — the HTTP / CONNECT proxy listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpListenerConfig {
    pub listen: String,
    pub read_timeout: Duration,
    pub write_timeout: Duration,
    pub idle_timeout: Duration,
    /// Time allowed for a complete request head (slow-header protection).
    pub header_timeout: Duration,
    /// Largest request head accepted; larger → 431.
    pub max_header_size: Size,
}

impl Default for HttpListenerConfig {
    /// listen `:7080`, read/write 60s, idle 120s, header 10s, max header 64KiB.
    fn default() -> Self {
        HttpListenerConfig {
            listen: ":7080".into(),
            read_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(120),
            header_timeout: Duration::from_secs(10),
            max_header_size: Size::kib(64),
        }
    }
}

/// `server.socks5:` — the SOCKS5 listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Socks5ListenerConfig {
    pub enabled: bool,
    pub listen: String,
}

impl Default for Socks5ListenerConfig {
    /// enabled, listen `:7180`.
    fn default() -> Self {
        Socks5ListenerConfig {
            enabled: true,
            listen: ":7180".into(),
        }
    }
}

/// `server.pac:` — the proxy auto-configuration file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PacConfig {
    /// `host:port` written into `PROXY …`; defaults to the request's Host with the proxy port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_host: Option<String>,
}

/// Backend `type`. Accepted spellings: `direct`, `wireguard`, `openvpn`, `httpproxy` /
/// `http_proxy`, `socks5` / `socks5_proxy`. Serialized with [`BackendType::api_name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendType {
    Direct,
    Wireguard,
    Openvpn,
    /// `httpproxy` or `http_proxy`
    HttpProxy,
    /// `socks5` or `socks5_proxy`
    Socks5,
    /// A VPN provider (`nordvpn`, `mullvad`, `privateinternetaccess`/`pia`, `protonvpn`); the
    /// control plane resolves it to a `wireguard` or `openvpn` backend before the data plane
    /// sees it.
    Provider(ProviderKind),
}

impl BackendType {
    /// Every type, in documentation order.
    pub const ALL: [BackendType; 5] = [
        BackendType::Direct,
        BackendType::Wireguard,
        BackendType::Openvpn,
        BackendType::HttpProxy,
        BackendType::Socks5,
    ];

    /// Every accepted spelling of `type`.
    pub const ACCEPTED_NAMES: [&'static str; 12] = [
        "direct",
        "wireguard",
        "openvpn",
        "httpproxy",
        "http_proxy",
        "socks5",
        "socks5_proxy",
        "nordvpn",
        "mullvad",
        "privateinternetaccess",
        "pia",
        "protonvpn",
    ];

    /// The API enumeration value: `direct|wireguard|openvpn|httpproxy|socks5`, or the
    /// provider's name.
    pub const fn api_name(self) -> &'static str {
        match self {
            BackendType::Direct => "direct",
            BackendType::Wireguard => "wireguard",
            BackendType::Openvpn => "openvpn",
            BackendType::HttpProxy => "httpproxy",
            BackendType::Socks5 => "socks5",
            BackendType::Provider(p) => p.name(),
        }
    }

    /// Whether this build can run backends of this type (all of them now).
    pub const fn is_available(self) -> bool {
        matches!(
            self,
            BackendType::Direct
                | BackendType::HttpProxy
                | BackendType::Socks5
                | BackendType::Wireguard
                | BackendType::Openvpn
                | BackendType::Provider(_)
        )
    }

    /// Parse any accepted spelling (exact, lower case).
    pub fn from_name(name: &str) -> Option<BackendType> {
        match name {
            "direct" => Some(BackendType::Direct),
            "wireguard" => Some(BackendType::Wireguard),
            "openvpn" => Some(BackendType::Openvpn),
            "httpproxy" | "http_proxy" => Some(BackendType::HttpProxy),
            "socks5" | "socks5_proxy" => Some(BackendType::Socks5),
            other => ProviderKind::from_name(other).map(BackendType::Provider),
        }
    }
}

impl std::fmt::Display for BackendType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.api_name())
    }
}

impl std::str::FromStr for BackendType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BackendType::from_name(s).ok_or_else(|| {
            format!(
                "unknown backend type `{s}` (accepted: {})",
                BackendType::ACCEPTED_NAMES.join(", ")
            )
        })
    }
}

impl Serialize for BackendType {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.api_name())
    }
}

impl<'de> Deserialize<'de> for BackendType {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One entry of `backends:`.
///
/// YAML shape: `{name, type, enabled, http_proxy|httpproxy: {...}, socks5|socks5_proxy: {...},
/// wireguard: {...}, openvpn: {...}, config: {...}}`. The `wireguard` / `openvpn` objects (and
/// a provider backend's `config`) are kept as raw JSON in [`BackendConfig::other`] and written
/// back under the key named after the type (`config` for providers); they are read through
/// [`crate::wireguard::WireguardSettings`], [`crate::openvpn::OpenvpnSettings`] and
/// [`crate::provider::ProviderSettings`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawBackend", into = "RawBackend")]
pub struct BackendConfig {
    pub name: String,
    pub kind: BackendType,
    pub enabled: bool,
    /// Settings of `httpproxy` backends (YAML key `http_proxy`, also accepted as `httpproxy`).
    pub http_proxy: Option<UpstreamProxyConfig>,
    /// Settings of `socks5` backends (YAML key `socks5`, also accepted as `socks5_proxy`).
    pub socks5: Option<UpstreamProxyConfig>,
    /// Raw settings of wireguard and openvpn backends, and a provider backend's `config`,
    /// kept for round-tripping.
    pub other: Option<serde_json::Value>,
    /// Active health checks of this backend (see [`crate::health_check`]).
    pub health_check: Option<crate::health_check::BackendHealthCheck>,
}

impl BackendConfig {
    /// An enabled `direct` backend.
    pub fn direct(name: &str) -> Self {
        BackendConfig {
            name: name.into(),
            kind: BackendType::Direct,
            enabled: true,
            http_proxy: None,
            socks5: None,
            other: None,
            health_check: None,
        }
    }

    /// The upstream proxy settings this backend's type uses (`http_proxy` for httpproxy,
    /// `socks5` for socks5), if any.
    pub fn upstream(&self) -> Option<&UpstreamProxyConfig> {
        match self.kind {
            BackendType::HttpProxy => self.http_proxy.as_ref(),
            BackendType::Socks5 => self.socks5.as_ref(),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    #[serde(default)]
    name: String,
    #[serde(rename = "type")]
    kind: BackendType,
    #[serde(default = "yes")]
    enabled: bool,
    #[serde(default, alias = "httpproxy", skip_serializing_if = "Option::is_none")]
    http_proxy: Option<UpstreamProxyConfig>,
    #[serde(
        default,
        alias = "socks5_proxy",
        skip_serializing_if = "Option::is_none"
    )]
    socks5: Option<UpstreamProxyConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wireguard: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    openvpn: Option<serde_json::Value>,
    /// Options of a provider backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    config: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    health_check: Option<crate::health_check::BackendHealthCheck>,
}

impl TryFrom<RawBackend> for BackendConfig {
    type Error = String;
    fn try_from(raw: RawBackend) -> Result<Self, String> {
        if raw.config.is_some() && !matches!(raw.kind, BackendType::Provider(_)) {
            return Err(format!(
                "backend `{}`: a `config` object belongs to provider backends, not to type `{}`",
                raw.name, raw.kind
            ));
        }
        let other = match raw.kind {
            BackendType::Wireguard => {
                if raw.openvpn.is_some() {
                    return Err(format!(
                        "backend `{}`: settings object `openvpn` does not match type `wireguard`",
                        raw.name
                    ));
                }
                raw.wireguard
            }
            BackendType::Openvpn => {
                if raw.wireguard.is_some() {
                    return Err(format!(
                        "backend `{}`: settings object `wireguard` does not match type `openvpn`",
                        raw.name
                    ));
                }
                raw.openvpn
            }
            BackendType::Provider(_) => {
                if raw.wireguard.is_some() || raw.openvpn.is_some() {
                    return Err(format!(
                        "backend `{}`: a {} backend takes its options in `config`",
                        raw.name, raw.kind
                    ));
                }
                raw.config
            }
            kind => {
                if let Some(key) = [("wireguard", &raw.wireguard), ("openvpn", &raw.openvpn)]
                    .iter()
                    .find_map(|(k, v)| v.as_ref().map(|_| *k))
                {
                    return Err(format!(
                        "backend `{}`: settings object `{key}` does not match type `{kind}`",
                        raw.name
                    ));
                }
                None
            }
        };
        Ok(BackendConfig {
            name: raw.name,
            kind: raw.kind,
            enabled: raw.enabled,
            http_proxy: raw.http_proxy,
            socks5: raw.socks5,
            other,
            health_check: raw.health_check,
        })
    }
}

impl From<BackendConfig> for RawBackend {
    fn from(b: BackendConfig) -> Self {
        let (wireguard, openvpn, config) = match b.kind {
            BackendType::Wireguard => (b.other, None, None),
            BackendType::Openvpn => (None, b.other, None),
            BackendType::Provider(_) => (None, None, b.other),
            _ => (None, None, None),
        };
        RawBackend {
            name: b.name,
            kind: b.kind,
            enabled: b.enabled,
            http_proxy: b.http_proxy,
            socks5: b.socks5,
            wireguard,
            openvpn,
            config,
            health_check: b.health_check,
        }
    }
}

/// `http_proxy:` / `socks5:` settings of an upstream-proxy backend.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamProxyConfig {
    /// `host:port`
    pub address: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

/// Route `load_balance`: `round_robin` (default) or `least_conn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadBalance {
    #[default]
    RoundRobin,
    LeastConn,
}

/// One entry of `routes:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub domains: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<String>,
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub load_balance: LoadBalance,
}

impl RouteConfig {
    /// The backend names this route may use (`backend` or `backends`).
    pub fn backend_names(&self) -> Vec<&str> {
        match &self.backend {
            Some(b) => vec![b.as_str()],
            None => self.backends.iter().map(String::as_str).collect(),
        }
    }
}

/// `auth.mode`. A mode this code base does not implement yet ([`AuthMode::is_implemented`]) is
/// recognized so that a config using it is reported as unimplemented instead of failing to
/// parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthMode {
    /// No proxy authentication.
    #[default]
    None,
    /// Users and bcrypt hashes listed in `auth.native.users`.
    Native,
    /// Operating-system accounts through PAM (`auth.system`).
    System,
    /// Search, then bind as the user, against a directory (`auth.ldap`).
    Ldap,
    /// OAuth 2 / OIDC bearer tokens (`auth.oauth`).
    Oauth,
}

impl AuthMode {
    /// Every mode.
    pub const ALL: [AuthMode; 5] = [
        AuthMode::None,
        AuthMode::Native,
        AuthMode::System,
        AuthMode::Ldap,
        AuthMode::Oauth,
    ];

    /// The YAML / API value.
    pub const fn api_name(self) -> &'static str {
        match self {
            AuthMode::None => "none",
            AuthMode::Native => "native",
            AuthMode::System => "system",
            AuthMode::Ldap => "ldap",
            AuthMode::Oauth => "oauth",
        }
    }

    /// Whether the code base implements this mode (availability `unimplemented` otherwise).
    /// Whether this host can run it (the libraries a mode loads at run time) is the control
    /// plane's answer (`build_disabled`).
    pub const fn is_implemented(self) -> bool {
        matches!(
            self,
            AuthMode::None | AuthMode::Native | AuthMode::Ldap | AuthMode::System | AuthMode::Oauth
        )
    }
}

impl std::fmt::Display for AuthMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.api_name())
    }
}

impl<'de> Deserialize<'de> for AuthMode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        if s == "negotiate" {
            return Err(serde::de::Error::custom(
                "`negotiate` is not an auth mode: SPNEGO is HTTP middleware configured under auth.negotiate.*",
            ));
        }
        AuthMode::ALL
            .into_iter()
            .find(|m| m.api_name() == s)
            .ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "unknown auth mode `{s}` (accepted: none, native, system, ldap, oauth)"
                ))
            })
    }
}

/// `auth:` — proxy authentication of clients.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    pub mode: AuthMode,
    #[serde(deserialize_with = "null_default")]
    pub native: NativeAuthConfig,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ldap: Option<LdapAuthConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oauth: Option<OAuthAuthConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<SystemAuthConfig>,
    /// SPNEGO (Kerberos) middleware in front of the mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub negotiate: Option<NegotiateAuthConfig>,
}

/// `auth.native:`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NativeAuthConfig {
    #[serde(deserialize_with = "null_default")]
    pub users: Vec<NativeUser>,
}

/// One entry of `auth.native.users`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NativeUser {
    #[serde(default)]
    pub username: String,
    /// bcrypt hash (`$2b$…`).
    #[serde(default)]
    pub password_hash: String,
}

/// `auth.ldap:`. `ldaps://` URLs speak TLS from the start; `tls: true` on an `ldap://` URL
/// upgrades with StartTLS.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LdapAuthConfig {
    pub url: String,
    pub base_dn: String,
    /// Contains `%s` for the user name (escaped per RFC 4515), e.g. `(uid=%s)`.
    pub user_filter: String,
    pub tls: bool,
    /// Accept any server certificate (test directories only).
    pub insecure_skip_verify: bool,
}

/// `auth.system:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SystemAuthConfig {
    /// PAM service (a file under /etc/pam.d/). Default `switchyard`.
    pub service: String,
}

impl Default for SystemAuthConfig {
    fn default() -> Self {
        Self {
            service: "switchyard".into(),
        }
    }
}

/// `auth.negotiate:` — SPNEGO (Kerberos) for HTTP and CONNECT.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NegotiateAuthConfig {
    pub enabled: bool,
    pub keytab: String,
    /// e.g. `HTTP/proxy.example.org@EXAMPLE.ORG`.
    pub service_principal: String,
    pub realm: String,
}

/// `auth.oauth:`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OAuthAuthConfig {
    pub issuer_url: String,
    pub client_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// RFC 7662 introspection endpoint; when set, tokens are checked there (with the client
    /// id and secret) instead of by signature.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub introspection_url: Option<String>,
}

/// `access_control:` — client IP filtering. Entries are IPs or CIDRs; a bare IP is a /32
/// (IPv4) or /128 (IPv6). Host bits of a CIDR are cleared (`10.1.2.3/8` → `10.0.0.0/8`).
///
/// Without a `whitelist` key only [`LOCAL_NETWORKS`] are admitted (as squid's `localnet` and
/// tinyproxy's `Allow` defaults do), so a gateway with a public address is not an open proxy.
/// An explicit empty list `whitelist: []` admits every address.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AccessControlConfig {
    /// When non-empty, only these clients are admitted. Default [`LOCAL_NETWORKS`].
    #[serde(with = "ip_list")]
    pub whitelist: Vec<ipnet::IpNet>,
    /// These clients are refused (checked after the whitelist).
    #[serde(with = "ip_list")]
    pub blacklist: Vec<ipnet::IpNet>,
}

/// The default proxy clients: loopback, private (RFC 1918), link-local and unique-local ranges.
pub const LOCAL_NETWORKS: [&str; 8] = [
    "127.0.0.0/8",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.254.0.0/16",
    "::1/128",
    "fe80::/10",
    "fc00::/7",
];

impl Default for AccessControlConfig {
    /// whitelist [`LOCAL_NETWORKS`], no blacklist.
    fn default() -> Self {
        AccessControlConfig {
            whitelist: LOCAL_NETWORKS
                .iter()
                .filter_map(|n| n.parse().ok())
                .collect(),
            blacklist: Vec::new(),
        }
    }
}

impl AccessControlConfig {
    /// Who the proxy admits, for the start-up log: `everyone`, or the whitelist.
    pub fn describe(&self) -> String {
        let admitted = if self.whitelist.is_empty() {
            "every address".to_owned()
        } else {
            let list: Vec<String> = self.whitelist.iter().map(|n| n.to_string()).collect();
            list.join(", ")
        };
        if self.blacklist.is_empty() {
            admitted
        } else {
            let list: Vec<String> = self.blacklist.iter().map(|n| n.to_string()).collect();
            format!("{admitted} except {}", list.join(", "))
        }
    }

    /// Whether a client address is admitted: in the whitelist (when non-empty) and not in the
    /// blacklist.
    pub fn allows(&self, ip: std::net::IpAddr) -> bool {
        let ip = match ip {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map(std::net::IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        (self.whitelist.is_empty() || self.whitelist.iter().any(|n| n.contains(&ip)))
            && !self.blacklist.iter().any(|n| n.contains(&ip))
    }
}

/// Parse an access-control entry: an IP (→ /32 or /128) or a CIDR (host bits cleared).
pub fn parse_ip_or_cidr(s: &str) -> Result<ipnet::IpNet, String> {
    let t = s.trim();
    if let Ok(ip) = t.parse::<std::net::IpAddr>() {
        return Ok(ipnet::IpNet::from(ip));
    }
    t.parse::<ipnet::IpNet>()
        .map(|n| n.trunc())
        .map_err(|_| format!("`{s}` is neither an IP address nor a CIDR (e.g. 10.0.0.0/8)"))
}

mod ip_list {
    use serde::{Deserialize, Deserializer, Serializer};

    struct Entry(ipnet::IpNet);

    impl<'de> Deserialize<'de> for Entry {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let s = String::deserialize(d)?;
            super::parse_ip_or_cidr(&s)
                .map(Entry)
                .map_err(serde::de::Error::custom)
        }
    }

    pub fn serialize<S: Serializer>(v: &[ipnet::IpNet], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|n| n.to_string()))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ipnet::IpNet>, D::Error> {
        Ok(Vec::<Entry>::deserialize(d)?
            .into_iter()
            .map(|e| e.0)
            .collect())
    }
}

/// `rate_limit:` — token-bucket request limiting and bandwidth caps.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimitConfig {
    pub enabled: bool,
    pub requests_per_second: f64,
    pub burst_size: u32,
    pub per_ip: bool,
    #[serde(deserialize_with = "null_default")]
    pub bandwidth: BandwidthConfig,
}

/// Bytes per second; 0 = unlimited. Per client IP when `rate_limit.per_ip`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BandwidthConfig {
    pub upload: Size,
    pub download: Size,
}

/// `api:` — the management API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    pub enabled: bool,
    pub listen: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    pub allowed_origins: Vec<String>,
    pub enable_request_log: bool,
    pub request_log_size: usize,
    /// `host:port` that `POST /api/v1/backends/{name}/test` connects to when the request names
    /// no target.
    pub backend_test_target: String,
    /// Period of the `stats.update` WebSocket event; zero (the default) = no such events.
    pub stats_interval: Duration,
    /// A WebSocket client that sends nothing (not even `ping`) for this long is closed.
    pub ws_read_timeout: Duration,
    /// Serve the API over TLS (rustls) with this certificate and key. Unset = plain HTTP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<ApiTlsConfig>,
}

/// `api.tls:` — PEM files of the API listener's certificate (chain) and private key.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiTlsConfig {
    /// Certificate chain, leaf first (PEM).
    pub cert: String,
    /// Private key: PKCS#8, PKCS#1 (RSA) or SEC1 (EC) PEM.
    pub key: String,
}

impl Default for ApiConfig {
    /// enabled, listen `127.0.0.1:7082` (local only: set `api.listen` to reach it from
    /// elsewhere), no token, request log off with 1000 entries, backend tests
    /// against `www.google.com:443`, no `stats.update` events, WebSocket read timeout 60s,
    /// no TLS.
    fn default() -> Self {
        ApiConfig {
            enabled: true,
            listen: "127.0.0.1:7082".into(),
            token: None,
            allowed_origins: Vec::new(),
            enable_request_log: false,
            request_log_size: 1000,
            backend_test_target: "www.google.com:443".into(),
            stats_interval: Duration::ZERO,
            ws_read_timeout: Duration::from_secs(60),
            tls: None,
        }
    }
}

/// `logging.format`: `text` (default) or `json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Accepted `logging.level` values.
pub const LOG_LEVELS: [&str; 5] = ["trace", "debug", "info", "warn", "error"];

/// `logging:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoggingConfig {
    pub level: String,
    pub format: LogFormat,
    /// File path; `None` = stderr.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

impl Default for LoggingConfig {
    /// level `info`, format `text`, stderr.
    fn default() -> Self {
        LoggingConfig {
            level: "info".into(),
            format: LogFormat::Text,
            output: None,
        }
    }
}

/// `metrics:` — the metrics listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    pub enabled: bool,
    pub listen: String,
}

impl Default for MetricsConfig {
    /// disabled, listen `:7090`.
    fn default() -> Self {
        MetricsConfig {
            enabled: false,
            listen: ":7090".into(),
        }
    }
}
