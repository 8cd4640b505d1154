//! UDP flows carried in QUIC datagrams, on the server: each (connection, flow id) is one
//! association with its own host UDP socket, like a SOCKS5 UDP ASSOCIATE. Every datagram is
//! routed by its destination: a `direct` route leaves from the host socket; other backends
//! (proxies, tunnels) cannot carry these datagrams yet and drop them (counted in the log at
//! debug level). Replies come back on the association's socket and go to the client as
//! datagrams of the same flow, naming their source.

use super::driver::Driver;
use crate::engine::CoreContext;
use crate::events::Protocol;
use crate::snapshot::BackendKind;
use bytes::Bytes;
use glommio::net::UdpSocket;
use quinn_proto::ConnectionHandle;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;
use switchyard_proto::quic_wire;
use switchyard_proto::socks5::TargetAddr;

/// Associations one connection may hold at once; datagrams of further flows are dropped.
const MAX_FLOWS_PER_CONNECTION: usize = 256;

/// Client datagrams of one core being resolved and sent at once; beyond it they are dropped
/// (UDP's answer to overload), so a slow resolver cannot pile up tasks without bound.
const MAX_SENDS_IN_FLIGHT: usize = 1024;

struct Association {
    socket: Rc<UdpSocket>,
    /// The live-table entry, registered by the reply task (which owns the context it borrows).
    live: Rc<RefCell<Option<Arc<crate::live::LiveConnection>>>>,
    /// Set by the reply task when the association idled out.
    ended: Rc<Cell<bool>>,
    /// When a datagram last went either way: a flow that only sends is not idle.
    last_active: Rc<Cell<Instant>>,
    _replies: glommio::Task<()>,
}

/// The associations by (connection, flow id).
type FlowTable = HashMap<(ConnectionHandle, u32), Rc<Association>>;

#[derive(Default, Clone)]
pub(crate) struct Relays {
    flows: Rc<RefCell<FlowTable>>,
    /// Client datagrams being resolved and sent ([`MAX_SENDS_IN_FLIGHT`]).
    sends_in_flight: Rc<Cell<usize>>,
}

/// Holds one of the [`MAX_SENDS_IN_FLIGHT`] places until the send task ends.
struct SendSlot(Rc<Cell<usize>>);

impl SendSlot {
    fn take(count: &Rc<Cell<usize>>) -> Option<Self> {
        (count.get() < MAX_SENDS_IN_FLIGHT).then(|| {
            count.set(count.get() + 1);
            Self(count.clone())
        })
    }
}

impl Drop for SendSlot {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

fn split_target(addr: &TargetAddr) -> (String, u16) {
    match addr {
        TargetAddr::Ip(sa) => (sa.ip().to_string(), sa.port()),
        TargetAddr::Domain(h, p) => (h.clone(), *p),
    }
}

impl Relays {
    /// Drops every association of a connection that ended.
    pub fn forget(&self, conn: ConnectionHandle) {
        self.flows.borrow_mut().retain(|(c, _), _| *c != conn);
    }

    /// Relays one datagram from the client (resolution and sending run in their own task).
    pub async fn relay(
        &self,
        ctx: &Rc<CoreContext>,
        driver: &Rc<Driver>,
        conn: ConnectionHandle,
        peer: SocketAddr,
        data: &[u8],
    ) {
        let Ok((flow, addr, at)) = quic_wire::parse_datagram(data) else {
            return;
        };
        let payload = data.get(at..).unwrap_or_default().to_vec();
        let (host, port) = split_target(&addr);
        let snapshot = ctx.current_snapshot();
        let Some((_, backend)) = snapshot.select(&host) else {
            return;
        };
        if !matches!(backend.kind, BackendKind::Direct) {
            tracing::debug!(%host, backend = %backend.name, "QUIC datagram dropped: route cannot carry UDP");
            return;
        }
        let association =
            match self.association(ctx, driver, conn, flow, peer, &addr, &backend.name) {
                Some(a) => a,
                None => return,
            };
        let Some(slot) = SendSlot::take(&self.sends_in_flight) else {
            tracing::debug!(%host, limit = MAX_SENDS_IN_FLIGHT, "QUIC datagram dropped: too many sends in flight");
            return;
        };
        association.last_active.set(Instant::now());
        let ctx = ctx.clone();
        glommio::spawn_local(async move {
            let _slot = slot;
            let Ok(addrs) = ctx.resolver.resolve(&ctx.offload, &host, port).await else {
                return;
            };
            let Some(dest) = addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()) else {
                return;
            };
            if association.socket.send_to(&payload, *dest).await.is_ok() {
                ctx.counters
                    .core(ctx.core)
                    .add_received(payload.len() as u64);
                if let Some(live) = association.live.borrow().as_ref() {
                    live.add_recv(payload.len() as u64);
                }
            }
        })
        .detach();
    }

    #[allow(clippy::too_many_arguments)]
    fn association(
        &self,
        ctx: &Rc<CoreContext>,
        driver: &Rc<Driver>,
        conn: ConnectionHandle,
        flow: u32,
        peer: SocketAddr,
        first: &TargetAddr,
        backend: &str,
    ) -> Option<Rc<Association>> {
        let key = (conn, flow);
        if let Some(a) = self.flows.borrow().get(&key).filter(|a| !a.ended.get()) {
            return Some(a.clone());
        }
        let mut flows = self.flows.borrow_mut();
        flows.retain(|_, a| !a.ended.get());
        if flows.keys().filter(|(c, _)| *c == conn).count() >= MAX_FLOWS_PER_CONNECTION {
            return None;
        }
        // Dual-stack where the host has IPv6, IPv4 otherwise.
        let socket = UdpSocket::bind(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0))
            .or_else(|_| UdpSocket::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)))
            .ok()?;
        let socket = Rc::new(socket);
        let live = Rc::new(RefCell::new(None));
        let ended = Rc::new(Cell::new(false));
        let last_active = Rc::new(Cell::new(Instant::now()));
        let replies = {
            let (socket, driver, live, ended, last_active) = (
                socket.clone(),
                driver.clone(),
                live.clone(),
                ended.clone(),
                last_active.clone(),
            );
            let idle = ctx.current_snapshot().timeouts.idle;
            let ctx = ctx.clone();
            let (label, backend) = (first.to_string(), backend.to_owned());
            glommio::spawn_local(async move {
                let registered =
                    crate::proxied::Registered::new(&ctx, peer, label, backend, Protocol::Quic);
                *live.borrow_mut() = Some(registered.shared());
                let mut buf = vec![0u8; 65_536];
                loop {
                    // idle counts from the last datagram either way
                    let quiet = last_active.get().elapsed();
                    if quiet >= idle {
                        ended.set(true);
                        return;
                    }
                    // None: quiet until the timer (look again), Some(None): the socket failed
                    let got = futures_lite::future::or(
                        async { Some(socket.recv_from(&mut buf).await.ok()) },
                        async {
                            glommio::timer::sleep(idle - quiet).await;
                            None
                        },
                    )
                    .await;
                    let Some(received) = got else {
                        continue;
                    };
                    let Some((n, from)) = received else {
                        ended.set(true);
                        return;
                    };
                    last_active.set(Instant::now());
                    let mut out = Vec::with_capacity(n + 32);
                    let from =
                        SocketAddr::new(crate::access_control::canonical(from.ip()), from.port());
                    quic_wire::encode_datagram(
                        flow,
                        &TargetAddr::Ip(from),
                        buf.get(..n).unwrap_or_default(),
                        &mut out,
                    );
                    if driver.send_datagram(conn, Bytes::from(out)) {
                        ctx.counters.core(ctx.core).add_sent(n as u64);
                        registered.conn().add_sent(n as u64);
                    }
                }
            })
        };
        let association = Rc::new(Association {
            socket,
            live,
            ended,
            last_active,
            _replies: replies,
        });
        flows.insert(key, association.clone());
        Some(association)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_in_flight_stop_at_the_bound_and_free_their_places() {
        let count = Rc::new(Cell::new(0));
        let held: Vec<SendSlot> = (0..MAX_SENDS_IN_FLIGHT)
            .map(|_| SendSlot::take(&count).expect("a place"))
            .collect();
        assert!(SendSlot::take(&count).is_none(), "one past the bound");
        drop(held);
        assert_eq!(count.get(), 0);
        assert!(SendSlot::take(&count).is_some());
    }
}
