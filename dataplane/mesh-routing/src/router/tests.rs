//! Unit tests of the router: refused input, metrics, timers, probes, hostile datagrams.
#![allow(clippy::unwrap_used)]
use super::*;
use crate::wire::{Flood, FloodMode, Membership};

const A: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);
const C: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 3);
const MS: Duration = Duration::from_millis(1);

/// Router "a" with the registry listing a, b, c and d–f (10.99.0.4–6).
fn router(now: Instant) -> Router {
    let mut r = Router::new("a", A, RoutingConfig::default(), 0, 1, now).unwrap();
    let mut members = vec![("a", A), ("b", B), ("c", C)];
    members.extend(
        ["d", "e", "f"]
            .into_iter()
            .zip(4..)
            .map(|(id, last)| (id, Ipv4Addr::new(10, 99, 0, last))),
    );
    r.set_members(
        members.into_iter().map(|(id, vip)| (id.to_owned(), vip)),
        now,
    );
    r
}

fn entry(dest: &str, vip: Ipv4Addr, latency_ms: u32, path: &[&str]) -> RouteEntry {
    let hop_count = path.len() as u8;
    RouteEntry {
        dest: dest.into(),
        vip,
        metric: metric(latency_ms, hop_count),
        latency_ms,
        hop_count,
        path: path.iter().map(|p| p.to_string()).collect(),
    }
}

fn ann(sender: &str, seq: u64, entries: Vec<RouteEntry>) -> Announcement {
    Announcement {
        sender: sender.into(),
        seq,
        entries,
    }
}

#[test]
fn the_metric_is_latency_plus_100_per_hop_and_saturates() {
    assert_eq!(metric(7, 0), 7);
    assert_eq!(metric(7, 2), 207);
    assert_eq!(metric(u32::MAX, 3), METRIC_INFINITY - 1);
}

#[test]
fn config_clamps_max_hops_and_keeps_the_keys() {
    let c = RoutingConfig::new(1000, Duration::from_secs(60), false);
    assert_eq!(c.max_hops, MAX_PATH as u8);
    assert_eq!(c.route_timeout, Duration::from_secs(60));
    assert!(!c.split_horizon);
    assert_eq!(c.announce_interval, DEFAULT_ANNOUNCE_INTERVAL);
    let d = RoutingConfig::default();
    assert_eq!(
        (d.max_hops, d.route_timeout, d.split_horizon),
        (8, Duration::from_secs(300), true)
    );
}

#[test]
fn degenerate_timers_are_made_workable() {
    let now = Instant::now();
    let config = RoutingConfig {
        announce_interval: Duration::ZERO,
        announce_jitter: Duration::from_secs(5),
        route_timeout: Duration::ZERO,
        ..RoutingConfig::default()
    };
    let r = Router::new("a", A, config, 0, 1, now).unwrap();
    let c = r.config();
    assert_eq!(c.announce_interval, MIN_ANNOUNCE_INTERVAL);
    assert_eq!(c.announce_jitter, MIN_ANNOUNCE_INTERVAL / 2);
    assert_eq!(c.route_timeout, MIN_ANNOUNCE_INTERVAL * 3);
    assert!(r.poll_timeout() > now);
}

#[test]
fn bad_peer_ids_are_refused() {
    let now = Instant::now();
    assert_eq!(
        Router::new("", A, RoutingConfig::default(), 0, 1, now).unwrap_err(),
        RoutingError::BadPeerId
    );
    let mut r = router(now);
    for id in ["", "a", &"x".repeat(MAX_ID_LEN + 1)] {
        assert_eq!(r.neighbour_up(id, B, MS, now), Err(RoutingError::BadPeerId));
    }
}

#[test]
fn announcements_from_strangers_impostors_and_the_past_are_refused() {
    let now = Instant::now();
    let mut r = router(now);
    let a1 = ann("b", 5, vec![entry("c", C, 1, &[])]);
    assert_eq!(
        r.handle_announcement("b", &a1, now),
        Err(RoutingError::NotNeighbour("b".into()))
    );
    r.neighbour_up("b", B, MS, now).unwrap();
    assert!(matches!(
        r.handle_announcement("x", &a1, now),
        Err(RoutingError::SenderMismatch { .. })
    ));
    r.handle_announcement("b", &a1, now).unwrap();
    assert_eq!(r.next_hop(C).unwrap().peer_id, "b");
    let replay = ann("b", 5, vec![]);
    assert!(matches!(
        r.handle_announcement("b", &replay, now),
        Err(RoutingError::Stale {
            seq: 5,
            last: 5,
            ..
        })
    ));
    r.handle_announcement("b", &ann("b", 6, vec![]), now)
        .unwrap();
    // Far behind the last one: b restarted from a lower start, and is believed.
    let far = 6 + REORDER_WINDOW + 1;
    r.handle_announcement("b", &ann("b", far, vec![]), now)
        .unwrap();
    assert!(matches!(
        r.handle_announcement("b", &ann("b", 7, vec![]), now),
        Err(RoutingError::Stale { .. })
    ));
    r.handle_announcement("b", &ann("b", 1, vec![]), now)
        .unwrap();
}

#[test]
fn entries_through_us_with_repeats_or_withdrawn_are_not_routes() {
    let now = Instant::now();
    let mut r = router(now);
    r.neighbour_up("b", B, MS, now).unwrap();
    let d = Ipv4Addr::new(10, 99, 0, 4);
    let e = Ipv4Addr::new(10, 99, 0, 5);
    let f = Ipv4Addr::new(10, 99, 0, 6);
    let mut withdrawn = entry("f", f, 1, &[]);
    withdrawn.metric = METRIC_INFINITY;
    let msg = ann(
        "b",
        1,
        vec![
            entry("c", C, 1, &["a"]),      // through us
            entry("d", d, 1, &["x", "x"]), // repeated id
            entry("e", e, 1, &["b"]),      // through the sender itself
            withdrawn,
        ],
    );
    r.handle_announcement("b", &msg, now).unwrap();
    for vip in [C, d, e, f] {
        assert_eq!(r.next_hop(vip), None, "{vip}");
    }
}

#[test]
fn relayed_routes_add_the_link_latency_and_one_hop() {
    let now = Instant::now();
    let mut r = router(now);
    r.neighbour_up("b", B, 7 * MS, now).unwrap();
    let msg = ann("b", 1, vec![entry("c", C, 5, &[]), entry("a", A, 7, &[])]);
    r.handle_announcement("b", &msg, now).unwrap();
    let hop = r.next_hop(C).unwrap();
    assert_eq!(
        (hop.peer_id.as_str(), hop.vip, hop.metric, hop.hop_count),
        ("b", B, 12 + 100, 1)
    );
    assert_eq!(r.next_hop(A), None, "no route to ourselves");
    assert_eq!(r.forwarding_table().len(), 2);
}

#[test]
fn announcements_choose_paths_but_never_who_owns_an_address() {
    let now = Instant::now();
    let mut r = router(now);
    r.neighbour_up("b", B, MS, now).unwrap();
    let d = Ipv4Addr::new(10, 99, 0, 4);
    // b claims c's address for a made-up id, and for d (listed with another address)
    let msg = ann(
        "b",
        1,
        vec![entry("mallory", C, 1, &[]), entry("d", C, 1, &[])],
    );
    r.handle_announcement("b", &msg, now).unwrap();
    assert_eq!(r.next_hop(C), None);
    assert_eq!(r.next_hop(d), None);
    assert_eq!(r.stats().claims_refused, 2);
    // the real owner's route is taken, and stays with its owner
    r.handle_announcement("b", &ann("b", 2, vec![entry("c", C, 1, &[])]), now)
        .unwrap();
    assert_eq!(r.next_hop(C).unwrap().dest_peer_id, "c");
    // the registry moves the address (a lease that moved): the old owner's route goes at once,
    // the new owner's comes with its next announcement
    r.set_members([("b".to_owned(), B), ("new".to_owned(), C)], now);
    assert_eq!(r.next_hop(C), None);
    r.handle_announcement(
        "b",
        &ann("b", 3, vec![entry("c", C, 1, &[]), entry("new", C, 1, &[])]),
        now,
    )
    .unwrap();
    assert_eq!(r.next_hop(C).unwrap().dest_peer_id, "new");
}

#[test]
fn last_updated_converts_to_wall_clock_time() {
    let t0 = Instant::now();
    let mut r = router(t0);
    r.neighbour_up("b", B, MS, t0).unwrap();
    let later = t0 + Duration::from_secs(90);
    let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let v = &r.routes()[0];
    assert_eq!(v.last_updated, t0);
    assert_eq!(
        v.last_updated_at(later, wall),
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 - 90)
    );
}

#[test]
fn big_tables_are_split_under_the_datagram_limit() {
    let now = Instant::now();
    let mut r = router(now);
    let ids: Vec<String> = (0..60).map(|i| format!("{i:0>60}")).collect();
    for (i, id) in ids.iter().enumerate() {
        r.neighbour_up(id, Ipv4Addr::new(10, 98, 0, i as u8), MS, now)
            .unwrap();
    }
    let out = r.poll_announcements(now);
    let to_first: Vec<&Vec<u8>> = out
        .iter()
        .filter(|(to, _)| *to == ids[0])
        .map(|(_, b)| b)
        .collect();
    assert!(to_first.len() > 1, "one table in several datagrams");
    let mut dests = BTreeSet::new();
    let mut seqs = Vec::new();
    for bytes in to_first {
        match Message::decode(bytes).unwrap() {
            Message::Announcement(a) => {
                assert!(bytes.len() <= MAX_DATAGRAM);
                seqs.push(a.seq);
                dests.extend(a.entries.into_iter().map(|e| e.dest));
            }
            Message::Probe(_) | Message::Membership(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(dests.len(), 60, "every route, the receiver's own poisoned");
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "increasing seqs {seqs:?}"
    );
}

#[test]
fn timers_periodic_rounds_have_jitter_and_pending_work_is_due_now() {
    let t0 = Instant::now();
    let mut r = router(t0);
    assert_eq!(r.poll_timeout(), t0 + DEFAULT_ANNOUNCE_INTERVAL);
    let t1 = t0 + Duration::from_secs(1);
    r.neighbour_up("b", B, MS, t1).unwrap();
    assert_eq!(r.poll_timeout(), t1, "a new neighbour is owed a table now");
    let out = r.poll_announcements(t1);
    assert!(out.iter().any(|(_, b)| b[0] == 1), "table sent");
    assert!(out.iter().any(|(_, b)| b[0] == 2), "probe sent");
    assert_eq!(r.poll_timeout(), t0 + DEFAULT_ANNOUNCE_INTERVAL);
    let mut at = r.poll_timeout();
    let mut gaps = BTreeSet::new();
    for _ in 0..20 {
        assert!(!r.poll_announcements(at).is_empty());
        let next = r.poll_timeout();
        let gap = next - at;
        assert!(gap <= DEFAULT_ANNOUNCE_INTERVAL);
        assert!(gap > DEFAULT_ANNOUNCE_INTERVAL - DEFAULT_ANNOUNCE_JITTER);
        gaps.insert(gap);
        at = next;
    }
    assert!(gaps.len() > 1, "the interval varies");
}

#[test]
fn only_the_matching_probe_reply_updates_latency() {
    let t0 = Instant::now();
    let mut r = router(t0);
    r.neighbour_up("b", B, 40 * MS, t0).unwrap();
    let out = r.poll_announcements(t0);
    let probe = out
        .iter()
        .find_map(|(_, b)| match Message::decode(b).unwrap() {
            Message::Probe(p) => Some(p),
            _ => None,
        })
        .unwrap();
    let t1 = t0 + 20 * MS;
    let wrong = Probe {
        nonce: probe.nonce ^ 1,
        ..probe
    };
    assert_eq!(r.handle_probe_reply("b", wrong, t1), None);
    assert_eq!(r.handle_probe_reply("b", probe, t1), Some(20 * MS));
    assert_eq!(
        r.next_hop(B).unwrap().metric,
        35,
        "40 → a quarter of the way to 20"
    );
    assert_eq!(r.handle_probe_reply("b", probe, t1), None, "answered once");
}

#[test]
fn a_neighbour_cannot_grow_the_table_without_bound() {
    let now = Instant::now();
    let mut r = router(now);
    r.neighbour_up("b", B, MS, now).unwrap();
    let mut members: Vec<(String, Ipv4Addr)> = (0..MAX_DESTINATIONS as u32 + 200)
        .map(|n| (format!("d{n}"), Ipv4Addr::from(n)))
        .collect();
    members.push(("b".into(), B));
    r.set_members(members, now);
    let mut seq = 0;
    let mut n = 0u32;
    while n < MAX_DESTINATIONS as u32 + 100 {
        let entries = (0..200)
            .map(|i| entry(&format!("d{}", n + i), Ipv4Addr::from(n + i), 1, &[]))
            .collect();
        seq += 1;
        r.handle_announcement("b", &ann("b", seq, entries), now)
            .unwrap();
        n += 200;
    }
    assert_eq!(
        r.forwarding_table().len(),
        MAX_DESTINATIONS + 1,
        "+ b itself"
    );
    assert!(r.stats().entries_refused >= 100);
}

fn _router_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Router>();
}

#[test]
fn refusals_are_counted() {
    let now = Instant::now();
    let mut r = router(now);
    assert!(r.handle_control("b", &[0xff, 1], now).is_err());
    assert!(r.handle_control("b", &[], now).is_err());
    assert_eq!(r.stats().malformed, 2);
    let a1 = ann("b", 1, vec![]);
    assert!(r.handle_announcement("b", &a1, now).is_err());
    r.neighbour_up("b", B, MS, now).unwrap();
    r.handle_announcement("b", &a1, now).unwrap();
    let loop_entry = ann("b", 2, vec![entry("c", C, 1, &["a"])]);
    r.handle_announcement("b", &loop_entry, now).unwrap();
    let s = r.stats();
    assert_eq!(
        (
            s.announcements_refused,
            s.announcements_received,
            s.entries_refused
        ),
        (1, 2, 1)
    );
}

#[test]
fn probes_are_echoed() {
    let now = Instant::now();
    let mut r = router(now);
    let p = Probe {
        nonce: 9,
        timestamp_us: 77,
    };
    let out = r
        .handle_control("z", &Message::Probe(p).encode().unwrap(), now)
        .unwrap();
    assert_eq!(
        out.send,
        vec![("z".to_string(), Message::ProbeReply(p).encode().unwrap())]
    );
}

#[test]
fn floods_and_memberships_from_strangers_are_refused() {
    let now = Instant::now();
    let mut r = router(now);
    let f = Message::Flood(Flood {
        origin: "z".into(),
        id: 1,
        ttl: 3,
        mode: FloodMode::Broadcast,
        payload: vec![1],
    });
    assert_eq!(
        r.handle_control("z", &f.encode().unwrap(), now),
        Err(RoutingError::NotNeighbour("z".into()))
    );
    let m = Message::Membership(Membership {
        origin: "z".into(),
        vip: C,
        seq: 1,
        groups: vec![],
    });
    assert_eq!(
        r.handle_control("z", &m.encode().unwrap(), now),
        Err(RoutingError::NotNeighbour("z".into()))
    );
}

#[test]
fn a_flood_with_ttl_1_is_delivered_but_not_passed_on() {
    let now = Instant::now();
    let mut r = router(now);
    r.neighbour_up("b", B, MS, now).unwrap();
    r.neighbour_up("c", C, MS, now).unwrap();
    let f = |ttl| Flood {
        origin: "b".into(),
        id: u64::from(ttl),
        ttl,
        mode: FloodMode::Broadcast,
        payload: vec![ttl],
    };
    let (deliver, send) = r.handle_flood("b", f(1), now).unwrap();
    assert_eq!((deliver, send.len()), (Some(vec![1]), 0));
    let (deliver, send) = r.handle_flood("b", f(2), now).unwrap();
    assert_eq!((deliver, send.len()), (Some(vec![2]), 1));
    assert_eq!(send[0].0, "c");
    match Message::decode(&send[0].1).unwrap() {
        Message::Flood(g) => assert_eq!(g.ttl, 1),
        other => panic!("{other:?}"),
    }
}

proptest::proptest! {
    #[test]
    fn random_control_datagrams_never_panic(
        datagrams in proptest::collection::vec(
            proptest::collection::vec(proptest::num::u8::ANY, 0..256), 1..20),
    ) {
        let now = Instant::now();
        let mut r = router(now);
        r.neighbour_up("b", B, MS, now).unwrap();
        for d in datagrams {
            let _ = r.handle_control("b", &d, now);
        }
        let _ = r.poll_announcements(now + Duration::from_secs(11));
        let _ = r.routes();
    }

    #[test]
    fn random_well_formed_announcements_never_panic(
        entries in proptest::collection::vec(
            ("[a-e]", 0u32..u32::MAX, proptest::collection::vec("[a-e]", 0..5)), 0..20),
    ) {
        let now = Instant::now();
        let mut r = router(now);
        r.neighbour_up("b", B, MS, now).unwrap();
        let entries = entries
            .into_iter()
            .map(|(dest, lat, path)| RouteEntry {
                dest,
                vip: C,
                metric: lat,
                latency_ms: lat,
                hop_count: path.len() as u8,
                path,
            })
            .collect();
        let _ = r.handle_announcement("b", &ann("b", 1, entries), now);
        for v in r.routes() {
            proptest::prop_assert!(!v.path.contains(&"a".to_string()));
        }
        let _ = r.poll_announcements(now);
    }
}

#[test]
fn memberships_must_name_their_registry_address_and_no_members_address_as_a_group() {
    let now = Instant::now();
    let mut r = router(now);
    r.neighbour_up("b", B, MS, now).unwrap();
    r.handle_announcement("b", &ann("b", 1, vec![entry("c", C, 1, &[])]), now)
        .unwrap();
    let membership = |origin: &str, vip, seq, group| Membership {
        origin: origin.into(),
        vip,
        seq,
        groups: vec![group],
    };
    let service = Ipv4Addr::new(10, 99, 0, 200);
    // b "joins" c's own address as an anycast group; claims to be c; an unlisted id
    for m in [
        membership("b", B, 1, C),
        membership("c", B, 2, service),
        membership("z", Ipv4Addr::new(10, 99, 0, 9), 1, service),
    ] {
        r.handle_membership("b", &m, now).unwrap();
    }
    assert_eq!(r.stats().claims_refused, 3);
    assert!(r.group_members(C).is_empty());
    assert!(r.group_members(service).is_empty());
    // an anycast address the registry does not list for c: kept, counted, reaches nobody
    r.handle_membership("b", &membership("c", C, 3, service), now)
        .unwrap();
    assert_eq!(r.stats().claims_refused, 4);
    assert_eq!(r.anycast_target(service), None);
    // listed by the registry: c is the group's member
    r.set_anycast_listing([("c".to_owned(), vec![service])]);
    assert_eq!(r.group_members(service), vec![("c".to_owned(), C)]);
    assert!(matches!(
        r.anycast_target(service),
        Some(AnycastTarget::Remote(h)) if h.dest_peer_id == "c"
    ));
}
