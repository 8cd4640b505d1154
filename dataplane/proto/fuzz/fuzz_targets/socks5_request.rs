//! SOCKS5 parsing on arbitrary bytes: greeting, username/password, request, UDP header and the
//! client-side replies. No panics, consumed counts within bounds, and parse → encode → parse
//! round trips.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_proto::socks5::{
    encode_request, encode_udp_header, encode_userpass, parse_greeting, parse_method_selection,
    parse_reply, parse_request, parse_udp_header, parse_userpass, parse_userpass_status,
    try_encode_udp_header,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((g, n))) = parse_greeting(data) {
        assert!(n <= data.len());
        assert_eq!(g.methods.len() + 2, n);
    }
    if let Ok(Some((up, n))) = parse_userpass(data) {
        assert!(n <= data.len());
        let mut out = Vec::new();
        encode_userpass(&up.username, &up.password, &mut out).expect("parsed creds encode");
        assert_eq!(&out[..], &data[..n]);
    }
    if let Ok(Some((req, n))) = parse_request(data) {
        assert!(n <= data.len());
        let mut out = Vec::new();
        encode_request(req.command, &req.addr, &mut out).expect("parsed request encodes");
        let (again, m) = parse_request(&out).expect("re-parse").expect("complete");
        assert_eq!(m, out.len());
        assert_eq!(again, req);
        let _ = req.addr.to_string();
    }
    if let Ok(h) = parse_udp_header(data) {
        assert!(h.header_len <= data.len());
        let mut out = Vec::new();
        try_encode_udp_header(&h.addr, &mut out).expect("parsed address encodes");
        let again = parse_udp_header(&out).expect("re-parse");
        assert_eq!(again.addr, h.addr);
        let mut out2 = Vec::new();
        encode_udp_header(&h.addr, &mut out2);
        assert_eq!(out, out2);
    }
    if let Ok(Some((_, n))) = parse_reply(data) {
        assert!(n <= data.len());
    }
    if let Ok(Some((_, n))) = parse_method_selection(data) {
        assert_eq!(n, 2);
    }
    if let Ok(Some((_, n))) = parse_userpass_status(data) {
        assert_eq!(n, 2);
    }
});
