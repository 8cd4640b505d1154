//! Mesh routing for the Switchyard mesh peer, as plain code: no sockets, no runtime, no clock.
//! Time comes in as `Instant` arguments and everything to send comes out as
//! `(neighbour peer id, datagram)` pairs for the mesh control port ([`CONTROL_PORT`], 7387,
//! UDP from virtual IP to virtual IP inside the sessions). The peer owns the sessions, the
//! device and the timers; this crate decides.
//!
//! * [`wire`]: the control messages (route announcement, latency probe and reply, group
//!   membership, flooded broadcast/multicast packet): versioned, first byte = kind, bounded,
//!   with a decoder that never panics.
//! * [`Router`] (module [`router`]): the distance-vector table — direct neighbours with
//!   measured latency, routes learned from announcements, metric = latency ms + hop count ×
//!   100, split horizon with poisoned reverse, path-vector loop prevention, `max_hops`,
//!   `route_timeout`, triggered withdrawals, periodic announcements with jitter, hysteresis;
//!   plus probes, group membership, anycast choice and the broadcast/multicast delivery tree.
//! * [`delivery`]: which traffic mode (unicast, broadcast, multicast, anycast) an IP packet
//!   from the device asks for, from its destination address.
//! * [`l2`]: TAP-mode helpers — EtherIP (RFC 3378) encapsulation, the generated device MAC,
//!   the MAC learning table with the flood/unicast decision, ARP parsing and building.
//!
//! Broadcast and multicast packets cross the mesh as [`wire::Flood`] control messages (kind 5
//! on port 7387): the peer consumes them like the other control messages and writes the
//! carried packet to its device when [`ControlOutcome::deliver`] says so.
//!
//! Not here: sessions (boringtun), NAT traversal (`switchyard-ice`), the registry, the device.
//! The peer forwards packets for other virtual IPs hop by hop with [`decrement_ttl`] (dropping
//! at TTL 0, the other half of loop prevention) and [`Router::next_hop`].
//!
//! # How the peer drives this
//!
//! ```
//! use std::net::Ipv4Addr;
//! use std::time::{Duration, Instant};
//! use switchyard_mesh_routing::{
//!     classify_destination, AnycastTarget, Delivery, FloodMode, MeshNetwork, Router, RoutingConfig,
//! };
//!
//! // Stand-ins for the peer's own I/O.
//! fn send_control(_neighbour: &str, _datagram: &[u8]) { /* UDP vip→vip:7387 via its session */ }
//! fn send_packet(_neighbour: &str, _packet: &[u8]) { /* encrypt with that neighbour's session */ }
//! fn write_device(_packet: &[u8]) {}
//!
//! let now = Instant::now();
//! // From mesh.routing: max_hops, route_timeout, split_horizon.
//! let config = RoutingConfig::new(8, Duration::from_secs(300), true);
//! // seq_start: Unix microseconds (grows across restarts); random_seed: any random u64.
//! let mut router =
//!     Router::new("peer-a", Ipv4Addr::new(10, 99, 0, 1), config, 1_700_000_000_000_000, 42, now)?;
//!
//! // A session came up (ICE + boringtun): tell the router, with the measured round trip.
//! router.neighbour_up("peer-b", Ipv4Addr::new(10, 99, 0, 2), Duration::from_millis(12), now)?;
//!
//! // After every event, and whenever router.poll_timeout() passes: send what is due.
//! for (neighbour, datagram) in router.poll_announcements(now) {
//!     send_control(&neighbour, &datagram);
//! }
//!
//! // A datagram arrived on port 7387 through peer-b's session.
//! # let datagram = switchyard_mesh_routing::wire::Message::Probe(
//! #     switchyard_mesh_routing::wire::Probe { nonce: 1, timestamp_us: 2 }).encode()?;
//! let outcome = router.handle_control("peer-b", &datagram, now)?;
//! for (neighbour, reply) in &outcome.send {
//!     send_control(neighbour, reply);
//! }
//! if let Some(packet) = &outcome.deliver {
//!     write_device(packet); // a broadcast or multicast packet for us
//! }
//!
//! // A packet read from the device (here UDP from 10.99.0.1 to 10.99.0.2).
//! let packet = [0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0, 10, 99, 0, 1, 10, 99, 0, 2];
//! let network =
//!     MeshNetwork::new("10.99.0.0/16".parse()?, router.local_vip(), router.known_groups());
//! match classify_destination(&packet, &network) {
//!     Ok(Delivery::Unicast(vip)) => {
//!         // The neighbour to encrypt for: the destination itself when direct.
//!         if let Some(hop) = router.next_hop(vip) {
//!             send_packet(&hop.peer_id, &packet);
//!         }
//!     }
//!     Ok(Delivery::Broadcast) => {
//!         for (n, d) in router.originate_flood(FloodMode::Broadcast, packet.to_vec(), now)? {
//!             send_control(&n, &d);
//!         }
//!     }
//!     Ok(Delivery::Multicast(group)) => {
//!         for (n, d) in router.originate_flood(FloodMode::Multicast(group), packet.to_vec(), now)? {
//!             send_control(&n, &d);
//!         }
//!     }
//!     Ok(Delivery::Anycast(group)) => match router.anycast_target(group) {
//!         Some(AnycastTarget::Remote(hop)) => send_packet(&hop.peer_id, &packet),
//!         Some(AnycastTarget::Local) => write_device(&packet),
//!         None => {}
//!     },
//!     Ok(Delivery::Local) | Ok(Delivery::NotMesh) | Err(_) => {}
//! }
//!
//! // A packet from a session for another vip (only when relay_via_peers is on):
//! let mut forwarded = packet;
//! if switchyard_mesh_routing::decrement_ttl(&mut forwarded)? == switchyard_mesh_routing::Forward::Forward {
//!     if let Some(hop) = router.next_hop(Ipv4Addr::new(10, 99, 0, 2)) {
//!         send_packet(&hop.peer_id, &forwarded);
//!     }
//! }
//!
//! // The session went away: routes through it are withdrawn at the next poll.
//! router.neighbour_down("peer-b", now);
//! // GET /api/v1/mesh/routes maps router.routes() (RouteView) field by field.
//! assert!(router.routes().is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! In TAP mode frames from the device go through [`l2::learning::MacTable::decide`]: unicast
//! to the learned peer, or flood (one EtherIP copy per peer, [`l2::etherip::encapsulate`]);
//! frames from peers are decapsulated, their source MAC learned, and written to the device.
//!
//! Non-test code may not panic on input: indexing, `unwrap`, `expect` and `panic!` are denied.
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(
        clippy::indexing_slicing,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo
    )
)]

pub mod delivery;
pub mod groups;
pub mod l2;
pub mod router;
pub mod seen;
pub mod wire;

pub use delivery::{
    classify_destination, decrement_ttl, ClassifyError, Delivery, Forward, MeshNetwork,
};
pub use router::{
    metric, AnycastTarget, ControlOutcome, NextHop, RouteKind, RouteView, Router, RouterStats,
    RoutingConfig, RoutingError, HOP_PENALTY_MS,
};
pub use wire::{FloodMode, Message, CONTROL_PORT};
