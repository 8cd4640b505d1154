//! Memberships (kind 4): the body after the kind and version bytes is the fuzzer's. A decoded
//! membership round-trips; the group table stores it (a new origin), refuses the same sequence
//! again, lists the origin as a member of each announced group, and takes a newer sequence.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::time::Instant;
use switchyard_mesh_routing::groups::GroupTable;
use switchyard_mesh_routing::wire::{Membership, VERSION};
use switchyard_mesh_routing::Message;

fuzz_target!(|data: &[u8]| {
    let mut datagram = vec![4, VERSION];
    datagram.extend_from_slice(data);
    let Ok(Message::Membership(m)) = Message::decode(&datagram) else {
        return;
    };
    let again = Message::Membership(m.clone()).encode().expect("encodes");
    assert_eq!(again, datagram);

    let now = Instant::now();
    let mut table = GroupTable::new(0);
    assert!(table.accept(&m, now), "a first announcement is stored");
    assert!(!table.accept(&m, now), "the same sequence is not news");
    for g in &m.groups {
        assert!(table
            .remote_members(*g)
            .iter()
            .any(|(id, vip)| *id == m.origin && *vip == m.vip));
        assert!(table.all_groups().contains(g));
    }
    let newer = Membership {
        seq: m.seq.wrapping_add(1),
        groups: Vec::new(),
        ..m.clone()
    };
    assert!(table.accept(&newer, now), "a newer sequence replaces it");
    for g in &m.groups {
        assert!(table.remote_members(*g).is_empty());
    }
    table.forget(&m.origin);
    assert!(table.all_groups().is_empty());
});
