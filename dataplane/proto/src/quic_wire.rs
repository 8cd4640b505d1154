//! The messages of switchyard's QUIC transport between a client and a server (ALPN [`ALPN`]).
//!
//! * The client's first bidirectional stream (id 0) is the **hello**: magic `SYQ`, version 1,
//!   then the token (`u16` length + bytes) and the proxy user name and password (`u8` length +
//!   bytes each; empty = none). The server answers with a [`Reply`] and, when it refuses, also
//!   closes the connection with [`CLOSE_AUTH_REFUSED`] and the reason.
//! * Every other bidirectional stream is one proxied TCP flow: an [`Open`] (kind `1`, the host
//!   as `u8` length + bytes, the port as `u16`), answered by a [`Reply`] (status byte, `u8`
//!   length + message); after an `Ok` reply the stream carries the flow's bytes both ways.
//! * A QUIC datagram (RFC 9221) carries one UDP datagram of a flow: the flow id (`u32`), the
//!   SOCKS5 UDP header naming the destination (client → server) or the source (server →
//!   client), then the payload.
//!
//! All integers are big-endian. Parsers take what has arrived so far and return `Ok(None)` until
//! a message is complete, with the number of bytes it used.

use crate::socks5::{self, TargetAddr};

/// ALPN protocol id both sides require.
pub const ALPN: &[u8] = b"switchyard-quic/1";
const MAGIC: &[u8; 3] = b"SYQ";
const VERSION: u8 = 1;
const KIND_TCP: u8 = 1;

/// Application close code: the hello's token or credentials were refused.
pub const CLOSE_AUTH_REFUSED: u32 = 0x101;
/// Application close code: the hello was malformed or did not come first.
pub const CLOSE_BAD_HELLO: u32 = 0x102;
/// Application close code: the server is shutting the connection down (idle, reload).
pub const CLOSE_NORMAL: u32 = 0;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("not a switchyard QUIC hello")]
    BadMagic,
    #[error("unsupported switchyard QUIC version {0}")]
    Version(u8),
    #[error("unknown stream kind {0}")]
    Kind(u8),
    #[error("field too long: {0}")]
    TooLong(&'static str),
    #[error("malformed {0}")]
    Malformed(&'static str),
}

/// What a client presents once per connection.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hello {
    pub token: String,
    pub username: String,
    pub password: String,
}

/// The target of one proxied TCP flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Open {
    pub host: String,
    pub port: u16,
}

/// The server's answer to a hello or an open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    Ok = 0,
    /// Token or credentials missing or wrong.
    AuthRefused = 1,
    /// No route, or access control refused the destination.
    NotAllowed = 2,
    /// The destination (or the upstream of the routed backend) refused the connection.
    Refused = 3,
    /// Any other failure to reach the destination.
    Failed = 4,
    Timeout = 5,
    /// The open header could not be parsed.
    Malformed = 6,
}

impl Status {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => Status::Ok,
            1 => Status::AuthRefused,
            2 => Status::NotAllowed,
            3 => Status::Refused,
            5 => Status::Timeout,
            6 => Status::Malformed,
            _ => Status::Failed,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: Status,
    pub message: String,
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, at: 0 }
    }
    fn u8(&mut self) -> Option<u8> {
        let v = *self.buf.get(self.at)?;
        self.at += 1;
        Some(v)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes([self.u8()?, self.u8()?]))
    }
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let v = self.buf.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(v)
    }
    fn text(&mut self, n: usize, what: &'static str) -> Result<Option<String>, WireError> {
        match self.bytes(n) {
            None => Ok(None),
            Some(b) => String::from_utf8(b.to_vec())
                .map(Some)
                .map_err(|_| WireError::Malformed(what)),
        }
    }
}

fn put_u8_text(out: &mut Vec<u8>, s: &str, what: &'static str) -> Result<(), WireError> {
    let n = u8::try_from(s.len()).map_err(|_| WireError::TooLong(what))?;
    out.push(n);
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

pub fn encode_hello(hello: &Hello, out: &mut Vec<u8>) -> Result<(), WireError> {
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    let n = u16::try_from(hello.token.len()).map_err(|_| WireError::TooLong("token"))?;
    out.extend_from_slice(&n.to_be_bytes());
    out.extend_from_slice(hello.token.as_bytes());
    put_u8_text(out, &hello.username, "username")?;
    put_u8_text(out, &hello.password, "password")
}

pub fn parse_hello(buf: &[u8]) -> Result<Option<(Hello, usize)>, WireError> {
    let mut r = Reader::new(buf);
    let Some(magic) = r.bytes(3) else {
        return Ok(None);
    };
    if magic != MAGIC {
        return Err(WireError::BadMagic);
    }
    let Some(version) = r.u8() else {
        return Ok(None);
    };
    if version != VERSION {
        return Err(WireError::Version(version));
    }
    let Some(n) = r.u16() else { return Ok(None) };
    let Some(token) = r.text(usize::from(n), "token")? else {
        return Ok(None);
    };
    let Some(n) = r.u8() else { return Ok(None) };
    let Some(username) = r.text(usize::from(n), "username")? else {
        return Ok(None);
    };
    let Some(n) = r.u8() else { return Ok(None) };
    let Some(password) = r.text(usize::from(n), "password")? else {
        return Ok(None);
    };
    Ok(Some((
        Hello {
            token,
            username,
            password,
        },
        r.at,
    )))
}

pub fn encode_open(open: &Open, out: &mut Vec<u8>) -> Result<(), WireError> {
    if open.host.is_empty() {
        return Err(WireError::Malformed("empty host"));
    }
    out.push(KIND_TCP);
    put_u8_text(out, &open.host, "host")?;
    out.extend_from_slice(&open.port.to_be_bytes());
    Ok(())
}

pub fn parse_open(buf: &[u8]) -> Result<Option<(Open, usize)>, WireError> {
    let mut r = Reader::new(buf);
    let Some(kind) = r.u8() else { return Ok(None) };
    if kind != KIND_TCP {
        return Err(WireError::Kind(kind));
    }
    let Some(n) = r.u8() else { return Ok(None) };
    let Some(host) = r.text(usize::from(n), "host")? else {
        return Ok(None);
    };
    if host.is_empty() {
        return Err(WireError::Malformed("empty host"));
    }
    let Some(port) = r.u16() else { return Ok(None) };
    Ok(Some((Open { host, port }, r.at)))
}

/// Appends a reply; a message longer than 255 bytes is cut (at a character boundary).
pub fn encode_reply(status: Status, message: &str, out: &mut Vec<u8>) {
    let mut end = message.len().min(255);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    out.push(status as u8);
    out.push(end as u8);
    out.extend_from_slice(message.as_bytes().get(..end).unwrap_or_default());
}

pub fn parse_reply(buf: &[u8]) -> Result<Option<(Reply, usize)>, WireError> {
    let mut r = Reader::new(buf);
    let Some(status) = r.u8() else {
        return Ok(None);
    };
    let Some(n) = r.u8() else { return Ok(None) };
    let Some(bytes) = r.bytes(usize::from(n)) else {
        return Ok(None);
    };
    Ok(Some((
        Reply {
            status: Status::from_u8(status),
            message: String::from_utf8_lossy(bytes).into_owned(),
        },
        r.at,
    )))
}

/// Appends a datagram of `flow` for (or from) `addr`.
pub fn encode_datagram(flow: u32, addr: &TargetAddr, payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&flow.to_be_bytes());
    socks5::encode_udp_header(addr, out);
    out.extend_from_slice(payload);
}

/// A whole datagram: flow id, address, and where the payload starts.
pub fn parse_datagram(datagram: &[u8]) -> Result<(u32, TargetAddr, usize), WireError> {
    let mut r = Reader::new(datagram);
    let flow = match (r.u16(), r.u16()) {
        (Some(hi), Some(lo)) => (u32::from(hi) << 16) | u32::from(lo),
        _ => return Err(WireError::Malformed("datagram")),
    };
    let rest = datagram.get(4..).unwrap_or_default();
    let header = socks5::parse_udp_header(rest).map_err(|_| WireError::Malformed("datagram"))?;
    if header.frag != 0 {
        return Err(WireError::Malformed("fragmented datagram"));
    }
    Ok((flow, header.addr, 4 + header.header_len))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_waits_for_more() {
        let hello = Hello {
            token: "t0k".into(),
            username: "alice".into(),
            password: "pw".into(),
        };
        let mut out = Vec::new();
        encode_hello(&hello, &mut out).unwrap();
        out.extend_from_slice(b"rest");
        let (parsed, used) = parse_hello(&out).unwrap().unwrap();
        assert_eq!(parsed, hello);
        assert_eq!(&out[used..], b"rest");
        for cut in 0..used {
            assert_eq!(parse_hello(&out[..cut]).unwrap(), None, "cut at {cut}");
        }
    }

    #[test]
    fn hello_rejects_other_protocols_and_versions() {
        assert_eq!(
            parse_hello(b"GET / HTTP/1.1").unwrap_err(),
            WireError::BadMagic
        );
        assert_eq!(parse_hello(b"SYQ\x09").unwrap_err(), WireError::Version(9));
    }

    #[test]
    fn open_round_trips_and_refuses_bad_input() {
        let open = Open {
            host: "example.com".into(),
            port: 443,
        };
        let mut out = Vec::new();
        encode_open(&open, &mut out).unwrap();
        assert_eq!(parse_open(&out).unwrap(), Some((open, out.len())));
        assert_eq!(parse_open(&out[..out.len() - 1]).unwrap(), None);
        assert_eq!(parse_open(b"\x07").unwrap_err(), WireError::Kind(7));
        assert!(parse_open(b"\x01\x00\x00\x50").is_err(), "empty host");
        assert!(
            parse_open(b"\x01\x02\xff\xfe\x00\x50").is_err(),
            "not UTF-8"
        );
        let long = Open {
            host: "a".repeat(300),
            port: 1,
        };
        assert_eq!(
            encode_open(&long, &mut Vec::new()).unwrap_err(),
            WireError::TooLong("host")
        );
    }

    #[test]
    fn reply_round_trips_and_cuts_long_messages() {
        let mut out = Vec::new();
        encode_reply(Status::Refused, "connection refused", &mut out);
        let (reply, used) = parse_reply(&out).unwrap().unwrap();
        assert_eq!(used, out.len());
        assert_eq!(reply.status, Status::Refused);
        assert_eq!(reply.message, "connection refused");
        out.clear();
        encode_reply(Status::Failed, &"é".repeat(200), &mut out);
        let (reply, _) = parse_reply(&out).unwrap().unwrap();
        assert_eq!(reply.message.chars().count(), 127);
        assert_eq!(parse_reply(&out[..10]).unwrap(), None);
    }

    #[test]
    fn datagram_round_trips() {
        let addr = TargetAddr::Domain("dns.test".into(), 53);
        let mut out = Vec::new();
        encode_datagram(7, &addr, b"payload", &mut out);
        let (flow, parsed, at) = parse_datagram(&out).unwrap();
        assert_eq!((flow, parsed), (7, addr));
        assert_eq!(&out[at..], b"payload");
        assert!(parse_datagram(&out[..3]).is_err());
        assert!(parse_datagram(&out[..6]).is_err());
    }
}
