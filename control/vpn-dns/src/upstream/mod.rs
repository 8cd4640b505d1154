//! Where queries the cache cannot answer go: through the tunnel (DNS over TCP via the selected
//! switchyard server's proxy) or directly (UDP, TCP when truncated) from sockets that may carry
//! the tunnel's mark.
//!
//! These sockets belong to the client process. The client runs in a bypass cgroup of the split
//! tunnel, so the DNS redirect never applies to them (otherwise a forwarded query would come
//! straight back to this resolver).

pub mod proxy;
pub mod tcp;
pub mod udp;

use std::net::SocketAddr;

use hickory_proto::op::{Message, Query, ResponseCode};
use tokio::net::{TcpSocket, TcpStream};

use crate::message::ReplyMismatch;

/// The proxy protocol of the switchyard server used as the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyProtocol {
    /// HTTP CONNECT (Basic proxy authentication).
    Http,
    /// SOCKS5 CONNECT (username/password, RFC 1929).
    Socks5,
}

/// How the resolver reaches the upstream servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    /// "Through the tunnel": DNS over TCP (RFC 7766, connection reuse, pipelined) through the
    /// selected switchyard server's proxy — HTTP CONNECT or SOCKS5 with its credentials.
    Proxy {
        /// `host:port` of the proxy listener.
        address: String,
        protocol: ProxyProtocol,
        username: Option<String>,
        password: Option<String>,
    },
    /// Plain UDP (TCP on truncation) from sockets carrying SO_MARK `mark` (e.g. the VPN's
    /// tunnel mark so policy routing sends them into the TUN) — or no mark.
    Direct { mark: Option<u32> },
}

/// Why one upstream attempt failed (the resolver then tries the next server).
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("no answer within the timeout")]
    Timeout,
    #[error("proxy: {0}")]
    Proxy(String),
    #[error("connection closed before the answer")]
    Closed,
    #[error("too many queries outstanding on one connection")]
    Busy,
    #[error("query could not be encoded: {0}")]
    Encode(String),
    #[error("bad reply: {0}")]
    BadReply(#[from] ReplyMismatch),
    #[error("server answered {0}")]
    Rcode(ResponseCode),
    #[error("no upstream servers configured")]
    NoServers,
}

/// Sends queries over one [`Upstream`]; holds its reusable TCP connections, so a new upstream
/// (server switched) gets a new `Exchanger` and the old connections close with the old one.
pub struct Exchanger {
    upstream: Upstream,
    pool: tcp::Pool,
}

impl Exchanger {
    pub fn new(upstream: Upstream) -> Self {
        Exchanger {
            upstream,
            pool: tcp::Pool::default(),
        }
    }

    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// One attempt at `server` (unbounded in time; the caller applies the timeout).
    pub async fn exchange(
        &self,
        server: SocketAddr,
        query: &Query,
    ) -> Result<Message, UpstreamError> {
        match &self.upstream {
            Upstream::Direct { mark } => {
                let reply = udp::exchange(server, *mark, query).await?;
                if !reply.truncated() {
                    return Ok(reply);
                }
                self.pool
                    .exchange(server, query, || direct_tcp(server, *mark))
                    .await
            }
            Upstream::Proxy { .. } => {
                self.pool
                    .exchange(server, query, || self.through_proxy(server))
                    .await
            }
        }
    }

    async fn through_proxy(&self, server: SocketAddr) -> Result<TcpStream, UpstreamError> {
        let Upstream::Proxy {
            address,
            protocol,
            username,
            password,
        } = &self.upstream
        else {
            return Err(UpstreamError::Proxy("not a proxy upstream".into()));
        };
        let mut stream = TcpStream::connect(address.as_str()).await?;
        let credentials = match (username, password) {
            (Some(username), password) => Some(proxy::Credentials {
                username,
                password: password.as_deref().unwrap_or_default(),
            }),
            (None, _) => None,
        };
        match protocol {
            ProxyProtocol::Http => proxy::http_connect(&mut stream, server, credentials).await?,
            ProxyProtocol::Socks5 => {
                proxy::socks5_connect(&mut stream, server, credentials).await?
            }
        }
        Ok(stream)
    }
}

/// A TCP connection to `server` from a socket carrying `mark`.
async fn direct_tcp(server: SocketAddr, mark: Option<u32>) -> Result<TcpStream, UpstreamError> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(server),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    if let Some(mark) = mark {
        socket.set_mark(mark)?;
    }
    socket.set_nonblocking(true)?;
    let socket = TcpSocket::from_std_stream(socket.into());
    Ok(socket.connect(server).await?)
}
