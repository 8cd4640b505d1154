//! The mesh on its owner core: the sessions, the socket, the device, the timers. Three tasks
//! share one [`Mesh`] through a `RefCell` on this core: the receiver (datagrams from the
//! socket, never cancelled mid-receive), the main loop (packets from the device, peer-table
//! changes, timers, the router's announcements) and nothing else; a plain thread reads the
//! device (a TUN descriptor cannot be awaited on glommio's ring) and hands packets over a
//! bounded queue. How the bytes move (batched, offloaded) is `super::io`'s business; this
//! file decides what to do with each datagram and each packet. The traffic modes (broadcast,
//! multicast, anycast, TAP frames) are in [`modes`].

mod modes;

use super::io::{self, Device, DeviceQueue, MeshSocket};
use super::nat::{self, Inbound, NatPaths};
use super::wire::{self, DatagramKind, CONTROL_PORT, RELAY_PORT};
use super::{
    owner_of, MeshRoute, MeshSettings, MeshShared, MeshStart, MeshTotals, PathToPeer, PeerCounters,
    PeerEntry, SessionState,
};
use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Packet, Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use switchyard_mesh_routing::{Message, Router};

/// boringtun wants `update_timers` every 250 ms or so.
const TIMER_TICK: Duration = Duration::from_millis(250);
/// A session older than this without a new handshake is gone (WireGuard's REJECT_AFTER_TIME).
const SESSION_LIFETIME: Duration = Duration::from_secs(180);
/// Datagram scratch: the largest IP packet plus WireGuard's overhead.
const SCRATCH: usize = 65_536 + 256;
/// Sent datagrams kept for the next encapsulations (the rest are freed: memory over
/// allocations): about one super-packet's segments for each of a few streams.
const SPARE_DATAGRAMS: usize = 256;
/// What WireGuard adds to a data packet (boringtun's `DATA_OVERHEAD_SZ`: header and tag).
const DATA_OVERHEAD: usize = 32;
/// A handshake initiation (148 bytes) is written instead of a data packet while a session is
/// being set up: the destination always has room for one.
const HANDSHAKE_ROOM: usize = 148;
/// The shortest sleep for NAT traversal's timers.
const NAT_MIN_WAIT: Duration = Duration::from_millis(1);
/// Receives taken from the socket per turn of the receiver before others get the core.
const RECEIVE_BURST: usize = 64;
/// Receiver indexes are 24 bits (boringtun keeps the low 8 for the session).
const MAX_INDEX: u32 = (1 << 24) - 1;
/// Handshake initiations per second (all peers together) taken without a cookie; beyond it an
/// initiation must carry a mac2 proving its source address (WireGuard's cookie, the figure
/// boringtun's device uses). Each costs an X25519 operation before its key is known.
const HANDSHAKES_PER_SECOND: u64 = 100;
/// WireGuard message type of a cookie reply: it authenticates nothing about its sender.
const COOKIE_REPLY: u8 = 3;
/// WireGuard message type of a handshake initiation.
const HANDSHAKE_INIT: u8 = 1;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Which way a session's datagrams go: over the underlay, or in relay envelopes through the
/// session (its key in `Mesh::sessions`) of the member that is the next hop to the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Underlay(PathToPeer),
    Through(u32),
}

struct Session {
    /// Its key in `Mesh::sessions` (and boringtun's receiver index >> 8).
    index: u32,
    entry: Arc<PeerEntry>,
    tunn: Tunn,
    /// The way the last authenticated datagram came (the peer may roam, or be behind a NAT
    /// not checked yet); used until NAT traversal selected a path.
    learnt: Option<nat::PathSince>,
    /// The peer's published relay addresses (a datagram from one came through its relay).
    relays: Vec<SocketAddr>,
    /// Which published endpoint is tried (moves on after each unanswered connect timeout).
    choice: usize,
    /// Since when this session tries to connect without success.
    trying_since: Instant,
    /// The router knows this session as a neighbour.
    neighbour: bool,
    /// When the underlay was last tried for a session that goes through a relay.
    underlay_tried: Instant,
    /// The session of the relaying member the router's route to this peer goes through (only
    /// while the peer is no neighbour).
    through: Option<u32>,
    /// The session of the relaying member that carried the last authenticated datagram of
    /// this session; `None` when it came over the underlay.
    relayed: Option<u32>,
    /// Since when the way this session went left with its relaying member and no datagram
    /// proved another: its keys are still good, but it shows as connecting (not connected),
    /// and as unreachable once `connect_timeout` passed.
    way_lost: Option<Instant>,
}

impl Session {
    /// Where its datagrams go ([`nat::choose`]), given the path NAT traversal selected.
    fn path(&self, selected: Option<nat::PathSince>, direct_connect: bool) -> Option<PathToPeer> {
        nat::choose(
            selected,
            self.learnt,
            &self.entry.endpoints,
            self.choice,
            direct_connect,
        )
    }

    fn connected(&self) -> bool {
        self.tunn
            .time_since_last_handshake()
            .is_some_and(|d| d < SESSION_LIFETIME)
    }
}

struct Mesh {
    settings: MeshSettings,
    shared: Arc<MeshShared>,
    secret: StaticSecret,
    public: PublicKey,
    table: Arc<super::PeerTable>,
    sessions: HashMap<u32, Box<Session>>,
    /// Broadcast, multicast and anycast; TAP frames.
    modes: modes::Modes,
    next_index: u32,
    device: Device,
    /// Datagrams to send once the `RefCell` borrow ends.
    outgoing: Vec<(SocketAddr, Vec<u8>)>,
    /// Buffers of sent datagrams, for the next encapsulations ([`Mesh::recycle`]).
    spare: Vec<Vec<u8>>,
    /// Output of encapsulation and timers.
    scratch: Vec<u8>,
    /// Output of decapsulation: separate, because a decrypted packet may be answered (a
    /// probe reply), which encapsulates, while it is still being read.
    decrypted: Vec<u8>,
    /// Relay envelopes decrypted but not handled yet: (the session that carried it, the
    /// envelope). Handled once that session is back in `sessions` (the answer to the inner
    /// datagram goes through it).
    envelopes: Vec<(u32, Vec<u8>)>,
    /// The session of each peer's virtual IP.
    by_vip: HashMap<Ipv4Addr, u32>,
    /// Every packet a session decrypted (tests: what a relay could read).
    #[cfg(test)]
    decrypted_log: Vec<Vec<u8>>,
    /// The distance-vector table; `None` only when our id is unusable as a router id.
    router: Option<Router>,
    /// The virtual IP the router was last made for (made once per address, even when the
    /// id is refused).
    router_vip: Option<Ipv4Addr>,
    /// The routes last published to the control plane.
    published: Vec<MeshRoute>,
    /// NAT traversal (candidates, checks, selected paths); `None` when it is off.
    nat: Option<NatPaths>,
    /// mac1 check and cookies for handshake initiations before any X25519 work (its count
    /// restarts each second).
    limiter: RateLimiter,
}

impl Mesh {
    fn new(settings: MeshSettings, shared: Arc<MeshShared>, device: std::fs::File) -> Self {
        let secret = StaticSecret::from(settings.private_key);
        let public = PublicKey::from(&secret);
        let nat = settings.nat.enabled.then(|| {
            NatPaths::new(
                &settings.nat,
                &settings.local_id,
                settings.preshared_key,
                settings.connect_timeout,
                settings.keep_alive,
                Instant::now(),
            )
        });
        Mesh {
            nat,
            limiter: RateLimiter::new(&public, HANDSHAKES_PER_SECOND),
            settings,
            shared,
            secret,
            public,
            table: Arc::new(super::PeerTable::default()),
            sessions: HashMap::new(),
            modes: modes::Modes::new(),
            next_index: 1,
            device: Device::new(device),
            outgoing: Vec::new(),
            spare: Vec::new(),
            scratch: vec![0u8; SCRATCH],
            decrypted: vec![0u8; SCRATCH],
            envelopes: Vec::new(),
            by_vip: HashMap::new(),
            #[cfg(test)]
            decrypted_log: Vec::new(),
            router: None,
            router_vip: None,
            published: Vec::new(),
        }
    }

    /// A router for our id and current virtual IP (again when the address changed: the
    /// neighbours are then told afresh at the next tick).
    fn ensure_router(&mut self) {
        let vip = self.local_vip();
        if self.router_vip == Some(vip) {
            return;
        }
        self.router_vip = Some(vip);
        let now = Instant::now();
        let seq_start = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(1);
        // any varying u64 serves as the seed of jitter and probe nonces
        let seed = seq_start
            ^ u64::from_le_bytes(self.public.as_bytes()[..8].try_into().unwrap_or([7; 8]));
        match Router::new(
            self.settings.local_id.clone(),
            vip,
            self.settings.routing.clone(),
            seq_start,
            seed,
            now,
        ) {
            Ok(r) => {
                self.router = Some(r);
                self.share_members();
            }
            Err(e) => {
                tracing::error!(id = %self.settings.local_id, error = %e,
                    "mesh routing off: the peer id cannot name a router");
                self.router = None;
            }
        }
        for s in self.sessions.values_mut() {
            s.neighbour = false;
        }
    }

    /// Tells the router whether session `s` is up (a neighbour, with its measured latency).
    fn sync_neighbour(&mut self, s: &mut Session, now: Instant) {
        let Some(router) = self.router.as_mut() else {
            return;
        };
        // a session that only works through a relay is no link of ours: a neighbour's last
        // datagram came over the underlay (and it has had one: a relay that left proves none)
        let up = s.connected() && s.relayed.is_none() && s.learnt.is_some();
        if up && !s.neighbour {
            let rtt = Duration::from_micros(s.entry.counters.rtt_us.load(Relaxed));
            match router.neighbour_up(&s.entry.id, s.entry.vip, rtt, now) {
                Ok(()) => s.neighbour = true,
                Err(e) => {
                    tracing::warn!(peer = %s.entry.id, error = %e, "mesh peer not routable")
                }
            }
        } else if !up && s.neighbour {
            router.neighbour_down(&s.entry.id, now);
            s.neighbour = false;
        }
    }

    /// Sends what the router has due (announcements, probes) and publishes its routes.
    fn drive_router(&mut self, now: Instant) {
        let Some(router) = self.router.as_mut() else {
            if !self.published.is_empty() {
                self.published.clear();
                self.shared.routes.store(Arc::new(Vec::new()));
            }
            return;
        };
        if now >= router.poll_timeout() {
            let due = router.poll_announcements(now);
            for (neighbour, datagram) in due {
                self.send_control(&neighbour, &datagram);
            }
        }
        let Some(router) = self.router.as_ref() else {
            return;
        };
        let wall = SystemTime::now();
        let routes: Vec<MeshRoute> = router
            .routes()
            .into_iter()
            .map(|r| MeshRoute {
                last_updated_ms: r
                    .last_updated_at(now, wall)
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| d.as_millis() as u64)
                    .unwrap_or(0),
                dest_peer_id: r.dest_peer_id,
                dest_ip: r.dest_ip,
                next_hop: r.next_hop,
                relayed: r.kind == switchyard_mesh_routing::RouteKind::Relayed,
                latency_ms: r.latency_ms,
                peers_between: r.hop_count,
                active: r.active,
            })
            .collect();
        if routes != self.published {
            self.shared.routes.store(Arc::new(routes.clone()));
            self.published = routes;
            self.sync_relays();
        }
    }

    /// Which sessions go through a relaying member: those of peers that are no neighbour and
    /// that the router reaches via another member. A session that gets such a way while it is
    /// not up handshakes along it at once when it is ours to open (the lower key opens).
    fn sync_relays(&mut self) {
        let indexes: Vec<u32> = self.sessions.keys().copied().collect();
        for i in indexes {
            let through = match (self.sessions.get(&i), self.router.as_ref()) {
                (Some(s), Some(r)) if !s.neighbour => r
                    .next_hop_to(&s.entry.id)
                    .filter(|hop| hop.peer_id != s.entry.id)
                    .and_then(|hop| self.session_of(&hop.peer_id)),
                _ => None,
            };
            let Some(mut s) = self.sessions.remove(&i) else {
                continue;
            };
            if s.through != through {
                s.through = through;
                if through.is_some()
                    && !s.connected()
                    && self.public.as_bytes() < &s.entry.public_key
                {
                    self.initiate(&mut s, true);
                }
            }
            self.sessions.insert(i, s);
        }
    }

    /// A control message for neighbour `id`, through its session (outside a borrow of it).
    fn send_control(&mut self, id: &str, datagram: &[u8]) {
        // a peer that does not relay offers no routes through itself
        if !self.settings.relay_via_peers
            && matches!(Message::decode(datagram), Ok(Message::Announcement(_)))
        {
            return;
        }
        let Some(index) = self.session_of(id) else {
            return;
        };
        let Some(mut s) = self.sessions.remove(&index) else {
            return;
        };
        let packet = wire::udp_packet(self.local_vip(), s.entry.vip, CONTROL_PORT, datagram);
        self.encapsulate(&mut s, &packet);
        self.sessions.insert(index, s);
    }

    /// The session of the peer `id`.
    fn session_of(&self, id: &str) -> Option<u32> {
        self.sessions
            .iter()
            .find(|(_, s)| s.entry.id == id)
            .map(|(i, _)| *i)
    }

    fn local_vip(&self) -> Ipv4Addr {
        self.shared.local_vip()
    }

    /// Applies a new peer table: sessions of unchanged peers (same id and key) stay, others
    /// start or end.
    fn sync_table(&mut self) {
        let table = self.shared.peers.load_full();
        if Arc::ptr_eq(&table, &self.table) {
            return;
        }
        let mut keep: HashMap<u32, Box<Session>> = HashMap::new();
        let mut old: Vec<(u32, Box<Session>)> = self.sessions.drain().collect();
        for entry in &table.peers {
            let found = old.iter().position(|(_, s)| {
                s.entry.id == entry.id
                    && s.entry.public_key == entry.public_key
                    && s.entry.joined_ms == entry.joined_ms
            });
            match found {
                Some(i) => {
                    let (index, mut s) = old.swap_remove(i);
                    if s.entry.endpoints != entry.endpoints {
                        s.choice = 0;
                    }
                    if s.entry.candidates != entry.candidates {
                        s.relays = nat::relay_addresses(&entry.candidates);
                        if let Some(n) = self.nat.as_mut() {
                            let key = pair_key(&self.secret, &entry.public_key);
                            n.set_peer(&entry.id, &key, &entry.candidates, Instant::now());
                        }
                    }
                    s.entry = entry.clone();
                    keep.insert(index, s);
                }
                None => {
                    let index = self.allocate_index(&keep, &old);
                    let tunn = Tunn::new(
                        self.secret.clone(),
                        PublicKey::from(entry.public_key),
                        self.settings.preshared_key,
                        Some(self.settings.keep_alive.as_secs().clamp(1, 65_535) as u16),
                        index,
                        None,
                    );
                    entry.counters.set_state(SessionState::Connecting);
                    entry.counters.set_path(None);
                    if let Some(n) = self.nat.as_mut() {
                        // a peer that joined again starts its checks afresh
                        n.remove_peer(&entry.id);
                        let key = pair_key(&self.secret, &entry.public_key);
                        n.set_peer(&entry.id, &key, &entry.candidates, Instant::now());
                    }
                    // boxed: a session moves out of the map and back for every packet
                    let mut s = Box::new(Session {
                        index,
                        entry: entry.clone(),
                        tunn,
                        learnt: None,
                        relays: nat::relay_addresses(&entry.candidates),
                        choice: 0,
                        trying_since: Instant::now(),
                        neighbour: false,
                        underlay_tried: Instant::now(),
                        through: None,
                        relayed: None,
                        way_lost: None,
                    });
                    // the peer with the lower key opens the session at once; the other waits
                    // for it (or for traffic), so crossing handshakes are rare
                    if self.public.as_bytes() < &entry.public_key {
                        self.initiate(&mut s, false);
                    }
                    tracing::info!(peer = %entry.id, vip = %entry.vip, "mesh peer added");
                    keep.insert(index, s);
                }
            }
        }
        let now = Instant::now();
        for (_, s) in old {
            tracing::info!(peer = %s.entry.id, "mesh peer removed");
            self.modes.forget_peer(&s.entry.id);
            let still_listed = keep.values().any(|k| k.entry.id == s.entry.id);
            if let Some(n) = self.nat.as_mut().filter(|_| !still_listed) {
                n.remove_peer(&s.entry.id);
            }
            if s.neighbour {
                if let Some(r) = self.router.as_mut() {
                    r.neighbour_down(&s.entry.id, now);
                }
            }
        }
        // a relay that left carries nothing any more: a session that went through it has no
        // way until a datagram proves one (over the underlay, tried at once, or another relay)
        let listed: Vec<u32> = keep.keys().copied().collect();
        let now = Instant::now();
        let mut lost = Vec::new();
        for s in keep.values_mut() {
            let went_through = s.through.or(s.relayed);
            s.through = s.through.filter(|i| listed.contains(i));
            if s.relayed.is_some_and(|i| !listed.contains(&i)) {
                s.relayed = None;
                s.learnt = None;
            }
            if went_through.is_some_and(|i| !listed.contains(&i)) && s.through.is_none() {
                s.way_lost = Some(now);
                s.trying_since = now;
                s.entry.counters.set_state(SessionState::Connecting);
                s.entry.counters.set_path(None);
                lost.push(s.index);
            }
        }
        self.by_vip = keep.iter().map(|(i, s)| (s.entry.vip, *i)).collect();
        self.sessions = keep;
        self.table = table;
        self.share_members();
        for index in lost {
            if let Some(mut s) = self.sessions.remove(&index) {
                self.initiate_underlay(&mut s);
                self.sessions.insert(index, s);
            }
        }
    }

    /// Gives the router the registry's table: who owns which virtual IP (announcements only
    /// choose paths).
    fn share_members(&mut self) {
        if let Some(router) = self.router.as_mut() {
            let members = self.table.peers.iter().map(|p| (p.id.clone(), p.vip));
            router.set_members(members, Instant::now());
            let anycast = self.table.peers.iter();
            router.set_anycast_listing(anycast.map(|p| (p.id.clone(), p.anycast.clone())));
        }
    }

    fn allocate_index(&mut self, a: &HashMap<u32, Box<Session>>, b: &[(u32, Box<Session>)]) -> u32 {
        loop {
            let i = self.next_index;
            self.next_index = if i >= MAX_INDEX { 1 } else { i + 1 };
            if !a.contains_key(&i) && !b.iter().any(|(j, _)| *j == i) {
                return i;
            }
        }
    }

    /// Sends a handshake initiation; `again` also when one is under way (a new path).
    fn initiate(&mut self, s: &mut Session, again: bool) {
        let Some(way) = self.way_of(s) else {
            return;
        };
        if let TunnResult::WriteToNetwork(d) =
            s.tunn.format_handshake_initiation(&mut self.scratch, again)
        {
            let d = d.to_vec();
            self.send_of(s, way, d);
        }
    }

    /// Queues datagram `d` of session `s` along `way`. A handshake initiation through a
    /// relay goes over the underlay too, once per `connect_timeout` (the same message: the
    /// answer that comes first completes it, and one over the underlay takes the session off
    /// the relay).
    fn send_of(&mut self, s: &mut Session, way: Way, d: Vec<u8>) {
        if matches!(way, Way::Through(_))
            && d.first() == Some(&HANDSHAKE_INIT)
            && s.underlay_tried.elapsed() >= self.settings.connect_timeout
        {
            s.underlay_tried = Instant::now();
            if let Some(path) = self.path_of(s) {
                self.transmit(path, d.clone());
            }
        }
        self.transmit_way(way, s.entry.vip, d);
    }

    /// Which way session `s`'s datagrams go now: through the relaying member the router
    /// chose, else through the one that carried its last datagram, else over the underlay.
    fn way_of(&self, s: &Session) -> Option<Way> {
        match s.through.or(s.relayed) {
            Some(relay) => Some(Way::Through(relay)),
            None => self.path_of(s).map(Way::Underlay),
        }
    }

    /// Queues datagram `d` of the session with the peer at `vip` along `way`.
    fn transmit_way(&mut self, way: Way, vip: Ipv4Addr, d: Vec<u8>) {
        match way {
            Way::Underlay(path) => self.transmit(path, d),
            Way::Through(relay) => {
                let envelope = wire::udp_packet(self.local_vip(), vip, RELAY_PORT, &d);
                self.send_underlay(relay, &envelope);
            }
        }
    }

    /// Encapsulates `packet` in session `index` and sends it over the underlay (the session
    /// of a neighbour: an envelope never goes into another envelope).
    fn send_underlay(&mut self, index: u32, packet: &[u8]) {
        let Some(mut s) = self.sessions.remove(&index) else {
            self.shared.totals.no_route.fetch_add(1, Relaxed);
            return;
        };
        let way = self.path_of(&s).map(Way::Underlay);
        self.encapsulate_along(&mut s, packet, way);
        self.sessions.insert(index, s);
    }

    /// A handshake initiation over the underlay even when the session goes through a relay
    /// (answered there, the session leaves the relay).
    fn initiate_underlay(&mut self, s: &mut Session) {
        s.underlay_tried = Instant::now();
        let Some(path) = self.path_of(s) else {
            return;
        };
        if let TunnResult::WriteToNetwork(d) =
            s.tunn.format_handshake_initiation(&mut self.scratch, true)
        {
            let d = d.to_vec();
            self.transmit(path, d);
        }
    }

    /// Shows how session `s`'s datagrams travel in its counters.
    fn show_way(&self, s: &Session) {
        match self.way_of(s) {
            Some(Way::Through(_)) => s.entry.counters.set_through_peers(),
            Some(Way::Underlay(path)) => s.entry.counters.set_path(Some(&path)),
            None => s.entry.counters.set_path(None),
        }
    }

    /// Where session `s`'s datagrams go now over the underlay.
    fn path_of(&self, s: &Session) -> Option<PathToPeer> {
        let selected = self.nat.as_ref().and_then(|n| n.selected(&s.entry.id));
        s.path(
            selected,
            self.settings.nat.direct_connect || self.nat.is_none(),
        )
    }

    /// Queues datagram `d` along `path` (framed for our TURN relay when it goes through it).
    fn transmit(&mut self, path: PathToPeer, d: Vec<u8>) {
        match (path, self.nat.as_mut()) {
            (PathToPeer::Direct(to), _) => self.outgoing.push((to, d)),
            (path, Some(n)) => match n.frame(path, d) {
                Some(framed) => self.outgoing.push(framed),
                None => {
                    self.shared.totals.no_route.fetch_add(1, Relaxed);
                }
            },
            (PathToPeer::Relayed { .. }, None) => {
                self.shared.totals.no_route.fetch_add(1, Relaxed);
            }
        }
    }

    /// NAT traversal's due timers, its datagrams and events.
    fn nat_turn(&mut self, now: Instant) {
        let Some(n) = self.nat.as_mut() else {
            return;
        };
        if n.poll_timeout().is_some_and(|t| t <= now) {
            n.handle_timeout(now);
        }
        self.drain_nat();
    }

    /// Sends what NAT traversal queued and applies its events: a peer whose path was just
    /// selected gets a handshake along it at once when no session is up and it is ours to
    /// open (the lower key opens, as at the start).
    fn drain_nat(&mut self) {
        let Some(n) = self.nat.as_mut() else {
            return;
        };
        let selected = n.drain(&mut self.outgoing, &self.shared);
        for id in selected {
            let Some(index) = self.session_of(&id) else {
                continue;
            };
            let Some(mut s) = self.sessions.remove(&index) else {
                continue;
            };
            self.show_way(&s);
            // also when the session goes through a relay: a direct path is better
            if (!s.connected() || s.relayed.is_some())
                && self.public.as_bytes() < &s.entry.public_key
            {
                self.initiate_underlay(&mut s);
            }
            self.sessions.insert(index, s);
        }
    }

    /// When NAT traversal wants to be called next.
    fn nat_deadline(&self) -> Option<Instant> {
        self.nat.as_ref().and_then(NatPaths::poll_timeout)
    }

    /// Releases the TURN allocations before the socket closes.
    fn close_nat(&mut self) {
        if let Some(n) = self.nat.as_mut() {
            n.close(Instant::now(), &mut self.outgoing);
        }
    }

    /// A datagram from the socket.
    fn on_datagram(&mut self, d: &[u8], from: SocketAddr) {
        match wire::classify(d) {
            DatagramKind::Stun | DatagramKind::ChannelData => {
                let inbound = match self.nat.as_mut() {
                    Some(n) => n.handle(from, d, Instant::now()),
                    None => Inbound::Dropped,
                };
                match inbound {
                    Inbound::Consumed => {}
                    Inbound::Dropped => {
                        self.shared.totals.ice_dropped.fetch_add(1, Relaxed);
                    }
                    Inbound::WireGuard { payload, back } => {
                        // unwrapped from our relay: a WireGuard datagram, never STUN again
                        if !matches!(
                            wire::classify(&payload),
                            DatagramKind::Stun | DatagramKind::ChannelData
                        ) {
                            self.wireguard_datagram(&payload, back);
                        } else {
                            self.shared.totals.ice_dropped.fetch_add(1, Relaxed);
                        }
                    }
                }
                self.drain_nat();
            }
            _ => self.wireguard_datagram(d, PathToPeer::Direct(from)),
        }
    }

    /// A WireGuard datagram that came along `back` (directly from the peer's address, or
    /// through a relay).
    fn wireguard_datagram(&mut self, d: &[u8], back: PathToPeer) {
        let from = match back {
            PathToPeer::Direct(a) | PathToPeer::Relayed { remote: a, .. } => a,
        };
        let Some(index) = self.session_for(d, Way::Underlay(back), from.ip()) else {
            return;
        };
        let Some(mut s) = self.sessions.remove(&index) else {
            self.shared.totals.invalid.fetch_add(1, Relaxed);
            return;
        };
        let back = match back {
            PathToPeer::Direct(a) => nat::arrival(a, None, &s.relays),
            relayed => relayed,
        };
        self.decapsulate(&mut s, d, Way::Underlay(back), from.ip());
        self.sessions.insert(index, s);
        self.drain_envelopes();
    }

    /// The session a WireGuard datagram that came along `back` from `from` is for: by its
    /// receiver index, or (a handshake initiation past the rate limiter) by its static key.
    fn session_for(&mut self, d: &[u8], back: Way, from: IpAddr) -> Option<u32> {
        match wire::classify(d) {
            DatagramKind::Stun | DatagramKind::ChannelData => {
                self.shared.totals.ice_dropped.fetch_add(1, Relaxed);
                None
            }
            DatagramKind::Unknown => {
                self.shared.totals.invalid.fetch_add(1, Relaxed);
                None
            }
            DatagramKind::WireGuard { receiver } => Some(receiver >> 8),
            DatagramKind::HandshakeInit if !self.handshake_admitted(d, back, from) => None,
            DatagramKind::HandshakeInit => {
                let found = self.initiator_index(d);
                if found.is_none() {
                    self.shared.totals.unknown_key.fetch_add(1, Relaxed);
                    tracing::debug!(%from, "mesh handshake from a key the registry does not list: dropped");
                }
                found
            }
        }
    }

    /// Handles the relay envelopes decrypted so far (their sessions are back in the map).
    fn drain_envelopes(&mut self) {
        while let Some((carrier, envelope)) = self.envelopes.pop() {
            self.envelope(carrier, envelope);
        }
    }

    /// A relay envelope session `carrier` brought: for us, its datagram goes to our session
    /// with its source; for another member it is passed on towards it (`relay_via_peers`,
    /// TTL decremented), as it is: only the two ends hold that session's keys.
    fn envelope(&mut self, carrier: u32, mut envelope: Vec<u8>) {
        let totals = &self.shared.totals;
        let Some((src, dst)) = wire::ipv4_addresses(&envelope) else {
            totals.invalid.fetch_add(1, Relaxed);
            return;
        };
        if owner_of(&self.table, src).is_none() {
            totals.relay_refused.fetch_add(1, Relaxed);
            return;
        }
        if dst == self.local_vip() {
            let Some((_, inner)) = wire::udp_to(&envelope) else {
                totals.invalid.fetch_add(1, Relaxed);
                return;
            };
            let inner = inner.to_vec();
            return self.relayed_datagram(carrier, src, &inner);
        }
        if !self.settings.relay_via_peers || !wire::decrement_ttl(&mut envelope) {
            totals.relay_refused.fetch_add(1, Relaxed);
            return;
        }
        let next = self
            .router
            .as_ref()
            .and_then(|r| r.next_hop(dst))
            .and_then(|hop| self.session_of(&hop.peer_id))
            .filter(|next| *next != carrier);
        match next {
            Some(next) => {
                totals.relayed.fetch_add(1, Relaxed);
                self.send_underlay(next, &envelope);
            }
            None => {
                totals.no_route.fetch_add(1, Relaxed);
            }
        }
    }

    /// A WireGuard datagram of the member at `src` that came in an envelope through session
    /// `carrier`: it must open `src`'s own session (the envelope's address is the relay's
    /// word, the datagram's authentication is not).
    fn relayed_datagram(&mut self, carrier: u32, src: Ipv4Addr, d: &[u8]) {
        let back = Way::Through(carrier);
        let Some(index) = self.session_for(d, back, IpAddr::V4(src)) else {
            return;
        };
        let Some(mut s) = self.sessions.remove(&index) else {
            self.shared.totals.invalid.fetch_add(1, Relaxed);
            return;
        };
        if s.entry.vip == src {
            self.decapsulate(&mut s, d, back, IpAddr::V4(src));
        } else {
            self.shared.totals.invalid.fetch_add(1, Relaxed);
        }
        self.sessions.insert(index, s);
    }

    /// Whether a handshake initiation may cost the X25519 work of finding its key: its mac1
    /// must be keyed to our public key, and beyond [`HANDSHAKES_PER_SECOND`] its mac2 must
    /// carry the cookie of its source address (answered with a cookie reply otherwise).
    fn handshake_admitted(&mut self, d: &[u8], back: Way, from: IpAddr) -> bool {
        let mut reply = [0u8; 64];
        match self.limiter.verify_packet(Some(from), d, &mut reply) {
            Ok(_) => true,
            Err(TunnResult::WriteToNetwork(cookie)) => {
                self.shared.totals.handshake_cookies.fetch_add(1, Relaxed);
                let cookie = cookie.to_vec();
                match (back, from) {
                    (Way::Underlay(path), _) => self.transmit(path, cookie),
                    (through, IpAddr::V4(vip)) => self.transmit_way(through, vip, cookie),
                    (Way::Through(_), IpAddr::V6(_)) => {}
                }
                false
            }
            Err(_) => {
                self.shared.totals.handshakes_refused.fetch_add(1, Relaxed);
                false
            }
        }
    }

    /// The session of the peer whose static key a handshake initiation carries.
    fn initiator_index(&self, d: &[u8]) -> Option<u32> {
        let Ok(Packet::HandshakeInit(init)) = Tunn::parse_incoming_packet(d) else {
            return None;
        };
        let half = parse_handshake_anon(&self.secret, &self.public, &init).ok()?;
        self.sessions
            .iter()
            .find(|(_, s)| s.entry.public_key == half.peer_static_public)
            .map(|(i, _)| *i)
    }

    fn decapsulate(&mut self, s: &mut Session, d: &[u8], back: Way, from: IpAddr) {
        let mut scratch = std::mem::take(&mut self.decrypted);
        // anyone who saw our initiation's mac1 can make a cookie reply: it says nothing about
        // where the peer is
        let proves_address = d.first() != Some(&COOKIE_REPLY);
        let mut first = true;
        loop {
            let input: &[u8] = if first { d } else { &[] };
            let src = first.then_some(from);
            first = false;
            match s.tunn.decapsulate(src, input, &mut scratch) {
                TunnResult::Done => {
                    if src.is_some() && proves_address {
                        self.authenticated(s, back);
                    }
                    break;
                }
                TunnResult::WriteToNetwork(out) => {
                    let out = out.to_vec();
                    // answers (handshake response, queued packets) go back the way it came
                    // unless NAT traversal selected a path since
                    self.authenticated(s, back);
                    let way = match back {
                        Way::Underlay(path) => Way::Underlay(self.path_of(s).unwrap_or(path)),
                        through => through,
                    };
                    self.transmit_way(way, s.entry.vip, out);
                }
                TunnResult::WriteToTunnelV4(packet, _) => {
                    self.authenticated(s, back);
                    let packet = packet.to_vec();
                    self.decrypted_packet(s, packet);
                    break;
                }
                TunnResult::WriteToTunnelV6(..) => {
                    self.shared.totals.no_route.fetch_add(1, Relaxed);
                    break;
                }
                TunnResult::Err(e) => {
                    self.shared.totals.invalid.fetch_add(1, Relaxed);
                    tracing::debug!(peer = %s.entry.id, %from, error = ?e, "mesh datagram refused");
                    break;
                }
            }
        }
        self.decrypted = scratch;
    }

    /// A datagram passed the session's authentication: `back` is the way to the peer now.
    fn authenticated(&self, s: &mut Session, back: Way) {
        s.way_lost = None;
        match back {
            Way::Underlay(path) => {
                if s.learnt.map(|(p, _)| p) != Some(path) {
                    s.learnt = Some((path, Instant::now()));
                }
                s.relayed = None;
            }
            Way::Through(relay) => s.relayed = Some(relay),
        }
        s.entry.counters.last_seen_ms.store(unix_ms(), Relaxed);
        self.refresh_state(s);
    }

    fn refresh_state(&self, s: &mut Session) {
        let c = &s.entry.counters;
        if s.connected() && s.way_lost.is_none() {
            if c.state() != SessionState::Connected {
                tracing::info!(peer = %s.entry.id, way = ?self.way_of(s), "mesh session up");
            }
            self.show_way(s);
            c.set_state(SessionState::Connected);
            s.trying_since = Instant::now();
            if let Some(age) = s.tunn.time_since_last_handshake() {
                c.last_handshake_ms
                    .store(unix_ms().saturating_sub(age.as_millis() as u64), Relaxed);
            }
        }
    }

    /// A decrypted IP packet from peer `s`.
    fn decrypted_packet(&mut self, s: &mut Session, packet: Vec<u8>) {
        if packet.is_empty() {
            return; // keepalive
        }
        #[cfg(test)]
        self.decrypted_log.push(packet.clone());
        let Some((src, dst)) = wire::ipv4_addresses(&packet) else {
            self.shared.totals.no_route.fetch_add(1, Relaxed);
            return;
        };
        if matches!(wire::udp_to(&packet), Some((RELAY_PORT, _))) {
            // another member's datagram, for us or to pass on: handled once `s` is back
            count(
                &s.entry.counters,
                &self.shared.totals,
                packet.len(),
                Direction::Received,
            );
            self.envelopes.push((s.index, packet));
            return;
        }
        // cryptokey routing: a session speaks for its peer's own address (or an anycast
        // address it announced), never for another member's: relayed traffic has a session of
        // its own with its origin
        if src != s.entry.vip && !self.anycast_source(s, src) {
            self.shared.totals.invalid.fetch_add(1, Relaxed);
            return;
        }
        count(
            &s.entry.counters,
            &self.shared.totals,
            packet.len(),
            Direction::Received,
        );
        let totals = &self.shared.totals;
        if self.is_for_us(dst) {
            if let Some((CONTROL_PORT, payload)) = wire::udp_to(&packet) {
                let payload = payload.to_vec();
                self.control(s, &payload);
            } else if !self.settings.layer2 {
                self.write_device(&packet);
            } else if let Some(frame) = wire::etherip_frame(&packet) {
                // learn where the sender's MAC lives, then hand the frame to the device —
                // unless that MAC lives behind another member (counted there)
                if self.learn_mac(frame, src) {
                    self.count_flooded_frame(frame);
                    self.write_device(frame);
                }
            } else {
                // TAP mode carries frames only
                totals.invalid.fetch_add(1, Relaxed);
            }
            return;
        }
        if !self.settings.layer2 && self.flooded_packet(dst) {
            self.write_device(&packet);
            return;
        }
        // a packet for another member in plaintext: relays pass on envelopes only
        totals.relay_refused.fetch_add(1, Relaxed);
    }

    /// A message on the mesh control port: the router's (announcement, probe, membership,
    /// flood).
    fn control(&mut self, s: &mut Session, payload: &[u8]) {
        let now = Instant::now();
        self.ensure_router();
        // the session may be up a moment before the next tick would tell the router
        self.sync_neighbour(s, now);
        let Some(router) = self.router.as_mut() else {
            self.shared.totals.control_dropped.fetch_add(1, Relaxed);
            return;
        };
        let kind = Message::decode(payload);
        if matches!(kind, Ok(Message::Flood(_))) {
            // floods travel as end-to-end copies in their origin's own session, never as
            // another member's message
            self.shared.totals.control_dropped.fetch_add(1, Relaxed);
            return;
        }
        let claims_before = router.stats().claims_refused;
        let result = router.handle_control(&s.entry.id, payload, now);
        let claims = router.stats().claims_refused - claims_before;
        self.shared
            .totals
            .route_claims_refused
            .fetch_add(claims, Relaxed);
        let outcome = match result {
            Ok(o) => o,
            Err(e) => {
                self.shared.totals.control_dropped.fetch_add(1, Relaxed);
                tracing::debug!(peer = %s.entry.id, error = %e, "mesh control message refused");
                return;
            }
        };
        if let Some(rtt) = outcome.rtt {
            let us = u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX).max(1);
            s.entry.counters.rtt_us.store(us, Relaxed);
        }
        if matches!(kind, Ok(Message::Membership(_))) {
            // changed memberships reach classification
            self.refresh_network();
        }
        for (neighbour, datagram) in &outcome.send {
            if *neighbour == s.entry.id {
                // the sender's session is out of the map while we read from it
                let packet =
                    wire::udp_packet(self.local_vip(), s.entry.vip, CONTROL_PORT, datagram);
                self.encapsulate(s, &packet);
            } else {
                self.send_control(neighbour, datagram);
            }
        }
        self.drive_router(now);
    }

    fn write_device(&mut self, packet: &[u8]) {
        if let Err(e) = self.device.write(packet) {
            self.shared.totals.overflow.fetch_add(1, Relaxed);
            tracing::trace!(error = %e, "mesh device write failed");
        }
    }

    /// Writes what the device holds back for joining (at the end of each burst).
    fn flush_device(&mut self) {
        if let Err(e) = self.device.flush() {
            self.shared.totals.overflow.fetch_add(1, Relaxed);
            tracing::trace!(error = %e, "mesh device write failed");
        }
    }

    /// An IP packet for the mesh (from the device, or forwarded).
    fn send_to_mesh(&mut self, packet: &[u8]) {
        let Some((_, dst)) = wire::ipv4_addresses(packet) else {
            self.shared.totals.no_route.fetch_add(1, Relaxed);
            return;
        };
        // the destination's own session (end to end: through relaying members it travels in
        // envelopes; without a session up it queues the packet and handshakes)
        match self.by_vip.get(&dst).copied() {
            Some(i) => self.send_to_session(i, |_| packet.to_vec()),
            None => {
                self.shared.totals.no_route.fetch_add(1, Relaxed);
            }
        }
    }

    /// A packet from the device: an IP packet (TUN) or an Ethernet frame (TAP).
    fn device_packet(&mut self, packet: &[u8]) {
        if self.settings.layer2 {
            self.device_frame(packet);
        } else {
            self.device_ip_packet(packet);
        }
    }

    /// Counts and encapsulates the packet `make` builds for the session `index`.
    fn send_to_session(&mut self, index: u32, make: impl FnOnce(&Session) -> Vec<u8>) {
        let Some(mut s) = self.sessions.remove(&index) else {
            self.shared.totals.no_route.fetch_add(1, Relaxed);
            return;
        };
        let packet = make(&s);
        count(
            &s.entry.counters,
            &self.shared.totals,
            packet.len(),
            Direction::Sent,
        );
        self.encapsulate(&mut s, &packet);
        self.sessions.insert(index, s);
    }

    fn encapsulate(&mut self, s: &mut Session, packet: &[u8]) {
        let way = self.way_of(s);
        self.encapsulate_along(s, packet, way);
    }

    fn encapsulate_along(&mut self, s: &mut Session, packet: &[u8], way: Option<Way>) {
        let Some(way) = way else {
            self.shared.totals.no_route.fetch_add(1, Relaxed);
            return;
        };
        if let Way::Through(relay) = way {
            if self.too_big_for_relay(relay, packet) {
                return;
            }
        }
        // encrypted straight into a datagram buffer of an earlier send: no copy, no allocation
        // per packet. boringtun panics on a destination shorter than the packet plus its
        // overhead, and queues the packet itself while a handshake is under way.
        let mut d = self.spare.pop().unwrap_or_default();
        d.resize(packet.len().max(HANDSHAKE_ROOM) + DATA_OVERHEAD, 0);
        let written = match s.tunn.encapsulate(packet, &mut d) {
            TunnResult::WriteToNetwork(w) => Some(w.len()),
            _ => None,
        };
        match written {
            Some(n) => {
                d.truncate(n);
                self.send_of(s, way, d);
            }
            None => self.spare.push(d),
        }
    }

    /// Takes back the datagrams a send is done with (and empties `sent`), keeping up to
    /// [`SPARE_DATAGRAMS`] buffers for the next encapsulations.
    fn recycle(&mut self, sent: &mut Vec<(SocketAddr, Vec<u8>)>) {
        let room = SPARE_DATAGRAMS.saturating_sub(self.spare.len());
        // the drain empties `sent` also past `room`: the rest are freed
        self.spare.extend(sent.drain(..).map(|(_, d)| d).take(room));
    }

    /// Whether `packet` cannot go through the relaying member `relay` in one piece: an IPv4
    /// packet with "don't fragment" larger than the device MTU less an envelope. The device
    /// gets ICMP "fragmentation needed" from the relay's virtual IP (not ours: the kernel drops
    /// a packet from its own address), so the sender's path MTU to that peer adapts instead of
    /// every relayed datagram being fragmented on the underlay. TAP frames are not checked.
    fn too_big_for_relay(&mut self, relay: u32, packet: &[u8]) -> bool {
        let mtu = self.settings.device_mtu as usize;
        if self.settings.layer2 || packet.len() + wire::ENVELOPE_OVERHEAD <= mtu {
            return false;
        }
        let Some(router) = self.sessions.get(&relay).map(|r| r.entry.vip) else {
            return false;
        };
        let fits = u16::try_from(mtu.saturating_sub(wire::ENVELOPE_OVERHEAD)).unwrap_or(u16::MAX);
        match wire::fragmentation_needed(packet, router, fits) {
            Some(icmp) => {
                self.shared.totals.too_big_for_relay.fetch_add(1, Relaxed);
                self.write_device(&icmp);
                true
            }
            None => false,
        }
    }

    /// Timers of every session (WireGuard's, the connect timeout), the router's neighbours
    /// and its announcements and probes.
    fn tick(&mut self) {
        let now = Instant::now();
        // a no-op until a second has passed since the last reset
        self.limiter.reset_count();
        self.ensure_router();
        let indexes: Vec<u32> = self.sessions.keys().copied().collect();
        for i in indexes {
            let Some(mut s) = self.sessions.remove(&i) else {
                continue;
            };
            let way = self.way_of(&s);
            if let TunnResult::WriteToNetwork(d) = s.tunn.update_timers(&mut self.scratch) {
                if let Some(way) = way {
                    let d = d.to_vec();
                    self.send_of(&mut s, way, d);
                }
            }
            self.refresh_state(&mut s);
            self.sync_neighbour(&mut s, now);
            let stuck = !s.connected() || s.way_lost.is_some();
            if stuck && s.trying_since.elapsed() >= self.settings.connect_timeout {
                let c = &s.entry.counters;
                if c.state() != SessionState::Unreachable {
                    tracing::warn!(peer = %s.entry.id, path = ?self.path_of(&s),
                        "mesh peer unreachable: no handshake within connect_timeout");
                }
                c.set_state(SessionState::Unreachable);
                c.set_path(None);
                c.rtt_us.store(0, Relaxed);
                // try the next published endpoint, from this side too
                s.learnt = None;
                s.choice = s.choice.wrapping_add(1);
                s.trying_since = Instant::now();
                self.initiate(&mut s, true);
            }
            self.sessions.insert(i, s);
        }
        self.sync_groups();
        self.drive_router(now);
        self.sync_relays();
    }
}

#[derive(Clone, Copy)]
enum Direction {
    Sent,
    Received,
}

/// Counts one IP packet of `len` bytes for the peer and for the mesh.
fn count(peer: &PeerCounters, totals: &MeshTotals, len: usize, d: Direction) {
    let len = len as u64;
    let (peer_bytes, peer_packets, bytes, packets) = match d {
        Direction::Sent => (
            &peer.bytes_sent,
            &peer.packets_sent,
            &totals.bytes_sent,
            &totals.packets_sent,
        ),
        Direction::Received => (
            &peer.bytes_received,
            &peer.packets_received,
            &totals.bytes_received,
            &totals.packets_received,
        ),
    };
    peer_bytes.fetch_add(len, Relaxed);
    peer_packets.fetch_add(1, Relaxed);
    bytes.fetch_add(len, Relaxed);
    packets.fetch_add(1, Relaxed);
}

async fn receive(socket: Rc<MeshSocket>, mesh: Rc<RefCell<Mesh>>) {
    let mut buf = vec![0u8; SCRATCH];
    let mut out = Vec::new();
    loop {
        if let Err(e) = socket.readable().await {
            tracing::debug!(error = %e, "mesh receive failed");
            glommio::timer::sleep(Duration::from_millis(10)).await;
            continue;
        }
        for _ in 0..RECEIVE_BURST {
            let (n, from, segment) = match socket.try_recv(&mut buf) {
                Ok(r) => r,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::debug!(error = %e, "mesh receive failed");
                    break;
                }
            };
            {
                let mut m = mesh.borrow_mut();
                m.sync_table();
                // a GRO receive holds several datagrams of one sender back to back
                for d in buf[..n].chunks(segment) {
                    m.on_datagram(d, from);
                }
                std::mem::swap(&mut out, &mut m.outgoing);
            }
            socket.send_all(&out).await;
            mesh.borrow_mut().recycle(&mut out);
        }
        // joined segments go to the device once the burst is read
        mesh.borrow_mut().flush_device();
        glommio::yield_if_needed().await;
    }
}

/// Runs the mesh until the control plane raises the stop flag.
pub(crate) async fn run(start: MeshStart) {
    let MeshStart {
        settings,
        shared,
        socket,
        device,
    } = start;
    shared.running.store(true, Relaxed);
    shared.beat_ms.store(unix_ms(), Relaxed);
    let layer2 = settings.layer2;
    let reader_device = match device.try_clone() {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(error = %e, "mesh device descriptor");
            shared.running.store(false, Relaxed);
            return;
        }
    };
    let queue = DeviceQueue::new();
    let reader = {
        let (queue, shared) = (queue.clone(), shared.clone());
        std::thread::Builder::new()
            .name("mesh-device".into())
            .spawn(move || io::read_device(layer2, reader_device, queue, shared))
    };
    if let Err(e) = reader {
        tracing::error!(error = %e, "mesh device reader thread");
        shared.running.store(false, Relaxed);
        return;
    }
    let mesh = Rc::new(RefCell::new(Mesh::new(settings, shared.clone(), device)));
    let socket = match MeshSocket::new(socket) {
        Ok(s) => Rc::new(s),
        Err(e) => {
            tracing::error!(error = %e, "mesh socket");
            shared.running.store(false, Relaxed);
            return;
        }
    };
    // dropping the task handle when this function returns stops the receiver too
    let _receiver = glommio::spawn_local(receive(socket.clone(), mesh.clone()));
    tracing::info!(local = ?socket.local_addr(), offload = mesh.borrow().device.has_vnet_hdr(),
        "mesh data plane running");
    let mut last_tick = Instant::now();
    let mut out = Vec::new();
    loop {
        if shared.stop.load(Acquire) {
            break;
        }
        shared.beat_ms.store(unix_ms(), Relaxed);
        let listener = shared.wake.listen();
        // batches left from the last turn's bound need no wake-up
        if !shared.wake.take() && queue.full.is_empty() {
            let mut wait = TIMER_TICK.saturating_sub(last_tick.elapsed());
            // NAT traversal's timers (checks are paced at tens of milliseconds) join ours; what
            // was due has just been handled, so a deadline still past waits a millisecond
            // rather than spin and starve the receiver
            if let Some(at) = mesh.borrow().nat_deadline() {
                let until = at.saturating_duration_since(Instant::now());
                wait = wait.min(until.max(NAT_MIN_WAIT));
            }
            futures_lite::future::or(listener, glommio::timer::sleep(wait)).await;
            shared.wake.take();
        }
        mesh.borrow_mut().sync_table();
        // one batch at a time, sent before the next: the GSO runs stay within one batch and
        // the outgoing list stays short; a bounded number per turn, so the timers below still
        // run under a stream that never lets the queue empty
        for _ in 0..io::DEVICE_QUEUE {
            let Some(batch) = queue.full.pop() else {
                break;
            };
            {
                let mut m = mesh.borrow_mut();
                for packet in batch.packets() {
                    m.device_packet(packet);
                }
                m.flush_device();
                std::mem::swap(&mut out, &mut m.outgoing);
            }
            queue.recycle(batch);
            socket.send_all(&out).await;
            mesh.borrow_mut().recycle(&mut out);
            // the receiver (the stream's acknowledgements) gets its turn
            glommio::yield_if_needed().await;
        }
        {
            let mut m = mesh.borrow_mut();
            m.nat_turn(Instant::now());
            if last_tick.elapsed() >= TIMER_TICK {
                last_tick = Instant::now();
                m.tick();
            }
            m.flush_device();
            std::mem::swap(&mut out, &mut m.outgoing);
        }
        socket.send_all(&out).await;
        mesh.borrow_mut().recycle(&mut out);
    }
    let goodbye = {
        let mut m = mesh.borrow_mut();
        m.close_nat();
        std::mem::take(&mut m.outgoing)
    };
    socket.send_all(&goodbye).await;
    tracing::info!("mesh data plane stopped");
    shared.running.store(false, Relaxed);
    shared.beat_ms.store(0, Relaxed);
}

/// The secret only we and the peer with `public_key` can compute: it keys the NAT traversal
/// checks of the pair, so knowing both ids is not enough to answer or forge them.
fn pair_key(secret: &StaticSecret, public_key: &[u8; 32]) -> [u8; 32] {
    secret
        .diffie_hellman(&PublicKey::from(*public_key))
        .to_bytes()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::mesh::{PeerCounters, PeerTable};
    use std::io::{Read, Seek, SeekFrom};

    struct Side {
        mesh: Mesh,
        addr: SocketAddr,
        vip: Ipv4Addr,
        public: [u8; 32],
        device: std::fs::File,
    }

    fn side(seed: u8, last: u8) -> Side {
        let private = [seed; 32];
        let public = PublicKey::from(&StaticSecret::from(private)).to_bytes();
        let shared = Arc::new(MeshShared::default());
        let vip = Ipv4Addr::new(10, 100, 0, last);
        shared.set_local_vip(vip);
        let device = tempfile::tempfile().unwrap();
        let settings = MeshSettings {
            local_id: format!("peer{last}"),
            routing: switchyard_mesh_routing::RoutingConfig::default(),
            private_key: private,
            preshared_key: Some([9; 32]),
            keep_alive: Duration::from_secs(25),
            connect_timeout: Duration::from_secs(30),
            relay_via_peers: false,
            layer2: false,
            device_mtu: 1400,
            nat: crate::mesh::NatSettings::default(),
        };
        Side {
            mesh: Mesh::new(settings, shared, device.try_clone().unwrap()),
            addr: SocketAddr::from(([192, 0, 2, last], 40_000)),
            vip,
            public,
            device,
        }
    }

    /// Lists `other` in `me`'s table under `key`.
    fn list(me: &mut Side, other: &Side, key: [u8; 32]) -> Arc<PeerCounters> {
        let counters = Arc::new(PeerCounters::default());
        me.mesh.shared.publish(PeerTable {
            peers: vec![Arc::new(PeerEntry {
                id: format!("peer{}", other.vip.octets()[3]),
                name: String::new(),
                vip: other.vip,
                public_key: key,
                endpoints: vec![other.addr],
                candidates: Vec::new(),
                joined_ms: 1,
                anycast: Vec::new(),
                counters: counters.clone(),
            })],
        });
        me.mesh.sync_table();
        counters
    }

    /// Delivers every datagram `from` has queued for `to`; how many there were.
    fn deliver(from: &mut Side, to: &mut Side) -> usize {
        let out = std::mem::take(&mut from.mesh.outgoing);
        for (dst, d) in &out {
            assert_eq!(*dst, to.addr);
            to.mesh.on_datagram(d, from.addr);
        }
        out.len()
    }

    fn device_bytes(s: &mut Side) -> Vec<u8> {
        let mut all = Vec::new();
        s.device.seek(SeekFrom::Start(0)).unwrap();
        s.device.read_to_end(&mut all).unwrap();
        all
    }

    /// Sent datagrams come back as buffers for the next encapsulations, at most
    /// SPARE_DATAGRAMS of them, and the sent list is empty after (the runner swaps it with the
    /// outgoing list: anything left would be sent again).
    #[test]
    fn recycling_empties_the_sent_list_and_keeps_a_bounded_pool() {
        let mut a = side(1, 1);
        let to: SocketAddr = "127.0.0.1:9".parse().expect("address");
        let mut sent: Vec<(SocketAddr, Vec<u8>)> = (0..SPARE_DATAGRAMS + 10)
            .map(|i| (to, vec![0u8; 100 + i]))
            .collect();
        a.mesh.recycle(&mut sent);
        assert!(sent.is_empty());
        assert_eq!(a.mesh.spare.len(), SPARE_DATAGRAMS);
        sent.push((to, vec![1u8; 10]));
        a.mesh.recycle(&mut sent);
        assert!(sent.is_empty());
        assert_eq!(a.mesh.spare.len(), SPARE_DATAGRAMS);
    }

    #[test]
    fn only_the_listed_key_gets_a_session_and_packets_and_probes_cross_it() {
        // the lower key initiates; make `a` the lower one
        let (mut a, mut b) = {
            let (x, y) = (side(1, 1), side(2, 2));
            if x.public < y.public {
                (x, y)
            } else {
                (y, x)
            }
        };
        let b_key = b.public;
        let a_counters = list(&mut b, &a, [7; 32]);
        let b_counters = list(&mut a, &b, b_key);
        // a → b: b lists another key for a, so the initiation is dropped and counted
        assert_eq!(deliver(&mut a, &mut b), 1, "a initiates at once");
        assert!(b.mesh.outgoing.is_empty(), "no answer to an unlisted key");
        assert_eq!(b.mesh.shared.totals.unknown_key.load(Relaxed), 1);
        assert_eq!(a_counters.state(), SessionState::Connecting);

        // with the right key listed, the next attempt completes the handshake
        let a_key = a.public;
        let a_counters = list(&mut b, &a, a_key);
        let mut first = a.mesh.sessions.remove(&1).unwrap();
        first.trying_since = Instant::now() - Duration::from_secs(60);
        a.mesh.sessions.insert(1, first);
        a.mesh.tick();
        assert_eq!(b_counters.state(), SessionState::Unreachable);
        assert!(deliver(&mut a, &mut b) >= 1);
        assert!(deliver(&mut b, &mut a) >= 1, "handshake response");
        // a's next turn: session up, first latency probe sent along with a data packet
        a.mesh.tick();
        assert_eq!(b_counters.state(), SessionState::Connected);
        let packet = wire::udp_packet(a.vip, b.vip, 5000, b"hello mesh");
        a.mesh.send_to_mesh(&packet);
        deliver(&mut a, &mut b);
        deliver(&mut b, &mut a);
        assert_eq!(a_counters.state(), SessionState::Connected);
        assert!(b_counters.rtt_us.load(Relaxed) >= 1, "b answered a's probe");
        // the data packet reached b's device; the probe was consumed, not written
        assert_eq!(device_bytes(&mut b), packet);
        assert!(a_counters.packets_received.load(Relaxed) >= 2);
        assert!(b_counters.bytes_sent.load(Relaxed) >= packet.len() as u64);

        // a packet for a virtual IP nobody owns has no route
        a.mesh.send_to_mesh(&wire::udp_packet(
            a.vip,
            Ipv4Addr::new(10, 100, 0, 99),
            1,
            b"x",
        ));
        assert_eq!(a.mesh.shared.totals.no_route.load(Relaxed), 1);
        // garbage and STUN are counted, never answered
        a.mesh.on_datagram(&[0xde, 0xad], b.addr);
        a.mesh.on_datagram(&[0x40, 0, 0, 0], b.addr);
        assert!(a.mesh.outgoing.is_empty());
        assert_eq!(a.mesh.shared.totals.ice_dropped.load(Relaxed), 1);
    }

    /// Lists every other side in each side's table.
    fn list_all(sides: &mut [Side]) {
        list_all_with_anycast(sides, &[]);
    }

    /// Lists every other side in each side's table, side `i` with the registry's anycast
    /// addresses `anycast[i]` (none past the slice's end).
    fn list_all_with_anycast(sides: &mut [Side], anycast: &[Vec<Ipv4Addr>]) {
        let entries: Vec<(Ipv4Addr, [u8; 32], SocketAddr, Vec<Ipv4Addr>)> = sides
            .iter()
            .enumerate()
            .map(|(i, s)| {
                (
                    s.vip,
                    s.public,
                    s.addr,
                    anycast.get(i).cloned().unwrap_or_default(),
                )
            })
            .collect();
        for me in sides.iter_mut() {
            let peers = entries
                .iter()
                .filter(|(vip, _, _, _)| *vip != me.vip)
                .map(|(vip, key, addr, anycast)| {
                    Arc::new(PeerEntry {
                        id: format!("peer{}", vip.octets()[3]),
                        name: String::new(),
                        vip: *vip,
                        public_key: *key,
                        endpoints: vec![*addr],
                        candidates: Vec::new(),
                        joined_ms: 1,
                        anycast: anycast.clone(),
                        counters: Arc::new(PeerCounters::default()),
                    })
                })
                .collect();
            me.mesh.shared.publish(PeerTable { peers });
            me.mesh.sync_table();
        }
    }

    /// Delivers datagrams between the sides until none are left, except between the pair
    /// `cut` (no underlay path); ticks every side first.
    fn pump(sides: &mut [Side], cut: (usize, usize)) {
        pump_cut(sides, &[cut]);
    }

    /// [`pump`] with several pairs cut.
    fn pump_cut(sides: &mut [Side], cuts: &[(usize, usize)]) {
        for s in sides.iter_mut() {
            s.mesh.tick();
        }
        for _ in 0..50 {
            let mut any = false;
            for i in 0..sides.len() {
                let out = std::mem::take(&mut sides[i].mesh.outgoing);
                let from = sides[i].addr;
                for (dst, d) in out {
                    any = true;
                    let j = sides.iter().position(|s| s.addr == dst).unwrap();
                    if cuts.iter().any(|&c| c == (i, j) || c == (j, i)) {
                        continue;
                    }
                    sides[j].mesh.on_datagram(&d, from);
                }
            }
            if !any {
                return;
            }
        }
        panic!("the sides kept talking");
    }

    #[test]
    fn a_peer_without_a_session_is_reached_through_a_relaying_neighbour() {
        let mut sides = vec![side(1, 1), side(2, 2), side(3, 3)];
        sides[1].mesh.settings.relay_via_peers = true;
        list_all(&mut sides);
        // 0 and 2 have no underlay path: sessions 0–1 and 1–2 come up, 0–2 never does
        for _ in 0..4 {
            pump(&mut sides, (0, 2));
        }
        let route = |s: &Side, dest: Ipv4Addr| s.mesh.router.as_ref().unwrap().next_hop(dest);
        let (v0, v1, v2) = (sides[0].vip, sides[1].vip, sides[2].vip);
        let hop = route(&sides[0], v2).expect("0 learnt 2 from 1");
        assert_eq!((hop.peer_id.as_str(), hop.hop_count), ("peer2", 1));
        assert_eq!(route(&sides[2], v0).unwrap().peer_id, "peer2");
        assert_eq!(route(&sides[0], v1).unwrap().hop_count, 0, "1 is direct");
        let published = sides[0].mesh.shared.routes.load();
        assert!(
            published
                .iter()
                .any(|r| r.dest_ip == v2 && r.relayed && r.next_hop == "peer2" && r.active),
            "{published:?}"
        );

        // 0 and 2 have a session of their own, handshaken through 1's envelopes
        let ends = |s: &Side| {
            let x = s
                .mesh
                .sessions
                .values()
                .find(|x| x.entry.id != "peer2")
                .unwrap();
            (x.connected(), x.relayed.is_some(), x.neighbour)
        };
        assert_eq!(ends(&sides[0]), (true, true, false), "0's session with 2");
        assert_eq!(ends(&sides[2]), (true, true, false), "2's session with 0");
        let c = &sides[0]
            .mesh
            .sessions
            .values()
            .find(|x| x.entry.vip == v2)
            .unwrap();
        assert_eq!(c.entry.counters.path_type(), Some("multi-hop"));

        // 0 → 2 through 1, end to end: unchanged (1 passed on ciphertext, it has no TTL to
        // decrement); the answer 2 → 0 the same way
        let packet = wire::udp_packet(v0, v2, 5000, b"two hops");
        sides[0].mesh.send_to_mesh(&packet);
        pump(&mut sides, (0, 2));
        assert_eq!(device_bytes(&mut sides[2]), packet);
        let answer = wire::udp_packet(v2, v0, 5001, b"back");
        sides[2].mesh.send_to_mesh(&answer);
        pump(&mut sides, (0, 2));
        assert_eq!(device_bytes(&mut sides[0]), answer);
        // the relay read neither (nor the handshakes): only envelopes and its own traffic
        assert_relay_read_nothing_of(&sides[1], &[b"two hops", b"back"]);
        assert!(device_bytes(&mut sides[1]).is_empty());
        assert!(sides[1].mesh.shared.totals.relayed.load(Relaxed) >= 4);

        // the largest packet the device passes does not fit an envelope in one underlay
        // datagram: with "don't fragment" (wire::udp_packet sets it) 0's device is told the
        // relayed way's MTU by ICMP from the relay's address; one that fits still goes
        let fits = 1400 - wire::ENVELOPE_OVERHEAD;
        let big = wire::udp_packet(v0, v2, 5002, &vec![7; fits + 1 - 28]);
        take_device(&mut sides[0]);
        take_device(&mut sides[2]);
        sides[0].mesh.send_to_mesh(&big);
        let icmp = take_device(&mut sides[0]);
        assert_eq!(
            wire::ipv4_addresses(&icmp),
            Some((v1, v0)),
            "from the relay to 0"
        );
        assert_eq!((icmp[20], icmp[21]), (3, 4), "fragmentation needed");
        assert_eq!(u16::from_be_bytes([icmp[26], icmp[27]]) as usize, fits);
        assert_eq!(&icmp[28..48], &big[..20], "quotes the packet's header");
        assert_eq!(
            sides[0].mesh.shared.totals.too_big_for_relay.load(Relaxed),
            1
        );
        pump(&mut sides, (0, 2));
        assert!(
            take_device(&mut sides[2]).is_empty(),
            "the big packet stayed"
        );
        let most = wire::udp_packet(v0, v2, 5003, &vec![7; fits - 28]);
        sides[0].mesh.send_to_mesh(&most);
        pump(&mut sides, (0, 2));
        assert_eq!(take_device(&mut sides[2]), most);

        // the relay leaves the network: 0's session with 2 keeps its keys but has no way, so
        // it shows connecting, not connected, and unreachable once connect_timeout passed
        let relay = sides.remove(1);
        list_all(&mut sides);
        let state = |s: &Side| {
            let x = s
                .mesh
                .sessions
                .values()
                .find(|x| x.entry.vip == v2)
                .unwrap();
            (x.connected(), x.entry.counters.state())
        };
        sides[0].mesh.tick();
        assert_eq!(state(&sides[0]), (true, SessionState::Connecting));
        sides[0].mesh.settings.connect_timeout = Duration::ZERO;
        sides[0].mesh.tick();
        assert_eq!(state(&sides[0]), (true, SessionState::Unreachable));
        drop(relay);

        // without relaying, 1 offers no routes: a fresh 0 learns nothing about 2
        let mut sides = vec![side(1, 1), side(2, 2), side(3, 3)];
        list_all(&mut sides);
        for _ in 0..4 {
            pump(&mut sides, (0, 2));
        }
        assert!(route(&sides[0], v2).is_none());
        assert!(route(&sides[0], v1).is_some());
    }

    /// Asserts that none of `needles` is in a packet `relay` decrypted, and that it passed on
    /// envelopes of others.
    fn assert_relay_read_nothing_of(relay: &Side, needles: &[&[u8]]) {
        let mut envelopes = 0;
        for p in &relay.mesh.decrypted_log {
            for n in needles {
                assert!(
                    !p.windows(n.len()).any(|w| w == *n),
                    "the relay read {:?}",
                    String::from_utf8_lossy(n)
                );
            }
            let (src, dst) = wire::ipv4_addresses(p).unwrap();
            if wire::udp_to(p).is_some_and(|(port, _)| port == RELAY_PORT)
                && src != relay.vip
                && dst != relay.vip
            {
                envelopes += 1;
            }
        }
        assert!(envelopes > 0, "nothing of others went through the relay");
    }

    #[test]
    fn across_three_hops_the_ends_handshake_and_talk_end_to_end_through_two_relays() {
        // a line 0 – 1 – 2 – 3: only neighbours have an underlay path; 1 and 2 relay
        let mut sides = vec![side(1, 1), side(2, 2), side(3, 3), side(4, 4)];
        for i in [1, 2] {
            sides[i].mesh.settings.relay_via_peers = true;
        }
        list_all(&mut sides);
        let cuts = [(0, 2), (0, 3), (1, 3)];
        for _ in 0..6 {
            pump_cut(&mut sides, &cuts);
        }
        let (v0, v3) = (sides[0].vip, sides[3].vip);
        let hop = sides[0].mesh.router.as_ref().unwrap().next_hop(v3).unwrap();
        assert_eq!((hop.peer_id.as_str(), hop.hop_count), ("peer2", 2));
        for s in sides.iter_mut() {
            take_device(s);
        }
        let packet = wire::udp_packet(v0, v3, 5000, b"three hops");
        sides[0].mesh.send_to_mesh(&packet);
        pump_cut(&mut sides, &cuts);
        assert_eq!(take_device(&mut sides[3]), packet);
        let answer = wire::udp_packet(v3, v0, 5000, b"three back");
        sides[3].mesh.send_to_mesh(&answer);
        pump_cut(&mut sides, &cuts);
        assert_eq!(take_device(&mut sides[0]), answer);
        let session = sides[3].mesh.by_vip[&v0];
        assert!(sides[3].mesh.sessions[&session].connected());
        for relay in [1, 2] {
            assert_relay_read_nothing_of(&sides[relay], &[b"three hops", b"three back"]);
            assert!(take_device(&mut sides[relay]).is_empty());
        }
    }

    #[test]
    fn a_relay_that_forges_a_members_source_or_envelope_is_dropped_and_counted() {
        let mut sides = vec![side(1, 1), side(2, 2), side(3, 3)];
        sides[1].mesh.settings.relay_via_peers = true;
        list_all(&mut sides);
        for _ in 0..4 {
            pump(&mut sides, (0, 2));
        }
        let (v0, v1, v2) = (sides[0].vip, sides[1].vip, sides[2].vip);
        for s in sides.iter_mut() {
            take_device(s);
        }
        // 1 writes a packet in 0's name into its own session with 2
        let forged = wire::udp_packet(v0, v2, 5000, b"in 0's name");
        sides[1].mesh.send_to_mesh(&forged);
        pump(&mut sides, (0, 2));
        assert!(take_device(&mut sides[2]).is_empty(), "delivered a forgery");
        let totals = &sides[2].mesh.shared.totals;
        assert_eq!(totals.invalid.load(Relaxed), 1);
        // … and an envelope from 0 whose datagram it made up (a data message for 2's session
        // with 0, by its receiver index), and one it replays
        let index = sides[2].mesh.by_vip[&v0];
        let mut made_up = vec![4, 0, 0, 0];
        made_up.extend((index << 8).to_le_bytes());
        made_up.extend([0u8; 8 + 16 + 40]);
        let envelope = wire::udp_packet(v0, v2, RELAY_PORT, &made_up);
        sides[1].mesh.send_to_mesh(&envelope);
        pump(&mut sides, (0, 2));
        assert!(take_device(&mut sides[2]).is_empty());
        assert_eq!(sides[2].mesh.shared.totals.invalid.load(Relaxed), 2);
        // a genuine packet 0 → 2 still arrives, and the relay sending its own is fine
        let genuine = wire::udp_packet(v0, v2, 5000, b"from 0");
        sides[0].mesh.send_to_mesh(&genuine);
        pump(&mut sides, (0, 2));
        assert_eq!(take_device(&mut sides[2]), genuine);
        let own = wire::udp_packet(v1, v2, 5000, b"from 1");
        sides[1].mesh.send_to_mesh(&own);
        pump(&mut sides, (0, 2));
        assert_eq!(take_device(&mut sides[2]), own);
        // a relaying peer no longer passes on plaintext for others: 0 (no relay) drops what 2
        // hands it in plaintext for 1, counted
        let plain = wire::udp_packet(v2, v1, 5000, b"please forward");
        let to_0 = sides[2].mesh.by_vip[&v0];
        sides[2].mesh.send_to_session(to_0, |_| plain.clone());
        pump(&mut sides, (0, 2));
        assert!(take_device(&mut sides[1]).is_empty());
        assert_eq!(sides[0].mesh.shared.totals.relay_refused.load(Relaxed), 1);
        assert_eq!(sides[0].mesh.shared.totals.invalid.load(Relaxed), 0);
    }

    /// A side with NAT traversal on (no STUN/TURN servers: host candidates and checks).
    fn side_with_nat(seed: u8, last: u8) -> Side {
        let mut s = side(seed, last);
        let mut settings = s.mesh.settings.clone();
        settings.nat = crate::mesh::NatSettings {
            enabled: true,
            host_candidates: vec![s.addr],
            ..crate::mesh::NatSettings::default()
        };
        s.mesh = Mesh::new(
            settings,
            s.mesh.shared.clone(),
            s.device.try_clone().unwrap(),
        );
        s
    }

    #[test]
    fn with_nat_traversal_the_checks_select_a_peer_reflexive_path_and_the_session_follows() {
        let mut sides = [side_with_nat(1, 1), side_with_nat(2, 2)];
        // each lists the other; side 0 knows side 1 only by an address nothing answers on
        // (a NAT mapping it never learnt), side 1 knows side 0's real address
        let wrong = SocketAddr::from(([192, 0, 2, 99], 1));
        for i in 0..2 {
            let other = &sides[1 - i];
            let published = if i == 0 { wrong } else { other.addr };
            let entry = Arc::new(PeerEntry {
                id: format!("peer{}", other.vip.octets()[3]),
                name: String::new(),
                vip: other.vip,
                public_key: other.public,
                endpoints: vec![published],
                candidates: vec![crate::mesh::CandidateEndpoint {
                    address: published.ip().to_string(),
                    port: published.port(),
                    kind: "lan".into(),
                    priority: 0,
                }],
                joined_ms: 1,
                anycast: Vec::new(),
                counters: Arc::new(PeerCounters::default()),
            });
            sides[i]
                .mesh
                .shared
                .publish(PeerTable { peers: vec![entry] });
            sides[i].mesh.sync_table();
        }
        let addrs = [sides[0].addr, sides[1].addr];
        let deadline = Instant::now() + Duration::from_secs(10);
        let connected = |s: &Side| s.mesh.sessions.values().all(|x| x.connected());
        while !(sides.iter().all(connected)
            && sides[0]
                .mesh
                .nat
                .as_ref()
                .unwrap()
                .selected("peer2")
                .is_some())
        {
            assert!(Instant::now() < deadline, "no path and session within 10 s");
            for s in sides.iter_mut() {
                s.mesh.nat_turn(Instant::now());
                s.mesh.tick();
            }
            for _ in 0..20 {
                for i in 0..2 {
                    let out = std::mem::take(&mut sides[i].mesh.outgoing);
                    for (dst, d) in out {
                        // only the real addresses answer
                        if let Some(j) = addrs.iter().position(|a| *a == dst) {
                            sides[j].mesh.on_datagram(&d, addrs[i]);
                        }
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // side 0 learnt side 1's address from its check (peer-reflexive) and uses it
        assert_eq!(
            sides[0]
                .mesh
                .nat
                .as_ref()
                .unwrap()
                .selected("peer2")
                .map(|(p, _)| p),
            Some(PathToPeer::Direct(addrs[1]))
        );
        let s = sides[0].mesh.sessions.values().next().unwrap();
        assert_eq!(sides[0].mesh.path_of(s), Some(PathToPeer::Direct(addrs[1])));
        assert_eq!(s.entry.counters.path_type(), Some("direct"));
        // data crosses on the selected path
        let packet = wire::udp_packet(sides[0].vip, sides[1].vip, 5000, b"through the NAT");
        sides[0].mesh.send_to_mesh(&packet);
        let out = std::mem::take(&mut sides[0].mesh.outgoing);
        assert!(out.iter().all(|(dst, _)| *dst == addrs[1]), "{out:?}");
        for (_, d) in out {
            sides[1].mesh.on_datagram(&d, addrs[0]);
        }
        assert!(device_bytes(&mut sides[1])
            .windows(packet.len())
            .any(|w| w == packet.as_slice()));
    }

    /// What reached a side's device since the last look (emptied).
    fn take_device(s: &mut Side) -> Vec<u8> {
        let all = device_bytes(s);
        s.device.set_len(0).unwrap();
        s.device.seek(SeekFrom::Start(0)).unwrap();
        all
    }

    /// A valid handshake initiation to `to` from a key nobody lists (mac1 keyed to `to`).
    fn stranger_initiation(seed: u8, to: &Side) -> Vec<u8> {
        let mut tunn = Tunn::new(
            StaticSecret::from([seed; 32]),
            PublicKey::from(to.public),
            None,
            None,
            1,
            None,
        );
        let mut out = vec![0u8; 256];
        match tunn.format_handshake_initiation(&mut out, false) {
            TunnResult::WriteToNetwork(d) => d.to_vec(),
            _ => panic!("no initiation"),
        }
    }

    #[test]
    fn initiations_without_our_mac1_are_refused_before_any_key_work() {
        let mut b = side(2, 2);
        let mut garbage = vec![0x5a; 148];
        garbage[..4].copy_from_slice(&1u32.to_le_bytes());
        for _ in 0..10 {
            b.mesh
                .on_datagram(&garbage, SocketAddr::from(([198, 51, 100, 7], 9)));
        }
        let totals = &b.mesh.shared.totals;
        assert_eq!(totals.handshakes_refused.load(Relaxed), 10);
        // never got as far as looking for the key (an X25519 operation each)
        assert_eq!(totals.unknown_key.load(Relaxed), 0);
        assert!(b.mesh.outgoing.is_empty());
    }

    #[test]
    fn a_handshake_flood_gets_cookies_and_a_live_session_keeps_carrying_packets() {
        let mut sides = vec![side(1, 1), side(2, 2)];
        list_all(&mut sides);
        pump(&mut sides, (9, 9));
        pump(&mut sides, (9, 9));
        let mut b = sides.pop().unwrap();
        let mut a = sides.pop().unwrap();
        // a second's worth of initiations from strangers, then more: the rest get cookies
        let flooder = SocketAddr::from(([198, 51, 100, 7], 9));
        let flood: Vec<Vec<u8>> = (0..30).map(|i| stranger_initiation(100 + i, &b)).collect();
        let sent = HANDSHAKES_PER_SECOND + 50;
        for i in 0..sent as usize {
            b.mesh.on_datagram(&flood[i % flood.len()], flooder);
        }
        let totals = &b.mesh.shared.totals;
        let (cookies, keyed) = (
            totals.handshake_cookies.load(Relaxed),
            totals.unknown_key.load(Relaxed),
        );
        // (the session's own handshake may have counted in this second too)
        assert_eq!(cookies + keyed, sent);
        assert!(cookies >= 50, "{cookies} cookies");
        assert!(
            keyed <= HANDSHAKES_PER_SECOND,
            "only the initiations within the rate cost key work: {keyed}"
        );
        let cookies = std::mem::take(&mut b.mesh.outgoing);
        assert_eq!(cookies.len() as u64, sent - keyed);
        assert!(cookies
            .iter()
            .all(|(to, d)| *to == flooder && d.len() == 64 && d[0] == COOKIE_REPLY));
        // meanwhile the session a–b carries a packet (no handshake needed)
        take_device(&mut b);
        let packet = wire::udp_packet(a.vip, b.vip, 5000, b"during the flood");
        a.mesh.send_to_mesh(&packet);
        deliver(&mut a, &mut b);
        assert_eq!(take_device(&mut b), packet);
    }

    #[test]
    fn a_cookie_reply_from_elsewhere_does_not_move_the_peers_address() {
        let (mut a, mut b) = (side(1, 1), side(2, 2));
        list(&mut a, &b, b.public);
        list(&mut b, &a, a.public);
        // b is under load: a's initiation is answered with a cookie reply
        let stranger = stranger_initiation(100, &b);
        for _ in 0..HANDSHAKES_PER_SECOND {
            b.mesh
                .on_datagram(&stranger, SocketAddr::from(([198, 51, 100, 7], 9)));
        }
        b.mesh.outgoing.clear();
        a.mesh.tick();
        let initiation = std::mem::take(&mut a.mesh.outgoing);
        assert!(!initiation.is_empty(), "a initiates");
        for (_, d) in &initiation {
            b.mesh.on_datagram(d, a.addr);
        }
        let (_, cookie) = b
            .mesh
            .outgoing
            .iter()
            .find(|(_, d)| d.first() == Some(&COOKIE_REPLY))
            .cloned()
            .expect("a cookie reply");
        // the cookie reply arrives from an address that is not b's: a takes the cookie but
        // learns no path from it
        let elsewhere = SocketAddr::from(([203, 0, 113, 9], 4444));
        a.mesh.on_datagram(&cookie, elsewhere);
        let learnt: Vec<_> = a
            .mesh
            .sessions
            .values()
            .map(|s| s.learnt.map(|(p, _)| p))
            .collect();
        assert!(
            learnt
                .iter()
                .all(|l| !matches!(l, Some(PathToPeer::Direct(x)) if *x == elsewhere)),
            "{learnt:?}"
        );
    }

    /// The IGMPv3 report the kernel writes when a socket joins (`join`) or leaves `group`.
    fn igmp_v3(from: Ipv4Addr, group: Ipv4Addr, join: bool) -> Vec<u8> {
        let mut igmp = vec![0x22, 0, 0, 0, 0, 0, 0, 1, if join { 4 } else { 3 }, 0, 0, 0];
        igmp.extend(group.octets());
        let mut p = wire::udp_packet(from, Ipv4Addr::new(224, 0, 0, 22), 1, &[]);
        p.truncate(20);
        p[9] = 2;
        p[3] = (20 + igmp.len()) as u8;
        p.extend(igmp);
        p
    }

    #[test]
    fn a_relaying_peer_speaks_only_for_its_own_address_not_for_those_it_routes_to() {
        let mut sides = vec![side(1, 1), side(2, 2), side(3, 3)];
        for s in sides.iter_mut() {
            s.mesh.settings.relay_via_peers = true;
        }
        list_all(&mut sides);
        // 0 reaches 2 only through 1
        for _ in 0..4 {
            pump(&mut sides, (0, 2));
        }
        for s in sides.iter_mut() {
            take_device(s);
        }
        let (v0, v1, v2) = (sides[0].vip, sides[1].vip, sides[2].vip);
        // peer1 sends packets whose sources are: itself, peer3 (it relays for it), nobody
        for src in [v1, v2, Ipv4Addr::new(10, 100, 0, 77)] {
            let packet = wire::udp_packet(src, v0, 5000, b"who");
            sides[1].mesh.send_to_mesh(&packet);
            pump(&mut sides, (0, 2));
            let got = take_device(&mut sides[0]);
            if src == v1 {
                assert_eq!(got, packet, "{src}");
            } else {
                assert!(got.is_empty(), "{src} is not peer1's");
            }
        }
        assert_eq!(sides[0].mesh.shared.totals.invalid.load(Relaxed), 2);
    }

    #[test]
    fn floods_are_delivered_only_from_their_origins_own_session_at_its_own_address() {
        let mut sides = vec![side(1, 1), side(2, 2)];
        for s in &sides {
            s.mesh.shared.set_network_prefix(24);
        }
        list_all(&mut sides);
        for _ in 0..3 {
            pump(&mut sides, (9, 9));
        }
        take_device(&mut sides[1]);
        let everyone = Ipv4Addr::new(10, 100, 0, 255);
        let flood = |origin: &str, src: Ipv4Addr| {
            Message::Flood(switchyard_mesh_routing::wire::Flood {
                origin: origin.into(),
                id: 1 << 40,
                ttl: 2,
                mode: switchyard_mesh_routing::FloodMode::Broadcast,
                payload: wire::udp_packet(src, everyone, 9, b"flood"),
            })
            .encode()
            .unwrap()
        };
        // a flood message in a stranger's name, and even in its own: floods travel as copies
        // in the origin's session, never as messages a member passes on
        let own = sides[0].vip;
        sides[0].mesh.send_control("peer2", &flood("mallory", own));
        sides[0].mesh.send_control("peer2", &flood("peer1", own));
        // a broadcast packet with another member's source, in its own session
        let to_1 = sides[0].mesh.by_vip[&sides[1].vip];
        let other = wire::udp_packet(Ipv4Addr::new(10, 100, 0, 3), everyone, 9, b"flood");
        sides[0].mesh.send_to_session(to_1, |_| other.clone());
        pump(&mut sides, (9, 9));
        assert!(take_device(&mut sides[1]).is_empty(), "nothing delivered");
        let totals = sides[1].mesh.shared.clone();
        let totals = &totals.totals;
        assert_eq!(totals.control_dropped.load(Relaxed), 2, "flood messages");
        assert_eq!(totals.invalid.load(Relaxed), 1, "forged inner source");
        // its own broadcast from its device, from its own address, is delivered once
        let broadcast = wire::udp_packet(own, everyone, 9, b"flood");
        sides[0].mesh.device_packet(&broadcast);
        pump(&mut sides, (9, 9));
        assert_eq!(take_device(&mut sides[1]), broadcast);
        assert_eq!(totals.modes.broadcast_received.load(Relaxed), 1);
    }

    #[test]
    fn broadcast_multicast_and_anycast_reach_the_right_peers_across_two_hops() {
        let mut sides = vec![side(1, 1), side(2, 2), side(3, 3)];
        sides[1].mesh.settings.relay_via_peers = true;
        for s in &sides {
            s.mesh.shared.set_network_prefix(24);
        }
        list_all(&mut sides);
        for _ in 0..4 {
            pump(&mut sides, (0, 2));
        }
        let (v0, v2) = (sides[0].vip, sides[2].vip);
        for s in sides.iter_mut() {
            take_device(s);
        }

        // a broadcast from 0 reaches 1 and (through 1) 2, once each, unchanged
        let broadcast = wire::udp_packet(v0, Ipv4Addr::new(10, 100, 0, 255), 9999, b"all");
        sides[0].mesh.device_packet(&broadcast);
        pump(&mut sides, (0, 2));
        assert_eq!(take_device(&mut sides[1]), broadcast);
        assert_eq!(take_device(&mut sides[2]), broadcast, "exactly once");
        assert!(take_device(&mut sides[0]).is_empty());
        let modes = &sides[2].mesh.shared.totals.modes;
        assert_eq!(modes.broadcast_received.load(Relaxed), 1);
        assert!(sides[1].mesh.shared.totals.relayed.load(Relaxed) >= 1);

        // 2 joins a group on its device (IGMP): a multicast from 0 reaches only 2
        let group = Ipv4Addr::new(239, 1, 2, 3);
        sides[2].mesh.device_packet(&igmp_v3(v2, group, true));
        assert!(take_device(&mut sides[2]).is_empty(), "IGMP is consumed");
        for _ in 0..2 {
            pump(&mut sides, (0, 2));
        }
        let multicast = wire::udp_packet(v0, group, 5353, b"group");
        sides[0].mesh.device_packet(&multicast);
        pump(&mut sides, (0, 2));
        assert_eq!(take_device(&mut sides[2]), multicast);
        assert!(take_device(&mut sides[1]).is_empty(), "1 did not join");
        // the copy for 2 went through 1 in an envelope of the session 0–2
        assert_relay_read_nothing_of(&sides[1], &[b"group"]);
        // after the leave nothing is sent at all
        sides[2].mesh.device_packet(&igmp_v3(v2, group, false));
        for _ in 0..2 {
            pump(&mut sides, (0, 2));
        }
        sides[0].mesh.device_packet(&multicast);
        pump(&mut sides, (0, 2));
        assert!(take_device(&mut sides[2]).is_empty());
        assert_eq!(
            sides[0]
                .mesh
                .shared
                .totals
                .modes
                .multicast_sent
                .load(Relaxed),
            1
        );

        // an anycast address on 1 and 2 that the registry does not list: it draws nothing
        let anycast = Ipv4Addr::new(10, 100, 0, 200);
        for i in [1, 2] {
            sides[i].mesh.shared.set_local_anycast(vec![anycast]);
        }
        for _ in 0..3 {
            pump(&mut sides, (0, 2));
        }
        let to_anycast = wire::udp_packet(v0, anycast, 7000, b"nearest");
        sides[0].mesh.device_packet(&to_anycast);
        pump(&mut sides, (0, 2));
        assert!(take_device(&mut sides[1]).is_empty() && take_device(&mut sides[2]).is_empty());
        assert!(
            sides[0]
                .mesh
                .shared
                .totals
                .route_claims_refused
                .load(Relaxed)
                > 0
        );
        // listed for both: 0's packets go to 1 (closer), then to 2 when 1 drops it
        let listed = vec![Vec::new(), vec![anycast], vec![anycast]];
        list_all_with_anycast(&mut sides, &listed);
        for _ in 0..3 {
            pump(&mut sides, (0, 2));
        }
        sides[0].mesh.device_packet(&to_anycast);
        pump(&mut sides, (0, 2));
        assert_eq!(take_device(&mut sides[1]), to_anycast);
        assert!(take_device(&mut sides[2]).is_empty());
        sides[1].mesh.shared.set_local_anycast(Vec::new());
        for _ in 0..3 {
            pump(&mut sides, (0, 2));
        }
        sides[0].mesh.device_packet(&to_anycast);
        pump(&mut sides, (0, 2));
        assert!(take_device(&mut sides[1]).is_empty());
        assert_eq!(take_device(&mut sides[2]), to_anycast, "moved to 2, via 1");
        let modes = &sides[2].mesh.shared.totals.modes;
        assert_eq!(modes.anycast_received.load(Relaxed), 1);
        assert_eq!(modes.anycast_addresses.load(Relaxed), 1);
    }
}
