//! ICMP on the TUN path. Runtime-free.
//!
//! The tunnel carries TCP and UDP flows, not raw IP: an echo request routed into the TUN cannot
//! be relayed through the server's proxies. Dropping it silently leaves `ping` waiting for a
//! reply that never comes, so the TUN answers as a router that filters it would: ICMP
//! destination unreachable, code 13 "communication administratively prohibited" (RFC 1812
//! §5.2.7.1), from the TUN's gateway address, quoting the request's header and first 8 bytes
//! (RFC 792). `ping` then reports "Packet filtered" at once. ICMP errors themselves are never
//! answered (RFC 1122 §3.2.2).

use crate::mesh::wire::checksum;
use std::net::Ipv4Addr;

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

#[cfg(test)]
mod tests {
    use super::*;

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
