//! STUN binding client for one server: learns the server-reflexive address (what the NAT maps
//! our socket to) and asks again every `refresh` so the NAT keeps the mapping and a changed
//! mapping is noticed.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rand::Rng;

use crate::stun::{Attribute, Class, Message, Method, TransactionId};
use crate::transaction::{Retransmit, TimerAction, INITIAL_RTO};
use crate::IceError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingEvent {
    /// First answer, or the mapping changed.
    Mapped(SocketAddr),
    Failed(IceError),
}

pub struct BindingClient {
    server: SocketAddr,
    timeout: Duration,
    refresh: Duration,
    in_flight: Option<(TransactionId, Vec<u8>, Retransmit)>,
    next_request: Option<Instant>,
    mapped: Option<SocketAddr>,
    transmits: Vec<Vec<u8>>,
    events: Vec<BindingEvent>,
}

impl BindingClient {
    pub fn new(server: SocketAddr, timeout: Duration, refresh: Duration, now: Instant) -> Self {
        BindingClient {
            server,
            timeout,
            refresh,
            in_flight: None,
            next_request: Some(now),
            mapped: None,
            transmits: Vec::new(),
            events: Vec::new(),
        }
    }

    pub fn server(&self) -> SocketAddr {
        self.server
    }

    pub fn mapped(&self) -> Option<SocketAddr> {
        self.mapped
    }

    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.transmits.pop()
    }

    pub fn poll_event(&mut self) -> Option<BindingEvent> {
        if self.events.is_empty() {
            None
        } else {
            Some(self.events.remove(0))
        }
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.in_flight {
            Some((_, _, timer)) => Some(timer.next_timeout()),
            None => self.next_request,
        }
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some((_, bytes, timer)) = &mut self.in_flight {
            match timer.poll(now) {
                TimerAction::Wait => {}
                TimerAction::Resend => self.transmits.push(bytes.clone()),
                TimerAction::TimedOut => {
                    self.in_flight = None;
                    self.next_request = Some(now + self.refresh);
                    self.events.push(BindingEvent::Failed(IceError::Timeout {
                        server: self.server,
                        what: "STUN Binding",
                    }));
                }
            }
            return;
        }
        if self.next_request.is_some_and(|t| now >= t) {
            self.next_request = None;
            let tid: TransactionId = rand::thread_rng().gen();
            // a bare Binding request: 28 bytes
            let Ok(bytes) = Message::new(Class::Request, Method::Binding, tid).encode(None, true)
            else {
                return;
            };
            self.transmits.push(bytes.clone());
            self.in_flight = Some((
                tid,
                bytes,
                Retransmit::start(now, INITIAL_RTO, self.timeout),
            ));
        }
    }

    /// True when the message answered our request (it is then consumed).
    pub fn handle_message(&mut self, message: &Message, now: Instant) -> bool {
        let ours = matches!(&self.in_flight, Some((tid, _, _)) if *tid == message.transaction_id);
        if !ours || message.method != Method::Binding {
            return false;
        }
        self.in_flight = None;
        self.next_request = Some(now + self.refresh);
        match (message.class, message.mapped_address()) {
            (Class::Success, Some(mapped)) => {
                if self.mapped != Some(mapped) {
                    self.mapped = Some(mapped);
                    self.events.push(BindingEvent::Mapped(mapped));
                }
            }
            _ => {
                let (code, reason) = message.error_code().unwrap_or((0, "no mapped address"));
                self.events
                    .push(BindingEvent::Failed(IceError::StunRejected {
                        server: self.server,
                        code,
                        reason: reason.to_string(),
                    }));
            }
        }
        true
    }
}

/// The success response a STUN server (or a peer answering a check) sends: XOR-MAPPED-ADDRESS
/// is where the request came from.
pub fn success_response(request: &Message, from: SocketAddr) -> Message {
    Message::new(Class::Success, request.method, request.transaction_id)
        .with(Attribute::XorMappedAddress(from))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn learns_mapping_then_refreshes() {
        let now = Instant::now();
        let server = "127.0.0.1:3478".parse().unwrap();
        let mut b =
            BindingClient::new(server, Duration::from_secs(5), Duration::from_secs(25), now);
        b.handle_timeout(now);
        let req = Message::decode(&b.poll_transmit().expect("request")).unwrap();
        let mapped: SocketAddr = "198.51.100.7:6000".parse().unwrap();
        let resp = success_response(&req, mapped);
        assert!(b.handle_message(&resp, now));
        assert_eq!(b.poll_event(), Some(BindingEvent::Mapped(mapped)));
        assert_eq!(b.poll_timeout(), Some(now + Duration::from_secs(25)));
        // A stranger's transaction is not ours.
        assert!(!b.handle_message(&resp, now));
    }

    #[test]
    fn no_answer_is_a_timeout_error() {
        let now = Instant::now();
        let server = "127.0.0.1:3478".parse().unwrap();
        let mut b =
            BindingClient::new(server, Duration::from_secs(1), Duration::from_secs(25), now);
        while b.poll_event().is_none() {
            let t = b.poll_timeout().expect("timer");
            b.handle_timeout(t);
        }
        assert_eq!(b.mapped(), None);
    }
}
