//! HTTP/1.x message heads and body framing for a forward proxy.
//!
//! What it does: parses request and response heads (via `httparse`) under size and count limits,
//! decides how a message body is framed ([`BodyKind`]) with the request-smuggling defences a proxy
//! needs (conflicting `Content-Length`, `Transfer-Encoding` without final `chunked`), removes
//! hop-by-hop headers, serialises heads back to bytes, parses request targets (absolute, authority
//! and origin form) and scans chunked bodies *without decoding them* ([`ChunkedScanner`]) so the
//! data plane can relay the bytes verbatim and still know where one message ends and the next
//! begins on a keep-alive connection.
//!
//! What it does not: no I/O, no buffering policy, no decoding of content or transfer codings.
//! Callers feed byte slices they read themselves; every parser returns `Ok(None)` (or a partial
//! count) when it needs more bytes, and every error maps to one status code via
//! [`HeadError::status`].

use std::fmt;
use std::net::Ipv6Addr;

/// One header field as received: the name keeps its original case, the value its original bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub value: Vec<u8>,
}

impl Header {
    pub fn new(name: &str, value: &[u8]) -> Self {
        Header {
            name: name.to_owned(),
            value: value.to_vec(),
        }
    }
}

/// A parsed request line plus headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    pub target: String,
    /// `0` for HTTP/1.0, `1` for HTTP/1.1.
    pub version_minor: u8,
    pub headers: Vec<Header>,
}

/// A parsed status line plus headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// `0` for HTTP/1.0, `1` for HTTP/1.1.
    pub version_minor: u8,
    pub status: u16,
    pub reason: String,
    pub headers: Vec<Header>,
}

/// Bounds applied while parsing a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadLimits {
    /// Largest head (start line, headers and the final empty line) accepted, in bytes.
    pub max_head_bytes: usize,
    /// Largest number of header fields accepted.
    pub max_headers: usize,
}

impl Default for HeadLimits {
    fn default() -> Self {
        HeadLimits {
            max_head_bytes: 64 * 1024,
            max_headers: 100,
        }
    }
}

/// Why a head (or a chunked body) was rejected. Each variant maps to exactly one status code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// Syntax or framing error: the peer's fault, answer 400 (or 502 for an upstream response)
    /// and close the connection.
    #[error("malformed HTTP message: {0}")]
    Malformed(String),
    /// The head (or a chunked trailer section) is larger than the limit: 431.
    #[error("HTTP head too large")]
    TooLarge,
    /// More header fields than the limit: 431.
    #[error("too many HTTP header fields")]
    TooManyHeaders,
}

impl HeadError {
    /// The status code to answer a client with.
    pub fn status(&self) -> u16 {
        match self {
            HeadError::Malformed(_) => 400,
            HeadError::TooLarge | HeadError::TooManyHeaders => 431,
        }
    }
}

fn malformed(msg: impl Into<String>) -> HeadError {
    HeadError::Malformed(msg.into())
}

/// True when `buf` contains an empty line (the end of a head), in the line-ending forms httparse
/// accepts (`\n\n` or `\n\r\n`). Lets us skip a full parse while a head is still incomplete.
fn has_head_end(buf: &[u8]) -> bool {
    let mut rest = buf;
    while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
        let after = rest.get(pos + 1..).unwrap_or_default();
        match after {
            [b'\n', ..] | [b'\r', b'\n', ..] => return true,
            _ => rest = after,
        }
    }
    false
}

fn map_httparse_err(e: httparse::Error) -> HeadError {
    match e {
        httparse::Error::TooManyHeaders => HeadError::TooManyHeaders,
        other => malformed(other.to_string()),
    }
}

fn convert_headers(headers: &[httparse::Header<'_>]) -> Vec<Header> {
    headers
        .iter()
        .map(|h| Header {
            name: h.name.to_owned(),
            value: h.value.to_vec(),
        })
        .collect()
}

/// Header slots kept on the stack: the default limit fits, so a head parses without a heap
/// allocation of `max_headers` slots (3.2 KiB at the default 100, twice per proxied request).
const STACK_HEADER_SLOTS: usize = 100;

/// `max_headers` slots for httparse: a prefix of `stack`, or `heap` when the limit is larger.
fn header_slots<'a, 'h>(
    limits: &HeadLimits,
    stack: &'a mut [httparse::Header<'h>; STACK_HEADER_SLOTS],
    heap: &'a mut Vec<httparse::Header<'h>>,
) -> &'a mut [httparse::Header<'h>] {
    match stack.get_mut(..limits.max_headers) {
        Some(slots) => slots,
        None => {
            heap.resize(limits.max_headers, httparse::EMPTY_HEADER);
            heap
        }
    }
}

/// Window of `buf` that parsing may look at, and whether `buf` already reaches the limit.
fn limited<'a>(buf: &'a [u8], limits: &HeadLimits) -> (&'a [u8], bool) {
    let at_limit = buf.len() >= limits.max_head_bytes;
    (buf.get(..limits.max_head_bytes).unwrap_or(buf), at_limit)
}

fn version_minor(v: Option<u8>) -> Result<u8, HeadError> {
    match v {
        Some(v @ (0 | 1)) => Ok(v),
        _ => Err(malformed("unsupported HTTP version")),
    }
}

/// An incomplete head: wait for more bytes, unless the limit is already reached.
fn need_more<T>(at_limit: bool) -> Result<Option<T>, HeadError> {
    if at_limit {
        Err(HeadError::TooLarge)
    } else {
        Ok(None)
    }
}

/// Parses a request head from the start of `buf`.
///
/// `Ok(None)` means more bytes are needed (and `buf` is still under `max_head_bytes`);
/// `Ok(Some((head, head_len)))` gives the head and the bytes it took, including the final empty
/// line. Leading empty lines before the request line are tolerated (and counted in `head_len`).
pub fn parse_request_head(
    buf: &[u8],
    limits: &HeadLimits,
) -> Result<Option<(RequestHead, usize)>, HeadError> {
    let (window, at_limit) = limited(buf, limits);
    if !has_head_end(window) {
        return need_more(at_limit);
    }
    let mut stack = [httparse::EMPTY_HEADER; STACK_HEADER_SLOTS];
    let mut heap = Vec::new();
    let mut req = httparse::Request::new(header_slots(limits, &mut stack, &mut heap));
    match req.parse(window).map_err(map_httparse_err)? {
        httparse::Status::Partial => need_more(at_limit),
        httparse::Status::Complete(len) => {
            let method = req.method.ok_or_else(|| malformed("missing method"))?;
            let target = req
                .path
                .ok_or_else(|| malformed("missing request target"))?;
            let head = RequestHead {
                method: method.to_owned(),
                target: target.to_owned(),
                version_minor: version_minor(req.version)?,
                headers: convert_headers(req.headers),
            };
            Ok(Some((head, len)))
        }
    }
}

/// Parses a response head from the start of `buf`; same contract as [`parse_request_head`].
pub fn parse_response_head(
    buf: &[u8],
    limits: &HeadLimits,
) -> Result<Option<(ResponseHead, usize)>, HeadError> {
    let (window, at_limit) = limited(buf, limits);
    if !has_head_end(window) {
        return need_more(at_limit);
    }
    let mut stack = [httparse::EMPTY_HEADER; STACK_HEADER_SLOTS];
    let mut heap = Vec::new();
    let mut resp = httparse::Response::new(header_slots(limits, &mut stack, &mut heap));
    match resp.parse(window).map_err(map_httparse_err)? {
        httparse::Status::Partial => need_more(at_limit),
        httparse::Status::Complete(len) => {
            let status = resp.code.ok_or_else(|| malformed("missing status code"))?;
            if !(100..=999).contains(&status) {
                return Err(malformed("status code out of range"));
            }
            let head = ResponseHead {
                version_minor: version_minor(resp.version)?,
                status,
                reason: resp.reason.unwrap_or_default().to_owned(),
                headers: convert_headers(resp.headers),
            };
            Ok(Some((head, len)))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Header access shared by request and response heads.

fn find_header<'a>(headers: &'a [Header], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_slice())
}

fn remove_header_in(headers: &mut Vec<Header>, name: &str) {
    headers.retain(|h| !h.name.eq_ignore_ascii_case(name));
}

fn set_header_in(headers: &mut Vec<Header>, name: &str, value: &[u8]) {
    let mut seen = false;
    headers.retain_mut(|h| {
        if !h.name.eq_ignore_ascii_case(name) {
            return true;
        }
        if seen {
            return false;
        }
        seen = true;
        h.value = value.to_vec();
        true
    });
    if !seen {
        headers.push(Header::new(name, value));
    }
}

/// Iterates the comma-separated, trimmed, non-empty elements of every header named `name`.
fn list_elements<'a>(headers: &'a [Header], name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
    headers
        .iter()
        .filter(move |h| h.name.eq_ignore_ascii_case(name))
        .flat_map(|h| h.value.split(|&b| b == b','))
        .map(|e| e.trim_ascii())
        .filter(|e| !e.is_empty())
}

fn has_token(headers: &[Header], name: &str, token: &str) -> bool {
    list_elements(headers, name).any(|e| e.eq_ignore_ascii_case(token.as_bytes()))
}

fn keep_alive(version_minor: u8, headers: &[Header]) -> bool {
    if has_token(headers, "connection", "close") {
        return false;
    }
    version_minor >= 1 || has_token(headers, "connection", "keep-alive")
}

macro_rules! header_accessors {
    ($ty:ty) => {
        impl $ty {
            /// Value of the first header named `name` (ASCII case-insensitive).
            pub fn header(&self, name: &str) -> Option<&[u8]> {
                find_header(&self.headers, name)
            }

            /// Like [`Self::header`], when the value is valid UTF-8.
            pub fn header_str(&self, name: &str) -> Option<&str> {
                self.header(name).and_then(|v| std::str::from_utf8(v).ok())
            }

            /// Removes every header named `name`.
            pub fn remove_header(&mut self, name: &str) {
                remove_header_in(&mut self.headers, name)
            }

            /// Replaces the first header named `name` (dropping any others of that name), or
            /// appends it.
            pub fn set_header(&mut self, name: &str, value: &[u8]) {
                set_header_in(&mut self.headers, name, value)
            }

            /// Whether the connection stays open after this message: HTTP/1.1 unless
            /// `Connection: close`; HTTP/1.0 only with `Connection: keep-alive`.
            pub fn wants_keep_alive(&self) -> bool {
                keep_alive(self.version_minor, &self.headers)
            }
        }
    };
}

header_accessors!(RequestHead);
header_accessors!(ResponseHead);

// ---------------------------------------------------------------------------------------------
// Body framing.

/// How a message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// No body at all.
    Empty,
    /// Exactly this many bytes (may be `0`).
    Length(u64),
    /// `Transfer-Encoding: chunked`; use [`ChunkedScanner`] to find the end.
    Chunked,
    /// Response body delimited by the server closing the connection.
    UntilClose,
}

/// Outcome of looking at `Transfer-Encoding`.
enum TeFraming {
    Absent,
    /// `chunked` is the final coding (and appears once).
    Chunked,
    /// Present but `chunked` is not the final coding (or is repeated).
    NotChunked,
}

fn transfer_encoding(headers: &[Header]) -> TeFraming {
    let mut any = false;
    let mut chunked_count = 0usize;
    let mut last_is_chunked = false;
    for coding in list_elements(headers, "transfer-encoding") {
        any = true;
        // A coding may carry parameters (`gzip;q=1` is not valid here, but be tolerant).
        let name = coding
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        last_is_chunked = name.eq_ignore_ascii_case(b"chunked");
        if last_is_chunked {
            chunked_count += 1;
        }
    }
    if !any
        && !headers
            .iter()
            .any(|h| h.name.eq_ignore_ascii_case("transfer-encoding"))
    {
        TeFraming::Absent
    } else if last_is_chunked && chunked_count == 1 {
        TeFraming::Chunked
    } else {
        TeFraming::NotChunked
    }
}

/// All `Content-Length` values (comma lists included) must be identical valid decimal numbers.
fn content_length(headers: &[Header]) -> Result<Option<u64>, HeadError> {
    let mut found: Option<u64> = None;
    for h in headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("content-length"))
    {
        for elem in h.value.split(|&b| b == b',') {
            let n = parse_decimal(elem.trim_ascii())
                .ok_or_else(|| malformed("invalid Content-Length"))?;
            match found {
                Some(prev) if prev != n => return Err(malformed("conflicting Content-Length")),
                _ => found = Some(n),
            }
        }
    }
    Ok(found)
}

fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 20 {
        return None;
    }
    let mut n: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some(n)
}

/// How the body of `head` is framed.
///
/// * `Transfer-Encoding` whose final coding is `chunked` → [`BodyKind::Chunked`], even when a
///   `Content-Length` is also present (RFC 9112 §6.3). Such a request must not be forwarded with
///   its `Content-Length`: call [`drop_content_length_if_chunked`] before writing it upstream.
/// * `Transfer-Encoding` without a final, single `chunked`, or any `Transfer-Encoding` on an
///   HTTP/1.0 request → `Malformed` (the length can't be known: smuggling risk).
/// * `Content-Length` that is not a plain decimal, overflows, or differs between duplicates →
///   `Malformed`. Identical duplicates (`5, 5`) are accepted.
/// * Neither → [`BodyKind::Empty`]. A request is never [`BodyKind::UntilClose`].
pub fn request_body_kind(head: &RequestHead) -> Result<BodyKind, HeadError> {
    let cl = content_length(&head.headers);
    match transfer_encoding(&head.headers) {
        TeFraming::Absent => Ok(match cl? {
            Some(n) => BodyKind::Length(n),
            None => BodyKind::Empty,
        }),
        _ if head.version_minor == 0 => Err(malformed("Transfer-Encoding in an HTTP/1.0 request")),
        TeFraming::Chunked => Ok(BodyKind::Chunked),
        TeFraming::NotChunked => Err(malformed("Transfer-Encoding without final chunked coding")),
    }
}

/// How the body of a response to a `request_method` request is framed.
///
/// `HEAD` requests, `1xx`, `204` and `304` responses and `2xx` answers to `CONNECT` have no body.
/// Then `Transfer-Encoding` with final `chunked` (HTTP/1.1 only) → chunked; any other
/// `Transfer-Encoding` → until close; a valid `Content-Length` → that length (invalid or
/// conflicting → `Malformed`, which the proxy should answer with 502); else until close.
pub fn response_body_kind(
    request_method: &str,
    head: &ResponseHead,
) -> Result<BodyKind, HeadError> {
    let status = head.status;
    if request_method.eq_ignore_ascii_case("HEAD")
        || (100..200).contains(&status)
        || status == 204
        || status == 304
        || (request_method.eq_ignore_ascii_case("CONNECT") && (200..300).contains(&status))
    {
        return Ok(BodyKind::Empty);
    }
    match transfer_encoding(&head.headers) {
        TeFraming::Chunked if head.version_minor >= 1 => Ok(BodyKind::Chunked),
        TeFraming::Chunked | TeFraming::NotChunked => Ok(BodyKind::UntilClose),
        TeFraming::Absent => Ok(match content_length(&head.headers)? {
            Some(n) => BodyKind::Length(n),
            None => BodyKind::UntilClose,
        }),
    }
}

/// When `kind` is [`BodyKind::Chunked`], removes every `Content-Length` header: a message carrying
/// both must not be forwarded with both (RFC 9112 §6.3), or the next hop might frame it by length.
pub fn drop_content_length_if_chunked(headers: &mut Vec<Header>, kind: BodyKind) {
    if kind == BodyKind::Chunked {
        remove_header_in(headers, "content-length");
    }
}

/// Headers that apply to one connection only and are never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

/// Headers a `Connection` token may not remove: they frame the message (or name the origin), and
/// letting a client strip them through `Connection: content-length` would desynchronise framing.
const PROTECTED: &[&str] = &["transfer-encoding", "content-length", "host"];

/// Removes hop-by-hop headers before a message is forwarded: `Connection`, `Keep-Alive`,
/// `Proxy-Connection`, `Proxy-Authenticate`, `Proxy-Authorization`, `TE`, `Trailer`, `Upgrade`,
/// and every header named by a `Connection` token.
///
/// `Transfer-Encoding` is deliberately **kept**: the data plane relays chunked bodies verbatim
/// (see [`ChunkedScanner`]), so the next hop needs the header to frame the bytes it receives.
/// For the same reason a `Connection` token can never remove `Transfer-Encoding`,
/// `Content-Length` or `Host`.
pub fn strip_hop_by_hop(headers: &mut Vec<Header>) {
    let named: Vec<String> = list_elements(headers, "connection")
        .filter_map(|t| std::str::from_utf8(t).ok())
        .map(str::to_ascii_lowercase)
        .filter(|t| !PROTECTED.contains(&t.as_str()))
        .collect();
    headers.retain(|h| {
        !HOP_BY_HOP.iter().any(|n| h.name.eq_ignore_ascii_case(n))
            && !named.iter().any(|n| h.name.eq_ignore_ascii_case(n))
    });
}

// ---------------------------------------------------------------------------------------------
// Serialisation.

/// Appends `bytes` with CR, LF and NUL replaced by spaces, so a value set by the caller can never
/// split a head (response splitting / header injection).
fn push_sanitized(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend(bytes.iter().map(|&b| match b {
        b'\r' | b'\n' | 0 => b' ',
        b => b,
    }));
}

/// Appends a header name, keeping only token characters (anything else would corrupt the head).
fn push_token(out: &mut Vec<u8>, name: &str) {
    out.extend(name.bytes().filter(|&b| is_tchar(b)));
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn write_headers(headers: &[Header], out: &mut Vec<u8>) {
    for h in headers {
        push_token(out, &h.name);
        out.extend_from_slice(b": ");
        push_sanitized(out, &h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

fn push_version(out: &mut Vec<u8>, minor: u8) {
    out.extend_from_slice(b"HTTP/1.");
    out.extend_from_slice(minor.to_string().as_bytes());
}

/// Serialises `method SP target SP HTTP/1.x CRLF`, the headers, and the final CRLF into `out`.
/// CR/LF/NUL inside the start line or values are replaced by spaces (never emitted raw).
pub fn write_request_head(head: &RequestHead, out: &mut Vec<u8>) {
    push_token(out, &head.method);
    out.push(b' ');
    out.extend(head.target.bytes().map(|b| {
        if b.is_ascii_whitespace() || b == 0 {
            b'_'
        } else {
            b
        }
    }));
    out.push(b' ');
    push_version(out, head.version_minor);
    out.extend_from_slice(b"\r\n");
    write_headers(&head.headers, out);
}

/// Serialises `HTTP/1.x SP status SP reason CRLF`, the headers, and the final CRLF into `out`.
pub fn write_response_head(head: &ResponseHead, out: &mut Vec<u8>) {
    push_version(out, head.version_minor);
    out.push(b' ');
    out.extend_from_slice(format!("{:03}", head.status.min(999)).as_bytes());
    out.push(b' ');
    push_sanitized(out, head.reason.as_bytes());
    out.extend_from_slice(b"\r\n");
    write_headers(&head.headers, out);
}

/// A canned response: status line, `Content-Type: text/plain; charset=utf-8`, `Content-Length`,
/// the `extra_headers`, `Connection: close` when `close`, then `body`. Always HTTP/1.1.
pub fn simple_response(
    status: u16,
    reason: &str,
    extra_headers: &[(&str, &str)],
    body: &str,
    close: bool,
) -> Vec<u8> {
    let mut head = ResponseHead {
        version_minor: 1,
        status,
        reason: reason.to_owned(),
        headers: Vec::with_capacity(extra_headers.len() + 3),
    };
    head.headers
        .push(Header::new("Content-Type", b"text/plain; charset=utf-8"));
    head.headers.push(Header::new(
        "Content-Length",
        body.len().to_string().as_bytes(),
    ));
    for (name, value) in extra_headers {
        head.headers.push(Header::new(name, value.as_bytes()));
    }
    if close {
        head.headers.push(Header::new("Connection", b"close"));
    }
    let mut out = Vec::with_capacity(128 + body.len());
    write_response_head(&head, &mut out);
    out.extend_from_slice(body.as_bytes());
    out
}

// ---------------------------------------------------------------------------------------------
// Request targets.

/// A parsed request target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `http://host[:port]/path?query` (absolute form, what a forward proxy receives).
    Absolute {
        /// `http` or `https`, lowercased.
        scheme: String,
        /// Lowercased; IPv6 without brackets.
        host: String,
        port: u16,
        /// Starts with `/` (an empty path becomes `/`); fragment removed.
        path_and_query: String,
    },
    /// `host:port` (authority form, `CONNECT` only).
    Authority { host: String, port: u16 },
    /// `/path?query` (origin form), or `*` for `OPTIONS *`.
    Origin { path_and_query: String },
}

impl Target {
    /// `host:port` (IPv6 in brackets) for absolute and authority forms.
    pub fn authority(&self) -> Option<String> {
        match self {
            Target::Absolute { host, port, .. } | Target::Authority { host, port } => {
                Some(format_authority(host, *port))
            }
            Target::Origin { .. } => None,
        }
    }
}

/// `host:port`, bracketing IPv6 literals.
pub fn format_authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Absolute {
                scheme,
                host,
                port,
                path_and_query,
            } => write!(
                f,
                "{scheme}://{}{path_and_query}",
                format_authority(host, *port)
            ),
            Target::Authority { host, port } => f.write_str(&format_authority(host, *port)),
            Target::Origin { path_and_query } => f.write_str(path_and_query),
        }
    }
}

const MAX_HOST_LEN: usize = 255;

/// Validates and normalises a host: lowercased reg-name (letters, digits, `-`, `.`, `_`) or an
/// IPv6 literal in brackets (returned without them).
fn parse_host(raw: &str) -> Result<String, HeadError> {
    if let Some(inner) = raw.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| malformed("unterminated IPv6 literal"))?;
        let ip: Ipv6Addr = inner
            .parse()
            .map_err(|_| malformed("invalid IPv6 literal"))?;
        return Ok(ip.to_string());
    }
    if raw.is_empty() {
        return Err(malformed("empty host"));
    }
    if raw.len() > MAX_HOST_LEN {
        return Err(malformed("host too long"));
    }
    if !raw
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    {
        return Err(malformed("invalid character in host"));
    }
    Ok(raw.to_ascii_lowercase())
}

/// Splits `authority` into host and optional port (IPv6 bracket aware). Rejects userinfo.
fn split_authority(authority: &str) -> Result<(String, Option<u16>), HeadError> {
    if authority.contains('@') {
        return Err(malformed("userinfo in request target"));
    }
    let (host_part, port_part) = if authority.starts_with('[') {
        let close = authority
            .find(']')
            .ok_or_else(|| malformed("unterminated IPv6 literal"))?;
        let (h, rest) = authority.split_at(close + 1);
        match rest {
            "" => (h, None),
            _ => match rest.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None => return Err(malformed("garbage after IPv6 literal")),
            },
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let host = parse_host(host_part)?;
    let port = match port_part {
        // RFC 3986 allows an empty port: same as absent.
        None | Some("") => None,
        Some(p) => Some(parse_port(p)?),
    };
    Ok((host, port))
}

fn parse_port(p: &str) -> Result<u16, HeadError> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed("invalid port"));
    }
    match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(malformed("invalid port")),
        Ok(n) => Ok(n),
    }
}

/// Parses a request target for `method`.
///
/// * `CONNECT` → [`Target::Authority`]; `host:port` or `[v6]:port`, port required.
/// * `http://…` / `https://…` (scheme case-insensitive) → [`Target::Absolute`] with default port
///   80 / 443; userinfo is rejected; the fragment is dropped.
/// * `/…` → [`Target::Origin`]; `*` → [`Target::Origin`] for `OPTIONS` only.
///
/// Hosts are lowercased; IPv6 literals are validated and stored without brackets.
pub fn parse_target(method: &str, target: &str) -> Result<Target, HeadError> {
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(target)?;
        let port = port.ok_or_else(|| malformed("CONNECT target needs a port"))?;
        return Ok(Target::Authority { host, port });
    }
    if target.starts_with('/') {
        return Ok(Target::Origin {
            path_and_query: target.to_owned(),
        });
    }
    if target == "*" {
        return if method.eq_ignore_ascii_case("OPTIONS") {
            Ok(Target::Origin {
                path_and_query: "*".to_owned(),
            })
        } else {
            Err(malformed("asterisk form is only valid for OPTIONS"))
        };
    }
    let (scheme, rest) = target
        .split_once("://")
        .ok_or_else(|| malformed("unsupported request target form"))?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return Err(malformed("unsupported scheme")),
    };
    let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
    let auth_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(auth_end);
    let (host, port) = split_authority(authority)?;
    let path_and_query = if path.is_empty() {
        "/".to_owned()
    } else if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_owned()
    };
    Ok(Target::Absolute {
        scheme,
        host,
        port: port.unwrap_or(default_port),
        path_and_query,
    })
}

// ---------------------------------------------------------------------------------------------
// Chunked body scanning.

/// Longest chunk-size line accepted (size, extensions and CRLF), in bytes.
pub const MAX_CHUNK_LINE: usize = 4 * 1024;
/// Largest trailer section accepted (all trailer lines and the final CRLF), in bytes.
pub const MAX_TRAILER_BYTES: usize = 16 * 1024;
/// Most hex digits in a chunk size (a `u64`).
const MAX_SIZE_DIGITS: u32 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Reading hex digits of a chunk size; `line` counts bytes of the size line so far.
    Size {
        value: u64,
        digits: u32,
        line: usize,
    },
    /// After the size digits: optional whitespace, then `;` or CR.
    AfterSize { value: u64, line: usize },
    /// Inside chunk extensions, until CR.
    Ext { value: u64, line: usize },
    /// CR of the size line seen; LF expected.
    SizeLf { value: u64 },
    /// Inside chunk data.
    Data { remaining: u64 },
    /// Chunk data done; CR expected.
    DataCr,
    /// CR after data seen; LF expected.
    DataLf,
    /// At the start of a trailer line (or of the final empty line).
    TrailerStart { total: usize },
    /// Inside a trailer line, until CR.
    TrailerLine { total: usize },
    /// CR in a trailer line seen; LF expected.
    TrailerLf { total: usize },
    /// CR of the final empty line seen; LF expected.
    EndLf,
    /// The body is complete.
    Done,
}

const CHUNK_START: ChunkState = ChunkState::Size {
    value: 0,
    digits: 0,
    line: 0,
};

/// Finds the end of a `Transfer-Encoding: chunked` body without decoding it, so the bytes can be
/// relayed verbatim. Feed successive reads to [`ChunkedScanner::scan`].
///
/// It is strict on purpose (a lenient scanner in a proxy is a request-smuggling vector): CRLF line
/// endings only, at most 16 hex digits per size, size lines (with extensions) at most
/// [`MAX_CHUNK_LINE`] bytes, trailer section at most [`MAX_TRAILER_BYTES`], no obsolete line
/// folding in trailers.
#[derive(Debug, Clone)]
pub struct ChunkedScanner {
    state: ChunkState,
}

/// Result of one [`ChunkedScanner::scan`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkScan {
    /// How many leading bytes of the buffer belong to the body.
    pub consumed: usize,
    /// Whether the body ended with those bytes (anything after belongs to the next message).
    pub complete: bool,
}

impl Default for ChunkedScanner {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedScanner {
    pub fn new() -> Self {
        ChunkedScanner { state: CHUNK_START }
    }

    /// Whether the end of the body has been seen.
    pub fn is_complete(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Scans `buf`, the bytes following whatever was scanned before. Returns how many of them
    /// belong to the body and whether the body is complete after them. When `complete` is false,
    /// `consumed == buf.len()`. After completion further calls consume nothing. After an error
    /// the scanner must not be used again (the connection has to be closed).
    pub fn scan(&mut self, buf: &[u8]) -> Result<ChunkScan, HeadError> {
        let mut i = 0usize;
        while self.state != ChunkState::Done {
            // Chunk data is skipped in one step; framing bytes are checked one by one.
            if let ChunkState::Data { remaining } = self.state {
                let avail = buf.len().saturating_sub(i);
                let take = usize::try_from(remaining).map_or(avail, |r| r.min(avail));
                i += take;
                let left = remaining.saturating_sub(take as u64);
                if left == 0 {
                    self.state = ChunkState::DataCr;
                    continue;
                }
                self.state = ChunkState::Data { remaining: left };
                break;
            }
            let Some(&b) = buf.get(i) else { break };
            i += 1;
            self.state = step(self.state, b)?;
        }
        Ok(ChunkScan {
            consumed: i,
            complete: self.state == ChunkState::Done,
        })
    }
}

fn bump_line(line: usize) -> Result<usize, HeadError> {
    let line = line.saturating_add(1);
    if line > MAX_CHUNK_LINE {
        Err(malformed("chunk size line too long"))
    } else {
        Ok(line)
    }
}

fn bump_trailer(total: usize) -> Result<usize, HeadError> {
    let total = total.saturating_add(1);
    if total > MAX_TRAILER_BYTES {
        Err(HeadError::TooLarge)
    } else {
        Ok(total)
    }
}

/// After the size digits (or whitespace after them): whitespace, `;` or CR.
fn after_size(b: u8, value: u64, line: usize) -> Result<ChunkState, HeadError> {
    match b {
        b' ' | b'\t' => Ok(ChunkState::AfterSize { value, line }),
        b';' => Ok(ChunkState::Ext { value, line }),
        b'\r' => Ok(ChunkState::SizeLf { value }),
        _ => Err(malformed("invalid character after chunk size")),
    }
}

fn step(state: ChunkState, b: u8) -> Result<ChunkState, HeadError> {
    use ChunkState::*;
    Ok(match state {
        Size {
            value,
            digits,
            line,
        } => {
            let line = bump_line(line)?;
            match hex_value(b) {
                Some(_) if digits >= MAX_SIZE_DIGITS => {
                    return Err(malformed("chunk size has too many digits"))
                }
                Some(d) => Size {
                    value: value
                        .checked_mul(16)
                        .and_then(|v| v.checked_add(u64::from(d)))
                        .ok_or_else(|| malformed("chunk size overflow"))?,
                    digits: digits + 1,
                    line,
                },
                None if digits == 0 => return Err(malformed("missing chunk size")),
                None => after_size(b, value, line)?,
            }
        }
        AfterSize { value, line } => after_size(b, value, bump_line(line)?)?,
        Ext { value, line } => {
            let line = bump_line(line)?;
            match b {
                b'\r' => SizeLf { value },
                b'\t' | b' '..=b'~' | 0x80..=0xff => Ext { value, line },
                _ => return Err(malformed("control character in chunk extension")),
            }
        }
        SizeLf { value } => match b {
            b'\n' if value == 0 => TrailerStart { total: 0 },
            b'\n' => Data { remaining: value },
            _ => return Err(malformed("chunk size line not ended by CRLF")),
        },
        DataCr => match b {
            b'\r' => DataLf,
            _ => return Err(malformed("chunk data not followed by CRLF")),
        },
        DataLf => match b {
            b'\n' => CHUNK_START,
            _ => return Err(malformed("chunk data not followed by CRLF")),
        },
        TrailerStart { total } => {
            let total = bump_trailer(total)?;
            match b {
                b'\r' => EndLf,
                b' ' | b'\t' => return Err(malformed("obsolete line folding in trailer")),
                b'\n' | 0 => return Err(malformed("invalid byte in trailer")),
                _ => TrailerLine { total },
            }
        }
        TrailerLine { total } => {
            let total = bump_trailer(total)?;
            match b {
                b'\r' => TrailerLf { total },
                b'\n' | 0 => return Err(malformed("invalid byte in trailer")),
                _ => TrailerLine { total },
            }
        }
        TrailerLf { total } => match b {
            b'\n' => TrailerStart {
                total: bump_trailer(total)?,
            },
            _ => return Err(malformed("trailer line not ended by CRLF")),
        },
        EndLf => match b {
            b'\n' => Done,
            _ => return Err(malformed("chunked body not ended by CRLF")),
        },
        Data { .. } | Done => state,
    })
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn req(buf: &[u8]) -> Result<Option<(RequestHead, usize)>, HeadError> {
        parse_request_head(buf, &HeadLimits::default())
    }

    fn req_ok(buf: &[u8]) -> RequestHead {
        req(buf).unwrap().unwrap().0
    }

    fn resp_ok(buf: &[u8]) -> ResponseHead {
        parse_response_head(buf, &HeadLimits::default())
            .unwrap()
            .unwrap()
            .0
    }

    #[test]
    fn parses_request_head_and_reports_length() {
        let buf = b"GET http://Example.com/a?b HTTP/1.1\r\nHost: example.com\r\nX-A: 1\r\n\r\nBODY";
        let (head, len) = req(buf).unwrap().unwrap();
        assert_eq!(len, buf.len() - 4);
        assert_eq!(head.method, "GET");
        assert_eq!(head.target, "http://Example.com/a?b");
        assert_eq!(head.version_minor, 1);
        assert_eq!(head.header("HOST"), Some(&b"example.com"[..]));
        assert_eq!(head.header_str("x-a"), Some("1"));
        assert_eq!(head.header("missing"), None);
    }

    #[test]
    fn partial_heads_need_more_bytes() {
        let full = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        for cut in 0..full.len() {
            assert_eq!(req(&full[..cut]).unwrap(), None, "cut at {cut}");
        }
        assert!(req(full).unwrap().is_some());
    }

    #[test]
    fn head_size_limit() {
        let limits = HeadLimits {
            max_head_bytes: 32,
            max_headers: 10,
        };
        // Incomplete and already at the limit → too large.
        let buf = b"GET / HTTP/1.1\r\nX-Long: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        assert_eq!(parse_request_head(buf, &limits), Err(HeadError::TooLarge));
        // Complete, but the end lies beyond the limit → too large.
        let buf = b"GET / HTTP/1.1\r\nX-Long: aaaaaaaaaaaaaaaaaaaa\r\n\r\n";
        assert_eq!(parse_request_head(buf, &limits), Err(HeadError::TooLarge));
        // Head exactly at the limit is fine, even with a body following.
        let buf = b"GET / HTTP/1.1\r\nX-L: aaaaaaa\r\n\r\nmore body bytes";
        let (_, len) = parse_request_head(buf, &limits).unwrap().unwrap();
        assert_eq!(len, 32);
        // Under the limit and incomplete → need more.
        assert_eq!(parse_request_head(b"GET / HTTP/1.1\r\n", &limits), Ok(None));
        assert_eq!(HeadError::TooLarge.status(), 431);
    }

    #[test]
    fn header_count_limit() {
        let limits = HeadLimits {
            max_head_bytes: 4096,
            max_headers: 2,
        };
        let buf = b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n";
        assert_eq!(
            parse_request_head(buf, &limits),
            Err(HeadError::TooManyHeaders)
        );
        assert_eq!(HeadError::TooManyHeaders.status(), 431);
        let buf = b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\n\r\n";
        assert!(parse_request_head(buf, &limits).unwrap().is_some());
    }

    #[test]
    fn malformed_heads_are_400() {
        let cases: &[&[u8]] = &[
            b"GET / HTTP/2.0\r\n\r\n",
            b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nNo-Colon\r\n\r\n",
            b"GET  / HTTP/1.1\r\n\r\n",
            b"G\x00T / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n",
            b"GET / HTTP/1.1\r\nA : b\r\n\r\n",
            b"\xff\xfe\r\n\r\n",
        ];
        for c in cases {
            let e = req(c).unwrap_err();
            assert_eq!(e.status(), 400, "{:?}", String::from_utf8_lossy(c));
        }
    }

    #[test]
    fn parses_response_head() {
        let buf = b"HTTP/1.0 404 Not Found\r\nContent-Length: 3\r\n\r\nabc";
        let (head, len) = parse_response_head(buf, &HeadLimits::default())
            .unwrap()
            .unwrap();
        assert_eq!(len, buf.len() - 3);
        assert_eq!(head.version_minor, 0);
        assert_eq!(head.status, 404);
        assert_eq!(head.reason, "Not Found");
        let head = resp_ok(b"HTTP/1.1 200\r\n\r\n");
        assert_eq!(head.reason, "");
        assert_eq!(
            parse_response_head(b"HTTP/1.1 20", &HeadLimits::default()),
            Ok(None)
        );
        assert!(parse_response_head(b"HTTP/1.1 2000 X\r\n\r\n", &HeadLimits::default()).is_err());
        assert!(parse_response_head(b"HTTP/1.1 099 X\r\n\r\n", &HeadLimits::default()).is_err());
    }

    #[test]
    fn header_mutation() {
        let mut h = req_ok(b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\na: 3\r\n\r\n");
        h.set_header("A", b"x");
        assert_eq!(h.headers.len(), 2);
        assert_eq!(h.header("a"), Some(&b"x"[..]));
        h.set_header("New", b"n");
        assert_eq!(h.headers.last().unwrap().name, "New");
        h.remove_header("b");
        assert_eq!(h.header("B"), None);
        assert_eq!(h.headers.len(), 2);
    }

    #[test]
    fn keep_alive_rules() {
        assert!(req_ok(b"GET / HTTP/1.1\r\n\r\n").wants_keep_alive());
        assert!(!req_ok(b"GET / HTTP/1.1\r\nConnection: Close\r\n\r\n").wants_keep_alive());
        assert!(!req_ok(b"GET / HTTP/1.1\r\nConnection: foo, close\r\n\r\n").wants_keep_alive());
        assert!(!req_ok(b"GET / HTTP/1.0\r\n\r\n").wants_keep_alive());
        assert!(req_ok(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").wants_keep_alive());
        assert!(
            !req_ok(b"GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n").wants_keep_alive()
        );
        assert!(!resp_ok(b"HTTP/1.0 200 OK\r\n\r\n").wants_keep_alive());
        assert!(resp_ok(b"HTTP/1.1 200 OK\r\n\r\n").wants_keep_alive());
    }

    fn body(head: &[u8]) -> Result<BodyKind, HeadError> {
        request_body_kind(&req_ok(head))
    }

    #[test]
    fn request_framing() {
        assert_eq!(body(b"GET / HTTP/1.1\r\n\r\n"), Ok(BodyKind::Empty));
        assert_eq!(
            body(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n"),
            Ok(BodyKind::Length(10))
        );
        assert_eq!(
            body(b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
            Ok(BodyKind::Length(0))
        );
        assert_eq!(
            body(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Ok(BodyKind::Chunked)
        );
        assert_eq!(
            body(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n"),
            Ok(BodyKind::Chunked)
        );
        assert_eq!(
            body(
                b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
            ),
            Ok(BodyKind::Chunked)
        );
        // TE wins over CL.
        assert_eq!(
            body(b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Ok(BodyKind::Chunked)
        );
        // Identical duplicates are fine.
        assert_eq!(
            body(b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n"),
            Ok(BodyKind::Length(5))
        );
        assert_eq!(
            body(b"POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n"),
            Ok(BodyKind::Length(5))
        );
    }

    #[test]
    fn request_smuggling_defences() {
        let bad: &[&[u8]] = &[
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 5, 6\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 1 0\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: \r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 5,\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 18446744073709551616\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: \r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: ,\r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        ];
        for b in bad {
            let e = body(b).unwrap_err();
            assert_eq!(e.status(), 400, "{}", String::from_utf8_lossy(b));
        }
        assert_eq!(
            body(b"POST / HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\n"),
            Ok(BodyKind::Length(u64::MAX))
        );
    }

    #[test]
    fn drop_cl_when_chunked() {
        let mut h =
            req_ok(b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n");
        let kind = request_body_kind(&h).unwrap();
        drop_content_length_if_chunked(&mut h.headers, kind);
        assert_eq!(h.header("content-length"), None);
        let mut h = req_ok(b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n");
        drop_content_length_if_chunked(&mut h.headers, BodyKind::Length(5));
        assert!(h.header("content-length").is_some());
    }

    #[test]
    fn response_framing() {
        let r = |m: &str, b: &[u8]| response_body_kind(m, &resp_ok(b));
        let cl = b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n";
        assert_eq!(r("GET", cl), Ok(BodyKind::Length(7)));
        assert_eq!(r("HEAD", cl), Ok(BodyKind::Empty));
        assert_eq!(r("head", cl), Ok(BodyKind::Empty));
        assert_eq!(r("CONNECT", cl), Ok(BodyKind::Empty));
        assert_eq!(
            r("CONNECT", b"HTTP/1.1 407 Auth\r\nContent-Length: 7\r\n\r\n"),
            Ok(BodyKind::Length(7))
        );
        for s in [
            "100 Continue",
            "101 Switching",
            "204 No Content",
            "304 Not Modified",
        ] {
            let b = format!("HTTP/1.1 {s}\r\nContent-Length: 7\r\n\r\n");
            assert_eq!(r("GET", b.as_bytes()), Ok(BodyKind::Empty), "{s}");
        }
        assert_eq!(
            r(
                "GET",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
            ),
            Ok(BodyKind::Chunked)
        );
        assert_eq!(
            r("GET", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"),
            Ok(BodyKind::UntilClose)
        );
        assert_eq!(
            r(
                "GET",
                b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            ),
            Ok(BodyKind::UntilClose)
        );
        assert_eq!(
            r("GET", b"HTTP/1.1 200 OK\r\n\r\n"),
            Ok(BodyKind::UntilClose)
        );
        assert!(r(
            "GET",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"
        )
        .is_err());
        assert!(r("GET", b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").is_err());
    }

    #[test]
    fn hop_by_hop_removal() {
        let mut h = req_ok(
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, X-Secret, content-length, Transfer-Encoding, HOST\r\n\
Keep-Alive: 5\r\nProxy-Connection: x\r\nProxy-Authorization: Basic x\r\nProxy-Authenticate: y\r\n\
TE: trailers\r\nTrailer: X\r\nUpgrade: websocket\r\nx-secret: 1\r\nContent-Length: 3\r\n\
Transfer-Encoding: chunked\r\nX-Keep: 1\r\n\r\n",
        );
        strip_hop_by_hop(&mut h.headers);
        let names: Vec<&str> = h.headers.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(
            names,
            ["Host", "Content-Length", "Transfer-Encoding", "X-Keep"]
        );
    }

    #[test]
    fn writes_heads() {
        let buf = b"POST http://a/ HTTP/1.1\r\nHost: a\r\nX: y z\r\n\r\n";
        let head = req_ok(buf);
        let mut out = Vec::new();
        write_request_head(&head, &mut out);
        assert_eq!(out, buf);
        let rbuf = b"HTTP/1.0 503 Service Unavailable\r\nA: b\r\n\r\n";
        let mut out = Vec::new();
        write_response_head(&resp_ok(rbuf), &mut out);
        assert_eq!(out, rbuf);
    }

    #[test]
    fn writer_never_emits_injected_lines() {
        let mut head = req_ok(b"GET / HTTP/1.1\r\n\r\n");
        head.set_header("X-Forwarded-For", b"1.2.3.4\r\nEvil: yes");
        head.headers.push(Header::new("Bad\r\nName", b"v"));
        head.target = "/a b\r\nc".to_owned();
        let mut out = Vec::new();
        write_request_head(&head, &mut out);
        let (parsed, len) = req(&out).unwrap().unwrap();
        assert_eq!(len, out.len());
        assert_eq!(parsed.headers.len(), 2);
        assert_eq!(parsed.header("evil"), None);
        assert_eq!(parsed.header("BadName"), Some(&b"v"[..]));
        let resp = ResponseHead {
            version_minor: 1,
            status: 200,
            reason: "OK\r\nSet-Cookie: x".to_owned(),
            headers: vec![],
        };
        let mut out = Vec::new();
        write_response_head(&resp, &mut out);
        assert_eq!(resp_ok(&out).headers.len(), 0);
    }

    #[test]
    fn simple_responses() {
        let out = simple_response(
            407,
            "Proxy Authentication Required",
            &[("Proxy-Authenticate", "Basic realm=\"x\"")],
            "auth",
            true,
        );
        let (head, len) = parse_response_head(&out, &HeadLimits::default())
            .unwrap()
            .unwrap();
        assert_eq!(head.status, 407);
        assert_eq!(head.header_str("content-length"), Some("4"));
        assert_eq!(
            head.header_str("content-type"),
            Some("text/plain; charset=utf-8")
        );
        assert_eq!(
            head.header_str("proxy-authenticate"),
            Some("Basic realm=\"x\"")
        );
        assert!(!head.wants_keep_alive());
        assert_eq!(&out[len..], b"auth");
        let out = simple_response(200, "OK", &[], "", false);
        let head = resp_ok(&out);
        assert!(head.wants_keep_alive());
        assert_eq!(response_body_kind("GET", &head), Ok(BodyKind::Length(0)));
        // Injection through the extra headers is neutralised.
        let out = simple_response(400, "Bad", &[("X", "a\r\nInjected: 1")], "", true);
        assert_eq!(resp_ok(&out).header("injected"), None);
    }

    #[test]
    fn targets() {
        let t = |m: &str, s: &str| parse_target(m, s);
        assert_eq!(
            t("GET", "http://Example.COM/a?b=c#frag"),
            Ok(Target::Absolute {
                scheme: "http".into(),
                host: "example.com".into(),
                port: 80,
                path_and_query: "/a?b=c".into()
            })
        );
        assert_eq!(
            t("GET", "HTTPS://h:8443"),
            Ok(Target::Absolute {
                scheme: "https".into(),
                host: "h".into(),
                port: 8443,
                path_and_query: "/".into()
            })
        );
        assert_eq!(
            t("GET", "http://h?q"),
            Ok(Target::Absolute {
                scheme: "http".into(),
                host: "h".into(),
                port: 80,
                path_and_query: "/?q".into()
            })
        );
        assert_eq!(
            t("GET", "http://[::1]:8080/x"),
            Ok(Target::Absolute {
                scheme: "http".into(),
                host: "::1".into(),
                port: 8080,
                path_and_query: "/x".into()
            })
        );
        assert_eq!(
            t("GET", "http://h:/x").unwrap().authority().unwrap(),
            "h:80"
        );
        assert_eq!(
            t("CONNECT", "Example.com:443"),
            Ok(Target::Authority {
                host: "example.com".into(),
                port: 443
            })
        );
        let v6 = t("CONNECT", "[2001:DB8::1]:443").unwrap();
        assert_eq!(
            v6,
            Target::Authority {
                host: "2001:db8::1".into(),
                port: 443
            }
        );
        assert_eq!(v6.to_string(), "[2001:db8::1]:443");
        assert_eq!(
            t("GET", "/p?q"),
            Ok(Target::Origin {
                path_and_query: "/p?q".into()
            })
        );
        assert_eq!(
            t("OPTIONS", "*"),
            Ok(Target::Origin {
                path_and_query: "*".into()
            })
        );
        assert_eq!(
            t("GET", "http://a.b:81/x").unwrap().to_string(),
            "http://a.b:81/x"
        );
    }

    #[test]
    fn bad_targets() {
        let bad = [
            ("CONNECT", "example.com"),
            ("CONNECT", "example.com:"),
            ("CONNECT", "example.com:0"),
            ("CONNECT", "example.com:65536"),
            ("CONNECT", "example.com:+80"),
            ("CONNECT", "user@example.com:443"),
            ("CONNECT", "[::1]"),
            ("CONNECT", "[::1:443"),
            ("CONNECT", "[zz]:443"),
            ("CONNECT", "[::1]x:443"),
            ("CONNECT", ":443"),
            ("CONNECT", "/path"),
            ("CONNECT", "::1:443"),
            ("GET", "http://user:pw@example.com/"),
            ("GET", "http:///x"),
            ("GET", "http://"),
            ("GET", "ftp://example.com/"),
            ("GET", "example.com:80"),
            ("GET", "*"),
            ("GET", ""),
            ("GET", "http://exa mple.com/"),
            ("GET", "http://exa%41mple.com/"),
            ("GET", "http://a:99999/"),
        ];
        for (m, s) in bad {
            assert!(t_err(m, s), "{m} {s} should be rejected");
        }
        let long = format!("http://{}/", "a".repeat(300));
        assert!(t_err("GET", &long));
    }

    fn t_err(m: &str, s: &str) -> bool {
        matches!(parse_target(m, s), Err(HeadError::Malformed(_)))
    }

    fn scan_all(input: &[u8]) -> Result<ChunkScan, HeadError> {
        ChunkedScanner::new().scan(input)
    }

    #[test]
    fn chunked_whole_and_bytewise() {
        let body = b"5\r\nhello\r\n1A;name=value;x=\"q\"\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-Trailer: 1\r\nY: 2\r\n\r\n";
        let mut input = body.to_vec();
        input.extend_from_slice(b"GET /next HTTP/1.1\r\n");
        assert_eq!(
            scan_all(&input),
            Ok(ChunkScan {
                consumed: body.len(),
                complete: true
            })
        );
        // Every split point gives the same total.
        for split in 0..input.len() {
            let mut s = ChunkedScanner::new();
            let a = s.scan(&input[..split]).unwrap();
            if a.complete {
                assert_eq!(a.consumed, body.len());
                continue;
            }
            assert_eq!(a.consumed, split);
            let b = s.scan(&input[split..]).unwrap();
            assert!(b.complete);
            assert_eq!(a.consumed + b.consumed, body.len());
            assert!(s.is_complete());
            assert_eq!(s.scan(b"more").unwrap().consumed, 0);
        }
        // One byte at a time.
        let mut s = ChunkedScanner::new();
        let mut total = 0;
        for &byte in input.iter() {
            let r = s.scan(&[byte]).unwrap();
            total += r.consumed;
            if r.complete {
                break;
            }
        }
        assert_eq!(total, body.len());
    }

    #[test]
    fn chunked_minimal_and_large_sizes() {
        assert_eq!(
            scan_all(b"0\r\n\r\n"),
            Ok(ChunkScan {
                consumed: 5,
                complete: true
            })
        );
        assert!(scan_all(b"0 ; ext\r\n\r\n").unwrap().complete);
        // A huge chunk: the scanner only counts it.
        let mut s = ChunkedScanner::new();
        let r = s.scan(b"FFFFFFFFFFFFFFFF\r\nabc").unwrap();
        assert_eq!(
            r,
            ChunkScan {
                consumed: 21,
                complete: false
            }
        );
        let r = s.scan(&[0u8; 1000]).unwrap();
        assert_eq!(r.consumed, 1000);
        // Leading zeros count towards the digit limit but are otherwise fine.
        assert!(
            scan_all(b"0000000000000005\r\nhello\r\n0\r\n\r\n")
                .unwrap()
                .complete
        );
    }

    #[test]
    fn chunked_rejects_garbage() {
        let bad: &[&[u8]] = &[
            b"\r\n",
            b"x\r\n",
            b"-1\r\n",
            b"+5\r\n",
            b"0x5\r\n",
            b"5\nhello\r\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"5\r\nhelloXX",
            b"5\rhello",
            b"5 5\r\n",
            b"10000000000000000\r\n",
            b"00000000000000001\r\n",
            b"5;\x00\r\n",
            b"5;a\nb\r\n",
            b"0\r\nX: 1\n\r\n",
            b"0\r\n\n",
            b"0\r\n\rX",
            b"0\r\nX: 1\r\n folded\r\n\r\n",
            b"0\r\nX\x00: 1\r\n\r\n",
            b" 5\r\n",
        ];
        for b in bad {
            assert!(
                matches!(scan_all(b), Err(HeadError::Malformed(_))),
                "{:?} should be rejected, got {:?}",
                String::from_utf8_lossy(b),
                scan_all(b)
            );
        }
    }

    #[test]
    fn chunked_bounds() {
        let mut line = b"5;".to_vec();
        line.extend(std::iter::repeat_n(b'a', MAX_CHUNK_LINE));
        assert!(matches!(scan_all(&line), Err(HeadError::Malformed(_))));
        let mut ok = b"5;".to_vec();
        ok.extend(std::iter::repeat_n(b'a', MAX_CHUNK_LINE - 3));
        ok.extend_from_slice(b"\r\nhello\r\n0\r\n\r\n");
        assert!(scan_all(&ok).unwrap().complete);
        let mut trailers = b"0\r\n".to_vec();
        for _ in 0..MAX_TRAILER_BYTES / 10 + 1 {
            trailers.extend_from_slice(b"X-T: 1234\r\n");
        }
        assert_eq!(scan_all(&trailers), Err(HeadError::TooLarge));
    }
}
