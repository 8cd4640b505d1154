//! One quinn-proto endpoint driven from one glommio UDP socket on its owner core.
//!
//! quinn-proto is sans-IO: this module feeds it the datagrams the socket receives, its timers,
//! and sends what it wants sent. Each QUIC stream is bridged to a [`FlowStream`] (the same
//! cross-core byte channel the WireGuard tunnels use), so a flow can be served by a task on any
//! core while the connection stays on this one. The driver moves bytes between streams and
//! their channels on every turn and never holds its state across an await; what happened on
//! the connections (new streams, datagrams, handshakes, losses) comes back from [`Driver::turn`]
//! as [`DriverEvent`]s for the role (server or client) to act on.
//!
//! Datagrams go out one per `sendmsg`, except that a transmit quinn-proto built for
//! segmentation offload (several datagrams of one size in one buffer) is handed to the kernel in
//! one call with `UDP_SEGMENT` when the kernel takes it (see [`crate::quic::udp`]).

use super::admission::{Admission, Holding};
use super::udp::UdpPort;
use crate::wireguard::flow::{self, FlowEnds, FlowStream, Wake, CHUNK, MAX_QUEUED_CHUNKS};
use bytes::{Bytes, BytesMut};
use quinn_proto::{
    ClientConfig, ConnectionHandle, DatagramEvent, Dir, EndpointConfig, Event, ServerConfig,
    StreamEvent, StreamId, VarInt,
};
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Datagrams taken from the socket without waiting after each awaited one.
const MAX_BURST: usize = 64;
/// Transmits built per connection per turn before the loop yields to other tasks.
const MAX_TRANSMITS_PER_TURN: usize = 64;

/// What happened on the endpoint during a turn.
#[derive(Debug)]
pub(crate) enum DriverEvent {
    /// A peer-opened bidirectional stream, bridged to a flow.
    Stream {
        conn: ConnectionHandle,
        id: StreamId,
        flow: FlowStream,
        peer: SocketAddr,
    },
    /// The server accepted a new connection.
    Accepted {
        conn: ConnectionHandle,
        peer: SocketAddr,
    },
    Connected(ConnectionHandle),
    /// The connection is gone (closed by either side, timed out, or refused in the handshake).
    Lost {
        conn: ConnectionHandle,
        reason: quinn_proto::ConnectionError,
    },
    Datagram {
        conn: ConnectionHandle,
        data: Bytes,
    },
}

/// A stream and the channels of its flow.
struct Pipe {
    ends: FlowEnds,
    /// Flow bytes not yet taken by the stream.
    pending: Option<(Vec<u8>, usize)>,
    recv_done: bool,
    send_done: bool,
}

struct Conn {
    quic: quinn_proto::Connection,
    pipes: HashMap<StreamId, Pipe>,
    lost: bool,
}

/// The server role's decision on a new connection from an address, given what the endpoint
/// holds.
pub(crate) type Admit = Box<dyn Fn(SocketAddr, &Holding) -> Admission>;

struct State {
    endpoint: quinn_proto::Endpoint,
    server: Option<Arc<ServerConfig>>,
    conns: HashMap<ConnectionHandle, Conn>,
    /// Datagrams to send: (destination, bytes, segment size).
    outgoing: Vec<(SocketAddr, Vec<u8>, Option<usize>)>,
    events: Vec<DriverEvent>,
    /// The server role's decision on a new connection (access control, limits, Retry).
    admit: Option<Admit>,
    scratch: Vec<u8>,
}

pub(crate) struct Driver {
    state: RefCell<State>,
    port: RefCell<Rc<UdpPort>>,
    pub wake: Arc<Wake>,
    /// Sends the kernel refused (the client's address went away, ...).
    send_failures: std::cell::Cell<u64>,
    /// A turn stopped at its transmit limit: run another at once.
    more: std::cell::Cell<bool>,
}

impl Driver {
    /// A driver on `port`; `server` makes it accept connections.
    pub fn new(
        port: UdpPort,
        server: Option<Arc<ServerConfig>>,
        admit: Option<Admit>,
        wake: Arc<Wake>,
    ) -> Rc<Self> {
        let endpoint = quinn_proto::Endpoint::new(
            Arc::new(EndpointConfig::default()),
            server.clone(),
            true,
            None,
        );
        Rc::new(Self {
            state: RefCell::new(State {
                endpoint,
                server,
                conns: HashMap::new(),
                outgoing: Vec::new(),
                events: Vec::new(),
                admit,
                scratch: Vec::with_capacity(65_536),
            }),
            port: RefCell::new(Rc::new(port)),
            wake,
            send_failures: std::cell::Cell::new(0),
            more: std::cell::Cell::new(false),
        })
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.port.borrow().local_addr()
    }

    /// Starts a connection to `remote`.
    pub fn connect(
        &self,
        config: ClientConfig,
        remote: SocketAddr,
        server_name: &str,
    ) -> Result<ConnectionHandle, quinn_proto::ConnectError> {
        let mut st = self.state.borrow_mut();
        let (ch, quic) = st
            .endpoint
            .connect(Instant::now(), config, remote, server_name)?;
        st.conns.insert(
            ch,
            Conn {
                quic,
                pipes: HashMap::new(),
                lost: false,
            },
        );
        self.wake.notify();
        Ok(ch)
    }

    /// Opens a bidirectional stream bridged to a flow; None when the peer's stream limit is
    /// reached (retry after a turn) or the connection is gone.
    pub fn open_stream(&self, ch: ConnectionHandle) -> Option<(StreamId, FlowStream)> {
        let mut st = self.state.borrow_mut();
        let conn = st.conns.get_mut(&ch).filter(|c| !c.lost)?;
        let id = conn.quic.streams().open(Dir::Bi)?;
        let flow = attach(conn, id, self.wake.clone(), conn.quic.remote_address());
        self.wake.notify();
        Some((id, flow))
    }

    /// Closes a connection with an application error code and reason.
    pub fn close(&self, ch: ConnectionHandle, code: u32, reason: &str) {
        let mut st = self.state.borrow_mut();
        if let Some(conn) = st.conns.get_mut(&ch) {
            conn.quic.close(
                Instant::now(),
                VarInt::from_u32(code),
                Bytes::copy_from_slice(reason.as_bytes()),
            );
        }
        self.wake.notify();
    }

    /// Queues a QUIC datagram; false when it was dropped (too large, unsupported, or gone).
    pub fn send_datagram(&self, ch: ConnectionHandle, data: Bytes) -> bool {
        let mut st = self.state.borrow_mut();
        let Some(conn) = st.conns.get_mut(&ch).filter(|c| !c.lost) else {
            return false;
        };
        let sent = conn.quic.datagrams().send(data, true).is_ok();
        self.wake.notify();
        sent
    }

    pub fn rtt(&self, ch: ConnectionHandle) -> Option<std::time::Duration> {
        let st = self.state.borrow();
        st.conns.get(&ch).map(|c| c.quic.rtt())
    }

    /// Whether 0-RTT was accepted by the server on this connection (client side).
    pub fn accepted_0rtt(&self, ch: ConnectionHandle) -> bool {
        let st = self.state.borrow();
        st.conns.get(&ch).is_some_and(|c| c.quic.accepted_0rtt())
    }

    /// Tells quinn-proto that this side's address changed (after a rebind), so it probes the
    /// new path at once.
    pub fn local_address_changed(&self) {
        let mut st = self.state.borrow_mut();
        for conn in st.conns.values_mut() {
            conn.quic.local_address_changed();
        }
        self.wake.notify();
    }

    /// Replaces the socket (client migration after its address went away).
    pub fn rebind(&self, port: UdpPort) {
        *self.port.borrow_mut() = Rc::new(port);
        self.local_address_changed();
    }

    /// The earliest timer of any connection.
    pub fn next_timeout(&self) -> Option<Instant> {
        let mut st = self.state.borrow_mut();
        st.conns
            .values_mut()
            .filter_map(|c| c.quic.poll_timeout())
            .min()
    }

    /// Receives datagrams until the socket fails (or is replaced: the loop then returns and
    /// the caller starts it again on the new one).
    pub async fn receive(self: Rc<Self>) {
        let mut buf = vec![0u8; 65_536];
        loop {
            let port = self.port.borrow().clone();
            let got = port.recv(&mut buf).await;
            if !Rc::ptr_eq(&port, &self.port.borrow()) {
                continue; // rebound while waiting: the datagram came on the old socket
            }
            let (n, from) = match got {
                Ok(v) => v,
                Err(e) => {
                    tracing::debug!(error = %e, "QUIC socket receive failed");
                    glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            self.handle_datagram(from, buf.get(..n).unwrap_or_default());
            // take the rest of a burst before the loop turns (one turn per burst, not per packet)
            for _ in 0..MAX_BURST {
                match port.try_recv(&mut buf) {
                    Ok((n, from)) => self.handle_datagram(from, buf.get(..n).unwrap_or_default()),
                    Err(_) => break,
                }
            }
            self.wake.notify();
        }
    }

    fn handle_datagram(&self, from: SocketAddr, data: &[u8]) {
        let now = Instant::now();
        let mut guard = self.state.borrow_mut();
        let st = &mut *guard;
        st.scratch.clear();
        let event =
            st.endpoint
                .handle(now, from, None, None, BytesMut::from(data), &mut st.scratch);
        match event {
            Some(DatagramEvent::ConnectionEvent(ch, ev)) => {
                if let Some(conn) = st.conns.get_mut(&ch) {
                    conn.quic.handle_event(ev);
                }
            }
            Some(DatagramEvent::NewConnection(incoming)) => {
                let peer = incoming.remote_address();
                if let Some(admit) = st.admit.as_ref() {
                    let holding = Holding {
                        total: st.conns.len(),
                        from_client: st
                            .conns
                            .values()
                            .filter(|c| c.quic.remote_address().ip() == peer.ip())
                            .count(),
                        handshaking: st
                            .conns
                            .values()
                            .filter(|c| c.quic.is_handshaking())
                            .count(),
                        validated: incoming.remote_address_validated(),
                    };
                    match admit(peer, &holding) {
                        Admission::Accept => {}
                        Admission::Retry if incoming.may_retry() => {
                            st.scratch.clear();
                            match st.endpoint.retry(incoming, &mut st.scratch) {
                                Ok(t) => push_transmit(&mut st.outgoing, &t, &st.scratch),
                                Err(e) => st.endpoint.ignore(e.into_incoming()),
                            }
                            return;
                        }
                        Admission::Retry | Admission::Refuse(_) => {
                            st.scratch.clear();
                            let t = st.endpoint.refuse(incoming, &mut st.scratch);
                            push_transmit(&mut st.outgoing, &t, &st.scratch);
                            return;
                        }
                    }
                }
                st.scratch.clear();
                match st
                    .endpoint
                    .accept(incoming, now, &mut st.scratch, st.server.clone())
                {
                    Ok((ch, quic)) => {
                        st.conns.insert(
                            ch,
                            Conn {
                                quic,
                                pipes: HashMap::new(),
                                lost: false,
                            },
                        );
                        st.events.push(DriverEvent::Accepted { conn: ch, peer });
                    }
                    Err(e) => {
                        tracing::debug!(client = %peer, error = %e.cause, "QUIC accept failed");
                        if let Some(t) = e.response {
                            push_transmit(&mut st.outgoing, &t, &st.scratch);
                        }
                    }
                }
            }
            Some(DatagramEvent::Response(t)) => push_transmit(&mut st.outgoing, &t, &st.scratch),
            None => {}
        }
    }

    /// Runs timers, connection events and stream bridging; returns what the role must handle.
    pub fn turn(&self) -> Vec<DriverEvent> {
        let now = Instant::now();
        let segments = self.port.borrow().max_segments();
        let mut guard = self.state.borrow_mut();
        let st = &mut *guard;
        let mut drained = Vec::new();
        let mut more = false;
        for (&ch, conn) in st.conns.iter_mut() {
            if conn.quic.poll_timeout().is_some_and(|t| t <= now) {
                conn.quic.handle_timeout(now);
            }
            while let Some(ev) = conn.quic.poll_endpoint_events() {
                if let Some(back) = st.endpoint.handle_event(ch, ev) {
                    conn.quic.handle_event(back);
                }
            }
            while let Some(ev) = conn.quic.poll() {
                match ev {
                    Event::Connected => st.events.push(DriverEvent::Connected(ch)),
                    Event::ConnectionLost { reason } => {
                        conn.lost = true;
                        // Every flow of the connection is cut with it.
                        for pipe in conn.pipes.values() {
                            pipe.ends.aborted.store(true, Ordering::Release);
                        }
                        conn.pipes.clear();
                        st.events.push(DriverEvent::Lost { conn: ch, reason });
                    }
                    Event::Stream(StreamEvent::Opened { dir: Dir::Bi }) => {
                        while let Some(id) = conn.quic.streams().accept(Dir::Bi) {
                            let peer = conn.quic.remote_address();
                            let flow = attach(conn, id, self.wake.clone(), peer);
                            st.events.push(DriverEvent::Stream {
                                conn: ch,
                                id,
                                flow,
                                peer,
                            });
                        }
                    }
                    Event::Stream(StreamEvent::Opened { dir: Dir::Uni }) => {
                        // Unused by the protocol: refuse what is sent on them.
                        while let Some(id) = conn.quic.streams().accept(Dir::Uni) {
                            let _ = conn.quic.recv_stream(id).stop(VarInt::from_u32(0));
                        }
                    }
                    Event::DatagramReceived => {
                        while let Some(data) = conn.quic.datagrams().recv() {
                            st.events.push(DriverEvent::Datagram { conn: ch, data });
                        }
                    }
                    _ => {}
                }
            }
            if !conn.lost {
                conn.pipes
                    .retain(|&id, pipe| bridge(&mut conn.quic, id, pipe));
            }
            for sent in 0..=MAX_TRANSMITS_PER_TURN {
                if sent == MAX_TRANSMITS_PER_TURN {
                    more = true;
                    break;
                }
                st.scratch.clear();
                let Some(t) = conn.quic.poll_transmit(now, segments, &mut st.scratch) else {
                    break;
                };
                push_transmit(&mut st.outgoing, &t, &st.scratch);
            }
            if conn.quic.is_drained() {
                drained.push(ch);
            }
        }
        for ch in drained {
            st.conns.remove(&ch);
        }
        self.more.set(more);
        std::mem::take(&mut st.events)
    }

    /// Sends what the turn produced.
    pub async fn flush(&self) {
        let outgoing = std::mem::take(&mut self.state.borrow_mut().outgoing);
        if outgoing.is_empty() {
            return;
        }
        let port = self.port.borrow().clone();
        for (to, data, segment) in outgoing {
            if let Err(e) = port.send(to, &data, segment).await {
                self.send_failures.set(self.send_failures.get() + 1);
                tracing::debug!(to = %to, error = %e, "QUIC send failed");
            }
        }
    }

    pub fn send_failures(&self) -> u64 {
        self.send_failures.get()
    }

    /// Whether more transmits are waiting (a turn stopped at its limit).
    pub fn busy(&self) -> bool {
        self.more.get() || !self.state.borrow().outgoing.is_empty()
    }
}

fn push_transmit(
    out: &mut Vec<(SocketAddr, Vec<u8>, Option<usize>)>,
    t: &quinn_proto::Transmit,
    buf: &[u8],
) {
    let data = buf.get(..t.size).unwrap_or(buf).to_vec();
    out.push((t.destination, data, t.segment_size));
}

fn attach(conn: &mut Conn, id: StreamId, wake: Arc<Wake>, peer: SocketAddr) -> FlowStream {
    let (ends, stream) = flow::pair(wake, peer);
    conn.pipes.insert(
        id,
        Pipe {
            ends,
            pending: None,
            recv_done: false,
            send_done: false,
        },
    );
    stream
}

/// Moves bytes between a stream and its flow; false once both directions are done.
fn bridge(quic: &mut quinn_proto::Connection, id: StreamId, pipe: &mut Pipe) -> bool {
    // stream → flow, as far as the flow's queue has room (else QUIC flow control pushes back)
    while !pipe.recv_done {
        if pipe.ends.to_client.is_closed() {
            // the flow's reader is gone: tell the peer to stop sending
            let _ = quic.recv_stream(id).stop(VarInt::from_u32(0));
            pipe.recv_done = true;
            break;
        }
        if pipe.ends.to_client.len() >= MAX_QUEUED_CHUNKS {
            break;
        }
        let mut recv = quic.recv_stream(id);
        let mut chunks = match recv.read(true) {
            Ok(c) => c,
            Err(_) => {
                pipe.ends.to_client.close();
                pipe.recv_done = true;
                break;
            }
        };
        let outcome = chunks.next(CHUNK);
        let _ = chunks.finalize();
        match outcome {
            Ok(Some(chunk)) => {
                let _ = pipe.ends.to_client.try_send(chunk.bytes.to_vec());
            }
            Ok(None) => {
                // FIN: the flow reads EOF once it has taken what is queued
                pipe.ends.to_client.close();
                pipe.recv_done = true;
            }
            Err(quinn_proto::ReadError::Blocked) => break,
            Err(quinn_proto::ReadError::Reset(_)) => {
                pipe.ends.aborted.store(true, Ordering::Release);
                pipe.ends.to_client.close();
                pipe.recv_done = true;
            }
        }
    }
    // flow → stream, as far as the stream takes it
    while !pipe.send_done {
        if pipe.pending.is_none() {
            match pipe.ends.from_client.try_recv() {
                Ok(chunk) => {
                    pipe.pending = Some((chunk, 0));
                    pipe.ends.space.notify(usize::MAX);
                }
                Err(async_channel::TryRecvError::Empty) => break,
                Err(async_channel::TryRecvError::Closed) => {
                    let _ = quic.send_stream(id).finish();
                    pipe.send_done = true;
                    break;
                }
            }
        }
        let Some((chunk, offset)) = pipe.pending.as_mut() else {
            break;
        };
        match quic
            .send_stream(id)
            .write(chunk.get(*offset..).unwrap_or_default())
        {
            Ok(n) => {
                *offset += n;
                if *offset >= chunk.len() {
                    pipe.pending = None;
                } else {
                    break;
                }
            }
            Err(quinn_proto::WriteError::Blocked) => break,
            Err(_) => {
                // stopped by the peer or closed: the flow's writes fail from now on
                pipe.pending = None;
                pipe.ends.from_client.close();
                pipe.send_done = true;
            }
        }
    }
    !(pipe.recv_done && pipe.send_done)
}
