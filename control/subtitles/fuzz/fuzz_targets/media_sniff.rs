//! Media container sniffing on arbitrary bytes: never panics, only looks at the first
//! `SNIFF_LEN` bytes, and never takes a playlist (HLS, ffconcat) for media.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../src/media.rs"]
#[allow(dead_code)]
mod media;

fuzz_target!(|data: &[u8]| {
    let got = media::sniff(data);
    let head = &data[..data.len().min(media::SNIFF_LEN)];
    assert_eq!(got, media::sniff(head));
    if data.starts_with(b"#EXTM3U") || data.starts_with(b"ffconcat") {
        assert_eq!(got, None);
    }
    if let Some(c) = got {
        assert!(c.file_name().starts_with("media."));
        assert!(!c.demuxer().is_empty());
    }
});
