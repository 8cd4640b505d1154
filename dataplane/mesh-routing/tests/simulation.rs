//! Routers wired into topologies in memory: every control datagram a router emits is delivered
//! to the neighbour after half the link's round-trip time (so probes measure the link), in
//! time order, and the simulated clock jumps from event to event. Scenarios check convergence,
//! next hops and metrics, withdrawal, timeouts, split horizon, loop freedom and the traffic
//! modes; a proptest does the same over random topologies.
#![allow(clippy::unwrap_used)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use switchyard_mesh_routing::l2::arp::{parse_arp, ArpOp, ArpPacket, ArpTable};
use switchyard_mesh_routing::l2::etherip::{decapsulate, encapsulate, DEFAULT_TTL};
use switchyard_mesh_routing::l2::learning::{
    FrameDelivery, MacTable, DEFAULT_AGEING, DEFAULT_CAPACITY,
};
use switchyard_mesh_routing::l2::mac::{generate_mac, MacAddr};
use switchyard_mesh_routing::wire::{Message, METRIC_INFINITY};
use switchyard_mesh_routing::{
    decrement_ttl, AnycastTarget, FloodMode, Forward, RouteKind, Router, RoutingConfig,
    HOP_PENALTY_MS,
};

fn vip_of(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 99, 0, index as u8 + 1)
}

/// A datagram in flight: arrival time, send order (FIFO per instant), from, to, bytes.
type InFlight = Reverse<(Instant, u64, String, String, Vec<u8>)>;

struct Sim {
    now: Instant,
    routers: BTreeMap<String, Router>,
    vips: BTreeMap<String, Ipv4Addr>,
    /// Undirected links and their round-trip time.
    links: BTreeMap<(String, String), Duration>,
    /// Directed (from, to) pairs whose datagrams are dropped (a peer gone silent).
    muted: BTreeSet<(String, String)>,
    queue: BinaryHeap<InFlight>,
    order: u64,
    /// Flooded payloads each router delivered to its device.
    delivered: BTreeMap<String, Vec<Vec<u8>>>,
    /// Datagrams sent, by message kind (first byte).
    sent_by_kind: BTreeMap<u8, usize>,
    /// Every announcement sent: (from, to, message).
    log: Vec<(String, String, Message)>,
}

fn key(a: &str, b: &str) -> (String, String) {
    if a < b {
        (a.to_owned(), b.to_owned())
    } else {
        (b.to_owned(), a.to_owned())
    }
}

impl Sim {
    fn new(names: &[&str], config: RoutingConfig) -> Sim {
        let now = Instant::now();
        let mut routers = BTreeMap::new();
        let mut vips = BTreeMap::new();
        for (i, name) in names.iter().enumerate() {
            let r = Router::new(*name, vip_of(i), config.clone(), 1000, i as u64 + 7, now)
                .expect("router");
            routers.insert(name.to_string(), r);
            vips.insert(name.to_string(), vip_of(i));
        }
        // every router has the registry's table of members (late joiners included: the
        // registry lists a peer before its sessions come up)
        for r in routers.values_mut() {
            r.set_members(vips.clone(), now);
        }
        Sim {
            now,
            routers,
            vips,
            links: BTreeMap::new(),
            muted: BTreeSet::new(),
            queue: BinaryHeap::new(),
            order: 0,
            delivered: BTreeMap::new(),
            sent_by_kind: BTreeMap::new(),
            log: Vec::new(),
        }
    }

    fn link(&mut self, a: &str, b: &str, rtt_ms: u64) {
        let rtt = Duration::from_millis(rtt_ms);
        self.links.insert(key(a, b), rtt);
        let (va, vb) = (self.vips[a], self.vips[b]);
        let now = self.now;
        self.routers
            .get_mut(a)
            .unwrap()
            .neighbour_up(b, vb, rtt, now)
            .unwrap();
        self.routers
            .get_mut(b)
            .unwrap()
            .neighbour_up(a, va, rtt, now)
            .unwrap();
    }

    fn unlink(&mut self, a: &str, b: &str) {
        self.links.remove(&key(a, b));
        let now = self.now;
        self.routers.get_mut(a).unwrap().neighbour_down(b, now);
        self.routers.get_mut(b).unwrap().neighbour_down(a, now);
    }

    fn send(&mut self, from: &str, out: Vec<(String, Vec<u8>)>) {
        for (to, bytes) in out {
            let Some(rtt) = self.links.get(&key(from, &to)).copied() else {
                panic!("{from} sent to {to}, which is not a neighbour");
            };
            let kind = bytes[0];
            *self.sent_by_kind.entry(kind).or_default() += 1;
            if let Ok(m @ Message::Announcement(_)) = Message::decode(&bytes) {
                self.log.push((from.to_owned(), to.clone(), m));
            }
            if self.muted.contains(&(from.to_owned(), to.clone())) {
                continue;
            }
            self.order += 1;
            self.queue.push(Reverse((
                self.now + rtt / 2,
                self.order,
                from.to_owned(),
                to,
                bytes,
            )));
        }
    }

    /// Runs every event up to `now + d`; panics when it takes an absurd number of steps (a
    /// routing loop that never settles, i.e. count to infinity).
    fn run(&mut self, d: Duration) {
        let end = self.now + d;
        for _ in 0..200_000 {
            let next_msg = self.queue.peek().map(|Reverse((t, ..))| *t);
            let next_timer = self.routers.values().map(|r| r.poll_timeout()).min();
            let next = match (next_msg, next_timer) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => a.or(b).unwrap_or(end),
            };
            if next > end {
                self.now = end;
                return;
            }
            self.now = self.now.max(next);
            if next_msg == Some(next) {
                let Reverse((_, _, from, to, bytes)) = self.queue.pop().unwrap();
                if !self.links.contains_key(&key(&from, &to)) {
                    continue; // the link went down while it was in flight
                }
                let now = self.now;
                let outcome = self
                    .routers
                    .get_mut(&to)
                    .unwrap()
                    .handle_control(&from, &bytes, now)
                    .unwrap_or_else(|e| panic!("{to} refused a datagram from {from}: {e}"));
                if let Some(p) = outcome.deliver {
                    self.delivered.entry(to.clone()).or_default().push(p);
                }
                self.send(&to, outcome.send);
            } else {
                let now = self.now;
                let due: Vec<String> = self
                    .routers
                    .iter()
                    .filter(|(_, r)| r.poll_timeout() <= now)
                    .map(|(n, _)| n.clone())
                    .collect();
                for name in due {
                    let out = self.routers.get_mut(&name).unwrap().poll_announcements(now);
                    self.send(&name, out);
                }
            }
        }
        panic!("no quiescence: routing did not settle");
    }

    /// Runs until no datagram is in flight and no router has anything but periodic work.
    fn settle(&mut self) {
        self.run(Duration::from_millis(500));
    }

    fn r(&self, name: &str) -> &Router {
        &self.routers[name]
    }

    fn next_hop(&self, from: &str, to: &str) -> Option<String> {
        self.r(from).next_hop(self.vips[to]).map(|h| h.peer_id)
    }

    fn metric(&self, from: &str, to: &str) -> Option<u32> {
        self.r(from).next_hop(self.vips[to]).map(|h| h.metric)
    }

    /// Follows next hops from `from` to `to`: the peers visited, or an error on a loop or a
    /// hop that leads nowhere.
    fn walk(&self, from: &str, to: &str) -> Result<Vec<String>, String> {
        let mut at = from.to_owned();
        let mut seen = vec![at.clone()];
        while at != to {
            let Some(hop) = self.next_hop(&at, to) else {
                return if at == from {
                    Ok(Vec::new())
                } else {
                    Err(format!(
                        "{at} has no route to {to} though {seen:?} led there"
                    ))
                };
            };
            if !self.links.contains_key(&key(&at, &hop)) {
                return Err(format!("{at} routes {to} via {hop}, not a neighbour"));
            }
            if seen.contains(&hop) {
                return Err(format!("loop towards {to}: {seen:?} then {hop}"));
            }
            seen.push(hop.clone());
            at = hop;
        }
        Ok(seen)
    }

    fn broadcast(&mut self, from: &str, payload: &[u8]) {
        let now = self.now;
        let out = self
            .routers
            .get_mut(from)
            .unwrap()
            .originate_flood(FloodMode::Broadcast, payload.to_vec(), now)
            .unwrap();
        self.send(from, out);
        self.settle();
    }

    fn deliveries_of(&self, payload: &[u8]) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for (n, ps) in &self.delivered {
            let c = ps.iter().filter(|p| p.as_slice() == payload).count();
            if c > 0 {
                out.insert(n.clone(), c);
            }
        }
        out
    }

    fn connected(&self, from: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::from([from.to_owned()]);
        let mut todo = VecDeque::from([from.to_owned()]);
        while let Some(at) = todo.pop_front() {
            for (a, b) in self.links.keys() {
                let other = if *a == at {
                    b
                } else if *b == at {
                    a
                } else {
                    continue;
                };
                if seen.insert(other.clone()) {
                    todo.push_back(other.clone());
                }
            }
        }
        seen
    }
}

fn config(split_horizon: bool) -> RoutingConfig {
    RoutingConfig::new(8, Duration::from_secs(300), split_horizon)
}

fn line(split_horizon: bool) -> Sim {
    let mut s = Sim::new(&["a", "b", "c", "d"], config(split_horizon));
    s.link("a", "b", 10);
    s.link("b", "c", 10);
    s.link("c", "d", 10);
    s.settle();
    s
}

#[test]
fn a_line_converges_with_the_spec_metric() {
    for sh in [true, false] {
        let s = line(sh);
        assert_eq!(s.walk("a", "d").unwrap(), ["a", "b", "c", "d"]);
        assert_eq!(s.walk("d", "a").unwrap(), ["d", "c", "b", "a"]);
        assert_eq!(s.metric("a", "b"), Some(10));
        assert_eq!(s.metric("a", "c"), Some(20 + HOP_PENALTY_MS));
        assert_eq!(s.metric("a", "d"), Some(30 + 2 * HOP_PENALTY_MS));

        let views = s.r("a").routes();
        let to_d: Vec<_> = views.iter().filter(|v| v.dest_peer_id == "d").collect();
        assert_eq!(to_d.len(), 1);
        let v = to_d[0];
        assert_eq!(
            (
                v.dest_ip,
                v.next_hop.as_str(),
                v.kind,
                v.metric,
                v.latency_ms,
                v.hop_count,
                v.active
            ),
            (vip_of(3), "b", RouteKind::Relayed, 230, 30, 2, true)
        );
        assert_eq!(v.path, ["b", "c"]);
        let to_b = views.iter().find(|v| v.dest_peer_id == "b").unwrap();
        assert_eq!(
            (
                to_b.next_hop.as_str(),
                to_b.kind,
                to_b.metric,
                to_b.hop_count
            ),
            ("", RouteKind::Direct, 10, 0)
        );
        assert!(to_b.last_updated <= s.now);
    }
}

#[test]
fn cutting_a_link_withdraws_the_routes_behind_it_without_counting_to_infinity() {
    for sh in [true, false] {
        let mut s = line(sh);
        let before = s.sent_by_kind.get(&1).copied().unwrap_or(0);
        s.unlink("c", "d");
        // Triggered updates only: well before any periodic round or route_timeout.
        s.run(Duration::from_millis(100));
        for n in ["a", "b", "c"] {
            assert_eq!(s.next_hop(n, "d"), None, "{n} still routes to d (sh={sh})");
            assert!(s.r(n).routes().iter().all(|v| v.dest_peer_id != "d"));
        }
        assert_eq!(s.next_hop("d", "a"), None);
        let announcements = s.sent_by_kind.get(&1).copied().unwrap_or(0) - before;
        assert!(
            announcements <= 8,
            "{announcements} announcements to withdraw one destination (sh={sh})"
        );
        // The rest of the line still works.
        assert_eq!(s.walk("a", "c").unwrap(), ["a", "b", "c"]);
    }
}

#[test]
fn a_ring_prefers_the_lower_metric_and_reroutes_when_a_link_goes() {
    let mut s = Sim::new(&["a", "b", "c", "d"], config(true));
    s.link("a", "b", 10);
    s.link("b", "c", 10);
    s.link("c", "d", 10);
    s.link("d", "a", 50);
    s.settle();
    // Direct at 50 ms beats two relays at 30 ms (+200).
    assert_eq!(s.walk("a", "d").unwrap(), ["a", "d"]);
    assert_eq!(s.metric("a", "d"), Some(50));
    // One hop: via b (20+100) beats via d (60+100).
    assert_eq!(s.walk("a", "c").unwrap(), ["a", "b", "c"]);
    assert_eq!(s.metric("a", "c"), Some(120));
    // The alternative is listed, inactive.
    let to_c: Vec<_> = s
        .r("a")
        .routes()
        .into_iter()
        .filter(|v| v.dest_peer_id == "c")
        .collect();
    assert_eq!(to_c.len(), 2);
    assert!(to_c[0].active && to_c[0].next_hop == "b");
    assert!(!to_c[1].active && to_c[1].next_hop == "d" && to_c[1].metric == 160);

    s.unlink("a", "b");
    s.run(Duration::from_millis(200));
    assert_eq!(s.walk("a", "b").unwrap(), ["a", "d", "c", "b"]);
    assert_eq!(s.metric("a", "b"), Some(70 + 2 * HOP_PENALTY_MS));
    assert_eq!(s.walk("a", "c").unwrap(), ["a", "d", "c"]);
    assert_eq!(s.walk("b", "a").unwrap(), ["b", "c", "d", "a"]);
    // And back when it returns.
    s.link("a", "b", 10);
    s.settle();
    assert_eq!(s.walk("a", "c").unwrap(), ["a", "b", "c"]);
}

#[test]
fn a_star_relays_through_its_hub() {
    let mut s = Sim::new(&["hub", "x", "y", "z"], config(true));
    for leaf in ["x", "y", "z"] {
        s.link("hub", leaf, 20);
    }
    s.settle();
    for (from, to) in [("x", "y"), ("y", "z"), ("z", "x")] {
        assert_eq!(s.walk(from, to).unwrap(), [from, "hub", to]);
        assert_eq!(s.metric(from, to), Some(40 + HOP_PENALTY_MS));
        let hop = s.r(from).next_hop(s.vips[to]).unwrap();
        assert_eq!((hop.vip, hop.hop_count), (s.vips["hub"], 1));
    }
    s.unlink("hub", "z");
    s.run(Duration::from_millis(100));
    assert_eq!(s.next_hop("x", "z"), None);
    assert_eq!(s.walk("x", "y").unwrap(), ["x", "hub", "y"]);
}

/// With split horizon a route is announced back to its next hop with metric infinity (poisoned
/// reverse); without, with its real metric, and the path vector makes the receiver refuse it.
#[test]
fn split_horizon_poisons_routes_towards_their_next_hop() {
    for sh in [true, false] {
        let s = line(sh);
        // a's route to d runs through b: what did a last tell b about d?
        let last = s
            .log
            .iter()
            .rev()
            .filter(|(f, t, _)| f == "a" && t == "b")
            .find_map(|(_, _, m)| match m {
                Message::Announcement(a) => a.entries.iter().find(|e| e.dest == "d").cloned(),
                _ => None,
            })
            .expect("a announced d to b");
        assert_eq!(last.path, ["b", "c"]);
        if sh {
            assert_eq!(last.metric, METRIC_INFINITY, "poisoned reverse");
        } else {
            assert_eq!(last.metric, 230);
        }
        // Either way b never considers d through a.
        assert!(s
            .r("b")
            .routes()
            .iter()
            .all(|v| !(v.dest_peer_id == "d" && v.next_hop == "a")));
    }
}

/// The path vector is what stops the loop here: without split horizon, a keeps offering b its
/// stale route to c (path [b]) after the b–c link goes. A router that ignored the path would
/// take it, route c back to a and count to infinity (bounded only by max_hops).
#[test]
fn the_path_vector_refuses_routes_through_ourselves() {
    let mut s = Sim::new(&["a", "b", "c"], config(false));
    s.link("a", "b", 10);
    s.link("b", "c", 10);
    s.settle();
    // a re-announces its route to c to b in every periodic round, path [b].
    s.run(Duration::from_secs(25));
    let before = s.sent_by_kind.get(&1).copied().unwrap_or(0);
    s.unlink("b", "c");
    assert_eq!(s.next_hop("b", "c"), None, "b took a route to c via a");
    for _ in 0..200 {
        s.run(Duration::from_millis(1));
        assert_eq!(s.next_hop("b", "c"), None, "b took a route to c via a");
    }
    assert_eq!(s.next_hop("a", "c"), None, "a kept a route to c");
    assert!(
        s.r("b").stats().entries_refused > 0,
        "a's route to c (path [b]) was refused"
    );
    // One withdrawal each way, not a count up to max_hops.
    let announcements = s.sent_by_kind.get(&1).copied().unwrap_or(0) - before;
    assert!(announcements <= 2, "{announcements} announcements");
    // Periodic rounds do not bring it back either.
    s.run(Duration::from_secs(30));
    assert_eq!(s.next_hop("b", "c"), None);
}

#[test]
fn max_hops_bounds_the_route_length() {
    let names = ["n0", "n1", "n2", "n3", "n4", "n5"];
    let mut s = Sim::new(
        &names,
        RoutingConfig::new(2, Duration::from_secs(300), true),
    );
    for w in names.windows(2) {
        s.link(w[0], w[1], 5);
    }
    s.settle();
    // Two peers between n0 and n3: allowed. Three (n0 → n4): not.
    assert_eq!(s.walk("n0", "n3").unwrap(), ["n0", "n1", "n2", "n3"]);
    assert_eq!(s.next_hop("n0", "n4"), None);
    assert_eq!(s.next_hop("n5", "n1"), None);
    assert!(s.r("n0").routes().iter().all(|v| v.hop_count <= 2));
}

#[test]
fn routes_from_a_silent_neighbour_expire_after_route_timeout() {
    let timeout = Duration::from_secs(60);
    let mut s = Sim::new(&["a", "b", "c", "d"], RoutingConfig::new(8, timeout, true));
    s.link("a", "b", 10);
    s.link("b", "c", 10);
    s.link("c", "d", 10);
    s.settle();
    // c goes silent towards b, but the session stays up (nobody called neighbour_down).
    s.muted.insert(("c".into(), "b".into()));
    s.run(timeout - Duration::from_secs(5));
    assert_eq!(
        s.next_hop("b", "d").as_deref(),
        Some("c"),
        "not expired yet"
    );
    assert_eq!(s.next_hop("a", "d").as_deref(), Some("b"));
    s.run(Duration::from_secs(10));
    assert_eq!(s.next_hop("b", "d"), None, "expired");
    assert_eq!(s.r("b").stats().routes_expired, 1);
    assert_eq!(s.next_hop("a", "d"), None, "and withdrawn onwards");
    // The direct route to c lives on: it is the session, not an announcement.
    assert_eq!(s.next_hop("b", "c").as_deref(), Some("c"));
}

#[test]
fn small_latency_changes_do_not_move_a_route() {
    let mut s = Sim::new(&["a", "b", "c", "d"], config(true));
    s.link("a", "b", 10);
    s.link("b", "d", 10);
    s.link("a", "c", 15);
    s.link("c", "d", 10);
    s.settle();
    assert_eq!(s.next_hop("a", "d").as_deref(), Some("b")); // 120 vs 125
    s.link("a", "c", 8); // via c 118 vs 120
    s.settle();
    assert_eq!(s.next_hop("a", "d").as_deref(), Some("b"));
    s.link("a", "c", 1); // via c 111 vs 120: within 10 %
    s.settle();
    assert_eq!(s.next_hop("a", "d").as_deref(), Some("b"));
    assert_eq!(
        s.metric("a", "d"),
        Some(120),
        "the metric shown is still measured"
    );
    s.link("a", "b", 30); // via b 140: now clearly worse
    s.settle();
    assert_eq!(s.next_hop("a", "d").as_deref(), Some("c"));
    assert_eq!(s.metric("a", "d"), Some(111));
}

#[test]
fn probes_measure_link_latency() {
    let mut s = Sim::new(&["a", "b"], config(true));
    s.link("a", "b", 10);
    // The link is really 40 ms, not the 10 ms the session reported.
    s.links.insert(key("a", "b"), Duration::from_millis(40));
    s.run(Duration::from_secs(120));
    let m = s.metric("a", "b").unwrap();
    assert_eq!(m, 40, "measured {m} ms");
    assert!(s.sent_by_kind[&2] > 0 && s.sent_by_kind[&3] > 0);
}

#[test]
fn broadcast_reaches_every_peer_exactly_once_over_the_tree() {
    // A ring with a chord and a tail: several paths to most peers.
    let names = ["a", "b", "c", "d", "e", "f"];
    let mut s = Sim::new(&names, config(true));
    s.link("a", "b", 10);
    s.link("b", "c", 10);
    s.link("c", "d", 10);
    s.link("d", "a", 10);
    s.link("a", "c", 15);
    s.link("d", "e", 10);
    s.link("e", "f", 10);
    s.settle();
    for origin in names {
        let before = s.sent_by_kind.get(&5).copied().unwrap_or(0);
        let payload = format!("hello from {origin}").into_bytes();
        s.broadcast(origin, &payload);
        let got = s.deliveries_of(&payload);
        let want: BTreeMap<String, usize> = names
            .iter()
            .filter(|n| **n != origin)
            .map(|n| (n.to_string(), 1))
            .collect();
        assert_eq!(got, want, "broadcast from {origin}");
        let copies = s.sent_by_kind.get(&5).copied().unwrap_or(0) - before;
        assert_eq!(
            copies,
            names.len() - 1,
            "one copy per tree edge from {origin}"
        );
    }
}

/// Right after the links come up nobody has told anybody its routes yet, so a broadcast goes
/// to every neighbour and copies cross: the seen-cache delivers each once all the same.
#[test]
fn broadcast_before_routes_converge_is_still_delivered_once() {
    let names = ["a", "b", "c", "d"];
    let mut s = Sim::new(&names, config(true));
    s.link("a", "b", 10);
    s.link("b", "c", 10);
    s.link("c", "a", 10);
    s.link("c", "d", 10);
    s.link("d", "a", 10);
    s.broadcast("a", b"early");
    assert_eq!(
        s.deliveries_of(b"early"),
        BTreeMap::from([("b".into(), 1), ("c".into(), 1), ("d".into(), 1)])
    );
    let dups: u64 = s.routers.values().map(|r| r.stats().flood_duplicates).sum();
    let delivered: u64 = s.routers.values().map(|r| r.stats().floods_delivered).sum();
    assert!(dups > 0, "copies crossed and were dropped");
    assert_eq!(delivered, 3);
}

#[test]
fn a_duplicated_flood_datagram_is_delivered_once() {
    let mut s = line(true);
    let now = s.now;
    let out = s
        .routers
        .get_mut("a")
        .unwrap()
        .originate_flood(FloodMode::Broadcast, b"dup".to_vec(), now)
        .unwrap();
    let (to, bytes) = out.into_iter().next().unwrap();
    assert_eq!(to, "b");
    let b = s.routers.get_mut("b").unwrap();
    let first = b.handle_control("a", &bytes, now).unwrap();
    assert_eq!(first.deliver.as_deref(), Some(&b"dup"[..]));
    assert_eq!(first.send.len(), 1, "passed on to c");
    let again = b.handle_control("a", &bytes, now).unwrap();
    assert_eq!((again.deliver, again.send.len()), (None, 0));
}

#[test]
fn broadcast_works_without_split_horizon_too() {
    let mut s = line(false);
    s.broadcast("b", b"x");
    assert_eq!(
        s.deliveries_of(b"x"),
        BTreeMap::from([("a".into(), 1), ("c".into(), 1), ("d".into(), 1)])
    );
}

#[test]
fn multicast_reaches_the_group_members_only() {
    let group = Ipv4Addr::new(239, 1, 2, 3);
    let mut s = line(true);
    s.routers.get_mut("c").unwrap().join_group(group);
    s.routers.get_mut("d").unwrap().join_group(group);
    s.settle();
    let members: Vec<String> = s
        .r("a")
        .group_members(group)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(members, ["c", "d"]);
    let now = s.now;
    let out = s
        .routers
        .get_mut("a")
        .unwrap()
        .originate_flood(FloodMode::Multicast(group), b"m".to_vec(), now)
        .unwrap();
    s.send("a", out);
    s.settle();
    assert_eq!(
        s.deliveries_of(b"m"),
        BTreeMap::from([("c".into(), 1), ("d".into(), 1)])
    );
    // Leaving is announced too.
    s.routers.get_mut("d").unwrap().leave_group(group);
    s.settle();
    assert_eq!(s.r("a").group_members(group).len(), 1);
}

#[test]
fn anycast_picks_the_closest_member() {
    let service = Ipv4Addr::new(10, 99, 200, 1);
    let mut s = Sim::new(&["a", "b", "c", "d"], config(true));
    s.link("a", "b", 10);
    s.link("b", "c", 10);
    s.link("c", "d", 30);
    s.routers.get_mut("b").unwrap().join_group(service);
    s.routers.get_mut("d").unwrap().join_group(service);
    s.settle();
    let target = |s: &Sim, n: &str| match s.r(n).anycast_target(service) {
        Some(AnycastTarget::Remote(h)) => format!("{}->{}", h.peer_id, h.dest_peer_id),
        Some(AnycastTarget::Local) => "local".into(),
        None => "none".into(),
    };
    // announced but not listed by the registry: no remote member is chosen
    assert_eq!(target(&s, "a"), "none");
    for r in s.routers.values_mut() {
        r.set_anycast_listing([
            ("b".to_owned(), vec![service]),
            ("d".to_owned(), vec![service]),
        ]);
    }
    assert_eq!(target(&s, "a"), "b->b");
    assert_eq!(target(&s, "b"), "local");
    assert_eq!(target(&s, "c"), "b->b", "10 ms to b beats 30 ms to d");
    assert_eq!(target(&s, "d"), "local");
    assert!(s.r("a").known_groups().contains(&service));
    s.routers.get_mut("b").unwrap().leave_group(service);
    s.settle();
    assert_eq!(target(&s, "a"), "b->d");
    assert_eq!(target(&s, "c"), "d->d");
}

#[test]
fn a_late_joiner_learns_routes_and_groups_at_once() {
    let group = Ipv4Addr::new(239, 9, 9, 9);
    let mut s = Sim::new(&["a", "b", "c"], config(true));
    s.link("a", "b", 10);
    s.routers.get_mut("a").unwrap().join_group(group);
    s.settle();
    s.link("b", "c", 10);
    s.run(Duration::from_millis(100)); // no periodic round in between
    assert_eq!(s.walk("c", "a").unwrap(), ["c", "b", "a"]);
    assert_eq!(s.r("c").group_members(group).len(), 1);
}

/// Carries an IP packet from `from` to the peer owning `dst` hop by hop, as the peers'
/// data planes would: each relay decrements the TTL. Returns the packet as it arrives.
fn carry(s: &Sim, from: &str, dst: Ipv4Addr, mut packet: Vec<u8>) -> (String, Vec<u8>) {
    let mut at = from.to_owned();
    for _ in 0..16 {
        let hop = s.r(&at).next_hop(dst).expect("a route");
        at = hop.peer_id;
        if s.vips[&at] == dst {
            return (at, packet);
        }
        assert_eq!(decrement_ttl(&mut packet), Ok(Forward::Forward));
    }
    panic!("no arrival");
}

/// One peer's bridge state in TAP mode.
struct Bridge {
    mac: MacAddr,
    macs: MacTable,
    arp: ArpTable,
    received: Vec<Vec<u8>>,
}

/// TAP mode over the mesh: an ARP request (broadcast frame) goes to every peer as EtherIP,
/// relayed hop by hop; the owner learns who asked and answers unicast; from then on frames to
/// that MAC go to one peer only.
#[test]
fn tap_mode_carries_arp_and_learns_where_each_mac_lives() {
    let s = line(true);
    let mut bridges: BTreeMap<String, Bridge> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| {
            let mac = generate_mac(n);
            let b = Bridge {
                mac,
                macs: MacTable::new(mac, DEFAULT_AGEING, DEFAULT_CAPACITY),
                arp: ArpTable::default(),
                received: Vec::new(),
            };
            (n.to_string(), b)
        })
        .collect();
    let now = s.now;
    let send_frame = |bridges: &mut BTreeMap<String, Bridge>, from: &str, frame: Vec<u8>| {
        let targets: Vec<Ipv4Addr> = match bridges[from].macs.decide(&frame, now) {
            FrameDelivery::Flood => s.r(from).forwarding_table().into_keys().collect(),
            FrameDelivery::Unicast(peer) => vec![s.vips[&peer]],
            FrameDelivery::Drop => vec![],
        };
        let mut ttls = BTreeMap::new();
        for dst in targets {
            let packet = encapsulate(s.vips[from], dst, 1, DEFAULT_TTL, &frame).unwrap();
            let (at, packet) = carry(&s, from, dst, packet);
            let got = decapsulate(&packet).unwrap();
            assert_eq!((got.src, got.dst), (s.vips[from], dst));
            ttls.insert(at.clone(), got.ttl);
            let b = bridges.get_mut(&at).unwrap();
            b.macs.learn_from_frame(got.frame, from, now);
            b.arp.learn_from_frame(got.frame, now);
            b.received.push(got.frame.to_vec());
        }
        ttls
    };
    let (a_mac, c_mac) = (bridges["a"].mac, bridges["c"].mac);
    let (a_ip, c_ip) = (s.vips["a"], s.vips["c"]);

    // a asks who has c's address: flooded, one copy per peer, relays count in the TTL.
    let who_has = ArpPacket::request(a_mac, a_ip, c_ip);
    let request = who_has.to_frame();
    let ttls = send_frame(&mut bridges, "a", request.clone());
    assert_eq!(
        ttls,
        BTreeMap::from([("b".into(), 64), ("c".into(), 63), ("d".into(), 62)])
    );
    for n in ["b", "c", "d"] {
        assert_eq!(bridges[n].received, vec![request.clone()], "{n}");
    }
    assert_eq!(
        bridges["c"].arp.mac_of(a_ip, now, DEFAULT_AGEING),
        Some(a_mac)
    );

    // c answers a, unicast: c learned a's MAC from the request.
    let reply = who_has.reply(c_mac).to_frame();
    assert_eq!(
        bridges["c"].macs.decide(&reply, now),
        FrameDelivery::Unicast("a".into())
    );
    let ttls = send_frame(&mut bridges, "c", reply.clone());
    assert_eq!(ttls.keys().collect::<Vec<_>>(), ["a"]);
    assert_eq!(
        parse_arp(&bridges["a"].received[0]).unwrap().unwrap().op,
        ArpOp::Reply
    );
    assert_eq!(
        bridges["a"].arp.mac_of(c_ip, now, DEFAULT_AGEING),
        Some(c_mac)
    );
    assert_eq!(bridges["b"].received.len(), 1, "b saw only the broadcast");

    // a now knows where c's MAC lives; b's is still unknown and floods.
    let mut to_c = c_mac.0.to_vec();
    to_c.extend(a_mac.0);
    to_c.extend([0x08, 0x00]);
    assert_eq!(
        bridges["a"].macs.decide(&to_c, now),
        FrameDelivery::Unicast("c".into())
    );
    to_c[..6].copy_from_slice(&bridges["b"].mac.0);
    assert_eq!(bridges["a"].macs.decide(&to_c, now), FrameDelivery::Flood);
}

mod random_topologies {
    use super::*;
    use proptest::prelude::*;

    fn topology() -> impl Strategy<Value = (usize, Vec<(usize, usize, u64)>, usize)> {
        (3usize..=7).prop_flat_map(|n| {
            (
                Just(n),
                proptest::collection::vec((0..n, 0..n, 1u64..60), 1..(n * 2)),
                0usize..64,
            )
        })
    }

    fn check(s: &Sim, names: &[String]) -> Result<(), TestCaseError> {
        for from in names {
            let reach = s.connected(from);
            for to in names {
                if from == to {
                    continue;
                }
                let walk = s.walk(from, to).map_err(TestCaseError::fail)?;
                if reach.contains(to) {
                    // max_hops 8 exceeds any path in ≤ 7 peers: everything reachable is routed.
                    prop_assert_eq!(walk.last(), Some(to), "{} cannot reach {}", from, to);
                    prop_assert!(walk.len() <= 10);
                } else {
                    prop_assert!(walk.is_empty(), "{} routes to unreachable {}", from, to);
                }
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn routes_are_loop_free_and_complete(
            (n, edges, pick) in topology(),
            split_horizon in any::<bool>(),
        ) {
            let names: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let mut s = Sim::new(&refs, config(split_horizon));
            for (a, b, rtt) in &edges {
                if a != b {
                    s.link(&names[*a], &names[*b], *rtt);
                }
            }
            s.run(Duration::from_secs(30));
            check(&s, &names)?;

            // Broadcast from one peer: each peer it can reach, exactly once.
            let origin = names[pick % n].clone();
            s.broadcast(&origin, b"bcast");
            let reach = s.connected(&origin);
            let want: BTreeMap<String, usize> = reach
                .iter()
                .filter(|p| **p != origin)
                .map(|p| (p.clone(), 1))
                .collect();
            prop_assert_eq!(s.deliveries_of(b"bcast"), want);

            // Cut a link. While updates travel, peers may briefly point at each other with
            // stale routes (a micro-loop — rare: about 1 case in 1,400 in a 1,500-case run —
            // and the IP TTL drops what is caught in it); the path vector must clear it as
            // soon as the updates cross (links ≤ 60 ms), with no periodic round or timeout.
            let links: Vec<(String, String)> = s.links.keys().cloned().collect();
            if links.is_empty() {
                return Ok(());
            }
            let (a, b) = links[pick % links.len()].clone();
            s.unlink(&a, &b);
            let step = Duration::from_millis(5);
            let mut last_loop = None;
            for i in 0..400u32 {
                s.run(step);
                for from in &names {
                    for to in &names {
                        if from != to && s.walk(from, to).is_err_and(|e| e.contains("loop")) {
                            last_loop = Some(step * (i + 1));
                        }
                    }
                }
            }
            if let Some(at) = last_loop {
                prop_assert!(at <= Duration::from_millis(100), "a loop lasted {:?}", at);
            }
            check(&s, &names)?;
            s.run(Duration::from_secs(30));
            check(&s, &names)?;
        }
    }
}
