//! The server configuration model. Field names are the YAML keys of the spec.

use crate::units::{Duration, Size};

/// Root of `switchyard server` configuration.
#[derive(Debug, Clone, PartialEq, Default)]
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
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerSection {
    pub http: HttpListenerConfig,
    pub socks5: Socks5ListenerConfig,
    pub pac: PacConfig,
    /// Data-plane cores; 0 = all online cores.
    pub cores: usize,
    /// Most simultaneous client connections across all cores (0 = unlimited).
    pub max_connections: usize,
}

#[derive(Debug, Clone, PartialEq)]
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

#[derive(Debug, Clone, PartialEq)]
pub struct Socks5ListenerConfig {
    pub enabled: bool,
    pub listen: String,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct PacConfig {
    /// `host:port` written into `PROXY …`; defaults to the request's Host with the proxy port.
    pub proxy_host: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendType {
    Direct,
    Wireguard,
    Openvpn,
    /// `httpproxy` or `http_proxy`
    HttpProxy,
    /// `socks5` or `socks5_proxy`
    Socks5,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BackendConfig {
    pub name: String,
    pub kind: BackendType,
    pub enabled: bool,
    /// Settings of `httpproxy` backends (YAML key `http_proxy`, also accepted as `httpproxy`).
    pub http_proxy: Option<UpstreamProxyConfig>,
    /// Settings of `socks5` backends (YAML key `socks5`, also accepted as `socks5_proxy`).
    pub socks5: Option<UpstreamProxyConfig>,
    /// Raw settings of types not implemented yet (wireguard, openvpn), kept for round-tripping.
    pub other: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpstreamProxyConfig {
    /// `host:port`
    pub address: String,
    pub username: Option<String>,
    pub password: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadBalance {
    #[default]
    RoundRobin,
    LeastConn,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    pub name: String,
    pub domains: Vec<String>,
    pub backend: Option<String>,
    pub backends: Vec<String>,
    pub enabled: bool,
    pub priority: i32,
    pub load_balance: LoadBalance,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthMode {
    /// No proxy authentication.
    #[default]
    None,
    Native,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct AuthConfig {
    pub mode: AuthMode,
    pub native: NativeAuthConfig,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct NativeAuthConfig {
    pub users: Vec<NativeUser>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NativeUser {
    pub username: String,
    /// bcrypt hash (`$2b$…`).
    pub password_hash: String,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct AccessControlConfig {
    /// When non-empty, only these clients are admitted.
    pub whitelist: Vec<ipnet::IpNet>,
    /// These clients are refused (checked after the whitelist).
    pub blacklist: Vec<ipnet::IpNet>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct RateLimitConfig {
    pub enabled: bool,
    pub requests_per_second: f64,
    pub burst_size: u32,
    pub per_ip: bool,
    pub bandwidth: BandwidthConfig,
}

/// Bytes per second; 0 = unlimited. Per client IP when `rate_limit.per_ip`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BandwidthConfig {
    pub upload: Size,
    pub download: Size,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ApiConfig {
    pub enabled: bool,
    pub listen: String,
    pub token: Option<String>,
    pub allowed_origins: Vec<String>,
    pub enable_request_log: bool,
    pub request_log_size: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LoggingConfig {
    pub level: String,
    pub format: LogFormat,
    /// File path; `None` = stderr.
    pub output: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    pub enabled: bool,
    pub listen: String,
}
