//! Runtime-free protocol logic shared by the glommio data plane and the tokio control plane.
//!
//! Parsers and encoders take bytes in and give values (or bytes) out; there are no sockets, no
//! async runtime and no clocks here, so everything is unit-tested and fuzzed (see `fuzz/`)
//! without I/O, and both planes call the very same code:
//!
//! * [`http1`]: HTTP/1.x heads (via `httparse`), body framing with smuggling defences, hop-by-hop
//!   header removal, request targets, a verbatim chunked-body scanner, canned responses.
//! * [`socks5`]: RFC 1928 / RFC 1929 messages, server and client side, plus UDP ASSOCIATE headers.
//! * [`route_matcher`]: domain patterns (`example.com`, `*.example.com`, `cdn*.example.com`, `*`)
//!   compiled into an indexed table that picks the winning route by priority, then config order.
//! * [`quic_wire`]: the hello, stream-open, reply and datagram messages of the QUIC transport.
//! * [`pac`]: a PAC script (ES5) with exactly the route matcher's semantics, for browsers.
//! * [`cache`]: the HTTP cache's policy and formats — presets, rules, cache keys, freshness and
//!   bypass decisions, byte ranges, the on-disk entry header and the eviction index.
//!
//! Non-test code may not panic on input: indexing, `unwrap`, `expect` and `panic!` are denied
//! below and errors are `thiserror` enums that say which status or reply code to send.
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo
    )
)]

pub mod cache;
pub mod http1;
pub mod pac;
pub mod quic_wire;
pub mod route_matcher;
pub mod socks5;
