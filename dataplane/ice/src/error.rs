//! Errors of the NAT traversal crate: what failed, at which server, and whether configuration
//! (URL, credentials) or the network is to blame.

use std::net::SocketAddr;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IceError {
    /// Configuration: a `stun:`/`turn:` URL this crate cannot use.
    #[error("bad server URL {url:?}: {why}")]
    BadUrl { url: String, why: String },
    /// A peer's published endpoint is not a usable candidate.
    #[error("bad mesh endpoint {endpoint}: {why}")]
    BadEndpoint { endpoint: String, why: String },
    /// Configuration: the TURN server refused our long-term credentials (second 401).
    #[error("TURN server {server} refused the credentials of user {username:?} in realm {realm:?} (wrong TURN username or password)")]
    TurnUnauthorized {
        server: SocketAddr,
        username: String,
        realm: String,
    },
    /// The TURN server answered an Allocate with an error (e.g. 486 quota, 508 capacity).
    #[error("TURN server {server} refused the allocation: {code} {reason}")]
    TurnRejected {
        server: SocketAddr,
        code: u16,
        reason: String,
    },
    /// The TURN server broke the protocol.
    #[error("TURN server {server}: {why}")]
    TurnProtocol { server: SocketAddr, why: String },
    #[error("STUN server {server} answered with error {code} {reason}")]
    StunRejected {
        server: SocketAddr,
        code: u16,
        reason: String,
    },
    /// Network: no answer within `mesh.stun.timeout` (retry later).
    #[error("{what} to {server}: no answer within the STUN timeout")]
    Timeout {
        server: SocketAddr,
        what: &'static str,
    },
}
