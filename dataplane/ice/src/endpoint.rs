//! [`IceEndpoint`]: NAT traversal for the one UDP socket of a mesh peer. It gathers our
//! candidates (host, server-reflexive from every STUN server, relayed from every TURN server —
//! one allocation per server, shared by all remote peers), runs one [`Agent`] per remote peer,
//! and demultiplexes what the socket receives: STUN and ChannelData are consumed here, everything
//! else (WireGuard) is handed back as [`Received::Data`], unwrapped when it came through our relay.

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::agent::{Agent, AgentConfig, AgentEvent, Outgoing, Path, Via};
use crate::binding::{BindingClient, BindingEvent};
use crate::candidate::{Candidate, CandidateKind, Endpoint};
use crate::stun::{Class, Message, Method};
use crate::turn::{TurnClient, TurnEvent, TurnState};
use crate::{classify, DatagramKind, IceError};

/// One TURN server from `mesh.turn.servers`, its host already resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnServerConfig {
    pub addr: SocketAddr,
    pub username: String,
    pub password: String,
}

/// Everything the endpoint needs, from the `mesh.*` keys (server names resolved by the caller).
#[derive(Debug, Clone)]
pub struct IceConfig {
    /// This peer's id in the mesh network.
    pub local_id: String,
    /// Keys the check password ([`crate::pair_password`]): the network pre-shared key, or empty.
    pub secret: Vec<u8>,
    /// The socket's own addresses (interface address + the socket's port): host candidates.
    pub host_addrs: Vec<SocketAddr>,
    /// `mesh.stun.servers`.
    pub stun_servers: Vec<SocketAddr>,
    /// `mesh.turn.servers` (used only when `agent.relay_enabled`).
    pub turn_servers: Vec<TurnServerConfig>,
    /// `mesh.connection.keep_alive_interval`: how often the STUN mapping is asked again (keeps
    /// the NAT binding open).
    pub keepalive_interval: Duration,
    /// Timeouts, checks, nomination, consent and the direct/relay policy (`agent.stun_timeout`
    /// also caps the STUN and TURN transactions).
    pub agent: AgentConfig,
}

impl IceConfig {
    /// The spec's sample values for everything but the id and the host addresses.
    pub fn new(local_id: &str, host_addrs: Vec<SocketAddr>) -> IceConfig {
        IceConfig {
            local_id: local_id.to_string(),
            secret: Vec::new(),
            host_addrs,
            stun_servers: Vec::new(),
            turn_servers: Vec::new(),
            keepalive_interval: Duration::from_secs(25),
            agent: AgentConfig::default(),
        }
    }
}

/// A datagram for the socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub to: SocketAddr,
    pub bytes: Vec<u8>,
}

/// What [`IceEndpoint::handle_datagram`] made of a datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received<'a> {
    /// STUN or TURN traffic, handled here.
    Consumed,
    /// Not ICE traffic (a WireGuard message): from the peer's address `from`, arriving `via` our
    /// socket directly or through our relay (then unwrapped).
    Data {
        from: SocketAddr,
        via: Via,
        payload: Cow<'a, [u8]>,
    },
    /// STUN/ChannelData that is malformed or nobody's: drop and count it.
    Dropped,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A new local candidate (or a changed one): republish [`IceEndpoint::local_endpoints`].
    CandidateGathered(Candidate),
    /// A STUN or TURN server failed (a wrong TURN password is [`IceError::TurnUnauthorized`]).
    ServerFailed {
        server: SocketAddr,
        error: IceError,
    },
    PathSelected {
        peer: String,
        path: Path,
    },
    PathLost {
        peer: String,
    },
    /// No path to the peer within `connect_timeout`; checks go on.
    Unreachable {
        peer: String,
    },
}

pub struct IceEndpoint {
    config: IceConfig,
    candidates: Vec<Candidate>,
    stun: Vec<BindingClient>,
    turn: Vec<TurnClient>,
    /// (TURN server, our relayed address there) of each live allocation.
    relays: Vec<(SocketAddr, SocketAddr)>,
    agents: BTreeMap<String, Agent>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
}

impl IceEndpoint {
    /// Starts gathering at once: the first transmits are the STUN Binding and TURN Allocate
    /// requests.
    pub fn new(config: IceConfig, now: Instant) -> IceEndpoint {
        let candidates = config
            .host_addrs
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let preference = u16::MAX.saturating_sub(u16::try_from(i).unwrap_or(u16::MAX));
                Candidate::new(CandidateKind::Host, *a, preference)
            })
            .collect();
        let stun = config
            .stun_servers
            .iter()
            .map(|s| {
                BindingClient::new(
                    *s,
                    config.agent.stun_timeout,
                    config.keepalive_interval,
                    now,
                )
            })
            .collect();
        let turn = if config.agent.relay_enabled {
            config
                .turn_servers
                .iter()
                .map(|t| {
                    TurnClient::new(
                        t.addr,
                        &t.username,
                        &t.password,
                        config.agent.stun_timeout,
                        now,
                    )
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut endpoint = IceEndpoint {
            config,
            candidates,
            stun,
            turn,
            relays: Vec::new(),
            agents: BTreeMap::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
        };
        endpoint.handle_timeout(now);
        endpoint
    }

    pub fn local_candidates(&self) -> &[Candidate] {
        &self.candidates
    }

    /// Our candidates as the spec's Mesh endpoints, for registration and PATCH.
    pub fn local_endpoints(&self) -> Vec<Endpoint> {
        self.candidates.iter().map(Candidate::to_endpoint).collect()
    }

    /// The state of our allocation on each TURN server.
    pub fn turn_states(&self) -> Vec<(SocketAddr, TurnState)> {
        self.turn
            .iter()
            .map(|t| (t.server(), t.state().clone()))
            .collect()
    }

    /// Adds a remote peer, or adds candidates to a known one. Endpoints that are not valid
    /// candidates are skipped and returned as errors.
    /// Adds or updates a peer with its registry endpoints. `pair_key` is a secret only the two
    /// peers share (the mesh passes the X25519 shared secret of their static keys): with the
    /// network secret it keys the pair's check password, so knowing the ids is not enough to
    /// answer or forge checks. It is read when the peer's agent is made (a peer whose key
    /// changed must be removed first).
    pub fn set_peer(
        &mut self,
        peer: &str,
        pair_key: &[u8],
        endpoints: &[Endpoint],
        now: Instant,
    ) -> Vec<IceError> {
        let mut errors = Vec::new();
        let candidates: Vec<Candidate> = endpoints
            .iter()
            .filter_map(|e| {
                Candidate::from_endpoint(e)
                    .map_err(|err| errors.push(err))
                    .ok()
            })
            .collect();
        if peer == self.config.local_id {
            return errors;
        }
        let agent = self.agents.entry(peer.to_string()).or_insert_with(|| {
            let secret = [self.config.secret.as_slice(), pair_key].concat();
            let mut agent = Agent::new(
                &self.config.local_id,
                peer,
                &secret,
                self.config.agent.clone(),
                now,
            );
            let host_priority = self
                .candidates
                .iter()
                .map(|c| c.priority)
                .max()
                .unwrap_or(0);
            agent.add_local(Via::Direct, host_priority);
            for c in &self.candidates {
                if c.kind == CandidateKind::Relayed {
                    if let Some(t) = self.turn.iter().find(|t| t.relayed() == Some(c.addr)) {
                        agent.add_local(Via::Relay(t.server()), c.priority);
                    }
                }
            }
            agent
        });
        agent.add_remote_candidates(&candidates);
        // Let the peer's checks in through each of our relays (permissions are per IP).
        for c in &candidates {
            for t in &mut self.turn {
                t.create_permission(c.addr.ip(), now);
            }
        }
        self.flush(now);
        errors
    }

    pub fn remove_peer(&mut self, peer: &str) {
        self.agents.remove(peer);
    }

    pub fn selected_path(&self, peer: &str) -> Option<Path> {
        self.agents.get(peer).and_then(Agent::selected)
    }

    /// Frames a datagram for `peer` along its selected path; None while there is none.
    pub fn encapsulate(&self, peer: &str, data: &[u8]) -> Option<Transmit> {
        let path = self.selected_path(peer)?;
        self.route(path.via, path.remote, data)
    }

    /// The data plane's form of [`IceEndpoint::encapsulate`]: where to send `data` for `peer`,
    /// and whether `out` (a buffer the caller reuses) holds the framed datagram to send instead
    /// of `data` (true when the path goes through our relay). None while there is no path.
    pub fn encapsulate_into(
        &self,
        peer: &str,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Option<(SocketAddr, bool)> {
        let path = self.selected_path(peer)?;
        self.encapsulate_via(path.via, path.remote, data, out)
    }

    /// [`IceEndpoint::encapsulate_into`] along a given way out instead of the selected path
    /// (the data plane answers a datagram the way it came, also before a path is selected).
    /// None when `via` names a TURN server we have no allocation on.
    pub fn encapsulate_via(
        &self,
        via: Via,
        remote: SocketAddr,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Option<(SocketAddr, bool)> {
        match via {
            Via::Direct => Some((remote, false)),
            Via::Relay(server) => {
                let turn = self.turn.iter().find(|t| t.server() == server)?;
                turn.wrap_into(remote, data, out).then_some((server, true))
            }
        }
    }

    fn route(&self, via: Via, to: SocketAddr, bytes: &[u8]) -> Option<Transmit> {
        match via {
            Via::Direct => Some(Transmit {
                to,
                bytes: bytes.to_vec(),
            }),
            Via::Relay(server) => {
                let turn = self.turn.iter().find(|t| t.server() == server)?;
                Some(Transmit {
                    to: server,
                    bytes: turn.wrap(to, bytes)?,
                })
            }
        }
    }

    /// Releases the TURN allocations (call before closing the socket, then drain transmits).
    pub fn close(&mut self, now: Instant) {
        for t in &mut self.turn {
            t.deallocate(now);
        }
        self.agents.clear();
        self.flush(now);
    }

    pub fn handle_datagram<'a>(
        &mut self,
        from: SocketAddr,
        datagram: &'a [u8],
        now: Instant,
    ) -> Received<'a> {
        let from_turn = self.turn.iter().position(|t| t.server() == from);
        let received = match (classify(datagram), from_turn) {
            (DatagramKind::ChannelData, Some(i)) => match self.turn[i].unwrap_channel(datagram) {
                Some((peer, inner)) => {
                    let via = Via::Relay(from);
                    self.handle_inner(via, peer, Cow::Borrowed(inner), now)
                }
                None => Received::Dropped,
            },
            (DatagramKind::ChannelData, None) => Received::Dropped,
            (DatagramKind::Stun, _) => self.handle_stun(from, from_turn, datagram, now),
            (DatagramKind::Other, _) => Received::Data {
                from,
                via: Via::Direct,
                payload: Cow::Borrowed(datagram),
            },
        };
        self.flush(now);
        received
    }

    fn handle_stun<'a>(
        &mut self,
        from: SocketAddr,
        from_turn: Option<usize>,
        datagram: &'a [u8],
        now: Instant,
    ) -> Received<'a> {
        let Ok(message) = Message::decode(datagram) else {
            return Received::Dropped;
        };
        for b in self.stun.iter_mut().filter(|b| b.server() == from) {
            if b.handle_message(&message, now) {
                return Received::Consumed;
            }
        }
        if let Some(i) = from_turn {
            let via = Via::Relay(from);
            if let Some((peer, data)) = self.turn[i].handle_message(&message, datagram, now) {
                return self.handle_inner(via, peer, Cow::Owned(data), now);
            }
            if matches!(message.class, Class::Success | Class::Error)
                && message.method != Method::Binding
            {
                return Received::Consumed;
            }
        }
        if self.handle_check(Via::Direct, from, &message, datagram, now) {
            Received::Consumed
        } else {
            Received::Dropped
        }
    }

    /// A datagram that came through our relay from `peer`.
    fn handle_inner<'a>(
        &mut self,
        via: Via,
        peer: SocketAddr,
        inner: Cow<'a, [u8]>,
        now: Instant,
    ) -> Received<'a> {
        if classify(&inner) != DatagramKind::Stun {
            return Received::Data {
                from: peer,
                via,
                payload: inner,
            };
        }
        let Ok(message) = Message::decode(&inner) else {
            return Received::Dropped;
        };
        if self.handle_check(via, peer, &message, &inner, now) {
            Received::Consumed
        } else {
            Received::Dropped
        }
    }

    /// A connectivity check or its answer, for the agent it names.
    fn handle_check(
        &mut self,
        via: Via,
        from: SocketAddr,
        message: &Message,
        raw: &[u8],
        now: Instant,
    ) -> bool {
        if message.method != Method::Binding {
            return false;
        }
        match message.class {
            Class::Request => {
                // USERNAME is "our id:their id".
                let Some(sender) = message
                    .username()
                    .and_then(|u| u.strip_prefix(self.config.local_id.as_str()))
                    .and_then(|u| u.strip_prefix(':'))
                else {
                    return false;
                };
                match self.agents.get_mut(sender) {
                    Some(agent) => agent.handle_request(via, from, message, raw, now),
                    None => false,
                }
            }
            Class::Success | Class::Error => self
                .agents
                .values_mut()
                .any(|a| a.handle_response(via, from, message, raw, now)),
            Class::Indication => false,
        }
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.stun
            .iter()
            .filter_map(BindingClient::poll_timeout)
            .chain(self.turn.iter().filter_map(TurnClient::poll_timeout))
            .chain(self.agents.values().filter_map(Agent::poll_timeout))
            .min()
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        for b in &mut self.stun {
            b.handle_timeout(now);
        }
        for t in &mut self.turn {
            t.handle_timeout(now);
        }
        for a in self.agents.values_mut() {
            a.handle_timeout(now);
        }
        self.flush(now);
    }

    /// Moves what the parts produced into the endpoint's queues, reacting to their events.
    fn flush(&mut self, now: Instant) {
        for i in 0..self.stun.len() {
            while let Some(bytes) = self.stun[i].poll_transmit() {
                let to = self.stun[i].server();
                self.transmits.push_back(Transmit { to, bytes });
            }
            while let Some(event) = self.stun[i].poll_event() {
                let server = self.stun[i].server();
                match event {
                    BindingEvent::Mapped(addr) => {
                        self.add_candidate(CandidateKind::ServerReflexive, addr)
                    }
                    BindingEvent::Failed(error) => {
                        self.events.push_back(Event::ServerFailed { server, error })
                    }
                }
            }
        }
        for i in 0..self.turn.len() {
            while let Some(event) = self.turn[i].poll_event() {
                let server = self.turn[i].server();
                match event {
                    TurnEvent::Allocated { relayed, mapped } => {
                        if let Some(mapped) = mapped {
                            self.add_candidate(CandidateKind::ServerReflexive, mapped);
                        }
                        self.add_candidate(CandidateKind::Relayed, relayed);
                        self.relays.push((server, relayed));
                        let priority = self
                            .candidates
                            .iter()
                            .find(|c| c.addr == relayed)
                            .map(|c| c.priority)
                            .unwrap_or(0);
                        for agent in self.agents.values_mut() {
                            agent.add_local(Via::Relay(server), priority);
                            for c in agent.remote_candidates() {
                                self.turn[i].create_permission(c.addr.ip(), now);
                            }
                        }
                    }
                    TurnEvent::Failed(error) => {
                        self.drop_relay(server, now);
                        self.events.push_back(Event::ServerFailed { server, error });
                    }
                    TurnEvent::Lost => self.drop_relay(server, now),
                }
            }
        }
        // Agents' events first: a path through our relay gets its channel before data flows.
        let mut channels = Vec::new();
        for (peer, agent) in &mut self.agents {
            while let Some(event) = agent.poll_event() {
                self.events.push_back(match event {
                    AgentEvent::PathSelected(path) => {
                        if let Via::Relay(server) = path.via {
                            channels.push((server, path.remote));
                        }
                        Event::PathSelected {
                            peer: peer.clone(),
                            path,
                        }
                    }
                    AgentEvent::PathLost => Event::PathLost { peer: peer.clone() },
                    AgentEvent::Unreachable => Event::Unreachable { peer: peer.clone() },
                });
            }
        }
        for (server, remote) in channels {
            if let Some(t) = self.turn.iter_mut().find(|t| t.server() == server) {
                t.bind_channel(remote, now);
            }
        }
        let mut outgoing: Vec<Outgoing> = Vec::new();
        for agent in self.agents.values_mut() {
            while let Some(o) = agent.poll_outgoing() {
                outgoing.push(o);
            }
        }
        for o in outgoing {
            if let Some(t) = self.route(o.via, o.to, &o.bytes) {
                self.transmits.push_back(t);
            }
        }
        for t in &mut self.turn {
            while let Some(bytes) = t.poll_transmit() {
                self.transmits.push_back(Transmit {
                    to: t.server(),
                    bytes,
                });
            }
        }
    }

    fn drop_relay(&mut self, server: SocketAddr, now: Instant) {
        let relayed: Vec<SocketAddr> = self
            .relays
            .iter()
            .filter(|(s, _)| *s == server)
            .map(|(_, r)| *r)
            .collect();
        self.relays.retain(|(s, _)| *s != server);
        self.candidates
            .retain(|c| c.kind != CandidateKind::Relayed || !relayed.contains(&c.addr));
        for agent in self.agents.values_mut() {
            agent.remove_local(Via::Relay(server), now);
        }
    }

    fn add_candidate(&mut self, kind: CandidateKind, addr: SocketAddr) {
        if self.candidates.iter().any(|c| c.addr == addr) {
            return;
        }
        // A changed NAT mapping adds a candidate; the old one stays published and simply fails
        // its checks.
        let preference = u16::MAX.saturating_sub(
            u16::try_from(self.candidates.iter().filter(|c| c.kind == kind).count())
                .unwrap_or(u16::MAX),
        );
        let candidate = Candidate::new(kind, addr, preference);
        self.candidates.push(candidate);
        self.events.push_back(Event::CandidateGathered(candidate));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    /// The pair key both simulated peers hold.
    const PAIR_KEY: &[u8] = b"pair key";
    use crate::agent::PathKind;

    /// Endpoints on a simulated network with a virtual clock: every transmit to a known
    /// address arrives at once while the network is up.
    struct Sim {
        start: Instant,
        now: Instant,
        nodes: Vec<(SocketAddr, IceEndpoint)>,
        events: Vec<(usize, Event)>,
        up: bool,
        /// Binding requests sent by this node are lost (one-way loss).
        drop_requests_from: Option<usize>,
    }

    impl Sim {
        fn new(ids: &[&str], tweak: impl Fn(&mut IceConfig)) -> Sim {
            let now = Instant::now();
            let nodes: Vec<(SocketAddr, IceEndpoint)> = ids
                .iter()
                .enumerate()
                .map(|(i, id)| {
                    let addr: SocketAddr = format!("10.0.0.{}:51820", i + 1).parse().unwrap();
                    let mut c = IceConfig::new(id, vec![addr]);
                    tweak(&mut c);
                    (addr, IceEndpoint::new(c, now))
                })
                .collect();
            let mut sim = Sim {
                start: now,
                now,
                nodes,
                events: Vec::new(),
                up: true,
                drop_requests_from: None,
            };
            let all: Vec<(String, Vec<Endpoint>)> = ids
                .iter()
                .zip(&sim.nodes)
                .map(|(id, (_, e))| (id.to_string(), e.local_endpoints()))
                .collect();
            for (_, e) in &mut sim.nodes {
                for (id, endpoints) in &all {
                    assert!(e.set_peer(id, PAIR_KEY, endpoints, now).is_empty());
                }
            }
            sim
        }

        /// Runs until `done` or `limit` of virtual time passed; true when done.
        fn run(&mut self, limit: Duration, done: impl Fn(&Sim) -> bool) -> bool {
            let end = self.now + limit;
            let mut stuck = 0;
            loop {
                let mut moved = true;
                while moved {
                    moved = false;
                    for i in 0..self.nodes.len() {
                        let from = self.nodes[i].0;
                        while let Some(t) = self.nodes[i].1.poll_transmit() {
                            moved = true;
                            let Some(j) = self.nodes.iter().position(|(a, _)| *a == t.to) else {
                                continue;
                            };
                            let request =
                                Message::decode(&t.bytes).is_ok_and(|m| m.class == Class::Request);
                            if self.up && !(request && self.drop_requests_from == Some(i)) {
                                let now = self.now;
                                let r = self.nodes[j].1.handle_datagram(from, &t.bytes, now);
                                assert_eq!(r, Received::Consumed);
                            }
                        }
                        while let Some(e) = self.nodes[i].1.poll_event() {
                            self.events.push((i, e));
                        }
                    }
                }
                if done(self) {
                    return true;
                }
                let next = self
                    .nodes
                    .iter()
                    .filter_map(|(_, e)| e.poll_timeout())
                    .min();
                // A timer that stays due after handle_timeout would spin a real event loop.
                if next.is_some_and(|t| t <= self.now) {
                    stuck += 1;
                    assert!(
                        stuck < 1000,
                        "a timer stays due at {:?}",
                        next.map(|t| t - self.start)
                    );
                } else {
                    stuck = 0;
                }
                match next {
                    Some(t) if t <= end => {
                        self.now = self.now.max(t);
                        let now = self.now;
                        for (_, e) in &mut self.nodes {
                            e.handle_timeout(now);
                        }
                    }
                    _ => return false,
                }
            }
        }

        fn selected(&self, i: usize, peer: &str) -> Option<Path> {
            self.nodes[i].1.selected_path(peer)
        }

        fn count(&self, pick: impl Fn(&Event) -> bool) -> usize {
            self.events.iter().filter(|(_, e)| pick(e)).count()
        }
    }

    #[test]
    fn direct_path_selected_lost_and_found_again() {
        let mut sim = Sim::new(&["a", "b"], |_| {});
        assert!(sim.run(Duration::from_secs(10), |s| {
            s.selected(0, "b").is_some() && s.selected(1, "a").is_some()
        }));
        let path = sim.selected(0, "b").unwrap();
        assert_eq!(path.kind, PathKind::Direct);
        assert_eq!(path.remote, sim.nodes[1].0);
        assert_eq!(sim.count(|e| matches!(e, Event::PathSelected { .. })), 2);

        // Consent keeps the path while the network is up …
        assert!(!sim.run(Duration::from_secs(120), |s| s
            .count(|e| matches!(e, Event::PathLost { .. }))
            > 0));
        // … and both sides lose it when it goes down.
        sim.up = false;
        assert!(sim.run(Duration::from_secs(60), |s| s
            .count(|e| matches!(e, Event::PathLost { .. }))
            == 2));
        assert_eq!(sim.selected(0, "b"), None);
        // Checks go on; when the network is back, the path is found again.
        sim.up = true;
        assert!(sim.run(Duration::from_secs(120), |s| {
            s.selected(0, "b").is_some() && s.selected(1, "a").is_some()
        }));
        assert_eq!(sim.count(|e| matches!(e, Event::PathSelected { .. })), 4);
    }

    #[test]
    fn controlled_side_that_lost_the_path_alone_gets_it_back() {
        let mut sim = Sim::new(&["a", "b"], |_| {});
        assert!(sim.run(Duration::from_secs(10), |s| {
            s.selected(0, "b").is_some() && s.selected(1, "a").is_some()
        }));
        // b's consent checks go unanswered; a's are answered: only b (controlled) loses it.
        sim.drop_requests_from = Some(1);
        assert!(sim.run(Duration::from_secs(60), |s| s
            .count(|e| matches!(e, Event::PathLost { .. }))
            == 1));
        assert_eq!(sim.selected(1, "a"), None);
        assert!(sim.selected(0, "b").is_some());
        sim.drop_requests_from = None;
        assert!(sim.run(Duration::from_secs(60), |s| s.selected(1, "a").is_some()));
        assert_eq!(sim.count(|e| matches!(e, Event::PathLost { .. })), 1);
    }

    #[test]
    fn no_path_means_unreachable_and_checks_go_on() {
        let mut sim = Sim::new(&["a", "b"], |c| {
            c.agent.connect_timeout = Duration::from_secs(10)
        });
        sim.up = false;
        assert!(sim.run(Duration::from_secs(30), |s| s
            .count(|e| matches!(e, Event::Unreachable { .. }))
            == 2));
        sim.up = true;
        assert!(sim.run(Duration::from_secs(60), |s| {
            s.selected(0, "b").is_some() && s.selected(1, "a").is_some()
        }));
    }

    #[test]
    fn direct_connect_off_and_no_relay_means_no_path() {
        let mut sim = Sim::new(&["a", "b"], |c| c.agent.direct_connect = false);
        assert!(!sim.run(Duration::from_secs(60), |s| s.selected(0, "b").is_some()));
        assert_eq!(sim.count(|e| matches!(e, Event::Unreachable { .. })), 2);
    }

    /// Replaces b with one made by `make` (given b's address and a's endpoints) and checks
    /// that b drops a's first check, unanswered.
    fn a_check_is_dropped_by(make: impl FnOnce(SocketAddr, &[Endpoint], Instant) -> IceEndpoint) {
        let mut sim = Sim::new(&["a", "b"], |_| {});
        let a_endpoints = sim.nodes[0].1.local_endpoints();
        sim.nodes[1].1 = make(sim.nodes[1].0, &a_endpoints, sim.now);
        let now = sim.now;
        sim.nodes[0].1.handle_timeout(now);
        let t = sim.nodes[0].1.poll_transmit().expect("a check");
        let a_addr = sim.nodes[0].0;
        assert_eq!(
            sim.nodes[1].1.handle_datagram(a_addr, &t.bytes, now),
            Received::Dropped
        );
        assert!(sim.nodes[1].1.poll_transmit().is_none());
    }

    #[test]
    fn checks_with_another_networks_secret_are_dropped() {
        // b derives its check password from a different network key
        a_check_is_dropped_by(|b_addr, a_endpoints, now| {
            let mut c = IceConfig::new("b", vec![b_addr]);
            c.secret = b"other network".to_vec();
            let mut b = IceEndpoint::new(c, now);
            b.set_peer("a", PAIR_KEY, a_endpoints, now);
            b
        });
    }

    #[test]
    fn checks_keyed_for_another_pair_are_dropped() {
        // same network, same ids, but b's pair key is not the one a holds (an outsider who
        // knows both ids)
        a_check_is_dropped_by(|b_addr, a_endpoints, now| {
            let mut b = IceEndpoint::new(IceConfig::new("b", vec![b_addr]), now);
            b.set_peer("a", b"not our pair", a_endpoints, now);
            b
        });
    }
}
