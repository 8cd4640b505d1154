//! The new-tunnel load generator on its own, against programs you started yourself (for
//! profiling one path, see bench/README.md):
//! `cargo run --release -p switchyard-bench --example tunnel_rate -- --origin 127.0.0.1:8080 --connect 127.0.0.1:3128`.

use std::net::SocketAddr;

use clap::Parser;
use switchyard_bench::load::Via;

#[derive(Parser)]
struct Cli {
    /// the HTTP origin serving `--path` (nginx)
    #[arg(long)]
    origin: SocketAddr,
    /// through this HTTP proxy (CONNECT)
    #[arg(long, conflicts_with = "socks5")]
    connect: Option<SocketAddr>,
    /// through this SOCKS5 proxy
    #[arg(long)]
    socks5: Option<SocketAddr>,
    #[arg(long, default_value = "/1k.bin")]
    path: String,
    /// expected body length
    #[arg(long, default_value_t = 1024)]
    body: usize,
    #[arg(long, default_value_t = 32)]
    in_flight: u32,
    /// load threads (default: one per CPU)
    #[arg(long)]
    threads: Option<u32>,
    #[arg(long, default_value_t = 5)]
    seconds: u64,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let via = Via::from_flags(cli.connect, cli.socks5);
    let threads = cli.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(1))
    });
    let r = switchyard_bench::tunnel_rate::run(
        via,
        cli.origin,
        &cli.path,
        cli.body,
        cli.in_flight,
        threads,
        cli.seconds,
    )?;
    println!("{}", serde_json::to_string_pretty(&r)?);
    Ok(())
}
