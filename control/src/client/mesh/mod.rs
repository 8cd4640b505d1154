//! The mesh peer of `switchyard client` (issue 13), control-plane side: enabling checks the
//! configuration, loads (or makes) the peer's key, binds the mesh UDP port and starts the
//! [`peer`] task (registration, heartbeats, events, the peer table); the packets themselves
//! are the data plane's (`switchyard_dataplane::mesh`, on its owner core). Disabling stops
//! the data plane, leaves the network (so the others see `peer.left` at once) and closes the
//! device. The API reads [`Live`] and the data plane's counters.
//!
//! NAT traversal (`switchyard-ice`) and routing (`switchyard-mesh-routing`) run on the data
//! plane; the control loop resolves the STUN/TURN servers for it and publishes the candidates
//! it gathers as this peer's endpoints.

pub mod endpoints;
pub mod identity;
pub mod peer;
pub mod registry;
pub mod view;

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_api::MeshPeer;
use switchyard_config::client::{mesh_preshared_key, MeshConfig};
use switchyard_dataplane::commands::CommandSender;
use switchyard_dataplane::mesh::{MeshShared, PeerCounters};

/// Longest wait for the data plane to let go of the device when disabling.
const STOP_WAIT: Duration = Duration::from_secs(3);
/// Longest wait for the registry when leaving.
const LEAVE_WAIT: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    #[error("{field} is not set: the mesh needs it")]
    Missing { field: &'static str },
    #[error("mesh.device.mac_address {0:?} is not a unicast MAC address (aa:bb:cc:dd:ee:ff)")]
    Mac(String),
    #[error("mesh.discovery.server: {0}")]
    InsecureRegistry(String),
    #[error("mesh.discovery.fingerprint: {0}")]
    RegistryPin(String),
    #[error(transparent)]
    Registry(#[from] registry::RegistryError),
    #[error("mesh.connection.preshared_key: {0}")]
    PresharedKey(String),
    #[error(transparent)]
    Identity(#[from] identity::IdentityError),
    #[error("binding the mesh UDP port {port}: {source}")]
    Bind { port: u16, source: std::io::Error },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Registering with the registry.
    Connecting,
    /// Registered, device up, data plane running.
    Connected,
    /// The last step failed (see `error`); retried.
    Error,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Connecting => "connecting",
            Phase::Connected => "connected",
            Phase::Error => "error",
        }
    }
}

/// What the control loop knows (short locks, control plane only).
pub struct LiveInfo {
    pub phase: Phase,
    pub error: Option<String>,
    pub virtual_ip: Option<Ipv4Addr>,
    pub network_cidr: String,
    /// The other peers as the registry lists them.
    pub peers: Vec<MeshPeer>,
    /// Their data-plane counters by peer id (with the key they belong to).
    pub counters: HashMap<String, ([u8; 32], Arc<PeerCounters>)>,
}

/// A running mesh peer.
pub struct Live {
    pub peer_id: String,
    pub peer_name: String,
    pub network_id: String,
    pub started: Instant,
    pub shared: Arc<MeshShared>,
    pub info: Mutex<LiveInfo>,
}

struct Running {
    live: Arc<Live>,
    task: tokio::task::JoinHandle<()>,
    registry: registry::RegistryClient,
}

pub struct MeshManager {
    commands: CommandSender,
    data_dir: PathBuf,
    /// Serialises enable and disable.
    running: tokio::sync::Mutex<Option<Running>>,
    /// The running peer, for the API (cheap clone under a short lock).
    live: Mutex<Option<Arc<Live>>>,
}

/// The registry id of this peer: `peer_name` made of the id alphabet, else one derived from
/// the key (unique per peer).
pub fn peer_id(peer_name: &str, public_key: &[u8; 32]) -> String {
    let cleaned: String = peer_name
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    if cleaned.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return cleaned;
    }
    let hex: String = public_key[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("peer-{hex}")
}

/// The TAP device's MAC when none is configured: locally administered, unicast, from the key
/// (the same on every start).
pub fn generated_mac(public_key: &[u8; 32]) -> [u8; 6] {
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&public_key[..6]);
    mac[0] = (mac[0] & 0xFC) | 0x02;
    mac
}

pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let parts: Vec<u8> = text
        .split([':', '-'])
        .map(|p| u8::from_str_radix(p, 16).ok().filter(|_| p.len() == 2))
        .collect::<Option<_>>()?;
    let mac: [u8; 6] = parts.try_into().ok()?;
    (mac[0] & 1 == 0 && mac != [0; 6]).then_some(mac)
}

pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}

/// Binds the mesh socket: the configured port, else the one saved from an earlier start, else
/// any (then saved).
fn bind(cfg: &MeshConfig, data_dir: &std::path::Path) -> Result<std::net::UdpSocket, MeshError> {
    let configured = cfg.connection.listen_port;
    let wanted = if configured != 0 {
        configured
    } else {
        identity::saved_port(data_dir)
    };
    let open = |port: u16| {
        std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port))
            .map_err(|source| MeshError::Bind { port, source })
    };
    let socket = match open(wanted) {
        Ok(s) => s,
        Err(e) if configured == 0 && wanted != 0 => {
            tracing::info!(error = %e, "the mesh port of the last start is taken: picking another");
            open(0)?
        }
        Err(e) => return Err(e),
    };
    let sock = socket2::SockRef::from(&socket);
    let _ = sock.set_recv_buffer_size(4 << 20);
    let _ = sock.set_send_buffer_size(1 << 20);
    if configured == 0 {
        if let Ok(a) = socket.local_addr() {
            identity::save_port(data_dir, a.port());
        }
    }
    Ok(socket)
}

impl MeshManager {
    pub fn new(commands: CommandSender, data_dir: PathBuf) -> Self {
        Self {
            commands,
            data_dir,
            running: tokio::sync::Mutex::new(None),
            live: Mutex::new(None),
        }
    }

    pub fn live(&self) -> Option<Arc<Live>> {
        self.live.lock().clone()
    }

    /// Starts the peer with `cfg` (no-op when it runs). Registration happens in the
    /// background: its progress and errors show in the status.
    pub async fn enable(&self, cfg: &MeshConfig) -> Result<(), MeshError> {
        let mut running = self.running.lock().await;
        if running.is_some() {
            return Ok(());
        }
        if cfg.network_id.trim().is_empty() {
            return Err(MeshError::Missing {
                field: "mesh.network_id",
            });
        }
        let base = registry::base_url(&cfg.discovery.server).ok_or(MeshError::Missing {
            field: "mesh.discovery.server",
        })?;
        switchyard_config::client::registry_transport(&cfg.discovery)
            .map_err(MeshError::InsecureRegistry)?;
        let pin = switchyard_config::client::registry_pin(&cfg.discovery)
            .map_err(MeshError::RegistryPin)?;
        let psk = mesh_preshared_key(&cfg.connection).map_err(MeshError::PresharedKey)?;
        let identity = identity::load_or_create(&self.data_dir)?;
        let mac = if cfg.device.kind == "tap" {
            let mac = match cfg.device.mac_address.trim() {
                "" => generated_mac(&identity.public),
                given => parse_mac(given).ok_or_else(|| MeshError::Mac(given.to_owned()))?,
            };
            Some(format_mac(&mac))
        } else {
            None
        };
        let socket = bind(cfg, &self.data_dir)?;
        let port = socket.local_addr().map(|a| a.port()).unwrap_or_default();
        let id = peer_id(&cfg.peer_name, &identity.public);
        let name = if cfg.peer_name.trim().is_empty() {
            hostname()
        } else {
            cfg.peer_name.trim().to_owned()
        };
        tracing::info!(peer = %id, port, network = %cfg.network_id, registry = %base, "mesh peer starting");
        let live = Arc::new(Live {
            peer_id: id,
            peer_name: name,
            network_id: cfg.network_id.clone(),
            started: Instant::now(),
            shared: Arc::new(MeshShared::default()),
            info: Mutex::new(LiveInfo {
                phase: Phase::Connecting,
                error: None,
                virtual_ip: None,
                network_cidr: cfg.network_cidr.clone(),
                peers: Vec::new(),
                counters: HashMap::new(),
            }),
        });
        let secret = |v: &Option<String>| {
            v.as_deref()
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
        };
        let registry = registry::RegistryClient::new(
            base,
            registry::Credentials {
                admin: secret(&cfg.discovery.token),
                enrollment_key: secret(&cfg.discovery.enrollment_key),
                token_file: Some(identity::peer_token_path(&self.data_dir)),
            },
            cfg.network_id.clone(),
            pin,
        )?;
        let task = peer::PeerTask {
            live: live.clone(),
            registry: registry.clone(),
            identity,
            cfg: cfg.clone(),
            psk,
            mac,
            socket,
            port,
            commands: self.commands.clone(),
        };
        let task = tokio::spawn(task.run());
        *self.live.lock() = Some(live.clone());
        *running = Some(Running {
            live,
            task,
            registry,
        });
        Ok(())
    }

    /// Stops the peer: data plane, control loop, registration, device. No-op when stopped.
    pub async fn disable(&self) {
        let mut running = self.running.lock().await;
        let Some(r) = running.take() else {
            return;
        };
        *self.live.lock() = None;
        r.task.abort();
        let _ = r.task.await;
        r.live.shared.request_stop();
        let registered = r.live.info.lock().virtual_ip.is_some();
        if registered {
            match tokio::time::timeout(LEAVE_WAIT, r.registry.leave(&r.live.peer_id)).await {
                Ok(Ok(())) => tracing::info!(peer = %r.live.peer_id, "mesh peer left the network"),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "leaving the mesh network failed: the lease expires instead")
                }
                Err(_) => {
                    tracing::warn!("leaving the mesh network timed out: the lease expires instead")
                }
            }
        }
        // the device goes when the owner and its reader thread have closed it
        let deadline = Instant::now() + STOP_WAIT;
        while r.live.shared.running.load(Relaxed) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        tracing::info!("mesh peer stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peer_id_is_the_name_in_the_id_alphabet_or_comes_from_the_key() {
        let key = [0xab; 32];
        assert_eq!(peer_id("office-1", &key), "office-1");
        assert_eq!(peer_id("Büro 2", &key), "B-ro-2");
        assert_eq!(peer_id("", &key), "peer-abababababab");
        assert_eq!(peer_id("-x", &key), "peer-abababababab");
        assert_eq!(peer_id(&"a".repeat(80), &key).len(), 64);
    }

    #[test]
    fn a_tap_mac_is_generated_unicast_and_local_or_parsed() {
        let mac = generated_mac(&[0xff; 32]);
        assert_eq!(format_mac(&mac), "fe:ff:ff:ff:ff:ff");
        assert_eq!(
            parse_mac("02:00:5E:10:00:01"),
            Some([2, 0, 0x5e, 0x10, 0, 1])
        );
        assert_eq!(parse_mac("01:00:5e:00:00:01"), None, "multicast");
        assert_eq!(parse_mac("02:00:5e:10:00"), None);
        assert_eq!(parse_mac("2:0:5e:10:0:1"), None);
    }
}
