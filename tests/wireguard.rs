//! WireGuard backends end to end: a real userspace WireGuard peer (boringtun-cli with keys set
//! by `wg`) in a network namespace of its own, with nginx behind it on the tunnel address;
//! `switchyard server` in the host namespace reaches the peer's endpoint over a veth pair this
//! test creates, and proxies HTTP, CONNECT and SOCKS5 through the tunnel. The origin's access
//! log must show the tunnel address of switchyard, never a host address. Needs root (namespaces,
//! TUN); skips with a reason otherwise, fails under CI.

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use support::*;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Larger than every buffer on the way (flow channels, smoltcp windows, the UDP socket's), and
/// long enough for many window updates: the transfers that used to be cut short.
const BIG: usize = 24 * 1024 * 1024;

fn sh(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn sh_in(program: &str, args: &[&str], input: &str) -> String {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn keypair() -> (String, String) {
    let private = sh("wg", &["genkey"]);
    let public = sh_in("wg", &["pubkey"], &private);
    (private, public)
}

/// Everything the test needs as root, or None (skip) with the reason printed.
fn prerequisites() -> Option<(PathBuf, PathBuf)> {
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if !is_root {
        if std::env::var_os("CI").is_some() {
            panic!("the WireGuard tests need root in CI");
        }
        eprintln!("SKIP: the WireGuard tests need root (network namespaces, TUN)");
        return None;
    }
    require("ip")?;
    require("wg")?;
    let nginx = require("nginx")?;
    let peer = which("boringtun-cli")
        .or_else(|| {
            let home = std::env::var("HOME").ok()?;
            let p = PathBuf::from(home).join(".cargo/bin/boringtun-cli");
            p.is_file().then_some(p)
        })
        .or_else(|| require("boringtun-cli"))?;
    Some((peer, nginx))
}

/// A network namespace with a veth to the host, a boringtun-cli peer and nginx on the tunnel
/// address. Removed (processes killed by PID, namespace and veth deleted) on drop.
struct Peer {
    ns: String,
    host_veth: String,
    tun: String,
    dir: tempfile::TempDir,
    boringtun: PathBuf,
    peer_proc: Option<Proc>,
    _nginx: Proc,
    /// The peer's UDP endpoint as switchyard sees it.
    endpoint: String,
    /// The peer's address inside the tunnel (nginx listens there, port 80).
    origin_ip: String,
    /// switchyard's address inside the tunnel.
    client_ip: String,
    peer_private: String,
    pub peer_public: String,
    pub client_private: String,
    client_public: String,
}

impl Peer {
    fn start(boringtun: PathBuf, nginx: PathBuf) -> Peer {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}{}", std::process::id() % 10_000, n);
        // Distinct per process and test: 10.213.K.0/30 on the veth, 10.214.K.0/24 in the tunnel.
        let k = (std::process::id() * 7 + n * 31) % 250 + 1;
        let ns = format!("sywg-{id}");
        let host_veth = format!("sywgh{id}");
        let ns_veth = format!("sywgn{id}");
        let tun = format!("sywgt{id}");
        let _ = Command::new("ip")
            .args(["netns", "del", &ns])
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("ip")
            .args(["link", "del", &host_veth])
            .stderr(Stdio::null())
            .status();
        sh("ip", &["netns", "add", &ns]);
        sh(
            "ip",
            &[
                "link", "add", &host_veth, "type", "veth", "peer", "name", &ns_veth,
            ],
        );
        sh("ip", &["link", "set", &ns_veth, "netns", &ns]);
        let host_ip = format!("10.213.{k}.1");
        let ns_ip = format!("10.213.{k}.2");
        sh(
            "ip",
            &["addr", "add", &format!("{host_ip}/30"), "dev", &host_veth],
        );
        sh("ip", &["link", "set", &host_veth, "up"]);
        sh(
            "ip",
            &[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{ns_ip}/30"),
                "dev",
                &ns_veth,
            ],
        );
        sh("ip", &["-n", &ns, "link", "set", &ns_veth, "up"]);
        sh("ip", &["-n", &ns, "link", "set", "lo", "up"]);
        let (peer_private, peer_public) = keypair();
        let (client_private, client_public) = keypair();
        let dir = tempfile::tempdir().expect("tempdir");
        let origin_ip = format!("10.214.{k}.1");
        let client_ip = format!("10.214.{k}.2");
        // nginx inside the namespace, on the tunnel address, logging the client address.
        let www = dir.path().join("www");
        std::fs::create_dir_all(&www).expect("www");
        std::fs::write(www.join("hello.txt"), "hello through the tunnel\n").expect("file");
        std::fs::write(www.join("big.bin"), vec![7u8; BIG]).expect("file");
        let d = dir.path().display();
        let conf = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n  access_log {d}/access.log;\n  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;\n\
               fastcgi_temp_path {d}/fcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
               server {{ listen {origin_ip}:80; root {}; }}\n}}\n",
            www.display()
        );
        std::fs::write(dir.path().join("nginx.conf"), conf).expect("conf");
        let mut peer = Peer {
            ns: ns.clone(),
            host_veth,
            tun,
            boringtun,
            peer_proc: None,
            _nginx: Proc {
                child: Command::new("true").spawn().expect("true"),
                name: "placeholder".into(),
            },
            endpoint: format!("{ns_ip}:51820"),
            origin_ip,
            client_ip,
            peer_private,
            peer_public,
            client_private,
            client_public,
            dir,
        };
        peer.start_wireguard();
        let child = Command::new("ip")
            .args(["netns", "exec", &ns])
            .arg(&nginx)
            .arg("-c")
            .arg(peer.dir.path().join("nginx.conf"))
            .arg("-p")
            .arg(peer.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx");
        peer._nginx = Proc {
            child,
            name: "nginx".into(),
        };
        // nginx is up once its pid file exists.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !peer.dir.path().join("nginx.pid").exists() {
            assert!(
                Instant::now() < deadline,
                "nginx did not start in the namespace"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        peer
    }

    /// Starts boringtun-cli in the namespace and configures its TUN device and keys.
    fn start_wireguard(&mut self) {
        let log = self.dir.path().join("boringtun.log");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(&self.boringtun)
            .args([
                &self.tun,
                "--foreground",
                "--disable-drop-privileges",
                "--threads",
                "1",
                "-l",
            ])
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("boringtun-cli");
        self.peer_proc = Some(Proc {
            child,
            name: "boringtun-cli".into(),
        });
        let sock = format!("/var/run/wireguard/{}.sock", self.tun);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::path::Path::new(&sock).exists() {
            assert!(
                Instant::now() < deadline,
                "boringtun-cli did not create {sock}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let key_file = self.dir.path().join("peer.key");
        std::fs::write(&key_file, format!("{}\n", self.peer_private)).expect("key");
        let key_path = key_file.display().to_string();
        let allowed = format!("{}/32", self.client_ip);
        sh(
            "ip",
            &[
                "netns",
                "exec",
                &self.ns,
                "wg",
                "set",
                &self.tun,
                "private-key",
                &key_path,
                "listen-port",
                "51820",
                "peer",
                &self.client_public,
                "allowed-ips",
                &allowed,
            ],
        );
        let tun_addr = format!("{}/24", self.origin_ip);
        sh(
            "ip",
            &["-n", &self.ns, "addr", "add", &tun_addr, "dev", &self.tun],
        );
        sh("ip", &["-n", &self.ns, "link", "set", &self.tun, "up"]);
    }

    fn stop_wireguard(&mut self) {
        self.peer_proc = None; // killed by PID on drop; its TUN device goes with it
        let sock = format!("/var/run/wireguard/{}.sock", self.tun);
        let _ = std::fs::remove_file(sock);
    }

    /// The `wireguard:` settings object for switchyard, optionally with another peer key.
    fn settings(&self, peer_public: &str) -> serde_json::Value {
        serde_json::json!({
            "private_key": self.client_private,
            "address": [format!("{}/32", self.client_ip)],
            "public_key": peer_public,
            "endpoint": self.endpoint,
            "allowed_ips": [format!("{}/24", self.origin_ip)],
            "persistent_keepalive": 0,
            "mtu": 1420,
        })
    }

    fn access_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop_wireguard();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_veth])
            .status();
    }
}

fn server_yaml(peer: &Peer, peer_public: &str) -> String {
    let settings = serde_json::to_string(&peer.settings(peer_public)).expect("json");
    format!(
        "backends:\n  - {{name: direct, type: direct}}\n  - {{name: wg, type: wireguard, wireguard: {settings}}}\n\
         routes:\n  - {{name: tunnel, domains: [\"{}\"], backend: wg, priority: 10}}\n  - {{name: rest, domains: [\"*\"], backend: direct}}\n",
        peer.origin_ip
    )
}

fn backend_healthy(server: &Server, name: &str) -> Option<bool> {
    server.api_get(&format!("/api/v1/backends/{name}"))["healthy"].as_bool()
}

fn wait_health(server: &Server, name: &str, want: bool, within: Duration) {
    let deadline = Instant::now() + within;
    while backend_healthy(server, name) != Some(want) {
        assert!(
            Instant::now() < deadline,
            "backend {name} did not become healthy={want}; log:\n{}",
            server.logs.lock().map(|l| l.join("\n")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A JSON POST to the management API: (status, body).
fn post(server: &Server, path: &str, body: &dyn std::fmt::Display) -> (u16, serde_json::Value) {
    api_call(server, "POST", path, Some(&body.to_string()), None)
}

fn body(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn http_connect_and_socks5_go_through_the_tunnel() {
    let Some((boringtun, nginx)) = prerequisites() else {
        return;
    };
    let peer = Peer::start(boringtun, nginx);
    let server = start_server(&server_yaml(&peer, &peer.peer_public));
    let url = format!("http://{}/hello.txt", peer.origin_ip);
    let proxy = format!("http://{}", server.http);
    let socks = format!("socks5://{}", server.socks5);

    let http = curl(&["-sS", "--max-time", "20", "-x", &proxy, &url]);
    assert_eq!(body(&http), "hello through the tunnel\n", "{http:?}");
    let connect = curl(&["-sS", "--max-time", "20", "-p", "-x", &proxy, &url]);
    assert_eq!(body(&connect), "hello through the tunnel\n", "{connect:?}");
    let via_socks = curl(&["-sS", "--max-time", "20", "-x", &socks, &url]);
    assert_eq!(
        body(&via_socks),
        "hello through the tunnel\n",
        "{via_socks:?}"
    );
    // Long transfers arrive whole: at full speed through CONNECT, and to a slow reader through
    // SOCKS5 (its flow's window keeps closing and reopening).
    let big_url = format!("http://{}/big.bin", peer.origin_ip);
    let download = |via: &[&str]| {
        let mut args = vec!["-sS", "--max-time", "120", "-o", "/dev/null"];
        args.extend_from_slice(via);
        args.extend_from_slice(&["-w", "%{size_download}", &big_url]);
        curl(&args)
    };
    let fast = download(&["-p", "-x", &proxy]);
    assert_eq!(body(&fast), BIG.to_string(), "{fast:?}");
    let slow = download(&["--limit-rate", "8M", "-x", &socks]);
    assert_eq!(body(&slow), BIG.to_string(), "{slow:?}");
    // And no data-plane core went down on the way (a panicking core takes its connections and
    // the tunnel with it; a transfer on another core could still have finished).
    let logs = server.logs.lock().map(|l| l.join("\n")).unwrap_or_default();
    assert!(
        !logs.contains("data-plane core stopped"),
        "a core stopped during the transfers:\n{logs}"
    );

    // The origin saw switchyard's tunnel address only.
    let log = peer.access_log();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 5, "five requests reached the origin:\n{log}");
    for line in &lines {
        assert!(
            line.starts_with(&format!("{} ", peer.client_ip)),
            "origin saw another address: {line}"
        );
    }
    assert_eq!(backend_healthy(&server, "wg"), Some(true));
    let stats = server.api_get("/api/v1/backends/wg/stats");
    assert!(
        stats["total_connections"].as_u64().unwrap_or(0) >= 5,
        "{stats}"
    );
    assert!(
        stats["bytes_sent"].as_u64().unwrap_or(0) >= 2 * BIG as u64,
        "{stats}"
    );

    // The connection test of the API goes through the tunnel as well.
    let target = format!(r#"{{"target": "{}:80", "timeout": "10s"}}"#, peer.origin_ip);
    let (status, result) = post(&server, "/api/v1/backends/wg/test", &target);
    assert_eq!(status, 200, "{result}");
    assert_eq!(result["status"], "ok", "{result}");
    // A closed port inside the tunnel is refused by the peer's stack, reported as such.
    let closed = format!(r#"{{"target": "{}:81", "timeout": "10s"}}"#, peer.origin_ip);
    let (_, result) = post(&server, "/api/v1/backends/wg/test", &closed);
    assert_eq!(result["status"], "failed", "{result}");
    assert!(
        result["error"]
            .as_str()
            .unwrap_or_default()
            .contains("refused"),
        "{result}"
    );
}

#[test]
fn a_lost_peer_turns_the_backend_unhealthy_and_back() {
    let Some((boringtun, nginx)) = prerequisites() else {
        return;
    };
    let mut peer = Peer::start(boringtun, nginx);
    let server = start_server(&server_yaml(&peer, &peer.peer_public));
    let proxy = format!("http://{}", server.http);
    let url = format!("http://{}/hello.txt", peer.origin_ip);
    let ok = curl(&["-sS", "--max-time", "20", "-x", &proxy, &url]);
    assert_eq!(body(&ok), "hello through the tunnel\n", "{ok:?}");
    wait_health(&server, "wg", true, Duration::from_secs(5));

    peer.stop_wireguard();
    wait_health(&server, "wg", false, Duration::from_secs(40));
    let listed = server.api_get("/api/v1/backends");
    let wg = listed
        .as_array()
        .and_then(|l| l.iter().find(|b| b["name"] == "wg"))
        .cloned()
        .expect("wg listed");
    assert_eq!(wg["healthy"], false, "{listed}");
    assert_eq!(wg["type"], "wireguard");
    let failed = curl(&[
        "-sS",
        "--max-time",
        "30",
        "-x",
        &proxy,
        "-w",
        "%{http_code}",
        "-o",
        "/dev/null",
        &url,
    ]);
    assert!(
        matches!(body(&failed).as_str(), "502" | "504"),
        "{failed:?}"
    );

    peer.start_wireguard();
    wait_health(&server, "wg", true, Duration::from_secs(40));
    let again = curl(&["-sS", "--max-time", "20", "-x", &proxy, &url]);
    assert_eq!(body(&again), "hello through the tunnel\n", "{again:?}");
}

#[test]
fn a_wrong_peer_key_is_a_clear_error() {
    let Some((boringtun, nginx)) = prerequisites() else {
        return;
    };
    let peer = Peer::start(boringtun, nginx);
    let (_, stranger) = keypair();
    let server = start_server(&server_yaml(&peer, &stranger));
    let proxy = format!("http://{}", server.http);
    let url = format!("http://{}/hello.txt", peer.origin_ip);
    let out = curl(&[
        "-sS",
        "--max-time",
        "30",
        "-x",
        &proxy,
        "-w",
        "\n%{http_code}",
        &url,
    ]);
    let text = body(&out);
    assert!(text.ends_with("\n502"), "{text}");
    assert!(
        text.contains("no WireGuard handshake answer") && text.contains("keys do not match"),
        "{text}"
    );
    wait_health(&server, "wg", false, Duration::from_secs(30));
    assert_eq!(peer.access_log(), "", "nothing reached the origin");
}

#[test]
fn a_wireguard_backend_created_through_the_api_carries_traffic_and_hides_its_keys() {
    let Some((boringtun, nginx)) = prerequisites() else {
        return;
    };
    let peer = Peer::start(boringtun, nginx);
    let server = start_server("");
    let create = serde_json::json!({"name": "wg-api", "type": "wireguard", "wireguard": peer.settings(&peer.peer_public)});
    let (status, reply) = post(&server, "/api/v1/backends", &create);
    assert_eq!(status, 201, "{reply}");
    assert_eq!(reply["type"], "wireguard");
    let mut bad = create.clone();
    bad["name"] = "wg-bad".into();
    bad["wireguard"]["private_key"] = "not a key".into();
    let (status, reply) = post(&server, "/api/v1/backends", &bad);
    assert_eq!(status, 400, "{reply}");
    assert!(reply.to_string().contains("private_key"), "{reply}");

    let route = serde_json::json!({"name": "tunnel", "domains": [peer.origin_ip], "backend": "wg-api", "priority": 10});
    let (status, reply) = post(&server, "/api/v1/routes", &route);
    assert_eq!(status, 201, "{reply}");
    let url = format!("http://{}/hello.txt", peer.origin_ip);
    let out = curl(&[
        "-sS",
        "--max-time",
        "20",
        "-x",
        &format!("http://{}", server.http),
        &url,
    ]);
    assert_eq!(body(&out), "hello through the tunnel\n", "{out:?}");

    let config = server.api_get("/api/v1/config");
    let wg = config["backends"]
        .as_array()
        .and_then(|l| l.iter().find(|b| b["name"] == "wg-api"))
        .cloned()
        .expect("listed");
    assert_eq!(wg["wireguard"]["private_key"], "********", "{wg}");
    assert_eq!(wg["wireguard"]["endpoint"], peer.endpoint.as_str(), "{wg}");
    assert!(!config.to_string().contains(&peer.client_private));

    // The OpenAPI document describes the settings object.
    let doc = server.api_get("/api/v1/openapi.json");
    let schema = &doc["components"]["schemas"]["WireguardSettings"];
    for key in [
        "private_key",
        "address",
        "public_key",
        "endpoint",
        "allowed_ips",
        "dns",
    ] {
        assert!(schema["properties"][key].is_object(), "{key} in {schema}");
    }
}

#[test]
fn a_route_fails_over_from_a_dead_tunnel_to_a_live_one() {
    let Some((boringtun, nginx)) = prerequisites() else {
        return;
    };
    let peer = Peer::start(boringtun, nginx);
    let (_, stranger) = keypair();
    let good = serde_json::to_string(&peer.settings(&peer.peer_public)).expect("json");
    let dead = serde_json::to_string(&peer.settings(&stranger)).expect("json");
    let server = start_server(&format!(
        "backends:\n  - {{name: wg-dead, type: wireguard, wireguard: {dead}}}\n  - {{name: wg-good, type: wireguard, wireguard: {good}}}\n\
         routes:\n  - {{name: tunnel, domains: [\"*\"], backends: [wg-dead, wg-good], load_balance: round_robin}}\n"
    ));
    // The connection test starts the dead tunnel; its unanswered handshake marks it unhealthy.
    let target = format!(r#"{{"target": "{}:80", "timeout": "10s"}}"#, peer.origin_ip);
    let (_, result) = post(&server, "/api/v1/backends/wg-dead/test", &target);
    assert_eq!(result["status"], "failed", "{result}");
    wait_health(&server, "wg-dead", false, Duration::from_secs(30));
    let proxy = format!("http://{}", server.http);
    let url = format!("http://{}/hello.txt", peer.origin_ip);
    for _ in 0..4 {
        let out = curl(&["-sS", "--max-time", "20", "-x", &proxy, &url]);
        assert_eq!(body(&out), "hello through the tunnel\n", "{out:?}");
    }
    assert_eq!(backend_healthy(&server, "wg-good"), Some(true));
}
