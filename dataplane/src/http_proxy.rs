//! The HTTP/1.1 forward proxy on one client connection: absolute-form requests relayed to
//! origins over pooled keep-alive connections (many requests per client connection), CONNECT
//! tunnels, proxy authentication, rate limiting, and the error replies for bad input.

use crate::connector::Connected;
use crate::engine::CoreContext;
use crate::error::DataplaneError;
use crate::events::Protocol;
use crate::origin_pool::{self, PoolKey};
use crate::proxied::{dial, run_tunnel, Registered};
use crate::snapshot::{Backend, Snapshot};
use crate::trace::Trace;
use crate::tunnel;
use glommio::net::TcpStream;
use std::cell::RefCell;
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
enum HeadRead<T> {
    Head(T),
    /// Clean EOF before any byte of a new message.
    Closed,
    TimedOut,
    Bad(HeadError),
    Io,
}

async fn with_timeout<T>(d: Duration, fut: impl std::future::Future<Output = T>) -> Option<T> {
    futures_lite::future::or(async { Some(fut.await) }, async {
        glommio::timer::sleep(d).await;
        None
    })
    .await
}

/// Reads until `parse` yields a head; `carry` holds bytes read beyond it on return.
async fn read_head<T>(
    from: &RefCell<TcpStream>,
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
enum BodyEnd {
    /// Delimited body complete; the source connection can carry another message.
    Complete,
    /// Body ran to EOF (close-delimited); the source is finished.
    Eof,
}

/// Relays one body of `kind` from `from` (whose already-read bytes are in `carry`) to `to`.
/// Bytes beyond the body stay in `carry` (a pipelined next message).
async fn relay_body(
    from: &RefCell<TcpStream>,
    to: &RefCell<TcpStream>,
    carry: &mut Vec<u8>,
    kind: BodyKind,
    count: &dyn Fn(u64),
) -> io::Result<BodyEnd> {
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

async fn reply(
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
async fn refuse(
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
    refuse(client, trace, status, reason, &[], e.to_string()).await;
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
        let snapshot = ctx.snapshot.load_full();
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
        let mut trace = Trace::new(
            if connect {
                Protocol::Connect
            } else {
                Protocol::Http
            },
            &head.method,
        );
        trace.url = head.target.clone();
        trace.user_agent = head.header_str("user-agent").unwrap_or_default().to_owned();
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
                run_tunnel(
                    &ctx,
                    &snapshot,
                    client,
                    job.connected,
                    carry,
                    peer,
                    Protocol::Connect,
                    &job.label,
                    &job.backend,
                    job.trace,
                )
                .await;
                return;
            }
        }
    }
}

/// What the connection does after a request.
enum Next {
    KeepAlive,
    Close,
    Tunnel(Box<TunnelJob>),
}

struct TunnelJob {
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
    if let Some(users) = &snapshot.users {
        let creds = head
            .header("proxy-authorization")
            .and_then(crate::credentials::parse_basic);
        let ok = match &creds {
            Some((u, p)) => users.verify(&ctx.offload, u, p).await,
            None => false,
        };
        if let Some((u, _)) = creds {
            trace.username = u;
        }
        if !ok {
            let body_kind = http1::request_body_kind(&head).unwrap_or(BodyKind::UntilClose);
            let close = !matches!(body_kind, BodyKind::Empty | BodyKind::Length(0))
                || !head.wants_keep_alive();
            reply(
                client,
                407,
                "Proxy Authentication Required",
                &[("Proxy-Authenticate", "Basic realm=\"switchyard\"")],
                "proxy authentication required\n",
                close,
            )
            .await;
            trace.fail(407, "proxy authentication required");
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
            trace.host = host_port_label(&host, port);
            trace.path = path_and_query.clone();
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
    let backend = match route(snapshot, host) {
        Ok(b) => b.clone(),
        Err(e) => {
            refuse_with(client, trace, &e).await;
            return Next::Close;
        }
    };
    trace.backend = backend.name.clone();
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
    let next = exchange(
        ctx,
        snapshot,
        client,
        carry,
        head,
        peer,
        host,
        port,
        path_and_query,
        trace,
        &backend,
        conn,
        request_body,
        client_keep_alive,
    )
    .await;
    bcore.closed();
    trace.up.set(conn.bytes_recv.load(Relaxed) - up_before);
    trace.down.set(conn.bytes_sent.load(Relaxed) - down_before);
    next
}

/// Sends the request to the origin (pooled connection or a new one) and relays the response.
#[allow(clippy::too_many_arguments)]
async fn exchange(
    ctx: &CoreContext,
    snapshot: &Snapshot,
    client: &RefCell<TcpStream>,
    carry: &mut Vec<u8>,
    mut head: RequestHead,
    peer: SocketAddr,
    host: &str,
    port: u16,
    path_and_query: String,
    trace: &mut Trace,
    backend: &Backend,
    conn: &crate::live::LiveConnection,
    request_body: BodyKind,
    client_keep_alive: bool,
) -> Next {
    // Rewrite the head for the origin: origin-form target, Host from the absolute URI,
    // hop-by-hop headers (incl. Proxy-Authorization) removed.
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
    head.target = path_and_query;
    let authority = if port == 80 {
        http1::format_authority(host, 80)
            .trim_end_matches(":80")
            .to_owned()
    } else {
        http1::format_authority(host, port)
    };
    head.set_header("Host", authority.as_bytes());
    head.version_minor = 1;
    let mut out = Vec::with_capacity(512);
    http1::write_request_head(&head, &mut out);

    let key = PoolKey {
        backend: backend.kind.clone(),
        host: host.to_owned(),
        port,
    };
    let core = ctx.counters.core(ctx.core);
    let bcore = backend.counters.core(ctx.core);
    let count_up = |n: u64| {
        core.add_received(n);
        bcore.add_received(n);
        conn.add_recv(n);
    };
    let count_down = |n: u64| {
        core.add_sent(n);
        bcore.add_sent(n);
        conn.add_sent(n);
    };

    // A pooled connection may have been closed by the origin just now; a request without a
    // body is retried once on a fresh connection when that happens before any response byte.
    let retryable = matches!(request_body, BodyKind::Empty | BodyKind::Length(0));
    let mut attempt = 0;
    let failure: Option<(u16, &str, String)>;
    let (origin, response, mut origin_carry) = 'attempts: loop {
        attempt += 1;
        let pooled = origin_pool::take(&key);
        let reused = pooled.is_some();
        let (stream, early) = match pooled {
            Some(s) => (s, Vec::new()),
            None => match dial(ctx, snapshot, backend, host, port).await {
                Ok(c) => (c.stream, c.early_data),
                Err(e) => {
                    tracing::debug!(client = %peer, %host, port, error = %e, "request failed");
                    let (status, reason) = e.http_status();
                    failure = Some((status, reason, e.to_string()));
                    break 'attempts (None, None, Vec::new());
                }
            },
        };
        let _ = stream.set_read_timeout(Some(snapshot.timeouts.read));
        let _ = stream.set_write_timeout(Some(snapshot.timeouts.write));
        let origin = RefCell::new(stream);
        if tunnel::write_all(&origin, &out).await.is_err() {
            if reused && attempt == 1 && retryable {
                continue;
            }
            failure = Some((
                502,
                "Bad Gateway",
                format!("{host}:{port} closed the connection"),
            ));
            break (None, None, Vec::new());
        }
        if expects_continue
            && attempt == 1
            && !retryable
            && tunnel::write_all(client, b"HTTP/1.1 100 Continue\r\n\r\n")
                .await
                .is_err()
        {
            return Next::Close;
        }
        if let Err(e) = relay_body(client, &origin, carry, request_body, &count_up).await {
            tracing::debug!(client = %peer, error = %e, "request body relay failed");
            failure = Some((
                502,
                "Bad Gateway",
                format!("relaying the request body failed: {e}"),
            ));
            break (None, None, Vec::new());
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
                        return Next::Close;
                    }
                }
                other => break other,
            }
        };
        match response {
            HeadRead::Head(r) => {
                failure = None;
                break (Some(origin), Some(r), origin_carry);
            }
            HeadRead::Closed if reused && attempt == 1 && retryable => continue,
            HeadRead::TimedOut => {
                failure = Some((
                    504,
                    "Gateway Timeout",
                    format!("{host}:{port} did not answer in time"),
                ));
                break (None, None, Vec::new());
            }
            HeadRead::Bad(e) => {
                failure = Some((
                    502,
                    "Bad Gateway",
                    format!("invalid response from {host}:{port}: {e}"),
                ));
                break (None, None, Vec::new());
            }
            HeadRead::Closed | HeadRead::Io => {
                failure = Some((
                    502,
                    "Bad Gateway",
                    format!("{host}:{port} closed the connection without a response"),
                ));
                break (None, None, Vec::new());
            }
        }
    };
    let (Some(origin), Some(mut response)) = (origin, response) else {
        let (status, reason, message) =
            failure.unwrap_or((502, "Bad Gateway", "no response".into()));
        refuse(client, trace, status, reason, &[], message).await;
        return Next::Close;
    };
    let response: &mut ResponseHead = &mut response;
    let response_body = match http1::response_body_kind(&head.method, response) {
        Ok(k) => k,
        Err(e) => {
            let msg = format!("invalid response from {host}:{port}: {e}");
            refuse(client, trace, 502, "Bad Gateway", &[], msg).await;
            return Next::Close;
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
    let mut out = Vec::with_capacity(512);
    http1::write_response_head(response, &mut out);
    if tunnel::write_all(client, &out).await.is_err() {
        return Next::Close;
    }
    count_down(out.len() as u64);
    match relay_body(
        &origin,
        client,
        &mut origin_carry,
        response_body,
        &count_down,
    )
    .await
    {
        Ok(BodyEnd::Complete) if origin_keep_alive && origin_carry.is_empty() => {
            let _ = origin.borrow().set_read_timeout(None);
            origin_pool::give(key, origin.into_inner());
        }
        Ok(_) => {}
        Err(e) => {
            trace.error = format!("response body relay failed: {e}");
            return Next::Close;
        }
    }
    if keep_client {
        Next::KeepAlive
    } else {
        Next::Close
    }
}
