//! The bulk-stream load on its own, against a proxy you started yourself (for profiling the
//! relay, see bench/README.md): one stream of 128 KiB writes into an in-process sink, directly
//! or through CONNECT / SOCKS5. Prints the figures as JSON (read the proxy's CPU from
//! `/proc/PID/stat` or `perf stat -p PID` around it).
//! `cargo run --profile perf -p switchyard-bench --example bulk -- --connect 127.0.0.1:3128`.

use std::net::SocketAddr;

use clap::Parser;
use switchyard_bench::load::{self, Via};

#[derive(Parser)]
struct Cli {
    /// through this HTTP proxy (CONNECT)
    #[arg(long, conflicts_with = "socks5")]
    connect: Option<SocketAddr>,
    /// through this SOCKS5 proxy
    #[arg(long)]
    socks5: Option<SocketAddr>,
    #[arg(long, default_value_t = 1)]
    streams: u32,
    #[arg(long, default_value_t = 5)]
    seconds: u64,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let via = Via::from_flags(cli.connect, cli.socks5);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cpus)
        .enable_all()
        .build()?;
    let (sink, count) = rt.block_on(load::sink_server())?;
    let b = rt.block_on(load::bulk(via, sink, count, cli.streams, cli.seconds))?;
    println!("{}", serde_json::to_string(&b)?);
    Ok(())
}
