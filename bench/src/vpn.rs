//! **vpn**: the client's VPN (TUN) path against the plain link and against redsocks (Debian's
//! transparent proxy, fed by an nftables redirect) in one run (needs root: namespaces, cgroups).
//!
//! Layout (names prefixed `syvpnb` or `$SWITCHYARD_BENCH_PREFIX`, removed at the end, also on error):
//! - namespace `syvpnb-net`: `switchyard server` on 10.210.0.1:18080, iperf3 servers and a
//!   connect-and-close origin on 10.211.9.1 and fd00:211:9::1;
//! - namespace `syvpnb-lan` (veth 10.210.0.2 and fd00:210::2, default routes to the other side):
//!   `switchyard client` with the VPN on (TUN `syvpnbt0`, include mode, the app cgroup
//!   `syvpnb/app` selected), and redsocks relaying to the same server by HTTP CONNECT for the
//!   sockets of uid 65534 (nft `meta skuid` redirect).
//!
//! Three paths to the same iperf3 server: plain (the veth, no proxy), vpn (a process of the app
//! cgroup: TUN → NAT → client → server), redsocks (uid 65534: nft redirect → redsocks → server);
//! plain and vpn also over IPv6, at both TUN MTUs (the server dials the origin's IPv6 address;
//! redsocks relays IPv4 only: its IPv6 row says so).
//! Figures: iperf3 TCP throughput, the relay's CPU per Gbit/s (client process vs redsocks; the
//! server is the same for both and reported too), and new flows/s (connect, read one byte,
//! close; one Python worker, so the figure compares paths rather than measuring a ceiling).

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::procs::{which, Procs};
use crate::scenarios::Ctx;
use crate::wireguard::{cpu_seconds, stat_seconds};

const ORIGIN: &str = "10.211.9.1";
/// The same origin's IPv6 address (the VPN's IPv6 row).
const ORIGIN6: &str = "fd00:211:9::1";
const SERVER: &str = "10.210.0.1:18080";
/// The client's API inside the lan namespace (the bench switches `vpn.tcp_redirect` through it).
const CLIENT_API: &str = "127.0.0.1:17383";

/// Prefix of every name the scenario creates (namespaces, cgroup, interfaces): `syvpnb`, or
/// `SWITCHYARD_BENCH_PREFIX` so runs in several worktrees on one machine do not collide.
fn prefix() -> String {
    prefix_or("syvpnb")
}

/// `SWITCHYARD_BENCH_PREFIX` when set and valid (≤ 10 alphanumerics), else `default`.
pub(crate) fn prefix_or(default: &str) -> String {
    std::env::var("SWITCHYARD_BENCH_PREFIX")
        .ok()
        .filter(|p| !p.is_empty() && p.len() <= 10 && p.bytes().all(|b| b.is_ascii_alphanumeric()))
        .unwrap_or_else(|| default.to_string())
}
const NOBODY: &str = "65534";

fn cgroup_root() -> Result<std::path::PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    info.lines()
        .find(|l| l.contains(" - cgroup2 "))
        .and_then(|l| l.split_whitespace().nth(4))
        .map(|p| Path::new(p).join(prefix()))
        .context("no cgroup2 mount")
}

pub(crate) fn sh(cmd: &str) -> Result<String> {
    let out = Command::new("sh").arg("-c").arg(cmd).output()?;
    if !out.status.success() {
        bail!("`{cmd}`: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Removes what [`run`] creates; safe to call when nothing exists.
fn teardown(data: Option<&Path>) {
    let p = prefix();
    for ns in [format!("{p}-lan"), format!("{p}-net")] {
        let _ = Command::new("ip")
            .args(["netns", "del", ns.as_str()])
            .stderr(Stdio::null())
            .status();
    }
    if let Some(d) = data {
        let _ = Command::new("umount")
            .arg(d.join("bpffs"))
            .stderr(Stdio::null())
            .status();
    }
    if let Ok(root) = cgroup_root() {
        for sub in [
            "app",
            "own",
            "switchyard-split-apps",
            "switchyard-client",
            "",
        ] {
            let dir = root.join(sub);
            let _ = fs::write(dir.join("cgroup.kill"), "1");
            for _ in 0..50 {
                if fs::remove_dir(&dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

struct Guard(std::path::PathBuf);

impl Drop for Guard {
    fn drop(&mut self) {
        teardown(Some(&self.0));
    }
}

/// A command inside `ns`, optionally as a process of `cgroup` or as uid 65534.
pub(crate) fn in_ns(
    ns: &str,
    cgroup: Option<&Path>,
    nobody: bool,
    program: &str,
    args: &[&str],
) -> Command {
    let join = cgroup
        .map(|cg| format!("echo $$ > '{}/cgroup.procs' && ", cg.display()))
        .unwrap_or_default();
    let user = if nobody {
        format!("setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups ")
    } else {
        String::new()
    };
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "{join}exec nsenter --net=/run/netns/{ns} {user}\"$@\""
        ))
        .arg("sh")
        .arg(program)
        .args(args);
    cmd
}

// dual-stack: the same origin answers on its IPv4 and IPv6 addresses
const ORIGIN_PY: &str = "import socket\nl=socket.socket(socket.AF_INET6)\nl.setsockopt(socket.IPPROTO_IPV6,socket.IPV6_V6ONLY,0)\nl.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\nl.bind(('::',8081))\nl.listen(4096)\nwhile True:\n    c,_=l.accept()\n    c.sendall(b'x')\n    c.close()\n";
const FLOWS_PY: &str = "import socket,sys,time\ndst=(sys.argv[1],int(sys.argv[2]))\nend=time.time()+float(sys.argv[3])\nn=0\nerr=0\nwhile time.time()<end:\n    try:\n        s=socket.create_connection(dst,5)\n        s.recv(1)\n        s.close()\n        n+=1\n    except OSError:\n        err+=1\nprint(n,err)\n";

/// utime + stime of the threads of `pid` named `name` (the client's TUN pump is `vpn-tun`).
fn thread_cpu_seconds(pid: u32, name: &str) -> Option<f64> {
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut found = None;
    for task in tasks.flatten() {
        let tid = task.file_name().to_string_lossy().into_owned();
        let comm = fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap_or_default();
        if comm.trim_end() == name {
            *found.get_or_insert(0.0) += stat_seconds(&format!("{pid}/task/{tid}"), 11, 12);
        }
    }
    found
}

/// One path's figures.
#[derive(Default, Debug, Clone)]
struct PathFigures {
    gbps: f64,
    relay_cpu: Option<f64>,
    /// The TUN pump thread's share of `relay_cpu` (VPN rows only).
    pump_cpu: Option<f64>,
    server_cpu: Option<f64>,
    flows_per_s: f64,
    flow_errors: u64,
    /// CPU of the relay process (and of the server) per new flow, in µs.
    relay_us_per_flow: Option<f64>,
    server_us_per_flow: Option<f64>,
    error: Option<String>,
}

/// One call to the client's API inside `lan`; the response body.
fn client_api(lan: &str, method: &str, path: &str, body: &str) -> Result<String> {
    sh(&format!(
        "ip netns exec {lan} curl -sf -X {method} -H 'Content-Type: application/json' \
         --data '{body}' http://{CLIENT_API}{path}"
    ))
}

/// Waits until the client's VPN is `connected` (its API may not be up yet); its status.
fn vpn_connected(lan: &str) -> Result<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = client_api(lan, "GET", "/api/v1/vpn/status", "")
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok());
        match status {
            Some(s) if s["status"] == "connected" => return Ok(s),
            Some(s) if s["status"] == "error" => bail!("the client's VPN failed: {s}"),
            other if Instant::now() > deadline => {
                bail!("the client's VPN did not come up: {other:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Switches the client's `vpn.tcp_redirect` (it applies at the next enable): disable, change,
/// enable, and wait until the VPN is connected again.
fn set_tcp_redirect(lan: &str, on: bool) -> Result<()> {
    client_api(lan, "POST", "/api/v1/vpn/disable", "{}")?;
    let change = format!("{{\"vpn\": {{\"tcp_redirect\": {on}}}}}");
    client_api(lan, "PUT", "/api/v1/config", &change)?;
    client_api(lan, "POST", "/api/v1/vpn/enable", "{}")?;
    vpn_connected(lan).map(drop)
}

/// Runs an `iperf3 -c … -J` command; the received Gbit/s (all streams).
pub(crate) fn iperf(cmd: Command) -> Result<f64> {
    let mut cmd = cmd;
    let out = cmd.output().context("iperf3")?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("iperf3 output: {}", String::from_utf8_lossy(&out.stderr)))?;
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3: {e}");
    }
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|b| b / 1e9)
        .context("iperf3: no sum_received")
}

fn flows(cmd: Command) -> Result<(f64, u64, f64)> {
    let mut cmd = cmd;
    let started = Instant::now();
    let out = cmd.output().context("flow loop")?;
    let took = started.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace();
    let n: f64 = it.next().and_then(|v| v.parse().ok()).with_context(|| {
        format!(
            "flow count: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })?;
    let errors: u64 = it.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok((n, errors, took))
}

pub fn run(ctx: &Ctx) -> Result<String> {
    if sh("id -u")?.trim() != "0" {
        bail!("needs root (network namespaces, cgroups, TUN)");
    }
    for tool in ["iperf3", "redsocks", "nft", "nsenter", "setpriv", "curl"] {
        which(tool).with_context(|| format!("{tool} is not installed"))?;
    }
    // the Debian interpreter: a per-user one (pyenv) is not readable by uid 65534
    if !Path::new("/usr/bin/python3").exists() {
        bail!("/usr/bin/python3 is not installed");
    }
    let dir = ctx.env.dir.join("vpn");
    let data = dir.join("client-data");
    teardown(Some(&data));
    fs::create_dir_all(&data)?;
    let _guard = Guard(data.clone());
    let p = prefix();
    let (lan, net) = (format!("{p}-lan"), format!("{p}-net"));
    let (lan, net) = (lan.as_str(), net.as_str());
    let root = cgroup_root()?;
    let (app, own) = (root.join("app"), root.join("own"));
    for d in [&root, &app, &own] {
        fs::create_dir_all(d)?;
    }
    sh(&format!(
        "set -e; ip netns add {lan}; ip netns add {net}
         ip link add {p}l netns {lan} type veth peer name {p}n netns {net}
         ip -n {lan} link set lo up; ip -n {net} link set lo up
         ip -n {lan} addr add 10.210.0.2/24 dev {p}l; ip -n {lan} link set {p}l up
         ip -n {net} addr add 10.210.0.1/24 dev {p}n; ip -n {net} link set {p}n up
         ip -n {net} addr add {ORIGIN}/32 dev lo
         ip -n {lan} route add default via 10.210.0.1
         ip -n {lan} addr add fd00:210::2/64 dev {p}l nodad
         ip -n {net} addr add fd00:210::1/64 dev {p}n nodad
         ip -n {net} addr add {ORIGIN6}/128 dev lo
         ip -n {lan} -6 route add default via fd00:210::1"
    ))?;
    let mut procs = Procs::default();
    let sy = ctx.switchyard.display().to_string();
    let server_cfg = dir.join("server.yaml");
    fs::write(
        &server_cfg,
        format!("server:\n  http: {{listen: \"{SERVER}\"}}\n  socks5: {{enabled: false}}\n  cores: 1\napi: {{listen: \"127.0.0.1:17082\"}}\nlogging: {{level: warn}}\n"),
    )?;
    let server = procs.spawn_under_test(
        "switchyard server",
        in_ns(
            net,
            None,
            false,
            &sy,
            &["server", "--config", &server_cfg.display().to_string()],
        ),
        &dir.join("server.log"),
    )?;
    procs.spawn(
        "iperf3 -s",
        in_ns(
            net,
            None,
            false,
            "iperf3",
            &["-s", "-B", ORIGIN, "-p", "5201"],
        ),
        &dir.join("iperf3.log"),
    )?;
    procs.spawn(
        "iperf3 -s (IPv6)",
        in_ns(
            net,
            None,
            false,
            "iperf3",
            &["-s", "-B", ORIGIN6, "-p", "5202"],
        ),
        &dir.join("iperf3-v6.log"),
    )?;
    procs.spawn(
        "origin",
        in_ns(net, None, false, "/usr/bin/python3", &["-c", ORIGIN_PY]),
        &dir.join("origin.log"),
    )?;
    let client_cfg = dir.join("client.yaml");
    fs::write(
        &client_cfg,
        format!(
            "proxy:\n  http: {{listen: \"127.0.0.1:0\"}}\n  socks5: {{listen: \"127.0.0.1:0\"}}\n  cores: 1\n\
             api: {{listen: \"{CLIENT_API}\"}}\nlogging: {{level: warn, format: json}}\n\
             servers:\n  - {{name: gw, address: \"{SERVER}\", protocol: HTTP}}\n\
             vpn:\n  enabled: true\n  interface_name: {p}t0\n  scope_cgroup: \"{}\"\n  dns: {{enabled: false}}\n  \
             split: {{mode: include, apps: [{{name: app, cgroup: \"{}\"}}]}}\n",
            root.display(),
            app.display()
        ),
    )?;
    let client_log = dir.join("client.log");
    let client = procs.spawn_under_test(
        "switchyard client",
        in_ns(
            lan,
            Some(&own),
            false,
            &sy,
            &[
                "client",
                "--config",
                &client_cfg.display().to_string(),
                "--data-dir",
                &data.display().to_string(),
            ],
        ),
        &client_log,
    )?;
    let redsocks_cfg = dir.join("redsocks.conf");
    fs::write(
        &redsocks_cfg,
        "base { log_debug = off; log_info = off; daemon = off; redirector = iptables; }\n\
         redsocks { local_ip = 127.0.0.1; local_port = 12345; ip = 10.210.0.1; port = 18080; type = http-connect; }\n",
    )?;
    let redsocks = procs.spawn_under_test(
        "redsocks",
        in_ns(
            lan,
            None,
            false,
            "redsocks",
            &["-c", &redsocks_cfg.display().to_string()],
        ),
        &dir.join("redsocks.log"),
    )?;
    sh(&format!(
        "nsenter --net=/run/netns/{lan} nft -f - <<'EOF'
table ip {p}_redsocks {{
  chain out {{
    type nat hook output priority -100; policy accept;
    meta skuid {NOBODY} ip daddr {ORIGIN} tcp dport {{ 5201, 8081 }} redirect to :12345
  }}
}}
EOF"
    ))?;
    // the client is up when its VPN says so (or failed)
    let vpn_status = match vpn_connected(lan) {
        Ok(status) => status["mechanism"].as_str().unwrap_or_default().to_string(),
        Err(e) => {
            let log = fs::read_to_string(&client_log).unwrap_or_default();
            match procs.exited(client) {
                Some(r) => bail!("{r}: {log}"),
                None => bail!("{e:#}: {log}"),
            }
        }
    };
    if let Some(r) = procs.exited(redsocks) {
        bail!("{r}");
    }
    let secs = ctx.seconds.to_string();
    let mut results: Vec<(&str, PathFigures)> = Vec::new();
    // the VPN rows: TCP redirected past the TUN by the eBPF classifier (the default), then
    // through the TUN (`vpn.tcp_redirect: false`) at two MTUs, in one run
    let vpn = Some(app.as_path());
    let mut tcp_redirect = true;
    for (name, cgroup, nobody, relay, v6, redirect) in [
        ("plain veth", None, false, None, false, None),
        (
            "switchyard VPN (eBPF socket redirect)",
            vpn,
            false,
            Some(client),
            false,
            Some(true),
        ),
        (
            "switchyard VPN IPv6 (eBPF socket redirect)",
            vpn,
            false,
            Some(client),
            true,
            Some(true),
        ),
        (
            "switchyard VPN (TUN, MTU 1420)",
            vpn,
            false,
            Some(client),
            false,
            Some(false),
        ),
        (
            "switchyard VPN IPv6 (TUN, MTU 1420)",
            vpn,
            false,
            Some(client),
            true,
            Some(false),
        ),
        // the TUN never carries packets off the machine: a large MTU is safe and cuts the
        // pump's per-packet work
        (
            "switchyard VPN (TUN, MTU 9000)",
            vpn,
            false,
            Some(client),
            false,
            Some(false),
        ),
        (
            "switchyard VPN IPv6 (TUN, MTU 9000)",
            vpn,
            false,
            Some(client),
            true,
            Some(false),
        ),
        ("plain veth IPv6", None, false, None, true, None),
        (
            "redsocks (nft redirect)",
            None,
            true,
            Some(redsocks),
            false,
            None,
        ),
    ] {
        if let Some(want) = redirect.filter(|w| *w != tcp_redirect) {
            set_tcp_redirect(lan, want)?;
            tcp_redirect = want;
        }
        let (origin, iperf_port) = if v6 {
            (ORIGIN6, "5202")
        } else {
            (ORIGIN, "5201")
        };
        let iperf_args = ["-c", origin, "-p", iperf_port, "-t", secs.as_str(), "-J"];
        let flow_args = ["-c", FLOWS_PY, origin, "8081", secs.as_str()];
        if name == "switchyard VPN (TUN, MTU 9000)" {
            sh(&format!("ip -n {lan} link set dev {p}t0 mtu 9000"))?;
        }
        let mut fig = PathFigures::default();
        let relay_before = relay.map(cpu_seconds);
        let pump = |pid: u32| thread_cpu_seconds(pid, "vpn-tun");
        let pump_before = relay.and_then(pump);
        let server_before = cpu_seconds(server);
        let started = Instant::now();
        match iperf(in_ns(lan, cgroup, nobody, "iperf3", &iperf_args)) {
            Ok(g) => {
                let wall = started.elapsed().as_secs_f64().max(0.001);
                fig.gbps = g;
                fig.relay_cpu = relay
                    .zip(relay_before)
                    .map(|(pid, before)| (cpu_seconds(pid) - before) / wall / g.max(1e-9));
                fig.pump_cpu = relay
                    .and_then(pump)
                    .zip(pump_before)
                    .map(|(after, before)| (after - before) / wall / g.max(1e-9));
                if relay.is_some() {
                    fig.server_cpu =
                        Some((cpu_seconds(server) - server_before) / wall / g.max(1e-9));
                }
            }
            Err(e) => fig.error = Some(format!("{e:#}")),
        }
        let relay_before = relay.map(cpu_seconds);
        let server_before = cpu_seconds(server);
        match flows(in_ns(lan, cgroup, nobody, "/usr/bin/python3", &flow_args)) {
            Ok((n, errors, took)) => {
                fig.flows_per_s = n / took.max(0.001);
                fig.flow_errors = errors;
                let per_flow = |cpu: f64| cpu / n.max(1.0) * 1e6;
                fig.relay_us_per_flow = relay
                    .zip(relay_before)
                    .map(|(pid, before)| per_flow(cpu_seconds(pid) - before));
                if relay.is_some() {
                    fig.server_us_per_flow = Some(per_flow(cpu_seconds(server) - server_before));
                }
            }
            Err(e) => fig.error = Some(format!("{e:#}")),
        }
        tracing::info!("bench vpn: {name}: {fig:?}");
        results.push((name, fig));
    }
    // Debian's redsocks (0.5) relays IPv4 only: its listener and the original-destination
    // lookup are IPv4 (darkk/redsocks issue 13, open); the row says so instead of a figure
    results.push((
        "redsocks IPv6",
        PathFigures {
            error: Some("not measured: redsocks relays IPv4 only".into()),
            ..PathFigures::default()
        },
    ));
    ctx.write_json(
        "vpn",
        json!({
            "seconds": ctx.seconds,
            "classifier": vpn_status,
            "paths": results.iter().map(|(name, f)| json!({
                "path": name,
                "iperf3_gbit_s": f.gbps,
                "relay_cpu_s_per_gbit": f.relay_cpu,
                "tun_pump_cpu_s_per_gbit": f.pump_cpu,
                "server_cpu_s_per_gbit": f.server_cpu,
                "new_flows_per_s": f.flows_per_s,
                "relay_cpu_us_per_flow": f.relay_us_per_flow,
                "server_cpu_us_per_flow": f.server_us_per_flow,
                "flow_errors": f.flow_errors,
                "error": f.error,
            })).collect::<Vec<_>>(),
        }),
    )?;
    let mut md = String::from("## vpn\n\n");
    let _ = writeln!(
        md,
        "iperf3 TCP ({}s) and new flows/s (one Python worker: connect, read 1 byte, close) from the lan namespace to the same origin. The VPN and redsocks both relay through the same `switchyard server` (HTTP CONNECT), with their per-connection logs off (redsocks `log_info = off`, the client at level warn: at info it writes a request line per flow); CPU is CPU-seconds per second of transfer per Gbit/s of the relay process (switchyard client incl. the TUN pump, or redsocks), of the client's TUN pump thread alone (kernel work done in its syscalls included) and of the server. Classifier: {vpn_status}. Load average at the end: {}.\n",
        ctx.seconds,
        crate::scenarios::loadavg()
    );
    md.push_str("| path | Gbit/s | relay CPU per Gbit/s | of which TUN pump | server CPU per Gbit/s | new flows/s | relay / server CPU µs per flow | errors |\n|---|---|---|---|---|---|---|---|\n");
    let opt = |v: Option<f64>| v.map_or("–".to_string(), |x| format!("{x:.3}"));
    for (name, f) in &results {
        let _ = writeln!(
            md,
            "| {name} | {:.2} | {} | {} | {} | {:.0} | {} / {} | {} |",
            f.gbps,
            opt(f.relay_cpu),
            opt(f.pump_cpu),
            opt(f.server_cpu),
            f.flows_per_s,
            f.relay_us_per_flow
                .map_or("–".to_string(), |x| format!("{x:.0}")),
            f.server_us_per_flow
                .map_or("–".to_string(), |x| format!("{x:.0}")),
            f.error.clone().unwrap_or_else(|| f.flow_errors.to_string())
        );
    }
    Ok(md)
}
