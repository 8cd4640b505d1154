//! A plain-HTTP request that a cache rule covers: answered from the store (with ranges and
//! conditional requests), or fetched once from the origin while the body is streamed to the client
//! and into the store at the same time.
//!
//! Decisions (documented for operators in config/examples/server.yaml):
//! * Only responses with a `Content-Length` are stored (the size decides the tier and is reserved
//!   on disk before the first byte); chunked or close-delimited answers are relayed uncached
//!   (miss reason `no_length`).
//! * A miss fetches the **whole** object from the origin: the client's `Range` and conditional
//!   headers are not forwarded. A single-range client still gets `206` for its range, streamed as
//!   the bytes pass; a multi-range client gets the full `200` on that first request (allowed by
//!   RFC 9110) and `multipart/byteranges` once the object is stored.
//! * The fill continues when the client that started it disconnects, so the object still lands.

use super::disk::DiskFill;
use super::fill::{Advance, Claim, Fill, FillLease, Fills, Streamable};
use super::memory_body::MemoryBody;
use super::stats::Operation;
use super::store::{now_unix, Body, Entry, EvictReason, Lookup, Tier};
use super::{CachePolicy, CacheStore};
use crate::engine::CoreContext;
use crate::http_proxy::{
    exchange, origin_authority, origin_request, refuse, relay_response, send_request, ByteMeter,
    Forwarded, Next, Sent, Upstream,
};
use crate::snapshot::{Backend, Snapshot};
use crate::trace::Trace;
use crate::tunnel;
use futures_lite::io::AsyncWrite;
use glommio::net::TcpStream;
use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use switchyard_proto::cache::entry::EntryMeta;
use switchyard_proto::cache::key::cache_key;
use switchyard_proto::cache::policy::{
    check_request, check_response, stored_headers, variant_key, wants_fresh_copy,
};
use switchyard_proto::cache::range::{
    content_range, evaluate, if_range_matches, multipart, unsatisfied_range, ByteRange, RangeAnswer,
};
use switchyard_proto::cache::rules::CacheRule;
use switchyard_proto::http1::{self, BodyKind, RequestHead, ResponseHead};

/// Request headers not forwarded on a fill: the cache wants the whole, unconditional object.
const FILL_DROPPED_HEADERS: [&str; 6] = [
    "range",
    "if-range",
    "if-none-match",
    "if-modified-since",
    "if-match",
    "if-unmodified-since",
];

/// Bodies up to this size are written together with the head.
const INLINE_BODY: u64 = 64 << 10;
/// Bytes written to the client per slice of a stored body (bounds one socket write).
const SERVE_SLICE: usize = 1 << 20;

/// The parts of a cacheable request's handling that stay the same from lookup to fill.
pub(crate) struct CacheCall<'a> {
    pub ctx: &'a CoreContext,
    pub snapshot: &'a Snapshot,
    pub store: &'a Arc<CacheStore>,
    pub policy: &'a CachePolicy,
    pub rule: &'a CacheRule,
    pub client: &'a RefCell<TcpStream>,
    pub backend: &'a Backend,
    pub conn: &'a crate::live::LiveConnection,
}

impl CacheCall<'_> {
    /// Forwards the request uncached.
    async fn bypass(&self, carry: &mut Vec<u8>, request: Forwarded<'_>, trace: &mut Trace) -> Next {
        exchange(
            self.ctx,
            self.snapshot,
            self.client,
            carry,
            request,
            trace,
            self.backend,
            self.conn,
        )
        .await
    }
}

/// A request `call.rule` covers: answered from the store, from a fill in progress, or fetched
/// (and stored) as the fill's leader; bypassed to the plain exchange when it may not be cached.
pub(crate) async fn exchange_cached(
    call: &CacheCall<'_>,
    carry: &mut Vec<u8>,
    request: Forwarded<'_>,
    trace: &mut Trace,
) -> Next {
    let CacheCall {
        ctx,
        store,
        rule,
        client,
        conn,
        ..
    } = *call;
    let host = request.host;
    if let Err(bypass) = check_request(&request.head, rule) {
        store.stats.miss(host, bypass.label());
        return call.bypass(carry, request, trace).await;
    }
    if !matches!(request.request_body, BodyKind::Empty | BodyKind::Length(0)) {
        store.stats.miss(host, "request_body");
        return call.bypass(carry, request, trace).await;
    }
    let base_key = cache_key(
        host,
        request.port,
        &request.path_and_query,
        rule.ignore_query,
    );
    // Responses that vary on request headers are stored under a variant key.
    let key_now = || match store.vary_of(&base_key) {
        Some(names) => variant_key(&base_key, &names, &request.head),
        None => base_key.clone(),
    };
    let key = key_now();
    let meter = ByteMeter::new(ctx, None, conn);

    if !wants_fresh_copy(&request.head, rule) {
        let looked_up = Instant::now();
        let found = store.lookup(&key);
        store.stats.observe(Operation::Lookup, looked_up);
        match found {
            Lookup::Hit(entry) => {
                if let Some(next) = answer_hit(store, client, &request, &entry, trace, &meter).await
                {
                    return next;
                }
            }
            Lookup::Busy => {
                store.stats.miss(host, "index_busy");
                return call.bypass(carry, request, trace).await;
            }
            Lookup::Miss => {}
        }
    }
    if request.head.method.eq_ignore_ascii_case("HEAD") {
        // Only a GET fills the cache.
        store.stats.miss(host, "head_not_cached");
        return call.bypass(carry, request, trace).await;
    }
    let lease = match Fills::claim(store, &base_key) {
        Claim::Leader(lease) => lease,
        Claim::Follower(fill) => {
            if request.head.header("range").is_none() {
                if let Some(stream) = fill.wait_streamable().await {
                    let followed =
                        follow(store, client, &request, &fill, &stream, trace, &meter).await;
                    if let Some(next) = followed {
                        return next;
                    }
                }
            }
            fill.wait().await;
            if let Lookup::Hit(entry) = store.lookup(&key_now()) {
                if let Some(next) = answer_hit(store, client, &request, &entry, trace, &meter).await
                {
                    return next;
                }
            }
            store.stats.miss(host, "fill_failed");
            return call.bypass(carry, request, trace).await;
        }
    };
    let next = fill(call, carry, request, trace, base_key, &lease).await;
    drop(lease);
    next
}

/// Streams a disk fill in progress to a follower, reading the temporary file as it grows.
/// `None` when the file cannot be opened (the caller then waits for the stored entry).
async fn follow(
    store: &CacheStore,
    client: &RefCell<TcpStream>,
    request: &Forwarded<'_>,
    fill: &Fill,
    stream: &Streamable,
    trace: &mut Trace,
    meter: &ByteMeter<'_>,
) -> Option<Next> {
    // Buffered (page-cache) reads: O_DIRECT reads through the poll ring are not supported by
    // every block device (virtio answers EOPNOTSUPP), and the bytes were just written anyway.
    let file = glommio::io::BufferedFile::open(&stream.temp).await.ok()?;
    store.stats.hit(request.host);
    trace.backend = "cache".to_owned();
    let keep_alive = request.client_keep_alive;
    let total = stream.meta.body_len;
    let mut head = ResponseHead {
        version_minor: 1,
        status: 200,
        reason: "OK".to_owned(),
        headers: stream
            .meta
            .headers
            .iter()
            .map(|(n, v)| http1::Header::new(n, v))
            .collect(),
    };
    head.set_header("Content-Length", total.to_string().as_bytes());
    head.set_header("Accept-Ranges", b"bytes");
    head.set_header("X-Cache", b"HIT");
    head.set_header(
        "Connection",
        if keep_alive { b"keep-alive" } else { b"close" },
    );
    trace.status = 200;
    let mut out = Vec::with_capacity(512);
    http1::write_response_head(&head, &mut out);
    let mut sent = 0u64;
    let result: io::Result<()> = async {
        tunnel::write_all(client, &out).await?;
        meter.down(out.len() as u64);
        let head_only = request.head.method.eq_ignore_ascii_case("HEAD");
        let mut pos = 0u64;
        while pos < total && !head_only {
            let readable = match fill.wait_beyond(pos).await {
                Advance::Readable(n) => n.min(total),
                Advance::Complete => total,
                Advance::Failed => {
                    return Err(io::Error::other(
                        "the fill this response streamed from failed",
                    ))
                }
            };
            while pos < readable {
                let want = usize::try_from((readable - pos).min(SERVE_SLICE as u64))
                    .unwrap_or(SERVE_SLICE);
                let bytes = file
                    .read_at(stream.body_offset + pos, want)
                    .await
                    .map_err(|e| io::Error::other(e.to_string()))?;
                if bytes.is_empty() {
                    return Err(io::Error::other("cache file shorter than announced"));
                }
                tunnel::write_all(client, &bytes).await?;
                meter.down(bytes.len() as u64);
                pos += bytes.len() as u64;
                sent += bytes.len() as u64;
            }
        }
        Ok(())
    }
    .await;
    let _ = file.close().await;
    store.stats.served(true, sent);
    Some(match result {
        Ok(()) if keep_alive => Next::KeepAlive,
        Ok(()) => Next::Close,
        Err(e) => {
            tracing::warn!(url = %stream.meta.url, sent, error = %e, "streaming from a cache fill failed");
            trace.error = format!("streaming from the cache fill failed: {e}");
            Next::Close
        }
    })
}

/// Serves a stored entry. `None` when its file has gone (the entry is then dropped and the
/// request continues as a miss).
async fn answer_hit(
    store: &CacheStore,
    client: &RefCell<TcpStream>,
    request: &Forwarded<'_>,
    entry: &Arc<Entry>,
    trace: &mut Trace,
    meter: &ByteMeter<'_>,
) -> Option<Next> {
    let started = Instant::now();
    let source = match BodySource::open(entry).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(key = %entry.meta.key, error = %e, "cached file unreadable; refetching");
            store.remove(&entry.meta.key, EvictReason::Damaged);
            return None;
        }
    };
    store.stats.hit(request.host);
    trace.backend = "cache".to_owned();
    let keep_alive = request.client_keep_alive;
    let head_only = request.head.method.eq_ignore_ascii_case("HEAD");
    let result = serve_entry(
        client,
        &request.head,
        entry,
        &source,
        keep_alive,
        head_only,
        trace,
        meter,
    )
    .await;
    store.stats.observe(Operation::ServeHit, started);
    if let Err(e) = &result {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            // The file shrank under us (changed outside the cache): the next request refetches.
            tracing::warn!(key = %entry.meta.key, error = %e, "cached file shrank while served; entry dropped");
            store.remove(&entry.meta.key, EvictReason::Damaged);
        }
    }
    Some(match result {
        Ok(body_bytes) => {
            store.stats.served(true, body_bytes);
            if keep_alive {
                Next::KeepAlive
            } else {
                Next::Close
            }
        }
        Err(e) => {
            trace.error = format!("serving from cache failed: {e}");
            Next::Close
        }
    })
}

/// A stored body: the memory copy, or the entry file read with positioned reads through
/// io_uring. Reads (not a memory map) so that a file shortened by another process while it is
/// served ends the response with an error instead of a SIGBUS that would kill the process.
enum BodySource<'e> {
    /// With the memfd the bytes are sealed in, when they are (see [`MemoryBody`]).
    Memory(&'e [u8], Option<std::os::fd::RawFd>),
    File {
        file: glommio::io::BufferedFile,
        offset: u64,
    },
}

/// The entry file ended before the bytes its entry announces.
fn shrunk_file() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "cache entry file is shorter than its entry (changed outside the cache)",
    )
}

impl<'e> BodySource<'e> {
    async fn open(entry: &'e Entry) -> io::Result<Self> {
        match &entry.body {
            Body::Memory(body) => Ok(BodySource::Memory(body, body.fd())),
            Body::Disk { path, offset } => {
                let file = glommio::io::BufferedFile::open(path)
                    .await
                    .map_err(io::Error::from)?;
                let size = file.file_size().await.map_err(io::Error::from)?;
                if size != offset + entry.meta.body_len {
                    let _ = file.close().await;
                    return Err(io::Error::other("entry file has the wrong length"));
                }
                Ok(BodySource::File {
                    file,
                    offset: *offset,
                })
            }
        }
    }

    /// Calls `each` with the bytes of `range`, in order, at most [`SERVE_SLICE`] at a time.
    async fn for_each_piece(
        &self,
        range: ByteRange,
        mut each: impl AsyncFnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        match self {
            BodySource::Memory(bytes, _) => {
                let start = usize::try_from(range.start).unwrap_or(usize::MAX);
                let end = usize::try_from(range.end + 1).unwrap_or(usize::MAX);
                each(bytes.get(start..end).ok_or_else(shrunk_file)?).await
            }
            BodySource::File { file, offset } => {
                let mut pos = range.start;
                while pos <= range.end {
                    let want = usize::try_from((range.end + 1 - pos).min(SERVE_SLICE as u64))
                        .unwrap_or(SERVE_SLICE);
                    let bytes = file
                        .read_at(offset + pos, want)
                        .await
                        .map_err(io::Error::from)?;
                    if bytes.is_empty() {
                        return Err(shrunk_file());
                    }
                    each(&bytes[..]).await?;
                    pos += bytes.len() as u64;
                }
                Ok(())
            }
        }
    }

    /// Appends `range` of the body to `out` (small bodies, sent with their head).
    async fn append(&self, range: ByteRange, out: &mut Vec<u8>) -> io::Result<()> {
        self.for_each_piece(range, async |piece: &[u8]| {
            out.extend_from_slice(piece);
            Ok(())
        })
        .await
    }

    /// Writes `range` of the body to the client; returns the bytes sent. Each write offers
    /// everything still to send of a piece, so one `send(2)` moves as much as the socket takes.
    async fn send(
        &self,
        client: &RefCell<TcpStream>,
        range: ByteRange,
        meter: &ByteMeter<'_>,
    ) -> io::Result<u64> {
        if let BodySource::Memory(_, Some(fd)) = self {
            if zero_copy() {
                return sendfile_range(client, *fd, range, meter).await;
            }
        }
        let mut sent = 0u64;
        self.for_each_piece(range, async |piece: &[u8]| {
            let mut left = piece;
            while !left.is_empty() {
                let n =
                    poll_fn(|cx| Pin::new(&mut *client.borrow_mut()).poll_write(cx, left)).await?;
                if n == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                meter.down(n as u64);
                sent += n as u64;
                left = left.get(n..).unwrap_or_default();
            }
            Ok(())
        })
        .await?;
        Ok(sent)
    }
}

/// Whether sealed bodies go out with `sendfile(2)`: unless `SWITCHYARD_RELAY=copy` (the
/// bench's copy-path comparison, the same switch as the tunnel relay's).
fn zero_copy() -> bool {
    crate::splice::enabled()
}

/// Sends `range` of a body sealed in memfd `fd` with `sendfile(2)`: the
/// socket gets page references, the body is not copied through user space. When the socket's
/// buffer is full, the task waits on glommio's poll for room and `sendfile` carries on.
async fn sendfile_range(
    client: &RefCell<TcpStream>,
    fd: std::os::fd::RawFd,
    range: ByteRange,
    meter: &ByteMeter<'_>,
) -> io::Result<u64> {
    let socket = std::os::fd::AsRawFd::as_raw_fd(&*client.borrow());
    crate::sys::set_nonblocking(socket)?;
    let end = range.end + 1;
    let mut pos = range.start;
    while pos < end {
        let left = usize::try_from(end - pos).unwrap_or(usize::MAX);
        match crate::sys::sendfile(socket, fd, pos, left) {
            Ok(0) => return Err(shrunk_file()),
            Ok(n) => {
                meter.down(n as u64);
                pos += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                poll_fn(|cx| client.borrow_mut().poll_writable(cx)).await?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(end - range.start)
}

fn response_head(status: u16, reason: &str, entry: &Entry, keep_alive: bool) -> ResponseHead {
    let mut head = ResponseHead {
        version_minor: 1,
        status,
        reason: reason.to_owned(),
        headers: entry
            .meta
            .headers
            .iter()
            .map(|(n, v)| http1::Header::new(n, v))
            .collect(),
    };
    let age = now_unix().saturating_sub(entry.meta.created_unix);
    head.set_header("Age", age.to_string().as_bytes());
    head.set_header("Accept-Ranges", b"bytes");
    head.set_header("X-Cache", b"HIT");
    head.set_header(
        "Connection",
        if keep_alive { b"keep-alive" } else { b"close" },
    );
    head
}

fn stored_header<'m>(entry: &'m Entry, name: &str) -> Option<&'m [u8]> {
    entry
        .meta
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_slice())
}

/// `If-None-Match` against the stored ETag (weak comparison, as RFC 9110 asks for it).
fn not_modified(request: &RequestHead, entry: &Entry) -> bool {
    let (Some(wanted), Some(etag)) = (
        request.header("if-none-match"),
        stored_header(entry, "etag"),
    ) else {
        return false;
    };
    let strip = |t: &[u8]| -> Vec<u8> {
        let t = t.trim_ascii();
        t.strip_prefix(b"W/").unwrap_or(t).to_vec()
    };
    let etag = strip(etag);
    wanted
        .split(|&b| b == b',')
        .any(|candidate| candidate.trim_ascii() == b"*" || strip(candidate) == etag)
}

#[allow(clippy::too_many_arguments)]
async fn serve_entry(
    client: &RefCell<TcpStream>,
    request: &RequestHead,
    entry: &Entry,
    source: &BodySource<'_>,
    keep_alive: bool,
    head_only: bool,
    trace: &mut Trace,
    meter: &ByteMeter<'_>,
) -> io::Result<u64> {
    let total = entry.meta.body_len;
    let range_allowed = if_range_matches(
        request.header("if-range"),
        stored_header(entry, "etag"),
        stored_header(entry, "last-modified"),
    );
    let answer = if request.header("range").is_some() && range_allowed {
        evaluate(request.header("range"), total)
    } else {
        RangeAnswer::Full
    };
    let mut out = Vec::with_capacity(512);
    let mut parts: Vec<(Vec<u8>, ByteRange)> = Vec::new();
    let mut trailer = Vec::new();
    if not_modified(request, entry) {
        let mut head = response_head(304, "Not Modified", entry, keep_alive);
        head.remove_header("content-type");
        http1::write_response_head(&head, &mut out);
        trace.status = 304;
    } else {
        match answer {
            RangeAnswer::Full => {
                let age = now_unix().saturating_sub(entry.meta.created_unix);
                out.extend_from_slice(&entry.full_head);
                let connection = if keep_alive { "keep-alive" } else { "close" };
                out.extend_from_slice(
                    format!("Age: {age}\r\nConnection: {connection}\r\n\r\n").as_bytes(),
                );
                if total > 0 {
                    parts.push((
                        Vec::new(),
                        ByteRange {
                            start: 0,
                            end: total - 1,
                        },
                    ));
                }
                trace.status = 200;
            }
            RangeAnswer::Partial(ranges) if ranges.len() == 1 => {
                let r = ranges[0];
                let mut head = response_head(206, "Partial Content", entry, keep_alive);
                head.set_header("Content-Range", content_range(r, total).as_bytes());
                head.set_header(
                    "Content-Length",
                    (r.end + 1 - r.start).to_string().as_bytes(),
                );
                http1::write_response_head(&head, &mut out);
                parts.push((Vec::new(), r));
                trace.status = 206;
            }
            RangeAnswer::Partial(ranges) => {
                let content_type =
                    stored_header(entry, "content-type").and_then(|v| std::str::from_utf8(v).ok());
                let boundary = format!("switchyard-{:016x}", now_unix() ^ total);
                let plan = multipart(&ranges, total, content_type, &boundary);
                let mut head = response_head(206, "Partial Content", entry, keep_alive);
                head.set_header("Content-Type", plan.content_type.as_bytes());
                head.set_header("Content-Length", plan.content_length.to_string().as_bytes());
                http1::write_response_head(&head, &mut out);
                parts = plan.parts;
                trailer = plan.trailer;
                trace.status = 206;
            }
            RangeAnswer::Unsatisfiable => {
                let mut head = response_head(416, "Range Not Satisfiable", entry, keep_alive);
                head.remove_header("content-type");
                head.set_header("Content-Range", unsatisfied_range(total).as_bytes());
                head.set_header("Content-Length", b"0");
                http1::write_response_head(&head, &mut out);
                trace.status = 416;
            }
        }
    }
    if head_only || trace.status == 304 {
        tunnel::write_all(client, &out).await?;
        meter.down(out.len() as u64);
        return Ok(0);
    }
    let mut body_bytes = 0u64;
    // A small single-part body goes out with its head in one write (one syscall per hit).
    if let [(prefix, range)] = parts.as_slice() {
        if prefix.is_empty() && range.len() <= INLINE_BODY && trailer.is_empty() {
            source.append(*range, &mut out).await?;
            body_bytes = range.len();
            parts.clear();
        }
    }
    if parts.is_empty() {
        tunnel::write_all(client, &out).await?;
    } else {
        write_head_before_body(client, &out).await?;
    }
    meter.down(out.len() as u64);
    for (prefix, range) in &parts {
        if !prefix.is_empty() {
            tunnel::write_all(client, prefix).await?;
            meter.down(prefix.len() as u64);
        }
        body_bytes += source.send(client, *range, meter).await?;
    }
    if !trailer.is_empty() {
        tunnel::write_all(client, &trailer).await?;
        meter.down(trailer.len() as u64);
    }
    Ok(body_bytes)
}

/// Writes a response head whose body follows at once: sent with `MSG_MORE`, so it leaves in
/// the body's first segment rather than as a packet of its own (one receiver wake-up less per
/// response). What the socket does not take at once goes through glommio's write.
async fn write_head_before_body(client: &RefCell<TcpStream>, head: &[u8]) -> io::Result<()> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(&*client.borrow());
    let sent = match crate::sys::send_more(fd, head) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
        Err(e) => return Err(e),
    };
    match head.get(sent..) {
        Some(rest) if !rest.is_empty() => tunnel::write_all(client, rest).await,
        _ => Ok(()),
    }
}

/// Where a fill's bytes go.
enum Sink {
    Memory(Vec<u8>),
    Disk(DiskFill),
    /// Storing failed (or was never possible); the body is only relayed.
    None,
}

/// The leader's miss: fetch the whole object, stream it to the client and into the store.
async fn fill(
    call: &CacheCall<'_>,
    carry: &mut Vec<u8>,
    request: Forwarded<'_>,
    trace: &mut Trace,
    base_key: String,
    lease: &FillLease,
) -> Next {
    let CacheCall {
        ctx,
        snapshot,
        store,
        policy,
        rule,
        client,
        backend,
        conn,
    } = *call;
    let Forwarded {
        head: client_head,
        peer,
        host,
        port,
        path_and_query,
        request_body,
        client_keep_alive,
    } = request;
    let mut head = client_head.clone();
    for name in FILL_DROPPED_HEADERS {
        head.remove_header(name);
    }
    let url = format!("http://{}{}", origin_authority(host, port), path_and_query);
    let (out, _) = origin_request(
        &mut head,
        &backend.kind,
        host,
        port,
        path_and_query,
        request_body,
    );
    let meter = ByteMeter::new(ctx, Some(backend), conn);
    let upstream = match send_request(
        ctx,
        snapshot,
        client,
        carry,
        &out,
        false,
        backend,
        host,
        port,
        request_body,
        &meter,
        peer,
    )
    .await
    {
        Sent::Answered(u) => *u,
        Sent::Failed(status, reason, message) => {
            store.stats.miss(host, "origin_error");
            refuse(client, trace, status, reason, &[], message).await;
            return Next::Close;
        }
        Sent::ClientGone => return Next::Close,
    };
    let decision = check_response(
        &head,
        &upstream.response,
        rule,
        policy.default_ttl,
        policy.max_file_size,
    );
    let length = match http1::response_body_kind(&head.method, &upstream.response) {
        Ok(BodyKind::Length(n)) => Some(n),
        _ => None,
    };
    let plan = match (decision, length) {
        (Err(bypass), _) => Err(bypass.label()),
        (Ok(_), None) => Err("no_length"),
        (Ok(freshness), Some(n)) => match store.tier_for(n) {
            Some(tier) => Ok((freshness, n, tier)),
            None => Err("too_large"),
        },
    };
    let (freshness, length, tier) = match plan {
        Ok(p) => p,
        Err(reason) => {
            store.stats.miss(host, reason);
            let (next, bytes) = relay_response(
                client,
                upstream,
                &head.method,
                host,
                port,
                client_keep_alive,
                trace,
                &meter,
                &[("X-Cache", b"MISS")],
            )
            .await;
            store.stats.served(false, bytes);
            return next;
        }
    };
    store.stats.miss(host, "not_cached");
    let key = if freshness.vary.is_empty() {
        base_key
    } else {
        store.set_vary(&base_key, freshness.vary.clone());
        variant_key(&base_key, &freshness.vary, &client_head)
    };
    let started = Instant::now();
    let now = now_unix();
    let meta = EntryMeta {
        key: key.clone(),
        url,
        host: host.to_ascii_lowercase(),
        status: upstream.response.status,
        headers: stored_headers(&upstream.response),
        content_type: upstream
            .response
            .header_str("content-type")
            .unwrap_or_default()
            .to_owned(),
        body_len: length,
        body_checksum: 0,
        created_unix: now,
        expires_unix: now.saturating_add(freshness.ttl.as_secs()),
    };
    let sink = match tier {
        Tier::Memory => Sink::Memory(Vec::with_capacity(usize::try_from(length).unwrap_or(0))),
        Tier::Disk => {
            match DiskFill::create(
                store.temp_path(&key),
                store.entry_path(&key),
                &meta,
                store.janitor(),
            )
            .await
            {
                Ok(d) => {
                    lease.publish(Streamable {
                        meta: meta.clone(),
                        temp: d.temp_path().to_owned(),
                        body_offset: d.header_len(),
                    });
                    Sink::Disk(d)
                }
                Err(e) => {
                    tracing::error!(%key, dir = %store.settings.disk_dir.display(), error = %e,
                        "cannot store cache entry; serving uncached");
                    store.stats.store_error();
                    Sink::None
                }
            }
        }
    };
    // The client's own range, served from the stream as the bytes pass.
    let window = match client_head.header("range") {
        Some(_) => evaluate(client_head.header("range"), length),
        None => RangeAnswer::Full,
    };
    let tee = Tee {
        client,
        upstream,
        client_keep_alive,
        window,
        length,
        sink,
        meter: &meter,
        store,
        key: &key,
        lease,
    };
    let (next, relayed, stored) = tee.run(trace, meta, head_is_head(&head)).await;
    store.stats.served(false, relayed);
    if stored {
        store.stats.observe(Operation::Store, started);
    }
    next
}

fn head_is_head(head: &RequestHead) -> bool {
    head.method.eq_ignore_ascii_case("HEAD")
}

/// Body bytes in hand during a fill: left over from reading the head, or a pooled read buffer.
enum Piece {
    Carried(Vec<u8>),
    Read(Box<[u8]>, usize),
}

/// Streams one origin body to the client (all of it, or the client's range) and into a sink.
struct Tee<'a> {
    client: &'a RefCell<TcpStream>,
    upstream: Upstream,
    client_keep_alive: bool,
    window: RangeAnswer,
    length: u64,
    sink: Sink,
    meter: &'a ByteMeter<'a>,
    store: &'a CacheStore,
    key: &'a str,
    lease: &'a FillLease,
}

impl Tee<'_> {
    /// Returns what the client connection does next, body bytes sent to it, and whether the
    /// entry was stored.
    async fn run(
        mut self,
        trace: &mut Trace,
        meta: EntryMeta,
        head_only: bool,
    ) -> (Next, u64, bool) {
        let total = self.length;
        let mut response = self.upstream.response.clone();
        http1::strip_hop_by_hop(&mut response.headers);
        response.version_minor = 1;
        response.set_header("X-Cache", b"MISS");
        response.set_header("Accept-Ranges", b"bytes");
        let keep = self.client_keep_alive;
        response.set_header("Connection", if keep { b"keep-alive" } else { b"close" });
        // Which bytes of the body the client gets; `None` = none (416 or HEAD).
        let want: Option<ByteRange> = match &self.window {
            RangeAnswer::Partial(r) if r.len() == 1 => {
                response.status = 206;
                response.reason = "Partial Content".to_owned();
                response.set_header("Content-Range", content_range(r[0], total).as_bytes());
                response.set_header(
                    "Content-Length",
                    (r[0].end + 1 - r[0].start).to_string().as_bytes(),
                );
                Some(r[0])
            }
            RangeAnswer::Unsatisfiable => {
                response.status = 416;
                response.reason = "Range Not Satisfiable".to_owned();
                response.remove_header("content-type");
                response.set_header("Content-Range", unsatisfied_range(total).as_bytes());
                response.set_header("Content-Length", b"0");
                None
            }
            _ if total == 0 => None,
            _ => Some(ByteRange {
                start: 0,
                end: total - 1,
            }),
        };
        let want = if head_only { None } else { want };
        trace.status = response.status;
        let mut out = Vec::with_capacity(512);
        http1::write_response_head(&response, &mut out);
        let mut client_ok = tunnel::write_all(self.client, &out).await.is_ok();
        if client_ok {
            self.meter.down(out.len() as u64);
        }
        let mut relayed = 0u64;
        let mut pos = 0u64;
        let mut origin_error = None;
        let mut carry = std::mem::take(&mut self.upstream.carry);
        while pos < total {
            let piece = if !carry.is_empty() {
                let take = usize::try_from((total - pos).min(carry.len() as u64)).unwrap_or(0);
                let rest = carry.split_off(take);
                Piece::Carried(std::mem::replace(&mut carry, rest))
            } else {
                match tunnel::read_pooled(&self.upstream.origin).await {
                    Ok((buf, 0)) => {
                        crate::buffer_pool::give(buf);
                        origin_error =
                            Some("origin closed before the body was complete".to_owned());
                        break;
                    }
                    Ok((buf, n)) => Piece::Read(buf, n),
                    Err(e) => {
                        origin_error = Some(format!("reading the origin body failed: {e}"));
                        break;
                    }
                }
            };
            let bytes: &[u8] = match &piece {
                Piece::Read(buf, n) => {
                    let n = usize::try_from((total - pos).min(*n as u64)).unwrap_or(0);
                    buf.get(..n).unwrap_or_default()
                }
                Piece::Carried(chunk) => chunk,
            };
            let len = bytes.len() as u64;
            if client_ok {
                if let Some(w) = want {
                    let from = pos.max(w.start);
                    let to = (pos + len).min(w.end + 1);
                    if from < to {
                        let a = usize::try_from(from - pos).unwrap_or(0);
                        let b = usize::try_from(to - pos).unwrap_or(0);
                        let part = bytes.get(a..b).unwrap_or_default();
                        if tunnel::write_all(self.client, part).await.is_ok() {
                            self.meter.down(part.len() as u64);
                            relayed += part.len() as u64;
                        } else {
                            client_ok = false;
                            tracing::debug!(key = %self.key, "client left during a fill; continuing the fill");
                        }
                    }
                }
            }
            let stored = match &mut self.sink {
                Sink::Memory(v) => {
                    v.extend_from_slice(bytes);
                    Ok(())
                }
                Sink::Disk(d) => {
                    let wrote = d.write(bytes).await;
                    self.lease.advance(d.flushed_body());
                    wrote
                }
                Sink::None => Ok(()),
            };
            if let Err(e) = stored {
                tracing::error!(key = %self.key, error = %e, "writing cache entry failed; serving uncached");
                self.store.stats.store_error();
                if let Sink::Disk(d) = std::mem::replace(&mut self.sink, Sink::None) {
                    d.abort();
                }
            }
            pos += len;
            if let Piece::Read(buf, _) = piece {
                crate::buffer_pool::give(buf);
            }
            if !client_ok && matches!(self.sink, Sink::None) {
                break;
            }
        }
        let complete = pos == total && origin_error.is_none();
        if let Some(e) = &origin_error {
            trace.error = e.clone();
        }
        let stored = if complete {
            self.store_entry(meta).await
        } else {
            if let Sink::Disk(d) = std::mem::replace(&mut self.sink, Sink::None) {
                d.abort();
            }
            false
        };
        // The origin connection is reusable when its body was read exactly.
        let Upstream {
            origin,
            response: origin_response,
            pool_key,
            ..
        } = self.upstream;
        if complete && carry.is_empty() && origin_response.wants_keep_alive() {
            let _ = origin.borrow().set_read_timeout(None);
            crate::origin_pool::give(pool_key, origin.into_inner());
        }
        let next = if client_ok && complete && keep {
            Next::KeepAlive
        } else {
            Next::Close
        };
        (next, relayed, stored)
    }

    async fn store_entry(&mut self, mut meta: EntryMeta) -> bool {
        let entry = match std::mem::replace(&mut self.sink, Sink::None) {
            Sink::Memory(bytes) => {
                let mut checksum = switchyard_proto::cache::entry::BodyChecksum::new();
                checksum.update(&bytes);
                meta.body_checksum = checksum.finish();
                Entry::new(meta, Body::Memory(MemoryBody::new(bytes)))
            }
            Sink::Disk(d) => match d.finish(&mut meta).await {
                Ok((path, offset)) => {
                    self.lease.complete(meta.body_len);
                    Entry::new(meta, Body::Disk { path, offset })
                }
                Err(e) => {
                    tracing::error!(key = %self.key, error = %e, "sealing cache entry failed");
                    self.store.stats.store_error();
                    return false;
                }
            },
            Sink::None => return false,
        };
        self.store.insert(entry)
    }
}
