//! `switchyard client`: the user-side agent. Local HTTP and SOCKS5 proxies run on the same
//! glommio engine as the server (the client role is compiled into the engine's snapshot by
//! [`engine_config`]); the tokio control plane holds the server connection ([`state`]), probes the
//! listed servers ([`servers`]), keeps the debug-entry ring ([`debug_log`]) fed from the engine's
//! bounded request queue, and serves the client API ([`api`]) with the diagnostics endpoints of
//! `switchyard-diagnostics` (captured log, log stream, memory, pprof) mounted behind its token. VPN (TUN)
//! mode is [`vpn`]; the mesh peer is [`mesh`].

pub mod api;
pub mod debug_log;
pub mod engine_config;
pub mod mesh;
pub mod servers;
pub mod state;
pub mod vpn;

use anyhow::Context as _;
use arc_swap::ArcSwap;
use state::{ClientState, Initial};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use switchyard_config::client::{validate_client, ClientConfig};
use switchyard_dataplane::engine::DataplaneOptions;
use switchyard_dataplane::events::Event;
use switchyard_dataplane::{Dataplane, SnapshotHandle};

/// Log records kept for `GET /api/v1/logs`.
const LOG_ENTRIES: usize = 1000;

#[derive(clap::Args, Debug)]
pub struct ClientArgs {
    /// YAML configuration (changes from the API are saved back to it). Without it the client
    /// runs from `<data-dir>/config.yaml` when present, else on built-in defaults.
    #[arg(long, short, env = "SWITCHYARD_CLIENT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Directory of the client's state: quick settings, selected server, saved configuration.
    #[arg(
        long,
        global = true,
        env = "SWITCHYARD_CLIENT_DATA_DIR",
        default_value = "./data/client"
    )]
    pub data_dir: PathBuf,
    #[command(subcommand)]
    pub command: Option<ClientCommand>,
}

#[derive(clap::Subcommand, Debug)]
pub enum ClientCommand {
    /// Remove what the VPN left installed (`vpn.lockdown`: routes, rules, nft table, eBPF
    /// programs, cgroups) for a client that is not running; prints what it removed.
    VpnUnlock,
}

/// `switchyard client vpn-unlock`.
fn vpn_unlock(data_dir: &std::path::Path) -> anyhow::Result<()> {
    let removed = vpn::unlock(data_dir)
        .with_context(|| format!("unlocking the VPN state of {}", data_dir.display()))?;
    if removed.is_empty() {
        println!(
            "nothing to remove: no VPN state is journalled in {}",
            data_dir.display()
        );
    }
    for line in &removed {
        println!("removed {line}");
    }
    Ok(())
}

fn load(path: &std::path::Path) -> anyhow::Result<ClientConfig> {
    let cfg = if path.exists() {
        ClientConfig::load_file(path)?
    } else {
        ClientConfig::default()
    };
    let problems = validate_client(&cfg);
    if !problems.is_empty() {
        let list: Vec<String> = problems
            .iter()
            .map(|p| format!("[{}] {p}", p.section))
            .collect();
        anyhow::bail!(
            "invalid configuration {}:\n  {}",
            path.display(),
            list.join("\n  ")
        );
    }
    Ok(cfg)
}

pub fn run(args: ClientArgs) -> anyhow::Result<()> {
    if let Some(ClientCommand::VpnUnlock) = args.command {
        return vpn_unlock(&args.data_dir);
    }
    // before any thread exists: it changes the environment
    let notifier = Arc::new(crate::systemd_notify::Notifier::from_env());
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating the data directory {}", args.data_dir.display()))?;
    let config_given = args.config.is_some();
    let config_path = args
        .config
        .unwrap_or_else(|| args.data_dir.join("config.yaml"));
    if config_given && !config_path.exists() {
        anyhow::bail!(
            "configuration file {} does not exist",
            config_path.display()
        );
    }
    let cfg = load(&config_path)?;
    // Every log record also goes to the diagnostics store (GET /api/v1/logs, logs/stream).
    let logs = switchyard_diagnostics::LogStore::new(LOG_ENTRIES);
    switchyard_service::logging::init_with_layer(&cfg.logging, "", Some(Box::new(logs.layer())))?;
    if config_path.exists() {
        tracing::info!(config = %config_path.display(), "configuration loaded");
    } else {
        tracing::info!(saves_to = %config_path.display(), "no configuration file: running on built-in defaults");
    }
    if cfg.api.allowed_origins.iter().any(|o| o == "*") {
        tracing::warn!("api.allowed_origins is \"*\": Host and Origin checks of the client API and web UI are disabled; any web page a browser visits can reconfigure the client");
    }
    let settings = state::load_settings(&args.data_dir, &cfg);
    // a crash or kill -9 of the last run may have left VPN routes, rules, nft tables, bpf pins
    vpn::startup_cleanup(&args.data_dir, &cfg);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("control")
        .enable_all()
        .build()
        .context("starting the control-plane runtime")?;

    let listener = |what: &str, l: &switchyard_config::client::ProxyListenerConfig| {
        l.enabled
            .then(|| crate::net::parse(what, &l.listen).map(|a| crate::net::spec(&a)))
            .transpose()
    };
    let http = listener("proxy.http", &cfg.proxy.http)?;
    let socks5 = listener("proxy.socks5", &cfg.proxy.socks5)?;
    let plan = switchyard_dataplane::cores::CorePlan::detect(cfg.proxy.cores);
    tracing::info!(cores = plan.cpus.len(), cpus = %switchyard_dataplane::cores::placement(&plan.cpus), reason = %plan.reason, "data-plane cores decided");
    let probe_cores = plan.cpus.len();
    let connected_at_start = settings.auto_connect && !settings.current_server.is_empty();
    let first_server = cfg
        .servers
        .iter()
        .find(|s| connected_at_start && s.name == settings.current_server);
    let snapshot = engine_config::compile(&cfg, first_server, None, probe_cores)
        .context("compiling the client's routes")?;
    let snapshot: SnapshotHandle = Arc::new(ArcSwap::from_pointee(snapshot));
    let cache = crate::cache::open(&cfg.cache);
    let vpn_path = vpn_path(&cfg);
    let dataplane = Dataplane::start(
        snapshot,
        DataplaneOptions {
            plan,
            http,
            socks5,
            cache: cache.clone(),
            vpn: vpn_path.clone(),
            quic: None,
        },
        runtime.handle().clone(),
    )?;
    if let Some(a) = dataplane.http_addr {
        tracing::info!(listen = %a, "client HTTP proxy listening");
    }
    if let Some(a) = dataplane.socks5_addr {
        tracing::info!(listen = %a, "client SOCKS5 proxy listening");
    }
    match first_server {
        Some(s) => tracing::info!(server = %s.name, address = %s.address, protocol = s.protocol.as_str(), "connected to the server"),
        None if engine_config::blocks(&cfg, None) => tracing::info!(
            "not connected: destinations for the server are blocked (routing.when_disconnected: block) until POST /api/v1/connect"
        ),
        None if cfg.servers.is_empty() => {
            tracing::info!("no server configured: every destination goes direct")
        }
        None => tracing::info!(
            "not connected (auto_connect off): every destination goes direct until POST /api/v1/connect"
        ),
    }
    let state = Arc::new(ClientState::new(
        Initial {
            config: cfg.clone(),
            config_path,
            data_dir: args.data_dir.clone(),
            settings,
            diagnostics: switchyard_diagnostics::DiagnosticsState::new(logs),
            vpn: vpn::VpnManager::new(
                vpn_path,
                dataplane.vpn_addr.map(|a| a.port()),
                dataplane.live.clone(),
                args.data_dir.clone(),
                dataplane.snapshot.clone(),
            ),
        },
        &dataplane,
        cache,
    ));
    let events = dataplane.events.clone();
    let requests = dataplane.requests.clone();

    runtime.block_on(async move {
        tokio::spawn(drain_dataplane(state.clone(), events, requests));
        tokio::spawn(servers::probe_loop(state.clone()));
        tokio::spawn(vpn_apps_loop(state.clone()));
        tokio::spawn(vpn_follow_server(state.clone()));
        tokio::spawn(exit_cleanly_on_signals(state.clone(), notifier.clone()));
        if cfg.vpn.enabled {
            let server = state.server_in_use();
            // a failure is the VPN's `error` state, visible in its status
            let _ = state.vpn.enable(&cfg, server.as_ref()).await;
        }
        if cfg.mesh.enabled {
            if let Err(e) = state.mesh.enable(&cfg.mesh).await {
                tracing::error!(error = %e, "mesh peer not started");
            }
        }
        if let Some(store) = &state.cache {
            let every = cfg.cache.storage.disk.cleanup_interval.as_std();
            tokio::spawn(crate::cache::cleanup(store.clone(), every));
        }
        if cfg.web_ui.enabled {
            serve_web_ui(&cfg, state.clone())?;
        }
        tokio::spawn(crate::server::release_startup_code());
        if cfg.api.enabled {
            let listen = crate::net::parse("api", &cfg.api.listen)?;
            let listener = crate::net::bind_tokio(&listen)?;
            let local = listener.local_addr()?;
            tracing::info!(listen = %local, "client API listening");
            announce_ready(&state, &notifier, &format!("serving: client API {local}"));
            if cfg.api.token.is_none() && !local.ip().is_loopback() {
                tracing::warn!(listen = %local, "api.token is not set and the client API listens beyond loopback: anyone who reaches it controls the client");
            }
            let app = api::router(state.clone());
            axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
                .await
                .context("client API server")?;
        } else {
            tracing::info!("client API disabled (api.enabled: false)");
            announce_ready(&state, &notifier, "serving");
            std::future::pending::<()>().await;
        }
        anyhow::Ok(())
    })?;
    dataplane.join();
    Ok(())
}

/// Binds `web_ui.listen` and serves the web UI there (with the client API beside it, see
/// [`crate::web_ui::client`]) on its own task; a bind failure stops the start.
fn serve_web_ui(cfg: &ClientConfig, state: Arc<ClientState>) -> anyhow::Result<()> {
    let listen = crate::net::parse("web_ui", &cfg.web_ui.listen)?;
    let listener = crate::net::bind_tokio(&listen)?;
    let local = listener.local_addr()?;
    tracing::info!(listen = %local, url = %format!("http://{local}/ui/"), "client web UI listening");
    if cfg.api.token.is_none() && !local.ip().is_loopback() {
        tracing::warn!(listen = %local, "api.token is not set and the web UI listens beyond loopback: anyone who reaches it controls the client");
    }
    let app = crate::web_ui::client::router(state);
    tokio::spawn(async move {
        let served = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the client web UI stopped");
        }
    });
    Ok(())
}

/// The VPN listener's shared state, when `vpn.tun` has IPv4 addresses.
fn vpn_path(cfg: &ClientConfig) -> Option<Arc<switchyard_dataplane::tun::VpnPath>> {
    let tun = vpn::host::tun_address(&cfg.vpn.tun.address).map(|(ip, _)| ip);
    let gateway = cfg.vpn.tun.gateway.parse::<std::net::Ipv4Addr>().ok();
    match (tun, gateway) {
        (Some(tun), Some(gateway)) if tun != gateway => {
            let path = switchyard_dataplane::tun::VpnPath::new(tun, gateway);
            let tun6 = vpn::host::tun_address6(&cfg.vpn.tun.address6).map(|(ip, _)| ip);
            let gateway6 = cfg.vpn.tun.gateway6.parse::<std::net::Ipv6Addr>().ok();
            let path = match (tun6, gateway6) {
                (Some(tun6), Some(gateway6)) if tun6 != gateway6 => path.with_v6(tun6, gateway6),
                _ => {
                    if !cfg.vpn.tun.address6.is_empty() {
                        tracing::warn!(address6 = %cfg.vpn.tun.address6, gateway6 = %cfg.vpn.tun.gateway6,
                            "vpn.tun needs distinct IPv6 address6 and gateway6: tunnelled IPv6 is refused");
                    }
                    path
                }
            };
            Some(Arc::new(path))
        }
        _ => {
            tracing::warn!(address = %cfg.vpn.tun.address, gateway = %cfg.vpn.tun.gateway,
                "vpn.tun needs distinct IPv4 address and gateway: VPN mode unavailable");
            None
        }
    }
}

/// Every listener is bound and every core serves: tells systemd (`READY=1`) and feeds its
/// watchdog while the cores keep beating, as the server does ([`crate::core_watch`]).
fn announce_ready(
    state: &Arc<ClientState>,
    notifier: &Arc<crate::systemd_notify::Notifier>,
    status: &str,
) {
    notifier.ready(status);
    tokio::spawn(crate::core_watch::run(
        state.core_health.clone(),
        notifier.clone(),
        status.to_owned(),
    ));
}

/// On SIGTERM or SIGINT: take the VPN down (TUN, routes, rules, nft table, eBPF links, resolver)
/// before exiting, so a clean stop leaves nothing for the next start to recover — except, with
/// `vpn.lockdown`, the split tunnel, which keeps tunnelled apps off the network.
async fn exit_cleanly_on_signals(
    state: Arc<ClientState>,
    notifier: Arc<crate::systemd_notify::Notifier>,
) {
    switchyard_service::shutdown_signal().await;
    notifier.stopping();
    // leave the mesh first: the other peers see peer.left at once
    state.mesh.disable().await;
    // with vpn.lockdown the split tunnel stays: tunnelled apps stay off the network until the
    // next start takes it over or `switchyard client vpn-unlock` runs
    let lockdown = state.config.load().vpn.lockdown;
    if let Err(e) = state.vpn.shutdown(lockdown).await {
        tracing::warn!(error = %e, "VPN teardown at shutdown was incomplete: the next start removes what is left");
    }
    std::process::exit(0);
}

/// Catches processes of name/path app rules started after the VPN came up.
async fn vpn_apps_loop(state: Arc<ClientState>) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tick.tick().await;
        if state.vpn.phase().enabled() {
            state.vpn.refresh_apps().await;
        }
    }
}

/// A running VPN follows server changes from any source (the API's connection endpoints also
/// await the same step so that they answer after the VPN followed).
async fn vpn_follow_server(state: Arc<ClientState>) {
    let mut changes = state.active_server.subscribe();
    while changes.changed().await.is_ok() {
        changes.mark_unchanged();
        state.vpn_follow_server().await;
    }
}

/// Moves request records (→ debug entries) and events (→ failed-dial state) out of the data
/// plane's bounded queues so they never fill.
async fn drain_dataplane(
    state: Arc<ClientState>,
    events: Arc<switchyard_dataplane::events::EventQueue>,
    requests: Arc<switchyard_dataplane::events::RequestQueue>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(25));
    let mut record_drops = 0;
    loop {
        tick.tick().await;
        while let Some(event) = events.pop() {
            if let Event::BackendHealth { name, healthy } = event {
                if !healthy {
                    tracing::warn!(backend = %name, "dials through the server keep failing");
                }
                state.dial_health(&name, healthy);
            }
        }
        while let Some(record) = requests.pop() {
            let entry = debug_log::entry_from(&record);
            log_request(&record, &entry);
            state.debug.push(entry);
        }
        let dropped = requests.dropped();
        if dropped > record_drops {
            tracing::warn!(
                dropped = dropped - record_drops,
                "debug entries dropped (queue full)"
            );
            record_drops = dropped;
        }
    }
}

/// One log record per proxied request (the spec's log fields), so the log and its live stream
/// show the traffic; a failure is a warning naming the reason.
fn log_request(
    record: &switchyard_dataplane::events::RequestRecord,
    e: &switchyard_api::client::DebugEntry,
) {
    let url = format!("{}{}", e.host, e.path);
    if e.error.is_empty() {
        tracing::info!(method = %e.method, host = %e.host, url = %url, status_code = e.status_code,
            duration_ms = record.duration_ms, action = %e.action, backend = %e.backend, "request");
    } else {
        tracing::warn!(method = %e.method, host = %e.host, url = %url, action = %e.action,
            backend = %e.backend, error = %e.error, "request failed");
    }
}
