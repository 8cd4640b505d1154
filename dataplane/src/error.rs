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
            | Self::Tunnel { .. }
            | Self::Quic { .. }
            | Self::Openvpn { .. } => Side::Upstream,
            Self::BackendUnavailable(_) | Self::NoRoute(_) | Self::Overloaded(_) => Side::Internal,
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
            Self::Overloaded(_) | Self::BackendUnavailable(_) => (503, "Service Unavailable"),
            Self::NoRoute(_) => (502, "Bad Gateway"),
            _ => (502, "Bad Gateway"),
        }
    }

    /// SOCKS5 reply code (RFC 1928 §6).
    pub fn socks5_reply(&self) -> switchyard_proto::socks5::ReplyCode {
        use switchyard_proto::socks5::ReplyCode;
        match self {
            Self::Refused { .. } => ReplyCode::ConnectionRefused,
            Self::UpstreamProxy { refused: true, .. } => ReplyCode::ConnectionRefused,
            Self::Resolve { .. } => ReplyCode::HostUnreachable,
            Self::ConnectTimeout { .. } => ReplyCode::TtlExpired,
            Self::Connect { source, .. } => match source.raw_os_error() {
                Some(libc::ENETUNREACH) => ReplyCode::NetworkUnreachable,
                Some(libc::EHOSTUNREACH) => ReplyCode::HostUnreachable,
                Some(libc::ECONNREFUSED) => ReplyCode::ConnectionRefused,
                _ => ReplyCode::HostUnreachable,
            },
            Self::NoRoute(_) => ReplyCode::NotAllowed,
            _ => ReplyCode::GeneralFailure,
        }
    }
}
