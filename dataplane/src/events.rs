//! Events and request records from the data plane to the control plane through bounded
//! lock-free queues, one lane per core ([`CoreQueues`]). A full lane drops the item and counts
//! the drop: the data plane never waits.
//!
//! Connection events (one pair per proxied connection, with their strings) are built only while
//! someone subscribes to them ([`EventQueue::wants_connection_events`]): on a busy proxy nobody
//! watching means two queue writes and four string copies per connection saved, and the control
//! plane serialises nothing.

use crossbeam_queue::ArrayQueue;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering, Ordering::Relaxed};
use std::time::Instant;

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

pub type RequestQueue = CoreQueues<RequestRecord>;

/// The event queue plus whether connection events are wanted. The interest word is
/// `(epoch << 1) | on`: every subscription bumps the epoch and sets `on`, and the control plane
/// clears `on` only with a compare-and-swap against the word it read before counting
/// subscribers, so a subscription racing with that count is never switched off.
#[derive(Debug)]
pub struct EventQueue {
    queue: CoreQueues<Event>,
    interest: AtomicU64,
}

impl EventQueue {
    /// One core's lane of `capacity` (plus the other threads' lane).
    pub fn new(capacity: usize) -> Self {
        Self::per_core(1, capacity)
    }

    /// A lane per core, sharing `capacity` (see [`CoreQueues`]).
    pub fn per_core(cores: usize, capacity: usize) -> Self {
        Self {
            queue: CoreQueues::new(cores, capacity),
            interest: AtomicU64::new(0),
        }
    }

    /// From a thread that is not a data-plane core (control plane, tunnel owners).
    pub fn push(&self, event: Event) {
        self.queue.push(event);
    }

    /// From data-plane core `core`, into its own lane.
    pub fn push_from(&self, core: usize, event: Event) {
        self.queue.push_from(core, event);
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

/// Bounded queues of boxed items, one lane per data-plane core plus one for every other thread,
/// so that a core's pushes write only its own lane's lines: with one queue shared by all cores,
/// every push is a compare-and-swap on the same tail and a write beside the other cores' slots.
///
/// The slots are allocated and written (their stamps) when the lanes are made, so their size is
/// idle memory whether or not anything is ever queued: a 4096-slot queue of [`RequestRecord`]s
/// held 1.2 MiB from start, of boxes it holds 64 KiB; the cores share `capacity` between their
/// lanes. The box costs one allocation per item, and items are only made while someone wants
/// them (the request log, event subscribers).
///
/// Each item is stamped when pushed, and [`Self::pop`] hands out what the lanes held when it
/// last looked, oldest first, so a consumer sees the order the cores pushed in as it did with one
/// queue. The consumer's side (a staging buffer behind a mutex) is only ever locked by
/// consumers: a core never waits on it.
#[derive(Debug)]
pub struct CoreQueues<T> {
    lanes: Box<[Lane<T>]>,
    staged: parking_lot::Mutex<std::collections::VecDeque<(Instant, T)>>,
}

#[derive(Debug)]
struct Lane<T> {
    queue: ArrayQueue<Box<(Instant, T)>>,
    /// Items this lane refused because it was full; written by its own pusher only.
    dropped: AtomicU64,
}

/// Capacity of the lane shared by the threads that are not data-plane cores (control plane,
/// tunnel owners): their events are rare.
const OTHER_LANE: usize = 256;
/// The smallest lane a core gets, however many cores share the capacity.
const MIN_CORE_LANE: usize = 256;

impl<T> CoreQueues<T> {
    /// Lanes for `cores` cores sharing `capacity` slots (at least [`MIN_CORE_LANE`] each), plus
    /// the other threads' lane.
    pub fn new(cores: usize, capacity: usize) -> Self {
        let cores = cores.max(1);
        let per_core = capacity.div_ceil(cores).max(MIN_CORE_LANE);
        let lane = |capacity: usize| Lane {
            queue: ArrayQueue::new(capacity),
            dropped: AtomicU64::new(0),
        };
        Self {
            lanes: (0..cores)
                .map(|_| lane(per_core))
                .chain(std::iter::once(lane(OTHER_LANE)))
                .collect(),
            staged: parking_lot::Mutex::new(std::collections::VecDeque::new()),
        }
    }

    /// Pushes from data-plane core `core` into its own lane (an unknown core uses the other
    /// threads' lane). Never blocks; a full lane costs the item, not the caller.
    pub fn push_from(&self, core: usize, item: T) {
        let last = self.lanes.len() - 1;
        self.push_into(&self.lanes[core.min(last)], item);
    }

    /// Pushes from a thread that is not a data-plane core.
    pub fn push(&self, item: T) {
        self.push_into(&self.lanes[self.lanes.len() - 1], item);
    }

    fn push_into(&self, lane: &Lane<T>, item: T) {
        if lane.queue.push(Box::new((Instant::now(), item))).is_err() {
            lane.dropped.fetch_add(1, Relaxed);
        }
    }

    /// The oldest item of those queued when the lanes were last emptied; empties them again
    /// when those are all handed out.
    pub fn pop(&self) -> Option<T> {
        let mut staged = self.staged.lock();
        if staged.is_empty() {
            for lane in self.lanes.iter() {
                while let Some(item) = lane.queue.pop() {
                    staged.push_back(*item);
                }
            }
            // each lane is already in push order: a stable sort merges them
            staged.make_contiguous().sort_by_key(|(at, _)| *at);
        }
        staged.pop_front().map(|(_, item)| item)
    }

    /// Items refused by full lanes so far.
    pub fn dropped(&self) -> u64 {
        self.lanes.iter().map(|l| l.dropped.load(Relaxed)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(host: &str) -> Event {
        Event::ConnectionNew {
            protocol: Protocol::Http,
            host: host.into(),
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
    fn a_full_lane_drops_and_counts_and_the_others_still_take() {
        let q = CoreQueues::new(2, 2);
        for i in 0..=MIN_CORE_LANE {
            q.push_from(0, i);
        }
        assert_eq!(q.dropped(), 1);
        q.push_from(1, 1000);
        q.push(2000);
        assert_eq!(q.dropped(), 1);
        let mut popped = 0;
        while q.pop().is_some() {
            popped += 1;
        }
        assert_eq!(popped, MIN_CORE_LANE + 2);
    }

    #[test]
    fn each_core_pushes_into_its_own_lane() {
        let q = CoreQueues::new(2, 8);
        q.push_from(0, 'a');
        q.push_from(1, 'b');
        q.push_from(1, 'c');
        q.push_from(9, 'x'); // not a core: the other threads' lane
        q.push('y');
        let lens: Vec<usize> = q.lanes.iter().map(|l| l.queue.len()).collect();
        assert_eq!(lens, [1, 2, 2]);
    }

    #[test]
    fn items_from_several_lanes_come_out_in_push_order() {
        let q = EventQueue::per_core(2, 8);
        let pushes: [(Option<usize>, &str); 5] = [
            (Some(1), "a:1"),
            (Some(0), "b:1"),
            (None, "c:1"),
            (Some(1), "d:1"),
            (Some(0), "e:1"),
        ];
        for (core, host) in pushes {
            let event = ev(host);
            match core {
                Some(core) => q.push_from(core, event),
                None => q.push(event),
            }
            // distinct stamps: the order under test is the stamps'
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let hosts: Vec<String> = std::iter::from_fn(|| q.pop())
            .filter_map(|e| match e {
                Event::ConnectionNew { host, .. } => Some(host),
                _ => None,
            })
            .collect();
        assert_eq!(hosts, ["a:1", "b:1", "c:1", "d:1", "e:1"]);
    }
}
