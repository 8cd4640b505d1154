//! SOCKS5 (RFC 1928) with no-auth or username/password (RFC 1929): CONNECT through the routed
//! backend, UDP ASSOCIATE relayed directly (only for destinations routed to a `direct`
//! backend), BIND refused with "command not supported".

use crate::credentials::Verdict;
use crate::engine::CoreContext;
use crate::events::Protocol;
use crate::snapshot::{BackendKind, Snapshot};
use crate::trace::Trace;
use crate::tunnel;
use glommio::net::{TcpStream, UdpSocket};
use std::cell::RefCell;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
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
    let snapshot = ctx.snapshot.load_full();
    let client = RefCell::new(stream);
    let handshake = async {
        let mut carry = Vec::new();
        let greeting = match read_msg(&client, &mut carry, socks5::parse_greeting).await {
            Ok(Some(g)) => g,
            // Not SOCKS5 (or garbage): close without a reply, as the RFC leaves no other option.
            _ => return None,
        };
        let need_auth = snapshot.users.is_some();
        let wanted = if need_auth { 2u8 } else { 0u8 };
        if !greeting.methods.contains(&wanted) {
            let _ = tunnel::write_all(&client, &socks5::encode_method_selection(0xFF)).await;
            return None;
        }
        tunnel::write_all(&client, &socks5::encode_method_selection(wanted))
            .await
            .ok()?;
        if let Some(users) = &snapshot.users {
            let creds = read_msg(&client, &mut carry, socks5::parse_userpass)
                .await
                .ok()??;
            let client_ip = crate::access_control::canonical(peer.ip());
            let verdict = users
                .verify(
                    &snapshot.auth_guard,
                    &ctx.offload,
                    client_ip,
                    &creds.username,
                    &creds.password,
                )
                .await;
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

async fn connect(
    ctx: &CoreContext,
    snapshot: &Snapshot,
    client: RefCell<TcpStream>,
    carry: Vec<u8>,
    peer: SocketAddr,
    addr: TargetAddr,
) {
    let client_ip = crate::access_control::canonical(peer.ip());
    let (host, port) = split_target(&addr);
    let label = addr.to_string();
    let mut trace = Trace::new(Protocol::Socks5, "CONNECT");
    trace.host = label.clone();
    trace.url = label.clone();
    let Some((_, backend)) = snapshot.select(&host) else {
        send_reply(&client, ReplyCode::NotAllowed, unspecified()).await;
        trace.fail(403, format!("no route for {host}"));
        trace.finish(ctx, snapshot, client_ip);
        return;
    };
    let backend = backend.clone();
    trace.backend = backend.name.clone();
    let connected = match crate::proxied::dial(ctx, snapshot, &backend, &host, port).await {
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
    crate::proxied::run_tunnel(
        ctx,
        snapshot,
        client,
        connected,
        carry,
        peer,
        Protocol::Socks5,
        &label,
        &backend,
        trace,
    )
    .await;
}

/// UDP ASSOCIATE: one relay socket per association, alive while the control connection is.
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
        Ok(s) => s,
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
    let client_udp: std::cell::Cell<Option<SocketAddr>> = std::cell::Cell::new(None);
    let idle = snapshot.timeouts.idle;
    let pump = async {
        let mut buf = vec![0u8; 65_536];
        let mut out = Vec::with_capacity(65_600);
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
                let direct = snapshot
                    .select(&host)
                    .is_some_and(|(_, b)| b.kind == BackendKind::Direct);
                if !direct {
                    tracing::debug!(%host, "SOCKS5 UDP datagram dropped: route is not direct");
                    continue;
                }
                let Ok(addrs) = ctx.resolver.resolve(&ctx.offload, &host, port).await else {
                    continue;
                };
                let Some(dest) = addrs
                    .iter()
                    .find(|a| a.is_ipv4() == local_ip.is_ipv4())
                    .or(addrs.first())
                else {
                    continue;
                };
                let payload = datagram.get(header.header_len..).unwrap_or_default();
                let _ = relay.send_to(payload, *dest).await;
                ctx.counters
                    .core(ctx.core)
                    .add_received(payload.len() as u64);
            } else if let Some(c) = client_udp.get() {
                out.clear();
                socks5::encode_udp_header(&TargetAddr::Ip(from), &mut out);
                out.extend_from_slice(datagram);
                let _ = relay.send_to(&out, c).await;
                ctx.counters.core(ctx.core).add_sent(n as u64);
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
