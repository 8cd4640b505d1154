//! The TUN path's NAT: which original destination each translated flow had. Runtime-free.
//!
//! An application's segment `app → dst` that enters the TUN is rewritten to
//! `gateway:nat_port → tun_ip:listen_port` and written back, so the kernel delivers the flow to
//! the data plane's VPN listener; the listener's segments `tun_ip:listen_port → gateway:nat_port`
//! are rewritten back to `dst → app`. The NAT port identifies the flow in both directions.
//!
//! Two halves with different owners: [`NatTable`] is shared — the pump thread publishes each
//! flow's original destination in an atomic slot indexed by NAT port, and a data-plane core that
//! accepted `gateway:nat_port` reads it without any lock. [`Translator`] is the pump thread's own
//! state (flow lookup by application address, TCP close tracking, expiry) and is never shared.

use super::packet::{self, Checksum, Skip, TcpV4, ACK, FIN, RST, SYN};
use super::packet6::{self, Transport6};
use super::udp_nat::{UdpNat, IPPROTO_UDP};
use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;

/// First NAT port and how many there are (one flow each).
pub const FIRST_PORT: u16 = 10000;
pub const PORTS: usize = 50000;

/// One address of a NAT slot, readable from any thread without locks. `word` is 0 when free;
/// an IPv4 address is `1 << 63 | ip << 16 | port` in it alone. An IPv6 address does not fit:
/// `word` is `1 << 63 | 1 << 62 | generation << 16 | port` and the address's two halves are in
/// `v6`, written by the pump (the only writer) between clearing `word` and publishing it — a
/// seqlock: a reader takes the halves only when `word` is the same before and after reading them
/// (the generation tells a slot republished meanwhile apart), so no one ever waits.
struct AddrSlot {
    word: AtomicU64,
    v6: [AtomicU64; 2],
}

const TAKEN: u64 = 1 << 63;
const V6: u64 = 1 << 62;

impl AddrSlot {
    fn new() -> Self {
        AddrSlot {
            word: AtomicU64::new(0),
            v6: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    fn store(&self, a: SocketAddr, generation: u64) {
        match a {
            SocketAddr::V4(a) => self.word.store(
                TAKEN | u64::from(u32::from(*a.ip())) << 16 | u64::from(a.port()),
                Ordering::Release,
            ),
            SocketAddr::V6(a) => {
                let ip = u128::from(*a.ip());
                self.word.store(0, Ordering::Relaxed);
                fence(Ordering::Release);
                self.v6[0].store((ip >> 64) as u64, Ordering::Relaxed);
                self.v6[1].store(ip as u64, Ordering::Relaxed);
                let generation = (generation & 0x3fff_ffff_ffff) << 16;
                self.word.store(
                    TAKEN | V6 | generation | u64::from(a.port()),
                    Ordering::Release,
                );
            }
        }
    }

    fn clear(&self) {
        self.word.store(0, Ordering::Release);
    }

    fn taken(&self) -> bool {
        self.word.load(Ordering::Relaxed) != 0
    }

    fn load(&self) -> Option<SocketAddr> {
        let word = self.word.load(Ordering::Acquire);
        if word == 0 {
            return None;
        }
        let port = (word & 0xffff) as u16;
        if word & V6 == 0 {
            let ip = Ipv4Addr::from((word >> 16) as u32);
            return Some(SocketAddr::V4(SocketAddrV4::new(ip, port)));
        }
        let hi = self.v6[0].load(Ordering::Relaxed);
        let lo = self.v6[1].load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        // republished or freed while read: the flow this was asked for is gone
        if self.word.load(Ordering::Relaxed) != word {
            return None;
        }
        let ip = Ipv6Addr::from(u128::from(hi) << 64 | u128::from(lo));
        Some(SocketAddr::V6(SocketAddrV6::new(ip, port, 0, 0)))
    }
}

/// Original destinations (and the applications' own addresses) by NAT port, IPv4 or IPv6,
/// readable from any thread without locks.
pub struct NatTable {
    first: u16,
    slots: Box<[AddrSlot]>,
    /// The application's address of each open flow (shown as the flow's client).
    apps: Box<[AddrSlot]>,
    /// Publications so far (the pump's only), the generation of IPv6 slots.
    published: AtomicU64,
}

impl NatTable {
    pub fn new(first: u16, count: usize) -> Self {
        let count = count.min(usize::from(u16::MAX - first) + 1);
        NatTable {
            first,
            slots: (0..count).map(|_| AddrSlot::new()).collect(),
            apps: (0..count).map(|_| AddrSlot::new()).collect(),
            published: AtomicU64::new(0),
        }
    }

    pub(super) fn index(&self, nat_port: u16) -> Option<usize> {
        let i = usize::from(nat_port.checked_sub(self.first)?);
        (i < self.slots.len()).then_some(i)
    }

    pub(super) fn port(&self, index: usize) -> u16 {
        self.first + index as u16
    }

    /// The original destination of the flow on `nat_port`, if one is open.
    pub fn lookup(&self, nat_port: u16) -> Option<SocketAddr> {
        self.slots[self.index(nat_port)?].load()
    }

    /// The application's own address of the flow on `nat_port` (read after [`Self::lookup`]
    /// found the flow: published before it).
    pub fn app(&self, nat_port: u16) -> Option<SocketAddr> {
        self.apps[self.index(nat_port)?].load()
    }

    pub(super) fn publish(&self, index: usize, app: SocketAddr, dst: SocketAddr) {
        let generation = self.published.fetch_add(1, Ordering::Relaxed);
        self.apps[index].store(app, generation);
        self.slots[index].store(dst, generation);
    }

    /// How many NAT ports the table has.
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(super) fn clear(&self, index: usize) {
        self.slots[index].clear();
        self.apps[index].clear();
    }

    /// How many flows are open.
    pub fn open_flows(&self) -> usize {
        self.slots.iter().filter(|s| s.taken()).count()
    }
}

/// The first free flow slot at or after `next`, round robin (so a NAT port is reused as late as
/// possible); advances `next` past it.
pub(super) fn next_free<T>(flows: &[Option<T>], next: &mut usize) -> Option<usize> {
    let n = flows.len();
    let i = (0..n)
        .map(|k| (*next + k) % n)
        .find(|&i| flows[i].is_none())?;
    *next = (i + 1) % n;
    Some(i)
}

/// Where the translated flows meet the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatAddresses {
    /// The TUN device's address; the VPN listener is bound to it.
    pub tun_ip: Ipv4Addr,
    pub listen_port: u16,
    /// The source address of translated flows (the TUN's peer, never assigned locally).
    pub gateway: Ipv4Addr,
}

/// The same for IPv6 flows: the TUN's IPv6 address, the VPN's IPv6 listener (or UDP socket)
/// on it, and the IPv6 gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatAddresses6 {
    pub tun_ip: Ipv6Addr,
    pub listen_port: u16,
    pub gateway: Ipv6Addr,
}

/// What happened to one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Rewritten from the application towards the listener (payload bytes).
    Outbound(usize),
    /// Rewritten from the listener back to the application (payload bytes).
    Inbound(usize),
    /// Not for the NAT: dropped.
    Dropped(Drop),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    /// Neither a TCP segment nor (when UDP is relayed) a UDP datagram: ICMP, other protocols,
    /// IPv6 when the path has no IPv6 addresses.
    Unsupported,
    /// An IPv6 packet with extension headers or a fragment header (not followed).
    Ipv6Extension,
    /// A segment of no known flow that does not open one.
    NoFlow,
    /// Every NAT port is taken.
    Full,
    /// Addressed to the TUN's own addresses (would loop).
    Loop,
}

/// A parsed TCP segment of either family.
#[derive(Debug, Clone, Copy)]
enum Segment {
    V4(TcpV4),
    V6(Transport6),
}

impl Segment {
    fn src(&self) -> SocketAddr {
        match self {
            Segment::V4(s) => SocketAddr::V4(s.src),
            Segment::V6(s) => SocketAddr::V6(s.src),
        }
    }

    fn dst(&self) -> SocketAddr {
        match self {
            Segment::V4(s) => SocketAddr::V4(s.dst),
            Segment::V6(s) => SocketAddr::V6(s.dst),
        }
    }

    fn flags(&self) -> u8 {
        match self {
            Segment::V4(s) => s.flags,
            Segment::V6(s) => s.flags,
        }
    }

    fn payload(&self) -> usize {
        match self {
            Segment::V4(s) => s.payload,
            Segment::V6(s) => s.payload,
        }
    }

    /// Rewrites the packet to `src → dst`, which are of the segment's own family (a flow never
    /// changes family); anything else leaves it as it is.
    fn rewrite(&self, p: &mut [u8], src: SocketAddr, dst: SocketAddr, checksum: Checksum) {
        match (self, src, dst) {
            (Segment::V4(s), SocketAddr::V4(src), SocketAddr::V4(dst)) => {
                packet::rewrite(p, s, src, dst, checksum)
            }
            (Segment::V6(s), SocketAddr::V6(src), SocketAddr::V6(dst)) => {
                packet6::rewrite(p, s, false, src, dst, checksum)
            }
            _ => {}
        }
    }
}

/// The local side of NAT port `port` of a flow of the given family: the gateway's port and the
/// listener (or UDP socket) of `addrs` / `addrs6`; `None` for IPv6 without `addrs6`.
pub(super) fn local_side(
    addrs: &NatAddresses,
    addrs6: Option<NatAddresses6>,
    v6: bool,
    port: u16,
) -> Option<(SocketAddr, SocketAddr)> {
    if !v6 {
        return Some((
            SocketAddr::V4(SocketAddrV4::new(addrs.gateway, port)),
            SocketAddr::V4(SocketAddrV4::new(addrs.tun_ip, addrs.listen_port)),
        ));
    }
    let a = addrs6?;
    Some((
        SocketAddr::V6(SocketAddrV6::new(a.gateway, port, 0, 0)),
        SocketAddr::V6(SocketAddrV6::new(a.tun_ip, a.listen_port, 0, 0)),
    ))
}

/// Why an IPv6 packet is not translated.
pub(super) fn drop6(skip: Skip) -> Drop {
    match skip {
        Skip::Extension => Drop::Ipv6Extension,
        _ => Drop::Unsupported,
    }
}

struct Flow {
    app: SocketAddr,
    dst: SocketAddr,
    last: u64,
    established: bool,
    fin_app: bool,
    fin_local: bool,
    reset: bool,
}

/// Seconds a flow may stay in each state without traffic.
const SYN_TIMEOUT: u64 = 30;
const CLOSED_LINGER: u64 = 10;
const IDLE_TIMEOUT: u64 = 3600;

impl Flow {
    /// Either side has closed or reset it: a SYN on its 4-tuple opens a new connection.
    fn closing(&self) -> bool {
        self.reset || self.fin_app || self.fin_local
    }

    fn expired(&self, now: u64) -> bool {
        let quiet = now.saturating_sub(self.last);
        if self.reset || (self.fin_app && self.fin_local) {
            quiet >= CLOSED_LINGER
        } else if !self.established {
            quiet >= SYN_TIMEOUT
        } else {
            quiet >= IDLE_TIMEOUT
        }
    }
}

/// The pump thread's NAT state.
pub struct Translator {
    addrs: NatAddresses,
    /// The IPv6 side, when the TUN has IPv6 addresses (else IPv6 is dropped as unsupported).
    addrs6: Option<NatAddresses6>,
    table: Arc<NatTable>,
    flows: Vec<Option<Flow>>,
    by_app: HashMap<(SocketAddr, SocketAddr), usize>,
    next: usize,
    /// UDP flows, when the data plane relays UDP (else UDP is dropped as unsupported).
    udp: Option<UdpNat>,
}

impl Translator {
    /// The TUN's gateway address (the source of the ICMP errors the TUN answers with).
    pub fn gateway(&self) -> std::net::Ipv4Addr {
        self.addrs.gateway
    }

    /// The TUN's IPv6 gateway address, when it has one.
    pub fn gateway6(&self) -> Option<Ipv6Addr> {
        self.addrs6.map(|a| a.gateway)
    }

    /// Where echo requests are carried to the cores: the VPN UDP socket, when UDP is relayed.
    pub fn echo_carrier(&self) -> Option<super::icmp::Carrier> {
        self.udp.as_ref().map(|u| {
            let a = u.addresses();
            super::icmp::Carrier {
                tun_ip: a.tun_ip,
                udp_port: a.listen_port,
                gateway: a.gateway,
            }
        })
    }

    pub fn new(addrs: NatAddresses, table: Arc<NatTable>) -> Self {
        let n = table.len();
        // a previous VPN session's flows are gone with its TUN device
        for i in 0..n {
            table.clear(i);
        }
        Translator {
            addrs,
            addrs6: None,
            table,
            flows: (0..n).map(|_| None).collect(),
            by_app: HashMap::new(),
            next: 0,
            udp: None,
        }
    }

    /// Translates IPv4 UDP too, with `udp`'s own ports.
    pub fn with_udp(mut self, udp: UdpNat) -> Self {
        self.udp = Some(udp);
        self
    }

    /// Translates IPv6 TCP too, to the IPv6 listener of `addrs6` (its NAT ports are shared with
    /// IPv4: one table, one port per flow whatever its family).
    pub fn with_v6(mut self, addrs6: NatAddresses6) -> Self {
        self.addrs6 = Some(addrs6);
        self
    }

    /// Rewrites `p` in place (when the outcome is not `Dropped`). `now` is in seconds.
    pub fn translate(&mut self, p: &mut [u8], now: u64) -> Outcome {
        self.translate_with(p, Checksum::Full, now)
    }

    /// [`Translator::translate`] for a packet whose TCP checksum field holds what `checksum`
    /// says (a TUN with offloads hands over pending checksums, see `vnet::prepare`; a UDP
    /// datagram's checksum is always complete by then).
    pub fn translate_with(&mut self, p: &mut [u8], checksum: Checksum, now: u64) -> Outcome {
        if packet6::is_ipv6(p) {
            return self.translate6(p, checksum, now);
        }
        if let Some(udp) = self.udp.as_mut() {
            if p.first().is_some_and(|b| b >> 4 == 4) && p.get(9) == Some(&IPPROTO_UDP) {
                return udp.translate(p, now);
            }
        }
        let Ok(seg) = packet::parse(p) else {
            return Outcome::Dropped(Drop::Unsupported);
        };
        let a = self.addrs;
        if *seg.src.ip() == a.tun_ip
            && seg.src.port() == a.listen_port
            && *seg.dst.ip() == a.gateway
        {
            return self.inbound(p, &Segment::V4(seg), checksum, now);
        }
        if *seg.dst.ip() == a.gateway || *seg.dst.ip() == a.tun_ip {
            return Outcome::Dropped(Drop::Loop);
        }
        self.outbound(p, &Segment::V4(seg), checksum, now)
    }

    fn translate6(&mut self, p: &mut [u8], checksum: Checksum, now: u64) -> Outcome {
        let Some(a) = self.addrs6 else {
            return Outcome::Dropped(Drop::Unsupported);
        };
        if packet6::next_header(p) == Some(packet6::IPPROTO_UDP) {
            return match self.udp.as_mut() {
                Some(udp) => udp.translate6(p, now),
                None => Outcome::Dropped(Drop::Unsupported),
            };
        }
        let seg = match packet6::parse_tcp(p) {
            Ok(seg) => seg,
            Err(skip) => return Outcome::Dropped(drop6(skip)),
        };
        if *seg.src.ip() == a.tun_ip
            && seg.src.port() == a.listen_port
            && *seg.dst.ip() == a.gateway
        {
            return self.inbound(p, &Segment::V6(seg), checksum, now);
        }
        if *seg.dst.ip() == a.gateway || *seg.dst.ip() == a.tun_ip {
            return Outcome::Dropped(Drop::Loop);
        }
        self.outbound(p, &Segment::V6(seg), checksum, now)
    }

    fn inbound(&mut self, p: &mut [u8], seg: &Segment, checksum: Checksum, now: u64) -> Outcome {
        let Some(i) = self.table.index(seg.dst().port()) else {
            return Outcome::Dropped(Drop::NoFlow);
        };
        let Some(flow) = self.flows[i].as_mut() else {
            return Outcome::Dropped(Drop::NoFlow);
        };
        // a port's flow is of one family: the other family's listener has no flow there
        if flow.app.is_ipv4() != seg.dst().is_ipv4() {
            return Outcome::Dropped(Drop::NoFlow);
        }
        let flags = seg.flags();
        flow.last = now;
        if flags & (SYN | ACK) == SYN | ACK {
            flow.established = true;
        }
        flow.fin_local |= flags & FIN != 0;
        flow.reset |= flags & RST != 0;
        let (src, dst) = (flow.dst, flow.app);
        seg.rewrite(p, src, dst, checksum);
        Outcome::Inbound(seg.payload())
    }

    fn outbound(&mut self, p: &mut [u8], seg: &Segment, checksum: Checksum, now: u64) -> Outcome {
        let key = (seg.src(), seg.dst());
        let flags = seg.flags();
        let opens = flags & (SYN | ACK | RST) == SYN;
        let mut known = self.by_app.get(&key).copied();
        if let Some(i) =
            known.filter(|&i| opens && self.flows[i].as_ref().is_some_and(Flow::closing))
        {
            // the app reuses the 4-tuple of a flow that is closing or closed (in linger): a new
            // connection, not the old one's retransmission. It gets a fresh entry and NAT port:
            // inheriting `reset`/`fin_*` would sweep it after CLOSED_LINGER of quiet, and on the
            // old port the listener may still hold the old connection (CLOSE_WAIT, TIME_WAIT)
            self.free(i);
            known = None;
        }
        let i = match known {
            Some(i) => i,
            None if opens => match self.allocate(key, now) {
                Some(i) => i,
                None => return Outcome::Dropped(Drop::Full),
            },
            None => return Outcome::Dropped(Drop::NoFlow),
        };
        let local = local_side(
            &self.addrs,
            self.addrs6,
            seg.src().is_ipv6(),
            self.table.port(i),
        );
        let Some((src, dst)) = local else {
            return Outcome::Dropped(Drop::Unsupported);
        };
        let Some(flow) = self.flows[i].as_mut() else {
            return Outcome::Dropped(Drop::NoFlow);
        };
        flow.last = now;
        flow.fin_app |= flags & FIN != 0;
        flow.reset |= flags & RST != 0;
        seg.rewrite(p, src, dst, checksum);
        Outcome::Outbound(seg.payload())
    }

    fn allocate(&mut self, (app, dst): (SocketAddr, SocketAddr), now: u64) -> Option<usize> {
        // reused as late as possible: the listener side may still hold the previous flow's
        // 4-tuple in TIME_WAIT
        let i = next_free(&self.flows, &mut self.next)?;
        self.flows[i] = Some(Flow {
            app,
            dst,
            last: now,
            established: false,
            fin_app: false,
            fin_local: false,
            reset: false,
        });
        self.by_app.insert((app, dst), i);
        self.table.publish(i, app, dst);
        Some(i)
    }

    fn free(&mut self, i: usize) {
        if let Some(f) = self.flows[i].take() {
            self.by_app.remove(&(f.app, f.dst));
        }
        self.table.clear(i);
    }

    /// Frees expired flows; returns how many.
    pub fn sweep(&mut self, now: u64) -> usize {
        let mut freed = 0;
        for i in 0..self.flows.len() {
            if self.flows[i].as_ref().is_some_and(|f| f.expired(now)) {
                self.free(i);
                freed += 1;
            }
        }
        freed + self.udp.as_mut().map_or(0, |u| u.sweep(now))
    }

    /// TCP and UDP flows in the NAT.
    pub fn open_flows(&self) -> usize {
        self.by_app.len() + self.udp.as_ref().map_or(0, UdpNat::open_flows)
    }
}

#[cfg(test)]
mod tests {
    use super::super::packet::tests::{full_checksums, packet};
    use super::*;

    fn sa(s: &str) -> SocketAddrV4 {
        s.parse().expect("address")
    }

    fn translator(ports: usize) -> (Translator, Arc<NatTable>) {
        let table = Arc::new(NatTable::new(FIRST_PORT, ports));
        let addrs = NatAddresses {
            tun_ip: "10.255.0.2".parse().expect("ip"),
            listen_port: 7000,
            gateway: "10.255.0.1".parse().expect("ip"),
        };
        (Translator::new(addrs, table.clone()), table)
    }

    fn checksums_ok(p: &[u8]) -> bool {
        let (ip, tcp) = full_checksums(p);
        u16::from_be_bytes([p[10], p[11]]) == ip && u16::from_be_bytes([p[36], p[37]]) == tcp
    }

    #[test]
    fn a_flow_goes_to_the_listener_and_its_replies_come_back_from_the_destination() {
        let (mut t, table) = translator(8);
        let (app, dst) = (sa("10.255.0.2:40000"), sa("192.0.2.9:443"));
        let mut syn = packet(app, dst, SYN, b"");
        assert_eq!(t.translate(&mut syn, 1), Outcome::Outbound(0));
        let seg = packet::parse(&syn).expect("tcp");
        assert_eq!(seg.src, sa("10.255.0.1:10000"));
        assert_eq!(seg.dst, sa("10.255.0.2:7000"));
        assert!(checksums_ok(&syn));
        // the core that accepted 10.255.0.1:10000 learns where the app wanted to go
        assert_eq!(table.lookup(10000), Some(dst.into()));
        assert_eq!(table.lookup(10001), None);

        let mut synack = packet(
            sa("10.255.0.2:7000"),
            sa("10.255.0.1:10000"),
            SYN | ACK,
            b"",
        );
        assert_eq!(t.translate(&mut synack, 1), Outcome::Inbound(0));
        let back = packet::parse(&synack).expect("tcp");
        assert_eq!((back.src, back.dst), (dst, app));
        assert!(checksums_ok(&synack));

        let mut data = packet(app, dst, ACK, b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(t.translate(&mut data, 2), Outcome::Outbound(18));
        assert_eq!(packet::parse(&data).expect("tcp").src.port(), 10000);

        // a second flow of the same app gets its own port
        let mut other = packet(sa("10.255.0.2:40001"), dst, SYN, b"");
        assert_eq!(t.translate(&mut other, 2), Outcome::Outbound(0));
        assert_eq!(packet::parse(&other).expect("tcp").src.port(), 10001);
        assert_eq!(t.open_flows(), 2);
        assert_eq!(table.open_flows(), 2);
    }

    #[test]
    fn stray_segments_loops_and_other_protocols_are_dropped() {
        let (mut t, _) = translator(8);
        let mut ack = packet(sa("10.255.0.2:1"), sa("192.0.2.9:80"), ACK, b"x");
        assert_eq!(t.translate(&mut ack, 0), Outcome::Dropped(Drop::NoFlow));
        let mut reply = packet(sa("10.255.0.2:7000"), sa("10.255.0.1:10003"), ACK, b"");
        assert_eq!(t.translate(&mut reply, 0), Outcome::Dropped(Drop::NoFlow));
        let mut to_gateway = packet(sa("10.255.0.2:1"), sa("10.255.0.1:80"), SYN, b"");
        assert_eq!(
            t.translate(&mut to_gateway, 0),
            Outcome::Dropped(Drop::Loop)
        );
        let mut udp = packet(sa("10.255.0.2:1"), sa("192.0.2.9:53"), 0, b"q");
        udp[9] = 17;
        assert_eq!(
            t.translate(&mut udp, 0),
            Outcome::Dropped(Drop::Unsupported)
        );
    }

    #[test]
    fn closed_reset_and_unanswered_flows_expire_and_free_their_port() {
        let (mut t, table) = translator(2);
        let dst = sa("192.0.2.9:80");
        let mut a = packet(sa("10.255.0.2:1"), dst, SYN, b"");
        let mut b = packet(sa("10.255.0.2:2"), dst, SYN, b"");
        let mut c = packet(sa("10.255.0.2:3"), dst, SYN, b"");
        assert_eq!(t.translate(&mut a, 0), Outcome::Outbound(0));
        assert_eq!(t.translate(&mut b, 0), Outcome::Outbound(0));
        assert_eq!(t.translate(&mut c, 0), Outcome::Dropped(Drop::Full));
        // flow a is established and closed by both sides
        let mut synack = packet(
            sa("10.255.0.2:7000"),
            sa("10.255.0.1:10000"),
            SYN | ACK,
            b"",
        );
        t.translate(&mut synack, 1);
        let mut fin = packet(sa("10.255.0.2:1"), dst, FIN | ACK, b"");
        t.translate(&mut fin, 2);
        let mut fin_back = packet(
            sa("10.255.0.2:7000"),
            sa("10.255.0.1:10000"),
            FIN | ACK,
            b"",
        );
        t.translate(&mut fin_back, 2);
        assert_eq!(t.sweep(2 + CLOSED_LINGER - 1), 0);
        assert_eq!(t.sweep(2 + CLOSED_LINGER), 1);
        assert_eq!(table.lookup(10000), None);
        // b never got an answer
        assert_eq!(t.sweep(SYN_TIMEOUT), 1);
        assert_eq!(t.open_flows(), 0);
        let mut c = packet(sa("10.255.0.2:3"), dst, SYN, b"");
        assert_eq!(t.translate(&mut c, 40), Outcome::Outbound(0));
        // an established flow that keeps talking stays
        let mut synack = packet(
            sa("10.255.0.2:7000"),
            sa("10.255.0.1:10000"),
            SYN | ACK,
            b"",
        );
        assert_eq!(t.translate(&mut synack, 41), Outcome::Inbound(0));
        assert_eq!(t.sweep(41 + SYN_TIMEOUT), 0);
        let mut rst = packet(sa("10.255.0.2:3"), dst, RST, b"");
        t.translate(&mut rst, 100);
        assert_eq!(t.sweep(100 + CLOSED_LINGER), 1);
    }

    #[test]
    fn a_new_syn_on_a_closed_flows_4_tuple_opens_a_fresh_flow() {
        let (mut t, table) = translator(4);
        let (app, dst) = (sa("10.255.0.2:40000"), sa("192.0.2.9:443"));
        let listener = sa("10.255.0.2:7000");
        let mut syn = packet(app, dst, SYN, b"");
        assert_eq!(t.translate(&mut syn, 0), Outcome::Outbound(0));
        t.translate(
            &mut packet(listener, sa("10.255.0.1:10000"), SYN | ACK, b""),
            0,
        );
        // closed by both sides, then by a reset: in linger
        t.translate(&mut packet(app, dst, FIN | ACK, b""), 1);
        t.translate(
            &mut packet(listener, sa("10.255.0.1:10000"), FIN | ACK, b""),
            1,
        );
        t.translate(&mut packet(app, dst, RST, b""), 1);

        // the app opens a new connection from the same port to the same destination
        let mut syn = packet(app, dst, SYN, b"");
        assert_eq!(t.translate(&mut syn, 2), Outcome::Outbound(0));
        let port = packet::parse(&syn).expect("tcp").src.port();
        assert_ne!(
            port, 10000,
            "a fresh NAT port: the listener may still hold the old one"
        );
        assert_eq!(table.lookup(10000), None);
        assert_eq!(table.lookup(port), Some(dst.into()));
        let mut synack = packet(listener, sa(&format!("10.255.0.1:{port}")), SYN | ACK, b"");
        assert_eq!(t.translate(&mut synack, 2), Outcome::Inbound(0));
        let mut data = packet(app, dst, ACK, b"hello");
        assert_eq!(t.translate(&mut data, 3), Outcome::Outbound(5));
        assert_eq!(packet::parse(&data).expect("tcp").src.port(), port);
        // an open connection quiet for longer than the linger stays
        assert_eq!(t.sweep(3 + CLOSED_LINGER), 0);
        assert_eq!(t.open_flows(), 1);
        // its own SYN, retransmitted, is not a new connection
        let mut again = packet(app, dst, SYN, b"");
        assert_eq!(t.translate(&mut again, 4), Outcome::Outbound(0));
        assert_eq!(packet::parse(&again).expect("tcp").src.port(), port);
        assert_eq!(t.open_flows(), 1);
    }

    #[test]
    fn the_table_answers_only_for_its_own_ports() {
        let table = NatTable::new(FIRST_PORT, 4);
        assert_eq!(table.lookup(9999), None);
        assert_eq!(table.lookup(10004), None);
        let (app, dst) = (sa("10.0.0.7:40000"), sa("203.0.113.1:65535"));
        table.publish(3, app.into(), dst.into());
        assert_eq!(table.lookup(10003), Some(dst.into()));
        assert_eq!(table.app(10003), Some(app.into()));
        table.clear(3);
        assert_eq!(table.lookup(10003), None);
        // IPv6 addresses of every shape, in the same slots
        for (app, dst) in [
            ("[fd7a:5359::2]:40000", "[2001:db8::ffff:1]:443"),
            ("[::1]:1", "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"),
            ("[fd7a::2]:2", "[::ffff:192.0.2.1]:0"),
        ] {
            let (app, dst): (SocketAddr, SocketAddr) =
                (app.parse().expect("v6"), dst.parse().expect("v6"));
            table.publish(3, app, dst);
            assert_eq!(table.lookup(10003), Some(dst));
            assert_eq!(table.app(10003), Some(app));
        }
        assert_eq!(table.open_flows(), 1);
        table.clear(3);
        assert_eq!(table.lookup(10003), None);
        assert_eq!(table.open_flows(), 0);
    }

    #[test]
    fn an_ipv6_slot_is_never_read_torn_while_the_pump_republishes_it() {
        // one writer republishing two destinations, one reader: every read is one of the two
        let table = Arc::new(NatTable::new(FIRST_PORT, 1));
        let a: SocketAddr = "[2001:db8::1:1]:1".parse().expect("v6");
        let b: SocketAddr = "[fd00:ffff::ffff:2]:2".parse().expect("v6");
        let app: SocketAddr = "[fd7a::2]:3".parse().expect("v6");
        table.publish(0, app, a);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (table, stop) = (table.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    table.publish(0, app, if n.is_multiple_of(2) { a } else { b });
                    n += 1;
                }
            })
        };
        for _ in 0..200_000 {
            // `None` while a publication is under way: the reader never waits
            if let Some(d) = table.lookup(FIRST_PORT) {
                assert!(d == a || d == b, "torn read: {d}");
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().expect("writer");
        assert!(matches!(table.lookup(FIRST_PORT), Some(d) if d == a || d == b));
    }

    fn translator6(ports: usize) -> (Translator, Arc<NatTable>) {
        let (t, table) = translator(ports);
        let t = t.with_v6(NatAddresses6 {
            tun_ip: "fd7a:5359::2".parse().expect("ip"),
            listen_port: 7006,
            gateway: "fd7a:5359::1".parse().expect("ip"),
        });
        (t, table)
    }

    #[test]
    fn an_ipv6_flow_goes_to_the_ipv6_listener_and_shares_the_nat_ports() {
        use super::super::packet6::tests::{checksum_at, full_checksum, packet6, sa6};
        use super::super::packet6::IPPROTO_TCP;
        let (mut t, table) = translator6(8);
        // an IPv4 flow takes port 10000, the IPv6 one the next
        let mut syn4 = packet(sa("10.255.0.2:40000"), sa("192.0.2.9:443"), SYN, b"");
        assert_eq!(t.translate(&mut syn4, 1), Outcome::Outbound(0));
        let (app, dst) = (sa6("[fd7a:5359::2]:40000"), sa6("[2001:db8::9]:443"));
        let mut syn = packet6(IPPROTO_TCP, app, dst, SYN, b"");
        assert_eq!(t.translate(&mut syn, 1), Outcome::Outbound(0));
        let seg = packet6::parse_tcp(&syn).expect("tcp");
        assert_eq!(seg.src, sa6("[fd7a:5359::1]:10001"));
        assert_eq!(seg.dst, sa6("[fd7a:5359::2]:7006"));
        assert_eq!(checksum_at(&syn), full_checksum(&syn));
        assert_eq!(table.lookup(10001), Some(dst.into()));
        assert_eq!(table.app(10001), Some(app.into()));

        let listener = sa6("[fd7a:5359::2]:7006");
        let mut synack = packet6(IPPROTO_TCP, listener, seg.src, SYN | ACK, b"");
        assert_eq!(t.translate(&mut synack, 1), Outcome::Inbound(0));
        let back = packet6::parse_tcp(&synack).expect("tcp");
        assert_eq!((back.src, back.dst), (dst, app));
        assert_eq!(checksum_at(&synack), full_checksum(&synack));
        let mut data = packet6(IPPROTO_TCP, app, dst, ACK, b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(t.translate(&mut data, 2), Outcome::Outbound(18));
        // the IPv4 listener's segment to the IPv6 flow's port is no flow of its
        let mut wrong = packet(sa("10.255.0.2:7000"), sa("10.255.0.1:10001"), ACK, b"");
        assert_eq!(t.translate(&mut wrong, 2), Outcome::Dropped(Drop::NoFlow));
        assert_eq!(t.open_flows(), 2);
        // loops, and extension headers, are dropped
        let mut to_gateway = packet6(IPPROTO_TCP, app, sa6("[fd7a:5359::1]:80"), SYN, b"");
        assert_eq!(
            t.translate(&mut to_gateway, 2),
            Outcome::Dropped(Drop::Loop)
        );
        let mut fragment = packet6(IPPROTO_TCP, app, dst, SYN, b"");
        fragment[6] = 44;
        assert_eq!(
            t.translate(&mut fragment, 2),
            Outcome::Dropped(Drop::Ipv6Extension)
        );
        // flows close and expire as IPv4 ones do
        let mut rst = packet6(IPPROTO_TCP, app, dst, RST, b"");
        assert_eq!(t.translate(&mut rst, 3), Outcome::Outbound(0));
        assert_eq!(t.sweep(3 + CLOSED_LINGER), 1);
        assert_eq!(table.lookup(10001), None);
    }

    #[test]
    fn without_ipv6_addresses_ipv6_is_dropped_as_unsupported() {
        use super::super::packet6::tests::{packet6, sa6};
        use super::super::packet6::IPPROTO_TCP;
        let (mut t, _) = translator(8);
        let mut syn = packet6(
            IPPROTO_TCP,
            sa6("[fd7a::2]:1"),
            sa6("[2001:db8::1]:80"),
            SYN,
            b"",
        );
        assert_eq!(
            t.translate(&mut syn, 0),
            Outcome::Dropped(Drop::Unsupported)
        );
        assert_eq!(t.open_flows(), 0);
    }
}
