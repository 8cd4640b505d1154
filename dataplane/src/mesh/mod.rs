//! The mesh peer's data plane (issue 13): one owner core runs the mesh — the UDP socket every
//! peer-to-peer datagram uses, one boringtun session per peer the registry lists, and the mesh
//! TUN device. IP packets from the device go to the peer that owns the destination virtual IP;
//! datagrams from the socket are demultiplexed ([`wire::classify`]) and decrypted, then written
//! to the device, consumed as control traffic (port [`wire::CONTROL_PORT`]) or forwarded. In TAP
//! mode the device carries Ethernet frames, which travel as EtherIP between the virtual IPs
//! (group and unknown destinations to every peer, MACs learnt per session).
//!
//! The control plane (tokio) talks to the owner only through [`MeshShared`]: it publishes the
//! peer table as an `ArcSwap` snapshot and wakes the owner, reads per-peer atomics, and raises
//! the stop flag. Nothing here waits on a lock the control plane can hold.
//!
//! Seams for what comes next: [`PathToPeer`] (only `Direct` today; the TURN relay and
//! via-peer paths of `switchyard-ice` / `switchyard-mesh-routing` join it) and [`next_hop`]
//! (the destination's own session today; the distance-vector table later). Datagrams for
//! the ICE agent (STUN, ChannelData) and control messages other than latency probes are
//! dropped and counted by their hooks until those crates are plugged in.

mod runner;
pub mod wire;

use arc_swap::ArcSwap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

pub use crate::wireguard::flow::Wake;
pub(crate) use runner::run;

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
    /// Its published endpoints, best first.
    pub endpoints: Vec<SocketAddr>,
    /// When it joined (registry, Unix ms): a peer that left and joined again has lost its
    /// sessions, so ours with it starts afresh instead of waiting for a stale one to time out.
    pub joined_ms: i64,
    pub counters: Arc<PeerCounters>,
}

/// The peers the data plane may talk to (the registry's list without this peer).
#[derive(Debug, Default)]
pub struct PeerTable {
    pub peers: Vec<Arc<PeerEntry>>,
}

/// How datagrams reach a peer. Only direct paths exist today; the TURN relay (`Relayed`) and
/// multi-hop (`ViaPeer`) arrive with the ICE and routing crates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathToPeer {
    /// Straight to one of the peer's endpoints (host or server-reflexive candidate).
    Direct(SocketAddr),
}

impl PathToPeer {
    /// The `connection_type` of the client view.
    pub fn connection_type(&self) -> &'static str {
        match self {
            PathToPeer::Direct(_) => "direct",
        }
    }
}

/// The peer whose session carries packets for `dst`: today the peer that owns `dst`
/// (direct routes only); the distance-vector table answers here later.
pub fn next_hop(table: &PeerTable, dst: Ipv4Addr) -> Option<&Arc<PeerEntry>> {
    table.peers.iter().find(|p| p.vip == dst)
}

/// Totals of the mesh and the drops of each kind.
#[derive(Debug, Default)]
pub struct MeshTotals {
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    pub packets_sent: AtomicU64,
    pub packets_received: AtomicU64,
    /// STUN / ChannelData datagrams: the ICE hook drops them until `switchyard-ice` is in.
    pub ice_dropped: AtomicU64,
    /// Control messages other than latency probes (route announcements, until the routing
    /// crate is in).
    pub control_dropped: AtomicU64,
    /// Handshakes from a key the registry does not list.
    pub unknown_key: AtomicU64,
    /// Datagrams of no known kind or session, or failing authentication.
    pub invalid: AtomicU64,
    /// Packets for a virtual IP without a usable session (or forwarding off).
    pub no_route: AtomicU64,
    /// Packets dropped because a queue or the device was full.
    pub overflow: AtomicU64,
}

/// What the control plane and the owner core share.
#[derive(Debug, Default)]
pub struct MeshShared {
    pub peers: ArcSwap<PeerTable>,
    /// This peer's virtual IP (changes when a lost lease is registered again).
    pub local_vip: AtomicU32,
    pub totals: MeshTotals,
    /// Wakes the owner: a new peer table, a packet from the device, stop.
    pub wake: Wake,
    pub stop: AtomicBool,
    /// True while the owner runs.
    pub running: AtomicBool,
    /// Unix ms of the owner's last loop turn (at least every 250 ms while it runs): an owner
    /// whose core panicked stops stamping it.
    pub beat_ms: AtomicU64,
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
    pub private_key: [u8; 32],
    /// The network's pre-shared key (WireGuard PSK), when configured.
    pub preshared_key: Option<[u8; 32]>,
    pub keep_alive: Duration,
    /// A peer that does not complete a handshake within this is marked unreachable.
    pub connect_timeout: Duration,
    /// Forward decrypted packets for other virtual IPs (hop by hop, TTL decremented).
    pub relay_via_peers: bool,
    /// TAP mode: the device carries Ethernet frames, sent to peers as EtherIP.
    pub layer2: bool,
}

impl std::fmt::Debug for MeshSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshSettings")
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

/// Creates the mesh TUN device `name` (layer 3, no offloads: the mesh moves one IP packet per
/// WireGuard message); it disappears when the last descriptor closes.
pub fn open_device(name: &str) -> std::io::Result<std::fs::File> {
    crate::sys::open_tun_plain(name)
}
