//! `edge`: the appliance's budget on a small box — the stripped binary's size, and for every
//! command its cold start to listening and its idle memory (RSS as `ps` reports it, file-backed
//! pages included, and PSS, which shares those pages among processes).
//!
//! Each command is started three times with a fresh data directory and loopback ports; the start
//! time is from `spawn` until its first listener accepts a TCP connection (median of three), the
//! memory is read from `/proc` after it has been idle for two seconds (the last start). The boot
//! to serving of the appliance image under qemu is measured by `tests/appliance.rs`, which prints
//! it.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;

use crate::procs::{free_port, Procs};
use crate::scenarios::Ctx;

const STARTS: usize = 3;
const IDLE: Duration = Duration::from_secs(2);

/// How to start one command on `port` with its state in `dir`.
fn command(bin: &Path, name: &str, port: u16, dir: &Path) -> Result<Command> {
    let mut cmd = Command::new(bin);
    cmd.current_dir(dir);
    let listen = format!("127.0.0.1:{port}");
    match name {
        "server" => {
            let yaml = format!(
                "server:\n  http: {{listen: \"{listen}\"}}\n  socks5: {{listen: \"127.0.0.1:0\"}}\n  \
                 data_dir: \"{}\"\napi: {{listen: \"127.0.0.1:0\"}}\n",
                dir.join("data").display()
            );
            let config = dir.join("server.yaml");
            std::fs::write(&config, yaml)?;
            cmd.args(["server", "--config"]).arg(config);
        }
        "client" => {
            let yaml = format!(
                "proxy:\n  http: {{listen: \"{listen}\"}}\n  socks5: {{listen: \"127.0.0.1:0\"}}\n\
                 api: {{listen: \"127.0.0.1:0\"}}\n"
            );
            let config = dir.join("client.yaml");
            std::fs::write(&config, yaml)?;
            cmd.args(["client", "--config"])
                .arg(config)
                .arg("--data-dir")
                .arg(dir.join("data"));
        }
        "pkgcache" | "inventory" | "subtitles" => {
            cmd.args([name, "--listen", &listen, "--data-dir"])
                .arg(dir.join("data"));
        }
        other => anyhow::bail!("no edge recipe for {other}"),
    }
    Ok(cmd)
}

/// PSS in KiB from `/proc/PID/smaps_rollup`.
pub(crate) fn pss_kib(pid: u32) -> Result<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no Pss line")
}

/// From `spawned` (just before the spawn) to the first accepted connection, polled every
/// millisecond.
fn start_to_listening(
    procs: &mut Procs,
    pid: u32,
    addr: SocketAddr,
    spawned: Instant,
) -> Result<Duration> {
    while spawned.elapsed() < Duration::from_secs(30) {
        if let Some(reason) = procs.exited(pid) {
            anyhow::bail!(reason);
        }
        if std::net::TcpStream::connect(addr).is_ok() {
            return Ok(spawned.elapsed());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    anyhow::bail!("{addr} not listening after 30 s")
}

struct Measured {
    start_ms: f64,
    rss_kib: u64,
    pss_kib: u64,
}

fn measure(ctx: &Ctx, name: &str) -> Result<Measured> {
    let mut starts = Vec::new();
    let mut memory = (0, 0);
    for run in 0..STARTS {
        let dir = ctx.env.dir.join(format!("edge-{name}-{run}"));
        std::fs::create_dir_all(&dir)?;
        let port = free_port()?;
        let mut procs = Procs::default();
        let cmd = command(&ctx.switchyard, name, port, &dir)?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        // the spawn itself is part of the cold start
        let spawned = Instant::now();
        let pid = procs.spawn_under_test(name, cmd, &dir.join("log.txt"))?;
        let listening = start_to_listening(&mut procs, pid, addr, spawned)
            .with_context(|| crate::procs::tail(&dir.join("log.txt"), 5))?;
        starts.push(listening.as_secs_f64() * 1000.0);
        if run + 1 == STARTS {
            std::thread::sleep(IDLE);
            memory = (crate::procs::rss_kib(pid)?, pss_kib(pid)?);
        }
        // dropping `procs` stops the command (SIGTERM, then SIGKILL)
    }
    starts.sort_by(|a, b| a.total_cmp(b));
    Ok(Measured {
        start_ms: starts[STARTS / 2],
        rss_kib: memory.0,
        pss_kib: memory.1,
    })
}

/// The binary's size as shipped: stripped with objcopy (as the appliance package does).
fn stripped_size(ctx: &Ctx) -> Result<(u64, u64)> {
    let full = std::fs::metadata(&ctx.switchyard)?.len();
    let stripped = ctx.env.dir.join("switchyard.stripped");
    let status = Command::new("objcopy")
        .arg("--strip-all")
        .arg(&ctx.switchyard)
        .arg(&stripped)
        .status()
        .context("objcopy (binutils)")?;
    anyhow::ensure!(status.success(), "objcopy --strip-all failed: {status}");
    Ok((full, std::fs::metadata(&stripped)?.len()))
}

pub fn run(ctx: &Ctx) -> Result<String> {
    let (full, stripped) = stripped_size(ctx)?;
    let mut md = String::from("## edge (appliance budget)\n\n");
    let _ = writeln!(
        md,
        "Binary {}: {:.1} MB as built, **{:.1} MB stripped**.\n",
        ctx.switchyard.display(),
        full as f64 / 1e6,
        stripped as f64 / 1e6
    );
    md.push_str("| command | start to listening (median of 3) | idle RSS | idle PSS |\n|---|---:|---:|---:|\n");
    let mut rows = Vec::new();
    for name in ["server", "client", "pkgcache", "inventory", "subtitles"] {
        match measure(ctx, name) {
            Ok(m) => {
                let _ = writeln!(
                    md,
                    "| {name} | {:.0} ms | {:.1} MiB | {:.1} MiB |",
                    m.start_ms,
                    m.rss_kib as f64 / 1024.0,
                    m.pss_kib as f64 / 1024.0
                );
                rows.push(json!({"command": name, "start_to_listening_ms": m.start_ms,
                                 "idle_rss_kib": m.rss_kib, "idle_pss_kib": m.pss_kib}));
            }
            Err(e) => {
                let _ = writeln!(md, "| {name} | FAILED: {e:#} | | |");
                rows.push(json!({"command": name, "error": format!("{e:#}")}));
            }
        }
    }
    md.push_str("\nBoot to serving of the appliance image under qemu: printed by `cargo nextest run -p switchyard --test appliance`.\n");
    ctx.write_json(
        "edge",
        json!({"binary_bytes": full, "stripped_bytes": stripped, "commands": rows}),
    )?;
    Ok(md)
}
