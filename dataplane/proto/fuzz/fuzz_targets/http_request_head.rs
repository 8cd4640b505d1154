//! Request (and response) head parsing on arbitrary bytes: no panics, consistent lengths, body
//! framing and target parsing never panic, and a parsed head survives write → parse unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_proto::http1::{
    parse_request_head, parse_response_head, parse_target, request_body_kind, response_body_kind,
    strip_hop_by_hop, write_request_head, write_response_head, HeadLimits,
};

fuzz_target!(|data: &[u8]| {
    let limits = HeadLimits {
        max_head_bytes: 8 * 1024,
        max_headers: 32,
    };
    if let Ok(Some((mut head, len))) = parse_request_head(data, &limits) {
        assert!(len <= data.len() && len <= limits.max_head_bytes);
        // The head alone parses to the same head (trailing bytes never change it).
        if let Ok(Some((again, len2))) = parse_request_head(&data[..len], &limits) {
            assert_eq!(len2, len);
            assert_eq!(again, head);
        }
        let _ = request_body_kind(&head);
        let _ = parse_target(&head.method, &head.target);
        let _ = head.wants_keep_alive();
        let mut out = Vec::new();
        write_request_head(&head, &mut out);
        let big = HeadLimits {
            max_head_bytes: out.len() + 1,
            max_headers: 64,
        };
        let (reparsed, n) = parse_request_head(&out, &big)
            .expect("written head parses")
            .expect("written head is complete");
        assert_eq!(n, out.len());
        assert_eq!(reparsed.method, head.method);
        assert_eq!(reparsed.target, head.target);
        assert_eq!(reparsed.headers.len(), head.headers.len());
        strip_hop_by_hop(&mut head.headers);
        assert!(head.header("connection").is_none());
    }
    if let Ok(Some((head, len))) = parse_response_head(data, &limits) {
        assert!(len <= data.len());
        for method in ["GET", "HEAD", "CONNECT"] {
            let _ = response_body_kind(method, &head);
        }
        let mut out = Vec::new();
        write_response_head(&head, &mut out);
        let big = HeadLimits {
            max_head_bytes: out.len() + 1,
            max_headers: 64,
        };
        let (reparsed, _) = parse_response_head(&out, &big)
            .expect("written head parses")
            .expect("written head is complete");
        assert_eq!(reparsed.status, head.status);
        assert_eq!(reparsed.headers.len(), head.headers.len());
    }
    // Target parsing on raw text.
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = parse_target("CONNECT", s);
        let _ = parse_target("GET", s);
    }
});
