//! Multicast and anycast group membership: the groups this peer joined and the groups every
//! other peer announced ([`Membership`] messages, flooded with a per-origin sequence number).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crate::wire::{Membership, MAX_GROUPS};

/// One remote peer's last announced groups.
#[derive(Debug, Clone)]
struct Member {
    vip: Ipv4Addr,
    seq: u64,
    groups: BTreeSet<Ipv4Addr>,
    received: Instant,
}

/// Local and remote group memberships.
#[derive(Debug)]
pub struct GroupTable {
    local: BTreeSet<Ipv4Addr>,
    seq: u64,
    /// The local set changed and was not announced yet.
    dirty: bool,
    remote: BTreeMap<String, Member>,
}

impl GroupTable {
    /// `seq_start` should grow across restarts (Unix microseconds) so that peers that still
    /// remember the old sequence take the new announcements as newer.
    pub fn new(seq_start: u64) -> Self {
        GroupTable {
            local: BTreeSet::new(),
            seq: seq_start,
            dirty: false,
            remote: BTreeMap::new(),
        }
    }

    /// Joins a group; false when already joined or at the [`MAX_GROUPS`] limit.
    pub fn join(&mut self, group: Ipv4Addr) -> bool {
        if self.local.len() >= MAX_GROUPS || !self.local.insert(group) {
            return false;
        }
        self.dirty = true;
        true
    }

    /// Leaves a group; false when not a member.
    pub fn leave(&mut self, group: Ipv4Addr) -> bool {
        let left = self.local.remove(&group);
        self.dirty |= left;
        left
    }

    pub fn is_local_member(&self, group: Ipv4Addr) -> bool {
        self.local.contains(&group)
    }

    pub fn local_groups(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.local.iter().copied()
    }

    pub(crate) fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// The next announcement of the local groups (a new sequence number each time).
    pub(crate) fn next_local_announcement(&mut self, origin: &str, vip: Ipv4Addr) -> Membership {
        self.dirty = false;
        self.seq = self.seq.wrapping_add(1);
        Membership {
            origin: origin.to_owned(),
            vip,
            seq: self.seq,
            groups: self.local.iter().copied().collect(),
        }
    }

    /// Stores a remote announcement when it is newer than the one held; true when stored
    /// (so it should be passed on).
    pub fn accept(&mut self, m: &Membership, now: Instant) -> bool {
        match self.remote.get(&m.origin) {
            Some(held) if crate::router::is_stale(m.seq, held.seq) => return false,
            None if self.remote.len() >= crate::router::MAX_DESTINATIONS => return false,
            _ => {}
        }
        self.remote.insert(
            m.origin.clone(),
            Member {
                vip: m.vip,
                seq: m.seq,
                groups: m.groups.iter().copied().collect(),
                received: now,
            },
        );
        true
    }

    /// Forgets a peer that left the network.
    pub fn forget(&mut self, origin: &str) {
        self.remote.remove(origin);
    }

    /// Drops announcements not refreshed within `timeout`.
    pub fn expire(&mut self, now: Instant, timeout: Duration) {
        self.remote
            .retain(|_, m| now.saturating_duration_since(m.received) < timeout);
    }

    /// When the oldest remote announcement expires.
    pub fn next_expiry(&self, timeout: Duration) -> Option<Instant> {
        self.remote.values().map(|m| m.received + timeout).min()
    }

    /// The remote members of `group` (peer id, vip), by id.
    pub fn remote_members(&self, group: Ipv4Addr) -> Vec<(String, Ipv4Addr)> {
        self.remote
            .iter()
            .filter(|(_, m)| m.groups.contains(&group))
            .map(|(id, m)| (id.clone(), m.vip))
            .collect()
    }

    /// Every group anyone (local or remote) announced.
    pub fn all_groups(&self) -> BTreeSet<Ipv4Addr> {
        let mut all = self.local.clone();
        for m in self.remote.values() {
            all.extend(m.groups.iter().copied());
        }
        all
    }

    /// The stored remote announcements, re-encodable as they were received (for a neighbour
    /// that just came up).
    pub(crate) fn remote_announcements(&self) -> Vec<Membership> {
        self.remote
            .iter()
            .map(|(id, m)| Membership {
                origin: id.clone(),
                vip: m.vip,
                seq: m.seq,
                groups: m.groups.iter().copied().collect(),
            })
            .collect()
    }

    /// The last local announcement, if any was made (same sequence number: not new).
    pub(crate) fn current_local_announcement(
        &self,
        origin: &str,
        vip: Ipv4Addr,
    ) -> Option<Membership> {
        if self.local.is_empty() {
            return None;
        }
        Some(Membership {
            origin: origin.to_owned(),
            vip,
            seq: self.seq,
            groups: self.local.iter().copied().collect(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn m(origin: &str, seq: u64, groups: &[Ipv4Addr]) -> Membership {
        Membership {
            origin: origin.into(),
            vip: Ipv4Addr::new(10, 0, 0, 9),
            seq,
            groups: groups.to_vec(),
        }
    }

    #[test]
    fn newer_announcements_replace_older_ones_and_older_are_refused() {
        let g = Ipv4Addr::new(239, 0, 0, 1);
        let h = Ipv4Addr::new(239, 0, 0, 2);
        let t0 = Instant::now();
        let mut t = GroupTable::new(0);
        assert!(t.accept(&m("b", 5, &[g]), t0));
        assert!(!t.accept(&m("b", 5, &[h]), t0), "same seq is a duplicate");
        assert!(!t.accept(&m("b", 4, &[h]), t0), "older seq");
        assert_eq!(
            t.remote_members(g),
            vec![("b".into(), Ipv4Addr::new(10, 0, 0, 9))]
        );
        assert!(t.accept(&m("b", 6, &[h]), t0));
        assert!(
            t.remote_members(g).is_empty(),
            "the new set replaces the old"
        );
        assert_eq!(t.remote_members(h).len(), 1);
    }

    #[test]
    fn a_restarted_origin_far_behind_is_believed() {
        let g = Ipv4Addr::new(239, 0, 0, 1);
        let t0 = Instant::now();
        let mut t = GroupTable::new(0);
        assert!(t.accept(&m("b", 1_000_000, &[]), t0));
        assert!(!t.accept(&m("b", 999_000, &[g]), t0), "reordered");
        assert!(t.accept(&m("b", 1, &[g]), t0), "restarted from 0");
        assert_eq!(t.remote_members(g).len(), 1);
    }

    #[test]
    fn local_join_and_leave_mark_the_table_for_announcement() {
        let g = Ipv4Addr::new(239, 0, 0, 1);
        let mut t = GroupTable::new(100);
        assert!(!t.is_dirty());
        assert!(t.join(g));
        assert!(!t.join(g));
        assert!(t.is_dirty());
        let a = t.next_local_announcement("a", Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!((a.seq, a.groups.clone()), (101, vec![g]));
        assert!(!t.is_dirty());
        assert!(t.leave(g));
        assert!(t.is_dirty());
        assert_eq!(t.next_local_announcement("a", a.vip).seq, 102);
    }

    #[test]
    fn announcements_expire() {
        let g = Ipv4Addr::new(239, 0, 0, 1);
        let t0 = Instant::now();
        let mut t = GroupTable::new(0);
        t.accept(&m("b", 1, &[g]), t0);
        let timeout = Duration::from_secs(60);
        assert_eq!(t.next_expiry(timeout), Some(t0 + timeout));
        t.expire(t0 + Duration::from_secs(59), timeout);
        assert_eq!(t.remote_members(g).len(), 1);
        t.expire(t0 + timeout, timeout);
        assert!(t.remote_members(g).is_empty());
    }

    #[test]
    fn the_local_group_count_is_bounded() {
        let mut t = GroupTable::new(0);
        for i in 0..MAX_GROUPS {
            assert!(t.join(Ipv4Addr::new(239, 0, 0, i as u8)));
        }
        assert!(!t.join(Ipv4Addr::new(239, 0, 1, 0)));
    }
}
