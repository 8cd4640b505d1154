//! The mesh peer of `switchyard client` end to end (issue 13, TUN mode, direct paths): a real
//! `switchyard server` runs the registry in the host namespace on a veth address of a LAN the
//! test builds (a bridge in a hub namespace), and each `switchyard client` peer runs in a
//! namespace of its own on that LAN. Traffic stays between the namespaces the test created
//! and the host-side veth. Needs root (namespaces, TUN); skips with a reason otherwise, fails
//! under CI.

mod support;

use futures::StreamExt;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};
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
        Lan::named("sympeer", "sypr", test, count)
    }

    /// `prefix` names the namespaces, `short` the host-side interface (15 bytes at most).
    fn named(prefix: &str, short: &str, test: u32, count: usize) -> Lan {
        let tag = format!("{}{test}", std::process::id() % 10_000);
        let octet = (std::process::id() * 4 + test) % 250 + 2;
        let lan = Lan {
            hub: format!("{prefix}{tag}h"),
            host_if: format!("{short}{tag}"),
            peers: (0..count).map(|i| format!("{prefix}{tag}p{i}")).collect(),
            net: format!("10.213.{octet}"),
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

    /// A peer in namespace `ns` whose client API the test reaches at `ip`.
    fn launch(
        ns: &str,
        ip: &str,
        name: &str,
        registry: SocketAddr,
        device: &str,
        relay: bool,
    ) -> Peer {
        let dir = tempfile::tempdir().expect("tempdir");
        let yaml = format!(
            "proxy:\n  http: {{listen: \"127.0.0.1:0\"}}\n  socks5: {{listen: \"127.0.0.1:0\"}}\n  cores: 1\n\
             api: {{listen: \"0.0.0.0:0\"}}\nlogging: {{level: debug, format: json}}\n\
             mesh:\n  enabled: true\n  network_id: {NETWORK}\n  peer_name: {name}\n  device: {{type: {device}}}\n\
             \x20 discovery: {{server: \"http://{registry}\", heartbeat_interval: 1s}}\n\
             \x20 connection: {{connect_timeout: 5s, keep_alive_interval: 5s, preshared_key: \"{PSK}\", relay_via_peers: {relay}}}\n"
        );
        std::fs::write(dir.path().join("client.yaml"), yaml).expect("write config");
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{ns}"))
            .arg(BIN)
            .arg("client")
            .arg("--config")
            .arg(dir.path().join("client.yaml"))
            .arg("--data-dir")
            .arg(dir.path().join("data"));
        let started = spawn_with_listeners(cmd, name, &["client API listening"]);
        let port = started.addrs[0].port();
        Peer {
            proc: started.proc,
            api: format!("{ip}:{port}").parse().expect("addr"),
            logs: started.logs,
            _dir: dir,
        }
    }

    fn call(&self, method: &str, path: &str) -> (u16, Value) {
        let out = curl(&[
            "-sS",
            "--max-time",
            "10",
            "-X",
            method,
            "-w",
            "\n%{http_code}",
            &format!("http://{}{path}", self.api),
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (
            code.trim().parse().unwrap_or(0),
            serde_json::from_str(body).unwrap_or(Value::Null),
        )
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
        let deadline = Instant::now() + PATIENCE;
        loop {
            let v = self.get(path);
            if check(&v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: last {path}: {v}\nlog:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn pid(&self) -> u32 {
        self.proc.child.id()
    }
}

fn start_registry(lan: &Lan) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let yaml = format!(
        "server:\n  http: {{ listen: \"127.0.0.1:0\" }}\n  socks5: {{ listen: \"127.0.0.1:0\" }}\n  cores: 1\n  data_dir: {data:?}\n\
         api: {{ listen: \"{}:0\" }}\nlogging: {{ level: info, format: json }}\n\
         mesh:\n  registry: {{ enabled: true, lease_time: 5m }}\n",
        lan.registry_ip()
    );
    let path = dir.path().join("server.yaml");
    std::fs::write(&path, yaml).expect("write config");
    let server = start_server_with_file(dir, path);
    let (status, body) = api_call(
        &server,
        "POST",
        "/api/v1/mesh/networks",
        Some(&json!({"id": NETWORK, "name": "test lab", "cidr": "10.100.0.0/24"}).to_string()),
        None,
    );
    assert_eq!(status, 201, "network created: {body}");
    server
}

/// `ping` from namespace `ns` to `ip`: whether replies came back.
fn ping(ns: &str, ip: &str, count: u32) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "ping", "-q", "-n", "-c"])
        .arg(count.to_string())
        .args(["-W", "2", "-i", "0.3", ip])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Pings for about five seconds (long enough for a fresh handshake): whether any reply came.
fn ping_long(ns: &str, ip: &str) -> bool {
    ping(ns, ip, 10)
}

/// `curl -sS --max-time <secs> <url>` from namespace `ns`.
fn curl_in(ns: &str, secs: u32, url: &str) -> std::process::Output {
    Command::new("ip")
        .args(["netns", "exec", ns, "curl", "-sS", "--max-time"])
        .arg(secs.to_string())
        .arg(url)
        .output()
        .expect("curl")
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The data of the next `kind` event about `peer` on the registry's event stream.
fn next_event(rt: &tokio::runtime::Runtime, ws: &mut Ws, kind: &str, peer: &str) -> Value {
    let wait = async {
        loop {
            match ws.next().await {
                Some(Ok(tokio_tungstenite::tungstenite::Message::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
                    if v["type"] == kind && v["data"]["peer_id"] == peer {
                        return v["data"].clone();
                    }
                }
                Some(Ok(_)) => {}
                other => panic!("event stream ended waiting for {kind}: {other:?}"),
            }
        }
    };
    rt.block_on(async { tokio::time::timeout(PATIENCE, wait).await })
        .unwrap_or_else(|_| panic!("no {kind} event for {peer}"))
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
            "ws://{}/api/v1/mesh/networks/{NETWORK}/events",
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
        let listed = server.api_get(&format!("/api/v1/mesh/networks/{NETWORK}/peers/alpha"));
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
    let entry = server.api_get(&format!("/api/v1/mesh/networks/{NETWORK}/peers/mallory"));
    let (status, _) = api_call(
        &server,
        "DELETE",
        &format!("/api/v1/mesh/networks/{NETWORK}/peers/mallory"),
        None,
        None,
    );
    assert_eq!(status, 204);
    let forged = json!({"network_id": NETWORK, "peer": {"id": "mallory", "name": "mallory",
        "public_key": FORGED_KEY, "endpoints": entry["endpoints"]}});
    let (status, body) = api_call(
        &server,
        "POST",
        &format!("/api/v1/mesh/networks/{NETWORK}/peers"),
        Some(&forged.to_string()),
        None,
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
        let tag = format!("{}2", std::process::id() % 10_000);
        let octet = (std::process::id() * 4 + 2) % 250 + 2;
        let b = SecondBridge {
            hub: format!("syhop{tag}g"),
            host_if: format!("syhg{tag}"),
            net: format!("10.215.{octet}"),
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
    let lan = Lan::named("syhop", "syhopi", 2, 3);
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

    // the middle peer leaves: the route is withdrawn and charlie is out of reach
    assert_eq!(bravo.call("POST", "/api/v1/mesh/disable").0, 200);
    for (p, other) in [(&alpha, "charlie"), (&charlie, "alpha")] {
        p.wait_for("/api/v1/mesh/routes", "the route withdrawn", |v| {
            v.as_array()
                .is_some_and(|a| a.iter().all(|r| r["dest_peer_id"] != other))
        });
        let seen = p.get(&format!("/api/v1/mesh/peers/{other}"));
        assert_ne!(seen["connection_type"], "multi-hop", "{seen}");
    }
    assert!(
        !ping(&lan.peers[0], &charlie_vip, 2),
        "alpha → charlie without bravo"
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
    let lan = Lan::named("symfast", "symfs", 3, 2);
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
    // 8 MiB without a repeating pattern (xorshift), so a misplaced segment shows
    let dir = tempfile::tempdir().expect("tempdir");
    let mut blob = vec![0u8; 8 << 20];
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
        .args([
            "netns",
            "exec",
            &lan.peers[0],
            "python3",
            "-m",
            "http.server",
        ])
        .args(["--bind", &vips[0], "--directory"])
        .arg(&served)
        .arg("8080")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3 http.server");
    let url = format!("http://{}:8080/blob", vips[0]);
    let got = dir.path().join("got");
    let mut last = None;
    for _ in 0..40 {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &lan.peers[1],
                "curl",
                "-sS",
                "--max-time",
                "30",
            ])
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
        "bulk download over the mesh: {}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        peers[0].log_text(),
        peers[1].log_text()
    );
    let received = std::fs::read(&got).expect("downloaded file");
    assert_eq!(received.len(), blob.len(), "bytes received");
    assert!(received == blob, "the bytes arrived changed");
}
