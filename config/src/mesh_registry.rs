//! `mesh:` of the server configuration — the registry of mesh networks and peers (issue 13).
//!
//! Off by default: a proxy-only gateway gets no database file. When on, the registry keeps
//! networks, peers and leases in SQLite at `<server.data_dir>/mesh-registry.db`, or in the
//! PostgreSQL database `mesh.registry.database_url` names.

use serde::{Deserialize, Serialize};

use crate::model::null_default;
use crate::units::Duration;

/// The spec's sample heartbeat interval of a mesh peer (`mesh.discovery.heartbeat_interval`).
pub const SAMPLE_HEARTBEAT: Duration = Duration::from_secs(30);

/// Heartbeats a peer may miss before its lease expires (default lease = this × the heartbeat).
pub const MISSED_HEARTBEATS: u64 = 3;

/// `mesh:`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshSection {
    #[serde(deserialize_with = "null_default")]
    pub registry: MeshRegistryConfig,
}

/// `mesh.registry:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshRegistryConfig {
    /// Serve the `/api/v1/mesh/networks` registry. Default false.
    pub enabled: bool,
    /// `sqlite://…` or `postgres://…`; empty = SQLite file `mesh-registry.db` in
    /// `server.data_dir`. A PostgreSQL database should be the registry's own (its migration
    /// table is not shared with other services).
    pub database_url: String,
    /// How long an address stays leased without a heartbeat. Default 90s: three missed
    /// heartbeats at the spec's sample interval (30s).
    pub lease_time: Duration,
}

impl Default for MeshRegistryConfig {
    /// disabled, SQLite in the data directory, lease_time 90s.
    fn default() -> Self {
        MeshRegistryConfig {
            enabled: false,
            database_url: String::new(),
            lease_time: Duration::from_secs(
                SAMPLE_HEARTBEAT.as_std().as_secs() * MISSED_HEARTBEATS,
            ),
        }
    }
}

impl MeshRegistryConfig {
    /// Problems as `(field, message)`.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.lease_time.as_std() < std::time::Duration::from_secs(1) {
            out.push((
                "mesh.registry.lease_time".into(),
                "must be at least 1s (default 90s: three missed 30s heartbeats)".into(),
            ));
        }
        let url = self.database_url.trim();
        if !url.is_empty()
            && !["sqlite:", "postgres://", "postgresql://"]
                .iter()
                .any(|s| url.starts_with(s))
        {
            out.push((
                "mesh.registry.database_url".into(),
                "must start with sqlite:, postgres:// or postgresql:// (empty = SQLite in server.data_dir)".into(),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_lease_is_three_sample_heartbeats() {
        let c = MeshRegistryConfig::default();
        assert!(!c.enabled);
        assert_eq!(c.lease_time.as_std().as_secs(), 90);
        assert!(c.problems().is_empty());
    }

    #[test]
    fn bad_url_and_zero_lease_are_named() {
        let c = MeshRegistryConfig {
            enabled: true,
            database_url: "mysql://x".into(),
            lease_time: Duration::ZERO,
        };
        let fields: Vec<String> = c.problems().into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            fields,
            ["mesh.registry.lease_time", "mesh.registry.database_url"]
        );
    }
}
