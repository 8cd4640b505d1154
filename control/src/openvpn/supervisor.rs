//! One backend's `openvpn` process, from start to stop: writes its files, starts it, forwards
//! its output to the log, follows its management interface, puts the tunnel into service on
//! CONNECTED (host routing, the data plane's link, health) and out of it on any other state,
//! restarts it with exponential backoff when it exits, and on stop terminates it (management
//! `signal SIGTERM`, then SIGKILL after a grace period) and removes everything it created.

use super::host::{self, Record};
use super::launch::{self, Names, STOP_GRACE};
use super::management::{self, Message};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_config::openvpn::OpenvpnSettings;
use switchyard_dataplane::events::{Event, EventQueue};
use switchyard_dataplane::openvpn::{LinkUp, OpenvpnLink};
use switchyard_dataplane::snapshot::BackendHealth;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::process::{Child, Command};
use tokio::sync::watch;

const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// A run this long (or one that connected) resets the backoff.
const STABLE_RUN: Duration = Duration::from_secs(60);

/// Everything one supervisor needs.
pub struct Backend {
    pub name: String,
    pub settings: OpenvpnSettings,
    pub names: Names,
    pub link: Arc<OpenvpnLink>,
    pub health: Arc<BackendHealth>,
    pub events: Arc<EventQueue>,
    pub program: PathBuf,
}

impl Backend {
    fn set_health(&self, healthy: bool) {
        if let Some(now) = self.health.set(healthy) {
            tracing::warn!(backend = %self.name, healthy = now, "backend health changed");
            self.events.push(Event::BackendHealth {
                name: self.name.clone(),
                healthy: now,
            });
        }
    }

    /// Takes the tunnel out of service (data plane first, then the host's routing).
    async fn down(&self, routed: &mut bool) {
        self.link.set(None);
        self.set_health(false);
        if *routed {
            host::unconfigure(self.names.table).await;
            *routed = false;
        }
    }

    fn write_files(&self, file_text: Option<&str>) -> std::io::Result<launch::Rendered> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.names.dir)?;
        let rendered = launch::render(&self.settings, &self.names, file_text);
        write_private(&self.names.config_path(), &rendered.config)?;
        if let Some(auth) = &rendered.auth {
            write_private(&self.names.auth_path(), auth)?;
        }
        let _ = std::fs::remove_file(self.names.management_path());
        Ok(rendered)
    }
}

/// Writes a file only its owner can read (it may hold keys or the password).
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    std::io::Write::write_all(&mut f, text.as_bytes())
}

/// Runs until `stop` turns true, then stops the process and cleans up.
pub async fn run(backend: Backend, mut stop: watch::Receiver<bool>) {
    let mut backoff = BACKOFF_FIRST;
    let mut record = Record::new(&backend.name, &backend.names);
    loop {
        if *stop.borrow() {
            break;
        }
        let started = Instant::now();
        let outcome = run_once(&backend, &mut record, &mut stop).await;
        let stopping = matches!(outcome, Outcome::Stopped);
        if stopping {
            break;
        }
        if matches!(outcome, Outcome::Exited { connected: true }) || started.elapsed() > STABLE_RUN
        {
            backoff = BACKOFF_FIRST;
        }
        tracing::info!(backend = %backend.name, retry_in = ?backoff, "openvpn will be restarted");
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
    // Everything this backend created goes: the routing, the device (gone with its process),
    // the run directory with the files holding keys and the password.
    backend.link.set(None);
    host::undo(&record, &backend.names.dir).await;
    tracing::info!(backend = %backend.name, device = %backend.names.device, "openvpn backend stopped");
}

enum Outcome {
    Stopped,
    Exited { connected: bool },
}

async fn run_once(
    backend: &Backend,
    record: &mut Record,
    stop: &mut watch::Receiver<bool>,
) -> Outcome {
    let name = backend.name.as_str();
    // Read at every start: a refused file fixed in place is used on the next try.
    let file_text = match launch::read_config_file(&backend.settings) {
        Ok(text) => text,
        Err(e) => {
            tracing::error!(backend = %name, error = %e,
                "openvpn not started: its config_file cannot be used");
            return Outcome::Exited { connected: false };
        }
    };
    let rendered = match backend.write_files(file_text.as_deref()) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(backend = %name, dir = %backend.names.dir.display(), error = %e,
                "cannot write the openvpn run directory");
            return Outcome::Exited { connected: false };
        }
    };
    record.pid = None;
    if let Err(e) = record.save(&backend.names) {
        tracing::error!(backend = %name, error = %e, "cannot record the openvpn backend's host changes");
        return Outcome::Exited { connected: false };
    }
    // The management socket is ours: openvpn connects to it (`--management-client`).
    let listener = match UnixListener::bind(backend.names.management_path()) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(backend = %name, error = %e, "cannot listen for openvpn's management connection");
            return Outcome::Exited { connected: false };
        }
    };
    let mut cmd = Command::new(&backend.program);
    cmd.args(launch::args(&backend.names))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(cwd) = &rendered.cwd {
        cmd.current_dir(cwd);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(backend = %name, program = %backend.program.display(), error = %e,
                "cannot start openvpn");
            return Outcome::Exited { connected: false };
        }
    };
    record.pid = child.id();
    if let Err(e) = record.save(&backend.names) {
        tracing::error!(backend = %name, error = %e, "cannot record the openvpn process");
    }
    tracing::info!(backend = %name, pid = ?record.pid, device = %backend.names.device,
        table = backend.names.table, "openvpn started");
    if let Some(out) = child.stdout.take() {
        tokio::spawn(forward_log(name.to_owned(), out));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(forward_log(name.to_owned(), err));
    }

    let mut routed = false;
    let mut connected_once = false;
    let mut management: Option<tokio::io::WriteHalf<UnixStream>> = None;
    let (lines_tx, mut lines) = tokio::sync::mpsc::channel::<String>(64);
    let attach = attach_management(listener, lines_tx);
    tokio::pin!(attach);
    let mut attaching = true;
    let outcome = loop {
        tokio::select! {
            status = child.wait() => {
                match status {
                    Ok(s) => tracing::warn!(backend = %name, status = %s, "openvpn exited"),
                    Err(e) => tracing::warn!(backend = %name, error = %e, "openvpn wait failed"),
                }
                break Outcome::Exited { connected: connected_once };
            }
            _ = stop.changed() => {
                terminate(&mut child, management.as_mut(), name).await;
                break Outcome::Stopped;
            }
            writer = &mut attach, if attaching => {
                attaching = false;
                management = writer;
                if management.is_none() {
                    tracing::warn!(backend = %name, "openvpn's management interface did not come up");
                }
            }
            Some(line) = lines.recv() => {
                match management::parse(&line) {
                    Some(Message::State { name: state, detail, local_ipv4 }) => {
                        tracing::info!(backend = %name, state = %state, detail = %detail, "openvpn state");
                        if state == "CONNECTED" {
                            match local_ipv4 {
                                Some(address) => match host::configure(&backend.names, address).await {
                                    Ok(()) => {
                                        routed = true;
                                        connected_once = true;
                                        backend.link.set(Some(LinkUp {
                                            device: backend.names.device.clone(),
                                            ipv4: address,
                                        }));
                                        backend.set_health(true);
                                        tracing::info!(backend = %name, device = %backend.names.device,
                                            address = %address, table = backend.names.table,
                                            "OpenVPN tunnel in service");
                                    }
                                    Err(e) => {
                                        tracing::error!(backend = %name, error = %e, "cannot route the OpenVPN tunnel");
                                        backend.down(&mut routed).await;
                                    }
                                },
                                None => {
                                    tracing::error!(backend = %name, "connected without an IPv4 address in the tunnel; not usable");
                                    backend.down(&mut routed).await;
                                }
                            }
                        } else {
                            backend.down(&mut routed).await;
                        }
                    }
                    Some(Message::Bytecount { received, sent }) => {
                        tracing::debug!(backend = %name, received, sent, "openvpn byte count");
                    }
                    None => {}
                }
            }
        }
    };
    backend.down(&mut routed).await;
    outcome
}

/// Accepts openvpn's management connection (within 10 s), sends the hello and forwards every
/// line it reads; returns the writing half.
async fn attach_management(
    listener: UnixListener,
    lines: tokio::sync::mpsc::Sender<String>,
) -> Option<tokio::io::WriteHalf<UnixStream>> {
    let (stream, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept())
        .await
        .ok()?
        .ok()?;
    let (read, mut write) = tokio::io::split(stream);
    write.write_all(management::HELLO.as_bytes()).await.ok()?;
    tokio::spawn(async move {
        let mut reader = BufReader::new(read).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            if lines.send(line).await.is_err() {
                break;
            }
        }
    });
    Some(write)
}

/// Asks the process to exit (management, else SIGTERM), then kills it after the grace period.
async fn terminate(
    child: &mut Child,
    management: Option<&mut tokio::io::WriteHalf<UnixStream>>,
    name: &str,
) {
    let asked = match management {
        Some(m) => m.write_all(management::TERMINATE.as_bytes()).await.is_ok(),
        None => false,
    };
    if !asked {
        if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
    match tokio::time::timeout(STOP_GRACE, child.wait()).await {
        Ok(_) => tracing::info!(backend = %name, "openvpn terminated"),
        Err(_) => {
            tracing::warn!(backend = %name, "openvpn did not exit in time; killing it");
            let _ = child.kill().await;
        }
    }
}

/// Forwards the process's output lines to the log, tagged with the backend.
async fn forward_log(backend: String, out: impl AsyncRead + Unpin) {
    let mut lines = BufReader::new(out).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let lower = line.to_ascii_lowercase();
        if lower.contains("error") || lower.contains("fatal") || lower.contains("failed") {
            tracing::warn!(backend = %backend, "openvpn: {line}");
        } else {
            tracing::info!(backend = %backend, "openvpn: {line}");
        }
    }
}
