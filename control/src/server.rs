//! `switchyard server`: loads and validates the configuration, starts the glommio data plane on
//! its cores and the tokio control plane (management API, PAC) on its own threads, drains
//! data-plane events, and reloads the hot-reloadable sections on SIGHUP.

use anyhow::Context as _;
use arc_swap::ArcSwap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use switchyard_config::{ServerConfig, HOT_RELOADABLE_SECTIONS};
use switchyard_dataplane::counters::Counters;
use switchyard_dataplane::engine::DataplaneOptions;
use switchyard_dataplane::events::{Event, EventQueue};
use switchyard_dataplane::{Dataplane, Snapshot, SnapshotHandle};

/// What the control plane shares with its handlers.
pub struct ServerState {
    /// The configuration the server runs (hot sections as last reloaded).
    pub config: ArcSwap<ServerConfig>,
    pub config_path: Option<PathBuf>,
    pub snapshot: SnapshotHandle,
    pub counters: Arc<Counters>,
    pub events: Arc<EventQueue>,
    pub http_addr: Option<SocketAddr>,
    pub cores: usize,
}

fn load(path: Option<&PathBuf>) -> anyhow::Result<ServerConfig> {
    let cfg = match path {
        Some(p) => ServerConfig::load_file(p)?,
        None => ServerConfig::default(),
    };
    let problems = switchyard_config::validate(&cfg);
    if !problems.is_empty() {
        let list: Vec<String> = problems
            .iter()
            .map(|p| format!("[{}] {}: {}", p.section, p.field, p.message))
            .collect();
        anyhow::bail!("invalid configuration:\n  {}", list.join("\n  "));
    }
    Ok(cfg)
}

pub fn run(config_path: Option<PathBuf>) -> anyhow::Result<()> {
    let cfg = load(config_path.as_ref())?;
    crate::logging::init(&cfg.logging)?;
    match &config_path {
        Some(p) => tracing::info!(config = %p.display(), "configuration loaded"),
        None => tracing::info!("no --config given: running on built-in defaults"),
    }

    // The control plane: a small tokio runtime on its own threads (one worker is plenty for
    // the APIs; blocking work such as bcrypt goes to its blocking pool).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("control")
        .enable_all()
        .build()
        .context("starting the control-plane runtime")?;

    let http = cfg.server.http.listen.as_str();
    let http_listen = crate::net::parse("server.http", http)?;
    let socks_listen = if cfg.server.socks5.enabled {
        Some(crate::net::parse(
            "server.socks5",
            &cfg.server.socks5.listen,
        )?)
    } else {
        None
    };
    let cores_wanted = cfg.server.cores;
    let probe_cores = if cores_wanted == 0 {
        num_cpus()
    } else {
        cores_wanted
    };
    let snapshot =
        Snapshot::compile(&cfg, None, probe_cores).context("compiling the configuration")?;
    let snapshot: SnapshotHandle = Arc::new(ArcSwap::from_pointee(snapshot));
    let dataplane = Dataplane::start(
        snapshot.clone(),
        DataplaneOptions {
            cores: cores_wanted,
            http: Some(crate::net::spec(&http_listen)),
            socks5: socks_listen.as_ref().map(crate::net::spec),
        },
        runtime.handle().clone(),
    )?;
    if let Some(a) = dataplane.http_addr {
        tracing::info!(listen = %a, "HTTP proxy (and CONNECT) listening");
    }
    if let Some(a) = dataplane.socks5_addr {
        tracing::info!(listen = %a, "SOCKS5 proxy listening");
    }
    let state = Arc::new(ServerState {
        config: ArcSwap::from_pointee(cfg.clone()),
        config_path,
        snapshot,
        counters: dataplane.counters.clone(),
        events: dataplane.events.clone(),
        http_addr: dataplane.http_addr,
        cores: dataplane.cores.len(),
    });

    runtime.block_on(async move {
        tokio::spawn(drain_events(state.clone()));
        tokio::spawn(reload_on_hangup(state.clone()));
        if cfg.api.enabled {
            let listen = crate::net::parse("api", &cfg.api.listen)?;
            let listener = crate::net::bind_tokio(&listen)?;
            tracing::info!(listen = %listener.local_addr()?, "management API listening");
            let app = crate::api::router(state.clone(), cfg.api.token.clone());
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .context("management API server")?;
        } else {
            tracing::info!("management API disabled (api.enabled: false)");
            std::future::pending::<()>().await;
        }
        anyhow::Ok(())
    })?;
    dataplane.join();
    Ok(())
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Moves data-plane events out of the bounded queue so it never fills; they are logged here
/// (the WebSocket fan-out will subscribe to the same stream).
async fn drain_events(state: Arc<ServerState>) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut reported_drops = 0;
    loop {
        tick.tick().await;
        while let Some(event) = state.events.pop() {
            match event {
                Event::ConnectionNew {
                    protocol,
                    host,
                    backend,
                    client,
                } => {
                    tracing::debug!(protocol = protocol.as_str(), %host, %backend, %client, "connection.new")
                }
                Event::ConnectionClose {
                    protocol,
                    host,
                    backend,
                    client,
                    bytes_sent,
                    bytes_received,
                } => {
                    tracing::debug!(protocol = protocol.as_str(), %host, %backend, %client, bytes_sent, bytes_received, "connection.close")
                }
            }
        }
        let dropped = state.events.dropped();
        if dropped > reported_drops {
            tracing::warn!(
                dropped = dropped - reported_drops,
                "data-plane events dropped (queue full)"
            );
            reported_drops = dropped;
        }
    }
}

/// Result of re-reading the configuration file.
pub struct ReloadOutcome {
    pub changed_sections: Vec<&'static str>,
    pub restart_required: Vec<&'static str>,
}

/// Re-reads the file and applies the hot-reloadable sections by publishing a new snapshot; live
/// connections keep the snapshot they started with.
pub fn reload(state: &ServerState) -> anyhow::Result<ReloadOutcome> {
    let path = state
        .config_path
        .as_ref()
        .context("the server runs on built-in defaults (no --config file to reload)")?;
    let new = load(Some(path))?;
    let running = state.config.load_full();
    let changed = switchyard_config::changed_sections(&running, &new);
    let mut effective = (*running).clone();
    effective.routes = new.routes.clone();
    effective.rate_limit = new.rate_limit.clone();
    effective.access_control = new.access_control.clone();
    let restart_required: Vec<&'static str> = changed
        .iter()
        .copied()
        .filter(|s| !HOT_RELOADABLE_SECTIONS.contains(s))
        .collect();
    let old_snapshot = state.snapshot.load_full();
    let snapshot = Snapshot::compile(&effective, Some(&old_snapshot), state.cores)?;
    state.snapshot.store(Arc::new(snapshot));
    state.config.store(Arc::new(effective));
    Ok(ReloadOutcome {
        changed_sections: changed,
        restart_required,
    })
}

async fn reload_on_hangup(state: Arc<ServerState>) {
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        tracing::warn!("cannot install the SIGHUP handler; reload through the API only");
        return;
    };
    while hup.recv().await.is_some() {
        match reload(&state) {
            Ok(o) => tracing::info!(
                changed = ?o.changed_sections,
                restart_required = ?o.restart_required,
                "configuration reloaded (SIGHUP)"
            ),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "reload failed; the running configuration stays")
            }
        }
    }
}
