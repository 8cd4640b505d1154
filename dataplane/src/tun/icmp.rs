//! ICMP on the TUN path: the packets of ping through the VPN. Runtime-free.
//!
//! The tunnel carries TCP and UDP flows, not raw IP, so an echo request that enters the TUN is
//! answered by the client itself (see [`super::echo`] for how it decides): with an echo reply
//! from the destination ([`echo_reply`]: same identifier, sequence and data, so `ping` matches
//! it), or with an ICMP error from the TUN's gateway as a router would send it
//! ([`error_reply`]): "host unreachable" (ICMP 3/1, ICMPv6 1/3 "address unreachable") when the
//! destination cannot be reached over its route, "communication administratively prohibited"
//! (ICMP 3/13, RFC 1812 §5.2.7.1; ICMPv6 1/1, RFC 4443 §3.1) when the rules refuse it. An
//! IPv4 error quotes the request's header and first 8 bytes (RFC 792), an ICMPv6 error as much
//! of the request as fits in 1280 bytes. ICMP errors themselves are never answered (RFC 1122
//! §3.2.2), nor are requests from the gateway, unspecified, broadcast or multicast sources.
//!
//! Between the pump and the cores an echo request travels as the payload of an IPv4 UDP
//! datagram from `gateway:carrier_port` to the VPN UDP socket ([`carry`]), and its answer back
//! the same way ([`carried_answer`]), so the kernel does the hand-off; [`carrier_port`] depends
//! on the destination only, so `SO_REUSEPORT` brings every request to one destination to the
//! same core.

use crate::mesh::wire::checksum;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const IPPROTO_ICMPV6: u8 = 58;
const ICMPV6_DEST_UNREACHABLE: u8 = 1;
const ICMPV6_ADMIN_PROHIBITED: u8 = 1;
const ICMPV6_ADDRESS_UNREACHABLE: u8 = 3;
const ICMPV6_ECHO_REQUEST: u8 = 128;
const ICMPV6_ECHO_REPLY: u8 = 129;
/// The IPv6 minimum MTU, which an ICMPv6 error must not exceed (RFC 4443 §2.4 (c)).
const IPV6_MIN_MTU: usize = 1280;

const IPPROTO_ICMP: u8 = 1;
const IPPROTO_UDP: u8 = 17;
const ECHO_REPLY: u8 = 0;
const ECHO_REQUEST: u8 = 8;
const DEST_UNREACHABLE: u8 = 3;
const HOST_UNREACHABLE: u8 = 1;
const ADMIN_PROHIBITED: u8 = 13;
/// TTL (hop limit) of the packets the TUN answers with.
const TTL: u8 = 64;

/// The UDP source ports that carry echo requests from the pump to the cores (above the NAT's
/// ports, [`super::nat::FIRST_PORT`] + [`super::nat::PORTS`], so no UDP flow has one).
pub const CARRIER_PORTS: std::ops::Range<u16> = 60_000..64_096;
// a translated UDP flow's NAT port must never look like a carrier port to the cores
const _: () =
    assert!(super::nat::FIRST_PORT as usize + super::nat::PORTS <= CARRIER_PORTS.start as usize);
/// The largest request that is carried (it and its IPv4 and UDP headers fit in one datagram).
const MAX_CARRIED: usize = u16::MAX as usize - 28;

/// Why the TUN answers an echo request with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The destination cannot be reached over its route.
    HostUnreachable,
    /// The client's rules refuse it (no route, a route that carries nothing there).
    Prohibited,
}

/// What an answer written into the TUN is (for the counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    EchoReply,
    Refused(Refusal),
    /// Another ICMP error.
    Other,
}

/// An echo request: its whole IP packet (up to the IP total length), either family.
#[derive(Debug, Clone, Copy)]
pub struct Echo<'a> {
    pub packet: &'a [u8],
    pub src: IpAddr,
    pub dst: IpAddr,
    /// Offset of the ICMP header.
    icmp: usize,
}

impl Echo<'_> {
    pub fn is_ipv6(&self) -> bool {
        self.dst.is_ipv6()
    }
}

/// Reads `packet` as an echo request the TUN answers: IPv4 (whole, not a fragment) or IPv6
/// (no extension headers), from a unicast source; `None` for anything else.
pub fn parse_echo(packet: &[u8]) -> Option<Echo<'_>> {
    match packet.first()? >> 4 {
        4 => parse_echo4(packet),
        6 => parse_echo6(packet),
        _ => None,
    }
}

fn parse_echo4(packet: &[u8]) -> Option<Echo<'_>> {
    let ihl = usize::from(packet[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([*packet.get(2)?, *packet.get(3)?]));
    if ihl < 20 || total < ihl + 8 || packet.len() < total {
        return None;
    }
    // a fragment (first or later) is not a whole request; the pump reassembles before this
    let fragment = u16::from_be_bytes([packet[6], packet[7]]) & 0x3fff;
    if packet[9] != IPPROTO_ICMP || fragment != 0 || packet[ihl] != ECHO_REQUEST {
        return None;
    }
    let src = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
    let dst = Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]);
    if src.is_unspecified() || src.is_broadcast() || src.is_multicast() {
        return None;
    }
    Some(Echo {
        packet: &packet[..total],
        src: IpAddr::V4(src),
        dst: IpAddr::V4(dst),
        icmp: ihl,
    })
}

fn parse_echo6(packet: &[u8]) -> Option<Echo<'_>> {
    if packet.len() < 40 + 8 {
        return None;
    }
    let total = 40 + usize::from(u16::from_be_bytes([packet[4], packet[5]]));
    if packet[6] != IPPROTO_ICMPV6
        || total < 40 + 8
        || total > packet.len()
        || packet[40] != ICMPV6_ECHO_REQUEST
    {
        return None;
    }
    let src = ipv6_at(packet, 8);
    if src.is_unspecified() || src.is_multicast() {
        return None;
    }
    Some(Echo {
        packet: &packet[..total],
        src: IpAddr::V6(src),
        dst: IpAddr::V6(ipv6_at(packet, 24)),
        icmp: 40,
    })
}

fn ipv6_at(p: &[u8], at: usize) -> Ipv6Addr {
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&p[at..at + 16]);
    Ipv6Addr::from(octets)
}

/// The echo reply to the echo request `packet`, from its destination: identifier, sequence
/// number and data kept (IPv4 options are not echoed).
pub fn echo_reply(packet: &[u8]) -> Option<Vec<u8>> {
    let echo = parse_echo(packet)?;
    let message = &echo.packet[echo.icmp..];
    let mut out = match (echo.src, echo.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => ipv4_header(dst, src, message.len())?,
        (IpAddr::V6(src), IpAddr::V6(dst)) => ipv6_header(dst, src, message.len())?,
        _ => return None,
    };
    let at = out.len();
    out.extend_from_slice(message);
    out[at] = if echo.is_ipv6() {
        ICMPV6_ECHO_REPLY
    } else {
        ECHO_REPLY
    };
    finish_icmp(&mut out, at);
    Some(out)
}

/// The ICMP error from `gateway` (the TUN's gateway of the request's family) that refuses the
/// echo request `packet` for `why`; `None` when `packet` is no echo request, the families
/// differ or the request comes from the gateway itself.
pub fn error_reply(packet: &[u8], gateway: IpAddr, why: Refusal) -> Option<Vec<u8>> {
    let echo = parse_echo(packet)?;
    if echo.src == gateway {
        return None;
    }
    let (quoted, kind, code) = match (echo.src, gateway) {
        (IpAddr::V4(_), IpAddr::V4(_)) => (
            &echo.packet[..echo.icmp + 8],
            DEST_UNREACHABLE,
            match why {
                Refusal::HostUnreachable => HOST_UNREACHABLE,
                Refusal::Prohibited => ADMIN_PROHIBITED,
            },
        ),
        (IpAddr::V6(_), IpAddr::V6(_)) => (
            &echo.packet[..echo.packet.len().min(IPV6_MIN_MTU - 40 - 8)],
            ICMPV6_DEST_UNREACHABLE,
            match why {
                Refusal::HostUnreachable => ICMPV6_ADDRESS_UNREACHABLE,
                Refusal::Prohibited => ICMPV6_ADMIN_PROHIBITED,
            },
        ),
        _ => return None,
    };
    let mut out = match (gateway, echo.src) {
        (IpAddr::V4(from), IpAddr::V4(to)) => ipv4_header(from, to, 8 + quoted.len())?,
        (IpAddr::V6(from), IpAddr::V6(to)) => ipv6_header(from, to, 8 + quoted.len())?,
        _ => return None,
    };
    let at = out.len();
    out.extend_from_slice(&[kind, code, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(quoted);
    finish_icmp(&mut out, at);
    Some(out)
}

/// The ICMP error to write back into the TUN for `packet`, when it is an IPv4 ICMP echo request
/// (first fragment or whole) from an address other than `gateway`; `None` for anything else.
pub fn filtered_reply(packet: &[u8], gateway: Ipv4Addr) -> Option<Vec<u8>> {
    error_reply(packet, IpAddr::V4(gateway), Refusal::Prohibited)
}

/// The ICMPv6 error to write back into the TUN for `packet`, when it is an IPv6 ICMPv6 echo
/// request (no extension headers) from a unicast address other than `gateway`; `None` for
/// anything else (errors, neighbour discovery, other protocols are never answered).
pub fn filtered_reply6(packet: &[u8], gateway: Ipv6Addr) -> Option<Vec<u8>> {
    error_reply(packet, IpAddr::V6(gateway), Refusal::Prohibited)
}

/// A 20-byte IPv4 header `src → dst` of an ICMP message of `len` bytes (checksum set).
fn ipv4_header(src: Ipv4Addr, dst: Ipv4Addr, len: usize) -> Option<Vec<u8>> {
    let total = u16::try_from(20 + len).ok()?;
    let mut out = Vec::with_capacity(usize::from(total));
    out.extend_from_slice(&[0x45, 0]);
    out.extend_from_slice(&total.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, TTL, IPPROTO_ICMP, 0, 0]);
    out.extend_from_slice(&src.octets());
    out.extend_from_slice(&dst.octets());
    let check = checksum(&out);
    out[10..12].copy_from_slice(&check.to_be_bytes());
    Some(out)
}

/// A 40-byte IPv6 header `src → dst` of an ICMPv6 message of `len` bytes.
fn ipv6_header(src: Ipv6Addr, dst: Ipv6Addr, len: usize) -> Option<Vec<u8>> {
    let payload = u16::try_from(len).ok()?;
    let mut out = Vec::with_capacity(40 + len);
    out.extend_from_slice(&[0x60, 0, 0, 0]);
    out.extend_from_slice(&payload.to_be_bytes());
    out.extend_from_slice(&[IPPROTO_ICMPV6, TTL]);
    out.extend_from_slice(&src.octets());
    out.extend_from_slice(&dst.octets());
    Some(out)
}

/// Sets the checksum of the ICMP (or ICMPv6) message at `at` of the packet `out`.
fn finish_icmp(out: &mut [u8], at: usize) {
    out[at + 2] = 0;
    out[at + 3] = 0;
    let check = if out[0] >> 4 == 6 {
        icmpv6_checksum(out)
    } else {
        checksum(&out[at..])
    };
    out[at + 2..at + 4].copy_from_slice(&check.to_be_bytes());
}

/// The ICMPv6 checksum of the message after the fixed header of `p` (its checksum field zero),
/// over the pseudo-header of RFC 8200 §8.1.
fn icmpv6_checksum(p: &[u8]) -> u16 {
    let message = &p[40..];
    let mut summed = Vec::with_capacity(40 + message.len());
    summed.extend_from_slice(&p[8..40]);
    summed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    summed.extend_from_slice(&[0, 0, 0, IPPROTO_ICMPV6]);
    summed.extend_from_slice(message);
    checksum(&summed)
}

/// The carrier port of echo requests to `dst`: the same for every request to it.
pub fn carrier_port(dst: IpAddr) -> u16 {
    // FNV-1a over the address
    let octets = match dst {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    let hash = octets.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    });
    let span = u32::from(CARRIER_PORTS.end - CARRIER_PORTS.start);
    CARRIER_PORTS.start + (hash % span) as u16
}

/// Whether `port` is a carrier port.
pub fn is_carrier_port(port: u16) -> bool {
    CARRIER_PORTS.contains(&port)
}

/// Where carried echo requests go and their answers come from: the VPN UDP socket
/// `tun_ip:udp_port`, the carrier ports on `gateway`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Carrier {
    pub tun_ip: Ipv4Addr,
    pub udp_port: u16,
    pub gateway: Ipv4Addr,
}

/// The IPv4 UDP datagram `gateway:carrier_port → tun_ip:udp_port` that carries the echo request
/// `packet` (either family) to a core; `None` when `packet` is no echo request or too large.
/// Its UDP checksum is 0 ("none", RFC 768): the datagram never leaves the machine.
pub fn carry(packet: &[u8], c: &Carrier) -> Option<Vec<u8>> {
    let echo = parse_echo(packet)?;
    if echo.packet.len() > MAX_CARRIED {
        return None;
    }
    Some(udp4(
        (c.gateway, carrier_port(echo.dst)),
        (c.tun_ip, c.udp_port),
        echo.packet,
    ))
}

/// The IPv4 UDP datagram `src → dst` with `payload` and no UDP checksum (`payload` must fit).
fn udp4(src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16), payload: &[u8]) -> Vec<u8> {
    let len = 20 + 8 + payload.len();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&[0x45, 0]);
    out.extend_from_slice(&(len as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0x40, 0, TTL, IPPROTO_UDP, 0, 0]);
    out.extend_from_slice(&src.0.octets());
    out.extend_from_slice(&dst.0.octets());
    let check = checksum(&out);
    out[10..12].copy_from_slice(&check.to_be_bytes());
    out.extend_from_slice(&src.1.to_be_bytes());
    out.extend_from_slice(&dst.1.to_be_bytes());
    out.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(payload);
    out
}

/// When `packet` is a core's answer to a carried request (an IPv4 UDP datagram from
/// `tun_ip:udp_port` to a carrier port of `gateway`): the answer to write into the TUN and what
/// it is. `None` for any other packet, and for a payload that is not an ICMP echo reply or
/// destination-unreachable error of either family.
pub fn carried_answer<'a>(packet: &'a [u8], c: &Carrier) -> Option<(&'a [u8], Answer)> {
    if packet.first()? >> 4 != 4 || packet.get(9) != Some(&IPPROTO_UDP) {
        return None;
    }
    let ihl = usize::from(packet[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([*packet.get(2)?, *packet.get(3)?]));
    if ihl < 20 || total < ihl + 8 || packet.len() < total {
        return None;
    }
    let read16 = |at: usize| u16::from_be_bytes([packet[at], packet[at + 1]]);
    let (src, dst) = (ipv4_at(packet, 12), ipv4_at(packet, 16));
    if src != c.tun_ip
        || dst != c.gateway
        || read16(ihl) != c.udp_port
        || !is_carrier_port(read16(ihl + 2))
        || read16(6) & 0x3fff != 0
    {
        return None;
    }
    let length = usize::from(read16(ihl + 4));
    let inner = packet.get(ihl + 8..ihl + length.max(8))?;
    if length < 8 || ihl + length > total {
        return None;
    }
    Some((inner, answer_kind(inner)?))
}

fn ipv4_at(p: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(p[at], p[at + 1], p[at + 2], p[at + 3])
}

/// What the ICMP packet `p` (an answer a core built) is; `None` when it is none of those.
fn answer_kind(p: &[u8]) -> Option<Answer> {
    let (icmp, total, echo_reply, unreachable) = match p.first()? >> 4 {
        4 => {
            let ihl = usize::from(p[0] & 0x0f) * 4;
            if ihl < 20 || p.get(9) != Some(&IPPROTO_ICMP) {
                return None;
            }
            let total = usize::from(u16::from_be_bytes([*p.get(2)?, *p.get(3)?]));
            (ihl, total, ECHO_REPLY, DEST_UNREACHABLE)
        }
        6 => {
            if p.len() < 40 || p[6] != IPPROTO_ICMPV6 {
                return None;
            }
            let total = 40 + usize::from(u16::from_be_bytes([p[4], p[5]]));
            (40, total, ICMPV6_ECHO_REPLY, ICMPV6_DEST_UNREACHABLE)
        }
        _ => return None,
    };
    if total != p.len() || total < icmp + 8 {
        return None;
    }
    let (kind, code) = (p[icmp], p[icmp + 1]);
    let v6 = p[0] >> 4 == 6;
    Some(if kind == echo_reply {
        Answer::EchoReply
    } else if kind != unreachable {
        return None;
    } else if (!v6 && code == HOST_UNREACHABLE) || (v6 && code == ICMPV6_ADDRESS_UNREACHABLE) {
        Answer::Refused(Refusal::HostUnreachable)
    } else if (!v6 && code == ADMIN_PROHIBITED) || (v6 && code == ICMPV6_ADMIN_PROHIBITED) {
        Answer::Refused(Refusal::Prohibited)
    } else {
        Answer::Other
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfd7a, 0x5359, 0, 0, 0, 0, 0, 1);

    /// An ICMPv6 message of `kind` from fd7a:5359::2 to 2001:db8::7 with `data` after its
    /// 8-byte header (checksum left zero: the reply does not check it).
    fn icmp6(kind: u8, data: &[u8]) -> Vec<u8> {
        let len = 8 + data.len();
        let mut p = vec![0u8; 40 + len];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&(len as u16).to_be_bytes());
        p[6] = IPPROTO_ICMPV6;
        p[7] = 64;
        p[8..24].copy_from_slice(&Ipv6Addr::new(0xfd7a, 0x5359, 0, 0, 0, 0, 0, 2).octets());
        p[24..40].copy_from_slice(&Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7).octets());
        p[40] = kind;
        p[44..48].copy_from_slice(&[0x12, 0x34, 0, 1]);
        p[48..].copy_from_slice(data);
        p
    }

    #[test]
    fn an_ipv6_echo_request_is_answered_as_administratively_prohibited() {
        let request = icmp6(ICMPV6_ECHO_REQUEST, &[0xab; 56]);
        let reply = filtered_reply6(&request, GATEWAY6).expect("a reply");
        assert_eq!(reply.len(), 40 + 8 + request.len());
        assert_eq!(&reply[8..24], &GATEWAY6.octets());
        assert_eq!(&reply[24..40], &request[8..24]);
        assert_eq!((reply[6], reply[40], reply[41]), (58, 1, 1));
        assert_eq!(&reply[48..], &request[..]);
        let mut check = reply.clone();
        check[42] = 0;
        check[43] = 0;
        assert_eq!(
            icmpv6_checksum(&check),
            u16::from_be_bytes([reply[42], reply[43]])
        );
        // a big request is quoted only up to the minimum MTU
        let big = icmp6(ICMPV6_ECHO_REQUEST, &[0; 3000]);
        assert_eq!(filtered_reply6(&big, GATEWAY6).map(|r| r.len()), Some(1280));
    }

    #[test]
    fn ipv6_errors_neighbour_discovery_and_garbage_get_no_answer() {
        for kind in [1, 129, 135, 136] {
            assert_eq!(
                filtered_reply6(&icmp6(kind, &[0; 8]), GATEWAY6),
                None,
                "{kind}"
            );
        }
        let mut from_gateway = icmp6(ICMPV6_ECHO_REQUEST, &[0; 8]);
        from_gateway[8..24].copy_from_slice(&GATEWAY6.octets());
        assert_eq!(filtered_reply6(&from_gateway, GATEWAY6), None);
        let request = icmp6(ICMPV6_ECHO_REQUEST, &[0; 8]);
        for cut in 0..request.len() {
            assert_eq!(filtered_reply6(&request[..cut], GATEWAY6), None, "{cut}");
        }
        assert_eq!(filtered_reply(&request, GATEWAY), None, "not IPv4");
    }

    const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 233, 0, 1);

    /// An IPv4 ICMP message of `kind` from 10.233.0.2 to 192.0.2.7 with `data` after the
    /// 8-byte ICMP header (checksums left zero: the reply does not check them).
    fn icmp(kind: u8, data: &[u8]) -> Vec<u8> {
        let total = 20 + 8 + data.len();
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[8] = 64;
        p[9] = IPPROTO_ICMP;
        p[12..16].copy_from_slice(&[10, 233, 0, 2]);
        p[16..20].copy_from_slice(&[192, 0, 2, 7]);
        p[20] = kind;
        p[24..28].copy_from_slice(&[0x12, 0x34, 0, 1]); // id, sequence
        p[28..].copy_from_slice(data);
        p
    }

    #[test]
    fn an_echo_request_is_answered_as_filtered_by_the_gateway() {
        let request = icmp(ECHO_REQUEST, &[0xab; 56]);
        let reply = filtered_reply(&request, GATEWAY).expect("a reply");
        assert_eq!(reply.len(), 20 + 8 + 28);
        assert_eq!(&reply[12..16], &GATEWAY.octets());
        assert_eq!(&reply[16..20], &[10, 233, 0, 2]);
        assert_eq!((reply[20], reply[21]), (DEST_UNREACHABLE, ADMIN_PROHIBITED));
        // the request's header and its first 8 bytes, which is how the sender matches it
        assert_eq!(&reply[28..], &request[..28]);
        assert_eq!(checksum(&reply[..20]), 0, "IP header checksum");
        assert_eq!(checksum(&reply[20..]), 0, "ICMP checksum");
    }

    #[test]
    fn errors_replies_fragments_and_garbage_get_no_answer() {
        assert_eq!(
            filtered_reply(&icmp(DEST_UNREACHABLE, &[0; 28]), GATEWAY),
            None
        );
        assert_eq!(
            filtered_reply(&icmp(0, &[0; 8]), GATEWAY),
            None,
            "echo reply"
        );
        let mut later_fragment = icmp(ECHO_REQUEST, &[0; 8]);
        later_fragment[7] = 0x10;
        assert_eq!(filtered_reply(&later_fragment, GATEWAY), None);
        let mut from_gateway = icmp(ECHO_REQUEST, &[0; 8]);
        from_gateway[12..16].copy_from_slice(&GATEWAY.octets());
        assert_eq!(filtered_reply(&from_gateway, GATEWAY), None);
        let mut tcp = icmp(ECHO_REQUEST, &[0; 8]);
        tcp[9] = 6;
        assert_eq!(filtered_reply(&tcp, GATEWAY), None);
        let request = icmp(ECHO_REQUEST, &[0; 8]);
        for cut in 0..request.len() {
            assert_eq!(filtered_reply(&request[..cut], GATEWAY), None, "{cut}");
        }
        let mut lying = request.clone();
        lying[0] = 0x4f; // header length past the packet
        assert_eq!(filtered_reply(&lying, GATEWAY), None);
    }

    /// The checksum a receiver computes over the ICMP(v6) message of `p`: 0 when it is right.
    fn verify(p: &[u8]) -> u16 {
        if p[0] >> 4 == 6 {
            let mut zeroed = p.to_vec();
            zeroed[42] = 0;
            zeroed[43] = 0;
            let want = icmpv6_checksum(&zeroed);
            u16::from_be_bytes([p[42], p[43]]) ^ want
        } else {
            checksum(&p[..20]) | checksum(&p[20..])
        }
    }

    #[test]
    fn an_echo_reply_comes_from_the_destination_with_id_sequence_and_data_kept() {
        let data: Vec<u8> = (0..56u8).collect();
        let request = icmp(ECHO_REQUEST, &data);
        let reply = echo_reply(&request).expect("a reply");
        assert_eq!(reply.len(), request.len());
        assert_eq!(&reply[12..16], &[192, 0, 2, 7], "from the destination");
        assert_eq!(&reply[16..20], &[10, 233, 0, 2], "to the sender");
        assert_eq!(
            (reply[9], reply[20], reply[21]),
            (IPPROTO_ICMP, ECHO_REPLY, 0)
        );
        assert_eq!(&reply[24..], &request[24..], "id, sequence, data");
        assert_eq!(verify(&reply), 0, "IP and ICMP checksums");
        // IPv4 options are not echoed; the message is
        let mut with_options = vec![0u8; 24];
        with_options[..20].copy_from_slice(&request[..20]);
        with_options[0] = 0x46;
        with_options.extend_from_slice(&request[20..]);
        let total = with_options.len() as u16;
        with_options[2..4].copy_from_slice(&total.to_be_bytes());
        let reply = echo_reply(&with_options).expect("a reply");
        assert_eq!(reply.len(), request.len());
        assert_eq!(&reply[24..], &with_options[28..]);
        assert_eq!(verify(&reply), 0);

        let request6 = icmp6(ICMPV6_ECHO_REQUEST, &data);
        let reply6 = echo_reply(&request6).expect("a reply");
        assert_eq!(reply6.len(), request6.len());
        assert_eq!(&reply6[8..24], &request6[24..40], "from the destination");
        assert_eq!(&reply6[24..40], &request6[8..24], "to the sender");
        assert_eq!(
            (reply6[6], reply6[40], reply6[41]),
            (58, ICMPV6_ECHO_REPLY, 0)
        );
        assert_eq!(&reply6[44..], &request6[44..], "id, sequence, data");
        assert_eq!(verify(&reply6), 0, "ICMPv6 checksum");
    }

    #[test]
    fn host_unreachable_quotes_the_request_from_the_gateway() {
        let request = icmp(ECHO_REQUEST, &[7; 32]);
        let error =
            error_reply(&request, IpAddr::V4(GATEWAY), Refusal::HostUnreachable).expect("an error");
        assert_eq!((error[20], error[21]), (DEST_UNREACHABLE, HOST_UNREACHABLE));
        assert_eq!(&error[12..16], &GATEWAY.octets());
        assert_eq!(&error[28..], &request[..28]);
        assert_eq!(verify(&error), 0);
        let request6 = icmp6(ICMPV6_ECHO_REQUEST, &[7; 32]);
        let error6 = error_reply(&request6, IpAddr::V6(GATEWAY6), Refusal::HostUnreachable)
            .expect("an error");
        assert_eq!((error6[40], error6[41]), (1, ICMPV6_ADDRESS_UNREACHABLE));
        assert_eq!(&error6[48..], &request6[..]);
        assert_eq!(verify(&error6), 0);
        // the gateway of the other family answers nothing
        assert_eq!(
            error_reply(&request, IpAddr::V6(GATEWAY6), Refusal::HostUnreachable),
            None
        );
    }

    const CARRIER: Carrier = Carrier {
        tun_ip: Ipv4Addr::new(10, 233, 0, 2),
        udp_port: 7001,
        gateway: GATEWAY,
    };

    /// The core's side: the request a carrier datagram holds, answered to its source port.
    fn answered(carried: &[u8], answer: &[u8]) -> Vec<u8> {
        let from = (GATEWAY, u16::from_be_bytes([carried[20], carried[21]]));
        udp4((CARRIER.tun_ip, CARRIER.udp_port), from, answer)
    }

    #[test]
    fn requests_are_carried_to_the_udp_socket_and_answers_come_back_whole() {
        for request in [
            icmp(ECHO_REQUEST, &[1; 40]),
            icmp6(ICMPV6_ECHO_REQUEST, &[2; 40]),
        ] {
            let carried = carry(&request, &CARRIER).expect("carried");
            assert_eq!(checksum(&carried[..20]), 0, "IP header checksum");
            assert_eq!(&carried[12..16], &GATEWAY.octets());
            assert_eq!(&carried[16..20], &CARRIER.tun_ip.octets());
            let port = u16::from_be_bytes([carried[20], carried[21]]);
            assert!(is_carrier_port(port));
            assert_eq!(port, carrier_port(parse_echo(&request).expect("echo").dst));
            assert_eq!(u16::from_be_bytes([carried[22], carried[23]]), 7001);
            assert_eq!(&carried[28..], &request[..]);
            // the carrier datagram is not itself an answer
            assert_eq!(carried_answer(&carried, &CARRIER), None);

            let reply = echo_reply(&request).expect("reply");
            let back = answered(&carried, &reply);
            assert_eq!(
                carried_answer(&back, &CARRIER),
                Some((&reply[..], Answer::EchoReply))
            );
            let gateway = if request[0] >> 4 == 6 {
                IpAddr::V6(GATEWAY6)
            } else {
                IpAddr::V4(GATEWAY)
            };
            for (why, kind) in [
                (
                    Refusal::HostUnreachable,
                    Answer::Refused(Refusal::HostUnreachable),
                ),
                (Refusal::Prohibited, Answer::Refused(Refusal::Prohibited)),
            ] {
                let error = error_reply(&request, gateway, why).expect("error");
                let back = answered(&carried, &error);
                assert_eq!(carried_answer(&back, &CARRIER), Some((&error[..], kind)));
            }
            // answers from elsewhere, to other ports, or that are no ICMP answer are refused
            let mut other_source = answered(&carried, &reply);
            other_source[20..22].copy_from_slice(&7002u16.to_be_bytes());
            assert_eq!(carried_answer(&other_source, &CARRIER), None);
            let not_carrier = udp4((CARRIER.tun_ip, 7001), (GATEWAY, 10_000), &reply);
            assert_eq!(carried_answer(&not_carrier, &CARRIER), None);
            let a_request_back = answered(&carried, &request);
            assert_eq!(carried_answer(&a_request_back, &CARRIER), None);
            for cut in 0..back.len() {
                assert_eq!(carried_answer(&back[..cut], &CARRIER), None, "{cut}");
            }
        }
        // the same destination always has the same carrier port
        assert_eq!(
            carrier_port("192.0.2.7".parse().expect("ip")),
            carrier_port("192.0.2.7".parse().expect("ip"))
        );
    }

    #[test]
    fn truncated_or_garbage_input_gets_nothing_and_never_panics() {
        let request = icmp(ECHO_REQUEST, &[0; 16]);
        let request6 = icmp6(ICMPV6_ECHO_REQUEST, &[0; 16]);
        for p in [&request, &request6] {
            for cut in 0..p.len() {
                let part = &p[..cut];
                assert!(echo_reply(part).is_none(), "{cut}");
                assert!(carry(part, &CARRIER).is_none(), "{cut}");
                assert!(parse_echo(part).is_none(), "{cut}");
            }
        }
        // an echo reply, an error, another protocol: no reply
        assert!(echo_reply(&icmp(ECHO_REPLY, &[0; 8])).is_none());
        assert!(echo_reply(&icmp6(ICMPV6_ECHO_REPLY, &[0; 8])).is_none());
        assert!(carry(&icmp(DEST_UNREACHABLE, &[0; 28]), &CARRIER).is_none());
        // arbitrary bytes
        let mut seed = 0x1234_5678u32;
        for len in 0..200 {
            let junk: Vec<u8> = (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (seed >> 16) as u8
                })
                .collect();
            for first in [0x45, 0x60, junk.first().copied().unwrap_or(0)] {
                let mut p = junk.clone();
                if let Some(b) = p.first_mut() {
                    *b = first;
                }
                let _ = echo_reply(&p);
                let _ = error_reply(&p, IpAddr::V4(GATEWAY), Refusal::HostUnreachable);
                let _ = carry(&p, &CARRIER);
                let _ = carried_answer(&p, &CARRIER);
            }
        }
    }
}
