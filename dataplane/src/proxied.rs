//! What every proxied connection shares, whichever protocol brought it: connecting through a
//! backend (with latency, error and passive-health accounting), registering in the live table
//! with connection events, and relaying a tunnel (CONNECT and SOCKS5) to its end.

use crate::connector::{Connected, Dialer};
use crate::engine::CoreContext;
use crate::error::DataplaneError;
use crate::events::{Event, Protocol};
use crate::live::LiveGuard;
use crate::snapshot::{Backend, BackendKind, Snapshot};
use crate::trace::Trace;
use crate::tunnel::{self, Meter};
use glommio::net::TcpStream;
use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// The live-table entry and events of one client connection once it is routed somewhere.
pub(crate) struct Registered<'a> {
    guard: LiveGuard<'a>,
    /// Set when connection events are wanted at open: the close event goes with the open one.
    events: Option<&'a crate::events::EventQueue>,
    /// The core whose lane of the event queue the events go into.
    core: usize,
}

impl<'a> Registered<'a> {
    pub fn new(
        ctx: &'a CoreContext,
        peer: SocketAddr,
        host: String,
        backend: String,
        protocol: Protocol,
    ) -> Self {
        let events = ctx.events.wants_connection_events().then_some(&*ctx.events);
        if let Some(events) = events {
            events.push_from(
                ctx.core,
                Event::ConnectionNew {
                    protocol,
                    host: host.clone(),
                    backend: backend.clone(),
                    client: peer,
                },
            );
        }
        Self {
            guard: ctx.live.register(ctx.core, peer, host, backend, protocol),
            events,
            core: ctx.core,
        }
    }

    pub fn conn(&self) -> &crate::live::LiveConnection {
        &self.guard.conn
    }

    /// The entry itself, for tasks that outlive a borrow of this registration.
    pub fn shared(&self) -> std::sync::Arc<crate::live::LiveConnection> {
        self.guard.conn.clone()
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let Some(events) = self.events else { return };
        let c = &self.guard.conn;
        events.push_from(
            self.core,
            Event::ConnectionClose {
                protocol: c.protocol,
                host: c.host.clone(),
                backend: c.backend.clone(),
                client: c.client,
                bytes_sent: c.bytes_sent.load(std::sync::atomic::Ordering::Relaxed),
                bytes_received: c.bytes_recv.load(std::sync::atomic::Ordering::Relaxed),
            },
        );
    }
}

/// Connects through `backend`, recording latency, errors and passive health.
pub(crate) async fn dial(
    ctx: &CoreContext,
    snapshot: &Snapshot,
    backend: &Backend,
    host: &str,
    port: u16,
) -> Result<Connected, DataplaneError> {
    dial_within(ctx, backend, host, port, snapshot.timeouts.connect).await
}

/// The connection a plain-HTTP (absolute-form) request to `host:port` is written to: the
/// upstream proxy itself for an `httpproxy` backend, the origin (or a tunnel) otherwise.
pub(crate) async fn dial_for_request(
    ctx: &CoreContext,
    snapshot: &Snapshot,
    backend: &Backend,
    host: &str,
    port: u16,
) -> Result<Connected, DataplaneError> {
    let dialer = dialer(ctx, snapshot.timeouts.connect);
    let result = dialer.connect_for_request(&backend.kind, host, port);
    account(ctx, backend, result).await
}

/// [`dial`] with an explicit timeout (backend tests choose their own).
pub(crate) async fn dial_within(
    ctx: &CoreContext,
    backend: &Backend,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<Connected, DataplaneError> {
    let dialer = dialer(ctx, timeout);
    account(ctx, backend, dialer.connect(&backend.kind, host, port)).await
}

/// A connect through `backend` that counts towards nothing (active health checks: the checker
/// judges the outcome itself).
pub(crate) async fn probe(
    ctx: &CoreContext,
    backend: &Backend,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<Connected, DataplaneError> {
    start_tunnel(ctx, backend);
    dialer(ctx, timeout)
        .connect(&backend.kind, host, port)
        .await
}

/// Starts a tunnel backend's tunnel on its first use.
fn start_tunnel(ctx: &CoreContext, backend: &Backend) {
    match &backend.kind {
        BackendKind::Wireguard(tunnel) => tunnel.0.ensure_started(ctx, &backend.health),
        BackendKind::Quic(server) => server.0.ensure_started(ctx, &backend.health),
        _ => {}
    }
}

fn dialer(ctx: &CoreContext, timeout: Duration) -> Dialer<'_> {
    Dialer {
        resolver: &ctx.resolver,
        offload: &ctx.offload,
        timeout,
    }
}

/// Runs a connect through `backend`, recording its latency, errors and passive health.
async fn account(
    ctx: &CoreContext,
    backend: &Backend,
    connect: impl std::future::Future<Output = Result<Connected, DataplaneError>>,
) -> Result<Connected, DataplaneError> {
    start_tunnel(ctx, backend);
    let started = std::time::Instant::now();
    let result = connect.await;
    let counters = backend.counters.core(ctx.core);
    match &result {
        Ok(_) => counters.connected_in(started.elapsed()),
        Err(_) => {
            counters
                .errors
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    // Only failures that say something about the backend's own path count against its health:
    // a direct backend is never blamed for an origin, and an upstream proxy that relays an
    // origin's refusal is working.
    let judged = match (&backend.kind, &result) {
        (_, Ok(_)) => Some(true),
        (BackendKind::Direct, Err(_)) => None,
        (_, Err(DataplaneError::UpstreamProxy { refused: true, .. })) => None,
        // the proxy reported on the destination: it works
        (_, Err(DataplaneError::OriginRefused { .. } | DataplaneError::Unreachable { .. })) => None,
        (_, Err(e)) if e.side() == crate::error::Side::Upstream => Some(false),
        _ => None,
    };
    if let Some(success) = judged {
        if let Some(healthy) = backend.health.record(success) {
            tracing::warn!(backend = %backend.name, healthy, "backend health changed");
            ctx.events.push_from(
                ctx.core,
                Event::BackendHealth {
                    name: backend.name.clone(),
                    healthy,
                },
            );
        }
    }
    result
}

/// The client side of a tunnel: a TCP connection, or a QUIC stream's flow.
pub(crate) trait ClientStream:
    futures_lite::io::AsyncRead
    + futures_lite::io::AsyncWrite
    + crate::backend_stream::HalfClose
    + crate::backend_stream::KernelSocket
    + Unpin
{
    /// The handshake's read timeout no longer applies once the tunnel relays.
    fn clear_read_timeout(&self);
}

impl ClientStream for TcpStream {
    fn clear_read_timeout(&self) {
        let _ = self.set_read_timeout(None);
    }
}

impl ClientStream for crate::wireguard::FlowStream {
    // the relay's idle timer covers a flow
    fn clear_read_timeout(&self) {}
}

/// A tunnel's backend for a task of its own: found again by its place in the snapshot the task
/// holds (no reference count that every core writes), or held when it is not in it.
pub(crate) enum TunnelBackend {
    InSnapshot(usize),
    Held(Arc<Backend>),
}

impl TunnelBackend {
    pub fn of(snapshot: &Snapshot, backend: &Arc<Backend>) -> Self {
        match snapshot
            .backends
            .iter()
            .position(|b| Arc::ptr_eq(b, backend))
        {
            Some(i) => Self::InSnapshot(i),
            None => Self::Held(backend.clone()),
        }
    }
}

/// What a tunnel task starts from. It reaches the task in one box, emptied into the task's
/// locals on its first poll: an async fn keeps its arguments for its whole life beside the
/// locals they are moved into, so passing these by value would store them twice (three times
/// through [`spawn_tunnel`]'s own task) in every idle tunnel.
pub(crate) struct TunnelStart<C> {
    pub client: RefCell<C>,
    pub connected: Connected,
    /// Bytes the client sent after its request, before the tunnel was up.
    pub client_early: Vec<u8>,
    pub peer: SocketAddr,
    pub protocol: Protocol,
    /// `host:port` for the live-connection table.
    pub label: String,
    pub trace: Trace,
    /// A VPN flow that bypassed the TUN (the socket redirect): its bytes are counted in the
    /// VPN path's totals here, as the pump counts those of the flows it carries.
    pub vpn_tally: Option<Arc<crate::tun::TunStats>>,
}

/// Starts [`run_tunnel`] as a task of its own and returns at once, so the connection's task
/// (sized for every request and handshake it might have handled) ends and frees its state: an
/// idle tunnel keeps only the relay's. The tunnel task takes over the connection's place in
/// the active count.
// Rc<Arc<_>>: the core's per-connection snapshot handle (see `CoreContext::current_snapshot`).
#[allow(clippy::too_many_arguments, clippy::redundant_allocation)]
pub(crate) fn spawn_tunnel(
    ctx: &Rc<CoreContext>,
    snapshot: &Rc<Arc<Snapshot>>,
    client: RefCell<TcpStream>,
    connected: Connected,
    client_early: Vec<u8>,
    peer: SocketAddr,
    protocol: Protocol,
    label: String,
    backend: TunnelBackend,
    trace: Trace,
) {
    let slot = crate::engine::ConnectionSlot::take_over(ctx);
    let (ctx, snapshot) = (ctx.clone(), snapshot.clone());
    let start = Box::new(TunnelStart {
        client,
        connected,
        client_early,
        peer,
        protocol,
        label,
        trace,
        vpn_tally: None,
    });
    glommio::spawn_local(async move {
        let _slot = slot;
        let backend = match &backend {
            TunnelBackend::InSnapshot(i) => snapshot.backends.get(*i),
            TunnelBackend::Held(b) => Some(b),
        };
        if let Some(backend) = backend {
            tunnel_task(&ctx, &snapshot, backend, start).await;
        }
    })
    .detach();
}

/// Relays a CONNECT, SOCKS5 or QUIC tunnel, reports it, and finishes its trace.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_tunnel<'a, C: ClientStream + 'a>(
    ctx: &'a CoreContext,
    snapshot: &'a Snapshot,
    client: RefCell<C>,
    connected: Connected,
    client_early: Vec<u8>,
    peer: SocketAddr,
    protocol: Protocol,
    label: &str,
    backend: &'a Backend,
    trace: Trace,
    vpn_tally: Option<Arc<crate::tun::TunStats>>,
) -> impl std::future::Future<Output = ()> + 'a {
    let start = Box::new(TunnelStart {
        client,
        connected,
        client_early,
        peer,
        protocol,
        label: label.to_owned(),
        trace,
        vpn_tally,
    });
    tunnel_task(ctx, snapshot, backend, start)
}

/// Moves the value out and frees the box now: `*start` in [`tunnel_task`] would keep the
/// emptied allocation until the task ends.
#[allow(clippy::boxed_local)] // taking the box is the point: it is freed on return
fn unbox<T>(b: Box<T>) -> T {
    *b
}

async fn tunnel_task<C: ClientStream>(
    ctx: &CoreContext,
    snapshot: &Snapshot,
    backend: &Backend,
    start: Box<TunnelStart<C>>,
) {
    let TunnelStart {
        client,
        connected,
        client_early,
        peer,
        protocol,
        label,
        trace,
        vpn_tally,
    } = unbox(start);
    let upstream = RefCell::new(connected.stream);
    let core = ctx.counters.core(ctx.core);
    let bcore = backend.counters.core(ctx.core);
    bcore.opened();
    let registered = Registered::new(ctx, peer, label, backend.name.clone(), protocol);
    client.borrow().clear_read_timeout();
    let client_ip = crate::access_control::canonical(peer.ip());
    let live = registered.conn();
    let meter = |upload: bool| Meter {
        counters: [core, bcore],
        live: Some(live),
        upload,
        limiter: if upload {
            snapshot.upload_limit.as_deref()
        } else {
            snapshot.download_limit.as_deref()
        },
        client: client_ip,
        vpn_tally: vpn_tally.as_deref(),
    };
    let (up, down) = (meter(true), meter(false));
    let mut ok = true;
    // bytes that arrived with the handshake count like relayed ones (an origin that speaks first
    // often has its first bytes in the same segment as the proxy's CONNECT answer)
    if !client_early.is_empty() {
        ok &= tunnel::write_all(&upstream, &client_early).await.is_ok();
        if ok {
            up.count(client_early.len() as u64);
        }
    }
    if ok && !connected.early_data.is_empty() {
        ok &= tunnel::write_all(&client, &connected.early_data)
            .await
            .is_ok();
        if ok {
            down.count(connected.early_data.len() as u64);
        }
    }
    if ok {
        tunnel::relay(&client, &upstream, up, down, snapshot.timeouts.idle).await;
    }
    // No await from here on: the relay's last direction left its FIN to the close(2) of
    // `client` and `upstream`, which drop when this function returns.
    bcore.closed();
    trace
        .up
        .set(live.bytes_recv.load(std::sync::atomic::Ordering::Relaxed));
    trace
        .down
        .set(live.bytes_sent.load(std::sync::atomic::Ordering::Relaxed));
    drop(registered);
    trace.finish(ctx, snapshot, client_ip);
}
