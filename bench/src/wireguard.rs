//! **wireguard**: switchyard's user-space WireGuard backend against the same path through
//! boringtun-cli's TUN device and the kernel's TCP stack, in one run (needs root: namespaces).
//!
//! Layout (all names prefixed `sywgb`, removed at the end, also on error):
//! - namespace `sywgb-srv`: boringtun-cli (the WireGuard server peer, TUN `sywgbt0`,
//!   10.216.0.1/24) and nginx on 10.216.0.1:80 serving a 1 GiB file and a 1 KiB file;
//! - the host: switchyard with a `wireguard` backend to 10.215.1.2:51820 over veth `sywgbh0`
//!   (tunnel address 10.216.0.2);
//! - namespace `sywgb-cli`: the reference, boringtun-cli as a client (TUN `sywgbt1`,
//!   10.216.0.3) over veth to the server namespace, with curl and the kernel's TCP.
//!
//! Figures: download of the 1 GiB file (Gbit/s; CPU seconds of the tunnel endpoint process,
//! switchyard vs the client-side boringtun-cli, and of curl, whose context carries part of the
//! kernel TCP work that the reference does instead of smoltcp),
//! new connections/s through the tunnel (CONNECT + GET 1 KiB + close, 16 workers), and RSS
//! growth per idle tunnelled CONNECT connection (200 held open).

use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::procs::{free_port, rss_kib, which, Procs};
use crate::scenarios::Ctx;

const ORIGIN: &str = "10.216.0.1";
const BIG: u64 = 1 << 30;

pub(crate) fn run_cmd(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("run {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A WireGuard key pair (private, public) in base64, made by `wg genkey` / `wg pubkey`.
pub(crate) fn keypair() -> Result<(String, String)> {
    let private = run_cmd("wg", &["genkey"])?;
    let mut child = Command::new("wg")
        .arg("pubkey")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(private.as_bytes())?;
    let out = child.wait_with_output()?;
    Ok((
        private,
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    ))
}

/// Removes what [`setup`] creates; safe to call when nothing exists.
fn teardown() {
    for ns in ["sywgb-srv", "sywgb-cli"] {
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stderr(Stdio::null())
            .status();
    }
    let _ = Command::new("ip")
        .args(["link", "del", "sywgbh0"])
        .stderr(Stdio::null())
        .status();
    for tun in ["sywgbt0", "sywgbt1"] {
        let _ = fs::remove_file(format!("/var/run/wireguard/{tun}.sock"));
    }
}

struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        teardown();
    }
}

/// utime + stime of `pid` in seconds.
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    stat_seconds(&pid.to_string(), 11, 12)
}

/// cutime + cstime of this process: the CPU of the children it waited for (the curl clients).
fn children_cpu_seconds() -> f64 {
    stat_seconds("self", 13, 14)
}

pub(crate) fn stat_seconds(pid: &str, a: usize, b: usize) -> f64 {
    crate::procs::stat_seconds(pid, &[a, b])
}

/// Starts boringtun-cli in namespace `ns` with TUN `tun` and `--threads threads` (its own
/// default, 4, when `None`); returns its PID once its UAPI socket exists.
pub(crate) fn start_boringtun(
    procs: &mut Procs,
    bin: &Path,
    ns: &str,
    tun: &str,
    threads: Option<u32>,
    log: &Path,
) -> Result<u32> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns]).arg(bin).args([
        tun,
        "--foreground",
        "--disable-drop-privileges",
    ]);
    if let Some(n) = threads {
        cmd.arg("--threads").arg(n.to_string());
    }
    let pid = procs.spawn_under_test(tun, cmd, log)?;
    let sock = format!("/var/run/wireguard/{tun}.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !Path::new(&sock).exists() {
        if Instant::now() > deadline {
            bail!("boringtun-cli did not create {sock}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(pid)
}

/// Downloads `url` with curl (optionally run in a namespace, optionally through a proxy);
/// returns (bytes, seconds).
fn download(ns: Option<&str>, proxy: Option<&str>, url: &str) -> Result<(u64, f64)> {
    let mut args: Vec<String> = Vec::new();
    if let Some(ns) = ns {
        args.extend(["netns".into(), "exec".into(), ns.into(), "curl".into()]);
    }
    args.extend(
        [
            "-sS",
            "--max-time",
            "300",
            "-o",
            "/dev/null",
            "-w",
            "%{size_download} %{time_total}",
        ]
        .map(String::from),
    );
    if let Some(p) = proxy {
        args.extend(["-p".into(), "-x".into(), p.into()]);
    }
    args.push(url.into());
    let program = if ns.is_some() { "ip" } else { "curl" };
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_cmd(program, &refs)?;
    let mut it = out.split_whitespace();
    let bytes: u64 = it.next().and_then(|v| v.parse().ok()).context("size")?;
    let secs: f64 = it.next().and_then(|v| v.parse().ok()).context("time")?;
    Ok((bytes, secs))
}

async fn connect_through(proxy: std::net::SocketAddr) -> Result<tokio::net::TcpStream> {
    let mut s = tokio::net::TcpStream::connect(proxy).await?;
    s.write_all(format!("CONNECT {ORIGIN}:80 HTTP/1.1\r\nHost: {ORIGIN}:80\r\n\r\n").as_bytes())
        .await?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await? == 0 || head.len() > 4096 {
            bail!("proxy closed during CONNECT");
        }
        head.push(byte[0]);
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        bail!("CONNECT refused: {}", String::from_utf8_lossy(&head));
    }
    Ok(s)
}

/// Workers loop CONNECT + GET /1k.bin (Connection: close) + read to EOF for `seconds`.
async fn conn_rate(proxy: std::net::SocketAddr, workers: u32, seconds: u64) -> (f64, u64) {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (done, errors) = (done.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                let one = async {
                    let mut s = connect_through(proxy).await?;
                    s.write_all(
                        b"GET /1k.bin HTTP/1.1\r\nHost: origin\r\nConnection: close\r\n\r\n",
                    )
                    .await?;
                    let mut body = Vec::new();
                    s.read_to_end(&mut body).await?;
                    anyhow::ensure!(body.len() > 1024, "short response");
                    Ok::<_, anyhow::Error>(())
                };
                match tokio::time::timeout(Duration::from_secs(10), one).await {
                    Ok(Ok(())) => done.fetch_add(1, Ordering::Relaxed),
                    _ => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    (
        done.load(Ordering::Relaxed) as f64 / seconds as f64,
        errors.load(Ordering::Relaxed),
    )
}

/// boringtun-cli on PATH or in `~/.cargo/bin`.
pub(crate) fn boringtun_cli() -> Result<std::path::PathBuf> {
    which("boringtun-cli")
        .or_else(|| {
            let p = Path::new(&std::env::var("HOME").ok()?).join(".cargo/bin/boringtun-cli");
            p.is_file().then_some(p)
        })
        .context("boringtun-cli is not installed (cargo install boringtun-cli --locked)")
}

pub fn run(ctx: &Ctx) -> Result<String> {
    let is_root = run_cmd("id", &["-u"]).map(|u| u == "0").unwrap_or(false);
    if !is_root {
        bail!("needs root (network namespaces, TUN devices)");
    }
    let boringtun = boringtun_cli()?;
    let nginx = which("nginx").context("nginx is not installed")?;
    which("wg").context("wg (wireguard-tools) is not installed")?;
    teardown();
    let _guard = Guard;
    let dir = ctx.env.dir.join("wireguard");
    fs::create_dir_all(dir.join("www"))?;
    // A sparse 1 GiB file: nginx sends it with sendfile, the tunnels encrypt every byte.
    fs::File::create(dir.join("www/big.bin"))?.set_len(BIG)?;
    fs::write(dir.join("www/1k.bin"), vec![b'x'; 1024])?;

    for args in [
        "netns add sywgb-srv",
        "netns add sywgb-cli",
        "link add sywgbh0 type veth peer name sywgbn0",
        "link set sywgbn0 netns sywgb-srv",
        "addr add 10.215.1.1/30 dev sywgbh0",
        "link set sywgbh0 up",
        "-n sywgb-srv addr add 10.215.1.2/30 dev sywgbn0",
        "-n sywgb-srv link set sywgbn0 up",
        "-n sywgb-srv link set lo up",
        "-n sywgb-cli link set lo up",
        "-n sywgb-srv link add sywgbs1 type veth peer name sywgbc1",
        "-n sywgb-srv link set sywgbc1 netns sywgb-cli",
        "-n sywgb-srv addr add 10.215.2.2/30 dev sywgbs1",
        "-n sywgb-srv link set sywgbs1 up",
        "-n sywgb-cli addr add 10.215.2.1/30 dev sywgbc1",
        "-n sywgb-cli link set sywgbc1 up",
    ] {
        run_cmd("ip", &args.split(' ').collect::<Vec<_>>())?;
    }
    let (srv_private, srv_public) = keypair()?;
    let (sy_private, sy_public) = keypair()?;
    let (ref_private, ref_public) = keypair()?;
    let mut procs = Procs::default();
    let srv_key = dir.join("srv.key");
    fs::write(&srv_key, &srv_private)?;
    let ref_key = dir.join("ref.key");
    fs::write(&ref_key, &ref_private)?;
    start_boringtun(
        &mut procs,
        &boringtun,
        "sywgb-srv",
        "sywgbt0",
        Some(1),
        &dir.join("srv.log"),
    )?;
    run_cmd(
        "ip",
        &[
            "netns",
            "exec",
            "sywgb-srv",
            "wg",
            "set",
            "sywgbt0",
            "private-key",
            &srv_key.display().to_string(),
            "listen-port",
            "51820",
            "peer",
            &sy_public,
            "allowed-ips",
            "10.216.0.2/32",
            "peer",
            &ref_public,
            "allowed-ips",
            "10.216.0.3/32",
        ],
    )?;
    run_cmd(
        "ip",
        &[
            "-n",
            "sywgb-srv",
            "addr",
            "add",
            "10.216.0.1/24",
            "dev",
            "sywgbt0",
        ],
    )?;
    run_cmd("ip", &["-n", "sywgb-srv", "link", "set", "sywgbt0", "up"])?;
    let ref_pid = start_boringtun(
        &mut procs,
        &boringtun,
        "sywgb-cli",
        "sywgbt1",
        Some(1),
        &dir.join("ref.log"),
    )?;
    run_cmd(
        "ip",
        &[
            "netns",
            "exec",
            "sywgb-cli",
            "wg",
            "set",
            "sywgbt1",
            "private-key",
            &ref_key.display().to_string(),
            "peer",
            &srv_public,
            "endpoint",
            "10.215.2.2:51820",
            "allowed-ips",
            "10.216.0.0/24",
        ],
    )?;
    run_cmd(
        "ip",
        &[
            "-n",
            "sywgb-cli",
            "addr",
            "add",
            "10.216.0.3/24",
            "dev",
            "sywgbt1",
        ],
    )?;
    run_cmd("ip", &["-n", "sywgb-cli", "link", "set", "sywgbt1", "up"])?;

    let d = dir.display();
    fs::write(
        dir.join("nginx.conf"),
        format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log warn;\n\
             events {{ worker_connections 4096; }}\nhttp {{ access_log off; sendfile on; keepalive_timeout 300s;\n\
             client_header_timeout 300s; client_body_temp_path {d}/b; proxy_temp_path {d}/p; fastcgi_temp_path {d}/f;\n\
             uwsgi_temp_path {d}/u; scgi_temp_path {d}/s;\n  server {{ listen {ORIGIN}:80 backlog=4096; root {d}/www; }}\n}}\n"
        ),
    )?;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", "sywgb-srv"])
        .arg(&nginx)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .arg("-p")
        .arg(&dir);
    procs.spawn("nginx", cmd, &dir.join("nginx.log"))?;

    let http_port = free_port()?;
    let api_port = free_port()?;
    let conf = format!(
        "server:\n  http: {{ listen: \"127.0.0.1:{http_port}\" }}\n  socks5: {{ listen: \"127.0.0.1:0\" }}\n\
         api: {{ listen: \"127.0.0.1:{api_port}\" }}\nlogging: {{ level: warn }}\n\
         backends:\n  - name: wg\n    type: wireguard\n    wireguard:\n      private_key: \"{sy_private}\"\n\
         \x20     address: [\"10.216.0.2/32\"]\n      public_key: \"{srv_public}\"\n      endpoint: \"10.215.1.2:51820\"\n\
         \x20     allowed_ips: [\"10.216.0.0/24\"]\nroutes:\n  - {{name: all, domains: [\"*\"], backend: wg}}\n"
    );
    fs::write(dir.join("switchyard.yaml"), conf)?;
    let mut cmd = Command::new(&ctx.switchyard);
    cmd.arg("server")
        .arg("--config")
        .arg(dir.join("switchyard.yaml"))
        .current_dir(&dir);
    let sy_pid = procs.spawn_under_test("switchyard", cmd, &dir.join("switchyard.log"))?;
    let proxy_addr = std::net::SocketAddr::from(([127, 0, 0, 1], http_port));
    procs.wait_port(sy_pid, proxy_addr, Duration::from_secs(15))?;
    let proxy = format!("http://{proxy_addr}");
    let small = format!("http://{ORIGIN}/1k.bin");
    // Warm both paths (handshakes) and check they carry the file.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let a = download(Some("sywgb-cli"), None, &small);
        let b = download(None, Some(&proxy), &small);
        match (&a, &b) {
            (Ok((1024, _)), Ok((1024, _))) => break,
            _ if Instant::now() > deadline => {
                let show = |r: &Result<(u64, f64)>| match r {
                    Ok((n, _)) => format!("{n} bytes"),
                    Err(e) => format!("{e:#}"),
                };
                bail!(
                    "tunnels do not carry the test file: reference {}, switchyard {}",
                    show(&a),
                    show(&b)
                );
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(500));
    }

    let big = format!("http://{ORIGIN}/big.bin");
    // CPU of the tunnel endpoint and of the client (curl: its kernel TCP receive work is
    // partly accounted to it; in the reference that is the TCP stack doing smoltcp's job).
    let (cpu, client) = (cpu_seconds(ref_pid), children_cpu_seconds());
    let (ref_bytes, ref_secs) = download(Some("sywgb-cli"), None, &big)?;
    let ref_cpu = cpu_seconds(ref_pid) - cpu;
    let ref_client_cpu = children_cpu_seconds() - client;
    let (cpu, client) = (cpu_seconds(sy_pid), children_cpu_seconds());
    let (sy_bytes, sy_secs) = download(None, Some(&proxy), &big)?;
    let sy_cpu = cpu_seconds(sy_pid) - cpu;
    let sy_client_cpu = children_cpu_seconds() - client;
    let gbit = |bytes: u64, secs: f64| bytes as f64 * 8.0 / secs.max(1e-9) / 1e9;

    let seconds = ctx.seconds.min(10);
    let (rate, rate_errors) = ctx.rt.block_on(conn_rate(proxy_addr, 16, seconds));

    // Memory: RSS growth with idle tunnelled connections held open.
    let held = 200usize;
    let before = rss_kib(sy_pid)?;
    let streams = ctx.rt.block_on(async {
        let mut v = Vec::with_capacity(held);
        for _ in 0..held {
            v.push(connect_through(proxy_addr).await?);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok::<_, anyhow::Error>(v)
    })?;
    let after = rss_kib(sy_pid)?;
    drop(streams);
    let per_conn = after.saturating_sub(before) as f64 / held as f64;

    let mut md = String::from("## wireguard\n\n");
    let _ = writeln!(
        md,
        "1 GiB download over WireGuard (boringtun-cli server peer in a namespace, nginx behind it).\n\n\
         | path | bytes | seconds | Gbit/s | CPU s of the tunnel endpoint process | CPU s of curl |\n|---|---|---|---|---|---|\n\
         | switchyard CONNECT → wireguard backend (boringtun + smoltcp) | {sy_bytes} | {sy_secs:.2} | {:.2} | {sy_cpu:.2} (switchyard) | {sy_client_cpu:.2} |\n\
         | reference: boringtun-cli TUN + kernel TCP, curl direct | {ref_bytes} | {ref_secs:.2} | {:.2} | {ref_cpu:.2} (boringtun-cli; kernel TCP only partly, via curl) | {ref_client_cpu:.2} |\n\n\
         Ratio switchyard / reference: {:.2}×.\n\n\
         New connections through the tunnel (CONNECT + GET 1 KiB + close, 16 workers, {seconds} s): {rate:.0}/s, {rate_errors} errors.\n\n\
         Memory: {held} idle tunnelled CONNECT connections: RSS {before} → {after} KiB, {per_conn:.1} KiB each.\n",
        gbit(sy_bytes, sy_secs),
        gbit(ref_bytes, ref_secs),
        gbit(sy_bytes, sy_secs) / gbit(ref_bytes, ref_secs).max(1e-9),
    );
    let json = serde_json::json!({
        "switchyard": {"bytes": sy_bytes, "seconds": sy_secs, "cpu_seconds": sy_cpu, "client_cpu_seconds": sy_client_cpu},
        "reference": {"bytes": ref_bytes, "seconds": ref_secs, "cpu_seconds": ref_cpu, "client_cpu_seconds": ref_client_cpu},
        "connections_per_second": rate, "connection_errors": rate_errors,
        "memory": {"held": held, "rss_before_kib": before, "rss_after_kib": after},
        "load": crate::scenarios::loadavg(),
    });
    fs::write(
        ctx.out.join("wireguard.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    drop(procs);
    Ok(md)
}
