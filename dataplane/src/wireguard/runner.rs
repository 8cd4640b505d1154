//! The task that runs one WireGuard tunnel on its owner core: the boringtun session, the
//! smoltcp interface with one TCP socket per flow, one UDP socket per SOCKS5 UDP association
//! (and a DNS socket when the tunnel has DNS servers), the UDP socket to the endpoint, WireGuard's timers, and the liveness probe that
//! drives the backend's health. A second task receives datagrams, so a datagram is never lost
//! to a cancelled receive; both share the state through a `RefCell` on this core only.

use super::datagrams::{self, DatagramEnds, DatagramPort};
use super::device::QueueDevice;
use super::flow::{self, FlowEnds, FlowStream, Wake, CHUNK, MAX_QUEUED_CHUNKS};
use super::ports::{self, PortPool};
use super::{Destination, OpenRequest, Request};
use crate::error::DataplaneError;
use crate::events::{Event, EventQueue};
use crate::offload::Offload;
use crate::resolver::Resolver;
use crate::snapshot::BackendHealth;
use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use glommio::net::UdpSocket;
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::socket::{dns, tcp, udp};
use smoltcp::wire::{
    DnsQueryType, HardwareAddress, IpAddress, IpCidr, IpEndpoint, IpListenEndpoint,
};
use std::cell::{Cell, RefCell};
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_config::wireguard::WireguardSettings;

/// A quiet tunnel (nothing received for this long) is probed with a new handshake.
const LIVENESS_INTERVAL: Duration = Duration::from_secs(10);
/// WireGuard's REKEY_TIMEOUT: a handshake not answered within it failed.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// boringtun wants `update_timers` every 250 ms or so.
const TIMER_TICK: Duration = Duration::from_millis(250);
/// Per-flow smoltcp buffers: large enough for a full window at LAN/WAN rates.
const RX_BUFFER: usize = 256 * 1024;
const TX_BUFFER: usize = 256 * 1024;
/// Kernel buffers of the UDP socket to the endpoint.
const UDP_RECV_BUFFER: usize = 4 << 20;
const UDP_SEND_BUFFER: usize = 1 << 20;
/// Datagram scratch: the largest IP packet plus WireGuard's overhead.
const SCRATCH: usize = 65_536 + 256;

pub(super) struct RunnerArgs {
    pub owner: Arc<super::Owner>,
    pub generation: u64,
    pub name: String,
    pub settings: WireguardSettings,
    pub requests: async_channel::Receiver<Request>,
    pub wake: Arc<Wake>,
    pub health: Arc<BackendHealth>,
    pub events: Arc<EventQueue>,
    pub resolver: Resolver,
    pub offload: Offload,
}

type Reply = futures::channel::oneshot::Sender<Result<FlowStream, DataplaneError>>;

struct Flow {
    handle: SocketHandle,
    /// The flow's local port in the tunnel (given back to the pool when the flow ends).
    port: u16,
    ends: FlowEnds,
    target: SocketAddr,
    /// Client bytes not yet taken by the socket.
    pending: Vec<u8>,
    offset: usize,
    /// Until the connection is established: who waits for it, and what they get.
    waiting: Option<(Reply, FlowStream)>,
    opened: Instant,
    fin_sent: bool,
    eof_sent: bool,
    /// Aborted; removed after the next interface poll has sent the reset.
    finished: bool,
    /// Bytes moved peer → client and client → peer, for the log line that ends the flow.
    down: u64,
    up: u64,
}

impl Flow {
    /// Every flow-ending path says why at debug level: a cut transfer must be traceable.
    fn ended(&self, backend: &str, state: tcp::State, why: &str) {
        tracing::debug!(backend, target = %self.target, ?state, down = self.down, up = self.up,
            lived_ms = self.opened.elapsed().as_millis() as u64, why, "WireGuard flow ended");
    }
}

/// Smoltcp buffers of one UDP association, each direction: datagrams and payload bytes.
const UDP_DATAGRAMS: usize = 64;
const UDP_PAYLOAD: usize = 64 * 1024;

/// One SOCKS5 UDP association: a smoltcp UDP socket and the channels to its relay.
struct Association {
    handle: SocketHandle,
    port: u16,
    ends: DatagramEnds,
}

fn association_socket() -> udp::Socket<'static> {
    let buffer = || {
        udp::PacketBuffer::new(
            vec![udp::PacketMetadata::EMPTY; UDP_DATAGRAMS],
            vec![0; UDP_PAYLOAD],
        )
    };
    udp::Socket::new(buffer(), buffer())
}

struct PendingName {
    query: dns::QueryHandle,
    name: String,
    port: u16,
    reply: Reply,
    started: Instant,
}

struct Tunnel {
    name: String,
    settings: WireguardSettings,
    endpoint: SocketAddr,
    tunn: Tunn,
    iface: Interface,
    device: QueueDevice,
    sockets: SocketSet<'static>,
    dns: Option<SocketHandle>,
    flows: Vec<Flow>,
    associations: Vec<Association>,
    names: Vec<PendingName>,
    ports: PortPool,
    scratch: Vec<u8>,
    /// Encrypted datagrams waiting to be sent to the endpoint.
    outgoing: Vec<Vec<u8>>,
    last_rx: Option<Instant>,
    probe_started: Option<Instant>,
    last_timers: Instant,
    alive: Option<bool>,
    wake: Arc<Wake>,
    health: Arc<BackendHealth>,
    events: Arc<EventQueue>,
}

fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// The smoltcp socket of one flow: large buffers (window scaling), Cubic, no Nagle (the relay
/// writes whole chunks).
fn flow_socket() -> tcp::Socket<'static> {
    let mut socket = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0; RX_BUFFER]),
        tcp::SocketBuffer::new(vec![0; TX_BUFFER]),
    );
    socket.set_congestion_control(tcp::CongestionControl::Cubic);
    socket.set_nagle_enabled(false);
    socket
}

/// The error of a connect the peer never answered.
fn unanswered(backend: &str, endpoint: SocketAddr) -> DataplaneError {
    DataplaneError::Tunnel {
        backend: backend.to_owned(),
        reason: format!(
            "no WireGuard handshake answer from {endpoint} (peer down, or the keys do not match)"
        ),
    }
}

fn smol_now() -> smoltcp::time::Instant {
    smoltcp::time::Instant::now()
}

impl Tunnel {
    fn new(args: &RunnerArgs, endpoint: SocketAddr) -> Self {
        let s = &args.settings;
        let tunn = Tunn::new(
            StaticSecret::from(s.private_key),
            PublicKey::from(s.public_key),
            s.preshared_key,
            s.persistent_keepalive,
            // boringtun shifts the index left by 8 bits: keep it within 24.
            (random_u64() & 0x00ff_ffff) as u32,
            None,
        );
        let mut device = QueueDevice::new(usize::from(s.mtu));
        let mut config = Config::new(HardwareAddress::Ip);
        config.random_seed = random_u64();
        let mut iface = Interface::new(config, &mut device, smol_now());
        iface.update_ip_addrs(|addrs| {
            for net in &s.address {
                let cidr = IpCidr::new(IpAddress::from(net.addr()), net.prefix_len());
                if addrs.push(cidr).is_err() {
                    tracing::warn!(backend = %args.name, address = %net, "too many interface addresses; ignored");
                }
            }
        });
        // Every destination is reached through the peer: default routes via our own address
        // (an IP-medium interface needs no next hop, only a route).
        for net in &s.address {
            match net.addr() {
                IpAddr::V4(a) => {
                    let _ = iface.routes_mut().add_default_ipv4_route(a);
                }
                IpAddr::V6(a) => {
                    let _ = iface.routes_mut().add_default_ipv6_route(a);
                }
            }
        }
        let mut sockets = SocketSet::new(Vec::new());
        let dns = (!s.dns.is_empty()).then(|| {
            let servers: Vec<IpAddress> = s.dns.iter().map(|ip| IpAddress::from(*ip)).collect();
            sockets.add(dns::Socket::new(&servers, Vec::new()))
        });
        Self {
            name: args.name.clone(),
            settings: s.clone(),
            endpoint,
            tunn,
            iface,
            device,
            sockets,
            dns,
            flows: Vec::new(),
            associations: Vec::new(),
            names: Vec::new(),
            ports: PortPool::starting_at(
                ports::FIRST + (random_u64() % u64::from(ports::LAST - ports::FIRST + 1)) as u16,
                usize::from(s.max_flows),
            ),
            scratch: vec![0; SCRATCH],
            outgoing: Vec::new(),
            last_rx: None,
            probe_started: None,
            last_timers: Instant::now(),
            alive: None,
            wake: args.wake.clone(),
            health: args.health.clone(),
            events: args.events.clone(),
        }
    }

    fn set_alive(&mut self, alive: bool, why: &str) {
        if self.alive == Some(alive) {
            return;
        }
        self.alive = Some(alive);
        if alive {
            tracing::info!(backend = %self.name, endpoint = %self.endpoint, "WireGuard peer answers");
        } else {
            tracing::warn!(backend = %self.name, endpoint = %self.endpoint, reason = why, "WireGuard peer lost");
        }
        if let Some(healthy) = self.health.set(alive) {
            self.events.push(Event::BackendHealth {
                name: self.name.clone(),
                healthy,
            });
        }
    }

    fn unanswered(&self) -> DataplaneError {
        unanswered(&self.name, self.endpoint)
    }

    /// One datagram from the network: decrypt into the interface, or answer handshakes.
    fn receive_datagram(&mut self, datagram: &[u8], from: SocketAddr) {
        match self
            .tunn
            .decapsulate(Some(from.ip()), datagram, &mut self.scratch)
        {
            TunnResult::WriteToNetwork(out) => {
                self.outgoing.push(out.to_vec());
                // Packets queued while there was no session go out now.
                while let TunnResult::WriteToNetwork(out) =
                    self.tunn.decapsulate(None, &[], &mut self.scratch)
                {
                    self.outgoing.push(out.to_vec());
                }
            }
            TunnResult::WriteToTunnelV4(packet, _) | TunnResult::WriteToTunnelV6(packet, _) => {
                self.device.inbound.push_back(packet.to_vec());
            }
            // a cookie reply (type 3) is made by anyone who saw our initiation: it proves
            // nothing about the peer being alive
            TunnResult::Done if datagram.first() == Some(&3) => return,
            TunnResult::Done => {}
            TunnResult::Err(e) => {
                tracing::debug!(backend = %self.name, %from, error = ?e, "WireGuard datagram dropped");
                return;
            }
        }
        self.last_rx = Some(Instant::now());
        self.probe_started = None;
        self.set_alive(true, "");
    }

    /// A free local port, or the error that refuses the flow when every port is taken.
    fn allocate_port(&mut self) -> Result<u16, DataplaneError> {
        self.ports.allocate().map_err(|e| {
            tracing::warn!(backend = %self.name, "flow refused: {e}");
            DataplaneError::Tunnel {
                backend: self.name.clone(),
                reason: e.to_string(),
            }
        })
    }

    fn request(&mut self, request: Request) {
        match request {
            Request::Open(open) => self.open(open),
            Request::Datagrams(reply) => {
                let _ = reply.send(self.open_datagrams());
            }
        }
    }

    /// A UDP socket on a free port of the tunnel for one SOCKS5 association.
    fn open_datagrams(&mut self) -> Result<DatagramPort, DataplaneError> {
        let port = self.allocate_port()?;
        let mut socket = association_socket();
        if let Err(e) = socket.bind(port) {
            self.ports.release(port);
            return Err(DataplaneError::Tunnel {
                backend: self.name.clone(),
                reason: format!("cannot open a UDP port: {e}"),
            });
        }
        let handle = self.sockets.add(socket);
        let (ends, datagram_port) = datagrams::pair(self.wake.clone());
        self.associations.push(Association { handle, port, ends });
        Ok(datagram_port)
    }

    /// Moves datagrams between each association's socket and its relay; an association whose
    /// relay dropped its port is removed. Destinations outside `allowed_ips` are dropped.
    fn shuttle_datagrams(&mut self) {
        let mut i = 0;
        while i < self.associations.len() {
            let association = &self.associations[i];
            if association.ends.from_client.is_closed() && association.ends.from_client.is_empty() {
                self.sockets.remove(association.handle);
                self.ports.release(association.port);
                self.associations.swap_remove(i);
                continue;
            }
            let socket = self.sockets.get_mut::<udp::Socket>(association.handle);
            while socket.can_recv() && !association.ends.to_client.is_full() {
                let Ok((payload, meta)) = socket.recv() else {
                    break;
                };
                let from = SocketAddr::new(meta.endpoint.addr.into(), meta.endpoint.port);
                let _ = association
                    .ends
                    .to_client
                    .try_send((from, payload.to_vec()));
            }
            while socket.can_send() {
                let Ok((to, payload)) = association.ends.from_client.try_recv() else {
                    break;
                };
                if !self.settings.allows(to.ip()) || self.settings.source_for(to.ip()).is_none() {
                    tracing::debug!(backend = %self.name, %to, "SOCKS5 UDP datagram dropped: not carried by the tunnel");
                    continue;
                }
                let endpoint = IpEndpoint::new(IpAddress::from(to.ip()), to.port());
                if let Err(e) = socket.send_slice(&payload, endpoint) {
                    tracing::debug!(backend = %self.name, %to, error = %e, "SOCKS5 UDP datagram dropped");
                }
            }
            i += 1;
        }
    }

    fn open(&mut self, request: OpenRequest) {
        match request.destination {
            Destination::Addr(addr) => self.connect(addr, request.reply),
            Destination::Name(name, port) => {
                let Some(dns_handle) = self.dns else {
                    let _ = request.reply.send(Err(DataplaneError::Resolve {
                        host: name,
                        reason: "the tunnel has no DNS servers".into(),
                    }));
                    return;
                };
                let kind = if self.settings.address.iter().any(|a| a.addr().is_ipv4()) {
                    DnsQueryType::A
                } else {
                    DnsQueryType::Aaaa
                };
                let socket = self.sockets.get_mut::<dns::Socket>(dns_handle);
                match socket.start_query(self.iface.context(), &name, kind) {
                    Ok(query) => self.names.push(PendingName {
                        query,
                        name,
                        port,
                        reply: request.reply,
                        started: Instant::now(),
                    }),
                    Err(e) => {
                        let _ = request.reply.send(Err(DataplaneError::Resolve {
                            host: name,
                            reason: format!("DNS query through the tunnel: {e}"),
                        }));
                    }
                }
            }
        }
    }

    fn connect(&mut self, target: SocketAddr, reply: Reply) {
        let name = self.name.clone();
        let tunnel_error = |reason: String| DataplaneError::Tunnel {
            backend: name.clone(),
            reason,
        };
        if !self.settings.allows(target.ip()) {
            let e = tunnel_error(format!(
                "{} is outside the tunnel's allowed_ips",
                target.ip()
            ));
            let _ = reply.send(Err(e));
            return;
        }
        let Some(source) = self.settings.source_for(target.ip()) else {
            let e = tunnel_error(format!(
                "the tunnel has no address of the family of {target}"
            ));
            let _ = reply.send(Err(e));
            return;
        };
        let port = match self.allocate_port() {
            Ok(port) => port,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let mut socket = flow_socket();
        let local = IpListenEndpoint {
            addr: Some(IpAddress::from(source)),
            port,
        };
        if let Err(e) = socket.connect(
            self.iface.context(),
            (IpAddress::from(target.ip()), target.port()),
            local,
        ) {
            self.ports.release(port);
            let e = tunnel_error(format!("cannot open a flow to {target}: {e}"));
            let _ = reply.send(Err(e));
            return;
        }
        let handle = self.sockets.add(socket);
        let (ends, stream) = flow::pair(self.wake.clone(), SocketAddr::new(source, port));
        self.flows.push(Flow {
            handle,
            port,
            ends,
            target,
            pending: Vec::new(),
            offset: 0,
            waiting: Some((reply, stream)),
            opened: Instant::now(),
            fin_sent: false,
            eof_sent: false,
            finished: false,
            down: 0,
            up: 0,
        });
    }

    /// Names answered by the tunnel's DNS become connections.
    fn poll_names(&mut self) {
        let Some(dns_handle) = self.dns else { return };
        let mut i = 0;
        while i < self.names.len() {
            let query = self.names[i].query;
            let socket = self.sockets.get_mut::<dns::Socket>(dns_handle);
            let result = socket.get_query_result(query);
            let timed_out = self.names[i].started.elapsed() > Duration::from_secs(10);
            match result {
                Err(dns::GetQueryResultError::Pending) if !timed_out => {
                    if self.names[i].reply.is_canceled() {
                        socket.cancel_query(query);
                        self.names.swap_remove(i);
                    } else {
                        i += 1;
                    }
                    continue;
                }
                Err(dns::GetQueryResultError::Pending) => socket.cancel_query(query),
                _ => {}
            }
            let pending = self.names.swap_remove(i);
            match result.ok().and_then(|addrs| addrs.first().copied()) {
                Some(ip) => {
                    let ip: IpAddr = ip.into();
                    self.connect(SocketAddr::new(ip, pending.port), pending.reply);
                }
                None => {
                    let _ = pending.reply.send(Err(DataplaneError::Resolve {
                        host: pending.name,
                        reason: "the tunnel's DNS servers gave no address".into(),
                    }));
                }
            }
        }
    }

    /// Moves bytes between each flow's socket and its channels; false = the flow is over.
    fn shuttle(&mut self, index: usize) -> bool {
        let alive = self.alive == Some(true);
        // Built only when a connect fails: this runs for every flow on every turn.
        let endpoint = self.endpoint;
        let backend = self.name.as_str();
        let flow = &mut self.flows[index];
        if flow.finished {
            self.sockets.remove(flow.handle);
            return false;
        }
        let socket = self.sockets.get_mut::<tcp::Socket>(flow.handle);
        if let Some((reply, _)) = &flow.waiting {
            if reply.is_canceled() {
                flow.ended(
                    backend,
                    socket.state(),
                    "the connection stopped waiting for it",
                );
                socket.abort();
                flow.finished = true;
                return true;
            }
            match socket.state() {
                tcp::State::Established | tcp::State::CloseWait => {
                    if let Some((reply, stream)) = flow.waiting.take() {
                        if reply.send(Ok(stream)).is_err() {
                            flow.ended(
                                backend,
                                socket.state(),
                                "the connection stopped waiting for it",
                            );
                            socket.abort();
                            flow.finished = true;
                            return true;
                        }
                    }
                }
                tcp::State::Closed => {
                    flow.ended(
                        backend,
                        socket.state(),
                        "refused: reset before it was established",
                    );
                    if let Some((reply, _)) = flow.waiting.take() {
                        let _ = reply.send(Err(DataplaneError::Refused {
                            target: flow.target.to_string(),
                        }));
                    }
                    self.sockets.remove(flow.handle);
                    return false;
                }
                _ => {
                    if !alive && flow.opened.elapsed() > HANDSHAKE_TIMEOUT {
                        flow.ended(backend, socket.state(), "no handshake answer from the peer");
                        if let Some((reply, _)) = flow.waiting.take() {
                            let _ = reply.send(Err(unanswered(backend, endpoint)));
                        }
                        socket.abort();
                        flow.finished = true;
                    }
                    return true;
                }
            }
        }
        if flow.ends.to_client.receiver_count() == 0 {
            // The connection dropped its stream: whatever is still open is reset.
            flow.ended(backend, socket.state(), "the connection dropped its stream");
            if !matches!(socket.state(), tcp::State::Closed | tcp::State::TimeWait) {
                socket.abort();
            }
            flow.finished = true;
            return true;
        }
        // Peer → client, while the client keeps up.
        while socket.can_recv() && flow.ends.to_client.len() < MAX_QUEUED_CHUNKS {
            let chunk = socket.recv(|buf| {
                let n = buf.len().min(CHUNK);
                (n, buf[..n].to_vec())
            });
            match chunk {
                Ok(c) if !c.is_empty() => {
                    flow.down += c.len() as u64;
                    let _ = flow.ends.to_client.try_send(c);
                }
                _ => break,
            }
        }
        if !flow.eof_sent && !socket.may_recv() && !socket.can_recv() {
            let why = if socket.state() == tcp::State::Closed {
                "end of stream to the connection: the socket closed (reset, or both sides done)"
            } else {
                "end of stream to the connection: the peer sent FIN"
            };
            flow.ended(backend, socket.state(), why);
            flow.ends.to_client.close();
            flow.eof_sent = true;
        }
        // Client → peer, while the socket has room.
        loop {
            if flow.offset >= flow.pending.len() {
                match flow.ends.from_client.try_recv() {
                    Ok(chunk) => {
                        flow.pending = chunk;
                        flow.offset = 0;
                        flow.ends.space.notify(1);
                    }
                    Err(async_channel::TryRecvError::Empty) => break,
                    Err(async_channel::TryRecvError::Closed) => {
                        if !flow.fin_sent {
                            tracing::debug!(backend, target = %flow.target, up = flow.up,
                                "WireGuard flow: the connection finished sending; FIN to the peer");
                            socket.close();
                            flow.fin_sent = true;
                        }
                        break;
                    }
                }
            }
            if !socket.can_send() {
                break;
            }
            match socket.send_slice(&flow.pending[flow.offset..]) {
                Ok(n) if n > 0 => {
                    flow.offset += n;
                    flow.up += n as u64;
                }
                _ => break,
            }
        }
        if matches!(socket.state(), tcp::State::Closed | tcp::State::TimeWait) && flow.eof_sent {
            flow.ended(backend, socket.state(), "closed");
            self.sockets.remove(flow.handle);
            return false;
        }
        true
    }

    fn step(&mut self) {
        let now = Instant::now();
        let t = smol_now();
        self.iface.poll(t, &mut self.device, &mut self.sockets);
        self.poll_names();
        let mut i = 0;
        while i < self.flows.len() {
            if self.shuttle(i) {
                i += 1;
            } else {
                let flow = self.flows.swap_remove(i);
                self.ports.release(flow.port);
            }
        }
        self.shuttle_datagrams();
        self.iface.poll(t, &mut self.device, &mut self.sockets);
        while let Some(packet) = self.device.outbound.pop_front() {
            match self.tunn.encapsulate(&packet, &mut self.scratch) {
                TunnResult::WriteToNetwork(out) => self.outgoing.push(out.to_vec()),
                TunnResult::Err(e) => {
                    tracing::debug!(backend = %self.name, error = ?e, "WireGuard packet not sent")
                }
                _ => {}
            }
        }
        if now.duration_since(self.last_timers) >= TIMER_TICK {
            self.last_timers = now;
            match self.tunn.update_timers(&mut self.scratch) {
                TunnResult::WriteToNetwork(out) => self.outgoing.push(out.to_vec()),
                TunnResult::Err(e) => {
                    tracing::debug!(backend = %self.name, error = ?e, "WireGuard timers")
                }
                _ => {}
            }
        }
        self.probe(now);
    }

    /// Resets every established flow of a lost peer: a pooled keep-alive flow would otherwise take
    /// the next request and wait for an answer that cannot come (flows have no kernel read
    /// timeout). The reset reads as end-of-stream, so a body-less request is retried on a new flow,
    /// which fails fast while the peer stays silent.
    fn reset_established_flows(&mut self) {
        for flow in &self.flows {
            if flow.waiting.is_none() && !flow.finished {
                let socket = self.sockets.get_mut::<tcp::Socket>(flow.handle);
                flow.ended(&self.name, socket.state(), "reset: the peer is lost");
                socket.abort();
            }
        }
    }

    /// A quiet tunnel is asked for a handshake; no answer within the timeout = peer lost.
    fn probe(&mut self, now: Instant) {
        if let Some(started) = self.probe_started {
            if now.duration_since(started) >= HANDSHAKE_TIMEOUT {
                self.probe_started = None;
                let reason = self.unanswered().to_string();
                self.set_alive(false, &reason);
                self.reset_established_flows();
            }
            return;
        }
        let quiet = self
            .last_rx
            .is_none_or(|at| now.duration_since(at) >= LIVENESS_INTERVAL);
        if quiet {
            if let TunnResult::WriteToNetwork(out) = self
                .tunn
                .format_handshake_initiation(&mut self.scratch, true)
            {
                self.outgoing.push(out.to_vec());
            }
            self.probe_started = Some(now);
        }
    }

    /// How long the loop may sleep before something needs doing.
    fn next_wake(&mut self) -> Duration {
        let smol = self
            .iface
            .poll_delay(smol_now(), &self.sockets)
            .map(|d| Duration::from_micros(d.total_micros()))
            .unwrap_or(TIMER_TICK);
        let timers = TIMER_TICK.saturating_sub(self.last_timers.elapsed());
        let names = if self.names.is_empty() {
            TIMER_TICK
        } else {
            Duration::from_millis(50)
        };
        smol.min(timers).min(names)
    }
}

/// How often a named endpoint is resolved again while the peer answers, and at most how often
/// while it does not (the name may point elsewhere now: dynamic DNS, a replaced server).
const RERESOLVE_EVERY: Duration = Duration::from_secs(300);
const RERESOLVE_LOST: Duration = Duration::from_secs(30);

/// Whether a named endpoint is due to be resolved again; an address never is.
#[derive(Debug)]
struct EndpointRefresh {
    named: bool,
    last: Instant,
}

impl EndpointRefresh {
    fn new(endpoint: &str, now: Instant) -> Self {
        let host = endpoint.rsplit_once(':').map_or(endpoint, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        Self {
            named: host.parse::<IpAddr>().is_err(),
            last: now,
        }
    }

    fn due(&self, now: Instant, peer_lost: bool) -> bool {
        let wait = if peer_lost {
            RERESOLVE_LOST
        } else {
            RERESOLVE_EVERY
        };
        self.named && now.saturating_duration_since(self.last) >= wait
    }
}

/// What resolving the endpoint needs, detachable from the runner's arguments.
#[derive(Clone)]
struct EndpointLookup {
    backend: String,
    endpoint: String,
    resolver: Resolver,
    offload: Offload,
}

impl EndpointLookup {
    async fn resolve(&self) -> Option<SocketAddr> {
        let endpoint = &self.endpoint;
        let (host, port) = endpoint.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port: u16 = port.parse().ok()?;
        match self.resolver.resolve(&self.offload, host, port).await {
            Ok(addrs) => addrs.first().copied(),
            Err(e) => {
                tracing::warn!(backend = %self.backend, %endpoint, error = %e, "WireGuard endpoint does not resolve");
                None
            }
        }
    }

    /// Resolves the name again and points the tunnel at the new address (same family: the
    /// UDP socket is bound to one).
    async fn refresh(self, tunnel: Rc<RefCell<Tunnel>>, busy: Rc<Cell<bool>>) {
        if let Some(addr) = self.resolve().await {
            let mut t = tunnel.borrow_mut();
            if addr != t.endpoint {
                if addr.is_ipv4() == t.endpoint.is_ipv4() {
                    tracing::info!(backend = %self.backend, from = %t.endpoint, to = %addr,
                        "WireGuard endpoint name resolves to a new address");
                    t.endpoint = addr;
                } else {
                    tracing::warn!(backend = %self.backend, now = %addr, kept = %t.endpoint,
                        "WireGuard endpoint name resolves to another address family; kept the old address");
                }
            }
        }
        busy.set(false);
    }
}

/// The socket to the endpoint, with a receive buffer that holds a burst of a full flow window
/// (the default ~208 KiB dropped datagrams under bulk downloads, each drop a TCP retransmission
/// inside the tunnel). The kernel caps the size at `net.core.rmem_max`.
fn bind_udp(bind: SocketAddr) -> std::io::Result<UdpSocket> {
    use std::os::fd::AsRawFd;
    let socket = UdpSocket::bind(bind)?;
    for (name, size, what) in [
        (libc::SO_RCVBUF, UDP_RECV_BUFFER, "receive"),
        (libc::SO_SNDBUF, UDP_SEND_BUFFER, "send"),
    ] {
        if let Err(e) =
            crate::sys::set_int_sockopt(socket.as_raw_fd(), libc::SOL_SOCKET, name, size as i32)
        {
            tracing::debug!(error = %e, what, "WireGuard UDP buffer left at the default");
        }
    }
    Ok(socket)
}

async fn send_all(udp: &UdpSocket, to: SocketAddr, datagrams: Vec<Vec<u8>>) {
    for d in datagrams {
        if let Err(e) = udp.send_to(&d, to).await {
            tracing::debug!(%to, error = %e, "WireGuard datagram not sent");
        }
    }
}

async fn receive(udp: Rc<UdpSocket>, tunnel: Rc<RefCell<Tunnel>>, wake: Arc<Wake>) {
    let mut buf = vec![0u8; SCRATCH];
    loop {
        let (n, from) = match udp.recv_from(&mut buf).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "WireGuard receive failed");
                glommio::timer::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let (out, endpoint) = {
            let mut t = tunnel.borrow_mut();
            t.receive_datagram(&buf[..n], from);
            (std::mem::take(&mut t.outgoing), t.endpoint)
        };
        send_all(&udp, endpoint, out).await;
        wake.notify();
    }
}

/// Runs the tunnel until every holder of its backend is gone.
pub(super) async fn run(args: RunnerArgs) {
    let lookup = EndpointLookup {
        backend: args.name.clone(),
        endpoint: args.settings.endpoint.clone(),
        resolver: args.resolver.clone(),
        offload: args.offload.clone(),
    };
    // The endpoint may not resolve yet (names, DNS down): keep trying, unhealthy meanwhile.
    let endpoint = loop {
        if args.requests.sender_count() == 0 || !args.owner.beat(args.generation) {
            return;
        }
        if let Some(a) = lookup.resolve().await {
            break a;
        }
        if let Some(healthy) = args.health.set(false) {
            args.events.push(Event::BackendHealth {
                name: args.name.clone(),
                healthy,
            });
        }
        while let Ok(req) = args.requests.try_recv() {
            let e = DataplaneError::Tunnel {
                backend: args.name.clone(),
                reason: format!("endpoint {} does not resolve", args.settings.endpoint),
            };
            match req {
                Request::Open(open) => {
                    let _ = open.reply.send(Err(e));
                }
                Request::Datagrams(reply) => {
                    let _ = reply.send(Err(e));
                }
            }
        }
        glommio::timer::sleep(HANDSHAKE_TIMEOUT).await;
    };
    let bind: SocketAddr = if endpoint.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let udp = match bind_udp(bind) {
        Ok(s) => Rc::new(s),
        Err(e) => {
            tracing::error!(backend = %args.name, error = %e, "WireGuard UDP socket");
            return;
        }
    };
    let tunnel = Rc::new(RefCell::new(Tunnel::new(&args, endpoint)));
    // Dropping the task handle when this function returns stops the receiver too.
    let _receiver = glommio::spawn_local(receive(udp.clone(), tunnel.clone(), args.wake.clone()));
    let mut refresh = EndpointRefresh::new(&args.settings.endpoint, Instant::now());
    let resolving = Rc::new(Cell::new(false));
    loop {
        if args.requests.sender_count() == 0 {
            tracing::info!(backend = %args.name, "WireGuard tunnel stopped (backend removed or changed)");
            return;
        }
        if !args.owner.beat(args.generation) {
            tracing::warn!(backend = %args.name, "WireGuard tunnel handed to another core; this one stops");
            return;
        }
        let listener = args.wake.listen();
        if !args.wake.take() {
            let delay = tunnel.borrow_mut().next_wake();
            futures_lite::future::or(listener, glommio::timer::sleep(delay)).await;
            args.wake.take();
        }
        let (out, endpoint, peer_lost) = {
            let mut t = tunnel.borrow_mut();
            while let Ok(req) = args.requests.try_recv() {
                t.request(req);
            }
            t.step();
            (
                std::mem::take(&mut t.outgoing),
                t.endpoint,
                t.alive == Some(false),
            )
        };
        send_all(&udp, endpoint, out).await;
        let now = Instant::now();
        if !resolving.get() && refresh.due(now, peer_lost) {
            refresh.last = now;
            resolving.set(true);
            glommio::spawn_local(lookup.clone().refresh(tunnel.clone(), resolving.clone()))
                .detach();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::phy::ChecksumCapabilities;

    #[test]
    fn a_named_endpoint_is_resolved_again_soon_when_the_peer_is_lost_and_now_and_then_otherwise() {
        let start = Instant::now();
        let refresh = EndpointRefresh::new("wg.example.net:51820", start);
        let after = |d: Duration| start + d;
        assert!(!refresh.due(after(Duration::from_secs(1)), true));
        assert!(refresh.due(after(RERESOLVE_LOST), true));
        assert!(!refresh.due(after(RERESOLVE_LOST), false));
        assert!(refresh.due(after(RERESOLVE_EVERY), false));
    }

    #[test]
    fn an_endpoint_given_as_an_address_is_never_resolved_again() {
        let start = Instant::now();
        let later = start + RERESOLVE_EVERY * 10;
        for endpoint in ["192.0.2.7:51820", "[2001:db8::7]:51820"] {
            let refresh = EndpointRefresh::new(endpoint, start);
            assert!(!refresh.due(later, true), "{endpoint}");
            assert!(!refresh.due(later, false), "{endpoint}");
        }
    }
    use smoltcp::wire::{
        IpProtocol, Ipv4Address, Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket, TcpRepr, TcpSeqNumber,
    };

    const LOCAL: Ipv4Address = Ipv4Address::new(10, 9, 0, 2);
    const REMOTE: Ipv4Address = Ipv4Address::new(10, 9, 0, 1);

    /// An IPv4 TCP segment from the remote origin to our flow.
    fn segment(repr: &TcpRepr) -> Vec<u8> {
        let caps = ChecksumCapabilities::default();
        let ip = Ipv4Repr {
            src_addr: REMOTE,
            dst_addr: LOCAL,
            next_header: IpProtocol::Tcp,
            payload_len: repr.buffer_len(),
            hop_limit: 64,
        };
        let mut packet = vec![0; ip.buffer_len() + repr.buffer_len()];
        ip.emit(&mut Ipv4Packet::new_unchecked(&mut packet[..]), &caps);
        let mut tcp = TcpPacket::new_unchecked(&mut packet[ip.buffer_len()..]);
        repr.emit(&mut tcp, &REMOTE.into(), &LOCAL.into(), &caps);
        packet
    }

    /// The TCP header of a packet the interface sent: (seq, ack, window field).
    fn sent(packet: &[u8]) -> (TcpSeqNumber, Option<TcpSeqNumber>, u16, Option<u8>) {
        let ip = Ipv4Packet::new_checked(packet).expect("ipv4");
        let tcp = TcpPacket::new_checked(ip.payload()).expect("tcp");
        let repr = TcpRepr::parse(
            &tcp,
            &ip.src_addr().into(),
            &ip.dst_addr().into(),
            &ChecksumCapabilities::default(),
        )
        .expect("tcp repr");
        (
            repr.seq_number,
            repr.ack_number,
            repr.window_len,
            repr.window_scale,
        )
    }

    fn data<'a>(seq: TcpSeqNumber, ack: TcpSeqNumber, payload: &'a [u8]) -> TcpRepr<'a> {
        TcpRepr {
            src_port: 80,
            dst_port: 50_000,
            control: TcpControl::Psh,
            seq_number: seq,
            ack_number: Some(ack),
            window_len: 65_535,
            window_scale: None,
            max_seg_size: None,
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp: None,
            payload,
        }
    }

    /// The cut-transfer defect: an origin sent bytes past the right edge of the window our flow
    /// had advertised (legal for it to have seen a larger edge earlier: window scaling rounds
    /// each advertisement down), the old stack took them because its buffer had room, and the
    /// next ACK it built panicked ("attempt to subtract sequence numbers with underflow"),
    /// which took the whole data-plane core, every connection on it and the tunnel down.
    #[test]
    fn bytes_past_the_advertised_window_do_not_bring_the_flow_down() {
        let mut device = QueueDevice::new(65_535);
        let mut iface = Interface::new(Config::new(HardwareAddress::Ip), &mut device, smol_now());
        iface.update_ip_addrs(|a| {
            a.push(IpCidr::new(LOCAL.into(), 32)).expect("address");
        });
        iface
            .routes_mut()
            .add_default_ipv4_route(LOCAL)
            .expect("route");
        let mut sockets = SocketSet::new(Vec::new());
        let mut socket = flow_socket();
        socket
            .connect(
                iface.context(),
                (IpAddress::from(REMOTE), 80),
                IpListenEndpoint {
                    addr: Some(LOCAL.into()),
                    port: 50_000,
                },
            )
            .expect("connect");
        let handle = sockets.add(socket);
        iface.poll(smol_now(), &mut device, &mut sockets);
        let syn = device.outbound.pop_back().expect("SYN sent");
        let (isn, _, _, our_scale) = sent(&syn);
        let shift = our_scale.expect("a 256 KiB buffer is advertised with window scaling");

        // SYN-ACK, then a first burst that fills most of the buffer.
        let mut remote = TcpSeqNumber(1_000);
        let syn_ack = TcpRepr {
            control: TcpControl::Syn,
            ack_number: Some(isn + 1),
            window_scale: Some(7),
            max_seg_size: Some(1_400),
            ..data(remote, isn + 1, &[])
        };
        device.inbound.push_back(segment(&syn_ack));
        remote += 1;
        let burst = vec![1u8; RX_BUFFER - 8_000];
        for chunk in burst.chunks(1_400) {
            device
                .inbound
                .push_back(segment(&data(remote, isn + 1, chunk)));
            remote += chunk.len();
        }
        device.outbound.clear();
        iface.poll(smol_now(), &mut device, &mut sockets);
        let (_, ack, window, _) = sent(device.outbound.back().expect("ACK sent"));
        assert_eq!(ack, Some(remote));
        let right_edge = remote + ((window as usize) << shift);

        // The relay drains the socket; before the window update goes out, the origin sends
        // past the edge it was given.
        let socket = sockets.get_mut::<tcp::Socket>(handle);
        let mut drained = 0;
        while socket.can_recv() {
            drained += socket.recv(|b| (b.len(), b.len())).expect("recv");
        }
        assert_eq!(drained, burst.len());
        // One segment (so the ACK for it is delayed, and the stack first asks whether to send a
        // window update — where the old stack panicked).
        let past = vec![2u8; (right_edge - remote) + 1_000];
        device
            .inbound
            .push_back(segment(&data(remote, isn + 1, &past)));
        iface.poll(smol_now(), &mut device, &mut sockets);
        // The (delayed) ACK for them goes out.
        let later = smol_now() + smoltcp::time::Duration::from_millis(100);
        iface.poll(later, &mut device, &mut sockets);

        // The flow lives on, holding only what it had room to be sent.
        let socket = sockets.get_mut::<tcp::Socket>(handle);
        assert_eq!(socket.state(), tcp::State::Established);
        assert!(socket.recv_queue() <= right_edge - remote);
        // And carries on: what the origin sends next inside the window still arrives.
        let mut got = 0;
        while socket.can_recv() {
            got += socket.recv(|b| (b.len(), b.len())).expect("recv");
        }
        iface.poll(smol_now(), &mut device, &mut sockets);
        let next = remote + got;
        device
            .inbound
            .push_back(segment(&data(next, isn + 1, &[3u8; 1_000])));
        iface.poll(smol_now(), &mut device, &mut sockets);
        let socket = sockets.get_mut::<tcp::Socket>(handle);
        assert_eq!(socket.recv_queue(), 1_000);
    }
}
