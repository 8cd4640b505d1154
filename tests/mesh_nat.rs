//! The mesh peer's NAT traversal end to end (issue 13): five `switchyard client` peers in
//! network namespaces, a `switchyard server` registry and coturn (STUN/TURN) on a public
//! segment, real Linux NAT (nftables masquerade) in router namespaces:
//!
//! ```text
//!  public segment P (bridge in synat…h): registry P.254 (host-side veth), coturn P.253,
//!    alpha P.1                       (public)
//!    nat-b P.2 ─ bravo 192.168.2.2   (masquerade: endpoint-independent mapping)
//!    nat-c P.3 ─ charlie 192.168.3.2 (masquerade)
//!    nat-d P.4 ─ delta 192.168.4.2   (masquerade fully-random: a symmetric NAT)
//!  LAN L (bridge in synat…l): bravo L.1 (relay_via_peers), echo L.2; the host-side veth L.254
//!    gives echo a route to the registry only
//! ```
//!
//! Each NAT router drops unsolicited datagrams to itself, as a home router does, and has no
//! default route (nothing leaves the segment). What the test proves, per pair: alpha–bravo,
//! alpha–charlie direct (the public peer answers the NATed one's check); bravo–charlie direct
//! through both NATs (server-reflexive candidates, hole punching); bravo–delta and
//! charlie–delta relayed through coturn (delta's symmetric NAT maps every destination to a new
//! port, and the others' NATs drop what they did not ask for); alpha–delta direct (a public
//! peer reaches a symmetric NAT through the peer-reflexive candidate of delta's check);
//! bravo–echo direct on their LAN; echo with alpha, charlie and delta multi-hop through bravo.
//! Then ping and TCP across the mesh for all ten pairs, the connection types in the client
//! API and the heartbeats, a registry restart on the same SQLite file (same leases, heartbeats
//! accepted, traffic flows), and a peer that stops (SIGTERM): `peer.left` and its routes
//! withdrawn everywhere. Traffic stays between the namespaces the test created and its two
//! host-side veths. Needs root; skips with a reason otherwise, fails under CI.

mod support;

use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::mesh::{curl_in, ping, registry_get, Ws, REGISTRY_ADMIN};
use support::netns::{root_with_tools_or_skip, sh, sh_quiet};
use support::*;

/// Longest wait for the mesh to settle (registration, gathering, checks, handshakes, routes).
const PATIENCE: Duration = Duration::from_secs(60);
const NETWORK: &str = "natlab";
/// The network's pre-shared key (base64 of 32 bytes 0x07).
const PSK: &str = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";
const NAMES: [&str; 5] = ["alpha", "bravo", "charlie", "delta", "echo"];
const TURN_USER: &str = "mesh";
const TURN_PASSWORD: &str = "relay-secret";

/// The namespaces, bridges and host-side veths; removed on drop.
struct Topology {
    /// First three octets of the public segment and of the LAN bravo shares with echo.
    public: String,
    lan: String,
    /// The peers' namespaces, in `NAMES` order.
    peers: Vec<String>,
    routers: Vec<String>,
    hubs: Vec<String>,
    host_ifs: Vec<String>,
}

impl Topology {
    fn new() -> Topology {
        let tag = format!("{}", std::process::id() % 10_000);
        let octet = std::process::id() % 250 + 2;
        let t = Topology {
            public: format!("10.217.{octet}"),
            lan: format!("10.218.{octet}"),
            peers: ["a", "b", "c", "d", "e"]
                .iter()
                .map(|p| format!("synat{tag}{p}"))
                .collect(),
            routers: ["nb", "nc", "nd"]
                .iter()
                .map(|r| format!("synat{tag}{r}"))
                .collect(),
            hubs: vec![format!("synat{tag}h"), format!("synat{tag}l")],
            host_ifs: vec![format!("synat{tag}p"), format!("synat{tag}l")],
        };
        let (p, l) = (&t.public, &t.lan);
        let (hub, lan_hub) = (&t.hubs[0], &t.hubs[1]);
        let mut script = String::from("set -e\n");
        for (h, host_if, net) in [(hub, &t.host_ifs[0], p), (lan_hub, &t.host_ifs[1], l)] {
            script += &format!(
                "ip netns add {h}; ip -n {h} link set lo up
                 ip -n {h} link add br0 type bridge; ip -n {h} link set br0 up
                 ip link add {host_if} type veth peer name up0 netns {h}
                 ip -n {h} link set up0 master br0 up
                 ip addr add {net}.254/24 dev {host_if}; ip link set {host_if} up\n"
            );
        }
        // coturn's address: the public bridge itself. The private ranges lead into a veth
        // nobody answers on, as the internet silently drops them: coturn closes an allocation
        // whose relayed send fails (no route), and the peers do try private host candidates.
        script += &format!(
            "ip -n {hub} addr add {p}.253/24 dev br0
             ip link add sink netns {hub} type veth peer name sinkpeer netns {hub}
             ip -n {hub} link set sink up; ip -n {hub} link set sinkpeer up
             ip -n {hub} addr add 10.199.0.1/30 dev sink
             ip -n {hub} neigh add 10.199.0.2 lladdr 02:00:00:00:00:01 dev sink nud permanent
             ip -n {hub} route add 192.168.0.0/16 via 10.199.0.2
             ip -n {hub} route add {l}.0/24 via 10.199.0.2\n"
        );
        let port = |ns: &str, hub: &str, port: &str, ifname: &str| {
            format!(
                "ip -n {hub} link add {port} type veth peer name {ifname} netns {ns}
                 ip -n {hub} link set {port} master br0 up; ip -n {ns} link set {ifname} up\n"
            )
        };
        let a = &t.peers[0];
        script += &format!("ip netns add {a}; ip -n {a} link set lo up\n");
        script += &port(a, hub, "pa", "eth0");
        script += &format!("ip -n {a} addr add {p}.1/24 dev eth0\n");
        for (i, router) in t.routers.iter().enumerate() {
            let (peer, k) = (&t.peers[i + 1], i + 2);
            let masquerade = if k == 4 {
                "masquerade fully-random"
            } else {
                "masquerade"
            };
            script += &format!(
                "ip netns add {router}; ip -n {router} link set lo up
                 ip netns add {peer}; ip -n {peer} link set lo up\n"
            );
            script += &port(router, hub, &format!("pn{k}"), "wan");
            script += &format!(
                "ip -n {router} addr add {p}.{k}/24 dev wan
                 ip link add lan netns {router} type veth peer name eth0 netns {peer}
                 ip -n {router} addr add 192.168.{k}.1/24 dev lan; ip -n {router} link set lan up
                 ip -n {peer} addr add 192.168.{k}.2/24 dev eth0; ip -n {peer} link set eth0 up
                 ip -n {peer} route add default via 192.168.{k}.1
                 ip netns exec {router} sysctl -qw net.ipv4.ip_forward=1
                 ip netns exec {router} nft -f - <<EOF
table ip synat_nat {{
  chain post {{ type nat hook postrouting priority srcnat; oifname \"wan\" {masquerade}; }}
  chain in {{ type filter hook input priority filter; iifname \"wan\" ct state new drop; }}
}}
EOF
"
            );
        }
        // bravo's second leg and echo on the LAN; echo reaches the registry through the host
        let (b, e) = (&t.peers[1], &t.peers[4]);
        script += &port(b, lan_hub, "lb", "eth1");
        script += &format!("ip -n {b} addr add {l}.1/24 dev eth1\n");
        script += &format!("ip netns add {e}; ip -n {e} link set lo up\n");
        script += &port(e, lan_hub, "le", "eth0");
        script += &format!(
            "ip -n {e} addr add {l}.2/24 dev eth0
             ip -n {e} route add {p}.254/32 via {l}.254\n"
        );
        let out = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .expect("sh");
        assert!(
            out.status.success(),
            "building the topology: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        t
    }

    fn registry_ip(&self) -> String {
        format!("{}.254", self.public)
    }

    fn turn_ip(&self) -> String {
        format!("{}.253", self.public)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in self.peers.iter().chain(&self.routers).chain(&self.hubs) {
            sh_quiet(&format!("ip netns del {ns}"));
        }
        for i in &self.host_ifs {
            sh_quiet(&format!("ip link del {i}"));
        }
    }
}

/// coturn's `turnserver` in the public hub namespace, UDP only, one long-term user.
struct Coturn {
    /// Killed (by its PID) when the test ends.
    _proc: Proc,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Coturn {
    fn start(t: &Topology, turnserver: &std::path::Path) -> Coturn {
        let dir = tempfile::tempdir().expect("tempdir");
        let ip = t.turn_ip();
        let port = 3478 + (std::process::id() % 1000) as u16;
        let d = dir.path().display();
        let config = format!(
            "listening-ip={ip}\nlistening-port={port}\nrelay-ip={ip}\n\
             lt-cred-mech\nuser={TURN_USER}:{TURN_PASSWORD}\nrealm=switchyard.test\n\
             verbose\nno-cli\nno-tls\nno-dtls\nno-tcp\nno-rfc5780\nfingerprint\n\
             log-file={d}/turn.log\nsimple-log\npidfile={d}/turn.pid\nuserdb={d}/turndb\n"
        );
        let conf = dir.path().join("turnserver.conf");
        std::fs::write(&conf, config).expect("write coturn config");
        // `ip netns exec` execs the program: the child's PID is turnserver's
        let child = Command::new("ip")
            .args(["netns", "exec", &t.hubs[0]])
            .arg(turnserver)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start turnserver");
        let turn = Coturn {
            _proc: Proc {
                child,
                name: "turnserver".into(),
            },
            addr: format!("{ip}:{port}").parse().expect("addr"),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let listening = sh_quiet(&format!("ip netns exec {} ss -Hlun", t.hubs[0]));
            if listening.contains(&format!("{ip}:{port}")) {
                return turn;
            }
            assert!(
                Instant::now() < deadline,
                "turnserver is not listening on {ip}:{port}: {}",
                turn.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("turn.log")).unwrap_or_default()
    }
}

impl Drop for Coturn {
    /// A failing run leaves coturn's log in `$MESH_NAT_LOGS/turnserver.log` when that is set.
    fn drop(&mut self) {
        if let Some(dir) = std::env::var_os("MESH_NAT_LOGS").filter(|_| std::thread::panicking()) {
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::write(
                std::path::Path::new(&dir).join("turnserver.log"),
                self.log(),
            );
        }
    }
}

/// The registry: a `switchyard server` on the public segment with a fixed API port, its SQLite
/// file in a directory that outlives restarts.
struct Registry {
    server: Option<Server>,
    config: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Registry {
    fn start(t: &Topology) -> Registry {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let port = std::net::TcpListener::bind(format!("{}:0", t.registry_ip()))
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let yaml = format!(
            "server:\n  http: {{ listen: \"127.0.0.1:0\" }}\n  socks5: {{ listen: \"127.0.0.1:0\" }}\n  cores: 1\n  data_dir: {data:?}\n\
             api: {{ listen: \"{}:{port}\", token: {REGISTRY_ADMIN} }}\nlogging: {{ level: info, format: json }}\n\
             mesh:\n  registry: {{ enabled: true, lease_time: 5m }}\n",
            t.registry_ip()
        );
        let config = dir.path().join("server.yaml");
        std::fs::write(&config, yaml).expect("write config");
        let mut r = Registry {
            server: None,
            config,
            _dir: dir,
        };
        r.launch();
        let (status, body) = api_call(
            r.server(),
            "POST",
            "/api/v1/mesh/networks",
            Some(&json!({"id": NETWORK, "name": "nat lab", "cidr": "10.100.0.0/24"}).to_string()),
            Some(REGISTRY_ADMIN),
        );
        assert_eq!(status, 201, "network created: {body}");
        r
    }

    fn launch(&mut self) {
        let scratch = tempfile::tempdir().expect("tempdir");
        self.server = Some(start_server_with_file(scratch, self.config.clone()));
    }

    fn server(&self) -> &Server {
        self.server.as_ref().expect("registry running")
    }

    /// Stops the registry (SIGTERM, then waits) and starts it again on the same file and port.
    fn restart(&mut self) {
        if let Some(mut s) = self.server.take() {
            sh_quiet(&format!("kill -TERM {}", s.pid()));
            let deadline = Instant::now() + Duration::from_secs(10);
            while s.proc.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.launch();
    }

    fn peers(&self) -> Vec<Value> {
        registry_get(
            self.server().api,
            &format!("/api/v1/mesh/networks/{NETWORK}/peers"),
        )["peers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    fn peer(&self, id: &str) -> Value {
        registry_get(
            self.server().api,
            &format!("/api/v1/mesh/networks/{NETWORK}/peers/{id}"),
        )
    }
}

/// A client peer in its namespace; the test reaches its API from inside the namespace.
struct Peer {
    ns: String,
    name: &'static str,
    port: u16,
    proc: Proc,
    logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

impl Peer {
    fn start(ns: &str, name: &'static str, registry: SocketAddr, turn: SocketAddr) -> Peer {
        let dir = tempfile::tempdir().expect("tempdir");
        let relay = name == "bravo";
        // its own single-use key: the registry's admin token is in no peer's configuration
        let key = support::mesh::single_use_key(registry, NETWORK);
        let yaml = format!(
            "proxy:\n  http: {{listen: \"127.0.0.1:0\"}}\n  socks5: {{listen: \"127.0.0.1:0\"}}\n  cores: 1\n\
             api: {{listen: \"0.0.0.0:0\"}}\nlogging: {{level: debug, format: json}}\n\
             mesh:\n  enabled: true\n  network_id: {NETWORK}\n  peer_name: {name}\n\
             \x20 discovery: {{server: \"http://{registry}\", insecure: true, enrollment_key: {key}, heartbeat_interval: 1s}}\n\
             \x20 stun: {{servers: [\"stun:{turn}\"], timeout: 3s}}\n\
             \x20 turn: {{servers: [{{url: \"turn:{turn}\", username: {TURN_USER}, password: {TURN_PASSWORD}}}]}}\n\
             \x20 connection: {{connect_timeout: 5s, keep_alive_interval: 5s, preshared_key: \"{PSK}\", relay_via_peers: {relay}}}\n"
        );
        let started = support::mesh::start_client_in(ns, name, dir.path(), &yaml);
        Peer {
            ns: ns.to_owned(),
            name,
            port: started.addrs[0].port(),
            proc: started.proc,
            logs: started.logs,
            _dir: dir,
        }
    }

    fn get(&self, path: &str) -> Value {
        let out = curl_in(
            &self.ns,
            10,
            &format!("http://127.0.0.1:{}{path}", self.port),
        );
        assert!(
            out.status.success(),
            "GET {path} at {}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    fn log_text(&self) -> String {
        self.logs.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// Waits until `check` holds for this peer's `path` (bounded), returning the last value.
    fn wait_for(&self, path: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
        support::mesh::wait_until(
            PATIENCE,
            &format!("{}: {what} ({path})", self.name),
            || self.get(path),
            check,
            || format!("log:\n{}", tail(&self.log_text(), 80)),
        )
    }

    fn vip(&self) -> String {
        self.get("/api/v1/mesh/status")["virtual_ip"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

impl Drop for Peer {
    /// A failing run leaves every peer's log in `$MESH_NAT_LOGS/<name>.log` when that is set.
    fn drop(&mut self) {
        if let Some(dir) = std::env::var_os("MESH_NAT_LOGS").filter(|_| std::thread::panicking()) {
            let _ = std::fs::create_dir_all(&dir);
            let path = std::path::Path::new(&dir).join(format!("{}.log", self.name));
            let _ = std::fs::write(path, self.log_text());
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The connection type each pair must show (both ends), by the topology.
fn expected(a: &str, b: &str) -> &'static str {
    let pair = |x: &str, y: &str| (a == x && b == y) || (a == y && b == x);
    if pair("bravo", "delta") || pair("charlie", "delta") {
        "relayed"
    } else if (a == "echo" || b == "echo") && !pair("bravo", "echo") {
        "multi-hop"
    } else {
        "direct"
    }
}

/// The data of the next `kind` event about `peer` on the registry's event stream.
fn next_event(rt: &tokio::runtime::Runtime, ws: &mut Ws, kind: &str, peer: &str) -> Value {
    support::mesh::next_event(rt, ws, kind, peer, PATIENCE)
}

#[test]
fn five_peers_through_nat_symmetric_nat_and_a_relaying_peer_reach_each_other() {
    if !root_with_tools_or_skip(
        "mesh NAT namespaces",
        &["ip", "nsenter", "ping", "curl", "nft", "ss"],
    ) {
        return;
    }
    let Some(turnserver) = require("turnserver") else {
        return;
    };
    let t = Topology::new();
    let turn = Coturn::start(&t, &turnserver);
    let mut registry = Registry::start(&t);
    let registry_addr = registry.server().api;
    let peers: Vec<Peer> = NAMES
        .iter()
        .zip(&t.peers)
        .map(|(name, ns)| Peer::start(ns, name, registry_addr, turn.addr))
        .collect();
    let by_name = |n: &str| &peers[NAMES.iter().position(|m| *m == n).expect("name")];

    // every peer sees every other with the connection type the topology allows
    for p in &peers {
        p.wait_for(
            "/api/v1/mesh/peers",
            "every pair connected as expected",
            |v| {
                let Some(list) = v.as_array() else {
                    return false;
                };
                list.len() == 4
                    && list.iter().all(|x| {
                        let other = x["id"].as_str().unwrap_or_default();
                        x["status"] == "connected"
                            && x["connection_type"] == expected(p.name, other)
                    })
            },
        );
    }
    let vips: Vec<String> = peers.iter().map(Peer::vip).collect();
    let mut distinct = vips.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 5, "distinct virtual IPs: {vips:?}");

    // what the peers published: the NATed ones their NAT's public address (srflx) and a relay
    // on coturn; echo, with no way to the servers, only its LAN address
    for (name, k) in [("bravo", 2), ("charlie", 3), ("delta", 4)] {
        let wan = format!("{}.{k}", t.public);
        let listed = registry.peer(name);
        let endpoints = listed["endpoints"].as_array().cloned().unwrap_or_default();
        let has = |kind: &str, address: &str| {
            endpoints
                .iter()
                .any(|e| e["type"] == kind && e["address"] == address)
        };
        assert!(has("srflx", &wan), "{name}: {listed}");
        assert!(has("relay", &t.turn_ip()), "{name}: {listed}");
        assert!(has("lan", &format!("192.168.{k}.2")), "{name}: {listed}");
    }
    let echo = registry.peer("echo");
    assert!(
        echo["endpoints"]
            .as_array()
            .is_some_and(|e| e.iter().all(|x| x["type"] == "lan")),
        "{echo}"
    );
    // the client status counts the kinds of sessions
    let delta_status = by_name("delta").get("/api/v1/mesh/status");
    assert_eq!(
        (
            delta_status["connected_peers"].as_u64(),
            delta_status["direct_connections"].as_u64(),
            delta_status["relayed_connections"].as_u64()
        ),
        (Some(4), Some(1), Some(2)),
        "delta: alpha direct, bravo and charlie relayed, echo through bravo: {delta_status}"
    );

    // ping and TCP across the mesh for all ten pairs (TCP: the other peer's client API, a
    // multi-segment document, compared with the same document fetched locally)
    let documents: Vec<Vec<u8>> = peers
        .iter()
        .map(|p| {
            let out = curl_in(
                &p.ns,
                10,
                &format!("http://127.0.0.1:{}/api/v1/openapi.json", p.port),
            );
            assert!(out.status.success() && out.stdout.len() > 20_000);
            out.stdout
        })
        .collect();
    let check_pair = |i: usize, j: usize| {
        let (from, to) = (&peers[i], &peers[j]);
        assert!(
            ping(&from.ns, &vips[j], 3),
            "ping {} → {} ({})\n{} log:\n{}\n{} log:\n{}",
            from.name,
            to.name,
            expected(from.name, to.name),
            from.name,
            tail(&from.log_text(), 60),
            to.name,
            tail(&to.log_text(), 60)
        );
        assert!(
            ping(&to.ns, &vips[i], 3),
            "ping {} → {}",
            to.name,
            from.name
        );
        let out = curl_in(
            &from.ns,
            20,
            &format!("http://{}:{}/api/v1/openapi.json", vips[j], to.port),
        );
        assert!(
            out.status.success() && out.stdout == documents[j],
            "TCP {} → {} ({}): {}",
            from.name,
            to.name,
            expected(from.name, to.name),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for i in 0..5 {
        for j in i + 1..5 {
            check_pair(i, j);
        }
    }
    // relayed bytes really went through coturn: delta's relayed sessions carried documents
    let bravo_seen_by_delta = by_name("delta").get("/api/v1/mesh/peers/bravo");
    assert_eq!(bravo_seen_by_delta["connection_type"], "relayed");
    assert!(
        bravo_seen_by_delta["bytes_received"].as_u64() > Some(20_000)
            || bravo_seen_by_delta["bytes_sent"].as_u64() > Some(20_000),
        "{bravo_seen_by_delta}"
    );
    // echo's paths to the others go through bravo
    let routes = by_name("echo").get("/api/v1/mesh/routes");
    for other in ["alpha", "charlie", "delta"] {
        let r = routes
            .as_array()
            .and_then(|a| {
                a.iter()
                    .find(|r| r["dest_peer_id"] == other && r["active"] == true)
            })
            .cloned()
            .unwrap_or(Value::Null);
        assert_eq!(
            (r["type"].as_str(), r["next_hop"].as_str()),
            (Some("relayed"), Some("bravo")),
            "echo → {other}: {routes}"
        );
    }
    // the heartbeats carry the least direct kind of path (the registry shows it): alpha reaches
    // echo only through bravo, delta reaches bravo and charlie through the TURN relay
    let deadline = Instant::now() + PATIENCE;
    loop {
        let types: Vec<Value> = ["alpha", "delta"]
            .iter()
            .map(|n| registry.peer(n)["connection_type"].clone())
            .collect();
        if types == [json!("multi-hop"), json!("relayed")] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "heartbeat connection types: {types:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // a registry restart on the same SQLite file keeps every lease: same addresses, same
    // registrations (joined_at), heartbeats accepted again (last_seen moves), traffic flows
    let before = registry.peers();
    assert_eq!(before.len(), 5);
    registry.restart();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let after = registry.peers();
        let kept = after.len() == 5
            && before.iter().all(|b| {
                after.iter().any(|a| {
                    a["id"] == b["id"]
                        && a["virtual_ip"] == b["virtual_ip"]
                        && a["joined_at"] == b["joined_at"]
                        && a["last_seen"] != b["last_seen"]
                })
            });
        if kept {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "leases after the registry restart:\nbefore {before:?}\nafter {after:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    for (p, vip) in peers.iter().zip(&vips) {
        assert_eq!(&p.vip(), vip, "{} kept its address", p.name);
        assert_eq!(
            p.get("/api/v1/mesh/status")["status"],
            "connected",
            "{}",
            p.name
        );
    }
    for (i, j) in [(0, 3), (1, 2), (3, 4), (0, 4)] {
        check_pair(i, j);
    }

    // a peer that stops (SIGTERM) leaves: peer.left, and its routes are withdrawn everywhere
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (mut ws, _) = rt
        .block_on(tokio_tungstenite::connect_async(format!(
            "ws://{}/api/v1/mesh/networks/{NETWORK}/events?token={REGISTRY_ADMIN}",
            registry.server().api
        )))
        .expect("registry event stream");
    let charlie = by_name("charlie");
    sh(&format!("kill -TERM {}", charlie.proc.child.id()));
    next_event(&rt, &mut ws, "peer.left", "charlie");
    for p in peers.iter().filter(|p| p.name != "charlie") {
        p.wait_for("/api/v1/mesh/routes", "charlie's routes withdrawn", |v| {
            v.as_array()
                .is_some_and(|a| a.iter().all(|r| r["dest_peer_id"] != "charlie"))
        });
        p.wait_for("/api/v1/mesh/peers", "charlie dropped", |v| {
            v.as_array()
                .is_some_and(|a| a.len() == 3 && a.iter().all(|x| x["id"] != "charlie"))
        });
    }
    assert!(!ping(&t.peers[0], &vips[2], 1), "charlie is gone");
    drop(turn);
}
