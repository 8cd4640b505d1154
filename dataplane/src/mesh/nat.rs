//! NAT traversal of the mesh peer on its owner core: one [`IceEndpoint`] (`switchyard-ice`)
//! gathers our server-reflexive (STUN) and relayed (TURN) candidates, checks connectivity with
//! every peer against the candidates the registry lists for it and selects a path — direct
//! first, the TURN relay when nothing direct works (symmetric NAT), direct again when a direct
//! pair starts working later. This module decides which path a peer's WireGuard datagram takes
//! and frames it for that path; the runner owns the socket and the sessions.
//!
//! Path choice per peer ([`choose`]): of the path the checks selected and the way the peer's
//! authenticated datagrams come (a peer behind a NAT we have not checked yet is answered at its
//! peer-reflexive address), the one that changed last — a selection never overrides a way a
//! WireGuard-authenticated datagram proved since (the peer roamed, as WireGuard's own roaming
//! rule has it); else one of its published direct endpoints.

use super::{CandidateEndpoint, MeshShared, PathToPeer};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_ice::{
    Event, IceConfig, IceEndpoint, Path, PathKind, Received, TurnServerConfig, Via,
};

/// `mesh.stun`, `mesh.turn` and `mesh.connection` as NAT traversal takes them (server names
/// resolved by the control plane).
#[derive(Clone)]
pub struct NatSettings {
    /// Off: only the published direct endpoints and learnt addresses are used, STUN and
    /// ChannelData datagrams are dropped (counted).
    pub enabled: bool,
    /// Our host candidates: the interfaces' addresses with the mesh socket's port.
    pub host_candidates: Vec<SocketAddr>,
    pub stun_servers: Vec<SocketAddr>,
    pub turn_servers: Vec<TurnServerConfig>,
    /// `mesh.stun.timeout`: caps every STUN/TURN transaction and check.
    pub stun_timeout: Duration,
    /// `mesh.connection.direct_connect`: paths without a relay.
    pub direct_connect: bool,
    /// `mesh.connection.relay_enabled`: TURN allocations and the peers' relay candidates.
    pub relay_enabled: bool,
}

impl Default for NatSettings {
    fn default() -> Self {
        NatSettings {
            enabled: false,
            host_candidates: Vec::new(),
            stun_servers: Vec::new(),
            turn_servers: Vec::new(),
            stun_timeout: Duration::from_secs(5),
            direct_connect: true,
            relay_enabled: true,
        }
    }
}

impl std::fmt::Debug for NatSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // the TURN passwords stay out of logs
        let turn: Vec<SocketAddr> = self.turn_servers.iter().map(|t| t.addr).collect();
        f.debug_struct("NatSettings")
            .field("enabled", &self.enabled)
            .field("host_candidates", &self.host_candidates)
            .field("stun_servers", &self.stun_servers)
            .field("turn_servers", &turn)
            .field("direct_connect", &self.direct_connect)
            .field("relay_enabled", &self.relay_enabled)
            .finish()
    }
}

/// A selected ICE path as the way datagrams travel.
pub fn path_to_peer(path: &Path) -> PathToPeer {
    match (path.via, path.kind) {
        (Via::Direct, PathKind::Direct) => PathToPeer::Direct(path.remote),
        (Via::Direct, PathKind::Relayed) => PathToPeer::Relayed {
            turn: None,
            remote: path.remote,
        },
        (Via::Relay(server), _) => PathToPeer::Relayed {
            turn: Some(server),
            remote: path.remote,
        },
    }
}

/// How a datagram from `from` came: through our allocation on `via_turn`, from one of the
/// peer's published relay addresses (`peer_relays`: its allocation relayed it), or directly.
/// An answer goes back the same way.
pub fn arrival(
    from: SocketAddr,
    via_turn: Option<SocketAddr>,
    peer_relays: &[SocketAddr],
) -> PathToPeer {
    match via_turn {
        Some(server) => PathToPeer::Relayed {
            turn: Some(server),
            remote: from,
        },
        None if peer_relays.contains(&from) => PathToPeer::Relayed {
            turn: None,
            remote: from,
        },
        None => PathToPeer::Direct(from),
    }
}

/// A path and since when it holds (selected by the checks, or first proven by an
/// authenticated datagram).
pub type PathSince = (PathToPeer, Instant);

/// The path a peer's datagrams take: of the one the checks selected and the way its
/// authenticated datagrams come, the newer (a tie goes to the selection); else published
/// endpoint number `choice` (rotating). The policy holds for the last two as well: no direct
/// path when `direct_connect` is off.
pub fn choose(
    selected: Option<PathSince>,
    learnt: Option<PathSince>,
    published: &[SocketAddr],
    choice: usize,
    direct_connect: bool,
) -> Option<PathToPeer> {
    let allowed = |p: &PathSince| direct_connect || matches!(p.0, PathToPeer::Relayed { .. });
    match (selected, learnt.filter(allowed)) {
        (Some(s), Some(l)) if l.1 > s.1 => return Some(l.0),
        (Some(s), _) => return Some(s.0),
        (None, Some(l)) => return Some(l.0),
        (None, None) => {}
    }
    (direct_connect && !published.is_empty())
        .then(|| PathToPeer::Direct(published[choice % published.len()]))
}

/// The relay addresses among a peer's published candidates.
pub fn relay_addresses(candidates: &[CandidateEndpoint]) -> Vec<SocketAddr> {
    candidates
        .iter()
        .filter(|c| c.kind == "relay")
        .filter_map(|c| {
            let ip = c.address.trim_matches(['[', ']']).parse().ok()?;
            Some(SocketAddr::new(ip, c.port))
        })
        .collect()
}

/// What NAT traversal made of a STUN or ChannelData datagram.
pub(super) enum Inbound {
    /// STUN/TURN traffic it handled.
    Consumed,
    /// Malformed or nobody's: count it.
    Dropped,
    /// A WireGuard datagram that came through our relay, unwrapped, and the way back.
    WireGuard { payload: Vec<u8>, back: PathToPeer },
}

/// The owner core's NAT traversal: the ICE endpoint and the paths it selected.
pub(super) struct NatPaths {
    ice: IceEndpoint,
    /// The selected path of each peer (by id), and when it was selected.
    selected: HashMap<String, PathSince>,
    /// Framing scratch for relayed datagrams.
    frame: Vec<u8>,
    /// What was last published to the control plane.
    published: Vec<CandidateEndpoint>,
}

impl NatPaths {
    pub fn new(
        settings: &NatSettings,
        local_id: &str,
        secret: Option<[u8; 32]>,
        connect_timeout: Duration,
        keepalive: Duration,
        now: Instant,
    ) -> NatPaths {
        let mut config = IceConfig::new(local_id, settings.host_candidates.clone());
        config.secret = secret.map(|k| k.to_vec()).unwrap_or_default();
        config.stun_servers = settings.stun_servers.clone();
        config.turn_servers = settings.turn_servers.clone();
        config.keepalive_interval = keepalive.max(Duration::from_secs(1));
        config.agent.stun_timeout = settings.stun_timeout.max(Duration::from_millis(500));
        config.agent.connect_timeout = connect_timeout;
        config.agent.direct_connect = settings.direct_connect;
        config.agent.relay_enabled = settings.relay_enabled;
        tracing::info!(local = %local_id, ?settings, "mesh NAT traversal starting");
        NatPaths {
            ice: IceEndpoint::new(config, now),
            selected: HashMap::new(),
            frame: Vec::with_capacity(2048),
            published: Vec::new(),
        }
    }

    /// A peer of the registry's list (again when its candidates changed).
    /// Adds or updates peer `id`; `pair_key` (the X25519 shared secret of our static keys)
    /// keys its check password.
    pub fn set_peer(
        &mut self,
        id: &str,
        pair_key: &[u8; 32],
        candidates: &[CandidateEndpoint],
        now: Instant,
    ) {
        for e in self.ice.set_peer(id, pair_key, candidates, now) {
            tracing::debug!(peer = %id, error = %e, "mesh peer candidate skipped");
        }
    }

    pub fn remove_peer(&mut self, id: &str) {
        self.ice.remove_peer(id);
        self.selected.remove(id);
    }

    /// The path the checks selected for peer `id`, and when.
    pub fn selected(&self, id: &str) -> Option<PathSince> {
        self.selected.get(id).copied()
    }

    /// A STUN or ChannelData datagram from the socket.
    pub fn handle(&mut self, from: SocketAddr, d: &[u8], now: Instant) -> Inbound {
        match self.ice.handle_datagram(from, d, now) {
            Received::Consumed => Inbound::Consumed,
            Received::Dropped => Inbound::Dropped,
            Received::Data { from, via, payload } => Inbound::WireGuard {
                payload: payload.into_owned(),
                back: match via {
                    Via::Relay(server) => arrival(from, Some(server), &[]),
                    Via::Direct => PathToPeer::Direct(from),
                },
            },
        }
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.ice.poll_timeout()
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        self.ice.handle_timeout(now);
    }

    /// Moves what the endpoint wants sent into `out` and applies its events: new candidates
    /// are published to the control plane, selected paths recorded. Returns the peers whose
    /// path was selected (their handshake can go at once).
    pub fn drain(
        &mut self,
        out: &mut Vec<(SocketAddr, Vec<u8>)>,
        shared: &MeshShared,
    ) -> Vec<String> {
        while let Some(t) = self.ice.poll_transmit() {
            out.push((t.to, t.bytes));
        }
        let mut newly = Vec::new();
        let mut republish = false;
        while let Some(event) = self.ice.poll_event() {
            match event {
                Event::CandidateGathered(c) => {
                    tracing::info!(kind = c.kind.endpoint_type(), addr = %c.addr, "mesh candidate gathered");
                    republish = true;
                }
                Event::ServerFailed { server, error } => {
                    tracing::warn!(%server, error = %error, "mesh STUN/TURN server failed");
                    republish = true;
                }
                Event::PathSelected { peer, path } => {
                    let p = path_to_peer(&path);
                    tracing::info!(%peer, path = ?p, "mesh path selected");
                    self.selected.insert(peer.clone(), (p, Instant::now()));
                    newly.push(peer);
                }
                Event::PathLost { peer } => {
                    tracing::info!(%peer, "mesh path lost: checking again");
                    self.selected.remove(&peer);
                }
                Event::Unreachable { peer } => {
                    tracing::debug!(%peer, "mesh connectivity checks found no path yet");
                }
            }
        }
        if republish || self.published.is_empty() {
            let now = self.ice.local_endpoints();
            if now != self.published {
                shared.candidates.store(Arc::new(now.clone()));
                shared.candidates_version.fetch_add(1, Relaxed);
                self.published = now;
            }
        }
        newly
    }

    /// `d` framed for `path`: where it goes and what is sent. None when the path names a TURN
    /// server we have no allocation on (any more).
    pub fn frame(&mut self, path: PathToPeer, d: Vec<u8>) -> Option<(SocketAddr, Vec<u8>)> {
        match path {
            PathToPeer::Direct(to)
            | PathToPeer::Relayed {
                turn: None,
                remote: to,
            } => Some((to, d)),
            PathToPeer::Relayed {
                turn: Some(server),
                remote,
            } => {
                let (to, framed) =
                    self.ice
                        .encapsulate_via(Via::Relay(server), remote, &d, &mut self.frame)?;
                Some((to, if framed { self.frame.clone() } else { d }))
            }
        }
    }

    /// Releases the TURN allocations (the data plane stops); the goodbyes go to `out`.
    pub fn close(&mut self, now: Instant, out: &mut Vec<(SocketAddr, Vec<u8>)>) {
        self.ice.close(now);
        while let Some(t) = self.ice.poll_transmit() {
            out.push((t.to, t.bytes));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ice_paths_map_to_direct_or_relayed() {
        let remote = a("198.51.100.7:4000");
        let turn = a("203.0.113.1:3478");
        let path = |kind, via| Path { kind, via, remote };
        assert_eq!(
            path_to_peer(&path(PathKind::Direct, Via::Direct)),
            PathToPeer::Direct(remote)
        );
        // the peer's relay, reached straight from our socket
        let to_their_relay = path_to_peer(&path(PathKind::Relayed, Via::Direct));
        assert_eq!(to_their_relay, PathToPeer::Relayed { turn: None, remote });
        assert_eq!(to_their_relay.connection_type(), "relayed");
        // through our allocation
        let via_ours = path_to_peer(&path(PathKind::Relayed, Via::Relay(turn)));
        assert_eq!(
            via_ours,
            PathToPeer::Relayed {
                turn: Some(turn),
                remote
            }
        );
        assert_eq!(PathToPeer::Direct(remote).connection_type(), "direct");
    }

    #[test]
    fn the_selected_path_wins_then_the_learnt_one_then_the_published_ones() {
        let published = [a("192.0.2.1:1"), a("192.0.2.2:2")];
        let learnt = PathToPeer::Direct(a("198.51.100.9:9"));
        let relayed = PathToPeer::Relayed {
            turn: Some(a("203.0.113.1:3478")),
            remote: a("203.0.113.1:50000"),
        };
        let t0 = Instant::now();
        let (earlier, later) = (t0, t0 + Duration::from_secs(1));
        // a relayed selection wins over a direct address learnt earlier …
        assert_eq!(
            choose(
                Some((relayed, later)),
                Some((learnt, earlier)),
                &published,
                0,
                true
            ),
            Some(relayed)
        );
        // … and a direct selection (the upgrade) over a relayed arrival
        let direct = PathToPeer::Direct(a("198.51.100.2:7"));
        assert_eq!(
            choose(
                Some((direct, later)),
                Some((relayed, earlier)),
                &published,
                0,
                true
            ),
            Some(direct)
        );
        // but a way an authenticated datagram proved after the selection is not overridden
        assert_eq!(
            choose(
                Some((direct, earlier)),
                Some((learnt, later)),
                &published,
                0,
                true
            ),
            Some(learnt)
        );
        // before any selection: where the peer's datagrams came from (peer-reflexive)
        assert_eq!(
            choose(None, Some((learnt, t0)), &published, 0, true),
            Some(learnt)
        );
        // nothing learnt: the published endpoints in turn
        assert_eq!(
            choose(None, None, &published, 3, true),
            Some(PathToPeer::Direct(published[1]))
        );
        assert_eq!(choose(None, None, &[], 0, true), None);
        // direct_connect off: only relayed paths, never a published or learnt direct one
        assert_eq!(choose(None, Some((learnt, t0)), &published, 0, false), None);
        assert_eq!(
            choose(None, Some((relayed, t0)), &published, 0, false),
            Some(relayed)
        );
    }

    #[test]
    fn an_arrival_is_answered_the_way_it_came() {
        let from = a("198.51.100.4:6000");
        let turn = a("203.0.113.1:3478");
        assert_eq!(arrival(from, None, &[]), PathToPeer::Direct(from));
        assert_eq!(
            arrival(from, Some(turn), &[]),
            PathToPeer::Relayed {
                turn: Some(turn),
                remote: from
            }
        );
        // from the peer's own allocation: relayed, answered straight to it
        let theirs = a("203.0.113.1:50001");
        assert_eq!(
            arrival(theirs, None, &[theirs]),
            PathToPeer::Relayed {
                turn: None,
                remote: theirs
            }
        );
        let endpoint = |address: &str, port, kind: &str| CandidateEndpoint {
            address: address.into(),
            port,
            kind: kind.into(),
            priority: 1,
        };
        assert_eq!(
            relay_addresses(&[
                endpoint("192.0.2.1", 1, "lan"),
                endpoint("203.0.113.1", 50001, "relay"),
                endpoint("nonsense", 2, "relay"),
            ]),
            [theirs]
        );
    }
}
