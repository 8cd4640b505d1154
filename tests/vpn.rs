//! VPN (TUN) mode of `switchyard client` end to end, in network namespaces (root; CI must not
//! skip).
//!
//! Topology per test (names prefixed `syvpn`): a "lan" namespace holding the client (in its own
//! cgroup `own`) and two cgroups of test programs, `inc` and `exc`, below a scope cgroup; an
//! "internet" namespace joined by a veth pair (lan 10.210.0.2, internet 10.210.0.1) with
//! `switchyard server` on 10.210.0.1 and TCP origins on 10.211.9.1-3:8080 that answer each
//! connection with the peer address they see. A flow through the VPN reaches the origin from the
//! server (the origin sees its own 10.211.9.x address, and the server's request log has it); a
//! direct one comes from the client's LAN address 10.210.0.2. Probes and origins are this test
//! binary re-run in helper mode (`SYVPN_HELPER`). Traffic only goes to these namespaces. The
//! `syvns` tests add a bystander namespace (`-oth`, loopback only) whose processes share the scope
//! cgroups, and start the client under `ip netns exec` (no cgroup2 mount visible).

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use support::netns::{
    self, in_netns, next_result, remove_cgroups, root_with_tools_or_skip, sh, sh_quiet,
};
use support::{spawn_with_listeners, Listening, BIN};

const DIRECT: &str = "10.210.0.2";
const MARK: &str = "0x5359";
const TABLE: u32 = 0x5359;
/// Bytes the bulk probe sends through the VPN.
const BULK: usize = 8 << 20;

// ---------- helper mode ----------

fn result(line: &str) {
    println!("RESULT {line}");
    let _ = std::io::stdout().flush();
}

/// Answers each connection with the peer address, then holds it until the peer closes.
fn serve_origin(port: u16) -> ! {
    let l = std::net::TcpListener::bind(("0.0.0.0", port)).expect("bind origin");
    result("ready");
    for conn in l.incoming().flatten() {
        std::thread::spawn(move || {
            let mut conn = conn;
            if let Ok(peer) = conn.peer_addr() {
                let _ = conn.write_all(format!("{}\n", peer.ip()).as_bytes());
            }
            let mut sink = [0u8; 1024];
            while matches!(conn.read(&mut sink), Ok(n) if n > 0) {}
        });
    }
    std::process::exit(0)
}

/// Answers each UDP datagram to `ip:port` (one socket per address, so replies come from the
/// address that was asked) with `<peer address> <datagram>`.
fn serve_udp_origin(arg: &str) -> ! {
    let (port, ips) = arg.split_once(' ').expect("port and addresses");
    let port: u16 = port.parse().expect("port");
    let sockets: Vec<std::net::UdpSocket> = ips
        .split(' ')
        .map(|ip| std::net::UdpSocket::bind((ip, port)).expect("bind udp origin"))
        .collect();
    result("ready");
    let threads: Vec<_> = sockets
        .into_iter()
        .map(|sock| {
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65_536];
                while let Ok((n, peer)) = sock.recv_from(&mut buf) {
                    let mut reply = format!("{} ", peer.ip()).into_bytes();
                    reply.extend_from_slice(&buf[..n]);
                    let _ = sock.send_to(&reply, peer);
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    std::process::exit(0)
}

/// Sends `count` datagrams from one socket to `dst`, each answered before the next (a lost one
/// is sent again, at most three times): `seen=<address the origin saw> replies=<n>`, or
/// `send=<error kind>` when a send fails.
fn udp_round_trips(dst: SocketAddr, count: usize) -> String {
    let any = if dst.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" };
    udp_round_trips_from(any, dst, count)
}

/// [`udp_round_trips`] from a socket bound to `local`.
fn udp_round_trips_from(local: &str, dst: SocketAddr, count: usize) -> String {
    let sock = std::net::UdpSocket::bind(local).expect("bind");
    sock.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    let (mut seen, mut replies) = (String::from("nothing"), 0);
    let mut buf = [0u8; 2048];
    for i in 0..count {
        let message = format!("datagram {i}");
        for _attempt in 0..3 {
            if let Err(e) = sock.send_to(message.as_bytes(), dst) {
                return format!("send={:?}", e.kind());
            }
            let Ok((n, from)) = sock.recv_from(&mut buf) else {
                continue;
            };
            let reply = String::from_utf8_lossy(&buf[..n]).into_owned();
            if from == dst && reply.ends_with(&message) {
                seen = reply.split(' ').next().unwrap_or_default().to_owned();
                replies += 1;
                break;
            }
        }
    }
    format!("seen={seen} replies={replies}")
}

/// Sends one datagram of `size` bytes to `dst` (at most three times) and checks the answer
/// carries it whole: `seen=<address the origin saw> bytes=<answer length>`.
fn udp_large_round_trip(dst: SocketAddr, size: usize) -> String {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind");
    sock.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    let message: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
    let mut buf = vec![0u8; 65_536];
    for _attempt in 0..3 {
        sock.send_to(&message, dst).expect("send");
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        if from == dst && buf[..n].ends_with(&message) {
            let seen = String::from_utf8_lossy(&buf[..n - size]);
            return format!("seen={} bytes={n}", seen.trim_end());
        }
    }
    "seen=nothing bytes=0".into()
}

fn connect_and_read(dst: SocketAddr) -> (TcpStream, String) {
    let mut stream = TcpStream::connect_timeout(&dst, Duration::from_secs(10)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while let Ok(1) = stream.read(&mut byte) {
        if byte[0] == b'\n' {
            break;
        }
        seen.push(byte[0]);
    }
    (stream, String::from_utf8_lossy(&seen).into_owned())
}

/// A DNS query for the A record of `name` (id 0x5359, recursion desired).
fn dns_query(name: &str) -> Vec<u8> {
    dns_query_of(name, 1)
}

/// A DNS query for the records of type `qtype` of `name`.
fn dns_query_of(name: &str, qtype: u8) -> Vec<u8> {
    let mut q = vec![0x53, 0x59, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, qtype, 0, 1]);
    q
}

/// Bytes after the first line of the IPv6 HTTP origin's answers (a pattern no byte of which
/// repeats its neighbour, so a lost or doubled segment shows).
fn http6_body() -> Vec<u8> {
    (0..256 * 1024u32).map(|i| (i % 251) as u8).collect()
}

/// An HTTP origin on `[::]:port`: answers each request with `<peer address>\n` and
/// [`http6_body`], and reports each connection (`RESULT seen=<peer address>`).
fn serve_http6_origin(port: u16) -> ! {
    let l = std::net::TcpListener::bind(("::", port)).expect("bind origin");
    result("ready");
    for conn in l.incoming().flatten() {
        let Ok(peer) = conn.peer_addr() else {
            continue;
        };
        result(&format!("seen={}", peer.ip()));
        std::thread::spawn(move || {
            let mut conn = conn;
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && matches!(conn.read(&mut byte), Ok(1)) {
                head.push(byte[0]);
            }
            let mut body = format!("{}\n", peer.ip()).into_bytes();
            body.extend_from_slice(&http6_body());
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(answer.as_bytes());
            let _ = conn.write_all(&body);
        });
    }
    std::process::exit(0)
}

/// Resolves the AAAA record of `name` over UDP at `server`, then asks the IPv6 HTTP origin at
/// the answer's port 8086: `ip=<answer> seen=<what the origin saw>`.
fn resolve6_then_connect(server: SocketAddr, name: &str) -> String {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind");
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    sock.send_to(&dns_query_of(name, 28), server).expect("send");
    let mut buf = [0u8; 1500];
    let (n, _) = sock.recv_from(&mut buf).expect("dns answer");
    let reply = &buf[..n];
    let answers = u16::from_be_bytes([reply[6], reply[7]]);
    if answers == 0 || n < 12 + 16 {
        return "ip=none".into();
    }
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&reply[n - 16..]);
    let ip = std::net::Ipv6Addr::from(octets);
    let dst = SocketAddr::from((ip, 8086));
    let mut stream = TcpStream::connect_timeout(&dst, Duration::from_secs(10)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let _ = stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    let seen = text
        .split_once("\r\n\r\n")
        .and_then(|(_, body)| body.lines().next())
        .unwrap_or("nothing");
    format!("ip={ip} seen={seen}")
}

/// Asks `server` over UDP for the records of type `qtype` (1 = A, 28 = AAAA) of `name`:
/// `answer=<address of the last record>`, `answer=none` for an empty answer or `answer=silence`
/// when no answer came from `server` itself (a redirected question's answer must appear to).
fn dns_ask(server: SocketAddr, name: &str, qtype: u8) -> String {
    let any = if server.is_ipv6() {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    };
    let sock = std::net::UdpSocket::bind(any).expect("bind");
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    sock.send_to(&dns_query_of(name, qtype), server)
        .expect("send");
    let mut buf = [0u8; 1500];
    let reply = match sock.recv_from(&mut buf) {
        Ok((n, from)) if from == server => &buf[..n],
        _ => return "answer=silence".into(),
    };
    let answers = u16::from_be_bytes([reply[6], reply[7]]);
    let size = if qtype == 28 { 16 } else { 4 };
    if answers == 0 || reply.len() < 12 + size {
        return "answer=none".into();
    }
    let data = &reply[reply.len() - size..];
    let ip = match <[u8; 16]>::try_from(data) {
        Ok(octets) => std::net::IpAddr::from(octets),
        Err(_) => std::net::IpAddr::from([data[0], data[1], data[2], data[3]]),
    };
    format!("answer={ip}")
}

/// Asks `server` over UDP for the A record of `name`: `rcode=<response code> answers=<count>`,
/// or `rcode=silence` when no answer came.
fn dns_rcode(server: SocketAddr, name: &str) -> String {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind");
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    sock.send_to(&dns_query(name), server).expect("send");
    let mut buf = [0u8; 1500];
    match sock.recv_from(&mut buf) {
        Ok((n, from)) if from == server && n >= 12 => format!(
            "rcode={} answers={}",
            buf[3] & 0x0f,
            u16::from_be_bytes([buf[6], buf[7]])
        ),
        _ => "rcode=silence".into(),
    }
}

/// Connects to `dst` and reads the origin's line: `seen=<address>`, or how it failed —
/// `reset` (refused or reset, while connecting or after), `closed`, `error=<kind>`.
fn tcp_outcome(dst: SocketAddr) -> String {
    use std::io::ErrorKind::{ConnectionRefused, ConnectionReset};
    let mut stream = match TcpStream::connect_timeout(&dst, Duration::from_secs(10)) {
        Ok(s) => s,
        Err(e) if matches!(e.kind(), ConnectionRefused | ConnectionReset) => return "reset".into(),
        Err(e) => return format!("error={:?}", e.kind()),
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match stream.read(&mut byte) {
            Ok(1) if byte[0] != b'\n' => line.push(byte[0]),
            Ok(1) => return format!("seen={}", String::from_utf8_lossy(&line)),
            Ok(_) => return "closed".into(),
            Err(e) if e.kind() == ConnectionReset => return "reset".into(),
            Err(e) => return format!("error={:?}", e.kind()),
        }
    }
}

/// The address of the one A record of an answer (its last four bytes), if it has an answer.
fn dns_answer(reply: &[u8]) -> Option<String> {
    let answers = u16::from_be_bytes([*reply.get(6)?, *reply.get(7)?]);
    if answers == 0 || reply.len() < 16 {
        return None;
    }
    let a = &reply[reply.len() - 4..];
    Some(format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3]))
}

/// Resolves `name` over UDP at `server`, then connects to the answer's port 8080.
fn resolve_then_connect(server: SocketAddr, name: &str) -> String {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind");
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    sock.send_to(&dns_query(name), server).expect("send");
    let mut buf = [0u8; 1500];
    let (n, _) = sock.recv_from(&mut buf).expect("dns answer");
    let Some(ip) = dns_answer(&buf[..n]) else {
        return "ip=none".into();
    };
    let (_, seen) = connect_and_read(format!("{ip}:8080").parse().expect("address"));
    format!("ip={ip} seen={seen}")
}

#[test]
fn helper() {
    let Ok(action) = std::env::var("SYVPN_HELPER") else {
        return; // a plain test run: nothing to do
    };
    let arg = std::env::var("SYVPN_ARG").unwrap_or_default();
    match action.as_str() {
        "origin" => serve_origin(arg.parse().expect("port")),
        "http6-origin" => serve_http6_origin(arg.parse().expect("port")),
        // SYVPN_ARG = "dns-server-address name"
        "resolve6-tcp" => {
            let (server, name) = arg.split_once(' ').expect("server and name");
            result(&resolve6_then_connect(
                server.parse().expect("server"),
                name,
            ));
        }
        // SYVPN_ARG = "port address..."
        "udp-origin" => serve_udp_origin(&arg),
        // SYVPN_ARG = "destination count"
        "udp" => {
            let (dst, count) = arg.split_once(' ').expect("destination and count");
            result(&udp_round_trips(
                dst.parse().expect("destination"),
                count.parse().expect("count"),
            ));
        }
        // SYVPN_ARG = "local-address destination count"
        "udp-from" => {
            let mut words = arg.split(' ');
            let (Some(local), Some(dst), Some(count)) = (words.next(), words.next(), words.next())
            else {
                panic!("udp-from: {arg:?}");
            };
            result(&udp_round_trips_from(
                local,
                dst.parse().expect("destination"),
                count.parse().expect("count"),
            ));
        }
        // SYVPN_ARG = "destination size"
        "udp-large" => {
            let (dst, size) = arg.split_once(' ').expect("destination and size");
            result(&udp_large_round_trip(
                dst.parse().expect("destination"),
                size.parse().expect("size"),
            ));
        }
        "tcp" => {
            let (_, seen) = connect_and_read(arg.parse().expect("address"));
            result(&format!("seen={seen}"));
        }
        "tcp-outcome" => result(&tcp_outcome(arg.parse().expect("address"))),
        // SYVPN_ARG = "dns-server-address name"
        "dns-rcode" => {
            let (server, name) = arg.split_once(' ').expect("server and name");
            result(&dns_rcode(server.parse().expect("server"), name));
        }
        // connects, reports, then holds the connection until stdin closes
        "tcp-hold" => {
            let (_stream, seen) = connect_and_read(arg.parse().expect("address"));
            result(&format!("seen={seen}"));
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
        }
        // connects, sends BULK bytes, half-closes and waits for the origin to close
        "tcp-bulk" => {
            let (mut stream, seen) = connect_and_read(arg.parse().expect("address"));
            let block = vec![0x5a; 64 * 1024];
            let mut sent = 0;
            while sent < BULK {
                if stream.write_all(&block).is_err() {
                    break;
                }
                sent += block.len();
            }
            let _ = stream.shutdown(std::net::Shutdown::Write);
            let closed = matches!(stream.read(&mut [0u8; 16]), Ok(0));
            result(&format!("seen={seen} sent={sent} closed={closed}"));
        }
        // SYVPN_ARG = "dns-server-address name qtype"
        "dns-ask" => {
            let mut words = arg.split(' ');
            let (Some(server), Some(name), Some(qtype)) =
                (words.next(), words.next(), words.next())
            else {
                panic!("dns-ask: {arg:?}");
            };
            result(&dns_ask(
                server.parse().expect("server"),
                name,
                qtype.parse().expect("qtype"),
            ));
        }
        // SYVPN_ARG = "dns-server-address name"
        "resolve-tcp" => {
            let (server, name) = arg.split_once(' ').expect("server and name");
            result(&resolve_then_connect(server.parse().expect("server"), name));
        }
        other => panic!("unknown helper action {other}"),
    }
    std::process::exit(0)
}

// ---------- fixture ----------

/// Root, the tools, and a TUN device; else skip (fail under `CI`).
fn tools_or_skip(what: &str) -> bool {
    if !Path::new("/dev/net/tun").exists() {
        support::skip_unless_ci(&format!("{what}: no /dev/net/tun"));
        return false;
    }
    root_with_tools_or_skip(what, &["ip", "nft", "nsenter", "bpftool", "curl"])
}

/// [`tools_or_skip`] plus dnsmasq (the upstream DNS server) and tcpdump (the leak captures).
fn dns_tools_or_skip(what: &str) -> bool {
    tools_or_skip(what)
        && support::require("dnsmasq").is_some()
        && support::require("tcpdump").is_some()
}

fn cgroup2_mount() -> PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    info.lines()
        .find(|l| l.contains(" - cgroup2 "))
        .and_then(|l| l.split_whitespace().nth(4))
        .map(PathBuf::from)
        .expect("a cgroup2 mount")
}

static COUNTER: AtomicU32 = AtomicU32::new(0);
/// This test binary in helper mode inside `netns` (and `cgroup`).
fn helper_in(netns: &str, cgroup: Option<&Path>, action: &str, arg: &str) -> Command {
    netns::helper_in(netns, cgroup, ("SYVPN_HELPER", "SYVPN_ARG"), action, arg)
}

struct Topo {
    id: String,
    lan: String,
    net: String,
    scope: PathBuf,
    inc: PathBuf,
    exc: PathBuf,
    own: PathBuf,
    dir: tempfile::TempDir,
    children: Vec<Child>,
    server: Option<Listening>,
}

impl Topo {
    fn new() -> Topo {
        Topo::named("syvpn")
    }

    /// A topology whose namespaces, links and cgroups start with `prefix`.
    fn named(prefix: &str) -> Topo {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let id = format!("{prefix}{}{n}", std::process::id() % 100000);
        let (lan, net) = (format!("{id}-lan"), format!("{id}-net"));
        let scope = cgroup2_mount().join(&id);
        let topo = Topo {
            inc: scope.join("inc"),
            exc: scope.join("exc"),
            own: scope.join("own"),
            scope,
            lan,
            net,
            id: id.clone(),
            dir: tempfile::tempdir().expect("tempdir"),
            children: Vec::new(),
            server: None,
        };
        for dir in [&topo.scope, &topo.inc, &topo.exc, &topo.own] {
            std::fs::create_dir_all(dir).expect("cgroup");
        }
        let (l, t) = (&topo.lan, &topo.net);
        sh(&format!(
            "set -e; ip netns add {l}; ip netns add {t}
             ip link add {id}l netns {l} type veth peer name {id}n netns {t}
             ip -n {l} link set lo up; ip -n {t} link set lo up
             ip -n {l} addr add 10.210.0.2/24 dev {id}l; ip -n {l} link set {id}l up
             ip -n {t} addr add 10.210.0.1/24 dev {id}n; ip -n {t} link set {id}n up
             for a in 10.211.9.1 10.211.9.2 10.211.9.3; do ip -n {t} addr add $a/32 dev lo; done
             ip -n {l} route add default via 10.210.0.1"
        ));
        topo
    }

    /// Adds IPv6: lan fd00:210::2 — internet fd00:210::1 with origins on fd00:211:9::1-2, and a
    /// third namespace `-far` beyond the lan (a router hop away: not the directly connected LAN)
    /// with an origin on fd00:214::1 that the lan reaches directly and the server cannot reach.
    fn add_ipv6(&self) -> FarNetns {
        let (id, l, t) = (&self.id, &self.lan, &self.net);
        let far = FarNetns(format!("{id}-far"));
        let f = &far.0;
        sh(&format!(
            "set -e
             ip -n {l} addr add fd00:210::2/64 dev {id}l nodad
             ip -n {t} addr add fd00:210::1/64 dev {id}n nodad
             ip -n {t} addr add {ORIGIN6}/128 dev lo; ip -n {t} addr add {NAMED6}/128 dev lo
             ip -n {l} -6 route add default via fd00:210::1
             ip netns add {f}
             ip link add {id}f netns {l} type veth peer name {id}g netns {f}
             ip -n {f} link set lo up
             ip -n {l} addr add fd00:215::1/64 dev {id}f nodad; ip -n {l} link set {id}f up
             ip -n {f} addr add fd00:215::2/64 dev {id}g nodad; ip -n {f} link set {id}g up
             ip -n {f} addr add {FAR6}/128 dev lo
             ip -n {l} -6 route add fd00:214::/64 via fd00:215::2
             ip -n {f} -6 route add default via fd00:215::1"
        ));
        far
    }

    fn tun(&self) -> String {
        // interface names are at most 15 bytes
        let id = &self.id;
        format!("tun{}", &id[id.len().saturating_sub(10)..])
    }

    /// The UDP origin on port 7000 of the origin addresses.
    fn start_udp_origin(&mut self) {
        let net = self.net.clone();
        self.start_helper(&net, "udp-origin", "7000 10.211.9.1 10.211.9.2 10.211.9.3");
    }

    /// Starts the helper `action` in `netns` (stopped with the topology) once it says it is
    /// ready; its further result lines.
    fn start_helper(
        &mut self,
        netns: &str,
        action: &str,
        arg: &str,
    ) -> BufReader<std::process::ChildStdout> {
        let mut child = helper_in(netns, None, action, arg).spawn().expect(action);
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        assert_eq!(next_result(&mut out), "ready", "{action}");
        self.children.push(child);
        out
    }

    /// `seen=<address the UDP origin saw> replies=<n>` for `count` datagrams a process of
    /// `cgroup` exchanged with `dst`:7000.
    fn udp_seen(&self, cgroup: &Path, dst: &str, count: usize) -> String {
        self.probe(cgroup, "udp", &format!("{dst}:7000 {count}"))
    }

    /// What a process of `cgroup` saw sending one `size`-byte datagram to `dst`:7000 (see
    /// [`udp_large_round_trip`]).
    fn udp_large(&self, cgroup: &Path, dst: &str, size: usize) -> String {
        self.probe(cgroup, "udp-large", &format!("{dst}:7000 {size}"))
    }

    /// The result line of the helper `action` run once by a process of `cgroup` in the lan
    /// namespace.
    fn probe(&self, cgroup: &Path, action: &str, arg: &str) -> String {
        let mut child = helper_in(&self.lan, Some(cgroup), action, arg)
            .spawn()
            .expect("probe");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let r = next_result(&mut out);
        let _ = child.wait();
        r
    }

    fn start_origins(&mut self) {
        let mut child = helper_in(&self.net, None, "origin", "8080")
            .spawn()
            .expect("origin");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        assert_eq!(next_result(&mut out), "ready");
        self.children.push(child);
    }

    /// `switchyard server` in the internet namespace, request log on.
    fn start_server(&mut self) -> SocketAddr {
        let path = self.dir.path().join("server.yaml");
        std::fs::write(
            &path,
            "server:\n  http: {listen: \"10.210.0.1:0\"}\n  socks5: {listen: \"10.210.0.1:0\"}\n  cores: 1\n\
             api: {listen: \"127.0.0.1:0\", enable_request_log: true}\nlogging: {level: info, format: json}\n",
        )
        .expect("server config");
        let mut cmd = in_netns(&self.net, None, Path::new(BIN));
        cmd.args(["server", "--config"]).arg(&path);
        let s = spawn_with_listeners(
            cmd,
            "switchyard server",
            &["HTTP proxy", "management API", "SOCKS5 proxy"],
        );
        let http = s.addrs[0];
        self.server = Some(s);
        http
    }

    fn server_api(&self) -> SocketAddr {
        self.server.as_ref().expect("server").addrs[1]
    }

    fn server_socks5(&self) -> SocketAddr {
        self.server.as_ref().expect("server").addrs[2]
    }

    /// The server's live connections (`GET /api/v1/connections`).
    fn server_connections(&self) -> serde_json::Value {
        let (_, text) = curl_in(
            &self.net,
            "GET",
            &format!("http://{}/api/v1/connections", self.server_api()),
            None,
        );
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
    }

    fn client_yaml(
        &self,
        server: SocketAddr,
        enabled: bool,
        classifier: &str,
        split: &str,
    ) -> String {
        format!(
            "proxy:\n  http: {{listen: \"127.0.0.1:0\"}}\n  socks5: {{listen: \"127.0.0.1:0\"}}\n  cores: 1\n\
             api: {{listen: \"127.0.0.1:0\"}}\nlogging: {{level: info, format: json}}\n\
             servers:\n  - {{name: gw, address: \"{server}\", protocol: HTTP}}\n\
             vpn:\n  enabled: {enabled}\n  interface_name: {tun}\n  scope_cgroup: \"{scope}\"\n  classifier: {classifier}\n  dns: {{enabled: false}}\n  split: {split}\n",
            tun = self.tun(),
            scope = self.scope.display(),
        )
    }

    /// Starts `switchyard client` in the lan namespace, in the `own` cgroup.
    fn start_client(&self, yaml: &str) -> Client {
        self.start_client_with(yaml, in_netns(&self.lan, Some(&self.own), Path::new(BIN)))
    }

    /// Like [`Topo::start_client`], under `ip netns exec`, which remounts /sys: the client sees
    /// no cgroup2 mount.
    fn start_client_ip_netns_exec(&self, yaml: &str) -> Client {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!(
                "echo $$ > '{}/cgroup.procs' && exec ip netns exec {} \"$@\"",
                self.own.display(),
                self.lan
            ))
            .arg("sh")
            .arg(BIN);
        self.start_client_with(yaml, cmd)
    }

    fn start_client_with(&self, yaml: &str, mut cmd: Command) -> Client {
        let cfg = self.dir.path().join("client.yaml");
        std::fs::write(&cfg, yaml).expect("client config");
        cmd.arg("client")
            .arg("--config")
            .arg(&cfg)
            .arg("--data-dir")
            .arg(self.data_dir());
        let started = spawn_with_listeners(cmd, "switchyard client", &["client API listening"]);
        Client {
            api: started.addrs[0],
            lan: self.lan.clone(),
            proc: started,
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// What the origin saw when a process of `cgroup` connected to `dst` from the lan namespace.
    fn seen(&self, cgroup: &Path, dst: &str) -> String {
        let mut child = helper_in(&self.lan, Some(cgroup), "tcp", &format!("{dst}:8080"))
            .spawn()
            .expect("probe");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let r = next_result(&mut out);
        let _ = child.wait();
        r.trim_start_matches("seen=").to_string()
    }

    /// What a process of `cgroup` resolved `name` to (through 10.211.9.53) and what the origin
    /// at that address saw: `ip=A seen=B`.
    fn resolve_and_connect(&self, cgroup: &Path, name: &str) -> String {
        let arg = format!("{DNS}:53 {name}");
        let mut child = helper_in(&self.lan, Some(cgroup), "resolve-tcp", &arg)
            .spawn()
            .expect("probe");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let r = next_result(&mut out);
        let _ = child.wait();
        r
    }

    /// dnsmasq on 10.211.9.53 in the internet namespace, logging queries; returns the log path.
    fn start_dnsmasq(&mut self) -> PathBuf {
        self.start_dnsmasq_on(&[DNS])
    }

    /// dnsmasq on each of `addresses` (IPv4 or IPv6, added to the internet namespace's
    /// loopback), logging queries; returns the log path.
    fn start_dnsmasq_on(&mut self, addresses: &[&str]) -> PathBuf {
        let log = self.dir.path().join("dnsmasq.log");
        for a in addresses {
            let (prefix, nodad) = if a.contains(':') {
                (128, "nodad")
            } else {
                (32, "")
            };
            sh(&format!(
                "ip -n {} addr add {a}/{prefix} dev lo {nodad}",
                self.net
            ));
        }
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.net))
            .args([
                "dnsmasq",
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--user=root",
                "--bind-interfaces",
                &format!("--listen-address={}", addresses.join(",")),
                "--address=/a.tun.test/10.211.9.2",
                // an IPv6-only name (AAAA; its A question gets no address)
                &format!("--address=/v6.tun.test/{NAMED6}"),
                // b.plain.test, c.plain.test, … (each question a name not cached yet)
                "--address=/plain.test/10.211.9.1",
                // x.dual.test, y.dual.test, …: an A and an AAAA record each
                "--address=/dual.test/10.211.9.1",
                &format!("--address=/dual.test/{ORIGIN6}"),
                "--log-queries",
                // answers of --address carry TTL 0 unless told otherwise: nothing would be cached
                "--local-ttl=300",
            ])
            .arg(format!("--log-facility={}", log.display()))
            .arg(format!(
                "--pid-file={}",
                self.dir.path().join("dnsmasq.pid").display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("dnsmasq");
        self.children.push(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !addresses.iter().all(|a| {
            sh_quiet(&format!("nsenter --net=/run/netns/{} ss -lnu", self.net)).contains(a)
        }) {
            assert!(Instant::now() < deadline, "dnsmasq did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        log
    }

    /// tcpdump of port 53 on the lan namespace's veth (its physical link); stop with
    /// [`Capture::packets`].
    fn capture_dns(&self) -> Capture {
        self.capture("port 53")
    }

    /// tcpdump of what matches `filter` on the lan namespace's veth; stop with
    /// [`Capture::packets`].
    fn capture(&self, filter: &str) -> Capture {
        let mut child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.lan))
            .args(["tcpdump", "-i", &format!("{}l", self.id), "-n", "-l"])
            .args(filter.split(' '))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tcpdump");
        let mut err = BufReader::new(child.stderr.take().expect("stderr"));
        let mut line = String::new();
        while err.read_line(&mut line).unwrap_or(0) > 0 && !line.contains("listening on") {
            line.clear();
        }
        Capture { child }
    }

    /// The server's request log (as text).
    fn server_requests(&self) -> String {
        curl_in(
            &self.net,
            "GET",
            &format!("http://{}/api/v1/requests", self.server_api()),
            None,
        )
        .1
    }

    /// Waits (bounded) until the server's request log has a request for `target`: a tunnel is
    /// logged when it ends.
    fn wait_server_request(&self, target: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.server_requests();
            if log.contains(target) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "server request log has no {target}: {log}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Disables the client's VPN and checks that it left nothing of its own behind.
    fn disable_and_expect_nothing_left(&self, client: &Client) {
        let v = client.ok("POST", "/api/v1/vpn/disable", None);
        assert_eq!(v["status"], "disabled");
        assert_eq!(self.leftovers(), Vec::<String>::new());
    }

    /// What of the VPN is left in the lan namespace and the scope cgroup.
    fn leftovers(&self) -> Vec<String> {
        let l = &self.lan;
        let mut left = Vec::new();
        let rules = sh_quiet(&format!("ip -n {l} rule show; ip -n {l} -6 rule show"));
        if rules.contains(&format!("fwmark {MARK}")) || rules.contains(&format!("lookup {TABLE}")) {
            left.push(format!("ip rule: {rules}"));
        }
        let routes = sh_quiet(&format!(
            "ip -n {l} route show table {TABLE}; ip -n {l} -6 route show table {TABLE}"
        ));
        if !routes.trim().is_empty() {
            left.push(format!("routes: {}", routes.trim()));
        }
        let tables = sh_quiet(&format!("nsenter --net=/run/netns/{l} nft list tables"));
        if tables.contains("switchyard_split") {
            left.push("nft table".into());
        }
        let links = sh_quiet(&format!("ip -n {l} link show"));
        if links.contains(&self.tun()) {
            left.push("TUN device".into());
        }
        let attached = sh_quiet(&format!("bpftool cgroup show '{}'", self.scope.display()));
        if attached.lines().count() > 1 {
            left.push(format!("cgroup programs: {attached}"));
        }
        let pins = self.data_dir().join("bpffs");
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        if mounts.contains(&pins.display().to_string()) {
            left.push("bpffs mount".into());
        }
        let pinned = sh_quiet(&format!(
            "find '{}' -mindepth 1 2>/dev/null",
            pins.display()
        ));
        if !pinned.trim().is_empty() {
            left.push(format!("pins: {pinned}"));
        }
        left
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.server = None;
        // a failed test's client was killed: its rules go with the namespace, its cgroup
        // programs with the scope cgroup; only the pin mount needs undoing
        let pins = self.data_dir().join("bpffs");
        let _ = Command::new("umount")
            .arg(&pins)
            .stderr(Stdio::null())
            .status();
        for ns in [&self.lan, &self.net] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        remove_cgroups(&[
            &self.inc,
            &self.exc,
            &self.own,
            &self.scope.join("switchyard-split-apps"),
            &self.scope.join("switchyard-client"),
            &self.scope,
        ]);
    }
}

/// curl run inside `netns`: (status, body).
fn curl_in(netns: &str, method: &str, url: &str, body: Option<&str>) -> (u16, String) {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{netns}")).args([
        "curl",
        "-sS",
        "--max-time",
        "30",
        "-X",
        method,
        "-w",
        "\n%{http_code}",
    ]);
    if let Some(b) = body {
        cmd.args(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    let out = cmd.arg(url).output().expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

const DNS: &str = "10.211.9.53";

/// The IPv6 topology ([`Topo::add_ipv6`]): the lan's address, two origins of the internet
/// namespace (the second one is `v6.tun.test`) and the origin only the lan reaches.
const DIRECT6: &str = "fd00:210::2";
const ORIGIN6: &str = "fd00:211:9::1";
const NAMED6: &str = "fd00:211:9::2";
const FAR6: &str = "fd00:214::1";
/// The far side of the far namespace's link, the lan's address there.
const DIRECT6_FAR: &str = "fd00:215::1";

/// The namespace [`Topo::add_ipv6`] adds; deleted on drop.
struct FarNetns(String);

impl Drop for FarNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

struct Capture {
    child: Child,
}

impl Capture {
    /// Stops the capture and returns the packets it printed.
    fn packets(mut self) -> Vec<String> {
        // tcpdump writes each packet line at once (-l); give the last one a moment
        std::thread::sleep(Duration::from_millis(300));
        let _ = self.child.kill();
        let mut out = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        let _ = self.child.wait();
        out.lines().map(str::to_string).collect()
    }
}

struct Client {
    proc: Listening,
    api: SocketAddr,
    lan: String,
}

impl Client {
    fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, serde_json::Value) {
        let (status, text) = curl_in(
            &self.lan,
            method,
            &format!("http://{}{path}", self.api),
            body,
        );
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        )
    }

    fn ok(&self, method: &str, path: &str, body: Option<&str>) -> serde_json::Value {
        let (status, v) = self.call(method, path, body);
        assert_eq!(status, 200, "{method} {path}: {v}\nlog:\n{}", self.log());
        v
    }

    fn log(&self) -> String {
        self.proc
            .logs
            .lock()
            .map(|l| l.join("\n"))
            .unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.proc.proc.child.id()
    }
}

// ---------- the scenarios ----------

/// Asserts what the origin saw, with the client's log when it is not that.
fn expect_seen(topo: &Topo, client: &Client, cgroup: &Path, dst: &str, want: &str) {
    let seen = topo.seen(cgroup, dst);
    assert_eq!(
        seen,
        want,
        "{} → {dst}: origin saw {seen:?}, wanted {want}\nclient log:\n{}",
        cgroup.display(),
        client.log()
    );
}

/// A bulk upload through the VPN arrives whole and is counted in the status. With the nftables
/// classifier the TUN carried it in TSO super-packets: the device's average packet (data one
/// way, ACKs the other, both read by the pump) is larger than its MTU, which one segment per
/// packet can never be. With eBPF the classifier redirected it from connect(2) to the client's
/// loopback listener: it never crossed the TUN.
fn bulk_upload_through_the_vpn(topo: &Topo, client: &Client, classifier: &str) {
    let tun_tx = || {
        let stats = sh(&format!(
            "ip -n {} -j -s link show dev {}",
            topo.lan,
            topo.tun()
        ));
        let v: serde_json::Value = serde_json::from_str(&stats).expect("ip -j");
        let tx = &v[0]["stats64"]["tx"];
        let mtu = v[0]["mtu"].as_u64().expect("mtu");
        (
            tx["bytes"].as_u64().expect("bytes"),
            tx["packets"].as_u64().expect("packets"),
            mtu,
        )
    };
    let status_u64 = |field: &str| {
        client.ok("GET", "/api/v1/vpn/status", None)[field]
            .as_u64()
            .unwrap_or(0)
    };
    let (sent_before, redirected_before) = (status_u64("bytes_sent"), status_u64("tcp_redirected"));
    let (bytes_before, packets_before, mtu) = tun_tx();
    let out = helper_in(&topo.lan, Some(&topo.inc), "tcp-bulk", "10.211.9.2:8080")
        .output()
        .expect("bulk probe");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("seen=10.211.9.2 sent={BULK} closed=true")),
        "bulk upload through the VPN: {text}\n{}",
        client.log()
    );
    let (bytes, packets) = {
        let (b, p, _) = tun_tx();
        (b - bytes_before, p - packets_before)
    };
    let redirected = status_u64("tcp_redirected") - redirected_before;
    if classifier == "ebpf" {
        assert!(
            bytes < BULK as u64 / 10,
            "{bytes} bytes of a redirected upload crossed the TUN"
        );
        assert_eq!(redirected, 1, "flows redirected past the TUN");
        a_direct_connection_to_the_redirect_listener_is_reset(topo, client);
    } else {
        assert!(bytes >= BULK as u64, "{bytes} bytes crossed the TUN");
        assert!(
            bytes / packets.max(1) > mtu,
            "{packets} packets of {bytes} bytes on a TUN with MTU {mtu}: no super-packets"
        );
        assert_eq!(redirected, 0, "the nftables classifier redirects nothing");
    }
    let sent = status_u64("bytes_sent");
    assert!(
        sent - sent_before >= BULK as u64,
        "the status counted {} bytes sent",
        sent - sent_before
    );
}

/// A hostile local caller — any process, or a web page the browser fetches from loopback —
/// connects straight to the client's redirect listener (a privileged loopback port): no record
/// of the classifier names a destination for it, so it is reset and relayed nowhere.
fn a_direct_connection_to_the_redirect_listener_is_reset(topo: &Topo, client: &Client) {
    let listening = sh(&format!(
        "ip netns exec {} ss -Hltnp 'sport >= :900 and sport <= :1023'",
        topo.lan
    ));
    let port = listening
        .lines()
        .filter(|l| l.contains("switchyard") && l.contains("127.0.0.1:"))
        .find_map(|l| {
            l.split_whitespace()
                .nth(3)?
                .rsplit(':')
                .next()?
                .parse::<u16>()
                .ok()
        })
        .unwrap_or_else(|| panic!("no redirect listener on a privileged port: {listening}"));
    let redirected = || {
        client.ok("GET", "/api/v1/vpn/status", None)["tcp_redirected"]
            .as_u64()
            .unwrap_or(0)
    };
    let before = redirected();
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &topo.lan, "curl", "-sS", "-m", "5"])
        .args([
            "-H",
            "Host: 10.211.9.2:8080",
            "-H",
            "Origin: http://evil.example",
        ])
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .expect("curl");
    // the reset may reach curl before its connect completes (7), or after (52, 56); a
    // timeout (28) or an answer would be wrong
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(7 | 52 | 56)),
        "a direct connection to the redirect listener on {port}: {:?} {said}",
        out.status.code()
    );
    assert_eq!(
        redirected(),
        before,
        "a direct connection counted as redirected"
    );
}

/// Include and exclude mode, an IP rule added live, measured status and connections, disable
/// and `kill -9` + restart leaving nothing behind — with the given classifier.
fn vpn_scenario(classifier: &str) {
    let mut topo = Topo::new();
    topo.start_origins();
    let server = topo.start_server();
    // before the VPN, every cgroup goes direct
    assert_eq!(topo.seen(&topo.inc, "10.211.9.1"), DIRECT);

    let split = format!(
        "{{mode: include, apps: [{{name: inc-app, cgroup: \"{}\"}}]}}",
        topo.inc.display()
    );
    let client = topo.start_client(&topo.client_yaml(server, true, classifier, &split));
    let status = client.ok("GET", "/api/v1/vpn/status", None);
    assert_eq!(status["status"], "connected", "{status}\n{}", client.log());
    assert_eq!(status["mechanism"], classifier, "{status}");
    assert_eq!(status["ip"], "10.255.0.2");
    assert_eq!(status["local_ip"], status["ip"]);
    assert_eq!(status["connected_at"], status["connected_since"]);
    assert!(status["connected_at"].is_string(), "{status}");

    // include: the app's cgroup goes through the server, the other one direct
    let via = topo.seen(&topo.inc, "10.211.9.1");
    assert_eq!(
        via,
        "10.211.9.1",
        "inc app through the VPN and the server\n{}",
        client.log()
    );
    topo.wait_server_request("10.211.9.1:8080");
    expect_seen(&topo, &client, &topo.exc, "10.211.9.1", DIRECT);

    // ping to a tunnelled destination: answered from a probe through the server (its HTTP
    // CONNECT here; see syicmp_ for the rest)
    let said = ping(&topo, &topo.inc, &["-c", "1", "10.211.9.1"]);
    assert!(
        said.contains("bytes from 10.211.9.1: icmp_seq=1"),
        "{said}\n{}",
        client.log()
    );
    icmp_stats(&client, &[("echo_answered", 1)]);

    // an IP rule added live steers one destination of the other cgroup into the VPN
    client.ok(
        "POST",
        "/api/v1/vpn/split/ips",
        Some(r#"{"cidr":"10.211.9.3"}"#),
    );
    expect_seen(&topo, &client, &topo.exc, "10.211.9.3", "10.211.9.3");
    expect_seen(&topo, &client, &topo.exc, "10.211.9.2", DIRECT);
    let rules = client.ok("GET", "/api/v1/vpn/split/rules", None);
    assert_eq!(rules["ips"], serde_json::json!(["10.211.9.3"]));

    // a live flow is listed with its measured bytes, and the status counts bytes
    let mut hold = helper_in(&topo.lan, Some(&topo.inc), "tcp-hold", "10.211.9.2:8080")
        .spawn()
        .expect("probe");
    let mut out = BufReader::new(hold.stdout.take().expect("stdout"));
    assert_eq!(next_result(&mut out), "seen=10.211.9.2");
    // the relay counts a write once it completes, which may be just after the app read it
    let deadline = Instant::now() + Duration::from_secs(10);
    let flow = loop {
        let conns = client.ok("GET", "/api/v1/vpn/connections", None);
        let flow = conns
            .as_array()
            .expect("array")
            .iter()
            .find(|c| c["remote_addr"] == "10.211.9.2:8080")
            .cloned();
        match flow {
            Some(f) if f["bytes_received"] == 11 => break f, // "10.211.9.2\n"
            other => assert!(
                Instant::now() < deadline,
                "no live flow to 10.211.9.2 with 11 bytes received: {other:?} in {conns}"
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(flow["protocol"], "tcp");
    assert_application_address(&flow);
    drop(hold.stdin.take());
    let _ = hold.wait();
    let status = client.ok("GET", "/api/v1/vpn/status", None);
    assert!(
        status["bytes_received"].as_u64().unwrap_or(0) >= 33,
        "{status}"
    );

    bulk_upload_through_the_vpn(&topo, &client, classifier);

    // exclude: everything goes through the VPN except the listed app and IP
    let v = client.ok(
        "PUT",
        "/api/v1/vpn/split/mode",
        Some(r#"{"mode":"exclude"}"#),
    );
    assert_eq!(v["mode"], "exclude");
    expect_seen(&topo, &client, &topo.exc, "10.211.9.1", "10.211.9.1");
    expect_seen(&topo, &client, &topo.inc, "10.211.9.1", DIRECT);
    expect_seen(&topo, &client, &topo.exc, "10.211.9.3", DIRECT);
    let v = client.ok("DELETE", "/api/v1/vpn/split/ips/10.211.9.3", None);
    assert_eq!(v["status"], "removed");
    expect_seen(&topo, &client, &topo.exc, "10.211.9.3", "10.211.9.3");

    // disable leaves nothing behind, and traffic goes direct again
    assert!(
        topo.leftovers().len() >= 3,
        "while on: {:?}",
        topo.leftovers()
    );
    topo.disable_and_expect_nothing_left(&client);
    assert_eq!(
        client.ok("GET", "/api/v1/vpn/status", None)["status"],
        "disabled"
    );
    expect_seen(&topo, &client, &topo.exc, "10.211.9.1", DIRECT);

    // enable again, then kill -9: the next start cleans up before anything else
    let v = client.ok("POST", "/api/v1/vpn/enable", None);
    assert_eq!(v["status"], "enabled");
    expect_seen(&topo, &client, &topo.exc, "10.211.9.1", "10.211.9.1");
    sh(&format!("kill -9 {}", client.pid()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while sh_quiet(&format!("ip -n {} link show", topo.lan)).contains(&topo.tun()) {
        assert!(
            Instant::now() < deadline,
            "the TUN device outlived the client"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !topo.leftovers().is_empty(),
        "a killed client leaves its rules"
    );
    drop(client);
    let mut restarted = topo.start_client(&topo.client_yaml(server, false, classifier, &split));
    assert_eq!(
        topo.leftovers(),
        Vec::<String>::new(),
        "{}",
        restarted.log()
    );
    assert_eq!(
        restarted.ok("GET", "/api/v1/vpn/status", None)["status"],
        "disabled"
    );
    expect_seen(&topo, &restarted, &topo.exc, "10.211.9.1", DIRECT);

    // a clean stop (SIGTERM) takes the VPN down before the process exits
    let v = restarted.ok("POST", "/api/v1/vpn/enable", None);
    assert_eq!(v["status"], "enabled");
    assert!(
        !topo.leftovers().is_empty(),
        "while on: {:?}",
        topo.leftovers()
    );
    stop_client(&mut restarted);
    assert_eq!(
        topo.leftovers(),
        Vec::<String>::new(),
        "{}",
        restarted.log()
    );
}

#[test]
fn syvpn_ebpf_include_exclude_live_rules_and_cleanup() {
    if tools_or_skip("syvpn_ebpf_include_exclude_live_rules_and_cleanup") {
        vpn_scenario("ebpf");
    }
}

#[test]
fn syvpn_nftables_include_exclude_live_rules_and_cleanup() {
    if tools_or_skip("syvpn_nftables_include_exclude_live_rules_and_cleanup") {
        vpn_scenario("nftables");
    }
}

/// `vpn.split.allow_lan`: off, an included app's connection to a host of the directly connected
/// LAN goes through the tunnel and the server (which sits on that LAN itself and stays
/// reachable); turned on live through `PUT /api/v1/config`, the LAN is bypassed again.
#[test]
fn syvpn_allow_lan_false_tunnels_the_directly_connected_lan() {
    if !tools_or_skip("syvpn_allow_lan_false_tunnels_the_directly_connected_lan") {
        return;
    }
    let mut topo = Topo::new();
    // a second LAN host: the internet namespace's veth answers 10.210.0.5 too; a connection
    // through the server comes from the server's own LAN address, a direct one from 10.210.0.2
    const LAN_HOST: &str = "10.210.0.5";
    const SERVER: &str = "10.210.0.1";
    sh(&format!(
        "ip -n {} addr add {LAN_HOST}/24 dev {}n",
        topo.net, topo.id
    ));
    topo.start_origins();
    let server = topo.start_server();
    assert_eq!(topo.seen(&topo.inc, LAN_HOST), DIRECT);
    let split = format!(
        "{{mode: include, apps: [{{name: inc-app, cgroup: \"{}\"}}], allow_lan: false}}",
        topo.inc.display()
    );
    let client = topo.start_client(&topo.client_yaml(server, true, "ebpf", &split));
    let status = client.ok("GET", "/api/v1/vpn/status", None);
    assert_eq!(status["status"], "connected", "{status}\n{}", client.log());
    let rules = client.ok("GET", "/api/v1/vpn/split/rules", None);
    assert_eq!(rules["allow_lan"], false, "{rules}");

    expect_seen(&topo, &client, &topo.inc, LAN_HOST, SERVER);
    topo.wait_server_request(&format!("{LAN_HOST}:8080"));
    // the tunnel itself still works: the server's own address on that LAN is bypassed
    expect_seen(&topo, &client, &topo.inc, "10.211.9.1", "10.211.9.1");
    // the other cgroup is not tunnelled at all
    expect_seen(&topo, &client, &topo.exc, LAN_HOST, DIRECT);

    let v = client.ok(
        "PUT",
        "/api/v1/config",
        Some(r#"{"vpn":{"split":{"allow_lan":true}}}"#),
    );
    assert_eq!(v["status"], "updated", "{v}");
    let rules = client.ok("GET", "/api/v1/vpn/split/rules", None);
    assert_eq!(rules["allow_lan"], true, "{rules}");
    expect_seen(&topo, &client, &topo.inc, LAN_HOST, DIRECT);
    expect_seen(&topo, &client, &topo.inc, "10.211.9.1", "10.211.9.1");

    topo.disable_and_expect_nothing_left(&client);
}

/// A namespace of its own whose processes share the VPN's scope cgroups (a container, an
/// `ip netns` tool), with a TCP origin on 8080 and a DNS server on 127.0.0.1:53 (TCP and UDP).
struct Bystander {
    ns: String,
    children: Vec<Child>,
}

impl Bystander {
    fn new(topo: &Topo) -> Bystander {
        let ns = format!("{}-oth", topo.id);
        sh(&format!("ip netns add {ns}; ip -n {ns} link set lo up"));
        let mut b = Bystander {
            ns,
            children: Vec::new(),
        };
        for (action, arg) in [
            ("origin", "8080"),
            ("origin", "53"),
            ("udp-origin", "53 127.0.0.1"),
        ] {
            let mut child = helper_in(&b.ns, None, action, arg)
                .spawn()
                .expect("bystander server");
            let mut out = BufReader::new(child.stdout.take().expect("stdout"));
            assert_eq!(next_result(&mut out), "ready");
            b.children.push(child);
        }
        b
    }

    /// What a bystander process of `cgroup` gets from `action` `arg`.
    fn probe(&self, cgroup: &Path, action: &str, arg: &str) -> String {
        let mut child = helper_in(&self.ns, Some(cgroup), action, arg)
            .spawn()
            .expect("bystander probe");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let r = next_result(&mut out);
        let _ = child.wait();
        r
    }

    /// Its own origin and its own DNS server answer it, from every cgroup of the scope.
    fn assert_untouched(&self, topo: &Topo, client: &Client) {
        for cg in [&topo.exc, &topo.inc, &topo.scope] {
            let at = format!("bystander in {}\n{}", cg.display(), client.log());
            assert_eq!(
                self.probe(cg, "tcp", "127.0.0.1:8080"),
                "seen=127.0.0.1",
                "{at}"
            );
            assert_eq!(
                self.probe(cg, "tcp", "127.0.0.1:53"),
                "seen=127.0.0.1",
                "its DNS server over TCP: {at}"
            );
            assert_eq!(
                self.probe(cg, "udp", "127.0.0.1:53 2"),
                "seen=127.0.0.1 replies=2",
                "its DNS server over UDP: {at}"
            );
        }
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

/// The client under `ip netns exec` (no cgroup2 mount visible) mounts the hierarchy privately
/// and runs the VPN — DNS interception on, everything tunnelled — while a bystander namespace
/// whose processes share the scope cgroups keeps its own routes and DNS server; the private mount
/// goes with disable, and a kill -9 leaves nothing the next start does not remove.
fn bystander_scenario(classifier: &str) {
    let mut topo = Topo::named("syvns");
    topo.start_origins();
    let server = topo.start_server();
    let bystander = Bystander::new(&topo);
    // the scope relative to the cgroup2 root: /sys/fs/cgroup paths do not exist for the client
    let yaml = topo
        .client_yaml(server, true, classifier, "{mode: exclude}")
        .replace(&topo.scope.display().to_string(), &topo.id)
        .replace(
            "dns: {enabled: false}",
            &format!("dns: {{enabled: true, servers: [\"{DNS}\"]}}"),
        );
    let client = topo.start_client_ip_netns_exec(&yaml);
    let status = client.ok("GET", "/api/v1/vpn/status", None);
    assert_eq!(status["status"], "connected", "{status}\n{}", client.log());
    assert_eq!(status["mechanism"], classifier, "{status}");
    assert!(
        client.log().contains("mounted a private cgroup2 hierarchy"),
        "{}",
        client.log()
    );
    let private = topo.data_dir().join("cgroup2");
    let client_mounts =
        |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    assert!(
        client_mounts(client.pid()).contains(&format!(" {} ", private.display())),
        "the client's mount namespace has the private cgroup2 mount"
    );
    expect_seen(&topo, &client, &topo.exc, "10.211.9.1", "10.211.9.1");
    bystander.assert_untouched(&topo, &client);

    let v = client.ok("POST", "/api/v1/vpn/disable", None);
    assert_eq!(v["status"], "disabled");
    assert!(
        !client_mounts(client.pid()).contains(&format!(" {} ", private.display())),
        "disable unmounts it\n{}",
        client.log()
    );
    assert!(!private.exists(), "and removes its directory");
    assert_eq!(topo.leftovers(), Vec::<String>::new());

    // kill -9 while on: the next start (again without a visible cgroup2) removes what is left
    client.ok("POST", "/api/v1/vpn/enable", None);
    expect_seen(&topo, &client, &topo.exc, "10.211.9.1", "10.211.9.1");
    sh(&format!("kill -9 {}", client.pid()));
    drop(client);
    let restarted = topo.start_client_ip_netns_exec(
        &yaml.replace("enabled: true\n  interface", "enabled: false\n  interface"),
    );
    assert_eq!(
        restarted.ok("GET", "/api/v1/vpn/status", None)["status"],
        "disabled"
    );
    assert_eq!(
        topo.leftovers(),
        Vec::<String>::new(),
        "{}",
        restarted.log()
    );
    assert!(!private.exists(), "{}", restarted.log());
    assert!(
        !topo.scope.join("switchyard-split-apps").exists(),
        "the managed cgroup, created through the mount that died with the client, is removed\n{}",
        restarted.log()
    );
    bystander.assert_untouched(&topo, &restarted);
}

#[test]
fn syvns_ebpf_bystander_namespace_untouched_and_no_visible_cgroup2() {
    if tools_or_skip("syvns_ebpf_bystander_namespace_untouched_and_no_visible_cgroup2") {
        bystander_scenario("ebpf");
    }
}

#[test]
fn syvns_nftables_bystander_namespace_untouched_and_no_visible_cgroup2() {
    if tools_or_skip("syvns_nftables_bystander_namespace_untouched_and_no_visible_cgroup2") {
        bystander_scenario("nftables");
    }
}

/// Enabling fails cleanly: a TUN name the kernel refuses puts the VPN in `error` with the reason
/// and leaves nothing behind; disable returns it to `disabled`.
#[test]
fn syvpn_failed_enable_is_an_error_and_leaves_nothing() {
    if !tools_or_skip("syvpn_failed_enable_is_an_error_and_leaves_nothing") {
        return;
    }
    let mut topo = Topo::new();
    let server = topo.start_server();
    // a cgroup scope that does not exist makes the split tunnel fail after the TUN was created
    let yaml = topo
        .client_yaml(server, false, "ebpf", "{mode: include}")
        .replace(
            &topo.scope.display().to_string(),
            "/sys/fs/cgroup/syvpn-does-not-exist",
        );
    let client = topo.start_client(&yaml);
    let (status, v) = client.call("POST", "/api/v1/vpn/enable", None);
    assert_eq!(status, 500, "{v}");
    let st = client.ok("GET", "/api/v1/vpn/status", None);
    assert_eq!(st["status"], "error", "{st}");
    assert!(st["error"].as_str().is_some_and(|e| !e.is_empty()), "{st}");
    assert_eq!(topo.leftovers(), Vec::<String>::new());
    client.ok("POST", "/api/v1/vpn/disable", None);
    assert_eq!(
        client.ok("GET", "/api/v1/vpn/status", None)["status"],
        "disabled"
    );
}

/// The IPv6 address [`dns_scenario`]'s dnsmasq listens on besides [`DNS`].
const DNS6: &str = "fd00:211:9::53";

/// One question of [`dns_questions`]: where it went and its type, what came back, what should.
struct Question {
    asked: String,
    got: String,
    want: &'static str,
}

/// A process of `cgroup` (no app) asks each DNS server, over IPv4 and over IPv6, for the A and
/// the AAAA record of a fresh name under `dual.test`.
fn dns_questions(topo: &Topo, cgroup: &Path, tag: &str) -> Vec<Question> {
    let servers = [format!("{DNS}:53"), format!("[{DNS6}]:53")];
    let mut got = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        for (qtype, want) in [(1, "10.211.9.1"), (28, ORIGIN6)] {
            let name = format!("{tag}{i}q{qtype}.dual.test");
            let asked = format!("{server} {name} {qtype}");
            got.push(Question {
                got: topo.probe(cgroup, "dns-ask", &asked),
                asked,
                want,
            });
        }
    }
    got
}

/// Asserts every question of [`dns_questions`] was answered with its record, and none of them
/// (nor anything else on port 53) crossed the lan link.
fn assert_dns_intercepted(topo: &Topo, client: &Client, cgroup: &Path, tag: &str) {
    let capture = topo.capture_dns();
    let got = dns_questions(topo, cgroup, tag);
    let leaked = capture.packets();
    let wrong: Vec<String> = got
        .iter()
        .filter(|q| q.got != format!("answer={}", q.want))
        .map(|q| format!("{}: {} (wanted {})", q.asked, q.got, q.want))
        .collect();
    assert!(wrong.is_empty(), "{tag}: {wrong:#?}\n{}", client.log());
    assert!(
        leaked.is_empty(),
        "{tag}: DNS left by the lan link: {leaked:#?}\n{}",
        client.log()
    );
}

/// DNS interception (with the given classifier): a domain rule steers what its names resolve to
/// into the VPN, repeated questions are answered from the resolver's cache (dnsmasq sees one),
/// and while the VPN is on no DNS packet leaves by the lan link — questions for A and AAAA
/// records asked over IPv4 and over IPv6, in include mode by a process that is no app and in
/// exclude mode — which a capture shows it does without the VPN.
fn dns_scenario(classifier: &str) {
    let mut topo = Topo::new();
    let _far = topo.add_ipv6();
    topo.start_origins();
    let dns_log = topo.start_dnsmasq_on(&[DNS, DNS6]);
    let server = topo.start_server();
    let yaml = topo
        .client_yaml(
            server,
            true,
            classifier,
            "{mode: include, domains: [\"*.tun.test\"]}",
        )
        .replace(
            "dns: {enabled: false}",
            &format!("dns: {{enabled: true, servers: [\"{DNS}\"], cache_ttl: 5m}}"),
        );
    let client = topo.start_client(&yaml);
    let status = client.ok("GET", "/api/v1/vpn/status", None);
    assert_eq!(status["status"], "connected", "{status}\n{}", client.log());
    assert_eq!(status["mechanism"], classifier, "{status}");
    assert_eq!(status["dns"], serde_json::json!([DNS]));
    assert_eq!(status["dns_servers"], status["dns"]);

    // the domain rule: a name under *.tun.test goes through the VPN, another name direct
    let r = topo.resolve_and_connect(&topo.exc, "a.tun.test");
    assert_eq!(r, "ip=10.211.9.2 seen=10.211.9.2", "{}", client.log());
    let r = topo.resolve_and_connect(&topo.exc, "b.plain.test");
    assert_eq!(
        r,
        format!("ip=10.211.9.1 seen={DIRECT}"),
        "{}",
        client.log()
    );

    // the repeat is answered from the cache: dnsmasq saw the name once
    let r = topo.resolve_and_connect(&topo.exc, "a.tun.test");
    assert_eq!(r, "ip=10.211.9.2 seen=10.211.9.2");
    let queries = std::fs::read_to_string(&dns_log).unwrap_or_default();
    let asked = queries
        .lines()
        .filter(|l| l.contains("query[A] a.tun.test"))
        .count();
    assert_eq!(asked, 1, "dnsmasq log:\n{queries}");
    let cache = client.ok("GET", "/api/v1/vpn/dns/cache", None);
    assert_eq!(cache["enabled"], true, "{cache}");
    assert!(cache.to_string().contains("a.tun.test"), "{cache}");

    // include mode, a process that is no app: its flows go direct, its DNS does not — over
    // IPv4 or IPv6, for A or AAAA
    assert_dns_intercepted(&topo, &client, &topo.exc, "inc");

    // everything tunnelled: no DNS packet on the lan link, yet the name resolves
    client.ok(
        "PUT",
        "/api/v1/vpn/split/mode",
        Some(r#"{"mode":"exclude"}"#),
    );
    let capture = topo.capture_dns();
    let r = topo.resolve_and_connect(&topo.exc, "c.plain.test");
    assert_eq!(r, "ip=10.211.9.1 seen=10.211.9.1", "{}", client.log());
    let leaked = capture.packets();
    assert!(leaked.is_empty(), "DNS left by the lan link: {leaked:?}");
    assert_dns_intercepted(&topo, &client, &topo.exc, "exc");

    // disconnected, every flow goes direct and the running VPN's resolver follows at once: the
    // next question crosses the lan link; connected again, questions go through the server
    client.ok("POST", "/api/v1/disconnect", None);
    let capture = topo.capture_dns();
    let r = topo.resolve_and_connect(&topo.exc, "d.plain.test");
    assert_eq!(
        r,
        format!("ip=10.211.9.1 seen={DIRECT}"),
        "{}",
        client.log()
    );
    let seen = capture.packets();
    assert!(
        seen.iter().any(|l| l.contains(&format!("{DNS}.53"))),
        "disconnected, the resolver still forwarded through the server: {seen:?}\n{}",
        client.log()
    );
    client.ok("POST", "/api/v1/connect", None);
    let capture = topo.capture_dns();
    let r = topo.resolve_and_connect(&topo.exc, "e.plain.test");
    assert_eq!(r, "ip=10.211.9.1 seen=10.211.9.1", "{}", client.log());
    let leaked = capture.packets();
    assert!(
        leaked.is_empty(),
        "DNS left by the lan link after reconnecting: {leaked:?}"
    );

    // without the VPN the same questions do cross the link (the capture would see a leak)
    client.ok("POST", "/api/v1/vpn/disable", None);
    let capture = topo.capture_dns();
    let r = topo.resolve_and_connect(&topo.exc, "c.plain.test");
    assert_eq!(r, format!("ip=10.211.9.1 seen={DIRECT}"));
    let got = dns_questions(&topo, &topo.exc, "off");
    let seen = capture.packets();
    for server in [DNS, DNS6] {
        assert!(
            seen.iter().any(|l| l.contains(&format!("{server}.53"))),
            "the capture saw no direct DNS to {server}: {seen:#?}"
        );
    }
    let direct: Vec<&String> = got.iter().map(|q| &q.got).collect();
    assert!(
        got.iter().all(|q| q.got == format!("answer={}", q.want)),
        "direct answers: {direct:?}"
    );
    assert_eq!(topo.leftovers(), Vec::<String>::new());
}

#[test]
fn syvpn_ebpf_dns_domain_rule_cache_and_no_leak_v4_v6() {
    if dns_tools_or_skip("syvpn_ebpf_dns_domain_rule_cache_and_no_leak_v4_v6") {
        dns_scenario("ebpf");
    }
}

#[test]
fn syvpn_nftables_dns_domain_rule_cache_and_no_leak_v4_v6() {
    if dns_tools_or_skip("syvpn_nftables_dns_domain_rule_cache_and_no_leak_v4_v6") {
        dns_scenario("nftables");
    }
}

/// Fresh processes one after another, each a copy of this test binary started in the `exc`
/// cgroup (no app cgroup) of the lan namespace: alternately the copy named like the name rule and
/// the one at the path rule's path. Each resolves its own name through {DNS} (its first send) and
/// connects to the answer (its first connection); returns what each saw, with the dnsmasq log
/// line of its question.
fn fresh_app_flows(
    topo: &Topo,
    images: &[&Path],
    tag: &str,
    dns_log: &Path,
    count: usize,
) -> Vec<String> {
    (0..count)
        .map(|i| {
            let name = format!("{tag}{i}.plain.test");
            let image = images[i % images.len()];
            let mut child = netns::helper_copy_in(
                &topo.lan,
                Some(&topo.exc),
                image,
                ("SYVPN_HELPER", "SYVPN_ARG"),
                "resolve-tcp",
                &format!("{DNS}:53 {name}"),
            )
            .spawn()
            .expect("fresh app");
            let mut out = BufReader::new(child.stdout.take().expect("stdout"));
            let r = next_result(&mut out);
            let _ = child.wait();
            let image = image.file_name().unwrap_or_default().to_string_lossy();
            format!("{image} {r} dns-from={}", dns_asker(dns_log, &name))
        })
        .collect()
}

/// How many fresh processes [`fresh_app_flows`] starts per mode.
const FRESH_APPS: usize = 20;

/// The address dnsmasq saw asking for `name` (waiting, bounded, for its log line).
fn dns_asker(dns_log: &Path, name: &str) -> String {
    let needle = format!("query[A] {name} from ");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = std::fs::read_to_string(dns_log).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| l.contains(&needle)) {
            return line.rsplit(' ').next().unwrap_or_default().to_string();
        }
        if Instant::now() > deadline {
            return "nobody".into();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 38 item 2: apps by name or path are classified from a process's first socket, however
/// short-lived and however soon after the VPN came up (the client's /proc scan runs every 2 s and
/// would catch none of them): in include mode each goes through the VPN, in exclude mode each goes
/// direct, and its DNS question goes to the client's resolver (which asks through the server) in
/// both. A process matching no rule goes the other way. With eBPF the exec hook records each
/// process (and its records go with the processes); with nftables the exec watch (fanotify) moves
/// each into the apps cgroup before its exec returns, and counts it in the VPN status.
fn apps_from_their_first_connection_scenario(classifier: &str) {
    let nftables = classifier == "nftables";
    let mut topo = Topo::new();
    topo.start_origins();
    let dns_log = topo.start_dnsmasq();
    let server = topo.start_server();
    // copies of this test binary: one named like the name rule, one at the path rule's path
    // under a name no rule has
    let bin = topo.dir.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    let by_name = bin.join("syapp-by-name");
    let by_path = bin.join("pathapp");
    let exe = std::env::current_exe().expect("test exe");
    for copy in [&by_name, &by_path] {
        if std::fs::hard_link(&exe, copy).is_err() {
            std::fs::copy(&exe, copy).expect("copy the test binary");
        }
    }
    // and bash under a rule's name, whose subshell (a fork without exec) connects
    let shell = bin.join("syapp-shell");
    std::fs::copy("/bin/bash", &shell).expect("copy bash");
    let split = format!(
        "{{mode: include, apps: [{{name: syapp-by-name}}, {{name: by-path, path: \"{}\"}}, {{name: syapp-shell}}]}}",
        by_path.display()
    );
    let yaml = topo.client_yaml(server, true, classifier, &split).replace(
        "dns: {enabled: false}",
        &format!("dns: {{enabled: true, servers: [\"{DNS}\"]}}"),
    );
    let client = topo.start_client(&yaml);
    let status = client.ok("GET", "/api/v1/vpn/status", None);
    assert_eq!(status["status"], "connected", "{status}\n{}", client.log());
    assert_eq!(status["mechanism"], classifier, "{status}");
    // nftables: filesystem marks for the name rules, an inode mark on the path rule's file
    let marks = exec_watch_marks(client.pid());
    if nftables {
        assert!(
            marks.is_some_and(|(fs, inodes)| fs > 0 && inodes == 1),
            "{marks:?}"
        );
    } else {
        assert_eq!(marks, None);
    }

    let images = [by_name.as_path(), by_path.as_path()];
    let tunnelled = "ip=10.211.9.1 seen=10.211.9.1";
    let direct = format!("ip=10.211.9.1 seen={DIRECT}");
    let check = |flows: Vec<String>, want: &str| {
        let wrong: Vec<&String> = flows
            .iter()
            .filter(|f| {
                !f.contains(&format!(" {want} "))
                    || f.ends_with(&format!("dns-from={DIRECT}"))
                    || f.ends_with("dns-from=nobody")
            })
            .collect();
        assert!(
            wrong.is_empty(),
            "{} of {FRESH_APPS} fresh apps went the wrong way (wanted {want}, DNS through the resolver): {wrong:#?}\nclient log:\n{}",
            wrong.len(),
            client.log()
        );
    };
    // include: every app through the VPN from its first connection
    check(
        fresh_app_flows(&topo, &images, "inc", &dns_log, FRESH_APPS),
        tunnelled,
    );
    // a process matching no rule goes direct
    expect_seen(&topo, &client, &topo.exc, "10.211.9.1", DIRECT);
    // an app's forked child (no exec of its own) is that app from its first connection
    let forked = in_netns(&topo.lan, Some(&topo.exc), &shell)
        .args([
            "-c",
            "(exec 3<>/dev/tcp/10.211.9.1/8080; read -r seen <&3; echo \"seen=$seen\")",
        ])
        .output()
        .expect("app shell");
    let said = String::from_utf8_lossy(&forked.stdout);
    assert_eq!(said.trim(), "seen=10.211.9.1", "{}", client.log());

    client.ok(
        "PUT",
        "/api/v1/vpn/split/mode",
        Some(r#"{"mode":"exclude"}"#),
    );
    // exclude: every app direct from its first connection
    check(
        fresh_app_flows(&topo, &images, "exc", &dns_log, FRESH_APPS),
        &direct,
    );
    expect_seen(&topo, &client, &topo.exc, "10.211.9.1", "10.211.9.1");

    // the name rule removed live: a fresh process of that name is no app any more (tunnelled in
    // exclude mode), one at the rule's path still is
    client.ok("DELETE", "/api/v1/vpn/split/apps/syapp-by-name", None);
    let flows = fresh_app_flows(&topo, &images, "del", &dns_log, 2);
    assert!(flows[0].contains(&format!(" {tunnelled} ")), "{flows:?}");
    assert!(flows[1].contains(&format!(" {direct} ")), "{flows:?}");

    let status = client.ok("GET", "/api/v1/vpn/status", None);
    if !nftables {
        // the exec hook's records went with the processes (exit hook)
        let pinned = topo.data_dir().join("bpffs/maps/sy_app_tgids");
        let dump = sh_quiet(&format!(
            "bpftool -j map dump pinned '{}'",
            pinned.display()
        ));
        let records: serde_json::Value = serde_json::from_str(&dump).unwrap_or_default();
        assert_eq!(records, serde_json::json!([]), "{dump}");
        assert!(status.get("app_execs").is_none(), "{status}");
    } else {
        // every fresh app (and the shell) was moved at its exec
        let moved = status["app_execs"]["moved"].as_u64().unwrap_or(0);
        assert!(moved > 2 * FRESH_APPS as u64, "{status}");
        assert!(
            status["app_execs"]["seen"].as_u64() >= Some(moved),
            "{status}"
        );
        // the last name rule removed: the filesystem marks go, the path rule's stays
        client.ok("DELETE", "/api/v1/vpn/split/apps/syapp-shell", None);
        assert_eq!(exec_watch_marks(client.pid()), Some((0, 1)));
    }

    client.ok("POST", "/api/v1/vpn/disable", None);
    assert_eq!(topo.leftovers(), Vec::<String>::new());
    assert_eq!(
        exec_watch_marks(client.pid()),
        None,
        "disable closes the group"
    );
}

/// The marks of a process's fanotify group (the nftables exec watch), from its fdinfo:
/// (filesystem marks, inode marks); `None` when it has no group.
fn exec_watch_marks(pid: u32) -> Option<(usize, usize)> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    let fanotify = fds.flatten().find(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:[fanotify]")
    })?;
    let info = std::fs::read_to_string(format!(
        "/proc/{pid}/fdinfo/{}",
        fanotify.file_name().to_string_lossy()
    ))
    .unwrap_or_default();
    let count = |prefix: &str| info.lines().filter(|l| l.starts_with(prefix)).count();
    Some((count("fanotify sdev:"), count("fanotify ino:")))
}

#[test]
fn syvpn_ebpf_apps_by_name_and_path_from_their_first_connection() {
    if tools_or_skip("syvpn_ebpf_apps_by_name_and_path_from_their_first_connection")
        && support::require("dnsmasq").is_some()
    {
        apps_from_their_first_connection_scenario("ebpf");
    }
}

#[test]
fn syvpn_nftables_apps_by_name_and_path_from_their_first_connection() {
    if tools_or_skip("syvpn_nftables_apps_by_name_and_path_from_their_first_connection")
        && support::require("dnsmasq").is_some()
    {
        apps_from_their_first_connection_scenario("nftables");
    }
}

/// The processes the exec hook recorded (`sy_app_tgids` keys), read with bpftool from the pins
/// of the client at `data_dir`.
fn recorded_app_tgids(data_dir: &Path) -> Vec<u32> {
    let pinned = data_dir.join("bpffs/maps/sy_app_tgids");
    let dump = sh_quiet(&format!(
        "bpftool -j map dump pinned '{}'",
        pinned.display()
    ));
    let records: serde_json::Value = serde_json::from_str(&dump).unwrap_or_default();
    let key = |record: &serde_json::Value| -> Option<u32> {
        // with BTF bpftool adds the typed form; else the key's bytes, "0x.." each, little endian
        if let Some(k) = record["formatted"]["key"].as_u64() {
            return u32::try_from(k).ok();
        }
        let bytes = record["key"]
            .as_array()?
            .iter()
            .map(|b| u8::from_str_radix(b.as_str()?.trim_start_matches("0x"), 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        Some(u32::from_le_bytes(bytes.try_into().ok()?))
    };
    records
        .as_array()
        .map(|all| all.iter().filter_map(key).collect())
        .unwrap_or_default()
}

/// The cgroup v2 directory of a process (from `/proc/PID/cgroup`).
fn cgroup_of(pid: u32) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let rel = text
        .lines()
        .find_map(|l| l.strip_prefix("0::/"))
        .unwrap_or_default();
    cgroup2_mount().join(rel)
}

/// The exec hook (eBPF) or exec watch (nftables) acts only in the client's network namespace: a
/// process named like a name rule started in a bystander namespace whose processes share the
/// scope cgroups is not recorded as an app (eBPF) nor moved out of its cgroup (nftables: that
/// cgroup is not the client's to change) and reaches its own origin untouched, while the same
/// image started in the client's namespace is recorded (or moved into the apps cgroup) and
/// tunnelled.
fn exec_hook_bystander_scenario(classifier: &str) {
    let mut topo = Topo::new();
    topo.start_origins();
    let server = topo.start_server();
    let bystander = Bystander::new(&topo);
    let bin = topo.dir.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    let by_name = bin.join("syapp-by-name");
    let exe = std::env::current_exe().expect("test exe");
    if std::fs::hard_link(&exe, &by_name).is_err() {
        std::fs::copy(&exe, &by_name).expect("copy the test binary");
    }
    let split = "{mode: include, apps: [{name: syapp-by-name}]}";
    let client = topo.start_client(&topo.client_yaml(server, true, classifier, split));
    let status = client.ok("GET", "/api/v1/vpn/status", None);
    assert_eq!(status["status"], "connected", "{status}\n{}", client.log());
    assert_eq!(status["mechanism"], classifier, "{status}");

    // the app, started in each namespace (the scope's exc cgroup), holding its connection
    let hold = |netns: &str, dst: &str| {
        let mut child = netns::helper_copy_in(
            netns,
            Some(&topo.exc),
            &by_name,
            ("SYVPN_HELPER", "SYVPN_ARG"),
            "tcp-hold",
            dst,
        )
        .spawn()
        .expect("app");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let seen = next_result(&mut out);
        (child, seen)
    };
    let (mut own, own_seen) = hold(&topo.lan, "10.211.9.1:8080");
    let (mut other, other_seen) = hold(&bystander.ns, "127.0.0.1:8080");
    assert_eq!(own_seen, "seen=10.211.9.1", "{}", client.log());
    assert_eq!(other_seen, "seen=127.0.0.1", "{}", client.log());
    if classifier == "ebpf" {
        let recorded = recorded_app_tgids(&topo.data_dir());
        assert!(
            recorded.contains(&own.id()),
            "the app in the client's namespace ({}) is recorded: {recorded:?}",
            own.id()
        );
        assert!(
            !recorded.contains(&other.id()),
            "the bystander's process ({}) is recorded: {recorded:?}",
            other.id()
        );
    } else {
        let apps = topo.scope.join("switchyard-split-apps");
        assert_eq!(cgroup_of(own.id()), apps, "{}", client.log());
        assert_eq!(cgroup_of(other.id()), topo.exc, "{}", client.log());
    }
    for child in [&mut own, &mut other] {
        drop(child.stdin.take());
        let _ = child.wait();
    }
    bystander.assert_untouched(&topo, &client);

    client.ok("POST", "/api/v1/vpn/disable", None);
    assert_eq!(topo.leftovers(), Vec::<String>::new());
}

#[test]
fn syvpn_ebpf_exec_hook_leaves_a_bystander_namespace_alone() {
    if tools_or_skip("syvpn_ebpf_exec_hook_leaves_a_bystander_namespace_alone") {
        exec_hook_bystander_scenario("ebpf");
    }
}

#[test]
fn syvpn_nftables_exec_hook_leaves_a_bystander_namespace_alone() {
    if tools_or_skip("syvpn_nftables_exec_hook_leaves_a_bystander_namespace_alone") {
        exec_hook_bystander_scenario("nftables");
    }
}

/// A VPN flow's `local_addr` is the application's own address, not the NAT address
/// (`vpn.tun.gateway`, 10.255.0.1 by default) the kernel shows the relay.
fn assert_application_address(flow: &serde_json::Value) {
    let local = flow["local_addr"].as_str().unwrap_or("");
    assert!(
        !local.is_empty() && !local.starts_with("10.255.0.1:"),
        "local_addr {local:?} is the NAT address: {flow}"
    );
}

/// The live VPN flow of `protocol` to `remote`, once the relay has counted `received` bytes
/// towards the application (bounded wait).
fn vpn_flow(client: &Client, protocol: &str, remote: &str, received: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let conns = client.ok("GET", "/api/v1/vpn/connections", None);
        let flow = conns.as_array().and_then(|all| {
            all.iter()
                .find(|c| c["protocol"] == protocol && c["remote_addr"] == remote)
                .cloned()
        });
        match flow {
            Some(f) if f["bytes_received"] == received => {
                assert_application_address(&f);
                return f;
            }
            other => assert!(
                Instant::now() < deadline,
                "no live {protocol} flow to {remote} with {received} bytes received: {other:?} in {conns}"
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The client in include mode (the `inc` cgroup is the app) with the server's SOCKS5 selected,
/// its HTTP proxy as the second server `gw-http`, and a `direct` route for 10.211.9.3; once the
/// VPN is connected.
fn start_include_client(
    topo: &Topo,
    classifier: &str,
    socks: SocketAddr,
    http: SocketAddr,
) -> Client {
    let yaml = include_client_yaml(topo, classifier, socks).replace(
        "vpn:\n",
        &format!("  - {{name: gw-http, address: \"{http}\", protocol: HTTP}}\nvpn:\n"),
    ) + "routing:\n  routes:\n    - {name: to-direct, patterns: [\"10.211.9.3\"], action: direct}\n";
    start_connected_client(topo, &yaml)
}

/// The client configuration with the `inc` cgroup as the app (include mode) and the server's
/// SOCKS5 selected.
fn include_client_yaml(topo: &Topo, classifier: &str, socks: SocketAddr) -> String {
    let split = format!(
        "{{mode: include, apps: [{{name: inc-app, cgroup: \"{}\"}}]}}",
        topo.inc.display()
    );
    topo.client_yaml(socks, true, classifier, &split)
        .replace("protocol: HTTP", "protocol: SOCKS5")
}

/// Starts the client on `yaml`; once its VPN is connected.
fn start_connected_client(topo: &Topo, yaml: &str) -> Client {
    let client = topo.start_client(yaml);
    let status = client.ok("GET", "/api/v1/vpn/status", None);
    assert_eq!(status["status"], "connected", "{status}\n{}", client.log());
    client
}

/// UDP through the VPN path (with the given classifier): an app of the included cgroup exchanges datagrams with a UDP origin
/// through the server's SOCKS5 UDP ASSOCIATE (the origin sees the server's address, the server
/// lists the association), a `direct` client route relays them from the client's own address,
/// and the excluded cgroup never enters the tunnel. The client lists the flows as `udp`
/// connections with their measured bytes, and its status counts them.
fn udp_scenario(classifier: &str) {
    let mut topo = Topo::named("syvu");
    topo.start_udp_origin();
    let http = topo.start_server();
    let socks = topo.server_socks5();
    // before the VPN, every cgroup goes direct
    assert_eq!(
        topo.udp_seen(&topo.inc, "10.211.9.1", 1),
        format!("seen={DIRECT} replies=1")
    );

    let client = start_include_client(&topo, classifier, socks, http);

    // through the server: the origin sees the server's own address, three round trips on one flow
    let via = topo.udp_seen(&topo.inc, "10.211.9.1", 3);
    assert_eq!(
        via,
        "seen=10.211.9.1 replies=3",
        "inc app's UDP through the VPN and the server\n{}",
        client.log()
    );
    // "datagram N" is 10 bytes; each answer is "10.211.9.1 datagram N", 21 bytes
    let flow = vpn_flow(&client, "udp", "10.211.9.1:7000", 63);
    assert_eq!(flow["bytes_sent"], 30, "{flow}");
    // the server relayed it on a SOCKS5 UDP association from the client
    let conns = topo.server_connections();
    let association = conns["connections"]
        .as_array()
        .and_then(|all| {
            all.iter()
                .find(|c| c["protocol"] == "SOCKS5" && c["host"] == "10.211.9.1:7000")
                .cloned()
        })
        .unwrap_or_else(|| panic!("no SOCKS5 association on the server: {conns}"));
    assert_eq!(association["client_ip"], DIRECT, "{association}");
    assert_eq!(association["bytes_recv"], 30, "{association}");
    assert_eq!(association["bytes_sent"], 63, "{association}");

    // a direct route: relayed by the client from its own address, still through the TUN
    assert_eq!(
        topo.udp_seen(&topo.inc, "10.211.9.3", 2),
        format!("seen={DIRECT} replies=2"),
        "{}",
        client.log()
    );
    let flow = vpn_flow(&client, "udp", "10.211.9.3:7000", 42);
    assert_eq!(flow["bytes_sent"], 20, "{flow}");

    // the excluded cgroup is not tunnelled at all
    assert_eq!(
        topo.udp_seen(&topo.exc, "10.211.9.2", 1),
        format!("seen={DIRECT} replies=1")
    );
    let conns = client.ok("GET", "/api/v1/vpn/connections", None);
    assert!(
        !conns.to_string().contains("10.211.9.2:7000"),
        "excluded traffic in the VPN: {conns}"
    );

    // the status counts the UDP payload both ways, and the two open flows (the pump publishes
    // its flow count once a second)
    let status = client.ok("GET", "/api/v1/vpn/status", None);
    assert_eq!(status["bytes_sent"], 50, "{status}");
    assert_eq!(status["bytes_received"], 105, "{status}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = client.ok("GET", "/api/v1/vpn/status", None);
        if status["flows"] == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{status}");
        std::thread::sleep(Duration::from_millis(100));
    }

    // a datagram far larger than the TUN's MTU enters it as IPv4 fragments, and so does the
    // answer the relay sends back: both are reassembled, through the server and direct
    for (dst, seen) in [("10.211.9.1", "10.211.9.1"), ("10.211.9.3", DIRECT)] {
        let size = 30_000;
        let answer = size + seen.len() + 1;
        assert_eq!(
            topo.udp_large(&topo.inc, dst, size),
            format!("seen={seen} bytes={answer}"),
            "a {size}-byte datagram through the VPN to {dst}\n{}",
            client.log()
        );
    }

    // through a server reached over HTTP, UDP cannot go (CONNECT is TCP): its datagrams are
    // dropped and counted — and do not leak direct. (The kernel's own IPv6 packets on the device
    // are dropped too, hence "at least".)
    client.ok("POST", "/api/v1/servers/gw-http/select", None);
    let before = status["dropped"].as_u64().unwrap_or(0);
    assert_eq!(
        topo.udp_seen(&topo.inc, "10.211.9.2", 1),
        "seen=nothing replies=0",
        "{}",
        client.log()
    );
    let status = client.ok("GET", "/api/v1/vpn/status", None);
    let after = status["dropped"].as_u64().unwrap_or(0);
    assert!(after >= before + 3, "three attempts dropped: {status}");
    // while TCP still goes through that server
    topo.start_origins();
    expect_seen(&topo, &client, &topo.inc, "10.211.9.1", "10.211.9.1");

    topo.disable_and_expect_nothing_left(&client);
}

#[test]
fn syvu_ebpf_udp_through_the_server_socks5_association_and_direct() {
    if tools_or_skip("syvu_ebpf_udp_through_the_server_socks5_association_and_direct") {
        udp_scenario("ebpf");
    }
}

#[test]
fn syvu_nftables_udp_through_the_server_socks5_association_and_direct() {
    if tools_or_skip("syvu_nftables_udp_through_the_server_socks5_association_and_direct") {
        udp_scenario("nftables");
    }
}

/// The VPN's flows through a server reached over QUIC: UDP as QUIC datagrams, TCP as streams.
#[test]
fn syquic_vpn_udp_and_tcp_through_a_quic_server() {
    if !tools_or_skip("syquic_vpn_udp_and_tcp_through_a_quic_server") {
        return;
    }
    let mut topo = Topo::named("syquic");
    topo.start_udp_origin();
    let path = topo.dir.path().join("server.yaml");
    std::fs::write(
        &path,
        format!(
            "server:\n  http: {{listen: \"10.210.0.1:0\"}}\n  socks5: {{enabled: false}}\n  cores: 1\n\
             \x20 data_dir: \"{}\"\n  quic: {{listen: \"10.210.0.1:0\"}}\n\
             api: {{listen: \"127.0.0.1:0\", enable_request_log: true}}\nlogging: {{level: info, format: json}}\n",
            topo.dir.path().join("server-data").display()
        ),
    )
    .expect("server config");
    let mut cmd = in_netns(&topo.net, None, Path::new(BIN));
    cmd.args(["server", "--config"]).arg(&path);
    let s = spawn_with_listeners(
        cmd,
        "switchyard server",
        &["HTTP proxy", "management API", "QUIC transport listening"],
    );
    let quic = s.addrs[2];
    topo.server = Some(s);
    let (net, api) = (topo.net.clone(), topo.server_api());
    let quic_status = move || -> serde_json::Value {
        let (_, text) = curl_in(&net, "GET", &format!("http://{api}/api/v1/quic"), None);
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
    };
    let fingerprint = quic_status()["fingerprint"]
        .as_str()
        .expect("fingerprint")
        .to_owned();
    let split = format!(
        "{{mode: include, apps: [{{name: inc-app, cgroup: \"{}\"}}]}}",
        topo.inc.display()
    );
    let yaml = topo.client_yaml(quic, true, "nftables", &split).replace(
        "protocol: HTTP",
        &format!("protocol: QUIC, fingerprint: \"{fingerprint}\""),
    );
    let client = topo.start_client(&yaml);
    let status = client.ok("GET", "/api/v1/vpn/status", None);
    assert_eq!(status["status"], "connected", "{status}\n{}", client.log());

    // UDP through the server: the origin sees the server's address, three round trips
    assert_eq!(
        topo.udp_seen(&topo.inc, "10.211.9.1", 3),
        "seen=10.211.9.1 replies=3",
        "{}",
        client.log()
    );
    let q = quic_status();
    assert!(q["datagrams_received"].as_u64().unwrap_or(0) >= 3, "{q}");
    // TCP through the same connection
    topo.start_origins();
    expect_seen(&topo, &client, &topo.inc, "10.211.9.1", "10.211.9.1");
    let q = quic_status();
    assert_eq!(q["connections_total"], 1, "{q}");
    assert!(q["streams_total"].as_u64().unwrap_or(0) >= 1, "{q}");

    topo.disable_and_expect_nothing_left(&client);
}

/// `curl -6` of the IPv6 HTTP origin at `[ip]:8086` by a process of `cgroup` in the lan
/// namespace: (curl's exit code, body, stderr).
fn curl6(topo: &Topo, cgroup: &Path, ip: &str) -> (i32, Vec<u8>, String) {
    curl_origin(topo, cgroup, ip)
}

/// `curl` of the HTTP origin at `ip`:8086 (IPv4 or IPv6, which that origin listens on both)
/// by a process of `cgroup` in the lan namespace: (curl's exit code, body, stderr).
fn curl_origin(topo: &Topo, cgroup: &Path, ip: &str) -> (i32, Vec<u8>, String) {
    let (family, url) = if ip.contains(':') {
        ("-6", format!("http://[{ip}]:8086/"))
    } else {
        ("-4", format!("http://{ip}:8086/"))
    };
    let out = in_netns(&topo.lan, Some(cgroup), Path::new("curl"))
        .args(["-sS", family, "--max-time", "20"])
        .arg(url)
        .output()
        .expect("curl");
    (
        out.status.code().unwrap_or(-1),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The first line of a [`curl6`] body: the address the origin saw.
fn curl6_seen(topo: &Topo, cgroup: &Path, ip: &str) -> String {
    let (code, body, err) = curl6(topo, cgroup, ip);
    assert_eq!(code, 0, "curl -6 [{ip}]: {err}");
    let body = String::from_utf8_lossy(&body).into_owned();
    body.lines().next().unwrap_or_default().to_string()
}

/// The status reports the TUN's IPv6 address (the one the device carries) and gateway beside
/// the IPv4 ones (the defaults of `vpn.tun.address6` and `gateway6`).
fn assert_tun6_in_status(topo: &Topo, status: &serde_json::Value) {
    assert_eq!(status["ip6"], "fd7a:5359:5400::2", "{status}");
    assert_eq!(status["gateway6"], "fd7a:5359:5400::1", "{status}");
    assert_eq!(status["ip"], "10.255.0.2", "{status}");
    let addrs = sh(&format!(
        "ip -n {} -j -6 addr show dev {}",
        topo.lan,
        topo.tun()
    ));
    assert!(
        addrs.contains("\"local\":\"fd7a:5359:5400::2\""),
        "the TUN carries another IPv6 address: {addrs}"
    );
}

/// IPv6 through the VPN (with the given classifier), the server a SOCKS5 proxy that reaches
/// the internet namespace's IPv6 origins: `curl -6` of an included app arrives byte-exact
/// through the TUN and the server; its UDP too (a SOCKS5 association with an IPv6 target); an
/// AAAA answer of the resolver puts the name's IPv6 address into the split set (a domain rule
/// tunnels the excluded cgroup's flow to it); ping -6 is answered. Fail closed: a tunnelled flow to an IPv6 origin the server cannot reach is
/// reset at once, and that origin — which the lan reaches directly — sees no connection.
fn ipv6_scenario(classifier: &str) {
    let mut topo = Topo::named("syv6");
    let far = topo.add_ipv6();
    // kept open: the origin reports each connection on it
    let _origin_seen = topo.start_helper(&topo.net.clone(), "http6-origin", "8086");
    let mut far_seen = topo.start_helper(&far.0, "http6-origin", "8086");
    topo.start_helper(&topo.net.clone(), "udp-origin", &format!("7000 {ORIGIN6}"));
    let dns_log = topo.start_dnsmasq();
    topo.start_server();
    let socks = topo.server_socks5();
    // before the VPN, IPv6 goes direct
    assert_eq!(curl6_seen(&topo, &topo.inc, ORIGIN6), DIRECT6);

    let split = format!(
        "{{mode: include, apps: [{{name: inc-app, cgroup: \"{}\"}}], domains: [\"*.tun.test\"]}}",
        topo.inc.display()
    );
    let yaml = topo
        .client_yaml(socks, true, classifier, &split)
        .replace("protocol: HTTP", "protocol: SOCKS5")
        .replace(
            "dns: {enabled: false}",
            &format!("dns: {{enabled: true, servers: [\"{DNS}\"], cache_ttl: 5m}}"),
        );
    let client = topo.start_client(&yaml);
    let status = client.ok("GET", "/api/v1/vpn/status", None);
    assert_eq!(status["status"], "connected", "{status}\n{}", client.log());
    assert_tun6_in_status(&topo, &status);

    // the included app's IPv6 flow crosses the TUN and the server: the origin sees the
    // server's own address, and the body arrives byte for byte
    let (code, body, err) = curl6(&topo, &topo.inc, ORIGIN6);
    assert_eq!(code, 0, "curl -6 through the VPN: {err}\n{}", client.log());
    let mut want = format!("{ORIGIN6}\n").into_bytes();
    want.extend_from_slice(&http6_body());
    assert_eq!(body.len(), want.len(), "{}", client.log());
    assert!(body == want, "the body through the VPN differs");
    // the other cgroup is not tunnelled
    assert_eq!(curl6_seen(&topo, &topo.exc, ORIGIN6), DIRECT6);

    // UDP over IPv6, through the server's SOCKS5 association
    let via = topo.probe(&topo.inc, "udp", &format!("[{ORIGIN6}]:7000 3"));
    assert_eq!(
        via,
        format!("seen={ORIGIN6} replies=3"),
        "inc app's IPv6 UDP through the VPN\n{}",
        client.log()
    );

    // the resolver's AAAA answer: the excluded cgroup's flow to the name's IPv6 address is
    // tunnelled by the domain rule (the origin sees the server's address, not the lan's)
    let r = topo.probe(&topo.exc, "resolve6-tcp", &format!("{DNS}:53 v6.tun.test"));
    assert_eq!(r, format!("ip={NAMED6} seen={NAMED6}"), "{}", client.log());
    let queries = std::fs::read_to_string(&dns_log).unwrap_or_default();
    assert!(
        queries.contains("query[AAAA] v6.tun.test"),
        "dnsmasq log:\n{queries}"
    );

    // ping -6 to a tunnelled destination the server reaches is answered (see syicmp_)
    let said = ping(&topo, &topo.inc, &["-6", "-c", "1", ORIGIN6]);
    assert!(said.contains(" 1 received"), "{said}\n{}", client.log());

    // fail closed: the server cannot reach the far origin; the tunnelled flow is reset (not
    // left hanging: curl's timeout is exit code 28), and never goes direct
    let (code, _, err) = curl6(&topo, &topo.inc, FAR6);
    assert!(
        code != 0 && code != 28,
        "curl -6 to an origin the server cannot reach: exit {code}: {err}\n{}",
        client.log()
    );
    // the lan does reach it directly, and that is the first connection the origin saw
    assert_eq!(curl6_seen(&topo, &topo.exc, FAR6), DIRECT6_FAR);
    assert_eq!(
        next_result(&mut far_seen),
        format!("seen={DIRECT6_FAR}"),
        "the refused flow reached the origin"
    );

    // disable leaves nothing behind (the IPv6 rule and route included)
    topo.disable_and_expect_nothing_left(&client);
    assert_eq!(curl6_seen(&topo, &topo.inc, ORIGIN6), DIRECT6);
}

#[test]
fn syv6_ebpf_ipv6_tcp_udp_aaaa_and_fail_closed() {
    if tools_or_skip("syv6_ebpf_ipv6_tcp_udp_aaaa_and_fail_closed")
        && support::require("dnsmasq").is_some()
    {
        ipv6_scenario("ebpf");
    }
}

#[test]
fn syv6_nftables_ipv6_tcp_udp_aaaa_and_fail_closed() {
    if tools_or_skip("syv6_nftables_ipv6_tcp_udp_aaaa_and_fail_closed")
        && support::require("dnsmasq").is_some()
    {
        ipv6_scenario("nftables");
    }
}

/// The TUN's addresses (`vpn.tun.address` and `address6` by default).
const TUN_IP: &str = "10.255.0.2";
const TUN_IP6: &str = "fd7a:5359:5400::2";

/// Issue 38: nothing leaves by the lan link with the TUN's address as its source (with the given
/// classifier), whatever sends it. A socket bound to the TUN's address in the excluded cgroup
/// (no tunnel mark: as the kernel's socketless RST for a tunnelled flow's port) is routed into
/// the tunnel by `ip rule from <TUN address>`; with nftables, an unmarked datagram of a
/// tunnelled flow's conntrack entry (as a TIME_WAIT's ACK: the same 4-tuple, no socket mark),
/// which conntrack masquerades to the TUN's address, is marked again by its connection's mark.
/// A capture of the TUN's address on the lan link stays empty; the rules are gone after disable.
fn tun_source_scenario(classifier: &str) {
    let mut topo = Topo::named("sylk");
    topo.start_udp_origin();
    topo.start_server();
    let client = start_connected_client(
        &topo,
        &include_client_yaml(&topo, classifier, topo.server_socks5()),
    );
    let capture = topo.capture(&format!("src host {TUN_IP}"));
    // a tunnelled flow from a fixed port, then an excluded socket on that port to the same
    // destination: with nftables the same conntrack entry (a port above the ephemeral range,
    // which the client's own sockets draw from)
    let port = 65000 + COUNTER.fetch_add(1, Ordering::SeqCst) % 500;
    let tunnelled = topo.probe(
        &topo.inc,
        "udp-from",
        &format!("0.0.0.0:{port} 10.211.9.1:7000 1"),
    );
    let same_flow = topo.probe(
        &topo.exc,
        "udp-from",
        &format!("0.0.0.0:{port} 10.211.9.1:7000 1"),
    );
    let from_tun = topo.probe(
        &topo.exc,
        "udp-from",
        &format!("{TUN_IP}:0 10.211.9.2:7000 1"),
    );
    let leaked = capture.packets();
    assert_eq!(tunnelled, "seen=10.211.9.1 replies=1", "{}", client.log());
    // eBPF: the excluded socket's own flow (the tunnelled one's source was the TUN's address);
    // nftables: the tunnelled flow's conntrack entry, whose mark takes it into the tunnel (without
    // it the kernel refuses the send: EPERM)
    let same_flow_seen = match classifier {
        "ebpf" => format!("seen={DIRECT} replies=1"),
        _ => "seen=10.211.9.1 replies=1".to_string(),
    };
    assert_eq!(same_flow, same_flow_seen, "{}", client.log());
    assert_eq!(from_tun, "seen=10.211.9.2 replies=1", "{}", client.log());
    assert!(
        leaked.is_empty(),
        "left by the lan link with the TUN's address (same flow: {same_flow}, bound to the \
         TUN's address: {from_tun}): {leaked:#?}"
    );
    let rules = sh_quiet(&format!("ip -n {} rule show", topo.lan));
    assert!(
        rules.contains(&format!("from {TUN_IP} lookup {TABLE}")),
        "{rules}"
    );
    topo.disable_and_expect_nothing_left(&client);
}

#[test]
fn sylk_ebpf_nothing_leaves_the_lan_link_from_the_tun_address() {
    if tools_or_skip("sylk_ebpf_nothing_leaves_the_lan_link_from_the_tun_address")
        && support::require("tcpdump").is_some()
    {
        tun_source_scenario("ebpf");
    }
}

#[test]
fn sylk_nftables_nothing_leaves_the_lan_link_from_the_tun_address() {
    if tools_or_skip("sylk_nftables_nothing_leaves_the_lan_link_from_the_tun_address")
        && support::require("tcpdump").is_some()
    {
        tun_source_scenario("nftables");
    }
}

/// How [`server_down_scenario`] takes the server away.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ServerDown {
    /// Killed: its address refuses connections (a reset).
    Refusing,
    /// Alive, but an nftables rule of the internet namespace drops everything sent to its
    /// address: connects get no answer at all.
    Silent,
}

/// Fail closed when the server is down (with the given classifier): an included app's IPv4 and
/// IPv6 flows go through the SOCKS5 server while it runs; once it is gone, each ends in an error
/// of the client's (a refusing server: a reset at once; a silent one: after the client's
/// `server.connect_timeout`, 3 s here — never curl's own timeout) and none is sent direct — the
/// origin, which the lan reaches directly, sees the next direct connection as its first since,
/// and a capture on the lan link sees no packet for the origins. Silent, the VPN's resolver
/// answers SERVFAIL and nothing of port 53 leaves by the lan link.
fn server_down_scenario(classifier: &str, down: ServerDown) {
    let mut topo = Topo::named("syv6");
    let _far = topo.add_ipv6();
    let mut origin_seen = topo.start_helper(&topo.net.clone(), "http6-origin", "8086");
    topo.start_dnsmasq();
    topo.start_server();
    let socks = topo.server_socks5();
    let yaml = include_client_yaml(&topo, classifier, socks).replace(
        "dns: {enabled: false}",
        &format!("dns: {{enabled: true, servers: [\"{DNS}\"]}}"),
    ) + "server:\n  connect_timeout: 3s\n";
    let client = start_connected_client(&topo, &yaml);
    // the TUN's IPv6 address has its source rule too (removed at disable: leftovers)
    let rules6 = sh_quiet(&format!("ip -n {} -6 rule show", topo.lan));
    assert!(
        rules6.contains(&format!("from {TUN_IP6} lookup {TABLE}")),
        "{rules6}"
    );

    // the origin listens on [::]: an IPv4 peer shows as an IPv4-mapped address
    let origins = [("10.211.9.1", "::ffff:10.211.9.1"), (ORIGIN6, ORIGIN6)];
    for (ip, server_side) in origins {
        let (code, _, err) = curl_origin(&topo, &topo.inc, ip);
        assert_eq!(code, 0, "{ip} through the server: {err}\n{}", client.log());
        assert_eq!(next_result(&mut origin_seen), format!("seen={server_side}"));
    }

    match down {
        ServerDown::Refusing => topo.server = None,
        ServerDown::Silent => drop(sh(&format!(
            "nsenter --net=/run/netns/{} nft -f - <<'EOF'
table ip sysilent {{
  chain input {{ type filter hook input priority 0; policy accept; ip daddr {} drop; }}
}}
EOF",
            topo.net,
            socks.ip()
        ))),
    }
    let capture = topo.capture(&format!("host 10.211.9.1 or host {ORIGIN6} or port 53"));
    for (ip, _) in origins {
        let (code, _, err) = curl_origin(&topo, &topo.inc, ip);
        assert!(
            code != 0 && code != 28,
            "{ip} with the server down: exit {code}: {err}\n{}",
            client.log()
        );
    }
    let dns = app_dns_rcode(&topo, "e.tun.test");
    let leaked = capture.packets();
    assert!(
        leaked.is_empty(),
        "sent direct: {leaked:#?}\n{}",
        client.log()
    );
    if down == ServerDown::Silent {
        assert_eq!(dns, "rcode=2 answers=0", "{}", client.log());
    }
    // the next connection the origin sees is the excluded cgroup's direct one
    let (code, _, err) = curl_origin(&topo, &topo.exc, ORIGIN6);
    assert_eq!(code, 0, "direct: {err}");
    assert_eq!(
        next_result(&mut origin_seen),
        format!("seen={DIRECT6}"),
        "a refused flow reached the origin\n{}",
        client.log()
    );

    topo.disable_and_expect_nothing_left(&client);
}

#[test]
fn syv6_ebpf_server_down_refuses_ipv4_and_ipv6_never_direct() {
    if dns_tools_or_skip("syv6_ebpf_server_down_refuses_ipv4_and_ipv6_never_direct") {
        server_down_scenario("ebpf", ServerDown::Refusing);
    }
}

#[test]
fn syv6_nftables_server_down_refuses_ipv4_and_ipv6_never_direct() {
    if dns_tools_or_skip("syv6_nftables_server_down_refuses_ipv4_and_ipv6_never_direct") {
        server_down_scenario("nftables", ServerDown::Refusing);
    }
}

/// The silent server's path after classification is the data plane's, the same for both
/// classifiers: one is enough.
#[test]
fn syv6_nftables_server_silent_times_out_ipv4_ipv6_and_dns_never_direct() {
    if dns_tools_or_skip("syv6_nftables_server_silent_times_out_ipv4_ipv6_and_dns_never_direct") {
        server_down_scenario("nftables", ServerDown::Silent);
    }
}

/// `ping` (iputils) run by a process of `cgroup` in the lan namespace with `args` (numeric
/// output; it waits at most 10 s for the last answer): what it printed.
fn ping(topo: &Topo, cgroup: &Path, args: &[&str]) -> String {
    let out = in_netns(&topo.lan, Some(cgroup), Path::new("ping"))
        .args(["-n", "-W", "10"])
        .args(args)
        .output()
        .expect("ping");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Waits (bounded) until the client's ICMP counters (`icmp` of the VPN status) have `want`;
/// returns them.
fn icmp_stats(client: &Client, want: &[(&str, u64)]) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let icmp = client.ok("GET", "/api/v1/vpn/status", None)["icmp"].clone();
        if want.iter().all(|(k, v)| icmp[*k] == *v) {
            return icmp;
        }
        assert!(Instant::now() < deadline, "want {want:?}: {icmp}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 38 item 5: ping through the VPN (with the given classifier). An included app's echo
/// requests are answered by probing the destination over its route: through the server's
/// SOCKS5 (IPv4 and IPv6; the reply comes from the destination, id/seq/data intact, three out
/// of three), through the server's HTTP CONNECT (its `Proxy-Status` tells a refusing host from
/// an unreachable one) and direct. A destination the server cannot reach (an address of a
/// subnet of the internet namespace where no host answers ARP/ND) is reported "Destination Host
/// Unreachable" (IPv6: "Address unreachable") instead of leaving ping to time out; the status's
/// `icmp` counters move.
fn icmp_scenario(classifier: &str) {
    let mut topo = Topo::named("syic");
    let _far = topo.add_ipv6();
    // a subnet of the internet namespace without hosts: the server's connects fail with
    // EHOSTUNREACH once neighbour discovery gives up
    let (id, t) = (topo.id.clone(), topo.net.clone());
    sh(&format!(
        "set -e
         ip -n {t} link add {id}x type veth peer name {id}y
         ip -n {t} addr add 10.212.0.1/24 dev {id}x
         ip -n {t} addr add fd00:212::1/64 dev {id}x nodad
         ip -n {t} link set {id}x up; ip -n {t} link set {id}y up"
    ));
    let http = topo.start_server();
    let socks = topo.server_socks5();
    let client = start_include_client(&topo, classifier, socks, http);

    // through the server's SOCKS5: three replies from the destination itself
    for (family, dst) in [("-4", "10.211.9.1"), ("-6", ORIGIN6)] {
        let said = ping(&topo, &topo.inc, &[family, "-c", "3", "-i", "0.3", dst]);
        assert!(
            said.contains("3 packets transmitted, 3 received"),
            "{said}\n{}",
            client.log()
        );
        assert_eq!(
            said.matches(&format!("bytes from {dst}: icmp_seq="))
                .count(),
            3,
            "{said}"
        );
    }
    icmp_stats(&client, &[("echo_answered", 6), ("echo_requests", 6)]);

    // the server cannot reach the host: reported at once by the TUN's gateway, not a timeout
    let said = ping(&topo, &topo.inc, &["-4", "-c", "1", "10.212.0.9"]);
    assert!(
        said.contains("Destination Host Unreachable"),
        "{said}\n{}",
        client.log()
    );
    let said = ping(&topo, &topo.inc, &["-6", "-c", "1", "fd00:212::9"]);
    assert!(
        said.contains("Destination unreachable: Address unreachable"),
        "{said}\n{}",
        client.log()
    );
    icmp_stats(&client, &[("echo_unreachable", 2), ("echo_dropped", 0)]);

    // a direct route: the client probes from its own address
    let said = ping(&topo, &topo.inc, &["-c", "2", "-i", "0.3", "10.211.9.3"]);
    assert!(said.contains(", 2 received"), "{said}\n{}", client.log());

    // through the server's HTTP proxy: CONNECT's Proxy-Status says refused or unreachable
    client.ok("POST", "/api/v1/servers/gw-http/select", None);
    let said = ping(&topo, &topo.inc, &["-c", "2", "-i", "0.3", "10.211.9.2"]);
    assert!(said.contains(", 2 received"), "{said}\n{}", client.log());
    let said = ping(&topo, &topo.inc, &["-c", "1", "10.212.0.9"]);
    assert!(
        said.contains("Destination Host Unreachable"),
        "{said}\n{}",
        client.log()
    );
    icmp_stats(
        &client,
        &[
            ("echo_answered", 10),
            ("echo_unreachable", 3),
            ("echo_requests", 13),
            ("echo_dropped", 0),
            ("echo_limited", 0),
        ],
    );

    topo.disable_and_expect_nothing_left(&client);
}

#[test]
fn syicmp_ebpf_ping_answered_through_the_server_and_direct_unreachable_reported() {
    if tools_or_skip("syicmp_ebpf_ping_answered_through_the_server_and_direct_unreachable_reported")
        && support::require("ping").is_some()
    {
        icmp_scenario("ebpf");
    }
}

#[test]
fn syicmp_nftables_ping_answered_through_the_server_and_direct_unreachable_reported() {
    if tools_or_skip(
        "syicmp_nftables_ping_answered_through_the_server_and_direct_unreachable_reported",
    ) && support::require("ping").is_some()
    {
        icmp_scenario("nftables");
    }
}

/// What an included app's TCP connection to `dst`:8080 came to (see [`tcp_outcome`]).
fn app_tcp_outcome(topo: &Topo, dst: &str) -> String {
    topo.probe(&topo.inc, "tcp-outcome", &format!("{dst}:8080"))
}

/// The response code an included app's question for `name` got (see [`dns_rcode`]).
fn app_dns_rcode(topo: &Topo, name: &str) -> String {
    topo.probe(&topo.inc, "dns-rcode", &format!("{DNS}:53 {name}"))
}

/// The kill switch in VPN mode (issue 36, `routing.when_disconnected: block`), with the given
/// classifier. Disconnected, an included app's traffic for the server is refused — its TCP
/// connection reset, its UDP datagrams dropped, its DNS question answered REFUSED, its ping
/// answered "administratively prohibited" (iputils: "Packet filtered") — and a
/// capture on the lan link sees no packet to those origins and no DNS at all, while the `direct`
/// route (10.211.9.3) keeps working; the VPN status counts what was refused and the client
/// status says `blocked: not connected`. Connected again, everything goes through the server,
/// and once the server stops answering the resolver answers SERVFAIL without a direct query;
/// disconnected once more, a name of a `direct` route still resolves (directly).
fn kill_switch_scenario(classifier: &str) {
    let mut topo = Topo::named("syks");
    topo.start_origins();
    topo.start_udp_origin();
    topo.start_dnsmasq();
    topo.start_server();
    let yaml = include_client_yaml(&topo, classifier, topo.server_socks5()).replace(
        "dns: {enabled: false}",
        &format!("dns: {{enabled: true, servers: [\"{DNS}\"], cache_ttl: 5m}}"),
    ) + "routing:\n  when_disconnected: block\n  routes:\n    - {name: to-direct, patterns: [\"10.211.9.3\", \"*.plain.test\"], action: direct}\n";
    let client = start_connected_client(&topo, &yaml);
    // connected: through the server. (Another origin than the blocked one below: with nftables
    // the closed flow's socketless ACK/RST were seen on the lan link with the TUN's address,
    // about 1 run in 9. The TUN-source rule and the ct mark (sylk scenario) are meant to stop
    // that; with the same origin here it did not show in 15 runs with them nor 15 without.)
    assert_eq!(
        app_tcp_outcome(&topo, "10.211.9.2"),
        "seen=10.211.9.2",
        "{}",
        client.log()
    );

    client.ok("POST", "/api/v1/disconnect", None);
    let status = client.ok("GET", "/api/v1/status", None);
    assert_eq!(status["status"], "blocked: not connected", "{status}");
    let capture = topo.capture("host 10.211.9.1 or port 53");
    let refused_tcp = app_tcp_outcome(&topo, "10.211.9.1");
    let refused_udp = topo.udp_seen(&topo.inc, "10.211.9.1", 1);
    let refused_dns = app_dns_rcode(&topo, "a.tun.test");
    // the direct route keeps working (its packets go to 10.211.9.3, outside the capture)
    let direct_tcp = app_tcp_outcome(&topo, "10.211.9.3");
    let direct_udp = topo.udp_seen(&topo.inc, "10.211.9.3", 1);
    // a ping the rules refuse is answered "administratively prohibited" by the TUN's gateway
    let pinged = ping(&topo, &topo.inc, &["-4", "-c", "1", "10.211.9.1"]);
    let leaked = capture.packets();
    assert!(
        pinged.contains("From 10.255.0.1 icmp_seq=1 Packet filtered"),
        "{pinged}\n{}",
        client.log()
    );
    icmp_stats(&client, &[("echo_prohibited", 1), ("echo_requests", 1)]);
    assert_eq!(
        (
            refused_tcp.as_str(),
            refused_udp.as_str(),
            refused_dns.as_str()
        ),
        ("reset", "seen=nothing replies=0", "rcode=5 answers=0"),
        "blocked: TCP, UDP and DNS for the server\n{}",
        client.log()
    );
    assert!(
        leaked.is_empty(),
        "blocked traffic left by the lan link: {leaked:#?}\n{}",
        client.log()
    );
    assert_eq!(direct_tcp, format!("seen={DIRECT}"), "{}", client.log());
    assert_eq!(direct_udp, format!("seen={DIRECT} replies=1"));
    let blocked = &client.ok("GET", "/api/v1/vpn/status", None)["blocked"];
    assert_eq!(blocked["tcp_flows"], 1, "{blocked}");
    assert_eq!(blocked["dns_refused"], 1, "{blocked}");
    // the helper sends its datagram three times
    assert_eq!(blocked["udp_datagrams"], 3, "{blocked}");

    // connected: the server carries TCP, UDP and DNS again; the direct route stays direct
    client.ok("POST", "/api/v1/connect", None);
    assert_eq!(
        client.ok("GET", "/api/v1/status", None)["status"],
        "running"
    );
    let capture = topo.capture("port 53");
    assert_eq!(
        topo.probe(&topo.inc, "dns-ask", &format!("{DNS}:53 a.tun.test 1")),
        "answer=10.211.9.2",
        "{}",
        client.log()
    );
    assert!(capture.packets().is_empty(), "connected, DNS went direct");
    assert_eq!(
        app_tcp_outcome(&topo, "10.211.9.1"),
        "seen=10.211.9.1",
        "{}",
        client.log()
    );
    assert_eq!(
        topo.udp_seen(&topo.inc, "10.211.9.1", 1),
        "seen=10.211.9.1 replies=1"
    );
    assert_eq!(
        app_tcp_outcome(&topo, "10.211.9.3"),
        format!("seen={DIRECT}")
    );

    // connected to a server that stopped answering: the resolver fails closed too — SERVFAIL,
    // no direct query (as TCP is reset, see the syv6 server-down scenario)
    topo.server = None;
    let capture = topo.capture("port 53");
    assert_eq!(
        app_dns_rcode(&topo, "d.tun.test"),
        "rcode=2 answers=0",
        "{}",
        client.log()
    );
    let leaked = capture.packets();
    assert!(
        leaked.is_empty(),
        "the server is down: DNS went direct: {leaked:?}"
    );

    // disconnected again: a name of the `direct` route is resolved, directly
    client.ok("POST", "/api/v1/disconnect", None);
    let capture = topo.capture("port 53");
    assert_eq!(
        topo.probe(&topo.inc, "dns-ask", &format!("{DNS}:53 b.plain.test 1")),
        "answer=10.211.9.1",
        "{}",
        client.log()
    );
    let seen = capture.packets();
    assert!(
        seen.iter().any(|l| l.contains(&format!("{DNS}.53"))),
        "the direct route's name was not resolved directly: {seen:?}"
    );
    assert_eq!(app_dns_rcode(&topo, "c.tun.test"), "rcode=5 answers=0");

    topo.disable_and_expect_nothing_left(&client);
}

#[test]
fn syks_ebpf_kill_switch_blocks_tcp_udp_and_dns_for_the_server_while_disconnected() {
    if dns_tools_or_skip("syks_ebpf_kill_switch") && support::require("ping").is_some() {
        kill_switch_scenario("ebpf");
    }
}

#[test]
fn syks_nftables_kill_switch_blocks_tcp_udp_and_dns_for_the_server_while_disconnected() {
    if dns_tools_or_skip("syks_nftables_kill_switch") && support::require("ping").is_some() {
        kill_switch_scenario("nftables");
    }
}

/// Waits (bounded) until the TUN device is gone with a killed client.
fn wait_tun_gone(topo: &Topo) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while sh_quiet(&format!("ip -n {} link show", topo.lan)).contains(&topo.tun()) {
        assert!(
            Instant::now() < deadline,
            "the TUN device outlived the client"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends SIGTERM to the client and waits (bounded) for its clean exit.
fn stop_client(client: &mut Client) {
    sh(&format!("kill -TERM {}", client.pid()));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match client.proc.proc.child.try_wait() {
            Ok(Some(status)) => {
                assert!(status.success(), "exit after SIGTERM: {status}");
                return;
            }
            _ => {
                assert!(
                    Instant::now() < deadline,
                    "the client did not exit on SIGTERM"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// With the client gone, an included app's TCP connection to 10.211.9.1 fails, its UDP datagram
/// gets no reply, and a capture on the lan link sees no packet to the origin.
fn expect_locked(topo: &Topo, when: &str) {
    let capture = topo.capture("host 10.211.9.1");
    let tcp = app_tcp_outcome(topo, "10.211.9.1");
    let udp = topo.udp_seen(&topo.inc, "10.211.9.1", 1);
    let leaked = capture.packets();
    assert!(
        !tcp.starts_with("seen="),
        "{when}: the app's TCP connection went through: {tcp}"
    );
    // no route (EHOSTUNREACH at sendto) or no reply
    assert!(
        udp == "seen=nothing replies=0" || udp.starts_with("send="),
        "{when}: the app's UDP: {udp}"
    );
    assert!(
        leaked.is_empty(),
        "{when}: tunnelled traffic left by the lan link: {leaked:#?}"
    );
}

/// `vpn.lockdown: true` (issue 36) with the given classifier: `kill -9` of the client leaves the
/// split tunnel installed, so an included app's TCP connection fails (eBPF: refused by the dead
/// loopback listener; nftables: no route), its UDP datagram goes nowhere and nothing to the
/// origin leaves by the lan link; the next start takes the state over (no teardown first) and
/// the app works through the server again; a SIGTERM stop keeps the lock too; `switchyard
/// client vpn-unlock` (client stopped) removes everything (the leftovers check) and the app goes
/// direct as without a VPN.
fn lockdown_scenario(classifier: &str) {
    let mut topo = Topo::named("sylo");
    topo.start_origins();
    topo.start_udp_origin();
    topo.start_server();
    let yaml = include_client_yaml(&topo, classifier, topo.server_socks5()) + "  lockdown: true\n";
    let client = start_connected_client(&topo, &yaml);
    assert_eq!(
        app_tcp_outcome(&topo, "10.211.9.1"),
        "seen=10.211.9.1",
        "{}",
        client.log()
    );

    sh(&format!("kill -9 {}", client.pid()));
    wait_tun_gone(&topo);
    drop(client);
    assert!(
        !topo.leftovers().is_empty(),
        "lockdown: a killed client keeps its rules"
    );
    expect_locked(&topo, "killed");

    // the next start takes the state over (no teardown first: an app sending all along has no
    // datagram leave by the lan link) and the app works through the server again
    let capture = topo.capture("host 10.211.9.1");
    let sending = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sender = {
        let (lan, inc, sending) = (topo.lan.clone(), topo.inc.clone(), sending.clone());
        std::thread::spawn(move || {
            while sending.load(Ordering::SeqCst) {
                let _ = helper_in(&lan, Some(&inc), "udp", "10.211.9.1:7000 1").output();
            }
        })
    };
    let mut restarted = start_connected_client(&topo, &yaml);
    sending.store(false, Ordering::SeqCst);
    sender.join().expect("sender");
    let leaked = capture.packets();
    assert!(
        restarted.log().contains("took over the lockdown state"),
        "{}",
        restarted.log()
    );
    assert!(
        leaked.is_empty(),
        "restart: tunnelled traffic left by the lan link: {leaked:#?}"
    );
    assert_eq!(
        app_tcp_outcome(&topo, "10.211.9.1"),
        "seen=10.211.9.1",
        "{}",
        restarted.log()
    );
    assert_eq!(
        topo.udp_seen(&topo.inc, "10.211.9.1", 1),
        "seen=10.211.9.1 replies=1",
        "{}",
        restarted.log()
    );

    // a clean stop keeps the lock as well
    stop_client(&mut restarted);
    wait_tun_gone(&topo);
    expect_locked(&topo, "stopped");

    // vpn-unlock, in the namespace the client ran in: nothing is left, the app goes direct
    let mut unlock = in_netns(&topo.lan, None, Path::new(BIN));
    let out = unlock
        .args(["client", "vpn-unlock", "--data-dir"])
        .arg(topo.data_dir())
        .output()
        .expect("vpn-unlock");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "vpn-unlock: {printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        printed.contains("removed ip -4 rule fwmark 0x5359"),
        "{printed}"
    );
    assert_eq!(topo.leftovers(), Vec::<String>::new(), "{printed}");
    assert_eq!(
        app_tcp_outcome(&topo, "10.211.9.1"),
        format!("seen={DIRECT}")
    );
    assert_eq!(
        topo.udp_seen(&topo.inc, "10.211.9.1", 1),
        format!("seen={DIRECT} replies=1")
    );

    // locked again; a start with the VPN off keeps the lock until POST /api/v1/vpn/disable
    let client = start_connected_client(&topo, &yaml);
    sh(&format!("kill -9 {}", client.pid()));
    wait_tun_gone(&topo);
    drop(client);
    let vpn_off = yaml.replace("enabled: true\n  interface", "enabled: false\n  interface");
    let client = topo.start_client(&vpn_off);
    expect_locked(&topo, "restarted with the VPN off");
    topo.disable_and_expect_nothing_left(&client);
    assert_eq!(
        app_tcp_outcome(&topo, "10.211.9.1"),
        format!("seen={DIRECT}")
    );
}

#[test]
fn sylo_ebpf_lockdown_keeps_tunnelled_apps_off_the_network_until_restart_or_unlock() {
    if dns_tools_or_skip("sylo_ebpf_lockdown") {
        lockdown_scenario("ebpf");
    }
}

#[test]
fn sylo_nftables_lockdown_keeps_tunnelled_apps_off_the_network_until_restart_or_unlock() {
    if dns_tools_or_skip("sylo_nftables_lockdown") {
        lockdown_scenario("nftables");
    }
}
