//! `switchyard`: one binary for the gateway (`server`), tooling (`config validate`, `bench`) and,
//! as their work lands, the client and the auxiliary services. This crate is the tokio control
//! plane and the command line (`main`, which the binary in control/src/main.rs calls); the glommio
//! data plane lives in `switchyard-dataplane`.
#![forbid(unsafe_code)]

mod api;
mod cache;
mod client;
mod config_checks;
mod config_store;
mod core_watch;
mod health_checks;
mod hub;
mod mesh;
mod metrics;
mod net;
mod openvpn;
mod origin;
mod pac;
mod providers;
mod request_log;
mod server;
mod systemd_notify;
mod tls;
mod web_ui;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "switchyard",
    version,
    about = "Forward proxy gateway for appliances and edge boxes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy gateway (HTTP proxy, CONNECT, SOCKS5) and its management API.
    Server {
        /// YAML configuration; without it the built-in defaults run
        /// (HTTP proxy :7080 and SOCKS5 :7180 for local networks, API
        /// 127.0.0.1:7082, every host direct).
        #[arg(long, short, env = "SWITCHYARD_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Run the user-side client: local HTTP (127.0.0.1:7380) and SOCKS5 (127.0.0.1:7381) proxies
    /// routing each destination direct or through the selected server, and the client API (7383).
    Client(client::ClientArgs),
    /// Configuration tooling.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Run the vcpkg HTTP binary cache server (default 0.0.0.0:15151, ./data/pkgcache).
    Pkgcache(switchyard_pkgcache::PkgcacheArgs),
    /// Run the inventory service (default 0.0.0.0:3000, ./data/inventory, SQLite).
    Inventory(switchyard_inventory::InventoryArgs),
    /// Run the subtitle transcription and translation service (default 0.0.0.0:5001, ./data/subtitles).
    Subtitles(switchyard_subtitles::SubtitlesArgs),
    /// Benchmark switchyard side by side with peer programs (see bench/README).
    Bench(switchyard_bench::BenchArgs),
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Check a server configuration file; prints every problem and exits non-zero if invalid.
    Validate { file: PathBuf },
}

/// The command line: parses the arguments and runs the command.
pub fn main() -> ExitCode {
    // ring is the one crypto library in the binary (issue 14): reqwest, object_store and ldap3
    // take rustls' process default
    switchyard_service::tls::use_ring_provider();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Server { config } => server::run(config),
        Command::Client(args) => client::run(args),
        Command::Config {
            command: ConfigCommand::Validate { file },
        } => return validate(&file),
        Command::Pkgcache(args) => switchyard_pkgcache::run(args),
        Command::Inventory(args) => switchyard_inventory::run(args),
        Command::Subtitles(args) => switchyard_subtitles::run(args),
        Command::Bench(args) => switchyard_bench::run(args).context("benchmark failed"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchyard: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn validate(file: &std::path::Path) -> ExitCode {
    let cfg = match switchyard_config::ServerConfig::load_file(file) {
        Ok(c) => c,
        Err(e) => {
            println!("{}: invalid", file.display());
            println!("  {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut problems = crate::config_checks::validate(&cfg);
    problems.extend(openvpn::config_file_problems(&cfg));
    if problems.is_empty() {
        println!("{}: valid", file.display());
        return ExitCode::SUCCESS;
    }
    println!("{}: invalid ({} problems)", file.display(), problems.len());
    for p in &problems {
        println!("  [{}] {}: {}", p.section, p.field, p.message);
    }
    ExitCode::FAILURE
}
