//! SOCKS5 (RFC 1928) with no-auth or username/password (RFC 1929): CONNECT through the routed
//! backend, UDP ASSOCIATE relayed per datagram by its destination's route (`direct`, through an
//! `openvpn` backend's tunnel device, or inside a `wireguard` backend's tunnel), BIND refused
//! with "command not supported".

use crate::credentials::{Credential, Verdict};
use crate::engine::CoreContext;
use crate::events::Protocol;
use crate::snapshot::{BackendKind, Snapshot};
use crate::trace::Trace;
use crate::tunnel;
use glommio::net::{TcpStream, UdpSocket};
use std::cell::{Cell, RefCell};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use switchyard_proto::socks5::{self, Command, ReplyCode, Socks5Error, TargetAddr};

async fn read_msg<T>(
    client: &RefCell<TcpStream>,
    carry: &mut Vec<u8>,
    parse: impl Fn(&[u8]) -> Result<Option<(T, usize)>, Socks5Error>,
) -> Result<Option<T>, Socks5Error> {
    loop {
        if !carry.is_empty() {
            if let Some((v, used)) = parse(carry)? {
                carry.drain(..used);
                return Ok(Some(v));
            }
            if carry.len() > 1024 {
                return Err(Socks5Error::Malformed("message too long".into()));
            }
        }
        match tunnel::read_pooled(client).await {
            Ok((buf, 0)) => {
                crate::buffer_pool::give(buf);
                return Ok(None);
            }
            Ok((buf, n)) => {
                carry.extend_from_slice(&buf[..n]);
                crate::buffer_pool::give(buf);
            }
            Err(_) => return Ok(None),
        }
    }
}

fn unspecified() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
}

async fn send_reply(client: &RefCell<TcpStream>, code: ReplyCode, bound: SocketAddr) -> bool {
    let mut out = Vec::with_capacity(22);
    socks5::encode_reply(code, bound, &mut out);
    tunnel::write_all(client, &out).await.is_ok()
}

pub(crate) async fn serve(stream: TcpStream, peer: SocketAddr, ctx: Rc<CoreContext>) {
    let snapshot = ctx.current_snapshot();
    let client = RefCell::new(stream);
    let handshake = async {
        let mut carry = Vec::new();
        let greeting = match read_msg(&client, &mut carry, socks5::parse_greeting).await {
            Ok(Some(g)) => g,
            // Not SOCKS5 (or garbage): close without a reply, as the RFC leaves no other option.
            _ => return None,
        };
        let need_auth = snapshot.requires_auth();
        let wanted = if need_auth { 2u8 } else { 0u8 };
        if !greeting.methods.contains(&wanted) {
            let _ = tunnel::write_all(&client, &socks5::encode_method_selection(0xFF)).await;
            return None;
        }
        tunnel::write_all(&client, &socks5::encode_method_selection(wanted))
            .await
            .ok()?;
        if need_auth {
            let creds = read_msg(&client, &mut carry, socks5::parse_userpass)
                .await
                .ok()??;
            let client_ip = crate::access_control::canonical(peer.ip());
            let credential = Credential::Basic {
                user: creds.username.clone(),
                password: creds.password,
            };
            // Negotiate alone cannot check a user name and password: refused.
            let verdict = match &snapshot.auth {
                Some(auth) => {
                    auth.verify(&snapshot.auth_guard, &ctx.offload, client_ip, &credential)
                        .await
                }
                None => Verdict::Rejected,
            };
            let ok = verdict == Verdict::Accepted;
            let _ = tunnel::write_all(&client, &socks5::encode_userpass_status(ok)).await;
            if !ok {
                tracing::debug!(client = %peer, user = %creds.username, ?verdict, "SOCKS5 authentication failed");
                return None;
            }
        }
        match read_msg(&client, &mut carry, socks5::parse_request).await {
            Ok(Some(req)) => Some((req, carry)),
            Ok(None) => None,
            Err(e) => {
                send_reply(&client, e.reply_code(), unspecified()).await;
                None
            }
        }
    };
    let timeout = snapshot.timeouts.header;
    let negotiated = futures_lite::future::or(handshake, async {
        glommio::timer::sleep(timeout).await;
        None
    })
    .await;
    let Some((request, carry)) = negotiated else {
        return;
    };
    match request.command {
        Command::Connect => connect(&ctx, &snapshot, client, carry, peer, request.addr).await,
        Command::UdpAssociate => udp_associate(&ctx, &snapshot, client, peer).await,
        Command::Bind => {
            send_reply(&client, ReplyCode::CommandNotSupported, unspecified()).await;
        }
    }
}

fn split_target(addr: &TargetAddr) -> (String, u16) {
    match addr {
        TargetAddr::Ip(sa) => (sa.ip().to_string(), sa.port()),
        TargetAddr::Domain(h, p) => (h.clone(), *p),
    }
}

// Rc<Arc<_>>: the core's per-connection snapshot handle (see `CoreContext::current_snapshot`).
#[allow(clippy::redundant_allocation)]
async fn connect(
    ctx: &Rc<CoreContext>,
    snapshot: &Rc<std::sync::Arc<Snapshot>>,
    client: RefCell<TcpStream>,
    carry: Vec<u8>,
    peer: SocketAddr,
    addr: TargetAddr,
) {
    let client_ip = crate::access_control::canonical(peer.ip());
    let (host, port) = split_target(&addr);
    let label = addr.to_string();
    let mut trace = Trace::new(Protocol::Socks5, "CONNECT");
    // the request log's url is the same label, copied only when a record is written
    trace.host = label.clone();
    let Some((_, backend)) = snapshot.select(&host) else {
        send_reply(&client, ReplyCode::NotAllowed, unspecified()).await;
        trace.fail(403, format!("no route for {host}"));
        trace.finish(ctx, snapshot, client_ip);
        return;
    };
    // borrowed from the snapshot this connection holds: no count shared by all cores to bump
    trace.backend = backend.name.clone();
    let connected = match crate::proxied::dial(ctx, snapshot, backend, &host, port).await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(client = %peer, %host, port, error = %e, "SOCKS5 connect failed");
            send_reply(&client, e.socks5_reply(), unspecified()).await;
            trace.fail(e.http_status().0, e.to_string());
            trace.finish(ctx, snapshot, client_ip);
            return;
        }
    };
    let bound = connected
        .stream
        .local_addr()
        .unwrap_or_else(|_| unspecified());
    if !send_reply(&client, ReplyCode::Succeeded, bound).await {
        return;
    }
    trace.status = 200;
    let backend = crate::proxied::TunnelBackend::of(snapshot, backend);
    crate::proxied::spawn_tunnel(
        ctx,
        snapshot,
        client,
        connected,
        carry,
        peer,
        Protocol::Socks5,
        label,
        backend,
        trace,
    );
}

/// Where a datagram of a UDP association leaves, decided from the route its destination matched.
#[derive(Debug, PartialEq)]
enum UdpEgress {
    /// From a socket on the host's unspecified address (the host's routing).
    Direct,
    /// From a socket bound to the OpenVPN backend's tunnel device.
    Openvpn(crate::snapshot::LinkRef),
    /// From a UDP port inside the WireGuard tunnel (a smoltcp socket on its owner core).
    Wireguard(crate::snapshot::TunnelRef),
    /// As QUIC datagrams of the connection to a switchyard server (client role).
    Quic(crate::snapshot::QuicRef),
    /// Dropped: the backend cannot carry UDP (proxies speak TCP only).
    Unsupported,
}

fn udp_egress(kind: &BackendKind) -> UdpEgress {
    match kind {
        BackendKind::Direct => UdpEgress::Direct,
        BackendKind::Openvpn(link) => UdpEgress::Openvpn(link.clone()),
        BackendKind::Wireguard(tunnel) => UdpEgress::Wireguard(tunnel.clone()),
        BackendKind::Quic(server) => UdpEgress::Quic(server.clone()),
        _ => UdpEgress::Unsupported,
    }
}

/// What an egress socket of an association sends through.
#[derive(Debug, PartialEq)]
enum EgressKey {
    /// The host's routing, from an unspecified address of one family.
    Direct { ipv6: bool },
    /// An OpenVPN tunnel device.
    Device(String),
    /// A WireGuard backend's tunnel, by backend name.
    Wireguard(String),
    /// A QUIC server backend's connection, by backend name.
    Quic(String),
}

/// Where an association's datagrams for one egress go out.
enum Egress {
    Socket(UdpSocket),
    Tunnel(crate::wireguard::DatagramPort),
}

impl Egress {
    async fn send(&self, payload: &[u8], to: SocketAddr) {
        match self {
            Egress::Socket(socket) => {
                let _ = socket.send_to(payload, to).await;
            }
            Egress::Tunnel(port) => {
                port.send(to, payload.to_vec());
            }
        }
    }

    async fn recv(&self, buf: &mut Vec<u8>) -> Option<(usize, SocketAddr)> {
        match self {
            Egress::Socket(socket) => socket.recv_from(buf).await.ok(),
            Egress::Tunnel(port) => {
                let (from, datagram) = port.recv().await?;
                buf.clear();
                buf.extend_from_slice(&datagram);
                Some((datagram.len(), from))
            }
        }
    }
}

/// Egress sockets one association may open (both direct families and a few tunnels).
const MAX_EGRESS_SOCKETS: usize = 8;

/// A socket sending an association's datagrams to their destinations, and the task relaying
/// the replies to the client (cancelled when dropped, i.e. when the association ends). The
/// relay socket itself only talks to the client: it may be bound to an address (loopback)
/// that cannot reach the destination.
struct EgressSocket {
    key: EgressKey,
    socket: Rc<Egress>,
    _replies: glommio::Task<()>,
}

/// Wraps a datagram from `from` in the RFC 1928 UDP header and sends it to the client.
async fn send_to_client(
    relay: &UdpSocket,
    client: SocketAddr,
    from: SocketAddr,
    datagram: &[u8],
    out: &mut Vec<u8>,
) -> bool {
    out.clear();
    socks5::encode_udp_header(&TargetAddr::Ip(from), out);
    out.extend_from_slice(datagram);
    relay.send_to(out, client).await.is_ok()
}

async fn open_egress(
    key: &EgressKey,
    tunnel: Option<&crate::wireguard::WireguardBackend>,
    quic: Option<&crate::quic::QuicBackend>,
) -> Result<Egress, crate::error::DataplaneError> {
    if let (EgressKey::Quic(_), Some(server)) = (key, quic) {
        return Ok(Egress::Tunnel(server.open_datagrams().await?));
    }
    let io = |e: std::io::Error| crate::error::DataplaneError::Tunnel {
        backend: format!("{key:?}"),
        reason: e.to_string(),
    };
    match (key, tunnel) {
        (EgressKey::Direct { ipv6 }, _) => {
            let any = if *ipv6 {
                IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
            } else {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            };
            let socket = UdpSocket::bind(SocketAddr::new(any, 0))
                .map_err(|e| io(std::io::Error::from(e)))?;
            Ok(Egress::Socket(socket))
        }
        (EgressKey::Device(device), _) => crate::openvpn::udp_bound(device)
            .map(Egress::Socket)
            .map_err(io),
        (EgressKey::Wireguard(_), Some(tunnel)) => {
            Ok(Egress::Tunnel(tunnel.open_datagrams().await?))
        }
        (EgressKey::Wireguard(name) | EgressKey::Quic(name), _) => {
            Err(crate::error::DataplaneError::Tunnel {
                backend: name.clone(),
                reason: "no tunnel".into(),
            })
        }
    }
}

/// The association's egress socket for `key`, opened (with its reply task) on first use.
#[allow(clippy::too_many_arguments)]
async fn egress_socket(
    ctx: &CoreContext,
    sockets: &RefCell<Vec<EgressSocket>>,
    key: EgressKey,
    tunnel: Option<&crate::wireguard::WireguardBackend>,
    quic: Option<&crate::quic::QuicBackend>,
    relay: &Rc<UdpSocket>,
    client_udp: &Rc<Cell<Option<SocketAddr>>>,
    live: &AssociationEntry,
) -> Option<Rc<Egress>> {
    if let Some(e) = sockets.borrow().iter().find(|e| e.key == key) {
        return Some(e.socket.clone());
    }
    if sockets.borrow().len() >= MAX_EGRESS_SOCKETS {
        return None;
    }
    let socket = match open_egress(&key, tunnel, quic).await {
        Ok(s) => Rc::new(s),
        Err(e) => {
            tracing::debug!(?key, error = %e, "SOCKS5 UDP egress socket failed");
            return None;
        }
    };
    let replies = {
        let (socket, relay, client_udp) = (socket.clone(), relay.clone(), client_udp.clone());
        let live = live.clone();
        let counters = ctx.counters.clone();
        let core = ctx.core;
        glommio::spawn_local(async move {
            let mut buf = vec![0u8; 65_536];
            let mut out = Vec::with_capacity(65_600);
            while let Some((n, from)) = socket.recv(&mut buf).await {
                let Some(client) = client_udp.get() else {
                    continue;
                };
                if send_to_client(&relay, client, from, &buf[..n], &mut out).await {
                    counters.core(core).add_sent(n as u64);
                    if let Some(entry) = live.borrow().as_ref() {
                        entry.add_sent(n as u64);
                    }
                }
            }
        })
    };
    sockets.borrow_mut().push(EgressSocket {
        key,
        socket: socket.clone(),
        _replies: replies,
    });
    Some(socket)
}

/// The live-table entry of an association (connections API), shared with its reply tasks; set
/// when its first datagram is relayed (named after that datagram's destination).
type AssociationEntry = Rc<RefCell<Option<Arc<crate::live::LiveConnection>>>>;

/// UDP ASSOCIATE: one relay socket per association, alive while the control connection is.
/// Each datagram is routed by its destination: `direct` routes leave from a host socket,
/// `openvpn` routes from a socket bound to the tunnel device, `wireguard` routes from a UDP
/// port inside the tunnel; other backends (proxies) drop it. The relay socket only talks to
/// the client; replies come back on the egress sockets.
async fn udp_associate(
    ctx: &CoreContext,
    snapshot: &Snapshot,
    client: RefCell<TcpStream>,
    peer: SocketAddr,
) {
    let local_ip = client
        .borrow()
        .local_addr()
        .map(|a| a.ip())
        .ok()
        .or(ctx.socks5_ip);
    let Some(local_ip) = local_ip else {
        send_reply(&client, ReplyCode::GeneralFailure, unspecified()).await;
        return;
    };
    let relay = match UdpSocket::bind(SocketAddr::new(local_ip, 0)) {
        Ok(s) => Rc::new(s),
        Err(e) => {
            tracing::warn!(error = %e, "SOCKS5 UDP relay bind failed");
            send_reply(&client, ReplyCode::GeneralFailure, unspecified()).await;
            return;
        }
    };
    let Ok(relay_addr) = relay.local_addr() else {
        send_reply(&client, ReplyCode::GeneralFailure, unspecified()).await;
        return;
    };
    if !send_reply(&client, ReplyCode::Succeeded, relay_addr).await {
        return;
    }
    let client_ip = peer.ip();
    // The client's UDP source is learned from its first datagram (it must come from the
    // control connection's address).
    let client_udp: Rc<Cell<Option<SocketAddr>>> = Rc::new(Cell::new(None));
    let sockets: RefCell<Vec<EgressSocket>> = RefCell::new(Vec::new());
    let idle = snapshot.timeouts.idle;
    let live: AssociationEntry = Rc::new(RefCell::new(None));
    let pump = async {
        let mut registered = None;
        let mut buf = vec![0u8; 65_536];
        loop {
            let Ok((n, from)) = relay.recv_from(&mut buf).await else {
                return;
            };
            let datagram = &buf[..n];
            if from.ip() == client_ip && client_udp.get().is_none_or(|c| c == from) {
                client_udp.set(Some(from));
                let Ok(header) = socks5::parse_udp_header(datagram) else {
                    continue;
                };
                if header.frag != 0 {
                    continue; // fragmentation is optional (RFC 1928 §7); dropped
                }
                let (host, port) = split_target(&header.addr);
                let egress = match snapshot.select(&host) {
                    Some((_, b)) => {
                        if registered.is_none() {
                            let entry = crate::proxied::Registered::new(
                                ctx,
                                peer,
                                header.addr.to_string(),
                                b.name.clone(),
                                Protocol::Socks5,
                            );
                            *live.borrow_mut() = Some(entry.shared());
                            registered = Some(entry);
                        }
                        match &b.kind {
                            BackendKind::Wireguard(tunnel) => {
                                tunnel.0.ensure_started(ctx, &b.health)
                            }
                            BackendKind::Quic(server) => server.0.ensure_started(ctx, &b.health),
                            _ => {}
                        }
                        udp_egress(&b.kind)
                    }
                    None => UdpEgress::Unsupported,
                };
                let mut tunnel = None;
                let mut quic = None;
                let device = match egress {
                    UdpEgress::Direct => None,
                    UdpEgress::Openvpn(link) => match link.0.current() {
                        Some(up) => Some(EgressKey::Device(up.device.clone())),
                        None => {
                            tracing::debug!(%host, "SOCKS5 UDP datagram dropped: tunnel is down");
                            continue;
                        }
                    },
                    UdpEgress::Wireguard(t) => {
                        let key = EgressKey::Wireguard(t.0.name.clone());
                        tunnel = Some(t);
                        Some(key)
                    }
                    UdpEgress::Quic(server) => {
                        let key = EgressKey::Quic(server.0.name.clone());
                        quic = Some(server);
                        Some(key)
                    }
                    UdpEgress::Unsupported => {
                        tracing::debug!(%host, "SOCKS5 UDP datagram dropped: route cannot carry UDP");
                        continue;
                    }
                };
                let Ok(addrs) = ctx.resolver.resolve(&ctx.offload, &host, port).await else {
                    continue;
                };
                let (dest, key) = match (device, &tunnel) {
                    // the server resolves again; any address of the name will do
                    (Some(key @ EgressKey::Quic(_)), _) => (addrs.first(), key),
                    (Some(key), Some(t)) => (addrs.iter().find(|a| t.0.carries(a.ip())), key),
                    // OpenVPN carries IPv4 only (the address the server assigned).
                    (Some(key), None) => (addrs.iter().find(|a| a.is_ipv4()), key),
                    (None, _) => {
                        let dest = addrs
                            .iter()
                            .find(|a| a.is_ipv4() == local_ip.is_ipv4())
                            .or(addrs.first());
                        let ipv6 = dest.is_some_and(SocketAddr::is_ipv6);
                        (dest, EgressKey::Direct { ipv6 })
                    }
                };
                let Some(dest) = dest else {
                    continue;
                };
                let tunnel = tunnel.as_ref().map(|t| &*t.0);
                let quic = quic.as_ref().map(|q| &*q.0);
                let Some(socket) =
                    egress_socket(ctx, &sockets, key, tunnel, quic, &relay, &client_udp, &live)
                        .await
                else {
                    continue;
                };
                let payload = datagram.get(header.header_len..).unwrap_or_default();
                socket.send(payload, *dest).await;
                ctx.counters
                    .core(ctx.core)
                    .add_received(payload.len() as u64);
                if let Some(entry) = live.borrow().as_ref() {
                    entry.add_recv(payload.len() as u64);
                }
            }
        }
    };
    // The association ends when the TCP control connection closes (or idles out).
    let control = async {
        loop {
            match futures_lite::future::or(
                async { Some(tunnel::read_pooled(&client).await) },
                async {
                    glommio::timer::sleep(idle.max(Duration::from_secs(1))).await;
                    None
                },
            )
            .await
            {
                Some(Ok((buf, n))) => {
                    crate::buffer_pool::give(buf);
                    if n == 0 {
                        return;
                    }
                }
                _ => return,
            }
        }
    };
    futures_lite::future::or(pump, control).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::LinkRef;
    use std::sync::Arc;

    #[test]
    fn datagrams_leave_by_the_route_kind() {
        assert_eq!(udp_egress(&BackendKind::Direct), UdpEgress::Direct);
        let link = LinkRef(Arc::new(crate::openvpn::OpenvpnLink::new("vpn")));
        match udp_egress(&BackendKind::Openvpn(link.clone())) {
            UdpEgress::Openvpn(l) => assert!(Arc::ptr_eq(&l.0, &link.0)),
            other => panic!("{other:?}"),
        }
        let proxy = BackendKind::HttpProxy {
            host: "127.0.0.1".into(),
            port: 3128,
            authorization: None,
        };
        assert_eq!(udp_egress(&proxy), UdpEgress::Unsupported);
        let socks = BackendKind::Socks5 {
            host: "127.0.0.1".into(),
            port: 1080,
            credentials: None,
        };
        assert_eq!(udp_egress(&socks), UdpEgress::Unsupported);
    }
}
