//! The groups this peer is a member of, learnt from its own device, runtime-free: multicast
//! groups from the IGMP membership reports and leaves the kernel writes to the mesh device
//! when a socket joins or leaves a group on it (IGMPv1/v2 reports, v2 leaves, v3 reports with
//! their group records), and anycast addresses (the device's extra addresses inside the
//! network, read by the control plane). [`LocalGroups`] holds both and says what the router
//! must join or leave.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

/// IP protocol number of IGMP.
const IGMP: u8 = 2;
/// 224.0.0.1: every host is a member and no report is ever sent for it, so packets to it are
/// broadcast.
pub const ALL_HOSTS: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 1);

/// One membership change an IGMP report asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupChange {
    Join(Ipv4Addr),
    Leave(Ipv4Addr),
}

/// The membership changes of an IPv4 packet carrying IGMP; `None` when the packet is not IGMP
/// (queries and malformed IGMP give an empty list: consumed, nothing changes).
pub fn igmp_changes(packet: &[u8]) -> Option<Vec<GroupChange>> {
    if packet.len() < 20 || packet[0] >> 4 != 4 || packet[9] != IGMP {
        return None;
    }
    let ihl = usize::from(packet[0] & 0x0F) * 4;
    let total = usize::from(u16::from_be_bytes([packet[2], packet[3]])).min(packet.len());
    let igmp = packet.get(ihl..total).unwrap_or_default();
    Some(parse_igmp(igmp))
}

fn group_at(b: &[u8], at: usize) -> Option<Ipv4Addr> {
    let g: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
    let g = Ipv4Addr::from(g);
    (g.is_multicast() && g != ALL_HOSTS).then_some(g)
}

fn parse_igmp(igmp: &[u8]) -> Vec<GroupChange> {
    let mut out = Vec::new();
    let Some(&kind) = igmp.first() else {
        return out;
    };
    match kind {
        // v1 and v2 membership reports, v2 leave group
        0x12 | 0x16 => out.extend(group_at(igmp, 4).map(GroupChange::Join)),
        0x17 => out.extend(group_at(igmp, 4).map(GroupChange::Leave)),
        // v3 membership report (RFC 3376 §4.2): number of records at 6, records from 8
        0x22 => {
            let Some(n) = igmp.get(6..8).map(|b| u16::from_be_bytes([b[0], b[1]])) else {
                return out;
            };
            let mut at = 8;
            for _ in 0..n {
                let Some(head) = igmp.get(at..at + 8) else {
                    break;
                };
                let (record, aux_words) = (head[0], usize::from(head[1]));
                let sources = usize::from(u16::from_be_bytes([head[2], head[3]]));
                let group = group_at(igmp, at + 4);
                at += 8 + sources * 4 + aux_words * 4;
                let Some(group) = group else {
                    continue;
                };
                // sources are not tracked: a group with any source wanted is joined
                let change = match record {
                    // MODE_IS_EXCLUDE, CHANGE_TO_EXCLUDE_MODE: any source
                    2 | 4 => Some(GroupChange::Join(group)),
                    // MODE_IS_INCLUDE, CHANGE_TO_INCLUDE_MODE: none = left
                    1 | 3 if sources == 0 => Some(GroupChange::Leave(group)),
                    1 | 3 => Some(GroupChange::Join(group)),
                    // ALLOW_NEW_SOURCES
                    5 if sources > 0 => Some(GroupChange::Join(group)),
                    // BLOCK_OLD_SOURCES and unknown record types change nothing we track
                    _ => None,
                };
                out.extend(change);
            }
        }
        _ => {}
    }
    out
}

/// The groups of this peer: multicast groups joined on the device and anycast addresses.
#[derive(Debug, Default)]
pub struct LocalGroups {
    multicast: BTreeSet<Ipv4Addr>,
    anycast: BTreeSet<Ipv4Addr>,
}

impl LocalGroups {
    /// Applies an IGMP report's changes; true when the set changed.
    pub fn apply(&mut self, changes: &[GroupChange]) -> bool {
        let mut changed = false;
        for c in changes {
            changed |= match *c {
                GroupChange::Join(g) => self.multicast.insert(g),
                GroupChange::Leave(g) => self.multicast.remove(&g),
            };
        }
        changed
    }

    /// Replaces the anycast addresses (multicast ones and `local_vip` are not anycast);
    /// true when the set changed.
    pub fn set_anycast(&mut self, addresses: &[Ipv4Addr], local_vip: Ipv4Addr) -> bool {
        let next: BTreeSet<Ipv4Addr> = addresses
            .iter()
            .copied()
            .filter(|a| !a.is_multicast() && !a.is_broadcast() && *a != local_vip)
            .collect();
        let changed = next != self.anycast;
        self.anycast = next;
        changed
    }

    /// Whether the device joined multicast group `group`.
    pub fn is_multicast_member(&self, group: Ipv4Addr) -> bool {
        self.multicast.contains(&group)
    }

    pub fn is_anycast(&self, address: Ipv4Addr) -> bool {
        self.anycast.contains(&address)
    }

    pub fn multicast_count(&self) -> usize {
        self.multicast.len()
    }

    pub fn anycast_count(&self) -> usize {
        self.anycast.len()
    }

    /// Every group this peer is a member of.
    pub fn all(&self) -> BTreeSet<Ipv4Addr> {
        self.multicast.union(&self.anycast).copied().collect()
    }

    /// What to join and to leave so that a router holding `held` holds exactly these groups.
    pub fn reconcile(&self, held: &BTreeSet<Ipv4Addr>) -> (Vec<Ipv4Addr>, Vec<Ipv4Addr>) {
        let want = self.all();
        let join = want.difference(held).copied().collect();
        let leave = held.difference(&want).copied().collect();
        (join, leave)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4 packet with the router-alert option (IHL 6, as the kernel sends IGMP).
    fn ip(igmp: &[u8]) -> Vec<u8> {
        let total = 24 + igmp.len();
        let mut p = vec![
            0x46,
            0xc0,
            (total >> 8) as u8,
            total as u8,
            0,
            0,
            0x40,
            0,
            1,
            IGMP,
        ];
        p.extend([0, 0, 10, 100, 0, 1, 224, 0, 0, 22, 0x94, 4, 0, 0]);
        p.extend(igmp);
        p
    }

    fn record(kind: u8, group: [u8; 4], sources: &[[u8; 4]]) -> Vec<u8> {
        let mut r = vec![kind, 0];
        r.extend((sources.len() as u16).to_be_bytes());
        r.extend(group);
        for s in sources {
            r.extend(s);
        }
        r
    }

    fn v3(records: &[Vec<u8>]) -> Vec<u8> {
        let mut m = vec![0x22, 0, 0, 0, 0, 0];
        m.extend((records.len() as u16).to_be_bytes());
        for r in records {
            m.extend(r);
        }
        m
    }

    #[test]
    fn igmpv3_reports_join_and_leave_groups_the_way_the_kernel_writes_them() {
        let g = Ipv4Addr::new(239, 1, 2, 3);
        let h = Ipv4Addr::new(239, 9, 9, 9);
        // a socket joins (any source): CHANGE_TO_EXCLUDE with no sources
        let join = ip(&v3(&[record(4, g.octets(), &[])]));
        assert_eq!(igmp_changes(&join), Some(vec![GroupChange::Join(g)]));
        // it leaves: CHANGE_TO_INCLUDE with no sources; a source-specific join is a join
        let both = ip(&v3(&[
            record(3, g.octets(), &[]),
            record(3, h.octets(), &[[10, 0, 0, 1]]),
            record(6, h.octets(), &[[10, 0, 0, 1]]),
        ]));
        assert_eq!(
            igmp_changes(&both),
            Some(vec![GroupChange::Leave(g), GroupChange::Join(h)])
        );
        // records with aux data are skipped correctly
        let mut aux = record(2, g.octets(), &[]);
        aux[1] = 1;
        aux.extend([0xaa; 4]);
        let two = ip(&v3(&[aux, record(2, h.octets(), &[])]));
        assert_eq!(
            igmp_changes(&two),
            Some(vec![GroupChange::Join(g), GroupChange::Join(h)])
        );
    }

    #[test]
    fn igmpv2_reports_and_leaves_and_what_is_not_a_membership() {
        let g = [239, 5, 5, 5];
        let report = ip(&[0x16, 0, 0, 0, g[0], g[1], g[2], g[3]]);
        let leave = ip(&[0x17, 0, 0, 0, g[0], g[1], g[2], g[3]]);
        let g = Ipv4Addr::from(g);
        assert_eq!(igmp_changes(&report), Some(vec![GroupChange::Join(g)]));
        assert_eq!(igmp_changes(&leave), Some(vec![GroupChange::Leave(g)]));
        // a query changes nothing; all-hosts and unicast "groups" are never members
        assert_eq!(
            igmp_changes(&ip(&[0x11, 100, 0, 0, 0, 0, 0, 0])),
            Some(vec![])
        );
        assert_eq!(
            igmp_changes(&ip(&[0x16, 0, 0, 0, 224, 0, 0, 1])),
            Some(vec![])
        );
        assert_eq!(
            igmp_changes(&ip(&[0x16, 0, 0, 0, 10, 0, 0, 1])),
            Some(vec![])
        );
        // truncated and lying counts do not panic
        assert_eq!(
            igmp_changes(&ip(&[0x22, 0, 0, 0, 0, 0, 0, 9, 4])),
            Some(vec![])
        );
        assert_eq!(igmp_changes(&ip(&[])), Some(vec![]));
        let mut udp = ip(&[0x16, 0, 0, 0, 239, 0, 0, 1]);
        udp[9] = 17;
        assert_eq!(igmp_changes(&udp), None, "not IGMP");
        assert_eq!(igmp_changes(&[0x46; 10]), None);
    }

    #[test]
    fn local_groups_tell_the_router_what_to_join_and_leave() {
        let vip = Ipv4Addr::new(10, 100, 0, 1);
        let (g, a) = (Ipv4Addr::new(239, 0, 0, 7), Ipv4Addr::new(10, 100, 0, 200));
        let mut l = LocalGroups::default();
        assert!(l.apply(&[GroupChange::Join(g)]));
        assert!(!l.apply(&[GroupChange::Join(g)]));
        assert!(
            l.set_anycast(&[a, vip, g], vip),
            "vip and multicast are not anycast"
        );
        assert!(l.is_anycast(a) && !l.is_anycast(vip));
        assert!(!l.set_anycast(&[a], vip));
        let (join, leave) = l.reconcile(&BTreeSet::from([Ipv4Addr::new(239, 0, 0, 8)]));
        assert_eq!(
            (join, leave),
            (vec![a, g], vec![Ipv4Addr::new(239, 0, 0, 8)])
        );
        assert!(l.apply(&[GroupChange::Leave(g)]));
        assert!(l.set_anycast(&[], vip));
        assert_eq!(l.reconcile(&BTreeSet::from([a, g])), (vec![], vec![a, g]));
        assert_eq!((l.multicast_count(), l.anycast_count()), (0, 0));
    }
}
