//! Side-by-side benchmark harness: switchyard against peer programs on loopback.
//!
//! `switchyard bench` calls [`run`]. One run starts, each with its own config file in a temp dir
//! on free loopback ports, an nginx origin and the peers that are installed (tinyproxy, squid,
//! microsocks, danted), plus switchyard itself, and measures:
//!
//! - **http**: `wrk` through each HTTP proxy (and direct to nginx as the ceiling) for a 1 KiB and a
//!   1 MiB file; requests/s, transfer/s, p50/p99 latency, errors. A Lua script puts the
//!   absolute-form URL on the request line; every proxy is first checked to return the exact file.
//!   The programs are measured in turns, `--rounds` times (3), and each one's median round is
//!   reported, with the target checked in every round beside it.
//! - **connect**: bulk upload through a `CONNECT` tunnel to an in-process sink, against the same
//!   client straight to the sink (raw loopback TCP).
//! - **socks5**: connection rate (handshake + CONNECT + one echo round trip + close, many workers)
//!   and bulk throughput, switchyard against microsocks and danted.
//! - **tunnels**: the new-tunnel rate: one tunnel (CONNECT or SOCKS5) + a 1 KiB GET + close, 32
//!   in flight, against squid, tinyproxy, microsocks and danted, with the client's own ceiling
//!   straight to nginx (see [`tunnels`](mod@tunnels)).
//! - **memory**: switchyard's RSS idle and with thousands of idle CONNECT tunnels held open.
//! - **pkgcache**: `switchyard pkgcache` GET/PUT of 10 KiB, 10 MiB and 1 GiB packages against
//!   nginx serving the same files from disk (see [`pkgcache`](mod@pkgcache)).
//! - **cache**: HTTP cache hits (1 KiB, 1 MiB, 100 MiB) against nginx `proxy_cache` and varnish
//!   (see [`cache`](mod@cache)).
//!
//! - **wireguard**: the user-space WireGuard backend against boringtun-cli's TUN + kernel TCP
//!   (1 GiB download, new connections/s, memory per tunnelled connection; needs root; see
//!   [`wireguard`](mod@wireguard)).
//! - **inventory**: `switchyard inventory` list latency (page 1, search, category filter,
//!   low stock, deep page) for one user with 100,000 items on SQLite and PostgreSQL (see
//!   [`inventory`](mod@inventory)).
//!
//! - **client**: `switchyard client` → `switchyard server` → nginx against nginx direct and a
//!   two-squid chain (requests/s and transfer, 1 KiB and 1 MiB), and the client's idle RSS (see
//!   [`client`](mod@client)).
//!
//! - **quic**: the client → server leg over QUIC against CONNECT over TCP: new-flow p50/p99 and
//!   a 32 MiB download at 0 and 50 ms RTT and (QUIC) 1 % loss, through user-space relays (see
//!   [`quic`](mod@quic)).
//!
//! - **mesh**: two mesh peers in network namespaces, switchyard's mesh peer against nebula,
//!   tinc and boringtun-cli (`--threads 1` and default): TCP throughput (1 and 4 streams), ping
//!   latency p50/p99, CPU and memory per peer, the bare veth as the ceiling (needs root; see
//!   [`mesh`](mod@mesh)).
//!
//! Results go to `<out>/<scenario>.json` and `<out>/summary.md` (tables, ratios, targets). A peer
//! that is missing or fails to start is reported as such; every started process is stopped by PID
//! when its scenario ends, also on error.

mod cache;
mod client;
mod cpusplit;
mod edge;
mod inventory;
mod iperf;
pub mod load;
mod mesh;
mod peers;
mod pkgcache;
mod procs;
mod quic;
mod report;
mod scenarios;
pub mod tunnel_rate;
mod tunnels;
mod vpn;
mod wireguard;
mod wrk;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

pub use cpusplit::CpuList;

/// Arguments of `switchyard bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// path of the switchyard binary (default: the current executable)
    #[arg(long)]
    pub switchyard: Option<PathBuf>,
    /// directory for the JSON results and summary.md
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
    /// seconds per measurement
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// subset: http, connect, socks5, tunnels, memory, pkgcache, cache, inventory, wireguard, client, quic, vpn, mesh, edge
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// concurrent connections (wrk) and workers (SOCKS5 connection rate)
    #[arg(long, default_value_t = 64)]
    pub connections: u32,
    /// data-plane cores of the measured `switchyard server` (`server.cores`; 0 = every CPU), for
    /// the per-core scaling figures
    #[arg(long, default_value_t = 0)]
    pub switchyard_cores: usize,
    /// rounds of the http scenario: every program is measured once per round, in turn, and the
    /// tables give each program's median round
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// give the programs under test CPUs of their own: the CPUs this process may use are split
    /// into a LOAD set (this bench, wrk/h2load/iperf3, the nginx origin, the in-process clients
    /// and echo servers) and a TEST set (switchyard and every peer compared in a table); default
    /// first half LOAD, second half TEST. Needs at least 2 CPUs
    #[arg(long)]
    pub split_cpus: bool,
    /// with --split-cpus: the TEST set as a CPU list ("1", "4-15", "2,3"); the other allowed
    /// CPUs are LOAD
    #[arg(long, requires = "split_cpus")]
    pub test_cpus: Option<CpuList>,
}

/// All scenarios, in run order.
pub const SCENARIOS: [&str; 14] = [
    "http",
    "connect",
    "socks5",
    "tunnels",
    "memory",
    "pkgcache",
    "cache",
    "inventory",
    "wireguard",
    "client",
    "quic",
    "vpn",
    "mesh",
    "edge",
];

/// Runs the selected scenarios and writes the results. Synchronous; builds its own tokio runtime.
pub fn run(args: BenchArgs) -> Result<()> {
    let selected: Vec<&str> = if args.only.is_empty() {
        SCENARIOS.to_vec()
    } else {
        let mut v = Vec::new();
        for s in &args.only {
            let s = s.trim().to_ascii_lowercase();
            match SCENARIOS.iter().find(|k| **k == s) {
                Some(k) if !v.contains(k) => v.push(*k),
                Some(_) => {}
                None => bail!(
                    "unknown scenario {s:?} (choose from {})",
                    SCENARIOS.join(", ")
                ),
            }
        }
        v
    };
    if args.seconds == 0 || args.seconds > 600 {
        bail!("--seconds must be 1..=600");
    }
    if args.connections == 0 || args.connections > 10_000 {
        bail!("--connections must be 1..=10000");
    }
    if args.rounds == 0 || args.rounds > 20 {
        bail!("--rounds must be 1..=20");
    }
    if args.switchyard_cores > 1024 {
        bail!("--switchyard-cores must be 0 (every CPU) or a core count");
    }
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    // Before the runtime and any load-generator thread exist, so they inherit the LOAD set.
    let split = if args.split_cpus {
        let allowed = cpusplit::allowed_cpus()?;
        let split =
            cpusplit::CpuSplit::new(&allowed, args.test_cpus.as_ref().map(|l| l.0.as_slice()))?;
        if args.switchyard_cores > split.test.len() {
            bail!(
                "--switchyard-cores {} is more than the {} under-test CPUs ({})",
                args.switchyard_cores,
                split.test.len(),
                split.describe()
            );
        }
        let split = cpusplit::install(split)?;
        tracing::info!("bench: {}", split.describe());
        Some(split)
    } else {
        None
    };
    let switchyard = match &args.switchyard {
        Some(p) => p.clone(),
        None => std::env::current_exe().context("locate the current executable")?,
    };
    let switchyard = std::fs::canonicalize(&switchyard).unwrap_or(switchyard);
    std::fs::create_dir_all(&args.out).with_context(|| format!("create {}", args.out.display()))?;
    let out = std::fs::canonicalize(&args.out)?;
    let nofile = procs::raise_nofile();
    let mut tmp = tempfile::Builder::new()
        .prefix("switchyard-bench-")
        .tempdir()?;
    // The programs' logs and configurations, kept for a look after the run when asked.
    if std::env::var_os("SWITCHYARD_BENCH_KEEP").is_some() {
        tmp.disable_cleanup(true);
        eprintln!(
            "SWITCHYARD_BENCH_KEEP: logs stay in {}",
            tmp.path().display()
        );
    }
    let env = peers::Env {
        dir: tmp.path().to_path_buf(),
        cpus,
        load_cpus: split.map_or(cpus, |s| s.load.len()),
        test_cpus: split.map_or(cpus, |s| s.test.len()),
        split,
        nofile,
        switchyard_cores: args.switchyard_cores,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(env.load_cpus)
        .enable_all()
        .build()?;
    let ctx = scenarios::Ctx {
        env,
        rt,
        switchyard,
        out,
        seconds: args.seconds,
        connections: args.connections,
        rounds: args.rounds,
    };
    tracing::info!(
        "bench: scenarios {selected:?}, {}s each, {} connections, switchyard {}, RLIMIT_NOFILE {nofile}",
        args.seconds,
        args.connections,
        ctx.switchyard.display()
    );
    let load_at_start = scenarios::loadavg();
    let mut sections = Vec::new();
    for s in selected {
        tracing::info!("bench: scenario {s}");
        let load_before = scenarios::loadavg();
        let result = match s {
            "pkgcache" => pkgcache::run(&ctx),
            "inventory" => inventory::run(&ctx),
            "cache" => cache::run(&ctx),
            "wireguard" => wireguard::run(&ctx),
            "client" => client::run(&ctx),
            "quic" => quic::run(&ctx),
            "vpn" => vpn::run(&ctx),
            "mesh" => mesh::run(&ctx),
            "tunnels" => tunnels::run(&ctx),
            "edge" => edge::run(&ctx),
            _ => scenarios::run_one(&ctx, s),
        };
        let section = match result {
            Ok(md) => md,
            Err(e) => format!("## {s}\n\nScenario failed: {e:#}\n"),
        };
        let load_after = scenarios::loadavg();
        let busy = [&load_before, &load_after]
            .iter()
            .any(|l| tunnels::one_minute(l) > tunnels::BUSY_LOAD);
        let section = format!(
            "{section}\n{}Load average before / after this section: {load_before} / {load_after}{}\n",
            ctx.env
                .split_note()
                .map(|n| format!("CPUs: {n} (load generators, origin and helpers on load).\n"))
                .unwrap_or_default(),
            if busy {
                " — **figures taken under a load average above 3: other work shared the cores**"
            } else {
                ""
            }
        );
        tracing::info!("bench: {s} done; load average {load_before} → {load_after}");
        sections.push(section);
    }
    let summary = ctx.summary(&sections, &load_at_start);
    let path = ctx.out.join("summary.md");
    std::fs::write(&path, summary).with_context(|| format!("write {}", path.display()))?;
    tracing::info!("bench: wrote {}", path.display());
    Ok(())
}
