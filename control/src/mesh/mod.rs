//! The mesh registry of `switchyard server` (issue 13): networks with an IPv4 CIDR, the peers
//! registered in them and the address each peer leases. Mesh peers (`switchyard client`)
//! register (and get an address), renew their lease with heartbeats, announce their endpoints
//! and follow the other peers' `peer.joined` / `peer.left` / `peer.updated` events.
//!
//! Control plane only (tokio): the data plane never touches it. [`lease`] decides addresses
//! and expiry, [`validate`] checks input, [`store`] keeps rows in SQLite or PostgreSQL (so a
//! restart keeps networks, peers and leases), [`events`] fans events out per network; the
//! [`Registry`] ties them together, counts what happens (metrics) and runs the expiry sweep.

pub mod credential;
pub mod events;
pub mod lease;
pub mod store;
pub mod validate;

use credential::Caller;
use lease::LeasePolicy;
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use store::{Departed, EnrollmentKeyRow, RegisterAuth, Registered, RegistryError, Store};
use switchyard_api::{
    MeshHeartbeat, MeshNetwork, MeshNetworkCreate, MeshPeer, MeshPeerUpdate, MeshRegisterRequest,
};
use switchyard_config::MeshRegistryConfig;

/// A new peer credential.
fn new_peer_token() -> Result<String, RegistryError> {
    credential::new_secret(credential::PEER_TOKEN_PREFIX).map_err(RegistryError::NoRandomness)
}

/// Long-lived collectors, joined to each scrape of the metrics listener.
#[derive(Clone)]
pub struct MeshMetrics {
    networks: IntGauge,
    peers: IntGaugeVec,
    addresses: IntGaugeVec,
    registrations: IntCounterVec,
    heartbeats: IntCounterVec,
    expired: IntCounter,
}

impl MeshMetrics {
    fn new() -> Result<Self, prometheus::Error> {
        Ok(Self {
            networks: IntGauge::new("switchyard_mesh_networks", "mesh networks in the registry")?,
            peers: IntGaugeVec::new(
                Opts::new(
                    "switchyard_mesh_peers",
                    "peers holding an address lease, per mesh network",
                ),
                &["network"],
            )?,
            addresses: IntGaugeVec::new(
                Opts::new(
                    "switchyard_mesh_lease_addresses",
                    "addresses a mesh network can lease (its CIDR without network and broadcast address)",
                ),
                &["network"],
            )?,
            registrations: IntCounterVec::new(
                Opts::new(
                    "switchyard_mesh_registrations_total",
                    "peer registrations by result (joined = new lease, renewed = lease kept, refused = full network, key mismatch or invalid)",
                ),
                &["result"],
            )?,
            heartbeats: IntCounterVec::new(
                Opts::new(
                    "switchyard_mesh_heartbeats_total",
                    "peer heartbeats by result (renewed, no_lease = 409, unknown = 404, denied = 403 for another peer's credential)",
                ),
                &["result"],
            )?,
            expired: IntCounter::new(
                "switchyard_mesh_leases_expired_total",
                "address leases that ended without a heartbeat",
            )?,
        })
    }

    pub fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.networks.clone()),
            Box::new(self.peers.clone()),
            Box::new(self.addresses.clone()),
            Box::new(self.registrations.clone()),
            Box::new(self.heartbeats.clone()),
            Box::new(self.expired.clone()),
        ]
    }
}

/// Why the registry could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("opening the mesh registry database {url}: {source}")]
    Open {
        url: String,
        source: switchyard_sqlstore::DbError,
    },
    #[error("creating the data directory {dir}: {source}")]
    DataDir { dir: String, source: std::io::Error },
    #[error("mesh registry metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

pub struct Registry {
    store: Store,
    pub policy: LeasePolicy,
    pub events: events::NetworkEvents,
    pub metrics: MeshMetrics,
}

impl Registry {
    /// Opens (and migrates) the store `cfg` names; SQLite in `data_dir` by default.
    pub async fn open(cfg: &MeshRegistryConfig, data_dir: &Path) -> Result<Self, StartError> {
        let url = if cfg.database_url.trim().is_empty() {
            std::fs::create_dir_all(data_dir).map_err(|source| StartError::DataDir {
                dir: data_dir.display().to_string(),
                source,
            })?;
            switchyard_sqlstore::sqlite_url(&data_dir.join("mesh-registry.db"))
        } else {
            cfg.database_url.trim().to_owned()
        };
        let store = Store::open(&url).await.map_err(|source| StartError::Open {
            url: switchyard_sqlstore::redact(&url),
            source,
        })?;
        tracing::info!(database = %switchyard_sqlstore::redact(&url), engine = ?store.engine, lease_time = ?cfg.lease_time.as_std(), "mesh registry ready");
        let registry = Self {
            store,
            policy: LeasePolicy::new(cfg.lease_time.as_std()),
            events: events::NetworkEvents::default(),
            metrics: MeshMetrics::new()?,
        };
        registry.refresh_gauges().await;
        Ok(registry)
    }

    /// Sets the gauges from the store (after every change; a failure is logged, the gauges
    /// keep their last values).
    async fn refresh_gauges(&self) {
        match self.store.load().await {
            Ok(load) => {
                self.metrics.networks.set(load.len() as i64);
                self.metrics.peers.reset();
                self.metrics.addresses.reset();
                for n in load {
                    let l = [n.network_id.as_str()];
                    self.metrics
                        .peers
                        .with_label_values(&l)
                        .set(n.leased as i64);
                    self.metrics
                        .addresses
                        .with_label_values(&l)
                        .set(n.capacity as i64);
                }
            }
            Err(e) => tracing::warn!(error = %e, "mesh registry metrics not refreshed"),
        }
    }

    fn announce_left(&self, departed: &[Departed]) {
        for d in departed {
            self.events.publish(
                &d.network_id,
                "peer.left",
                json!({"peer_id": d.peer_id, "name": d.name}),
            );
        }
    }

    fn announce_expired(&self, departed: &[Departed]) {
        for d in departed {
            tracing::info!(network = %d.network_id, peer = %d.peer_id, "mesh lease expired (no heartbeat)");
        }
        self.metrics.expired.inc_by(departed.len() as u64);
        self.announce_left(departed);
    }

    pub async fn create_network(
        &self,
        req: &MeshNetworkCreate,
    ) -> Result<MeshNetwork, RegistryError> {
        validate::id("id", &req.id)?;
        validate::name("name", &req.name, true)?;
        let cidr = validate::cidr("cidr", &req.cidr)?;
        let created = self
            .store
            .create_network(&req.id, req.name.trim(), cidr)
            .await?;
        tracing::info!(network = %created.id, cidr = %created.cidr, "mesh network created");
        self.refresh_gauges().await;
        Ok(created)
    }

    pub async fn list_networks(&self) -> Result<Vec<MeshNetwork>, RegistryError> {
        self.store.list_networks().await
    }

    pub async fn network(&self, id: &str) -> Result<MeshNetwork, RegistryError> {
        self.store.network(id).await
    }

    pub async fn delete_network(&self, id: &str) -> Result<(), RegistryError> {
        let departed = self.store.delete_network(id).await?;
        tracing::info!(network = %id, peers = departed.len(), "mesh network deleted");
        self.announce_left(&departed);
        self.events.close(id);
        self.refresh_gauges().await;
        Ok(())
    }

    /// Who presents `secret` (a Bearer value that is not the API token): a peer, by its
    /// credential, or unresolved (at registration it may be an enrollment key).
    pub async fn caller(&self, secret: &str) -> Result<Caller, RegistryError> {
        // Only what looks like a peer credential costs a lookup.
        if !secret.trim().starts_with(credential::PEER_TOKEN_PREFIX) {
            return Ok(Caller::Unresolved(secret.to_owned()));
        }
        let hash = credential::secret_hash(secret);
        Ok(match self.store.peer_by_token(&hash).await? {
            Some((network, peer)) => Caller::Peer {
                network,
                peer,
                token: secret.trim().to_owned(),
            },
            None => Caller::Unresolved(secret.to_owned()),
        })
    }

    /// Creates an enrollment key of `network`; returns it with its secret (shown only now).
    pub async fn create_enrollment_key(
        &self,
        network: &str,
        reusable: bool,
        ttl: std::time::Duration,
    ) -> Result<(EnrollmentKeyRow, String), RegistryError> {
        let expires_at = chrono::Duration::from_std(ttl)
            .ok()
            .and_then(|ttl| chrono::Utc::now().checked_add_signed(ttl))
            .ok_or_else(|| validate::Invalid {
                field: "ttl".into(),
                reason: "too long".into(),
            })?;
        let id = credential::new_id().map_err(RegistryError::NoRandomness)?;
        let key = credential::new_secret(credential::ENROLLMENT_KEY_PREFIX)
            .map_err(RegistryError::NoRandomness)?;
        let row = self
            .store
            .create_enrollment_key(
                network,
                &id,
                &credential::secret_hash(&key),
                reusable,
                expires_at,
            )
            .await?;
        tracing::info!(network, key = %row.id, reusable, expires_at = %row.expires_at, "mesh enrollment key created");
        Ok((row, key))
    }

    pub async fn enrollment_keys(
        &self,
        network: &str,
    ) -> Result<Vec<EnrollmentKeyRow>, RegistryError> {
        self.store.enrollment_keys(network).await
    }

    pub async fn revoke_enrollment_key(
        &self,
        network: &str,
        id: &str,
    ) -> Result<(), RegistryError> {
        self.store.delete_enrollment_key(network, id).await?;
        tracing::info!(network, key = %id, "mesh enrollment key revoked");
        Ok(())
    }

    /// Registers `req` for `caller`; returns what happened and the peer's credential (new for
    /// the admin and for an enrollment key, the presented one for the peer itself).
    pub async fn register(
        &self,
        caller: &Caller,
        network: &str,
        req: &MeshRegisterRequest,
    ) -> Result<(Registered, String), RegistryError> {
        let result = self.register_checked(caller, network, req).await;
        let label = match &result {
            Ok((r, _)) if r.joined => "joined",
            Ok(_) => "renewed",
            Err(_) => "refused",
        };
        self.metrics.registrations.with_label_values(&[label]).inc();
        result
    }

    async fn register_checked(
        &self,
        caller: &Caller,
        network: &str,
        req: &MeshRegisterRequest,
    ) -> Result<(Registered, String), RegistryError> {
        if let Some(body_network) = &req.network_id {
            if body_network != network {
                return Err(validate::Invalid {
                    field: "network_id".into(),
                    reason: format!(
                        "{body_network:?} differs from the network in the path ({network:?})"
                    ),
                }
                .into());
            }
        }
        let peer = &req.peer;
        validate::id("peer.id", &peer.id)?;
        validate::name("peer.name", &peer.name, false)?;
        validate::public_key("peer.public_key", &peer.public_key)?;
        validate::endpoints("peer.endpoints", &peer.endpoints)?;
        let metadata = validate::metadata("peer.metadata", &peer.metadata)?;
        let mut peer = peer.clone();
        peer.public_key = peer.public_key.trim().to_owned();
        if peer.name.trim().is_empty() {
            peer.name = peer.id.clone();
        }
        let presented_hash = match caller {
            Caller::Unresolved(secret) | Caller::Peer { token: secret, .. } => {
                credential::secret_hash(secret)
            }
            Caller::Admin => String::new(),
        };
        let (auth, token) = match caller {
            Caller::Admin => (RegisterAuth::Admin, new_peer_token()?),
            Caller::Peer { token, .. } => {
                caller.may_act_on(network, &peer.id)?;
                (RegisterAuth::OwnCredential(&presented_hash), token.clone())
            }
            Caller::Unresolved(_) => (
                RegisterAuth::EnrollmentKey(&presented_hash),
                new_peer_token()?,
            ),
        };
        // A new credential replaces the stored one; the peer's own is kept as it is.
        let issued = (!matches!(auth, RegisterAuth::OwnCredential(_)))
            .then(|| credential::secret_hash(&token));
        let done = self
            .store
            .register(
                &self.policy,
                network,
                &peer,
                &metadata,
                auth,
                issued.as_deref(),
            )
            .await?;
        self.announce_expired(&done.expired);
        if done.joined {
            tracing::info!(network, peer = %peer.id, virtual_ip = %done.virtual_ip, "mesh peer joined");
            self.events.publish(
                network,
                "peer.joined",
                json!({"peer_id": peer.id, "name": peer.name, "virtual_ip": done.virtual_ip.to_string()}),
            );
        } else if done.endpoints_changed {
            self.events.publish(
                network,
                "peer.updated",
                json!({"peer_id": peer.id, "endpoints": peer.endpoints}),
            );
        }
        self.refresh_gauges().await;
        Ok((done, token))
    }

    pub async fn peers(
        &self,
        caller: &Caller,
        network: &str,
    ) -> Result<Vec<MeshPeer>, RegistryError> {
        caller.may_read(network)?;
        self.store.peers(network).await
    }

    pub async fn peer(
        &self,
        caller: &Caller,
        network: &str,
        peer: &str,
    ) -> Result<MeshPeer, RegistryError> {
        caller.may_read(network)?;
        self.store.peer(network, peer).await
    }

    pub async fn update_peer(
        &self,
        caller: &Caller,
        network: &str,
        peer: &str,
        update: &MeshPeerUpdate,
    ) -> Result<MeshPeer, RegistryError> {
        caller.may_act_on(network, peer)?;
        if let Some(list) = &update.endpoints {
            validate::endpoints("endpoints", list)?;
        }
        let metadata = update
            .metadata
            .as_ref()
            .map(|m| validate::metadata("metadata", m))
            .transpose()?;
        let updated = self
            .store
            .update_peer(network, peer, update, metadata.as_deref())
            .await?;
        self.events.publish(
            network,
            "peer.updated",
            json!({"peer_id": updated.id, "endpoints": updated.endpoints}),
        );
        Ok(updated)
    }

    pub async fn delete_peer(
        &self,
        caller: &Caller,
        network: &str,
        peer: &str,
    ) -> Result<(), RegistryError> {
        caller.may_act_on(network, peer)?;
        // The admin removes a peer (with its credential); a peer itself only leaves.
        let departed = match caller {
            Caller::Admin => self.store.delete_peer(network, peer).await?,
            _ => self.store.leave_peer(network, peer).await?,
        };
        if let Some(departed) = departed {
            tracing::info!(
                network,
                peer,
                by_admin = (*caller == Caller::Admin),
                "mesh peer deleted"
            );
            self.announce_left(&[departed]);
        }
        self.refresh_gauges().await;
        Ok(())
    }

    pub async fn heartbeat(
        &self,
        caller: &Caller,
        network: &str,
        peer: &str,
        report: &MeshHeartbeat,
    ) -> Result<(), RegistryError> {
        let result = match caller.may_act_on(network, peer) {
            Ok(()) => {
                self.store
                    .heartbeat(&self.policy, network, peer, report)
                    .await
            }
            Err(denied) => Err(denied.into()),
        };
        let label = match &result {
            Err(RegistryError::Denied(_)) => "denied",
            Ok(()) => "renewed",
            Err(RegistryError::NoLease { .. }) => "no_lease",
            Err(RegistryError::UnknownNetwork(_) | RegistryError::UnknownPeer { .. }) => "unknown",
            Err(_) => "error",
        };
        self.metrics.heartbeats.with_label_values(&[label]).inc();
        if matches!(result, Err(RegistryError::NoLease { .. })) {
            // The lease may be over without the sweep having ended it yet: end it now, so
            // `peer.left` precedes the peer's re-registration.
            self.sweep_network(Some(network)).await;
        }
        result
    }

    async fn sweep_network(&self, network: Option<&str>) {
        match self.store.expire_due(network).await {
            Ok(departed) if departed.is_empty() => {}
            Ok(departed) => {
                self.announce_expired(&departed);
                self.refresh_gauges().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "mesh lease expiry failed; retrying at the next sweep")
            }
        }
    }

    /// Ends expired leases (announcing `peer.left`) and forgets long-expired peers, every
    /// [`LeasePolicy::sweep_every`], for the life of the server.
    pub async fn sweep(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.policy.sweep_every());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.sweep_network(None).await;
            match self
                .store
                .forget(self.policy.forget_before(chrono::Utc::now()))
                .await
            {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(peers = n, "forgot mesh peers whose lease expired long ago")
                }
                Err(e) => tracing::warn!(error = %e, "forgetting expired mesh peers failed"),
            }
            if let Err(e) = self.store.forget_expired_keys(chrono::Utc::now()).await {
                tracing::warn!(error = %e, "deleting expired mesh enrollment keys failed");
            }
        }
    }
}
