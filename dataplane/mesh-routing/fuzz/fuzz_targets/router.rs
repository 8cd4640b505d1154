//! The router fed a sequence of control datagrams (announcements, probes and replies,
//! memberships, floods) from three neighbours, with time passing and sessions going down and
//! up in between: never panics, every datagram it sends decodes and goes to a neighbour, its
//! forwarding table only names neighbours it has, and a delivered flood payload is one a datagram carried.
//!
//! Input: records `[op][len][bytes…]`; op % 8 < 3 is a datagram from neighbour `op % 8`
//! (`len` bytes, a kind byte first; the version byte is added), 3 lets `len` × 100 ms pass,
//! 4 takes neighbour `len % 3` down, 5 brings it up, 6 polls the announcements, 7 sets the
//! registry's member list to the first `len % 5` of a fixed set.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};
use switchyard_mesh_routing::wire::VERSION;
use switchyard_mesh_routing::{Message, Router, RoutingConfig};

const NEIGHBOURS: [&str; 3] = ["a", "b", "c"];

fn vip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 99, 0, 10 + i)
}

/// Every datagram decodes and goes to a neighbour (or back to `reply_to`, whose datagram
/// came through a session: a probe is echoed even when the routing neighbour is gone).
fn check_sent(router: &Router, sent: &[(String, Vec<u8>)], reply_to: Option<&str>) {
    for (to, datagram) in sent {
        assert!(
            Message::decode(datagram).is_ok(),
            "sent to {to}: {datagram:?}"
        );
        assert!(
            router.neighbours().any(|(id, ..)| id == to) || reply_to == Some(to.as_str()),
            "sent to {to}, not a neighbour"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let mut now = Instant::now();
    let Ok(mut router) = Router::new("self", vip(0), RoutingConfig::default(), 1, 42, now) else {
        return;
    };
    for (i, id) in NEIGHBOURS.iter().enumerate() {
        let _ = router.neighbour_up(id, vip(i as u8 + 1), Duration::from_millis(5), now);
    }
    let mut rest = data;
    while let [op, len, tail @ ..] = rest {
        let len = usize::from(*len);
        match op % 8 {
            n @ 0..=2 => {
                let body = tail.get(..len).unwrap_or(tail);
                rest = &tail[body.len()..];
                let mut datagram = Vec::with_capacity(body.len() + 1);
                if let Some((kind, fields)) = body.split_first() {
                    datagram.extend([*kind, VERSION]);
                    datagram.extend_from_slice(fields);
                }
                let from = NEIGHBOURS[usize::from(n)];
                if let Ok(out) = router.handle_control(from, &datagram, now) {
                    check_sent(&router, &out.send, Some(from));
                    if let Some(payload) = &out.deliver {
                        assert!(
                            datagram
                                .windows(payload.len())
                                .any(|w| w == payload.as_slice()),
                            "a delivered payload comes from the datagram"
                        );
                    }
                }
                continue;
            }
            3 => now += Duration::from_millis(100 * len as u64),
            4 => router.neighbour_down(NEIGHBOURS[len % 3], now),
            5 => {
                let i = len % 3;
                let _ = router.neighbour_up(
                    NEIGHBOURS[i],
                    vip(i as u8 + 1),
                    Duration::from_millis(len as u64),
                    now,
                );
            }
            6 => {
                let sent = router.poll_announcements(now);
                check_sent(&router, &sent, None);
            }
            _ => {
                let members = (0..len % 5).map(|i| (format!("m{i}"), vip(i as u8 + 1)));
                router.set_members(members, now);
            }
        }
        rest = tail;
    }
    let neighbours: Vec<String> = router.neighbours().map(|(id, ..)| id.to_owned()).collect();
    for hop in router.forwarding_table().values() {
        assert!(neighbours.iter().any(|n| *n == hop.peer_id), "{hop:?}");
    }
    let _ = router.routes();
    let _ = router.poll_timeout();
});
