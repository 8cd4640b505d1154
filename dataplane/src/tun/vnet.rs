//! The virtio-net header that a TUN device opened with `IFF_VNET_HDR` puts before every packet,
//! and what the pump does with it before the NAT sees the packet. Runtime-free.
//!
//! With offloads on (`TUNSETOFFLOAD`: checksum, TSO4, TSO6) the kernel hands the pump TCP
//! super-packets of up to 64 KiB (`gso_type` TCPv4, `gso_size` = MSS) whose TCP checksum is left
//! for "the device" (`NEEDS_CSUM`: the checksum field holds the uncomplemented pseudo-header sum,
//! the rest is summed from `csum_start`), and takes such packets back the same way. So one read
//! and one write move ~45 segments, and the NAT rewrites one header for all of them — the reason
//! the VPN path uses the header (see `packet::Checksum` for the two checksum cases).
//!
//! Layout (legacy virtio, the device's native byte order, 10 bytes): flags u8, gso_type u8,
//! hdr_len u16, gso_size u16, csum_start u16, csum_offset u16.

use super::packet::{self, Checksum};
use super::packet6;

/// Bytes of the header (`struct virtio_net_hdr`, the TUN default `TUNSETVNETHDRSZ`).
pub const LEN: usize = 10;

/// `flags`: the checksum from `csum_start` is still to be computed (CHECKSUM_PARTIAL).
pub const F_NEEDS_CSUM: u8 = 1;
/// `gso_type` values.
pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
pub const GSO_TCPV6: u8 = 4;
/// Flag bit of `gso_type`: the segments carry ECN (CWR on the first only).
pub const GSO_ECN: u8 = 0x80;

/// One `struct virtio_net_hdr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VnetHeader {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHeader {
    /// Reads the header at the start of `b`; `None` when `b` is shorter than [`LEN`].
    pub fn parse(b: &[u8]) -> Option<VnetHeader> {
        let b: &[u8; LEN] = b.get(..LEN)?.try_into().ok()?;
        let u16_at = |at: usize| u16::from_ne_bytes([b[at], b[at + 1]]);
        Some(VnetHeader {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        })
    }

    /// The header's bytes, ready to precede a packet written to the device.
    pub fn to_bytes(self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
        b
    }

    fn is_gso(&self) -> bool {
        self.gso_type & !GSO_ECN != GSO_NONE
    }
}

/// Why a packet read with a virtio-net header cannot go to the NAT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Shorter than its header.
    Truncated,
    /// A super-packet or partial checksum the NAT cannot rewrite (not IPv4 TCP, or a checksum
    /// position that does not lie inside the packet).
    Offload,
}

/// Readies one packet read from the device (header `hdr`, packet `p` after it) for the NAT and
/// says how its TCP checksum must be rewritten:
/// - no pending checksum: [`Checksum::Full`], the header goes back unchanged;
/// - an IPv4 TCP packet (single or GSO) whose pending checksum is the TCP one:
///   [`Checksum::Partial`], the header goes back unchanged and the kernel finishes the checksum
///   (or trusts it on local delivery);
/// - any other single packet with a pending checksum (UDP, say): the checksum is completed here
///   and `NEEDS_CSUM` cleared, so the NAT sees an ordinary packet ([`Checksum::Full`]);
/// - any other super-packet: refused.
pub fn prepare(hdr: &mut VnetHeader, p: &mut [u8]) -> Result<Checksum, Refused> {
    if hdr.flags & F_NEEDS_CSUM == 0 {
        // a super-packet always carries a pending checksum; one without is malformed
        return if hdr.is_gso() {
            Err(Refused::Offload)
        } else {
            Ok(Checksum::Full)
        };
    }
    let (start, offset) = (usize::from(hdr.csum_start), usize::from(hdr.csum_offset));
    // the TCP header's offset and the super-packet type of its family
    let tcp = match packet::parse(p) {
        Ok(seg) => Some((seg.tcp_offset(), GSO_TCPV4)),
        Err(_) => packet6::parse_tcp(p)
            .ok()
            .map(|seg| (seg.transport_offset(), GSO_TCPV6)),
    };
    if let Some((at, family_gso)) = tcp {
        if at == start && offset == packet::TCP_CHECKSUM_OFFSET {
            let gso = hdr.gso_type & !GSO_ECN;
            return if gso == GSO_NONE || gso == family_gso {
                Ok(Checksum::Partial)
            } else {
                Err(Refused::Offload)
            };
        }
    }
    if hdr.is_gso() {
        return Err(Refused::Offload);
    }
    packet::complete_checksum(p, start, offset).ok_or(Refused::Offload)?;
    hdr.flags &= !F_NEEDS_CSUM;
    Ok(Checksum::Full)
}

#[cfg(test)]
mod tests {
    use super::super::packet::tests::{full_checksums, packet, partial};
    use super::super::packet::{ACK, SYN};
    use super::super::packet6::tests::{packet6, sa6};
    use super::super::packet6::IPPROTO_TCP;
    use super::*;
    use std::net::SocketAddrV4;

    fn sa(s: &str) -> SocketAddrV4 {
        s.parse().expect("address")
    }

    fn tcp_partial_header(gso_type: u8) -> VnetHeader {
        VnetHeader {
            flags: F_NEEDS_CSUM,
            gso_type,
            hdr_len: 40,
            gso_size: if gso_type == GSO_NONE { 0 } else { 1380 },
            csum_start: 20,
            csum_offset: 16,
        }
    }

    #[test]
    fn the_header_round_trips_and_short_input_is_none() {
        let h = VnetHeader {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4 | GSO_ECN,
            hdr_len: 52,
            gso_size: 1448,
            csum_start: 20,
            csum_offset: 16,
        };
        assert_eq!(VnetHeader::parse(&h.to_bytes()), Some(h));
        assert_eq!(VnetHeader::parse(&h.to_bytes()[..LEN - 1]), None);
        // the device's byte order: little-endian on every target the appliance runs on
        if cfg!(target_endian = "little") {
            assert_eq!(h.to_bytes(), [1, 0x81, 52, 0, 0xa8, 5, 20, 0, 16, 0]);
        }
    }

    #[test]
    fn tcp_with_a_pending_checksum_is_rewritten_as_partial_and_keeps_its_header() {
        for gso in [GSO_NONE, GSO_TCPV4, GSO_TCPV4 | GSO_ECN] {
            let mut p = partial(sa("10.255.0.2:40000"), sa("192.0.2.1:443"), ACK, &[7; 3000]);
            let mut h = tcp_partial_header(gso);
            let before = h;
            assert_eq!(prepare(&mut h, &mut p), Ok(Checksum::Partial));
            assert_eq!(h, before);
        }
        // an IPv6 super-packet, and TSO4 claimed for it
        let (src, dst) = (sa6("[fd7a::2]:40000"), sa6("[2001:db8::1]:443"));
        let mut p6 = packet6(IPPROTO_TCP, src, dst, ACK, &[7; 3000]);
        let mut h6 = VnetHeader {
            csum_start: 40,
            hdr_len: 60,
            ..tcp_partial_header(GSO_TCPV6)
        };
        assert_eq!(prepare(&mut h6, &mut p6), Ok(Checksum::Partial));
        h6.gso_type = GSO_TCPV4;
        assert_eq!(prepare(&mut h6, &mut p6), Err(Refused::Offload));
        // TSO6 on an IPv4 packet, or a TCP super-packet without its pending checksum
        let mut p = partial(sa("10.255.0.2:40000"), sa("192.0.2.1:443"), ACK, &[7; 3000]);
        assert_eq!(
            prepare(&mut tcp_partial_header(GSO_TCPV6), &mut p),
            Err(Refused::Offload)
        );
        let mut h = tcp_partial_header(GSO_TCPV4);
        h.flags = 0;
        assert_eq!(prepare(&mut h, &mut p), Err(Refused::Offload));
    }

    #[test]
    fn a_packet_without_a_pending_checksum_is_a_full_checksum_packet() {
        let mut p = packet(sa("10.255.0.2:40000"), sa("192.0.2.1:443"), SYN, b"");
        let mut h = VnetHeader::default();
        assert_eq!(prepare(&mut h, &mut p), Ok(Checksum::Full));
        assert_eq!(h, VnetHeader::default());
    }

    #[test]
    fn another_pending_checksum_is_completed_here_and_cleared() {
        // a UDP datagram whose checksum the kernel left pending (offset 6 in the UDP header)
        let mut p = partial(sa("10.255.0.2:5353"), sa("192.0.2.1:53"), 0, b"query!");
        p[9] = 17;
        let total = p.len();
        p[24..26].copy_from_slice(&((total - 20) as u16).to_be_bytes());
        let udp_seed = {
            let pseudo = packet::tests::sum_words(&p[12..20]) + 17 + (total - 20) as u32;
            !packet::tests::fold(pseudo)
        };
        p[26..28].copy_from_slice(&udp_seed.to_be_bytes());
        let mut h = VnetHeader {
            flags: F_NEEDS_CSUM,
            csum_start: 20,
            csum_offset: 6,
            ..VnetHeader::default()
        };
        assert_eq!(prepare(&mut h, &mut p), Ok(Checksum::Full));
        assert_eq!(h.flags & F_NEEDS_CSUM, 0);
        // the datagram now verifies: the sum over pseudo-header and datagram is all ones
        let pseudo = packet::tests::sum_words(&p[12..20]) + 17 + (total - 20) as u32;
        assert_eq!(
            packet::tests::fold(pseudo + packet::tests::sum_words(&p[20..])),
            0
        );
        // a position outside the packet is refused, not a panic
        for (start, offset) in [(20, u16::MAX), (u16::MAX, 0), (total as u16 - 1, 0)] {
            let mut h = VnetHeader {
                flags: F_NEEDS_CSUM,
                csum_start: start,
                csum_offset: offset,
                ..VnetHeader::default()
            };
            assert_eq!(prepare(&mut h, &mut p), Err(Refused::Offload));
        }
    }

    #[test]
    fn a_full_tcp_checksum_packet_is_not_disturbed_by_prepare() {
        let mut p = packet(sa("10.255.0.2:1"), sa("192.0.2.1:2"), ACK, b"abc");
        let copy = p.clone();
        prepare(&mut VnetHeader::default(), &mut p).expect("full");
        assert_eq!(p, copy);
        assert_eq!(full_checksums(&p).1, u16::from_be_bytes([p[36], p[37]]));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // a cheap deterministic fuzz: random headers over random and mutated real packets
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let base = partial(sa("10.255.0.2:40000"), sa("192.0.2.1:443"), ACK, &[1; 200]);
        for round in 0..20_000 {
            let r = next();
            let len = (r % 300) as usize;
            let mut p: Vec<u8> = if round % 2 == 0 {
                (0..len).map(|_| next() as u8).collect()
            } else {
                let mut p = base.clone();
                p.truncate(len.max(1));
                let at = (r >> 16) as usize % p.len();
                p[at] = (r >> 40) as u8;
                p
            };
            let hb = next().to_le_bytes();
            let mut raw = [0u8; LEN];
            raw[..8].copy_from_slice(&hb);
            raw[8] = (r >> 8) as u8;
            raw[9] = (r >> 24) as u8 & 1;
            raw[0] &= 3;
            if round % 3 == 0 {
                raw[6..8].copy_from_slice(&20u16.to_ne_bytes());
                raw[8..10].copy_from_slice(&16u16.to_ne_bytes());
            }
            let mut h = VnetHeader::parse(&raw).expect("10 bytes");
            if let Ok(mode) = prepare(&mut h, &mut p) {
                if let Ok(seg) = packet::parse(&p) {
                    let to = sa("10.255.0.1:10000");
                    packet::rewrite(&mut p, &seg, to, to, mode);
                }
            }
        }
    }
}
