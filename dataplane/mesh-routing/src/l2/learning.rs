//! The bridge's learning table (source MAC → the peer it came from, aged out like a switch
//! forgets) and the per-frame delivery decision for frames read from the TAP device.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::mac::MacAddr;

/// A learned address is forgotten after this long without a frame from it (the 802.1D
/// default ageing time).
pub const DEFAULT_AGEING: Duration = Duration::from_secs(300);
/// Most addresses held; when full, a new address is not learned (its frames are flooded).
pub const DEFAULT_CAPACITY: usize = 4096;

/// Where a frame from the local device goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameDelivery {
    /// The destination MAC was learned from this peer.
    Unicast(String),
    /// Broadcast, multicast or unknown unicast: to every peer (one EtherIP copy each).
    Flood,
    /// Not a frame (shorter than an Ethernet header), or addressed to ourselves.
    Drop,
}

/// What learning a frame's source MAC did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learning {
    /// A new address, or one that moved here after its owner had been quiet for the ageing
    /// time.
    Learned,
    /// The address was already known behind this peer: its age starts again.
    Refreshed,
    /// The address lives behind another peer that is still active: a claim on a neighbour's
    /// MAC, refused (the frame is not that peer's to send).
    Refused,
    /// Not learned: a group or our own address, or the table is full.
    Ignored,
}

/// MAC → peer, with ageing.
#[derive(Debug)]
pub struct MacTable {
    entries: HashMap<MacAddr, (String, Instant)>,
    ageing: Duration,
    capacity: usize,
    local: MacAddr,
}

impl MacTable {
    /// `local` is our own device MAC (never learned from a peer, frames to it are dropped).
    pub fn new(local: MacAddr, ageing: Duration, capacity: usize) -> Self {
        MacTable {
            entries: HashMap::new(),
            ageing,
            capacity,
            local,
        }
    }

    /// Learns the source MAC of a frame that arrived from `peer`. Group (multicast) and our
    /// own source addresses are never learned; a frame too short to have a source is ignored.
    pub fn learn_from_frame(&mut self, frame: &[u8], peer: &str, now: Instant) -> Learning {
        match MacAddr::source_of(frame) {
            Some(src) => self.learn(src, peer, now),
            None => Learning::Ignored,
        }
    }

    /// Learns `mac` → `peer`.
    pub fn learn(&mut self, mac: MacAddr, peer: &str, now: Instant) -> Learning {
        if mac.is_multicast() || mac == self.local {
            return Learning::Ignored;
        }
        if let Some((owner, seen)) = self.entries.get_mut(&mac) {
            if owner == peer {
                *seen = now;
                return Learning::Refreshed;
            }
            // Another peer claims an address still in use behind its owner: refused, or any
            // member could draw a neighbour's frames by sending one with its source MAC. The
            // address moves (a VM migrated, a bridge re-cabled) once its owner has been quiet
            // for the ageing time.
            if now.saturating_duration_since(*seen) < self.ageing {
                return Learning::Refused;
            }
            *owner = peer.to_owned();
            *seen = now;
            return Learning::Learned;
        }
        if self.entries.len() >= self.capacity {
            self.expire(now);
            if self.entries.len() >= self.capacity {
                return Learning::Ignored;
            }
        }
        self.entries.insert(mac, (peer.to_owned(), now));
        Learning::Learned
    }

    /// The peer that owns `mac`, unless the entry aged out.
    pub fn lookup(&self, mac: MacAddr, now: Instant) -> Option<&str> {
        let (peer, seen) = self.entries.get(&mac)?;
        (now.saturating_duration_since(*seen) < self.ageing).then_some(peer.as_str())
    }

    /// Forgets every address learned from a peer that left.
    pub fn forget_peer(&mut self, peer: &str) {
        self.entries.retain(|_, (owner, _)| owner != peer);
    }

    /// Drops aged-out entries.
    pub fn expire(&mut self, now: Instant) {
        let ageing = self.ageing;
        self.entries
            .retain(|_, (_, seen)| now.saturating_duration_since(*seen) < ageing);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Where a frame read from the local device goes.
    pub fn decide(&self, frame: &[u8], now: Instant) -> FrameDelivery {
        if frame.len() < super::etherip::ETHERNET_HEADER_LEN {
            return FrameDelivery::Drop;
        }
        let Some(dst) = MacAddr::destination_of(frame) else {
            return FrameDelivery::Drop;
        };
        if dst == self.local {
            return FrameDelivery::Drop;
        }
        if dst.is_multicast() {
            return FrameDelivery::Flood;
        }
        match self.lookup(dst, now) {
            Some(peer) => FrameDelivery::Unicast(peer.to_owned()),
            None => FrameDelivery::Flood,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const LOCAL: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const M2: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
    const M3: MacAddr = MacAddr([2, 0, 0, 0, 0, 3]);

    fn frame(dst: MacAddr, src: MacAddr) -> Vec<u8> {
        let mut f = dst.0.to_vec();
        f.extend(src.0);
        f.extend([0x08, 0x00]);
        f
    }

    #[test]
    fn unicast_to_a_learned_mac_goes_to_its_peer_and_the_rest_floods() {
        let t0 = Instant::now();
        let mut t = MacTable::new(LOCAL, DEFAULT_AGEING, DEFAULT_CAPACITY);
        assert_eq!(
            t.decide(&frame(M2, LOCAL), t0),
            FrameDelivery::Flood,
            "unknown"
        );
        assert_eq!(
            t.learn_from_frame(&frame(LOCAL, M2), "peer-b", t0),
            Learning::Learned
        );
        assert_eq!(
            t.decide(&frame(M2, LOCAL), t0),
            FrameDelivery::Unicast("peer-b".into())
        );
        assert_eq!(
            t.decide(&frame(MacAddr::BROADCAST, LOCAL), t0),
            FrameDelivery::Flood
        );
        let mcast = MacAddr([0x01, 0x00, 0x5e, 0, 0, 0xfb]);
        assert_eq!(t.decide(&frame(mcast, LOCAL), t0), FrameDelivery::Flood);
        assert_eq!(t.decide(&frame(LOCAL, M2), t0), FrameDelivery::Drop);
        assert_eq!(t.decide(&[0; 13], t0), FrameDelivery::Drop);
    }

    #[test]
    fn group_and_own_sources_are_not_learned() {
        let t0 = Instant::now();
        let mut t = MacTable::new(LOCAL, DEFAULT_AGEING, DEFAULT_CAPACITY);
        assert_eq!(t.learn(MacAddr::BROADCAST, "peer-b", t0), Learning::Ignored);
        assert_eq!(t.learn(LOCAL, "peer-b", t0), Learning::Ignored);
        assert_eq!(
            t.learn_from_frame(&[0; 11], "peer-b", t0),
            Learning::Ignored
        );
        assert!(t.is_empty());
    }

    #[test]
    fn entries_age_out_and_move_between_peers() {
        let t0 = Instant::now();
        let mut t = MacTable::new(LOCAL, Duration::from_secs(10), DEFAULT_CAPACITY);
        t.learn(M2, "peer-b", t0);
        assert_eq!(t.lookup(M2, t0 + Duration::from_secs(9)), Some("peer-b"));
        assert_eq!(
            t.learn(M2, "peer-b", t0 + Duration::from_secs(9)),
            Learning::Refreshed
        );
        assert_eq!(t.lookup(M2, t0 + Duration::from_secs(18)), Some("peer-b"));
        assert_eq!(t.lookup(M2, t0 + Duration::from_secs(19)), None);
        assert_eq!(
            t.learn(M2, "peer-c", t0 + Duration::from_secs(20)),
            Learning::Learned,
            "moved once its owner was quiet for the ageing time"
        );
        assert_eq!(t.lookup(M2, t0 + Duration::from_secs(20)), Some("peer-c"));
        t.learn(M3, "peer-c", t0 + Duration::from_secs(20));
        t.forget_peer("peer-c");
        assert!(t.is_empty());
    }

    #[test]
    fn a_live_address_is_not_taken_over_by_another_peer() {
        let t0 = Instant::now();
        let mut t = MacTable::new(LOCAL, Duration::from_secs(10), DEFAULT_CAPACITY);
        t.learn(M2, "victim", t0);
        // frames with the victim's source MAC from another member, again and again
        for s in 1..10 {
            let at = t0 + Duration::from_secs(s);
            assert_eq!(t.learn(M2, "mallory", at), Learning::Refused);
            t.learn(M2, "victim", at);
        }
        assert_eq!(t.lookup(M2, t0 + Duration::from_secs(10)), Some("victim"));
    }

    #[test]
    fn the_table_is_bounded() {
        let t0 = Instant::now();
        let mut t = MacTable::new(LOCAL, DEFAULT_AGEING, 2);
        assert_eq!(t.learn(M2, "b", t0), Learning::Learned);
        assert_eq!(t.learn(M3, "c", t0), Learning::Learned);
        assert_eq!(
            t.learn(MacAddr([2, 0, 0, 0, 0, 4]), "d", t0),
            Learning::Ignored
        );
        assert_eq!(t.len(), 2);
        // Once the old ones age out there is room again.
        assert_eq!(
            t.learn(MacAddr([2, 0, 0, 0, 0, 4]), "d", t0 + DEFAULT_AGEING),
            Learning::Learned
        );
    }

    #[test]
    fn a_claim_on_a_live_address_is_refused_each_time_and_the_owner_keeps_it_fresh() {
        let t0 = Instant::now();
        let mut t = MacTable::new(LOCAL, Duration::from_secs(10), DEFAULT_CAPACITY);
        assert_eq!(t.learn(M2, "victim", t0), Learning::Learned);
        // every claim is refused while the owner keeps sending, however long it goes on
        for s in (5..60).step_by(5) {
            let at = t0 + Duration::from_secs(s);
            assert_eq!(
                t.learn_from_frame(&frame(LOCAL, M2), "mallory", at),
                Learning::Refused,
                "at {s} s"
            );
            assert_eq!(t.learn(M2, "victim", at), Learning::Refreshed);
        }
        assert_eq!(
            t.decide(&frame(M2, LOCAL), t0 + Duration::from_secs(60)),
            FrameDelivery::Unicast("victim".into())
        );
        // a refused claim does not refresh the owner's entry either: it ages out on time
        let quiet = t0 + Duration::from_secs(55);
        assert_eq!(
            t.learn(M2, "mallory", quiet + Duration::from_secs(9)),
            Learning::Refused
        );
        assert_eq!(t.lookup(M2, quiet + Duration::from_secs(10)), None);
    }
}
