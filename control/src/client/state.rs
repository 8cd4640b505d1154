//! What the client's control plane holds: the running configuration and where it is saved, the
//! connection to the selected server (connected or not, which server, failed dials), the quick
//! settings, and the data plane's shared parts. Every change that affects routing re-publishes
//! the engine snapshot; a core picks it up on its next connection or request.

use super::debug_log::DebugLog;
use super::engine_config;
use super::servers::{server_status, Probes};
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use switchyard_api::client::QuickSettings;
use switchyard_config::client::{validate_client, ClientConfig, ClientServerConfig};
use switchyard_config::Problem;
use switchyard_dataplane::counters::Counters;
use switchyard_dataplane::SnapshotHandle;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no server named or with id `{0}`")]
    UnknownServer(String),
    #[error("no server is configured: add one under `servers`")]
    NoServer,
    #[error("invalid configuration")]
    Invalid(Vec<Problem>),
    #[error("the data plane refused the configuration: {0}")]
    Engine(String),
    #[error("cannot save {path}: {message}")]
    Save { path: String, message: String },
}

/// The connection to the selected server.
#[derive(Debug, Default)]
struct Connection {
    connected: bool,
    /// Name of the selected server.
    selected: Option<String>,
    /// The engine reported repeated failed dials to the selected server since its last
    /// successful probe.
    dial_failed: bool,
}

pub struct ClientState {
    pub config: ArcSwap<ClientConfig>,
    /// Where configuration changes are saved (`--config`, else `<data-dir>/config.yaml`).
    pub config_path: PathBuf,
    pub data_dir: PathBuf,
    /// Serialises configuration changes (PUT, import, reload, routes).
    pub config_write: tokio::sync::Mutex<()>,
    connection: Mutex<Connection>,
    settings: Mutex<QuickSettings>,
    pub snapshot: SnapshotHandle,
    pub counters: Arc<Counters>,
    pub cores: usize,
    /// Up/down state of each data-plane core.
    pub core_health: Arc<switchyard_dataplane::core_health::CoreHealth>,
    pub debug: DebugLog,
    pub probes: Probes,
    pub http_addr: Option<SocketAddr>,
    pub socks5_addr: Option<SocketAddr>,
    pub started: Instant,
    pub sessions: crate::api::auth::Sessions,
    /// Host/Origin checks of the API and web UI (`api::guard`), from `api.allowed_origins`;
    /// replaced when a new configuration is applied.
    pub origin_policy: ArcSwap<crate::origin::OriginPolicy>,
    pub cache: Option<Arc<switchyard_dataplane::cache::CacheStore>>,
    /// The captured log and the profiler slot of the diagnostics endpoints.
    pub diagnostics: switchyard_diagnostics::DiagnosticsState,
    /// VPN (TUN) mode.
    pub vpn: super::vpn::VpnManager,
    /// The mesh peer.
    pub mesh: super::mesh::MeshManager,
    /// The server traffic goes to (the selected one while connected), as last published; the
    /// VPN follows its changes.
    pub active_server: tokio::sync::watch::Sender<Option<ClientServerConfig>>,
}

/// Parts of the state that exist before the data plane starts.
pub struct Initial {
    pub config: ClientConfig,
    pub config_path: PathBuf,
    pub data_dir: PathBuf,
    pub settings: QuickSettings,
    pub diagnostics: switchyard_diagnostics::DiagnosticsState,
    pub vpn: super::vpn::VpnManager,
}

fn settings_path(data_dir: &Path) -> PathBuf {
    data_dir.join("settings.json")
}

/// The stored quick settings, or the configuration's defaults (auto_connect, the default
/// server) when none are stored or the stored server no longer exists.
pub fn load_settings(data_dir: &Path, cfg: &ClientConfig) -> QuickSettings {
    let stored: Option<QuickSettings> = std::fs::read(settings_path(data_dir)).ok().and_then(|b| {
        match serde_json::from_slice(&b) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "stored settings unreadable; using the configuration's");
                None
            }
        }
    });
    let mut s = stored.unwrap_or_else(|| QuickSettings {
        auto_connect: cfg.server.auto_connect,
        ..QuickSettings::default()
    });
    if !cfg.servers.iter().any(|srv| srv.name == s.current_server) {
        s.current_server = default_server(cfg)
            .map(|d| d.name.clone())
            .unwrap_or_default();
    }
    s
}

/// The server marked `is_default`, else the first listed.
pub fn default_server(cfg: &ClientConfig) -> Option<&ClientServerConfig> {
    cfg.servers
        .iter()
        .find(|s| s.is_default)
        .or_else(|| cfg.servers.first())
}

/// Writes `bytes` to `path` through a temporary file and a rename (never a half file).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = dir.unwrap_or_else(|| Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut tmp, bytes)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// The policy of `api.allowed_origins` (validated before: a list that does not parse falls
/// back to no entries, the strictest).
fn origin_policy(cfg: &ClientConfig) -> crate::origin::OriginPolicy {
    crate::origin::OriginPolicy::new(&cfg.api.allowed_origins).unwrap_or_else(|e| {
        tracing::error!(error = %e, "api.allowed_origins ignored");
        crate::origin::OriginPolicy::strict()
    })
}

impl ClientState {
    pub fn new(
        initial: Initial,
        dataplane: &switchyard_dataplane::Dataplane,
        cache: Option<Arc<switchyard_dataplane::cache::CacheStore>>,
    ) -> Self {
        let connected =
            initial.settings.auto_connect && !initial.settings.current_server.is_empty();
        let selected = (!initial.settings.current_server.is_empty())
            .then(|| initial.settings.current_server.clone());
        let active = selected
            .as_ref()
            .filter(|_| connected)
            .and_then(|name| initial.config.servers.iter().find(|s| &s.name == name))
            .cloned();
        let origin_policy = ArcSwap::from_pointee(origin_policy(&initial.config));
        Self {
            origin_policy,
            config: ArcSwap::from_pointee(initial.config),
            config_path: initial.config_path,
            data_dir: initial.data_dir.clone(),
            config_write: tokio::sync::Mutex::new(()),
            connection: Mutex::new(Connection {
                connected,
                selected,
                dial_failed: false,
            }),
            settings: Mutex::new(initial.settings),
            snapshot: dataplane.snapshot.clone(),
            counters: dataplane.counters.clone(),
            cores: dataplane.cores.len(),
            core_health: dataplane.core_health.clone(),
            debug: DebugLog::new(super::debug_log::CAPACITY),
            probes: Probes::default(),
            http_addr: dataplane.http_addr,
            socks5_addr: dataplane.socks5_addr,
            started: Instant::now(),
            sessions: crate::api::auth::Sessions::named(crate::api::auth::CLIENT_COOKIE_NAME),
            cache,
            diagnostics: initial.diagnostics,
            mesh: super::mesh::MeshManager::new(
                dataplane.commands.clone(),
                initial.data_dir.clone(),
            ),
            vpn: initial.vpn,
            active_server: tokio::sync::watch::Sender::new(active),
        }
    }

    /// The server traffic goes to right now: the selected one while connected, else none
    /// (every destination direct).
    pub fn server_in_use(&self) -> Option<ClientServerConfig> {
        self.active_server.borrow().clone()
    }

    /// Makes a running VPN follow the server in use (see `VpnManager::follow_server`).
    pub async fn vpn_follow_server(&self) {
        self.vpn_follow(self.server_in_use().as_ref()).await;
    }

    /// Makes a running VPN follow `server` (the one in use, or about to be).
    pub async fn vpn_follow(&self, server: Option<&ClientServerConfig>) {
        let cfg = self.config.load_full();
        self.vpn.follow_server(&cfg.vpn.split, server).await;
    }

    pub fn selected_name(&self) -> Option<String> {
        self.connection.lock().selected.clone()
    }

    pub fn is_connected(&self) -> bool {
        self.connection.lock().connected
    }

    /// The selected server's configuration.
    pub fn selected_server(&self) -> Option<ClientServerConfig> {
        let name = self.selected_name()?;
        self.config
            .load()
            .servers
            .iter()
            .find(|s| s.name == name)
            .cloned()
    }

    /// Compiles and publishes the engine snapshot for the current configuration and connection.
    pub fn publish(&self) -> Result<(), ClientError> {
        let cfg = self.config.load();
        // Held while compiling so two publishes cannot interleave (control plane only).
        let conn = self.connection.lock();
        let server = conn
            .connected
            .then(|| conn.selected.as_ref())
            .flatten()
            .and_then(|name| cfg.servers.iter().find(|s| &s.name == name));
        let previous = self.snapshot.load();
        let snapshot = engine_config::compile(&cfg, server, Some(&previous), self.cores)
            .map_err(|e| ClientError::Engine(e.to_string()))?;
        self.snapshot.store(Arc::new(snapshot));
        self.active_server.send_if_modified(|current| {
            let changed = current.as_ref() != server;
            if changed {
                *current = server.cloned();
            }
            changed
        });
        let none = if engine_config::blocks(&cfg, None) {
            "(none: server routes blocked, direct routes direct)"
        } else {
            "(none: every destination direct)"
        };
        tracing::info!(
            server = server.map_or(none, |s| s.name.as_str()),
            routes = cfg.routing.routes.len(),
            "routing published to the data plane"
        );
        Ok(())
    }

    /// `blocked: not connected` while the published snapshot refuses what the server would
    /// carry (`routing.when_disconnected: block` and no server connected), else `None`.
    pub fn blocked(&self) -> Option<String> {
        self.snapshot
            .load()
            .backends
            .iter()
            .any(|b| b.name == engine_config::BLOCKED)
            .then(|| format!("blocked: {}", engine_config::NOT_CONNECTED))
    }

    pub fn connect(&self) -> Result<String, ClientError> {
        {
            let mut conn = self.connection.lock();
            let name = conn.selected.clone().ok_or(ClientError::NoServer)?;
            conn.connected = true;
            conn.dial_failed = false;
            tracing::info!(server = %name, "connected");
        }
        self.publish()?;
        self.selected_name().ok_or(ClientError::NoServer)
    }

    pub fn disconnect(&self) -> Result<(), ClientError> {
        self.connection.lock().connected = false;
        if engine_config::blocks(&self.config.load(), None) {
            tracing::info!("disconnected: destinations for the server are blocked");
        } else {
            tracing::info!("disconnected: every destination goes direct");
        }
        self.publish()
    }

    /// Selects a server by name, or by id when `by_id`; returns its name.
    pub fn select(&self, key: &str, by_id: bool) -> Result<String, ClientError> {
        let cfg = self.config.load();
        let server = cfg
            .servers
            .iter()
            .find(|s| if by_id { s.id() == key } else { s.name == key })
            .or_else(|| {
                by_id
                    .then(|| cfg.servers.iter().find(|s| s.name == key))
                    .flatten()
            })
            .ok_or_else(|| ClientError::UnknownServer(key.to_owned()))?;
        let name = server.name.clone();
        {
            let mut conn = self.connection.lock();
            conn.selected = Some(name.clone());
            conn.dial_failed = false;
        }
        self.settings.lock().current_server = name.clone();
        self.save_settings()?;
        tracing::info!(server = %name, address = %server.address, "server selected");
        self.publish()?;
        Ok(name)
    }

    /// The engine reported the backend `backend` unhealthy (repeated failed dials).
    pub fn dial_health(&self, backend: &str, healthy: bool) {
        let (action, name) = engine_config::action_of(backend);
        let mut conn = self.connection.lock();
        if action == "server" && conn.selected.as_deref() == Some(name) {
            conn.dial_failed = !healthy;
        }
    }

    pub fn clear_dial_failure(&self) {
        self.connection.lock().dial_failed = false;
    }

    /// Why the client is degraded (empty when healthy): data-plane cores that are down, the kill
    /// switch blocking (`blocked: not connected`), and, while connected, a selected server that
    /// cannot be reached (its last probe failed, or the engine's dials to it keep failing since
    /// the last successful probe).
    pub fn problems(&self) -> Vec<String> {
        let mut problems = self.core_health.problems();
        problems.extend(self.blocked());
        let conn = self.connection.lock();
        let Some(name) = conn.selected.as_deref().filter(|_| conn.connected) else {
            return problems;
        };
        if self.probes.get(name).is_some_and(|p| p.latency.is_none()) {
            problems.push(format!(
                "server {name} is unreachable (its last probe failed)"
            ));
        } else if conn.dial_failed {
            problems.push(format!("connections through server {name} keep failing"));
        }
        problems
    }

    /// The list's `status` of the server `name`.
    pub fn status_of(&self, name: &str) -> &'static str {
        let cfg = self.config.load();
        let connected_to_it = {
            let conn = self.connection.lock();
            conn.connected && conn.selected.as_deref() == Some(name)
        };
        server_status(
            self.probes.get(name),
            connected_to_it,
            cfg.server.busy_latency.as_std(),
        )
    }

    pub fn settings(&self) -> QuickSettings {
        let mut s = self.settings.lock().clone();
        s.current_server = self.selected_name().unwrap_or_default();
        s
    }

    /// Stores new quick settings; a changed `current_server` selects that server.
    pub fn update_settings(&self, new: QuickSettings) -> Result<(), ClientError> {
        let current = self.selected_name().unwrap_or_default();
        if new.current_server != current && !new.current_server.is_empty() {
            self.select(&new.current_server, false)?;
        }
        let mut stored = new;
        stored.current_server = self.selected_name().unwrap_or_default();
        *self.settings.lock() = stored;
        self.save_settings()
    }

    fn save_settings(&self) -> Result<(), ClientError> {
        let s = self.settings.lock().clone();
        let path = settings_path(&self.data_dir);
        let bytes = serde_json::to_vec_pretty(&s).map_err(|e| ClientError::Save {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        write_atomically(&path, &bytes).map_err(|e| ClientError::Save {
            path: path.display().to_string(),
            message: e.to_string(),
        })
    }

    /// Validates `new`, checks that the engine compiles it, saves it (when `save`; a reload has
    /// just read it from the file) and makes it the running configuration. Returns the
    /// restart-requiring keys that changed. Nothing changes on error. Callers hold `config_write`.
    pub fn apply_config(&self, new: ClientConfig, save: bool) -> Result<Vec<String>, ClientError> {
        let problems = validate_client(&new);
        if !problems.is_empty() {
            return Err(ClientError::Invalid(problems));
        }
        engine_config::compile(&new, default_server(&new), None, 1)
            .map_err(|e| ClientError::Engine(e.to_string()))?;
        let old = self.config.load_full();
        if save {
            // The file's `${NAME}` references stay; other values never expand when loaded.
            let previous = std::fs::read_to_string(&self.config_path).ok();
            let yaml = switchyard_config::save::file_text(&new, previous.as_deref(), &|name| {
                std::env::var(name).ok()
            })
            .map_err(|message| ClientError::Save {
                path: self.config_path.display().to_string(),
                message,
            })?;
            write_atomically(&self.config_path, yaml.as_bytes()).map_err(|e| {
                ClientError::Save {
                    path: self.config_path.display().to_string(),
                    message: e.to_string(),
                }
            })?;
        }
        let restart = switchyard_config::client::restart_fields(&old, &new);
        self.origin_policy.store(Arc::new(origin_policy(&new)));
        self.config.store(Arc::new(new));
        // A selected server that is gone: fall back to the default one (or none).
        let cfg = self.config.load();
        {
            let mut conn = self.connection.lock();
            let still = conn
                .selected
                .as_ref()
                .is_some_and(|n| cfg.servers.iter().any(|s| &s.name == n));
            if !still {
                conn.selected = default_server(&cfg).map(|s| s.name.clone());
                if conn.selected.is_none() {
                    conn.connected = false;
                }
            }
        }
        self.publish()?;
        Ok(restart)
    }

    /// The connection state of the QUIC server `name` while it is the engine's server.
    pub fn quic_status(
        &self,
        name: &str,
    ) -> Option<Arc<switchyard_dataplane::quic::client::QuicClientStatus>> {
        let backend = format!("{}{name}", super::engine_config::SERVER_PREFIX);
        let snapshot = self.snapshot.load();
        snapshot
            .backends
            .iter()
            .find(|b| b.name == backend)
            .and_then(|b| match &b.kind {
                switchyard_dataplane::snapshot::BackendKind::Quic(q) => Some(q.0.status.clone()),
                _ => None,
            })
    }

    pub fn server_entries(&self) -> Vec<switchyard_api::client::ServerEntry> {
        let cfg = self.config.load();
        cfg.servers
            .iter()
            .map(|s| {
                let probe = self.probes.get(&s.name);
                switchyard_api::client::ServerEntry {
                    id: s.id().to_owned(),
                    name: s.name.clone(),
                    address: s.address.clone(),
                    protocol: s.protocol.as_str().to_owned(),
                    is_default: s.is_default,
                    latency_ms: probe
                        .and_then(|p| p.latency)
                        .map_or(0, |l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX)),
                    status: self.status_of(&s.name).to_owned(),
                    error: self.quic_status(&s.name).and_then(|q| {
                        (!q.connected.load(std::sync::atomic::Ordering::Acquire))
                            .then(|| q.last_error.lock().clone())
                            .flatten()
                    }),
                }
            })
            .collect()
    }
}
