//! The registry's rows: networks and peers in SQLite or PostgreSQL (one query set through
//! sqlx's `Any` driver, see `switchyard-sqlstore`). Every change that reads before it writes
//! runs in one write transaction; the unique index on (network, address) makes the database
//! the judge when registrations race, and a registration that loses the race is retried.

use super::credential::Denied;
use super::lease::{self, LeasePolicy};
use super::validate::Invalid;
use chrono::{DateTime, Utc};
use ipnet::Ipv4Net;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, AnyPool, Row};
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use switchyard_api::{
    MeshEndpoint, MeshHeartbeat, MeshNetwork, MeshPeer, MeshPeerRegistration, MeshPeerSummary,
    MeshPeerUpdate,
};
use switchyard_sqlstore::{begin_write, is_unique_violation, iso, Engine};

/// A registration that collided with a concurrent one is tried again this often.
const REGISTER_ATTEMPTS: usize = 16;

/// Why a registry operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Invalid(#[from] Invalid),
    #[error("no mesh network {0:?}")]
    UnknownNetwork(String),
    #[error("no peer {peer:?} in mesh network {network:?}")]
    UnknownPeer { network: String, peer: String },
    #[error("mesh network {0:?} already exists")]
    NetworkExists(String),
    #[error("peer {peer:?} holds no lease in mesh network {network:?} (it expired); register again to get an address")]
    NoLease { network: String, peer: String },
    #[error("peer {peer:?} of mesh network {network:?} holds a lease with another public key; delete the peer or wait until its lease expires")]
    KeyMismatch { network: String, peer: String },
    #[error("the public key of peer {peer:?} is already the key of peer {holder:?} in mesh network {network:?}: a key identifies one peer")]
    PublicKeyInUse {
        network: String,
        peer: String,
        holder: String,
    },
    #[error("no enrollment key {key:?} in mesh network {network:?}")]
    UnknownEnrollmentKey { network: String, key: String },
    #[error(transparent)]
    Denied(#[from] Denied),
    #[error("mesh network {network:?} ({cidr}) is full: all {capacity} addresses are leased")]
    NetworkFull {
        network: String,
        cidr: String,
        capacity: u64,
    },
    #[error("the registry database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("no randomness from the OS: {0}")]
    NoRandomness(getrandom::Error),
    #[error("stored registry data is damaged: {0}")]
    Corrupt(String),
}

type Result<T> = std::result::Result<T, RegistryError>;

/// A peer whose lease ended (expired, deleted, or its network deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Departed {
    pub network_id: String,
    pub peer_id: String,
    pub name: String,
}

/// What a registration did.
#[derive(Debug, Clone, PartialEq)]
pub struct Registered {
    pub virtual_ip: Ipv4Addr,
    pub cidr: Ipv4Net,
    pub lease_expires: DateTime<Utc>,
    /// A new lease (`peer.joined`), or the held one renewed.
    pub joined: bool,
    /// For a renewal: the endpoints differ from the stored ones (`peer.updated`).
    pub endpoints_changed: bool,
    pub others: Vec<MeshPeerSummary>,
    /// Leases of the network that had expired and were ended on the way.
    pub expired: Vec<Departed>,
}

/// What authorises a registration (the caller's identity, resolved by the registry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterAuth<'a> {
    /// The admin token: any id (a new credential replaces the old one).
    Admin,
    /// The SHA-256 of the id's own credential: checked against the stored one in the
    /// registration's transaction (a peer removed meanwhile does not come back this way).
    OwnCredential(&'a str),
    /// The SHA-256 of a presented secret that may be an enrollment key of the network: a new
    /// id only; a single-use key is consumed by the registration that succeeds.
    EnrollmentKey(&'a str),
}

/// An enrollment key as the registry lists it (its secret is never stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnrollmentKeyRow {
    pub id: String,
    pub reusable: bool,
    pub expires_at: DateTime<Utc>,
    pub created: DateTime<Utc>,
}

/// Leased peers per network (metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkLoad {
    pub network_id: String,
    pub leased: u64,
    pub capacity: u64,
}

/// The database and the engine it runs on.
#[derive(Clone)]
pub struct Store {
    pub pool: AnyPool,
    pub engine: Engine,
}

fn corrupt(what: impl std::fmt::Display) -> RegistryError {
    RegistryError::Corrupt(what.to_string())
}

/// The addresses members of `network` hold (address → peer id) and the anycast addresses
/// they list: neither may be leased to another peer.
async fn addresses_in_use(
    conn: &mut AnyConnection,
    network: &str,
    net: Ipv4Net,
) -> Result<(BTreeMap<Ipv4Addr, String>, BTreeSet<Ipv4Addr>)> {
    let rows = sqlx::query(
        "SELECT id, virtual_ip, metadata FROM mesh_peers \
         WHERE network_id = $1 AND virtual_ip IS NOT NULL",
    )
    .bind(network)
    .fetch_all(conn)
    .await?;
    let mut held = BTreeMap::new();
    let mut anycast = BTreeSet::new();
    for r in &rows {
        let id: String = r.try_get("id")?;
        let text: String = r.try_get("virtual_ip")?;
        let ip = text
            .parse::<Ipv4Addr>()
            .map_err(|e| corrupt(format!("address {text:?}: {e}")))?;
        held.insert(ip, id);
        // a list stored before these checks existed may not pass them: it reserves nothing
        let listed = anycast_of(&r.try_get::<String, _>("metadata")?, net).unwrap_or_default();
        anycast.extend(listed);
    }
    Ok((held, anycast))
}

/// The anycast addresses a stored (or about to be stored) metadata text lists.
fn anycast_of(metadata_json: &str, net: Ipv4Net) -> Result<Vec<Ipv4Addr>> {
    let meta: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(metadata_json).map_err(|e| corrupt(format!("metadata: {e}")))?;
    Ok(super::validate::anycast("metadata.anycast", &meta, net)?)
}

fn time(text: &str) -> Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| corrupt(format!("time {text:?}: {e}")))
}

fn endpoints_from(text: &str) -> Result<Vec<MeshEndpoint>> {
    serde_json::from_str(text).map_err(|e| corrupt(format!("endpoints: {e}")))
}

fn endpoints_json(list: &[MeshEndpoint]) -> Result<String> {
    serde_json::to_string(list).map_err(|e| corrupt(format!("endpoints: {e}")))
}

fn network_from(row: &AnyRow) -> Result<MeshNetwork> {
    Ok(MeshNetwork {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        cidr: row.try_get("cidr")?,
        peer_count: u64::try_from(row.try_get::<i64, _>("peer_count")?).unwrap_or(0),
        created: time(&row.try_get::<String, _>("created")?)?,
    })
}

const PEER_COLS: &str = "id, name, public_key, virtual_ip, endpoints, metadata, connection_type, \
     latency, last_seen, joined_at, lease_expires, bytes_sent, bytes_received";

fn peer_from(row: &AnyRow) -> Result<MeshPeer> {
    let metadata: String = row.try_get("metadata")?;
    Ok(MeshPeer {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        public_key: row.try_get("public_key")?,
        virtual_ip: row
            .try_get::<Option<String>, _>("virtual_ip")?
            .unwrap_or_default(),
        endpoints: endpoints_from(&row.try_get::<String, _>("endpoints")?)?,
        metadata: serde_json::from_str(&metadata).map_err(|e| corrupt(format!("metadata: {e}")))?,
        status: "connected".into(),
        connection_type: row.try_get("connection_type")?,
        latency: row.try_get("latency")?,
        last_seen: time(&row.try_get::<String, _>("last_seen")?)?,
        joined_at: time(&row.try_get::<String, _>("joined_at")?)?,
        lease_expires: time(&row.try_get::<String, _>("lease_expires")?)?,
        bytes_sent: u64::try_from(row.try_get::<i64, _>("bytes_sent")?).unwrap_or(0),
        bytes_received: u64::try_from(row.try_get::<i64, _>("bytes_received")?).unwrap_or(0),
    })
}

async fn network_exists(conn: &mut AnyConnection, id: &str) -> Result<bool> {
    Ok(sqlx::query("SELECT 1 FROM mesh_networks WHERE id = $1")
        .bind(id)
        .fetch_optional(conn)
        .await?
        .is_some())
}

/// Is `peer` a row of `network` (with a lease or not)?
async fn peer_exists(conn: &mut AnyConnection, network: &str, peer: &str) -> Result<bool> {
    Ok(
        sqlx::query("SELECT 1 FROM mesh_peers WHERE network_id = $1 AND id = $2")
            .bind(network)
            .bind(peer)
            .fetch_optional(conn)
            .await?
            .is_some(),
    )
}

/// `UnknownNetwork` or `UnknownPeer`, whichever is true.
async fn unknown(conn: &mut AnyConnection, network: &str, peer: &str) -> RegistryError {
    match network_exists(conn, network).await {
        Ok(false) => RegistryError::UnknownNetwork(network.into()),
        Ok(true) => RegistryError::UnknownPeer {
            network: network.into(),
            peer: peer.into(),
        },
        Err(e) => e,
    }
}

/// Ends the leases (of `network`, or all) that are over at `now`. `RETURNING` hands each
/// ended lease to exactly one caller, so a `peer.left` is never announced twice.
async fn expire(
    conn: &mut AnyConnection,
    now: &str,
    network: Option<&str>,
) -> Result<Vec<Departed>> {
    let rows = sqlx::query(
        "UPDATE mesh_peers SET previous_ip = virtual_ip, virtual_ip = NULL \
         WHERE virtual_ip IS NOT NULL AND lease_expires <= $1 \
         AND ($2 = '' OR network_id = $2) RETURNING network_id, id, name",
    )
    .bind(now)
    .bind(network.unwrap_or(""))
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(Departed {
                network_id: r.try_get("network_id")?,
                peer_id: r.try_get("id")?,
                name: r.try_get("name")?,
            })
        })
        .collect()
}

/// Checks a registration's enrollment key (by its hash) in the registration's transaction,
/// and consumes a single-use key. A valid key registers a new id only: an existing one needs
/// its own credential or the admin token, whether or not its lease is over.
async fn admit_enrollment(
    conn: &mut AnyConnection,
    network: &str,
    peer: &str,
    key_hash: &str,
    peer_exists: bool,
    now: DateTime<Utc>,
) -> Result<()> {
    let row = sqlx::query(
        "SELECT id, reusable, expires_at FROM mesh_enrollment_keys \
         WHERE key_hash = $1 AND network_id = $2",
    )
    .bind(key_hash)
    .bind(network)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| {
        Denied::Unauthenticated(format!(
            "not a valid API token, peer credential or enrollment key of mesh network {network:?} (a single-use key works once; a revoked key not at all)"
        ))
    })?;
    let id: String = row.try_get("id")?;
    let expires_at = time(&row.try_get::<String, _>("expires_at")?)?;
    if expires_at <= now {
        return Err(Denied::Unauthenticated(format!(
            "enrollment key {id:?} of mesh network {network:?} expired at {}",
            iso(expires_at)
        ))
        .into());
    }
    if peer_exists {
        return Err(Denied::Forbidden(format!(
            "peer {peer:?} is registered in mesh network {network:?}: registering it again needs its own peer credential or the admin token, not an enrollment key"
        ))
        .into());
    }
    if row.try_get::<i64, _>("reusable")? == 0 {
        sqlx::query("DELETE FROM mesh_enrollment_keys WHERE id = $1")
            .bind(&id)
            .execute(&mut *conn)
            .await?;
    }
    tracing::debug!(network, peer, key = %id, "registration admitted by enrollment key");
    Ok(())
}

fn enrollment_key_from(row: &AnyRow) -> Result<EnrollmentKeyRow> {
    Ok(EnrollmentKeyRow {
        id: row.try_get("id")?,
        reusable: row.try_get::<i64, _>("reusable")? != 0,
        expires_at: time(&row.try_get::<String, _>("expires_at")?)?,
        created: time(&row.try_get::<String, _>("created")?)?,
    })
}

impl Store {
    pub async fn open(url: &str) -> std::result::Result<Self, switchyard_sqlstore::DbError> {
        static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/mesh");
        let (pool, engine) = switchyard_sqlstore::open(url, &MIGRATOR).await?;
        Ok(Self { pool, engine })
    }

    pub async fn create_network(&self, id: &str, name: &str, cidr: Ipv4Net) -> Result<MeshNetwork> {
        let created = Utc::now();
        let inserted = sqlx::query(
            "INSERT INTO mesh_networks (id, name, cidr, created) VALUES ($1, $2, $3, $4)",
        )
        .bind(id)
        .bind(name)
        .bind(cidr.to_string())
        .bind(iso(created))
        .execute(&self.pool)
        .await;
        match inserted {
            Err(e) if is_unique_violation(&e) => Err(RegistryError::NetworkExists(id.into())),
            Err(e) => Err(e.into()),
            Ok(_) => Ok(MeshNetwork {
                id: id.into(),
                name: name.into(),
                cidr: cidr.to_string(),
                peer_count: 0,
                // As stored (millisecond precision), so a later GET shows the same time.
                created: time(&iso(created))?,
            }),
        }
    }

    /// Networks with the number of peers holding a lease at `now`, or the one named `id`.
    async fn networks(&self, id: Option<&str>) -> Result<Vec<MeshNetwork>> {
        let rows = sqlx::query(
            "SELECT n.id, n.name, n.cidr, n.created, \
             COUNT(CASE WHEN p.virtual_ip IS NOT NULL AND p.lease_expires > $1 THEN 1 END) AS peer_count \
             FROM mesh_networks n LEFT JOIN mesh_peers p ON p.network_id = n.id \
             WHERE ($2 = '' OR n.id = $2) \
             GROUP BY n.id, n.name, n.cidr, n.created ORDER BY n.id",
        )
        .bind(iso(Utc::now()))
        .bind(id.unwrap_or(""))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(network_from).collect()
    }

    pub async fn list_networks(&self) -> Result<Vec<MeshNetwork>> {
        self.networks(None).await
    }

    pub async fn network(&self, id: &str) -> Result<MeshNetwork> {
        self.networks(Some(id))
            .await?
            .pop()
            .ok_or_else(|| RegistryError::UnknownNetwork(id.into()))
    }

    /// Deletes a network and its peers; returns the peers that held a lease.
    pub async fn delete_network(&self, id: &str) -> Result<Vec<Departed>> {
        let mut tx = begin_write(&self.pool, self.engine).await?;
        let rows = sqlx::query(
            "SELECT id, name FROM mesh_peers WHERE network_id = $1 \
             AND virtual_ip IS NOT NULL AND lease_expires > $2 ORDER BY id",
        )
        .bind(id)
        .bind(iso(Utc::now()))
        .fetch_all(&mut *tx)
        .await?;
        let departed = rows
            .iter()
            .map(|r| {
                Ok(Departed {
                    network_id: id.into(),
                    peer_id: r.try_get("id")?,
                    name: r.try_get("name")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        sqlx::query("DELETE FROM mesh_enrollment_keys WHERE network_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        // Peers first: SQLite enforces the foreign key's cascade only with the pragma on, and
        // this does not depend on it.
        sqlx::query("DELETE FROM mesh_peers WHERE network_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let deleted = sqlx::query("DELETE FROM mesh_networks WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if deleted.rows_affected() == 0 {
            return Err(RegistryError::UnknownNetwork(id.into()));
        }
        tx.commit().await?;
        Ok(departed)
    }

    /// Registers `peer` in `network` (retrying a registration that lost a race).
    pub async fn register(
        &self,
        policy: &LeasePolicy,
        network: &str,
        peer: &MeshPeerRegistration,
        metadata_json: &str,
        auth: RegisterAuth<'_>,
        new_token_hash: Option<&str>,
    ) -> Result<Registered> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self
                .register_once(policy, network, peer, metadata_json, auth, new_token_hash)
                .await
            {
                Err(RegistryError::Db(e))
                    if is_unique_violation(&e) && attempt < REGISTER_ATTEMPTS =>
                {
                    tracing::debug!(network, peer = %peer.id, attempt, "registration collided with another; retrying");
                }
                other => return other,
            }
        }
    }

    async fn register_once(
        &self,
        policy: &LeasePolicy,
        network: &str,
        peer: &MeshPeerRegistration,
        metadata_json: &str,
        auth: RegisterAuth<'_>,
        new_token_hash: Option<&str>,
    ) -> Result<Registered> {
        let now = Utc::now();
        let now_s = iso(now);
        let expires = policy.expires(now);
        let expires_s = iso(expires);
        let endpoints = endpoints_json(&peer.endpoints)?;
        let mut tx = begin_write(&self.pool, self.engine).await?;
        let expired = expire(&mut tx, &now_s, Some(network)).await?;
        // PostgreSQL: lock the network's row, so registrations of one network take turns
        // instead of all picking the same free address and retrying as a herd. (SQLite's
        // `BEGIN IMMEDIATE` already serialises writers.)
        let net = self.network_cidr_locked(&mut tx, network).await?;
        let cidr = net.to_string();
        let existing = sqlx::query(
            "SELECT public_key, virtual_ip, previous_ip, endpoints, token_hash FROM mesh_peers \
             WHERE network_id = $1 AND id = $2",
        )
        .bind(network)
        .bind(&peer.id)
        .fetch_optional(&mut *tx)
        .await?;
        match auth {
            RegisterAuth::EnrollmentKey(key_hash) => {
                admit_enrollment(
                    &mut tx,
                    network,
                    &peer.id,
                    key_hash,
                    existing.is_some(),
                    now,
                )
                .await?
            }
            RegisterAuth::OwnCredential(token_hash) => {
                let stored = match &existing {
                    Some(r) => r.try_get::<Option<String>, _>("token_hash")?,
                    None => None,
                };
                if stored.as_deref() != Some(token_hash) {
                    return Err(Denied::Unauthenticated(format!(
                        "the credential of peer {:?} is no longer valid in mesh network {network:?} (the peer was removed)",
                        peer.id
                    ))
                    .into());
                }
            }
            RegisterAuth::Admin => {}
        }
        // A key identifies one peer: another member's key is refused (its leases were ended
        // above when over, so a departed peer's key is free again).
        let holder = sqlx::query(
            "SELECT id FROM mesh_peers WHERE network_id = $1 AND public_key = $2 AND id <> $3 \
             AND virtual_ip IS NOT NULL",
        )
        .bind(network)
        .bind(&peer.public_key)
        .bind(&peer.id)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(row) = holder {
            return Err(RegistryError::PublicKeyInUse {
                network: network.into(),
                peer: peer.id.clone(),
                holder: row.try_get("id")?,
            });
        }
        // anycast addresses are the registry's word (the data plane trusts no other): never a
        // member's address, never leased while some member lists them
        let own_anycast = anycast_of(metadata_json, net)?;
        let (mut held_addresses, listed_anycast) = addresses_in_use(&mut tx, network, net).await?;
        if let Some(r) = &existing {
            if let Some(ip) = r.try_get::<Option<String>, _>("virtual_ip")? {
                // its own address counts too: it keeps it below
                if let Ok(ip) = ip.parse() {
                    held_addresses.insert(ip, peer.id.clone());
                }
            }
        }
        super::validate::anycast_not_held("metadata.anycast", &own_anycast, &held_addresses)?;
        let held = match &existing {
            Some(r) => r
                .try_get::<Option<String>, _>("virtual_ip")?
                .map(|ip| {
                    Ok::<_, RegistryError>((
                        ip,
                        r.try_get::<String, _>("public_key")?,
                        r.try_get::<String, _>("endpoints")?,
                    ))
                })
                .transpose()?,
            None => None,
        };
        let (virtual_ip, joined, endpoints_changed) = if let Some((ip, key, old_endpoints)) = held {
            if key != peer.public_key {
                return Err(RegistryError::KeyMismatch {
                    network: network.into(),
                    peer: peer.id.clone(),
                });
            }
            sqlx::query(
                "UPDATE mesh_peers SET name = $1, endpoints = $2, metadata = $3, \
                 lease_expires = $4, last_seen = $5 WHERE network_id = $6 AND id = $7",
            )
            .bind(&peer.name)
            .bind(&endpoints)
            .bind(metadata_json)
            .bind(&expires_s)
            .bind(&now_s)
            .bind(network)
            .bind(&peer.id)
            .execute(&mut *tx)
            .await?;
            let ip: Ipv4Addr = ip
                .parse()
                .map_err(|e| corrupt(format!("address {ip:?}: {e}")))?;
            let changed = endpoints_from(&old_endpoints)? != peer.endpoints;
            (ip, false, changed)
        } else {
            let mut used: BTreeSet<Ipv4Addr> = held_addresses.keys().copied().collect();
            used.extend(listed_anycast.iter().copied());
            used.extend(own_anycast.iter().copied());
            let previous = match &existing {
                Some(r) => r
                    .try_get::<Option<String>, _>("previous_ip")?
                    .and_then(|t| t.parse().ok()),
                None => None,
            };
            let ip = lease::allocate(net, &used, previous).ok_or_else(|| {
                RegistryError::NetworkFull {
                    network: network.into(),
                    cidr: cidr.clone(),
                    capacity: lease::capacity(net),
                }
            })?;
            let sql = if existing.is_some() {
                // The peer's lease expired: it comes back as a new member.
                "UPDATE mesh_peers SET name = $3, public_key = $4, endpoints = $5, metadata = $6, \
                 virtual_ip = $7, lease_expires = $8, last_seen = $9, joined_at = $9, \
                 connection_type = NULL, latency = NULL, bytes_sent = 0, bytes_received = 0 \
                 WHERE network_id = $1 AND id = $2"
            } else {
                "INSERT INTO mesh_peers (network_id, id, name, public_key, endpoints, metadata, \
                 virtual_ip, lease_expires, last_seen, joined_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9)"
            };
            sqlx::query(sql)
                .bind(network)
                .bind(&peer.id)
                .bind(&peer.name)
                .bind(&peer.public_key)
                .bind(&endpoints)
                .bind(metadata_json)
                .bind(ip.to_string())
                .bind(&expires_s)
                .bind(&now_s)
                .execute(&mut *tx)
                .await?;
            (ip, true, false)
        };
        if let Some(hash) = new_token_hash {
            sqlx::query("UPDATE mesh_peers SET token_hash = $1 WHERE network_id = $2 AND id = $3")
                .bind(hash)
                .bind(network)
                .bind(&peer.id)
                .execute(&mut *tx)
                .await?;
        }
        let others = sqlx::query(
            "SELECT id, name, virtual_ip, public_key, endpoints FROM mesh_peers \
             WHERE network_id = $1 AND virtual_ip IS NOT NULL AND id <> $2 ORDER BY id",
        )
        .bind(network)
        .bind(&peer.id)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| {
            Ok(MeshPeerSummary {
                id: r.try_get("id")?,
                name: r.try_get("name")?,
                virtual_ip: r.try_get("virtual_ip")?,
                public_key: r.try_get("public_key")?,
                endpoints: endpoints_from(&r.try_get::<String, _>("endpoints")?)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
        tx.commit().await?;
        Ok(Registered {
            virtual_ip,
            cidr: net,
            lease_expires: time(&expires_s)?,
            joined,
            endpoints_changed,
            others,
            expired,
        })
    }

    /// The network's address range, its row locked on PostgreSQL so that writers of one
    /// network take turns (SQLite's `BEGIN IMMEDIATE` already serialises writers).
    async fn network_cidr_locked(
        &self,
        conn: &mut AnyConnection,
        network: &str,
    ) -> Result<Ipv4Net> {
        let lock = match self.engine {
            Engine::Postgres => " FOR UPDATE",
            Engine::Sqlite => "",
        };
        let cidr: String = sqlx::query(&format!(
            "SELECT cidr FROM mesh_networks WHERE id = $1{lock}"
        ))
        .bind(network)
        .fetch_optional(conn)
        .await?
        .ok_or_else(|| RegistryError::UnknownNetwork(network.into()))?
        .try_get("cidr")?;
        cidr.parse()
            .map_err(|e| corrupt(format!("cidr {cidr:?}: {e}")))
    }

    /// Peers of `network` holding a lease now.
    pub async fn peers(&self, network: &str) -> Result<Vec<MeshPeer>> {
        let mut conn = self.pool.acquire().await?;
        if !network_exists(&mut conn, network).await? {
            return Err(RegistryError::UnknownNetwork(network.into()));
        }
        sqlx::query(&format!(
            "SELECT {PEER_COLS} FROM mesh_peers WHERE network_id = $1 \
             AND virtual_ip IS NOT NULL AND lease_expires > $2 ORDER BY id"
        ))
        .bind(network)
        .bind(iso(Utc::now()))
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(peer_from)
        .collect()
    }

    /// One peer: `UnknownNetwork`, `UnknownPeer`, or `NoLease` when its lease is over.
    pub async fn peer(&self, network: &str, peer: &str) -> Result<MeshPeer> {
        let mut conn = self.pool.acquire().await?;
        Self::leased_peer(&mut conn, network, peer).await
    }

    async fn leased_peer(conn: &mut AnyConnection, network: &str, peer: &str) -> Result<MeshPeer> {
        let row = sqlx::query(&format!(
            "SELECT {PEER_COLS} FROM mesh_peers WHERE network_id = $1 AND id = $2"
        ))
        .bind(network)
        .bind(peer)
        .fetch_optional(&mut *conn)
        .await?;
        let Some(row) = row else {
            return Err(unknown(conn, network, peer).await);
        };
        let found = peer_from(&row)?;
        if found.virtual_ip.is_empty() || lease::ended(found.lease_expires, Utc::now()) {
            return Err(RegistryError::NoLease {
                network: network.into(),
                peer: peer.into(),
            });
        }
        Ok(found)
    }

    /// Replaces the endpoints and/or metadata of a peer holding a lease.
    pub async fn update_peer(
        &self,
        network: &str,
        peer: &str,
        update: &MeshPeerUpdate,
        metadata_json: Option<&str>,
    ) -> Result<MeshPeer> {
        let mut tx = begin_write(&self.pool, self.engine).await?;
        Self::leased_peer(&mut tx, network, peer).await?;
        if let Some(meta) = metadata_json {
            let net = self.network_cidr_locked(&mut tx, network).await?;
            let (held, _) = addresses_in_use(&mut tx, network, net).await?;
            let listed = anycast_of(meta, net)?;
            super::validate::anycast_not_held("metadata.anycast", &listed, &held)?;
        }
        if let Some(list) = &update.endpoints {
            sqlx::query("UPDATE mesh_peers SET endpoints = $1 WHERE network_id = $2 AND id = $3")
                .bind(endpoints_json(list)?)
                .bind(network)
                .bind(peer)
                .execute(&mut *tx)
                .await?;
        }
        if let Some(meta) = metadata_json {
            sqlx::query("UPDATE mesh_peers SET metadata = $1 WHERE network_id = $2 AND id = $3")
                .bind(meta)
                .bind(network)
                .bind(peer)
                .execute(&mut *tx)
                .await?;
        }
        let updated = Self::leased_peer(&mut tx, network, peer).await?;
        tx.commit().await?;
        Ok(updated)
    }

    /// Deletes a peer; `Some` when it held a lease (it leaves the network).
    pub async fn delete_peer(&self, network: &str, peer: &str) -> Result<Option<Departed>> {
        let row = sqlx::query(
            "DELETE FROM mesh_peers WHERE network_id = $1 AND id = $2 \
             RETURNING name, virtual_ip, lease_expires",
        )
        .bind(network)
        .bind(peer)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            let mut conn = self.pool.acquire().await?;
            return Err(unknown(&mut conn, network, peer).await);
        };
        let leased = row.try_get::<Option<String>, _>("virtual_ip")?.is_some()
            && !lease::ended(
                time(&row.try_get::<String, _>("lease_expires")?)?,
                Utc::now(),
            );
        Ok(leased.then(|| Departed {
            network_id: network.into(),
            peer_id: peer.into(),
            name: row.try_get("name").unwrap_or_default(),
        }))
    }

    /// A peer leaves by itself: its lease ends now (its address is free, offered to it again
    /// first) but its row and credential stay, so it can come back without a new enrollment
    /// key until the sweep forgets it. `Some` when it held a lease.
    pub async fn leave_peer(&self, network: &str, peer: &str) -> Result<Option<Departed>> {
        let now = iso(Utc::now());
        let row = sqlx::query(
            "UPDATE mesh_peers SET previous_ip = virtual_ip, virtual_ip = NULL, lease_expires = $1 \
             WHERE network_id = $2 AND id = $3 AND virtual_ip IS NOT NULL AND lease_expires > $1 \
             RETURNING name",
        )
        .bind(&now)
        .bind(network)
        .bind(peer)
        .fetch_optional(&self.pool)
        .await?;
        if let Some(row) = row {
            return Ok(Some(Departed {
                network_id: network.into(),
                peer_id: peer.into(),
                name: row.try_get("name")?,
            }));
        }
        let mut conn = self.pool.acquire().await?;
        let known = peer_exists(&mut conn, network, peer).await?;
        if known {
            Ok(None)
        } else {
            Err(unknown(&mut conn, network, peer).await)
        }
    }

    /// Renews a held lease (and records the peer's reported figures). `NoLease` when the lease
    /// is over, whether or not the sweep has ended it yet.
    pub async fn heartbeat(
        &self,
        policy: &LeasePolicy,
        network: &str,
        peer: &str,
        report: &MeshHeartbeat,
    ) -> Result<()> {
        let now = Utc::now();
        let now_s = iso(now);
        let renewed = sqlx::query(
            "UPDATE mesh_peers SET last_seen = $1, lease_expires = $2, \
             connection_type = COALESCE($3, connection_type), latency = COALESCE($4, latency), \
             bytes_sent = COALESCE($5, bytes_sent), bytes_received = COALESCE($6, bytes_received) \
             WHERE network_id = $7 AND id = $8 AND virtual_ip IS NOT NULL AND lease_expires > $1",
        )
        .bind(&now_s)
        .bind(iso(policy.expires(now)))
        .bind(report.connection_type.as_deref())
        .bind(report.latency)
        .bind(
            report
                .bytes_sent
                .map(|v| i64::try_from(v).unwrap_or(i64::MAX)),
        )
        .bind(
            report
                .bytes_received
                .map(|v| i64::try_from(v).unwrap_or(i64::MAX)),
        )
        .bind(network)
        .bind(peer)
        .execute(&self.pool)
        .await?;
        if renewed.rows_affected() == 1 {
            return Ok(());
        }
        let mut conn = self.pool.acquire().await?;
        let known = peer_exists(&mut conn, network, peer).await?;
        Err(if known {
            RegistryError::NoLease {
                network: network.into(),
                peer: peer.into(),
            }
        } else {
            unknown(&mut conn, network, peer).await
        })
    }

    /// Ends every lease that is over (of one network, or all).
    pub async fn expire_due(&self, network: Option<&str>) -> Result<Vec<Departed>> {
        let mut conn = self.pool.acquire().await?;
        expire(&mut conn, &iso(Utc::now()), network).await
    }

    /// Forgets peers whose lease ended before `before` (their heartbeat then answers 404).
    pub async fn forget(&self, before: DateTime<Utc>) -> Result<u64> {
        Ok(
            sqlx::query("DELETE FROM mesh_peers WHERE virtual_ip IS NULL AND lease_expires < $1")
                .bind(iso(before))
                .execute(&self.pool)
                .await?
                .rows_affected(),
        )
    }

    /// The (network, peer) whose credential hashes to `token_hash`.
    pub async fn peer_by_token(&self, token_hash: &str) -> Result<Option<(String, String)>> {
        let row = sqlx::query("SELECT network_id, id FROM mesh_peers WHERE token_hash = $1")
            .bind(token_hash)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok((r.try_get("network_id")?, r.try_get("id")?)))
            .transpose()
    }

    pub async fn create_enrollment_key(
        &self,
        network: &str,
        id: &str,
        key_hash: &str,
        reusable: bool,
        expires_at: DateTime<Utc>,
    ) -> Result<EnrollmentKeyRow> {
        let mut tx = begin_write(&self.pool, self.engine).await?;
        if !network_exists(&mut tx, network).await? {
            return Err(RegistryError::UnknownNetwork(network.into()));
        }
        let created = iso(Utc::now());
        let expires = iso(expires_at);
        sqlx::query(
            "INSERT INTO mesh_enrollment_keys (id, network_id, key_hash, reusable, expires_at, created) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(id)
        .bind(network)
        .bind(key_hash)
        .bind(i64::from(reusable))
        .bind(&expires)
        .bind(&created)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(EnrollmentKeyRow {
            id: id.into(),
            reusable,
            // As stored (millisecond precision), so a later list shows the same times.
            expires_at: time(&expires)?,
            created: time(&created)?,
        })
    }

    /// The network's enrollment keys that can still be used (unexpired), oldest first.
    pub async fn enrollment_keys(&self, network: &str) -> Result<Vec<EnrollmentKeyRow>> {
        let mut conn = self.pool.acquire().await?;
        if !network_exists(&mut conn, network).await? {
            return Err(RegistryError::UnknownNetwork(network.into()));
        }
        sqlx::query(
            "SELECT id, reusable, expires_at, created FROM mesh_enrollment_keys \
             WHERE network_id = $1 AND expires_at > $2 ORDER BY created, id",
        )
        .bind(network)
        .bind(iso(Utc::now()))
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(enrollment_key_from)
        .collect()
    }

    /// Revokes (deletes) an enrollment key; peers it enrolled keep their own credentials.
    pub async fn delete_enrollment_key(&self, network: &str, id: &str) -> Result<()> {
        let deleted =
            sqlx::query("DELETE FROM mesh_enrollment_keys WHERE network_id = $1 AND id = $2")
                .bind(network)
                .bind(id)
                .execute(&self.pool)
                .await?;
        if deleted.rows_affected() == 1 {
            return Ok(());
        }
        let mut conn = self.pool.acquire().await?;
        Err(if network_exists(&mut conn, network).await? {
            RegistryError::UnknownEnrollmentKey {
                network: network.into(),
                key: id.into(),
            }
        } else {
            RegistryError::UnknownNetwork(network.into())
        })
    }

    /// Deletes enrollment keys that expired before `now`.
    pub async fn forget_expired_keys(&self, now: DateTime<Utc>) -> Result<u64> {
        Ok(
            sqlx::query("DELETE FROM mesh_enrollment_keys WHERE expires_at <= $1")
                .bind(iso(now))
                .execute(&self.pool)
                .await?
                .rows_affected(),
        )
    }

    /// Leased and leasable addresses per network.
    pub async fn load(&self) -> Result<Vec<NetworkLoad>> {
        self.list_networks()
            .await?
            .into_iter()
            .map(|n| {
                let net: Ipv4Net = n
                    .cidr
                    .parse()
                    .map_err(|e| corrupt(format!("cidr {:?}: {e}", n.cidr)))?;
                Ok(NetworkLoad {
                    network_id: n.id,
                    leased: n.peer_count,
                    capacity: lease::capacity(net),
                })
            })
            .collect()
    }
}
