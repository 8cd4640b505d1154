//! UDP in the TUN path's NAT: the IPv4 UDP header rewrite and the pump's UDP flow table.
//! Runtime-free.
//!
//! The same shape as TCP: an application's datagram `app → dst` that enters the TUN is rewritten
//! to `gateway:nat_port → tun_ip:udp_port` and written back, so the kernel delivers it to the data
//! plane's VPN UDP socket; that socket's replies `tun_ip:udp_port → gateway:nat_port` are
//! rewritten back to `dst → app`. A flow is the pair `(app, dst)`; it has no handshake, so it opens
//! with its first datagram and ends when it has been quiet for a while. The NAT port space is its
//! own ([`NatTable`] instance): UDP and TCP ports never collide.

use super::nat::{drop6, local_side, Drop, NatAddresses, NatAddresses6, NatTable, Outcome};
use super::packet::{adjust, ipv4_lengths, read16, words, write16, Checksum, Skip};
use super::packet6::{self, Transport6};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;

/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;

/// The addressing of one IPv4 UDP datagram, with the header offset to rewrite it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpV4 {
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    /// UDP payload length.
    pub payload: usize,
    /// Offset of the UDP header.
    udp: usize,
}

/// Why a packet is not an IPv4 UDP datagram the NAT can rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotUdp {
    NotIpv4,
    OtherProtocol,
    Fragment,
    Truncated,
}

/// Reads an IPv4 UDP datagram's addressing.
pub fn parse(p: &[u8]) -> Result<UdpV4, NotUdp> {
    let (ihl, total) = ipv4_lengths(p, IPPROTO_UDP).map_err(|skip| match skip {
        Skip::NotIpv4 => NotUdp::NotIpv4,
        Skip::NotTcp => NotUdp::OtherProtocol,
        Skip::Fragment | Skip::Extension => NotUdp::Fragment,
        Skip::Truncated => NotUdp::Truncated,
    })?;
    let udp = ihl;
    if total < udp + 8 {
        return Err(NotUdp::Truncated);
    }
    let length = usize::from(read16(p, udp + 4));
    if length < 8 || udp + length > total {
        return Err(NotUdp::Truncated);
    }
    let ip = |at: usize| Ipv4Addr::new(p[at], p[at + 1], p[at + 2], p[at + 3]);
    Ok(UdpV4 {
        src: SocketAddrV4::new(ip(12), read16(p, udp)),
        dst: SocketAddrV4::new(ip(16), read16(p, udp + 2)),
        payload: length - 8,
        udp,
    })
}

/// Rewrites the datagram's source and destination, updating the IP header checksum and the UDP
/// checksum incrementally. A zero UDP checksum means "none" (RFC 768, IPv4 only) and stays zero;
/// a computed checksum that comes out zero is sent as `0xffff`. `d` must come from [`parse`] of
/// this same buffer.
pub fn rewrite(p: &mut [u8], d: &UdpV4, src: SocketAddrV4, dst: SocketAddrV4) {
    let mut ip_check = read16(p, 10);
    let check_at = d.udp + 6;
    let had_checksum = read16(p, check_at) != 0;
    let mut udp_check = read16(p, check_at);
    for (old, new, at) in [
        (words(*d.src.ip()), words(*src.ip()), 12usize),
        (words(*d.dst.ip()), words(*dst.ip()), 16usize),
    ] {
        for i in 0..2 {
            ip_check = adjust(ip_check, old[i], new[i]);
            udp_check = adjust(udp_check, old[i], new[i]);
        }
        write16(p, at, new[0]);
        write16(p, at + 2, new[1]);
    }
    for (old, new, at) in [
        (d.src.port(), src.port(), d.udp),
        (d.dst.port(), dst.port(), d.udp + 2),
    ] {
        udp_check = adjust(udp_check, old, new);
        write16(p, at, new);
    }
    write16(p, 10, ip_check);
    let udp_check = match (had_checksum, udp_check) {
        (false, _) => 0,
        (true, 0) => 0xffff,
        (true, c) => c,
    };
    write16(p, check_at, udp_check);
}

/// Seconds a UDP flow stays without traffic: shorter before the destination ever answered (a
/// probe or a one-off), as conntrack does.
pub const UNREPLIED_TIMEOUT: u64 = 60;
pub const REPLIED_TIMEOUT: u64 = 180;

struct Flow {
    app: SocketAddr,
    dst: SocketAddr,
    last: u64,
    replied: bool,
}

impl Flow {
    fn expired(&self, now: u64) -> bool {
        let quiet = now.saturating_sub(self.last);
        quiet
            >= if self.replied {
                REPLIED_TIMEOUT
            } else {
                UNREPLIED_TIMEOUT
            }
    }
}

/// A parsed UDP datagram of either family.
#[derive(Debug, Clone, Copy)]
enum Datagram {
    V4(UdpV4),
    V6(Transport6),
}

impl Datagram {
    fn src(&self) -> SocketAddr {
        match self {
            Datagram::V4(d) => SocketAddr::V4(d.src),
            Datagram::V6(d) => SocketAddr::V6(d.src),
        }
    }

    fn dst(&self) -> SocketAddr {
        match self {
            Datagram::V4(d) => SocketAddr::V4(d.dst),
            Datagram::V6(d) => SocketAddr::V6(d.dst),
        }
    }

    fn payload(&self) -> usize {
        match self {
            Datagram::V4(d) => d.payload,
            Datagram::V6(d) => d.payload,
        }
    }

    /// Rewrites to `src → dst` of the datagram's own family (a flow never changes family).
    fn rewrite(&self, p: &mut [u8], src: SocketAddr, dst: SocketAddr) {
        match (self, src, dst) {
            (Datagram::V4(d), SocketAddr::V4(src), SocketAddr::V4(dst)) => rewrite(p, d, src, dst),
            (Datagram::V6(d), SocketAddr::V6(src), SocketAddr::V6(dst)) => {
                packet6::rewrite(p, d, true, src, dst, Checksum::Full)
            }
            _ => {}
        }
    }
}

/// The pump thread's UDP NAT state (never shared; the cores read [`NatTable`]).
pub struct UdpNat {
    addrs: NatAddresses,
    /// The IPv6 side (the VPN's IPv6 UDP socket), when the TUN has IPv6 addresses.
    addrs6: Option<NatAddresses6>,
    table: Arc<NatTable>,
    flows: Vec<Option<Flow>>,
    by_app: HashMap<(SocketAddr, SocketAddr), usize>,
    next: usize,
}

impl UdpNat {
    /// `addrs.listen_port` is the data plane's VPN UDP port.
    pub fn new(addrs: NatAddresses, table: Arc<NatTable>) -> Self {
        let n = table.len();
        // a previous VPN session's flows are gone with its TUN device
        for i in 0..n {
            table.clear(i);
        }
        UdpNat {
            addrs,
            addrs6: None,
            table,
            flows: (0..n).map(|_| None).collect(),
            by_app: HashMap::new(),
            next: 0,
        }
    }

    /// The IPv4 side: the VPN UDP socket (`listen_port`) on `tun_ip`, and the gateway.
    pub fn addresses(&self) -> NatAddresses {
        self.addrs
    }

    /// Translates IPv6 UDP too, to the IPv6 UDP socket of `addrs6` (NAT ports shared with IPv4).
    pub fn with_v6(mut self, addrs6: NatAddresses6) -> Self {
        self.addrs6 = Some(addrs6);
        self
    }

    /// Rewrites the IPv4 UDP datagram `p` in place (when the outcome is not `Dropped`). `now` is
    /// in seconds.
    pub fn translate(&mut self, p: &mut [u8], now: u64) -> Outcome {
        let Ok(d) = parse(p) else {
            return Outcome::Dropped(Drop::Unsupported);
        };
        let a = self.addrs;
        if *d.src.ip() == a.tun_ip && d.src.port() == a.listen_port && *d.dst.ip() == a.gateway {
            return self.inbound(p, &Datagram::V4(d), now);
        }
        if *d.dst.ip() == a.gateway || *d.dst.ip() == a.tun_ip {
            return Outcome::Dropped(Drop::Loop);
        }
        self.outbound(p, &Datagram::V4(d), now)
    }

    /// [`UdpNat::translate`] for an IPv6 UDP datagram.
    pub fn translate6(&mut self, p: &mut [u8], now: u64) -> Outcome {
        let Some(a) = self.addrs6 else {
            return Outcome::Dropped(Drop::Unsupported);
        };
        let d = match packet6::parse_udp(p) {
            Ok(d) => d,
            Err(skip) => return Outcome::Dropped(drop6(skip)),
        };
        if *d.src.ip() == a.tun_ip && d.src.port() == a.listen_port && *d.dst.ip() == a.gateway {
            return self.inbound(p, &Datagram::V6(d), now);
        }
        if *d.dst.ip() == a.gateway || *d.dst.ip() == a.tun_ip {
            return Outcome::Dropped(Drop::Loop);
        }
        self.outbound(p, &Datagram::V6(d), now)
    }

    fn inbound(&mut self, p: &mut [u8], d: &Datagram, now: u64) -> Outcome {
        let Some(i) = self.table.index(d.dst().port()) else {
            return Outcome::Dropped(Drop::NoFlow);
        };
        let Some(flow) = self.flows[i].as_mut() else {
            return Outcome::Dropped(Drop::NoFlow);
        };
        if flow.app.is_ipv4() != d.dst().is_ipv4() {
            return Outcome::Dropped(Drop::NoFlow);
        }
        flow.last = now;
        flow.replied = true;
        let (src, dst) = (flow.dst, flow.app);
        d.rewrite(p, src, dst);
        Outcome::Inbound(d.payload())
    }

    fn outbound(&mut self, p: &mut [u8], d: &Datagram, now: u64) -> Outcome {
        let key = (d.src(), d.dst());
        let i = match self.by_app.get(&key) {
            Some(&i) => i,
            None => match self.allocate(key, now) {
                Some(i) => i,
                None => return Outcome::Dropped(Drop::Full),
            },
        };
        let local = local_side(
            &self.addrs,
            self.addrs6,
            d.src().is_ipv6(),
            self.table.port(i),
        );
        let Some((src, dst)) = local else {
            return Outcome::Dropped(Drop::Unsupported);
        };
        let Some(flow) = self.flows[i].as_mut() else {
            return Outcome::Dropped(Drop::NoFlow);
        };
        flow.last = now;
        d.rewrite(p, src, dst);
        Outcome::Outbound(d.payload())
    }

    fn allocate(&mut self, (app, dst): (SocketAddr, SocketAddr), now: u64) -> Option<usize> {
        // reused as late as possible, so a core still relaying the previous flow of a port sees
        // the new destination in the table and starts afresh
        let i = super::nat::next_free(&self.flows, &mut self.next)?;
        self.flows[i] = Some(Flow {
            app,
            dst,
            last: now,
            replied: false,
        });
        self.by_app.insert((app, dst), i);
        self.table.publish(i, app, dst);
        Some(i)
    }

    /// Frees flows that have been quiet too long; returns how many.
    pub fn sweep(&mut self, now: u64) -> usize {
        let mut freed = 0;
        for i in 0..self.flows.len() {
            let Some(flow) = &self.flows[i] else {
                continue;
            };
            if flow.expired(now) {
                self.by_app.remove(&(flow.app, flow.dst));
                self.flows[i] = None;
                self.table.clear(i);
                freed += 1;
            }
        }
        freed
    }

    pub fn open_flows(&self) -> usize {
        self.by_app.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tun::packet::tests::{fold, sum_words};

    fn sa(s: &str) -> SocketAddrV4 {
        s.parse().expect("address")
    }

    /// The IP and UDP checksums computed from scratch (UDP: 0 stays "none").
    fn full_checksums(p: &[u8]) -> (u16, u16) {
        let ihl = usize::from(p[0] & 0x0f) * 4;
        let total = usize::from(read16(p, 2));
        let mut header = p[..ihl].to_vec();
        header[10] = 0;
        header[11] = 0;
        let ip = fold(sum_words(&header));
        let mut d = p[ihl..total].to_vec();
        d[6] = 0;
        d[7] = 0;
        let pseudo = sum_words(&p[12..20]) + u32::from(IPPROTO_UDP) + (total - ihl) as u32;
        let udp = match fold(pseudo + sum_words(&d)) {
            0 => 0xffff,
            c => c,
        };
        (ip, udp)
    }

    /// A valid IPv4 UDP datagram; with `checksum: false` its UDP checksum is 0 (none).
    fn datagram(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8], checksum: bool) -> Vec<u8> {
        let total = 28 + payload.len();
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[6] = 0x40;
        p[8] = 64;
        p[9] = IPPROTO_UDP;
        p[12..16].copy_from_slice(&src.ip().octets());
        p[16..20].copy_from_slice(&dst.ip().octets());
        p[20..22].copy_from_slice(&src.port().to_be_bytes());
        p[22..24].copy_from_slice(&dst.port().to_be_bytes());
        p[24..26].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        p[28..].copy_from_slice(payload);
        let (ip, udp) = full_checksums(&p);
        write16(&mut p, 10, ip);
        if checksum {
            write16(&mut p, 26, udp);
        }
        p
    }

    fn checksums_ok(p: &[u8]) -> bool {
        let (ip, udp) = full_checksums(p);
        let carried = read16(p, 26);
        read16(p, 10) == ip && (carried == 0 || carried == udp)
    }

    #[test]
    fn parses_addresses_ports_and_payload() {
        let p = datagram(sa("10.255.0.2:40000"), sa("192.0.2.7:7000"), b"ping", true);
        let d = parse(&p).expect("udp");
        assert_eq!(
            (d.src, d.dst, d.payload),
            (sa("10.255.0.2:40000"), sa("192.0.2.7:7000"), 4)
        );
    }

    #[test]
    fn incremental_rewrite_equals_a_full_recomputation() {
        for payload in [&b""[..], b"x", b"hello world", &[0xff; 1001]] {
            let mut p = datagram(
                sa("10.255.0.2:65535"),
                sa("255.254.253.252:1"),
                payload,
                true,
            );
            let d = parse(&p).expect("udp");
            rewrite(&mut p, &d, sa("10.255.0.1:10007"), sa("10.255.0.2:39999"));
            let after = parse(&p).expect("still udp");
            assert_eq!(
                (after.src, after.dst),
                (sa("10.255.0.1:10007"), sa("10.255.0.2:39999"))
            );
            assert_eq!(after.payload, payload.len());
            let (ip, udp) = full_checksums(&p);
            assert_eq!(read16(&p, 10), ip, "ip checksum, payload {}", payload.len());
            assert_eq!(
                read16(&p, 26),
                udp,
                "udp checksum, payload {}",
                payload.len()
            );
        }
    }

    #[test]
    fn a_zero_checksum_stays_none_and_a_computed_zero_is_sent_as_all_ones() {
        let mut p = datagram(sa("10.255.0.2:5000"), sa("192.0.2.7:7000"), b"abc", false);
        let d = parse(&p).expect("udp");
        rewrite(&mut p, &d, sa("10.255.0.1:10000"), sa("10.255.0.2:6000"));
        assert_eq!(read16(&p, 26), 0, "no checksum stays no checksum");
        assert_eq!(read16(&p, 10), full_checksums(&p).0);

        // find a source port for which the rewritten datagram's checksum computes to zero
        let template = datagram(sa("10.255.0.2:5000"), sa("192.0.2.7:7000"), b"zz", true);
        let d = parse(&template).expect("udp");
        let zero = (0..=u16::MAX)
            .find(|&port| {
                let mut q = template.clone();
                rewrite(
                    &mut q,
                    &d,
                    sa(&format!("10.255.0.1:{port}")),
                    sa("10.255.0.2:6000"),
                );
                let (_, udp) = full_checksums(&q);
                // full_checksums maps a computed 0 to 0xffff; find where the raw sum is 0
                let ihl = 20;
                let total = q.len();
                let mut body = q[ihl..total].to_vec();
                body[6] = 0;
                body[7] = 0;
                let pseudo = sum_words(&q[12..20]) + 17 + (total - ihl) as u32;
                udp == 0xffff && fold(pseudo + sum_words(&body)) == 0
            })
            .expect("some port makes the checksum zero");
        let mut q = template.clone();
        rewrite(
            &mut q,
            &d,
            sa(&format!("10.255.0.1:{zero}")),
            sa("10.255.0.2:6000"),
        );
        assert_eq!(read16(&q, 26), 0xffff);
    }

    #[test]
    fn refuses_what_is_not_a_whole_ipv4_udp_datagram() {
        let good = datagram(sa("1.2.3.4:1"), sa("5.6.7.8:2"), b"data", true);
        assert_eq!(parse(&[]), Err(NotUdp::Truncated));
        assert_eq!(parse(&good[..25]), Err(NotUdp::Truncated));
        let mut v6 = good.clone();
        v6[0] = 0x60;
        assert_eq!(parse(&v6), Err(NotUdp::NotIpv4));
        let mut tcp = good.clone();
        tcp[9] = 6;
        assert_eq!(parse(&tcp), Err(NotUdp::OtherProtocol));
        let mut frag = good.clone();
        frag[7] = 1; // a fragment offset
        assert_eq!(parse(&frag), Err(NotUdp::Fragment));
        let mut long = good.clone();
        long[24..26].copy_from_slice(&100u16.to_be_bytes());
        assert_eq!(parse(&long), Err(NotUdp::Truncated));
        let mut short = good;
        short[24..26].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(parse(&short), Err(NotUdp::Truncated));
        // no input panics, whatever its bytes
        for len in 0..40 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 37 + 0x45) as u8).collect();
            let _ = parse(&junk);
        }
    }

    fn nat(ports: usize) -> (UdpNat, Arc<NatTable>) {
        let table = Arc::new(NatTable::new(10000, ports));
        let addrs = NatAddresses {
            tun_ip: Ipv4Addr::new(10, 255, 0, 2),
            listen_port: 7001,
            gateway: Ipv4Addr::new(10, 255, 0, 1),
        };
        (UdpNat::new(addrs, table.clone()), table)
    }

    #[test]
    fn a_flow_is_translated_both_ways_and_published() {
        let (mut t, table) = nat(8);
        let (app, dst) = (sa("10.255.0.2:40000"), sa("192.0.2.7:7000"));
        let mut out = datagram(app, dst, b"ping", true);
        assert_eq!(t.translate(&mut out, 0), Outcome::Outbound(4));
        let d = parse(&out).expect("udp");
        assert_eq!(
            (d.src, d.dst),
            (sa("10.255.0.1:10000"), sa("10.255.0.2:7001"))
        );
        assert!(checksums_ok(&out));
        assert_eq!(table.lookup(10000), Some(dst.into()));

        let mut reply = datagram(
            sa("10.255.0.2:7001"),
            sa("10.255.0.1:10000"),
            b"pong!",
            true,
        );
        assert_eq!(t.translate(&mut reply, 1), Outcome::Inbound(5));
        let d = parse(&reply).expect("udp");
        assert_eq!((d.src, d.dst), (dst, app));
        assert!(checksums_ok(&reply));

        // the same pair keeps its port; another destination gets its own
        let mut again = datagram(app, dst, b"", true);
        assert_eq!(t.translate(&mut again, 2), Outcome::Outbound(0));
        assert_eq!(parse(&again).expect("udp").src.port(), 10000);
        let mut other = datagram(app, sa("192.0.2.8:7000"), b"", false);
        assert_eq!(t.translate(&mut other, 2), Outcome::Outbound(0));
        assert_eq!(parse(&other).expect("udp").src.port(), 10001);
        assert_eq!(read16(&other, 26), 0);
        assert_eq!(t.open_flows(), 2);
    }

    #[test]
    fn an_ipv6_datagram_goes_to_the_ipv6_socket_and_back() {
        use crate::tun::packet6::tests::{checksum_at, full_checksum, packet6, sa6};
        use crate::tun::packet6::IPPROTO_UDP as UDP;
        let (t, table) = nat(8);
        let mut t = t.with_v6(NatAddresses6 {
            tun_ip: "fd7a:5359::2".parse().expect("ip"),
            listen_port: 7007,
            gateway: "fd7a:5359::1".parse().expect("ip"),
        });
        let (app, dst) = (sa6("[fd7a:5359::2]:40000"), sa6("[2001:db8::7]:53"));
        let mut out = packet6(UDP, app, dst, 0, b"ping");
        assert_eq!(t.translate6(&mut out, 0), Outcome::Outbound(4));
        let d = packet6::parse_udp(&out).expect("udp");
        assert_eq!(
            (d.src, d.dst),
            (sa6("[fd7a:5359::1]:10000"), sa6("[fd7a:5359::2]:7007"))
        );
        assert_eq!(checksum_at(&out), full_checksum(&out));
        assert_eq!(table.lookup(10000), Some(dst.into()));
        let mut reply = packet6(UDP, d.dst, d.src, 0, b"pong!");
        assert_eq!(t.translate6(&mut reply, 1), Outcome::Inbound(5));
        let back = packet6::parse_udp(&reply).expect("udp");
        assert_eq!((back.src, back.dst), (dst, app));
        assert_eq!(checksum_at(&reply), full_checksum(&reply));
        // an IPv4 reply to the IPv6 flow's port is no flow of its
        let mut wrong = datagram(sa("10.255.0.2:7001"), sa("10.255.0.1:10000"), b"x", true);
        assert_eq!(t.translate(&mut wrong, 1), Outcome::Dropped(Drop::NoFlow));
    }

    #[test]
    fn stray_replies_loops_and_a_full_table_are_dropped() {
        let (mut t, _) = nat(1);
        let mut stray = datagram(sa("10.255.0.2:7001"), sa("10.255.0.1:10000"), b"x", true);
        assert_eq!(t.translate(&mut stray, 0), Outcome::Dropped(Drop::NoFlow));
        let mut outside = datagram(sa("10.255.0.2:7001"), sa("10.255.0.1:9999"), b"x", true);
        assert_eq!(t.translate(&mut outside, 0), Outcome::Dropped(Drop::NoFlow));
        let mut to_gateway = datagram(sa("10.255.0.2:1"), sa("10.255.0.1:80"), b"x", true);
        assert_eq!(
            t.translate(&mut to_gateway, 0),
            Outcome::Dropped(Drop::Loop)
        );
        let mut a = datagram(sa("10.255.0.2:1"), sa("192.0.2.9:9"), b"x", true);
        assert_eq!(t.translate(&mut a, 0), Outcome::Outbound(1));
        let mut b = datagram(sa("10.255.0.2:2"), sa("192.0.2.9:9"), b"x", true);
        assert_eq!(t.translate(&mut b, 0), Outcome::Dropped(Drop::Full));
    }

    #[test]
    fn quiet_flows_expire_sooner_when_never_answered() {
        let (mut t, table) = nat(4);
        let dst = sa("192.0.2.9:9");
        let mut a = datagram(sa("10.255.0.2:1"), dst, b"x", true);
        let mut b = datagram(sa("10.255.0.2:2"), dst, b"x", true);
        t.translate(&mut a, 0);
        t.translate(&mut b, 0);
        let mut reply = datagram(sa("10.255.0.2:7001"), sa("10.255.0.1:10001"), b"y", true);
        assert_eq!(t.translate(&mut reply, 10), Outcome::Inbound(1));
        assert_eq!(t.sweep(UNREPLIED_TIMEOUT - 1), 0);
        assert_eq!(t.sweep(UNREPLIED_TIMEOUT), 1, "the unanswered flow");
        assert_eq!(table.lookup(10000), None);
        assert_eq!(table.lookup(10001), Some(dst.into()));
        assert_eq!(t.sweep(10 + REPLIED_TIMEOUT - 1), 0);
        assert_eq!(t.sweep(10 + REPLIED_TIMEOUT), 1);
        assert_eq!(t.open_flows(), 0);
        // a freed pair opens a new flow on the next port (round robin)
        let mut again = datagram(sa("10.255.0.2:1"), dst, b"x", true);
        assert_eq!(t.translate(&mut again, 500), Outcome::Outbound(1));
        assert_eq!(parse(&again).expect("udp").src.port(), 10002);
    }
}
