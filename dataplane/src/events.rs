//! Events from the data plane to the control plane through a bounded lock-free queue.
//! A full queue drops the event and counts the drop: the data plane never waits.
//!
//! Connection events (one pair per proxied connection, with their strings) are built only while
//! someone subscribes to them ([`EventQueue::wants_connection_events`]): on a busy proxy nobody
//! watching means two queue writes on a line every core shares and four string copies per
//! connection saved, and the control plane serialises nothing.

use crossbeam_queue::ArrayQueue;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering, Ordering::Relaxed};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http,
    Connect,
    Socks5,
    /// A flow of the client's VPN (TUN) path.
    Vpn,
    /// A UDP flow of the client's VPN (TUN) path.
    VpnUdp,
    /// A flow (stream or datagrams) of the QUIC transport.
    Quic,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "HTTP",
            Self::Connect => "CONNECT",
            Self::Socks5 => "SOCKS5",
            Self::Vpn => "VPN",
            Self::VpnUdp => "VPN-UDP",
            Self::Quic => "QUIC",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    ConnectionNew {
        protocol: Protocol,
        host: String,
        backend: String,
        client: SocketAddr,
    },
    ConnectionClose {
        protocol: Protocol,
        host: String,
        backend: String,
        client: SocketAddr,
        bytes_sent: u64,
        bytes_received: u64,
    },
    /// A backend's passive health changed (connect failures / recoveries).
    BackendHealth { name: String, healthy: bool },
}

/// One proxied request (HTTP request, CONNECT tunnel or SOCKS5 connection) for the request log.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    pub timestamp: std::time::SystemTime,
    pub method: String,
    pub host: String,
    pub path: String,
    pub url: String,
    pub user_agent: String,
    pub client_ip: std::net::IpAddr,
    pub username: String,
    pub backend: String,
    pub status_code: u16,
    /// Towards the client.
    pub bytes_sent: u64,
    /// From the client.
    pub bytes_recv: u64,
    pub duration_ms: u64,
    pub error: String,
    pub protocol: Protocol,
}

pub type RequestQueue = BoundedQueue<RequestRecord>;

/// The event queue plus whether connection events are wanted. The interest word is
/// `(epoch << 1) | on`: every subscription bumps the epoch and sets `on`, and the control plane
/// clears `on` only with a compare-and-swap against the word it read before counting
/// subscribers, so a subscription racing with that count is never switched off.
#[derive(Debug)]
pub struct EventQueue {
    queue: BoundedQueue<Event>,
    interest: AtomicU64,
}

impl EventQueue {
    pub fn new(capacity: usize) -> Self {
        Self {
            queue: BoundedQueue::new(capacity),
            interest: AtomicU64::new(0),
        }
    }

    pub fn push(&self, event: Event) {
        self.queue.push(event);
    }

    pub fn pop(&self) -> Option<Event> {
        self.queue.pop()
    }

    pub fn dropped(&self) -> u64 {
        self.queue.dropped()
    }

    /// Whether the data plane should build connection events (a read-only check on its side).
    pub fn wants_connection_events(&self) -> bool {
        self.interest.load(Relaxed) & 1 == 1
    }

    /// A consumer of connection events appeared: on from now.
    pub fn subscribed(&self) {
        let _ = self
            .interest
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.wrapping_add(2) | 1)
            });
    }

    /// The interest word to pass to [`Self::unsubscribed_since`] (read it before counting).
    pub fn interest(&self) -> u64 {
        self.interest.load(Ordering::Acquire)
    }

    /// No consumer is left, as counted after reading `seen`: off, unless one subscribed since.
    pub fn unsubscribed_since(&self, seen: u64) {
        if seen & 1 == 1 {
            let _ = self.interest.compare_exchange(
                seen,
                seen & !1,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }
}

/// A bounded queue of boxed items. The slots are allocated and written (their stamps) when the
/// queue is made, so their size is idle memory whether or not anything is ever queued: a
/// 4096-slot queue of [`RequestRecord`]s held 1.2 MiB from start, of boxes it holds 64 KiB. The
/// box costs one allocation per item, and items are only made while someone wants them (the
/// request log, event subscribers).
#[derive(Debug)]
pub struct BoundedQueue<T> {
    queue: ArrayQueue<Box<T>>,
    dropped: AtomicU64,
}

impl<T> BoundedQueue<T> {
    pub fn new(capacity: usize) -> Self {
        Self {
            queue: ArrayQueue::new(capacity.max(1)),
            dropped: AtomicU64::new(0),
        }
    }

    /// Never blocks; a full queue costs the event, not the caller.
    pub fn push(&self, event: T) {
        if self.queue.push(Box::new(event)).is_err() {
            self.dropped.fetch_add(1, Relaxed);
        }
    }

    pub fn pop(&self) -> Option<T> {
        self.queue.pop().map(|boxed| *boxed)
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev() -> Event {
        Event::ConnectionNew {
            protocol: Protocol::Http,
            host: "a:80".into(),
            backend: "direct".into(),
            client: "127.0.0.1:1".parse().expect("addr"),
        }
    }

    #[test]
    fn connection_events_stay_on_for_a_subscriber_racing_with_the_count() {
        let q = EventQueue::new(4);
        assert!(!q.wants_connection_events());
        q.subscribed();
        assert!(q.wants_connection_events());
        // the control plane read the word, then a subscriber arrived before it counted zero
        let seen = q.interest();
        q.subscribed();
        q.unsubscribed_since(seen);
        assert!(q.wants_connection_events());
        // nobody arrived since the read: off
        let seen = q.interest();
        q.unsubscribed_since(seen);
        assert!(!q.wants_connection_events());
    }

    #[test]
    fn full_queue_drops_and_counts() {
        let q = EventQueue::new(1);
        q.push(ev());
        q.push(ev());
        assert_eq!(q.dropped(), 1);
        assert!(q.pop().is_some());
        assert!(q.pop().is_none());
    }
}
