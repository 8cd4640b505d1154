//! The mesh peer's data plane (issue 13): one owner core runs the mesh — the UDP socket every
//! peer-to-peer datagram uses, one boringtun session per peer the registry lists, and the mesh
//! TUN device. IP packets from the device go to the peer that owns the destination virtual IP;
//! datagrams from the socket are demultiplexed ([`wire::classify`]) and decrypted, then written
//! to the device, consumed as control traffic (port [`wire::CONTROL_PORT`]), or — relay
//! envelopes (port [`wire::RELAY_PORT`]) — handed to the session they belong to or passed on. In TAP
//! mode the device carries Ethernet frames, which travel as EtherIP between the virtual IPs
//! (group and unknown destinations to every peer, MACs learnt per session).
//!
//! The control plane (tokio) talks to the owner only through [`MeshShared`]: it publishes the
//! peer table as an `ArcSwap` snapshot and wakes the owner, reads per-peer atomics, and raises
//! the stop flag. Nothing here waits on a lock the control plane can hold.
//!
//! Routing (`switchyard-mesh-routing`): the owner core drives one `Router` — sessions that come
//! up or go are its neighbours (with the latency its probes measure), its announcements and
//! probes travel on the control port inside the sessions. Every pair of members has a session
//! of its own: the datagrams of one with a peer the underlay does not reach travel in relay
//! envelopes through the session with the router's next hop, which passes them on when it has
//! `relay_via_peers` (a peer that does not relay offers no routes) and cannot read or forge
//! them. The routes are published to the control plane as [`MeshRoute`] snapshots.
//!
//! NAT traversal (`switchyard-ice`, module [`nat`]): the owner core gathers server-reflexive
//! and relayed candidates, runs connectivity checks against the candidates the registry lists
//! for each peer and sends each peer's WireGuard datagrams on the path the checks selected
//! ([`PathToPeer`]: direct, or through a TURN relay). The gathered candidates reach the control
//! plane as an `ArcSwap` snapshot with a version counter ([`MeshShared::candidates`]), which
//! publishes them to the registry.
//!
//! Traffic modes (`runner/modes.rs`): a packet from the device is classified by its destination
//! (`switchyard_mesh_routing::classify_destination`): broadcast and multicast go as one copy
//! per reachable member (multicast: per member of the group) in our session with it, anycast
//! to the closest member. This peer's groups are learnt from the
//! device ([`membership`]: the IGMP reports the kernel writes to it, and the device's extra
//! addresses the control plane publishes in [`MeshShared::local_anycast`]). In TAP mode
//! broadcast, multicast and unknown-unicast frames take the same copies and unicast frames go
//! to the peer their MAC was learnt from, routed like any packet for its virtual IP.
//!
//! How the bytes move is `io`'s (batched socket and device I/O: UDP GSO/GRO, a TUN with
//! TSO and a virtio-net header, batched hand-off from the device thread) with its runtime-free
//! arithmetic in [`segment`]; runner.rs decides what each datagram and packet means.

mod io;
pub mod membership;
pub mod nat;
mod runner;
pub mod segment;
pub mod wire;

use arc_swap::ArcSwap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

pub use crate::wireguard::flow::Wake;
pub use nat::NatSettings;
pub(crate) use runner::run;
/// A candidate as the registry's Mesh endpoint (`lan`, `srflx`, `relay`).
pub use switchyard_ice::Endpoint as CandidateEndpoint;
/// One resolved `mesh.turn.servers` entry; the URL parser of `mesh.stun`/`mesh.turn` servers.
pub use switchyard_ice::{ServerUrl, TurnServerConfig};
/// `mesh.routing` as the router takes it.
pub use switchyard_mesh_routing::RoutingConfig;

/// Per-peer measurements, written by the owner core, read by the control plane.
#[derive(Debug, Default)]
pub struct PeerCounters {
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    pub packets_sent: AtomicU64,
    pub packets_received: AtomicU64,
    /// Unix milliseconds of the last completed handshake; 0 = never.
    pub last_handshake_ms: AtomicU64,
    /// Unix milliseconds of the last datagram authenticated as this peer's; 0 = never.
    pub last_seen_ms: AtomicU64,
    /// Round trip of the last latency probe in microseconds; 0 = not measured yet.
    pub rtt_us: AtomicU64,
    state: AtomicU8,
    /// The kind of path the session uses: 0 none, 1 direct, 2 relayed (TURN), 3 through other
    /// members (its datagrams in relay envelopes).
    path: AtomicU8,
}

/// Where a peer's session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// Handshaking (or not tried yet).
    Connecting,
    /// A current session exists.
    Connected,
    /// No handshake answer within `connect_timeout`; retried.
    Unreachable,
}

impl PeerCounters {
    pub fn state(&self) -> SessionState {
        match self.state.load(Relaxed) {
            1 => SessionState::Connected,
            2 => SessionState::Unreachable,
            _ => SessionState::Connecting,
        }
    }

    /// `direct` or `relayed`: how the session's datagrams travel; `None` without a path.
    pub fn path_type(&self) -> Option<&'static str> {
        match self.path.load(Relaxed) {
            1 => Some("direct"),
            2 => Some("relayed"),
            3 => Some("multi-hop"),
            _ => None,
        }
    }

    /// Written by the owner core: the session's datagrams travel through other members.
    pub fn set_through_peers(&self) {
        self.path.store(3, Relaxed);
    }

    /// Written by the owner core.
    pub fn set_path(&self, path: Option<&PathToPeer>) {
        let v = match path {
            None => 0,
            Some(PathToPeer::Direct(_)) => 1,
            Some(PathToPeer::Relayed { .. }) => 2,
        };
        self.path.store(v, Relaxed);
    }

    /// Written by the owner core.
    pub fn set_state(&self, s: SessionState) {
        let v = match s {
            SessionState::Connecting => 0,
            SessionState::Connected => 1,
            SessionState::Unreachable => 2,
        };
        self.state.store(v, Relaxed);
    }
}

/// One peer of the network as the registry lists it.
#[derive(Debug)]
pub struct PeerEntry {
    pub id: String,
    pub name: String,
    pub vip: Ipv4Addr,
    /// Its X25519 static public key: a handshake with any other key is refused.
    pub public_key: [u8; 32],
    /// Its published direct endpoints (host and server-reflexive), best first: where a
    /// handshake goes before NAT traversal selected a path.
    pub endpoints: Vec<SocketAddr>,
    /// Everything it published (also `relay`), for the connectivity checks.
    pub candidates: Vec<CandidateEndpoint>,
    /// When it joined (registry, Unix ms): a peer that left and joined again has lost its
    /// sessions, so ours with it starts afresh instead of waiting for a stale one to time out.
    pub joined_ms: i64,
    /// The anycast addresses the registry lists for it (`metadata.anycast`): the only ones it
    /// may send from or be chosen for besides its own address.
    pub anycast: Vec<Ipv4Addr>,
    pub counters: Arc<PeerCounters>,
}

/// The peers the data plane may talk to (the registry's list without this peer).
#[derive(Debug, Default)]
pub struct PeerTable {
    pub peers: Vec<Arc<PeerEntry>>,
}

/// How datagrams reach a peer's session over the underlay. (A session with a peer reached via
/// others sends its datagrams in relay envelopes through the next hop's session instead.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathToPeer {
    /// Straight to the peer (a host, server-reflexive or peer-reflexive address).
    Direct(SocketAddr),
    /// Through a TURN relay: framed for our allocation on `turn` (ChannelData or a Send
    /// indication) and relayed to `remote`, or (`turn` None) sent as it is to `remote`, the
    /// peer's own allocation, which relays it to the peer.
    Relayed {
        turn: Option<SocketAddr>,
        remote: SocketAddr,
    },
}

impl PathToPeer {
    /// The `connection_type` of the client view.
    pub fn connection_type(&self) -> &'static str {
        match self {
            PathToPeer::Direct(_) => "direct",
            PathToPeer::Relayed { .. } => "relayed",
        }
    }
}

/// The peer that owns the virtual IP `dst` (its own session is the direct path to it).
pub fn owner_of(table: &PeerTable, dst: Ipv4Addr) -> Option<&Arc<PeerEntry>> {
    table.peers.iter().find(|p| p.vip == dst)
}

/// One route of the owner core's routing table, for `GET /api/v1/mesh/routes` and the peer
/// view (the routing crate's `RouteView` with the time as wall clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshRoute {
    pub dest_peer_id: String,
    pub dest_ip: Ipv4Addr,
    /// The neighbour packets go to; empty for a direct route.
    pub next_hop: String,
    /// Through other peers (the routing crate's `relayed`).
    pub relayed: bool,
    /// Summed link latency in ms.
    pub latency_ms: u32,
    /// Peers between us and the destination (0 for a direct route).
    pub peers_between: u8,
    /// Unix ms of the last change or refresh.
    pub last_updated_ms: u64,
    /// The route in use for the destination (the others are alternatives).
    pub active: bool,
}

/// Totals of the mesh and the drops of each kind.
#[derive(Debug, Default)]
pub struct MeshTotals {
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    pub packets_sent: AtomicU64,
    pub packets_received: AtomicU64,
    /// STUN / ChannelData datagrams NAT traversal did not take (malformed, nobody's, or NAT
    /// traversal off).
    pub ice_dropped: AtomicU64,
    /// Control messages the router refused (malformed, stale, from a non-neighbour).
    pub control_dropped: AtomicU64,
    /// Handshakes from a key the registry does not list.
    pub unknown_key: AtomicU64,
    /// Handshake initiations refused before any key work: a mac1 not keyed to us, or a
    /// missing cookie while under load.
    pub handshakes_refused: AtomicU64,
    /// Cookie replies sent to initiations beyond the handshake rate (under load).
    pub handshake_cookies: AtomicU64,
    /// Route announcement entries for an id the registry does not list, or naming another
    /// virtual IP than the registry's.
    pub route_claims_refused: AtomicU64,
    /// TAP mode: frames from a member whose source MAC lives behind another member still
    /// active (a member cannot draw a neighbour's frames by sending with its MAC); not
    /// written to the device.
    pub mac_claims_refused: AtomicU64,
    /// Datagrams of no known kind or session, or failing authentication.
    pub invalid: AtomicU64,
    /// Packets for a virtual IP without a usable session.
    pub no_route: AtomicU64,
    /// Packets for another member that a session carried in plaintext (a relay passes on only
    /// envelopes, whose payload it cannot read), and envelopes this peer does not pass on
    /// (`relay_via_peers` off, TTL spent, a source no member holds).
    pub relay_refused: AtomicU64,
    /// Envelopes of other members' sessions passed on towards their destination.
    pub relayed: AtomicU64,
    /// IPv4 packets with "don't fragment" too large for a way through a relaying member
    /// (the device MTU less an envelope's [`wire::ENVELOPE_OVERHEAD`]): answered with ICMP
    /// "fragmentation needed", so the sender's path MTU adapts.
    pub too_big_for_relay: AtomicU64,
    /// Packets dropped because a queue or the device was full.
    pub overflow: AtomicU64,
    pub modes: ModeCounters,
}

/// Packets of each traffic mode other than unicast, and this peer's group memberships.
#[derive(Debug, Default)]
pub struct ModeCounters {
    /// Broadcast packets (TAP: broadcast and unknown-unicast frames) read from the device and
    /// sent to every reachable member.
    pub broadcast_sent: AtomicU64,
    /// Broadcast packets (TAP: frames to a group MAC) from members written to the device.
    pub broadcast_received: AtomicU64,
    pub multicast_sent: AtomicU64,
    pub multicast_received: AtomicU64,
    /// Anycast packets read from the device and sent to the closest member.
    pub anycast_sent: AtomicU64,
    /// Anycast packets for one of our anycast addresses written to the device.
    pub anycast_received: AtomicU64,
    /// Multicast groups joined on the device (IGMP) right now.
    pub multicast_groups: AtomicU64,
    /// Anycast addresses of the device right now.
    pub anycast_addresses: AtomicU64,
}

/// What the control plane and the owner core share.
#[derive(Debug, Default)]
pub struct MeshShared {
    pub peers: ArcSwap<PeerTable>,
    /// The routing table as the owner core last published it.
    pub routes: ArcSwap<Vec<MeshRoute>>,
    /// This peer's virtual IP (changes when a lost lease is registered again).
    pub local_vip: AtomicU32,
    /// The prefix length of the network's CIDR (0 until known: every address is then unicast
    /// except 255.255.255.255).
    pub network_prefix: AtomicU8,
    /// The anycast addresses of this peer: extra addresses of the mesh device inside the
    /// network, as the control plane last read them.
    pub local_anycast: ArcSwap<Vec<Ipv4Addr>>,
    pub totals: MeshTotals,
    /// Wakes the owner: a new peer table, a packet from the device, stop.
    pub wake: Wake,
    pub stop: AtomicBool,
    /// True while the owner runs.
    pub running: AtomicBool,
    /// Unix ms of the owner's last loop turn (at least every 250 ms while it runs): an owner
    /// whose core panicked stops stamping it.
    pub beat_ms: AtomicU64,
    /// Our candidates as NAT traversal last gathered them (host, server-reflexive, relayed) …
    pub candidates: ArcSwap<Vec<CandidateEndpoint>>,
    /// … and how often they changed: the control plane publishes them when this moves.
    pub candidates_version: AtomicU64,
}

impl MeshShared {
    pub fn publish(&self, table: PeerTable) {
        self.peers.store(Arc::new(table));
        self.wake.notify();
    }

    pub fn set_local_vip(&self, vip: Ipv4Addr) {
        self.local_vip.store(u32::from(vip), Relaxed);
        self.wake.notify();
    }

    pub fn set_network_prefix(&self, prefix: u8) {
        self.network_prefix.store(prefix.min(32), Relaxed);
    }

    /// Publishes the device's anycast addresses (the owner applies them at its next tick).
    pub fn set_local_anycast(&self, mut addresses: Vec<Ipv4Addr>) {
        addresses.sort();
        addresses.dedup();
        if **self.local_anycast.load() != addresses {
            self.local_anycast.store(Arc::new(addresses));
        }
    }

    /// The network the local virtual IP is in (0.0.0.0/0 until the prefix is known).
    pub fn network(&self) -> ipnet::Ipv4Net {
        let prefix = self.network_prefix.load(Relaxed);
        ipnet::Ipv4Net::new(self.local_vip(), prefix)
            .unwrap_or_default()
            .trunc()
    }

    pub fn local_vip(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.local_vip.load(Relaxed))
    }

    /// Whether the owner turned its loop within `within` (it is alive).
    pub fn owner_alive(&self, within: Duration) -> bool {
        let beat = self.beat_ms.load(Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        beat > 0 && now.saturating_sub(beat) <= within.as_millis() as u64
    }

    pub fn request_stop(&self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.wake.notify();
    }
}

/// Session parameters of the mesh.
#[derive(Clone)]
pub struct MeshSettings {
    /// This peer's id in the network (the router's name for us).
    pub local_id: String,
    /// `mesh.routing`: max_hops, route_timeout, split_horizon.
    pub routing: RoutingConfig,
    pub private_key: [u8; 32],
    /// The network's pre-shared key (WireGuard PSK), when configured.
    pub preshared_key: Option<[u8; 32]>,
    pub keep_alive: Duration,
    /// A peer that does not complete a handshake within this is marked unreachable.
    pub connect_timeout: Duration,
    /// Pass on relay envelopes for other members (hop by hop, TTL decremented) and offer
    /// routes through this peer.
    pub relay_via_peers: bool,
    /// TAP mode: the device carries Ethernet frames, sent to peers as EtherIP.
    pub layer2: bool,
    /// `mesh.device.mtu`: what the device passes in one packet.
    pub device_mtu: u32,
    /// NAT traversal: candidates, STUN and TURN servers, the path policy.
    pub nat: NatSettings,
}

impl std::fmt::Debug for MeshSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshSettings")
            .field("local_id", &self.local_id)
            .field("routing", &self.routing)
            .field("keep_alive", &self.keep_alive)
            .field("connect_timeout", &self.connect_timeout)
            .field("relay_via_peers", &self.relay_via_peers)
            .finish_non_exhaustive()
    }
}

/// Everything the owner core needs to run the mesh: handed over by
/// [`crate::commands::Command::StartMesh`].
pub struct MeshStart {
    pub settings: MeshSettings,
    pub shared: Arc<MeshShared>,
    /// The bound mesh socket (the control plane chose the port and published it).
    pub socket: std::net::UdpSocket,
    /// The mesh TUN device, configured (address, MTU, up) by the control plane.
    pub device: std::fs::File,
}

/// Creates the mesh TAP device `name` (Ethernet frames; TAP mode).
pub fn open_tap_device(name: &str) -> std::io::Result<std::fs::File> {
    crate::sys::open_tap(name)
}

/// Creates the mesh TUN device `name` (layer 3); it disappears when the last descriptor
/// closes. With a virtio-net header and TSO/checksum offload when the kernel takes them, so a
/// read takes a TCP super-packet that the reader cuts into segments (`segment::split`); each
/// segment is still one WireGuard message.
pub fn open_device(name: &str) -> std::io::Result<std::fs::File> {
    crate::sys::open_tun(name)
}
