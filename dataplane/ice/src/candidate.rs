//! Candidates (RFC 8445 §5.1) and their mapping to the spec's Mesh endpoint
//! `{address, port, type: lan|srflx|relay, priority}`.

use std::net::{IpAddr, SocketAddr};

use crate::IceError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CandidateKind {
    /// An address of the local host (the spec's `lan`).
    Host,
    /// The address a NAT maps us to, learnt from STUN (`srflx`).
    ServerReflexive,
    /// Learnt from a connectivity check that arrived from an unknown address; never published.
    PeerReflexive,
    /// The address of our allocation on a TURN server (`relay`).
    Relayed,
}

impl CandidateKind {
    /// RFC 8445 §5.1.2.2 recommended type preferences.
    pub fn type_preference(self) -> u32 {
        match self {
            CandidateKind::Host => 126,
            CandidateKind::PeerReflexive => 110,
            CandidateKind::ServerReflexive => 100,
            CandidateKind::Relayed => 0,
        }
    }

    /// The spec's endpoint `type` (peer-reflexive candidates are published as `srflx`).
    pub fn endpoint_type(self) -> &'static str {
        match self {
            CandidateKind::Host => "lan",
            CandidateKind::ServerReflexive | CandidateKind::PeerReflexive => "srflx",
            CandidateKind::Relayed => "relay",
        }
    }

    pub fn from_endpoint_type(kind: &str) -> Option<CandidateKind> {
        match kind {
            "lan" | "host" => Some(CandidateKind::Host),
            "srflx" => Some(CandidateKind::ServerReflexive),
            "prflx" => Some(CandidateKind::PeerReflexive),
            "relay" => Some(CandidateKind::Relayed),
            _ => None,
        }
    }
}

/// RFC 8445 §5.1.2.1: priority = 2^24·type preference + 2^8·local preference + (256 − component).
/// The mesh has one component (the UDP socket). The largest value, 2130706431, fits the spec's
/// integer (i32) field.
pub fn priority(kind: CandidateKind, local_preference: u16) -> u32 {
    const COMPONENT: u32 = 1;
    (kind.type_preference() << 24) + (u32::from(local_preference) << 8) + (256 - COMPONENT)
}

/// RFC 8445 §6.1.2.3 pair priority from the controlling (G) and controlled (D) candidates.
pub fn pair_priority(controlling: u32, controlled: u32) -> u64 {
    let (g, d) = (u64::from(controlling), u64::from(controlled));
    (1 << 32) * g.min(d) + 2 * g.max(d) + u64::from(g > d)
}

/// A candidate: a transport address of one kind with its priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Candidate {
    pub kind: CandidateKind,
    pub addr: SocketAddr,
    pub priority: u32,
}

impl Candidate {
    pub fn new(kind: CandidateKind, addr: SocketAddr, local_preference: u16) -> Candidate {
        Candidate {
            kind,
            addr,
            priority: priority(kind, local_preference),
        }
    }

    pub fn to_endpoint(&self) -> Endpoint {
        Endpoint {
            address: self.addr.ip().to_string(),
            port: self.addr.port(),
            kind: self.kind.endpoint_type().to_string(),
            priority: i32::try_from(self.priority).unwrap_or(i32::MAX),
        }
    }

    /// A published endpoint back to a candidate. An endpoint without a priority (0 or negative,
    /// e.g. registered by hand) gets the recommended one of its type.
    pub fn from_endpoint(endpoint: &Endpoint) -> Result<Candidate, IceError> {
        let bad = |why: &str| IceError::BadEndpoint {
            endpoint: format!("{}:{} {}", endpoint.address, endpoint.port, endpoint.kind),
            why: why.to_string(),
        };
        let ip: IpAddr = endpoint
            .address
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| bad("address is not an IP address"))?;
        if endpoint.port == 0 {
            return Err(bad("port 0"));
        }
        let kind = CandidateKind::from_endpoint_type(&endpoint.kind)
            .ok_or_else(|| bad("type is not lan, srflx or relay"))?;
        let priority = u32::try_from(endpoint.priority)
            .ok()
            .filter(|p| *p > 0)
            .unwrap_or_else(|| priority(kind, u16::MAX));
        Ok(Candidate {
            kind,
            addr: SocketAddr::new(ip, endpoint.port),
            priority,
        })
    }
}

/// The spec's Mesh endpoint, field for field (the api crate's `MeshEndpointView` has the same
/// shape; this crate does not depend on it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    pub address: String,
    pub port: u16,
    /// `lan`, `srflx` or `relay`.
    pub kind: String,
    pub priority: i32,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn rfc_priorities() {
        assert_eq!(priority(CandidateKind::Host, 65535), 2130706431);
        assert_eq!(priority(CandidateKind::ServerReflexive, 65535), 1694498815);
        assert_eq!(priority(CandidateKind::Relayed, 65535), 16777215);
        assert!(priority(CandidateKind::Host, 0) > priority(CandidateKind::PeerReflexive, 65535));
        assert!(
            priority(CandidateKind::ServerReflexive, 0) > priority(CandidateKind::Relayed, 65535)
        );
        // Symmetric in G and D except for the tie-break bit.
        assert_eq!(pair_priority(5, 3), (1 << 32) * 3 + 2 * 5 + 1);
        assert_eq!(pair_priority(3, 5), (1 << 32) * 3 + 2 * 5);
    }

    #[test]
    fn endpoint_round_trip() {
        for kind in [
            CandidateKind::Host,
            CandidateKind::ServerReflexive,
            CandidateKind::Relayed,
        ] {
            let c = Candidate::new(kind, "[2001:db8::1]:51820".parse().unwrap(), 100);
            let e = c.to_endpoint();
            assert_eq!(Candidate::from_endpoint(&e).unwrap(), c);
        }
        let e = Candidate::new(CandidateKind::Host, "10.0.0.1:1".parse().unwrap(), 7).to_endpoint();
        assert_eq!((e.address.as_str(), e.kind.as_str()), ("10.0.0.1", "lan"));
    }

    #[test]
    fn bad_endpoints_are_errors() {
        let e = |address: &str, port, kind: &str, priority| Endpoint {
            address: address.into(),
            port,
            kind: kind.into(),
            priority,
        };
        assert!(Candidate::from_endpoint(&e("host.example", 1, "lan", 1)).is_err());
        assert!(Candidate::from_endpoint(&e("10.0.0.1", 0, "lan", 1)).is_err());
        assert!(Candidate::from_endpoint(&e("10.0.0.1", 1, "tcp", 1)).is_err());
        let c = Candidate::from_endpoint(&e("10.0.0.1", 1, "relay", -5)).unwrap();
        assert_eq!(c.priority, priority(CandidateKind::Relayed, u16::MAX));
    }
}
