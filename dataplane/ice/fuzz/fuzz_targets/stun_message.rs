//! STUN messages (RFC 8489, with the ICE and TURN attributes): decoding arbitrary bytes never
//! panics; what decodes passes the demultiplexer's quick check, re-encodes (with and without
//! MESSAGE-INTEGRITY and FINGERPRINT) into bytes that decode to an equal message, whose
//! integrity verifies with the key it was written with and not with another; checking the
//! integrity of the fuzzer's own message never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_ice::stun::Message;

const KEY: &[u8] = b"fuzz-integrity-key";

fuzz_target!(|data: &[u8]| {
    let Ok(msg) = Message::decode(data) else {
        return;
    };
    assert!(Message::looks_like_stun(data));
    let _ = msg.verify_integrity(data, KEY);
    let plain = Message {
        integrity: None,
        ..msg.clone()
    };
    for (key, fingerprint) in [
        (None, false),
        (None, true),
        (Some(KEY), false),
        (Some(KEY), true),
    ] {
        let Ok(bytes) = msg.encode(key, fingerprint) else {
            // only a message near the length field's limit outgrows it by the 32 bytes of
            // MESSAGE-INTEGRITY and FINGERPRINT
            assert!(data.len() + 32 > usize::from(u16::MAX));
            continue;
        };
        assert!(Message::looks_like_stun(&bytes));
        let again = Message::decode(&bytes).expect("a re-encoded message decodes");
        assert_eq!(
            Message {
                integrity: None,
                ..again.clone()
            },
            plain
        );
        assert_eq!(again.integrity.is_some(), key.is_some());
        if key.is_some() {
            assert!(again.verify_integrity(&bytes, KEY));
            assert!(!again.verify_integrity(&bytes, b"another key"));
        }
    }
});
