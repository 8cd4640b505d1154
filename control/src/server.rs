//! `switchyard server`: loads and validates the configuration, starts the glommio data plane on
//! its cores and the tokio control plane (management API, PAC) on its own threads, moves
//! data-plane events and request records into the hub and the request log, and reloads the
//! hot-reloadable sections on SIGHUP. Under systemd it reports `READY=1` once every listener is
//! bound and every core serves, feeds the unit's watchdog while the cores keep beating
//! ([`crate::core_watch`]) and reports `STOPPING=1` on SIGTERM or SIGINT.

use crate::hub::Hub;
use crate::request_log::RequestLog;
use anyhow::Context as _;
use arc_swap::ArcSwap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_config::ServerConfig;
use switchyard_dataplane::commands::CommandSender;
use switchyard_dataplane::counters::Counters;
use switchyard_dataplane::engine::DataplaneOptions;
use switchyard_dataplane::events::{EventQueue, RequestQueue};
use switchyard_dataplane::live::LiveTable;
use switchyard_dataplane::{Dataplane, Snapshot, SnapshotHandle};

/// What the control plane shares with its handlers.
pub struct ServerState {
    /// The configuration the server runs: the file as loaded, plus hot reloads and API changes.
    pub config: ArcSwap<ServerConfig>,
    pub config_path: Option<PathBuf>,
    /// Serialises every change of the configuration (API mutations, saves, reloads).
    pub config_write: tokio::sync::Mutex<()>,
    pub snapshot: SnapshotHandle,
    pub counters: Arc<Counters>,
    pub events: Arc<EventQueue>,
    pub requests: Arc<RequestQueue>,
    pub live: Arc<LiveTable>,
    pub commands: CommandSender,
    pub http_addr: Option<SocketAddr>,
    pub cores: usize,
    /// Up/down state of each data-plane core (health, metrics).
    pub core_health: Arc<switchyard_dataplane::core_health::CoreHealth>,
    pub hub: Hub,
    pub request_log: RequestLog,
    pub started: Instant,
    /// Successful configuration reloads (SIGHUP, API, saves with hot sections).
    pub reloads: AtomicU64,
    /// Host/Origin checks of every API and dashboard request (`api::guard`) and of the
    /// WebSocket upgrades, from `api.allowed_origins` at startup.
    pub origin_policy: crate::origin::OriginPolicy,
    /// API login sessions (`POST /api/v1/login`).
    pub sessions: crate::api::auth::Sessions,
    /// `/api/v1/ws` client slots and read timeout.
    pub ws: crate::api::ws::WsClients,
    /// The API is served over TLS (`api.tls`): session cookies are `Secure`.
    pub api_tls: bool,
    /// The HTTP cache's store (`cache.enabled` at start; storage changes need a restart).
    pub cache: Option<Arc<switchyard_dataplane::cache::CacheStore>>,
    /// Provider backends: server lists, resolutions, keys.
    pub providers: crate::providers::Providers,
    /// Durations of the active health checks (metrics).
    pub health_checks: crate::health_checks::CheckMetrics,
    /// The `openvpn` processes of `openvpn` backends (told about every published configuration).
    pub openvpn: crate::openvpn::Manager,
    /// The mesh registry (`mesh.registry.enabled`; opened at start, changes need a restart).
    pub mesh: Option<Arc<crate::mesh::Registry>>,
    /// The QUIC listener (`server.quic.listen`; changes need a restart).
    pub quic: Option<Arc<switchyard_dataplane::quic::QuicListener>>,
}

pub fn load(path: Option<&PathBuf>) -> anyhow::Result<ServerConfig> {
    let cfg = match path {
        Some(p) => ServerConfig::load_file(p)?,
        None => ServerConfig::default(),
    };
    let problems = crate::config_checks::validate(&cfg);
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
    // before any thread exists (logging, runtime, data plane): they change the environment
    let notifier = Arc::new(crate::systemd_notify::Notifier::from_env());
    switchyard_proxy_auth::set_keytab_environment(&cfg.auth);
    switchyard_service::init_logging(&cfg.logging, "")?;
    match &config_path {
        Some(p) => tracing::info!(config = %p.display(), "configuration loaded"),
        None => tracing::info!("no --config given: running on built-in defaults"),
    }
    // API security settings are checked before anything starts: a bad entry stops the server.
    let origin_policy = crate::origin::OriginPolicy::new(&cfg.api.allowed_origins)?;
    if origin_policy.checks_disabled() {
        tracing::warn!("api.allowed_origins is \"*\": Host and Origin checks of the API are disabled; any web page a browser visits can read and change the server's configuration");
    }
    let api_tls = match (&cfg.api.tls, cfg.api.enabled) {
        (Some(t), true) => Some(
            crate::tls::acceptor(std::path::Path::new(&t.cert), std::path::Path::new(&t.key))
                .context("the management API's TLS settings")?,
        ),
        _ => None,
    };

    // The control plane: a small tokio runtime on its own threads (one worker is plenty for
    // the APIs; blocking work such as bcrypt goes to its blocking pool).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("control")
        .enable_all()
        .build()
        .context("starting the control-plane runtime")?;

    let http_listen = crate::net::parse("server.http", &cfg.server.http.listen)?;
    let socks_listen = if cfg.server.socks5.enabled {
        Some(crate::net::parse(
            "server.socks5",
            &cfg.server.socks5.listen,
        )?)
    } else {
        None
    };
    // Decided once, from the affinity mask, the cgroup CPU quota and server.cores: the same
    // number sizes the executors, the per-core counters and the live tables.
    let plan = switchyard_dataplane::cores::CorePlan::detect(cfg.server.cores);
    tracing::info!(cores = plan.cpus.len(), cpus = %switchyard_dataplane::cores::placement(&plan.cpus), reason = %plan.reason, "data-plane cores decided");
    let mut snapshot =
        Snapshot::compile(&cfg, None, plan.cpus.len()).context("compiling the configuration")?;
    if let Some(verifier) =
        switchyard_proxy_auth::verifier(&cfg.auth).context("setting up proxy authentication")?
    {
        tracing::info!(mode = %cfg.auth.mode, "proxy authentication");
        snapshot = snapshot.with_verifier(verifier);
    }
    if let Some(verifier) =
        switchyard_proxy_auth::negotiate_verifier(&cfg.auth).context("setting up auth.negotiate")?
    {
        tracing::info!("proxy authentication: SPNEGO (Negotiate) in front of the mode");
        snapshot = snapshot.with_negotiate(verifier);
    }
    let snapshot: SnapshotHandle = Arc::new(ArcSwap::from_pointee(snapshot));
    let cache = crate::cache::open(&cfg.cache);
    let quic = quic_listener(&cfg)?;
    let dataplane = Dataplane::start(
        snapshot.clone(),
        DataplaneOptions {
            plan,
            http: Some(crate::net::spec(&http_listen)),
            socks5: socks_listen.as_ref().map(crate::net::spec),
            cache: cache.clone(),
            vpn: None,
            quic,
        },
        runtime.handle().clone(),
    )?;
    if let Some(q) = &dataplane.quic {
        tracing::info!(listen = %q.local_addr, fingerprint = %q.fingerprint, self_signed = q.self_signed,
            "QUIC transport listening (clients pin this fingerprint)");
    }
    let admits = cfg.access_control.describe();
    if let Some(a) = dataplane.http_addr {
        tracing::info!(listen = %a, clients = %admits, "HTTP proxy (and CONNECT) listening");
    }
    if let Some(a) = dataplane.socks5_addr {
        tracing::info!(listen = %a, clients = %admits, "SOCKS5 proxy listening");
    }
    let beyond_loopback = [dataplane.http_addr, dataplane.socks5_addr]
        .iter()
        .flatten()
        .any(|a| !a.ip().is_loopback());
    if cfg.access_control.whitelist.is_empty() && beyond_loopback {
        tracing::warn!(
            auth = ?cfg.auth.mode,
            "access_control.whitelist is empty: the proxy forwards for every address that reaches it"
        );
    }
    let mesh = if cfg.mesh.registry.enabled {
        let registry = runtime.block_on(crate::mesh::Registry::open(
            &cfg.mesh.registry,
            std::path::Path::new(&cfg.server.data_dir),
        ))?;
        Some(Arc::new(registry))
    } else {
        None
    };
    let dataplane_socks5 = dataplane.socks5_addr;
    let openvpn = {
        let _runtime = runtime.enter();
        crate::openvpn::Manager::start(dataplane.events.clone())
    };
    let state = Arc::new(ServerState {
        config: ArcSwap::from_pointee(cfg.clone()),
        config_path,
        config_write: tokio::sync::Mutex::new(()),
        snapshot,
        counters: dataplane.counters.clone(),
        events: dataplane.events.clone(),
        requests: dataplane.requests.clone(),
        live: dataplane.live.clone(),
        commands: dataplane.commands.clone(),
        http_addr: dataplane.http_addr,
        cores: dataplane.cores.len(),
        core_health: dataplane.core_health.clone(),
        hub: Hub::for_dataplane(dataplane.events.clone()),
        request_log: RequestLog::new(cfg.api.request_log_size),
        started: Instant::now(),
        reloads: AtomicU64::new(0),
        origin_policy,
        sessions: crate::api::auth::Sessions::default(),
        ws: crate::api::ws::WsClients::new(cfg.api.ws_read_timeout.as_std()),
        api_tls: api_tls.is_some(),
        cache,
        providers: crate::providers::Providers::new(PathBuf::from(&cfg.server.data_dir)),
        health_checks: crate::health_checks::CheckMetrics::new(),
        openvpn,
        mesh,
        quic: dataplane.quic.clone(),
    });

    runtime.block_on(async move {
        tokio::spawn(stop_on_signals(state.clone(), notifier.clone()));
        state.openvpn.reconcile(&cfg, &state.snapshot.load());
        tokio::spawn(drain_dataplane(state.clone()));
        tokio::spawn(reload_on_hangup(state.clone()));
        tokio::spawn(crate::providers::run(state.clone()));
        tokio::spawn(crate::health_checks::run(state.clone()));
        if let Some(registry) = &state.mesh {
            tokio::spawn(registry.clone().sweep());
        }
        if let Some(store) = &state.cache {
            let every = cfg.cache.storage.disk.cleanup_interval.as_std();
            tokio::spawn(crate::cache::cleanup(store.clone(), every));
        }
        if !cfg.api.stats_interval.is_zero() {
            tokio::spawn(crate::api::ws::publish_stats(state.clone(), cfg.api.stats_interval.as_std()));
        }
        if cfg.metrics.enabled {
            let listen = crate::net::parse("metrics", &cfg.metrics.listen)?;
            let listener = crate::net::bind_tokio(&listen)?;
            tracing::info!(listen = %listener.local_addr()?, path = "/metrics", "metrics listening");
            tokio::spawn(crate::metrics::serve(state.clone(), listener));
        }
        tokio::spawn(release_startup_code());
        let mut serving = Vec::new();
        if let Some(a) = state.http_addr {
            serving.push(format!("HTTP proxy {a}"));
        }
        if let Some(a) = dataplane_socks5 {
            serving.push(format!("SOCKS5 {a}"));
        }
        if cfg.api.enabled {
            let listen = crate::net::parse("api", &cfg.api.listen)?;
            let listener = crate::net::bind_tokio(&listen)?;
            let local = listener.local_addr()?;
            tracing::info!(
                listen = %local,
                tls = api_tls.is_some(),
                token = cfg.api.token.is_some(),
                reachable_from = if local.ip().is_loopback() { "this host only" } else { "the network" },
                "management API listening"
            );
            crate::api::auth::warn_if_unauthenticated(&state, local);
            serving.push(format!("API {local}"));
            announce_ready(&state, &notifier, &serving);
            let app = crate::api::router(state.clone());
            match api_tls {
                Some(acceptor) => crate::tls::serve(listener, acceptor, app).await,
                None => axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
                    .await
                    .context("management API server")?,
            }
        } else {
            tracing::info!("management API disabled (api.enabled: false)");
            announce_ready(&state, &notifier, &serving);
            std::future::pending::<()>().await;
        }
        anyhow::Ok(())
    })?;
    dataplane.join();
    Ok(())
}

/// Every listener is bound and every core reported ready: tells systemd (`READY=1`, with what
/// serves where as `STATUS=`) and starts watching the cores for it.
fn announce_ready(
    state: &Arc<ServerState>,
    notifier: &Arc<crate::systemd_notify::Notifier>,
    serving: &[String],
) {
    let status = format!(
        "serving: {} on {} data-plane cores",
        serving.join(", "),
        state.cores
    );
    notifier.ready(&status);
    tracing::debug!(status = %status, watchdog = ?notifier.watchdog_timeout(), "ready");
    tokio::spawn(crate::core_watch::run(
        state.core_health.clone(),
        notifier.clone(),
        status,
    ));
}

/// On SIGTERM or SIGINT: tells systemd the service stops, stops the OpenVPN backends' processes
/// (their devices and rules go with them), then exits.
async fn stop_on_signals(state: Arc<ServerState>, notifier: Arc<crate::systemd_notify::Notifier>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot install the SIGTERM handler: OpenVPN processes are cleaned up at the next start");
        return;
    };
    let code = tokio::select! {
        _ = term.recv() => 0,
        _ = int.recv() => 130,
    };
    tracing::info!("shutting down");
    notifier.stopping();
    state.openvpn.shutdown().await;
    std::process::exit(code);
}

/// Moves events and request records out of the data plane's bounded queues (so they never
/// fill) into the hub and the request log.
async fn drain_dataplane(state: Arc<ServerState>) {
    // 25 ms keeps up with ~160k records/s in the 4096-slot queues.
    let mut tick = tokio::time::interval(Duration::from_millis(25));
    let (mut event_drops, mut record_drops) = (0, 0);
    loop {
        tick.tick().await;
        state.hub.release_idle_events();
        while let Some(event) = state.events.pop() {
            state.hub.publish_dataplane(&event);
        }
        while let Some(record) = state.requests.pop() {
            state.request_log.push(record);
        }
        let dropped = state.events.dropped();
        if dropped > event_drops {
            tracing::warn!(
                dropped = dropped - event_drops,
                "data-plane events dropped (queue full)"
            );
            event_drops = dropped;
        }
        let dropped = state.requests.dropped();
        if dropped > record_drops {
            tracing::warn!(
                dropped = dropped - record_drops,
                "request-log records dropped (queue full)"
            );
            record_drops = dropped;
        }
    }
}

/// Gives back the code pages start-up mapped (switchyard_dataplane::text_pages) once the
/// listeners are up and the first rounds of the periodic tasks have run: an idle `server` or
/// `client` keeps only the code it runs.
pub(crate) async fn release_startup_code() {
    tokio::time::sleep(Duration::from_secs(1)).await;
    use switchyard_dataplane::text_pages;
    // the binary's resident code right before and right after the release, read by the process
    // itself: their ratio shows the release worked whatever else the machine runs meanwhile
    let before = text_pages::own_code_residency();
    match text_pages::release_code_pages() {
        Ok(bytes) => {
            let after = text_pages::own_code_residency();
            tracing::info!(
                bytes,
                code_resident_before_kib = before.map(|c| c.resident_kib),
                code_resident_after_kib = after.map(|c| c.resident_kib),
                "start-up code pages released"
            );
        }
        Err(e) => tracing::debug!(error = %e, "cannot release start-up code pages"),
    }
    // the heap start-up freed (parsed eBPF objects among it) goes back as well
    let trimmed = switchyard_dataplane::text_pages::release_freed_heap();
    tracing::debug!(trimmed, "start-up heap trimmed");
}

async fn reload_on_hangup(state: Arc<ServerState>) {
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        tracing::warn!("cannot install the SIGHUP handler; reload through the API only");
        return;
    };
    while hup.recv().await.is_some() {
        match crate::config_store::reload(&state).await {
            Ok(o) => tracing::info!(
                changed = ?o.changed_sections,
                restart_required = ?o.restart_required,
                "configuration reloaded (SIGHUP)"
            ),
            Err(e) => tracing::error!(error = %e, "reload failed; the running configuration stays"),
        }
    }
}

/// The QUIC listener of `server.quic` (bound here so its errors stop the start): the
/// configured certificate, or the one generated in the data directory on first start.
fn quic_listener(
    cfg: &ServerConfig,
) -> anyhow::Result<Option<Arc<switchyard_dataplane::quic::QuicListener>>> {
    use switchyard_dataplane::quic::{tls, QuicListener, QuicServerOptions};
    let q = &cfg.server.quic;
    if q.listen.is_empty() {
        return Ok(None);
    }
    let listen = crate::net::parse("server.quic", &q.listen)?;
    let configured = q
        .tls
        .as_ref()
        .map(|t| (std::path::Path::new(&t.cert), std::path::Path::new(&t.key)));
    let identity = tls::server_identity(configured, std::path::Path::new(&cfg.server.data_dir))
        .context("the QUIC listener's certificate")?;
    let listener = QuicListener::bind(QuicServerOptions {
        listen: crate::net::spec(&listen),
        identity,
        token: q.token.clone(),
        limits: switchyard_dataplane::quic::admission::AdmissionLimits {
            max_connections: q.max_connections,
            max_per_client: q.max_connections_per_client,
            unvalidated_handshakes: switchyard_dataplane::quic::admission::UNVALIDATED_HANDSHAKES,
        },
    })?;
    Ok(Some(listener))
}

impl ServerState {
    pub fn count_reload(&self) {
        self.reloads.fetch_add(1, Ordering::Relaxed);
    }
}
