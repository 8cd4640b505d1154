//! The compiled, immutable view of the configuration the data plane runs on. The control plane
//! builds a new [`Snapshot`] on every change and publishes it through `arc_swap`; a core loads
//! the current one when a connection (or request) starts, so live connections are never
//! disturbed by a reload. State that must outlive a snapshot is carried over: backend counters
//! and health by backend name, the rate limiters and the authentication guard as they are (a
//! reload reconfigures them in place, so it never resets a client's budgets).

use crate::access_control::AccessControl;
use crate::counters::Counters;
use crate::credentials::{AuthGuard, Users};
use crate::proxy_auth::{CredentialVerifier, External, NegotiateAuth, ProxyAuth};
use crate::rate_limit::{BandwidthLimiter, RequestLimiter};
use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use switchyard_config::{AuthMode, BackendType, LoadBalance, ServerConfig};
use switchyard_proto::route_matcher::{RouteEntry, RouteTable};

pub type SnapshotHandle = Arc<ArcSwap<Snapshot>>;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("route {route}: {message}")]
    Route { route: String, message: String },
    #[error("backend {backend}: {message}")]
    Backend { backend: String, message: String },
    #[error("cache: {0}")]
    Cache(String),
}

/// How a backend reaches destinations.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BackendKind {
    Direct,
    /// Upstream HTTP proxy: CONNECT for tunnels, absolute-form requests for plain HTTP;
    /// `authorization` is a ready `Basic …` value sent as `Proxy-Authorization`.
    HttpProxy {
        host: String,
        port: u16,
        authorization: Option<String>,
    },
    Socks5 {
        host: String,
        port: u16,
        credentials: Option<(String, String)>,
    },
    /// A user-space WireGuard tunnel (shared across snapshots while its settings stay).
    Wireguard(TunnelRef),
    /// An OpenVPN tunnel run by the control plane (shared across snapshots by name).
    Openvpn(LinkRef),
    /// A switchyard server reached over QUIC (client role; shared across snapshots while
    /// its settings stay, so a reload keeps the connection).
    Quic(QuicRef),
    /// Refuses every connection with [`crate::error::DataplaneError::Blocked`] and carries no
    /// datagram: the client's kill switch (`routing.when_disconnected: block`) puts it where
    /// the server would be while no server is connected.
    Blocked {
        reason: &'static str,
    },
    /// Parsed and validated, but its transport is not in this build yet.
    Unavailable {
        type_name: &'static str,
    },
}

/// A WireGuard backend's tunnel; two refer to the same tunnel only if they are the same one.
#[derive(Debug, Clone)]
pub struct TunnelRef(pub Arc<crate::wireguard::WireguardBackend>);

impl PartialEq for TunnelRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for TunnelRef {}

impl std::hash::Hash for TunnelRef {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.0), state)
    }
}

/// A QUIC server backend; two refer to the same one only if they are the same one.
#[derive(Debug, Clone)]
pub struct QuicRef(pub Arc<crate::quic::QuicBackend>);

impl PartialEq for QuicRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for QuicRef {}

impl std::hash::Hash for QuicRef {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.0), state)
    }
}

/// An OpenVPN backend's link; two refer to the same link only if they are the same one.
#[derive(Debug, Clone)]
pub struct LinkRef(pub Arc<crate::openvpn::OpenvpnLink>);

impl PartialEq for LinkRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for LinkRef {}

impl std::hash::Hash for LinkRef {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.0), state)
    }
}

#[derive(Debug)]
pub struct Backend {
    pub name: String,
    pub kind: BackendKind,
    pub enabled: bool,
    pub counters: Arc<Counters>,
    pub health: Arc<BackendHealth>,
    /// Its active health checks, run by the control plane; `None` = not checked.
    pub health_check: Option<switchyard_config::health_check::HealthCheckPlan>,
}

pub use crate::backend_health::{BackendHealth, FAILURES_TO_UNHEALTHY};

impl BackendKind {
    /// The upstream HTTP proxy (host, port, `Proxy-Authorization` value) that plain-HTTP
    /// requests are forwarded to in absolute form, for an `httpproxy` backend.
    pub fn http_upstream(&self) -> Option<(&str, u16, Option<&str>)> {
        match self {
            BackendKind::HttpProxy {
                host,
                port,
                authorization,
            } => Some((host, *port, authorization.as_deref())),
            _ => None,
        }
    }
}

impl Backend {
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            BackendKind::Direct => "direct",
            BackendKind::HttpProxy { .. } => "httpproxy",
            BackendKind::Socks5 { .. } => "socks5",
            BackendKind::Wireguard(_) => "wireguard",
            BackendKind::Openvpn(_) => "openvpn",
            BackendKind::Quic(_) => "quic",
            BackendKind::Blocked { .. } => "blocked",
            BackendKind::Unavailable { type_name } => type_name,
        }
    }
}

#[derive(Debug)]
pub struct RouteTarget {
    pub name: String,
    /// Indexes into [`Snapshot::backends`].
    pub backends: Vec<usize>,
    pub load_balance: LoadBalance,
    /// Round-robin positions: one cache-padded slot per data-plane core plus one for every other
    /// thread (none for a single backend). Each core rotates through the backends on its own, so
    /// a pick writes no line that another core writes; core `i` starts at position `i`, so the
    /// cores' first picks spread too.
    next: Box<[CachePadded<AtomicUsize>]>,
}

impl RouteTarget {
    /// The next round-robin position of the calling thread's slot.
    fn next_position(&self) -> usize {
        let last = self.next.len().saturating_sub(1);
        let slot = crate::cores::current().map_or(last, |core| core.min(last));
        self.next
            .get(slot)
            .map_or(0, |n| n.fetch_add(1, Ordering::Relaxed))
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub read: Duration,
    pub write: Duration,
    pub idle: Duration,
    pub header: Duration,
    pub connect: Duration,
}

#[derive(Debug)]
pub struct Snapshot {
    pub generation: u64,
    pub routes: RouteTable<RouteTarget>,
    pub backends: Vec<Arc<Backend>>,
    /// The `auth.mode` check (`None`: no mode).
    pub auth: Option<ProxyAuth>,
    /// `auth.negotiate.enabled`: SPNEGO in front of the mode. Authentication is required when
    /// either this or `auth` is set.
    pub negotiate: Option<NegotiateAuth>,
    pub access: AccessControl,
    /// Failure budgets and verification slots of proxy authentication.
    pub auth_guard: Arc<AuthGuard>,
    pub request_limit: Option<Arc<RequestLimiter>>,
    pub upload_limit: Option<Arc<BandwidthLimiter>>,
    pub download_limit: Option<Arc<BandwidthLimiter>>,
    pub timeouts: Timeouts,
    pub max_header_size: usize,
    pub max_connections: usize,
    /// `api.enable_request_log`: the data plane records requests only when on.
    pub request_log: bool,
    /// Cache rules (with enabled presets) when `cache.enabled`.
    pub cache: Option<Arc<crate::cache::CachePolicy>>,
}

fn split_host_port(address: &str) -> Option<(String, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return None;
    }
    Some((host.to_owned(), port.parse().ok()?))
}

impl Snapshot {
    /// Hands the verifier of the configured external mode (LDAP, PAM, OAuth) to a snapshot
    /// that is still failing closed for it.
    pub fn with_verifier(mut self, verifier: Arc<dyn CredentialVerifier>) -> Self {
        if matches!(&self.auth, Some(ProxyAuth::FailClosed { mode }) if *mode == verifier.mode()) {
            self.auth = Some(ProxyAuth::External(Arc::new(External::new(verifier))));
        }
        self
    }

    /// Hands the SPNEGO verifier to a snapshot with `auth.negotiate.enabled`.
    pub fn with_negotiate(mut self, verifier: Arc<dyn CredentialVerifier>) -> Self {
        if self.negotiate.is_some() {
            self.negotiate = Some(NegotiateAuth::Ready(Arc::new(External::new(verifier))));
        }
        self
    }

    /// Whether clients must authenticate.
    pub fn requires_auth(&self) -> bool {
        self.auth.is_some() || self.negotiate.is_some()
    }

    /// Compiles `cfg`. `previous` lends its backend counters to backends of the same name and
    /// hands on its limiters and authentication guard.
    pub fn compile(
        cfg: &ServerConfig,
        previous: Option<&Snapshot>,
        cores: usize,
    ) -> Result<Self, SnapshotError> {
        let mut backends = Vec::with_capacity(cfg.backends.len());
        for b in &cfg.backends {
            let old = previous.and_then(|p| p.backends.iter().find(|old| old.name == b.name));
            let counters = old
                .map(|old| old.counters.clone())
                .unwrap_or_else(|| Arc::new(Counters::new(cores)));
            let health = old.map(|old| old.health.clone()).unwrap_or_default();
            let bad = |message: &str| SnapshotError::Backend {
                backend: b.name.clone(),
                message: message.to_owned(),
            };
            let kind = match b.kind {
                BackendType::Direct => BackendKind::Direct,
                BackendType::HttpProxy => {
                    let up = b
                        .http_proxy
                        .as_ref()
                        .ok_or_else(|| bad("http_proxy settings missing"))?;
                    let (host, port) = split_host_port(&up.address)
                        .ok_or_else(|| bad("address must be host:port"))?;
                    let authorization = up.username.as_ref().map(|u| {
                        crate::credentials::encode_basic(u, up.password.as_deref().unwrap_or(""))
                    });
                    BackendKind::HttpProxy {
                        host,
                        port,
                        authorization,
                    }
                }
                BackendType::Socks5 => {
                    let up = b
                        .socks5
                        .as_ref()
                        .ok_or_else(|| bad("socks5 settings missing"))?;
                    let (host, port) = split_host_port(&up.address)
                        .ok_or_else(|| bad("address must be host:port"))?;
                    let credentials = up
                        .username
                        .as_ref()
                        .map(|u| (u.clone(), up.password.clone().unwrap_or_default()));
                    BackendKind::Socks5 {
                        host,
                        port,
                        credentials,
                    }
                }
                BackendType::Wireguard => {
                    let raw = b
                        .other
                        .as_ref()
                        .ok_or_else(|| bad("wireguard settings missing"))?;
                    let settings = switchyard_config::wireguard::WireguardSettings::from_value(raw)
                        .map_err(|e| bad(&format!("wireguard.{e}")))?;
                    // Same settings: keep the running tunnel (and its session) across reloads.
                    let kept = old.and_then(|old| match &old.kind {
                        BackendKind::Wireguard(t) if t.0.settings == settings => Some(t.clone()),
                        _ => None,
                    });
                    BackendKind::Wireguard(kept.unwrap_or_else(|| {
                        TunnelRef(Arc::new(crate::wireguard::WireguardBackend::new(
                            &b.name, settings,
                        )))
                    }))
                }
                BackendType::Openvpn => {
                    // The control plane's supervisor publishes the tunnel into the link and
                    // measures its health; a new backend is unhealthy until it is connected.
                    let kept = old.and_then(|old| match &old.kind {
                        BackendKind::Openvpn(l) => Some(l.clone()),
                        _ => None,
                    });
                    if kept.is_none() {
                        health.set(false);
                    }
                    BackendKind::Openvpn(kept.unwrap_or_else(|| {
                        LinkRef(Arc::new(crate::openvpn::OpenvpnLink::new(&b.name)))
                    }))
                }
                // The control plane replaces a provider backend by the wireguard or openvpn
                // backend it resolved to; one still here has not resolved (yet).
                BackendType::Provider(p) => BackendKind::Unavailable {
                    type_name: p.name(),
                },
            };
            backends.push(Arc::new(Backend {
                name: b.name.clone(),
                kind,
                enabled: b.enabled,
                counters,
                health,
                health_check: switchyard_config::health_check::HealthCheckPlan::for_backend(cfg, b),
            }));
        }

        let mut entries = Vec::new();
        for r in cfg.routes.iter().filter(|r| r.enabled) {
            let names: Vec<&String> = r.backend.iter().chain(r.backends.iter()).collect();
            let mut indexes = Vec::with_capacity(names.len());
            for name in names {
                let i = backends
                    .iter()
                    .position(|b| &b.name == name)
                    .ok_or_else(|| SnapshotError::Route {
                        route: r.name.clone(),
                        message: format!("backend {name} does not exist"),
                    })?;
                indexes.push(i);
            }
            if indexes.is_empty() {
                return Err(SnapshotError::Route {
                    route: r.name.clone(),
                    message: "no backend".into(),
                });
            }
            let balanced = indexes.len() > 1;
            entries.push(RouteEntry {
                patterns: r.domains.clone(),
                priority: r.priority,
                value: RouteTarget {
                    name: r.name.clone(),
                    backends: indexes,
                    load_balance: r.load_balance,
                    next: if balanced {
                        (0..=cores)
                            .map(|i| CachePadded::new(AtomicUsize::new(i)))
                            .collect()
                    } else {
                        Box::default()
                    },
                },
            });
        }
        let routes = RouteTable::build(entries).map_err(|e| SnapshotError::Route {
            route: "*".into(),
            message: e.to_string(),
        })?;

        let auth = match cfg.auth.mode {
            AuthMode::None => None,
            AuthMode::Native => Some(ProxyAuth::Native(Users::new(
                cfg.auth
                    .native
                    .users
                    .iter()
                    .map(|u| (u.username.clone(), u.password_hash.clone())),
            ))),
            // The mode needs a restart to change, so the running verifier carries over; until
            // the control plane hands one over, everything is refused.
            mode => Some(
                previous
                    .and_then(|p| match &p.auth {
                        Some(ProxyAuth::External(e)) if e.verifier.mode() == mode.api_name() => {
                            Some(ProxyAuth::External(e.clone()))
                        }
                        _ => None,
                    })
                    .unwrap_or(ProxyAuth::FailClosed {
                        mode: mode.api_name(),
                    }),
            ),
        };
        let negotiate = cfg.auth.negotiate.as_ref().filter(|n| n.enabled).map(|_| {
            previous
                .and_then(|p| p.negotiate.clone())
                .unwrap_or(NegotiateAuth::FailClosed)
        });
        let cache = compile_cache(&cfg.cache)?;
        // Nothing below fails: the shared limiters are reconfigured only for a snapshot that
        // will be published.
        let rl = &cfg.rate_limit;
        let request_limit = RequestLimiter::carry_over(
            previous.and_then(|p| p.request_limit.as_ref()),
            rl.enabled,
            rl.requests_per_second,
            rl.burst_size,
            rl.per_ip,
        );
        let upload_limit = BandwidthLimiter::carry_over(
            previous.and_then(|p| p.upload_limit.as_ref()),
            rl.enabled,
            rl.bandwidth.upload.0,
            rl.per_ip,
        );
        let download_limit = BandwidthLimiter::carry_over(
            previous.and_then(|p| p.download_limit.as_ref()),
            rl.enabled,
            rl.bandwidth.download.0,
            rl.per_ip,
        );
        let auth_guard = previous.map_or_else(
            || Arc::new(AuthGuard::for_this_host()),
            |p| p.auth_guard.clone(),
        );
        let http = &cfg.server.http;
        Ok(Self {
            generation: previous.map_or(1, |p| p.generation + 1),
            routes,
            backends,
            auth,
            negotiate,
            access: AccessControl::new(
                cfg.access_control.whitelist.clone(),
                cfg.access_control.blacklist.clone(),
            ),
            auth_guard,
            request_limit,
            upload_limit,
            download_limit,
            timeouts: Timeouts {
                read: http.read_timeout.0,
                write: http.write_timeout.0,
                idle: http.idle_timeout.0,
                header: http.header_timeout.0,
                connect: Duration::from_secs(10),
            },
            max_header_size: usize::try_from(http.max_header_size.0).unwrap_or(usize::MAX),
            max_connections: cfg.server.max_connections,
            request_log: cfg.api.enable_request_log,
            cache,
        })
    }

    /// The route for `host` (no port) and the backend chosen by its load-balancing policy.
    pub fn select(&self, host: &str) -> Option<(&RouteTarget, &Arc<Backend>)> {
        let route = self.routes.lookup(host)?;
        let usable = |i: &usize| self.backends.get(*i).is_some_and(|b| b.enabled);
        // The common case, one backend, needs no counting or allocation.
        if let [only] = route.backends.as_slice() {
            return usable(only).then(|| (route, &self.backends[*only]));
        }
        // Unhealthy members are skipped while a healthy one is left (and picked again once
        // they recover). When none is healthy every enabled member stays a candidate (try
        // anyway, no 503 of our own): a wrong verdict (a check target that is down, not the
        // backends) never takes the route down by itself, and when the backends really are
        // down the client gets the connect's own error (502/504) naming what failed.
        // A member out for failing connects whose retry time has come takes this one
        // connection, so that it comes back once it works again (see `PASSIVE_RETRY`).
        if let Some(&retry) = route
            .backends
            .iter()
            .find(|i| usable(i) && self.backends[**i].health.claim_retry())
        {
            return Some((route, &self.backends[retry]));
        }
        let healthy = |i: &usize| usable(i) && self.backends[*i].health.is_healthy();
        let mut candidates: Vec<usize> = route.backends.iter().copied().filter(healthy).collect();
        if candidates.is_empty() {
            candidates = route.backends.iter().copied().filter(usable).collect();
        }
        let chosen = match (candidates.len(), route.load_balance) {
            (0, _) => return None,
            (1, _) => candidates[0],
            (n, LoadBalance::RoundRobin) => candidates[route.next_position() % n],
            // one line per core read (each core's open count), not the whole counter set
            (_, LoadBalance::LeastConn) => *candidates
                .iter()
                .min_by_key(|&&i| self.backends[i].counters.active_total())?,
        };
        Some((route, &self.backends[chosen]))
    }
}

/// The cache rules of `cfg` plus its enabled presets, compiled; `None` when caching is off.
pub fn compile_cache(
    cfg: &switchyard_config::cache::CacheConfig,
) -> Result<Option<Arc<crate::cache::CachePolicy>>, SnapshotError> {
    use switchyard_proto::cache::rules::RuleSet;
    if !cfg.enabled {
        return Ok(None);
    }
    let rules =
        RuleSet::build(cfg.effective_rules()).map_err(|e| SnapshotError::Cache(e.to_string()))?;
    Ok(Some(Arc::new(crate::cache::CachePolicy {
        rules,
        default_ttl: cfg.default_ttl.0,
        max_file_size: cfg.max_file_size.0,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_config::{BackendConfig, RouteConfig, UpstreamProxyConfig};

    fn backend(name: &str, kind: BackendType) -> BackendConfig {
        BackendConfig {
            name: name.into(),
            kind,
            enabled: true,
            http_proxy: Some(UpstreamProxyConfig {
                address: "127.0.0.1:3128".into(),
                username: Some("u".into()),
                password: Some("p".into()),
            }),
            socks5: None,
            other: None,
            health_check: None,
        }
    }

    fn route(name: &str, domains: &[&str], backends: &[&str], priority: i32) -> RouteConfig {
        RouteConfig {
            name: name.into(),
            domains: domains.iter().map(|d| d.to_string()).collect(),
            backend: None,
            backends: backends.iter().map(|d| d.to_string()).collect(),
            enabled: true,
            priority,
            load_balance: LoadBalance::RoundRobin,
        }
    }

    fn config() -> ServerConfig {
        ServerConfig {
            backends: vec![
                backend("direct", BackendType::Direct),
                backend("up", BackendType::HttpProxy),
                backend("up2", BackendType::HttpProxy),
            ],
            routes: vec![
                route("all", &["*"], &["direct"], 0),
                route("ex", &["*.example.com"], &["up", "up2"], 10),
            ],
            ..ServerConfig::default()
        }
    }

    #[test]
    fn routes_by_priority_and_round_robins() {
        let snap = Snapshot::compile(&config(), None, 2).expect("compile");
        let (_, b) = snap.select("other.org").expect("route");
        assert_eq!(b.name, "direct");
        let picks: Vec<String> = (0..4)
            .map(|_| snap.select("a.example.com").expect("route").1.name.clone())
            .collect();
        assert_eq!(picks, ["up", "up2", "up", "up2"]);
        match &snap.backends[1].kind {
            BackendKind::HttpProxy { authorization, .. } => {
                assert_eq!(authorization.as_deref(), Some("Basic dTpw"))
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn each_core_round_robins_on_its_own_slot() {
        let snap = Arc::new(Snapshot::compile(&config(), None, 2).expect("compile"));
        let picks_on = |core: usize| {
            let snap = snap.clone();
            std::thread::spawn(move || {
                crate::cores::enter(core);
                (0..4)
                    .map(|_| snap.select("a.example.com").expect("route").1.name.clone())
                    .collect::<Vec<_>>()
            })
            .join()
            .expect("picker")
        };
        assert_eq!(picks_on(0), ["up", "up2", "up", "up2"]);
        // core 1 starts one further, so the cores' first connections spread
        assert_eq!(picks_on(1), ["up2", "up", "up2", "up"]);
        let route = snap.routes.lookup("a.example.com").expect("route");
        let positions: Vec<usize> = route
            .next
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect();
        // each core wrote only its own slot; the other threads' slot was not touched
        assert_eq!(positions, [4, 5, 2]);
        // a route with one backend keeps no positions
        assert!(snap
            .routes
            .lookup("other.org")
            .expect("route")
            .next
            .is_empty());
    }

    #[test]
    fn balancing_skips_unhealthy_members_and_returns_to_them() {
        let snap = Snapshot::compile(&config(), None, 1).expect("compile");
        let pick = || snap.select("a.example.com").expect("route").1.name.clone();
        snap.backends[1].health.set(false);
        assert_eq!([pick(), pick(), pick()], ["up2", "up2", "up2"]);
        snap.backends[2].health.set(false);
        let both_down: Vec<String> = (0..2).map(|_| pick()).collect();
        assert!(both_down.contains(&"up".to_owned()) && both_down.contains(&"up2".to_owned()));
        snap.backends[1].health.set(true);
        snap.backends[2].health.set(true);
        let back: Vec<String> = (0..2).map(|_| pick()).collect();
        assert!(back.contains(&"up".to_owned()) && back.contains(&"up2".to_owned()));
    }

    #[test]
    fn counters_survive_recompile() {
        let first = Snapshot::compile(&config(), None, 1).expect("compile");
        first.backends[0].counters.core(0).opened();
        let second = Snapshot::compile(&config(), Some(&first), 1).expect("compile");
        assert_eq!(second.backends[0].counters.totals().total_connections, 1);
        assert_eq!(second.generation, 2);
    }

    #[test]
    fn limiters_and_auth_guard_survive_recompile() {
        let mut cfg = config();
        cfg.rate_limit.enabled = true;
        cfg.rate_limit.requests_per_second = 0.01;
        cfg.rate_limit.burst_size = 1;
        cfg.rate_limit.per_ip = true;
        let first = Snapshot::compile(&cfg, None, 1).expect("compile");
        let client: std::net::IpAddr = [10, 0, 0, 1].into();
        let limiter = first.request_limit.as_ref().expect("limiter");
        assert!(limiter.admit(client));
        let second = Snapshot::compile(&cfg, Some(&first), 1).expect("compile");
        let again = second.request_limit.as_ref().expect("limiter");
        assert!(!again.admit(client), "a reload must not refill the bucket");
        assert!(Arc::ptr_eq(&first.auth_guard, &second.auth_guard));
    }

    #[test]
    fn a_failed_compile_leaves_the_running_limiters_alone() {
        let mut cfg = config();
        cfg.rate_limit.enabled = true;
        cfg.rate_limit.requests_per_second = 1.0;
        cfg.rate_limit.burst_size = 1;
        let first = Snapshot::compile(&cfg, None, 1).expect("compile");
        let mut bad = cfg.clone();
        bad.rate_limit.enabled = false;
        bad.routes.push(route("bad", &["x.com"], &["nope"], 0));
        assert!(Snapshot::compile(&bad, Some(&first), 1).is_err());
        let limiter = first.request_limit.as_ref().expect("limiter");
        let client: std::net::IpAddr = [10, 0, 0, 2].into();
        assert!(limiter.admit(client));
        assert!(!limiter.admit(client), "still enabled");
    }

    #[test]
    fn an_openvpn_backend_starts_unhealthy_and_keeps_its_link() {
        let mut cfg = config();
        let mut vpn = backend("vpn", BackendType::Openvpn);
        vpn.http_proxy = None;
        let settings = switchyard_config::openvpn::OpenvpnSettings {
            config_file: Some("/etc/v.ovpn".into()),
            ..Default::default()
        };
        vpn.other = Some(settings.to_value());
        cfg.backends.push(vpn);
        let first = Snapshot::compile(&cfg, None, 1).expect("compile");
        let b = first
            .backends
            .iter()
            .find(|b| b.name == "vpn")
            .expect("vpn");
        assert!(!b.health.is_healthy(), "unhealthy until connected");
        assert_eq!(b.type_name(), "openvpn");
        b.health.set(true);
        let second = Snapshot::compile(&cfg, Some(&first), 1).expect("compile");
        let again = second
            .backends
            .iter()
            .find(|b| b.name == "vpn")
            .expect("vpn");
        assert!(
            again.health.is_healthy(),
            "a reload keeps the measured state"
        );
        assert_eq!(again.kind, b.kind, "same link");
    }

    #[test]
    fn missing_backend_is_an_error() {
        let mut cfg = config();
        cfg.routes.push(route("bad", &["x.com"], &["nope"], 0));
        assert!(Snapshot::compile(&cfg, None, 1).is_err());
    }
}
