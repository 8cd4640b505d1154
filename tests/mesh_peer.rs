//! The mesh peer of `switchyard client` end to end (issue 13, TUN mode, direct paths): a real
//! `switchyard server` runs the registry in the host namespace on a veth address of a LAN the
//! test builds (a bridge in a hub namespace), and each `switchyard client` peer runs in a
//! namespace of its own on that LAN. Traffic stays between the namespaces the test created
//! and the host-side veth. Needs root (namespaces, TUN); skips with a reason otherwise, fails
//! under CI.

mod support;

use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};
use support::mesh::{curl_in, ping, ping_dont_fragment, Ws};
use support::netns::{root_with_tools_or_skip, sh, sh_quiet};
use support::*;

/// Longest wait for the mesh to settle (registration, handshakes, first probe).
const PATIENCE: Duration = Duration::from_secs(30);
const NETWORK: &str = "lab";
/// The network's pre-shared key (base64 of 32 bytes 0x07).
const PSK: &str = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";
/// A key nobody holds the private half of (32 bytes 0x02).
const FORGED_KEY: &str = "AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=";

/// A LAN of namespaces: a bridge in a hub namespace, one namespace per peer with `eth0` on the
/// bridge, and a host-side veth (the registry's and the test's way in). Removed on drop.
struct Lan {
    hub: String,
    host_if: String,
    peers: Vec<String>,
    /// First three octets of the LAN's /24.
    net: String,
}

impl Lan {
    fn new(test: u32, count: usize) -> Lan {
        Lan::named("sympeer", "sypr", "10.213", test, count)
    }

    /// `prefix` names the namespaces, `short` the host-side interface (15 bytes at most);
    /// the LAN is a /24 inside `net16` (first two octets).
    fn named(prefix: &str, short: &str, net16: &str, test: u32, count: usize) -> Lan {
        let tag = format!("{}{test}", std::process::id() % 10_000);
        let octet = (std::process::id() * 4 + test) % 250 + 2;
        let lan = Lan {
            hub: format!("{prefix}{tag}h"),
            host_if: format!("{short}{tag}"),
            peers: (0..count).map(|i| format!("{prefix}{tag}p{i}")).collect(),
            net: format!("{net16}.{octet}"),
        };
        let hub = &lan.hub;
        sh(&format!(
            "ip netns add {hub} && ip -n {hub} link set lo up && \
             ip -n {hub} link add br0 type bridge && ip -n {hub} link set br0 up && \
             ip link add {host} type veth peer name up0 netns {hub} && \
             ip -n {hub} link set up0 master br0 up && \
             ip addr add {net}.254/24 dev {host} && ip link set {host} up",
            host = lan.host_if,
            net = lan.net
        ));
        for (i, ns) in lan.peers.iter().enumerate() {
            sh(&format!(
                "ip netns add {ns} && ip -n {ns} link set lo up && \
                 ip -n {hub} link add p{i} type veth peer name eth0 netns {ns} && \
                 ip -n {hub} link set p{i} master br0 up && \
                 ip -n {ns} addr add {net}.{a}/24 dev eth0 && ip -n {ns} link set eth0 up",
                net = lan.net,
                a = i + 1
            ));
        }
        lan
    }

    fn registry_ip(&self) -> String {
        format!("{}.254", self.net)
    }

    fn lan_ip(&self, i: usize) -> String {
        format!("{}.{}", self.net, i + 1)
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for ns in self.peers.iter().chain([&self.hub]) {
            sh_quiet(&format!("ip netns del {ns}"));
        }
        sh_quiet(&format!("ip link del {}", self.host_if));
    }
}

/// A client peer in its namespace.
struct Peer {
    proc: Proc,
    api: SocketAddr,
    logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl Peer {
    fn start(lan: &Lan, i: usize, name: &str, registry: SocketAddr) -> Peer {
        Peer::start_with(lan, i, name, registry, "tun")
    }

    fn start_with(lan: &Lan, i: usize, name: &str, registry: SocketAddr, device: &str) -> Peer {
        Peer::launch(&lan.peers[i], &lan.lan_ip(i), name, registry, device, false)
    }

    /// A peer in namespace `ns` whose client API the test reaches at `ip`, joining with a
    /// single-use enrollment key of its own (the registry's admin token is in no peer's
    /// configuration).
    fn launch(
        ns: &str,
        ip: &str,
        name: &str,
        registry: SocketAddr,
        device: &str,
        relay: bool,
    ) -> Peer {
        let key = support::mesh::single_use_key(registry, NETWORK);
        let discovery =
            format!("server: \"http://{registry}\", insecure: true, enrollment_key: {key}");
        Peer::launch_with(ns, ip, name, &discovery, device, relay, &[])
    }

    /// A peer whose `mesh.discovery` holds `discovery` (YAML flow-map entries) and a 1 s
    /// heartbeat, with environment variables `env`.
    fn launch_with(
        ns: &str,
        ip: &str,
        name: &str,
        discovery: &str,
        device: &str,
        relay: bool,
        env: &[(&str, &std::path::Path)],
    ) -> Peer {
        let dir = tempfile::tempdir().expect("tempdir");
        let yaml = format!(
            "proxy:\n  http: {{listen: \"127.0.0.1:0\"}}\n  socks5: {{listen: \"127.0.0.1:0\"}}\n  cores: 1\n\
             api: {{listen: \"0.0.0.0:0\"}}\nlogging: {{level: debug, format: json}}\n\
             mesh:\n  enabled: true\n  network_id: {NETWORK}\n  peer_name: {name}\n  device: {{type: {device}}}\n\
             \x20 discovery: {{{discovery}, heartbeat_interval: 1s}}\n\
             \x20 connection: {{connect_timeout: 5s, keep_alive_interval: 5s, preshared_key: \"{PSK}\", relay_via_peers: {relay}}}\n"
        );
        let started = support::mesh::start_client_in_with_env(ns, name, dir.path(), &yaml, env);
        let port = started.addrs[0].port();
        Peer {
            proc: started.proc,
            api: format!("{ip}:{port}").parse().expect("addr"),
            logs: started.logs,
            _dir: dir,
        }
    }

    fn call(&self, method: &str, path: &str) -> (u16, Value) {
        support::mesh::call_json(method, &format!("http://{}{path}", self.api), &[])
    }

    fn get(&self, path: &str) -> Value {
        let (status, v) = self.call("GET", path);
        assert_eq!(status, 200, "GET {path}: {v}");
        v
    }

    fn log_text(&self) -> String {
        self.logs.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// Waits until `check` holds for this peer's `path` (bounded), returning the last value.
    fn wait_for(&self, path: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        support::mesh::wait_until(
            PATIENCE,
            &format!("{what} ({path})"),
            // an API not reachable yet (a namespace address still settling) is "not yet"
            || match self.call("GET", path) {
                (200, v) => v,
                (status, v) => serde_json::json!({"status": status, "body": v}),
            },
            check,
            || format!("log:\n{}", self.log_text()),
        )
    }

    fn pid(&self) -> u32 {
        self.proc.child.id()
    }
}

/// The registry's API token, in no peer's configuration.
const ADMIN: &str = support::mesh::REGISTRY_ADMIN;

/// The registry (with `api.token` [`ADMIN`]) and the test network.
fn start_registry(lan: &Lan) -> Server {
    let server = launch_registry(lan, "");
    let (status, body) = api_call(
        &server,
        "POST",
        "/api/v1/mesh/networks",
        Some(&json!({"id": NETWORK, "name": "test lab", "cidr": "10.100.0.0/24"}).to_string()),
        Some(ADMIN),
    );
    assert_eq!(status, 201, "network created: {body}");
    server
}

/// The registry alone (no network yet), with `api_extra` (YAML flow-map entries, e.g.
/// `, tls: {...}`) in its `api` section.
fn launch_registry(lan: &Lan, api_extra: &str) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let token = format!(", token: {ADMIN}{api_extra}");
    let yaml = format!(
        "server:\n  http: {{ listen: \"127.0.0.1:0\" }}\n  socks5: {{ listen: \"127.0.0.1:0\" }}\n  cores: 1\n  data_dir: {data:?}\n\
         api: {{ listen: \"{}:0\"{token} }}\nlogging: {{ level: info, format: json }}\n\
         mesh:\n  registry: {{ enabled: true, lease_time: 5m }}\n",
        lan.registry_ip()
    );
    let path = dir.path().join("server.yaml");
    std::fs::write(&path, yaml).expect("write config");
    start_server_with_file(dir, path)
}

/// Pings for about five seconds (long enough for a fresh handshake): whether any reply came.
fn ping_long(ns: &str, ip: &str) -> bool {
    ping(ns, ip, 10)
}

/// The data of the next `kind` event about `peer` on the registry's event stream.
fn next_event(rt: &tokio::runtime::Runtime, ws: &mut Ws, kind: &str, peer: &str) -> Value {
    support::mesh::next_event(rt, ws, kind, peer, PATIENCE)
}

fn connected_ids(p: &Peer) -> Vec<String> {
    let mut ids: Vec<String> = p
        .get("/api/v1/mesh/peers/connected")
        .as_array()
        .expect("array")
        .iter()
        .map(|v| v["id"].as_str().unwrap_or_default().to_owned())
        .collect();
    ids.sort();
    ids
}

#[test]
fn three_peers_mesh_ping_and_tcp_across_keys_are_checked_and_leavers_are_dropped() {
    if !root_with_tools_or_skip("mesh peer namespaces", &["ip", "nsenter", "ping"]) {
        return;
    }
    let lan = Lan::new(0, 4);
    let server = start_registry(&lan);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (mut ws, _) = rt
        .block_on(tokio_tungstenite::connect_async(format!(
            "ws://{}/api/v1/mesh/networks/{NETWORK}/events?token={ADMIN}",
            server.api
        )))
        .expect("registry event stream");

    let names = ["alpha", "bravo", "charlie"];
    let peers: Vec<Peer> = names
        .iter()
        .enumerate()
        .map(|(i, n)| Peer::start(&lan, i, n, server.api))
        .collect();

    // every peer registers, gets its own address and connects to the two others
    let mut vips = Vec::new();
    for (p, name) in peers.iter().zip(names) {
        let status = p.wait_for("/api/v1/mesh/status", "connected to both others", |s| {
            s["status"] == "connected" && s["connected_peers"] == 2
        });
        assert_eq!(status["enabled"], true);
        assert_eq!(status["peer_id"], name);
        assert_eq!(status["peer_count"], 2);
        assert_eq!(status["direct_connections"], 2);
        assert_eq!(status["relayed_connections"], 0);
        assert_eq!(status["network_cidr"], "10.100.0.0/24");
        let net = p.get("/api/v1/mesh/network");
        assert_eq!(net["local_peer_id"], name);
        assert_eq!(net["virtual_ip"], status["virtual_ip"]);
        vips.push(status["virtual_ip"].as_str().expect("vip").to_owned());
    }
    let mut distinct = vips.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "distinct virtual IPs: {vips:?}");

    // ping and TCP across the mesh between every pair (TCP: the other peer's client API,
    // a multi-segment answer, compared with the same document fetched over the LAN)
    let openapi = curl(&[
        "-sS",
        "--max-time",
        "10",
        &format!("http://{}/api/v1/openapi.json", peers[0].api),
    ]);
    assert!(
        openapi.status.success() && openapi.stdout.len() > 20_000,
        "openapi over the LAN"
    );
    for (i, from) in lan.peers.iter().take(3).enumerate() {
        for (j, to) in peers.iter().enumerate() {
            if i == j {
                continue;
            }
            assert!(
                ping(from, &vips[j], 3),
                "ping {} → {}\nlog of {0}:\n{}\nlog of {1}:\n{}\n{}",
                names[i],
                names[j],
                peers[i].log_text(),
                to.log_text(),
                sh_quiet(&format!("ip -n {from} addr; ip -n {from} route"))
            );
            let url = format!("http://{}:{}/api/v1/openapi.json", vips[j], to.api.port());
            let out = curl_in(from, 20, &url);
            assert!(
                out.status.success(),
                "TCP {} → {}: {}",
                names[i],
                names[j],
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                out.stdout == openapi.stdout,
                "TCP {} → {}: the document arrived changed",
                names[i],
                names[j]
            );
        }
    }

    // the client API shows the peers connected, with measured latency and traffic
    for (i, p) in peers.iter().enumerate() {
        let list = p.wait_for("/api/v1/mesh/peers/connected", "latency measured", |v| {
            v.as_array().is_some_and(|a| {
                a.len() == 2 && a.iter().all(|x| x["latency_ms"].as_u64() >= Some(1))
            })
        });
        for v in list.as_array().expect("array") {
            assert_eq!(v["status"], "connected", "{v}");
            assert_eq!(v["connection_type"], "direct", "{v}");
            assert!(
                v["bytes_sent"].as_u64() > Some(20_000)
                    || v["bytes_received"].as_u64() > Some(20_000),
                "{v}"
            );
            assert!(
                v["bytes_sent"].as_u64() > Some(0) && v["bytes_received"].as_u64() > Some(0),
                "{v}"
            );
            assert_ne!(v["id"], names[i]);
            assert_eq!(v["endpoints"][0]["type"], "lan", "{v}");
        }
        let routes = p.get("/api/v1/mesh/routes");
        let routes = routes.as_array().expect("routes");
        assert_eq!(routes.len(), 2, "{routes:?}");
        for r in routes {
            assert_eq!(
                (
                    r["type"].as_str(),
                    r["next_hop"].as_str(),
                    r["hop_count"].as_u64()
                ),
                (Some("direct"), Some(""), Some(1)),
                "{r}"
            );
            assert_eq!(
                r["metric"].as_u64(),
                r["latency_ms"].as_u64().map(|l| l + 100),
                "{r}"
            );
            assert_eq!(r["active"], true);
        }
        let stats = p.get("/api/v1/mesh/stats");
        assert!(
            stats["packets_sent"].as_u64() > Some(0) && stats["bytes_received"].as_u64() > Some(0),
            "{stats}"
        );
        let one = p.get(&format!("/api/v1/mesh/peers/{}", names[(i + 1) % 3]));
        assert_eq!(one["virtual_ip"], vips[(i + 1) % 3]);
        assert_eq!(p.call("GET", "/api/v1/mesh/peers/nobody").0, 404);
    }
    // the registry shows what the peers measured (heartbeat bodies)
    let deadline = Instant::now() + PATIENCE;
    loop {
        let listed = support::mesh::registry_get(
            server.api,
            &format!("/api/v1/mesh/networks/{NETWORK}/peers/alpha"),
        );
        let reported = listed["connection_type"] == "direct"
            && listed["latency"].as_f64().is_some_and(|l| l > 0.0)
            && listed["bytes_sent"].as_u64() > Some(0)
            && listed["bytes_received"].as_u64() > Some(0);
        if reported {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "alpha's heartbeats carry its measurements: {listed}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    // a wrong key cannot talk: mallory joins properly, then the registry lists another key
    // for it. alpha restarts its peer (fresh sessions): it follows the registry, so mallory's
    // real key no longer opens a session, in either direction
    let mallory = Peer::start(&lan, 3, "mallory", server.api);
    mallory.wait_for("/api/v1/mesh/status", "mallory connected", |s| {
        s["connected_peers"] == 3
    });
    let mallory_vip = mallory.get("/api/v1/mesh/status")["virtual_ip"]
        .as_str()
        .expect("vip")
        .to_owned();
    assert!(
        ping(&lan.peers[0], &mallory_vip, 2),
        "mallory reachable with its registered key"
    );
    let entry = support::mesh::registry_get(
        server.api,
        &format!("/api/v1/mesh/networks/{NETWORK}/peers/mallory"),
    );
    let (status, _) = api_call(
        &server,
        "DELETE",
        &format!("/api/v1/mesh/networks/{NETWORK}/peers/mallory"),
        None,
        Some(ADMIN),
    );
    assert_eq!(status, 204);
    // the admin's removal: every member drops mallory's session at once (peer.left), so
    // mallory reaches nobody though its key and sessions were good a moment ago
    peers[1].wait_for("/api/v1/mesh/peers", "bravo dropped mallory", |v| {
        v.as_array()
            .is_some_and(|a| a.iter().all(|x| x["id"] != "mallory"))
    });
    // (the data plane takes a new table at its next timer turn, 250 ms)
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        !ping(&lan.peers[3], &vips[1], 2),
        "mallory → bravo after the admin removed mallory"
    );
    let forged = json!({"network_id": NETWORK, "peer": {"id": "mallory", "name": "mallory",
        "public_key": FORGED_KEY, "endpoints": entry["endpoints"]}});
    let (status, body) = api_call(
        &server,
        "POST",
        &format!("/api/v1/mesh/networks/{NETWORK}/peers"),
        Some(&forged.to_string()),
        Some(ADMIN),
    );
    assert_eq!(status, 201, "{body}");
    assert_eq!(peers[0].call("POST", "/api/v1/mesh/disable").0, 200);
    assert_eq!(peers[0].call("POST", "/api/v1/mesh/enable").0, 200);
    peers[0].wait_for(
        "/api/v1/mesh/status",
        "alpha back with bravo and charlie",
        |s| s["status"] == "connected" && s["connected_peers"] == 2 && s["peer_count"] == 3,
    );
    let alpha_vip = peers[0].get("/api/v1/mesh/status")["virtual_ip"]
        .as_str()
        .expect("vip")
        .to_owned();
    assert_eq!(
        peers[0].get("/api/v1/mesh/peers/mallory")["public_key"],
        FORGED_KEY,
        "alpha knows mallory by the registry's key"
    );
    assert!(
        !ping_long(&lan.peers[3], &alpha_vip),
        "mallory → alpha with a key the registry does not list"
    );
    assert!(
        !ping(&lan.peers[0], &mallory_vip, 3),
        "alpha → mallory under the listed (wrong) key"
    );
    assert_ne!(
        peers[0].get("/api/v1/mesh/peers/mallory")["status"],
        "connected"
    );
    assert!(
        ping(&lan.peers[1], &alpha_vip, 2),
        "bravo → alpha unaffected"
    );
    vips[0] = alpha_vip;
    drop(mallory);

    // disable and enable at runtime: charlie leaves (peer.left) and comes back
    let (status, body) = peers[2].call("POST", "/api/v1/mesh/disable");
    assert_eq!((status, body["status"].as_str()), (200, Some("disabled")));
    next_event(&rt, &mut ws, "peer.left", "charlie");
    assert_eq!(peers[2].get("/api/v1/mesh/status")["status"], "disabled");
    assert!(
        !ping(&lan.peers[0], &vips[2], 1),
        "a disabled peer does not answer"
    );
    let (status, body) = peers[2].call("POST", "/api/v1/mesh/enable");
    assert_eq!((status, body["status"].as_str()), (200, Some("enabled")));
    next_event(&rt, &mut ws, "peer.joined", "charlie");
    peers[2].wait_for("/api/v1/mesh/status", "charlie back", |s| {
        s["connected_peers"] == 2
    });
    let vip = peers[2].get("/api/v1/mesh/status")["virtual_ip"]
        .as_str()
        .expect("vip")
        .to_owned();
    assert!(
        ping(&lan.peers[0], &vip, 3),
        "alpha → charlie after re-enabling"
    );

    // a peer that stops (SIGTERM) leaves: peer.left, and the others drop it
    sh(&format!("kill -TERM {}", peers[1].pid()));
    next_event(&rt, &mut ws, "peer.left", "bravo");
    for p in [&peers[0], &peers[2]] {
        p.wait_for("/api/v1/mesh/peers", "bravo dropped", |v| {
            v.as_array()
                .is_some_and(|a| a.iter().all(|x| x["id"] != "bravo"))
        });
        assert_eq!(p.call("GET", "/api/v1/mesh/peers/bravo").0, 404);
        assert!(!connected_ids(p).contains(&"bravo".to_owned()));
    }
}

#[test]
fn tap_mode_carries_arp_and_ip_between_two_peers() {
    if !root_with_tools_or_skip("mesh peer namespaces", &["ip", "nsenter", "ping"]) {
        return;
    }
    let lan = Lan::new(1, 2);
    let server = start_registry(&lan);
    let peers: Vec<Peer> = ["left", "right"]
        .iter()
        .enumerate()
        .map(|(i, n)| Peer::start_with(&lan, i, n, server.api, "tap"))
        .collect();
    let mut vips = Vec::new();
    for p in &peers {
        let s = p.wait_for("/api/v1/mesh/status", "connected", |s| {
            s["status"] == "connected" && s["connected_peers"] == 1
        });
        vips.push(s["virtual_ip"].as_str().expect("vip").to_owned());
    }
    // the device is layer 2 with the MAC the peer publishes
    let right_mac = peers[0].get("/api/v1/mesh/peers/right")["virtual_mac"]
        .as_str()
        .expect("mac")
        .to_owned();
    assert_eq!(right_mac.len(), 17, "{right_mac}");
    let link = sh(&format!("ip -n {} link show symesh0", lan.peers[1]));
    assert!(
        link.contains("link/ether") && link.contains(&right_mac),
        "{link}"
    );
    // ping needs ARP first: the broadcast request crosses the mesh, the answer comes back
    for (i, j) in [(0, 1), (1, 0)] {
        assert!(
            ping(&lan.peers[i], &vips[j], 3),
            "ping over TAP {i} → {j}\n{}\n{}",
            peers[i].log_text(),
            peers[j].log_text()
        );
    }
    let neigh = sh(&format!("ip -n {} neigh show dev symesh0", lan.peers[0]));
    assert!(
        neigh.contains(&vips[1]) && neigh.contains(&right_mac),
        "left learnt right's MAC by ARP across the mesh: {neigh}"
    );
    // and TCP: right's client API over the mesh
    let url = format!(
        "http://{}:{}/api/v1/mesh/status",
        vips[1],
        peers[1].api.port()
    );
    let out = curl_in(&lan.peers[0], 10, &url);
    let status: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        status["peer_id"],
        "right",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A second bridge (its own hub namespace and host-side veth) that moves the LAN's peer
/// `moved` over to it and adds a second leg (`eth1`) to peer `leg`: `moved` then reaches the
/// registry only through the host and the other peers only through `leg`. Removed on drop.
struct SecondBridge {
    hub: String,
    host_if: String,
    net: String,
}

impl SecondBridge {
    fn new(lan: &Lan, leg: usize, moved: usize) -> SecondBridge {
        SecondBridge::named(lan, leg, moved, ("syhop", "syhg", "10.215"), 2)
    }

    /// `names`: the namespace prefix, the host-side interface prefix and the first two octets
    /// of the bridge's /24.
    fn named(
        lan: &Lan,
        leg: usize,
        moved: usize,
        names: (&str, &str, &str),
        test: u32,
    ) -> SecondBridge {
        let (prefix, short, net16) = names;
        let tag = format!("{}{test}", std::process::id() % 10_000);
        let octet = (std::process::id() * 4 + test) % 250 + 2;
        let b = SecondBridge {
            hub: format!("{prefix}{tag}g"),
            host_if: format!("{short}{tag}"),
            net: format!("{net16}.{octet}"),
        };
        let (hub, net) = (&b.hub, &b.net);
        let (leg_ns, moved_ns) = (&lan.peers[leg], &lan.peers[moved]);
        sh(&format!(
            "ip netns add {hub} && ip -n {hub} link set lo up && \
             ip -n {hub} link add br0 type bridge && ip -n {hub} link set br0 up && \
             ip link add {host} type veth peer name up0 netns {hub} && \
             ip -n {hub} link set up0 master br0 up && \
             ip addr add {net}.254/24 dev {host} && ip link set {host} up && \
             ip -n {hub} link add q0 type veth peer name eth1 netns {leg_ns} && \
             ip -n {hub} link set q0 master br0 up && \
             ip -n {leg_ns} addr add {net}.1/24 dev eth1 && ip -n {leg_ns} link set eth1 up && \
             ip -n {moved_ns} link del eth0 && \
             ip -n {hub} link add q1 type veth peer name eth0 netns {moved_ns} && \
             ip -n {hub} link set q1 master br0 up && \
             ip -n {moved_ns} addr add {net}.2/24 dev eth0 && ip -n {moved_ns} link set eth0 up && \
             ip -n {moved_ns} route add {registry}/32 via {net}.254",
            host = b.host_if,
            registry = lan.registry_ip(),
        ));
        b
    }

    /// The moved peer's address.
    fn moved_ip(&self) -> String {
        format!("{}.2", self.net)
    }
}

impl Drop for SecondBridge {
    fn drop(&mut self) {
        sh_quiet(&format!("ip netns del {}", self.hub));
        sh_quiet(&format!("ip link del {}", self.host_if));
    }
}

/// The route `from` uses for `dest`, when it has one.
fn active_route(from: &Value, dest: &str) -> Option<Value> {
    from.as_array()?
        .iter()
        .find(|r| r["dest_peer_id"] == dest && r["active"] == true)
        .cloned()
}

#[test]
fn a_peer_behind_another_is_reached_across_two_hops_and_withdrawn_when_the_middle_leaves() {
    if !root_with_tools_or_skip("mesh peer namespaces", &["ip", "nsenter", "ping", "curl"]) {
        return;
    }
    // alpha and bravo share a LAN; charlie's underlay reaches only bravo (and the registry
    // through the host): alpha ⇄ charlie must go alpha → bravo → charlie
    let lan = Lan::named("syhop", "syhopi", "10.213", 2, 3);
    let second = SecondBridge::new(&lan, 1, 2);
    let server = start_registry(&lan);
    let start = |i: usize, ip: &str, name: &str, relay: bool| {
        Peer::launch(&lan.peers[i], ip, name, server.api, "tun", relay)
    };
    // only bravo relays: alpha and charlie take each other's packets from bravo's session
    // because their route to the other goes through it
    let alpha = start(0, &lan.lan_ip(0), "alpha", false);
    let bravo = start(1, &lan.lan_ip(1), "bravo", true);
    let charlie = start(2, &second.moved_ip(), "charlie", false);
    let vip = |p: &Peer| {
        p.wait_for("/api/v1/mesh/status", "a virtual IP", |s| {
            s["virtual_ip"].as_str().is_some_and(|v| !v.is_empty())
        })["virtual_ip"]
            .as_str()
            .expect("vip")
            .to_owned()
    };
    let (alpha_vip, charlie_vip) = (vip(&alpha), vip(&charlie));
    bravo.wait_for("/api/v1/mesh/status", "bravo has both sessions", |s| {
        s["direct_connections"] == 2
    });

    // both ends learn the other through bravo: relayed, two links, metric = latency + 200
    for (p, other) in [(&alpha, "charlie"), (&charlie, "alpha")] {
        let routes = p.wait_for("/api/v1/mesh/routes", "a route via bravo", |v| {
            active_route(v, other).is_some_and(|r| r["type"] == "relayed")
        });
        let r = active_route(&routes, other).expect("route");
        assert_eq!(
            (r["next_hop"].as_str(), r["hop_count"].as_u64()),
            (Some("bravo"), Some(2)),
            "{r}"
        );
        assert_eq!(
            r["metric"].as_u64(),
            r["latency_ms"].as_u64().map(|l| l + 200),
            "{r}"
        );
        let direct = active_route(&routes, "bravo").expect("route to bravo");
        assert_eq!(
            (direct["type"].as_str(), direct["hop_count"].as_u64()),
            (Some("direct"), Some(1))
        );
        let seen = p.get(&format!("/api/v1/mesh/peers/{other}"));
        assert_eq!(
            (seen["status"].as_str(), seen["connection_type"].as_str()),
            (Some("connected"), Some("multi-hop")),
            "{seen}"
        );
        assert_eq!(p.get("/api/v1/mesh/status")["direct_connections"], 1);
    }
    // the underlay really has no path between alpha and charlie
    assert!(
        !ping(&lan.peers[0], &second.moved_ip(), 1),
        "alpha's underlay reaches charlie"
    );

    // ping both ways and TCP (charlie's client API, a multi-segment document) across two hops
    assert!(
        ping(&lan.peers[0], &charlie_vip, 3),
        "ping alpha → charlie\nalpha:\n{}\nbravo:\n{}",
        alpha.log_text(),
        bravo.log_text()
    );
    assert!(ping(&lan.peers[2], &alpha_vip, 3), "ping charlie → alpha");
    // the relayed way carries 60 bytes of envelope more: a packet that fills the device's
    // 1400 bytes with "don't fragment" is answered with "fragmentation needed" (mtu 1340) from
    // bravo's address, the kernel keeps that path MTU, and a 1340-byte packet crosses
    let bravo_vip = vip(&bravo);
    let (answered, said) = ping_dont_fragment(&lan.peers[0], &charlie_vip, 1400 - 28);
    assert!(
        !answered && said.contains(&format!("From {bravo_vip}")) && said.contains("mtu = 1340"),
        "{said}"
    );
    let (answered, said) = ping_dont_fragment(&lan.peers[0], &charlie_vip, 1340 - 28);
    assert!(answered, "{said}");
    assert!(alpha.get("/api/v1/mesh/stats")["drops"]["too_big_for_relay"].as_u64() >= Some(1));
    let openapi = curl(&[
        "-sS",
        "--max-time",
        "10",
        &format!("http://{}/api/v1/openapi.json", charlie.api),
    ]);
    assert!(openapi.status.success() && openapi.stdout.len() > 20_000);
    let out = curl_in(
        &lan.peers[0],
        20,
        &format!(
            "http://{charlie_vip}:{}/api/v1/openapi.json",
            charlie.api.port()
        ),
    );
    assert!(
        out.status.success() && out.stdout == openapi.stdout,
        "TCP alpha → charlie across two hops: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let relayed = bravo.get("/api/v1/mesh/peers/charlie");
    assert!(
        relayed["bytes_received"].as_u64() > Some(20_000),
        "bravo carried the document from charlie: {relayed}"
    );
    // a 4 MiB stream alpha → charlie through bravo arrives byte for byte; bravo passed it on
    // in envelopes it cannot read (alpha and charlie have their own session) and refused
    // nothing
    let logs = || {
        format!(
            "alpha:\n{}\nbravo:\n{}\ncharlie:\n{}",
            alpha.log_text(),
            bravo.log_text(),
            charlie.log_text()
        )
    };
    transfer_blob((&lan.peers[0], &alpha_vip), &lan.peers[2], 4 << 20, logs);
    let stats = bravo.get("/api/v1/mesh/stats");
    assert!(
        stats["relayed_datagrams"].as_u64() > Some(2_000),
        "bravo relayed the stream: {stats}"
    );
    assert_eq!(stats["drops"]["relay_refused"], 0, "{stats}");

    // the middle peer leaves: the route is withdrawn and charlie is out of reach
    assert_eq!(bravo.call("POST", "/api/v1/mesh/disable").0, 200);
    for (p, other) in [(&alpha, "charlie"), (&charlie, "alpha")] {
        p.wait_for("/api/v1/mesh/routes", "the route withdrawn", |v| {
            v.as_array()
                .is_some_and(|a| a.iter().all(|r| r["dest_peer_id"] != other))
        });
        // the end-to-end session's keys are still good, but it has no way: unreachable once
        // connect_timeout passed, not connected
        let seen = p.wait_for(
            &format!("/api/v1/mesh/peers/{other}"),
            "unreachable without its relay",
            |v| v["status"] == "unreachable",
        );
        assert_ne!(seen["connection_type"], "multi-hop", "{seen}");
    }
    assert!(
        !ping(&lan.peers[0], &charlie_vip, 2),
        "alpha → charlie without bravo"
    );
}

/// Receives UDP on a port inside a namespace and prints every datagram as `<payload> <source>`;
/// the extra arguments `group@interface-address` join multicast groups (IP_ADD_MEMBERSHIP),
/// which makes the kernel send IGMP reports on that interface.
const UDP_LISTENER: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
for g in sys.argv[2:]:
    group, iface = g.split("@")
    s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                 socket.inet_aton(group) + socket.inet_aton(iface))
print("ready", flush=True)
while True:
    data, src = s.recvfrom(4096)
    print(data.decode(errors="replace"), src[0], flush=True)
"#;

/// Sends `count` datagrams `<tag><n>` to `dst:port`, 50 ms apart, from `interface-address`
/// (broadcast allowed, multicast out of that interface, not looped back).
const UDP_SENDER: &str = r#"
import socket, sys, time
dst, port, iface, count, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(iface))
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
for i in range(count):
    s.sendto(("%s%d" % (tag, i)).encode(), (dst, port))
    time.sleep(0.05)
"#;

/// A UDP listener (python3) in a namespace; killed on drop.
struct Listener {
    _proc: Proc,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Listener {
    fn start(ns: &str, port: u16, groups: &[String]) -> Listener {
        use std::io::BufRead;
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns, "python3", "-u", "-c", UDP_LISTENER])
            .arg(port.to_string())
            .args(groups)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 listener");
        let stdout = child.stdout.take().expect("stdout");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (sink, (ready_tx, ready_rx)) = (lines.clone(), std::sync::mpsc::channel());
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if line == "ready" {
                    let _ = ready_tx.send(());
                } else if let Ok(mut l) = sink.lock() {
                    l.push(line);
                }
            }
        });
        ready_rx
            .recv_timeout(PATIENCE)
            .expect("the listener did not start");
        Listener {
            _proc: Proc {
                child,
                name: format!("listener in {ns}"),
            },
            lines,
        }
    }

    /// The payloads received with tag `tag` (source address dropped).
    fn received(&self, tag: &str) -> Vec<String> {
        self.lines
            .lock()
            .map(|l| {
                l.iter()
                    .filter(|x| x.starts_with(tag))
                    .map(|x| x.split(' ').next().unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits (bounded) until `n` datagrams tagged `tag` arrived; what arrived.
    fn wait_for(&self, tag: &str, n: usize) -> Vec<String> {
        let deadline = Instant::now() + PATIENCE;
        while self.received(tag).len() < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        self.received(tag)
    }
}

/// Sends `count` datagrams tagged `tag` from namespace `ns` (source `iface`) to `dst:port`.
fn send_udp(ns: &str, iface: &str, dst: &str, port: u16, count: u32, tag: &str) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "python3", "-c", UDP_SENDER, dst])
        .arg(port.to_string())
        .arg(iface)
        .arg(count.to_string())
        .arg(tag)
        .output()
        .expect("python3 sender");
    assert!(
        out.status.success(),
        "send from {ns}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Packets the peer's data plane wrote to the mesh device of namespace `ns` (the kernel's
/// receive counter of `symesh0`).
fn device_rx_packets(ns: &str) -> u64 {
    sh(&format!(
        "ip netns exec {ns} cat /sys/class/net/symesh0/statistics/rx_packets"
    ))
    .trim()
    .parse()
    .expect("rx_packets")
}

/// Sends one datagram tagged `tag` after another (200 ms apart, bounded) until `listener`
/// has one: the group or anycast membership it waits for has reached the sender's peer.
fn send_until_received(
    ns: &str,
    iface: &str,
    (dst, port): (&str, u16),
    listener: &Listener,
    tag: &str,
    what: &str,
) {
    let deadline = Instant::now() + PATIENCE;
    while listener.received(tag).is_empty() {
        assert!(Instant::now() < deadline, "{what}");
        send_udp(ns, iface, dst, port, 1, tag);
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `tag0 … tag<n-1>`: every datagram of a stream once.
fn stream(tag: &str, n: u32) -> Vec<String> {
    (0..n).map(|i| format!("{tag}{i}")).collect()
}

/// alpha and bravo on a LAN, charlie reachable only through bravo (which relays), all three
/// in `device` mode, settled: alpha and charlie route to each other via bravo.
struct TwoHops {
    peers: Vec<Peer>,
    vips: Vec<String>,
    namespaces: Vec<String>,
    server: Server,
    _second: SecondBridge,
    _lan: Lan,
}

impl TwoHops {
    fn start(test: u32, device: &str) -> TwoHops {
        let lan = Lan::named("symode", "symd", "10.216", test, 3);
        let second = SecondBridge::named(&lan, 1, 2, ("symode", "symg", "10.217"), test);
        let server = start_registry(&lan);
        let start = |i: usize, ip: &str, name: &str, relay: bool| {
            Peer::launch(&lan.peers[i], ip, name, server.api, device, relay)
        };
        let peers = vec![
            start(0, &lan.lan_ip(0), "alpha", false),
            start(1, &lan.lan_ip(1), "bravo", true),
            start(2, &second.moved_ip(), "charlie", false),
        ];
        let mut vips = Vec::new();
        for p in &peers {
            let s = p.wait_for("/api/v1/mesh/status", "all peers connected", |s| {
                s["status"] == "connected" && s["connected_peers"] == 2
            });
            vips.push(s["virtual_ip"].as_str().expect("vip").to_owned());
        }
        for (p, other) in [(&peers[0], "charlie"), (&peers[2], "alpha")] {
            p.wait_for("/api/v1/mesh/routes", "a route via bravo", |v| {
                active_route(v, other).is_some_and(|r| r["next_hop"] == "bravo")
            });
        }
        TwoHops {
            peers,
            vips,
            namespaces: lan.peers.clone(),
            server,
            _second: second,
            _lan: lan,
        }
    }

    fn modes(&self, i: usize) -> Value {
        self.peers[i].get("/api/v1/mesh/stats")["traffic_modes"].clone()
    }
}

#[test]
fn tun_broadcast_reaches_every_peer_once_multicast_only_members_and_anycast_the_closest() {
    if !root_with_tools_or_skip("mesh traffic modes", &["ip", "nsenter", "python3"]) {
        return;
    }
    let m = TwoHops::start(3, "tun");
    let ns = &m.namespaces;
    let (alpha_vip, bravo_vip, charlie_vip) = (&m.vips[0], &m.vips[1], &m.vips[2]);

    // broadcast to the network's broadcast address: bravo and charlie (two hops away) get
    // every datagram exactly once
    let (bravo, charlie) = (
        Listener::start(&ns[1], 4100, &[]),
        Listener::start(&ns[2], 4100, &[]),
    );
    send_udp(&ns[0], alpha_vip, "10.100.0.255", 4100, 10, "bc");
    let want = stream("bc", 10);
    assert_eq!(bravo.wait_for("bc", 10), want, "bravo");
    assert_eq!(charlie.wait_for("bc", 10), want, "charlie, via bravo");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(charlie.received("bc"), want, "no duplicates");
    assert_eq!(m.modes(0)["broadcast_packets_sent"], 10, "{}", m.modes(0));
    assert_eq!(m.modes(2)["broadcast_packets_received"], 10);
    // bravo passed charlie's copies on in envelopes of alpha's session with charlie
    let relayed = m.peers[1].get("/api/v1/mesh/stats")["relayed_datagrams"].as_u64();
    assert!(relayed >= Some(10), "{relayed:?}");

    // multicast: charlie joins 239.77.0.1 on its mesh device (the kernel's IGMP report tells
    // its peer), bravo does not; alpha's stream reaches charlie only
    let group = "239.77.0.1";
    let member = Listener::start(&ns[2], 4200, &[format!("{group}@{charlie_vip}")]);
    m.peers[2].wait_for("/api/v1/mesh/stats", "the group learnt from IGMP", |s| {
        s["traffic_modes"]["multicast_groups"] == 1
    });
    // the membership reaches alpha within a round trip; a stream sent meanwhile would lose
    // its first datagrams, so send a probe stream until one arrives, then the real one
    send_until_received(
        &ns[0],
        alpha_vip,
        (group, 4200),
        &member,
        "warm",
        "no multicast reached charlie",
    );
    let rx = [device_rx_packets(&ns[1]), device_rx_packets(&ns[2])];
    send_udp(&ns[0], alpha_vip, group, 4200, 10, "mc");
    assert_eq!(member.wait_for("mc", 10), stream("mc", 10));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(member.received("mc"), stream("mc", 10), "no duplicates");
    // bravo's device saw none of the stream, charlie's all of it
    let bravo_rx = device_rx_packets(&ns[1]) - rx[0];
    assert!(bravo_rx < 3, "bravo's device got {bravo_rx} packets");
    assert!(device_rx_packets(&ns[2]) - rx[1] >= 10);
    assert_eq!(
        m.modes(1)["multicast_packets_received"],
        0,
        "bravo did not join: {}",
        m.modes(1)
    );
    assert!(m.modes(2)["multicast_packets_received"].as_u64() >= Some(11));
    // charlie leaves (the socket closes: IGMP leave): alpha stops sending at all
    drop(member);
    m.peers[2].wait_for("/api/v1/mesh/stats", "the group left", |s| {
        s["traffic_modes"]["multicast_groups"] == 0
    });
    std::thread::sleep(Duration::from_secs(1));
    let before = m.modes(0)["multicast_packets_sent"].as_u64();
    send_udp(&ns[0], alpha_vip, group, 4200, 3, "gone");
    assert_eq!(m.modes(0)["multicast_packets_sent"].as_u64(), before);

    // anycast: 10.100.0.200 on bravo and charlie; alpha's datagrams go to bravo (one hop
    // closer), and to charlie once bravo drops the address
    let anycast = "10.100.0.200";
    for n in [&ns[1], &ns[2]] {
        sh(&format!("ip -n {n} addr add {anycast}/32 dev symesh0"));
    }
    let (near, far) = (
        Listener::start(&ns[1], 4300, &[]),
        Listener::start(&ns[2], 4300, &[]),
    );
    send_until_received(
        &ns[0],
        alpha_vip,
        (anycast, 4300),
        &near,
        "any",
        "no anycast reached bravo",
    );
    send_udp(&ns[0], alpha_vip, anycast, 4300, 5, "near");
    assert_eq!(near.wait_for("near", 5), stream("near", 5));
    // TCP too: the member answers from the anycast address, which alpha accepts from it
    let url = format!(
        "http://{anycast}:{}/api/v1/mesh/status",
        m.peers[1].api.port()
    );
    let out = curl_in(&ns[0], 10, &url);
    let status: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        status["peer_id"],
        "bravo",
        "TCP to the anycast address: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // once bravo answers for the address, nothing goes to charlie (the probes sent while the
    // memberships were still being announced may have reached either member)
    assert!(
        far.received("near").is_empty(),
        "charlie got {:?}",
        far.received("near")
    );
    sh(&format!(
        "ip -n {} addr del {anycast}/32 dev symesh0",
        ns[1]
    ));
    send_until_received(
        &ns[0],
        alpha_vip,
        (anycast, 4300),
        &far,
        "moved",
        "anycast did not move to charlie",
    );
    send_udp(&ns[0], alpha_vip, anycast, 4300, 5, "far");
    assert_eq!(far.wait_for("far", 5), stream("far", 5));
    assert!(near.received("far").is_empty());
    assert!(m.modes(2)["anycast_packets_received"].as_u64() >= Some(6));
    assert_eq!(m.modes(2)["anycast_addresses"], 1);
    // unicast is unchanged: ping across two hops
    assert!(ping(&ns[0], charlie_vip, 2), "alpha → charlie");
    assert!(ping(&ns[0], bravo_vip, 2), "alpha → bravo");

    // the registry hears how each peer reaches the others: alpha and charlie reach one peer
    // through bravo (multi-hop), bravo has sessions with both (direct)
    let deadline = Instant::now() + PATIENCE;
    loop {
        let kind = |id: &str| {
            support::mesh::registry_get(
                m.server.api,
                &format!("/api/v1/mesh/networks/{NETWORK}/peers/{id}"),
            )["connection_type"]
                .clone()
        };
        let seen = [kind("alpha"), kind("bravo"), kind("charlie")];
        if seen == ["multi-hop", "direct", "multi-hop"] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "heartbeat connection types: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn tap_arp_and_broadcast_frames_cross_two_hops_through_the_flood_tree() {
    if !root_with_tools_or_skip("mesh TAP modes", &["ip", "nsenter", "ping", "python3"]) {
        return;
    }
    let m = TwoHops::start(4, "tap");
    let ns = &m.namespaces;
    // no IPv6 chatter (router solicitations, MLD) on the TAP devices: the device counters
    // below count the test's frames only
    for n in ns {
        sh(&format!(
            "ip netns exec {n} sysctl -qw net.ipv6.conf.symesh0.disable_ipv6=1"
        ));
    }
    // ARP across the mesh: the broadcast request goes down the flood tree (charlie's over
    // two hops), the unicast reply to the learnt MAC through bravo
    for (i, j) in [(0, 1), (0, 2), (2, 0)] {
        assert!(
            ping(&ns[i], &m.vips[j], 3),
            "ping over TAP {i} → {j}\n{}",
            m.peers[i].log_text()
        );
    }
    let charlie_mac = m.peers[0].get("/api/v1/mesh/peers/charlie")["virtual_mac"]
        .as_str()
        .expect("mac")
        .to_owned();
    let neigh = sh(&format!("ip -n {} neigh show dev symesh0", ns[0]));
    assert!(
        neigh.contains(&m.vips[2]) && neigh.contains(&charlie_mac),
        "alpha learnt charlie's MAC by ARP across two hops: {neigh}"
    );
    // with the MACs learnt, unicast frames are not flooded: bravo's device sees none of
    // alpha ⇄ charlie's pings (it only relays their EtherIP packets)
    let rx = device_rx_packets(&ns[1]);
    assert!(ping(&ns[0], &m.vips[2], 5), "ping alpha → charlie");
    let bravo_rx = device_rx_packets(&ns[1]) - rx;
    assert!(bravo_rx < 3, "bravo's device got {bravo_rx} frames");
    // a broadcast frame (UDP to the network's broadcast address) reaches both, once
    let (bravo, charlie) = (
        Listener::start(&ns[1], 4400, &[]),
        Listener::start(&ns[2], 4400, &[]),
    );
    send_udp(&ns[0], &m.vips[0], "10.100.0.255", 4400, 10, "frame");
    let want = stream("frame", 10);
    assert_eq!(bravo.wait_for("frame", 10), want);
    assert_eq!(charlie.wait_for("frame", 10), want);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(charlie.received("frame"), want, "no duplicates");
    assert!(m.modes(2)["broadcast_packets_received"].as_u64() >= Some(10));
    // a multicast frame stream reaches only the member (IGMP frames on the TAP device)
    let member = Listener::start(&ns[2], 4500, &[format!("239.77.0.2@{}", m.vips[2])]);
    send_until_received(
        &ns[0],
        &m.vips[0],
        ("239.77.0.2", 4500),
        &member,
        "warm",
        "no multicast frame reached charlie",
    );
    let rx = device_rx_packets(&ns[1]);
    send_udp(&ns[0], &m.vips[0], "239.77.0.2", 4500, 10, "mc");
    assert_eq!(member.wait_for("mc", 10), stream("mc", 10));
    let bravo_rx = device_rx_packets(&ns[1]) - rx;
    assert!(bravo_rx < 3, "bravo's device got {bravo_rx} frames");
    assert_eq!(
        m.modes(1)["multicast_packets_received"],
        0,
        "{}",
        m.modes(1)
    );
}

#[test]
fn a_registry_restart_keeps_the_peers_addresses_and_the_mesh_running() {
    if !root_with_tools_or_skip("mesh registry restart", &["ip", "nsenter", "ping"]) {
        return;
    }
    let lan = Lan::named("symode", "symd", "10.216", 5, 2);
    // The registry has an admin token the peers never see: each joins with a single-use
    // enrollment key and then uses its own credential, across the registry's restart.
    let server = start_registry(&lan);
    // the peers know the registry by address and port: pin the port for the second start
    let config = std::fs::read_to_string(&server.config_path).expect("config");
    let pinned = config.replace(&format!("{}:0", lan.registry_ip()), &server.api.to_string());
    std::fs::write(&server.config_path, pinned).expect("pin the API port");
    let peers: Vec<Peer> = ["left", "right"]
        .iter()
        .enumerate()
        .map(|(i, n)| Peer::start(&lan, i, n, server.api))
        .collect();
    let vip = |p: &Peer| {
        p.wait_for("/api/v1/mesh/status", "connected", |s| {
            s["status"] == "connected" && s["connected_peers"] == 1
        })["virtual_ip"]
            .as_str()
            .expect("vip")
            .to_owned()
    };
    let vips: Vec<String> = peers.iter().map(vip).collect();
    assert!(ping(&lan.peers[0], &vips[1], 2), "ping before the restart");

    // stop the registry (same SQLite file) and start it again on the same port
    let Server {
        proc,
        dir,
        config_path,
        ..
    } = server;
    drop(proc);
    let stopped = chrono::Utc::now();
    assert!(
        ping(&lan.peers[0], &vips[1], 2),
        "the mesh runs without the registry"
    );
    let server = start_server_with_file(dir, config_path);
    for (p, (name, vip)) in peers.iter().zip(["left", "right"].iter().zip(&vips)) {
        // a heartbeat answered 204 again moves last_seen past the restart, same address
        let deadline = Instant::now() + PATIENCE;
        loop {
            let path = format!("/api/v1/mesh/networks/{NETWORK}/peers/{name}");
            let (_, listed) = api_call(&server, "GET", &path, None, Some(ADMIN));
            let renewed = listed["last_seen"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .is_some_and(|t| t > stopped);
            if renewed {
                assert_eq!(listed["virtual_ip"], *vip, "{listed}");
                break;
            }
            assert!(Instant::now() < deadline, "{name}'s heartbeats: {listed}");
            std::thread::sleep(Duration::from_millis(250));
        }
        let status = p.get("/api/v1/mesh/status");
        assert_eq!(
            (status["status"].as_str(), status["virtual_ip"].as_str()),
            (Some("connected"), Some(vip.as_str())),
            "{status}"
        );
        assert!(
            !p.log_text().contains("registering again"),
            "{name} did not have to register again:\n{}",
            p.log_text()
        );
    }
    assert!(ping(&lan.peers[0], &vips[1], 2), "ping after the restart");
    assert!(ping(&lan.peers[1], &vips[0], 2));
    // every key was used once, and no peer holds the admin token
    let (_, keys) = api_call(
        &server,
        "GET",
        &format!("/api/v1/mesh/networks/{NETWORK}/enrollment-keys"),
        None,
        Some(ADMIN),
    );
    assert_eq!(keys["keys"], json!([]), "{keys}");
    for p in &peers {
        let data = p._dir.path().join("data");
        let token = std::fs::read_to_string(data.join("mesh.peer-token")).expect("peer token");
        assert!(token.starts_with("sypt_"), "{token}");
        let mode = std::fs::metadata(data.join("mesh.peer-token"))
            .expect("meta")
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let config = std::fs::read_to_string(p._dir.path().join("client.yaml")).expect("config");
        assert!(!config.contains(ADMIN), "{config}");
    }
    // the admin removes `right`: its credential goes with it, and its status says so
    let (status, _) = api_call(
        &server,
        "DELETE",
        &format!("/api/v1/mesh/networks/{NETWORK}/peers/right"),
        None,
        Some(ADMIN),
    );
    assert_eq!(status, 204);
    peers[1].wait_for("/api/v1/mesh/status", "right's credential refused", |s| {
        s["status"] == "error"
    });
    assert!(
        peers[1].log_text().contains("answered 401"),
        "{}",
        peers[1].log_text()
    );
}

/// Issue 28: an https registry with a self-signed certificate, pinned by its SHA-256
/// fingerprint (`mesh.discovery.fingerprint`, the QUIC transport's form). Two peers join with
/// the right pin and follow the registry's events over wss:// (the second one's `peer.joined`
/// reaches the first through the stream); a peer with a wrong pin is refused at the TLS
/// handshake, says so in its log and status, and never joins.
#[test]
fn peers_join_an_https_registry_pinned_by_fingerprint_and_follow_its_events_over_wss() {
    if !root_with_tools_or_skip("mesh https registry", &["ip", "nsenter", "ping"]) {
        return;
    }
    let lan = Lan::named("symtls", "symtl", "10.222", 6, 3);
    let certs = tempfile::tempdir().expect("tempdir");
    let generated =
        rcgen::generate_simple_self_signed(vec![lan.registry_ip()]).expect("certificate");
    let (cert, key) = (certs.path().join("api.crt"), certs.path().join("api.key"));
    std::fs::write(&cert, generated.cert.pem()).expect("cert");
    std::fs::write(&key, generated.signing_key.serialize_pem()).expect("key");
    use switchyard_dataplane::quic::tls::{fingerprint_of, format_fingerprint};
    let pin = format_fingerprint(&fingerprint_of(generated.cert.der()));
    let server = launch_registry(&lan, &format!(", tls: {{cert: {cert:?}, key: {key:?}}}"));
    let base = format!("https://{}", server.api);
    create_network_at(&base);
    let join = |i: usize, name: &str, pin: &str| {
        let key = support::mesh::single_use_key_at(&base, NETWORK);
        let discovery =
            format!("server: \"{base}\", fingerprint: \"{pin}\", enrollment_key: {key}");
        Peer::launch_with(
            &lan.peers[i],
            &lan.lan_ip(i),
            name,
            &discovery,
            "tun",
            false,
            &[],
        )
    };
    let _joined = two_peers_join_and_follow_events(&lan, |i, name| join(i, name, &pin));

    let mut wrong_pin = pin.clone();
    wrong_pin.replace_range(..2, if pin.starts_with("00") { "11" } else { "00" });
    let outsider = join(2, "outsider", &wrong_pin);
    never_joins(
        &base,
        &outsider,
        &format!("does not match the pinned {wrong_pin}"),
    );
}

/// The network [`NETWORK`] on the https registry at `base`, made by its admin.
fn create_network_at(base: &str) {
    let (status, body) = support::mesh::admin_call(
        base,
        "POST",
        "/api/v1/mesh/networks",
        Some(json!({"id": NETWORK, "name": "test lab", "cidr": "10.100.0.0/24"})),
    );
    assert_eq!(status, 201, "network created: {body}");
}

/// Peers "left" and "right" (namespaces 0 and 1, started by `join`) join an https registry:
/// left reaches right, and left's event stream (wss:// under an https registry) announces
/// right's `peer.joined`.
fn two_peers_join_and_follow_events(lan: &Lan, join: impl Fn(usize, &str) -> Peer) -> [Peer; 2] {
    let left = join(0, "left");
    left.wait_for("/api/v1/mesh/status", "left registered", |s| {
        s["status"] == "connected"
    });
    let right = join(1, "right");
    let vip = right.wait_for("/api/v1/mesh/status", "right connected", |s| {
        s["status"] == "connected" && s["connected_peers"] == 1
    })["virtual_ip"]
        .as_str()
        .expect("vip")
        .to_owned();
    assert!(ping(&lan.peers[0], &vip, 3), "left reaches right");
    support::mesh::wait_until(
        PATIENCE,
        "left's event stream announces right",
        || json!(left.log_text()),
        |log| {
            log.as_str().is_some_and(|l| {
                l.lines().any(|l| {
                    l.contains("mesh event") && l.contains("peer.joined") && l.contains("right")
                })
            })
        },
        String::new,
    );
    [left, right]
}

/// `outsider` is refused by the https registry at `base` at the TLS handshake: its status
/// turns `error` with `refusal` as the reason, its log warns with it, and the registry lists
/// the two other peers only.
fn never_joins(base: &str, outsider: &Peer, refusal: &str) {
    outsider.wait_for(
        "/api/v1/mesh/status",
        "the registry refused, and why",
        |s| s["status"] == "error" && s["error"].as_str().is_some_and(|e| e.contains(refusal)),
    );
    assert!(
        outsider
            .log_text()
            .lines()
            .any(|l| l.contains("WARN") && l.contains(refusal)),
        "{}",
        outsider.log_text()
    );
    let (_, listed) = support::mesh::admin_call(
        base,
        "GET",
        &format!("/api/v1/mesh/networks/{NETWORK}/peers"),
        None,
    );
    let ids: Vec<&str> = listed["peers"]
        .as_array()
        .expect("peers")
        .iter()
        .filter_map(|p| p["id"].as_str())
        .collect();
    assert_eq!(ids.len(), 2, "{listed}");
    assert!(!ids.contains(&"outsider"), "{listed}");
}

/// A CA of its own for a test (a self-signed certificate that may sign others).
fn test_ca(name: &str) -> rcgen::CertifiedIssuer<'static, rcgen::KeyPair> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let key = rcgen::KeyPair::generate().expect("CA key");
    rcgen::CertifiedIssuer::self_signed(params, key).expect("CA certificate")
}

/// Issue 28: an https registry whose certificate a CA signed, with no fingerprint pinned —
/// the peers' CA roots decide (rustls-platform-verifier: on Linux rustls-native-certs, which
/// takes `SSL_CERT_FILE` / `SSL_CERT_DIR` over the system's bundle). Two peers whose roots hold
/// that CA join and follow the registry's events over wss://; a peer whose roots are another
/// CA is refused at the handshake, says in its log that the certificate is not trusted and
/// why, and never joins.
#[test]
fn peers_trust_an_https_registry_through_their_ca_roots_and_refuse_it_without_its_ca() {
    if !root_with_tools_or_skip("mesh https registry", &["ip", "nsenter", "ping"]) {
        return;
    }
    let lan = Lan::named("syroot", "syrt", "10.225", 8, 3);
    let certs = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| certs.path().join(name);
    let ca = test_ca("switchyard registry test CA");
    let mut params = rcgen::CertificateParams::new(vec![lan.registry_ip()]).expect("params");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, &ca).expect("server certificate");
    std::fs::write(path("api.crt"), cert.pem()).expect("cert");
    std::fs::write(path("api.key"), key.serialize_pem()).expect("key");
    std::fs::write(path("ca.pem"), ca.pem()).expect("CA");
    std::fs::write(path("other-ca.pem"), test_ca("another CA").pem()).expect("other CA");
    let server = launch_registry(
        &lan,
        &format!(
            ", tls: {{cert: {:?}, key: {:?}}}",
            path("api.crt"),
            path("api.key")
        ),
    );
    let base = format!("https://{}", server.api);
    create_network_at(&base);
    // no fingerprint: the CA roots in SSL_CERT_FILE decide
    let join = |i: usize, name: &str, roots: &std::path::Path| {
        let key = support::mesh::single_use_key_at(&base, NETWORK);
        let discovery = format!("server: \"{base}\", enrollment_key: {key}");
        Peer::launch_with(
            &lan.peers[i],
            &lan.lan_ip(i),
            name,
            &discovery,
            "tun",
            false,
            &[("SSL_CERT_FILE", roots)],
        )
    };
    let _joined = two_peers_join_and_follow_events(&lan, |i, name| join(i, name, &path("ca.pem")));

    let outsider = join(2, "outsider", &path("other-ca.pem"));
    never_joins(
        &base,
        &outsider,
        "presented a certificate this peer does not trust: it is not issued by a CA among \
         this peer's roots (SSL_CERT_FILE",
    );
}

/// A bulk TCP transfer across the mesh arrives byte for byte: what the batched data path
/// carries as TSO super-packets cut into segments, UDP GSO/GRO trains and segments joined
/// again for the receiving device (python3's http.server in one peer's namespace, curl in
/// the other's).
#[test]
fn a_bulk_tcp_transfer_crosses_the_batched_data_path_intact() {
    if !root_with_tools_or_skip(
        "mesh peer namespaces",
        &["ip", "nsenter", "curl", "python3"],
    ) {
        return;
    }
    let lan = Lan::named("symfast", "symfs", "10.221", 3, 2);
    let server = start_registry(&lan);
    let peers: Vec<Peer> = ["sender", "receiver"]
        .iter()
        .enumerate()
        .map(|(i, n)| Peer::start(&lan, i, n, server.api))
        .collect();
    let mut vips = Vec::new();
    for p in &peers {
        let s = p.wait_for("/api/v1/mesh/status", "connected", |s| {
            s["status"] == "connected" && s["connected_peers"] == 1
        });
        vips.push(s["virtual_ip"].as_str().expect("vip").to_owned());
    }
    let logs = || format!("{}\n{}", peers[0].log_text(), peers[1].log_text());
    transfer_blob((&lan.peers[0], &vips[0]), &lan.peers[1], 8 << 20, logs);
}

/// Serves `size` bytes without a repeating pattern (xorshift, so a misplaced segment shows)
/// over HTTP at `server`'s (namespace, virtual IP) and downloads them with curl in namespace
/// `client`; asserts they arrived byte for byte (`logs` for the failure message).
fn transfer_blob(server: (&str, &str), client: &str, size: usize, logs: impl Fn() -> String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut blob = vec![0u8; size];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for b in blob.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let served = dir.path().join("served");
    std::fs::create_dir(&served).expect("dir");
    std::fs::write(served.join("blob"), &blob).expect("write blob");
    let mut http = Command::new("ip")
        .args(["netns", "exec", server.0, "python3", "-m", "http.server"])
        .args(["--bind", server.1, "--directory"])
        .arg(&served)
        .arg("8080")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3 http.server");
    let url = format!("http://{}:8080/blob", server.1);
    let got = dir.path().join("got");
    let mut last = None;
    for _ in 0..40 {
        let out = Command::new("ip")
            .args(["netns", "exec", client, "curl", "-sS", "--max-time", "30"])
            .arg("-o")
            .arg(&got)
            .arg(&url)
            .output()
            .expect("curl");
        let done = out.status.success();
        last = Some(out);
        if done {
            break;
        }
        // the server may not listen yet
        std::thread::sleep(Duration::from_millis(250));
    }
    let _ = http.kill();
    let _ = http.wait();
    let out = last.expect("curl ran");
    assert!(
        out.status.success(),
        "bulk download over the mesh: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        logs()
    );
    let received = std::fs::read(&got).expect("downloaded file");
    assert_eq!(received.len(), blob.len(), "bytes received");
    assert!(received == blob, "the bytes arrived changed");
}

/// Issue 28's malicious member "mallory" in namespace `lan.peers[at]`: enrolled with a
/// single-use enrollment key and its own X25519 key, like any peer, and holding a real session
/// with `victim` (the peer in `lan.peers[index]`).
fn enroll_mallory(
    lan: &Lan,
    server: &Server,
    at: usize,
    (victim, index): (&Peer, usize),
) -> support::mesh_member::Member {
    use support::mesh_member::{key_from_base64, udp_socket_in, Member};
    let socket = udp_socket_in(&lan.peers[at]);
    let port = socket.local_addr().expect("addr").port();
    let secret = boringtun::x25519::StaticSecret::from([0x4d; 32]);
    let body = json!({"network_id": NETWORK, "peer": {"id": "mallory", "name": "mallory",
        "public_key": Member::public_key_of(&secret),
        "endpoints": [{"address": lan.lan_ip(at), "port": port, "type": "lan", "priority": 1}]}});
    let key = support::mesh::single_use_key(server.api, NETWORK);
    let (status, reg) = api_call(
        server,
        "POST",
        &format!("/api/v1/mesh/networks/{NETWORK}/peers"),
        Some(&body.to_string()),
        Some(&key),
    );
    assert_eq!(status, 201, "{reg}");
    let mallory_vip = reg["virtual_ip"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("mallory's vip");
    let victim_id = victim.get("/api/v1/mesh/status")["peer_id"]
        .as_str()
        .expect("peer id")
        .to_owned();
    let entry = support::mesh::registry_get(
        server.api,
        &format!("/api/v1/mesh/networks/{NETWORK}/peers/{victim_id}"),
    );
    let victim_ip = lan.lan_ip(index);
    let victim_at: SocketAddr = entry["endpoints"]
        .as_array()
        .and_then(|l| l.iter().find(|e| e["address"] == victim_ip))
        .map(|e| format!("{victim_ip}:{}", e["port"]))
        .and_then(|a| a.parse().ok())
        .expect("the victim's LAN endpoint");
    let victim_key = key_from_base64(entry["public_key"].as_str().expect("key"));
    let mut m = Member::new(
        "mallory",
        socket,
        secret,
        mallory_vip,
        victim_at,
        victim_key,
        Some(key_from_base64(PSK)),
    );
    victim.wait_for(
        "/api/v1/mesh/peers/mallory",
        "the victim lists mallory",
        |p| p["id"] == "mallory",
    );
    assert!(m.connect(PATIENCE), "mallory's session with {victim_id}");
    m
}

/// Issue 28's malicious member: mallory enrolls with its own key like any peer and holds a
/// real session with alpha, then lies in the mesh protocol. Each lie fails and is counted in
/// alpha's `drops`; alpha and bravo keep talking throughout, and mallory never receives a
/// packet meant for bravo or for an anycast address it claimed.
#[test]
fn a_malicious_member_with_a_valid_key_draws_no_traffic_and_speaks_for_nobody() {
    use std::net::Ipv4Addr;
    use switchyard_dataplane::mesh::wire;
    use switchyard_mesh_routing::wire::{Announcement, Flood, Membership, RouteEntry};
    use switchyard_mesh_routing::{FloodMode, Message};

    if !root_with_tools_or_skip(
        "mesh peer namespaces",
        &["ip", "nsenter", "ping", "python3"],
    ) {
        return;
    }
    let lan = Lan::named("syevil", "syevl", "10.223", 6, 3);
    let server = start_registry(&lan);
    let alpha = Peer::start(&lan, 0, "alpha", server.api);
    let bravo = Peer::start(&lan, 1, "bravo", server.api);
    let vip_of = |p: &Peer| -> Ipv4Addr {
        let s = p.wait_for("/api/v1/mesh/status", "connected", |s| {
            s["connected_peers"] == 1
        });
        s["virtual_ip"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .expect("vip")
    };
    let (alpha_vip, bravo_vip) = (vip_of(&alpha), vip_of(&bravo));

    let mut m = enroll_mallory(&lan, &server, 2, (&alpha, 0));
    let mallory_vip = m.vip;
    let drops = |what: &str| -> u64 {
        alpha.get("/api/v1/mesh/stats")["drops"][what]
            .as_u64()
            .unwrap_or(0)
    };
    let wait_drops = |what: &str, at_least: u64| {
        alpha.wait_for("/api/v1/mesh/stats", &format!("alpha counts {what}"), |s| {
            s["drops"][what].as_u64() >= Some(at_least)
        });
    };

    // 1. packets in bravo's name through mallory's own session
    let invalid = drops("invalid");
    let forged = wire::udp_packet(bravo_vip, alpha_vip, 9, b"in bravo's name");
    for _ in 0..5 {
        m.send_packet(&forged);
    }
    wait_drops("invalid", invalid + 5);

    // 2. route claims: bravo's address under a made-up id, bravo's id at mallory's address;
    // 3. group claims: bravo's address as an anycast group, an address no one is listed for
    let claims = drops("route_claims_refused");
    let route = |dest: &str, vip| RouteEntry {
        dest: dest.into(),
        vip,
        metric: 1,
        latency_ms: 0,
        hop_count: 1,
        path: vec![dest.into()],
    };
    m.send_control(
        alpha_vip,
        &Message::Announcement(Announcement {
            sender: "mallory".into(),
            seq: 1,
            entries: vec![route("ghost", bravo_vip), route("bravo", mallory_vip)],
        }),
    );
    let service = Ipv4Addr::new(10, 100, 0, 200);
    for (seq, group) in [(1, bravo_vip), (2, service)] {
        m.send_control(
            alpha_vip,
            &Message::Membership(Membership {
                origin: "mallory".into(),
                vip: mallory_vip,
                seq,
                groups: vec![group],
            }),
        );
    }
    wait_drops("route_claims_refused", claims + 4);
    assert!(
        ping(&lan.peers[0], &bravo_vip.to_string(), 3),
        "alpha → bravo"
    );
    assert!(
        !ping(&lan.peers[0], &service.to_string(), 1),
        "nobody serves {service}"
    );
    m.pump(Duration::from_secs(1));
    assert!(
        !m.got_packet_for(bravo_vip) && !m.got_packet_for(service),
        "mallory drew traffic it claimed"
    );

    // a route to bravo through mallory (a path claim, which routes may make) does not let
    // mallory speak for bravo: relayed traffic is bravo's own ciphertext, not mallory's word
    m.send_control(
        alpha_vip,
        &Message::Announcement(Announcement {
            sender: "mallory".into(),
            seq: 2,
            entries: vec![route("bravo", bravo_vip)],
        }),
    );
    m.pump(Duration::from_millis(300));
    let invalid = drops("invalid");
    for _ in 0..5 {
        m.send_packet(&forged);
    }
    wait_drops("invalid", invalid + 5);

    // 4. a broadcast in bravo's name: as a flood control message with a sequence far ahead of
    // bravo's (floods travel end to end in their origin's own session now: refused as such), and
    // as a broadcast packet from bravo's address in mallory's session (cryptokey routing). Alpha
    // writes neither, and bravo's real broadcast still arrives
    let broadcasts = |p: &Peer| {
        p.get("/api/v1/mesh/stats")["traffic_modes"]["broadcast_packets_received"]
            .as_u64()
            .unwrap_or(0)
    };
    let heard = broadcasts(&alpha);
    let (control, invalid) = (drops("control_dropped"), drops("invalid"));
    let all = Ipv4Addr::new(10, 100, 0, 255);
    let in_bravos_name = wire::udp_packet(bravo_vip, all, 9999, b"forged");
    m.send_control(
        alpha_vip,
        &Message::Flood(Flood {
            origin: "bravo".into(),
            id: u64::MAX - 5,
            ttl: 1,
            mode: FloodMode::Broadcast,
            payload: in_bravos_name.clone(),
        }),
    );
    m.send_packet(&in_bravos_name);
    wait_drops("control_dropped", control + 1);
    wait_drops("invalid", invalid + 1);
    assert_eq!(
        broadcasts(&alpha),
        heard,
        "a broadcast in bravo's name was delivered"
    );
    sh(&format!(
        "ip netns exec {} python3 -c \"import socket; s = socket.socket(2, 2); \
         s.setsockopt(1, 6, 1); s.sendto(b'real', ('{all}', 9999))\"",
        lan.peers[1]
    ));
    alpha.wait_for("/api/v1/mesh/stats", "bravo's broadcast at alpha", |s| {
        s["traffic_modes"]["broadcast_packets_received"].as_u64() == Some(heard + 1)
    });

    // 5. forged connectivity checks: never answered, counted
    let ice = drops("ice_dropped");
    for _ in 0..20 {
        m.forged_ice_check("alpha:mallory");
    }
    assert_eq!(
        m.raw_answers(Duration::from_secs(1)),
        0,
        "a forged check was answered"
    );
    wait_drops("ice_dropped", ice + 20);

    // 6. off-path cookie replies for guessed receiver indexes: bravo's session keeps its path
    m.cookie_replies((1..64u32).flat_map(|i| (0..4).map(move |k| i << 8 | k)));
    assert!(
        ping(&lan.peers[0], &bravo_vip.to_string(), 3),
        "alpha → bravo after cookies"
    );
    assert_eq!(alpha.get("/api/v1/mesh/peers/bravo")["status"], "connected");

    // 7. handshake floods: garbage initiations are refused before any key work, real ones
    // beyond the rate get cookies; alpha and bravo keep talking meanwhile
    let (refused, cookies) = (drops("handshakes_refused"), drops("handshake_cookies"));
    m.handshake_flood(2000, false);
    m.handshake_flood(400, true);
    assert!(
        ping(&lan.peers[0], &bravo_vip.to_string(), 3),
        "alpha → bravo under a flood"
    );
    wait_drops("handshakes_refused", refused + 1000);
    wait_drops("handshake_cookies", cookies + 1);
    assert!(
        !m.got_packet_for(bravo_vip),
        "mallory never saw bravo's traffic"
    );
}

/// Issue 28, TAP mode: mallory (a member with its own valid key, speaking EtherIP in its own
/// session with alpha) sends frames whose source MAC is bravo's device MAC. Alpha refuses each
/// claim and counts it (`drops.mac_claims_refused`), writes none of those frames to its device,
/// and keeps sending bravo's frames to bravo: alpha ⇄ bravo ping works and mallory never
/// receives a frame for bravo's MAC. A frame from mallory's own MAC still arrives (the refusal
/// is about the claim, not about mallory).
#[test]
fn a_member_sending_with_a_neighbours_mac_in_tap_mode_draws_none_of_its_frames() {
    use std::net::Ipv4Addr;
    use support::mesh_member::ipv4_frame;
    use switchyard_dataplane::mesh::wire;
    use switchyard_mesh_routing::l2::mac::MacAddr;

    if !root_with_tools_or_skip(
        "mesh peer namespaces",
        &["ip", "nsenter", "ping", "python3"],
    ) {
        return;
    }
    let lan = Lan::named("symac", "symac", "10.224", 7, 3);
    let server = start_registry(&lan);
    let alpha = Peer::start_with(&lan, 0, "alpha", server.api, "tap");
    let bravo = Peer::start_with(&lan, 1, "bravo", server.api, "tap");
    let vip_of = |p: &Peer| -> Ipv4Addr {
        let s = p.wait_for("/api/v1/mesh/status", "connected", |s| {
            s["connected_peers"] == 1
        });
        s["virtual_ip"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .expect("vip")
    };
    let (alpha_vip, bravo_vip) = (vip_of(&alpha), vip_of(&bravo));
    let mac_of = |viewer: &Peer, id: &str| -> MacAddr {
        viewer.get(&format!("/api/v1/mesh/peers/{id}"))["virtual_mac"]
            .as_str()
            .and_then(|m| m.parse().ok())
            .expect("virtual_mac")
    };
    let (alpha_mac, bravo_mac) = (mac_of(&bravo, "alpha"), mac_of(&alpha, "bravo"));
    // alpha learns bravo's MAC behind bravo (ARP across the mesh, then the echo replies)
    assert!(
        ping(&lan.peers[0], &bravo_vip.to_string(), 3),
        "alpha → bravo over TAP\n{}",
        alpha.log_text()
    );

    let mut m = enroll_mallory(&lan, &server, 2, (&alpha, 0));
    let refused = || {
        alpha.get("/api/v1/mesh/stats")["drops"]["mac_claims_refused"]
            .as_u64()
            .unwrap_or(0)
    };
    assert_eq!(refused(), 0, "no claim refused before mallory sends");
    const PORT: u16 = 9977;
    let listener = Listener::start(&lan.peers[0], PORT, &[]);
    // frames from bravo's MAC (a UDP datagram in bravo's name to alpha), in mallory's session
    let in_bravos_name = wire::udp_packet(bravo_vip, alpha_vip, PORT, b"forged");
    let forged = ipv4_frame(alpha_mac, bravo_mac, &in_bravos_name);
    for _ in 0..5 {
        m.send_frame(alpha_vip, &forged);
    }
    // then one from a MAC of mallory's own, in its own name: written like any member's frame
    let own_mac = MacAddr([0x02, 0x4d, 0x4d, 0, 0, 1]);
    let own = ipv4_frame(
        alpha_mac,
        own_mac,
        &wire::udp_packet(m.vip, alpha_vip, PORT, b"own"),
    );
    m.send_frame(alpha_vip, &own);
    assert_eq!(
        listener.wait_for("own", 1),
        ["own"],
        "mallory's own frame reached alpha"
    );
    alpha.wait_for("/api/v1/mesh/stats", "alpha counts the claims", |s| {
        s["drops"]["mac_claims_refused"].as_u64() >= Some(5)
    });
    assert!(
        listener.received("forged").is_empty(),
        "a frame in bravo's name reached alpha"
    );

    // alpha's unicast to bravo's MAC still goes to bravo, also with mallory claiming it
    // throughout
    for _ in 0..3 {
        m.send_frame(alpha_vip, &forged);
        assert!(
            ping(&lan.peers[0], &bravo_vip.to_string(), 2),
            "alpha → bravo with mallory claiming bravo's MAC\n{}",
            alpha.log_text()
        );
    }
    let neigh = sh(&format!("ip -n {} neigh show dev symesh0", lan.peers[0]));
    assert!(
        neigh.contains(&bravo_mac.to_string()),
        "alpha's ARP entry for bravo: {neigh}"
    );
    m.pump(Duration::from_secs(1));
    assert!(
        !m.got_frame_for(bravo_mac),
        "mallory received a frame for bravo's MAC"
    );
    assert!(refused() >= 8, "every claim counted");
    assert_eq!(
        bravo.get("/api/v1/mesh/stats")["drops"]["mac_claims_refused"],
        0,
        "bravo never saw a claim"
    );
}
