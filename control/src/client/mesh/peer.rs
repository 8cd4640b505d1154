//! The running mesh peer's control loop (tokio): register (retrying with backoff), bring up
//! the mesh device with the leased address, start the data plane on its owner core, then keep
//! the lease with heartbeats (409 → register again, 404 → say so and retry), follow the
//! network's events (any event → re-read the peer list) and publish the peer table to the
//! data plane as a snapshot. Endpoint changes (interfaces coming and going, and the
//! server-reflexive and relayed candidates NAT traversal gathers on the data plane) are sent
//! to the registry.

use super::endpoints;
use super::identity::Identity;
use super::registry::{Heartbeat, RegistryClient, RegistryError};
use super::view;
use super::{Live, Phase};
use futures::StreamExt as _;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use switchyard_api::{MeshEndpoint, MeshHeartbeat, MeshPeer, MeshPeerRegistration, MeshPeerUpdate};
use switchyard_config::client::MeshConfig;
use switchyard_dataplane::commands::{Command, CommandSender};
use switchyard_dataplane::mesh::{
    CandidateEndpoint, MeshSettings, MeshStart, NatSettings, PeerCounters, PeerEntry, PeerTable,
    RoutingConfig, ServerUrl, SessionState, TurnServerConfig,
};

/// Longest pause between registration attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// An owner that has not turned its loop for this long is gone (it turns at least every 250 ms).
pub const OWNER_LOST: Duration = Duration::from_secs(3);
/// How often the interfaces are checked for changed host candidates.
const ENDPOINT_CHECK: Duration = Duration::from_secs(30);
/// How often the data plane's gathered candidates are looked at (a version counter).
const CANDIDATE_CHECK: Duration = Duration::from_millis(500);
/// How often the mesh device's addresses are read for anycast addresses (an address added or
/// removed moves anycast traffic within about this long).
const ANYCAST_CHECK: Duration = Duration::from_secs(1);

pub struct PeerTask {
    pub live: Arc<Live>,
    pub registry: RegistryClient,
    pub identity: Identity,
    pub cfg: MeshConfig,
    pub psk: Option<[u8; 32]>,
    /// TAP mode: the device's MAC (also published as the `mac` metadata); `None` in TUN mode.
    pub mac: Option<String>,
    pub socket: std::net::UdpSocket,
    pub port: u16,
    pub commands: CommandSender,
}

/// The anycast list the registry holds for this peer, and the last one it refused.
#[derive(Default)]
struct AnycastListed {
    sent: Vec<Ipv4Addr>,
    refused: Vec<Ipv4Addr>,
}

/// Aborts a spawned task when dropped (the event follower ends with the peer).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.min(5)).min(MAX_BACKOFF)
}

/// The registry's network CIDR → its prefix length.
fn prefix_of(cidr: &str) -> Option<u8> {
    cidr.parse::<ipnet::Ipv4Net>().ok().map(|n| n.prefix_len())
}

impl PeerTask {
    /// Our host candidates (the interfaces' addresses with the mesh port).
    fn hosts(&self) -> Vec<MeshEndpoint> {
        endpoints::host_endpoints(
            &endpoints::interface_addresses(),
            &self.cfg.device.name,
            self.port,
        )
    }

    /// What this peer publishes: its host candidates and what NAT traversal gathered.
    fn endpoints(&self) -> Vec<MeshEndpoint> {
        endpoints::with_gathered(self.hosts(), &self.live.shared.candidates.load())
    }

    /// NAT traversal's settings: host candidates, the STUN and TURN servers resolved (a name
    /// that does not resolve is left out and said so), the path policy.
    async fn nat_settings(&self) -> NatSettings {
        let mut stun_servers = Vec::new();
        for url in &self.cfg.stun.servers {
            match resolve(ServerUrl::parse_stun(url).map_err(|e| e.to_string())).await {
                Ok(a) => stun_servers.push(a),
                Err(e) => tracing::warn!(%url, error = %e, "mesh STUN server left out"),
            }
        }
        let mut turn_servers = Vec::new();
        for t in &self.cfg.turn.servers {
            match resolve(ServerUrl::parse_turn(&t.url).map_err(|e| e.to_string())).await {
                Ok(addr) => turn_servers.push(TurnServerConfig {
                    addr,
                    username: t.username.clone(),
                    password: t.password.clone(),
                }),
                Err(e) => tracing::warn!(url = %t.url, error = %e, "mesh TURN server left out"),
            }
        }
        NatSettings {
            enabled: true,
            host_candidates: self
                .hosts()
                .iter()
                .filter_map(|e| Some(SocketAddr::new(e.address.parse().ok()?, e.port)))
                .collect(),
            stun_servers,
            turn_servers,
            stun_timeout: self.cfg.stun.timeout.as_std(),
            direct_connect: self.cfg.connection.direct_connect,
            relay_enabled: self.cfg.connection.relay_enabled,
        }
    }

    /// Hands the mesh device's anycast addresses to the data plane; returns them (sorted).
    fn publish_anycast(&self, vip: Ipv4Addr, prefix: u8) -> Vec<Ipv4Addr> {
        let Ok(network) = ipnet::Ipv4Net::new(vip, prefix) else {
            return Vec::new();
        };
        let mut found = endpoints::anycast_addresses(
            &endpoints::interface_addresses(),
            &self.cfg.device.name,
            network.trunc(),
            vip,
        );
        found.sort();
        found.dedup();
        self.live.shared.set_local_anycast(found.clone());
        found
    }

    /// What this peer publishes as its metadata: the TAP device's `mac`, and the `anycast`
    /// addresses it serves (the other members accept it for those only when the registry
    /// lists them).
    fn metadata(&self, anycast: &[Ipv4Addr]) -> serde_json::Map<String, serde_json::Value> {
        let mut meta = serde_json::Map::new();
        if let Some(mac) = &self.mac {
            meta.insert("mac".to_owned(), mac.clone().into());
        }
        if !anycast.is_empty() {
            let list = anycast.iter().map(|a| a.to_string().into()).collect();
            meta.insert("anycast".to_owned(), serde_json::Value::Array(list));
        }
        meta
    }

    /// Sends a changed anycast list to the registry. A refused list is said once and not sent
    /// again until the device's addresses change.
    async fn update_anycast(&self, found: Vec<Ipv4Addr>, listed: &mut AnycastListed) {
        if found == listed.sent || found == listed.refused {
            return;
        }
        let update = MeshPeerUpdate {
            endpoints: None,
            metadata: Some(self.metadata(&found)),
        };
        match self.registry.update_peer(&self.live.peer_id, update).await {
            Ok(()) => {
                tracing::info!(anycast = ?found, "mesh anycast addresses listed by the registry");
                listed.sent = found;
                listed.refused.clear();
            }
            Err(e @ RegistryError::Refused { status: 400, .. }) => {
                tracing::warn!(anycast = ?found, error = %e,
                    "the registry refused this peer's anycast addresses: no member sends to them here");
                listed.refused = found;
            }
            Err(e) => tracing::debug!(error = %e, "mesh anycast addresses not updated"),
        }
    }

    fn fail(&self, e: impl std::fmt::Display) {
        let message = e.to_string();
        tracing::warn!(error = %message, "mesh peer");
        let mut info = self.live.info.lock();
        info.phase = Phase::Error;
        info.error = Some(message);
    }

    /// Registers until the registry accepts; the leased address and the network's prefix.
    async fn register(&self, published: &mut Vec<MeshEndpoint>) -> (Ipv4Addr, u8) {
        let mut attempt = 0;
        loop {
            *published = self.endpoints();
            let req = MeshPeerRegistration {
                id: self.live.peer_id.clone(),
                name: self.live.peer_name.clone(),
                public_key: self.identity.public_base64(),
                endpoints: published.clone(),
                // the anycast list follows in its own update: a list the registry refuses
                // must not keep the peer out of the network
                metadata: self.metadata(&[]),
            };
            match self.registry.register(req).await {
                Ok(r) => {
                    let vip = r.virtual_ip.parse::<Ipv4Addr>();
                    let prefix = prefix_of(&r.network_cidr);
                    if let (Ok(vip), Some(prefix)) = (vip, prefix) {
                        tracing::info!(peer = %self.live.peer_id, virtual_ip = %vip,
                            network = %r.network_cidr, peers = r.peers.len(), "mesh peer registered");
                        let mut info = self.live.info.lock();
                        info.network_cidr = r.network_cidr.clone();
                        info.error = None;
                        return (vip, prefix);
                    }
                    self.fail(RegistryError::Invalid {
                        what: "the registration",
                        reason: format!("address {:?} in {:?}", r.virtual_ip, r.network_cidr),
                    });
                }
                Err(e) => self.fail(e),
            }
            tokio::time::sleep(backoff(attempt)).await;
            attempt += 1;
        }
    }

    /// Gives the device its (new) address.
    async fn address_device(&self, vip: Ipv4Addr, prefix: u8) -> Result<(), String> {
        let name = self.cfg.device.name.clone();
        let mtu = self.cfg.device.mtu;
        tokio::task::spawn_blocking(move || {
            let host = switchyard_split_tunnel::host::Host::default();
            host.run("ip", &["-4", "addr", "flush", "dev", &name], None)
                .map_err(|e| e.to_string())?;
            crate::client::vpn::host::configure_tun(&name, vip, prefix, mtu)
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// Re-reads the peer list and publishes the table (counters kept for unchanged peers).
    async fn resync(&self, counters: &mut HashMap<String, ([u8; 32], Arc<PeerCounters>)>) {
        let peers = match self.registry.peers().await {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "mesh peer list not refreshed");
                return;
            }
        };
        let others: Vec<MeshPeer> = peers
            .into_iter()
            .filter(|p| p.id != self.live.peer_id)
            .collect();
        let table = build_table(&others, counters);
        {
            let mut info = self.live.info.lock();
            info.peers = others;
            info.counters = counters.clone();
        }
        self.live.shared.publish(table);
    }

    fn heartbeat_body(&self) -> MeshHeartbeat {
        let info = self.live.info.lock();
        let rtts: Vec<u64> = info
            .counters
            .values()
            .filter(|(_, c)| c.state() == SessionState::Connected)
            .map(|(_, c)| c.rtt_us.load(Relaxed))
            .filter(|rtt| *rtt > 0)
            .collect();
        let reach = view::reach(&info.peers, &info.counters, &self.live.shared.routes.load());
        let totals = &self.live.shared.totals;
        MeshHeartbeat {
            connection_type: reach.connection_type().map(str::to_owned),
            latency: (!rtts.is_empty())
                .then(|| rtts.iter().sum::<u64>() as f64 / rtts.len() as f64 / 1000.0),
            bytes_sent: Some(totals.bytes_sent.load(Relaxed)),
            bytes_received: Some(totals.bytes_received.load(Relaxed)),
        }
    }

    /// Creates and addresses the device and starts the data plane on its owner core; waits
    /// (bounded) until the owner runs.
    async fn start_data_plane(&self, vip: Ipv4Addr, prefix: u8) -> Result<(), String> {
        let name = &self.cfg.device.name;
        let device = match &self.mac {
            Some(_) => switchyard_dataplane::mesh::open_tap_device(name),
            None => switchyard_dataplane::mesh::open_device(name),
        }
        .map_err(|e| format!("creating the mesh device {name}: {e} (needs CAP_NET_ADMIN)"))?;
        if let Some(mac) = &self.mac {
            switchyard_split_tunnel::host::Host::default()
                .run("ip", &["link", "set", "dev", name, "address", mac], None)
                .map_err(|e| format!("setting the mesh device's MAC: {e}"))?;
        }
        self.address_device(vip, prefix)
            .await
            .map_err(|e| format!("configuring the mesh device: {e}"))?;
        self.live.shared.set_network_prefix(prefix);
        self.live.shared.set_local_vip(vip);
        let socket = self
            .socket
            .try_clone()
            .map_err(|e| format!("mesh socket: {e}"))?;
        let start = MeshStart {
            settings: MeshSettings {
                local_id: self.live.peer_id.clone(),
                routing: RoutingConfig::new(
                    self.cfg.routing.max_hops,
                    self.cfg.routing.route_timeout.as_std(),
                    self.cfg.routing.split_horizon,
                ),
                private_key: self.identity.private,
                preshared_key: self.psk,
                keep_alive: self.cfg.connection.keep_alive_interval.as_std(),
                connect_timeout: self.cfg.connection.connect_timeout.as_std(),
                relay_via_peers: self.cfg.connection.relay_via_peers,
                layer2: self.mac.is_some(),
                device_mtu: self.cfg.device.mtu,
                nat: self.nat_settings().await,
            },
            shared: self.live.shared.clone(),
            socket,
            device,
        };
        self.commands
            .try_send(Command::StartMesh(Box::new(start)))
            .map_err(|_| "the data plane's command queue is full or closed".to_string())?;
        for _ in 0..40 {
            if self.live.shared.owner_alive(OWNER_LOST) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err("the mesh data plane did not start on its core".into())
    }

    /// The owner core stopped turning (its core panicked and was restarted empty): stop what
    /// is left (the device reader) and start the data plane again.
    async fn restart_data_plane(&self, vip: Ipv4Addr, prefix: u8) {
        self.fail("the mesh data plane stopped (its core was restarted): starting it again");
        self.live.shared.request_stop();
        // the device reader sees the flag within one poll; the device goes with it
        tokio::time::sleep(Duration::from_millis(400)).await;
        self.live.shared.stop.store(false, Relaxed);
        match self.start_data_plane(vip, prefix).await {
            Ok(()) => {
                let mut info = self.live.info.lock();
                info.phase = Phase::Connected;
                info.error = None;
            }
            Err(e) => self.fail(e),
        }
    }

    pub async fn run(self) {
        let mut published = Vec::new();
        let (mut vip, mut prefix) = self.register(&mut published).await;
        // registered: disabling leaves the network from now on
        self.live.info.lock().virtual_ip = Some(vip);
        let mut counters = HashMap::new();
        self.resync(&mut counters).await;
        if let Err(e) = self.start_data_plane(vip, prefix).await {
            return self.fail(e);
        }
        self.live.info.lock().phase = Phase::Connected;
        let changed = Arc::new(tokio::sync::Notify::new());
        let _events = AbortOnDrop(tokio::spawn(follow_events(
            self.registry.clone(),
            changed.clone(),
        )));
        let mut heartbeat = tokio::time::interval(self.cfg.discovery.heartbeat_interval.as_std());
        heartbeat.tick().await;
        let mut endpoint_check = tokio::time::interval(ENDPOINT_CHECK);
        endpoint_check.tick().await;
        let mut anycast_check = tokio::time::interval(ANYCAST_CHECK);
        let mut candidate_check = tokio::time::interval(CANDIDATE_CHECK);
        let mut candidates_seen = 0;
        let mut anycast_listed = AnycastListed::default();
        loop {
            tokio::select! {
                _ = changed.notified() => self.resync(&mut counters).await,
                _ = anycast_check.tick() => {
                    let found = self.publish_anycast(vip, prefix);
                    self.update_anycast(found, &mut anycast_listed).await;
                }
                _ = candidate_check.tick() => {
                    let version = self.live.shared.candidates_version.load(Relaxed);
                    if version == candidates_seen {
                        continue;
                    }
                    let now = self.endpoints();
                    if now == published {
                        candidates_seen = version;
                        continue;
                    }
                    match self.registry.update_endpoints(&self.live.peer_id, now.clone()).await {
                        Ok(()) => {
                            tracing::info!(endpoints = ?now, "mesh endpoints published");
                            published = now;
                            candidates_seen = version;
                        }
                        Err(e) => tracing::debug!(error = %e, "mesh endpoints not updated"),
                    }
                }
                _ = endpoint_check.tick() => {
                    let now = self.endpoints();
                    if now != published {
                        match self.registry.update_endpoints(&self.live.peer_id, now.clone()).await {
                            Ok(()) => published = now,
                            Err(e) => tracing::debug!(error = %e, "mesh endpoints not updated"),
                        }
                    }
                }
                _ = heartbeat.tick() => {
                    match self.registry.heartbeat(&self.live.peer_id, &self.heartbeat_body()).await {
                        Ok(Heartbeat::Renewed) => {
                            let mut info = self.live.info.lock();
                            info.phase = Phase::Connected;
                            info.error = None;
                        }
                        Ok(answer) => {
                            if answer == Heartbeat::Unknown {
                                self.fail(format!(
                                    "the registry does not know network {} or this peer any more (404); registering again",
                                    self.cfg.network_id
                                ));
                            } else {
                                tracing::info!("mesh lease lost (409): registering again");
                            }
                            let (again, again_prefix) = self.register(&mut published).await;
                            // registering replaced the metadata: the anycast list goes again
                            anycast_listed = AnycastListed::default();
                            prefix = again_prefix;
                            if again != vip {
                                if let Err(e) = self.address_device(again, prefix).await {
                                    self.fail(format!("configuring the mesh device: {e}"));
                                    continue;
                                }
                                self.live.shared.set_local_vip(again);
                                vip = again;
                            }
                            let mut info = self.live.info.lock();
                            info.phase = Phase::Connected;
                            info.virtual_ip = Some(vip);
                        }
                        // the credential is refused (the admin removed this peer, or replaced
                        // its credential): shown in the status; the sessions run until stopped
                        Err(e @ RegistryError::Refused { status: 401 | 403, .. }) => self.fail(e),
                        // unreachable registry: the sessions keep running meanwhile
                        Err(e) => tracing::warn!(error = %e, "mesh heartbeat failed"),
                    }
                    if !self.live.shared.owner_alive(OWNER_LOST) {
                        self.restart_data_plane(vip, prefix).await;
                    }
                    // the list also catches events missed while the stream was down
                    self.resync(&mut counters).await;
                }
            }
        }
    }
}

/// The data plane's table for `peers` (keys the registry lists; endpoints best first).
pub fn build_table(
    peers: &[MeshPeer],
    counters: &mut HashMap<String, ([u8; 32], Arc<PeerCounters>)>,
) -> PeerTable {
    use base64::Engine as _;
    let mut entries = Vec::new();
    let mut seen = Vec::new();
    for p in peers {
        let key = base64::engine::general_purpose::STANDARD
            .decode(&p.public_key)
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok());
        let (Some(key), Ok(vip)) = (key, p.virtual_ip.parse::<Ipv4Addr>()) else {
            tracing::warn!(peer = %p.id, "mesh peer with an unusable key or address: ignored");
            continue;
        };
        let mut eps: Vec<&MeshEndpoint> = p.endpoints.iter().collect();
        eps.sort_by_key(|e| std::cmp::Reverse(e.priority));
        // relayed addresses are reached only along a path NAT traversal checked
        let endpoints: Vec<SocketAddr> = eps
            .iter()
            .filter(|e| e.kind != "relay")
            .filter_map(|e| {
                e.address
                    .parse::<Ipv4Addr>()
                    .ok()
                    .map(|ip| (ip, e.port).into())
            })
            .collect();
        let slot = counters
            .entry(p.id.clone())
            .or_insert_with(|| (key, Arc::default()));
        if slot.0 != key {
            *slot = (key, Arc::default());
        }
        seen.push(p.id.clone());
        let anycast = p
            .metadata
            .get("anycast")
            .and_then(|v| v.as_array())
            .map(|l| l.iter().filter_map(|a| a.as_str()?.parse().ok()).collect())
            .unwrap_or_default();
        entries.push(Arc::new(PeerEntry {
            id: p.id.clone(),
            name: p.name.clone(),
            vip,
            public_key: key,
            endpoints,
            candidates: eps
                .iter()
                .map(|e| CandidateEndpoint {
                    address: e.address.clone(),
                    port: e.port,
                    kind: e.kind.clone(),
                    priority: e.priority,
                })
                .collect(),
            joined_ms: p.joined_at.timestamp_millis(),
            anycast,
            counters: slot.1.clone(),
        }));
    }
    counters.retain(|id, _| seen.contains(id));
    PeerTable { peers: entries }
}

/// A `stun:`/`turn:` server's address (names looked up).
async fn resolve(url: Result<ServerUrl, String>) -> Result<SocketAddr, String> {
    let url = url?;
    if let Some(a) = url.socket_addr() {
        return Ok(a);
    }
    let mut found = tokio::net::lookup_host((url.host.as_str(), url.port))
        .await
        .map_err(|e| e.to_string())?;
    // the mesh socket is IPv4
    found
        .find(SocketAddr::is_ipv4)
        .ok_or_else(|| format!("{} has no IPv4 address", url.host))
}

/// Follows the network's event stream; every event (and every reconnect) asks for a resync.
async fn follow_events(registry: RegistryClient, changed: Arc<tokio::sync::Notify>) {
    let mut attempt = 0;
    loop {
        match registry.open_events().await {
            Ok(mut ws) => {
                attempt = 0;
                changed.notify_one();
                while let Some(msg) = ws.next().await {
                    match msg {
                        Ok(tokio_tungstenite::tungstenite::Message::Text(t)) => {
                            tracing::debug!(event = %t.as_str(), "mesh event");
                            changed.notify_one();
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::debug!(error = %e, "mesh event stream ended");
                            break;
                        }
                    }
                }
            }
            // a certificate refused here is refused for the REST calls too (one TLS
            // configuration), which log it as a warning
            Err(e) => tracing::debug!(error = %e, "mesh event stream not opened"),
        }
        tokio::time::sleep(backoff(attempt)).await;
        attempt += 1;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn peer(id: &str, key: u8, vip: &str) -> MeshPeer {
        use base64::Engine as _;
        serde_json::from_value(serde_json::json!({
            "id": id, "name": id,
            "public_key": base64::engine::general_purpose::STANDARD.encode([key; 32]),
            "virtual_ip": vip,
            "endpoints": [
                {"address": "192.0.2.1", "port": 4000, "type": "lan", "priority": 10},
                {"address": "198.51.100.1", "port": 4001, "type": "srflx", "priority": 20},
                {"address": "not-an-ip", "port": 1, "type": "lan", "priority": 30}
            ],
            "metadata": {}, "status": "connected",
            "last_seen": "2026-01-01T00:00:00Z", "joined_at": "2026-01-01T00:00:00Z",
            "lease_expires": "2026-01-01T00:05:00Z", "bytes_sent": 0, "bytes_received": 0
        }))
        .unwrap()
    }

    #[test]
    fn the_table_keeps_counters_of_unchanged_peers_and_renews_them_on_a_new_key() {
        let mut counters = HashMap::new();
        let t = build_table(
            &[peer("a", 1, "10.1.0.2"), peer("b", 2, "10.1.0.3")],
            &mut counters,
        );
        assert_eq!(t.peers.len(), 2);
        assert_eq!(
            t.peers[0].endpoints,
            [
                "198.51.100.1:4001".parse().unwrap(),
                "192.0.2.1:4000".parse().unwrap()
            ],
            "best priority first, unusable ones left out"
        );
        t.peers[0].counters.bytes_sent.store(7, Relaxed);
        let again = build_table(
            &[peer("a", 1, "10.1.0.2"), peer("b", 9, "10.1.0.3")],
            &mut counters,
        );
        assert_eq!(again.peers[0].counters.bytes_sent.load(Relaxed), 7);
        assert!(!Arc::ptr_eq(&again.peers[1].counters, &t.peers[1].counters));
        let mut bad = peer("c", 3, "10.1.0.4");
        bad.public_key = "short".into();
        let last = build_table(&[peer("a", 1, "10.1.0.2"), bad], &mut counters);
        assert_eq!(
            last.peers.len(),
            1,
            "a peer with an unusable key is not accepted"
        );
        assert_eq!(counters.len(), 1, "counters of departed peers go");
        assert_eq!(prefix_of("10.1.0.0/24"), Some(24));
        assert_eq!(backoff(0), Duration::from_secs(1));
        assert_eq!(backoff(10), MAX_BACKOFF);
    }

    #[test]
    fn relay_endpoints_are_candidates_only() {
        let mut p = peer("a", 1, "10.1.0.2");
        p.endpoints.push(
            serde_json::from_value(serde_json::json!(
                {"address": "203.0.113.1", "port": 50000, "type": "relay", "priority": 99}
            ))
            .unwrap(),
        );
        let t = build_table(&[p], &mut HashMap::new());
        assert!(!t.peers[0]
            .endpoints
            .contains(&"203.0.113.1:50000".parse().unwrap()));
        let kinds: Vec<&str> = t.peers[0]
            .candidates
            .iter()
            .map(|c| c.kind.as_str())
            .collect();
        assert_eq!(
            kinds,
            ["relay", "lan", "srflx", "lan"],
            "best first, all kept"
        );
    }
}
