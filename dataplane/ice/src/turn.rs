//! TURN client for one server (RFC 8656, UDP): Allocate with long-term credentials (401 → realm
//! and nonce → retry; 438 stale nonce → new nonce, retry), Refresh before the allocation expires,
//! CreatePermission and ChannelBind with their refreshes, Send/Data indications, ChannelData, and
//! deallocation (Refresh with LIFETIME 0).
//!
//! Sans-IO: everything it wants sent goes to [`TurnClient::server`] and is taken with
//! [`TurnClient::poll_transmit`].

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use rand::Rng;

use crate::channel_data;
use crate::stun::{long_term_key, Attribute, Class, Message, Method, TransactionId};
use crate::transaction::{Retransmit, TimerAction, INITIAL_RTO};
use crate::IceError;

/// Permissions last 300 s (RFC 8656 §9); refreshed a minute early.
const PERMISSION_REFRESH: Duration = Duration::from_secs(240);
/// Channel bindings last 600 s (§12); refreshed a minute early.
const CHANNEL_REFRESH: Duration = Duration::from_secs(540);
/// How long before the allocation's expiry a Refresh goes out.
const REFRESH_MARGIN: Duration = Duration::from_secs(60);
/// A failed permission or channel request is tried again after this long.
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// A failed allocation (timeout, server error) is tried again after this long; refused
/// credentials are not (they need a configuration change).
const ALLOCATE_RETRY: Duration = Duration::from_secs(30);
/// UDP, in REQUESTED-TRANSPORT.
const PROTOCOL_UDP: u8 = 17;
/// Stale-nonce retries per request before giving up (a server that keeps answering 438).
const MAX_STALE_RETRIES: u8 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnState {
    Allocating,
    Allocated {
        relayed: SocketAddr,
        mapped: Option<SocketAddr>,
    },
    Failed(IceError),
    Closed,
}

/// What the client reports to its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnEvent {
    Allocated {
        relayed: SocketAddr,
        mapped: Option<SocketAddr>,
    },
    Failed(IceError),
    /// The allocation expired or the server forgot it; the client allocates again.
    Lost,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Request {
    Allocate,
    Refresh { lifetime: u32 },
    CreatePermission(IpAddr),
    ChannelBind { peer: SocketAddr, channel: u16 },
}

struct Pending {
    request: Request,
    bytes: Vec<u8>,
    timer: Retransmit,
    authenticated: bool,
    stale_retries: u8,
}

#[derive(Debug, Default)]
struct Refreshable {
    confirmed: bool,
    in_flight: bool,
    refresh_at: Option<Instant>,
}

pub struct TurnClient {
    server: SocketAddr,
    username: String,
    password: String,
    realm: String,
    nonce: String,
    key: Option<Vec<u8>>,
    state: TurnState,
    expires: Option<Instant>,
    refresh_at: Option<Instant>,
    retry_allocate_at: Option<Instant>,
    pending: HashMap<TransactionId, Pending>,
    permissions: HashMap<IpAddr, Refreshable>,
    channels: HashMap<SocketAddr, (u16, Refreshable)>,
    channel_peers: HashMap<u16, SocketAddr>,
    next_channel: u16,
    timeout: Duration,
    transmits: VecDeque<Vec<u8>>,
    events: VecDeque<TurnEvent>,
}

impl TurnClient {
    /// Starts allocating at once. `timeout` caps each transaction (`mesh.stun.timeout`).
    pub fn new(
        server: SocketAddr,
        username: &str,
        password: &str,
        timeout: Duration,
        now: Instant,
    ) -> TurnClient {
        let mut client = TurnClient {
            server,
            username: username.to_string(),
            password: password.to_string(),
            realm: String::new(),
            nonce: String::new(),
            key: None,
            state: TurnState::Allocating,
            expires: None,
            refresh_at: None,
            retry_allocate_at: None,
            pending: HashMap::new(),
            permissions: HashMap::new(),
            channels: HashMap::new(),
            channel_peers: HashMap::new(),
            next_channel: rand::thread_rng()
                .gen_range(channel_data::MIN_CHANNEL..=channel_data::MAX_CHANNEL),
            timeout,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
        };
        client.send(Request::Allocate, 0, now);
        client
    }

    pub fn server(&self) -> SocketAddr {
        self.server
    }

    pub fn state(&self) -> &TurnState {
        &self.state
    }

    pub fn relayed(&self) -> Option<SocketAddr> {
        match self.state {
            TurnState::Allocated { relayed, .. } => Some(relayed),
            _ => None,
        }
    }

    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.transmits.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<TurnEvent> {
        self.events.pop_front()
    }

    /// Asks the server to let `peer`'s datagrams in (permissions are per IP address).
    pub fn create_permission(&mut self, peer: IpAddr, now: Instant) {
        let entry = self.permissions.entry(peer).or_default();
        if entry.in_flight || entry.confirmed {
            return;
        }
        entry.in_flight = true;
        if self.relayed().is_some() {
            self.send(Request::CreatePermission(peer), 0, now);
        }
    }

    /// Binds a channel to `peer` so data to and from it uses 4-byte ChannelData framing.
    pub fn bind_channel(&mut self, peer: SocketAddr, now: Instant) {
        if self.channels.contains_key(&peer) {
            return;
        }
        let Some(channel) = self.free_channel() else {
            return;
        };
        self.channel_peers.insert(channel, peer);
        self.channels.insert(
            peer,
            (
                channel,
                Refreshable {
                    in_flight: true,
                    ..Refreshable::default()
                },
            ),
        );
        if self.relayed().is_some() {
            self.send(Request::ChannelBind { peer, channel }, 0, now);
        }
    }

    fn free_channel(&mut self) -> Option<u16> {
        let span = channel_data::MAX_CHANNEL - channel_data::MIN_CHANNEL + 1;
        for _ in 0..span {
            let c = self.next_channel;
            self.next_channel = if c >= channel_data::MAX_CHANNEL {
                channel_data::MIN_CHANNEL
            } else {
                c + 1
            };
            if !self.channel_peers.contains_key(&c) {
                return Some(c);
            }
        }
        None
    }

    /// Frames `data` for `peer` through the relay: ChannelData when a channel is bound, a Send
    /// indication otherwise. The result goes to [`TurnClient::server`]; `None` when `data` is
    /// too long for a frame.
    pub fn wrap(&self, peer: SocketAddr, data: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(data.len() + 4);
        self.wrap_into(peer, data, &mut out).then_some(out)
    }

    /// [`TurnClient::wrap`] into a buffer the caller reuses (the data plane's hot path: a
    /// ChannelData frame is the data behind a 4-byte header). False (and `out` empty) when
    /// `data` is too long for a frame's 16-bit length.
    pub fn wrap_into(&self, peer: SocketAddr, data: &[u8], out: &mut Vec<u8>) -> bool {
        out.clear();
        if data.len() > usize::from(u16::MAX) {
            return false;
        }
        match self.channels.get(&peer) {
            Some((channel, r)) if r.confirmed => channel_data::encode_into(*channel, data, out),
            _ => match Message::new(Class::Indication, Method::Send, rand::thread_rng().gen())
                .with(Attribute::XorPeerAddress(peer))
                .with(Attribute::Data(data.to_vec()))
                .encode(None, false)
            {
                Ok(indication) => out.extend_from_slice(&indication),
                Err(_) => return false,
            },
        }
        true
    }

    /// A ChannelData frame from the server: the peer it came from and its data.
    pub fn unwrap_channel<'a>(&self, datagram: &'a [u8]) -> Option<(SocketAddr, &'a [u8])> {
        let (channel, data) = channel_data::decode(datagram)?;
        Some((*self.channel_peers.get(&channel)?, data))
    }

    /// Releases the allocation (Refresh with LIFETIME 0).
    pub fn deallocate(&mut self, now: Instant) {
        if self.relayed().is_some() {
            self.send(Request::Refresh { lifetime: 0 }, 0, now);
        }
    }

    /// A STUN message that came from the server. Returns a Data indication's peer and data;
    /// responses are consumed. Messages for other transactions are ignored.
    pub fn handle_message(
        &mut self,
        message: &Message,
        raw: &[u8],
        now: Instant,
    ) -> Option<(SocketAddr, Vec<u8>)> {
        if message.class == Class::Indication && message.method == Method::Data {
            let peer = message.attributes.iter().find_map(|a| match a {
                Attribute::XorPeerAddress(p) => Some(*p),
                _ => None,
            })?;
            let data = message.attributes.iter().find_map(|a| match a {
                Attribute::Data(d) => Some(d.clone()),
                _ => None,
            })?;
            return Some((peer, data));
        }
        if !matches!(message.class, Class::Success | Class::Error) {
            return None;
        }
        let pending = self.pending.get(&message.transaction_id)?;
        // A signed answer to a signed request must verify; a forged one is dropped unread.
        if let (true, Some(key)) = (pending.authenticated, &self.key) {
            if message.integrity.is_some() && !message.verify_integrity(raw, key) {
                tracing::debug!(server = %self.server, "TURN response with bad integrity dropped");
                return None;
            }
        }
        let pending = self.pending.remove(&message.transaction_id)?;
        if message.class == Class::Error {
            self.on_error(pending, message, now);
        } else {
            self.on_success(pending.request, message, now);
        }
        None
    }

    fn on_success(&mut self, request: Request, message: &Message, now: Instant) {
        let lifetime = message.attributes.iter().find_map(|a| match a {
            Attribute::Lifetime(l) => Some(Duration::from_secs(u64::from(*l))),
            _ => None,
        });
        match request {
            Request::Allocate => {
                let Some(relayed) = message.attributes.iter().find_map(|a| match a {
                    Attribute::XorRelayedAddress(r) => Some(*r),
                    _ => None,
                }) else {
                    self.fail(
                        IceError::TurnProtocol {
                            server: self.server,
                            why: "Allocate success without XOR-RELAYED-ADDRESS".into(),
                        },
                        now,
                    );
                    return;
                };
                let mapped = message.xor_mapped_address();
                self.state = TurnState::Allocated { relayed, mapped };
                self.schedule_refresh(lifetime.unwrap_or(Duration::from_secs(600)), now);
                self.events
                    .push_back(TurnEvent::Allocated { relayed, mapped });
                // Permissions and channels asked for before the allocation existed.
                let ips: Vec<IpAddr> = self
                    .permissions
                    .iter()
                    .filter(|(_, p)| p.in_flight)
                    .map(|(ip, _)| *ip)
                    .collect();
                for ip in ips {
                    self.send(Request::CreatePermission(ip), 0, now);
                }
                let channels: Vec<(SocketAddr, u16)> =
                    self.channels.iter().map(|(p, (c, _))| (*p, *c)).collect();
                for (peer, channel) in channels {
                    self.send(Request::ChannelBind { peer, channel }, 0, now);
                }
            }
            Request::Refresh { lifetime: 0 } => {
                self.state = TurnState::Closed;
                self.expires = None;
                self.refresh_at = None;
            }
            Request::Refresh { .. } => {
                self.schedule_refresh(lifetime.unwrap_or(Duration::from_secs(600)), now)
            }
            Request::CreatePermission(ip) => {
                let p = self.permissions.entry(ip).or_default();
                p.confirmed = true;
                p.in_flight = false;
                p.refresh_at = Some(now + PERMISSION_REFRESH);
            }
            Request::ChannelBind { peer, .. } => {
                if let Some((_, c)) = self.channels.get_mut(&peer) {
                    c.confirmed = true;
                    c.in_flight = false;
                    c.refresh_at = Some(now + CHANNEL_REFRESH);
                }
                // A channel binding also installs or refreshes the permission (§12.2).
                let p = self.permissions.entry(peer.ip()).or_default();
                p.confirmed = true;
                p.in_flight = false;
                p.refresh_at = Some(now + PERMISSION_REFRESH);
            }
        }
    }

    fn on_error(&mut self, pending: Pending, message: &Message, now: Instant) {
        let (code, reason) = message.error_code().unwrap_or((0, ""));
        let reason = reason.to_string();
        match code {
            401 if !pending.authenticated => {
                let (Some(realm), Some(nonce)) = (message.realm(), message.nonce()) else {
                    self.fail(
                        IceError::TurnProtocol {
                            server: self.server,
                            why: "401 without REALM and NONCE".into(),
                        },
                        now,
                    );
                    return;
                };
                self.realm = realm.to_string();
                self.nonce = nonce.to_string();
                self.key = Some(long_term_key(&self.username, &self.realm, &self.password));
                self.send(pending.request, 0, now);
            }
            401 => self.fail(
                IceError::TurnUnauthorized {
                    server: self.server,
                    username: self.username.clone(),
                    realm: self.realm.clone(),
                },
                now,
            ),
            438 if pending.stale_retries < MAX_STALE_RETRIES => {
                if let Some(nonce) = message.nonce() {
                    self.nonce = nonce.to_string();
                }
                if let Some(realm) = message.realm() {
                    if realm != self.realm {
                        self.realm = realm.to_string();
                        self.key = Some(long_term_key(&self.username, &self.realm, &self.password));
                    }
                }
                self.send(pending.request, pending.stale_retries + 1, now);
            }
            _ => match pending.request {
                Request::Allocate => self.fail(
                    IceError::TurnRejected {
                        server: self.server,
                        code,
                        reason,
                    },
                    now,
                ),
                // 437: the server no longer knows the allocation.
                Request::Refresh { lifetime } if lifetime > 0 => self.lost(now),
                Request::Refresh { .. } => self.state = TurnState::Closed,
                Request::CreatePermission(ip) => {
                    tracing::debug!(server = %self.server, %ip, code, %reason, "TURN permission refused");
                    self.retry_permission(ip, now);
                }
                Request::ChannelBind { peer, .. } => {
                    tracing::debug!(server = %self.server, %peer, code, %reason, "TURN channel bind refused");
                    self.retry_channel(peer, now);
                }
            },
        }
    }

    fn retry_permission(&mut self, ip: IpAddr, now: Instant) {
        if let Some(p) = self.permissions.get_mut(&ip) {
            p.in_flight = false;
            p.refresh_at = Some(now + RETRY_AFTER);
        }
    }

    fn retry_channel(&mut self, peer: SocketAddr, now: Instant) {
        if let Some((_, c)) = self.channels.get_mut(&peer) {
            c.in_flight = false;
            c.refresh_at = Some(now + RETRY_AFTER);
        }
    }

    fn schedule_refresh(&mut self, lifetime: Duration, now: Instant) {
        self.expires = Some(now + lifetime);
        let early = lifetime.saturating_sub(REFRESH_MARGIN).max(lifetime / 2);
        self.refresh_at = Some(now + early);
    }

    fn fail(&mut self, error: IceError, now: Instant) {
        tracing::warn!(%error, "TURN allocation failed");
        if !matches!(error, IceError::TurnUnauthorized { .. }) {
            self.retry_allocate_at = Some(now + ALLOCATE_RETRY);
        }
        self.state = TurnState::Failed(error.clone());
        self.pending.clear();
        self.expires = None;
        self.refresh_at = None;
        self.events.push_back(TurnEvent::Failed(error));
    }

    /// The allocation is gone: forget its permissions' and channels' confirmation and allocate again.
    fn lost(&mut self, now: Instant) {
        self.events.push_back(TurnEvent::Lost);
        self.pending.clear();
        self.expires = None;
        self.refresh_at = None;
        for p in self.permissions.values_mut() {
            *p = Refreshable {
                in_flight: true,
                ..Refreshable::default()
            };
        }
        for (_, c) in self.channels.values_mut() {
            *c = Refreshable {
                in_flight: true,
                ..Refreshable::default()
            };
        }
        self.state = TurnState::Allocating;
        self.send(Request::Allocate, 0, now);
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let refreshes = self
            .permissions
            .values()
            .chain(self.channels.values().map(|(_, c)| c))
            .filter(|r| !r.in_flight)
            .filter_map(|r| r.refresh_at);
        self.pending
            .values()
            .map(|p| p.timer.next_timeout())
            .chain(self.refresh_at)
            .chain(self.retry_allocate_at)
            .chain(self.expires)
            .chain(refreshes)
            .min()
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        let mut timed_out = Vec::new();
        for (tid, p) in self.pending.iter_mut() {
            match p.timer.poll(now) {
                TimerAction::Wait => {}
                TimerAction::Resend => self.transmits.push_back(p.bytes.clone()),
                TimerAction::TimedOut => timed_out.push(*tid),
            }
        }
        for tid in timed_out {
            let Some(p) = self.pending.remove(&tid) else {
                continue;
            };
            match p.request {
                Request::Allocate => self.fail(
                    IceError::Timeout {
                        server: self.server,
                        what: "TURN Allocate",
                    },
                    now,
                ),
                Request::Refresh { lifetime: 0 } => self.state = TurnState::Closed,
                Request::Refresh { .. } => self.refresh_at = Some(now + RETRY_AFTER),
                Request::CreatePermission(ip) => self.retry_permission(ip, now),
                Request::ChannelBind { peer, .. } => self.retry_channel(peer, now),
            }
        }
        if self.retry_allocate_at.is_some_and(|t| now >= t) {
            self.retry_allocate_at = None;
            self.key = None;
            self.state = TurnState::Allocating;
            self.send(Request::Allocate, 0, now);
        }
        if self.relayed().is_none() {
            return;
        }
        if self.expires.is_some_and(|e| now >= e) {
            self.lost(now);
            return;
        }
        if self.refresh_at.is_some_and(|r| now >= r) {
            self.refresh_at = None;
            self.send(Request::Refresh { lifetime: 600 }, 0, now);
        }
        let due: Vec<IpAddr> = self
            .permissions
            .iter_mut()
            .filter(|(_, p)| !p.in_flight && p.refresh_at.is_some_and(|r| now >= r))
            .map(|(ip, p)| {
                p.in_flight = true;
                *ip
            })
            .collect();
        for ip in due {
            self.send(Request::CreatePermission(ip), 0, now);
        }
        let due: Vec<(SocketAddr, u16)> = self
            .channels
            .iter_mut()
            .filter(|(_, (_, c))| !c.in_flight && c.refresh_at.is_some_and(|r| now >= r))
            .map(|(peer, (channel, c))| {
                c.in_flight = true;
                (*peer, *channel)
            })
            .collect();
        for (peer, channel) in due {
            self.send(Request::ChannelBind { peer, channel }, 0, now);
        }
    }

    fn send(&mut self, request: Request, stale_retries: u8, now: Instant) {
        let tid: TransactionId = rand::thread_rng().gen();
        let method = match request {
            Request::Allocate => Method::Allocate,
            Request::Refresh { .. } => Method::Refresh,
            Request::CreatePermission(_) => Method::CreatePermission,
            Request::ChannelBind { .. } => Method::ChannelBind,
        };
        let mut message = Message::new(Class::Request, method, tid);
        match &request {
            Request::Allocate => {
                message = message
                    .with(Attribute::RequestedTransport(PROTOCOL_UDP))
                    .with(Attribute::DontFragment)
            }
            Request::Refresh { lifetime } => message = message.with(Attribute::Lifetime(*lifetime)),
            Request::CreatePermission(ip) => {
                message = message.with(Attribute::XorPeerAddress(SocketAddr::new(*ip, 0)))
            }
            Request::ChannelBind { peer, channel } => {
                message = message
                    .with(Attribute::ChannelNumber(*channel))
                    .with(Attribute::XorPeerAddress(*peer))
            }
        }
        let authenticated = self.key.is_some();
        if authenticated {
            message = message
                .with(Attribute::Username(self.username.clone()))
                .with(Attribute::Realm(self.realm.clone()))
                .with(Attribute::Nonce(self.nonce.clone()));
        }
        // USERNAME is ours; REALM and NONCE passed decode's RFC 8489 bounds: it fits
        let Ok(bytes) = message.encode(self.key.as_deref(), true) else {
            return;
        };
        self.transmits.push_back(bytes.clone());
        self.pending.insert(
            tid,
            Pending {
                request,
                bytes,
                timer: Retransmit::start(now, INITIAL_RTO, self.timeout),
                authenticated,
                stale_retries,
            },
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const SERVER: &str = "127.0.0.1:3478";

    fn server() -> SocketAddr {
        SERVER.parse().unwrap()
    }

    /// The server's side of one exchange: decodes the client's last request and answers it.
    fn last_request(c: &mut TurnClient) -> Message {
        let mut last = None;
        while let Some(b) = c.poll_transmit() {
            last = Some(b);
        }
        Message::decode(&last.expect("a request")).expect("stun")
    }

    fn answer(
        c: &mut TurnClient,
        req: &Message,
        class: Class,
        attrs: Vec<Attribute>,
        key: Option<&[u8]>,
    ) {
        answer_at(c, req, class, attrs, key, Instant::now())
    }

    fn answer_at(
        c: &mut TurnClient,
        req: &Message,
        class: Class,
        attrs: Vec<Attribute>,
        key: Option<&[u8]>,
        at: Instant,
    ) {
        let mut m = Message::new(class, req.method, req.transaction_id);
        m.attributes = attrs;
        let raw = m.encode(key, true).unwrap();
        let decoded = Message::decode(&raw).unwrap();
        assert_eq!(c.handle_message(&decoded, &raw, at), None);
    }

    /// An error answer carrying a realm and a nonce, as 401 and 438 do.
    fn challenge(code: u16, reason: &str, nonce: &str) -> Vec<Attribute> {
        vec![
            Attribute::ErrorCode {
                code,
                reason: reason.into(),
            },
            Attribute::Realm("r".into()),
            Attribute::Nonce(nonce.into()),
        ]
    }

    fn allocated(now: Instant) -> (TurnClient, Vec<u8>) {
        let mut c = TurnClient::new(server(), "u", "p", Duration::from_secs(5), now);
        let req = last_request(&mut c);
        assert_eq!(req.method, Method::Allocate);
        assert!(req.integrity.is_none());
        answer_at(
            &mut c,
            &req,
            Class::Error,
            challenge(401, "Unauthorized", "n1"),
            None,
            now,
        );
        let req = last_request(&mut c);
        let key = long_term_key("u", "r", "p");
        assert_eq!(req.method, Method::Allocate);
        assert_eq!(req.username(), Some("u"));
        assert_eq!(req.nonce(), Some("n1"));
        let raw = req.encode(Some(&key), false).unwrap();
        assert!(Message::decode(&raw).unwrap().verify_integrity(&raw, &key));
        answer_at(
            &mut c,
            &req,
            Class::Success,
            vec![
                Attribute::XorRelayedAddress("127.0.0.1:50000".parse().unwrap()),
                Attribute::XorMappedAddress("127.0.0.1:40000".parse().unwrap()),
                Attribute::Lifetime(600),
            ],
            Some(&key),
            now,
        );
        (c, key)
    }

    #[test]
    fn allocate_with_long_term_credentials() {
        let (mut c, _) = allocated(Instant::now());
        assert_eq!(c.relayed(), Some("127.0.0.1:50000".parse().unwrap()));
        assert!(matches!(c.poll_event(), Some(TurnEvent::Allocated { .. })));
    }

    #[test]
    fn second_401_is_a_clear_credentials_error() {
        let now = Instant::now();
        let mut c = TurnClient::new(server(), "u", "wrong", Duration::from_secs(5), now);
        for nonce in ["n1", "n2"] {
            let req = last_request(&mut c);
            answer(
                &mut c,
                &req,
                Class::Error,
                challenge(401, "Unauthorized", nonce),
                None,
            );
        }
        let Some(TurnEvent::Failed(e)) = c.poll_event() else {
            panic!("no failure event");
        };
        assert!(matches!(e, IceError::TurnUnauthorized { .. }), "{e}");
        assert!(
            e.to_string().contains("wrong TURN username or password"),
            "{e}"
        );
    }

    #[test]
    fn stale_nonce_is_retried_with_the_new_nonce() {
        let now = Instant::now();
        let (mut c, key) = allocated(now);
        c.create_permission("10.0.0.9".parse().unwrap(), now);
        let req = last_request(&mut c);
        assert_eq!(req.method, Method::CreatePermission);
        answer(
            &mut c,
            &req,
            Class::Error,
            challenge(438, "Stale Nonce", "n2"),
            Some(&key),
        );
        let req2 = last_request(&mut c);
        assert_eq!(req2.method, Method::CreatePermission);
        assert_eq!(req2.nonce(), Some("n2"));
        assert_ne!(req2.transaction_id, req.transaction_id);
    }

    #[test]
    fn refreshes_before_expiry_and_channel_framing() {
        let now = Instant::now();
        let (mut c, key) = allocated(now);
        let peer: SocketAddr = "10.0.0.9:7000".parse().unwrap();
        // Before the channel is confirmed data goes as a Send indication.
        let send = Message::decode(&c.wrap(peer, b"x").unwrap()).unwrap();
        assert_eq!((send.class, send.method), (Class::Indication, Method::Send));
        c.bind_channel(peer, now);
        let req = last_request(&mut c);
        assert_eq!(req.method, Method::ChannelBind);
        answer_at(&mut c, &req, Class::Success, vec![], Some(&key), now);
        let frame = c.wrap(peer, b"abc").unwrap();
        assert_eq!(c.unwrap_channel(&frame), Some((peer, &b"abc"[..])));
        // The permission the channel installed is refreshed after 240 s, the allocation a
        // minute before its 600 s lifetime ends, the channel after 540 s.
        let mut seen = Vec::new();
        while let Some(due) = c
            .poll_timeout()
            .filter(|t| *t <= now + Duration::from_secs(540))
        {
            assert!(seen.len() < 10, "refresh storm: {seen:?}");
            c.handle_timeout(due);
            while let Some(b) = c.poll_transmit() {
                let m = Message::decode(&b).unwrap();
                seen.push(((due - now).as_secs(), m.method));
                answer_at(
                    &mut c,
                    &m,
                    Class::Success,
                    vec![Attribute::Lifetime(600)],
                    Some(&key),
                    due,
                );
            }
        }
        assert_eq!(
            seen,
            [
                (240, Method::CreatePermission),
                (480, Method::CreatePermission),
                (540, Method::Refresh),
                (540, Method::ChannelBind),
            ]
        );
    }

    #[test]
    fn data_indication_is_returned() {
        let (mut c, _) = allocated(Instant::now());
        let peer: SocketAddr = "10.0.0.9:7000".parse().unwrap();
        let raw = Message::new(Class::Indication, Method::Data, [9; 12])
            .with(Attribute::XorPeerAddress(peer))
            .with(Attribute::Data(b"hi".to_vec()))
            .encode(None, false)
            .unwrap();
        let m = Message::decode(&raw).unwrap();
        assert_eq!(
            c.handle_message(&m, &raw, Instant::now()),
            Some((peer, b"hi".to_vec()))
        );
    }

    #[test]
    fn allocate_timeout_fails() {
        let now = Instant::now();
        let mut c = TurnClient::new(server(), "u", "p", Duration::from_secs(2), now);
        let mut t = now;
        while let Some(next) = c.poll_timeout() {
            t = next;
            c.handle_timeout(t);
            if matches!(c.state(), TurnState::Failed(_)) {
                break;
            }
        }
        assert!(matches!(
            c.state(),
            TurnState::Failed(IceError::Timeout { .. })
        ));
        assert_eq!(t, now + Duration::from_secs(2));
    }
}
