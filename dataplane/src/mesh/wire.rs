//! What the mesh socket and the mesh device carry, runtime-free: the demultiplexing of a
//! received datagram by its first bytes (STUN, TURN ChannelData, WireGuard), the few IPv4
//! fields the peer reads or rewrites (destination, TTL), and the UDP packets that carry the
//! routing crate's control messages (announcements, latency probes) on the mesh control port.

use std::net::Ipv4Addr;

/// UDP port of the control traffic between peers, virtual IP to virtual IP (route
/// announcements, latency probes). Consumed by the peer, never written to the device.
pub const CONTROL_PORT: u16 = switchyard_mesh_routing::CONTROL_PORT;

/// UDP port of relay envelopes, virtual IP to virtual IP: the payload is a WireGuard datagram
/// of the session between the envelope's source and destination, which relaying members pass
/// on hop by hop and cannot read or forge. Consumed by the peer, never written to the device.
pub const RELAY_PORT: u16 = CONTROL_PORT + 1;

/// STUN's magic cookie (RFC 8489 §6).
const STUN_COOKIE: [u8; 4] = [0x21, 0x12, 0xA4, 0x42];

/// What a datagram on the mesh socket is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatagramKind {
    /// STUN message (binding answers, TURN control): for the ICE agent.
    Stun,
    /// TURN ChannelData (RFC 8656 §12): a relayed datagram of a bound peer.
    ChannelData,
    /// WireGuard handshake initiation (matched to a peer by its static key).
    HandshakeInit,
    /// WireGuard response, cookie reply or data, addressed by our receiver index.
    WireGuard {
        receiver: u32,
    },
    Unknown,
}

/// Classifies a datagram as the shared design decides (STUN first, then ChannelData, then the
/// WireGuard message types 1..=4 as a little-endian u32).
pub fn classify(d: &[u8]) -> DatagramKind {
    if d.len() >= 20 && d[0] & 0xC0 == 0 && d[4..8] == STUN_COOKIE {
        let len = usize::from(u16::from_be_bytes([d[2], d[3]]));
        if len + 20 == d.len() && len % 4 == 0 {
            return DatagramKind::Stun;
        }
    }
    if d.len() >= 4 && (0x40..=0x7F).contains(&d[0]) {
        return DatagramKind::ChannelData;
    }
    if d.len() < 4 {
        return DatagramKind::Unknown;
    }
    let receiver = || {
        d.get(4..8)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    match u32::from_le_bytes([d[0], d[1], d[2], d[3]]) {
        1 if d.len() == 148 => DatagramKind::HandshakeInit,
        // response: sender index at 4..8, receiver index at 8..12
        2 if d.len() == 92 => match d.get(8..12) {
            Some(b) => DatagramKind::WireGuard {
                receiver: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            },
            None => DatagramKind::Unknown,
        },
        3 if d.len() == 64 => receiver()
            .map(|receiver| DatagramKind::WireGuard { receiver })
            .unwrap_or(DatagramKind::Unknown),
        4 if d.len() >= 32 => receiver()
            .map(|receiver| DatagramKind::WireGuard { receiver })
            .unwrap_or(DatagramKind::Unknown),
        _ => DatagramKind::Unknown,
    }
}

/// Source and destination of an IPv4 packet; `None` for anything else (IPv6, truncated).
pub fn ipv4_addresses(p: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr)> {
    if p.len() < 20 || p[0] >> 4 != 4 {
        return None;
    }
    let src = Ipv4Addr::new(p[12], p[13], p[14], p[15]);
    let dst = Ipv4Addr::new(p[16], p[17], p[18], p[19]);
    Some((src, dst))
}

/// The UDP destination port and payload of an IPv4 UDP packet (unfragmented).
pub fn udp_to(p: &[u8]) -> Option<(u16, &[u8])> {
    if p.len() < 20 || p[0] >> 4 != 4 || p[9] != 17 {
        return None;
    }
    // a later fragment has no UDP header
    if u16::from_be_bytes([p[6], p[7]]) & 0x1FFF != 0 {
        return None;
    }
    let ihl = usize::from(p[0] & 0x0F) * 4;
    let udp = p.get(ihl..)?;
    if udp.len() < 8 {
        return None;
    }
    let port = u16::from_be_bytes([udp[2], udp[3]]);
    let len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    let payload = udp.get(8..len.max(8))?;
    Some((port, payload))
}

/// Decrements the TTL of an IPv4 packet being forwarded, updating the header checksum
/// incrementally (RFC 1624). False when the TTL was 1 or 0: the packet must be dropped.
pub fn decrement_ttl(p: &mut [u8]) -> bool {
    if p.len() < 20 || p[8] <= 1 {
        return false;
    }
    p[8] -= 1;
    // the TTL is the high byte of the 16-bit word at 8: the word drops by 0x0100
    let old = u16::from_be_bytes([p[10], p[11]]);
    let sum = u32::from(old) + 0x0100;
    let sum = (sum & 0xFFFF) + (sum >> 16);
    let [a, b] = (sum as u16).to_be_bytes();
    p[10] = a;
    p[11] = b;
    true
}

/// An IPv4 packet (no options, TTL 64, don't fragment) around `payload`.
fn ipv4_packet(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, payload: &[u8]) -> Vec<u8> {
    let total = 20 + payload.len();
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[6] = 0x40; // don't fragment
    p[8] = 64;
    p[9] = protocol;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let sum = checksum(&p[..20]);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    p[20..].copy_from_slice(payload);
    p
}

/// A UDP datagram in an IPv4 packet, UDP checksum 0 (optional in IPv4).
pub fn udp_packet(src: Ipv4Addr, dst: Ipv4Addr, port: u16, payload: &[u8]) -> Vec<u8> {
    let mut udp = vec![0u8; 8 + payload.len()];
    udp[0..2].copy_from_slice(&port.to_be_bytes());
    udp[2..4].copy_from_slice(&port.to_be_bytes());
    udp[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    udp[8..].copy_from_slice(payload);
    ipv4_packet(src, dst, 17, &udp)
}

/// What a relay envelope adds to the WireGuard datagram it carries: its IPv4 and UDP headers,
/// then the next hop's session's data header (16 bytes) and tag (16 bytes).
pub const ENVELOPE_OVERHEAD: usize = 20 + 8 + 32;

const IPPROTO_ICMP: u8 = 1;

/// ICMP "destination unreachable, fragmentation needed" (RFC 792, next-hop MTU per RFC 1191)
/// from `router` to the sender of the IPv4 `packet`, which has "don't fragment" set and does
/// not fit `mtu`: the IP header and the first 8 bytes of the packet quoted. `None` for anything
/// else — no DF, it fits, not IPv4, truncated, or itself an ICMP error (never answered,
/// RFC 1122 §3.2.2).
pub fn fragmentation_needed(packet: &[u8], router: Ipv4Addr, mtu: u16) -> Option<Vec<u8>> {
    let header = packet.get(..20)?;
    let ihl = usize::from(header[0] & 0x0F) * 4;
    let dont_fragment = header[6] & 0x40 != 0;
    if header[0] >> 4 != 4 || ihl < 20 || !dont_fragment || packet.len() <= usize::from(mtu) {
        return None;
    }
    let quoted = packet.get(..ihl + 8)?;
    // only echo requests among ICMP messages: errors and the rest are not answered
    if header[9] == IPPROTO_ICMP && quoted[ihl] != 8 {
        return None;
    }
    let mut icmp = vec![3, 4, 0, 0, 0, 0];
    icmp.extend_from_slice(&mtu.to_be_bytes());
    icmp.extend_from_slice(quoted);
    let sum = checksum(&icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    let sender = Ipv4Addr::new(header[12], header[13], header[14], header[15]);
    Some(ipv4_packet(router, sender, IPPROTO_ICMP, &icmp))
}

/// IP protocol number of EtherIP (RFC 3378).
pub const ETHERIP: u8 = 97;
/// The EtherIP header: version 3, reserved bits 0.
const ETHERIP_HEADER: [u8; 2] = [0x30, 0x00];

/// An Ethernet frame carried as EtherIP between two virtual IPs (TAP mode).
pub fn etherip_packet(src: Ipv4Addr, dst: Ipv4Addr, frame: &[u8]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(2 + frame.len());
    payload.extend_from_slice(&ETHERIP_HEADER);
    payload.extend_from_slice(frame);
    ipv4_packet(src, dst, ETHERIP, &payload)
}

/// The Ethernet frame of an EtherIP packet; `None` for anything else.
pub fn etherip_frame(p: &[u8]) -> Option<&[u8]> {
    if p.len() < 20 || p[0] >> 4 != 4 || p[9] != ETHERIP {
        return None;
    }
    if u16::from_be_bytes([p[6], p[7]]) & 0x3FFF != 0 {
        return None; // fragments are not reassembled
    }
    let ihl = usize::from(p[0] & 0x0F) * 4;
    let total = usize::from(u16::from_be_bytes([p[2], p[3]])).min(p.len());
    let body = p.get(ihl..total)?;
    if body.len() < 2 + 14 || body[..2] != ETHERIP_HEADER {
        return None;
    }
    Some(&body[2..])
}

/// The Internet checksum (RFC 1071) of `header` (any bytes; an odd last byte is padded).
pub(crate) fn checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_are_told_apart_by_their_first_bytes() {
        let mut stun = vec![0u8; 28];
        stun[1] = 0x01; // binding request
        stun[3] = 8;
        stun[4..8].copy_from_slice(&STUN_COOKIE);
        assert_eq!(classify(&stun), DatagramKind::Stun);
        // a wrong length field is not STUN
        stun[3] = 12;
        assert_ne!(classify(&stun), DatagramKind::Stun);
        assert_eq!(
            classify(&[0x40, 0, 0, 4, 1, 2, 3, 4]),
            DatagramKind::ChannelData
        );
        let mut init = vec![0u8; 148];
        init[0] = 1;
        assert_eq!(classify(&init), DatagramKind::HandshakeInit);
        let mut data = vec![0u8; 48];
        data[0] = 4;
        data[4..8].copy_from_slice(&0x0000_0301u32.to_le_bytes());
        assert_eq!(classify(&data), DatagramKind::WireGuard { receiver: 0x301 });
        let mut resp = vec![0u8; 92];
        resp[0] = 2;
        resp[8..12].copy_from_slice(&0x0000_0200u32.to_le_bytes());
        assert_eq!(classify(&resp), DatagramKind::WireGuard { receiver: 0x200 });
        assert_eq!(classify(&[9, 0, 0, 0, 1]), DatagramKind::Unknown);
        assert_eq!(classify(&init[..100]), DatagramKind::Unknown);
        assert_eq!(classify(&[]), DatagramKind::Unknown);
    }

    #[test]
    fn a_control_packet_round_trips_and_its_header_checksum_verifies() {
        let (a, b) = (Ipv4Addr::new(10, 100, 0, 1), Ipv4Addr::new(10, 100, 0, 2));
        let p = udp_packet(a, b, CONTROL_PORT, b"control payload");
        assert_eq!(ipv4_addresses(&p), Some((a, b)));
        assert_eq!(checksum(&p[..20]), 0, "a valid header sums to 0");
        let (port, payload) = udp_to(&p).expect("udp");
        assert_eq!(port, CONTROL_PORT);
        assert_eq!(payload, b"control payload");
    }

    #[test]
    fn an_ethernet_frame_round_trips_through_etherip() {
        let (a, b) = (Ipv4Addr::new(10, 100, 0, 1), Ipv4Addr::new(10, 100, 0, 2));
        let mut frame = vec![0xff; 6];
        frame.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
        frame.extend_from_slice(&[0u8; 28]);
        let p = etherip_packet(a, b, &frame);
        assert_eq!(ipv4_addresses(&p), Some((a, b)));
        assert_eq!(checksum(&p[..20]), 0);
        assert_eq!(etherip_frame(&p), Some(&frame[..]));
        assert_eq!(etherip_frame(&udp_packet(a, b, 1, &frame)), None);
        assert_eq!(etherip_frame(&p[..30]), None, "truncated");
    }

    #[test]
    fn fragmentation_needed_quotes_the_packet_and_answers_only_what_it_must() {
        let (a, b, relay) = (
            Ipv4Addr::new(10, 1, 0, 1),
            Ipv4Addr::new(10, 1, 0, 2),
            Ipv4Addr::new(10, 1, 0, 9),
        );
        let big = udp_packet(a, b, 7000, &[1; 1372]);
        let icmp = fragmentation_needed(&big, relay, 1340).expect("an answer");
        assert_eq!(ipv4_addresses(&icmp), Some((relay, a)));
        assert_eq!(checksum(&icmp[..20]), 0);
        assert_eq!(checksum(&icmp[20..]), 0, "the ICMP checksum verifies");
        assert_eq!((icmp[20], icmp[21]), (3, 4));
        assert_eq!(&icmp[24..28], &[0, 0, 0x05, 0x3c], "next-hop MTU 1340");
        assert_eq!(&icmp[28..], &big[..28], "header and 8 bytes quoted");
        // it fits; no DF; an ICMP error; truncated or not IPv4: no answer
        assert!(fragmentation_needed(&big, relay, 1400).is_none());
        let mut may_fragment = big.clone();
        may_fragment[6] = 0;
        assert!(fragmentation_needed(&may_fragment, relay, 1340).is_none());
        let error = ipv4_packet(a, b, IPPROTO_ICMP, &[3; 1400]);
        assert!(fragmentation_needed(&error, relay, 1340).is_none());
        let echo = ipv4_packet(a, b, IPPROTO_ICMP, &[8; 1400]);
        assert!(fragmentation_needed(&echo, relay, 1340).is_some());
        for cut in 0..28 {
            assert!(
                fragmentation_needed(&big[..cut], relay, 10).is_none(),
                "{cut}"
            );
        }
        let mut v6 = big.clone();
        v6[0] = 0x65;
        assert!(fragmentation_needed(&v6, relay, 1340).is_none());
    }

    #[test]
    fn forwarding_decrements_the_ttl_keeps_the_checksum_valid_and_stops_at_one() {
        let mut p = udp_packet(
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            9,
            b"x",
        );
        p[8] = 2;
        p[10..12].copy_from_slice(&[0, 0]);
        let sum = checksum(&p[..20]);
        p[10..12].copy_from_slice(&sum.to_be_bytes());
        assert!(decrement_ttl(&mut p));
        assert_eq!(p[8], 1);
        assert_eq!(checksum(&p[..20]), 0);
        assert!(!decrement_ttl(&mut p), "TTL 1 is not forwarded");
        assert!(ipv4_addresses(&[0x60; 40]).is_none(), "IPv6 is not read");
    }
}
