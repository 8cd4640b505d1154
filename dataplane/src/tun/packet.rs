//! IPv4/TCP header access and address rewriting for the TUN path's NAT. Runtime-free.
//!
//! Only what the NAT needs: the addresses, ports and flags of an IPv4 TCP packet, and rewriting
//! the source or destination with incremental checksum updates (RFC 1624), so a rewrite costs a
//! few additions whatever the payload size. Two checksum cases ([`Checksum`]): a packet whose
//! TCP checksum is complete, and one whose checksum the kernel left to "the device" (a TUN with
//! offloads: the field holds only the pseudo-header sum). Anything else (IPv6, UDP, ICMP, fragments, options
//! that make the header shorter than it claims) is reported as not rewritable.

use std::net::{Ipv4Addr, SocketAddrV4};

/// TCP flag bits.
pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const ACK: u8 = 0x10;

/// The addressing of one IPv4 TCP segment, with the header offsets to rewrite it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpV4 {
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub flags: u8,
    /// TCP payload length.
    pub payload: usize,
    /// Offset of the TCP header.
    tcp: usize,
}

impl TcpV4 {
    /// Offset of the TCP header in the packet (where a pending checksum starts).
    pub fn tcp_offset(&self) -> usize {
        self.tcp
    }
}

/// Offset of the checksum in the TCP header.
pub const TCP_CHECKSUM_OFFSET: usize = 16;

/// What the TCP checksum field of a packet holds, and so how a rewrite updates it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checksum {
    /// The complete checksum (complemented sum of pseudo-header, header and payload): every
    /// changed word — addresses and ports — is folded in with RFC 1624's complement update.
    Full,
    /// Pending (`CHECKSUM_PARTIAL`, virtio `NEEDS_CSUM`): the field holds the *uncomplemented*
    /// sum of the pseudo-header only, and whoever finishes it sums the TCP header and payload
    /// from the header's start. So only the addresses (pseudo-header words) are folded in,
    /// without the complement; the ports are summed later with the rest of the header.
    Partial,
}

/// Why a packet is not handled by the NAT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    NotIpv4,
    /// Another transport protocol than the one asked for (TCP, for [`parse`]).
    NotTcp,
    Fragment,
    Truncated,
    /// An IPv6 packet with extension headers (fragments included) before its transport header.
    Extension,
}

/// The header and total length of a whole IPv4 packet carrying `protocol` (fragments are
/// skipped: only the first carries the ports; the pump reassembles them before the NAT, see
/// [`super::frag`]).
pub(super) fn ipv4_lengths(p: &[u8], protocol: u8) -> Result<(usize, usize), Skip> {
    let first = *p.first().ok_or(Skip::Truncated)?;
    if first >> 4 != 4 {
        return Err(Skip::NotIpv4);
    }
    let ihl = usize::from(first & 0x0f) * 4;
    if ihl < 20 || p.len() < ihl {
        return Err(Skip::Truncated);
    }
    let total = usize::from(u16::from_be_bytes([p[2], p[3]]));
    if total < ihl || total > p.len() {
        return Err(Skip::Truncated);
    }
    if p[9] != protocol {
        return Err(Skip::NotTcp);
    }
    // more-fragments flag or a fragment offset: a piece of a bigger segment
    let frag = u16::from_be_bytes([p[6], p[7]]);
    if frag & 0x3fff != 0 {
        return Err(Skip::Fragment);
    }
    Ok((ihl, total))
}

/// Reads an IPv4 TCP packet's addressing (the first fragment of nothing: fragments are skipped).
pub fn parse(p: &[u8]) -> Result<TcpV4, Skip> {
    let (ihl, total) = ipv4_lengths(p, 6)?;
    let tcp = ihl;
    if total < tcp + 20 {
        return Err(Skip::Truncated);
    }
    let data_offset = usize::from(p[tcp + 12] >> 4) * 4;
    if data_offset < 20 || total < tcp + data_offset {
        return Err(Skip::Truncated);
    }
    let ip = |at: usize| Ipv4Addr::new(p[at], p[at + 1], p[at + 2], p[at + 3]);
    let port = |at: usize| u16::from_be_bytes([p[at], p[at + 1]]);
    Ok(TcpV4 {
        src: SocketAddrV4::new(ip(12), port(tcp)),
        dst: SocketAddrV4::new(ip(16), port(tcp + 2)),
        flags: p[tcp + 13],
        payload: total - tcp - data_offset,
        tcp,
    })
}

/// RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m'), for one 16-bit word changing from `old` to `new`.
pub(super) fn adjust(check: u16, old: u16, new: u16) -> u16 {
    let mut sum = u32::from(!check) + u32::from(!old) + u32::from(new);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

pub(super) fn words(ip: Ipv4Addr) -> [u16; 2] {
    let o = ip.octets();
    [
        u16::from_be_bytes([o[0], o[1]]),
        u16::from_be_bytes([o[2], o[3]]),
    ]
}

pub(super) fn read16(p: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([p[at], p[at + 1]])
}

pub(super) fn write16(p: &mut [u8], at: usize, v: u16) {
    p[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// The same change applied to a pending (uncomplemented) sum: S' = S + ~m + m'.
fn adjust_partial(sum: u16, old: u16, new: u16) -> u16 {
    !adjust(!sum, old, new)
}

/// Rewrites the packet's source and destination to `src` and `dst`, updating the IP header
/// checksum and the TCP checksum (whose pseudo-header covers the addresses) incrementally, as
/// `checksum` says the field holds. `seg` must come from [`parse`] of this same buffer.
pub fn rewrite(
    p: &mut [u8],
    seg: &TcpV4,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    checksum: Checksum,
) {
    let mut ip_check = read16(p, 10);
    let tcp_check_at = seg.tcp + TCP_CHECKSUM_OFFSET;
    let mut tcp_check = read16(p, tcp_check_at);
    let pairs = [
        (words(*seg.src.ip()), words(*src.ip()), 12usize),
        (words(*seg.dst.ip()), words(*dst.ip()), 16usize),
    ];
    for (old, new, at) in pairs {
        for i in 0..2 {
            ip_check = adjust(ip_check, old[i], new[i]);
            tcp_check = match checksum {
                Checksum::Full => adjust(tcp_check, old[i], new[i]),
                Checksum::Partial => adjust_partial(tcp_check, old[i], new[i]),
            };
        }
        p[at..at + 4].copy_from_slice(&[new[0].to_be_bytes(), new[1].to_be_bytes()].concat());
    }
    for (old, new, at) in [
        (seg.src.port(), src.port(), seg.tcp),
        (seg.dst.port(), dst.port(), seg.tcp + 2),
    ] {
        if checksum == Checksum::Full {
            tcp_check = adjust(tcp_check, old, new);
        }
        write16(p, at, new);
    }
    write16(p, 10, ip_check);
    write16(p, tcp_check_at, tcp_check);
}

/// Finishes a pending checksum as the device would: sums `p` from `start` to its end (the
/// field at `start + offset` holds the seed) and stores the complement there (0 as 0xffff, as
/// the kernel does, which UDP needs). `None` when the field does not lie inside the packet.
pub fn complete_checksum(p: &mut [u8], start: usize, offset: usize) -> Option<()> {
    let at = start.checked_add(offset)?;
    if at.checked_add(2)? > p.len() {
        return None;
    }
    let mut sum: u64 = 0;
    let mut words = p[start..].chunks_exact(2);
    for w in &mut words {
        sum += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        sum += u64::from(u16::from_be_bytes([*last, 0]));
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let check = match !(sum as u16) {
        0 => 0xffff,
        c => c,
    };
    write16(p, at, check);
    Some(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn fold(mut sum: u32) -> u16 {
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    pub(crate) fn sum_words(data: &[u8]) -> u32 {
        data.chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
            .sum()
    }

    /// Checksums computed from scratch (the reference the incremental update must equal).
    pub(crate) fn full_checksums(p: &[u8]) -> (u16, u16) {
        let ihl = usize::from(p[0] & 0x0f) * 4;
        let total = usize::from(read16(p, 2));
        let mut header = p[..ihl].to_vec();
        header[10] = 0;
        header[11] = 0;
        let ip = fold(sum_words(&header));
        let mut seg = p[ihl..total].to_vec();
        seg[16] = 0;
        seg[17] = 0;
        let pseudo = sum_words(&p[12..20]) + 6 + (total - ihl) as u32;
        let tcp = fold(pseudo + sum_words(&seg));
        (ip, tcp)
    }

    /// A valid IPv4 TCP packet with correct checksums.
    pub(crate) fn packet(
        src: SocketAddrV4,
        dst: SocketAddrV4,
        flags: u8,
        payload: &[u8],
    ) -> Vec<u8> {
        let total = 40 + payload.len();
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[6] = 0x40; // don't fragment
        p[8] = 64;
        p[9] = 6;
        p[12..16].copy_from_slice(&src.ip().octets());
        p[16..20].copy_from_slice(&dst.ip().octets());
        p[20..22].copy_from_slice(&src.port().to_be_bytes());
        p[22..24].copy_from_slice(&dst.port().to_be_bytes());
        p[24..28].copy_from_slice(&0x1234_5678u32.to_be_bytes());
        p[32] = 5 << 4;
        p[33] = flags;
        p[34..36].copy_from_slice(&64240u16.to_be_bytes());
        p[40..].copy_from_slice(payload);
        let (ip, tcp) = full_checksums(&p);
        write16(&mut p, 10, ip);
        write16(&mut p, 36, tcp);
        p
    }

    /// The same packet as the kernel hands it to a device with checksum offload: the TCP
    /// checksum field holds the uncomplemented pseudo-header sum.
    pub(crate) fn partial(
        src: SocketAddrV4,
        dst: SocketAddrV4,
        flags: u8,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut p = packet(src, dst, flags, payload);
        let pseudo = sum_words(&p[12..20]) + 6 + (p.len() - 20) as u32;
        write16(&mut p, 36, !fold(pseudo));
        p
    }

    fn sa(s: &str) -> SocketAddrV4 {
        s.parse().expect("address")
    }

    #[test]
    fn parses_addresses_ports_flags_and_payload() {
        let p = packet(sa("10.255.0.2:40000"), sa("192.0.2.7:443"), SYN, b"abc");
        let seg = parse(&p).expect("tcp");
        assert_eq!(seg.src, sa("10.255.0.2:40000"));
        assert_eq!(seg.dst, sa("192.0.2.7:443"));
        assert_eq!(seg.flags, SYN);
        assert_eq!(seg.payload, 3);
    }

    #[test]
    fn incremental_rewrite_equals_a_full_recomputation() {
        // odd payload lengths and addresses whose words carry into the fold
        for payload in [&b""[..], b"x", b"hello world", &[0xff; 1001]] {
            let mut p = packet(
                sa("10.255.0.2:65535"),
                sa("255.254.253.252:1"),
                ACK,
                payload,
            );
            let seg = parse(&p).expect("tcp");
            rewrite(
                &mut p,
                &seg,
                sa("10.255.0.1:10007"),
                sa("10.255.0.2:39999"),
                Checksum::Full,
            );
            let after = parse(&p).expect("still tcp");
            assert_eq!(after.src, sa("10.255.0.1:10007"));
            assert_eq!(after.dst, sa("10.255.0.2:39999"));
            assert_eq!(after.payload, payload.len());
            let (ip, tcp) = full_checksums(&p);
            assert_eq!(read16(&p, 10), ip, "ip checksum, payload {}", payload.len());
            assert_eq!(
                read16(&p, 36),
                tcp,
                "tcp checksum, payload {}",
                payload.len()
            );
        }
    }

    #[test]
    fn partial_rewrite_then_completion_equals_a_full_recomputation() {
        // what the receiver of a CHECKSUM_PARTIAL packet computes must match a packet built
        // from scratch with the new addresses and ports
        let cases = [
            (
                "10.255.0.2:65535",
                "255.254.253.252:1",
                "10.255.0.1:10007",
                "10.255.0.2:39999",
            ),
            (
                "10.255.0.2:7000",
                "10.255.0.1:10000",
                "192.0.2.9:443",
                "10.255.0.2:40000",
            ),
            (
                "0.0.0.1:0",
                "255.255.255.255:65535",
                "255.255.255.255:65535",
                "0.0.0.0:0",
            ),
        ];
        for (from_src, from_dst, to_src, to_dst) in cases {
            for payload in [&b""[..], b"x", &[0xff; 1001], &[0x5a; 65000]] {
                let mut p = partial(sa(from_src), sa(from_dst), ACK, payload);
                let seg = parse(&p).expect("tcp");
                rewrite(&mut p, &seg, sa(to_src), sa(to_dst), Checksum::Partial);
                let expected = partial(sa(to_src), sa(to_dst), ACK, payload);
                assert_eq!(
                    p, expected,
                    "partial sum after rewrite, {from_src} → {to_src}"
                );
                complete_checksum(&mut p, 20, TCP_CHECKSUM_OFFSET).expect("inside");
                let (ip, tcp) = full_checksums(&p);
                assert_eq!(read16(&p, 10), ip);
                assert_eq!(read16(&p, 36), tcp, "payload {}", payload.len());
            }
        }
    }

    #[test]
    fn a_full_update_on_a_partial_packet_would_be_wrong() {
        // the two cases really differ: the full-checksum update corrupts a pending sum
        let mut p = partial(sa("10.255.0.2:40000"), sa("192.0.2.9:443"), ACK, b"data");
        let seg = parse(&p).expect("tcp");
        rewrite(
            &mut p,
            &seg,
            sa("10.255.0.1:10000"),
            sa("10.255.0.2:7000"),
            Checksum::Full,
        );
        complete_checksum(&mut p, 20, TCP_CHECKSUM_OFFSET).expect("inside");
        assert_ne!(read16(&p, 36), full_checksums(&p).1);
    }

    #[test]
    fn completion_refuses_a_field_outside_the_packet() {
        let mut p = packet(sa("1.2.3.4:1"), sa("5.6.7.8:2"), SYN, b"odd");
        let len = p.len();
        assert_eq!(complete_checksum(&mut p, len - 1, 0), None);
        assert_eq!(complete_checksum(&mut p, usize::MAX, 2), None);
        assert_eq!(complete_checksum(&mut p, 20, usize::MAX), None);
        assert_eq!(complete_checksum(&mut p, len - 2, 0), Some(()));
    }

    #[test]
    fn refuses_what_is_not_a_whole_ipv4_tcp_segment() {
        let good = packet(sa("1.2.3.4:1"), sa("5.6.7.8:2"), SYN, b"");
        assert_eq!(parse(&[]), Err(Skip::Truncated));
        assert_eq!(parse(&good[..30]), Err(Skip::Truncated));
        let mut v6 = good.clone();
        v6[0] = 0x60;
        assert_eq!(parse(&v6), Err(Skip::NotIpv4));
        let mut udp = good.clone();
        udp[9] = 17;
        assert_eq!(parse(&udp), Err(Skip::NotTcp));
        let mut frag = good.clone();
        frag[6] = 0x20; // more fragments
        assert_eq!(parse(&frag), Err(Skip::Fragment));
        let mut lying = good.clone();
        lying[2..4].copy_from_slice(&2000u16.to_be_bytes());
        assert_eq!(parse(&lying), Err(Skip::Truncated));
        let mut short_ihl = good;
        short_ihl[0] = 0x44;
        assert_eq!(parse(&short_ihl), Err(Skip::Truncated));
    }
}
