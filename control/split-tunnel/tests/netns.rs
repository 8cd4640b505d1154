//! Split tunnelling in network namespaces, with both mechanisms (root; CI must not skip).
//!
//! Topology per test (names prefixed `syebpf`): a "lan" namespace with two veth links to an
//! "internet" namespace — `d` (main table; 10.201.1.1, fd53:1::1) and `t` (stands in for the TUN:
//! the tunnel table routes into it; 10.201.2.1, fd53:2::1; static IPv6 neighbours because a TUN is
//! point-to-point). The internet namespace runs a TCP origin on 10.201.9.1-3 and fd53:9::1-2, port
//! 8080, that answers each connection with the peer address it sees, so the `t` address means "went
//! through the tunnel" and the `d` address "went direct". A scope cgroup holds `inc` (an app named
//! by cgroup) and `exc`. Probes run inside the lan namespace and a cgroup; the resolver is a UDP/TCP
//! responder on 127.0.0.1:5353 and [::1]:5353 in the lan namespace, and nothing listens on
//! 10.201.9.53 / fd53:9::53 at all, so an answer to a query sent there proves the interception.
//! Probes and servers are this test binary re-run in helper mode (`SYEBPF_HELPER`). The TCP redirect
//! test stands in for the data plane with listeners on loopback in the lan namespace.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

#[path = "../../../tests/support/netns.rs"]
mod netns_support;
use netns_support::{
    next_result, remove_cgroups, root_with_tools_or_skip, sh, sh_quiet, HELPER_ARGS,
};

use switchyard_split_tunnel::{
    cgroup, AppRule, DnsRedirect, Mechanism, MechanismChoice, SplitMode, SplitRules, SplitTunnel,
    SplitTunnelConfig,
};

const TUNNEL: &str = "10.201.2.1";
const DIRECT: &str = "10.201.1.1";
const TUNNEL6: &str = "fd53:2::1";
const DIRECT6: &str = "fd53:1::1";
const MARK: u32 = 0x5359;
const TABLE: u32 = 0x5359;

// ---------- helper mode ----------

fn result(line: String) {
    println!("RESULT {line}");
    let _ = std::io::stdout().flush();
}

/// Connects to `dst` (a v4-mapped one on a dual-stack IPv6 socket) with a socket `prepare` set
/// up; returns the socket's mark after connect(), what getpeername() says and what the other end
/// wrote before closing.
fn connect_and_read(
    dst: SocketAddr,
    prepare: impl FnOnce(&socket2::Socket),
) -> (u32, SocketAddr, String) {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(dst),
        socket2::Type::STREAM,
        None,
    )
    .expect("socket");
    if dst.is_ipv6() {
        sock.set_only_v6(false).expect("dual stack");
    }
    prepare(&sock);
    sock.connect_timeout(&dst.into(), Duration::from_secs(5))
        .expect("connect");
    let mark = sock.mark().expect("get mark");
    let mut stream: TcpStream = sock.into();
    let peer = stream.peer_addr().expect("peer");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read");
    (mark, peer, text.trim().to_string())
}

fn tcp_probe(dst: SocketAddr, preset_mark: Option<u32>) -> String {
    let (mark, _, seen) = connect_and_read(dst, |sock| {
        if let Some(m) = preset_mark {
            sock.set_mark(m).expect("set mark");
        }
    });
    format!("mark={mark:#x} seen={seen}")
}

/// Like `tcp_probe`, reporting the peer; with `device`, the socket is bound to it first
/// (SO_BINDTODEVICE).
fn tcp_peer_probe(dst: SocketAddr, device: Option<&str>) -> String {
    let (mark, peer, reply) = connect_and_read(dst, |sock| {
        if let Some(device) = device {
            sock.bind_device(Some(device.as_bytes()))
                .expect("bind to device");
        }
    });
    format!("mark={mark:#x} peer={peer} reply={reply}")
}

fn udp_dns_probe(dst: SocketAddr, connected: bool) -> String {
    let sock = UdpSocket::bind(if dst.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }).expect("bind");
    sock.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    if connected {
        sock.connect(dst).expect("connect");
        sock.send(b"q").expect("send");
    } else {
        sock.send_to(b"q", dst).expect("send");
    }
    let mut buf = [0u8; 512];
    let (n, from) = sock.recv_from(&mut buf).expect("recv");
    let peer = if connected {
        sock.peer_addr().map(|a| a.to_string()).unwrap_or_default()
    } else {
        "-".into()
    };
    format!(
        "from={from} peer={peer} reply={}",
        String::from_utf8_lossy(&buf[..n])
    )
}

fn tcp_dns_probe(dst: SocketAddr) -> String {
    let mut s = TcpStream::connect_timeout(&dst, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(b"q").expect("write");
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("read");
    format!("peer={} reply={reply}", s.peer_addr().expect("peer"))
}

fn answer_peers(l: std::net::TcpListener) {
    for conn in l.incoming().flatten() {
        let mut conn = conn;
        if let Ok(peer) = conn.peer_addr() {
            let _ = conn.write_all(peer.ip().to_string().as_bytes());
        }
    }
}

fn serve_origin(port: u16) -> ! {
    let l4 = std::net::TcpListener::bind(("0.0.0.0", port)).expect("bind origin");
    let s6 =
        socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None).expect("socket");
    s6.set_only_v6(true).expect("v6 only");
    s6.bind(&SocketAddr::from(([0u16; 8], port)).into())
        .expect("bind origin v6");
    s6.listen(64).expect("listen");
    std::thread::spawn(move || answer_peers(s6.into()));
    result("ready".into());
    answer_peers(l4);
    std::process::exit(0)
}

/// Takes a distinctive process name, waits for a line on stdin, probes like `tcp`, then stays
/// until stdin closes.
fn app_then_probe(dst: SocketAddr) {
    let name = std::env::var("SYEBPF_COMM").expect("SYEBPF_COMM");
    std::fs::write("/proc/self/comm", &name).expect("set comm");
    result("ready".into());
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    result(tcp_probe(dst, None));
    let _ = std::io::stdin().read_line(&mut line);
}

fn serve_resolver(addr: SocketAddr) -> ! {
    let udp = UdpSocket::bind(addr).expect("bind udp");
    let tcp = std::net::TcpListener::bind(addr).expect("bind tcp");
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = udp.recv_from(&mut buf) {
            let mut reply = b"resolver:".to_vec();
            reply.extend_from_slice(&buf[..n]);
            let _ = udp.send_to(&reply, from);
        }
    });
    result("ready".into());
    for conn in tcp.incoming().flatten() {
        let mut conn = conn;
        let mut buf = [0u8; 512];
        if let Ok(n) = conn.read(&mut buf) {
            let mut reply = b"resolver:".to_vec();
            reply.extend_from_slice(&buf[..n]);
            let _ = conn.write_all(&reply);
        }
    }
    std::process::exit(0)
}

/// Holds a split tunnel until killed (the crash test) or told `stop` on stdin. With
/// `SYEBPF_SCOPE_REL` it starts like the client does: the cgroup2 hierarchy from
/// `prepare_cgroup2` (a private mount when none is visible), the scope relative to it.
fn hold() -> ! {
    let mut config = config_from_env();
    let mut mount = String::from("-");
    if let Ok(rel) = std::env::var("SYEBPF_SCOPE_REL") {
        let m = switchyard_split_tunnel::prepare_cgroup2(&config.data_dir, false).expect("prepare");
        config.scope_cgroup = m.join(rel);
        mount = m.display().to_string();
    }
    let rules = SplitRules {
        mode: SplitMode::Include,
        ips: vec!["10.201.9.2".into()],
        ..SplitRules::default()
    };
    let tunnel = SplitTunnel::start(config, rules).expect("start");
    result(format!("ready {} {mount}", tunnel.mechanism().as_str()));
    let mut line = String::new();
    if std::io::stdin().read_line(&mut line).is_ok() && line.trim() == "stop" {
        tunnel.disable().expect("disable");
        result("stopped".into());
        std::process::exit(0)
    }
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

#[test]
fn helper() {
    let Ok(action) = std::env::var("SYEBPF_HELPER") else {
        return; // a plain test run: nothing to do
    };
    let arg = std::env::var("SYEBPF_ARG").unwrap_or_default();
    let addr = || arg.parse::<SocketAddr>().expect("SYEBPF_ARG address");
    match action.as_str() {
        "origin" => serve_origin(arg.parse().expect("port")),
        "resolver" => serve_resolver(addr()),
        "hold" => hold(),
        "recover" => result(format!(
            "undone {}",
            switchyard_split_tunnel::recover(Path::new(&arg)).expect("recover")
        )),
        "tcp" => result(tcp_probe(addr(), None)),
        "app-then-tcp" => app_then_probe(addr()),
        "tcp-marked" => result(tcp_probe(addr(), Some(0x77))),
        "tcp-peer" => result(tcp_peer_probe(addr(), None)),
        "tcp-peer-bound" => {
            let device = std::env::var("SYEBPF_DEVICE").expect("SYEBPF_DEVICE");
            result(tcp_peer_probe(addr(), Some(&device)))
        }
        "udp-dns" => result(udp_dns_probe(addr(), false)),
        "udp-dns-connected" => result(udp_dns_probe(addr(), true)),
        "tcp-dns" => result(tcp_dns_probe(addr())),
        other => panic!("unknown helper action {other}"),
    }
    std::process::exit(0)
}

// ---------- fixture ----------

fn root_or_skip(what: &str) -> bool {
    root_with_tools_or_skip(
        what,
        &[
            "ip", "nft", "nsenter", "bpftool", "mount", "unshare", "findmnt",
        ],
    )
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

struct Topo {
    lan: String,
    net: String,
    /// a bystander's namespace (a container, an `ip netns` tool): its processes share the scope
    /// cgroups but have their own TCP origin and DNS server on loopback
    oth: String,
    scope: PathBuf,
    inc: PathBuf,
    exc: PathBuf,
    /// the client's own cgroup: a bypass cgroup, never classified
    own: PathBuf,
    data: tempfile::TempDir,
    pins: PathBuf,
    servers: Vec<Child>,
}

fn helper_cmd(action: &str, arg: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("test exe"));
    c.args(HELPER_ARGS)
        .env("SYEBPF_HELPER", action)
        .env("SYEBPF_ARG", arg)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    c
}

/// This test binary in helper mode, run inside `netns` after joining `cgroup` (when given) so that
/// its sockets are created there.
fn helper_in(netns: &str, cgroup: Option<&Path>, action: &str, arg: &str) -> Command {
    netns_support::helper_in(netns, cgroup, ("SYEBPF_HELPER", "SYEBPF_ARG"), action, arg)
}

fn read_result(child: &mut Child) -> String {
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    next_result(&mut out)
}

fn wait_ready(out: &mut impl BufRead) {
    assert_eq!(next_result(out), "ready");
}

impl Topo {
    fn new() -> Topo {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let id = format!("syebpf{}{n}", std::process::id() % 100000);
        let (lan, net, oth) = (
            format!("{id}-lan"),
            format!("{id}-net"),
            format!("{id}-oth"),
        );
        let mount = cgroup::cgroup2_mount().expect("cgroup2");
        let scope = mount.join(&id);
        let data = tempfile::tempdir().expect("tempdir");
        let pins = data.path().join("bpffs");
        let topo = Topo {
            inc: scope.join("inc"),
            exc: scope.join("exc"),
            own: scope.join("own"),
            lan,
            net,
            oth,
            scope,
            data,
            pins,
            servers: Vec::new(),
        };
        for dir in [&topo.scope, &topo.inc, &topo.exc, &topo.own] {
            std::fs::create_dir_all(dir).expect("cgroup");
        }
        let (l, t, o) = (&topo.lan, &topo.net, &topo.oth);
        sh(&format!(
            "set -e; ip netns add {l}; ip netns add {t}; ip netns add {o}; ip -n {o} link set lo up
             ip link add {id}d netns {l} type veth peer name {id}D netns {t}
             ip link add {id}t netns {l} type veth peer name {id}T netns {t}
             ip -n {l} link set lo up; ip -n {t} link set lo up
             ip -n {l} addr add 10.201.1.1/24 dev {id}d; ip -n {l} link set {id}d up
             ip -n {l} addr add 10.201.2.1/24 dev {id}t; ip -n {l} link set {id}t up
             ip -n {t} addr add 10.201.1.2/24 dev {id}D; ip -n {t} link set {id}D up
             ip -n {t} addr add 10.201.2.2/24 dev {id}T; ip -n {t} link set {id}T up
             for a in 10.201.9.1 10.201.9.2 10.201.9.3; do ip -n {t} addr add $a/32 dev lo; done
             ip -n {l} route add default via 10.201.1.2
             ip -n {l} addr add fd53:1::1/64 dev {id}d nodad; ip -n {l} addr add fd53:2::1/64 dev {id}t nodad
             ip -n {t} addr add fd53:1::2/64 dev {id}D nodad; ip -n {t} addr add fd53:2::2/64 dev {id}T nodad
             for a in fd53:9::1 fd53:9::2; do ip -n {t} addr add $a/128 dev lo; done
             ip -n {l} -6 route add default via fd53:1::2
             ip -n {t} link set {id}T address 02:53:00:00:00:02
             for a in fd53:9::1 fd53:9::2; do
               ip -n {l} -6 neigh replace $a lladdr 02:53:00:00:00:02 dev {id}t nud permanent; done
             ip netns exec {l} sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0"
        ));
        topo
    }

    fn tun_device(&self) -> String {
        format!("{}t", self.lan.trim_end_matches("-lan"))
    }

    fn start_server(&mut self, netns: &str, action: &str, arg: &str) {
        let mut child = helper_in(netns, None, action, arg).spawn().expect("server");
        assert_eq!(read_result(&mut child), "ready");
        self.servers.push(child);
    }

    fn start_servers(&mut self) {
        let (net, lan) = (self.net.clone(), self.lan.clone());
        self.start_server(&net, "origin", "8080");
        self.start_server(&lan, "resolver", "127.0.0.1:5353");
        self.start_server(&lan, "resolver", "[::1]:5353");
        let oth = self.oth.clone();
        self.start_server(&oth, "origin", "8080");
        self.start_server(&oth, "resolver", "127.0.0.1:53");
        self.start_server(&oth, "resolver", "[::1]:53");
    }

    /// A bystander in the other namespace, in the scope's cgroups, keeps its own routes (its
    /// sockets carry no mark) and its own DNS server (no redirect to the tunnel's resolver, which
    /// does not even exist in its namespace).
    fn assert_bystander_untouched(&self, when: &str) {
        for cg in [&self.inc, &self.exc, &self.scope] {
            let probe = |action: &str, arg: &str| {
                let mut child = helper_in(&self.oth, Some(cg), action, arg)
                    .spawn()
                    .expect("bystander");
                let r = read_result(&mut child);
                let _ = child.wait();
                r
            };
            let at = format!("{when}, bystander in {}", cg.display());
            assert_eq!(
                probe("tcp", "127.0.0.1:8080"),
                "mark=0x0 seen=127.0.0.1",
                "{at}: TCP"
            );
            assert_eq!(
                probe("tcp", "[::1]:8080"),
                "mark=0x0 seen=::1",
                "{at}: TCP v6"
            );
            assert_eq!(
                probe("udp-dns", "127.0.0.1:53"),
                "from=127.0.0.1:53 peer=- reply=resolver:q",
                "{at}: its own DNS over UDP"
            );
            assert_eq!(
                probe("tcp-dns", "127.0.0.1:53"),
                "peer=127.0.0.1:53 reply=resolver:q",
                "{at}: its own DNS over TCP"
            );
            assert_eq!(
                probe("udp-dns", "[::1]:53"),
                "from=[::1]:53 peer=- reply=resolver:q",
                "{at}: its own DNS over UDP v6"
            );
        }
    }

    /// Runs a probe inside the lan namespace as a process of `cgroup`.
    fn probe(&self, cgroup: &Path, action: &str, arg: &str) -> String {
        let mut child = self.spawn_probe(cgroup, action, arg, &[]);
        let r = read_result(&mut child);
        let _ = child.wait();
        r
    }

    fn spawn_probe(&self, cgroup: &Path, action: &str, arg: &str, env: &[(&str, &str)]) -> Child {
        helper_in(&self.lan, Some(cgroup), action, arg)
            .envs(env.iter().copied())
            .spawn()
            .expect("probe")
    }

    fn seen(&self, cgroup: &Path, dst: &str) -> String {
        let dst = SocketAddr::new(dst.parse().expect("ip"), 8080);
        let r = self.probe(cgroup, "tcp", &dst.to_string());
        r.split("seen=").nth(1).unwrap_or_default().to_string()
    }

    fn config(&self, mechanism: MechanismChoice) -> SplitTunnelConfig {
        let mut c = SplitTunnelConfig::new(self.data.path(), &self.scope, &self.tun_device());
        c.netns = Some(self.lan.clone());
        c.bpf_pin_dir = self.pins.clone();
        c.nft_table = self.lan.replace('-', "_");
        c.mechanism = mechanism;
        c.tunnel_mark = MARK;
        c.table = TABLE;
        c.bypass_cgroups = vec![self.own.clone()];
        c.dns = Some(lan_resolver());
        c
    }

    /// What of the split tunnel is on the host: rule, routes, nft table, pins, cgroup programs.
    fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        let rules = sh_quiet(&format!(
            "ip -n {} rule show; ip -n {} -6 rule show",
            self.lan, self.lan
        ));
        if rules.contains(&format!("fwmark {MARK:#x}")) {
            left.push("ip rule".into());
        }
        let routes = sh_quiet(&format!(
            "ip -n {l} route show table {TABLE}; ip -n {l} -6 route show table {TABLE}",
            l = self.lan
        ));
        if !routes.trim().is_empty() {
            left.push(format!("routes: {}", routes.trim()));
        }
        let tables = sh_quiet(&format!(
            "nsenter --net=/run/netns/{} nft list tables",
            self.lan
        ));
        if tables.contains(&self.lan.replace('-', "_")) {
            left.push("nft table".into());
        }
        let pins = switchyard_ebpf::list_pins(&self.pins);
        if !pins.is_empty() {
            left.push(format!("pins: {pins:?}"));
        }
        let attached = sh_quiet(&format!("bpftool cgroup show '{}'", self.scope.display()));
        if attached.contains("sy_") || attached.lines().count() > 1 {
            left.push(format!("cgroup programs: {attached}"));
        }
        if switchyard_ebpf::is_bpffs(&self.pins) {
            left.push("bpffs mount".into());
        }
        left
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        for child in &mut self.servers {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = switchyard_split_tunnel::recover(self.data.path());
        let _ = switchyard_ebpf::unmount_bpffs(&self.pins);
        let _ = Command::new("ip")
            .args(["netns", "del", &self.lan])
            .status();
        for ns in [&self.net, &self.oth] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        // a probe of a failed test may still run in a test cgroup: only this test's processes
        // are there; cgroup.kill ends them so the directories can go
        remove_cgroups(&[
            &self.inc,
            &self.exc,
            &self.own,
            &self.scope.join("switchyard-split-apps"),
            &self.scope,
        ]);
    }
}

// ---------- the scenario, run with each mechanism ----------

fn split_tunnel_scenario(choice: MechanismChoice, expected: Mechanism) {
    let mut topo = Topo::new();
    topo.start_servers();
    // before the split tunnel, everything goes direct
    assert_eq!(topo.seen(&topo.inc, "10.201.9.1"), DIRECT);

    let rules = SplitRules {
        mode: SplitMode::Include,
        apps: vec![AppRule {
            name: "inc-app".into(),
            cgroup: Some(topo.inc.display().to_string()),
            ..AppRule::default()
        }],
        ..SplitRules::default()
    };
    let mut st = SplitTunnel::start(topo.config(choice), rules).expect("start");
    assert_eq!(st.mechanism(), expected);
    topo.assert_bystander_untouched("include");

    // include: the app's cgroup is tunnelled, the other one goes direct
    let r = topo.probe(&topo.inc, "tcp", "10.201.9.1:8080");
    assert!(r.ends_with(&format!("seen={TUNNEL}")), "inc app: {r}");
    if expected == Mechanism::Ebpf {
        assert!(
            r.starts_with(&format!("mark={MARK:#x}")),
            "SO_MARK of the app's socket: {r}"
        );
    }
    let r = topo.probe(&topo.exc, "tcp", "10.201.9.1:8080");
    assert_eq!(r, format!("mark=0x0 seen={DIRECT}"), "other cgroup");

    // a socket that carries its own mark (the proxy's) is left alone
    let r = topo.probe(&topo.inc, "tcp-marked", "10.201.9.1:8080");
    assert_eq!(r, format!("mark=0x77 seen={DIRECT}"), "pre-marked socket");

    // an `ips` rule applies at once
    assert_eq!(topo.seen(&topo.exc, "10.201.9.2"), DIRECT);
    st.add_ip("10.201.9.2").expect("add ip");
    assert_eq!(topo.seen(&topo.exc, "10.201.9.2"), TUNNEL, "after add_ip");
    assert_eq!(topo.seen(&topo.exc, "10.201.9.1"), DIRECT);

    // IPv6 the same way: app cgroup tunnelled, a v6 `ips` rule applies at once
    assert_eq!(topo.seen(&topo.inc, "fd53:9::1"), TUNNEL6, "v6 app");
    assert_eq!(topo.seen(&topo.exc, "fd53:9::2"), DIRECT6, "v6 other");
    st.add_ip("fd53:9::2/128").expect("add v6 ip");
    assert_eq!(
        topo.seen(&topo.exc, "fd53:9::2"),
        TUNNEL6,
        "after v6 add_ip"
    );
    assert_eq!(topo.seen(&topo.exc, "fd53:9::1"), DIRECT6);

    // an app by process name is moved into the managed cgroup and then tunnelled
    let comm = format!("syebpfapp{}", std::process::id() % 100_000);
    let mut app = topo.spawn_probe(
        &topo.exc,
        "app-then-tcp",
        "10.201.9.1:8080",
        &[("SYEBPF_COMM", &comm)],
    );
    let mut out = BufReader::new(app.stdout.take().expect("stdout"));
    wait_ready(&mut out);
    let mut twin = helper_in(&topo.oth, Some(&topo.exc), "app-then-tcp", "127.0.0.1:8080")
        .env("SYEBPF_COMM", &comm)
        .spawn()
        .expect("bystander app");
    let mut twin_out = BufReader::new(twin.stdout.take().expect("stdout"));
    wait_ready(&mut twin_out);
    st.add_app(AppRule {
        name: comm.clone(),
        ..AppRule::default()
    })
    .expect("add app");
    let mount = cgroup::cgroup2_mount().expect("cgroup2");
    assert_eq!(
        cgroup::cgroup_of(&mount, app.id()).as_deref(),
        Some(st.apps_cgroup()),
        "moved into the apps cgroup"
    );
    assert_eq!(
        cgroup::cgroup_of(&mount, twin.id()),
        Some(topo.exc.clone()),
        "a process of the same name in another namespace is not moved"
    );
    let mut stdin = app.stdin.take().expect("stdin");
    stdin.write_all(b"go\n").expect("go");
    let r = next_result(&mut out);
    assert!(r.ends_with(&format!("seen={TUNNEL}")), "app by name: {r}");
    let mut twin_stdin = twin.stdin.take().expect("stdin");
    twin_stdin.write_all(b"go\n").expect("go");
    assert_eq!(
        next_result(&mut twin_out),
        "mark=0x0 seen=127.0.0.1",
        "the bystander of the same name"
    );
    drop(twin_stdin);
    let _ = twin.wait();
    // removing the app returns its processes to where they were
    assert!(st.remove_app(&comm).expect("remove app"));
    assert_eq!(
        cgroup::cgroup_of(&mount, app.id()),
        Some(topo.exc.clone()),
        "moved back"
    );
    drop(stdin);
    let _ = app.wait();

    // a domain rule steers the addresses the resolver saw for matching names
    st.add_domain("*.origin.test").expect("add domain");
    assert!(!st
        .on_resolved("origin.test", &["10.201.9.3".parse().expect("ip")])
        .expect("hook"));
    assert_eq!(topo.seen(&topo.exc, "10.201.9.3"), DIRECT);
    assert!(st
        .on_resolved("www.origin.test", &["10.201.9.3".parse().expect("ip")])
        .expect("hook"));
    assert_eq!(st.status().resolved_addresses, 1);
    assert_eq!(
        topo.seen(&topo.exc, "10.201.9.3"),
        TUNNEL,
        "domain-derived address"
    );
    assert!(st.remove_domain("*.origin.test").expect("remove domain"));
    assert_eq!(topo.seen(&topo.exc, "10.201.9.3"), DIRECT, "domain removed");

    // exclude: everything tunnelled but the matches; always_bypass wins over everything
    st.set_mode(SplitMode::Exclude).expect("mode");
    assert_eq!(topo.seen(&topo.inc, "10.201.9.1"), DIRECT, "excluded app");
    assert_eq!(
        topo.seen(&topo.exc, "10.201.9.1"),
        TUNNEL,
        "everything else"
    );
    assert_eq!(topo.seen(&topo.exc, "10.201.9.2"), DIRECT, "excluded ip");
    assert_eq!(topo.seen(&topo.own, "10.201.9.1"), DIRECT, "bypass cgroup");
    let mut rules = st.rules().clone();
    rules.always_bypass.push("10.201.9.0/30".into());
    st.set_rules(rules).expect("rules");
    assert_eq!(topo.seen(&topo.exc, "10.201.9.1"), DIRECT, "always_bypass");

    // DNS to any server :53 lands at the resolver, and the answer seems to come from the server
    for cg in [&topo.inc, &topo.exc] {
        let r = topo.probe(cg, "udp-dns", "10.201.9.53:53");
        assert_eq!(
            r, "from=10.201.9.53:53 peer=- reply=resolver:q",
            "UDP sendto/recvfrom"
        );
        let r = topo.probe(cg, "udp-dns-connected", "10.201.9.53:53");
        assert_eq!(
            r, "from=10.201.9.53:53 peer=10.201.9.53:53 reply=resolver:q",
            "connected UDP"
        );
        let r = topo.probe(cg, "tcp-dns", "10.201.9.53:53");
        assert_eq!(r, "peer=10.201.9.53:53 reply=resolver:q", "TCP");
        let r = topo.probe(cg, "udp-dns", "[fd53:9::53]:53");
        assert_eq!(
            r, "from=[fd53:9::53]:53 peer=- reply=resolver:q",
            "UDP over IPv6"
        );
        let r = topo.probe(cg, "tcp-dns", "[fd53:9::53]:53");
        assert_eq!(r, "peer=[fd53:9::53]:53 reply=resolver:q", "TCP over IPv6");
    }
    topo.assert_bystander_untouched("exclude");

    st.disable().expect("disable");
    assert_eq!(
        topo.leftovers(),
        Vec::<String>::new(),
        "disable leaves nothing"
    );
    assert_eq!(topo.seen(&topo.exc, "10.201.9.1"), DIRECT, "after disable");
}

#[test]
fn ebpf_classifies_routes_and_intercepts_dns() {
    if root_or_skip("ebpf_classifies_routes_and_intercepts_dns") {
        split_tunnel_scenario(MechanismChoice::Ebpf, Mechanism::Ebpf);
    }
}

#[test]
fn nftables_fallback_behaves_the_same() {
    if root_or_skip("nftables_fallback_behaves_the_same") {
        split_tunnel_scenario(MechanismChoice::Nftables, Mechanism::Nftables);
    }
}

#[test]
fn auto_uses_ebpf_and_falls_back_to_nftables_when_it_cannot_load() {
    if !root_or_skip("auto_uses_ebpf_and_falls_back_to_nftables_when_it_cannot_load") {
        return;
    }
    let mut topo = Topo::new();
    topo.start_servers();
    let rules = SplitRules {
        mode: SplitMode::Include,
        ips: vec!["10.201.9.2".into()],
        ..SplitRules::default()
    };
    let st = SplitTunnel::start(topo.config(MechanismChoice::Auto), rules.clone()).expect("start");
    assert_eq!(st.mechanism(), Mechanism::Ebpf);
    assert_eq!(st.fallback_reason(), None);
    st.disable().expect("disable");

    // a pin directory that cannot exist stands in for "no CAP_BPF / no bpffs"
    let mut config = topo.config(MechanismChoice::Auto);
    config.bpf_pin_dir = PathBuf::from("/dev/null/syebpf-pins");
    let st = SplitTunnel::start(config, rules).expect("start with fallback");
    assert_eq!(st.mechanism(), Mechanism::Nftables);
    assert!(
        st.fallback_reason()
            .is_some_and(|r| r.contains("/dev/null")),
        "{:?}",
        st.fallback_reason()
    );
    assert_eq!(
        topo.seen(&topo.exc, "10.201.9.2"),
        TUNNEL,
        "the fallback classifies"
    );
    assert_eq!(topo.seen(&topo.exc, "10.201.9.1"), DIRECT);
    st.disable().expect("disable");
    assert_eq!(topo.leftovers(), Vec::<String>::new());
}

/// A listener on `addr` (port 0: any) created inside the network namespace `netns`, as the data
/// plane's loopback listener is in the client's.
#[allow(unsafe_code)] // setns(2), which std does not wrap
fn listener_in(netns: &str, addr: &str) -> std::net::TcpListener {
    use std::os::fd::AsRawFd;
    let path = format!("/run/netns/{netns}");
    let addr = addr.to_string();
    std::thread::spawn(move || {
        let ns = std::fs::File::open(&path).expect("netns file");
        // SAFETY: setns(2) with an open namespace fd moves only this short-lived thread, which
        // does nothing but create the listener there.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
        let listener = std::net::TcpListener::bind(&addr).expect("bind listener");
        listener.set_nonblocking(true).expect("nonblocking");
        listener
    })
    .join()
    .expect("listener thread")
}

/// The next connection of `listener` within 10 s, or `None`.
fn accept_within(listener: &std::net::TcpListener) -> Option<(TcpStream, SocketAddr)> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match listener.accept() {
            Ok(accepted) => return Some(accepted),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if std::time::Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// Connects a probe of the apps cgroup to `dst`, expects `listener` to get the connection instead,
/// checks that `origins` knows where it was going (once), and returns what the probe reports.
fn redirected_probe(
    topo: &Topo,
    listener: &std::net::TcpListener,
    origins: &switchyard_ebpf::FlowOrigins,
    dst: &str,
    expected_origin: &str,
) -> String {
    let mut probe = topo.spawn_probe(&topo.inc, "tcp-peer", dst, &[]);
    let (mut conn, client) =
        accept_within(listener).unwrap_or_else(|| panic!("{dst}: the listener got nothing"));
    let expected: SocketAddr = expected_origin.parse().expect("origin");
    assert_eq!(
        origins.take(client),
        Some(expected),
        "{dst}: original destination of {client}"
    );
    assert_eq!(origins.take(client), None, "{dst}: taken once");
    conn.write_all(b"listener").expect("write");
    drop(conn);
    let r = read_result(&mut probe);
    let _ = probe.wait();
    r
}

fn tcp_redirect_scenario() {
    use switchyard_ebpf::{AppClass, ClassifierConfig, Mode, NetList, SplitTunnelProgram};
    let mut topo = Topo::new();
    topo.start_servers();
    let l4 = listener_in(&topo.lan, "127.0.0.1:0");
    let l6 = listener_in(&topo.lan, "[::1]:0");
    let port = |l: &std::net::TcpListener| l.local_addr().expect("local addr").port();
    let config = ClassifierConfig {
        mode: Mode::Include,
        tunnel_mark: MARK,
        dns: Some(lan_resolver()),
        netns_cookie: switchyard_ebpf::netns_cookie(Some(Path::new(&format!(
            "/run/netns/{}",
            topo.lan
        ))))
        .expect("netns cookie"),
        tcp_redirect: Some(switchyard_ebpf::TcpRedirect {
            port4: port(&l4),
            port6: port(&l6),
        }),
    };
    let mounted = switchyard_ebpf::ensure_bpffs(&topo.pins).expect("bpffs");
    let mut program = SplitTunnelProgram::attach(&topo.scope, &topo.pins, &config).expect("attach");
    let cgroup_id = |p: &Path| switchyard_ebpf::cgroup_id(p).expect("cgroup id");
    program
        .set_app_cgroup(cgroup_id(&topo.inc), AppClass::Selected)
        .expect("app cgroup");
    program
        .insert_net(NetList::Bypass, "10.201.9.3/32".parse().expect("net"))
        .expect("bypass net");
    let origins = program.flow_origins().expect("flow origins");

    // the app's tunnelled connections reach the listener, which learns where each was going; the
    // app sees the original peer and no tunnel mark (loopback must not be routed to the TUN)
    let r = redirected_probe(&topo, &l4, &origins, "10.201.9.1:8080", "10.201.9.1:8080");
    assert_eq!(r, "mark=0x0 peer=10.201.9.1:8080 reply=listener", "IPv4");
    let r = redirected_probe(&topo, &l6, &origins, "[fd53:9::1]:8080", "[fd53:9::1]:8080");
    assert_eq!(r, "mark=0x0 peer=[fd53:9::1]:8080 reply=listener", "IPv6");
    let r = redirected_probe(
        &topo,
        &l4,
        &origins,
        "[::ffff:10.201.9.1]:8080",
        "10.201.9.1:8080",
    );
    assert_eq!(
        r, "mark=0x0 peer=[::ffff:10.201.9.1]:8080 reply=listener",
        "v4-mapped destination of a dual-stack socket"
    );

    // a socket bound to a device cannot reach loopback: it keeps its tunnel mark (the TUN path)
    let direct_link = format!("{}d", topo.lan.trim_end_matches("-lan"));
    let mut bound = topo.spawn_probe(
        &topo.inc,
        "tcp-peer-bound",
        "10.201.9.1:8080",
        &[("SYEBPF_DEVICE", &direct_link)],
    );
    assert_eq!(
        read_result(&mut bound),
        format!("mark={MARK:#x} peer=10.201.9.1:8080 reply={DIRECT}"),
        "bound to a device"
    );
    let _ = bound.wait();

    // not tunnelled: an excluded destination, another cgroup; DNS keeps its own redirect
    assert_eq!(topo.seen(&topo.inc, "10.201.9.3"), DIRECT, "always_bypass");
    assert_eq!(topo.seen(&topo.exc, "10.201.9.1"), DIRECT, "other cgroup");
    assert_eq!(
        topo.seen(&topo.exc, "fd53:9::1"),
        DIRECT6,
        "other cgroup v6"
    );
    let r = topo.probe(&topo.inc, "tcp-dns", "10.201.9.53:53");
    assert_eq!(r, "peer=10.201.9.53:53 reply=resolver:q", "TCP DNS");
    topo.assert_bystander_untouched("tcp redirect");
    for l in [&l4, &l6] {
        assert!(nothing_waiting(l), "nothing else reached the listener");
    }
    program.detach().expect("detach");
    if mounted {
        switchyard_ebpf::unmount_bpffs(&topo.pins).expect("unmount bpffs");
    }
    assert_eq!(
        topo.leftovers(),
        Vec::<String>::new(),
        "detach leaves nothing"
    );
}

/// Whether `listener` has no connection waiting.
fn nothing_waiting(listener: &std::net::TcpListener) -> bool {
    matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

#[test]
fn ebpf_redirects_tunnelled_tcp_to_the_listener() {
    if root_or_skip("ebpf_redirects_tunnelled_tcp_to_the_listener") {
        tcp_redirect_scenario();
    }
}

fn crash_cleanup(choice: &str, expected: &str) {
    let topo = Topo::new();
    let config = topo.config(MechanismChoice::Auto);
    let mut cmd = helper_cmd("hold", "");
    cmd.env("SYEBPF_MECH", choice)
        .env("SYEBPF_LAN", &topo.lan)
        .env("SYEBPF_SCOPE", &topo.scope)
        .env("SYEBPF_DATA", topo.data.path())
        .env("SYEBPF_PINS", &topo.pins)
        .env("SYEBPF_TUN", topo.tun_device())
        .env("SYEBPF_NFT", &config.nft_table);
    let mut holder = cmd.spawn().expect("holder");
    assert_eq!(read_result(&mut holder), format!("ready {expected} -"));
    let before = topo.leftovers();
    assert!(
        before.iter().any(|l| l == "ip rule"),
        "the holder installed its rule: {before:?}"
    );
    assert!(
        before.iter().any(|l| l.starts_with("routes")),
        "and its routes: {before:?}"
    );
    // the exec hook's tracepoint link, by id: it must be gone (not only unpinned) after recovery
    let exec_link = (expected == "ebpf").then(|| {
        let pin = topo.pins.join("links/sy_app_exec");
        let shown = sh_quiet(&format!("bpftool -j link show pinned '{}'", pin.display()));
        let link: serde_json::Value = serde_json::from_str(&shown).unwrap_or_default();
        let id = link["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("no exec hook link: {shown}"));
        let attached = sh_quiet(&format!("bpftool link show id {id}"));
        assert!(attached.contains("sched_process_exec"), "{attached}");
        id
    });
    holder.kill().expect("kill -9");
    let _ = holder.wait();
    let after_crash = topo.leftovers();
    assert!(
        after_crash.iter().any(|l| l == "ip rule"),
        "a crash leaves the rule: {after_crash:?}"
    );
    if expected == "ebpf" {
        assert!(
            after_crash.iter().any(|l| l.starts_with("pins")),
            "pinned links survive: {after_crash:?}"
        );
        assert!(
            after_crash.iter().any(|l| l.starts_with("cgroup programs")),
            "{after_crash:?}"
        );
    } else {
        assert!(
            after_crash.iter().any(|l| l == "nft table"),
            "{after_crash:?}"
        );
    }
    let undone = switchyard_split_tunnel::recover(topo.data.path()).expect("recover");
    assert!(undone > 0);
    assert_eq!(
        topo.leftovers(),
        Vec::<String>::new(),
        "recovery leaves nothing"
    );
    assert!(
        !topo.scope.join("switchyard-split-apps").exists(),
        "managed cgroup removed"
    );
    if let Some(id) = exec_link {
        let shown = sh_quiet(&format!("bpftool link show id {id}"));
        assert!(
            !shown.contains("sched_process_exec"),
            "the exec hook is still attached: {shown}"
        );
    }
}

/// Port 53 to the resolver of the lan namespace.
fn lan_resolver() -> DnsRedirect {
    DnsRedirect {
        intercept_port: 53,
        resolver4: Some("127.0.0.1:5353".parse().expect("addr")),
        resolver6: Some("[::1]:5353".parse().expect("addr")),
    }
}

fn config_from_env() -> SplitTunnelConfig {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} unset"));
    let mut c = SplitTunnelConfig::new(
        Path::new(&var("SYEBPF_DATA")),
        Path::new(&var("SYEBPF_SCOPE")),
        &var("SYEBPF_TUN"),
    );
    c.netns = Some(var("SYEBPF_LAN"));
    c.bpf_pin_dir = PathBuf::from(var("SYEBPF_PINS"));
    c.nft_table = var("SYEBPF_NFT");
    c.tunnel_mark = MARK;
    c.table = TABLE;
    c.dns = Some(lan_resolver());
    c.mechanism = match var("SYEBPF_MECH").as_str() {
        "nftables" => MechanismChoice::Nftables,
        _ => MechanismChoice::Ebpf,
    };
    c
}

/// A mount namespace in which no cgroup2 mount is visible (what `ip netns exec` gives a process:
/// it remounts /sys), kept by a bind mount of its nsfs file so that a holder started in it, the
/// recovery after its kill -9 and the checks all see the same mounts.
struct NoCgroupMounts {
    dir: PathBuf,
}

impl NoCgroupMounts {
    fn new(parent: &Path) -> NoCgroupMounts {
        let dir = parent.join("mntns");
        let d = dir.display();
        // the nsfs file can be bound only below a mount of private propagation
        sh(&format!(
            "set -e; mkdir -p '{d}'; mount --bind '{d}' '{d}'; mount --make-private '{d}'
             touch '{d}/mnt'
             unshare --mount='{d}/mnt' --propagation private umount -R /sys/fs/cgroup"
        ));
        NoCgroupMounts { dir }
    }

    /// `program` run in the namespace.
    fn command(&self, program: &Path) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--mount={}/mnt", self.dir.display()))
            .arg("--")
            .arg(program);
        c
    }

    /// The mount points inside the namespace below `dir`.
    fn mounts_below(&self, dir: &Path) -> Vec<String> {
        sh_quiet(&format!(
            "nsenter --mount='{}/mnt' -- findmnt -rn -o TARGET",
            self.dir.display()
        ))
        .lines()
        .filter(|m| Path::new(m).starts_with(dir))
        .map(String::from)
        .collect()
    }
}

impl Drop for NoCgroupMounts {
    fn drop(&mut self) {
        // the namespace, and every mount in it, goes with its last reference
        let _ = Command::new("umount").arg(self.dir.join("mnt")).status();
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

/// The split tunnel started like the client starts it, in a mount namespace without a visible
/// cgroup2 mount: it mounts the hierarchy privately under its data directory, classifies (the
/// `ips` rule tunnels, the bystander namespace stays untouched), and unmounts it on stop — or,
/// after a kill -9, on recovery.
#[derive(Clone, Copy, PartialEq)]
enum Stop {
    Disable,
    /// kill -9, the mount namespace (and so the private mount) lives on
    Kill,
    /// kill -9, and the mounts go as if the namespace had ended with the client (`ip netns exec`)
    KillMountsGone,
}

fn without_visible_cgroup2(choice: &str, stop: Stop) {
    let mut topo = Topo::new();
    topo.start_servers();
    let mntns = NoCgroupMounts::new(topo.data.path());
    assert!(
        !sh_quiet(&format!(
            "nsenter --mount='{}/mnt' -- cat /proc/self/mountinfo",
            mntns.dir.display()
        ))
        .contains(" - cgroup2 "),
        "the fixture's namespace shows no cgroup2 mount"
    );
    let config = topo.config(MechanismChoice::Auto);
    let host_mount = cgroup::cgroup2_mount().expect("cgroup2");
    let rel = topo
        .scope
        .strip_prefix(&host_mount)
        .expect("scope below the mount");
    let exe = std::env::current_exe().expect("test exe");
    let mut cmd = mntns.command(&exe);
    cmd.args(HELPER_ARGS)
        .env("SYEBPF_HELPER", "hold")
        .env("SYEBPF_MECH", choice)
        .env("SYEBPF_LAN", &topo.lan)
        .env("SYEBPF_SCOPE", &topo.scope)
        .env("SYEBPF_SCOPE_REL", rel)
        .env("SYEBPF_DATA", topo.data.path())
        .env("SYEBPF_PINS", &topo.pins)
        .env("SYEBPF_TUN", topo.tun_device())
        .env("SYEBPF_NFT", &config.nft_table)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut holder = cmd.spawn().expect("holder");
    let mut out = BufReader::new(holder.stdout.take().expect("stdout"));
    let private = switchyard_split_tunnel::private_cgroup2_dir(topo.data.path());
    assert_eq!(
        next_result(&mut out),
        format!("ready {choice} {}", private.display()),
        "started on a private cgroup2 mount"
    );
    assert_eq!(
        mntns.mounts_below(&private),
        [private.display().to_string()],
        "mounted"
    );
    assert_eq!(topo.seen(&topo.exc, "10.201.9.2"), TUNNEL, "classifies");
    assert_eq!(topo.seen(&topo.exc, "10.201.9.1"), DIRECT);
    topo.assert_bystander_untouched("private cgroup2 mount");

    let mut stdin = holder.stdin.take().expect("stdin");
    if stop != Stop::Disable {
        holder.kill().expect("kill -9");
        let _ = holder.wait();
        assert_eq!(
            mntns.mounts_below(&private).len(),
            1,
            "a crash leaves the private mount"
        );
        assert!(topo.scope.join("switchyard-split-apps").exists());
        // what the crash left keeps acting, with the netns cookie: on the lan namespace only
        assert_eq!(topo.seen(&topo.exc, "10.201.9.2"), TUNNEL, "after kill -9");
        topo.assert_bystander_untouched("after kill -9");
        if stop == Stop::KillMountsGone {
            for dir in [&private, &topo.pins] {
                sh(&format!(
                    "nsenter --mount='{}/mnt' -- umount '{}'",
                    mntns.dir.display(),
                    dir.display()
                ));
            }
        }
        let mut recovery = mntns.command(&exe);
        recovery
            .args(HELPER_ARGS)
            .env("SYEBPF_HELPER", "recover")
            .env("SYEBPF_ARG", topo.data.path())
            .stdout(Stdio::piped());
        let mut recovery = recovery.spawn().expect("recovery");
        let r = read_result(&mut recovery);
        let _ = recovery.wait();
        assert!(r.starts_with("undone ") && r != "undone 0", "{r}");
    } else {
        stdin.write_all(b"stop\n").expect("stop");
        assert_eq!(next_result(&mut out), "stopped");
        let _ = holder.wait();
    }
    for dir in [&private, &topo.pins] {
        assert_eq!(
            mntns.mounts_below(dir),
            Vec::<String>::new(),
            "no private cgroup2 (nor bpffs) mount is left"
        );
    }
    assert!(!private.exists(), "its directory is removed");
    assert!(
        !topo.scope.join("switchyard-split-apps").exists(),
        "the managed cgroup is removed"
    );
    assert_eq!(topo.leftovers(), Vec::<String>::new());
    assert_eq!(topo.seen(&topo.exc, "10.201.9.2"), DIRECT, "after stop");
    drop(stdin);
}

#[test]
fn starts_without_a_visible_cgroup2_mount_ebpf() {
    if root_or_skip("starts_without_a_visible_cgroup2_mount_ebpf") {
        without_visible_cgroup2("ebpf", Stop::Disable);
    }
}

#[test]
fn starts_without_a_visible_cgroup2_mount_nftables() {
    if root_or_skip("starts_without_a_visible_cgroup2_mount_nftables") {
        without_visible_cgroup2("nftables", Stop::Disable);
    }
}

#[test]
fn kill_9_with_a_private_cgroup2_mount_then_recovery_leaves_nothing_ebpf() {
    if root_or_skip("kill_9_with_a_private_cgroup2_mount_then_recovery_leaves_nothing_ebpf") {
        without_visible_cgroup2("ebpf", Stop::Kill);
    }
}

#[test]
fn kill_9_with_a_private_cgroup2_mount_then_recovery_leaves_nothing_nftables() {
    if root_or_skip("kill_9_with_a_private_cgroup2_mount_then_recovery_leaves_nothing_nftables") {
        without_visible_cgroup2("nftables", Stop::Kill);
    }
}

#[test]
fn kill_9_ending_the_private_cgroup2_mount_then_recovery_leaves_nothing() {
    if root_or_skip("kill_9_ending_the_private_cgroup2_mount_then_recovery_leaves_nothing") {
        without_visible_cgroup2("ebpf", Stop::KillMountsGone);
    }
}

#[test]
fn kill_9_then_recovery_leaves_nothing_ebpf() {
    if root_or_skip("kill_9_then_recovery_leaves_nothing_ebpf") {
        crash_cleanup("ebpf", "ebpf");
    }
}

#[test]
fn kill_9_then_recovery_leaves_nothing_nftables() {
    if root_or_skip("kill_9_then_recovery_leaves_nothing_nftables") {
        crash_cleanup("nftables", "nftables");
    }
}
