//! The distance-vector routing table of one mesh peer, with path vectors, split horizon
//! (poisoned reverse), hysteresis, route expiry, triggered and periodic announcements, latency
//! probes, group membership flooding and the broadcast/multicast delivery tree.
//!
//! Rules, in the order a reader needs them:
//! * **Metric** = latency ms + hop count × [`HOP_PENALTY_MS`] (spec). Hop count is the number of
//!   peers between us and the destination: 0 for a direct session. Latency is the round-trip
//!   time of the probes, summed over the links. The penalty is what makes a direct route rank
//!   ahead of a one-hop relay, and that ahead of multi-hop, unless a link is over 100 ms slower.
//! * **Selection**: lowest metric, then fewest hops, then lowest next-hop id. A route in use is
//!   kept while its metric stays within the hysteresis (max(`hysteresis_ms`, 10 %)) of the best
//!   candidate, so small latency changes do not make traffic flap between next hops.
//! * **Path vector**: every entry carries the peers between its sender and the destination; an
//!   entry whose path holds our id (or repeats an id) is never used — the loop is refused
//!   before it forms, so there is no count-to-infinity. `max_hops` bounds the hop count. A
//!   path through a neighbour that itself told us it cannot reach the destination is stale and
//!   skipped too. While updates are in flight two peers can still briefly use each other's
//!   stale routes (a micro-loop lasting until the updates cross); the IP TTL, decremented by
//!   the peer on every forward, is the other half of loop prevention for those packets.
//! * **Split horizon with poisoned reverse**: when `split_horizon` is on, the route to D whose
//!   next hop is N is announced to N with metric infinity rather than left out. Why: N drops a
//!   route through us at once instead of waiting for `route_timeout`, and the poisoned entry
//!   tells N "I reach D through you" — exactly the child links of D's delivery tree that
//!   broadcast and multicast need. Off, entries go to everyone and the path vector alone keeps
//!   routes loop-free (the receiver still learns the child link from the path).
//! * **Announcements**: periodic full tables every `announce_interval` (10 s by default, minus
//!   a random jitter of up to `announce_jitter` so peers do not synchronise), a full table to a
//!   neighbour that just came up, and triggered updates carrying only the destinations whose
//!   route appeared, disappeared (metric infinity: withdrawal), changed path or next hop, or
//!   moved by more than the hysteresis. Entries are upserts; a learned route not refreshed
//!   within `route_timeout` expires. A withdrawal is repeated in the next two periodic rounds.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant, SystemTime};

use thiserror::Error;

use crate::groups::GroupTable;
use crate::seen::SeenCache;
use crate::wire::{
    announcement_header_len, entry_len, Announcement, Message, Probe, RouteEntry, WireError,
    MAX_DATAGRAM, MAX_ID_LEN, MAX_PATH, METRIC_INFINITY,
};

#[cfg(test)]
mod tests;
mod traffic;

/// Metric added per peer between us and the destination (spec: hop count × 100).
pub const HOP_PENALTY_MS: u32 = 100;

/// How often full tables go out unless configured otherwise.
pub const DEFAULT_ANNOUNCE_INTERVAL: Duration = Duration::from_secs(10);
/// Random shortening of each announcement interval (de-synchronises the peers).
pub const DEFAULT_ANNOUNCE_JITTER: Duration = Duration::from_secs(2);
/// Smallest metric improvement that moves a route to another next hop.
pub const DEFAULT_HYSTERESIS_MS: u32 = 10;
/// Most destinations kept per neighbour (a /16 mesh network): a neighbour announcing more
/// cannot grow our memory without bound.
pub const MAX_DESTINATIONS: usize = 65_536;
/// Shortest announcement interval the router accepts.
pub const MIN_ANNOUNCE_INTERVAL: Duration = Duration::from_secs(1);
/// How many periodic rounds repeat a withdrawal.
const WITHDRAWAL_ROUNDS: u8 = 2;

/// The routing keys (`mesh.routing.*`) plus the timers this crate chooses. [`Router::new`]
/// keeps them workable: max_hops ≤ [`MAX_PATH`], announce_interval ≥
/// [`MIN_ANNOUNCE_INTERVAL`], jitter ≤ half the interval, route_timeout ≥ three intervals
/// ([`Router::config`] shows what is in force).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingConfig {
    /// Most peers between us and a destination (0: direct sessions only). At most [`MAX_PATH`].
    pub max_hops: u8,
    /// A learned route (and a group membership) not refreshed for this long is dropped.
    pub route_timeout: Duration,
    pub split_horizon: bool,
    pub announce_interval: Duration,
    pub announce_jitter: Duration,
    pub hysteresis_ms: u32,
}

impl RoutingConfig {
    /// From the `mesh.routing` keys; `max_hops` is clamped to [`MAX_PATH`].
    pub fn new(max_hops: u32, route_timeout: Duration, split_horizon: bool) -> Self {
        RoutingConfig {
            max_hops: u8::try_from(max_hops.min(MAX_PATH as u32)).unwrap_or(MAX_PATH as u8),
            route_timeout,
            split_horizon,
            ..RoutingConfig::default()
        }
    }
}

impl Default for RoutingConfig {
    /// The spec's sample values: max_hops 8, route_timeout 5m, split_horizon true.
    fn default() -> Self {
        RoutingConfig {
            max_hops: 8,
            route_timeout: Duration::from_secs(300),
            split_horizon: true,
            announce_interval: DEFAULT_ANNOUNCE_INTERVAL,
            announce_jitter: DEFAULT_ANNOUNCE_JITTER,
            hysteresis_ms: DEFAULT_HYSTERESIS_MS,
        }
    }
}

/// The spec's metric: latency ms + hop count × 100, kept below [`METRIC_INFINITY`].
pub fn metric(latency_ms: u32, hop_count: u8) -> u32 {
    latency_ms
        .saturating_add(HOP_PENALTY_MS.saturating_mul(u32::from(hop_count)))
        .min(METRIC_INFINITY - 1)
}

/// Where to send a packet for a destination: always a peer we have a session with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextHop {
    /// The neighbour to hand the packet to (the destination itself for a direct route).
    pub peer_id: String,
    pub vip: Ipv4Addr,
    pub dest_peer_id: String,
    pub metric: u32,
    pub hop_count: u8,
}

/// Spec `type` of a Mesh route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    Direct,
    Relayed,
}

impl RouteKind {
    /// The spec's value: `direct` or `relayed`.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteKind::Direct => "direct",
            RouteKind::Relayed => "relayed",
        }
    }
}

/// One row of `GET /api/v1/mesh/routes` (the spec's Mesh route), plus the path vector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteView {
    pub dest_peer_id: String,
    pub dest_ip: Ipv4Addr,
    /// Empty for a direct route.
    pub next_hop: String,
    pub kind: RouteKind,
    pub metric: u32,
    pub latency_ms: u32,
    pub hop_count: u8,
    /// Monotonic; [`RouteView::last_updated_at`] gives the date-time.
    pub last_updated: Instant,
    /// The route in use for the destination (the others are alternatives).
    pub active: bool,
    /// Peers between us and the destination, next hop first.
    pub path: Vec<String>,
}

impl RouteView {
    /// `last_updated` as wall-clock time for the API, from one reading of both clocks.
    pub fn last_updated_at(&self, now: Instant, wall_now: SystemTime) -> SystemTime {
        wall_now
            .checked_sub(now.saturating_duration_since(self.last_updated))
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }
}

/// Counters since start, for the peer's stats endpoint and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouterStats {
    pub announcements_sent: u64,
    pub announcements_received: u64,
    /// Refused whole: stale, from a stranger, or claiming another sender.
    pub announcements_refused: u64,
    /// Entries not usable as routes: through us, repeated ids, through the sender (withdrawals
    /// and poisoned entries are not counted).
    pub entries_refused: u64,
    /// Route entries and memberships for an id the registry does not list, or naming another
    /// virtual IP than the registry gives that id; memberships naming a member's address as a
    /// group.
    pub claims_refused: u64,
    /// Learned routes dropped for not being refreshed within route_timeout.
    pub routes_expired: u64,
    /// Destinations that became unreachable (withdrawn to the neighbours).
    pub routes_lost: u64,
    pub probes_sent: u64,
    pub probe_replies: u64,
    pub memberships_accepted: u64,
    pub floods_originated: u64,
    pub floods_delivered: u64,
    /// Copies passed on down delivery trees.
    pub floods_forwarded: u64,
    /// Copies dropped by the seen-cache.
    pub flood_duplicates: u64,
    /// Control datagrams that did not decode.
    pub malformed: u64,
}

/// Why a control message was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RoutingError {
    #[error("{0} is not a neighbour (no session)")]
    NotNeighbour(String),
    #[error("announcement from {from} claims to be from {claimed}")]
    SenderMismatch { from: String, claimed: String },
    #[error("stale announcement from {from}: seq {seq} ≤ {last}")]
    Stale { from: String, seq: u64, last: u64 },
    #[error("a peer id must be 1..={MAX_ID_LEN} bytes and not our own")]
    BadPeerId,
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// What a received control datagram asks of the peer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ControlOutcome {
    /// Datagrams for the control port of these neighbours.
    pub send: Vec<(String, Vec<u8>)>,
    /// A flooded packet (IP packet or Ethernet frame) to write to the local device.
    pub deliver: Option<Vec<u8>>,
    /// A probe reply matched one of ours: the measured round-trip time.
    pub rtt: Option<Duration>,
}

/// Where an anycast packet goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnycastTarget {
    /// We are the closest member (we are one): deliver locally.
    Local,
    /// The closest reachable member and the next hop towards it.
    Remote(NextHop),
}

#[derive(Debug)]
struct Neighbour {
    vip: Ipv4Addr,
    latency_ms: u32,
    /// Last time the session's latency was set or measured.
    updated: Instant,
    last_seq: Option<u64>,
    adverts: BTreeMap<String, Advert>,
    /// Our outstanding probe: nonce and when it left.
    probe: Option<(u64, Instant)>,
}

/// The neighbour's last word on one destination.
#[derive(Debug)]
struct Advert {
    /// Usable route, or None when withdrawn, poisoned or refused (loop, max_hops).
    route: Option<Learned>,
    /// The neighbour reaches this destination through us: a child link of its delivery tree.
    via_us: bool,
    received: Instant,
}

#[derive(Debug)]
struct Learned {
    vip: Ipv4Addr,
    latency_ms: u32,
    path: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Route {
    next_hop: String,
    vip: Ipv4Addr,
    latency_ms: u32,
    /// Peers between us and the destination, next hop first; empty when direct.
    path: Vec<String>,
    metric: u32,
    last_updated: Instant,
}

impl Route {
    fn hop_count(&self) -> u8 {
        u8::try_from(self.path.len()).unwrap_or(u8::MAX)
    }
}

/// A tiny deterministic generator (xorshift64*) for jitter and nonces; seeded by the caller so
/// the router stays free of I/O and tests are reproducible.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// One peer's routing state machine. Feed it events and time; it gives back datagrams for the
/// control port and answers next-hop queries. See the crate docs for how the peer drives it.
#[derive(Debug)]
pub struct Router {
    local_id: String,
    local_vip: Ipv4Addr,
    config: RoutingConfig,
    rng: Rng,
    /// Origin of probe timestamps.
    epoch: Instant,
    last_now: Instant,
    neighbours: BTreeMap<String, Neighbour>,
    routes: BTreeMap<String, Route>,
    by_vip: BTreeMap<Ipv4Addr, String>,
    /// The registry's table: which peer id owns which virtual IP. Announcements choose paths
    /// only; an entry naming an id not listed here, or another address than the listed one,
    /// is no route (a member cannot draw another's traffic by claiming its address).
    members: BTreeMap<String, Ipv4Addr>,
    /// The registry's anycast addresses by member: an anycast group reaches a member only
    /// when listed here for it (a membership in a datagram is its liveness, not its right).
    anycast_listed: BTreeMap<String, BTreeSet<Ipv4Addr>>,
    /// Metric last announced per destination (triggered updates only for larger moves).
    announced: BTreeMap<String, u32>,
    /// Destinations for the next triggered update.
    pending: BTreeSet<String>,
    /// Lost destinations still announced with metric infinity: vip and rounds left.
    withdrawn: BTreeMap<String, (Ipv4Addr, u8)>,
    /// Neighbours owed a full table (they just came up).
    full_to: BTreeSet<String>,
    next_periodic: Instant,
    next_membership_refresh: Instant,
    seq: u64,
    groups: GroupTable,
    seen: SeenCache,
    flood_seq: u64,
    stats: RouterStats,
}

impl Router {
    /// A router for the local peer. `seq_start` should grow across restarts (Unix time in
    /// microseconds) so neighbours that remember our old sequence and flood numbers take the
    /// new ones as new (a restart that goes backwards by more than [`REORDER_WINDOW`] is
    /// believed too, but its first floods may meet old (origin, id) keys for a while);
    /// `random_seed` seeds the jitter and probe nonces (any random u64).
    pub fn new(
        local_id: impl Into<String>,
        local_vip: Ipv4Addr,
        config: RoutingConfig,
        seq_start: u64,
        random_seed: u64,
        now: Instant,
    ) -> Result<Router, RoutingError> {
        let local_id = local_id.into();
        if local_id.is_empty() || local_id.len() > MAX_ID_LEN {
            return Err(RoutingError::BadPeerId);
        }
        let mut config = config;
        config.max_hops = config.max_hops.min(MAX_PATH as u8);
        // A zero interval would announce on every poll; a timeout shorter than a few rounds
        // would expire every learned route between two announcements.
        config.announce_interval = config.announce_interval.max(MIN_ANNOUNCE_INTERVAL);
        config.announce_jitter = config.announce_jitter.min(config.announce_interval / 2);
        config.route_timeout = config.route_timeout.max(config.announce_interval * 3);
        Ok(Router {
            local_id,
            local_vip,
            rng: Rng(random_seed | 1),
            epoch: now,
            last_now: now,
            neighbours: BTreeMap::new(),
            routes: BTreeMap::new(),
            by_vip: BTreeMap::new(),
            members: BTreeMap::new(),
            anycast_listed: BTreeMap::new(),
            announced: BTreeMap::new(),
            pending: BTreeSet::new(),
            withdrawn: BTreeMap::new(),
            full_to: BTreeSet::new(),
            // The first periodic round waits one interval: new neighbours get a full table
            // at once anyway.
            next_periodic: now + config.announce_interval,
            next_membership_refresh: now,
            seq: seq_start,
            groups: GroupTable::new(seq_start),
            seen: SeenCache::default(),
            flood_seq: seq_start,
            stats: RouterStats::default(),
            config,
        })
    }

    pub fn local_id(&self) -> &str {
        &self.local_id
    }

    pub fn local_vip(&self) -> Ipv4Addr {
        self.local_vip
    }

    pub fn config(&self) -> &RoutingConfig {
        &self.config
    }

    /// A session with `id` is up (or its latency was re-measured): a direct route, and the
    /// neighbour is sent our full table and group memberships at the next poll.
    pub fn neighbour_up(
        &mut self,
        id: &str,
        vip: Ipv4Addr,
        latency: Duration,
        now: Instant,
    ) -> Result<(), RoutingError> {
        if id.is_empty() || id.len() > MAX_ID_LEN || id == self.local_id {
            return Err(RoutingError::BadPeerId);
        }
        self.last_now = now;
        let latency_ms = duration_ms(latency);
        match self.neighbours.get_mut(id) {
            Some(n) => {
                n.vip = vip;
                n.latency_ms = latency_ms;
                n.updated = now;
            }
            None => {
                self.neighbours.insert(
                    id.to_owned(),
                    Neighbour {
                        vip,
                        latency_ms,
                        updated: now,
                        last_seq: None,
                        adverts: BTreeMap::new(),
                        probe: None,
                    },
                );
                self.full_to.insert(id.to_owned());
            }
        }
        self.reselect_all(now);
        Ok(())
    }

    /// The session with `id` is gone: its direct route and everything learned from it go, and
    /// the losses are withdrawn from the other neighbours at the next poll (triggered update).
    pub fn neighbour_down(&mut self, id: &str, now: Instant) {
        self.last_now = now;
        if self.neighbours.remove(id).is_some() {
            self.full_to.remove(id);
            self.reselect_all(now);
        }
    }

    /// The neighbours we have sessions with, by id.
    pub fn neighbours(&self) -> impl Iterator<Item = (&str, Ipv4Addr, u32)> {
        self.neighbours
            .iter()
            .map(|(id, n)| (id.as_str(), n.vip, n.latency_ms))
    }

    /// Counters since start.
    pub fn stats(&self) -> &RouterStats {
        &self.stats
    }

    /// Sets the registry's table of members (id, virtual IP), the only source of which id owns
    /// which address; routes learnt for an id that no longer matches are dropped.
    pub fn set_members(
        &mut self,
        members: impl IntoIterator<Item = (String, Ipv4Addr)>,
        now: Instant,
    ) {
        self.last_now = now;
        self.members = members.into_iter().collect();
        let mut touched = BTreeSet::new();
        for n in self.neighbours.values_mut() {
            for (dest, advert) in n.adverts.iter_mut() {
                let listed = self.members.get(dest);
                if advert
                    .route
                    .as_ref()
                    .is_some_and(|r| listed != Some(&r.vip))
                {
                    advert.route = None;
                    touched.insert(dest.clone());
                }
            }
        }
        for dest in touched {
            self.reselect(&dest, now);
        }
    }

    /// Sets the registry's anycast addresses of each member (its `metadata.anycast`).
    pub fn set_anycast_listing(
        &mut self,
        listed: impl IntoIterator<Item = (String, Vec<Ipv4Addr>)>,
    ) {
        self.anycast_listed = listed
            .into_iter()
            .filter(|(_, l)| !l.is_empty())
            .map(|(id, l)| (id, l.into_iter().collect()))
            .collect();
    }

    /// Whether the registry lists anycast address `group` for member `id`.
    pub fn anycast_listed(&self, id: &str, group: Ipv4Addr) -> bool {
        self.anycast_listed
            .get(id)
            .is_some_and(|l| l.contains(&group))
    }

    /// Takes in one announcement from neighbour `from`.
    pub fn handle_announcement(
        &mut self,
        from: &str,
        msg: &Announcement,
        now: Instant,
    ) -> Result<(), RoutingError> {
        self.last_now = now;
        let result = self.take_announcement(from, msg, now);
        match result {
            Ok(()) => self.stats.announcements_received += 1,
            Err(_) => self.stats.announcements_refused += 1,
        }
        result
    }

    fn take_announcement(
        &mut self,
        from: &str,
        msg: &Announcement,
        now: Instant,
    ) -> Result<(), RoutingError> {
        if msg.sender != from {
            return Err(RoutingError::SenderMismatch {
                from: from.to_owned(),
                claimed: msg.sender.clone(),
            });
        }
        let local = self.local_id.clone();
        let n = self
            .neighbours
            .get_mut(from)
            .ok_or_else(|| RoutingError::NotNeighbour(from.to_owned()))?;
        if let Some(last) = n.last_seq {
            if is_stale(msg.seq, last) {
                return Err(RoutingError::Stale {
                    from: from.to_owned(),
                    seq: msg.seq,
                    last,
                });
            }
        }
        n.last_seq = Some(msg.seq);
        let mut touched = BTreeSet::new();
        let mut refused = 0;
        for e in &msg.entries {
            if e.dest == from {
                continue; // we know the sender directly
            }
            let sender_next_hop = e.path.first().unwrap_or(&e.dest);
            let via_us = *sender_next_hop == local;
            let claimed = self.members.get(&e.dest) == Some(&e.vip);
            let route = (claimed && usable(e, from, &local)).then(|| Learned {
                vip: e.vip,
                latency_ms: e.latency_ms,
                path: e.path.clone(),
            });
            if e.metric != METRIC_INFINITY && e.dest != local {
                if !claimed {
                    self.stats.claims_refused += 1;
                } else if route.is_none() {
                    refused += 1;
                }
            }
            if n.adverts.len() >= MAX_DESTINATIONS && !n.adverts.contains_key(&e.dest) {
                refused += 1;
                continue;
            }
            n.adverts.insert(
                e.dest.clone(),
                Advert {
                    route,
                    via_us,
                    received: now,
                },
            );
            touched.insert(e.dest.clone());
        }
        self.stats.entries_refused += refused;
        for dest in touched {
            if dest != local {
                self.reselect(&dest, now);
            }
        }
        Ok(())
    }

    /// The next hop for a peer's virtual IP (None: unknown, unreachable, or our own).
    pub fn next_hop(&self, dst_vip: Ipv4Addr) -> Option<NextHop> {
        let dest = self.by_vip.get(&dst_vip)?;
        self.next_hop_to(dest)
    }

    /// Whether a packet from the member at `vip` may have come through neighbour `via`: `via`
    /// is that member, or it offers a usable route to it (any of its routes, not only the one
    /// we chose, so asymmetric paths still pass). Addresses the registry does not list never
    /// do.
    pub fn may_come_through(&self, via: &str, vip: Ipv4Addr) -> bool {
        let Some((member, _)) = self.members.iter().find(|(_, v)| **v == vip) else {
            return false;
        };
        member == via
            || self.neighbours.get(via).is_some_and(|n| {
                n.adverts
                    .get(member)
                    .is_some_and(|a| a.route.as_ref().is_some_and(|r| r.vip == vip))
            })
    }

    /// The next hop towards a peer by id.
    pub fn next_hop_to(&self, dest: &str) -> Option<NextHop> {
        let r = self.routes.get(dest)?;
        let n = self.neighbours.get(&r.next_hop)?;
        Some(NextHop {
            peer_id: r.next_hop.clone(),
            vip: n.vip,
            dest_peer_id: dest.to_owned(),
            metric: r.metric,
            hop_count: r.hop_count(),
        })
    }

    /// The forwarding table: every reachable virtual IP and its next hop (for a data-plane
    /// snapshot).
    pub fn forwarding_table(&self) -> BTreeMap<Ipv4Addr, NextHop> {
        self.by_vip
            .iter()
            .filter_map(|(vip, dest)| Some((*vip, self.next_hop_to(dest)?)))
            .collect()
    }

    /// Every route: the one in use per destination (`active`) and the alternatives, by
    /// destination then metric.
    pub fn routes(&self) -> Vec<RouteView> {
        let now = self.last_now;
        let mut dests: BTreeSet<&str> = self.routes.keys().map(String::as_str).collect();
        dests.extend(self.neighbours.keys().map(String::as_str));
        for n in self.neighbours.values() {
            dests.extend(n.adverts.keys().map(String::as_str));
        }
        dests.remove(self.local_id.as_str());
        let mut out = Vec::new();
        for dest in dests {
            let active = self.routes.get(dest);
            let mut cands = self.candidates(dest, now);
            cands.sort_by(|a, b| rank(a).cmp(&rank(b)));
            for c in cands {
                let is_active = active.is_some_and(|r| r.next_hop == c.next_hop);
                let (metric, latency_ms, last_updated) = match (is_active, active) {
                    (true, Some(r)) => (r.metric, r.latency_ms, r.last_updated),
                    _ => (c.metric, c.latency_ms, c.last_updated),
                };
                let direct = c.path.is_empty();
                out.push(RouteView {
                    dest_peer_id: dest.to_owned(),
                    dest_ip: c.vip,
                    next_hop: if direct {
                        String::new()
                    } else {
                        c.next_hop.clone()
                    },
                    kind: if direct {
                        RouteKind::Direct
                    } else {
                        RouteKind::Relayed
                    },
                    metric,
                    latency_ms,
                    hop_count: c.hop_count(),
                    last_updated,
                    active: is_active,
                    path: c.path,
                });
            }
        }
        out
    }

    /// Datagrams due now: triggered updates, full tables for new neighbours, the periodic
    /// round (full tables, latency probes, membership refresh) and membership changes. Also
    /// expires routes and memberships. Call it whenever [`Router::poll_timeout`] passes and
    /// after feeding events.
    pub fn poll_announcements(&mut self, now: Instant) -> Vec<(String, Vec<u8>)> {
        self.last_now = now;
        self.expire(now);
        let mut out = Vec::new();
        let neighbours: Vec<String> = self.neighbours.keys().cloned().collect();
        let new_neighbours = std::mem::take(&mut self.full_to);
        if now >= self.next_periodic {
            let jitter = self.jitter();
            self.next_periodic = now + self.config.announce_interval.saturating_sub(jitter);
            let all = self.all_destinations();
            for to in &neighbours {
                self.push_announcements(&mut out, to, &all);
                self.push_probe(&mut out, to, now);
            }
            self.pending.clear();
            for (_, rounds) in self.withdrawn.values_mut() {
                *rounds = rounds.saturating_sub(1);
            }
            self.withdrawn.retain(|_, (_, rounds)| *rounds > 0);
        } else {
            let all = self.all_destinations();
            let pending: Vec<String> = self.pending.iter().cloned().collect();
            for to in &neighbours {
                if new_neighbours.contains(to) {
                    self.push_announcements(&mut out, to, &all);
                    self.push_probe(&mut out, to, now);
                } else if !pending.is_empty() {
                    self.push_announcements(&mut out, to, &pending);
                }
            }
            self.pending.clear();
        }
        // Memberships: a change goes out at once, the current set is refreshed well within
        // route_timeout, and a new neighbour gets every membership we hold.
        let refresh_due =
            now >= self.next_membership_refresh && self.groups.local_groups().next().is_some();
        if self.groups.is_dirty() || refresh_due {
            self.next_membership_refresh = now + self.membership_refresh_interval();
            let m = self
                .groups
                .next_local_announcement(&self.local_id, self.local_vip);
            push_message(&mut out, &neighbours, &Message::Membership(m));
        }
        let new: Vec<String> = new_neighbours.into_iter().collect();
        if !new.is_empty() {
            let mut held = self.groups.remote_announcements();
            held.extend(
                self.groups
                    .current_local_announcement(&self.local_id, self.local_vip),
            );
            for m in held {
                push_message(&mut out, &new, &Message::Membership(m));
            }
        }
        out
    }

    /// When [`Router::poll_announcements`] should next be called.
    pub fn poll_timeout(&self) -> Instant {
        if !self.pending.is_empty() || !self.full_to.is_empty() || self.groups.is_dirty() {
            return self.last_now;
        }
        let timeout = self.config.route_timeout;
        let mut at = self.next_periodic;
        for n in self.neighbours.values() {
            for a in n.adverts.values() {
                at = at.min(a.received + timeout);
            }
        }
        if let Some(e) = self.groups.next_expiry(timeout) {
            at = at.min(e);
        }
        if self.groups.local_groups().next().is_some() {
            at = at.min(self.next_membership_refresh);
        }
        at
    }

    /// Handles any datagram received on the control port from neighbour `from`.
    pub fn handle_control(
        &mut self,
        from: &str,
        datagram: &[u8],
        now: Instant,
    ) -> Result<ControlOutcome, RoutingError> {
        let mut out = ControlOutcome::default();
        let msg = Message::decode(datagram).inspect_err(|_| self.stats.malformed += 1)?;
        match msg {
            Message::Announcement(a) => self.handle_announcement(from, &a, now)?,
            Message::Probe(p) => {
                // Echoed to anyone whose datagram reached us through a session.
                out.send
                    .push((from.to_owned(), Message::ProbeReply(p).encode()?));
            }
            Message::ProbeReply(p) => out.rtt = self.handle_probe_reply(from, p, now),
            Message::Membership(m) => out.send = self.handle_membership(from, &m, now)?,
            Message::Flood(f) => {
                let (deliver, send) = self.handle_flood(from, f, now)?;
                out.deliver = deliver;
                out.send = send;
            }
        }
        Ok(out)
    }

    /// A probe reply: when it answers our outstanding probe, the neighbour's latency becomes
    /// an average of old and new (¾ old, ¼ new: one slow probe does not move routes).
    pub fn handle_probe_reply(&mut self, from: &str, p: Probe, now: Instant) -> Option<Duration> {
        self.last_now = now;
        let n = self.neighbours.get_mut(from)?;
        let (nonce, sent) = n.probe?;
        if nonce != p.nonce {
            return None;
        }
        n.probe = None;
        self.stats.probe_replies += 1;
        let rtt = now.saturating_duration_since(sent);
        let sample = duration_ms(rtt);
        // Step a quarter of the way, rounded away from the old value so it reaches the sample.
        n.latency_ms = if sample >= n.latency_ms {
            n.latency_ms + (sample - n.latency_ms).div_ceil(4)
        } else {
            n.latency_ms - (n.latency_ms - sample).div_ceil(4)
        };
        n.updated = now;
        self.reselect_all(now);
        Some(rtt)
    }

    // ---- internals ----------------------------------------------------------------------

    fn membership_refresh_interval(&self) -> Duration {
        (self.config.route_timeout / 3).max(self.config.announce_interval)
    }

    fn jitter(&mut self) -> Duration {
        let max = self.config.announce_jitter.as_millis();
        if max == 0 {
            return Duration::ZERO;
        }
        let ms = u128::from(self.rng.next()) % max;
        Duration::from_millis(u64::try_from(ms).unwrap_or(0))
    }

    fn all_destinations(&self) -> Vec<String> {
        let mut all: BTreeSet<String> = self.routes.keys().cloned().collect();
        all.extend(self.withdrawn.keys().cloned());
        all.into_iter().collect()
    }

    fn push_probe(&mut self, out: &mut Vec<(String, Vec<u8>)>, to: &str, now: Instant) {
        let nonce = self.rng.next();
        let timestamp_us =
            u64::try_from(now.saturating_duration_since(self.epoch).as_micros()).unwrap_or(0);
        if let Some(n) = self.neighbours.get_mut(to) {
            n.probe = Some((nonce, now));
            self.stats.probes_sent += 1;
            push_message(
                out,
                &[to.to_owned()],
                &Message::Probe(Probe {
                    nonce,
                    timestamp_us,
                }),
            );
        }
    }

    /// The entry for `dest` as announced to neighbour `to`.
    fn entry_for(&self, dest: &str, to: &str) -> Option<RouteEntry> {
        if let Some(r) = self.routes.get(dest) {
            let poisoned = self.config.split_horizon && r.next_hop == to;
            return Some(RouteEntry {
                dest: dest.to_owned(),
                vip: r.vip,
                metric: if poisoned { METRIC_INFINITY } else { r.metric },
                latency_ms: r.latency_ms,
                hop_count: r.hop_count(),
                path: r.path.clone(),
            });
        }
        let (vip, _) = self.withdrawn.get(dest)?;
        Some(RouteEntry {
            dest: dest.to_owned(),
            vip: *vip,
            metric: METRIC_INFINITY,
            latency_ms: 0,
            hop_count: 0,
            path: Vec::new(),
        })
    }

    /// Announcements to `to` for `dests`, split so each datagram fits [`MAX_DATAGRAM`].
    fn push_announcements(&mut self, out: &mut Vec<(String, Vec<u8>)>, to: &str, dests: &[String]) {
        let header = announcement_header_len(&self.local_id);
        let mut batch: Vec<RouteEntry> = Vec::new();
        let mut size = header;
        for dest in dests {
            let Some(e) = self.entry_for(dest, to) else {
                continue;
            };
            let len = entry_len(&e);
            if !batch.is_empty() && (size + len > MAX_DATAGRAM || batch.len() == 255) {
                self.push_batch(out, to, std::mem::take(&mut batch));
                size = header;
            }
            size += len;
            batch.push(e);
        }
        if !batch.is_empty() {
            self.push_batch(out, to, batch);
        }
        for dest in dests {
            if let Some(r) = self.routes.get(dest) {
                self.announced.insert(dest.clone(), r.metric);
            }
        }
    }

    fn push_batch(&mut self, out: &mut Vec<(String, Vec<u8>)>, to: &str, entries: Vec<RouteEntry>) {
        self.seq = self.seq.wrapping_add(1);
        self.stats.announcements_sent += 1;
        let msg = Message::Announcement(Announcement {
            sender: self.local_id.clone(),
            seq: self.seq,
            entries,
        });
        push_message(out, &[to.to_owned()], &msg);
    }

    /// Drops learned routes not refreshed within route_timeout, and stale memberships.
    fn expire(&mut self, now: Instant) {
        let timeout = self.config.route_timeout;
        let mut touched = BTreeSet::new();
        let mut expired = 0;
        for n in self.neighbours.values_mut() {
            n.adverts.retain(|dest, a| {
                let alive = now.saturating_duration_since(a.received) < timeout;
                if !alive {
                    touched.insert(dest.clone());
                    if a.route.is_some() {
                        expired += 1;
                    }
                }
                alive
            });
        }
        self.stats.routes_expired += expired;
        for dest in touched {
            self.reselect(&dest, now);
        }
        self.groups.expire(now, timeout);
    }

    fn reselect_all(&mut self, now: Instant) {
        let mut dests: BTreeSet<String> = self.routes.keys().cloned().collect();
        for (id, n) in &self.neighbours {
            dests.insert(id.clone());
            dests.extend(n.adverts.keys().cloned());
        }
        dests.remove(&self.local_id);
        for dest in dests {
            self.reselect(&dest, now);
        }
    }

    /// Every usable way to reach `dest` right now.
    fn candidates(&self, dest: &str, now: Instant) -> Vec<Route> {
        let mut out = Vec::new();
        if let Some(n) = self.neighbours.get(dest) {
            out.push(Route {
                next_hop: dest.to_owned(),
                vip: n.vip,
                latency_ms: n.latency_ms,
                path: Vec::new(),
                metric: metric(n.latency_ms, 0),
                last_updated: n.updated,
            });
        }
        for (id, n) in &self.neighbours {
            if id == dest {
                continue;
            }
            let Some(a) = n.adverts.get(dest) else {
                continue;
            };
            let Some(l) = &a.route else { continue };
            if now.saturating_duration_since(a.received) >= self.config.route_timeout {
                continue;
            }
            // A neighbour's own word beats hearsay: a path through a neighbour that told us
            // it cannot reach `dest` (withdrawn, or only through us) is stale, and taking it
            // while the updates travel would make a short-lived loop.
            let stale = l.path.iter().any(|hop| {
                self.neighbours
                    .get(hop)
                    .and_then(|m| m.adverts.get(dest))
                    .is_some_and(|b| b.route.is_none())
            });
            if stale {
                continue;
            }
            let mut path = Vec::with_capacity(l.path.len() + 1);
            path.push(id.clone());
            path.extend(l.path.iter().cloned());
            let Ok(hops) = u8::try_from(path.len()) else {
                continue;
            };
            if hops > self.config.max_hops {
                continue;
            }
            let latency_ms = n.latency_ms.saturating_add(l.latency_ms);
            out.push(Route {
                next_hop: id.clone(),
                vip: l.vip,
                latency_ms,
                path,
                metric: metric(latency_ms, hops),
                last_updated: a.received.max(n.updated),
            });
        }
        out
    }

    fn hysteresis(&self, best_metric: u32) -> u32 {
        self.config.hysteresis_ms.max(best_metric / 10)
    }

    /// Drops `vip` from the index only while it still names `dest` (two destinations can
    /// claim one address for a moment when a lease moves).
    fn unindex_vip(&mut self, vip: Ipv4Addr, dest: &str) {
        if self.by_vip.get(&vip).is_some_and(|d| d == dest) {
            self.by_vip.remove(&vip);
            let other = self
                .routes
                .iter()
                .find(|(d, r)| r.vip == vip && *d != dest)
                .map(|(d, _)| d.clone());
            if let Some(other) = other {
                self.by_vip.insert(vip, other);
            }
        }
    }

    fn reselect(&mut self, dest: &str, now: Instant) {
        let cands = self.candidates(dest, now);
        let best = cands.iter().min_by(|a, b| rank(a).cmp(&rank(b)));
        let current = self.routes.get(dest);
        let chosen = match (best, current) {
            (None, _) => None,
            (Some(b), None) => Some(b.clone()),
            (Some(b), Some(cur)) => {
                let limit = b.metric.saturating_add(self.hysteresis(b.metric));
                match cands.iter().find(|c| c.next_hop == cur.next_hop) {
                    Some(c) if c.metric <= limit => Some(c.clone()),
                    _ => Some(b.clone()),
                }
            }
        };
        let old = self.routes.get(dest).cloned();
        match (old, chosen) {
            (None, None) => {}
            (Some(old), None) => {
                self.stats.routes_lost += 1;
                self.routes.remove(dest);
                self.unindex_vip(old.vip, dest);
                self.announced.remove(dest);
                self.withdrawn
                    .insert(dest.to_owned(), (old.vip, WITHDRAWAL_ROUNDS));
                self.pending.insert(dest.to_owned());
            }
            (None, Some(new)) => {
                self.withdrawn.remove(dest);
                self.by_vip.insert(new.vip, dest.to_owned());
                self.routes.insert(dest.to_owned(), new);
                self.pending.insert(dest.to_owned());
            }
            (Some(old), Some(new)) => {
                let moved = self
                    .announced
                    .get(dest)
                    .is_none_or(|m| m.abs_diff(new.metric) > self.hysteresis(new.metric.min(*m)));
                if old.next_hop != new.next_hop || old.path != new.path || moved {
                    self.pending.insert(dest.to_owned());
                }
                if old.vip != new.vip {
                    self.unindex_vip(old.vip, dest);
                    self.by_vip.insert(new.vip, dest.to_owned());
                }
                self.routes.insert(dest.to_owned(), new);
            }
        }
    }
}

/// How far behind the last sequence number a datagram may be and still count as reordered
/// (refused); further behind, the sender restarted with a lower start and is believed.
/// Sessions are authenticated and replay-protected, so this only guards against reordering.
pub const REORDER_WINDOW: u64 = 4096;

/// A sequence number at or just behind the last one seen: a reordered or repeated datagram.
pub fn is_stale(seq: u64, last: u64) -> bool {
    seq <= last && last - seq <= REORDER_WINDOW
}

/// Selection order: metric, then hop count, then next-hop id (deterministic ties).
fn rank(r: &Route) -> (u32, usize, &str) {
    (r.metric, r.path.len(), r.next_hop.as_str())
}

/// Whether an entry from `from` can be used as a route at all (max_hops is applied when the
/// candidates are built).
fn usable(e: &RouteEntry, from: &str, local: &str) -> bool {
    if e.metric == METRIC_INFINITY || e.dest == local {
        return false;
    }
    // Path vector: our id anywhere on the path means the route runs through us.
    if e.path
        .iter()
        .any(|p| p == local || p == from || *p == e.dest)
    {
        return false;
    }
    let mut ids: BTreeSet<&str> = BTreeSet::new();
    e.path.iter().all(|p| ids.insert(p.as_str()))
}

fn duration_ms(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(METRIC_INFINITY - 1)
}

fn push_message(out: &mut Vec<(String, Vec<u8>)>, to: &[String], msg: &Message) {
    // Every message the router builds is within the wire limits: ids are checked on the way
    // in, paths are bounded by max_hops ≤ MAX_PATH and groups by MAX_GROUPS.
    if let Ok(bytes) = msg.encode() {
        for t in to {
            out.push((t.clone(), bytes.clone()));
        }
    }
}
