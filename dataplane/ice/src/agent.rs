//! The ICE-style agent for one remote peer (RFC 8445, simplified for the mesh): pairs our ways
//! out (the socket directly, or through one of our TURN allocations) with the peer's candidates,
//! runs connectivity checks, nominates (the peer with the lower id controls), keeps consent
//! (RFC 7675) on the selected pair, and starts over when the path is lost.
//!
//! Credentials: no offer/answer exchange exists in the mesh, so both sides derive them. The
//! username of a check is `receiver_id:sender_id` (RFC 8445 §7.2.2's RFRAG:LFRAG with peer ids as
//! ufrags) and the password is [`pair_password`], the same for both directions, keyed with the
//! network secret and the pair's own key (the mesh gives the X25519 shared secret of the two
//! static keys). MESSAGE-INTEGRITY therefore keeps checks of different pairs apart, and an
//! outsider who knows both ids can neither answer nor forge a check; the WireGuard handshake on
//! the selected path still authenticates the peer.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::Rng;

use crate::binding::success_response;
use crate::candidate::{pair_priority, priority, Candidate, CandidateKind};
use crate::stun::{hmac_sha1, Attribute, Class, Message, Method, TransactionId};
use crate::transaction::{Retransmit, TimerAction, INITIAL_RTO};

/// Most peer-reflexive remote candidates an agent holds: each came from a check whose source
/// address anyone on the path can rewrite (a replayed check keeps its integrity), and each
/// costs checks sent to it. A new one beyond this replaces the oldest one not in use.
pub const MAX_PEER_REFLEXIVE: usize = 8;

/// How our side of a pair sends: from the socket itself, or through our allocation on the TURN
/// server at this address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Via {
    Direct,
    Relay(SocketAddr),
}

/// Whether a selected path passes a TURN relay (ours or the peer's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathKind {
    Direct,
    Relayed,
}

impl PathKind {
    /// The spec's `connection_type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            PathKind::Direct => "direct",
            PathKind::Relayed => "relayed",
        }
    }
}

/// The selected path to a peer: send to `remote`, `via` our socket or our relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Path {
    pub kind: PathKind,
    pub via: Via,
    pub remote: SocketAddr,
}

/// The check password both peers of a pair derive: hex HMAC-SHA1 keyed with `secret` (the
/// network pre-shared key followed by the pair's key; a fixed label when empty) over the two
/// ids in order.
pub fn pair_password(secret: &[u8], a: &str, b: &str) -> String {
    let (low, high) = if a <= b { (a, b) } else { (b, a) };
    let key: &[u8] = if secret.is_empty() {
        b"switchyard-mesh-ice"
    } else {
        secret
    };
    let mut input = Vec::with_capacity(low.len() + high.len() + 1);
    input.extend_from_slice(low.as_bytes());
    input.push(0);
    input.extend_from_slice(high.as_bytes());
    hmac_sha1(key, &input)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Timing and policy of the agents (from `mesh.stun` and `mesh.connection`).
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// `mesh.stun.timeout`: caps every STUN/TURN transaction and connectivity check.
    pub stun_timeout: Duration,
    /// `mesh.connection.connect_timeout`: after this long without a path, the agent reports
    /// the peer unreachable (and goes on checking).
    pub connect_timeout: Duration,
    /// Consent checks on a selected path go out this often (RFC 7675: about 5 s) …
    pub consent_interval: Duration,
    /// … and the path is lost when none was answered for this long (RFC 7675: 30 s).
    pub consent_timeout: Duration,
    /// The controlling side nominates a valid pair at the latest this long after the first one
    /// succeeded, even while better pairs are still being checked.
    pub nomination_wait: Duration,
    /// Ta: one new check per this interval (RFC 8445 §14.2 recommends 50 ms).
    pub check_pacing: Duration,
    /// While a path is selected, better pairs that failed are checked again this often, so a
    /// relayed path becomes direct once the NATs allow it.
    pub upgrade_interval: Duration,
    /// `mesh.connection.direct_connect`: pairs without a relay on either side.
    pub direct_connect: bool,
    /// `mesh.connection.relay_enabled`: our TURN allocations and the peer's relay candidates.
    pub relay_enabled: bool,
}

impl Default for AgentConfig {
    /// The spec's sample values (`mesh.stun.timeout` 5s, `connect_timeout` 30s) and the RFCs'.
    fn default() -> Self {
        AgentConfig {
            stun_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(30),
            consent_interval: Duration::from_secs(5),
            consent_timeout: Duration::from_secs(30),
            nomination_wait: Duration::from_secs(1),
            check_pacing: Duration::from_millis(50),
            upgrade_interval: Duration::from_secs(30),
            direct_connect: true,
            relay_enabled: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentEvent {
    PathSelected(Path),
    PathLost,
    /// No path within `connect_timeout`; checks go on.
    Unreachable,
}

/// Something to send: `bytes` to `to`, from the socket or through our relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub via: Via,
    pub to: SocketAddr,
    pub bytes: Vec<u8>,
}

#[derive(Debug)]
enum PairState {
    Waiting,
    InProgress {
        tid: TransactionId,
        bytes: Vec<u8>,
        timer: Retransmit,
        nominate: bool,
    },
    Succeeded,
    Failed,
}

#[derive(Debug)]
struct Pair {
    via: Via,
    local_priority: u32,
    remote: SocketAddr,
    remote_kind: CandidateKind,
    priority: u64,
    state: PairState,
    /// The controlled side got a check with USE-CANDIDATE on this pair.
    nominated_by_peer: bool,
}

impl Pair {
    fn kind(&self) -> PathKind {
        if matches!(self.via, Via::Relay(_)) || self.remote_kind == CandidateKind::Relayed {
            PathKind::Relayed
        } else {
            PathKind::Direct
        }
    }

    fn path(&self) -> Path {
        Path {
            kind: self.kind(),
            via: self.via,
            remote: self.remote,
        }
    }

    fn pending(&self) -> bool {
        matches!(
            self.state,
            PairState::Waiting | PairState::InProgress { .. }
        )
    }
}

struct Consent {
    next: Instant,
    last_ok: Instant,
    outstanding: VecDeque<TransactionId>,
}

pub struct Agent {
    local_id: String,
    remote_id: String,
    controlling: bool,
    tie_breaker: u64,
    password: Vec<u8>,
    config: AgentConfig,
    /// Our ways out with the priority of the candidate behind each.
    locals: Vec<(Via, u32)>,
    remotes: Vec<Candidate>,
    pairs: Vec<Pair>,
    selected: Option<usize>,
    first_valid: Option<Instant>,
    next_check: Instant,
    retry_at: Option<Instant>,
    upgrade_at: Option<Instant>,
    connect_deadline: Option<Instant>,
    consent: Option<Consent>,
    out: VecDeque<Outgoing>,
    events: VecDeque<AgentEvent>,
}

const CONSENT_OUTSTANDING: usize = 8;

/// A relay allocation reaches peers of its server's address family (RFC 8656 allocations are
/// single-family unless asked otherwise); the socket is tried towards every candidate.
fn reaches(via: Via, remote: SocketAddr) -> bool {
    match via {
        Via::Relay(server) => server.is_ipv4() == remote.is_ipv4(),
        Via::Direct => true,
    }
}

impl Agent {
    pub fn new(
        local_id: &str,
        remote_id: &str,
        secret: &[u8],
        config: AgentConfig,
        now: Instant,
    ) -> Agent {
        Agent {
            local_id: local_id.to_string(),
            remote_id: remote_id.to_string(),
            controlling: local_id < remote_id,
            tie_breaker: rand::thread_rng().gen(),
            password: pair_password(secret, local_id, remote_id).into_bytes(),
            connect_deadline: Some(now + config.connect_timeout),
            config,
            locals: Vec::new(),
            remotes: Vec::new(),
            pairs: Vec::new(),
            selected: None,
            first_valid: None,
            next_check: now,
            retry_at: None,
            upgrade_at: None,
            consent: None,
            out: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    pub fn controlling(&self) -> bool {
        self.controlling
    }

    pub fn selected(&self) -> Option<Path> {
        self.selected
            .and_then(|i| self.pairs.get(i))
            .map(Pair::path)
    }

    pub fn remote_candidates(&self) -> &[Candidate] {
        &self.remotes
    }

    pub fn poll_outgoing(&mut self) -> Option<Outgoing> {
        self.out.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<AgentEvent> {
        self.events.pop_front()
    }

    /// Adds a way out (the socket, or a new relay allocation) and pairs it with every remote
    /// candidate.
    pub fn add_local(&mut self, via: Via, priority: u32) {
        if self.locals.iter().any(|(v, _)| *v == via) {
            return;
        }
        self.locals.push((via, priority));
        for remote in self.remotes.clone() {
            self.add_pair(via, priority, remote);
        }
    }

    /// Removes a way out (a relay allocation that failed or was lost).
    pub fn remove_local(&mut self, via: Via, now: Instant) {
        self.locals.retain(|(v, _)| *v != via);
        let selected_lost =
            self.selected.and_then(|i| self.pairs.get(i)).map(|p| p.via) == Some(via);
        let selected_path = self.selected();
        self.pairs.retain(|p| p.via != via);
        self.selected = selected_path.and_then(|s| self.pairs.iter().position(|p| p.path() == s));
        if selected_lost {
            self.lose(now);
        }
    }

    /// Adds the peer's published candidates (known ones are kept as they are).
    pub fn add_remote_candidates(&mut self, candidates: &[Candidate]) {
        for c in candidates {
            if let Some(known) = self.remotes.iter_mut().find(|r| r.addr == c.addr) {
                // A peer-reflexive address the peer now publishes (e.g. its relay, seen in a
                // check before the registry told us) takes the published kind.
                if known.kind == CandidateKind::PeerReflexive && c.kind != known.kind {
                    known.kind = c.kind;
                    for p in self.pairs.iter_mut().filter(|p| p.remote == c.addr) {
                        p.remote_kind = c.kind;
                    }
                }
                continue;
            }
            self.remotes.push(*c);
            for (via, prio) in self.locals.clone() {
                self.add_pair(via, prio, *c);
            }
        }
    }

    /// Below [`MAX_PEER_REFLEXIVE`] peer-reflexive candidates, or one fewer after forgetting
    /// the oldest not on the selected pair; false when every one is in use.
    fn make_room_for_peer_reflexive(&mut self) -> bool {
        if self.peer_reflexive_count() < MAX_PEER_REFLEXIVE {
            return true;
        }
        let in_use = self.selected().map(|p| p.remote);
        let oldest = self
            .remotes
            .iter()
            .filter(|r| r.kind == CandidateKind::PeerReflexive)
            .map(|r| r.addr)
            .find(|a| Some(*a) != in_use);
        match oldest {
            Some(addr) => {
                self.forget_remote(addr);
                true
            }
            None => false,
        }
    }

    /// Peer-reflexive candidates whose every pair failed are forgotten: a real peer's check
    /// brings its address back, an address forged into a replayed check stays gone.
    fn forget_failed_peer_reflexive(&mut self) {
        let failed: Vec<SocketAddr> = self
            .remotes
            .iter()
            .filter(|r| r.kind == CandidateKind::PeerReflexive)
            .map(|r| r.addr)
            .filter(|a| {
                self.pairs
                    .iter()
                    .filter(|p| p.remote == *a)
                    .all(|p| matches!(p.state, PairState::Failed))
            })
            .collect();
        for addr in failed {
            self.forget_remote(addr);
        }
    }

    /// Removes a remote candidate and its pairs (never the selected pair's).
    fn forget_remote(&mut self, addr: SocketAddr) {
        let selected_path = self.selected();
        if selected_path.is_some_and(|p| p.remote == addr) {
            return;
        }
        self.remotes.retain(|r| r.addr != addr);
        self.pairs.retain(|p| p.remote != addr);
        self.selected = selected_path.and_then(|s| self.pairs.iter().position(|p| p.path() == s));
    }

    /// How many peer-reflexive candidates are held.
    fn peer_reflexive_count(&self) -> usize {
        self.remotes
            .iter()
            .filter(|r| r.kind == CandidateKind::PeerReflexive)
            .count()
    }

    fn allowed(&self, via: Via, remote_kind: CandidateKind) -> bool {
        let relayed = matches!(via, Via::Relay(_)) || remote_kind == CandidateKind::Relayed;
        if relayed {
            self.config.relay_enabled
        } else {
            self.config.direct_connect
        }
    }

    fn add_pair(&mut self, via: Via, local_priority: u32, remote: Candidate) -> Option<usize> {
        if let Some(i) = self
            .pairs
            .iter()
            .position(|p| p.via == via && p.remote == remote.addr)
        {
            return Some(i);
        }
        if !self.allowed(via, remote.kind) || !reaches(via, remote.addr) {
            return None;
        }
        let priority = if self.controlling {
            pair_priority(local_priority, remote.priority)
        } else {
            pair_priority(remote.priority, local_priority)
        };
        self.pairs.push(Pair {
            via,
            local_priority,
            remote: remote.addr,
            remote_kind: remote.kind,
            priority,
            state: PairState::Waiting,
            nominated_by_peer: false,
        });
        self.retry_at = None;
        Some(self.pairs.len() - 1)
    }

    #[cfg(test)]
    fn check_request_for_test(&mut self) -> Vec<u8> {
        self.add_local(Via::Direct, 1);
        self.add_remote_candidates(&[Candidate::new(
            CandidateKind::Host,
            "10.9.9.9:9".parse().expect("addr"),
            1,
        )]);
        self.check_request(0, false)
            .map(|(_, bytes)| bytes)
            .unwrap_or_default()
    }

    /// A connectivity check for `pair`; `None` only when the ids are too long for a STUN
    /// message (the registry bounds them far below that).
    fn check_request(&mut self, pair: usize, nominate: bool) -> Option<(TransactionId, Vec<u8>)> {
        let tid: TransactionId = rand::thread_rng().gen();
        let p = &self.pairs[pair];
        // PRIORITY is what a peer-reflexive candidate learnt from this check would get.
        let prflx_priority = match p.via {
            Via::Direct => priority(CandidateKind::PeerReflexive, u16::MAX),
            Via::Relay(_) => p.local_priority,
        };
        let mut m = Message::new(Class::Request, Method::Binding, tid)
            .with(Attribute::Username(format!(
                "{}:{}",
                self.remote_id, self.local_id
            )))
            .with(Attribute::Priority(prflx_priority))
            .with(if self.controlling {
                Attribute::IceControlling(self.tie_breaker)
            } else {
                Attribute::IceControlled(self.tie_breaker)
            });
        if nominate {
            m = m.with(Attribute::UseCandidate);
        }
        let bytes = m.encode(Some(&self.password), true).ok()?;
        Some((tid, bytes))
    }

    fn start_check(&mut self, pair: usize, nominate: bool, now: Instant) {
        let Some((tid, bytes)) = self.check_request(pair, nominate) else {
            self.pairs[pair].state = PairState::Failed;
            return;
        };
        let p = &mut self.pairs[pair];
        self.out.push_back(Outgoing {
            via: p.via,
            to: p.remote,
            bytes: bytes.clone(),
        });
        p.state = PairState::InProgress {
            tid,
            bytes,
            timer: Retransmit::start(now, INITIAL_RTO, self.config.stun_timeout),
            nominate,
        };
    }

    /// A Binding request whose USERNAME names us and this peer. Answers it (when its integrity
    /// holds) and runs the triggered check (RFC 8445 §7.3.1.4). False when it was dropped.
    pub fn handle_request(
        &mut self,
        via: Via,
        from: SocketAddr,
        message: &Message,
        raw: &[u8],
        now: Instant,
    ) -> bool {
        if !message.verify_integrity(raw, &self.password) {
            tracing::debug!(peer = %self.remote_id, %from, "connectivity check with bad integrity dropped");
            return false;
        }
        // a success response carries one address: it always fits
        if let Ok(response) = success_response(message, from).encode(Some(&self.password), true) {
            self.out.push_back(Outgoing {
                via,
                to: from,
                bytes: response,
            });
        }
        let use_candidate = message
            .attributes
            .iter()
            .any(|a| matches!(a, Attribute::UseCandidate));
        let index = match self
            .pairs
            .iter()
            .position(|p| p.via == via && p.remote == from)
        {
            Some(i) => Some(i),
            None => {
                // A peer-reflexive remote candidate (RFC 8445 §7.3.1.3): the check came from an
                // address the peer did not publish (a NAT mapping seen only by us).
                let remote_priority = message
                    .attributes
                    .iter()
                    .find_map(|a| match a {
                        Attribute::Priority(p) => Some(*p),
                        _ => None,
                    })
                    .unwrap_or_else(|| priority(CandidateKind::PeerReflexive, 0));
                let kind = self
                    .remotes
                    .iter()
                    .find(|r| r.addr == from)
                    .map(|r| r.kind)
                    .unwrap_or(CandidateKind::PeerReflexive);
                let candidate = Candidate {
                    kind,
                    addr: from,
                    priority: remote_priority,
                };
                if !self.remotes.iter().any(|r| r.addr == from) {
                    if !self.make_room_for_peer_reflexive() {
                        return true;
                    }
                    self.remotes.push(candidate);
                }
                let local = self.locals.iter().find(|(v, _)| *v == via).map(|(_, p)| *p);
                local.and_then(|lp| self.add_pair(via, lp, candidate))
            }
        };
        let Some(i) = index else {
            return true;
        };
        if use_candidate && !self.controlling {
            self.pairs[i].nominated_by_peer = true;
        }
        match self.pairs[i].state {
            PairState::Succeeded => {
                if use_candidate && !self.controlling {
                    self.select(i, now);
                }
            }
            PairState::Waiting | PairState::Failed => self.start_check(i, false, now),
            PairState::InProgress { .. } => {}
        }
        true
    }

    /// A Binding response. False when it answers none of this agent's checks.
    pub fn handle_response(
        &mut self,
        via: Via,
        from: SocketAddr,
        message: &Message,
        raw: &[u8],
        now: Instant,
    ) -> bool {
        let tid = message.transaction_id;
        if let Some(consent) = &mut self.consent {
            if let Some(pos) = consent.outstanding.iter().position(|t| *t == tid) {
                consent.outstanding.remove(pos);
                if message.class == Class::Success && message.verify_integrity(raw, &self.password)
                {
                    consent.last_ok = now;
                }
                return true;
            }
        }
        let Some(i) = self
            .pairs
            .iter()
            .position(|p| matches!(&p.state, PairState::InProgress { tid: t, .. } if *t == tid))
        else {
            return false;
        };
        if !message.verify_integrity(raw, &self.password) {
            tracing::debug!(peer = %self.remote_id, %from, "check response with bad integrity dropped");
            return true;
        }
        let nominate = matches!(
            self.pairs[i].state,
            PairState::InProgress { nominate: true, .. }
        );
        let p = &mut self.pairs[i];
        // Symmetric addresses (§7.2.5.2.1): the answer must come back the way the check went.
        if message.class != Class::Success || p.via != via || p.remote != from {
            p.state = PairState::Failed;
            return true;
        }
        p.state = PairState::Succeeded;
        self.first_valid.get_or_insert(now);
        if nominate || (!self.controlling && self.pairs[i].nominated_by_peer) {
            self.select(i, now);
        }
        true
    }

    fn select(&mut self, i: usize, now: Instant) {
        if self.selected == Some(i) {
            return;
        }
        self.selected = Some(i);
        self.connect_deadline = None;
        self.consent = Some(Consent {
            next: now + self.config.consent_interval,
            last_ok: now,
            outstanding: VecDeque::new(),
        });
        let path = self.pairs[i].path();
        tracing::info!(peer = %self.remote_id, kind = path.kind.as_str(), remote = %path.remote, "mesh path selected");
        self.events.push_back(AgentEvent::PathSelected(path));
    }

    /// Consent expired or our way out vanished: forget the selection and check again.
    fn lose(&mut self, now: Instant) {
        tracing::info!(peer = %self.remote_id, "mesh path lost, checking again");
        self.selected = None;
        self.consent = None;
        self.first_valid = None;
        self.retry_at = None;
        self.upgrade_at = None;
        self.next_check = now;
        self.connect_deadline = Some(now + self.config.connect_timeout);
        for p in &mut self.pairs {
            p.state = PairState::Waiting;
            p.nominated_by_peer = false;
        }
        self.events.push_back(AgentEvent::PathLost);
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let timers = self.pairs.iter().filter_map(|p| match &p.state {
            PairState::InProgress { timer, .. } => Some(timer.next_timeout()),
            _ => None,
        });
        let waiting = self
            .pairs
            .iter()
            .any(|p| matches!(p.state, PairState::Waiting) && self.better(p));
        let checks = waiting.then_some(self.next_check);
        // Only timers whose handling changes something: while a nomination check is under way
        // (or no pair is valid) the nomination time has passed for good, and a retry is due
        // only while every pair failed — a timer that stays due spins the owner's loop.
        let nominating = self
            .pairs
            .iter()
            .any(|p| matches!(p.state, PairState::InProgress { nominate: true, .. }));
        let valid = self
            .pairs
            .iter()
            .any(|p| matches!(p.state, PairState::Succeeded));
        let nomination = (self.controlling && self.selected.is_none() && !nominating && valid)
            .then(|| self.first_valid.map(|t| t + self.config.nomination_wait))
            .flatten();
        let all_failed = self.selected.is_none()
            && !self.pairs.is_empty()
            && self
                .pairs
                .iter()
                .all(|p| matches!(p.state, PairState::Failed));
        let retry = self.retry_at.filter(|_| all_failed);
        let consent = self
            .consent
            .as_ref()
            .map(|c| c.next.min(c.last_ok + self.config.consent_timeout));
        timers
            .chain(checks)
            .chain(nomination)
            .chain(retry)
            .chain(self.upgrade_at)
            .chain(self.connect_deadline)
            .chain(consent)
            .min()
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        for i in 0..self.pairs.len() {
            let p = &mut self.pairs[i];
            if let PairState::InProgress { bytes, timer, .. } = &mut p.state {
                match timer.poll(now) {
                    TimerAction::Wait => {}
                    TimerAction::Resend => self.out.push_back(Outgoing {
                        via: p.via,
                        to: p.remote,
                        bytes: bytes.clone(),
                    }),
                    TimerAction::TimedOut => p.state = PairState::Failed,
                }
            }
        }
        self.forget_failed_peer_reflexive();

        if let Some(consent) = &mut self.consent {
            if now >= consent.last_ok + self.config.consent_timeout {
                self.lose(now);
            } else if now >= consent.next {
                consent.next = now + self.config.consent_interval;
                // The controlling side's consent checks nominate again, so a controlled
                // side that lost the path on its own (one-way loss) takes it back.
                let check = self
                    .selected
                    .and_then(|i| Some((i, self.check_request(i, self.controlling)?)));
                if let Some((i, (tid, bytes))) = check {
                    if let Some(consent) = &mut self.consent {
                        consent.outstanding.push_back(tid);
                        if consent.outstanding.len() > CONSENT_OUTSTANDING {
                            consent.outstanding.pop_front();
                        }
                    }
                    let p = &self.pairs[i];
                    self.out.push_back(Outgoing {
                        via: p.via,
                        to: p.remote,
                        bytes,
                    });
                }
            }
        }

        if now >= self.next_check {
            let next = self
                .pairs
                .iter()
                .enumerate()
                .filter(|(_, p)| matches!(p.state, PairState::Waiting) && self.better(p))
                .max_by_key(|(_, p)| p.priority)
                .map(|(i, _)| i);
            if let Some(i) = next {
                self.start_check(i, false, now);
                self.next_check = now + self.config.check_pacing;
            }
        }

        if self.controlling {
            self.maybe_nominate(now);
        }

        if self.selected.is_none()
            && !self.pairs.is_empty()
            && self
                .pairs
                .iter()
                .all(|p| matches!(p.state, PairState::Failed))
        {
            match self.retry_at {
                None => self.retry_at = Some(now + self.config.consent_interval),
                Some(t) if now >= t => {
                    self.retry_at = None;
                    self.next_check = now;
                    for p in &mut self.pairs {
                        p.state = PairState::Waiting;
                    }
                }
                Some(_) => {}
            }
        }

        if self.selected.is_some() {
            self.maybe_upgrade(now);
        }

        if self.connect_deadline.is_some_and(|t| now >= t) {
            self.connect_deadline = None;
            if self.selected.is_none() {
                self.events.push_back(AgentEvent::Unreachable);
            }
        }
    }

    /// Better than the selected pair (every pair is while none is selected).
    fn better(&self, p: &Pair) -> bool {
        self.selected
            .and_then(|s| self.pairs.get(s))
            .is_none_or(|s| p.priority > s.priority)
    }

    /// With a path selected, pairs better than it that failed are checked again every
    /// `upgrade_interval` (e.g. direct pairs whose NAT holes opened after a relay was chosen).
    fn maybe_upgrade(&mut self, now: Instant) {
        let failed = self
            .pairs
            .iter()
            .any(|p| matches!(p.state, PairState::Failed) && self.better(p));
        let pending = self.pairs.iter().any(|p| p.pending() && self.better(p));
        if !failed || pending {
            self.upgrade_at = None;
            return;
        }
        match self.upgrade_at {
            None => self.upgrade_at = Some(now + self.config.upgrade_interval),
            Some(t) if now >= t => {
                self.upgrade_at = None;
                self.next_check = now;
                let floor = self
                    .selected
                    .and_then(|s| self.pairs.get(s))
                    .map(|s| s.priority);
                for p in &mut self.pairs {
                    if matches!(p.state, PairState::Failed) && floor.is_none_or(|f| p.priority > f)
                    {
                        p.state = PairState::Waiting;
                    }
                }
            }
            Some(_) => {}
        }
    }

    /// The controlling side nominates the best valid pair once no better pair is still being
    /// checked (or after `nomination_wait`), and later moves to a better pair that succeeds.
    fn maybe_nominate(&mut self, now: Instant) {
        let nominating = self
            .pairs
            .iter()
            .any(|p| matches!(p.state, PairState::InProgress { nominate: true, .. }));
        if nominating {
            return;
        }
        let Some((best, best_priority)) = self
            .pairs
            .iter()
            .enumerate()
            .filter(|(_, p)| matches!(p.state, PairState::Succeeded))
            .max_by_key(|(_, p)| p.priority)
            .map(|(i, p)| (i, p.priority))
        else {
            return;
        };
        match self.selected {
            Some(s) if self.pairs[s].priority >= best_priority => {}
            Some(_) => self.start_check(best, true, now),
            None => {
                let better_pending = self
                    .pairs
                    .iter()
                    .any(|p| p.pending() && p.priority > best_priority);
                let waited = self
                    .first_valid
                    .is_some_and(|t| now >= t + self.config.nomination_wait);
                if !better_pending || waited {
                    self.start_check(best, true, now);
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn config() -> AgentConfig {
        AgentConfig {
            stun_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(10),
            check_pacing: Duration::from_millis(20),
            ..AgentConfig::default()
        }
    }

    #[test]
    fn password_is_symmetric_and_keyed() {
        assert_eq!(pair_password(b"", "a", "b"), pair_password(b"", "b", "a"));
        assert_ne!(
            pair_password(b"", "a", "b"),
            pair_password(b"psk", "a", "b")
        );
        assert_ne!(pair_password(b"", "a", "bc"), pair_password(b"", "ab", "c"));
        assert_eq!(pair_password(b"", "a", "b").len(), 40);
    }

    #[test]
    fn lower_id_controls() {
        let now = Instant::now();
        assert!(Agent::new("alpha", "beta", b"", config(), now).controlling());
        assert!(!Agent::new("beta", "alpha", b"", config(), now).controlling());
    }

    #[test]
    fn published_kind_replaces_peer_reflexive() {
        let now = Instant::now();
        let mut a = Agent::new("a", "b", b"", config(), now);
        a.add_local(Via::Direct, 1);
        let their_relay: SocketAddr = "10.0.0.3:2".parse().unwrap();
        // A check from b's relay arrives before b's relay candidate is known.
        let check = Agent::new("b", "a", b"", config(), now).check_request_for_test();
        let m = Message::decode(&check).unwrap();
        assert!(a.handle_request(Via::Direct, their_relay, &m, &check, now));
        assert_eq!(a.pairs[0].kind(), PathKind::Direct);
        a.add_remote_candidates(&[Candidate::new(CandidateKind::Relayed, their_relay, 1)]);
        assert_eq!(a.pairs.len(), 1);
        assert_eq!(a.pairs[0].kind(), PathKind::Relayed);
    }

    /// The controlling side waits for its nomination's answer without a timer that stays due
    /// (a real event loop would spin instead of receiving that answer).
    #[test]
    fn no_timer_stays_due_while_a_nomination_is_answered() {
        let now = Instant::now();
        let mut a = Agent::new("a", "b", b"", config(), now);
        let remote: SocketAddr = "10.0.0.2:1".parse().unwrap();
        a.add_local(Via::Direct, 1);
        a.add_remote_candidates(&[Candidate::new(CandidateKind::Host, remote, 1)]);
        let mut b = Agent::new("b", "a", b"", config(), now);
        b.add_local(Via::Direct, 1);
        let a_addr: SocketAddr = "10.0.0.1:1".parse().unwrap();
        // a's first check, answered by b: the pair is valid
        a.handle_timeout(now);
        let check = a.poll_outgoing().unwrap();
        let m = Message::decode(&check.bytes).unwrap();
        assert!(b.handle_request(Via::Direct, a_addr, &m, &check.bytes, now));
        let answer = b.poll_outgoing().unwrap();
        let m = Message::decode(&answer.bytes).unwrap();
        assert!(a.handle_response(Via::Direct, remote, &m, &answer.bytes, now));
        // the nomination goes out; its answer is still on the way well after nomination_wait
        let later = now + Duration::from_secs(2);
        a.handle_timeout(later);
        while a.poll_outgoing().is_some() {}
        assert!(a.selected().is_none());
        for step in 1..50 {
            let t = later + Duration::from_millis(step);
            a.handle_timeout(t);
            assert!(
                a.poll_timeout().is_some_and(|next| next > t),
                "a timer stays due"
            );
        }
    }

    /// Replayed checks from forged sources: at most MAX_PEER_REFLEXIVE addresses are held and
    /// checked, and they are gone once their checks fail.
    #[test]
    fn peer_reflexive_candidates_are_bounded_and_expire() {
        let now = Instant::now();
        let mut a = Agent::new("a", "b", b"", config(), now);
        a.add_local(Via::Direct, 1);
        let check = Agent::new("b", "a", b"", config(), now).check_request_for_test();
        let m = Message::decode(&check).unwrap();
        for i in 0..100u16 {
            let forged = SocketAddr::from(([198, 51, 100, (i % 250) as u8], 1000 + i));
            assert!(a.handle_request(Via::Direct, forged, &m, &check, now));
        }
        assert_eq!(a.peer_reflexive_count(), MAX_PEER_REFLEXIVE);
        assert!(a.pairs.len() <= MAX_PEER_REFLEXIVE);
        // nobody answers the checks sent to them: they fail and the addresses go
        let mut t = now;
        for _ in 0..400 {
            t += Duration::from_millis(50);
            a.handle_timeout(t);
            while a.poll_outgoing().is_some() {}
        }
        assert_eq!(a.peer_reflexive_count(), 0);
        assert!(a.pairs.is_empty());
    }

    #[test]
    fn policy_filters_pairs() {
        let now = Instant::now();
        let relay = Via::Relay("127.0.0.1:3478".parse().unwrap());
        let host = Candidate::new(CandidateKind::Host, "10.0.0.2:1".parse().unwrap(), 1);
        let their_relay = Candidate::new(CandidateKind::Relayed, "10.0.0.3:2".parse().unwrap(), 1);
        let mut c = config();
        c.direct_connect = false;
        let mut a = Agent::new("a", "b", b"", c, now);
        a.add_local(Via::Direct, 1);
        a.add_local(relay, 1);
        a.add_remote_candidates(&[host, their_relay]);
        assert!(a.pairs.iter().all(|p| p.kind() == PathKind::Relayed));
        assert_eq!(a.pairs.len(), 3);
        let mut c = config();
        c.relay_enabled = false;
        let mut a = Agent::new("a", "b", b"", c, now);
        a.add_local(Via::Direct, 1);
        a.add_local(relay, 1);
        a.add_remote_candidates(&[host, their_relay]);
        assert_eq!(a.pairs.len(), 1);
        assert_eq!(a.pairs[0].kind(), PathKind::Direct);
    }
}
