//! The HTTP/1.1 forward proxy on one client connection: absolute-form requests relayed to
//! origins over pooled keep-alive connections (many requests per client connection), CONNECT
//! tunnels, proxy authentication, rate limiting, and the error replies for bad input.

use crate::connector::Connected;
use crate::credentials::{Credential, Verdict};
use crate::engine::CoreContext;
use crate::error::DataplaneError;
use crate::events::Protocol;
use crate::origin_pool::{self, PoolKey};
use crate::proxied::{dial, dial_for_request, Registered};
use crate::proxy_auth::NEGOTIATE_CHALLENGE;
use crate::snapshot::{Backend, BackendKind, Snapshot};
use crate::trace::Trace;
use crate::tunnel;
use glommio::net::TcpStream;
use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use switchyard_proto::http1::{
    self, BodyKind, ChunkedScanner, HeadError, HeadLimits, RequestHead, ResponseHead, Target,
};

/// Why reading a head stopped without a head.
pub(crate) enum HeadRead<T> {
    Head(T),
    /// Clean EOF before any byte of a new message.
    Closed,
    TimedOut,
    Bad(HeadError),
    Io,
}

pub(crate) async fn with_timeout<T>(
    d: Duration,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    futures_lite::future::or(async { Some(fut.await) }, async {
        glommio::timer::sleep(d).await;
        None
    })
    .await
}

/// Reads until `parse` yields a head; `carry` holds bytes read beyond it on return.
pub(crate) async fn read_head<T, S: futures_lite::io::AsyncRead + Unpin>(
    from: &RefCell<S>,
    carry: &mut Vec<u8>,
    limits: &HeadLimits,
    timeout: Duration,
    parse: impl Fn(&[u8], &HeadLimits) -> Result<Option<(T, usize)>, HeadError>,
) -> HeadRead<T> {
    let work = async {
        loop {
            if !carry.is_empty() {
                match parse(carry, limits) {
                    Ok(Some((head, used))) => {
                        carry.drain(..used);
                        return HeadRead::Head(head);
                    }
                    Ok(None) if carry.len() >= limits.max_head_bytes => {
                        return HeadRead::Bad(HeadError::TooLarge)
                    }
                    Ok(None) => {}
                    Err(e) => return HeadRead::Bad(e),
                }
            }
            match tunnel::read_pooled(from).await {
                Ok((buf, 0)) => {
                    crate::buffer_pool::give(buf);
                    return if carry.is_empty() {
                        HeadRead::Closed
                    } else {
                        HeadRead::Io
                    };
                }
                Ok((buf, n)) => {
                    carry.extend_from_slice(&buf[..n]);
                    crate::buffer_pool::give(buf);
                }
                Err(_) => return HeadRead::Io,
            }
        }
    };
    with_timeout(timeout, work)
        .await
        .unwrap_or(HeadRead::TimedOut)
}

/// How a relayed body ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BodyEnd {
    /// Delimited body complete; the source connection can carry another message.
    Complete,
    /// Body ran to EOF (close-delimited); the source is finished.
    Eof,
}

/// Relays one body of `kind` from `from` (whose already-read bytes are in `carry`) to `to`.
/// Bytes beyond the body stay in `carry` (a pipelined next message).
pub(crate) async fn relay_body<F, T>(
    from: &RefCell<F>,
    to: &RefCell<T>,
    carry: &mut Vec<u8>,
    kind: BodyKind,
    count: &dyn Fn(u64),
) -> io::Result<BodyEnd>
where
    F: futures_lite::io::AsyncRead + Unpin,
    T: futures_lite::io::AsyncWrite + Unpin,
{
    match kind {
        BodyKind::Empty => Ok(BodyEnd::Complete),
        BodyKind::Length(mut left) => {
            let take = (carry.len() as u64).min(left) as usize;
            if take > 0 {
                tunnel::write_all(to, &carry[..take]).await?;
                carry.drain(..take);
                left -= take as u64;
                count(take as u64);
            }
            while left > 0 {
                let (buf, n) = tunnel::read_pooled(from).await?;
                if n == 0 {
                    crate::buffer_pool::give(buf);
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                let used = (n as u64).min(left) as usize;
                let res = tunnel::write_all(to, &buf[..used]).await;
                carry.extend_from_slice(&buf[used..n]);
                crate::buffer_pool::give(buf);
                res?;
                left -= used as u64;
                count(used as u64);
            }
            Ok(BodyEnd::Complete)
        }
        BodyKind::Chunked => {
            let mut scanner = ChunkedScanner::new();
            let bad = |e: HeadError| io::Error::new(io::ErrorKind::InvalidData, e.to_string());
            if !carry.is_empty() {
                let scan = scanner.scan(carry).map_err(bad)?;
                tunnel::write_all(to, &carry[..scan.consumed]).await?;
                count(scan.consumed as u64);
                carry.drain(..scan.consumed);
                if scan.complete {
                    return Ok(BodyEnd::Complete);
                }
            }
            loop {
                let (buf, n) = tunnel::read_pooled(from).await?;
                if n == 0 {
                    crate::buffer_pool::give(buf);
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                let scan = match scanner.scan(&buf[..n]) {
                    Ok(s) => s,
                    Err(e) => {
                        crate::buffer_pool::give(buf);
                        return Err(bad(e));
                    }
                };
                let res = tunnel::write_all(to, &buf[..scan.consumed]).await;
                carry.extend_from_slice(&buf[scan.consumed..n]);
                crate::buffer_pool::give(buf);
                res?;
                count(scan.consumed as u64);
                if scan.complete {
                    return Ok(BodyEnd::Complete);
                }
            }
        }
        BodyKind::UntilClose => {
            if !carry.is_empty() {
                tunnel::write_all(to, carry).await?;
                count(carry.len() as u64);
                carry.clear();
            }
            loop {
                let (buf, n) = tunnel::read_pooled(from).await?;
                if n == 0 {
                    crate::buffer_pool::give(buf);
                    return Ok(BodyEnd::Eof);
                }
                let res = tunnel::write_all(to, &buf[..n]).await;
                crate::buffer_pool::give(buf);
                res?;
                count(n as u64);
            }
        }
    }
}

pub(crate) async fn reply(
    client: &RefCell<TcpStream>,
    status: u16,
    reason: &str,
    extra: &[(&str, &str)],
    body: &str,
    close: bool,
) {
    let bytes = http1::simple_response(status, reason, extra, body, close);
    let _ = tunnel::write_all(client, &bytes).await;
}

/// Answers with an error status, recording it in the trace.
pub(crate) async fn refuse(
    client: &RefCell<TcpStream>,
    trace: &mut Trace,
    status: u16,
    reason: &str,
    extra: &[(&str, &str)],
    message: String,
) {
    reply(client, status, reason, extra, &format!("{message}\n"), true).await;
    trace.fail(status, message);
}

async fn refuse_with(client: &RefCell<TcpStream>, trace: &mut Trace, e: &DataplaneError) {
    let (status, reason) = e.http_status();
    // RFC 9209: a client behind this proxy tells a refusing host from an unreachable one
    let proxy_status = e
        .proxy_status()
        .map(|error| format!("switchyard; error={error}"));
    let extra: Vec<(&str, &str)> = proxy_status
        .as_deref()
        .map(|v| ("Proxy-Status", v))
        .into_iter()
        .collect();
    refuse(client, trace, status, reason, &extra, e.to_string()).await;
}

pub(crate) fn host_port_label(host: &str, port: u16) -> String {
    http1::format_authority(host, port)
}

pub(crate) async fn serve(stream: TcpStream, peer: SocketAddr, ctx: Rc<CoreContext>) {
    let client_ip = crate::access_control::canonical(peer.ip());
    let client = RefCell::new(stream);
    let mut carry: Vec<u8> = Vec::new();
    let mut first = true;
    let mut registered: Option<Registered<'_>> = None;
    loop {
        let snapshot = ctx.current_snapshot();
        let limits = HeadLimits {
            max_head_bytes: snapshot.max_header_size,
            ..HeadLimits::default()
        };
        // Between requests the connection may idle; once bytes arrive the head must complete
        // within the header timeout (slow-header protection).
        if !first && carry.is_empty() {
            let wait = with_timeout(snapshot.timeouts.idle, async {
                match tunnel::read_pooled(&client).await {
                    Ok((buf, n)) => {
                        carry.extend_from_slice(&buf[..n]);
                        crate::buffer_pool::give(buf);
                        n > 0
                    }
                    Err(_) => false,
                }
            })
            .await;
            if wait != Some(true) {
                break;
            }
        }
        first = false;
        let head = match read_head(
            &client,
            &mut carry,
            &limits,
            snapshot.timeouts.header,
            http1::parse_request_head,
        )
        .await
        {
            HeadRead::Head(h) => h,
            HeadRead::Closed | HeadRead::Io => break,
            HeadRead::TimedOut => {
                let mut trace = Trace::new(Protocol::Http, "");
                let msg = "request head not received in time".to_owned();
                refuse(&client, &mut trace, 408, "Request Timeout", &[], msg).await;
                trace.finish(&ctx, &snapshot, client_ip);
                break;
            }
            HeadRead::Bad(e) => {
                let mut trace = Trace::new(Protocol::Http, "");
                let status = e.status();
                let reason = if status == 431 {
                    "Request Header Fields Too Large"
                } else {
                    "Bad Request"
                };
                refuse(&client, &mut trace, status, reason, &[], e.to_string()).await;
                trace.finish(&ctx, &snapshot, client_ip);
                break;
            }
        };
        let connect = head.method.eq_ignore_ascii_case("CONNECT");
        let protocol = if connect {
            Protocol::Connect
        } else {
            Protocol::Http
        };
        // What only the request log reads is copied only when it is on (six strings per
        // request otherwise built and dropped unread).
        let mut trace = if snapshot.request_log {
            let mut t = Trace::new(protocol, &head.method);
            t.url = head.target.clone();
            t.user_agent = head.header_str("user-agent").unwrap_or_default().to_owned();
            t
        } else {
            Trace::unlogged(protocol)
        };
        let next = handle_request(
            &ctx,
            &snapshot,
            &client,
            &mut carry,
            head,
            peer,
            &mut trace,
            &mut registered,
        )
        .await;
        match next {
            Next::KeepAlive => trace.finish(&ctx, &snapshot, client_ip),
            Next::Close => {
                trace.finish(&ctx, &snapshot, client_ip);
                break;
            }
            Next::Tunnel(job) => {
                drop(registered.take());
                let carry = std::mem::take(&mut carry);
                let backend = crate::proxied::TunnelBackend::of(&snapshot, &job.backend);
                crate::proxied::spawn_tunnel(
                    &ctx,
                    &snapshot,
                    client,
                    job.connected,
                    carry,
                    peer,
                    Protocol::Connect,
                    job.label,
                    backend,
                    job.trace,
                );
                return;
            }
        }
    }
}

/// What the connection does after a request.
pub(crate) enum Next {
    KeepAlive,
    Close,
    Tunnel(Box<TunnelJob>),
}

pub(crate) struct TunnelJob {
    connected: Connected,
    label: String,
    backend: Arc<Backend>,
    trace: Trace,
}

#[allow(clippy::too_many_arguments)]
async fn handle_request<'c>(
    ctx: &'c CoreContext,
    snapshot: &Snapshot,
    client: &RefCell<TcpStream>,
    carry: &mut Vec<u8>,
    head: RequestHead,
    peer: SocketAddr,
    trace: &mut Trace,
    registered: &mut Option<Registered<'c>>,
) -> Next {
    let client_ip = crate::access_control::canonical(peer.ip());
    if let Some(limiter) = &snapshot.request_limit {
        if !limiter.admit(client_ip) {
            let msg = "rate limit exceeded".to_owned();
            refuse(
                client,
                trace,
                429,
                "Too Many Requests",
                &[("Retry-After", "1")],
                msg,
            )
            .await;
            return Next::Close;
        }
    }
    if snapshot.requires_auth() {
        let credential = head
            .header("proxy-authorization")
            .and_then(crate::credentials::parse_proxy_authorization);
        let guard = &snapshot.auth_guard;
        let (verdict, subject) = match (&credential, &snapshot.auth, &snapshot.negotiate) {
            (Some(c @ Credential::Negotiate(_)), _, Some(negotiate)) => {
                negotiate.verify(guard, &ctx.offload, client_ip, c).await
            }
            (Some(c), Some(auth), _) => auth.verify_naming(guard, &ctx.offload, client_ip, c).await,
            _ => (Verdict::Rejected, None),
        };
        if let Some(c) = &credential {
            // Who the accepted credential names (an OAuth token's subject, a Kerberos
            // principal), not a user name the client typed beside the token.
            trace.username = match subject {
                Some(s) if verdict == Verdict::Accepted => s.to_string(),
                _ => c.user().to_owned(),
            };
        }
        let mut challenges: Vec<(&str, &str)> = Vec::new();
        if snapshot.negotiate.is_some() {
            challenges.push(("Proxy-Authenticate", NEGOTIATE_CHALLENGE));
        }
        if let Some(auth) = &snapshot.auth {
            challenges.extend(auth.challenges().iter().map(|c| ("Proxy-Authenticate", *c)));
        }
        match verdict {
            Verdict::Accepted | Verdict::Rejected | Verdict::Unavailable => {}
            Verdict::Throttled => {
                tracing::debug!(client = %peer, "proxy authentication throttled");
                let msg = "too many failed authentications from this address; try again later";
                refuse(
                    client,
                    trace,
                    407,
                    "Proxy Authentication Required",
                    &challenges,
                    msg.to_owned(),
                )
                .await;
                return Next::Close;
            }
            Verdict::Busy => {
                let msg = "too many authentications in progress; try again".to_owned();
                refuse(
                    client,
                    trace,
                    503,
                    "Service Unavailable",
                    &[("Retry-After", "1")],
                    msg,
                )
                .await;
                return Next::Close;
            }
        }
        if verdict != Verdict::Accepted {
            let body_kind = http1::request_body_kind(&head).unwrap_or(BodyKind::UntilClose);
            let close = !matches!(body_kind, BodyKind::Empty | BodyKind::Length(0))
                || !head.wants_keep_alive();
            let (message, body) = if verdict == Verdict::Unavailable {
                (
                    "proxy authentication unavailable (the authentication service did not answer)",
                    "proxy authentication required: the authentication service is unavailable\n",
                )
            } else {
                (
                    "proxy authentication required",
                    "proxy authentication required\n",
                )
            };
            reply(
                client,
                407,
                "Proxy Authentication Required",
                &challenges,
                body,
                close,
            )
            .await;
            trace.fail(407, message);
            return if close { Next::Close } else { Next::KeepAlive };
        }
    }

    let target = match http1::parse_target(&head.method, &head.target) {
        Ok(t) => t,
        Err(e) => {
            refuse(client, trace, 400, "Bad Request", &[], e.to_string()).await;
            return Next::Close;
        }
    };
    match target {
        Target::Authority { host, port } if head.method.eq_ignore_ascii_case("CONNECT") => {
            trace.host = host_port_label(&host, port);
            let backend = match route(snapshot, &host) {
                Ok(b) => b.clone(),
                Err(e) => {
                    refuse_with(client, trace, &e).await;
                    return Next::Close;
                }
            };
            trace.backend = backend.name.clone();
            let connected = match dial(ctx, snapshot, &backend, &host, port).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(client = %peer, %host, port, error = %e, "CONNECT failed");
                    refuse_with(client, trace, &e).await;
                    return Next::Close;
                }
            };
            if tunnel::write_all(client, b"HTTP/1.1 200 Connection Established\r\n\r\n")
                .await
                .is_err()
            {
                trace.fail(200, "client went away");
                return Next::Close;
            }
            trace.status = 200;
            // The tunnel's trace is finished (counted and logged) when the tunnel closes.
            let tunnel_trace = std::mem::replace(trace, Trace::new(Protocol::Connect, "CONNECT"));
            Next::Tunnel(Box::new(TunnelJob {
                connected,
                label: tunnel_trace.host.clone(),
                backend,
                trace: tunnel_trace,
            }))
        }
        Target::Absolute {
            scheme,
            host,
            port,
            path_and_query,
        } if scheme == "http" => {
            // The strings only the request log reads are built only when it is on.
            if snapshot.request_log {
                trace.host = host_port_label(&host, port);
                trace.path = path_and_query.clone();
            }
            forward(
                ctx,
                snapshot,
                client,
                carry,
                head,
                peer,
                &host,
                port,
                path_and_query,
                trace,
                registered,
            )
            .await
        }
        _ => {
            let msg = "this is a proxy: send absolute-form http:// requests or CONNECT".to_owned();
            refuse(client, trace, 400, "Bad Request", &[], msg).await;
            Next::Close
        }
    }
}

fn route<'s>(snapshot: &'s Snapshot, host: &str) -> Result<&'s Arc<Backend>, DataplaneError> {
    snapshot
        .select(host)
        .map(|(_, b)| b)
        .ok_or_else(|| DataplaneError::NoRoute(host.to_owned()))
}

/// Forwards one absolute-form request; returns what the connection does next.
#[allow(clippy::too_many_arguments)]
async fn forward<'c>(
    ctx: &'c CoreContext,
    snapshot: &Snapshot,
    client: &RefCell<TcpStream>,
    carry: &mut Vec<u8>,
    head: RequestHead,
    peer: SocketAddr,
    host: &str,
    port: u16,
    path_and_query: String,
    trace: &mut Trace,
    registered: &mut Option<Registered<'c>>,
) -> Next {
    let request_body = match http1::request_body_kind(&head) {
        Ok(k) => k,
        Err(e) => {
            refuse(client, trace, 400, "Bad Request", &[], e.to_string()).await;
            return Next::Close;
        }
    };
    let client_keep_alive = head.wants_keep_alive();
    // Borrowed from the snapshot, which outlives the request: cloning the `Arc` wrote its
    // count, a line every core shares, twice per request.
    let backend: &Backend = match route(snapshot, host) {
        Ok(b) => b,
        Err(e) => {
            refuse_with(client, trace, &e).await;
            return Next::Close;
        }
    };
    if snapshot.request_log {
        trace.backend = backend.name.clone();
    }
    let live = registered.get_or_insert_with(|| {
        Registered::new(
            ctx,
            peer,
            host_port_label(host, port),
            backend.name.clone(),
            Protocol::Http,
        )
    });
    let conn = live.conn();
    let (up_before, down_before) = (conn.bytes_recv.load(Relaxed), conn.bytes_sent.load(Relaxed));
    // Each forwarded request counts as one connection through its backend while it runs.
    let bcore = backend.counters.core(ctx.core);
    bcore.opened();
    let request = Forwarded {
        head,
        peer,
        host,
        port,
        path_and_query,
        request_body,
        client_keep_alive,
    };
    let cached = match (&ctx.cache, &snapshot.cache) {
        (Some(store), Some(policy)) => policy.rules.find(host).map(|rule| (store, policy, rule)),
        _ => None,
    };
    let next = match cached {
        Some((store, policy, rule)) => {
            let call = crate::cache::serve::CacheCall {
                ctx,
                snapshot,
                store,
                policy,
                rule,
                client,
                backend,
                conn,
            };
            crate::cache::serve::exchange_cached(&call, carry, request, trace).await
        }
        None => exchange(ctx, snapshot, client, carry, request, trace, backend, conn).await,
    };
    bcore.closed();
    trace.up.set(conn.bytes_recv.load(Relaxed) - up_before);
    trace.down.set(conn.bytes_sent.load(Relaxed) - down_before);
    next
}

/// Counts the bytes of one forwarded request: per core, per backend and on the live connection.
pub(crate) struct ByteMeter<'a> {
    core: &'a crate::counters::CoreCounters,
    backend: Option<&'a crate::counters::CoreCounters>,
    conn: &'a crate::live::LiveConnection,
}

impl<'a> ByteMeter<'a> {
    pub(crate) fn new(
        ctx: &'a CoreContext,
        backend: Option<&'a Backend>,
        conn: &'a crate::live::LiveConnection,
    ) -> Self {
        ByteMeter {
            core: ctx.counters.core(ctx.core),
            backend: backend.map(|b| b.counters.core(ctx.core)),
            conn,
        }
    }

    /// Bytes received from the client.
    pub(crate) fn up(&self, n: u64) {
        self.core.add_received(n);
        if let Some(b) = self.backend {
            b.add_received(n);
        }
        self.conn.add_recv(n);
    }

    /// Bytes sent to the client.
    pub(crate) fn down(&self, n: u64) {
        self.core.add_sent(n);
        if let Some(b) = self.backend {
            b.add_sent(n);
        }
        self.conn.add_sent(n);
    }
}

/// Rewrites `head` for the next hop — origin-form target for an origin, absolute-form with the
/// backend's own `Proxy-Authorization` for an upstream HTTP proxy, Host from the absolute URI,
/// hop-by-hop headers (incl. the client's Proxy-Authorization) removed — and returns its bytes
/// and whether the client expects a `100 Continue`.
pub(crate) fn origin_request(
    head: &mut RequestHead,
    backend: &BackendKind,
    host: &str,
    port: u16,
    path_and_query: String,
    request_body: BodyKind,
) -> (Vec<u8>, bool) {
    http1::strip_hop_by_hop(&mut head.headers);
    http1::drop_content_length_if_chunked(&mut head.headers, request_body);
    // Answer `Expect: 100-continue` here: the body is relayed before the origin's response is
    // read, so waiting for the origin's 100 would stall the client until its own timeout.
    let expects_continue = head
        .header_str("expect")
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    if expects_continue {
        head.remove_header("expect");
    }
    let authority = origin_authority(host, port);
    head.target = match backend.http_upstream() {
        Some((_, _, authorization)) => {
            if let Some(value) = authorization {
                head.set_header("Proxy-Authorization", value.as_bytes());
            }
            format!("http://{authority}{path_and_query}")
        }
        None => path_and_query,
    };
    head.set_header("Host", authority.as_bytes());
    head.version_minor = 1;
    let mut out = Vec::with_capacity(512);
    http1::write_request_head(head, &mut out);
    (out, expects_continue)
}

/// `host` or `host:port` as the Host header and URLs write it (port 80 elided).
pub(crate) fn origin_authority(host: &str, port: u16) -> String {
    if port == 80 {
        http1::format_authority(host, 80)
            .trim_end_matches(":80")
            .to_owned()
    } else {
        http1::format_authority(host, port)
    }
}

/// The origin's answer to a forwarded request: its connection, the response head and body bytes
/// read along with the head.
pub(crate) struct Upstream {
    pub origin: RefCell<crate::backend_stream::BackendStream>,
    pub response: ResponseHead,
    pub carry: Vec<u8>,
    pub pool_key: PoolKey,
}

/// Whether the request line at the start of `head` names an idempotent method (RFC 9110
/// §9.2.2): only those are replayed on a fresh connection after a pooled one failed.
fn idempotent_request_line(head: &[u8]) -> bool {
    let method = head.split(|b| *b == b' ').next().unwrap_or_default();
    matches!(
        method,
        b"GET" | b"HEAD" | b"OPTIONS" | b"TRACE" | b"PUT" | b"DELETE"
    )
}

pub(crate) enum Sent {
    Answered(Box<Upstream>),
    /// No usable response: answer the client with this status.
    Failed(u16, &'static str, String),
    /// The client went away while interim responses were relayed.
    ClientGone,
}

/// Sends the request (head bytes `out`, then the client's body) to the origin over a pooled
/// connection or a new one, and reads the response head, relaying interim 1xx responses.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn send_request(
    ctx: &CoreContext,
    snapshot: &Snapshot,
    client: &RefCell<TcpStream>,
    carry: &mut Vec<u8>,
    out: &[u8],
    expects_continue: bool,
    backend: &Backend,
    host: &str,
    port: u16,
    request_body: BodyKind,
    meter: &ByteMeter<'_>,
    peer: SocketAddr,
) -> Sent {
    // Requests through an upstream HTTP proxy share its connections whatever the destination.
    let (pool_host, pool_port) = backend
        .kind
        .http_upstream()
        .map_or((host, port), |(proxy_host, proxy_port, _)| {
            (proxy_host, proxy_port)
        });
    let key = PoolKey {
        backend: backend.kind.clone(),
        host: pool_host.to_owned(),
        port: pool_port,
    };
    // A pooled connection may have been closed by the origin just now; an idempotent request
    // without a body is retried once on a fresh connection when that happens before any
    // response byte (RFC 9110 §9.2.2; a POST may have been acted on, so it is never replayed).
    let retryable = matches!(request_body, BodyKind::Empty | BodyKind::Length(0))
        && idempotent_request_line(out);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let pooled = origin_pool::take(&key, retryable && attempt == 1);
        let reused = pooled.is_some();
        let (stream, early) = match pooled {
            Some(s) => (s, Vec::new()),
            None => match dial_for_request(ctx, snapshot, backend, host, port).await {
                Ok(c) => (c.stream, c.early_data),
                Err(e) => {
                    tracing::debug!(client = %peer, %host, port, error = %e, "request failed");
                    let (status, reason) = e.http_status();
                    return Sent::Failed(status, reason, e.to_string());
                }
            },
        };
        // No per-read timer while the response head is awaited: `read_head` below bounds the
        // whole head with one timer (a second, per-read one cost a timer insertion and removal
        // per request); the body's reads get the read timeout once the head is in.
        let _ = stream.set_read_timeout(None);
        let _ = stream.set_write_timeout(Some(snapshot.timeouts.write));
        let origin = RefCell::new(stream);
        if tunnel::write_all(&origin, out).await.is_err() {
            if reused && attempt == 1 && retryable {
                continue;
            }
            let msg = format!("{host}:{port} closed the connection");
            return Sent::Failed(502, "Bad Gateway", msg);
        }
        if expects_continue
            && attempt == 1
            && !retryable
            && tunnel::write_all(client, b"HTTP/1.1 100 Continue\r\n\r\n")
                .await
                .is_err()
        {
            return Sent::ClientGone;
        }
        let count_up = |n: u64| meter.up(n);
        if let Err(e) = relay_body(client, &origin, carry, request_body, &count_up).await {
            tracing::debug!(client = %peer, error = %e, "request body relay failed");
            let msg = format!("relaying the request body failed: {e}");
            return Sent::Failed(502, "Bad Gateway", msg);
        }
        let mut origin_carry = early;
        let limits = HeadLimits::default();
        // Skip interim 1xx responses (relayed to the client as well).
        let response = loop {
            match read_head(
                &origin,
                &mut origin_carry,
                &limits,
                snapshot.timeouts.read,
                http1::parse_response_head,
            )
            .await
            {
                HeadRead::Head(r) if (100..200).contains(&r.status) && r.status != 101 => {
                    let mut interim = Vec::new();
                    http1::write_response_head(&r, &mut interim);
                    if tunnel::write_all(client, &interim).await.is_err() {
                        return Sent::ClientGone;
                    }
                }
                other => break other,
            }
        };
        return match response {
            // The client cannot fix the backend's credentials (and must not be asked for them).
            HeadRead::Head(response) if response.status == 407 && backend.kind.http_upstream().is_some() => {
                Sent::Failed(
                    502,
                    "Bad Gateway",
                    format!(
                        "upstream proxy {pool_host}:{pool_port} refused the backend's credentials (407)"
                    ),
                )
            }
            HeadRead::Head(response) => {
                let _ = origin.borrow().set_read_timeout(Some(snapshot.timeouts.read));
                Sent::Answered(Box::new(Upstream {
                    origin,
                    response,
                    carry: origin_carry,
                    pool_key: key,
                }))
            }
            // closed (or reset) before any response byte: the origin ended the idle
            // connection as it was reused
            HeadRead::Closed | HeadRead::Io if reused && attempt == 1 && retryable => continue,
            HeadRead::TimedOut => Sent::Failed(
                504,
                "Gateway Timeout",
                format!("{host}:{port} did not answer in time"),
            ),
            HeadRead::Bad(e) => Sent::Failed(
                502,
                "Bad Gateway",
                format!("invalid response from {host}:{port}: {e}"),
            ),
            HeadRead::Closed | HeadRead::Io => Sent::Failed(
                502,
                "Bad Gateway",
                format!("{host}:{port} closed the connection without a response"),
            ),
        };
    }
}

/// One absolute-form request on its way to the origin.
pub(crate) struct Forwarded<'h> {
    pub head: RequestHead,
    pub peer: SocketAddr,
    pub host: &'h str,
    pub port: u16,
    pub path_and_query: String,
    pub request_body: BodyKind,
    pub client_keep_alive: bool,
}

/// Sends the request to the origin (pooled connection or a new one) and relays the response.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn exchange(
    ctx: &CoreContext,
    snapshot: &Snapshot,
    client: &RefCell<TcpStream>,
    carry: &mut Vec<u8>,
    request: Forwarded<'_>,
    trace: &mut Trace,
    backend: &Backend,
    conn: &crate::live::LiveConnection,
) -> Next {
    let Forwarded {
        mut head,
        peer,
        host,
        port,
        path_and_query,
        request_body,
        client_keep_alive,
    } = request;
    let (out, expects_continue) = origin_request(
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
        expects_continue,
        backend,
        host,
        port,
        request_body,
        &meter,
        peer,
    )
    .await
    {
        Sent::Answered(u) => u,
        Sent::Failed(status, reason, message) => {
            refuse(client, trace, status, reason, &[], message).await;
            return Next::Close;
        }
        Sent::ClientGone => return Next::Close,
    };
    relay_response(
        client,
        *upstream,
        &head.method,
        host,
        port,
        client_keep_alive,
        trace,
        &meter,
        &[],
    )
    .await
    .0
}

/// Largest response body sent in one write with its head when both arrived together.
const INLINE_BODY_MAX: u64 = 16 * 1024;

/// Relays the origin's response to the client (head with `extra` headers added, then the body)
/// and pools the origin connection when it can carry another request. Also returns the body
/// bytes relayed.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn relay_response(
    client: &RefCell<TcpStream>,
    upstream: Upstream,
    method: &str,
    host: &str,
    port: u16,
    client_keep_alive: bool,
    trace: &mut Trace,
    meter: &ByteMeter<'_>,
    extra: &[(&str, &[u8])],
) -> (Next, u64) {
    let Upstream {
        origin,
        mut response,
        carry: mut origin_carry,
        pool_key,
    } = upstream;
    let response_body = match http1::response_body_kind(method, &response) {
        Ok(k) => k,
        Err(e) => {
            let msg = format!("invalid response from {host}:{port}: {e}");
            refuse(client, trace, 502, "Bad Gateway", &[], msg).await;
            return (Next::Close, 0);
        }
    };
    trace.status = response.status;
    let origin_keep_alive =
        response.wants_keep_alive() && !matches!(response_body, BodyKind::UntilClose);
    let keep_client = client_keep_alive && !matches!(response_body, BodyKind::UntilClose);
    http1::strip_hop_by_hop(&mut response.headers);
    http1::drop_content_length_if_chunked(&mut response.headers, response_body);
    response.version_minor = 1;
    response.set_header(
        "Connection",
        if keep_client { b"keep-alive" } else { b"close" },
    );
    for (name, value) in extra {
        response.set_header(name, value);
    }
    // A small body that arrived with the head leaves in the same write as the head: one send
    // and one segment towards the client instead of two (measured: 6 → 5 syscalls per 1 KiB
    // keep-alive request).
    let inline_body = match response_body {
        BodyKind::Length(n) if n <= INLINE_BODY_MAX && origin_carry.len() as u64 >= n => {
            Some(n as usize)
        }
        _ => None,
    };
    let mut out = Vec::with_capacity(512 + inline_body.unwrap_or(0));
    http1::write_response_head(&response, &mut out);
    let head_len = out.len() as u64;
    if let Some(n) = inline_body {
        out.extend_from_slice(&origin_carry[..n]);
        origin_carry.drain(..n);
    }
    if tunnel::write_all(client, &out).await.is_err() {
        return (Next::Close, 0);
    }
    meter.down(head_len);
    let body_bytes = Cell::new(0u64);
    let count_down = |n: u64| {
        meter.down(n);
        body_bytes.set(body_bytes.get() + n);
    };
    let relayed = match inline_body {
        Some(n) => {
            count_down(n as u64);
            Ok(BodyEnd::Complete)
        }
        None => {
            relay_body(
                &origin,
                client,
                &mut origin_carry,
                response_body,
                &count_down,
            )
            .await
        }
    };
    match relayed {
        Ok(BodyEnd::Complete) if origin_keep_alive && origin_carry.is_empty() => {
            let _ = origin.borrow().set_read_timeout(None);
            origin_pool::give(pool_key, origin.into_inner());
        }
        Ok(_) => {}
        Err(e) => {
            trace.error = format!("response body relay failed: {e}");
            return (Next::Close, body_bytes.get());
        }
    }
    let next = if keep_client {
        Next::KeepAlive
    } else {
        Next::Close
    };
    (next, body_bytes.get())
}

#[cfg(test)]
mod tests {
    use super::idempotent_request_line;

    #[test]
    fn only_idempotent_methods_are_replayed() {
        assert!(idempotent_request_line(b"GET /x HTTP/1.1\r\n"));
        assert!(idempotent_request_line(b"DELETE /x HTTP/1.1\r\n"));
        assert!(!idempotent_request_line(b"POST /x HTTP/1.1\r\n"));
        assert!(!idempotent_request_line(b"PATCH /x HTTP/1.1\r\n"));
        assert!(!idempotent_request_line(b"get /x HTTP/1.1\r\n"));
        assert!(!idempotent_request_line(b""));
    }
}
