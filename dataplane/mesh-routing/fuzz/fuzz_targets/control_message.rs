//! Control-port datagrams (every kind: announcements, probes, memberships, floods): decoding
//! arbitrary bytes never panics; what decodes re-encodes to the same bytes (the format has one
//! encoding per message) and decodes to an equal message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_mesh_routing::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(msg) = Message::decode(data) else {
        return;
    };
    let bytes = msg.encode().expect("a decoded message encodes");
    assert_eq!(bytes, data, "{msg:?}");
    assert_eq!(Message::decode(&bytes).expect("re-decodes"), msg);
});
