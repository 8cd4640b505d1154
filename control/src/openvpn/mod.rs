//! `openvpn` backends on the control plane: one managed `openvpn` process per enabled backend.
//!
//! [`Manager::reconcile`] is called with every configuration the server publishes; the manager
//! task starts a [`supervisor`] for each new backend, restarts it when its settings change and
//! stops it when the backend is disabled or deleted. Its tunnel device is named and routed per
//! backend ([`launch`], [`host`]): the data plane binds proxied sockets to the device, and the
//! device's default route lives in a table of its own that only those sockets reach, so nothing
//! else on the machine goes through the tunnel.
//!
//! State lives under `$SWITCHYARD_RUN_DIR/openvpn` (default `/run/switchyard/openvpn`), one
//! 0700 directory per backend. At start the manager first removes whatever an earlier run left
//! there (after a `kill -9`); on SIGTERM or SIGINT it stops every process and cleans up before
//! the server exits.

pub mod host;
pub mod launch;
pub mod management;
pub mod supervisor;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use switchyard_config::openvpn::OpenvpnSettings;
use switchyard_config::{BackendType, ServerConfig};
use switchyard_dataplane::events::EventQueue;
use switchyard_dataplane::snapshot::{BackendKind, Snapshot};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The `config_file`s of `openvpn` backends that cannot be used on this machine (unreadable, or
/// a line outside the allow-list of options), for `switchyard config validate`; the server
/// checks them again each time it starts a process.
pub fn config_file_problems(cfg: &ServerConfig) -> Vec<switchyard_config::Problem> {
    let mut problems = Vec::new();
    for (i, b) in cfg.backends.iter().enumerate() {
        if b.kind != BackendType::Openvpn {
            continue;
        }
        let Some(settings) = b
            .other
            .as_ref()
            .and_then(|v| OpenvpnSettings::from_value(v).ok())
        else {
            continue; // validation reports the settings themselves
        };
        if let Err(e) = launch::read_config_file(&settings) {
            problems.push(switchyard_config::Problem {
                section: "backends".into(),
                field: format!("backends[{i}].openvpn.config_file"),
                message: e.to_string(),
            });
        }
    }
    problems
}

/// Default parent of the run directory.
pub const DEFAULT_RUN_DIR: &str = "/run/switchyard";

/// One enabled `openvpn` backend as the configuration wants it.
#[derive(Clone)]
struct Wanted {
    settings: OpenvpnSettings,
    link: Arc<switchyard_dataplane::openvpn::OpenvpnLink>,
    health: Arc<switchyard_dataplane::snapshot::BackendHealth>,
}

/// What the manager task is told: the wanted backends, or that the server shuts down.
#[derive(Clone, Default)]
struct Desired {
    backends: BTreeMap<String, Wanted>,
    shutdown: bool,
}

pub struct Manager {
    shared: Arc<Shared>,
}

struct Shared {
    desired: watch::Sender<Desired>,
    /// Turns true once the manager stopped everything after a shutdown request.
    stopped: watch::Receiver<bool>,
}

impl Shared {
    /// Stops every process and removes what they created; returns when done.
    async fn shutdown(&self) {
        self.desired.send_modify(|d| d.shutdown = true);
        let mut stopped = self.stopped.clone();
        let _ = stopped.wait_for(|s| *s).await;
    }
}

impl Manager {
    /// Starts the manager task on the current tokio runtime; it first cleans up leftovers.
    pub fn start(events: Arc<EventQueue>) -> Self {
        let run_dir = std::env::var_os("SWITCHYARD_RUN_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_RUN_DIR));
        let root = std::path::absolute(run_dir.join("openvpn")).unwrap_or(run_dir.join("openvpn"));
        let program = std::env::var_os("SWITCHYARD_OPENVPN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("openvpn"));
        let (desired, rx) = watch::channel(Desired::default());
        let (stopped_tx, stopped) = watch::channel(false);
        tokio::spawn(manage(root, program, events, rx, stopped_tx));
        Manager {
            shared: Arc::new(Shared { desired, stopped }),
        }
    }

    /// Stops every `openvpn` process and removes what they created; returns when done. The
    /// server calls it on SIGTERM or SIGINT before it exits, so no process outlives it.
    pub async fn shutdown(&self) {
        self.shared.shutdown().await;
    }

    /// Hands the manager the `openvpn` backends of a configuration about to be published with
    /// `snapshot` (whose links and health the supervisors update). Call within the runtime.
    pub fn reconcile(&self, cfg: &ServerConfig, snapshot: &Snapshot) {
        let mut backends = BTreeMap::new();
        for b in cfg
            .backends
            .iter()
            .filter(|b| b.enabled && b.kind == BackendType::Openvpn)
        {
            let Some(settings) = b
                .other
                .as_ref()
                .and_then(|v| OpenvpnSettings::from_value(v).ok())
            else {
                continue; // validation refuses such a configuration before it gets here
            };
            let Some(compiled) = snapshot.backends.iter().find(|s| s.name == b.name) else {
                continue;
            };
            if let BackendKind::Openvpn(link) = &compiled.kind {
                backends.insert(
                    b.name.clone(),
                    Wanted {
                        settings,
                        link: link.0.clone(),
                        health: compiled.health.clone(),
                    },
                );
            }
        }
        self.shared.desired.send_modify(|d| d.backends = backends);
    }
}

struct Running {
    settings: OpenvpnSettings,
    link: Arc<switchyard_dataplane::openvpn::OpenvpnLink>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn manage(
    root: PathBuf,
    program: PathBuf,
    events: Arc<EventQueue>,
    mut desired: watch::Receiver<Desired>,
    stopped: watch::Sender<bool>,
) {
    // The run directory belongs to one server at a time; leftovers in it are cleaned (and
    // processes started) only by the server holding its lock. It is taken at start when the
    // directory exists (an earlier run may have left something), else with the first backend.
    let mut lock = if root.exists() {
        take_root(&root).await
    } else {
        None
    };
    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    loop {
        let want = desired.borrow_and_update().clone();
        if want.shutdown {
            for (_, r) in std::mem::take(&mut running) {
                r.stop().await;
            }
            if lock.take().is_some() {
                let _ = std::fs::remove_file(root.join(LOCK_FILE));
                let _ = std::fs::remove_dir(&root);
            }
            let _ = stopped.send(true);
            return;
        }
        if lock.is_none() && !want.backends.is_empty() {
            lock = take_root(&root).await;
        }
        if lock.is_none() && !want.backends.is_empty() {
            // Another server owns the directory: starting here would fight over its devices.
            if desired.changed().await.is_err() {
                let _ = stopped.send(true);
                return;
            }
            continue;
        }
        // Stop what is gone or changed (its device and table are reused by the new process).
        let names: Vec<String> = running.keys().cloned().collect();
        for name in names {
            let keep = want.backends.get(&name).is_some_and(|w| {
                running
                    .get(&name)
                    .is_some_and(|r| r.settings == w.settings && Arc::ptr_eq(&r.link, &w.link))
            });
            if !keep {
                if let Some(r) = running.remove(&name) {
                    tracing::info!(backend = %name, "stopping openvpn backend");
                    r.stop().await;
                }
            }
        }
        for (name, w) in &want.backends {
            if running.contains_key(name) {
                continue;
            }
            let names = launch::Names::new(&root, name);
            let (stop, stop_rx) = watch::channel(false);
            let backend = supervisor::Backend {
                name: name.clone(),
                settings: w.settings.clone(),
                names,
                link: w.link.clone(),
                health: w.health.clone(),
                events: events.clone(),
                program: program.clone(),
            };
            let task = tokio::spawn(supervisor::run(backend, stop_rx));
            running.insert(
                name.clone(),
                Running {
                    settings: w.settings.clone(),
                    link: w.link.clone(),
                    stop,
                    task,
                },
            );
        }
        if desired.changed().await.is_err() {
            // The manager was dropped with the server: stop everything all the same.
            for (_, r) in std::mem::take(&mut running) {
                r.stop().await;
            }
            let _ = stopped.send(true);
            return;
        }
    }
}

/// The lock file that makes a run directory one server's.
const LOCK_FILE: &str = ".lock";

/// Creates and locks the run directory, then removes what an earlier run left in it. `None`
/// (logged) when it cannot be created or another running server holds it.
async fn take_root(root: &Path) -> Option<std::fs::File> {
    if let Err(e) = prepare_root(root) {
        tracing::error!(dir = %root.display(), error = %e,
            "cannot create the OpenVPN run directory; OpenVPN backends stay down");
        return None;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(root.join(LOCK_FILE));
    let file = match file.map(|f| f.try_lock().map(|()| f)) {
        Ok(Ok(f)) => f,
        Ok(Err(_)) => {
            tracing::error!(dir = %root.display(),
                "another switchyard server uses this OpenVPN run directory; give each server its own SWITCHYARD_RUN_DIR. OpenVPN backends stay down");
            return None;
        }
        Err(e) => {
            tracing::error!(dir = %root.display(), error = %e, "cannot lock the OpenVPN run directory");
            return None;
        }
    };
    let cleaned = host::clean_leftovers(root).await;
    if !cleaned.is_empty() {
        tracing::warn!(devices = ?cleaned, dir = %root.display(),
            "removed OpenVPN leftovers of an earlier run (process, device, rules, table)");
    }
    Some(file)
}

fn prepare_root(root: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)
}
