//! The QUIC transport between a switchyard client and server: one QUIC connection carries
//! every proxied flow of a client — each TCP flow is a bidirectional stream that starts with a
//! short header naming its target, each UDP flow is a series of QUIC datagrams (RFC 9221) —
//! so a flow costs no TCP handshake, flows do not block each other on loss, and the connection
//! survives a change of the client's address (QUIC connection migration).
//!
//! quinn-proto (sans-IO) is driven from glommio UDP sockets ([`driver`]); no second runtime
//! handles packets. One core owns an endpoint:
//! * server: core 0 runs the `server.quic.listen` endpoint and serves its flows
//!   ([`server`]). Spreading connections over every core would need each core's
//!   `SO_REUSEPORT` socket to receive the packets of its own connections: connection IDs that
//!   encode the core (a `ConnectionIdGenerator`) and an eBPF `SO_REUSEPORT` program that steers
//!   a packet by the ID (what quinn-based servers and QUIC load balancers do); until then
//!   one core does the QUIC work and dials, and the relays run there too.
//! * client: the first core that needs a `protocol: QUIC` server starts its connection and
//!   owns it ([`client`]); flows on every core reach it through bounded queues and the
//!   cross-core byte channels the WireGuard tunnels use, with the same heartbeat and
//!   take-over if the owner core dies.
//!
//! Security: the client pins the server certificate's SHA-256 fingerprint ([`tls`]); the
//! server admits a connection's flows only after its hello (stream 0) carried the configured
//! token or valid proxy credentials, and closes a refused connection with
//! [`switchyard_proto::quic_wire::CLOSE_AUTH_REFUSED`] and the reason.
//!
//! 0-RTT: a client that reconnects to a server it has a TLS session ticket for sends its hello
//! and the first stream headers in early data. Early data can be replayed by an attacker who
//! captured it, so what rides in it must be safe to repeat: a hello (authentication only) and
//! a stream header (open a TCP connection to host:port) are — a replay opens a connection that
//! the attacker cannot read (it has no 1-RTT keys) — but application bytes after the header
//! could be a non-idempotent request. quinn-proto sends stream data in 0-RTT whenever the
//! session allows it, so the client writes only the header before the server's answer (a flow
//! waits for the `Ok` reply before the application's first byte is sent: 1 RTT per flow).

pub mod admission;
pub mod client;
pub(crate) mod datagram_relay;
pub(crate) mod driver;
pub(crate) mod server;
pub mod tls;
pub(crate) mod udp;

pub use client::{QuicBackend, QuicSettings};

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Concurrent bidirectional streams (flows) a peer may open on one connection.
pub(crate) const MAX_STREAMS: u32 = 4096;
/// A connection with no packets for this long is gone (keep-alives keep idle ones open).
pub(crate) const IDLE_TIMEOUT_MS: u32 = 30_000;

/// What the QUIC listener has seen (API and metrics).
#[derive(Debug, Default)]
pub struct QuicStats {
    pub connections_total: AtomicU64,
    pub connections_active: AtomicU64,
    pub streams_total: AtomicU64,
    pub datagrams_in: AtomicU64,
    /// Connections closed because their hello was refused.
    pub refused: AtomicU64,
    /// Initials answered with a Retry (address not validated while many handshakes ran).
    pub retries: AtomicU64,
    /// New connections refused by `max_connections` / `max_connections_per_client`.
    pub refused_by_limits: AtomicU64,
    /// Streams reset because their connection had not authenticated and already had
    /// [`server::MAX_STREAMS_BEFORE_HELLO`] waiting.
    pub streams_refused_before_hello: AtomicU64,
}

/// The server's QUIC listener: its bound socket, TLS and client token.
pub struct QuicListener {
    pub(crate) socket: socket2::Socket,
    pub(crate) crypto: Arc<quinn_proto::crypto::rustls::QuicServerConfig>,
    pub(crate) token: Option<String>,
    pub local_addr: std::net::SocketAddr,
    /// SHA-256 of the certificate, as clients pin it.
    pub fingerprint: String,
    pub self_signed: bool,
    pub limits: admission::AdmissionLimits,
    pub stats: QuicStats,
}

impl std::fmt::Debug for QuicListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicListener")
            .field("local_addr", &self.local_addr)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// How the control plane asks for a QUIC listener.
pub struct QuicServerOptions {
    pub listen: crate::engine::ListenSpec,
    pub identity: tls::ServerIdentity,
    pub token: Option<String>,
    pub limits: admission::AdmissionLimits,
}

impl QuicListener {
    /// Binds the UDP socket (so a bind error reaches the caller) and builds the TLS config.
    pub fn bind(opts: QuicServerOptions) -> Result<Arc<Self>, crate::error::DataplaneError> {
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
        let fail = |e: String| crate::error::DataplaneError::Start(format!("QUIC listener: {e}"));
        let crypto = tls::server_config(&opts.identity).map_err(|e| fail(e.to_string()))?;
        let bind = |addr: SocketAddr, dual: bool| -> std::io::Result<socket2::Socket> {
            let s = socket2::Socket::new(
                socket2::Domain::for_address(addr),
                socket2::Type::DGRAM,
                Some(socket2::Protocol::UDP),
            )?;
            if dual {
                s.set_only_v6(false)?;
            }
            s.bind(&addr.into())?;
            Ok(s)
        };
        let spec = opts.listen;
        let socket = match spec.ip {
            Some(ip) => bind(SocketAddr::new(ip, spec.port), false),
            None => bind(
                SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), spec.port),
                true,
            )
            .or_else(|_| {
                bind(
                    SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), spec.port),
                    false,
                )
            }),
        }
        .map_err(|e| fail(format!("cannot bind UDP port {}: {e}", spec.port)))?;
        let local_addr = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .ok_or_else(|| fail("socket has no address".into()))?;
        Ok(Arc::new(Self {
            socket,
            crypto,
            token: opts.token.filter(|t| !t.is_empty()),
            local_addr,
            fingerprint: tls::format_fingerprint(&opts.identity.fingerprint),
            self_signed: opts.identity.self_signed,
            limits: opts.limits,
            stats: QuicStats::default(),
        }))
    }
}
