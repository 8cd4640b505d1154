//! `openvpn` backends on the data plane. The control plane runs the `openvpn` process and, while
//! its management interface says CONNECTED, publishes the tunnel's device and address in the
//! backend's [`OpenvpnLink`] (lock-free: a core only loads an `ArcSwapOption`). A proxied
//! connection through the backend is a kernel TCP socket bound to that device
//! (`SO_BINDTODEVICE`), so only switchyard's own sockets use the tunnel; the device's routing
//! table and rules (set by the control plane) give those sockets their route and source address.
//! Destination names are resolved by the host's resolver; only addresses of a family the tunnel
//! carries are tried.

use crate::connector::Dialer;
use crate::error::DataplaneError;
use arc_swap::ArcSwapOption;
use futures_lite::io::AsyncWriteExt;
use glommio::net::TcpStream;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

/// The tunnel while it is up: the device proxied sockets bind to and its IPv4 address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkUp {
    pub device: String,
    pub ipv4: Ipv4Addr,
}

/// One `openvpn` backend's tunnel as the data plane sees it. Shared across snapshots by name.
#[derive(Debug)]
pub struct OpenvpnLink {
    pub name: String,
    up: ArcSwapOption<LinkUp>,
}

impl OpenvpnLink {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            up: ArcSwapOption::empty(),
        }
    }

    /// Publishes the tunnel as up (`Some`) or down (`None`).
    pub fn set(&self, up: Option<LinkUp>) {
        self.up.store(up.map(Arc::new));
    }

    pub fn current(&self) -> Option<Arc<LinkUp>> {
        self.up.load_full()
    }

    /// Opens a TCP connection to `host:port` through the tunnel, within `deadline`.
    pub(crate) async fn open(
        &self,
        dialer: &Dialer<'_>,
        host: &str,
        port: u16,
        deadline: Instant,
    ) -> Result<TcpStream, DataplaneError> {
        let fail = |reason: String| DataplaneError::Openvpn {
            backend: self.name.clone(),
            reason,
        };
        let Some(link) = self.current() else {
            return Err(fail("the tunnel is not connected".into()));
        };
        let addrs = dialer.resolver.resolve(dialer.offload, host, port).await?;
        // The tunnel carries IPv4 (the address the server assigned); IPv6 destinations would
        // have no source address inside it.
        let usable: Vec<SocketAddr> = addrs.into_iter().filter(SocketAddr::is_ipv4).collect();
        if usable.is_empty() {
            return Err(fail(format!("{host} has no IPv4 address")));
        }
        let target = crate::http_proxy::host_port_label(host, port);
        let mut last = None;
        for addr in usable {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match connect_bound(addr, &link.device, left).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(match last {
            Some(e) => match e.kind() {
                io::ErrorKind::ConnectionRefused => DataplaneError::Refused { target },
                io::ErrorKind::TimedOut => DataplaneError::ConnectTimeout { target },
                _ => DataplaneError::Connect { target, source: e },
            },
            None => DataplaneError::ConnectTimeout { target },
        })
    }
}

/// A UDP socket (any IPv4 address, ephemeral port) whose datagrams leave through `device`:
/// the device's own routing table gives them the tunnel's source address.
pub(crate) fn udp_bound(device: &str) -> io::Result<glommio::net::UdpSocket> {
    let socket = Socket::new(Domain::IPV4, Type::DGRAM.nonblocking(), Some(Protocol::UDP))?;
    socket.bind_device(Some(device.as_bytes()))?;
    socket.bind(&SockAddr::from(SocketAddr::from((
        Ipv4Addr::UNSPECIFIED,
        0,
    ))))?;
    let std_socket: std::net::UdpSocket = socket.into();
    Ok(glommio::net::UdpSocket::from(socket2_04::Socket::from(
        std_socket,
    )))
}

/// A non-blocking TCP connect from a socket bound to `device`, completed on the glommio
/// reactor: a zero-length send waits (io_uring poll) until the handshake is done and then
/// returns the connect's outcome (`sk_stream_wait_connect`).
async fn connect_bound(
    addr: SocketAddr,
    device: &str,
    timeout: std::time::Duration,
) -> io::Result<TcpStream> {
    let socket = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking(),
        Some(Protocol::TCP),
    )?;
    socket.bind_device(Some(device.as_bytes()))?;
    match socket.connect(&SockAddr::from(addr)) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    let std_stream: std::net::TcpStream = socket.into();
    let mut stream = TcpStream::from(socket2_04::Socket::from(std_stream));
    let handshake = async { stream.write(&[]).await.map(|_| ()) };
    futures_lite::future::or(handshake, async {
        glommio::timer::sleep(timeout).await;
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "connection timed out",
        ))
    })
    .await?;
    Ok(stream)
}
