//! The test driver: a coturn process of the test's own, and a one-thread std UDP loop that runs
//! several `IceEndpoint`s (one socket each) against it, passing each peer's endpoints to the
//! others the way the registry would. Sockets may live in network namespaces (bound by a thread
//! that entered the namespace; a socket keeps its namespace). `SYICE_TRACE=1` prints every
//! datagram the driver sends and receives.
#![allow(unsafe_code)] // setns(2) in `bind_in`, the one syscall std does not wrap.
#![allow(dead_code)] // each test binary uses part of the driver

use std::collections::HashSet;
use std::fs::File;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use switchyard_ice::stun::{Class, Message, Method};
use switchyard_ice::{Event, IceConfig, IceEndpoint, Path, Received, Via};

/// The program's path, or None after printing why the test skips. Under CI (`CI` set) a
/// missing program fails the test instead (tests/run installs it).
pub fn require(cmd: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join(cmd))
        .find(|p| p.is_file());
    match found {
        Some(p) => Some(p),
        None if std::env::var_os("CI").is_some() => {
            panic!("{cmd} is required in CI (tests/run installs coturn)")
        }
        None => {
            eprintln!(
                "SKIP: {cmd} is not installed (apt-get install coturn, or run tests/run as root)"
            );
            None
        }
    }
}

/// A UDP socket bound to `addr` inside network namespace `netns` (None: this one).
pub fn bind_in(netns: Option<&str>, addr: &str) -> UdpSocket {
    let Some(netns) = netns else {
        return UdpSocket::bind(addr).expect("bind");
    };
    let (path, addr) = (format!("/var/run/netns/{netns}"), addr.to_string());
    std::thread::spawn(move || {
        let ns = File::open(&path).expect("netns file");
        // SAFETY: setns(2) with a valid namespace fd only moves this short-lived thread, which
        // does nothing but bind the socket, into that network namespace.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
        UdpSocket::bind(&addr).expect("bind in netns")
    })
    .join()
    .expect("bind thread")
}

/// `turnserver` with a random port, one long-term user, UDP only, no TLS: on 127.0.0.1, or on
/// `ip` inside a network namespace.
pub struct Coturn {
    child: Child,
    pub addr: SocketAddr,
    netns: Option<String>,
    dir: tempfile::TempDir,
}

impl Coturn {
    pub fn start(user: &str, password: &str) -> Coturn {
        Coturn::start_in(None, "127.0.0.1", user, password)
    }

    pub fn start_in(netns: Option<&str>, ip: &str, user: &str, password: &str) -> Coturn {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = bind_in(netns, &format!("{ip}:0"))
            .local_addr()
            .expect("free port")
            .port();
        let d = dir.path().display();
        let config = format!(
            "listening-ip={ip}\nlistening-port={port}\nrelay-ip={ip}\n\
             allow-loopback-peers\nlt-cred-mech\nuser={user}:{password}\nrealm=switchyard.test\n\
             verbose\nno-cli\nno-tls\nno-dtls\nno-tcp\nno-rfc5780\nfingerprint\n\
             log-file={d}/turn.log\nsimple-log\npidfile={d}/turn.pid\nuserdb={d}/turndb\n"
        );
        let conf = dir.path().join("turnserver.conf");
        std::fs::write(&conf, config).expect("write config");
        let turnserver = require("turnserver").expect("turnserver");
        // `ip netns exec` execs the program, so the child's PID is turnserver's.
        let mut command = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(turnserver);
                c
            }
            None => Command::new(turnserver),
        };
        let child = command
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start turnserver");
        let addr: SocketAddr = format!("{ip}:{port}").parse().expect("addr");
        let turn = Coturn {
            child,
            addr,
            netns: netns.map(str::to_string),
            dir,
        };
        turn.wait_ready();
        turn
    }

    /// Waits until the server answers a STUN Binding request.
    fn wait_ready(&self) {
        let probe = bind_in(self.netns.as_deref(), &format!("{}:0", self.addr.ip()));
        probe
            .set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = [0u8; 1024];
        while Instant::now() < deadline {
            let req = Message::new(Class::Request, Method::Binding, [5; 12])
                .encode(None, true)
                .expect("a bare request fits");
            probe.send_to(&req, self.addr).expect("send");
            if let Ok((n, _)) = probe.recv_from(&mut buf) {
                if Message::decode(&buf[..n]).is_ok_and(|m| m.class == Class::Success) {
                    return;
                }
            }
        }
        let log = std::fs::read_to_string(self.dir.path().join("turn.log")).unwrap_or_default();
        panic!("turnserver did not answer on {}; log:\n{log}", self.addr);
    }
}

impl Drop for Coturn {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.path().join("turn.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!(
                "turnserver log (last lines, newest first):\n{}",
                tail.join("\n")
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Node {
    pub id: String,
    socket: UdpSocket,
    pub ice: IceEndpoint,
    pub events: Vec<Event>,
    /// Data (not ICE) datagrams the endpoint handed back.
    pub inbox: Vec<(SocketAddr, Via, Vec<u8>)>,
}

pub struct Net {
    nodes: Vec<Node>,
    /// Datagrams to these addresses are dropped by the driver (a path that does not exist).
    blocked: HashSet<SocketAddr>,
    /// While false, gathered candidates are not passed on (the peers have not met yet).
    pub registry_open: bool,
}

impl Net {
    /// One node per id, each with a socket on 127.0.0.1.
    pub fn new(ids: &[&str], config: impl Fn(&str, &UdpSocket) -> IceConfig) -> Net {
        let sockets = ids
            .iter()
            .map(|id| (*id, UdpSocket::bind("127.0.0.1:0").expect("bind")))
            .collect();
        Net::with_sockets(sockets, config)
    }

    pub fn with_sockets(
        sockets: Vec<(&str, UdpSocket)>,
        config: impl Fn(&str, &UdpSocket) -> IceConfig,
    ) -> Net {
        let nodes = sockets
            .into_iter()
            .map(|(id, socket)| {
                socket.set_nonblocking(true).expect("nonblocking");
                let ice = IceEndpoint::new(config(id, &socket), Instant::now());
                Node {
                    id: id.to_string(),
                    socket,
                    ice,
                    events: Vec::new(),
                    inbox: Vec::new(),
                }
            })
            .collect();
        Net {
            nodes,
            blocked: HashSet::new(),
            registry_open: true,
        }
    }

    pub fn socket_addrs(&self) -> HashSet<SocketAddr> {
        self.nodes
            .iter()
            .map(|n| n.socket.local_addr().expect("addr"))
            .collect()
    }

    pub fn endpoint(&self, id: &str) -> &IceEndpoint {
        &self.node(id).ice
    }

    fn node(&self, id: &str) -> &Node {
        self.nodes.iter().find(|n| n.id == id).expect("node")
    }

    /// Tells every node about every other node's current endpoints (the registry's job).
    pub fn introduce(&mut self) {
        for i in 0..self.nodes.len() {
            self.publish(i);
        }
    }

    fn publish(&mut self, from: usize) {
        let id = self.nodes[from].id.clone();
        let endpoints = self.nodes[from].ice.local_endpoints();
        let now = Instant::now();
        for (j, n) in self.nodes.iter_mut().enumerate() {
            if j != from {
                let errors = n.ice.set_peer(&id, b"test pair key", &endpoints, now);
                assert!(errors.is_empty(), "{errors:?}");
            }
        }
    }

    /// One round: send what every endpoint wants sent, read what arrived, run due timers.
    pub fn step(&mut self) {
        let mut buf = [0u8; 65536];
        let mut republish = Vec::new();
        for (i, n) in self.nodes.iter_mut().enumerate() {
            let now = Instant::now();
            if n.ice.poll_timeout().is_some_and(|t| t <= now) {
                n.ice.handle_timeout(now);
            }
            while let Ok((len, from)) = n.socket.recv_from(&mut buf) {
                if std::env::var_os("SYICE_TRACE").is_some() {
                    eprintln!(
                        "{} ← {from} {:?} {len}",
                        n.id,
                        switchyard_ice::classify(&buf[..len])
                    );
                }
                match n.ice.handle_datagram(from, &buf[..len], Instant::now()) {
                    Received::Data { from, via, payload } => {
                        n.inbox.push((from, via, payload.into_owned()))
                    }
                    Received::Consumed | Received::Dropped => {}
                }
            }
            while let Some(t) = n.ice.poll_transmit() {
                if !self.blocked.contains(&t.to) {
                    let r = n.socket.send_to(&t.bytes, t.to);
                    if std::env::var_os("SYICE_TRACE").is_some() {
                        eprintln!(
                            "{} → {} {:?} {} {r:?}",
                            n.id,
                            t.to,
                            switchyard_ice::classify(&t.bytes),
                            t.bytes.len()
                        );
                    }
                }
            }
            while let Some(e) = n.ice.poll_event() {
                if matches!(e, Event::CandidateGathered(_)) {
                    republish.push(i);
                }
                n.events.push(e);
            }
        }
        if self.registry_open {
            for i in republish {
                self.publish(i);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }

    /// Runs the loop for a while (to let timers run out).
    pub fn run_for(&mut self, span: Duration) {
        let end = Instant::now() + span;
        while Instant::now() < end {
            self.step();
        }
    }

    /// Runs until every node has a selected path to every other; returns them.
    pub fn run_until_selected(&mut self, blocked: HashSet<SocketAddr>) -> Vec<(String, Path)> {
        self.run_until_paths(blocked, |_| true)
    }

    /// Runs until every node has a selected path to every other that `wanted` accepts (paths
    /// can be upgraded after the first selection).
    pub fn run_until_paths(
        &mut self,
        blocked: HashSet<SocketAddr>,
        wanted: impl Fn(&Path) -> bool,
    ) -> Vec<(String, Path)> {
        self.blocked = blocked;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.step();
            let mut paths = Vec::new();
            for n in &self.nodes {
                for other in &self.nodes {
                    if other.id != n.id {
                        if let Some(p) = n.ice.selected_path(&other.id) {
                            paths.push((format!("{}→{}", n.id, other.id), p));
                        }
                    }
                }
            }
            let want = self.nodes.len() * (self.nodes.len() - 1);
            if paths.len() == want && paths.iter().all(|(_, p)| wanted(p)) {
                return paths;
            }
            if Instant::now() > deadline {
                let events: Vec<_> = self.nodes.iter().map(|n| (&n.id, &n.events)).collect();
                panic!("no wanted paths within 30 s; selected {paths:?}; events {events:?}");
            }
        }
    }

    /// Sends `data` from one node to another along the selected path and waits for it there.
    pub fn exchange(&mut self, from: &str, to: &str, data: &[u8]) {
        let t = self
            .node(from)
            .ice
            .encapsulate(to, data)
            .expect("a selected path");
        assert!(!self.blocked.contains(&t.to), "selected path is blocked");
        self.node(from)
            .socket
            .send_to(&t.bytes, t.to)
            .expect("send");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            self.step();
            if self.node(to).inbox.iter().any(|(_, _, d)| d == data) {
                return;
            }
        }
        panic!("{to} never received the data {from} sent to {}", t.to);
    }

    pub fn run_until_event<T>(&mut self, id: &str, pick: impl Fn(&Event) -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.step();
            if let Some(t) = self.node(id).events.iter().find_map(&pick) {
                return t;
            }
            assert!(Instant::now() < deadline, "no such event within 30 s");
        }
    }
}
