//! Cache entry headers: decoding arbitrary bytes never panics; whatever decodes re-encodes to
//! a block that decodes to the same meta; the length hint agrees with the decoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_proto::cache::entry::{decode_header, encode_header, header_len_hint, BLOCK};

fuzz_target!(|data: &[u8]| {
    let hint = header_len_hint(data);
    if let Ok((meta, len)) = decode_header(data) {
        assert_eq!(hint, Some(len));
        assert_eq!(len % BLOCK, 0);
        let block = encode_header(&meta);
        assert_eq!(block.len(), len);
        let (again, again_len) = decode_header(&block).expect("re-encoded header decodes");
        assert_eq!(again, meta);
        assert_eq!(again_len, len);
    }
    // A valid header with the fuzzer's bytes spliced in: exercises the checked paths behind
    // the checksum too.
    let (Some(&seed), Some(rest)) = (data.first(), data.get(1..)) else {
        return;
    };
    let mut block = encode_header(&switchyard_proto::cache::entry::EntryMeta {
        key: String::from_utf8_lossy(rest).into_owned(),
        headers: vec![("X".into(), rest.to_vec())],
        ..Default::default()
    });
    let at = usize::from(seed) % block.len();
    block[at] ^= 0xff;
    let _ = decode_header(&block);
    let _ = header_len_hint(&block);
});
