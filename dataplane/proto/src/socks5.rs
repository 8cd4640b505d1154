//! SOCKS5 (RFC 1928) and its username/password sub-negotiation (RFC 1929), both sides.
//!
//! What it does: server-side parsers for the greeting, the username/password request and the
//! CONNECT / BIND / UDP ASSOCIATE request, with encoders for the matching answers; client-side
//! encoders and parsers for talking to an upstream SOCKS5 proxy; and the header of UDP ASSOCIATE
//! datagrams. Streaming parsers return `Ok(None)` while they need more bytes and
//! `Ok(Some((value, consumed)))` once a message is complete, so a caller can keep reading into one
//! buffer and drain what was consumed.
//!
//! What it does not: no I/O, no authentication policy, no name resolution. [`Socks5Error`] tells
//! the caller which [`ReplyCode`] to send before closing (see [`Socks5Error::reply_code`]).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The protocol version byte.
pub const VERSION: u8 = 5;
/// Version byte of the RFC 1929 username/password sub-negotiation.
pub const USERPASS_VERSION: u8 = 1;

const ATYP_IPV4: u8 = 1;
const ATYP_DOMAIN: u8 = 3;
const ATYP_IPV6: u8 = 4;

/// An authentication method (RFC 1928 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    NoAuth,
    UserPass,
    NoAcceptable,
    Other(u8),
}

impl Method {
    pub const NO_AUTH: u8 = 0x00;
    pub const USER_PASS: u8 = 0x02;
    pub const NO_ACCEPTABLE: u8 = 0xFF;

    pub fn as_u8(self) -> u8 {
        match self {
            Method::NoAuth => Self::NO_AUTH,
            Method::UserPass => Self::USER_PASS,
            Method::NoAcceptable => Self::NO_ACCEPTABLE,
            Method::Other(b) => b,
        }
    }
}

impl From<u8> for Method {
    fn from(b: u8) -> Self {
        match b {
            Self::NO_AUTH => Method::NoAuth,
            Self::USER_PASS => Method::UserPass,
            Self::NO_ACCEPTABLE => Method::NoAcceptable,
            other => Method::Other(other),
        }
    }
}

impl From<Method> for u8 {
    fn from(m: Method) -> u8 {
        m.as_u8()
    }
}

/// The client's greeting: the authentication methods it offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greeting {
    pub methods: Vec<u8>,
}

impl Greeting {
    /// Whether the client offered `method`.
    pub fn offers(&self, method: Method) -> bool {
        self.methods.contains(&method.as_u8())
    }
}

/// A request command (RFC 1928 §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    Connect,
    Bind,
    UdpAssociate,
}

impl Command {
    pub fn as_u8(self) -> u8 {
        match self {
            Command::Connect => 1,
            Command::Bind => 2,
            Command::UdpAssociate => 3,
        }
    }

    pub fn from_u8(b: u8) -> Option<Self> {
        match b {
            1 => Some(Command::Connect),
            2 => Some(Command::Bind),
            3 => Some(Command::UdpAssociate),
            _ => None,
        }
    }
}

/// A destination (or bound) address: an IP socket address or a domain name with a port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TargetAddr {
    Ip(SocketAddr),
    Domain(String, u16),
}

impl TargetAddr {
    pub fn port(&self) -> u16 {
        match self {
            TargetAddr::Ip(a) => a.port(),
            TargetAddr::Domain(_, p) => *p,
        }
    }

    /// The host part: the IP as text (IPv6 without brackets) or the domain name.
    pub fn host(&self) -> String {
        match self {
            TargetAddr::Ip(a) => a.ip().to_string(),
            TargetAddr::Domain(d, _) => d.clone(),
        }
    }

    /// Bytes this address takes on the wire (ATYP, address, port).
    pub fn encoded_len(&self) -> usize {
        match self {
            TargetAddr::Ip(SocketAddr::V4(_)) => 1 + 4 + 2,
            TargetAddr::Ip(SocketAddr::V6(_)) => 1 + 16 + 2,
            TargetAddr::Domain(d, _) => 1 + 1 + d.len() + 2,
        }
    }
}

impl fmt::Display for TargetAddr {
    /// `host:port`, IPv6 as `[v6]:port`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetAddr::Ip(a) => write!(f, "{a}"),
            TargetAddr::Domain(d, p) => write!(f, "{d}:{p}"),
        }
    }
}

impl From<SocketAddr> for TargetAddr {
    fn from(a: SocketAddr) -> Self {
        TargetAddr::Ip(a)
    }
}

/// A client request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub command: Command,
    pub addr: TargetAddr,
}

/// RFC 1929 credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct UserPass {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for UserPass {
    /// Never prints the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserPass")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Reply field of a server reply (RFC 1928 §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReplyCode {
    Succeeded = 0,
    GeneralFailure = 1,
    NotAllowed = 2,
    NetworkUnreachable = 3,
    HostUnreachable = 4,
    ConnectionRefused = 5,
    TtlExpired = 6,
    CommandNotSupported = 7,
    AddressTypeNotSupported = 8,
}

impl ReplyCode {
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// The code for a reply byte, `None` for values RFC 1928 leaves unassigned.
    pub fn from_u8(b: u8) -> Option<Self> {
        Some(match b {
            0 => ReplyCode::Succeeded,
            1 => ReplyCode::GeneralFailure,
            2 => ReplyCode::NotAllowed,
            3 => ReplyCode::NetworkUnreachable,
            4 => ReplyCode::HostUnreachable,
            5 => ReplyCode::ConnectionRefused,
            6 => ReplyCode::TtlExpired,
            7 => ReplyCode::CommandNotSupported,
            8 => ReplyCode::AddressTypeNotSupported,
            _ => return None,
        })
    }

    /// The reply for a failed outbound connect, from its `io::ErrorKind`.
    pub fn from_io_error_kind(kind: std::io::ErrorKind) -> Self {
        use std::io::ErrorKind as K;
        match kind {
            K::ConnectionRefused => ReplyCode::ConnectionRefused,
            K::NetworkUnreachable => ReplyCode::NetworkUnreachable,
            K::HostUnreachable | K::NotFound => ReplyCode::HostUnreachable,
            K::TimedOut => ReplyCode::TtlExpired,
            K::PermissionDenied => ReplyCode::NotAllowed,
            _ => ReplyCode::GeneralFailure,
        }
    }
}

/// Why a SOCKS5 message was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Socks5Error {
    /// Wrong version byte. In a greeting: close without replying (it isn't SOCKS5); in a request:
    /// reply [`ReplyCode::GeneralFailure`] and close.
    #[error("unsupported SOCKS version {0}")]
    BadVersion(u8),
    /// Unknown command: reply [`ReplyCode::CommandNotSupported`] and close.
    #[error("unsupported SOCKS5 command {0}")]
    CommandNotSupported(u8),
    /// Unknown address type: reply [`ReplyCode::AddressTypeNotSupported`] and close.
    #[error("unsupported SOCKS5 address type {0}")]
    AddressTypeNotSupported(u8),
    /// Anything else malformed: reply [`ReplyCode::GeneralFailure`] (where a reply is possible)
    /// and close.
    #[error("malformed SOCKS5 message: {0}")]
    Malformed(String),
}

impl Socks5Error {
    /// The reply code to send for this error (when the protocol step allows a reply at all).
    pub fn reply_code(&self) -> ReplyCode {
        match self {
            Socks5Error::BadVersion(_) | Socks5Error::Malformed(_) => ReplyCode::GeneralFailure,
            Socks5Error::CommandNotSupported(_) => ReplyCode::CommandNotSupported,
            Socks5Error::AddressTypeNotSupported(_) => ReplyCode::AddressTypeNotSupported,
        }
    }
}

fn malformed(msg: impl Into<String>) -> Socks5Error {
    Socks5Error::Malformed(msg.into())
}

/// A cursor that distinguishes "need more bytes" (`None`) from a value.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn u8(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.bytes(N)?.try_into().ok()
    }

    fn u16(&mut self) -> Option<u16> {
        self.array::<2>().map(u16::from_be_bytes)
    }
}

/// Early-return `Ok(None)` when the reader ran out of bytes.
macro_rules! need {
    ($e:expr) => {
        match $e {
            Some(v) => v,
            None => return Ok(None),
        }
    };
}

fn domain_from_bytes(raw: &[u8]) -> Result<String, Socks5Error> {
    if raw.is_empty() {
        return Err(malformed("empty domain name"));
    }
    let s = std::str::from_utf8(raw).map_err(|_| malformed("domain name is not UTF-8"))?;
    if s.chars().any(char::is_control) {
        return Err(malformed("control character in domain name"));
    }
    Ok(s.to_owned())
}

/// Reads ATYP, address and port. `Ok(None)` = need more bytes.
fn read_addr(r: &mut Reader<'_>) -> Result<Option<TargetAddr>, Socks5Error> {
    let atyp = need!(r.u8());
    let addr = match atyp {
        ATYP_IPV4 => {
            let ip = Ipv4Addr::from(need!(r.array::<4>()));
            let port = need!(r.u16());
            TargetAddr::Ip(SocketAddr::new(IpAddr::V4(ip), port))
        }
        ATYP_IPV6 => {
            let ip = Ipv6Addr::from(need!(r.array::<16>()));
            let port = need!(r.u16());
            TargetAddr::Ip(SocketAddr::new(IpAddr::V6(ip), port))
        }
        ATYP_DOMAIN => {
            let len = need!(r.u8());
            if len == 0 {
                return Err(malformed("empty domain name"));
            }
            let raw = need!(r.bytes(usize::from(len)));
            let port = need!(r.u16());
            TargetAddr::Domain(domain_from_bytes(raw)?, port)
        }
        other => return Err(Socks5Error::AddressTypeNotSupported(other)),
    };
    Ok(Some(addr))
}

/// Appends ATYP, address and port. Fails for a domain that is empty or longer than 255 bytes.
fn write_addr(addr: &TargetAddr, out: &mut Vec<u8>) -> Result<(), Socks5Error> {
    match addr {
        TargetAddr::Ip(SocketAddr::V4(a)) => {
            out.push(ATYP_IPV4);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_be_bytes());
        }
        TargetAddr::Ip(SocketAddr::V6(a)) => {
            out.push(ATYP_IPV6);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_be_bytes());
        }
        TargetAddr::Domain(d, port) => {
            let len = u8::try_from(d.len())
                .ok()
                .filter(|&l| l > 0)
                .ok_or_else(|| malformed("domain name must be 1..=255 bytes"))?;
            out.push(ATYP_DOMAIN);
            out.push(len);
            out.extend_from_slice(d.as_bytes());
            out.extend_from_slice(&port.to_be_bytes());
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Server side.

/// Parses the client greeting `VER NMETHODS METHODS…`. A wrong version is
/// [`Socks5Error::BadVersion`] (close silently); zero methods is `Malformed`.
pub fn parse_greeting(buf: &[u8]) -> Result<Option<(Greeting, usize)>, Socks5Error> {
    let mut r = Reader::new(buf);
    let ver = need!(r.u8());
    if ver != VERSION {
        return Err(Socks5Error::BadVersion(ver));
    }
    let n = need!(r.u8());
    if n == 0 {
        return Err(malformed("greeting offers no methods"));
    }
    let methods = need!(r.bytes(usize::from(n))).to_vec();
    Ok(Some((Greeting { methods }, r.pos)))
}

/// Parses an RFC 1929 request `VER ULEN UNAME PLEN PASSWD` (VER = 1). Empty names or passwords
/// are accepted (the credential check will reject them); non-UTF-8 ones are `Malformed`.
pub fn parse_userpass(buf: &[u8]) -> Result<Option<(UserPass, usize)>, Socks5Error> {
    let mut r = Reader::new(buf);
    let ver = need!(r.u8());
    if ver != USERPASS_VERSION {
        return Err(Socks5Error::BadVersion(ver));
    }
    let ulen = need!(r.u8());
    let user = need!(r.bytes(usize::from(ulen)));
    let plen = need!(r.u8());
    let pass = need!(r.bytes(usize::from(plen)));
    let text = |b: &[u8], what: &str| {
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| malformed(format!("{what} is not UTF-8")))
    };
    let creds = UserPass {
        username: text(user, "username")?,
        password: text(pass, "password")?,
    };
    Ok(Some((creds, r.pos)))
}

/// Parses a request `VER CMD RSV ATYP DST.ADDR DST.PORT`. The reserved byte is ignored.
/// Errors are reported as soon as the offending byte has arrived.
pub fn parse_request(buf: &[u8]) -> Result<Option<(Request, usize)>, Socks5Error> {
    let mut r = Reader::new(buf);
    let ver = need!(r.u8());
    if ver != VERSION {
        return Err(Socks5Error::BadVersion(ver));
    }
    let cmd = need!(r.u8());
    let command = Command::from_u8(cmd).ok_or(Socks5Error::CommandNotSupported(cmd))?;
    let _rsv = need!(r.u8());
    let addr = need!(read_addr(&mut r)?);
    Ok(Some((Request { command, addr }, r.pos)))
}

/// `VER METHOD`: the server's method choice.
pub fn encode_method_selection(method: u8) -> [u8; 2] {
    [VERSION, method]
}

/// `VER STATUS` of the RFC 1929 sub-negotiation (`0` = success).
pub fn encode_userpass_status(ok: bool) -> [u8; 2] {
    [USERPASS_VERSION, if ok { 0 } else { 1 }]
}

/// Appends a reply `VER REP RSV ATYP BND.ADDR BND.PORT`.
pub fn encode_reply(code: ReplyCode, bound: SocketAddr, out: &mut Vec<u8>) {
    out.extend_from_slice(&[VERSION, code.as_u8(), 0]);
    // An IP address always encodes.
    let _ = write_addr(&TargetAddr::Ip(bound), out);
}

/// Like [`encode_reply`] with any bound address (a domain must be 1..=255 bytes).
pub fn encode_reply_addr(
    code: ReplyCode,
    bound: &TargetAddr,
    out: &mut Vec<u8>,
) -> Result<(), Socks5Error> {
    let mut tmp = Vec::with_capacity(3 + bound.encoded_len());
    tmp.extend_from_slice(&[VERSION, code.as_u8(), 0]);
    write_addr(bound, &mut tmp)?;
    out.extend_from_slice(&tmp);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// UDP ASSOCIATE datagrams.

/// The header of a UDP ASSOCIATE datagram: `RSV(2) FRAG ATYP DST.ADDR DST.PORT`, then data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpHeader {
    /// Fragment number; `0` = standalone. Callers not implementing reassembly drop `frag != 0`.
    pub frag: u8,
    pub addr: TargetAddr,
    /// Where the payload starts in the datagram.
    pub header_len: usize,
}

/// Parses the header of a whole datagram (truncation is `Malformed`, never "need more").
/// The reserved bytes must be zero.
pub fn parse_udp_header(datagram: &[u8]) -> Result<UdpHeader, Socks5Error> {
    let mut r = Reader::new(datagram);
    let truncated = || malformed("truncated UDP header");
    let rsv = r.u16().ok_or_else(truncated)?;
    if rsv != 0 {
        return Err(malformed("non-zero reserved bytes in UDP header"));
    }
    let frag = r.u8().ok_or_else(truncated)?;
    let addr = read_addr(&mut r)?.ok_or_else(truncated)?;
    Ok(UdpHeader {
        frag,
        addr,
        header_len: r.pos,
    })
}

/// Appends a UDP header (`FRAG = 0`) for `addr`.
///
/// A domain that cannot be encoded (empty or longer than 255 bytes) is written as
/// `0.0.0.0:port`, which no peer delivers to; use [`try_encode_udp_header`] to get an error
/// instead. Replies normally carry the IP the datagram came from, which always encodes.
pub fn encode_udp_header(addr: &TargetAddr, out: &mut Vec<u8>) {
    if try_encode_udp_header(addr, out).is_err() {
        let fallback = TargetAddr::Ip(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), addr.port()));
        let _ = try_encode_udp_header(&fallback, out);
    }
}

/// Appends a UDP header (`FRAG = 0`) for `addr`, or fails for an unencodable domain (leaving
/// `out` untouched).
pub fn try_encode_udp_header(addr: &TargetAddr, out: &mut Vec<u8>) -> Result<(), Socks5Error> {
    let mut tmp = Vec::with_capacity(3 + addr.encoded_len());
    tmp.extend_from_slice(&[0, 0, 0]);
    write_addr(addr, &mut tmp)?;
    out.extend_from_slice(&tmp);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Client side (talking to an upstream SOCKS5 proxy).

/// Appends a greeting offering `methods` (at most the first 255 are sent).
pub fn encode_greeting(methods: &[u8], out: &mut Vec<u8>) {
    let methods = methods.get(..255).unwrap_or(methods);
    out.push(VERSION);
    out.push(u8::try_from(methods.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(methods);
}

/// Parses the server's method selection `VER METHOD`; returns the method byte.
pub fn parse_method_selection(buf: &[u8]) -> Result<Option<(u8, usize)>, Socks5Error> {
    let mut r = Reader::new(buf);
    let ver = need!(r.u8());
    if ver != VERSION {
        return Err(Socks5Error::BadVersion(ver));
    }
    let method = need!(r.u8());
    Ok(Some((method, r.pos)))
}

/// Appends an RFC 1929 request. Username and password must each be at most 255 bytes.
pub fn encode_userpass(user: &str, pass: &str, out: &mut Vec<u8>) -> Result<(), Socks5Error> {
    let ulen = u8::try_from(user.len()).map_err(|_| malformed("username longer than 255 bytes"))?;
    let plen = u8::try_from(pass.len()).map_err(|_| malformed("password longer than 255 bytes"))?;
    out.push(USERPASS_VERSION);
    out.push(ulen);
    out.extend_from_slice(user.as_bytes());
    out.push(plen);
    out.extend_from_slice(pass.as_bytes());
    Ok(())
}

/// Parses the RFC 1929 status `VER STATUS`; `true` = authenticated.
pub fn parse_userpass_status(buf: &[u8]) -> Result<Option<(bool, usize)>, Socks5Error> {
    let mut r = Reader::new(buf);
    let ver = need!(r.u8());
    if ver != USERPASS_VERSION {
        return Err(Socks5Error::BadVersion(ver));
    }
    let status = need!(r.u8());
    Ok(Some((status == 0, r.pos)))
}

/// Appends a request. Fails (leaving `out` untouched) for an empty or over-long domain.
pub fn encode_request(
    cmd: Command,
    addr: &TargetAddr,
    out: &mut Vec<u8>,
) -> Result<(), Socks5Error> {
    let mut tmp = Vec::with_capacity(3 + addr.encoded_len());
    tmp.extend_from_slice(&[VERSION, cmd.as_u8(), 0]);
    write_addr(addr, &mut tmp)?;
    out.extend_from_slice(&tmp);
    Ok(())
}

/// A parsed server reply: the raw reply byte and the bound address.
pub type Reply = (u8, TargetAddr);

/// Parses a server reply `VER REP RSV ATYP BND.ADDR BND.PORT`; returns the raw reply byte (see
/// [`ReplyCode::from_u8`]; unassigned values are passed through) and the bound address.
pub fn parse_reply(buf: &[u8]) -> Result<Option<(Reply, usize)>, Socks5Error> {
    let mut r = Reader::new(buf);
    let ver = need!(r.u8());
    if ver != VERSION {
        return Err(Socks5Error::BadVersion(ver));
    }
    let rep = need!(r.u8());
    let _rsv = need!(r.u8());
    let addr = need!(read_addr(&mut r)?);
    Ok(Some(((rep, addr), r.pos)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn v4(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// Every strict prefix of a complete message must be "need more bytes".
    fn assert_prefixes_incomplete<T: fmt::Debug>(
        msg: &[u8],
        f: impl Fn(&[u8]) -> Result<Option<(T, usize)>, Socks5Error>,
    ) {
        for cut in 0..msg.len() {
            assert!(
                matches!(f(&msg[..cut]), Ok(None)),
                "prefix {cut} of {msg:?}: {:?}",
                f(&msg[..cut])
            );
        }
    }

    #[test]
    fn greeting() {
        let msg = [5, 2, 0, 2, 0xAA];
        let (g, n) = parse_greeting(&msg).unwrap().unwrap();
        assert_eq!(n, 4);
        assert_eq!(g.methods, vec![0, 2]);
        assert!(g.offers(Method::UserPass));
        assert!(!g.offers(Method::Other(1)));
        assert_prefixes_incomplete(&msg[..4], parse_greeting);
        assert_eq!(parse_greeting(&[4, 1, 0]), Err(Socks5Error::BadVersion(4)));
        // An HTTP request on the SOCKS port.
        assert_eq!(parse_greeting(b"GET /"), Err(Socks5Error::BadVersion(b'G')));
        assert!(matches!(
            parse_greeting(&[5, 0]),
            Err(Socks5Error::Malformed(_))
        ));
        let mut all = vec![5, 255];
        all.extend(0..=254u8);
        assert_eq!(parse_greeting(&all).unwrap().unwrap().1, 257);
    }

    #[test]
    fn method_bytes() {
        for b in 0..=255u8 {
            assert_eq!(Method::from(b).as_u8(), b);
        }
        assert_eq!(Method::from(2), Method::UserPass);
        assert_eq!(encode_method_selection(Method::NO_ACCEPTABLE), [5, 0xFF]);
        assert_eq!(encode_userpass_status(true), [1, 0]);
        assert_eq!(encode_userpass_status(false), [1, 1]);
    }

    #[test]
    fn userpass_roundtrip() {
        let mut out = Vec::new();
        encode_userpass("alice", "s3cr3t", &mut out).unwrap();
        out.push(0xEE);
        let (up, n) = parse_userpass(&out).unwrap().unwrap();
        assert_eq!(n, out.len() - 1);
        assert_eq!(up.username, "alice");
        assert_eq!(up.password, "s3cr3t");
        assert!(!format!("{up:?}").contains("s3cr3t"));
        assert_prefixes_incomplete(&out[..n], parse_userpass);
        // Empty credentials parse (and fail the check later).
        let (up, _) = parse_userpass(&[1, 0, 0]).unwrap().unwrap();
        assert_eq!(up.username, "");
        assert_eq!(parse_userpass(&[5, 0, 0]), Err(Socks5Error::BadVersion(5)));
        assert!(matches!(
            parse_userpass(&[1, 1, 0xFF, 0]),
            Err(Socks5Error::Malformed(_))
        ));
        let long = "x".repeat(256);
        assert!(encode_userpass(&long, "p", &mut Vec::new()).is_err());
        assert!(encode_userpass("u", &long, &mut Vec::new()).is_err());
        let max = "x".repeat(255);
        let mut out = Vec::new();
        encode_userpass(&max, &max, &mut out).unwrap();
        assert_eq!(parse_userpass(&out).unwrap().unwrap().0.password, max);
    }

    #[test]
    fn requests_roundtrip() {
        let addrs = [
            TargetAddr::Ip(v4("10.1.2.3:443")),
            TargetAddr::Ip("[2001:db8::1]:8080".parse().unwrap()),
            TargetAddr::Domain("example.com".into(), 80),
            TargetAddr::Domain("bücher.example".into(), 1),
            TargetAddr::Domain("d".repeat(255), 65535),
        ];
        for cmd in [Command::Connect, Command::Bind, Command::UdpAssociate] {
            for addr in &addrs {
                let mut out = Vec::new();
                encode_request(cmd, addr, &mut out).unwrap();
                assert_eq!(out.len(), 3 + addr.encoded_len());
                assert_prefixes_incomplete(&out, parse_request);
                out.extend_from_slice(b"payload");
                let (req, n) = parse_request(&out).unwrap().unwrap();
                assert_eq!(n, out.len() - 7);
                assert_eq!(req.command, cmd);
                assert_eq!(&req.addr, addr);
            }
        }
    }

    #[test]
    fn request_errors_map_to_reply_codes() {
        let e = parse_request(&[4, 1, 0, 1]).unwrap_err();
        assert_eq!(e, Socks5Error::BadVersion(4));
        assert_eq!(e.reply_code(), ReplyCode::GeneralFailure);
        let e = parse_request(&[5, 9]).unwrap_err();
        assert_eq!(e, Socks5Error::CommandNotSupported(9));
        assert_eq!(e.reply_code(), ReplyCode::CommandNotSupported);
        let e = parse_request(&[5, 1, 0, 2]).unwrap_err();
        assert_eq!(e, Socks5Error::AddressTypeNotSupported(2));
        assert_eq!(e.reply_code(), ReplyCode::AddressTypeNotSupported);
        // Domain: empty, invalid UTF-8, control characters.
        for bad in [
            &[5, 1, 0, 3, 0, 0, 80][..],
            &[5, 1, 0, 3, 2, 0xC3, 0x28, 0, 80],
            &[5, 1, 0, 3, 3, b'a', 0, b'b', 0, 80],
            &[5, 1, 0, 3, 2, b'a', b'\n', 0, 80],
        ] {
            let e = parse_request(bad).unwrap_err();
            assert!(matches!(e, Socks5Error::Malformed(_)), "{bad:?}");
            assert_eq!(e.reply_code(), ReplyCode::GeneralFailure);
        }
        // A bad domain length is reported at once, before the name arrives.
        assert!(parse_request(&[5, 1, 0, 3, 0]).is_err());
    }

    #[test]
    fn reply_roundtrip() {
        let mut out = Vec::new();
        encode_reply(ReplyCode::Succeeded, v4("192.0.2.1:1080"), &mut out);
        assert_eq!(out, [5, 0, 0, 1, 192, 0, 2, 1, 0x04, 0x38]);
        assert_prefixes_incomplete(&out, parse_reply);
        let ((code, addr), n) = parse_reply(&out).unwrap().unwrap();
        assert_eq!((code, n), (0, 10));
        assert_eq!(addr, TargetAddr::Ip(v4("192.0.2.1:1080")));
        let mut out = Vec::new();
        encode_reply(
            ReplyCode::ConnectionRefused,
            "[::1]:0".parse().unwrap(),
            &mut out,
        );
        let ((code, _), n) = parse_reply(&out).unwrap().unwrap();
        assert_eq!(ReplyCode::from_u8(code), Some(ReplyCode::ConnectionRefused));
        assert_eq!(n, 22);
        let mut out = Vec::new();
        encode_reply_addr(
            ReplyCode::Succeeded,
            &TargetAddr::Domain("proxy.local".into(), 7),
            &mut out,
        )
        .unwrap();
        let ((_, addr), _) = parse_reply(&out).unwrap().unwrap();
        assert_eq!(addr.to_string(), "proxy.local:7");
        assert!(encode_reply_addr(
            ReplyCode::Succeeded,
            &TargetAddr::Domain(String::new(), 7),
            &mut Vec::new()
        )
        .is_err());
        // Unassigned reply codes pass through.
        let ((code, _), _) = parse_reply(&[5, 0x42, 0, 1, 0, 0, 0, 0, 0, 0])
            .unwrap()
            .unwrap();
        assert_eq!((code, ReplyCode::from_u8(code)), (0x42, None));
        assert_eq!(parse_reply(&[0, 0]), Err(Socks5Error::BadVersion(0)));
        for c in 0..=8u8 {
            assert_eq!(ReplyCode::from_u8(c).unwrap().as_u8(), c);
        }
    }

    #[test]
    fn client_side_greeting_and_status() {
        let mut out = Vec::new();
        encode_greeting(&[Method::NO_AUTH, Method::USER_PASS], &mut out);
        assert_eq!(out, [5, 2, 0, 2]);
        let (g, _) = parse_greeting(&out).unwrap().unwrap();
        assert_eq!(g.methods, [0, 2]);
        let many: Vec<u8> = (0..300).map(|i| (i % 256) as u8).collect();
        let mut out = Vec::new();
        encode_greeting(&many, &mut out);
        assert_eq!(out.len(), 2 + 255);
        assert_eq!(parse_greeting(&out).unwrap().unwrap().1, 257);
        assert_eq!(parse_method_selection(&[5]), Ok(None));
        assert_eq!(parse_method_selection(&[5, 2, 9]), Ok(Some((2, 2))));
        assert_eq!(
            parse_method_selection(&[1, 2]),
            Err(Socks5Error::BadVersion(1))
        );
        assert_eq!(parse_userpass_status(&[1]), Ok(None));
        assert_eq!(parse_userpass_status(&[1, 0]), Ok(Some((true, 2))));
        assert_eq!(parse_userpass_status(&[1, 7]), Ok(Some((false, 2))));
        assert_eq!(
            parse_userpass_status(&[5, 0]),
            Err(Socks5Error::BadVersion(5))
        );
    }

    #[test]
    fn encode_rejects_bad_domains() {
        for d in [String::new(), "a".repeat(256)] {
            let mut out = vec![1, 2];
            let addr = TargetAddr::Domain(d, 80);
            assert!(encode_request(Command::Connect, &addr, &mut out).is_err());
            assert!(try_encode_udp_header(&addr, &mut out).is_err());
            assert_eq!(out, [1, 2], "out untouched on error");
            encode_udp_header(&addr, &mut out);
            let h = parse_udp_header(&out[2..]).unwrap();
            assert_eq!(h.addr, TargetAddr::Ip(v4("0.0.0.0:80")));
        }
    }

    #[test]
    fn udp_header_roundtrip() {
        for addr in [
            TargetAddr::Ip(v4("198.51.100.7:53")),
            TargetAddr::Ip("[::1]:5353".parse().unwrap()),
            TargetAddr::Domain("dns.example".into(), 53),
        ] {
            let mut out = Vec::new();
            encode_udp_header(&addr, &mut out);
            out.extend_from_slice(b"DATA");
            let h = parse_udp_header(&out).unwrap();
            assert_eq!(h.frag, 0);
            assert_eq!(h.addr, addr);
            assert_eq!(&out[h.header_len..], b"DATA");
            for cut in 0..h.header_len {
                assert!(parse_udp_header(&out[..cut]).is_err());
            }
        }
        let h = parse_udp_header(&[0, 0, 3, 1, 1, 2, 3, 4, 0, 1]).unwrap();
        assert_eq!(h.frag, 3);
        assert!(parse_udp_header(&[0, 1, 0, 1, 1, 2, 3, 4, 0, 1]).is_err());
        assert_eq!(
            parse_udp_header(&[0, 0, 0, 7, 1, 2, 3, 4, 0, 1]),
            Err(Socks5Error::AddressTypeNotSupported(7))
        );
    }

    #[test]
    fn display() {
        assert_eq!(TargetAddr::Ip(v4("1.2.3.4:5")).to_string(), "1.2.3.4:5");
        let v6 = TargetAddr::Ip("[2001:db8::2]:443".parse().unwrap());
        assert_eq!(v6.to_string(), "[2001:db8::2]:443");
        assert_eq!(v6.host(), "2001:db8::2");
        assert_eq!(v6.port(), 443);
        assert_eq!(TargetAddr::Domain("a.b".into(), 9).to_string(), "a.b:9");
    }

    #[test]
    fn reply_for_io_errors() {
        use std::io::ErrorKind as K;
        assert_eq!(
            ReplyCode::from_io_error_kind(K::ConnectionRefused),
            ReplyCode::ConnectionRefused
        );
        assert_eq!(
            ReplyCode::from_io_error_kind(K::Other),
            ReplyCode::GeneralFailure
        );
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A small deterministic sweep over short inputs (the fuzz targets go further).
        let mut seed = 0x1234_5678_u32;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            let len = (seed % 24) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|i| {
                    let b = (seed.rotate_left(i as u32 * 3) & 0xff) as u8;
                    if i == 0 {
                        5
                    } else if i == 3 {
                        b % 5
                    } else {
                        b
                    }
                })
                .collect();
            for parse in [
                |b: &[u8]| parse_request(b).map(|o| o.map(|(_, n)| n)),
                |b: &[u8]| parse_greeting(b).map(|o| o.map(|(_, n)| n)),
                |b: &[u8]| parse_userpass(b).map(|o| o.map(|(_, n)| n)),
                |b: &[u8]| parse_reply(b).map(|o| o.map(|(_, n)| n)),
            ] {
                if let Ok(Some(n)) = parse(&bytes) {
                    assert!(n <= bytes.len());
                }
            }
            let _ = parse_udp_header(&bytes);
        }
    }
}
