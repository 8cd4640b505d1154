//! The client role of the one data-plane engine: a client configuration (routes `direct` |
//! `server`, the selected server) is expressed as the engine's own configuration — two backends,
//! `direct` and `server/<name>` (an upstream HTTP proxy or SOCKS5 backend with the server's
//! credentials, or for `protocol: QUIC` the data plane's QUIC backend, which the engine's
//! configuration cannot name and [`compile`] puts in place), and one engine route per client route plus a catch-all for the default action —
//! and compiled into the engine's [`Snapshot`]. Routing, pooling, keep-alive, counters and request
//! records then all come from the same engine the server runs.
//!
//! While no server is connected, routes with action `server` go to `direct` — or, with
//! `routing.when_disconnected: block` (the kill switch), to a third backend, [`BLOCKED`], that
//! refuses every connection (`blocked: not connected`). The cores thus decide from the snapshot
//! they already read; the control plane only publishes a new one on connect and disconnect.

use std::sync::Arc;
use switchyard_config::client::{
    ClientConfig, ClientServerConfig, RouteAction, ServerProtocol, WhenDisconnected,
};
use switchyard_config::{
    BackendConfig, BackendType, LoadBalance, RouteConfig, ServerConfig, UpstreamProxyConfig,
};
use switchyard_dataplane::quic::{QuicBackend, QuicSettings};
use switchyard_dataplane::snapshot::{Backend, BackendKind, QuicRef, SnapshotError};
use switchyard_dataplane::Snapshot;

/// Name of the direct backend.
pub const DIRECT: &str = "direct";
/// Prefix of the server backend's name (`server/<server name>`).
pub const SERVER_PREFIX: &str = "server/";
/// Name of the catch-all engine route carrying `routing.default_action`.
pub const DEFAULT_ROUTE: &str = "(default action)";
/// Name of the backend that refuses what the server would carry while no server is connected
/// (`routing.when_disconnected: block`).
pub const BLOCKED: &str = "blocked";
/// Why [`BLOCKED`] refuses: proxy clients read `blocked: not connected`.
pub const NOT_CONNECTED: &str = "not connected";

/// `direct` / `server` / `blocked` and the backend name of a recorded request's backend.
pub fn action_of(backend: &str) -> (&'static str, &str) {
    match backend.strip_prefix(SERVER_PREFIX) {
        Some(name) => ("server", name),
        None if backend == BLOCKED => ("blocked", ""),
        None => ("direct", backend),
    }
}

/// Whether `cfg` with `server` connected (or none) refuses what the server would carry.
pub fn blocks(cfg: &ClientConfig, server: Option<&ClientServerConfig>) -> bool {
    server.is_none() && cfg.routing.when_disconnected == WhenDisconnected::Block
}

/// Whether `snapshot` refuses `host` (its route's backend is [`BLOCKED`]).
pub fn is_blocked(snapshot: &Snapshot, host: &str) -> bool {
    snapshot
        .select(host)
        .is_some_and(|(_, b)| matches!(b.kind, BackendKind::Blocked { .. }))
}

/// The engine configuration of `cfg`. `server` is the selected server while connected; without
/// one every destination goes direct (routes with action `server` included), or with
/// `routing.when_disconnected: block` those go to [`BLOCKED`] (a stand-in here that
/// [`compile`] replaces).
pub fn engine_config(cfg: &ClientConfig, server: Option<&ClientServerConfig>) -> ServerConfig {
    let mut backends = vec![BackendConfig::direct(DIRECT)];
    if blocks(cfg, server) {
        backends.push(BackendConfig::direct(BLOCKED));
    }
    let server_backend = server.map(|s| {
        let name = format!("{SERVER_PREFIX}{}", s.name);
        let upstream = UpstreamProxyConfig {
            address: s.address.clone(),
            username: s.username.clone(),
            password: s.password.clone(),
        };
        let (kind, http_proxy, socks5) = match s.protocol {
            ServerProtocol::Http => (BackendType::HttpProxy, Some(upstream), None),
            ServerProtocol::Socks5 => (BackendType::Socks5, None, Some(upstream)),
            // a stand-in that compiles; `compile` replaces it with the QUIC backend
            ServerProtocol::Quic => (BackendType::Direct, None, None),
        };
        backends.push(BackendConfig {
            name: name.clone(),
            kind,
            enabled: true,
            http_proxy,
            socks5,
            other: None,
            health_check: None,
        });
        name
    });
    let unconnected = if blocks(cfg, server) { BLOCKED } else { DIRECT };
    let target = |action: RouteAction| match (action, &server_backend) {
        (RouteAction::Server, Some(name)) => name.clone(),
        (RouteAction::Server, None) => unconnected.to_owned(),
        (RouteAction::Direct, _) => DIRECT.to_owned(),
    };
    let mut routes: Vec<RouteConfig> = cfg
        .routing
        .routes
        .iter()
        .map(|r| RouteConfig {
            name: r.name.clone(),
            domains: r.patterns.clone(),
            backend: Some(target(r.action)),
            backends: Vec::new(),
            enabled: true,
            priority: r.priority,
            load_balance: LoadBalance::RoundRobin,
        })
        .collect();
    routes.push(RouteConfig {
        name: DEFAULT_ROUTE.into(),
        domains: vec!["*".into()],
        backend: Some(target(cfg.routing.default_action)),
        backends: Vec::new(),
        enabled: true,
        priority: i32::MIN,
        load_balance: LoadBalance::RoundRobin,
    });
    let mut engine = ServerConfig {
        backends,
        routes,
        cache: cfg.cache.clone(),
        ..ServerConfig::default()
    };
    engine.server.cores = cfg.proxy.cores;
    // Local listeners serve one user: no connection cap beyond the process's file limit.
    engine.server.max_connections = 0;
    let http = &mut engine.server.http;
    http.read_timeout = cfg.proxy.read_timeout;
    http.write_timeout = cfg.proxy.write_timeout;
    http.idle_timeout = cfg.proxy.idle_timeout;
    // Debug entries are the engine's request records: always on in the client role.
    engine.api.enable_request_log = true;
    engine
}

/// Compiles the snapshot the client's cores run on.
pub fn compile(
    cfg: &ClientConfig,
    server: Option<&ClientServerConfig>,
    previous: Option<&Snapshot>,
    cores: usize,
) -> Result<Snapshot, SnapshotError> {
    let mut snapshot = Snapshot::compile(&engine_config(cfg, server), previous, cores)?;
    snapshot.timeouts.connect = cfg.server.connect_timeout.as_std();
    if let Some(s) = server.filter(|s| s.protocol == ServerProtocol::Quic) {
        put_quic_backend(&mut snapshot, s, previous)?;
    }
    if blocks(cfg, server) {
        replace_backend(&mut snapshot, BLOCKED, || BackendKind::Blocked {
            reason: NOT_CONNECTED,
        });
    }
    Ok(snapshot)
}

/// Puts a backend of the kind `kind` in place of the stand-in named `name` (the engine's
/// configuration cannot name that kind), keeping the stand-in's counters and health.
fn replace_backend(snapshot: &mut Snapshot, name: &str, kind: impl Fn() -> BackendKind) {
    for slot in snapshot.backends.iter_mut().filter(|b| b.name == name) {
        *slot = Arc::new(Backend {
            name: slot.name.clone(),
            kind: kind(),
            enabled: slot.enabled,
            counters: slot.counters.clone(),
            health: slot.health.clone(),
            health_check: None,
        });
    }
}

/// The QUIC settings of a server entry: its pin, token, credentials and TCP fallback.
fn quic_settings(s: &ClientServerConfig) -> Result<QuicSettings, SnapshotError> {
    let bad = |message: String| SnapshotError::Backend {
        backend: format!("{SERVER_PREFIX}{}", s.name),
        message,
    };
    let pin = s
        .fingerprint
        .as_deref()
        .ok_or_else(|| bad("a QUIC server needs `fingerprint`".into()))
        .and_then(|f| switchyard_config::client::parse_fingerprint(f).map_err(bad))?;
    let fallback = match &s.fallback {
        None => None,
        Some(f) => {
            let (host, port) = f
                .address
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h.trim_matches(['[', ']']).to_owned(), p.parse().ok()?)))
                .ok_or_else(|| bad(format!("fallback address {} is not host:port", f.address)))?;
            let kind = match f.protocol {
                ServerProtocol::Http => BackendKind::HttpProxy {
                    host,
                    port,
                    authorization: s.username.as_ref().map(|u| {
                        switchyard_dataplane::credentials::encode_basic(
                            u,
                            s.password.as_deref().unwrap_or(""),
                        )
                    }),
                },
                ServerProtocol::Socks5 => BackendKind::Socks5 {
                    host,
                    port,
                    credentials: s
                        .username
                        .as_ref()
                        .map(|u| (u.clone(), s.password.clone().unwrap_or_default())),
                },
                ServerProtocol::Quic => {
                    return Err(bad("the fallback must be HTTP or SOCKS5".into()))
                }
            };
            Some(Box::new(kind))
        }
    };
    Ok(QuicSettings {
        address: s.address.clone(),
        pin,
        token: s.token.clone().unwrap_or_default(),
        username: s.username.clone().unwrap_or_default(),
        password: s.password.clone().unwrap_or_default(),
        fallback,
    })
}

/// Replaces the stand-in of a QUIC server with its backend, keeping the running one (and its
/// connection) when the settings did not change.
fn put_quic_backend(
    snapshot: &mut Snapshot,
    s: &ClientServerConfig,
    previous: Option<&Snapshot>,
) -> Result<(), SnapshotError> {
    let name = format!("{SERVER_PREFIX}{}", s.name);
    let settings = quic_settings(s)?;
    let kept = previous
        .and_then(|p| p.backends.iter().find(|b| b.name == name))
        .and_then(|b| match &b.kind {
            BackendKind::Quic(q) if q.0.settings == settings => Some(q.clone()),
            _ => None,
        });
    let quic = kept.unwrap_or_else(|| QuicRef(Arc::new(QuicBackend::new(&name, settings))));
    replace_backend(snapshot, &name, || BackendKind::Quic(quic.clone()));
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use switchyard_config::client::ClientRouteConfig;
    use switchyard_dataplane::snapshot::BackendKind;

    fn config() -> ClientConfig {
        let mut cfg = ClientConfig::default();
        cfg.routing.routes = vec![
            ClientRouteConfig {
                name: "lan".into(),
                patterns: vec!["*.lan".into()],
                action: RouteAction::Direct,
                priority: 5,
            },
            ClientRouteConfig {
                name: "work".into(),
                patterns: vec!["*.corp.example".into()],
                action: RouteAction::Server,
                priority: 0,
            },
        ];
        cfg.servers = vec![ClientServerConfig {
            name: "home".into(),
            address: "127.0.0.1:7080".into(),
            username: Some("u".into()),
            password: Some("p".into()),
            ..ClientServerConfig::default()
        }];
        cfg
    }

    #[test]
    fn routes_choose_direct_or_the_server_backend() {
        let cfg = config();
        let snap = compile(&cfg, cfg.servers.first(), None, 1).unwrap();
        let pick = |host: &str| {
            let (route, backend) = snap.select(host).unwrap();
            (route.name.clone(), backend.name.clone())
        };
        assert_eq!(pick("nas.lan"), ("lan".into(), "direct".into()));
        assert_eq!(
            pick("a.corp.example"),
            ("work".into(), "server/home".into())
        );
        assert_eq!(
            pick("example.org"),
            (DEFAULT_ROUTE.into(), "server/home".into())
        );
        match &snap.backends[1].kind {
            BackendKind::HttpProxy {
                authorization,
                port,
                ..
            } => {
                assert_eq!(*port, 7080);
                assert_eq!(authorization.as_deref(), Some("Basic dTpw"));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(snap.request_log);
    }

    #[test]
    fn without_a_server_everything_goes_direct() {
        let cfg = config();
        let snap = compile(&cfg, None, None, 1).unwrap();
        for host in ["nas.lan", "a.corp.example", "example.org"] {
            assert_eq!(snap.select(host).unwrap().1.name, "direct", "{host}");
        }
        assert_eq!(snap.backends.len(), 1);
    }

    #[test]
    fn block_when_disconnected_refuses_server_routes_and_keeps_direct_ones() {
        let mut cfg = config();
        cfg.routing.when_disconnected = WhenDisconnected::Block;
        let snap = compile(&cfg, None, None, 1).unwrap();
        let pick = |host: &str| snap.select(host).unwrap().1.clone();
        assert_eq!(pick("nas.lan").kind, BackendKind::Direct);
        for host in ["a.corp.example", "example.org"] {
            let b = pick(host);
            assert_eq!(
                b.kind,
                BackendKind::Blocked {
                    reason: NOT_CONNECTED
                },
                "{host}"
            );
            assert_eq!(action_of(&b.name), ("blocked", ""));
            assert!(is_blocked(&snap, host), "{host}");
        }
        assert!(!is_blocked(&snap, "nas.lan"));
        // connected: the server carries them, nothing is blocked
        let snap = compile(&cfg, cfg.servers.first(), None, 1).unwrap();
        assert_eq!(snap.select("example.org").unwrap().1.name, "server/home");
        assert!(snap.backends.iter().all(|b| b.name != BLOCKED));
        // default_action direct: only the `server` route is blocked
        cfg.routing.default_action = RouteAction::Direct;
        let snap = compile(&cfg, None, None, 1).unwrap();
        assert_eq!(snap.select("example.org").unwrap().1.name, DIRECT);
        assert_eq!(snap.select("a.corp.example").unwrap().1.name, BLOCKED);
    }

    #[test]
    fn socks5_servers_and_default_direct() {
        let mut cfg = config();
        cfg.servers[0].protocol = ServerProtocol::Socks5;
        cfg.routing.default_action = RouteAction::Direct;
        let snap = compile(&cfg, cfg.servers.first(), None, 1).unwrap();
        assert_eq!(snap.select("example.org").unwrap().1.name, "direct");
        let (_, b) = snap.select("x.corp.example").unwrap();
        assert!(matches!(
            &b.kind,
            BackendKind::Socks5 {
                credentials: Some(_),
                ..
            }
        ));
        assert_eq!(action_of(&b.name), ("server", "home"));
        assert_eq!(action_of("direct"), ("direct", "direct"));
    }

    #[test]
    fn a_quic_server_becomes_the_quic_backend_and_survives_reloads() {
        let mut cfg = config();
        cfg.servers[0].protocol = ServerProtocol::Quic;
        cfg.servers[0].fingerprint = Some("ab".repeat(32));
        cfg.servers[0].fallback = Some(switchyard_config::client::ServerFallback {
            address: "127.0.0.1:7080".into(),
            protocol: ServerProtocol::Http,
        });
        let first = compile(&cfg, cfg.servers.first(), None, 1).unwrap();
        let (_, b) = first.select("example.org").unwrap();
        let BackendKind::Quic(quic) = &b.kind else {
            panic!("unexpected {:?}", b.kind)
        };
        assert_eq!(quic.0.settings.pin, [0xab; 32]);
        assert_eq!(quic.0.settings.username, "u");
        assert!(matches!(
            quic.0.settings.fallback.as_deref(),
            Some(BackendKind::HttpProxy {
                port: 7080,
                authorization: Some(_),
                ..
            })
        ));
        // same settings: the same backend (and connection) after a reload
        let again = compile(&cfg, cfg.servers.first(), Some(&first), 1).unwrap();
        assert_eq!(again.select("example.org").unwrap().1.kind, b.kind);
        // a new pin: a new backend
        cfg.servers[0].fingerprint = Some("cd".repeat(32));
        let changed = compile(&cfg, cfg.servers.first(), Some(&again), 1).unwrap();
        assert_ne!(changed.select("example.org").unwrap().1.kind, b.kind);
        // no pin: refused
        cfg.servers[0].fingerprint = None;
        assert!(compile(&cfg, cfg.servers.first(), None, 1).is_err());
    }
}
