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
use super::wire::{self, DatagramKind, CONTROL_PORT};
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
use std::net::{Ipv4Addr, SocketAddr};
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

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

struct Session {
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
    sessions: HashMap<u32, Session>,
    /// Broadcast, multicast and anycast; TAP frames.
    modes: modes::Modes,
    next_index: u32,
    device: Device,
    /// Datagrams to send once the `RefCell` borrow ends.
    outgoing: Vec<(SocketAddr, Vec<u8>)>,
    /// Output of encapsulation and timers.
    scratch: Vec<u8>,
    /// Output of decapsulation: separate, because a decrypted packet may be answered (a
    /// probe reply) or forwarded, which encapsulates, while it is still being read.
    decrypted: Vec<u8>,
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
            scratch: vec![0u8; SCRATCH],
            decrypted: vec![0u8; SCRATCH],
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
        let up = s.connected();
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
        let mut keep: HashMap<u32, Session> = HashMap::new();
        let mut old: Vec<(u32, Session)> = self.sessions.drain().collect();
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
                    let mut s = Session {
                        entry: entry.clone(),
                        tunn,
                        learnt: None,
                        relays: nat::relay_addresses(&entry.candidates),
                        choice: 0,
                        trying_since: Instant::now(),
                        neighbour: false,
                    };
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
        self.sessions = keep;
        self.table = table;
        self.share_members();
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

    fn allocate_index(&mut self, a: &HashMap<u32, Session>, b: &[(u32, Session)]) -> u32 {
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
        let Some(path) = self.path_of(s) else {
            return;
        };
        if let TunnResult::WriteToNetwork(d) =
            s.tunn.format_handshake_initiation(&mut self.scratch, again)
        {
            let d = d.to_vec();
            self.transmit(path, d);
        }
    }

    /// Where session `s`'s datagrams go now.
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
            s.entry.counters.set_path(self.path_of(&s).as_ref());
            if !s.connected() && self.public.as_bytes() < &s.entry.public_key {
                self.initiate(&mut s, true);
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
        let index = match wire::classify(d) {
            DatagramKind::Stun | DatagramKind::ChannelData => {
                self.shared.totals.ice_dropped.fetch_add(1, Relaxed);
                return;
            }
            DatagramKind::Unknown => {
                self.shared.totals.invalid.fetch_add(1, Relaxed);
                return;
            }
            DatagramKind::WireGuard { receiver } => receiver >> 8,
            DatagramKind::HandshakeInit if !self.handshake_admitted(d, back) => return,
            DatagramKind::HandshakeInit => match self.initiator_index(d) {
                Some(i) => i,
                None => {
                    self.shared.totals.unknown_key.fetch_add(1, Relaxed);
                    tracing::debug!(%from, "mesh handshake from a key the registry does not list: dropped");
                    return;
                }
            },
        };
        let Some(mut s) = self.sessions.remove(&index) else {
            self.shared.totals.invalid.fetch_add(1, Relaxed);
            return;
        };
        let back = match back {
            PathToPeer::Direct(a) => nat::arrival(a, None, &s.relays),
            relayed => relayed,
        };
        self.decapsulate(&mut s, d, back);
        self.sessions.insert(index, s);
    }

    /// Whether a handshake initiation may cost the X25519 work of finding its key: its mac1
    /// must be keyed to our public key, and beyond [`HANDSHAKES_PER_SECOND`] its mac2 must
    /// carry the cookie of its source address (answered with a cookie reply otherwise).
    fn handshake_admitted(&mut self, d: &[u8], back: PathToPeer) -> bool {
        let from = match back {
            PathToPeer::Direct(a) | PathToPeer::Relayed { remote: a, .. } => a,
        };
        let mut reply = [0u8; 64];
        match self.limiter.verify_packet(Some(from.ip()), d, &mut reply) {
            Ok(_) => true,
            Err(TunnResult::WriteToNetwork(cookie)) => {
                self.shared.totals.handshake_cookies.fetch_add(1, Relaxed);
                let cookie = cookie.to_vec();
                self.transmit(back, cookie);
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

    fn decapsulate(&mut self, s: &mut Session, d: &[u8], back: PathToPeer) {
        let from = match back {
            PathToPeer::Direct(a) | PathToPeer::Relayed { remote: a, .. } => a,
        };
        let mut scratch = std::mem::take(&mut self.decrypted);
        // anyone who saw our initiation's mac1 can make a cookie reply: it says nothing about
        // where the peer is
        let proves_address = d.first() != Some(&COOKIE_REPLY);
        let mut first = true;
        loop {
            let input: &[u8] = if first { d } else { &[] };
            let src = first.then_some(from.ip());
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
                    let path = self.path_of(s).unwrap_or(back);
                    self.transmit(path, out);
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
    fn authenticated(&self, s: &mut Session, back: PathToPeer) {
        if s.learnt.map(|(p, _)| p) != Some(back) {
            s.learnt = Some((back, Instant::now()));
        }
        s.entry.counters.last_seen_ms.store(unix_ms(), Relaxed);
        self.refresh_state(s);
    }

    fn refresh_state(&self, s: &mut Session) {
        let c = &s.entry.counters;
        if s.connected() {
            let path = self.path_of(s);
            if c.state() != SessionState::Connected {
                tracing::info!(peer = %s.entry.id, ?path, "mesh session up");
            }
            c.set_path(path.as_ref());
            c.set_state(SessionState::Connected);
            s.trying_since = Instant::now();
            if let Some(age) = s.tunn.time_since_last_handshake() {
                c.last_handshake_ms
                    .store(unix_ms().saturating_sub(age.as_millis() as u64), Relaxed);
            }
        }
    }

    /// A decrypted IP packet from peer `s`.
    fn decrypted_packet(&mut self, s: &mut Session, mut packet: Vec<u8>) {
        if packet.is_empty() {
            return; // keepalive
        }
        let Some((src, dst)) = wire::ipv4_addresses(&packet) else {
            self.shared.totals.no_route.fetch_add(1, Relaxed);
            return;
        };
        // a peer speaks for its own address, and for the members it offers routes to (a
        // relayed packet comes from one of those): never for an address the registry does not
        // give a member, whether or not we forward for others
        let relayed_by_sender = || {
            self.router
                .as_ref()
                .is_some_and(|r| r.may_come_through(&s.entry.id, src))
        };
        if src != s.entry.vip && !relayed_by_sender() && !self.anycast_source(s, src) {
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
                // learn where the sender's MAC lives, then hand the frame to the device
                self.learn_mac(frame, src);
                self.write_device(frame);
            } else {
                // TAP mode carries frames only
                totals.invalid.fetch_add(1, Relaxed);
            }
            return;
        }
        // forwarding hop by hop along the routing table, TTL decremented
        if !self.settings.relay_via_peers || !wire::decrement_ttl(&mut packet) {
            totals.no_route.fetch_add(1, Relaxed);
            return;
        }
        self.forward(&packet);
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
        self.after_control(payload, &outcome);
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
        // the router's next hop (the destination itself while its session is up, else a
        // peer on the way); without a route, the destination's own session, which queues
        // the packet and handshakes
        let routed = self
            .router
            .as_ref()
            .and_then(|r| r.next_hop(dst))
            .and_then(|hop| self.session_of(&hop.peer_id));
        let index = routed.or_else(|| {
            owner_of(&self.table, dst).and_then(|entry| {
                self.sessions
                    .iter()
                    .find(|(_, s)| Arc::ptr_eq(&s.entry, entry))
                    .map(|(i, _)| *i)
            })
        });
        match index {
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
        let Some(path) = self.path_of(s) else {
            self.shared.totals.no_route.fetch_add(1, Relaxed);
            return;
        };
        // boringtun queues the packet itself while a handshake is under way
        if let TunnResult::WriteToNetwork(d) = s.tunn.encapsulate(packet, &mut self.scratch) {
            let d = d.to_vec();
            self.transmit(path, d);
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
            let path = self.path_of(&s);
            if let TunnResult::WriteToNetwork(d) = s.tunn.update_timers(&mut self.scratch) {
                if let Some(path) = path {
                    let d = d.to_vec();
                    self.transmit(path, d);
                }
            }
            self.refresh_state(&mut s);
            self.sync_neighbour(&mut s, now);
            if !s.connected() && s.trying_since.elapsed() >= self.settings.connect_timeout {
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
            socket.send_all(&mut out).await;
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
            socket.send_all(&mut out).await;
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
        socket.send_all(&mut out).await;
    }
    let mut goodbye = {
        let mut m = mesh.borrow_mut();
        m.close_nat();
        std::mem::take(&mut m.outgoing)
    };
    socket.send_all(&mut goodbye).await;
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

    /// Delivers datagrams between the sides until none are left, except between the pairs
    /// in `cut` (no underlay path); ticks every side first.
    fn pump(sides: &mut [Side], cut: (usize, usize)) {
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
                    if (i, j) == cut || (j, i) == cut {
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

        // 0 → 2 through 1, TTL decremented once; the answer 2 → 0 passes the source check
        let packet = wire::udp_packet(v0, v2, 5000, b"two hops");
        sides[0].mesh.send_to_mesh(&packet);
        pump(&mut sides, (0, 2));
        let mut expected = packet.clone();
        assert!(wire::decrement_ttl(&mut expected));
        assert_eq!(device_bytes(&mut sides[2]), expected);
        let answer = wire::udp_packet(v2, v0, 5001, b"back");
        sides[2].mesh.send_to_mesh(&answer);
        pump(&mut sides, (0, 2));
        let mut expected = answer.clone();
        assert!(wire::decrement_ttl(&mut expected));
        assert_eq!(device_bytes(&mut sides[0]), expected);

        // without relaying, 1 offers no routes: a fresh 0 learns nothing about 2
        let mut sides = vec![side(1, 1), side(2, 2), side(3, 3)];
        list_all(&mut sides);
        for _ in 0..4 {
            pump(&mut sides, (0, 2));
        }
        assert!(route(&sides[0], v2).is_none());
        assert!(route(&sides[0], v1).is_some());
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
    fn a_relaying_peer_cannot_speak_for_an_address_no_member_it_routes_to_holds() {
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
            if src == Ipv4Addr::new(10, 100, 0, 77) {
                assert!(got.is_empty(), "an address no member holds");
            } else {
                assert_eq!(got, packet, "{src}");
            }
        }
        assert_eq!(sides[0].mesh.shared.totals.invalid.load(Relaxed), 1);
    }

    #[test]
    fn floods_are_delivered_only_from_a_listed_origin_at_its_own_address() {
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
        let flood = |origin: &str, id: u64, src: Ipv4Addr| {
            Message::Flood(switchyard_mesh_routing::wire::Flood {
                origin: origin.into(),
                id,
                ttl: 2,
                mode: switchyard_mesh_routing::FloodMode::Broadcast,
                payload: wire::udp_packet(src, everyone, 9, b"flood"),
            })
            .encode()
            .unwrap()
        };
        // peer1 floods a packet with another member's source; then in the name of a stranger
        let own = sides[0].vip;
        sides[0].mesh.send_control(
            "peer2",
            &flood("peer1", 1 << 40, Ipv4Addr::new(10, 100, 0, 2)),
        );
        sides[0]
            .mesh
            .send_control("peer2", &flood("mallory", 1 << 40, own));
        pump(&mut sides, (9, 9));
        assert!(take_device(&mut sides[1]).is_empty(), "nothing delivered");
        let totals = &sides[1].mesh.shared.totals;
        assert_eq!(totals.invalid.load(Relaxed), 1, "forged inner source");
        assert_eq!(
            totals.route_claims_refused.load(Relaxed),
            1,
            "unlisted origin"
        );
        // its own flood, from its own address, is delivered
        sides[0]
            .mesh
            .send_control("peer2", &flood("peer1", (1 << 40) + 1, own));
        pump(&mut sides, (9, 9));
        assert_eq!(
            take_device(&mut sides[1]),
            wire::udp_packet(own, everyone, 9, b"flood")
        );
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
        assert_eq!(
            sides[1]
                .mesh
                .shared
                .totals
                .modes
                .floods_forwarded
                .load(Relaxed),
            1
        );

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
        let mut forwarded = to_anycast.clone();
        assert!(wire::decrement_ttl(&mut forwarded));
        assert_eq!(take_device(&mut sides[2]), forwarded, "moved to 2, via 1");
        let modes = &sides[2].mesh.shared.totals.modes;
        assert_eq!(modes.anycast_received.load(Relaxed), 1);
        assert_eq!(modes.anycast_addresses.load(Relaxed), 1);
    }
}
