//! The server list's measured state: a periodic probe opens a TCP connection to every listed
//! server and records the connect latency (or the failure). [`server_status`] turns a probe and
//! the connection state into the list's `status`; [`ClientState::is_degraded`] uses the selected
//! server's probe and the engine's failed dials.

use super::state::ClientState;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_config::client::ServerProtocol;

/// The outcome of one probe of one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// Connect latency; `None` when the server could not be reached.
    pub latency: Option<Duration>,
    pub at: Instant,
}

/// Probes by server name.
#[derive(Default)]
pub struct Probes(Mutex<HashMap<String, Probe>>);

impl Probes {
    pub fn get(&self, name: &str) -> Option<Probe> {
        self.0.lock().get(name).copied()
    }

    pub fn set(&self, name: &str, probe: Probe) {
        self.0.lock().insert(name.to_owned(), probe);
    }

    /// Forget servers no longer listed.
    pub fn retain(&self, names: &[&str]) {
        self.0.lock().retain(|k, _| names.contains(&k.as_str()));
    }
}

/// `connected` (the selected server while connected and reachable), `busy` (reachable but slower
/// than `busy_latency`), `online`, or `offline` (the last probe failed). A server not probed yet
/// counts as reachable only when it is the connected one.
pub fn server_status(
    probe: Option<Probe>,
    connected_to_it: bool,
    busy_latency: Duration,
) -> &'static str {
    match probe.map(|p| p.latency) {
        Some(None) => "offline",
        None if connected_to_it => "connected",
        None => "offline",
        Some(Some(_)) if connected_to_it => "connected",
        Some(Some(l)) if l > busy_latency => "busy",
        Some(Some(_)) => "online",
    }
}

/// Probes every listed server each `server.probe_interval` (read anew every round).
pub async fn probe_loop(state: Arc<ClientState>) {
    loop {
        let cfg = state.config.load_full();
        let timeout = cfg.server.connect_timeout.as_std();
        let rounds = cfg.servers.iter().map(|s| {
            let address = s.address.clone();
            // A QUIC server is measured by its connection (no TCP port to probe); one the
            // client has not needed yet keeps its last probe.
            let quic = (s.protocol == ServerProtocol::Quic).then(|| state.quic_status(&s.name));
            async move {
                if let Some(quic) = quic {
                    let at = Instant::now();
                    return quic.and_then(|q| {
                        if q.connected.load(std::sync::atomic::Ordering::Acquire) {
                            Some(Probe {
                                latency: Some(q.rtt()),
                                at,
                            })
                        } else {
                            q.last_error
                                .lock()
                                .is_some()
                                .then_some(Probe { latency: None, at })
                        }
                    });
                }
                let start = Instant::now();
                let ok = matches!(
                    tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&address)).await,
                    Ok(Ok(_))
                );
                let at = Instant::now();
                Some(Probe {
                    latency: ok.then(|| at - start),
                    at,
                })
            }
        });
        let results = futures::future::join_all(rounds).await;
        for (server, probe) in cfg.servers.iter().zip(results) {
            let Some(probe) = probe else { continue };
            let before = state.probes.get(&server.name).map(|p| p.latency.is_some());
            state.probes.set(&server.name, probe);
            let now = probe.latency.is_some();
            if before != Some(now) {
                if now {
                    tracing::info!(server = %server.name, address = %server.address, "server reachable");
                } else {
                    tracing::warn!(server = %server.name, address = %server.address, "server unreachable");
                }
            }
            if now && state.selected_name().as_deref() == Some(server.name.as_str()) {
                state.clear_dial_failure();
            }
        }
        let names: Vec<&str> = cfg.servers.iter().map(|s| s.name.as_str()).collect();
        state.probes.retain(&names);
        tokio::time::sleep(cfg.server.probe_interval.as_std()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_from_probe_and_connection() {
        let busy = Duration::from_millis(500);
        let at = Instant::now();
        let up = |ms| {
            Some(Probe {
                latency: Some(Duration::from_millis(ms)),
                at,
            })
        };
        let down = Some(Probe { latency: None, at });
        assert_eq!(server_status(up(3), true, busy), "connected");
        assert_eq!(server_status(up(3), false, busy), "online");
        assert_eq!(server_status(up(900), false, busy), "busy");
        assert_eq!(server_status(down, true, busy), "offline");
        assert_eq!(server_status(down, false, busy), "offline");
        assert_eq!(server_status(None, true, busy), "connected");
        assert_eq!(server_status(None, false, busy), "offline");
    }
}
