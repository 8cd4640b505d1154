//! **mesh**: two mesh peers in network namespaces, switchyard's mesh peer against nebula, tinc
//! and boringtun-cli in one run, with the bare link as the ceiling (needs root: namespaces, TUN).
//!
//! Layout (names prefixed `symb`, or `$SWITCHYARD_BENCH_PREFIX`; removed at the start, at the
//! end, on error and on Ctrl-C): namespaces `symb-a` and `symb-b` joined by a veth pair
//! (underlay 10.219.0.1 / 10.219.0.2, MTU 1500). One program at a time builds its overlay
//! between the two namespaces, every overlay device at MTU [`OVERLAY_MTU`]:
//!
//! | row | overlay | devices |
//! |---|---|---|
//! | raw underlay (ceiling) | none: the veth itself | – |
//! | boringtun-cli `--threads 1` / default threads (4) | 10.219.1.0/24, 10.219.2.0/24; keys from `wg genkey`, configured with `wg set` as in [`wireguard`](mod@crate::wireguard) | `symbw?`, `symbx?` |
//! | nebula | 10.219.3.0/24; a CA and two host certs from `nebula-cert`; `a` is the lighthouse | `symbn?` |
//! | tinc (1.0, router mode, default cipher) | 10.219.4.0/24; RSA keys from `tincd -K`; `b` connects to `a` | `symbt?` |
//! | switchyard | 10.219.5.0/24 leased by a `switchyard server` registry in `symb-a`; two `switchyard client`s with `mesh.enabled` | `symby?` |
//! | switchyard relayed (a → c → b) | the same network, registry in a third namespace `symb-c` joined to `a` (10.219.7.0/24) and to `b` (10.219.8.0/24) without IP forwarding, the a–b veth down; a third client in `c` passes a's and b's end-to-end envelopes on (`relay_via_peers`) | `symbz?` |
//!
//! An overlay is ready when `b`'s overlay address answers a ping from `a` (bounded wait). Then,
//! from `a` to `b` over the overlay: latency from `ping -i 0.01` (ICMP echo; p50/p99 of the
//! per-reply times), TCP throughput from iperf3 with 1 and 4 streams, the CPU of both peer
//! processes during the iperf3 runs, and VmRSS / PSS of each peer process after them. The
//! program's processes are stopped by PID before the next one starts.

mod programs;
mod summary;

use programs::Layout;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::json;

use crate::edge::pss_kib;
use crate::inventory::percentile;
use crate::procs::{rss_kib, tail, which, Procs};
use crate::report::{Entry, Role};
use crate::scenarios::{loadavg, Ctx};
use crate::vpn::{in_ns, iperf, prefix_or, sh};
use crate::wireguard::{cpu_seconds, run_cmd};

/// MTU of every overlay device (the mesh peer's default; leaves room for each program's
/// encapsulation on the 1500-byte veth).
const OVERLAY_MTU: u32 = 1400;
/// Underlay addresses of `a` and `b` on the veth pair.
const UNDERLAY: [&str; 2] = ["10.219.0.1", "10.219.0.2"];
/// The registry's management API, in namespace `a` on its underlay address.
const REGISTRY_PORT: u16 = 17390;
/// Each switchyard client's own API, on loopback inside its namespace.
const CLIENT_API_PORT: u16 = 17383;
/// The mesh network the registry leases switchyard's overlay addresses from.
const NETWORK: &str = "symb";
const SWITCHYARD_CIDR: &str = "10.219.5.0/24";
/// Longest wait for an overlay (or the registry) to come up.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The switchyard row's name; the target compares it with this row.
const REFERENCE: &str = "boringtun-cli --threads 1";
/// The relayed switchyard row's name.
const RELAYED: &str = "switchyard relayed (a → c → b)";
/// The relaying namespace's links: to `a` (a's address, c's) and to `b` (b's, c's).
const RELAY_LINKS: [[&str; 2]; 2] = [["10.219.7.1", "10.219.7.3"], ["10.219.8.2", "10.219.8.3"]];

/// One overlay's figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MeshFigures {
    /// MTU of the device `a` reaches `b` through (read from the kernel).
    pub mtu: Option<u32>,
    pub tcp_1_stream_gbit_s: f64,
    pub tcp_4_streams_gbit_s: f64,
    pub ping_sent: u32,
    pub ping_received: usize,
    pub ping_p50_ms: f64,
    pub ping_p99_ms: f64,
    /// CPU-seconds per second of both peer processes per Gbit/s, over the two iperf3 runs.
    pub peer_cpu_per_gbit: Option<f64>,
    /// VmRSS and PSS (KiB) of the peer process in `a` and in `b` after the runs.
    pub rss_kib: Vec<u64>,
    pub pss_kib: Vec<u64>,
    pub load_before: String,
    pub load_after: String,
}

/// A program under test.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Overlay {
    Underlay,
    Boringtun { threads: Option<u32> },
    Nebula,
    Tinc,
    Switchyard,
    SwitchyardRelayed,
}

impl Overlay {
    const ALL: [Overlay; 7] = [
        Overlay::Underlay,
        Overlay::Boringtun { threads: Some(1) },
        Overlay::Boringtun { threads: None },
        Overlay::Nebula,
        Overlay::Tinc,
        Overlay::Switchyard,
        Overlay::SwitchyardRelayed,
    ];

    fn name(self) -> &'static str {
        match self {
            Overlay::Underlay => "raw underlay (veth)",
            Overlay::Boringtun { threads: Some(_) } => REFERENCE,
            Overlay::Boringtun { threads: None } => "boringtun-cli (default threads, 4)",
            Overlay::Nebula => "nebula",
            Overlay::Tinc => "tinc",
            Overlay::Switchyard => "switchyard",
            Overlay::SwitchyardRelayed => RELAYED,
        }
    }

    fn role(self) -> Role {
        match self {
            Overlay::Underlay => Role::Ceiling,
            Overlay::Switchyard => Role::Switchyard,
            Overlay::SwitchyardRelayed => Role::Variant,
            _ => Role::Peer,
        }
    }
}

/// The names this scenario creates, from one prefix.
struct Names {
    prefix: String,
}

impl Names {
    fn new() -> Names {
        Names {
            prefix: prefix_or("symb"),
        }
    }

    /// Namespace of side 0 (`a`) or 1 (`b`).
    fn ns(&self, side: usize) -> String {
        format!("{}-{}", self.prefix, side_name(side))
    }

    /// A device of side `side`: prefix + one letter per program + `a`/`b` (≤ 12 characters).
    fn dev(&self, kind: char, side: usize) -> String {
        format!("{}{kind}{}", self.prefix, side_name(side))
    }

    /// The relaying namespace (`c`) of the relayed row.
    fn relay_ns(&self) -> String {
        format!("{}-c", self.prefix)
    }
}

fn side_name(side: usize) -> &'static str {
    if side == 0 {
        "a"
    } else {
        "b"
    }
}

/// Overlay address of `side` in the /24 whose third octet is `net`.
fn overlay_ip(net: u8, side: usize) -> String {
    format!("10.219.{net}.{}", side + 1)
}

/// PIDs of the scenario's running processes, for the Ctrl-C handler.
static RUNNING: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// The processes of one program (or of the scenario), stopped by PID when dropped and known
/// to the Ctrl-C handler while they run.
#[derive(Default)]
struct Tracked {
    procs: Procs,
    pids: Vec<u32>,
}

impl Tracked {
    fn spawn(&mut self, name: &str, cmd: Command, log: &Path) -> Result<u32> {
        let pid = self.procs.spawn(name, cmd, log)?;
        self.track(pid);
        Ok(pid)
    }

    /// A mesh peer under test (on the TEST CPUs with `--split-cpus`).
    fn spawn_under_test(&mut self, name: &str, cmd: Command, log: &Path) -> Result<u32> {
        let pid = self.procs.spawn_under_test(name, cmd, log)?;
        self.track(pid);
        Ok(pid)
    }

    fn track(&mut self, pid: u32) {
        self.pids.push(pid);
        if let Ok(mut running) = RUNNING.lock() {
            running.push(pid);
        }
    }

    /// `Some(reason)` when one of `pids` has exited.
    fn exited(&mut self, pids: &[u32]) -> Option<String> {
        pids.iter().find_map(|pid| self.procs.exited(*pid))
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Ok(mut running) = RUNNING.lock() {
            running.retain(|p| !self.pids.contains(p));
        }
        // `procs` drops next and stops them (SIGTERM, then SIGKILL).
    }
}

/// Removes what [`run`] creates; safe to call when nothing exists.
fn teardown(names: &Names) {
    let _ = Command::new("ip")
        .args(["netns", "del", &names.relay_ns()])
        .stderr(Stdio::null())
        .status();
    for side in 0..2 {
        let _ = Command::new("ip")
            .args(["netns", "del", &names.ns(side)])
            .stderr(Stdio::null())
            .status();
        for kind in ['w', 'x'] {
            let _ = fs::remove_file(format!("/var/run/wireguard/{}.sock", names.dev(kind, side)));
        }
    }
}

struct Guard(Names);

impl Drop for Guard {
    fn drop(&mut self) {
        teardown(&self.0);
    }
}

/// On Ctrl-C: stops the scenario's processes by PID, removes its namespaces and exits (the
/// harness has no other SIGINT handling; without this the namespaces would stay behind).
fn handle_ctrl_c(ctx: &Ctx) {
    ctx.rt.spawn(async {
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
        let pids = RUNNING.lock().map(|r| r.clone()).unwrap_or_default();
        for pid in &pids {
            if let Some(pid) = i32::try_from(*pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
        }
        if !pids.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        teardown(&Names::new());
        eprintln!("bench: interrupted; mesh namespaces removed");
        std::process::exit(130);
    });
}

/// A started overlay: the peer processes (in `a`, in `b`) and the address to reach `b` at.
struct Up {
    peers: Vec<u32>,
    target: String,
    version: Option<String>,
    notes: Vec<String>,
}

/// What every program's start needs.
struct Setup<'a> {
    ctx: &'a Ctx,
    names: &'a Names,
    dir: PathBuf,
}

impl Setup<'_> {
    fn ns(&self, side: usize) -> String {
        self.names.ns(side)
    }

    fn workdir(&self, name: &str) -> Result<PathBuf> {
        let d = self.dir.join(name);
        fs::create_dir_all(&d)?;
        Ok(d)
    }
}

pub fn run(ctx: &Ctx) -> Result<String> {
    if run_cmd("id", &["-u"])? != "0" {
        bail!("needs root (network namespaces, TUN devices)");
    }
    for tool in ["iperf3", "ping", "nsenter", "curl"] {
        which(tool).with_context(|| format!("{tool} is not installed"))?;
    }
    let names = Names::new();
    teardown(&names);
    let _guard = Guard(Names::new());
    handle_ctrl_c(ctx);
    let dir = ctx.env.dir.join("mesh");
    fs::create_dir_all(&dir)?;
    let (a, b) = (names.ns(0), names.ns(1));
    let (va, vb) = (names.dev('v', 0), names.dev('v', 1));
    sh(&format!(
        "set -e; ip netns add {a}; ip netns add {b}
         ip link add {va} netns {a} type veth peer name {vb} netns {b}
         ip -n {a} link set lo up; ip -n {b} link set lo up
         ip -n {a} addr add {}/24 dev {va}; ip -n {a} link set {va} up
         ip -n {b} addr add {}/24 dev {vb}; ip -n {b} link set {vb} up",
        UNDERLAY[0], UNDERLAY[1]
    ))?;
    let setup = Setup {
        ctx,
        names: &names,
        dir: dir.clone(),
    };
    let mut entries: Vec<Entry<MeshFigures>> = Vec::new();
    for overlay in Overlay::ALL {
        tracing::info!("bench mesh: {}", overlay.name());
        let mut entry = Entry::new(overlay.name(), overlay.role());
        let mut procs = Tracked::default();
        let relayed = overlay == Overlay::SwitchyardRelayed;
        if relayed {
            relay_topology(&names, true)?;
        }
        let load_before = loadavg();
        match start(&setup, overlay, &mut procs) {
            Ok(up) => {
                entry.version = up.version.clone();
                entry.notes.extend(up.notes.iter().cloned());
                match measure(&setup, &mut procs, &up) {
                    Ok(mut fig) => {
                        fig.load_before = load_before;
                        fig.load_after = loadavg();
                        entry.figures = Some(fig);
                    }
                    Err(e) => entry.error = Some(format!("{e:#}")),
                }
            }
            Err(e) => entry.error = Some(format!("{e:#}")),
        }
        drop(procs);
        if relayed {
            relay_topology(&names, false)?;
        }
        tracing::info!("bench mesh: {}: {}", overlay.name(), entry.status());
        entries.push(entry);
    }
    ctx.write_json(
        "mesh",
        json!({
            "seconds": ctx.seconds,
            "ping_count": ping_count(ctx.seconds),
            "overlay_mtu": OVERLAY_MTU,
            "underlay": UNDERLAY,
            "entries": entries,
        }),
    )?;
    Ok(summary::section(ctx.seconds, &entries))
}

/// With `up`: namespace `c` joined to `a` and to `b` ([`RELAY_LINKS`]) with IP forwarding off,
/// and the a–b veth down, so `a` and `b` reach each other only through a peer in `c`. Without:
/// `c` removed and the veth up again.
fn relay_topology(names: &Names, up: bool) -> Result<()> {
    let (a, b, c, p) = (names.ns(0), names.ns(1), names.relay_ns(), &names.prefix);
    let (va, vb) = (names.dev('v', 0), names.dev('v', 1));
    if !up {
        let _ = Command::new("ip")
            .args(["netns", "del", &c])
            .stderr(Stdio::null())
            .status();
        return sh(&format!(
            "set -e; ip -n {a} link set {va} up; ip -n {b} link set {vb} up"
        ))
        .map(drop);
    }
    let [[ia, ca], [ib, cb]] = RELAY_LINKS;
    sh(&format!(
        "set -e; ip netns add {c}; ip -n {c} link set lo up
         ip netns exec {c} sysctl -qw net.ipv4.ip_forward=0
         ip link add {p}ra netns {a} type veth peer name {p}rc netns {c}
         ip link add {p}sb netns {b} type veth peer name {p}sc netns {c}
         ip -n {a} addr add {ia}/24 dev {p}ra; ip -n {a} link set {p}ra up
         ip -n {c} addr add {ca}/24 dev {p}rc; ip -n {c} link set {p}rc up
         ip -n {b} addr add {ib}/24 dev {p}sb; ip -n {b} link set {p}sb up
         ip -n {c} addr add {cb}/24 dev {p}sc; ip -n {c} link set {p}sc up
         ip -n {a} link set {va} down; ip -n {b} link set {vb} down"
    ))
    .map(drop)
}

/// The relayed row's layout: registry and relaying peer in `c`, which `a` and `b` reach over
/// their own links.
fn relay_layout(s: &Setup<'_>) -> Layout {
    let relay_ns = s.names.relay_ns();
    Layout {
        registry_ns: relay_ns.clone(),
        registry_listen: format!("0.0.0.0:{REGISTRY_PORT}"),
        registry_urls: RELAY_LINKS.map(|[_, c]| format!("http://{c}:{REGISTRY_PORT}")),
        relay: Some((relay_ns, format!("http://127.0.0.1:{REGISTRY_PORT}"))),
        dev: 'z',
        name: "switchyard-relayed",
    }
}

/// Runs an iperf3 client, again (a few times, a second apart) while the server still says it is
/// busy: a server whose previous test's last exchange was cut (a relayed path under load) keeps
/// that test open for a while.
fn iperf_when_free(command: impl Fn() -> Command) -> Result<f64> {
    let mut attempt = 0;
    loop {
        match iperf(command()) {
            Err(e) if attempt < 5 && e.to_string().contains("busy") => {
                attempt += 1;
                std::thread::sleep(Duration::from_secs(1));
            }
            result => return result,
        }
    }
}

/// Starts `overlay` between the two namespaces and waits until `b` answers over it.
fn start(s: &Setup<'_>, overlay: Overlay, procs: &mut Tracked) -> Result<Up> {
    // A fresh iperf3 server per program: one whose streams were cut by the previous program's
    // stop stays "busy running a test" for a while. --forceflush: its "Server listening" line
    // reaches the log at once and tells that it is ready.
    let log = s.dir.join(format!(
        "iperf3-server-{}.log",
        overlay.name().replace(' ', "_")
    ));
    let iperf_server = procs.spawn(
        "iperf3 -s",
        in_ns(
            &s.ns(1),
            None,
            false,
            "iperf3",
            &["-s", "-p", "5201", "--forceflush"],
        ),
        &log,
    )?;
    let deadline = Instant::now() + READY_TIMEOUT;
    while !fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("Server listening")
    {
        if let Some(reason) = procs.exited(&[iperf_server]) {
            bail!("{reason}: {}", tail(&log, 3));
        }
        if Instant::now() > deadline {
            bail!("iperf3 -s not listening after {READY_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let up = match overlay {
        Overlay::Underlay => Up {
            peers: Vec::new(),
            target: UNDERLAY[1].to_string(),
            version: None,
            notes: vec!["iperf3 and ping straight over the veth (MTU 1500)".into()],
        },
        Overlay::Boringtun { threads } => programs::boringtun(s, threads, procs)?,
        Overlay::Nebula => programs::nebula(s, procs)?,
        Overlay::Tinc => programs::tinc(s, procs)?,
        Overlay::Switchyard => programs::switchyard(s, &Layout::direct(s), procs)?,
        Overlay::SwitchyardRelayed => programs::switchyard(s, &relay_layout(s), procs)?,
    };
    wait_reachable(s, procs, &up)?;
    Ok(up)
}

/// Pings `b`'s overlay address from `a` until it answers, failing early if a peer exits.
fn wait_reachable(s: &Setup<'_>, procs: &mut Tracked, up: &Up) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(reason) = procs.exited(&up.peers) {
            bail!("{reason}");
        }
        let ok = in_ns(
            &s.ns(0),
            None,
            false,
            "ping",
            &["-n", "-q", "-c", "1", "-W", "1", &up.target],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|st| st.success())
        .unwrap_or(false);
        if ok {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{} does not answer pings over the overlay after {READY_TIMEOUT:?}",
                up.target
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Pings sent for the latency figures: 100 per second of `--seconds`, at most 1000.
fn ping_count(seconds: u64) -> u32 {
    u32::try_from(seconds.saturating_mul(100).min(1000)).unwrap_or(1000)
}

/// The per-reply round-trip times (ms) of `ping -n` output.
fn ping_times(output: &str) -> Vec<f64> {
    output
        .lines()
        .filter_map(|l| l.split_once("time=").map(|(_, rest)| rest))
        .filter_map(|t| t.split_whitespace().next()?.parse::<f64>().ok())
        .collect()
}

/// The word after `key` in `ip -o` output (`dev NAME`, `mtu N`).
fn word_after<'t>(text: &'t str, key: &str) -> Option<&'t str> {
    let mut words = text.split_whitespace();
    words.find(|w| *w == key)?;
    words.next()
}

/// MTU of the device that namespace `ns` routes `target` through, as the kernel reports it
/// (shows what the program really set up); `None` when it cannot be read.
fn route_mtu(ns: &str, target: &str) -> Option<u32> {
    let route = run_cmd("ip", &["-n", ns, "-o", "route", "get", target]).ok()?;
    let dev = word_after(&route, "dev")?;
    let link = run_cmd("ip", &["-n", ns, "-o", "link", "show", "dev", dev]).ok()?;
    word_after(&link, "mtu")?.parse().ok()
}

fn measure(s: &Setup<'_>, procs: &mut Tracked, up: &Up) -> Result<MeshFigures> {
    let a = s.ns(0);
    let mut fig = MeshFigures {
        mtu: route_mtu(&a, &up.target),
        ..MeshFigures::default()
    };
    let count = ping_count(s.ctx.seconds);
    let (count_s, deadline_s) = (count.to_string(), (count / 100 + 10).to_string());
    let out = in_ns(
        &a,
        None,
        false,
        "ping",
        &[
            "-n",
            "-i",
            "0.01",
            "-W",
            "1",
            "-c",
            &count_s,
            "-w",
            &deadline_s,
            &up.target,
        ],
    )
    .output()
    .context("ping")?;
    let mut times = ping_times(&String::from_utf8_lossy(&out.stdout));
    if times.is_empty() {
        bail!(
            "no ping reply over the overlay: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    times.sort_by(f64::total_cmp);
    fig.ping_sent = count;
    fig.ping_received = times.len();
    fig.ping_p50_ms = percentile(&times, 50.0);
    fig.ping_p99_ms = percentile(&times, 99.0);

    let secs = s.ctx.seconds.to_string();
    let cpu = |pids: &[u32]| pids.iter().map(|p| cpu_seconds(*p)).sum::<f64>();
    let cpu_before = cpu(&up.peers);
    let started = Instant::now();
    let client = |extra: &[&str]| {
        let mut args = vec!["-c", &up.target, "-p", "5201", "-t", &secs, "-J"];
        args.extend_from_slice(extra);
        iperf_when_free(|| in_ns(&a, None, false, "iperf3", &args))
    };
    fig.tcp_1_stream_gbit_s = client(&[]).context("iperf3, 1 stream")?;
    fig.tcp_4_streams_gbit_s = client(&["-P", "4"]).context("iperf3, 4 streams")?;
    let wall = started.elapsed().as_secs_f64().max(0.001);
    if !up.peers.is_empty() {
        let mean_gbit = (fig.tcp_1_stream_gbit_s + fig.tcp_4_streams_gbit_s) / 2.0;
        fig.peer_cpu_per_gbit = Some((cpu(&up.peers) - cpu_before) / wall / mean_gbit.max(1e-9));
    }
    if let Some(reason) = procs.exited(&up.peers) {
        bail!("{reason} during the measurement");
    }
    for pid in &up.peers {
        fig.rss_kib.push(rss_kib(*pid)?);
        fig.pss_kib.push(pss_kib(*pid)?);
    }
    Ok(fig)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn ping_times_are_read_from_each_reply() {
        let out = "PING 10.219.4.2 (10.219.4.2) 56(84) bytes of data.\n\
                   64 bytes from 10.219.4.2: icmp_seq=1 ttl=64 time=23.7 ms\n\
                   64 bytes from 10.219.4.2: icmp_seq=2 ttl=64 time=0.061 ms\n\
                   From 10.219.4.1 icmp_seq=3 Destination Host Unreachable\n\n\
                   --- 10.219.4.2 ping statistics ---\n\
                   3 packets transmitted, 2 received, 33% packet loss, time 20ms\n\
                   rtt min/avg/max/mdev = 0.061/11.880/23.700/11.819 ms\n";
        assert_eq!(ping_times(out), vec![23.7, 0.061]);
        assert!(ping_times("ping: connect: Network is unreachable").is_empty());
        assert_eq!(ping_count(5), 500);
        assert_eq!(ping_count(600), 1000);
    }

    #[test]
    fn device_and_mtu_are_read_from_ip_output() {
        let route = "10.219.3.2 dev symbna src 10.219.3.1 uid 0 \\    cache ";
        assert_eq!(word_after(route, "dev"), Some("symbna"));
        let link = "7: symbna: <POINTOPOINT,MULTICAST,NOARP,UP,LOWER_UP> mtu 1400 qdisc fq_codel state UNKNOWN";
        assert_eq!(word_after(link, "mtu"), Some("1400"));
        assert_eq!(word_after("dev", "dev"), None);
        assert_eq!(word_after("", "mtu"), None);
    }

    #[test]
    fn names_fit_interface_limits_and_carry_the_prefix() {
        let names = Names {
            prefix: "abcdefghij".into(),
        };
        assert_eq!(names.ns(1), "abcdefghij-b");
        assert!(names.dev('w', 0).len() <= 15);
        assert_eq!(
            Names::new().dev('t', 1).len(),
            Names::new().prefix.len() + 2
        );
    }
}
