//! Leases of virtual addresses: which address a registering peer gets, and when a lease ends.
//! Runtime-free; the store applies these decisions inside a database transaction and the
//! database's unique index on (network, address) has the last word under concurrency.

use chrono::{DateTime, Utc};
use ipnet::Ipv4Net;
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Duration;

/// The addresses of `net` a peer may hold: every address but the network and broadcast
/// addresses. Empty for /31 and /32 (network validation refuses those).
pub fn leasable(net: Ipv4Net) -> std::ops::RangeInclusive<u32> {
    let first = u32::from(net.network()).saturating_add(1);
    // For /31 and /32 `first > last`: an empty range.
    let last = u32::from(net.broadcast()).saturating_sub(1);
    first..=last
}

/// How many peers `net` can hold.
pub fn capacity(net: Ipv4Net) -> u64 {
    let r = leasable(net);
    if r.is_empty() {
        0
    } else {
        u64::from(r.end() - r.start()) + 1
    }
}

/// The address for a registering peer: `preferred` (its previous address) when it is leasable
/// and free, else the lowest free one; `None` when the network is full. `used` holds the
/// addresses leased now. Looks at most `used.len() + 1` candidates.
pub fn allocate(
    net: Ipv4Net,
    used: &BTreeSet<Ipv4Addr>,
    preferred: Option<Ipv4Addr>,
) -> Option<Ipv4Addr> {
    let range = leasable(net);
    if let Some(p) = preferred {
        if range.contains(&u32::from(p)) && !used.contains(&p) {
            return Some(p);
        }
    }
    range.map(Ipv4Addr::from).find(|a| !used.contains(a))
}

/// Is a lease ending at `expires` over at `now`? The end itself is outside the lease (the
/// store's queries say the same: `lease_expires <= now` is over).
pub fn ended(expires: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    expires <= now
}

/// When leases end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasePolicy {
    /// A lease lasts this long after its last registration or heartbeat.
    pub lease_time: Duration,
    /// A peer whose lease expired is remembered this long (its heartbeat answers 409, "re-register",
    /// rather than 404) before it is forgotten.
    pub forget_after: Duration,
}

impl LeasePolicy {
    pub fn new(lease_time: Duration) -> Self {
        Self {
            lease_time,
            forget_after: Duration::from_secs(24 * 3600),
        }
    }

    /// The end of a lease renewed at `now`.
    pub fn expires(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        now + chrono::Duration::from_std(self.lease_time).unwrap_or(chrono::TimeDelta::MAX)
    }

    /// Expired peers whose lease ended before this are forgotten.
    pub fn forget_before(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        now - chrono::Duration::from_std(self.forget_after).unwrap_or(chrono::TimeDelta::MAX)
    }

    /// How often expired leases are looked for: a quarter of the lease time, between 100 ms
    /// and 5 s, so `peer.left` follows an expiry closely without busy polling.
    pub fn sweep_every(&self) -> Duration {
        (self.lease_time / 4).clamp(Duration::from_millis(100), Duration::from_secs(5))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn slash_30_has_two_addresses_never_network_or_broadcast() {
        let n = net("10.9.0.0/30");
        assert_eq!(capacity(n), 2);
        let mut used = BTreeSet::new();
        let a = allocate(n, &used, None).unwrap();
        used.insert(a);
        let b = allocate(n, &used, None).unwrap();
        used.insert(b);
        assert_eq!((a, b), (ip("10.9.0.1"), ip("10.9.0.2")));
        assert_eq!(allocate(n, &used, None), None);
        // Preferring the network or broadcast address does not hand it out.
        used.clear();
        assert_eq!(
            allocate(n, &used, Some(ip("10.9.0.0"))),
            Some(ip("10.9.0.1"))
        );
        assert_eq!(
            allocate(n, &used, Some(ip("10.9.0.3"))),
            Some(ip("10.9.0.1"))
        );
    }

    #[test]
    fn lowest_free_address_fills_holes() {
        let n = net("192.168.7.0/24");
        let used: BTreeSet<_> = ["192.168.7.1", "192.168.7.2", "192.168.7.4"]
            .into_iter()
            .map(ip)
            .collect();
        assert_eq!(allocate(n, &used, None), Some(ip("192.168.7.3")));
        assert_eq!(capacity(n), 254);
    }

    #[test]
    fn preferred_address_is_kept_when_free() {
        let n = net("10.0.0.0/24");
        let mut used = BTreeSet::from([ip("10.0.0.1")]);
        assert_eq!(
            allocate(n, &used, Some(ip("10.0.0.77"))),
            Some(ip("10.0.0.77"))
        );
        used.insert(ip("10.0.0.77"));
        assert_eq!(
            allocate(n, &used, Some(ip("10.0.0.77"))),
            Some(ip("10.0.0.2"))
        );
        // Outside the network: ignored.
        assert_eq!(
            allocate(n, &used, Some(ip("10.0.1.5"))),
            Some(ip("10.0.0.2"))
        );
    }

    #[test]
    fn tiny_networks_lease_nothing() {
        assert_eq!(capacity(net("10.0.0.0/31")), 0);
        assert_eq!(capacity(net("10.0.0.7/32")), 0);
        assert_eq!(allocate(net("10.0.0.0/31"), &BTreeSet::new(), None), None);
    }

    #[test]
    fn a_full_slash_16_is_full() {
        let n = net("10.1.0.0/16");
        let used: BTreeSet<_> = leasable(n).map(Ipv4Addr::from).collect();
        assert_eq!(used.len() as u64, capacity(n));
        assert_eq!(allocate(n, &used, None), None);
    }

    #[test]
    fn expiry_is_exclusive_at_the_end() {
        let p = LeasePolicy::new(Duration::from_secs(90));
        let t0 = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let end = p.expires(t0);
        assert_eq!((end - t0).num_seconds(), 90);
        assert!(!ended(end, end - chrono::Duration::milliseconds(1)));
        assert!(ended(end, end));
        assert!(p.forget_before(t0) < t0);
    }

    #[test]
    fn sweeps_follow_the_lease_time_within_bounds() {
        let every = |s| LeasePolicy::new(Duration::from_secs(s)).sweep_every();
        assert_eq!(every(2), Duration::from_millis(500));
        assert_eq!(every(90), Duration::from_secs(5));
        assert_eq!(
            LeasePolicy::new(Duration::from_millis(200)).sweep_every(),
            Duration::from_millis(100)
        );
    }
}
