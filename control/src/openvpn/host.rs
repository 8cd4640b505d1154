//! What an OpenVPN backend changes on the host, and undoing it: the tunnel device's address,
//! its routing table (`default dev <tun>`) and the `ip rule`s that send the tunnel's own traffic
//! there. Before anything is created it is recorded in the backend's `state.json`, so the next
//! start removes what a crashed (`kill -9`) server left: the process, the device, rules, table
//! and run directory.

use super::launch::{Names, RULE_PRIORITY, STOP_GRACE};
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("`{cmd}` failed: {stderr}")]
    Command { cmd: String, stderr: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// The record of one backend's host changes (`state.json` in its run directory).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Record {
    pub backend: String,
    pub device: String,
    pub table: u32,
    pub priority: u32,
    /// PID of the running `openvpn` (its command line names the run directory).
    pub pid: Option<u32>,
}

impl Record {
    pub fn new(backend: &str, names: &Names) -> Self {
        Record {
            backend: backend.to_owned(),
            device: names.device.clone(),
            table: names.table,
            priority: RULE_PRIORITY,
            pid: None,
        }
    }

    /// Writes the record (atomically: a torn record would hide leftovers).
    pub fn save(&self, names: &Names) -> Result<(), HostError> {
        let path = names.state_path();
        let tmp = path.with_extension("tmp");
        let io = |source| HostError::Io {
            path: path.display().to_string(),
            source,
        };
        let text = serde_json::to_string(self).unwrap_or_default();
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)
    }
}

async fn ip(args: &[&str]) -> Result<String, HostError> {
    let cmd = format!("ip {}", args.join(" "));
    let out = Command::new("ip")
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| HostError::Command {
            cmd: cmd.clone(),
            stderr: e.to_string(),
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(HostError::Command {
            cmd,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// Brings the tunnel into service: device up, its address (a /32: no prefix route in `main`),
/// `default dev <tun>` in the backend's table, and rules sending sockets bound to the device
/// (`oif`) or to its address (`from`, which is also the reverse path of the replies) there.
pub async fn configure(names: &Names, address: Ipv4Addr) -> Result<(), HostError> {
    let dev = names.device.as_str();
    let table = names.table.to_string();
    let addr = address.to_string();
    let prio = RULE_PRIORITY.to_string();
    ip(&["link", "set", "dev", dev, "up"]).await?;
    ip(&["addr", "replace", &format!("{addr}/32"), "dev", dev]).await?;
    ip(&[
        "route", "replace", "default", "dev", dev, "src", &addr, "table", &table,
    ])
    .await?;
    remove_rules(names.table).await;
    ip(&[
        "rule", "add", "oif", dev, "lookup", &table, "priority", &prio,
    ])
    .await?;
    ip(&[
        "rule", "add", "from", &addr, "lookup", &table, "priority", &prio,
    ])
    .await?;
    Ok(())
}

/// Removes the rules pointing at `table` and empties it. Idempotent.
pub async fn unconfigure(table: u32) {
    remove_rules(table).await;
    let _ = ip(&["route", "flush", "table", &table.to_string()]).await;
}

async fn remove_rules(table: u32) {
    let table = table.to_string();
    // `ip rule del` removes one matching rule per call; a backend has two.
    for _ in 0..8 {
        if ip(&["rule", "del", "lookup", &table]).await.is_err() {
            break;
        }
    }
}

/// Whether a network device of this name exists.
pub async fn device_exists(device: &str) -> bool {
    ip(&["link", "show", "dev", device]).await.is_ok()
}

/// Whether `pid` runs an `openvpn` started with a configuration in `dir` (so a PID that was
/// reused by another program is never signalled).
fn is_our_process(pid: u32, dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let needle = dir.as_os_str().as_encoded_bytes();
    cmdline
        .split(|b| *b == 0)
        .any(|arg| arg.starts_with(needle))
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    if let Ok(raw) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), sig);
    }
}

/// Stops a process that is not our child (left by a crashed server): SIGTERM, then SIGKILL
/// after the grace period.
async fn stop_orphan(pid: u32, dir: &Path) {
    if !is_our_process(pid, dir) {
        return;
    }
    signal(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + STOP_GRACE;
    while alive(pid) && is_our_process(pid, dir) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if alive(pid) && is_our_process(pid, dir) {
        signal(pid, nix::sys::signal::Signal::SIGKILL);
    }
}

/// Undoes one record: the process, the rules and table, the device, then the run directory.
pub async fn undo(record: &Record, dir: &Path) {
    if let Some(pid) = record.pid {
        stop_orphan(pid, dir).await;
    }
    unconfigure(record.table).await;
    if device_exists(&record.device).await {
        if let Err(e) = ip(&["link", "del", "dev", &record.device]).await {
            tracing::warn!(device = %record.device, error = %e, "removing a leftover OpenVPN device failed");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Removes what earlier runs left under `root` (every backend directory with its record).
/// Returns the devices cleaned up.
pub async fn clean_leftovers(root: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut cleaned = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        if !dir.is_dir() {
            continue;
        }
        let record = std::fs::read_to_string(dir.join("state.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Record>(&t).ok());
        match record {
            Some(r) => {
                undo(&r, &dir).await;
                cleaned.push(r.device);
            }
            // Nothing was created on the host before the record was written.
            None => {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
    cleaned
}
