//! Which new QUIC connections the server takes, as a plain decision over what the endpoint
//! already holds. A QUIC Initial can come from a forged source address, and each accepted one
//! costs a TLS handshake and connection state: so beyond a small number of handshakes in
//! progress, an Initial whose address is not yet validated is answered with a Retry (a
//! stateless token the client must echo from its real address, RFC 9000 §8.1), and connections
//! are capped per server and per client address (only validated or under-budget ones get that
//! far, so a forged flood cannot fill another address's share).

/// `server.quic.max_connections` and `max_connections_per_client`, and the handshakes in
/// progress beyond which unvalidated Initials get a Retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    pub max_connections: usize,
    pub max_per_client: usize,
    pub unvalidated_handshakes: usize,
}

/// Handshakes in progress from unvalidated addresses before every further Initial must prove
/// its address with a Retry round trip first: enough for a burst of real clients to connect in
/// one round trip, few enough that a forged flood costs a handful of TLS handshakes at a time.
pub const UNVALIDATED_HANDSHAKES: usize = 16;

/// What the endpoint holds when an Initial arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    /// Connections of the endpoint (any state).
    pub total: usize,
    /// Of them, from the Initial's IP address.
    pub from_client: usize,
    /// Of them, still handshaking.
    pub handshaking: usize,
    /// The Initial carried a valid Retry token: its address is proven.
    pub validated: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Accept,
    /// Answer with a Retry packet (no state, no TLS).
    Retry,
    /// Refuse with CONNECTION_REFUSED; the reason is logged and counted.
    Refuse(&'static str),
}

pub fn decide(holding: &Holding, limits: &AdmissionLimits) -> Admission {
    if !holding.validated && holding.handshaking >= limits.unvalidated_handshakes {
        return Admission::Retry;
    }
    if holding.total >= limits.max_connections {
        return Admission::Refuse("server.quic.max_connections reached");
    }
    if holding.from_client >= limits.max_per_client {
        return Admission::Refuse("server.quic.max_connections_per_client reached");
    }
    Admission::Accept
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: AdmissionLimits = AdmissionLimits {
        max_connections: 100,
        max_per_client: 4,
        unvalidated_handshakes: 16,
    };

    fn holding(total: usize, from_client: usize, handshaking: usize, validated: bool) -> Holding {
        Holding {
            total,
            from_client,
            handshaking,
            validated,
        }
    }

    #[test]
    fn quiet_endpoint_accepts_at_once() {
        assert_eq!(decide(&holding(0, 0, 0, false), &LIMITS), Admission::Accept);
        assert_eq!(
            decide(&holding(50, 3, 15, false), &LIMITS),
            Admission::Accept
        );
    }

    #[test]
    fn many_handshakes_in_progress_make_unvalidated_initials_retry() {
        assert_eq!(
            decide(&holding(16, 0, 16, false), &LIMITS),
            Admission::Retry
        );
        // the same client after echoing the token
        assert_eq!(
            decide(&holding(16, 0, 16, true), &LIMITS),
            Admission::Accept
        );
    }

    #[test]
    fn caps_refuse_even_validated_clients() {
        assert!(matches!(
            decide(&holding(100, 0, 0, true), &LIMITS),
            Admission::Refuse(r) if r.contains("max_connections reached")
        ));
        assert!(matches!(
            decide(&holding(10, 4, 0, true), &LIMITS),
            Admission::Refuse(r) if r.contains("per_client")
        ));
    }
}
