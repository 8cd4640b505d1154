//! The client side: a `protocol: QUIC` server of the client's server list as a backend. The
//! first core that needs it runs its connection ([`QuicBackend::ensure_started`]); every
//! proxied TCP flow, on any core, asks that core for a stream, writes the stream header and
//! waits for the server's answer; SOCKS5 UDP associations get a datagram port whose datagrams
//! travel as QUIC datagrams of one flow id.
//!
//! The connection is made when the first flow needs it and again after it was lost; the rustls
//! session cache lives as long as the backend, so a reconnect resumes with 0-RTT. A handshake
//! that gets no answer within [`HANDSHAKE_TIMEOUT`] means UDP does not get through: with a
//! `fallback` configured, flows then go to the server's TCP proxy for [`UDP_BLOCKED_FOR`]
//! (logged once per change) before QUIC is tried again. A wrong certificate (pin mismatch) or a
//! refused token never falls back: those are errors to show, not network conditions.
//!
//! Migration: the socket is bound to the unspecified address, so when the client's address
//! changes the kernel sends from the new one and quinn-proto's server side validates the new
//! path while the streams go on. When sends keep failing (the old address is gone from a
//! socket the kernel tied to it), the socket is replaced by a new one and quinn-proto is told
//! the local address changed.

use super::driver::{Driver, DriverEvent};
use super::udp::UdpPort;
use crate::connector::{Connected, Dialer};
use crate::error::DataplaneError;
use crate::offload::Offload;
use crate::resolver::Resolver;
use crate::snapshot::{BackendHealth, BackendKind};
use crate::wireguard::datagrams::{self, DatagramEnds, DatagramPort};
use crate::wireguard::flow::{FlowStream, Wake};
use crate::wireguard::Owner;
use bytes::Bytes;
use parking_lot::Mutex;
use quinn_proto::ConnectionHandle;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_proto::quic_wire::{self, Status};
use switchyard_proto::socks5::TargetAddr;

/// A handshake unanswered for this long: UDP to the server is taken as blocked.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long flows use the fallback before QUIC is tried again.
pub const UDP_BLOCKED_FOR: Duration = Duration::from_secs(30);
/// Open requests waiting for the owner core; more fail at once as overload.
const MAX_PENDING_OPENS: usize = 1024;
/// The owner's longest sleep (heartbeat, handshake timer).
const TICK: Duration = Duration::from_millis(250);
/// Keep-alive of an idle connection (well inside the server's idle timeout).
const KEEP_ALIVE: Duration = Duration::from_secs(10);
/// After the server refused this client (pin, token, credentials), flows fail at once for this
/// long instead of each starting a handshake that will be refused again.
const REFUSED_RETRY: Duration = Duration::from_secs(5);
/// Consecutive send failures after which the socket is replaced.
const SEND_FAILURES_TO_REBIND: u32 = 3;

/// A QUIC server entry, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuicSettings {
    /// `host:port` of the server's `server.quic.listen`.
    pub address: String,
    /// SHA-256 of the server certificate.
    pub pin: [u8; 32],
    pub token: String,
    pub username: String,
    pub password: String,
    /// The server's TCP proxy, used while UDP is blocked.
    pub fallback: Option<Box<BackendKind>>,
}

/// What the owner core is asked for.
enum Request {
    Open(futures::channel::oneshot::Sender<Result<FlowStream, DataplaneError>>),
    Datagrams(futures::channel::oneshot::Sender<DatagramPort>),
}

/// The connection's state for the API and the log.
#[derive(Debug, Default)]
pub struct QuicClientStatus {
    pub connected: AtomicBool,
    /// Why the last connection attempt failed or the connection ended.
    pub last_error: Mutex<Option<String>>,
    /// Until when flows use the fallback (UDP blocked).
    blocked_until: Mutex<Option<Instant>>,
    /// Whether the last connection resumed with 0-RTT.
    pub resumed_0rtt: AtomicBool,
    /// The connection's smoothed round-trip time, microseconds.
    rtt_us: std::sync::atomic::AtomicU64,
}

impl QuicClientStatus {
    /// The connection's round-trip time (the list's latency).
    pub fn rtt(&self) -> Duration {
        Duration::from_micros(self.rtt_us.load(Ordering::Relaxed))
    }

    fn blocked(&self) -> bool {
        self.blocked_until
            .lock()
            .is_some_and(|until| Instant::now() < until)
    }
}

pub struct QuicBackend {
    pub name: String,
    pub settings: QuicSettings,
    pub status: Arc<QuicClientStatus>,
    requests: async_channel::Sender<Request>,
    requests_rx: async_channel::Receiver<Request>,
    started: AtomicBool,
    owner: Arc<Owner>,
    wake: Arc<Wake>,
}

impl std::fmt::Debug for QuicBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicBackend")
            .field("name", &self.name)
            .field("address", &self.settings.address)
            .finish_non_exhaustive()
    }
}

impl QuicBackend {
    pub fn new(name: &str, settings: QuicSettings) -> Self {
        let (requests, requests_rx) = async_channel::bounded(MAX_PENDING_OPENS);
        Self {
            name: name.to_owned(),
            settings,
            status: Arc::new(QuicClientStatus::default()),
            requests,
            requests_rx,
            started: AtomicBool::new(false),
            owner: Arc::new(Owner::new()),
            wake: Arc::new(Wake::default()),
        }
    }

    /// Starts the connection's owner on the calling core unless a live core runs it already.
    pub(crate) fn ensure_started(
        &self,
        ctx: &crate::engine::CoreContext,
        health: &Arc<BackendHealth>,
    ) {
        let Some((generation, take_over)) = self.owner.claim(&self.started) else {
            return;
        };
        if take_over {
            tracing::warn!(backend = %self.name, core = ctx.core,
                "the core running the QUIC connection stopped; starting it again here");
        }
        let runner = Runner {
            owner: self.owner.clone(),
            generation,
            name: self.name.clone(),
            settings: self.settings.clone(),
            requests: self.requests_rx.clone(),
            wake: self.wake.clone(),
            status: self.status.clone(),
            health: health.clone(),
            resolver: ctx.resolver.clone(),
            offload: ctx.offload.clone(),
        };
        glommio::spawn_local(runner.run()).detach();
    }

    /// Opens a TCP flow to `host:port` through the server (or its fallback while UDP is
    /// blocked), within `deadline`.
    pub(crate) async fn open(
        &self,
        dialer: &Dialer<'_>,
        host: &str,
        port: u16,
        deadline: Instant,
    ) -> Result<Connected, DataplaneError> {
        if let Some(fallback) = self.settings.fallback.as_deref() {
            if self.status.blocked() {
                tracing::debug!(backend = %self.name, %host, "UDP blocked: flow through the fallback");
                return Box::pin(dialer.connect(fallback, host, port)).await;
            }
        }
        let result = self.open_quic(host, port, deadline).await;
        match (&result, self.settings.fallback.as_deref()) {
            (
                Err(DataplaneError::Quic {
                    unanswered: true, ..
                }),
                Some(fallback),
            ) if Instant::now() < deadline => Box::pin(dialer.connect(fallback, host, port)).await,
            _ => result,
        }
    }

    async fn open_quic(
        &self,
        host: &str,
        port: u16,
        deadline: Instant,
    ) -> Result<Connected, DataplaneError> {
        let fail = |reason: String| DataplaneError::Quic {
            server: self.settings.address.clone(),
            reason,
            unanswered: false,
        };
        let mut header = Vec::with_capacity(4 + host.len());
        quic_wire::encode_open(
            &quic_wire::Open {
                host: host.to_owned(),
                port,
            },
            &mut header,
        )
        .map_err(|e| fail(e.to_string()))?;
        let (reply, answer) = futures::channel::oneshot::channel();
        self.requests
            .try_send(Request::Open(reply))
            .map_err(|_| DataplaneError::Overloaded("QUIC stream request queue full"))?;
        self.wake.notify();
        let target = crate::http_proxy::host_port_label(host, port);
        let timed_out = || DataplaneError::ConnectTimeout {
            target: target.clone(),
        };
        let opened = within(deadline, async {
            answer
                .await
                .unwrap_or_else(|_| Err(fail("the QUIC connection's core stopped".into())))
        })
        .await
        .ok_or_else(timed_out)??;
        let flow = RefCell::new(opened);
        let exchange = async {
            crate::tunnel::write_all(&flow, &header)
                .await
                .map_err(|e| fail(format!("stream closed: {e}")))?;
            let left = deadline.saturating_duration_since(Instant::now());
            super::server::read_message(&flow, quic_wire::parse_reply, left)
                .await
                .map_err(|e| fail(format!("no answer to the stream header: {e}")))
        };
        let (answer, early_data) = within(deadline, exchange).await.ok_or_else(timed_out)??;
        match answer.status {
            Status::Ok => Ok(Connected {
                stream: crate::backend_stream::BackendStream::Quic(flow.into_inner()),
                early_data,
            }),
            Status::Timeout => Err(DataplaneError::ConnectTimeout { target }),
            Status::Refused => Err(DataplaneError::OriginRefused {
                proxy: self.settings.address.clone(),
                target,
            }),
            _ => Err(DataplaneError::UpstreamProxy {
                proxy: self.settings.address.clone(),
                reason: format!("QUIC server refused {target}: {}", answer.message),
                refused: false,
            }),
        }
    }

    /// A UDP port whose datagrams travel as QUIC datagrams (the connection must have been
    /// started, see [`Self::ensure_started`]).
    pub(crate) async fn open_datagrams(&self) -> Result<DatagramPort, DataplaneError> {
        let (reply, answer) = futures::channel::oneshot::channel();
        self.requests
            .try_send(Request::Datagrams(reply))
            .map_err(|_| DataplaneError::Overloaded("QUIC request queue full"))?;
        self.wake.notify();
        let deadline = Instant::now() + Duration::from_secs(5);
        match within(deadline, answer).await {
            Some(Ok(port)) => Ok(port),
            _ => Err(DataplaneError::Quic {
                server: self.settings.address.clone(),
                reason: "the QUIC connection's core did not answer".into(),
                unanswered: false,
            }),
        }
    }
}

async fn within<T>(deadline: Instant, fut: impl std::future::Future<Output = T>) -> Option<T> {
    let left = deadline.saturating_duration_since(Instant::now());
    futures_lite::future::or(async { Some(fut.await) }, async {
        glommio::timer::sleep(left).await;
        None
    })
    .await
}

struct Runner {
    owner: Arc<Owner>,
    generation: u64,
    name: String,
    settings: QuicSettings,
    requests: async_channel::Receiver<Request>,
    wake: Arc<Wake>,
    status: Arc<QuicClientStatus>,
    health: Arc<BackendHealth>,
    resolver: Resolver,
    offload: Offload,
}

/// The connection while it exists.
struct Current {
    ch: ConnectionHandle,
    started: Instant,
    connected: bool,
    /// Stream 0 carries the hello: opened before any flow (at once with 0-RTT, else as soon
    /// as the handshake gives stream credit).
    hello: Option<glommio::Task<()>>,
}

fn transport() -> Arc<quinn_proto::TransportConfig> {
    let mut t = quinn_proto::TransportConfig::default();
    t.max_concurrent_bidi_streams(quinn_proto::VarInt::from_u32(0));
    t.max_concurrent_uni_streams(quinn_proto::VarInt::from_u32(0));
    t.keep_alive_interval(Some(KEEP_ALIVE));
    t.max_idle_timeout(Some(quinn_proto::IdleTimeout::from(
        quinn_proto::VarInt::from_u32(super::IDLE_TIMEOUT_MS),
    )));
    t.datagram_receive_buffer_size(Some(1 << 20));
    t.stream_receive_window(quinn_proto::VarInt::from_u32(2 << 20));
    t.receive_window(quinn_proto::VarInt::from_u32(16 << 20));
    t.send_window(16 << 20);
    Arc::new(t)
}

/// Words for why a connection ended, as a user should read them.
fn describe_loss(reason: &quinn_proto::ConnectionError, connected: bool) -> String {
    use quinn_proto::ConnectionError as E;
    match reason {
        E::ApplicationClosed(close)
            if close.error_code.into_inner() == u64::from(quic_wire::CLOSE_AUTH_REFUSED) =>
        {
            format!(
                "the server refused this client: {}",
                String::from_utf8_lossy(&close.reason)
            )
        }
        E::ApplicationClosed(close) => format!(
            "closed by the server (code {}): {}",
            close.error_code,
            String::from_utf8_lossy(&close.reason)
        ),
        E::TransportError(e)
            if e.to_string().contains("does not match the pinned")
                || e.to_string().contains("certificate") =>
        {
            format!("TLS handshake failed (certificate pin): {e}")
        }
        E::TimedOut if !connected => "no answer to the QUIC handshake (UDP blocked?)".to_owned(),
        other => other.to_string(),
    }
}

fn any_addr(for_remote: SocketAddr) -> SocketAddr {
    if for_remote.is_ipv4() {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
    } else {
        SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)
    }
}

impl Runner {
    fn fail_all(
        waiting: &mut VecDeque<
            futures::channel::oneshot::Sender<Result<FlowStream, DataplaneError>>,
        >,
        error: impl Fn() -> DataplaneError,
    ) {
        for reply in waiting.drain(..) {
            let _ = reply.send(Err(error()));
        }
    }

    fn record(&self, healthy: bool, error: Option<String>) {
        self.status.connected.store(healthy, Ordering::Release);
        if let Some(e) = error {
            *self.status.last_error.lock() = Some(e);
        }
        self.health.set(healthy);
    }

    async fn run(self) {
        let crypto = match self.settings_crypto() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(backend = %self.name, error = %e, "QUIC client TLS");
                self.record(false, Some(e));
                return;
            }
        };
        let mut config = quinn_proto::ClientConfig::new(crypto);
        config.transport_config(transport());
        let (host, port) = match self.settings.address.rsplit_once(':') {
            Some((h, p)) => (
                h.trim_start_matches('[').trim_end_matches(']').to_owned(),
                p.parse::<u16>().unwrap_or(0),
            ),
            None => (self.settings.address.clone(), 0),
        };
        let mut driver: Option<Rc<Driver>> = None;
        let mut receiver: Option<glommio::Task<()>> = None;
        let mut current: Option<Current> = None;
        let mut waiting = VecDeque::new();
        let mut udp: HashMap<u32, DatagramEnds> = HashMap::new();
        let mut next_flow: u32 = 1;
        let mut send_failures_seen = 0u64;
        let mut refused: Option<(Instant, String)> = None;
        loop {
            if !self.owner.beat(self.generation) {
                tracing::info!(backend = %self.name, "a newer core runs this QUIC connection; stopping here");
                return;
            }
            let listen = self.wake.listen();
            self.wake.take();
            while let Ok(request) = self.requests.try_recv() {
                match request {
                    Request::Open(reply) => waiting.push_back(reply),
                    Request::Datagrams(reply) => {
                        let (ends, port) = datagrams::pair(self.wake.clone());
                        udp.insert(next_flow, ends);
                        next_flow = next_flow.wrapping_add(1).max(1);
                        let _ = reply.send(port);
                    }
                }
            }
            waiting.retain(|r| !r.is_canceled());
            udp.retain(|_, ends| !ends.from_client.is_closed() || !ends.from_client.is_empty());

            if let Some((until, why)) = &refused {
                if Instant::now() < *until {
                    let server = self.settings.address.clone();
                    Self::fail_all(&mut waiting, || DataplaneError::Quic {
                        server: server.clone(),
                        reason: why.clone(),
                        unanswered: false,
                    });
                } else {
                    refused = None;
                }
            }
            if current.is_none() && (!waiting.is_empty() || !udp.is_empty()) {
                match self
                    .connect(&mut driver, &mut receiver, &config, &host, port)
                    .await
                {
                    Ok(c) => current = Some(c),
                    Err(e) => {
                        tracing::warn!(backend = %self.name, error = %e, "QUIC connection failed");
                        self.record(false, Some(e.clone()));
                        let server = self.settings.address.clone();
                        Self::fail_all(&mut waiting, || DataplaneError::Quic {
                            server: server.clone(),
                            reason: e.clone(),
                            unanswered: false,
                        });
                    }
                }
            }
            let Some(d) = driver.clone() else {
                futures_lite::future::or(listen, glommio::timer::sleep(TICK)).await;
                continue;
            };
            if let Some(c) = &current {
                if !c.connected && c.started.elapsed() > HANDSHAKE_TIMEOUT {
                    let why = format!(
                        "no answer to the QUIC handshake with {} within {}s (UDP blocked?)",
                        self.settings.address,
                        HANDSHAKE_TIMEOUT.as_secs()
                    );
                    d.close(c.ch, quic_wire::CLOSE_NORMAL, "handshake timeout");
                    current = None;
                    self.udp_blocked(&why);
                    let server = self.settings.address.clone();
                    Self::fail_all(&mut waiting, || DataplaneError::Quic {
                        server: server.clone(),
                        reason: why.clone(),
                        unanswered: true,
                    });
                }
            }
            if let Some(c) = current.as_mut().filter(|c| c.hello.is_none()) {
                if let Some((_, flow)) = d.open_stream(c.ch) {
                    let hello = quic_wire::Hello {
                        token: self.settings.token.clone(),
                        username: self.settings.username.clone(),
                        password: self.settings.password.clone(),
                    };
                    c.hello = Some(glommio::spawn_local(send_hello(
                        flow,
                        hello,
                        self.status.clone(),
                        self.name.clone(),
                    )));
                }
            }
            if let Some(c) = current.as_ref().filter(|c| c.hello.is_some()) {
                while !waiting.is_empty() {
                    let Some((_, flow)) = d.open_stream(c.ch) else {
                        break;
                    };
                    if let Some(reply) = waiting.pop_front() {
                        let _ = reply.send(Ok(flow));
                    }
                }
            }
            for event in d.turn() {
                match event {
                    DriverEvent::Connected(ch) if current.as_ref().is_some_and(|c| c.ch == ch) => {
                        if let Some(c) = current.as_mut() {
                            c.connected = true;
                        }
                        let resumed = d.accepted_0rtt(ch);
                        self.status.resumed_0rtt.store(resumed, Ordering::Release);
                        *self.status.blocked_until.lock() = None;
                        tracing::info!(backend = %self.name, server = %self.settings.address,
                            zero_rtt = resumed, "QUIC connection established");
                        self.record(true, None);
                    }
                    DriverEvent::Lost { conn, reason }
                        if current.as_ref().is_some_and(|c| c.ch == conn) =>
                    {
                        let connected = current.as_ref().is_some_and(|c| c.connected);
                        let why = describe_loss(&reason, connected);
                        let unanswered =
                            !connected && matches!(reason, quinn_proto::ConnectionError::TimedOut);
                        tracing::warn!(backend = %self.name, server = %self.settings.address, reason = %why, "QUIC connection ended");
                        if unanswered {
                            self.udp_blocked(&why);
                        } else {
                            self.record(false, Some(why.clone()));
                        }
                        let auth_refused = matches!(&reason,
                            quinn_proto::ConnectionError::ApplicationClosed(c)
                                if c.error_code.into_inner() == u64::from(quic_wire::CLOSE_AUTH_REFUSED));
                        let tls_refused = !connected
                            && matches!(reason, quinn_proto::ConnectionError::TransportError(_));
                        if auth_refused || tls_refused {
                            refused = Some((Instant::now() + REFUSED_RETRY, why.clone()));
                        }
                        current = None;
                        let server = self.settings.address.clone();
                        Self::fail_all(&mut waiting, || DataplaneError::Quic {
                            server: server.clone(),
                            reason: why.clone(),
                            unanswered,
                        });
                    }
                    DriverEvent::Datagram { data, .. } => {
                        let Ok((flow, addr, at)) = quic_wire::parse_datagram(&data) else {
                            continue;
                        };
                        let (Some(ends), TargetAddr::Ip(from)) = (udp.get(&flow), addr) else {
                            continue;
                        };
                        let _ = ends
                            .to_client
                            .try_send((from, data.get(at..).unwrap_or_default().to_vec()));
                    }
                    _ => {}
                }
            }
            if let Some(c) = &current {
                for (flow, ends) in &udp {
                    while let Ok((to, payload)) = ends.from_client.try_recv() {
                        let mut out = Vec::with_capacity(payload.len() + 32);
                        quic_wire::encode_datagram(*flow, &TargetAddr::Ip(to), &payload, &mut out);
                        d.send_datagram(c.ch, Bytes::from(out));
                    }
                }
            }
            if let Some(rtt) = current.as_ref().and_then(|c| d.rtt(c.ch)) {
                self.status
                    .rtt_us
                    .store(rtt.as_micros() as u64, Ordering::Relaxed);
            }
            // flushing may have produced more work (a datagram handed on)
            let _ = d.turn();
            d.flush().await;
            let failures = d.send_failures();
            if failures >= send_failures_seen + u64::from(SEND_FAILURES_TO_REBIND) {
                send_failures_seen = failures;
                self.rebind(&d, &mut receiver, &host, port).await;
            }
            let wait = d
                .next_timeout()
                .map(|t| t.saturating_duration_since(Instant::now()))
                .unwrap_or(TICK)
                .min(TICK);
            if !d.busy() {
                futures_lite::future::or(listen, glommio::timer::sleep(wait)).await;
            }
            glommio::yield_if_needed().await;
        }
    }

    fn settings_crypto(
        &self,
    ) -> Result<Arc<quinn_proto::crypto::rustls::QuicClientConfig>, String> {
        super::tls::client_config(self.settings.pin).map_err(|e| e.to_string())
    }

    fn udp_blocked(&self, why: &str) {
        let had_fallback = self.settings.fallback.is_some();
        let was_blocked = self.status.blocked();
        *self.status.blocked_until.lock() = Some(Instant::now() + UDP_BLOCKED_FOR);
        if had_fallback && !was_blocked {
            tracing::warn!(backend = %self.name, server = %self.settings.address, reason = %why,
                retry_in = ?UDP_BLOCKED_FOR, "QUIC unreachable: falling back to the server's TCP proxy");
        }
        self.status.connected.store(false, Ordering::Release);
        *self.status.last_error.lock() = Some(why.to_owned());
        // with a fallback the backend still carries flows
        self.health.set(had_fallback);
    }

    async fn resolve(&self, host: &str, port: u16) -> Result<SocketAddr, String> {
        let addrs = self
            .resolver
            .resolve(&self.offload, host, port)
            .await
            .map_err(|e| e.to_string())?;
        addrs
            .first()
            .copied()
            .ok_or_else(|| format!("{host} has no address"))
    }

    async fn connect(
        &self,
        driver: &mut Option<Rc<Driver>>,
        receiver: &mut Option<glommio::Task<()>>,
        config: &quinn_proto::ClientConfig,
        host: &str,
        port: u16,
    ) -> Result<Current, String> {
        let remote = self.resolve(host, port).await?;
        let d = match driver {
            Some(d) => d.clone(),
            None => {
                let socket =
                    UdpPort::bind(any_addr(remote)).map_err(|e| format!("UDP socket: {e}"))?;
                let d = Driver::new(socket, None, None, self.wake.clone());
                *receiver = Some(glommio::spawn_local(d.clone().receive()));
                *driver = Some(d.clone());
                d
            }
        };
        let ch = d
            .connect(config.clone(), remote, "switchyard")
            .map_err(|e| format!("cannot start a QUIC connection to {remote}: {e}"))?;
        tracing::debug!(backend = %self.name, %remote, "QUIC connecting");
        Ok(Current {
            ch,
            started: Instant::now(),
            connected: false,
            hello: None,
        })
    }

    /// Replaces the socket after repeated send failures (the local address went away).
    async fn rebind(
        &self,
        d: &Rc<Driver>,
        receiver: &mut Option<glommio::Task<()>>,
        host: &str,
        port: u16,
    ) {
        let Ok(remote) = self.resolve(host, port).await else {
            return;
        };
        match UdpPort::bind(any_addr(remote)) {
            Ok(socket) => {
                tracing::info!(backend = %self.name, local = ?socket.local_addr(),
                    "QUIC sends keep failing: new socket, migrating the connection");
                d.rebind(socket);
                *receiver = Some(glommio::spawn_local(d.clone().receive()));
            }
            Err(e) => tracing::debug!(backend = %self.name, error = %e, "QUIC rebind failed"),
        }
    }
}

async fn send_hello(
    flow: FlowStream,
    hello: quic_wire::Hello,
    status: Arc<QuicClientStatus>,
    name: String,
) {
    let mut out = Vec::new();
    if quic_wire::encode_hello(&hello, &mut out).is_err() {
        *status.last_error.lock() = Some("token or credentials too long for the hello".into());
        return;
    }
    let flow = RefCell::new(flow);
    if crate::tunnel::write_all(&flow, &out).await.is_err() {
        return;
    }
    flow.borrow().shutdown_write();
    match super::server::read_message(&flow, quic_wire::parse_reply, Duration::from_secs(30)).await
    {
        Ok((reply, _)) if reply.status == Status::Ok => {
            tracing::debug!(backend = %name, "QUIC hello accepted");
        }
        Ok((reply, _)) => {
            let why = format!("the server refused this client: {}", reply.message);
            tracing::warn!(backend = %name, reason = %why, "QUIC hello refused");
            *status.last_error.lock() = Some(why);
        }
        Err(e) => tracing::debug!(backend = %name, error = %e, "QUIC hello got no answer"),
    }
}
