//! NAT traversal through real Linux NAT in network namespaces (root; CI must not skip):
//!
//! ```text
//!   host a (10.201.1.2) ─ nat a (10.201.1.1 | 10.200.1.2) ─┐
//!                                                         wan (10.200.1.1, 10.200.2.1;
//!   host b (10.201.2.2) ─ nat b (10.201.2.1 | 10.200.2.2) ─┘  coturn on 10.200.0.1)
//! ```
//!
//! Each nat namespace masquerades its lan behind its wan address with nftables and, like a home
//! router, silently drops unsolicited datagrams to itself (no ICMP errors, and no conntrack
//! entry that would later clash with the lan host's own mapping). The wan namespace silently
//! discards traffic to the private lan ranges, as the internet does (a route into a veth nobody
//! answers on: with a blackhole or missing route coturn's relayed sends to the private host
//! candidates failed, and in our runs it relayed nothing more for those allocations). A plain
//! masquerade keeps the source port for every destination (endpoint-independent mapping), so the
//! agents punch through with their server-reflexive candidates and select a direct path. With
//! `masquerade fully-random` on b's side every destination gets its own port (a symmetric NAT):
//! the srflx candidate is useless to a, and the agents select the TURN relay.
//! Namespace names start with `syice`; they are deleted (with their nft tables) on drop.

mod driver;

use std::collections::HashSet;
use std::net::UdpSocket;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use driver::{bind_in, require, Coturn, Net};
use switchyard_ice::{IceConfig, PathKind, TurnServerConfig};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Root and the programs, or None after printing why the test skips (CI: a failure).
fn prerequisites() -> Option<()> {
    // The effective uid from /proc (no unsafe geteuid call needed).
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false);
    if !root {
        if std::env::var_os("CI").is_some() {
            panic!("the NAT namespace tests need root in CI");
        }
        eprintln!("SKIP: the NAT namespace tests need root");
        return None;
    }
    require("ip")?;
    require("nft")?;
    require("turnserver")?;
    Some(())
}

fn sh(script: &str) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "{script}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Topology {
    wan: String,
    nats: [String; 2],
    hosts: [String; 2],
}

impl Topology {
    /// `symmetric_b`: b's NAT gives every destination its own port.
    fn new(symmetric_b: bool) -> Topology {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let id = format!("syice{}{n}", std::process::id() % 100000);
        let t = Topology {
            wan: format!("{id}w"),
            nats: [format!("{id}na"), format!("{id}nb")],
            hosts: [format!("{id}ha"), format!("{id}hb")],
        };
        let w = &t.wan;
        let mut script = format!(
            "set -e; ip netns add {w}; ip -n {w} link set lo up
             ip -n {w} addr add 10.200.0.1/32 dev lo
             ip link add sink netns {w} type veth peer name sinkpeer netns {w}
             ip -n {w} link set sink up; ip -n {w} link set sinkpeer up
             ip -n {w} addr add 10.199.0.1/30 dev sink
             ip -n {w} neigh add 10.199.0.2 lladdr 02:00:00:00:00:01 dev sink nud permanent
             ip -n {w} route add 10.201.0.0/16 via 10.199.0.2
             ip netns exec {w} sysctl -qw net.ipv4.ip_forward=1\n"
        );
        for (i, side) in ["a", "b"].iter().enumerate() {
            let (nat, host, k) = (&t.nats[i], &t.hosts[i], i + 1);
            let mode = if symmetric_b && *side == "b" {
                "masquerade fully-random"
            } else {
                "masquerade"
            };
            script += &format!(
                "ip netns add {nat}; ip netns add {host}
                 ip -n {nat} link set lo up; ip -n {host} link set lo up
                 ip link add wan netns {nat} type veth peer name to{side} netns {w}
                 ip link add lan netns {nat} type veth peer name eth0 netns {host}
                 ip -n {w} addr add 10.200.{k}.1/24 dev to{side}; ip -n {w} link set to{side} up
                 ip -n {nat} addr add 10.200.{k}.2/24 dev wan; ip -n {nat} link set wan up
                 ip -n {nat} addr add 10.201.{k}.1/24 dev lan; ip -n {nat} link set lan up
                 ip -n {host} addr add 10.201.{k}.2/24 dev eth0; ip -n {host} link set eth0 up
                 ip -n {nat} route add default via 10.200.{k}.1
                 ip -n {host} route add default via 10.201.{k}.1
                 ip netns exec {nat} sysctl -qw net.ipv4.ip_forward=1
                 ip netns exec {nat} nft -f - <<EOF
table ip syice_nat {{
  chain post {{ type nat hook postrouting priority srcnat; oifname \"wan\" {mode}; }}
  chain in {{ type filter hook input priority filter; iifname \"wan\" ct state new drop; }}
}}
EOF
"
            );
        }
        sh(&script);
        t
    }

    fn config(&self, id: &str, socket: &UdpSocket, turn: &Coturn) -> IceConfig {
        let mut c = IceConfig::new(id, vec![socket.local_addr().expect("addr")]);
        c.stun_servers = vec![turn.addr];
        c.turn_servers = vec![TurnServerConfig {
            addr: turn.addr,
            username: "u".into(),
            password: "p".into(),
        }];
        c.agent.stun_timeout = Duration::from_secs(3);
        c
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in self.hosts.iter().chain(&self.nats).chain([&self.wan]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn run(symmetric_b: bool) -> Vec<(String, switchyard_ice::Path)> {
    let topo = Topology::new(symmetric_b);
    let turn = Coturn::start_in(Some(&topo.wan), "10.200.0.1", "u", "p");
    let sockets = vec![
        ("alpha", bind_in(Some(&topo.hosts[0]), "10.201.1.2:0")),
        ("beta", bind_in(Some(&topo.hosts[1]), "10.201.2.2:0")),
    ];
    let mut net = Net::with_sockets(sockets, |id, s| topo.config(id, s, &turn));
    net.introduce();
    let want = if symmetric_b {
        PathKind::Relayed
    } else {
        PathKind::Direct
    };
    let paths = net.run_until_paths(HashSet::new(), |p| p.kind == want);
    // The srflx candidates are the NATs' wan addresses.
    for (id, wan) in [("alpha", "10.200.1.2"), ("beta", "10.200.2.2")] {
        let endpoints = net.endpoint(id).local_endpoints();
        assert!(
            endpoints
                .iter()
                .any(|e| e.kind == "srflx" && e.address == wan),
            "{id}: {endpoints:?}"
        );
        assert!(
            endpoints
                .iter()
                .any(|e| e.kind == "relay" && e.address == "10.200.0.1"),
            "{id}: {endpoints:?}"
        );
    }
    net.exchange("alpha", "beta", b"\x04\0\0\0across the NATs");
    net.exchange("beta", "alpha", b"\x04\0\0\0and back");
    paths
}

#[test]
fn plain_nat_on_both_sides_connects_directly() {
    if prerequisites().is_none() {
        return;
    }
    let paths = run(false);
    for (pair, path) in &paths {
        // Direct through the NATs: the remote is the other NAT's wan address.
        assert!(
            path.remote.ip().to_string().starts_with("10.200."),
            "{pair}: {path:?}"
        );
    }
}

#[test]
fn symmetric_nat_needs_the_relay() {
    if prerequisites().is_none() {
        return;
    }
    let paths = run(true);
    assert!(paths.iter().all(|(_, p)| p.kind == PathKind::Relayed));
}
