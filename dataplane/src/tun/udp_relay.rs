//! UDP flows of the VPN path on the data plane: the VPN UDP socket of a core receives the
//! datagrams the pump translated (`gateway:nat_port → tun_ip:udp_port`), finds each one's
//! original destination in the shared UDP NAT table and relays it through that flow's egress,
//! chosen by the client's routes: a UDP socket of its own (`direct`) or a SOCKS5 UDP ASSOCIATE
//! with the server (`socks5`). Replies go back from the VPN UDP socket to `gateway:nat_port`,
//! which the pump rewrites to `dst → app`. A backend that speaks only TCP (an HTTP proxy) cannot
//! carry UDP: its flows' datagrams are dropped and counted.
//!
//! One task per flow (one per NAT port): it opens the egress, registers the flow in the live
//! table (connections API) and ends after [`FLOW_IDLE`] without traffic either way, when the
//! association's control connection closes, or when the egress fails. The flows of a core are
//! bounded ([`MAX_FLOWS_PER_CORE`]) and so is each flow's queue; what does not fit is dropped
//! and counted in [`UdpRelayStats`]. `SO_REUSEPORT` hashes a flow's 4-tuple, so all its
//! datagrams reach the same core. The socket also receives the echo requests the pump carries
//! from the gateway's carrier ports ([`super::echo`]).

use crate::connector::Dialer;
use crate::engine::CoreContext;
use crate::error::DataplaneError;
use crate::events::Protocol;
use crate::proxied::Registered;
use crate::snapshot::{Backend, BackendKind, Snapshot};
use crate::trace::Trace;
use futures_lite::future::or;
use futures_lite::io::AsyncReadExt;
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::net::{TcpStream, UdpSocket};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::Range;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};
use switchyard_proto::socks5::{self, TargetAddr};

/// Flows one core relays at once; datagrams of further flows are dropped (counted).
pub const MAX_FLOWS_PER_CORE: usize = 4096;
/// Datagrams queued for one flow while its egress opens or is busy; more are dropped (counted).
const FLOW_QUEUE: usize = 64;
/// A flow without a datagram either way for this long ends (shorter than the pump's NAT
/// timeouts, so the NAT port outlives its relay).
pub const FLOW_IDLE: Duration = Duration::from_secs(50);

/// What the UDP relay measured (the pump counts the translated packets and bytes).
#[derive(Debug, Default)]
pub struct UdpRelayStats {
    /// Datagrams the relay dropped: not from a NAT flow, too many flows, a full flow queue, no
    /// route, a route that cannot carry UDP, or an egress that failed.
    pub dropped: AtomicU64,
    /// Of those, datagrams of flows whose route was blocked (the kill switch).
    pub blocked: AtomicU64,
}

impl UdpRelayStats {
    fn drop_one(&self) {
        self.dropped.fetch_add(1, Relaxed);
    }
}

/// A core's flows by NAT port. A port's entry belongs to one destination: when the pump reused
/// the port for another destination, the old entry is stale and is replaced. Runtime-free.
pub(crate) struct FlowTable<T> {
    flows: HashMap<u16, FlowEntry<T>>,
    max: usize,
    next_id: u64,
}

struct FlowEntry<T> {
    id: u64,
    dst: SocketAddr,
    handle: T,
}

impl<T> FlowTable<T> {
    pub fn new(max: usize) -> Self {
        FlowTable {
            flows: HashMap::new(),
            max,
            next_id: 0,
        }
    }

    /// The flow of `port` if it is still the flow to `dst`.
    pub fn get(&self, port: u16, dst: SocketAddr) -> Option<&T> {
        self.flows
            .get(&port)
            .filter(|e| e.dst == dst)
            .map(|e| &e.handle)
    }

    /// Adds the flow of `port` (replacing a stale one of the same port); its id, or `None`
    /// when the table is full.
    pub fn insert(&mut self, port: u16, dst: SocketAddr, handle: T) -> Option<u64> {
        if !self.flows.contains_key(&port) && self.flows.len() >= self.max {
            return None;
        }
        self.next_id += 1;
        let id = self.next_id;
        self.flows.insert(port, FlowEntry { id, dst, handle });
        Some(id)
    }

    /// Removes the flow `id` of `port` (not a newer flow that replaced it).
    pub fn remove(&mut self, port: u16, id: u64) {
        if self.flows.get(&port).is_some_and(|e| e.id == id) {
            self.flows.remove(&port);
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.flows.len()
    }
}

type Flows = Rc<RefCell<FlowTable<LocalSender<Vec<u8>>>>>;

/// Serves a core's VPN UDP socket until it fails.
pub(crate) async fn serve(socket: UdpSocket, ctx: Rc<CoreContext>) {
    let Some(vpn) = ctx.vpn.clone() else {
        return;
    };
    let socket = Rc::new(socket);
    let flows: Flows = Rc::new(RefCell::new(FlowTable::new(MAX_FLOWS_PER_CORE)));
    let stats = &vpn.udp_stats;
    let probes = super::echo::core_probes();
    let mut buf = vec![0u8; 65_536];
    loop {
        let (n, from) = match socket.recv_from(&mut buf).await {
            Ok(r) => r,
            Err(e) => {
                // nothing on this unconnected socket reports per-peer errors; back off anyway
                tracing::debug!(error = %e, "VPN UDP socket receive failed");
                glommio::timer::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // echo requests the pump carries here come from the gateway's carrier ports
        if from.is_ipv4() && vpn.is_gateway(from.ip()) && super::icmp::is_carrier_port(from.port())
        {
            super::echo::handle(&ctx, &socket, &probes, from, &buf[..n]);
            continue;
        }
        // only the pump's translated flows come from the gateway address
        let dst = match vpn.udp_nat.lookup(from.port()) {
            Some(dst) if vpn.is_gateway(from.ip()) && dst.is_ipv4() == from.is_ipv4() => dst,
            _ => {
                tracing::debug!(client = %from, "VPN UDP: not a translated flow");
                stats.drop_one();
                continue;
            }
        };
        let datagram = buf[..n].to_vec();
        let mut table = flows.borrow_mut();
        if let Some(queue) = table.get(from.port(), dst) {
            if queue.try_send(datagram).is_err() {
                stats.drop_one();
            }
            continue;
        }
        let (queue, datagrams) = local_channel::new_bounded(FLOW_QUEUE);
        let _ = queue.try_send(datagram);
        let Some(id) = table.insert(from.port(), dst, queue) else {
            tracing::debug!(limit = MAX_FLOWS_PER_CORE, "VPN UDP: too many flows");
            stats.drop_one();
            continue;
        };
        drop(table);
        let (ctx, socket, flows) = (ctx.clone(), socket.clone(), flows.clone());
        glommio::spawn_local(async move {
            relay_flow(&ctx, &socket, from, dst, &datagrams).await;
            flows.borrow_mut().remove(from.port(), id);
        })
        .detach();
    }
}

/// Relays one flow until it idles out or its egress ends, then reports it.
async fn relay_flow(
    ctx: &CoreContext,
    vpn_socket: &UdpSocket,
    app: SocketAddr,
    dst: SocketAddr,
    datagrams: &LocalReceiver<Vec<u8>>,
) {
    let Some(vpn) = ctx.vpn.as_ref() else {
        return;
    };
    let stats = &vpn.udp_stats;
    let snapshot = ctx.snapshot.load_full();
    // route by the name the application resolved, like TCP flows; datagrams go to the address
    let host = vpn
        .names
        .load()
        .get(&dst.ip())
        .cloned()
        .unwrap_or_else(|| dst.ip().to_string());
    let label = super::host_port(&host, dst.port());
    let mut trace = Trace::new(Protocol::VpnUdp, "UDP");
    trace.host = label.clone();
    trace.url = label.clone();
    // shown as the flow's client: the application, not the NAT address replies go to
    let peer = vpn.udp_nat.app(app.port()).unwrap_or(app);
    let opened = match snapshot.select(&host) {
        Some((_, backend)) => {
            let backend = backend.clone();
            trace.backend = backend.name.clone();
            open_egress(ctx, &snapshot, &backend, dst)
                .await
                .map(|egress| (backend, egress))
        }
        None => Err(DataplaneError::NoRoute(host.clone())),
    };
    let (backend, (egress, control)) = match opened {
        Ok(o) => o,
        Err(e) => {
            tracing::debug!(%label, error = %e, "VPN UDP flow: no egress; its datagrams are dropped");
            trace.fail(
                if matches!(e, DataplaneError::NoRoute(_)) {
                    403
                } else {
                    e.http_status().0
                },
                e.to_string(),
            );
            // the flow stays (dropping) until it idles, so it is not re-routed per datagram
            let blocked = matches!(e, DataplaneError::Blocked(_));
            let last = Cell::new(Instant::now());
            or(
                async {
                    while datagrams.recv().await.is_some() {
                        last.set(Instant::now());
                        stats.drop_one();
                        if blocked {
                            stats.blocked.fetch_add(1, Relaxed);
                        }
                    }
                },
                idle(&last),
            )
            .await;
            trace.finish(ctx, &snapshot, peer.ip());
            return;
        }
    };
    trace.status = 200;
    let core = ctx.counters.core(ctx.core);
    let bcore = backend.counters.core(ctx.core);
    bcore.opened();
    let registered = Registered::new(ctx, peer, label, backend.name.clone(), Protocol::VpnUdp);
    let live = registered.conn();
    let last = Cell::new(Instant::now());
    let up = async {
        let mut out = Vec::with_capacity(2048);
        while let Some(datagram) = datagrams.recv().await {
            last.set(Instant::now());
            if egress.send(&datagram, dst, &mut out).await {
                let n = datagram.len() as u64;
                live.add_recv(n);
                core.add_received(n);
                bcore.add_received(n);
            } else {
                stats.drop_one();
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 65_536];
        while let Some(payload) = egress.recv(&mut buf, dst).await {
            last.set(Instant::now());
            let payload = &buf[payload];
            if vpn_socket.send_to(payload, app).await.is_ok() {
                let n = payload.len() as u64;
                live.add_sent(n);
                core.add_sent(n);
                bcore.add_sent(n);
            } else {
                stats.drop_one();
            }
        }
    };
    or(or(up, down), or(idle(&last), control_closed(control))).await;
    bcore.closed();
    trace.up.set(live.bytes_recv.load(Relaxed));
    trace.down.set(live.bytes_sent.load(Relaxed));
    drop(registered);
    trace.finish(ctx, &snapshot, peer.ip());
}

/// Returns once nothing has happened for [`FLOW_IDLE`] since `last`.
async fn idle(last: &Cell<Instant>) {
    loop {
        let quiet = last.get().elapsed();
        if quiet >= FLOW_IDLE {
            return;
        }
        glommio::timer::sleep(FLOW_IDLE - quiet).await;
    }
}

/// Where a flow's datagrams leave.
enum Egress {
    /// A UDP socket of the client's own (its cgroup bypasses the tunnel): the host's routing.
    Direct(UdpSocket),
    /// A SOCKS5 UDP association: datagrams with the RFC 1928 UDP header to the proxy's relay.
    Socks5 {
        socket: UdpSocket,
        relay: SocketAddr,
    },
    /// QUIC datagrams of the connection to a switchyard server.
    Quic(crate::wireguard::DatagramPort),
}

fn udp_socket(ip: IpAddr) -> Result<UdpSocket, DataplaneError> {
    UdpSocket::bind(SocketAddr::new(ip, 0))
        .map_err(|e| DataplaneError::Io(std::io::Error::other(e.to_string())))
}

/// The flow's egress, and the SOCKS5 association's control connection when it has one.
async fn open_egress(
    ctx: &CoreContext,
    snapshot: &Snapshot,
    backend: &Backend,
    dst: SocketAddr,
) -> Result<(Egress, Option<TcpStream>), DataplaneError> {
    match &backend.kind {
        BackendKind::Direct => {
            let any = match dst {
                SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            };
            Ok((Egress::Direct(udp_socket(any)?), None))
        }
        BackendKind::Socks5 {
            host,
            port,
            credentials,
        } => {
            let dialer = Dialer {
                resolver: &ctx.resolver,
                offload: &ctx.offload,
                timeout: snapshot.timeouts.connect,
            };
            let association = dialer
                .socks5_udp_associate(host, *port, credentials.as_ref())
                .await;
            let counters = backend.counters.core(ctx.core);
            let association = match association {
                Ok(a) => a,
                Err(e) => {
                    counters.errors.fetch_add(1, Relaxed);
                    return Err(e);
                }
            };
            // the proxy accepts datagrams only from the control connection's address
            let local = association
                .control
                .local_addr()
                .map(|a| a.ip())
                .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            let egress = Egress::Socks5 {
                socket: udp_socket(local)?,
                relay: association.relay,
            };
            Ok((egress, Some(association.control)))
        }
        BackendKind::Quic(server) => {
            server.0.ensure_started(ctx, &backend.health);
            Ok((Egress::Quic(server.0.open_datagrams().await?), None))
        }
        BackendKind::Blocked { reason } => Err(DataplaneError::Blocked(reason)),
        _ => Err(DataplaneError::BackendUnavailable(format!(
            "{} for UDP (only direct, socks5 and quic routes carry UDP)",
            backend.type_name()
        ))),
    }
}

impl Egress {
    /// Sends `payload` towards `dst`; `out` is scratch space.
    async fn send(&self, payload: &[u8], dst: SocketAddr, out: &mut Vec<u8>) -> bool {
        match self {
            Egress::Direct(socket) => socket.send_to(payload, dst).await.is_ok(),
            Egress::Socks5 { socket, relay, .. } => {
                out.clear();
                socks5::encode_udp_header(&TargetAddr::Ip(dst), out);
                out.extend_from_slice(payload);
                socket.send_to(out, *relay).await.is_ok()
            }
            Egress::Quic(port) => port.send(dst, payload.to_vec()),
        }
    }

    /// The next reply from `dst`: where its payload is in `buf`. `None` when the socket fails.
    /// Datagrams from anyone else are ignored.
    async fn recv(&self, buf: &mut [u8], dst: SocketAddr) -> Option<Range<usize>> {
        loop {
            match self {
                Egress::Direct(socket) => {
                    let (n, from) = socket.recv_from(buf).await.ok()?;
                    if same_peer(from, dst) {
                        return Some(0..n);
                    }
                }
                Egress::Socks5 { socket, relay, .. } => {
                    let (n, from) = socket.recv_from(buf).await.ok()?;
                    if from != *relay {
                        continue;
                    }
                    if let Some(payload) = socks5_payload(&buf[..n], dst) {
                        return Some(payload);
                    }
                }
                Egress::Quic(port) => {
                    let (from, data) = port.recv().await?;
                    if same_peer(from, dst) {
                        let n = data.len().min(buf.len());
                        buf[..n].copy_from_slice(&data[..n]);
                        return Some(0..n);
                    }
                }
            }
        }
    }
}

/// Returns when a SOCKS5 association's control connection closes (the proxy ended the
/// association); never for an egress without one.
async fn control_closed(control: Option<TcpStream>) {
    let Some(mut control) = control else {
        return std::future::pending().await;
    };
    let mut sink = [0u8; 256];
    while matches!(control.read(&mut sink).await, Ok(n) if n > 0) {}
}

/// Whether `from` is `dst` (an IPv4-mapped IPv6 address is the same peer as its IPv4 one; the
/// scope and flow label do not matter).
fn same_peer(from: SocketAddr, dst: SocketAddr) -> bool {
    let plain = |a: SocketAddr| match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => SocketAddr::new(IpAddr::V6(*v6.ip()), v6.port()),
        },
        v4 => v4,
    };
    plain(from) == plain(dst)
}

/// Where the payload of a SOCKS5 relay's datagram is, if it is a whole reply from `dst`.
fn socks5_payload(datagram: &[u8], dst: SocketAddr) -> Option<Range<usize>> {
    let header = socks5::parse_udp_header(datagram).ok()?;
    let from_dst = match header.addr {
        TargetAddr::Ip(a) => same_peer(a, dst),
        TargetAddr::Domain(..) => false,
    };
    (header.frag == 0 && from_dst).then_some(header.header_len..datagram.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().expect("address")
    }

    #[test]
    fn the_flow_table_is_bounded_and_forgets_stale_destinations() {
        let mut t = FlowTable::new(2);
        let a = t.insert(10000, sa("192.0.2.1:53"), 'a').expect("room");
        assert_eq!(t.get(10000, sa("192.0.2.1:53")), Some(&'a'));
        let _b = t.insert(10001, sa("192.0.2.2:53"), 'b').expect("room");
        assert_eq!(t.insert(10002, sa("192.0.2.3:53"), 'c'), None, "full");
        // the pump reused port 10000 for another destination: the old flow is stale
        assert_eq!(t.get(10000, sa("192.0.2.9:53")), None);
        let a2 = t.insert(10000, sa("192.0.2.9:53"), 'A').expect("replaces");
        assert_eq!(t.len(), 2);
        // the old flow's task ending does not remove its successor
        t.remove(10000, a);
        assert_eq!(t.get(10000, sa("192.0.2.9:53")), Some(&'A'));
        t.remove(10000, a2);
        assert_eq!(t.len(), 1);
        assert!(t.insert(10002, sa("192.0.2.3:53"), 'c').is_some());
    }

    #[test]
    fn relay_replies_are_taken_only_whole_and_from_the_destination() {
        let dst = sa("192.0.2.7:7000");
        let mut d = Vec::new();
        socks5::encode_udp_header(&TargetAddr::Ip(dst), &mut d);
        let header = d.len();
        d.extend_from_slice(b"pong");
        assert_eq!(socks5_payload(&d, dst), Some(header..header + 4));
        assert_eq!(socks5_payload(&d, sa("192.0.2.7:7001")), None);
        let mut mapped = Vec::new();
        let v6: SocketAddr = "[::ffff:192.0.2.7]:7000".parse().expect("v6");
        socks5::encode_udp_header(&TargetAddr::Ip(v6), &mut mapped);
        assert!(socks5_payload(&mapped, dst).is_some());
        let mut fragment = d.clone();
        fragment[2] = 1;
        assert_eq!(socks5_payload(&fragment, dst), None);
        for cut in 0..header {
            assert_eq!(socks5_payload(&d[..cut], dst), None);
        }
        // an IPv6 destination's replies
        let dst6 = sa("[2001:db8::7]:7000");
        let mut d6 = Vec::new();
        socks5::encode_udp_header(&TargetAddr::Ip(dst6), &mut d6);
        d6.extend_from_slice(b"pong");
        assert_eq!(socks5_payload(&d6, dst6), Some(d6.len() - 4..d6.len()));
        assert_eq!(socks5_payload(&d6, dst), None);
        assert_eq!(socks5_payload(&d, dst6), None);
    }
}
