//! ICMP on the TUN path. Runtime-free.
//!
//! The tunnel carries TCP and UDP flows, not raw IP: an echo request routed into the TUN cannot
//! be relayed through the server's proxies. Dropping it silently leaves `ping` waiting for a
//! reply that never comes, so the TUN answers as a router that filters it would: ICMP
//! destination unreachable, code 13 "communication administratively prohibited" (RFC 1812
//! §5.2.7.1), from the TUN's gateway address, quoting the request's header and first 8 bytes
//! (RFC 792). `ping` then reports "Packet filtered" at once. ICMP errors themselves are never
//! answered (RFC 1122 §3.2.2). IPv6 likewise ([`filtered_reply6`]): ICMPv6 destination
//! unreachable, code 1 "communication with destination administratively prohibited" (RFC 4443
//! §3.1), from the TUN's IPv6 gateway, quoting as much of the request as fits in 1280 bytes.

use crate::mesh::wire::checksum;
use std::net::{Ipv4Addr, Ipv6Addr};

const IPPROTO_ICMPV6: u8 = 58;
const ICMPV6_DEST_UNREACHABLE: u8 = 1;
const ICMPV6_ADMIN_PROHIBITED: u8 = 1;
const ICMPV6_ECHO_REQUEST: u8 = 128;
/// The IPv6 minimum MTU, which an ICMPv6 error must not exceed (RFC 4443 §2.4 (c)).
const IPV6_MIN_MTU: usize = 1280;

const IPPROTO_ICMP: u8 = 1;
const ECHO_REQUEST: u8 = 8;
const DEST_UNREACHABLE: u8 = 3;
const ADMIN_PROHIBITED: u8 = 13;

/// The ICMP error to write back into the TUN for `packet`, when it is an IPv4 ICMP echo request
/// (first fragment or whole) from an address other than `gateway`; `None` for anything else.
pub fn filtered_reply(packet: &[u8], gateway: Ipv4Addr) -> Option<Vec<u8>> {
    let first = *packet.first()?;
    if first >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(first & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([*packet.get(2)?, *packet.get(3)?]));
    if ihl < 20 || total < ihl + 8 || packet.len() < total {
        return None;
    }
    // a later fragment carries no ICMP header
    let fragment_offset = u16::from_be_bytes([packet[6], packet[7]]) & 0x1fff;
    if packet[9] != IPPROTO_ICMP || fragment_offset != 0 || packet[ihl] != ECHO_REQUEST {
        return None;
    }
    let src = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
    if src == gateway || src.is_unspecified() || src.is_broadcast() || src.is_multicast() {
        return None;
    }
    let quoted = &packet[..ihl + 8];
    let len = 20 + 8 + quoted.len();
    let mut out = vec![0u8; len];
    out[0] = 0x45;
    out[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    out[8] = 64; // TTL
    out[9] = IPPROTO_ICMP;
    out[12..16].copy_from_slice(&gateway.octets());
    out[16..20].copy_from_slice(&src.octets());
    let ip_check = checksum(&out[..20]);
    out[10..12].copy_from_slice(&ip_check.to_be_bytes());
    out[20] = DEST_UNREACHABLE;
    out[21] = ADMIN_PROHIBITED;
    out[28..].copy_from_slice(quoted);
    let icmp_check = checksum(&out[20..]);
    out[22..24].copy_from_slice(&icmp_check.to_be_bytes());
    Some(out)
}

/// The ICMPv6 error to write back into the TUN for `packet`, when it is an IPv6 ICMPv6 echo
/// request (no extension headers) from a unicast address other than `gateway`; `None` for
/// anything else (errors, neighbour discovery, other protocols are never answered).
pub fn filtered_reply6(packet: &[u8], gateway: Ipv6Addr) -> Option<Vec<u8>> {
    if packet.first()? >> 4 != 6 || packet.len() < 40 + 8 {
        return None;
    }
    let total = 40 + usize::from(u16::from_be_bytes([packet[4], packet[5]]));
    if packet[6] != IPPROTO_ICMPV6 || total > packet.len() || packet[40] != ICMPV6_ECHO_REQUEST {
        return None;
    }
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&packet[8..24]);
    let src = Ipv6Addr::from(octets);
    if src == gateway || src.is_unspecified() || src.is_multicast() {
        return None;
    }
    let quoted = &packet[..total.min(IPV6_MIN_MTU - 40 - 8)];
    let len = 40 + 8 + quoted.len();
    let mut out = vec![0u8; len];
    out[0] = 0x60;
    out[4..6].copy_from_slice(&((len - 40) as u16).to_be_bytes());
    out[6] = IPPROTO_ICMPV6;
    out[7] = 64; // hop limit
    out[8..24].copy_from_slice(&gateway.octets());
    out[24..40].copy_from_slice(&src.octets());
    out[40] = ICMPV6_DEST_UNREACHABLE;
    out[41] = ICMPV6_ADMIN_PROHIBITED;
    out[48..].copy_from_slice(quoted);
    let check = icmpv6_checksum(&out);
    out[42..44].copy_from_slice(&check.to_be_bytes());
    Some(out)
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
}
