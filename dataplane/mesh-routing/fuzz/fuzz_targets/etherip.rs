//! EtherIP (IPv4 protocol 97): decapsulating arbitrary bytes never panics; what decapsulates
//! re-encapsulates (same addresses, TTL and frame) into a packet that decapsulates to an equal
//! value; any frame the fuzzer gives encapsulates into a packet that decapsulates to it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::net::Ipv4Addr;
use switchyard_mesh_routing::l2::etherip::{decapsulate, encapsulate, ETHERNET_HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = decapsulate(data) {
        let packet = encapsulate(p.src, p.dst, 7, p.ttl, p.frame).expect("a decoded frame fits");
        let again = decapsulate(&packet).expect("re-encapsulated packet decapsulates");
        assert_eq!(again, p);
    }
    let src = Ipv4Addr::new(10, 99, 0, 1);
    let dst = Ipv4Addr::new(10, 99, 0, 2);
    let Some((&ttl, frame)) = data.split_first() else {
        return;
    };
    let packet = encapsulate(src, dst, 1, ttl, frame).expect("fits");
    match decapsulate(&packet) {
        Ok(p) => {
            assert_eq!((p.src, p.dst, p.ttl, p.frame), (src, dst, ttl, frame));
        }
        Err(e) => assert!(frame.len() < ETHERNET_HEADER_LEN, "{e}"),
    }
});
