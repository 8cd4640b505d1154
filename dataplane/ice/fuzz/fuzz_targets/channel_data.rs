//! TURN ChannelData frames and the mesh socket's demultiplexer: never panic on arbitrary
//! bytes; a decoded frame re-encodes to a frame that decodes to the same channel and data; a
//! datagram is classified STUN exactly when the quick check says so.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_ice::stun::Message;
use switchyard_ice::{channel_data, classify, DatagramKind};

fuzz_target!(|data: &[u8]| {
    let kind = classify(data);
    assert_eq!(kind == DatagramKind::Stun, Message::looks_like_stun(data));
    if let Some((channel, payload)) = channel_data::decode(data) {
        let frame = channel_data::encode(channel, payload);
        assert_eq!(channel_data::decode(&frame), Some((channel, payload)));
        assert!(kind != DatagramKind::Other);
    } else {
        assert!(kind != DatagramKind::ChannelData);
    }
});
