//! Traffic modes: which delivery an IP packet read from the mesh device asks for.
//!
//! The mode is carried by the IPv4 destination address alone, so applications need nothing
//! mesh-specific:
//! * 255.255.255.255 or the mesh network's broadcast address (e.g. 10.99.255.255 in
//!   10.99.0.0/16) → [`Delivery::Broadcast`]: every peer, once, down the delivery tree
//!   ([`crate::Router::originate_flood`] with [`crate::FloodMode::Broadcast`]).
//! * 224.0.0.0/4 → [`Delivery::Multicast`]: the peers that announced the group.
//! * an address some peer announced as an anycast group (a group outside 224.0.0.0/4, see
//!   [`crate::Router::known_groups`]) → [`Delivery::Anycast`]: the closest member
//!   ([`crate::Router::anycast_target`]); routed hop by hop like unicast, each hop picking its
//!   closest member, which only ever lowers the metric, so it cannot loop.
//! * our own virtual IP → [`Delivery::Local`]; another address of the network →
//!   [`Delivery::Unicast`] ([`crate::Router::next_hop`]); anything else → [`Delivery::NotMesh`].
//!
//! A peer that receives a packet for another virtual IP forwards it with [`decrement_ttl`]
//! first (dropping it at 0) and then the same next-hop lookup.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use thiserror::Error;

use crate::l2::array_at;

/// What classification needs to know about the mesh network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshNetwork {
    pub cidr: Ipv4Net,
    pub local_vip: Ipv4Addr,
    /// Announced anycast addresses (multicast addresses in here are ignored).
    pub anycast: BTreeSet<Ipv4Addr>,
}

impl MeshNetwork {
    /// `anycast` may be [`crate::Router::known_groups`] as is: multicast groups are skipped.
    pub fn new(
        cidr: Ipv4Net,
        local_vip: Ipv4Addr,
        anycast: impl IntoIterator<Item = Ipv4Addr>,
    ) -> Self {
        MeshNetwork {
            cidr: cidr.trunc(),
            local_vip,
            anycast: anycast.into_iter().filter(|a| !a.is_multicast()).collect(),
        }
    }
}

/// How a packet is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    Local,
    Unicast(Ipv4Addr),
    Broadcast,
    Multicast(Ipv4Addr),
    Anycast(Ipv4Addr),
    /// Not for the mesh (outside the network, or its network address): drop.
    NotMesh,
}

/// Why a packet could not be classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ClassifyError {
    #[error("packet shorter than an IPv4 header")]
    Truncated,
    #[error("not an IPv4 packet (version {0})")]
    NotIpv4(u8),
}

/// The IPv4 destination of a packet.
pub fn ipv4_destination(packet: &[u8]) -> Result<Ipv4Addr, ClassifyError> {
    let first = *packet.first().ok_or(ClassifyError::Truncated)?;
    if first >> 4 != 4 {
        return Err(ClassifyError::NotIpv4(first >> 4));
    }
    let dst = array_at::<4>(packet, 16).ok_or(ClassifyError::Truncated)?;
    Ok(Ipv4Addr::from(dst))
}

/// The delivery an IP packet from the device asks for (see the module docs for the rules).
pub fn classify_destination(
    packet: &[u8],
    network: &MeshNetwork,
) -> Result<Delivery, ClassifyError> {
    Ok(classify_address(ipv4_destination(packet)?, network))
}

/// [`classify_destination`] for an address already parsed.
pub fn classify_address(dst: Ipv4Addr, network: &MeshNetwork) -> Delivery {
    let cidr = network.cidr;
    // /31 and /32 have no broadcast address (RFC 3021).
    let has_broadcast = cidr.prefix_len() < 31;
    if dst.is_broadcast() || (has_broadcast && dst == cidr.broadcast()) {
        Delivery::Broadcast
    } else if dst.is_multicast() {
        Delivery::Multicast(dst)
    } else if network.anycast.contains(&dst) {
        Delivery::Anycast(dst)
    } else if dst == network.local_vip {
        Delivery::Local
    } else if cidr.contains(&dst) && !(has_broadcast && dst == cidr.network()) {
        Delivery::Unicast(dst)
    } else {
        Delivery::NotMesh
    }
}

/// What forwarding did to a packet's TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forward {
    /// TTL decremented (checksum updated): send it on.
    Forward,
    /// TTL reached 0: drop it (the TTL half of loop prevention).
    Expired,
}

/// Decrements the IPv4 TTL of a packet a peer forwards to another peer, updating the header
/// checksum incrementally (RFC 1624); a packet whose TTL would reach 0 is [`Forward::Expired`]
/// and left unchanged.
pub fn decrement_ttl(packet: &mut [u8]) -> Result<Forward, ClassifyError> {
    let first = *packet.first().ok_or(ClassifyError::Truncated)?;
    if first >> 4 != 4 {
        return Err(ClassifyError::NotIpv4(first >> 4));
    }
    if packet.len() < 20 {
        return Err(ClassifyError::Truncated);
    }
    let ttl = packet.get(8).copied().ok_or(ClassifyError::Truncated)?;
    if ttl <= 1 {
        return Ok(Forward::Expired);
    }
    let proto = packet.get(9).copied().ok_or(ClassifyError::Truncated)?;
    let old_sum = array_at::<2>(packet, 10)
        .map(u16::from_be_bytes)
        .ok_or(ClassifyError::Truncated)?;
    let old_word = u16::from_be_bytes([ttl, proto]);
    let new_word = u16::from_be_bytes([ttl - 1, proto]);
    // HC' = ~(~HC + ~m + m')
    let mut sum = u32::from(!old_sum) + u32::from(!old_word) + u32::from(new_word);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let new_sum = !(sum as u16);
    if let Some(t) = packet.get_mut(8) {
        *t = ttl - 1;
    }
    if let Some(c) = packet.get_mut(10..12) {
        c.copy_from_slice(&new_sum.to_be_bytes());
    }
    Ok(Forward::Forward)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn packet_to(dst: Ipv4Addr) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 20, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 99, 0, 1];
        p.extend(dst.octets());
        p
    }

    fn net() -> MeshNetwork {
        MeshNetwork::new(
            "10.99.0.0/16".parse().unwrap(),
            Ipv4Addr::new(10, 99, 0, 1),
            [Ipv4Addr::new(10, 99, 200, 1), Ipv4Addr::new(239, 1, 1, 1)],
        )
    }

    #[test]
    fn each_mode_is_picked_from_the_destination() {
        let n = net();
        let cases = [
            (Ipv4Addr::new(10, 99, 255, 255), Delivery::Broadcast),
            (Ipv4Addr::BROADCAST, Delivery::Broadcast),
            (
                Ipv4Addr::new(239, 1, 1, 1),
                Delivery::Multicast(Ipv4Addr::new(239, 1, 1, 1)),
            ),
            (
                Ipv4Addr::new(224, 0, 0, 251),
                Delivery::Multicast(Ipv4Addr::new(224, 0, 0, 251)),
            ),
            (
                Ipv4Addr::new(10, 99, 200, 1),
                Delivery::Anycast(Ipv4Addr::new(10, 99, 200, 1)),
            ),
            (Ipv4Addr::new(10, 99, 0, 1), Delivery::Local),
            (
                Ipv4Addr::new(10, 99, 3, 7),
                Delivery::Unicast(Ipv4Addr::new(10, 99, 3, 7)),
            ),
            (Ipv4Addr::new(10, 99, 0, 0), Delivery::NotMesh),
            (Ipv4Addr::new(192, 0, 2, 1), Delivery::NotMesh),
        ];
        for (dst, want) in cases {
            assert_eq!(classify_destination(&packet_to(dst), &n), Ok(want), "{dst}");
        }
    }

    #[test]
    fn point_to_point_networks_have_no_broadcast_address() {
        let n = MeshNetwork::new(
            "10.0.0.0/31".parse().unwrap(),
            Ipv4Addr::new(10, 0, 0, 0),
            [],
        );
        assert_eq!(
            classify_address(Ipv4Addr::new(10, 0, 0, 1), &n),
            Delivery::Unicast(Ipv4Addr::new(10, 0, 0, 1))
        );
    }

    #[test]
    fn short_and_ipv6_packets_are_errors() {
        let n = net();
        assert_eq!(classify_destination(&[], &n), Err(ClassifyError::Truncated));
        assert_eq!(
            classify_destination(&packet_to(Ipv4Addr::LOCALHOST)[..19], &n),
            Err(ClassifyError::Truncated)
        );
        assert_eq!(
            classify_destination(&[0x60; 40], &n),
            Err(ClassifyError::NotIpv4(6))
        );
    }

    #[test]
    fn forwarding_decrements_the_ttl_and_keeps_the_checksum_valid() {
        let mut p = crate::l2::etherip::encapsulate(
            Ipv4Addr::new(10, 99, 0, 1),
            Ipv4Addr::new(10, 99, 0, 3),
            0x1234,
            3,
            &[0; 14],
        )
        .unwrap();
        for ttl in [2u8, 1] {
            assert_eq!(decrement_ttl(&mut p), Ok(Forward::Forward));
            assert_eq!(p[8], ttl);
            assert_eq!(crate::l2::etherip::ipv4_checksum(&p[..20]), 0);
        }
        let before = p.clone();
        assert_eq!(decrement_ttl(&mut p), Ok(Forward::Expired));
        assert_eq!(p, before, "an expired packet is left alone");
        assert!(crate::l2::etherip::decapsulate(&p).is_ok());
        assert_eq!(
            decrement_ttl(&mut [0x45; 19]),
            Err(ClassifyError::Truncated)
        );
        assert_eq!(
            decrement_ttl(&mut [0x60; 40]),
            Err(ClassifyError::NotIpv4(6))
        );
    }

    proptest::proptest! {
        #[test]
        fn random_packets_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let _ = classify_destination(&bytes, &net());
            let _ = decrement_ttl(&mut bytes.clone());
        }

        #[test]
        fn the_incremental_checksum_equals_a_full_recompute(
            header in proptest::collection::vec(proptest::num::u8::ANY, 20),
            ttl in 2u8..=255,
        ) {
            let mut p = header;
            p[0] = 0x45;
            p[8] = ttl;
            p[10] = 0;
            p[11] = 0;
            let sum = crate::l2::etherip::ipv4_checksum(&p);
            p[10..12].copy_from_slice(&sum.to_be_bytes());
            decrement_ttl(&mut p).unwrap();
            proptest::prop_assert_eq!(crate::l2::etherip::ipv4_checksum(&p), 0);
        }
    }
}
