//! A userspace WireGuard peer for end-to-end tests: boringtun-cli (keys set by `wg`) in a
//! network namespace of its own, reached from the host over a veth pair, with nginx behind it
//! on the peer's tunnel address. Used by the WireGuard and provider-backend tests. Needs root.

use super::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Size of the peer's `big.bin`: larger than every buffer on the way (flow channels, smoltcp
/// windows, the UDP socket's) and long enough for many window updates, where long WireGuard
/// transfers used to be cut short.
pub const BIG_FILE: usize = 24 * 1024 * 1024;

pub fn sh(program: &str, args: &[&str]) -> String {
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

/// A fresh namespace `ns` (a leftover of that name is removed first) joined to the host by the
/// veth pair `host_veth`/`ns_veth` with /30 addresses `host_ip` and `ns_ip`, both ends and the
/// namespace's loopback up.
pub fn namespace_with_veth(ns: &str, host_veth: &str, ns_veth: &str, host_ip: &str, ns_ip: &str) {
    let _ = Command::new("ip")
        .args(["netns", "del", ns])
        .stderr(Stdio::null())
        .status();
    let _ = Command::new("ip")
        .args(["link", "del", host_veth])
        .stderr(Stdio::null())
        .status();
    sh("ip", &["netns", "add", ns]);
    sh(
        "ip",
        &[
            "link", "add", host_veth, "type", "veth", "peer", "name", ns_veth,
        ],
    );
    sh("ip", &["link", "set", ns_veth, "netns", ns]);
    sh(
        "ip",
        &["addr", "add", &format!("{host_ip}/30"), "dev", host_veth],
    );
    sh("ip", &["link", "set", host_veth, "up"]);
    sh(
        "ip",
        &[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{ns_ip}/30"),
            "dev",
            ns_veth,
        ],
    );
    sh("ip", &["-n", ns, "link", "set", ns_veth, "up"]);
    sh("ip", &["-n", ns, "link", "set", "lo", "up"]);
}

/// nginx in namespace `ns` serving `dir`/www on `listen` and logging each request's client
/// address to `dir`/access.log; returns once it runs (its pid file exists).
pub fn start_nginx(nginx: &Path, ns: &str, dir: &Path, listen: &str) -> Proc {
    let d = dir.display();
    let conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n  access_log {d}/access.log;\n  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;\n\
           fastcgi_temp_path {d}/fcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
           server {{ listen {listen}; root {d}/www; }}\n}}\n"
    );
    std::fs::write(dir.join("nginx.conf"), conf).expect("conf");
    let child = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(nginx)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .arg("-p")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nginx");
    let proc = Proc {
        child,
        name: "nginx".into(),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !dir.join("nginx.pid").exists() {
        assert!(
            Instant::now() < deadline,
            "nginx did not start in the namespace"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    proc
}

pub fn sh_in(program: &str, args: &[&str], input: &str) -> String {
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

pub fn keypair() -> (String, String) {
    let private = sh("wg", &["genkey"]);
    let public = sh_in("wg", &["pubkey"], &private);
    (private, public)
}

/// Everything the test needs as root, or None (skip) with the reason printed.
pub fn prerequisites() -> Option<(PathBuf, PathBuf)> {
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
pub struct Peer {
    pub ns: String,
    host_veth: String,
    pub tun: String,
    dir: tempfile::TempDir,
    boringtun: PathBuf,
    peer_proc: Option<Proc>,
    _nginx: Proc,
    /// The peer's UDP endpoint as switchyard sees it.
    pub endpoint: String,
    /// The peer's address on the veth (the UDP endpoint's IP).
    pub endpoint_ip: String,
    /// The peer's address inside the tunnel (nginx listens there, port 80).
    pub origin_ip: String,
    /// switchyard's address inside the tunnel.
    pub client_ip: String,
    peer_private: String,
    pub peer_public: String,
    pub client_private: String,
    pub client_public: String,
    /// Whether the peer accepts `client_public` from the start (else keys are added later
    /// with [`Peer::allow`]).
    authorize_client: bool,
}

/// Names and addresses of a [`Peer`]: `prefix` starts every namespace and interface name;
/// the veth is 10.`veth_octet`.K.0/30; the tunnel addresses are given (None: 10.(veth_octet+1).K.1
/// for the origin and .2 for the client).
pub struct Layout {
    pub prefix: &'static str,
    pub veth_octet: u8,
    pub origin_ip: Option<String>,
    pub client_ip: Option<String>,
    pub authorize_client: bool,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            prefix: "sywg",
            veth_octet: 213,
            origin_ip: None,
            client_ip: None,
            authorize_client: true,
        }
    }
}

impl Peer {
    pub fn start(boringtun: PathBuf, nginx: PathBuf) -> Peer {
        Peer::start_with(boringtun, nginx, Layout::default())
    }

    pub fn start_with(boringtun: PathBuf, nginx: PathBuf, layout: Layout) -> Peer {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}{}", std::process::id() % 10_000, n);
        // Distinct per process and test: 10.213.K.0/30 on the veth, 10.214.K.0/24 in the tunnel.
        let k = (std::process::id() * 7 + n * 31) % 250 + 1;
        let p = layout.prefix;
        let ns = format!("{p}-{id}");
        let host_veth = format!("{p}h{id}");
        let ns_veth = format!("{p}n{id}");
        let tun = format!("{p}t{id}");
        let (v, t) = (layout.veth_octet, layout.veth_octet + 1);
        let host_ip = format!("10.{v}.{k}.1");
        let ns_ip = format!("10.{v}.{k}.2");
        namespace_with_veth(&ns, &host_veth, &ns_veth, &host_ip, &ns_ip);
        let (peer_private, peer_public) = keypair();
        let (client_private, client_public) = keypair();
        let dir = tempfile::tempdir().expect("tempdir");
        let origin_ip = layout.origin_ip.unwrap_or(format!("10.{t}.{k}.1"));
        let client_ip = layout.client_ip.unwrap_or(format!("10.{t}.{k}.2"));
        // nginx inside the namespace, on the tunnel address, logging the client address.
        let www = dir.path().join("www");
        std::fs::create_dir_all(&www).expect("www");
        std::fs::write(www.join("hello.txt"), "hello through the tunnel\n").expect("file");
        std::fs::write(www.join("big.bin"), vec![7u8; BIG_FILE]).expect("file");
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
            endpoint_ip: ns_ip.clone(),
            authorize_client: layout.authorize_client,
            origin_ip,
            client_ip,
            peer_private,
            peer_public,
            client_private,
            client_public,
            dir,
        };
        peer.start_wireguard();
        // nginx listens on the tunnel address, which exists once the peer's device is up.
        let listen = format!("{}:80", peer.origin_ip);
        peer._nginx = start_nginx(&nginx, &ns, peer.dir.path(), &listen);
        peer
    }

    /// Starts boringtun-cli in the namespace and configures its TUN device and keys.
    pub fn start_wireguard(&mut self) {
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
            ],
        );
        if self.authorize_client {
            self.allow(&self.client_public.clone(), &self.client_ip.clone());
        }
        let tun_addr = format!("{}/24", self.origin_ip);
        sh(
            "ip",
            &["-n", &self.ns, "addr", "add", &tun_addr, "dev", &self.tun],
        );
        sh("ip", &["-n", &self.ns, "link", "set", &self.tun, "up"]);
    }

    /// Lets `public_key` in with tunnel address `ip` (what a provider does when a key is
    /// registered).
    pub fn allow(&self, public_key: &str, ip: &str) {
        allow_key(&self.ns, &self.tun, public_key, ip);
    }

    pub fn stop_wireguard(&mut self) {
        self.peer_proc = None; // killed by PID on drop; its TUN device goes with it
        let sock = format!("/var/run/wireguard/{}.sock", self.tun);
        let _ = std::fs::remove_file(sock);
    }

    /// The `wireguard:` settings object for switchyard, optionally with another peer key.
    pub fn settings(&self, peer_public: &str) -> serde_json::Value {
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

    pub fn access_log(&self) -> String {
        self.access_log_lines(1)
    }

    /// The origin's access log once it has at least `lines` lines (at most 5 s).
    pub fn access_log_lines(&self, lines: usize) -> String {
        super::nginx_access_log_lines(&self.dir.path().join("access.log"), lines)
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

/// `wg set` on the peer interface `tun` in namespace `ns`: accept `public_key` from tunnel
/// address `ip` (for stand-ins that hold names, not the [`Peer`]).
pub fn allow_key(ns: &str, tun: &str, public_key: &str, ip: &str) {
    let allowed = format!("{ip}/32");
    sh(
        "ip",
        &[
            "netns",
            "exec",
            ns,
            "wg",
            "set",
            tun,
            "peer",
            public_key,
            "allowed-ips",
            &allowed,
        ],
    );
}
