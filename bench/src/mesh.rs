//! **mesh**: TCP throughput between two `switchyard client` mesh peers (TUN mode, direct path)
//! against two boringtun-cli peers over the same link, in one run (needs root: namespaces).
//!
//! Layout (names prefixed `sympeerb`, removed at the end, also on error): namespaces
//! `sympeerb-a` and `sympeerb-b` joined by a veth pair (10.217.1.1 / 10.217.1.2); the mesh
//! registry (`switchyard server`) runs in `sympeerb-a`; each namespace runs a client peer
//! (device `symesh0`, network 10.218.0.0/24) and a boringtun-cli peer (`sympeerbt0` /
//! `sympeerbt1`, 10.219.0.1 / 10.219.0.2, `--threads 1`). iperf3 measures 1 and 4 TCP streams
//! from a to b through each.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::procs::{which, Procs};
use crate::scenarios::Ctx;
use crate::wireguard::{keypair, run_cmd, start_boringtun};

const NS_A: &str = "sympeerb-a";
const NS_B: &str = "sympeerb-b";
const REGISTRY: &str = "10.217.1.1:7082";

fn teardown() {
    for ns in [NS_A, NS_B] {
        let _ = run_cmd("ip", &["netns", "del", ns]);
    }
    for tun in ["sympeerbt0", "sympeerbt1"] {
        let _ = fs::remove_file(format!("/var/run/wireguard/{tun}.sock"));
    }
}

struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        teardown();
    }
}

fn in_ns(ns: &str, args: &[&str]) -> Result<String> {
    let mut all = vec!["netns", "exec", ns];
    all.extend_from_slice(args);
    run_cmd("ip", &all)
}

/// GET (or POST with `body`) inside `ns`; the body.
fn http(ns: &str, url: &str, body: Option<&str>) -> Result<String> {
    let mut args = vec!["curl", "-sS", "--max-time", "5"];
    if let Some(b) = body {
        args.extend(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    args.push(url);
    in_ns(ns, &args)
}

/// iperf3 from a to `ip` (a server in b): Gbit/s received.
fn iperf(ctx: &Ctx, ip: &str, streams: u32) -> Result<f64> {
    let seconds = ctx.seconds.clamp(3, 10).to_string();
    let out = in_ns(
        NS_A,
        &[
            "iperf3",
            "-c",
            ip,
            "-J",
            "-t",
            &seconds,
            "-P",
            &streams.to_string(),
        ],
    )?;
    let v: serde_json::Value = serde_json::from_str(&out).context("iperf3 JSON")?;
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|b| b / 1e9)
        .context("iperf3 reported no throughput")
}

fn start_peer(ctx: &Ctx, procs: &mut Procs, dir: &Path, ns: &str, name: &str) -> Result<u32> {
    let data = dir.join(name);
    fs::create_dir_all(&data)?;
    let cfg = data.join("client.yaml");
    fs::write(
        &cfg,
        format!(
            "proxy: {{http: {{listen: \"127.0.0.1:0\"}}, socks5: {{listen: \"127.0.0.1:0\"}}, cores: 1}}\n\
             api: {{listen: \"127.0.0.1:7383\"}}\nlogging: {{level: info, format: json}}\n\
             mesh: {{enabled: true, network_id: bench, peer_name: {name},\n  \
             discovery: {{server: \"http://{REGISTRY}\", heartbeat_interval: 5s}}}}\n"
        ),
    )?;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns])
        .arg(&ctx.switchyard)
        .args(["client", "--config"])
        .arg(&cfg)
        .arg("--data-dir")
        .arg(&data);
    procs.spawn(name, cmd, &data.join("log"))
}

/// The peer's virtual IP once it is connected to the other one.
fn wait_connected(procs: &mut Procs, pid: u32, ns: &str) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(reason) = procs.exited(pid) {
            bail!(reason);
        }
        if let Ok(text) = http(ns, "http://127.0.0.1:7383/api/v1/mesh/status", None) {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            if v["connected_peers"] == 1 {
                return Ok(v["virtual_ip"].as_str().unwrap_or_default().to_owned());
            }
        }
        if Instant::now() > deadline {
            bail!("the mesh peer in {ns} did not connect");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn run(ctx: &Ctx) -> Result<String> {
    if run_cmd("id", &["-u"]).map(|u| u != "0").unwrap_or(true) {
        bail!("needs root (network namespaces, TUN devices)");
    }
    which("iperf3").context("iperf3 is not installed")?;
    let boringtun = which("boringtun-cli")
        .or_else(|| {
            let p = Path::new(&std::env::var("HOME").ok()?).join(".cargo/bin/boringtun-cli");
            p.is_file().then_some(p)
        })
        .context("boringtun-cli is not installed (cargo install boringtun-cli --locked)")?;
    which("wg").context("wg (wireguard-tools) is not installed")?;
    teardown();
    let _guard = Guard;
    let dir = ctx.env.dir.join("mesh");
    fs::create_dir_all(&dir)?;
    for args in [
        "netns add sympeerb-a",
        "netns add sympeerb-b",
        "-n sympeerb-a link set lo up",
        "-n sympeerb-b link set lo up",
        "-n sympeerb-a link add eth0 type veth peer name eth0 netns sympeerb-b",
        "-n sympeerb-a addr add 10.217.1.1/24 dev eth0",
        "-n sympeerb-b addr add 10.217.1.2/24 dev eth0",
        "-n sympeerb-a link set eth0 up",
        "-n sympeerb-b link set eth0 up",
    ] {
        run_cmd("ip", &args.split(' ').collect::<Vec<_>>())?;
    }
    let mut procs = Procs::default();

    // the registry and its network
    let server_cfg = dir.join("server.yaml");
    fs::write(
        &server_cfg,
        format!(
            "server: {{http: {{listen: \"127.0.0.1:0\"}}, socks5: {{listen: \"127.0.0.1:0\"}}, cores: 1, data_dir: {:?}}}\n\
             api: {{listen: \"{REGISTRY}\"}}\nlogging: {{level: info, format: json}}\n\
             mesh: {{registry: {{enabled: true}}}}\n",
            dir.join("server-data")
        ),
    )?;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", NS_A])
        .arg(&ctx.switchyard)
        .args(["server", "--config"])
        .arg(&server_cfg);
    let server = procs.spawn("registry", cmd, &dir.join("server.log"))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while http(
        NS_A,
        &format!("http://{REGISTRY}/api/v1/mesh/networks"),
        Some(r#"{"id":"bench","name":"bench","cidr":"10.218.0.0/24"}"#),
    )
    .map(|b| !b.contains("\"bench\""))
    .unwrap_or(true)
    {
        if let Some(reason) = procs.exited(server) {
            bail!(reason);
        }
        if Instant::now() > deadline {
            bail!("the registry did not start");
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    // switchyard mesh peers
    let a = start_peer(ctx, &mut procs, &dir, NS_A, "peer-a")?;
    let b = start_peer(ctx, &mut procs, &dir, NS_B, "peer-b")?;
    wait_connected(&mut procs, a, NS_A)?;
    let vip_b = wait_connected(&mut procs, b, NS_B)?;

    // boringtun-cli peers on the same link
    let (key_a, pub_a) = keypair()?;
    let (key_b, pub_b) = keypair()?;
    for (ns, tun, key, ip, peer_pub, peer_ip, endpoint) in [
        (
            NS_A,
            "sympeerbt0",
            &key_a,
            "10.219.0.1/24",
            &pub_b,
            "10.219.0.2/32",
            "10.217.1.2:51820",
        ),
        (
            NS_B,
            "sympeerbt1",
            &key_b,
            "10.219.0.2/24",
            &pub_a,
            "10.219.0.1/32",
            "10.217.1.1:51820",
        ),
    ] {
        start_boringtun(
            &mut procs,
            &boringtun,
            ns,
            tun,
            &dir.join(format!("{tun}.log")),
        )?;
        let key_file = dir.join(format!("{tun}.key"));
        fs::write(&key_file, key)?;
        in_ns(
            ns,
            &[
                "wg",
                "set",
                tun,
                "private-key",
                &key_file.display().to_string(),
                "listen-port",
                "51820",
                "peer",
                peer_pub,
                "allowed-ips",
                peer_ip,
                "endpoint",
                endpoint,
            ],
        )?;
        in_ns(ns, &["ip", "addr", "add", ip, "dev", tun])?;
        in_ns(ns, &["ip", "link", "set", tun, "mtu", "1400", "up"])?;
    }

    let mut iperf_server = Command::new("ip");
    iperf_server.args(["netns", "exec", NS_B, "iperf3", "-s"]);
    procs.spawn("iperf3 -s", iperf_server, &dir.join("iperf3.log"))?;
    std::thread::sleep(Duration::from_millis(500));

    let mut rows = Vec::new();
    for (label, ip) in [
        ("switchyard mesh", vip_b.as_str()),
        ("boringtun-cli --threads 1", "10.219.0.2"),
    ] {
        let one = iperf(ctx, ip, 1)?;
        let four = iperf(ctx, ip, 4)?;
        rows.push((label, one, four));
    }
    let mut md = String::from(
        "## mesh\n\nTCP a → b through two mesh peers (TUN, direct path, one owner core each) and \
         through two boringtun-cli peers over the same veth, iperf3.\n\n\
         | path | 1 stream Gbit/s | 4 streams Gbit/s |\n|---|---|---|\n",
    );
    for (label, one, four) in &rows {
        md.push_str(&format!("| {label} | {one:.2} | {four:.2} |\n"));
    }
    if let [(_, s1, s4), (_, r1, r4)] = rows[..] {
        md.push_str(&format!(
            "\nRatio switchyard / boringtun-cli: {:.2} (1 stream), {:.2} (4 streams); target ≥ 2.\n",
            s1 / r1.max(1e-9),
            s4 / r4.max(1e-9)
        ));
    }
    Ok(md)
}
