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

use super::packet::{self, Checksum, TcpV4, ACK, FIN, RST, SYN};
use super::udp_nat::{UdpNat, IPPROTO_UDP};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// First NAT port and how many there are (one flow each).
pub const FIRST_PORT: u16 = 10000;
pub const PORTS: usize = 50000;

/// Original destinations (and the applications' own addresses) by NAT port, readable from any
/// thread without locks.
pub struct NatTable {
    first: u16,
    /// 0 = free; else `1 << 63 | ip << 16 | port`.
    slots: Box<[AtomicU64]>,
    /// The application's address of each open flow, same encoding (shown as the flow's client).
    apps: Box<[AtomicU64]>,
}

fn encode(a: SocketAddrV4) -> u64 {
    1u64 << 63 | u64::from(u32::from(*a.ip())) << 16 | u64::from(a.port())
}

fn decode(v: u64) -> Option<SocketAddrV4> {
    (v != 0).then(|| SocketAddrV4::new(Ipv4Addr::from((v >> 16) as u32), (v & 0xffff) as u16))
}

impl NatTable {
    pub fn new(first: u16, count: usize) -> Self {
        let count = count.min(usize::from(u16::MAX - first) + 1);
        NatTable {
            first,
            slots: (0..count).map(|_| AtomicU64::new(0)).collect(),
            apps: (0..count).map(|_| AtomicU64::new(0)).collect(),
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
    pub fn lookup(&self, nat_port: u16) -> Option<SocketAddrV4> {
        decode(self.slots[self.index(nat_port)?].load(Ordering::Acquire))
    }

    /// The application's own address of the flow on `nat_port` (read after [`Self::lookup`]
    /// found the flow: published before it).
    pub fn app(&self, nat_port: u16) -> Option<SocketAddrV4> {
        decode(self.apps[self.index(nat_port)?].load(Ordering::Acquire))
    }

    pub(super) fn publish(&self, index: usize, app: SocketAddrV4, dst: SocketAddrV4) {
        self.apps[index].store(encode(app), Ordering::Release);
        self.slots[index].store(encode(dst), Ordering::Release);
    }

    /// How many NAT ports the table has.
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(super) fn clear(&self, index: usize) {
        self.slots[index].store(0, Ordering::Release);
        self.apps[index].store(0, Ordering::Release);
    }

    /// How many flows are open.
    pub fn open_flows(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.load(Ordering::Relaxed) != 0)
            .count()
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
    /// Neither an IPv4 TCP segment nor (when UDP is relayed) an IPv4 UDP datagram: IPv6, ICMP,
    /// fragments.
    Unsupported,
    /// A segment of no known flow that does not open one.
    NoFlow,
    /// Every NAT port is taken.
    Full,
    /// Addressed to the TUN's own addresses (would loop).
    Loop,
}

struct Flow {
    app: SocketAddrV4,
    dst: SocketAddrV4,
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
    table: Arc<NatTable>,
    flows: Vec<Option<Flow>>,
    by_app: HashMap<(SocketAddrV4, SocketAddrV4), usize>,
    next: usize,
    /// UDP flows, when the data plane relays UDP (else UDP is dropped as unsupported).
    udp: Option<UdpNat>,
}

impl Translator {
    /// The TUN's gateway address (the source of the ICMP errors the TUN answers with).
    pub fn gateway(&self) -> std::net::Ipv4Addr {
        self.addrs.gateway
    }

    pub fn new(addrs: NatAddresses, table: Arc<NatTable>) -> Self {
        let n = table.slots.len();
        // a previous VPN session's flows are gone with its TUN device
        for i in 0..n {
            table.clear(i);
        }
        Translator {
            addrs,
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

    /// Rewrites `p` in place (when the outcome is not `Dropped`). `now` is in seconds.
    pub fn translate(&mut self, p: &mut [u8], now: u64) -> Outcome {
        self.translate_with(p, Checksum::Full, now)
    }

    /// [`Translator::translate`] for a packet whose TCP checksum field holds what `checksum`
    /// says (a TUN with offloads hands over pending checksums, see `vnet::prepare`; a UDP
    /// datagram's checksum is always complete by then).
    pub fn translate_with(&mut self, p: &mut [u8], checksum: Checksum, now: u64) -> Outcome {
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
            return self.inbound(p, &seg, checksum, now);
        }
        if *seg.dst.ip() == a.gateway || *seg.dst.ip() == a.tun_ip {
            return Outcome::Dropped(Drop::Loop);
        }
        self.outbound(p, &seg, checksum, now)
    }

    fn inbound(&mut self, p: &mut [u8], seg: &TcpV4, checksum: Checksum, now: u64) -> Outcome {
        let Some(i) = self.table.index(seg.dst.port()) else {
            return Outcome::Dropped(Drop::NoFlow);
        };
        let Some(flow) = self.flows[i].as_mut() else {
            return Outcome::Dropped(Drop::NoFlow);
        };
        flow.last = now;
        if seg.flags & (SYN | ACK) == SYN | ACK {
            flow.established = true;
        }
        flow.fin_local |= seg.flags & FIN != 0;
        flow.reset |= seg.flags & RST != 0;
        let (src, dst) = (flow.dst, flow.app);
        packet::rewrite(p, seg, src, dst, checksum);
        Outcome::Inbound(seg.payload)
    }

    fn outbound(&mut self, p: &mut [u8], seg: &TcpV4, checksum: Checksum, now: u64) -> Outcome {
        let key = (seg.src, seg.dst);
        let opens = seg.flags & (SYN | ACK | RST) == SYN;
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
            None if opens => match self.allocate(seg, now) {
                Some(i) => i,
                None => return Outcome::Dropped(Drop::Full),
            },
            None => return Outcome::Dropped(Drop::NoFlow),
        };
        let Some(flow) = self.flows[i].as_mut() else {
            return Outcome::Dropped(Drop::NoFlow);
        };
        flow.last = now;
        flow.fin_app |= seg.flags & FIN != 0;
        flow.reset |= seg.flags & RST != 0;
        let src = SocketAddrV4::new(self.addrs.gateway, self.table.port(i));
        let dst = SocketAddrV4::new(self.addrs.tun_ip, self.addrs.listen_port);
        packet::rewrite(p, seg, src, dst, checksum);
        Outcome::Outbound(seg.payload)
    }

    fn allocate(&mut self, seg: &TcpV4, now: u64) -> Option<usize> {
        // reused as late as possible: the listener side may still hold the previous flow's
        // 4-tuple in TIME_WAIT
        let i = next_free(&self.flows, &mut self.next)?;
        self.flows[i] = Some(Flow {
            app: seg.src,
            dst: seg.dst,
            last: now,
            established: false,
            fin_app: false,
            fin_local: false,
            reset: false,
        });
        self.by_app.insert((seg.src, seg.dst), i);
        self.table.publish(i, seg.src, seg.dst);
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
        assert_eq!(table.lookup(10000), Some(dst));
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
        assert_eq!(table.lookup(port), Some(dst));
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
        table.publish(3, sa("10.0.0.7:40000"), sa("203.0.113.1:65535"));
        assert_eq!(table.lookup(10003), Some(sa("203.0.113.1:65535")));
        assert_eq!(table.app(10003), Some(sa("10.0.0.7:40000")));
        table.clear(3);
        assert_eq!(table.lookup(10003), None);
    }
}
