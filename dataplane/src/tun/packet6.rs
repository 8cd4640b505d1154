//! IPv6 TCP and UDP header access and address rewriting for the TUN path's NAT. Runtime-free.
//!
//! The IPv6 counterpart of [`super::packet`] and [`super::udp_nat`]'s header code: IPv6 has no
//! header checksum, so a rewrite updates only the transport checksum, whose pseudo-header covers
//! the addresses (eight words each) and which is updated incrementally exactly as for IPv4
//! ([`Checksum`] says whether the field is complete or a pending pseudo-header sum). Only a
//! transport header right after the fixed 40-byte header is handled: a packet with extension
//! headers (fragments included) is refused ([`Skip::Extension`]) and the pump drops and counts
//! it — the kernel's own TCP and UDP send none on a path whose MTU they know.

use super::packet::{adjust, read16, write16, Checksum, Skip, TCP_CHECKSUM_OFFSET};
use std::net::{Ipv6Addr, SocketAddrV6};

/// Length of the fixed IPv6 header.
pub const HEADER: usize = 40;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;

/// Extension headers a packet may carry before its transport header (RFC 8200 §4, plus
/// ESP/AH and Mobility, HIP and Shim6, which the NAT does not follow either).
const EXTENSIONS: [u8; 9] = [0, 43, 44, 50, 51, 60, 135, 139, 140];

/// The addressing of one IPv6 TCP segment or UDP datagram, with the offset of its transport
/// header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transport6 {
    pub src: SocketAddrV6,
    pub dst: SocketAddrV6,
    /// TCP flags (0 for UDP).
    pub flags: u8,
    /// Transport payload length.
    pub payload: usize,
    /// Offset of the transport header (always [`HEADER`]).
    at: usize,
}

impl Transport6 {
    /// Offset of the transport header in the packet (where a pending checksum starts).
    pub fn transport_offset(&self) -> usize {
        self.at
    }
}

/// Whether `p` is an IPv6 packet (by its version nibble).
pub fn is_ipv6(p: &[u8]) -> bool {
    p.first().is_some_and(|b| b >> 4 == 6)
}

/// The next header of an IPv6 packet, if it has a whole fixed header.
pub fn next_header(p: &[u8]) -> Option<u8> {
    (is_ipv6(p) && p.len() >= HEADER).then(|| p[6])
}

/// The total length of a whole IPv6 packet whose transport header, `protocol`, follows the
/// fixed header.
fn lengths(p: &[u8], protocol: u8) -> Result<usize, Skip> {
    if !is_ipv6(p) {
        return Err(Skip::NotIpv4);
    }
    if p.len() < HEADER {
        return Err(Skip::Truncated);
    }
    let total = HEADER + usize::from(read16(p, 4));
    if total > p.len() {
        return Err(Skip::Truncated);
    }
    match p[6] {
        next if next == protocol => Ok(total),
        next if EXTENSIONS.contains(&next) => Err(Skip::Extension),
        _ => Err(Skip::NotTcp),
    }
}

fn addresses(p: &[u8]) -> (Ipv6Addr, Ipv6Addr) {
    let ip = |at: usize| {
        let mut o = [0u8; 16];
        o.copy_from_slice(&p[at..at + 16]);
        Ipv6Addr::from(o)
    };
    (ip(8), ip(24))
}

/// Reads an IPv6 TCP segment's addressing.
pub fn parse_tcp(p: &[u8]) -> Result<Transport6, Skip> {
    let total = lengths(p, IPPROTO_TCP)?;
    let at = HEADER;
    if total < at + 20 {
        return Err(Skip::Truncated);
    }
    let data_offset = usize::from(p[at + 12] >> 4) * 4;
    if data_offset < 20 || total < at + data_offset {
        return Err(Skip::Truncated);
    }
    let (src, dst) = addresses(p);
    Ok(Transport6 {
        src: SocketAddrV6::new(src, read16(p, at), 0, 0),
        dst: SocketAddrV6::new(dst, read16(p, at + 2), 0, 0),
        flags: p[at + 13],
        payload: total - at - data_offset,
        at,
    })
}

/// Reads an IPv6 UDP datagram's addressing. A zero checksum is refused: it is mandatory over
/// IPv6 (RFC 8200 §8.1), and an incremental update of "none" would produce a wrong one.
pub fn parse_udp(p: &[u8]) -> Result<Transport6, Skip> {
    let total = lengths(p, IPPROTO_UDP)?;
    let at = HEADER;
    if total < at + 8 {
        return Err(Skip::Truncated);
    }
    let length = usize::from(read16(p, at + 4));
    if length < 8 || at + length > total || read16(p, at + 6) == 0 {
        return Err(Skip::Truncated);
    }
    let (src, dst) = addresses(p);
    Ok(Transport6 {
        src: SocketAddrV6::new(src, read16(p, at), 0, 0),
        dst: SocketAddrV6::new(dst, read16(p, at + 2), 0, 0),
        flags: 0,
        payload: length - 8,
        at,
    })
}

fn words(ip: &Ipv6Addr) -> [u16; 8] {
    ip.segments()
}

/// Rewrites a TCP segment's (`udp == false`) or UDP datagram's source and destination to
/// `src` and `dst`, updating the transport checksum incrementally as `checksum` says the field
/// holds (UDP: always complete; a result of zero is sent as `0xffff`). `t` must come from
/// [`parse_tcp`] / [`parse_udp`] of this same buffer.
pub fn rewrite(
    p: &mut [u8],
    t: &Transport6,
    udp: bool,
    src: SocketAddrV6,
    dst: SocketAddrV6,
    checksum: Checksum,
) {
    let check_at = t.at + if udp { 6 } else { TCP_CHECKSUM_OFFSET };
    let mut check = read16(p, check_at);
    for (old, new, at) in [
        (words(t.src.ip()), words(src.ip()), 8usize),
        (words(t.dst.ip()), words(dst.ip()), 24usize),
    ] {
        for i in 0..8 {
            check = match checksum {
                Checksum::Full => adjust(check, old[i], new[i]),
                Checksum::Partial => !adjust(!check, old[i], new[i]),
            };
            write16(p, at + 2 * i, new[i]);
        }
    }
    for (old, new, at) in [
        (t.src.port(), src.port(), t.at),
        (t.dst.port(), dst.port(), t.at + 2),
    ] {
        if checksum == Checksum::Full {
            check = adjust(check, old, new);
        }
        write16(p, at, new);
    }
    if udp && check == 0 {
        check = 0xffff;
    }
    write16(p, check_at, check);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::packet::tests::{fold, sum_words};
    use super::super::packet::{ACK, SYN};
    use super::*;

    pub(crate) fn sa6(s: &str) -> SocketAddrV6 {
        s.parse().expect("address")
    }

    /// The transport checksum of `p` computed from scratch.
    pub(crate) fn full_checksum(p: &[u8]) -> u16 {
        let next = p[6];
        let len = usize::from(read16(p, 4));
        let mut t = p[HEADER..HEADER + len].to_vec();
        let at = if next == IPPROTO_UDP { 6 } else { 16 };
        t[at] = 0;
        t[at + 1] = 0;
        let pseudo = sum_words(&p[8..40]) + u32::from(next) + len as u32;
        match fold(pseudo + sum_words(&t)) {
            0 if next == IPPROTO_UDP => 0xffff,
            c => c,
        }
    }

    pub(crate) fn checksum_at(p: &[u8]) -> u16 {
        read16(p, HEADER + if p[6] == IPPROTO_UDP { 6 } else { 16 })
    }

    /// A valid IPv6 packet of `protocol` (TCP with `flags`, or UDP) with a correct checksum.
    pub(crate) fn packet6(
        protocol: u8,
        src: SocketAddrV6,
        dst: SocketAddrV6,
        flags: u8,
        payload: &[u8],
    ) -> Vec<u8> {
        let header = if protocol == IPPROTO_UDP { 8 } else { 20 };
        let len = header + payload.len();
        let mut p = vec![0u8; HEADER + len];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&(len as u16).to_be_bytes());
        p[6] = protocol;
        p[7] = 64;
        p[8..24].copy_from_slice(&src.ip().octets());
        p[24..40].copy_from_slice(&dst.ip().octets());
        p[40..42].copy_from_slice(&src.port().to_be_bytes());
        p[42..44].copy_from_slice(&dst.port().to_be_bytes());
        if protocol == IPPROTO_UDP {
            p[44..46].copy_from_slice(&(len as u16).to_be_bytes());
        } else {
            p[52] = 5 << 4;
            p[53] = flags;
            p[54..56].copy_from_slice(&64800u16.to_be_bytes());
        }
        p[HEADER + header..].copy_from_slice(payload);
        let c = full_checksum(&p);
        let at = HEADER + if protocol == IPPROTO_UDP { 6 } else { 16 };
        write16(&mut p, at, c);
        p
    }

    #[test]
    fn parses_tcp_and_udp_after_the_fixed_header() {
        let p = packet6(
            IPPROTO_TCP,
            sa6("[fd7a::2]:40000"),
            sa6("[2001:db8::7]:443"),
            SYN,
            b"abc",
        );
        let t = parse_tcp(&p).expect("tcp");
        assert_eq!(
            (t.src, t.dst, t.flags, t.payload),
            (sa6("[fd7a::2]:40000"), sa6("[2001:db8::7]:443"), SYN, 3)
        );
        assert_eq!(parse_udp(&p), Err(Skip::NotTcp));
        let u = packet6(
            IPPROTO_UDP,
            sa6("[fd7a::2]:5000"),
            sa6("[2001:db8::7]:53"),
            0,
            b"query",
        );
        assert_eq!(parse_udp(&u).expect("udp").payload, 5);
        assert_eq!(parse_tcp(&u), Err(Skip::NotTcp));
    }

    #[test]
    fn incremental_rewrites_equal_a_full_recomputation() {
        for protocol in [IPPROTO_TCP, IPPROTO_UDP] {
            for payload in [&b""[..], b"x", &[0xff; 1001]] {
                let mut p = packet6(
                    protocol,
                    sa6("[fd7a:5359::2]:65535"),
                    sa6("[ffff:fffe::fffd:1]:1"),
                    ACK,
                    payload,
                );
                let udp = protocol == IPPROTO_UDP;
                let t = if udp { parse_udp(&p) } else { parse_tcp(&p) }.expect("parsed");
                let (src, dst) = (sa6("[fd7a:5359::1]:10007"), sa6("[fd7a:5359::2]:7000"));
                rewrite(&mut p, &t, udp, src, dst, Checksum::Full);
                let after = if udp { parse_udp(&p) } else { parse_tcp(&p) }.expect("still");
                assert_eq!((after.src, after.dst), (src, dst));
                assert_eq!(checksum_at(&p), full_checksum(&p), "{protocol} {payload:?}");
            }
        }
    }

    #[test]
    fn a_partial_rewrite_then_completion_equals_a_full_recomputation() {
        let (src, dst) = (sa6("[fd7a::2]:7000"), sa6("[fd7a::1]:10000"));
        let (to_src, to_dst) = (sa6("[2001:db8:ffff::9]:443"), sa6("[fd7a::2]:40000"));
        for payload in [&b""[..], b"x", &[0x5a; 65000]] {
            let mut p = packet6(IPPROTO_TCP, src, dst, ACK, payload);
            let len = u32::from(read16(&p, 4));
            let pending = |p: &[u8]| !fold(sum_words(&p[8..40]) + 6 + len);
            let seed = pending(&p);
            write16(&mut p, HEADER + 16, seed);
            let t = parse_tcp(&p).expect("tcp");
            rewrite(&mut p, &t, false, to_src, to_dst, Checksum::Partial);
            assert_eq!(
                read16(&p, HEADER + 16),
                pending(&p),
                "the new pseudo-header sum"
            );
            super::super::packet::complete_checksum(&mut p, HEADER, 16).expect("inside");
            assert_eq!(checksum_at(&p), full_checksum(&p));
        }
    }

    #[test]
    fn refuses_extension_headers_truncation_and_udp_without_checksum() {
        let good = packet6(
            IPPROTO_TCP,
            sa6("[fd7a::2]:1"),
            sa6("[2001:db8::1]:2"),
            SYN,
            b"",
        );
        for cut in 0..good.len() {
            assert!(parse_tcp(&good[..cut]).is_err(), "{cut}");
        }
        let mut fragment = good.clone();
        fragment[6] = 44;
        assert_eq!(parse_tcp(&fragment), Err(Skip::Extension));
        let mut hop_by_hop = good.clone();
        hop_by_hop[6] = 0;
        assert_eq!(parse_tcp(&hop_by_hop), Err(Skip::Extension));
        let mut v4 = good.clone();
        v4[0] = 0x45;
        assert_eq!(parse_tcp(&v4), Err(Skip::NotIpv4));
        let mut lying = good;
        lying[4..6].copy_from_slice(&2000u16.to_be_bytes());
        assert_eq!(parse_tcp(&lying), Err(Skip::Truncated));
        let mut udp = packet6(
            IPPROTO_UDP,
            sa6("[fd7a::2]:1"),
            sa6("[2001:db8::1]:2"),
            0,
            b"q",
        );
        write16(&mut udp, HEADER + 6, 0);
        assert_eq!(parse_udp(&udp), Err(Skip::Truncated));
    }
}
