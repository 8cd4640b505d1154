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
//!
//! An overlay is ready when `b`'s overlay address answers a ping from `a` (bounded wait). Then,
//! from `a` to `b` over the overlay: latency from `ping -i 0.01` (ICMP echo; p50/p99 of the
//! per-reply times), TCP throughput from iperf3 with 1 and 4 streams, the CPU of both peer
//! processes during the iperf3 runs, and VmRSS / PSS of each peer process after them. The
//! program's processes are stopped by PID before the next one starts.

use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Value};

use crate::edge::pss_kib;
use crate::inventory::percentile;
use crate::peers::deb_version;
use crate::procs::{output_of, rss_kib, tail, which, Procs};
use crate::report::{compare, f, notes, table, verdict, version_cell, Entry, Role};
use crate::scenarios::{loadavg, Ctx};
use crate::tunnels::{one_minute, BUSY_LOAD};
use crate::vpn::{in_ns, iperf, prefix_or, sh};
use crate::wireguard::{boringtun_cli, cpu_seconds, keypair, run_cmd, start_boringtun};

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

/// One overlay's figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MeshFigures {
    pub mtu: u32,
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
}

impl Overlay {
    const ALL: [Overlay; 6] = [
        Overlay::Underlay,
        Overlay::Boringtun { threads: Some(1) },
        Overlay::Boringtun { threads: None },
        Overlay::Nebula,
        Overlay::Tinc,
        Overlay::Switchyard,
    ];

    fn name(self) -> &'static str {
        match self {
            Overlay::Underlay => "raw underlay (veth)",
            Overlay::Boringtun { threads: Some(_) } => REFERENCE,
            Overlay::Boringtun { threads: None } => "boringtun-cli (default threads, 4)",
            Overlay::Nebula => "nebula",
            Overlay::Tinc => "tinc",
            Overlay::Switchyard => "switchyard",
        }
    }

    fn role(self) -> Role {
        match self {
            Overlay::Underlay => Role::Ceiling,
            Overlay::Switchyard => Role::Switchyard,
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
    Ok(section(ctx.seconds, &entries))
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
        Overlay::Boringtun { threads } => boringtun(s, threads, procs)?,
        Overlay::Nebula => nebula(s, procs)?,
        Overlay::Tinc => tinc(s, procs)?,
        Overlay::Switchyard => switchyard(s, procs)?,
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

fn measure(s: &Setup<'_>, procs: &mut Tracked, up: &Up) -> Result<MeshFigures> {
    let a = s.ns(0);
    let mut fig = MeshFigures {
        mtu: if up.peers.is_empty() {
            1500
        } else {
            OVERLAY_MTU
        },
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
    fig.tcp_1_stream_gbit_s = iperf(in_ns(
        &a,
        None,
        false,
        "iperf3",
        &["-c", &up.target, "-p", "5201", "-t", &secs, "-J"],
    ))
    .context("iperf3, 1 stream")?;
    fig.tcp_4_streams_gbit_s = iperf(in_ns(
        &a,
        None,
        false,
        "iperf3",
        &["-c", &up.target, "-p", "5201", "-t", &secs, "-P", "4", "-J"],
    ))
    .context("iperf3, 4 streams")?;
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

// ---------------------------------------------------------------- the programs

fn boringtun(s: &Setup<'_>, threads: Option<u32>, procs: &mut Tracked) -> Result<Up> {
    let bin = boringtun_cli()?;
    which("wg").context("wg (wireguard-tools) is not installed")?;
    let (kind, net) = if threads.is_some() {
        ('w', 1)
    } else {
        ('x', 2)
    };
    let dir = s.workdir(&format!("boringtun-{kind}"))?;
    let keys = [keypair()?, keypair()?];
    let mut peers = Vec::new();
    for side in 0..2 {
        let (ns, tun) = (s.ns(side), s.names.dev(kind, side));
        let key = dir.join(format!("{}.key", side_name(side)));
        write_secret(&key, &keys[side].0)?;
        let log = dir.join(format!("{}.log", side_name(side)));
        let pid = start_boringtun(&mut procs.procs, &bin, &ns, &tun, threads, &log)?;
        procs.track(pid);
        peers.push(pid);
        let other = 1 - side;
        run_cmd(
            "ip",
            &[
                "netns",
                "exec",
                &ns,
                "wg",
                "set",
                &tun,
                "private-key",
                &key.display().to_string(),
                "listen-port",
                "51820",
                "peer",
                &keys[other].1,
                "allowed-ips",
                &format!("{}/32", overlay_ip(net, other)),
                "endpoint",
                &format!("{}:51820", UNDERLAY[other]),
            ],
        )?;
        sh(&format!(
            "set -e; ip -n {ns} addr add {}/24 dev {tun}; ip -n {ns} link set {tun} mtu {OVERLAY_MTU} up",
            overlay_ip(net, side)
        ))?;
    }
    Ok(Up {
        peers,
        target: overlay_ip(net, 1),
        version: output_of(&bin.to_string_lossy(), &["--version"]),
        notes: Vec::new(),
    })
}

/// nebula's configuration for `side` (`a` is the lighthouse, `b` finds it by the static map).
fn nebula_config(dir: &Path, side: usize, dev: &str) -> String {
    let me = side_name(side);
    let lighthouse = overlay_ip(3, 0);
    let (am, hosts) = if side == 0 {
        ("true", "[]".to_string())
    } else {
        ("false", format!("[\"{lighthouse}\"]"))
    };
    let d = dir.display();
    format!(
        "pki: {{ca: \"{d}/ca.crt\", cert: \"{d}/{me}.crt\", key: \"{d}/{me}.key\"}}\n\
         static_host_map: {{\"{lighthouse}\": [\"{}:4242\"]}}\n\
         lighthouse: {{am_lighthouse: {am}, interval: 60, hosts: {hosts}}}\n\
         listen: {{host: 0.0.0.0, port: 4242}}\n\
         punchy: {{punch: false}}\n\
         tun: {{disabled: false, dev: {dev}, mtu: {OVERLAY_MTU}}}\n\
         logging: {{level: info}}\n\
         firewall:\n  outbound: [{{port: any, proto: any, host: any}}]\n  inbound: [{{port: any, proto: any, host: any}}]\n",
        UNDERLAY[0]
    )
}

fn nebula(s: &Setup<'_>, procs: &mut Tracked) -> Result<Up> {
    let bin = which("nebula").context("nebula is not installed")?;
    which("nebula-cert").context("nebula-cert is not installed")?;
    let dir = s.workdir("nebula")?;
    let path = |f: &str| dir.join(f).display().to_string();
    run_cmd(
        "nebula-cert",
        &[
            "ca",
            "-name",
            "switchyard bench",
            "-out-crt",
            &path("ca.crt"),
            "-out-key",
            &path("ca.key"),
        ],
    )?;
    let mut peers = Vec::new();
    for side in 0..2 {
        let me = side_name(side);
        run_cmd(
            "nebula-cert",
            &[
                "sign",
                "-ca-crt",
                &path("ca.crt"),
                "-ca-key",
                &path("ca.key"),
                "-name",
                me,
                "-ip",
                &format!("{}/24", overlay_ip(3, side)),
                "-out-crt",
                &path(&format!("{me}.crt")),
                "-out-key",
                &path(&format!("{me}.key")),
            ],
        )?;
        let conf = dir.join(format!("{me}.yml"));
        fs::write(&conf, nebula_config(&dir, side, &s.names.dev('n', side)))?;
        let cmd = in_ns(
            &s.ns(side),
            None,
            false,
            &bin.to_string_lossy(),
            &["-config", &conf.display().to_string()],
        );
        peers.push(procs.spawn(&format!("nebula {me}"), cmd, &dir.join(format!("{me}.log")))?);
    }
    Ok(Up {
        peers,
        target: overlay_ip(3, 1),
        version: deb_version("nebula"),
        notes: vec!["AES-256-GCM (nebula's default cipher), a is the lighthouse".into()],
    })
}

/// tinc's `tinc.conf`, host file (before the key is appended) and `tinc-up` for `side`.
fn tinc_files(side: usize, dev: &str) -> [String; 3] {
    let me = side_name(side);
    let mut conf = format!("Name = {me}\nInterface = {dev}\nAddressFamily = ipv4\n");
    if side == 1 {
        conf.push_str("ConnectTo = a\n");
    }
    let host = format!(
        "Address = {}\nSubnet = {}/32\n",
        UNDERLAY[side],
        overlay_ip(4, side)
    );
    let up = format!(
        "#!/bin/sh\nip addr add {}/24 dev \"$INTERFACE\"\nip link set \"$INTERFACE\" mtu {OVERLAY_MTU} up\n",
        overlay_ip(4, side)
    );
    [conf, host, up]
}

fn tinc(s: &Setup<'_>, procs: &mut Tracked) -> Result<Up> {
    let bin = which("tincd").context("tinc is not installed")?;
    let dir = s.workdir("tinc")?;
    let conf_dirs = [dir.join("a"), dir.join("b")];
    for (side, d) in conf_dirs.iter().enumerate() {
        fs::create_dir_all(d.join("hosts"))?;
        let [conf, host, up] = tinc_files(side, &s.names.dev('t', side));
        fs::write(d.join("tinc.conf"), conf)?;
        fs::write(d.join("hosts").join(side_name(side)), host)?;
        fs::write(d.join("tinc-up"), up)?;
        fs::set_permissions(d.join("tinc-up"), fs::Permissions::from_mode(0o755))?;
        // Not a terminal on stdin: tincd writes the keys to their default places without asking
        // (rsa_key.priv, and the public key appended to hosts/<Name>).
        let out = Command::new(&bin)
            .arg("-c")
            .arg(d)
            .arg("-K2048")
            .stdin(Stdio::null())
            .output()
            .context("tincd -K")?;
        if !out.status.success() || !d.join("rsa_key.priv").exists() {
            bail!(
                "tincd -K failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    for side in 0..2 {
        let me = side_name(side);
        fs::copy(
            conf_dirs[side].join("hosts").join(me),
            conf_dirs[1 - side].join("hosts").join(me),
        )?;
    }
    let mut peers = Vec::new();
    for (side, d) in conf_dirs.iter().enumerate() {
        let me = side_name(side);
        let pidfile = format!("--pidfile={}", d.join("tinc.pid").display());
        let cmd = in_ns(
            &s.ns(side),
            None,
            false,
            &bin.to_string_lossy(),
            &["-c", &d.display().to_string(), "-D", &pidfile],
        );
        peers.push(procs.spawn(&format!("tincd {me}"), cmd, &dir.join(format!("{me}.log")))?);
    }
    Ok(Up {
        peers,
        target: overlay_ip(4, 1),
        version: deb_version("tinc"),
        notes: vec![
            "router mode, UDP, default Cipher/Digest (tinc 1.0: blowfish-CBC, SHA-1)".into(),
        ],
    })
}

/// An HTTP call made with curl from inside namespace `ns`: the status and the JSON body (Null
/// when empty or not JSON).
fn http(ns: &str, method: &str, url: &str, body: Option<&Value>) -> Result<(u16, Value)> {
    let body = body.map(Value::to_string);
    let mut args = vec!["-sS", "-m", "5", "-X", method, "-w", "\n%{http_code}"];
    if let Some(b) = &body {
        args.extend(["-H", "Content-Type: application/json", "--data", b.as_str()]);
    }
    args.push(url);
    let out = in_ns(ns, None, false, "curl", &args)
        .output()
        .context("curl")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    let code = code.trim().parse().unwrap_or(0);
    if code == 0 {
        bail!(
            "{method} {url}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok((code, serde_json::from_str(body).unwrap_or(Value::Null)))
}

/// The virtual IP the registry leased to the peer named (or with the id) `name`, from
/// `GET /api/v1/mesh/networks/{id}/peers`.
fn leased_ip(peers: &Value, name: &str) -> Option<String> {
    peers["peers"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name || p["id"] == name)?["virtual_ip"]
        .as_str()
        .filter(|ip| ip.parse::<std::net::Ipv4Addr>().is_ok())
        .map(str::to_string)
}

/// A client's `GET /api/v1/mesh/status` in a few words: its `status` and `enabled`.
fn mesh_state(code: u16, v: &Value) -> String {
    match (code, v["status"].as_str()) {
        (200, Some(status)) => format!("{status} (enabled: {})", v["enabled"]),
        _ => format!("HTTP {code} {v}"),
    }
}

/// `switchyard client`'s configuration for `side`: only the mesh, registry in `a`.
fn client_config(side: usize, dev: &str) -> String {
    format!(
        "proxy:\n  http: {{listen: \"127.0.0.1:0\"}}\n  socks5: {{listen: \"127.0.0.1:0\"}}\n  cores: 1\n\
         api: {{listen: \"127.0.0.1:{CLIENT_API_PORT}\"}}\nlogging: {{level: info}}\n\
         mesh:\n  enabled: true\n  network_id: {NETWORK}\n  network_cidr: {SWITCHYARD_CIDR}\n  peer_name: {}\n\
         \x20 device: {{type: tun, name: {dev}, mtu: {OVERLAY_MTU}}}\n\
         \x20 discovery: {{server: \"http://{}:{REGISTRY_PORT}\", heartbeat_interval: 5s}}\n",
        side_name(side),
        UNDERLAY[0]
    )
}

fn switchyard(s: &Setup<'_>, procs: &mut Tracked) -> Result<Up> {
    let bin = s.ctx.switchyard.display().to_string();
    let dir = s.workdir("switchyard")?;
    let a = s.ns(0);
    let registry = format!("http://{}:{REGISTRY_PORT}", UNDERLAY[0]);
    let server_cfg = dir.join("server.yaml");
    fs::write(
        &server_cfg,
        format!(
            "server:\n  http: {{listen: \"127.0.0.1:0\"}}\n  socks5: {{listen: \"127.0.0.1:0\"}}\n  cores: 1\n  data_dir: \"{}\"\n\
             api: {{listen: \"{}:{REGISTRY_PORT}\"}}\nlogging: {{level: info}}\n\
             mesh:\n  registry: {{enabled: true, lease_time: 30s}}\n",
            dir.join("server-data").display(),
            UNDERLAY[0]
        ),
    )?;
    let server_log = dir.join("server.log");
    let server = procs.spawn(
        "switchyard server (registry)",
        in_ns(
            &a,
            None,
            false,
            &bin,
            &["server", "--config", &server_cfg.display().to_string()],
        ),
        &server_log,
    )?;
    let networks = format!("{registry}/api/v1/mesh/networks");
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(reason) = procs.exited(&[server]) {
            bail!("{reason}; log: {}", tail(&server_log, 5));
        }
        match http(&a, "GET", &networks, None) {
            Ok((200, _)) => break,
            Ok((status, body)) if Instant::now() > deadline => {
                bail!("registry: GET {networks} answers {status}: {body}")
            }
            Err(e) if Instant::now() > deadline => bail!("registry did not come up: {e:#}"),
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
    let (status, body) = http(
        &a,
        "POST",
        &networks,
        Some(&json!({"id": NETWORK, "name": "switchyard bench", "cidr": SWITCHYARD_CIDR})),
    )?;
    if status != 201 {
        bail!("registry: creating the network answered {status}: {body}");
    }
    let mut peers = Vec::new();
    let mut logs = Vec::new();
    for side in 0..2 {
        let me = side_name(side);
        let cfg = dir.join(format!("client-{me}.yaml"));
        fs::write(&cfg, client_config(side, &s.names.dev('y', side)))?;
        let log = dir.join(format!("client-{me}.log"));
        let cmd = in_ns(
            &s.ns(side),
            None,
            false,
            &bin,
            &[
                "client",
                "--config",
                &cfg.display().to_string(),
                "--data-dir",
                &dir.join(format!("client-{me}-data")).display().to_string(),
            ],
        );
        peers.push(procs.spawn(&format!("switchyard client {me}"), cmd, &log)?);
        logs.push(log);
    }
    // Both peers registered: b's leased address is where a pings it.
    let listed = format!("{networks}/{NETWORK}/peers");
    let deadline = Instant::now() + READY_TIMEOUT;
    let target = loop {
        if let Some(reason) = procs.exited(&peers) {
            bail!(
                "{reason}; logs: a: {} / b: {}",
                tail(&logs[0], 3),
                tail(&logs[1], 3)
            );
        }
        let list = http(&a, "GET", &listed, None)
            .map(|(_, v)| v)
            .unwrap_or(Value::Null);
        if let (Some(_), Some(ip)) = (leased_ip(&list, "a"), leased_ip(&list, "b")) {
            break ip;
        }
        if Instant::now() > deadline {
            let status = |side: usize| {
                http(
                    &s.ns(side),
                    "GET",
                    &format!("http://127.0.0.1:{CLIENT_API_PORT}/api/v1/mesh/status"),
                    None,
                )
                .map(|(code, v)| mesh_state(code, &v))
                .unwrap_or_else(|e| format!("{e:#}"))
            };
            bail!(
                "the peers did not both register within {READY_TIMEOUT:?} (client mesh status a: {}, b: {}; registry lists {}); log a: {}",
                status(0),
                status(1),
                list["peers"],
                tail(&logs[0], 3)
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    Ok(Up {
        peers,
        target,
        version: output_of(&bin, &["--version"]).filter(|v| !v.is_empty()),
        notes: vec![format!(
            "`switchyard client` peers (whole client process measured), registry `switchyard server` in {a}, network {SWITCHYARD_CIDR}"
        )],
    })
}

/// Writes a key file readable by its owner only.
fn write_secret(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    Ok(())
}

// ---------------------------------------------------------------- summary

/// `a / b` with one decimal (MiB), or "–".
fn mib_pair(kib: &[u64]) -> String {
    if kib.is_empty() {
        return "–".into();
    }
    kib.iter()
        .map(|k| f(*k as f64 / 1024.0, 1))
        .collect::<Vec<_>>()
        .join(" / ")
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{}×", f(a / b, 2))
    } else {
        "–".into()
    }
}

/// The Markdown section: the table, the ratios to the reference and the best peer.
fn section(seconds: u64, entries: &[Entry<MeshFigures>]) -> String {
    let reference = entries
        .iter()
        .find(|e| e.program == REFERENCE)
        .and_then(Entry::valid);
    let mut md = String::from("## mesh\n\n");
    let _ = writeln!(
        md,
        "Two peers in network namespaces joined by a veth pair (underlay {} / {}, MTU 1500); each program builds its overlay over it (every overlay device at MTU {OVERLAY_MTU}), one program at a time. From `a` to `b`'s overlay address: iperf3 TCP for {seconds} s with 1 and 4 streams; latency of ICMP echo, `ping -i 0.01 -c {}`, p50/p99 of the per-reply times; peer CPU = CPU-seconds per second of both peer processes per Gbit/s over the two iperf3 runs; memory = VmRSS and PSS of each peer process (a / b) after the runs. Load averages above {BUSY_LOAD} are marked ⚠ (other work shared the 2 cores).\n",
        UNDERLAY[0],
        UNDERLAY[1],
        ping_count(seconds)
    );
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let fig = e.figures.as_ref();
            let num = |get: fn(&MeshFigures) -> f64, digits: usize| {
                fig.map(|x| f(get(x), digits)).unwrap_or_else(|| "–".into())
            };
            let vs_ref = match (e.valid(), reference) {
                (Some(x), Some(r)) => ratio(x.tcp_1_stream_gbit_s, r.tcp_1_stream_gbit_s),
                _ => "–".into(),
            };
            let load = fig
                .map(|x| {
                    let busy = [&x.load_before, &x.load_after]
                        .iter()
                        .any(|l| one_minute(l) > BUSY_LOAD);
                    format!(
                        "{} → {}{}",
                        x.load_before.split(' ').next().unwrap_or(""),
                        x.load_after.split(' ').next().unwrap_or(""),
                        if busy { " ⚠" } else { "" }
                    )
                })
                .unwrap_or_else(|| "–".into());
            vec![
                e.program.clone(),
                version_cell(&e.version),
                num(|x| x.tcp_1_stream_gbit_s, 2),
                num(|x| x.tcp_4_streams_gbit_s, 2),
                vs_ref,
                num(|x| x.ping_p50_ms, 3),
                num(|x| x.ping_p99_ms, 3),
                fig.map(|x| format!("{}/{}", x.ping_received, x.ping_sent))
                    .unwrap_or_else(|| "–".into()),
                fig.and_then(|x| x.peer_cpu_per_gbit)
                    .map(|v| f(v, 2))
                    .unwrap_or_else(|| "–".into()),
                fig.map(|x| mib_pair(&x.rss_kib))
                    .unwrap_or_else(|| "–".into()),
                fig.map(|x| mib_pair(&x.pss_kib))
                    .unwrap_or_else(|| "–".into()),
                load,
                e.status(),
            ]
        })
        .collect();
    md.push_str(&table(
        &[
            "program",
            "version",
            "TCP 1 stream Gbit/s",
            "TCP 4 streams Gbit/s",
            "1 stream vs boringtun-cli --threads 1",
            "ping p50 ms",
            "ping p99 ms",
            "replies",
            "peer CPU s/s per Gbit/s",
            "RSS MiB a / b",
            "PSS MiB a / b",
            "load (1 min)",
            "status",
        ],
        &rows,
    ));
    md.push_str(&notes(entries));
    md.push('\n');
    md.push_str(&targets(entries, reference));
    md
}

/// The target (switchyard ≥ 2× boringtun-cli --threads 1) and the ratios to the best peer and
/// the ceiling.
fn targets(entries: &[Entry<MeshFigures>], reference: Option<&MeshFigures>) -> String {
    let mut md = String::new();
    let c1 = compare(entries, |x| x.tcp_1_stream_gbit_s);
    let c4 = compare(entries, |x| x.tcp_4_streams_gbit_s);
    let Some(sy) = c1.switchyard else {
        let why = entries
            .iter()
            .find(|e| e.role == Role::Switchyard)
            .map(Entry::status)
            .unwrap_or_else(|| "not run".into());
        let _ = writeln!(
            md,
            "Target switchyard ≥ 2× {REFERENCE} (TCP throughput): not evaluated, switchyard was not measured ({why}).\n"
        );
        return md;
    };
    let lines = [
        (
            "1 stream",
            sy.tcp_1_stream_gbit_s,
            reference.map(|r| r.tcp_1_stream_gbit_s),
            &c1,
        ),
        (
            "4 streams",
            sy.tcp_4_streams_gbit_s,
            reference.map(|r| r.tcp_4_streams_gbit_s),
            &c4,
        ),
    ];
    for (what, mine, reference, c) in lines {
        let target = match reference {
            Some(r) if r > 0.0 => format!("{} ({})", ratio(mine, r), verdict(mine >= 2.0 * r)),
            _ => format!("not evaluated ({REFERENCE} not measured)"),
        };
        let best = c
            .best_peer
            .map(|(name, x)| {
                let v = if what == "1 stream" {
                    x.tcp_1_stream_gbit_s
                } else {
                    x.tcp_4_streams_gbit_s
                };
                format!("{} ({name})", ratio(mine, v))
            })
            .unwrap_or_else(|| "–".into());
        let ceiling = c
            .ceiling
            .map(|(_, x)| {
                let v = if what == "1 stream" {
                    x.tcp_1_stream_gbit_s
                } else {
                    x.tcp_4_streams_gbit_s
                };
                ratio(mine, v)
            })
            .unwrap_or_else(|| "–".into());
        let _ = writeln!(
            md,
            "- TCP {what}: switchyard / {REFERENCE} {target} (target ≥ 2×); / best peer {best}; / raw underlay {ceiling}"
        );
    }
    let best_p99 = entries
        .iter()
        .filter(|e| e.role == Role::Peer)
        .filter_map(|e| e.valid().map(|x| (e.program.as_str(), x.ping_p99_ms)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((name, p99)) = best_p99 {
        let _ = writeln!(
            md,
            "- ping p99: switchyard {} ms, best peer {} ms ({name})",
            f(sy.ping_p99_ms, 3),
            f(p99, 3)
        );
    }
    md.push('\n');
    md
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
    fn leased_ip_finds_a_peer_by_name_or_id() {
        let list = json!({"peers": [
            {"id": "k1", "name": "a", "virtual_ip": "10.219.5.1"},
            {"id": "b", "name": "peer b", "virtual_ip": "10.219.5.2"},
            {"id": "c", "name": "c", "virtual_ip": ""},
        ]});
        assert_eq!(leased_ip(&list, "a").as_deref(), Some("10.219.5.1"));
        assert_eq!(leased_ip(&list, "b").as_deref(), Some("10.219.5.2"));
        assert_eq!(leased_ip(&list, "c"), None);
        assert_eq!(leased_ip(&list, "d"), None);
        assert_eq!(leased_ip(&Value::Null, "a"), None);
    }

    #[test]
    fn mesh_state_names_status_and_enabled() {
        let v = json!({"status": "disabled", "enabled": false, "peer_count": 0});
        assert_eq!(mesh_state(200, &v), "disabled (enabled: false)");
        assert_eq!(mesh_state(404, &Value::Null), "HTTP 404 null");
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

    #[test]
    fn configs_point_each_side_at_the_other() {
        let neb = nebula_config(Path::new("/x"), 1, "symbnb");
        assert!(neb.contains("am_lighthouse: false"));
        assert!(neb.contains("hosts: [\"10.219.3.1\"]"));
        assert!(neb.contains("\"10.219.3.1\": [\"10.219.0.1:4242\"]"));
        assert!(neb.contains("cert: \"/x/b.crt\""));
        assert!(nebula_config(Path::new("/x"), 0, "symbna").contains("am_lighthouse: true"));
        let [conf, host, up] = tinc_files(1, "symbtb");
        assert!(conf.contains("Name = b\n") && conf.contains("ConnectTo = a\n"));
        assert!(host.contains("Address = 10.219.0.2\n") && host.contains("Subnet = 10.219.4.2/32"));
        assert!(up.contains("10.219.4.2/24") && up.contains("mtu 1400"));
        assert!(!tinc_files(0, "symbta")[0].contains("ConnectTo"));
        let client = client_config(1, "symbyb");
        assert!(client.contains("peer_name: b\n"));
        assert!(client.contains("server: \"http://10.219.0.1:17390\""));
        assert!(client.contains("name: symbyb"));
    }

    fn entry(program: &str, role: Role, gbit: Option<f64>) -> Entry<MeshFigures> {
        let mut e = Entry::new(program, role);
        e.figures = gbit.map(|g| MeshFigures {
            tcp_1_stream_gbit_s: g,
            tcp_4_streams_gbit_s: g * 1.5,
            ping_p99_ms: 1.0 / g,
            load_before: "1.00 1.00 1.00".into(),
            load_after: "4.00 1.00 1.00".into(),
            ..MeshFigures::default()
        });
        if gbit.is_none() {
            e.error = Some("did not start".into());
        }
        e
    }

    #[test]
    fn summary_rates_switchyard_against_the_single_thread_reference() {
        let mut es = vec![
            entry("raw underlay (veth)", Role::Ceiling, Some(10.0)),
            entry(REFERENCE, Role::Peer, Some(1.0)),
            entry("nebula", Role::Peer, Some(1.5)),
            entry("switchyard", Role::Switchyard, Some(2.5)),
        ];
        let md = section(5, &es);
        assert!(
            md.contains("switchyard / boringtun-cli --threads 1 2.50× (**met**)"),
            "{md}"
        );
        assert!(md.contains("/ best peer 1.67× (nebula)"), "{md}");
        assert!(md.contains("/ raw underlay 0.25×"), "{md}");
        assert!(md.contains("1.00 → 4.00 ⚠"), "{md}");
        es[3] = entry("switchyard", Role::Switchyard, Some(1.9));
        assert!(section(5, &es).contains("1.90× (**not met**)"));
        es[3] = entry("switchyard", Role::Switchyard, None);
        let md = section(5, &es);
        assert!(md.contains("| FAILED: did not start |"), "{md}");
        assert!(md.contains("not evaluated, switchyard was not measured (FAILED: did not start)"));
    }
}
