//! Wire types of the switchyard management APIs: every JSON body the control plane sends or
//! accepts, with the field names of the product specification. No I/O here; the control plane
//! serialises these and the end-to-end tests deserialise them.
#![forbid(unsafe_code)]

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// `GET /api/v1/health`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HealthResponse {
    /// `healthy` or `degraded`
    pub status: String,
    pub time: DateTime<Utc>,
}

/// `GET /api/v1/version`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct VersionInfo {
    pub version: String,
    pub git_commit: String,
    pub build_time: DateTime<Utc>,
    /// The spec's field name; holds the Rust compiler version of this build.
    pub go_version: String,
    /// `<os>/<arch>`
    pub platform: String,
}

/// `GET /api/v1/status`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ServerStatus {
    pub status: String,
    pub time: DateTime<Utc>,
    pub version: String,
    /// Number of configured backends.
    pub backends: u64,
}

/// `backends` of [`ServerStats`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackendCounts {
    pub total: u64,
    pub healthy: u64,
}

/// `GET /api/v1/stats`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ServerStats {
    pub total_connections: u64,
    pub active_connections: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub backends: BackendCounts,
    pub time: DateTime<Utc>,
}

/// Error body `{error, message, code}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorBody {
    pub error: String,
    pub message: String,
    pub code: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_field_names() {
        let s = ServerStats {
            total_connections: 1,
            active_connections: 2,
            bytes_sent: 3,
            bytes_received: 4,
            backends: BackendCounts {
                total: 1,
                healthy: 1,
            },
            time: DateTime::from_timestamp(0, 0).unwrap_or_default(),
        };
        let v = serde_json::to_value(&s).unwrap_or_default();
        for key in [
            "total_connections",
            "active_connections",
            "bytes_sent",
            "bytes_received",
            "backends",
            "time",
        ] {
            assert!(v.get(key).is_some(), "{key}");
        }
        assert_eq!(v["backends"]["healthy"], 1);
    }
}
