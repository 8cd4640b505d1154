//! Development runner for the benchmark harness:
//! `cargo run --release -p switchyard-bench --example bench -- --switchyard target/release/switchyard`.

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: switchyard_bench::BenchArgs,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    switchyard_bench::run(Cli::parse().args)
}
