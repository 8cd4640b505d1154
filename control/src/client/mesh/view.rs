//! The client mesh API's resources built from what the registry lists and what the data plane
//! measured: Mesh peer (client view), Mesh route, and the totals of the Mesh status.
//! Runtime-free.

use chrono::{DateTime, TimeZone, Utc};
use std::sync::atomic::Ordering::Relaxed;
use switchyard_api::client::{MeshPeerView, MeshRouteView};
use switchyard_api::MeshPeer;
use switchyard_dataplane::mesh::{PeerCounters, SessionState};

/// Metric of a route: latency in ms plus 100 per hop (spec).
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

/// One peer as the client shows it; `counters` is `None` for a peer the data plane has no
/// session for (yet).
pub fn peer_view(peer: &MeshPeer, counters: Option<&PeerCounters>) -> MeshPeerView {
    let state = counters.map_or(SessionState::Connecting, PeerCounters::state);
    let load = |f: fn(&PeerCounters) -> u64| counters.map_or(0, f);
    let connected = state == SessionState::Connected;
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
        status: status_word(state).into(),
        connection_type: if connected {
            "direct".into()
        } else {
            String::new()
        },
        latency_ms: latency_ms(load(|c| c.rtt_us.load(Relaxed))),
        last_seen: at_ms(load(|c| c.last_seen_ms.load(Relaxed))).unwrap_or(peer.last_seen),
        joined_at: peer.joined_at,
        bytes_sent: load(|c| c.bytes_sent.load(Relaxed)),
        bytes_received: load(|c| c.bytes_received.load(Relaxed)),
        endpoints: peer.endpoints.clone(),
        metadata: peer.metadata.clone(),
    }
}

/// The route to a peer with a session: direct, one hop. `None` while there is no session.
pub fn direct_route(peer: &MeshPeer, counters: &PeerCounters) -> Option<MeshRouteView> {
    if counters.state() != SessionState::Connected {
        return None;
    }
    let latency = latency_ms(counters.rtt_us.load(Relaxed));
    Some(MeshRouteView {
        dest_peer_id: peer.id.clone(),
        dest_ip: peer.virtual_ip.clone(),
        next_hop: String::new(),
        kind: "direct".into(),
        metric: metric(latency, 1),
        latency_ms: latency,
        hop_count: 1,
        last_updated: at_ms(counters.last_handshake_ms.load(Relaxed)).unwrap_or_else(Utc::now),
        active: true,
    })
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
    fn a_peer_without_a_session_has_no_route_and_shows_connecting() {
        let p = peer();
        let view = peer_view(&p, None);
        assert_eq!(view.status, "connecting");
        assert_eq!(view.connection_type, "");
        assert_eq!(view.latency_ms, 0);
        assert_eq!(view.metadata["site"], "lab");
        assert!(direct_route(&p, &PeerCounters::default()).is_none());
    }

    #[test]
    fn a_connected_peer_has_a_direct_route_with_the_spec_metric() {
        let p = peer();
        let c = PeerCounters::default();
        c.set_state(SessionState::Connected);
        c.rtt_us.store(1_200, Relaxed);
        c.bytes_sent.store(42, Relaxed);
        c.last_seen_ms.store(1_800_000_000_000, Relaxed);
        let view = peer_view(&p, Some(&c));
        assert_eq!(
            (view.status.as_str(), view.connection_type.as_str()),
            ("connected", "direct")
        );
        assert_eq!((view.latency_ms, view.bytes_sent), (2, 42));
        assert_eq!(view.last_seen.timestamp_millis(), 1_800_000_000_000);
        let r = direct_route(&p, &c).unwrap();
        assert_eq!((r.metric, r.hop_count, r.next_hop.as_str()), (102, 1, ""));
        assert_eq!(
            (r.dest_ip.as_str(), r.kind.as_str(), r.active),
            ("10.100.0.3", "direct", true)
        );
        assert_eq!(
            latency_ms(300),
            1,
            "a measured sub-millisecond round trip shows as 1"
        );
        assert_eq!(metric(35, 2), 235);
    }
}
