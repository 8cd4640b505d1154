//! Who calls the registry, and what each caller may do (issue 28). The admin token is never a
//! peer credential: a peer registers with an enrollment key of its network (or the admin
//! token, for an admin-run peer) and gets its own `peer_token`, which then acts on that peer
//! only. Secrets are 256 random bits; the registry stores only their SHA-256.

use sha2::{Digest, Sha256};

/// Prefix of an enrollment key (tells it apart from other tokens in logs and configs).
pub const ENROLLMENT_KEY_PREFIX: &str = "syek_";
/// Prefix of a peer credential.
pub const PEER_TOKEN_PREFIX: &str = "sypt_";

/// The authenticated caller of a registry request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The API token (Bearer, `?token=`, or a login session), or no token configured.
    Admin,
    /// A peer credential: acts on this peer of this network only.
    Peer {
        network: String,
        peer: String,
        /// The presented credential (a re-registration hands it back unchanged).
        token: String,
    },
    /// A Bearer secret that is neither: at registration, possibly an enrollment key.
    Unresolved(String),
}

/// Why a caller may not do something.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// No valid credential for this request (401).
    #[error("{0}")]
    Unauthenticated(String),
    /// A valid credential that does not cover this request (403).
    #[error("{0}")]
    Forbidden(String),
}

impl Caller {
    /// May this caller act on (heartbeat, PATCH, DELETE) `peer` of `network`?
    pub fn may_act_on(&self, network: &str, peer: &str) -> Result<(), Denied> {
        match self {
            Caller::Admin => Ok(()),
            Caller::Peer {
                network: n,
                peer: p,
                ..
            } if n == network && p == peer => Ok(()),
            Caller::Peer {
                network: n,
                peer: p,
                ..
            } => Err(Denied::Forbidden(format!(
                "the credential of peer {p:?} (network {n:?}) acts on that peer only, not on peer {peer:?} of network {network:?}"
            ))),
            Caller::Unresolved(_) => Err(unknown_credential()),
        }
    }

    /// May this caller read `network`'s peers and events?
    pub fn may_read(&self, network: &str) -> Result<(), Denied> {
        match self {
            Caller::Admin => Ok(()),
            Caller::Peer { network: n, .. } if n == network => Ok(()),
            Caller::Peer { network: n, .. } => Err(Denied::Forbidden(format!(
                "a peer credential of network {n:?} cannot read network {network:?}"
            ))),
            Caller::Unresolved(_) => Err(unknown_credential()),
        }
    }
}

fn unknown_credential() -> Denied {
    Denied::Unauthenticated("not a valid API token or peer credential of this registry".into())
}

/// What a peer credential may do on a route of the API (by its matched route, never by a path
/// prefix). Every route not listed is the admin's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRoute {
    /// Registration: an enrollment key, the peer's own credential, or the admin token.
    Register,
    /// Reading the peer's own network (peer list, one peer, events).
    ReadNetwork,
    /// Heartbeat, PATCH, DELETE of the peer itself.
    OwnPeer,
}

/// The peer access of (method, matched route); `None` = admin only.
pub fn peer_route(method: &str, route: &str) -> Option<PeerRoute> {
    const PEERS: &str = "/api/v1/mesh/networks/{networkID}/peers";
    const PEER: &str = "/api/v1/mesh/networks/{networkID}/peers/{peerID}";
    const HEARTBEAT: &str = "/api/v1/mesh/networks/{networkID}/peers/{peerID}/heartbeat";
    const EVENTS: &str = "/api/v1/mesh/networks/{networkID}/events";
    match (method.to_ascii_uppercase().as_str(), route) {
        ("POST", PEERS) => Some(PeerRoute::Register),
        ("GET", PEERS) | ("GET", PEER) | ("GET", EVENTS) => Some(PeerRoute::ReadNetwork),
        ("PATCH", PEER) | ("DELETE", PEER) | ("POST", HEARTBEAT) => Some(PeerRoute::OwnPeer),
        _ => None,
    }
}

/// A new secret: `prefix` and 64 hex digits (256 bits from the OS).
pub fn new_secret(prefix: &str) -> Result<String, getrandom::Error> {
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw)?;
    Ok(format!("{prefix}{}", hex(&raw)))
}

/// A new public id (an enrollment key's): 16 hex digits.
pub fn new_id() -> Result<String, getrandom::Error> {
    let mut raw = [0u8; 8];
    getrandom::fill(&mut raw)?;
    Ok(hex(&raw))
}

/// What the registry stores of a secret: hex SHA-256.
pub fn secret_hash(secret: &str) -> String {
    hex(&Sha256::digest(secret.trim().as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(network: &str, peer: &str) -> Caller {
        Caller::Peer {
            network: network.into(),
            peer: peer.into(),
            token: "t".into(),
        }
    }

    #[test]
    fn a_peer_acts_on_itself_only() {
        assert_eq!(peer("n", "a").may_act_on("n", "a"), Ok(()));
        assert!(matches!(
            peer("n", "a").may_act_on("n", "b"),
            Err(Denied::Forbidden(_))
        ));
        assert!(matches!(
            peer("n", "a").may_act_on("m", "a"),
            Err(Denied::Forbidden(_))
        ));
        assert_eq!(Caller::Admin.may_act_on("m", "b"), Ok(()));
        assert!(matches!(
            Caller::Unresolved("x".into()).may_act_on("n", "a"),
            Err(Denied::Unauthenticated(_))
        ));
    }

    #[test]
    fn a_peer_reads_its_own_network_only() {
        assert_eq!(peer("n", "a").may_read("n"), Ok(()));
        assert!(matches!(
            peer("n", "a").may_read("m"),
            Err(Denied::Forbidden(_))
        ));
    }

    #[test]
    fn peer_routes_are_the_mesh_peer_routes_only() {
        use PeerRoute::*;
        let p = "/api/v1/mesh/networks/{networkID}/peers";
        assert_eq!(peer_route("POST", p), Some(Register));
        assert_eq!(peer_route("GET", p), Some(ReadNetwork));
        assert_eq!(
            peer_route("delete", &format!("{p}/{{peerID}}")),
            Some(OwnPeer)
        );
        assert_eq!(
            peer_route("POST", &format!("{p}/{{peerID}}/heartbeat")),
            Some(OwnPeer)
        );
        assert_eq!(peer_route("GET", "/api/v1/config/full"), None);
        assert_eq!(
            peer_route("DELETE", "/api/v1/mesh/networks/{networkID}"),
            None
        );
        assert_eq!(
            peer_route("POST", "/api/v1/mesh/networks/{networkID}/enrollment-keys"),
            None
        );
        assert_eq!(peer_route("GET", "/api/v1/mesh/networks"), None);
    }

    #[test]
    fn the_peer_routes_are_served_routes() {
        // A renamed route would silently leave peers without access: hold the table to the
        // router's own list.
        let served: Vec<_> = crate::api::served_routes()
            .into_iter()
            .filter(|(method, path)| peer_route(method, path).is_some())
            .collect();
        assert_eq!(served.len(), 7, "{served:?}");
    }

    #[test]
    fn secrets_are_distinct_and_hashed() {
        let a = new_secret(PEER_TOKEN_PREFIX).expect("randomness");
        let b = new_secret(PEER_TOKEN_PREFIX).expect("randomness");
        assert_ne!(a, b);
        assert!(a.starts_with(PEER_TOKEN_PREFIX) && a.len() == PEER_TOKEN_PREFIX.len() + 64);
        assert_eq!(secret_hash(&a), secret_hash(&a));
        assert_ne!(secret_hash(&a), secret_hash(&b));
        assert_eq!(secret_hash(&a).len(), 64);
    }
}
