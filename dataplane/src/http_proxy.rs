//! The HTTP/1.1 forward proxy on one client connection: absolute-form requests relayed to
//! origins over pooled keep-alive connections (many requests per client connection), CONNECT
//! tunnels, proxy authentication, rate limiting, and the error replies for bad input.

use crate::connector::{Connected, Dialer};
use crate::engine::CoreContext;
use crate::error::DataplaneError;
use crate::events::{Event, Protocol};
use crate::origin_pool::{self, PoolKey};
use crate::snapshot::{Backend, Snapshot};
use crate::tunnel::{self, Meter};
use glommio::net::TcpStream;
use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
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

fn host_port_label(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Per-connection bookkeeping for events.
struct Tracked {
    protocol: Protocol,
    host: String,
    backend: String,
}

pub(crate) async fn serve(stream: TcpStream, peer: SocketAddr, ctx: Rc<CoreContext>) {
    let client_ip = crate::access_control::canonical(peer.ip());
    let client = RefCell::new(stream);
    let mut carry: Vec<u8> = Vec::new();
    let mut first = true;
    let mut tracked: Option<Tracked> = None;
    let core = ctx.counters.core(ctx.core);
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
                reply(
                    &client,
                    408,
                    "Request Timeout",
                    &[],
                    "request head not received in time\n",
                    true,
                )
                .await;
                break;
            }
            HeadRead::Bad(e) => {
                let status = e.status();
                let reason = if status == 431 {
                    "Request Header Fields Too Large"
                } else {
                    "Bad Request"
                };
                reply(&client, status, reason, &[], &format!("{e}\n"), true).await;
                break;
            }
        };
        core.requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);

        if let Some(limiter) = &snapshot.request_limit {
            if !limiter.admit(client_ip) {
                reply(
                    &client,
                    429,
                    "Too Many Requests",
                    &[("Retry-After", "1")],
                    "rate limit exceeded\n",
                    true,
                )
                .await;
                break;
            }
        }
        if let Some(users) = &snapshot.users {
            let creds = head
                .header("proxy-authorization")
                .and_then(crate::credentials::parse_basic);
            let ok = match creds {
                Some((u, p)) => users.verify(&ctx.offload, &u, &p).await,
                None => false,
            };
            if !ok {
                let body_kind = http1::request_body_kind(&head).unwrap_or(BodyKind::UntilClose);
                let close = !matches!(body_kind, BodyKind::Empty) || !head.wants_keep_alive();
                reply(
                    &client,
                    407,
                    "Proxy Authentication Required",
                    &[("Proxy-Authenticate", "Basic realm=\"switchyard\"")],
                    "proxy authentication required\n",
                    close,
                )
                .await;
                if close {
                    break;
                }
                continue;
            }
        }

        let target = match http1::parse_target(&head.method, &head.target) {
            Ok(t) => t,
            Err(e) => {
                reply(&client, 400, "Bad Request", &[], &format!("{e}\n"), true).await;
                break;
            }
        };
        match target {
            Target::Authority { host, port } if head.method.eq_ignore_ascii_case("CONNECT") => {
                connect_tunnel(&ctx, &snapshot, client, carry, peer, &host, port).await;
                finish(&ctx, tracked, peer);
                return;
            }
            Target::Absolute {
                scheme,
                host,
                port,
                path_and_query,
            } if scheme == "http" => {
                let keep = forward(
                    &ctx,
                    &snapshot,
                    &client,
                    &mut carry,
                    head,
                    peer,
                    &host,
                    port,
                    path_and_query,
                    &mut tracked,
                )
                .await;
                if !keep {
                    break;
                }
            }
            _ => {
                reply(
                    &client,
                    400,
                    "Bad Request",
                    &[],
                    "this is a proxy: send absolute-form http:// requests or CONNECT\n",
                    true,
                )
                .await;
                break;
            }
        }
    }
    finish(&ctx, tracked, peer);
}

fn finish(ctx: &CoreContext, tracked: Option<Tracked>, peer: SocketAddr) {
    if let Some(t) = tracked {
        ctx.events.push(Event::ConnectionClose {
            protocol: t.protocol,
            host: t.host,
            backend: t.backend,
            client: peer,
            bytes_sent: 0,
            bytes_received: 0,
        });
    }
}

fn route<'s>(snapshot: &'s Snapshot, host: &str) -> Result<&'s Arc<Backend>, DataplaneError> {
    snapshot
        .select(host)
        .map(|(_, b)| b)
        .ok_or_else(|| DataplaneError::NoRoute(host.to_owned()))
}

async fn dial(
    ctx: &CoreContext,
    snapshot: &Snapshot,
    backend: &Backend,
    host: &str,
    port: u16,
) -> Result<Connected, DataplaneError> {
    let dialer = Dialer {
        resolver: &ctx.resolver,
        offload: &ctx.offload,
        timeout: snapshot.timeouts.connect,
    };
    let started = std::time::Instant::now();
    let result = dialer.connect(&backend.kind, host, port).await;
    let counters = backend.counters.core(ctx.core);
    match &result {
        Ok(_) => counters.connected_in(started.elapsed()),
        Err(_) => {
            counters
                .errors
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    result
}

async fn fail_reply(client: &RefCell<TcpStream>, e: &DataplaneError) {
    let (status, reason) = e.http_status();
    reply(client, status, reason, &[], &format!("{e}\n"), true).await;
}

async fn connect_tunnel(
    ctx: &CoreContext,
    snapshot: &Snapshot,
    client: RefCell<TcpStream>,
    carry: Vec<u8>,
    peer: SocketAddr,
    host: &str,
    port: u16,
) {
    let backend = match route(snapshot, host) {
        Ok(b) => b.clone(),
        Err(e) => return fail_reply(&client, &e).await,
    };
    let connected = match dial(ctx, snapshot, &backend, host, port).await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(client = %peer, %host, port, error = %e, "CONNECT failed");
            return fail_reply(&client, &e).await;
        }
    };
    let label = host_port_label(host, port);
    if tunnel::write_all(&client, b"HTTP/1.1 200 Connection Established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    run_tunnel(
        ctx,
        snapshot,
        client,
        connected,
        carry,
        peer,
        Protocol::Connect,
        &label,
        &backend,
    )
    .await;
}

/// Relays a CONNECT or SOCKS5 tunnel and reports it.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_tunnel(
    ctx: &CoreContext,
    snapshot: &Snapshot,
    client: RefCell<TcpStream>,
    connected: Connected,
    client_early: Vec<u8>,
    peer: SocketAddr,
    protocol: Protocol,
    label: &str,
    backend: &Backend,
) {
    let upstream = RefCell::new(connected.stream);
    let core = ctx.counters.core(ctx.core);
    let bcore = backend.counters.core(ctx.core);
    bcore.opened();
    ctx.events.push(Event::ConnectionNew {
        protocol,
        host: label.to_owned(),
        backend: backend.name.clone(),
        client: peer,
    });
    let _ = client.borrow_mut().set_read_timeout(None);
    let mut ok = true;
    if !client_early.is_empty() {
        ok &= tunnel::write_all(&upstream, &client_early).await.is_ok();
    }
    if ok && !connected.early_data.is_empty() {
        ok &= tunnel::write_all(&client, &connected.early_data)
            .await
            .is_ok();
    }
    let client_ip = crate::access_control::canonical(peer.ip());
    let relayed = if ok {
        tunnel::relay(
            &client,
            &upstream,
            Meter {
                counters: [core, bcore],
                upload: true,
                limiter: snapshot.upload_limit.as_ref(),
                client: client_ip,
            },
            Meter {
                counters: [core, bcore],
                upload: false,
                limiter: snapshot.download_limit.as_ref(),
                client: client_ip,
            },
            snapshot.timeouts.idle,
        )
        .await
    } else {
        tunnel::Relayed::default()
    };
    bcore.closed();
    ctx.events.push(Event::ConnectionClose {
        protocol,
        host: label.to_owned(),
        backend: backend.name.clone(),
        client: peer,
        bytes_sent: relayed.download,
        bytes_received: relayed.upload,
    });
}

/// Forwards one absolute-form request; returns whether the client connection stays open.
#[allow(clippy::too_many_arguments)]
async fn forward(
    ctx: &CoreContext,
    snapshot: &Snapshot,
    client: &RefCell<TcpStream>,
    carry: &mut Vec<u8>,
    mut head: RequestHead,
    peer: SocketAddr,
    host: &str,
    port: u16,
    path_and_query: String,
    tracked: &mut Option<Tracked>,
) -> bool {
    let request_body = match http1::request_body_kind(&head) {
        Ok(k) => k,
        Err(e) => {
            reply(client, 400, "Bad Request", &[], &format!("{e}\n"), true).await;
            return false;
        }
    };
    let client_keep_alive = head.wants_keep_alive();
    let backend = match route(snapshot, host) {
        Ok(b) => b.clone(),
        Err(e) => {
            fail_reply(client, &e).await;
            return false;
        }
    };
    if tracked.is_none() {
        let t = Tracked {
            protocol: Protocol::Http,
            host: host_port_label(host, port),
            backend: backend.name.clone(),
        };
        ctx.events.push(Event::ConnectionNew {
            protocol: t.protocol,
            host: t.host.clone(),
            backend: t.backend.clone(),
            client: peer,
        });
        *tracked = Some(t);
    }

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
        host_port_label(host, port)
            .trim_end_matches(":80")
            .to_owned()
    } else {
        host_port_label(host, port)
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
    };
    let count_down = |n: u64| {
        core.add_sent(n);
        bcore.add_sent(n);
    };

    // A pooled connection may have been closed by the origin just now; a request without a
    // body is retried once on a fresh connection when that happens before any response byte.
    let mut attempt = 0;
    let (origin, response, mut origin_carry) = loop {
        attempt += 1;
        let pooled = origin_pool::take(&key);
        let reused = pooled.is_some();
        let (stream, early) = match pooled {
            Some(s) => (s, Vec::new()),
            None => match dial(ctx, snapshot, &backend, host, port).await {
                Ok(c) => (c.stream, c.early_data),
                Err(e) => {
                    tracing::debug!(client = %peer, %host, port, error = %e, "request failed");
                    fail_reply(client, &e).await;
                    return false;
                }
            },
        };
        let _ = stream.set_read_timeout(Some(snapshot.timeouts.read));
        let _ = stream.set_write_timeout(Some(snapshot.timeouts.write));
        let origin = RefCell::new(stream);
        if tunnel::write_all(&origin, &out).await.is_err() {
            if reused && attempt == 1 && matches!(request_body, BodyKind::Empty) {
                continue;
            }
            fail_reply(
                client,
                &DataplaneError::Io(io::ErrorKind::BrokenPipe.into()),
            )
            .await;
            return false;
        }
        if expects_continue
            && attempt == 1
            && !matches!(request_body, BodyKind::Empty)
            && tunnel::write_all(client, b"HTTP/1.1 100 Continue\r\n\r\n")
                .await
                .is_err()
        {
            return false;
        }
        match relay_body(client, &origin, carry, request_body, &count_up).await {
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(client = %peer, error = %e, "request body relay failed");
                fail_reply(client, &DataplaneError::Io(e)).await;
                return false;
            }
        }
        let mut origin_carry = early;
        let limits = HeadLimits::default();
        // Skip interim 1xx responses (100 Continue is relayed to the client as well).
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
                        return false;
                    }
                }
                other => break other,
            }
        };
        match response {
            HeadRead::Head(r) => break (origin, r, origin_carry),
            HeadRead::Closed
                if reused && attempt == 1 && matches!(request_body, BodyKind::Empty) =>
            {
                continue
            }
            HeadRead::TimedOut => {
                reply(
                    client,
                    504,
                    "Gateway Timeout",
                    &[],
                    &format!("{host}:{port} did not answer in time\n"),
                    true,
                )
                .await;
                return false;
            }
            HeadRead::Bad(e) => {
                reply(
                    client,
                    502,
                    "Bad Gateway",
                    &[],
                    &format!("invalid response from {host}:{port}: {e}\n"),
                    true,
                )
                .await;
                return false;
            }
            HeadRead::Closed | HeadRead::Io => {
                reply(
                    client,
                    502,
                    "Bad Gateway",
                    &[],
                    &format!("{host}:{port} closed the connection without a response\n"),
                    true,
                )
                .await;
                return false;
            }
        }
    };
    let mut response: ResponseHead = response;
    let response_body = match http1::response_body_kind(&head.method, &response) {
        Ok(k) => k,
        Err(e) => {
            reply(
                client,
                502,
                "Bad Gateway",
                &[],
                &format!("invalid response from {host}:{port}: {e}\n"),
                true,
            )
            .await;
            return false;
        }
    };
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
    http1::write_response_head(&response, &mut out);
    if tunnel::write_all(client, &out).await.is_err() {
        return false;
    }
    count_down(out.len() as u64);
    let end = relay_body(
        &origin,
        client,
        &mut origin_carry,
        response_body,
        &count_down,
    )
    .await;
    match end {
        Ok(BodyEnd::Complete) if origin_keep_alive && origin_carry.is_empty() => {
            let _ = origin.borrow().set_read_timeout(None);
            origin_pool::give(key, origin.into_inner());
        }
        Ok(_) => {}
        Err(_) => return false,
    }
    keep_client
}
