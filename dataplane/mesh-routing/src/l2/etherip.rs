//! EtherIP (RFC 3378): an Ethernet frame behind a 2-byte header (version 3, 12 reserved zero
//! bits), carried as IPv4 protocol 97 between two virtual IPs.

use std::net::Ipv4Addr;

use super::{array_at, L2Error};

/// IPv4 protocol number of EtherIP.
pub const IPPROTO_ETHERIP: u8 = 97;
/// The EtherIP header: version 3 in the top four bits, the rest reserved (zero).
pub const ETHERIP_HEADER: [u8; 2] = [0x30, 0x00];
/// TTL of packets we originate; hop-by-hop forwarding decrements it.
pub const DEFAULT_TTL: u8 = 64;
const IPV4_HEADER_LEN: usize = 20;
/// Largest frame that fits one IPv4 packet behind both headers.
pub const MAX_FRAME: usize = u16::MAX as usize - IPV4_HEADER_LEN - ETHERIP_HEADER.len();
/// An Ethernet header: destination, source, EtherType.
pub const ETHERNET_HEADER_LEN: usize = 14;

/// A decapsulated EtherIP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtherIp<'a> {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub ttl: u8,
    pub frame: &'a [u8],
}

/// The RFC 1071 checksum of an IPv4 header (0 over a header with a valid checksum field).
pub fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut words = header.chunks_exact(2);
    let mut sum: u64 = (&mut words)
        .filter_map(|w| array_at::<2>(w, 0))
        .map(|w| u64::from(u16::from_be_bytes(w)))
        .sum();
    if let Some(&last) = words.remainder().first() {
        sum += u64::from(last) << 8;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Wraps `frame` into an IPv4 EtherIP packet from `src` to `dst` (don't-fragment set: the
/// device MTU is chosen so a frame fits the session MTU). `ident` is the IPv4 identification.
pub fn encapsulate(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ident: u16,
    ttl: u8,
    frame: &[u8],
) -> Result<Vec<u8>, L2Error> {
    if frame.len() > MAX_FRAME {
        return Err(L2Error::FrameTooLarge(frame.len()));
    }
    let total = IPV4_HEADER_LEN + ETHERIP_HEADER.len() + frame.len();
    let mut p = Vec::with_capacity(total);
    p.extend([0x45, 0]);
    p.extend((total as u16).to_be_bytes()); // ≤ u16::MAX by MAX_FRAME
    p.extend(ident.to_be_bytes());
    p.extend([0x40, 0]); // DF, offset 0
    p.extend([ttl, IPPROTO_ETHERIP, 0, 0]);
    p.extend(src.octets());
    p.extend(dst.octets());
    let sum = ipv4_checksum(&p);
    p.splice(10..12, sum.to_be_bytes());
    p.extend(ETHERIP_HEADER);
    p.extend(frame);
    Ok(p)
}

/// Unwraps an IPv4 EtherIP packet, checking version, header length, checksum, protocol,
/// fragmentation and the EtherIP header; bytes past the IPv4 total length are ignored.
pub fn decapsulate(packet: &[u8]) -> Result<EtherIp<'_>, L2Error> {
    let truncated = || L2Error::Truncated("IPv4 header");
    let byte = |i: usize| packet.get(i).copied().ok_or_else(truncated);
    let be16 = |i: usize| {
        array_at::<2>(packet, i)
            .map(u16::from_be_bytes)
            .ok_or_else(truncated)
    };
    let addr = |i: usize| {
        array_at::<4>(packet, i)
            .map(Ipv4Addr::from)
            .ok_or_else(truncated)
    };
    let first = byte(0)?;
    if first >> 4 != 4 {
        return Err(L2Error::NotIpv4);
    }
    let ihl = usize::from(first & 0x0f) * 4;
    if ihl < IPV4_HEADER_LEN {
        return Err(truncated());
    }
    let header = packet.get(..ihl).ok_or_else(truncated)?;
    let total = usize::from(be16(2)?);
    if total < ihl || total > packet.len() {
        return Err(L2Error::Truncated("IPv4 packet"));
    }
    if ipv4_checksum(header) != 0 {
        return Err(L2Error::BadChecksum);
    }
    let proto = byte(9)?;
    if proto != IPPROTO_ETHERIP {
        return Err(L2Error::NotEtherIp(proto));
    }
    if be16(6)? & 0x3fff != 0 {
        return Err(L2Error::Fragmented);
    }
    let body = packet
        .get(ihl..total)
        .ok_or(L2Error::Truncated("IPv4 packet"))?;
    let eh = array_at::<2>(body, 0).ok_or(L2Error::Truncated("EtherIP header"))?;
    if eh != ETHERIP_HEADER {
        return Err(L2Error::BadEtherIpHeader(u16::from_be_bytes(eh)));
    }
    let frame = body.get(2..).unwrap_or_default();
    if frame.len() < ETHERNET_HEADER_LEN {
        return Err(L2Error::Truncated("Ethernet frame"));
    }
    Ok(EtherIp {
        src: addr(12)?,
        dst: addr(16)?,
        ttl: byte(8)?,
        frame,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const A: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);

    fn frame() -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend([0x02, 0, 0, 0, 0, 1, 0x08, 0x06]);
        f.extend([0xaa; 28]);
        f
    }

    #[test]
    fn round_trip_keeps_addresses_ttl_and_frame() {
        let p = encapsulate(A, B, 7, 5, &frame()).unwrap();
        assert_eq!(p.len(), 20 + 2 + frame().len());
        assert_eq!(p[9], 97);
        let d = decapsulate(&p).unwrap();
        assert_eq!((d.src, d.dst, d.ttl, d.frame), (A, B, 5, &frame()[..]));
    }

    #[test]
    fn the_checksum_is_the_internet_checksum() {
        // The classic example header from RFC 1071 discussions (checksum 0xb861).
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(ipv4_checksum(&h), 0xb861);
        let p = encapsulate(A, B, 1, 64, &frame()).unwrap();
        assert_eq!(ipv4_checksum(&p[..20]), 0);
    }

    #[test]
    fn damaged_packets_are_refused() {
        let good = encapsulate(A, B, 1, 64, &frame()).unwrap();
        let mut bad = good.clone();
        bad[15] ^= 1;
        assert_eq!(decapsulate(&bad), Err(L2Error::BadChecksum));
        let mut udp = good.clone();
        udp[9] = 17;
        let sum = {
            udp[10] = 0;
            udp[11] = 0;
            ipv4_checksum(&udp[..20])
        };
        udp[10..12].copy_from_slice(&sum.to_be_bytes());
        assert_eq!(decapsulate(&udp), Err(L2Error::NotEtherIp(17)));
        let mut frag = good.clone();
        frag[6] = 0x20; // MF
        frag[10] = 0;
        frag[11] = 0;
        let sum = ipv4_checksum(&frag[..20]);
        frag[10..12].copy_from_slice(&sum.to_be_bytes());
        assert_eq!(decapsulate(&frag), Err(L2Error::Fragmented));
        let mut ver = good.clone();
        ver[20] = 0x40;
        assert_eq!(decapsulate(&ver), Err(L2Error::BadEtherIpHeader(0x4000)));
        for cut in 0..good.len() {
            assert!(decapsulate(&good[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(decapsulate(&[0x60; 40]), Err(L2Error::NotIpv4));
    }

    #[test]
    fn padding_after_the_total_length_is_ignored() {
        let mut p = encapsulate(A, B, 1, 64, &frame()).unwrap();
        p.extend([0; 8]);
        assert_eq!(decapsulate(&p).unwrap().frame, &frame()[..]);
    }

    #[test]
    fn oversized_frames_are_refused() {
        assert_eq!(
            encapsulate(A, B, 1, 64, &vec![0; MAX_FRAME + 1]),
            Err(L2Error::FrameTooLarge(MAX_FRAME + 1))
        );
        assert!(encapsulate(A, B, 1, 64, &vec![0; MAX_FRAME]).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn random_packets_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..128)) {
            let _ = decapsulate(&bytes);
        }
    }
}
