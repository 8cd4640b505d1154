//! The client mesh API's resources built from what the registry lists and what the data plane
//! measured: Mesh peer (client view), Mesh route, and the totals of the Mesh status.
//! Runtime-free.

use chrono::{DateTime, TimeZone, Utc};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use switchyard_api::client::{MeshPeerView, MeshRouteView};
use switchyard_api::MeshPeer;
use switchyard_dataplane::mesh::{MeshRoute, PeerCounters, SessionState};

/// Metric of a route: latency in ms plus 100 per hop (spec). A hop is a link: a direct route
/// has one, a route through one other peer two.
pub fn metric(latency_ms: u64, hops: u64) -> u64 {
    latency_ms + hops * 100
}

/// A measured round trip in whole milliseconds, rounded up so that a measured sub-millisecond
/// LAN latency shows as 1 and 0 keeps meaning "not measured yet".
pub fn latency_ms(rtt_us: u64) -> u64 {
    rtt_us.div_ceil(1000)
}

fn at_ms(ms: u64) -> Option<DateTime<Utc>> {
    (ms > 0)
        .then(|| Utc.timestamp_millis_opt(ms as i64).single())
        .flatten()
}

pub fn status_word(s: SessionState) -> &'static str {
    match s {
        SessionState::Connecting => "connecting",
        SessionState::Connected => "connected",
        SessionState::Unreachable => "unreachable",
    }
}

/// The route in use to peer `id` when it goes through other peers (the peer is then reached
/// "multi-hop").
pub fn multi_hop_route<'a>(routes: &'a [MeshRoute], id: &str) -> Option<&'a MeshRoute> {
    routes
        .iter()
        .find(|r| r.active && r.relayed && r.dest_peer_id == id)
}

/// How this peer reaches the others: over a session of its own (direct, or through a TURN
/// relay), or only through other peers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reach {
    pub peers: u64,
    pub direct: u64,
    pub relayed: u64,
    pub multi_hop: u64,
}

impl Reach {
    pub fn connected(&self) -> u64 {
        self.direct + self.relayed + self.multi_hop
    }

    /// The `connection_type` a heartbeat reports for this peer, the least direct way it reaches
    /// any peer: `relayed` while a session goes through a TURN relay, else `multi-hop` while
    /// some peer is reached only through others, else `direct` while any session is up, else
    /// none (still being discovered).
    pub fn connection_type(&self) -> Option<&'static str> {
        if self.relayed > 0 {
            Some("relayed")
        } else if self.multi_hop > 0 {
            Some("multi-hop")
        } else if self.direct > 0 {
            Some("direct")
        } else {
            None
        }
    }
}

/// Counts the listed `peers` by how they are reached: a session that is up is direct or relayed
/// (its path); a peer without one that the routing table reaches through others is multi-hop.
pub fn reach(
    peers: &[MeshPeer],
    counters: &HashMap<String, ([u8; 32], Arc<PeerCounters>)>,
    routes: &[MeshRoute],
) -> Reach {
    let mut r = Reach {
        peers: peers.len() as u64,
        ..Reach::default()
    };
    for p in peers {
        let session = counters
            .get(&p.id)
            .filter(|(_, c)| c.state() == SessionState::Connected);
        if let Some((_, c)) = session {
            match c.path_type() {
                Some("relayed") => r.relayed += 1,
                // a session of its own, its datagrams through other members
                Some("multi-hop") => r.multi_hop += 1,
                _ => r.direct += 1,
            }
        } else if multi_hop_route(routes, &p.id).is_some() {
            r.multi_hop += 1;
        }
    }
    r
}

/// One peer as the client shows it; `counters` is `None` for a peer the data plane has no
/// session for (yet); `via` is the route in use when the peer is reached through others.
pub fn peer_view(
    peer: &MeshPeer,
    counters: Option<&PeerCounters>,
    via: Option<&MeshRoute>,
) -> MeshPeerView {
    let state = counters.map_or(SessionState::Connecting, PeerCounters::state);
    let load = |f: fn(&PeerCounters) -> u64| counters.map_or(0, f);
    let connected = state == SessionState::Connected;
    // reached through others: with no session up, or a session whose datagrams go through them
    let through_peers = counters.and_then(PeerCounters::path_type) == Some("multi-hop");
    let multi_hop = via.is_some() && (!connected || through_peers);
    let status = if multi_hop {
        "connected"
    } else {
        status_word(state)
    };
    let latency = match via {
        Some(r) if multi_hop => u64::from(r.latency_ms),
        _ => latency_ms(load(|c| c.rtt_us.load(Relaxed))),
    };
    MeshPeerView {
        id: peer.id.clone(),
        name: peer.name.clone(),
        virtual_ip: peer.virtual_ip.clone(),
        // TAP peers publish their device's MAC as the `mac` metadata; TUN peers have none
        virtual_mac: peer
            .metadata
            .get("mac")
            .and_then(|m| m.as_str())
            .unwrap_or_default()
            .to_owned(),
        public_key: peer.public_key.clone(),
        status: status.into(),
        connection_type: if multi_hop {
            "multi-hop".into()
        } else if connected {
            // the kind of path the session's datagrams take (direct until one is measured)
            counters
                .and_then(PeerCounters::path_type)
                .unwrap_or("direct")
                .into()
        } else {
            String::new()
        },
        latency_ms: latency,
        last_seen: at_ms(load(|c| c.last_seen_ms.load(Relaxed))).unwrap_or(peer.last_seen),
        joined_at: peer.joined_at,
        bytes_sent: load(|c| c.bytes_sent.load(Relaxed)),
        bytes_received: load(|c| c.bytes_received.load(Relaxed)),
        endpoints: peer.endpoints.clone(),
        metadata: peer.metadata.clone(),
    }
}

/// One route of the data plane's routing table as the API shows it: hops counted as links
/// (1 for direct), the metric from latency and hops.
pub fn route_view(r: &MeshRoute) -> MeshRouteView {
    let hops = u64::from(r.peers_between) + 1;
    let latency = u64::from(r.latency_ms);
    MeshRouteView {
        dest_peer_id: r.dest_peer_id.clone(),
        dest_ip: r.dest_ip.to_string(),
        next_hop: r.next_hop.clone(),
        kind: if r.relayed { "relayed" } else { "direct" }.into(),
        metric: metric(latency, hops),
        latency_ms: latency,
        hop_count: hops,
        last_updated: at_ms(r.last_updated_ms).unwrap_or_else(Utc::now),
        active: r.active,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn peer() -> MeshPeer {
        serde_json::from_value(serde_json::json!({
            "id": "b", "name": "peer b", "public_key": "AAAA", "virtual_ip": "10.100.0.3",
            "endpoints": [{"address": "192.0.2.1", "port": 4000, "type": "lan", "priority": 1}],
            "metadata": {"site": "lab"}, "status": "connected",
            "last_seen": "2026-01-01T00:00:00Z", "joined_at": "2026-01-01T00:00:00Z",
            "lease_expires": "2026-01-01T00:05:00Z", "bytes_sent": 0, "bytes_received": 0
        }))
        .unwrap()
    }

    #[test]
    fn a_peer_without_a_session_shows_connecting() {
        let p = peer();
        let view = peer_view(&p, None, None);
        assert_eq!(view.status, "connecting");
        assert_eq!(view.connection_type, "");
        assert_eq!(view.latency_ms, 0);
        assert_eq!(view.metadata["site"], "lab");
    }

    #[test]
    fn a_connected_peer_shows_direct_with_its_measured_latency() {
        let p = peer();
        let c = PeerCounters::default();
        c.set_state(SessionState::Connected);
        c.rtt_us.store(1_200, Relaxed);
        c.bytes_sent.store(42, Relaxed);
        c.last_seen_ms.store(1_800_000_000_000, Relaxed);
        let view = peer_view(&p, Some(&c), None);
        assert_eq!(
            (view.status.as_str(), view.connection_type.as_str()),
            ("connected", "direct")
        );
        assert_eq!((view.latency_ms, view.bytes_sent), (2, 42));
        assert_eq!(view.last_seen.timestamp_millis(), 1_800_000_000_000);
        assert_eq!(
            latency_ms(300),
            1,
            "a measured sub-millisecond round trip shows as 1"
        );
        assert_eq!(metric(35, 2), 235);
    }

    fn route(relayed: bool, active: bool) -> MeshRoute {
        MeshRoute {
            dest_peer_id: "b".into(),
            dest_ip: "10.100.0.3".parse().unwrap(),
            next_hop: if relayed { "c".into() } else { String::new() },
            relayed,
            latency_ms: 7,
            peers_between: u8::from(relayed),
            last_updated_ms: 1_800_000_000_000,
            active,
        }
    }

    #[test]
    fn routes_count_hops_as_links_and_a_peer_behind_another_is_multi_hop() {
        let direct = route_view(&route(false, true));
        assert_eq!(
            (
                direct.kind.as_str(),
                direct.next_hop.as_str(),
                direct.hop_count,
                direct.metric
            ),
            ("direct", "", 1, 107)
        );
        let relayed = route_view(&route(true, true));
        assert_eq!(
            (
                relayed.kind.as_str(),
                relayed.next_hop.as_str(),
                relayed.hop_count,
                relayed.metric
            ),
            ("relayed", "c", 2, 207)
        );
        assert_eq!(relayed.last_updated.timestamp_millis(), 1_800_000_000_000);

        let routes = [route(false, false), route(true, true)];
        let via = multi_hop_route(&routes, "b");
        assert_eq!(via, Some(&routes[1]));
        let p = peer();
        let unreachable = PeerCounters::default();
        unreachable.set_state(SessionState::Unreachable);
        let view = peer_view(&p, Some(&unreachable), via);
        assert_eq!(
            (
                view.status.as_str(),
                view.connection_type.as_str(),
                view.latency_ms
            ),
            ("connected", "multi-hop", 7)
        );
        // a session of its own wins: the peer is direct …
        let c = PeerCounters::default();
        c.set_state(SessionState::Connected);
        assert_eq!(peer_view(&p, Some(&c), via).connection_type, "direct");
        // … or relayed, when its datagrams go through a TURN relay
        c.set_path(Some(&switchyard_dataplane::mesh::PathToPeer::Relayed {
            turn: None,
            remote: "203.0.113.1:50000".parse().unwrap(),
        }));
        assert_eq!(peer_view(&p, Some(&c), via).connection_type, "relayed");
        assert!(multi_hop_route(&[route(true, false)], "b").is_none());
    }

    #[test]
    fn a_peer_reaching_some_peers_only_through_others_reports_multi_hop() {
        let mut c = peer();
        c.id = "c".into();
        let up = Arc::new(PeerCounters::default());
        up.set_state(SessionState::Connected);
        let down = Arc::new(PeerCounters::default());
        let counters = HashMap::from([
            ("b".to_owned(), ([0; 32], up.clone())),
            ("c".to_owned(), ([1; 32], down)),
        ]);
        let mut via = route(true, true);
        via.dest_peer_id = "c".into();
        let r = reach(&[peer(), c.clone()], &counters, &[via]);
        assert_eq!(
            (r.peers, r.direct, r.multi_hop, r.connected()),
            (2, 1, 1, 2)
        );
        assert_eq!(r.connection_type(), Some("multi-hop"));
        let r = reach(&[peer(), c], &counters, &[]);
        assert_eq!((r.connected(), r.connection_type()), (1, Some("direct")));
        assert_eq!(reach(&[], &counters, &[]).connection_type(), None);
        // a session through a TURN relay outranks both
        let relayed = Reach {
            peers: 3,
            direct: 1,
            relayed: 1,
            multi_hop: 1,
        };
        assert_eq!(relayed.connection_type(), Some("relayed"));
    }
}
