//! Real peers for the resolver tests: dnsmasq as the upstream server (its query log counts what
//! reached it), dig as the querying application, microsocks as a SOCKS5 proxy. Each runs on
//! loopback on free ports with its files in a temp dir and is killed by PID when dropped.
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use switchyard_vpn_dns::OnResolved;

/// Finds an executable in PATH or the sbin directories.
pub fn which(cmd: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"])
        .map(|d| Path::new(d).join(cmd))
        .find(|p| p.is_file());
    found
}

/// The program's path, or None after printing why the test skips. Under CI (`CI` set) a
/// missing program fails the test instead (tests/run installs them).
pub fn require(cmd: &str) -> Option<PathBuf> {
    match which(cmd) {
        Some(p) => Some(p),
        None if std::env::var_os("CI").is_some() => {
            panic!("{cmd} is required in CI (tests/run installs it)")
        }
        None => {
            eprintln!("SKIP: {cmd} is not installed (run tests/run as root to install it)");
            None
        }
    }
}

/// Whether this process runs as root (uid 0).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
}

/// A port free for both UDP and TCP on `ip`.
pub fn free_port(ip: IpAddr) -> u16 {
    loop {
        let udp = UdpSocket::bind((ip, 0)).expect("bind udp");
        let port = udp.local_addr().expect("addr").port();
        if TcpListener::bind((ip, port)).is_ok() {
            return port;
        }
    }
}

fn wait_for_tcp(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(addr).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on {addr}");
}

/// A child killed by PID when dropped.
pub struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running dnsmasq answering from its own records (no upstream of its own).
pub struct Dnsmasq {
    pub addr: SocketAddr,
    log: PathBuf,
    _proc: Proc,
    _dir: tempfile::TempDir,
}

/// One TXT string of 200 bytes; [`BIG_TXT_RECORDS`] of them make an answer larger than the EDNS
/// size the resolver advertises (1232), so dnsmasq truncates it over UDP.
pub const BIG_TXT: &str = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghi";
pub const BIG_TXT_RECORDS: usize = 8;

impl Dnsmasq {
    /// Starts dnsmasq with `records` (extra options such as `--address=/a.test/10.1.2.3`) and
    /// TTL 600 on its answers, or None when dnsmasq is missing.
    pub fn start(records: &[String]) -> Option<Dnsmasq> {
        Dnsmasq::start_on(IpAddr::from([127, 0, 0, 1]), records)
    }

    /// [`Dnsmasq::start`] on another loopback address (`::1`, `127.0.0.2`…).
    pub fn start_on(ip: IpAddr, records: &[String]) -> Option<Dnsmasq> {
        let bin = require("dnsmasq")?;
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("queries.log");
        let port = free_port(ip);
        let mut cmd = Command::new(bin);
        cmd.args([
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            "--pid-file=",
            "--local-ttl=600",
            "--log-queries",
        ])
        // As root dnsmasq would switch to `nobody`, who cannot write the log in our temp dir.
        .args(is_root().then_some("--user=root"))
        .arg(format!("--listen-address={ip}"))
        .arg(format!("--port={port}"))
        .arg(format!("--log-facility={}", log.display()))
        .args(records)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let proc = Proc(cmd.spawn().expect("start dnsmasq"));
        let addr = SocketAddr::new(ip, port);
        wait_for_tcp(addr);
        Some(Dnsmasq {
            addr,
            log,
            _proc: proc,
            _dir: dir,
        })
    }

    /// How many queries for `name` of `qtype` dnsmasq has logged.
    pub fn queries(&self, qtype: &str, name: &str) -> usize {
        // Questions for its own authoritative zones are logged as `auth[A] name from ...`.
        let needles = [
            format!("query[{qtype}] {name} from"),
            format!("auth[{qtype}] {name} from"),
        ];
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| needles.iter().any(|n| l.contains(n)))
            .count()
    }

    /// The process id on each logged query line, in order: dnsmasq serves UDP in its main
    /// process and each TCP connection in a child of its own.
    pub fn query_pids(&self) -> Vec<u32> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("]: query["))
            .filter_map(|l| l.split("dnsmasq[").nth(1)?.split(']').next()?.parse().ok())
            .collect()
    }

    /// Waits (10 s at most) until dnsmasq has logged `n` queries for `name`.
    pub fn wait_queries(&self, qtype: &str, name: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.queries(qtype, name) < n {
            assert!(
                Instant::now() < deadline,
                "dnsmasq logged {} queries for {name}, expected {n}",
                self.queries(qtype, name)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The records every resolver test uses.
pub fn test_records() -> Vec<String> {
    let mut r = vec![
        "--address=/a.test/10.1.2.3".to_owned(),
        "--address=/a.test/2001:db8::3".to_owned(),
        "--host-record=edge.cdn.test,10.9.9.9,2001:db8::9".to_owned(),
        "--cname=www.shop.test,shop.cdn.test".to_owned(),
        "--cname=shop.cdn.test,edge.cdn.test".to_owned(),
    ];
    for i in 0..BIG_TXT_RECORDS {
        r.push(format!("--txt-record=big.test,{i}{BIG_TXT}"));
    }
    r
}

/// dnsmasq with [`test_records`], when both it and dig are installed.
pub fn dnsmasq_and_dig() -> Option<Dnsmasq> {
    require("dig")?;
    Dnsmasq::start(&test_records())
}

/// Output of `dig @resolver args…`, one try with a 5 s limit so a test never hangs.
pub async fn dig(resolver: SocketAddr, args: &[&str]) -> String {
    let out = tokio::process::Command::new("dig")
        .arg(format!("@{}", resolver.ip()))
        .args(["-p", &resolver.port().to_string(), "+tries=1", "+time=5"])
        .args(args)
        .output()
        .await
        .expect("run dig");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `status:` of a dig answer (`NOERROR`, `SERVFAIL`, …).
pub fn status(dig_output: &str) -> &str {
    dig_output
        .split("status: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or("no answer")
}

/// `(name, ttl, type, data)` of each record dig printed with `+noall +answer`.
pub fn records(dig_output: &str) -> Vec<(String, u32, String, String)> {
    dig_output
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let [name, ttl, _class, rtype, data @ ..] = &f[..] else {
                return None;
            };
            Some((
                name.to_string(),
                ttl.parse().ok()?,
                rtype.to_string(),
                data.join(" "),
            ))
        })
        .collect()
}

/// One `on_resolved` call: the name and its addresses.
type Report = (String, Vec<IpAddr>);

/// Collects what the resolver reports through `on_resolved`.
#[derive(Clone, Default)]
pub struct Reports(Arc<Mutex<Vec<Report>>>);

impl Reports {
    pub fn hook(&self) -> OnResolved {
        let seen = self.0.clone();
        Arc::new(move |name: &str, ips: &[IpAddr]| {
            seen.lock()
                .expect("reports")
                .push((name.to_owned(), ips.to_vec()));
        })
    }

    /// How many reports were made.
    pub fn count(&self) -> usize {
        self.0.lock().expect("reports").len()
    }

    /// The addresses reported for `name` (all reports merged, sorted).
    pub fn addresses(&self, name: &str) -> Vec<IpAddr> {
        let mut ips: Vec<IpAddr> = self
            .0
            .lock()
            .expect("reports")
            .iter()
            .filter(|(n, _)| n == name)
            .flat_map(|(_, ips)| ips.iter().copied())
            .collect();
        ips.sort();
        ips.dedup();
        ips
    }
}

/// A running microsocks SOCKS5 proxy requiring `user`/`pass`.
pub struct Microsocks {
    pub addr: SocketAddr,
    _proc: Proc,
}

impl Microsocks {
    pub fn start(user: &str, pass: &str) -> Option<Microsocks> {
        Microsocks::start_on(free_port(IpAddr::from([127, 0, 0, 1])), user, pass)
    }

    /// Kills this proxy (closing every connection through it) and starts a new one on the
    /// same port.
    pub fn restart(self, user: &str, pass: &str) -> Option<Microsocks> {
        let port = self.addr.port();
        drop(self);
        Microsocks::start_on(port, user, pass)
    }

    fn start_on(port: u16, user: &str, pass: &str) -> Option<Microsocks> {
        let bin = require("microsocks")?;
        let proc = Proc(
            Command::new(bin)
                .args([
                    "-i",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "-u",
                    user,
                    "-P",
                    pass,
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start microsocks"),
        );
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        wait_for_tcp(addr);
        Some(Microsocks { addr, _proc: proc })
    }
}
