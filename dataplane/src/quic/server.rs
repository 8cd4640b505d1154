//! The server side of the QUIC transport, on the core that owns the endpoint: accepts
//! connections (access control first), checks each connection's hello (token or proxy
//! credentials, verified like a CONNECT's through the data plane's offload), then serves every
//! other stream as one proxied TCP flow routed exactly like a CONNECT (routes, backends, rate
//! limit, request log, counters, live connections) and relays QUIC datagrams as UDP flows.

use super::admission::{self, Admission, Holding};
use super::driver::{Admit, Driver, DriverEvent};
use super::{udp::UdpPort, QuicListener};
use crate::credentials::{Credential, Verdict};
use crate::engine::{ConnectionSlot, CoreContext};
use crate::error::DataplaneError;
use crate::events::Protocol;
use crate::trace::Trace;
use crate::tunnel;
use crate::wireguard::flow::{FlowStream, Wake};
use event_listener::Event;
use quinn_proto::ConnectionHandle;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use switchyard_proto::quic_wire::{self, Status};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AuthState {
    Pending,
    Accepted,
    Refused,
}

/// Flow streams a connection may open before its hello (stream 0) is accepted: what a client
/// resuming with 0-RTT sends at once (its hello and the headers of the flows it had waiting),
/// not the thousands of streams the transport allows, each waiting in a task of its own.
pub const MAX_STREAMS_BEFORE_HELLO: usize = 32;

/// Whether a connection's hello was accepted; flows wait for the verdict.
struct ConnAuth {
    state: Cell<AuthState>,
    decided: Event,
    /// The user the connection authenticated as (request log), empty for a token.
    user: RefCell<String>,
    /// Flow streams opened while the hello was pending.
    held: Cell<usize>,
}

impl ConnAuth {
    fn new() -> Self {
        Self {
            state: Cell::new(AuthState::Pending),
            decided: Event::new(),
            user: RefCell::new(String::new()),
            held: Cell::new(0),
        }
    }

    /// Whether a new flow stream may wait for the hello's verdict (always once accepted).
    fn hold_before_hello(&self) -> bool {
        match self.state.get() {
            AuthState::Accepted => true,
            AuthState::Refused => false,
            AuthState::Pending => {
                let held = self.held.get();
                self.held.set(held + 1);
                held < MAX_STREAMS_BEFORE_HELLO
            }
        }
    }

    fn decide(&self, state: AuthState) {
        self.state.set(state);
        self.decided.notify(usize::MAX);
    }

    async fn accepted(&self) -> bool {
        loop {
            match self.state.get() {
                AuthState::Accepted => return true,
                AuthState::Refused => return false,
                AuthState::Pending => {}
            }
            let listener = self.decided.listen();
            if self.state.get() != AuthState::Pending {
                continue;
            }
            listener.await;
        }
    }
}

/// QUIC transport parameters of the server: room for many concurrent flows per connection.
pub(super) fn transport() -> Arc<quinn_proto::TransportConfig> {
    let mut t = quinn_proto::TransportConfig::default();
    t.max_concurrent_bidi_streams(quinn_proto::VarInt::from_u32(super::MAX_STREAMS));
    t.max_concurrent_uni_streams(quinn_proto::VarInt::from_u32(0));
    t.max_idle_timeout(Some(quinn_proto::IdleTimeout::from(
        quinn_proto::VarInt::from_u32(super::IDLE_TIMEOUT_MS),
    )));
    t.datagram_receive_buffer_size(Some(1 << 20));
    t.stream_receive_window(quinn_proto::VarInt::from_u32(2 << 20));
    t.receive_window(quinn_proto::VarInt::from_u32(16 << 20));
    t.send_window(16 << 20);
    Arc::new(t)
}

/// Runs the listener's endpoint on this core until the core ends.
pub(crate) async fn serve(ctx: Rc<CoreContext>, listener: Arc<QuicListener>) {
    let port = match listener.socket.try_clone().and_then(UdpPort::from_socket) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "QUIC listener: cannot use the UDP socket");
            return;
        }
    };
    let mut config = quinn_proto::ServerConfig::with_crypto(listener.crypto.clone());
    config.transport_config(transport());
    let admit_ctx = ctx.clone();
    let admit_listener = listener.clone();
    let admit: Admit = Box::new(move |peer: SocketAddr, holding: &Holding| {
        if !admit_ctx.snapshot.load().access.allows(peer.ip()) {
            tracing::debug!(client = %peer, "QUIC connection refused by access control");
            return Admission::Refuse("access control");
        }
        let stats = &admit_listener.stats;
        let decision = admission::decide(holding, &admit_listener.limits);
        match decision {
            Admission::Retry => {
                stats.retries.fetch_add(1, Ordering::Relaxed);
            }
            Admission::Refuse(why) => {
                stats.refused_by_limits.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(client = %peer, reason = why, "QUIC connection refused");
            }
            Admission::Accept => {}
        }
        decision
    });
    let driver = Driver::new(
        port,
        Some(Arc::new(config)),
        Some(admit),
        Arc::new(Wake::default()),
    );
    tracing::info!(core = ctx.core, listen = ?driver.local_addr(), "QUIC endpoint running");
    let _receiver = glommio::spawn_local(driver.clone().receive());
    let udp = super::datagram_relay::Relays::default();
    let mut conns: HashMap<ConnectionHandle, (Rc<ConnAuth>, SocketAddr)> = HashMap::new();
    let stats = &listener.stats;
    loop {
        let listen = driver.wake.listen();
        driver.wake.take();
        for event in driver.turn() {
            match event {
                DriverEvent::Accepted { conn, peer } => {
                    stats.connections_total.fetch_add(1, Ordering::Relaxed);
                    stats.connections_active.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(client = %peer, "QUIC connection accepted");
                    conns.insert(conn, (Rc::new(ConnAuth::new()), peer));
                }
                DriverEvent::Stream {
                    conn,
                    id,
                    flow,
                    peer,
                } => {
                    let Some((auth, _)) = conns.get(&conn) else {
                        continue;
                    };
                    let auth = auth.clone();
                    if id.index() != 0 && !auth.hold_before_hello() {
                        // dropping the flow resets the stream: no task, no state for it
                        stats
                            .streams_refused_before_hello
                            .fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    if id.index() == 0 {
                        glommio::spawn_local(hello(
                            ctx.clone(),
                            driver.clone(),
                            listener.clone(),
                            conn,
                            auth,
                            flow,
                            peer,
                        ))
                        .detach();
                    } else {
                        stats.streams_total.fetch_add(1, Ordering::Relaxed);
                        glommio::spawn_local(serve_flow(ctx.clone(), auth, flow, peer)).detach();
                    }
                }
                DriverEvent::Lost { conn, reason } => {
                    if let Some((auth, peer)) = conns.remove(&conn) {
                        stats.connections_active.fetch_sub(1, Ordering::Relaxed);
                        // flows still waiting for the hello give up
                        if auth.state.get() == AuthState::Pending {
                            auth.decide(AuthState::Refused);
                        }
                        tracing::debug!(client = %peer, %reason, "QUIC connection closed");
                    }
                    udp.forget(conn);
                }
                DriverEvent::Datagram { conn, data } => {
                    let Some((auth, peer)) = conns.get(&conn) else {
                        continue;
                    };
                    if auth.state.get() != AuthState::Accepted {
                        continue; // nothing is relayed before the hello was accepted
                    }
                    stats.datagrams_in.fetch_add(1, Ordering::Relaxed);
                    udp.relay(&ctx, &driver, conn, *peer, &data).await;
                }
                DriverEvent::Connected(_) => {}
            }
        }
        driver.flush().await;
        if driver.busy() {
            glommio::yield_if_needed().await;
            continue;
        }
        let wait = driver
            .next_timeout()
            .map(|t| t.saturating_duration_since(std::time::Instant::now()))
            .unwrap_or(Duration::from_secs(1));
        futures_lite::future::or(listen, glommio::timer::sleep(wait)).await;
        glommio::yield_if_needed().await;
    }
}

/// Reads one message from a flow within `timeout`; the message and the bytes after it.
pub(super) async fn read_message<T>(
    flow: &RefCell<FlowStream>,
    parse: impl Fn(&[u8]) -> Result<Option<(T, usize)>, quic_wire::WireError>,
    timeout: Duration,
) -> Result<(T, Vec<u8>), String> {
    let read = async {
        let mut carry = Vec::new();
        loop {
            if let Some((v, used)) = parse(&carry).map_err(|e| e.to_string())? {
                carry.drain(..used);
                return Ok((v, carry));
            }
            if carry.len() > 1024 {
                return Err("message too long".to_owned());
            }
            let (buf, n) = tunnel::read_pooled(flow).await.map_err(|e| e.to_string())?;
            carry.extend_from_slice(buf.get(..n).unwrap_or_default());
            crate::buffer_pool::give(buf);
            if n == 0 {
                return Err("stream ended before the message".to_owned());
            }
        }
    };
    futures_lite::future::or(read, async {
        glommio::timer::sleep(timeout).await;
        Err("timed out".to_owned())
    })
    .await
}

async fn reply(flow: &RefCell<FlowStream>, status: Status, message: &str) -> bool {
    let mut out = Vec::with_capacity(2 + message.len());
    quic_wire::encode_reply(status, message, &mut out);
    tunnel::write_all(flow, &out).await.is_ok()
}

/// Constant-time comparison of a presented token with the configured one.
fn token_matches(presented: &str, configured: &str) -> bool {
    let (a, b) = (presented.as_bytes(), configured.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Checks the hello on stream 0 and decides the connection.
async fn hello(
    ctx: Rc<CoreContext>,
    driver: Rc<Driver>,
    listener: Arc<QuicListener>,
    conn: ConnectionHandle,
    auth: Rc<ConnAuth>,
    flow: FlowStream,
    peer: SocketAddr,
) {
    let snapshot = ctx.current_snapshot();
    let flow = RefCell::new(flow);
    let hello = match read_message(&flow, quic_wire::parse_hello, snapshot.timeouts.header).await {
        Ok((h, _)) => h,
        Err(e) => {
            tracing::debug!(client = %peer, error = %e, "QUIC hello refused");
            auth.decide(AuthState::Refused);
            driver.close(conn, quic_wire::CLOSE_BAD_HELLO, &format!("bad hello: {e}"));
            return;
        }
    };
    let client_ip = crate::access_control::canonical(peer.ip());
    let token_ok = listener
        .token
        .as_deref()
        .is_some_and(|t| token_matches(&hello.token, t));
    let verdict: Result<(), String> = if token_ok {
        Ok(())
    } else if !hello.token.is_empty() && listener.token.is_some() {
        Err("wrong token".into())
    } else if snapshot.requires_auth() || listener.token.is_some() {
        if hello.username.is_empty() {
            Err("a token or proxy credentials are required".into())
        } else {
            let credential = Credential::Basic {
                user: hello.username.clone(),
                password: hello.password.clone(),
            };
            let (verdict, subject) = match &snapshot.auth {
                Some(a) => {
                    a.verify_naming(&snapshot.auth_guard, &ctx.offload, client_ip, &credential)
                        .await
                }
                None => (Verdict::Rejected, None),
            };
            if verdict == Verdict::Accepted {
                // An OAuth token's subject rather than the user name typed beside it.
                *auth.user.borrow_mut() =
                    subject.map_or_else(|| hello.username.clone(), |s| s.to_string());
                Ok(())
            } else {
                Err(format!("credentials of {} refused", hello.username))
            }
        }
    } else {
        Ok(())
    };
    match verdict {
        Ok(()) => {
            auth.decide(AuthState::Accepted);
            reply(&flow, Status::Ok, "").await;
            flow.borrow().shutdown_write();
        }
        Err(why) => {
            tracing::info!(client = %peer, reason = %why, "QUIC client refused");
            auth.decide(AuthState::Refused);
            listener.stats.refused.fetch_add(1, Ordering::Relaxed);
            reply(&flow, Status::AuthRefused, &why).await;
            driver.close(
                conn,
                quic_wire::CLOSE_AUTH_REFUSED,
                &format!("authentication refused: {why}"),
            );
        }
    }
}

/// The reply status for a failed connect.
fn status_of(e: &DataplaneError) -> Status {
    match e {
        DataplaneError::Refused { .. }
        | DataplaneError::UpstreamProxy { refused: true, .. }
        | DataplaneError::OriginRefused { .. } => Status::Refused,
        DataplaneError::ConnectTimeout { .. } => Status::Timeout,
        DataplaneError::NoRoute(_) => Status::NotAllowed,
        _ => Status::Failed,
    }
}

/// One stream = one proxied TCP flow, routed like a CONNECT.
async fn serve_flow(ctx: Rc<CoreContext>, auth: Rc<ConnAuth>, flow: FlowStream, peer: SocketAddr) {
    let snapshot = ctx.current_snapshot();
    let flow = RefCell::new(flow);
    let timeout = snapshot.timeouts.header;
    let accepted = futures_lite::future::or(auth.accepted(), async {
        glommio::timer::sleep(timeout).await;
        false
    })
    .await;
    if !accepted {
        return;
    }
    // an authenticated flow is a connection for `server.max_connections`, as a TCP accept is
    let Some(_slot) = ConnectionSlot::open(&ctx, &snapshot, peer) else {
        reply(&flow, Status::Failed, "connection limit reached").await;
        return;
    };
    let (open, carry) = match read_message(&flow, quic_wire::parse_open, timeout).await {
        Ok(v) => v,
        Err(e) => {
            tracing::debug!(client = %peer, error = %e, "QUIC stream header refused");
            reply(&flow, Status::Malformed, &e).await;
            return;
        }
    };
    let client_ip = crate::access_control::canonical(peer.ip());
    let label = crate::http_proxy::host_port_label(&open.host, open.port);
    let mut trace = Trace::new(Protocol::Quic, "CONNECT");
    trace.host = label.clone();
    trace.username = auth.user.borrow().clone();
    if let Some(limiter) = &snapshot.request_limit {
        if !limiter.admit(client_ip) {
            reply(&flow, Status::NotAllowed, "rate limit exceeded").await;
            trace.fail(429, "rate limit exceeded");
            trace.finish(&ctx, &snapshot, client_ip);
            return;
        }
    }
    let Some((_, backend)) = snapshot.select(&open.host) else {
        let why = format!("no route for {}", open.host);
        reply(&flow, Status::NotAllowed, &why).await;
        trace.fail(403, why);
        trace.finish(&ctx, &snapshot, client_ip);
        return;
    };
    trace.backend = backend.name.clone();
    let connected = match crate::proxied::dial(&ctx, &snapshot, backend, &open.host, open.port)
        .await
    {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(client = %peer, target = %label, error = %e, "QUIC flow connect failed");
            reply(&flow, status_of(&e), &e.to_string()).await;
            trace.fail(e.http_status().0, e.to_string());
            trace.finish(&ctx, &snapshot, client_ip);
            return;
        }
    };
    if !reply(&flow, Status::Ok, "").await {
        return;
    }
    trace.status = 200;
    // counted once, by the ConnectionSlot taken above (held until the tunnel ends)
    crate::proxied::run_tunnel(
        &ctx,
        &snapshot,
        flow,
        connected,
        carry,
        peer,
        Protocol::Quic,
        &label,
        backend,
        trace,
        None,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(token_matches("secret", "secret"));
        assert!(!token_matches("secre", "secret"));
        assert!(!token_matches("secreT", "secret"));
        assert!(!token_matches("", "secret"));
    }
}
