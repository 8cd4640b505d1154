//! NAT traversal for the mesh peer, sans-IO: a STUN codec (RFC 8489), a STUN binding client that
//! learns the server-reflexive address, a TURN client (RFC 8656: Allocate with long-term
//! credentials, Refresh, CreatePermission, ChannelBind, Send/Data indications, ChannelData), and
//! an ICE-style agent per remote peer (RFC 8445 candidates and priorities, connectivity checks,
//! nomination, RFC 7675 consent) that selects a direct or relayed path.
//!
//! No sockets, no runtime, no clock: the owner feeds datagrams and time in and takes datagrams,
//! timers and events out, so the same code runs on the glommio data-plane core that owns the mesh
//! socket and in plain unit tests. It does not resolve names (the control plane resolves
//! `mesh.stun.servers` / `mesh.turn.servers` with [`ServerUrl`] and passes addresses), does not
//! speak TCP/TLS to servers, and does not authenticate peers (the WireGuard handshake on the
//! selected path does; see [`agent`] for how check credentials are derived).
//!
//! Every datagram of the one mesh socket goes through [`classify`] first (the shared mesh design):
//! STUN and TURN ChannelData go to [`IceEndpoint::handle_datagram`], which hands WireGuard
//! messages back as [`Received::Data`] — also those that came through our TURN relay, unwrapped.
//!
//! # How the peer drives this
//!
//! ```no_run
//! use std::time::Instant;
//! use switchyard_ice::{Endpoint, Event, IceConfig, IceEndpoint, Received};
//!
//! # fn send_to(_: std::net::SocketAddr, _: &[u8]) {}
//! # fn recv_from(_: &mut [u8]) -> (usize, std::net::SocketAddr) { unimplemented!() }
//! # fn wireguard_in(_: std::net::SocketAddr, _: &[u8]) {}
//! # fn publish(_: Vec<Endpoint>) {}
//! # let registry_endpoints_of_b: Vec<Endpoint> = Vec::new();
//! let mut config = IceConfig::new("peer-a", vec!["192.168.1.10:51820".parse().unwrap()]);
//! config.stun_servers = vec!["203.0.113.1:3478".parse().unwrap()]; // resolved mesh.stun.servers
//! let mut ice = IceEndpoint::new(config, Instant::now());
//! publish(ice.local_endpoints()); // register with the host candidates now …
//! // Every peer of the registry's list, and again on `peer.updated` with its new endpoints.
//! # let pair_key = [0u8; 32]; // the X25519 shared secret of the two peers' static keys
//! ice.set_peer("peer-b", &pair_key, &registry_endpoints_of_b, Instant::now());
//! let mut buf = [0u8; 65536];
//! let mut out = Vec::with_capacity(2048);
//! loop {
//!     while let Some(t) = ice.poll_transmit() {
//!         send_to(t.to, &t.bytes);
//!     }
//!     while let Some(event) = ice.poll_event() {
//!         match event {
//!             // … and PATCH the endpoints when srflx/relay candidates arrive.
//!             Event::CandidateGathered(_) => publish(ice.local_endpoints()),
//!             Event::PathSelected { peer, path } => { /* connection_type = path.kind.as_str() */ }
//!             Event::PathLost { peer } => { /* the agent is checking again */ }
//!             // A wrong TURN password: IceError::TurnUnauthorized — log it, relay is off.
//!             Event::ServerFailed { server, error } => {}
//!             _ => {}
//!         }
//!     }
//!     // Sleep until a datagram arrives or ice.poll_timeout(), then:
//!     let (n, from) = recv_from(&mut buf);
//!     match ice.handle_datagram(from, &buf[..n], Instant::now()) {
//!         Received::Data { from, payload, .. } => wireguard_in(from, &payload),
//!         Received::Consumed | Received::Dropped => {}
//!     }
//!     ice.handle_timeout(Instant::now());
//!     // Outgoing WireGuard for peer-b along the selected path: as it is when direct, framed
//!     // (ChannelData or a Send indication) in a reused buffer when through our relay.
//!     let wireguard = b"\x04\0\0\0 a WireGuard transport message";
//!     if let Some((to, framed)) = ice.encapsulate_into("peer-b", wireguard, &mut out) {
//!         send_to(to, if framed { &out } else { wireguard });
//!     }
//! }
//! ```

pub mod agent;
pub mod binding;
pub mod candidate;
pub mod channel_data;
mod endpoint;
mod error;
pub mod stun;
pub mod transaction;
pub mod turn;
mod url;

pub use agent::{pair_password, AgentConfig, Path, PathKind, Via};
pub use candidate::{Candidate, CandidateKind, Endpoint};
pub use endpoint::{Event, IceConfig, IceEndpoint, Received, Transmit, TurnServerConfig};
pub use error::IceError;
pub use url::{ServerUrl, DEFAULT_PORT};

/// What a datagram on the mesh socket is, by its first bytes (the shared mesh design, point 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatagramKind {
    /// STUN: top two bits 00, the magic cookie, a length field that matches.
    Stun,
    /// TURN ChannelData: first byte 0x40..=0x7F and a length that fits.
    ChannelData,
    /// Anything else (WireGuard: a little-endian type 1..=4).
    Other,
}

pub fn classify(datagram: &[u8]) -> DatagramKind {
    if stun::Message::looks_like_stun(datagram) {
        DatagramKind::Stun
    } else if channel_data::decode(datagram).is_some() {
        DatagramKind::ChannelData
    } else {
        DatagramKind::Other
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn classifies_the_three_kinds() {
        let stun = stun::Message::new(stun::Class::Request, stun::Method::Binding, [1; 12])
            .encode(None, true)
            .unwrap();
        assert_eq!(classify(&stun), DatagramKind::Stun);
        // A STUN header whose length field lies is not STUN.
        let mut lying = stun.clone();
        lying.push(0);
        assert_eq!(classify(&lying), DatagramKind::Other);
        assert_eq!(
            classify(&channel_data::encode(0x4000, b"x")),
            DatagramKind::ChannelData
        );
        // WireGuard handshake initiation / response / cookie / data: type as little-endian u32.
        for t in 1u8..=4 {
            let mut wg = vec![t, 0, 0, 0];
            wg.extend_from_slice(&[0xAB; 144]);
            assert_eq!(classify(&wg), DatagramKind::Other);
        }
        assert_eq!(classify(&[]), DatagramKind::Other);
        assert_eq!(classify(&[0x40, 0, 0]), DatagramKind::Other);
    }

    /// Random datagrams fed to a live endpoint never panic it.
    #[test]
    fn endpoint_survives_random_datagrams() {
        let now = std::time::Instant::now();
        let mut config = IceConfig::new("a", vec!["127.0.0.1:1000".parse().unwrap()]);
        let server: std::net::SocketAddr = "127.0.0.1:3478".parse().unwrap();
        config.stun_servers = vec![server];
        config.turn_servers = vec![TurnServerConfig {
            addr: server,
            username: "u".into(),
            password: "p".into(),
        }];
        let mut ice = IceEndpoint::new(config, now);
        ice.set_peer(
            "b",
            b"pair",
            &[
                Candidate::new(CandidateKind::Host, "127.0.0.1:2000".parse().unwrap(), 1)
                    .to_endpoint(),
            ],
            now,
        );
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let seeds: Vec<Vec<u8>> = std::iter::from_fn(|| ice.poll_transmit())
            .map(|t| t.bytes)
            .collect();
        for i in 0..20_000 {
            let mut d = if i % 2 == 0 {
                seeds[rng.gen_range(0..seeds.len())].clone()
            } else {
                (0..rng.gen_range(0..80)).map(|_| rng.gen()).collect()
            };
            if !d.is_empty() {
                let at = rng.gen_range(0..d.len());
                d[at] = rng.gen();
                d.truncate(rng.gen_range(0..=d.len()));
            }
            if i % 3 == 0 && d.len() >= 4 {
                d[0] = 0x40;
            }
            let from = if rng.gen_bool(0.5) {
                server
            } else {
                "127.0.0.1:2000".parse().unwrap()
            };
            let _ = ice.handle_datagram(from, &d, now);
        }
    }
}
