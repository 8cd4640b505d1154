//! Listener address helpers shared by the control-plane servers.

use anyhow::Context as _;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use switchyard_config::ListenAddr;
use switchyard_dataplane::engine::ListenSpec;

pub fn parse(what: &str, s: &str) -> anyhow::Result<ListenAddr> {
    switchyard_config::parse_listen(s)
        .map_err(|e| anyhow::anyhow!("{what} listen address {s:?}: {}", e.reason))
}

pub fn spec(addr: &ListenAddr) -> ListenSpec {
    ListenSpec {
        ip: addr.host,
        port: addr.port,
    }
}

/// Binds a tokio listener; "all interfaces" is IPv6 dual-stack (IPv4 when IPv6 is unavailable).
pub fn bind_tokio(addr: &ListenAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let candidates: Vec<(SocketAddr, bool)> = match addr.host {
        Some(ip) => vec![(SocketAddr::new(ip, addr.port), false)],
        None => vec![
            (
                SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), addr.port),
                true,
            ),
            (
                SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), addr.port),
                false,
            ),
        ],
    };
    let mut last = None;
    for (sa, dual) in candidates {
        let attempt = (|| -> std::io::Result<tokio::net::TcpListener> {
            let socket = if sa.is_ipv6() {
                tokio::net::TcpSocket::new_v6()?
            } else {
                tokio::net::TcpSocket::new_v4()?
            };
            socket.set_reuseaddr(true)?;
            if dual {
                socket2::SockRef::from(&socket).set_only_v6(false)?;
            }
            socket.bind(sa)?;
            socket.listen(1024)
        })();
        match attempt {
            Ok(l) => return Ok(l),
            Err(e) => last = Some((sa, e)),
        }
    }
    let (sa, e) = last.context("no address to bind")?;
    Err(anyhow::anyhow!("cannot listen on {sa}: {e}"))
}
