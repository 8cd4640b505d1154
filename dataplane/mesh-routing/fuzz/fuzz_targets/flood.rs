//! Floods (kind 5) and what the data path does with their payloads: the body after the kind
//! and version bytes is the fuzzer's. A decoded flood round-trips; its payload is classified
//! for delivery and TTL-decremented like a forwarded packet without panicking; a header whose
//! checksum was valid stays valid after the decrement; the (origin, id) duplicate filter takes
//! a key once.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::net::Ipv4Addr;
use std::time::Instant;
use switchyard_mesh_routing::l2::etherip::ipv4_checksum;
use switchyard_mesh_routing::seen::SeenCache;
use switchyard_mesh_routing::wire::{Flood, VERSION};
use switchyard_mesh_routing::{classify_destination, decrement_ttl, Forward, MeshNetwork, Message};

fuzz_target!(|data: &[u8]| {
    let mut datagram = vec![5, VERSION];
    datagram.extend_from_slice(data);
    let Ok(Message::Flood(flood)) = Message::decode(&datagram) else {
        return;
    };
    let again = Message::Flood(flood.clone()).encode().expect("encodes");
    assert_eq!(again, datagram);
    let Flood {
        origin,
        id,
        payload,
        ..
    } = &flood;

    let network = MeshNetwork::new(
        "10.99.0.0/16".parse().expect("cidr"),
        Ipv4Addr::new(10, 99, 0, 1),
        [Ipv4Addr::new(10, 99, 200, 1), Ipv4Addr::new(239, 1, 1, 1)],
    );
    let _ = classify_destination(payload, &network);

    let mut packet = payload.clone();
    let ihl = usize::from(packet.first().copied().unwrap_or(0) & 0x0f) * 4;
    let valid_before = ihl >= 20 && packet.len() >= ihl && ipv4_checksum(&packet[..ihl]) == 0;
    if let Ok(Forward::Forward) = decrement_ttl(&mut packet) {
        assert_eq!(packet[8], payload[8] - 1);
        assert_eq!(packet[..8], payload[..8]);
        assert_eq!(packet[12..], payload[12..]);
        if valid_before {
            assert_eq!(
                ipv4_checksum(&packet[..ihl]),
                0,
                "checksum after the decrement"
            );
        }
    } else {
        assert_eq!(
            &packet, payload,
            "an expired or refused packet is left unchanged"
        );
    }

    let mut seen = SeenCache::default();
    let now = Instant::now();
    assert!(seen.insert(origin, *id, now));
    assert!(!seen.insert(origin, *id, now));
    assert!(seen.insert(origin, id.wrapping_add(1), now));
    assert_eq!(seen.len(), 2);
});
