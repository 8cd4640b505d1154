//! Runtime-free protocol logic shared by the glommio data plane and the tokio control plane:
//! parsers and encoders take bytes in and give values (or bytes) out; no sockets, no runtime.
#![forbid(unsafe_code)]

pub mod http1;
pub mod pac;
pub mod route_matcher;
pub mod socks5;
