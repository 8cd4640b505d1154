//! Errors of the data plane, classified by whose fault they are so each maps to one reply.

use std::io;

/// Which side a failure belongs to; decides the status code and whether a retry can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The proxy client sent something wrong.
    Client,
    /// The origin or upstream proxy failed (refused, unreachable, bad reply).
    Upstream,
    /// Our own limits or an internal failure.
    Internal,
}

#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error("cannot resolve host {host}: {reason}")]
    Resolve { host: String, reason: String },
    #[error("connection to {target} refused")]
    Refused { target: String },
    #[error("cannot reach {target}: {source}")]
    Connect { target: String, source: io::Error },
    #[error("connection to {target} timed out")]
    ConnectTimeout { target: String },
    #[error("upstream proxy {proxy} failed: {reason}")]
    UpstreamProxy {
        proxy: String,
        reason: String,
        refused: bool,
    },
    /// The upstream proxy reached the destination's host, which refused the connection (SOCKS5
    /// reply 5, `Proxy-Status: connection_refused`, a QUIC server's `refused`): the proxy works.
    #[error("upstream proxy {proxy}: connection to {target} refused")]
    OriginRefused { proxy: String, target: String },
    /// The upstream proxy says the destination cannot be reached (SOCKS5 replies 3 and 4,
    /// `Proxy-Status: destination_ip_unroutable`): the proxy works.
    #[error("upstream proxy {proxy}: {target} is unreachable")]
    Unreachable { proxy: String, target: String },
    #[error("WireGuard backend {backend}: {reason}")]
    Tunnel { backend: String, reason: String },
    #[error("QUIC server {server}: {reason}")]
    Quic {
        server: String,
        reason: String,
        /// The handshake got no answer (UDP blocked?): a fallback may carry the flow.
        unanswered: bool,
    },
    #[error("OpenVPN backend {backend}: {reason}")]
    Openvpn { backend: String, reason: String },
    /// A blocked backend refused the connection (the client's kill switch); the message is
    /// what the proxy client reads: `blocked: not connected`.
    #[error("blocked: {0}")]
    Blocked(&'static str),
    #[error("backend {0} is not available in this build")]
    BackendUnavailable(String),
    #[error("no route for {0}")]
    NoRoute(String),
    #[error("overloaded: {0}")]
    Overloaded(&'static str),
    #[error("failed to start data plane: {0}")]
    Start(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl DataplaneError {
    pub fn side(&self) -> Side {
        match self {
            Self::Resolve { .. }
            | Self::Refused { .. }
            | Self::Connect { .. }
            | Self::ConnectTimeout { .. }
            | Self::UpstreamProxy { .. }
            | Self::OriginRefused { .. }
            | Self::Unreachable { .. }
            | Self::Tunnel { .. }
            | Self::Quic { .. }
            | Self::Openvpn { .. } => Side::Upstream,
            Self::BackendUnavailable(_)
            | Self::NoRoute(_)
            | Self::Overloaded(_)
            | Self::Blocked(_) => Side::Internal,
            Self::Start(_) | Self::Io(_) => Side::Internal,
        }
    }

    /// Whether trying again later (or another address) could succeed.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            Self::ConnectTimeout { .. } | Self::Overloaded(_) | Self::Connect { .. }
        )
    }

    /// HTTP status for a proxy client.
    pub fn http_status(&self) -> (u16, &'static str) {
        match self {
            Self::ConnectTimeout { .. } => (504, "Gateway Timeout"),
            Self::Overloaded(_) | Self::BackendUnavailable(_) | Self::Blocked(_) => {
                (503, "Service Unavailable")
            }
            Self::NoRoute(_) => (502, "Bad Gateway"),
            _ => (502, "Bad Gateway"),
        }
    }

    /// The RFC 9209 `Proxy-Status` error type an HTTP proxy reports this failure with, when
    /// the failure is the destination's (a client behind the proxy tells a refusing host from
    /// an unreachable one by it, see `connector::http_connect`).
    pub fn proxy_status(&self) -> Option<&'static str> {
        match self {
            Self::Refused { .. } | Self::OriginRefused { .. } => Some("connection_refused"),
            Self::Unreachable { .. } => Some("destination_ip_unroutable"),
            Self::Connect { source, .. } if is_unreachable(source) => {
                Some("destination_ip_unroutable")
            }
            Self::ConnectTimeout { .. } => Some("connection_timeout"),
            Self::Resolve { .. } => Some("dns_error"),
            _ => None,
        }
    }

    /// SOCKS5 reply code (RFC 1928 §6).
    pub fn socks5_reply(&self) -> switchyard_proto::socks5::ReplyCode {
        use switchyard_proto::socks5::ReplyCode;
        match self {
            Self::Refused { .. } => ReplyCode::ConnectionRefused,
            Self::UpstreamProxy { refused: true, .. } | Self::OriginRefused { .. } => {
                ReplyCode::ConnectionRefused
            }
            Self::Unreachable { .. } => ReplyCode::HostUnreachable,
            Self::Resolve { .. } => ReplyCode::HostUnreachable,
            Self::ConnectTimeout { .. } => ReplyCode::TtlExpired,
            Self::Connect { source, .. } => match source.raw_os_error() {
                Some(libc::ENETUNREACH) => ReplyCode::NetworkUnreachable,
                Some(libc::EHOSTUNREACH) => ReplyCode::HostUnreachable,
                Some(libc::ECONNREFUSED) => ReplyCode::ConnectionRefused,
                _ => ReplyCode::HostUnreachable,
            },
            Self::NoRoute(_) | Self::Blocked(_) => ReplyCode::NotAllowed,
            _ => ReplyCode::GeneralFailure,
        }
    }
}

/// Whether a connect failed because the host or its network cannot be reached.
pub(crate) fn is_unreachable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENETUNREACH | libc::EHOSTUNREACH)
    ) || matches!(
        e.kind(),
        io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable
    )
}
