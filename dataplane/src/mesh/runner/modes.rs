//! Traffic modes on the owner core. A packet read from the device is classified by its
//! destination (`classify_destination`): broadcast (255.255.255.255, the network's broadcast
//! address, 224.0.0.1) goes to every reachable member and multicast to the reachable members
//! that joined the group — one copy each, in our session with that member (end to end: a
//! relaying member passes on envelopes it cannot read, so every copy's origin and source are
//! proven by the session it arrives in) — anycast goes to the closest member, in our session
//! with it, and the rest is unicast as before. The groups of this peer
//! come from the device: IGMP reports the kernel writes to it (consumed here) and the anycast
//! addresses the control plane publishes; they are handed to the router, which announces them.
//!
//! TAP mode: broadcast, multicast and unknown-unicast frames take the same copies (IPv4
//! multicast frames those of their group) as EtherIP packets to each member; a unicast frame
//! goes as EtherIP to the virtual IP of the peer its MAC was learnt from — learnt from the
//! EtherIP packets of each member's own session — and is routed like any packet.

use super::{Mesh, Session};
use crate::mesh::membership::{self, LocalGroups, ALL_HOSTS};
use crate::mesh::wire;
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;
use switchyard_mesh_routing::l2::learning::{Learning, MacTable, DEFAULT_AGEING, DEFAULT_CAPACITY};
use switchyard_mesh_routing::l2::mac::MacAddr;
use switchyard_mesh_routing::{
    classify_destination, delivery::classify_address, AnycastTarget, Delivery, FloodMode,
    MeshNetwork,
};

/// Ethernet type of IPv4.
const ETHERTYPE_IPV4: [u8; 2] = [0x08, 0x00];

pub(super) struct Modes {
    /// This peer's multicast groups and anycast addresses, as the device tells.
    groups: LocalGroups,
    /// The groups the current router was given.
    applied: BTreeSet<Ipv4Addr>,
    /// The virtual IP of the router `applied` belongs to (a new router starts with none).
    applied_to: Option<Ipv4Addr>,
    /// What classification knows: the network, our address, every announced anycast address.
    network: MeshNetwork,
    /// TAP mode: MAC → the peer id it was last seen behind.
    macs: MacTable,
}

impl Modes {
    pub(super) fn new() -> Self {
        Modes {
            groups: LocalGroups::default(),
            applied: BTreeSet::new(),
            applied_to: None,
            network: MeshNetwork::new(Default::default(), Ipv4Addr::UNSPECIFIED, []),
            // our own MAC is never in a frame from a peer's flood of ours (origins skip it)
            macs: MacTable::new(MacAddr([0; 6]), DEFAULT_AGEING, DEFAULT_CAPACITY),
        }
    }

    /// A peer left the table: the MACs learnt behind it go.
    pub(super) fn forget_peer(&mut self, id: &str) {
        self.macs.forget_peer(id);
    }
}

/// The IPv4 packet of an Ethernet frame, when it carries one.
fn ipv4_of_frame(frame: &[u8]) -> Option<&[u8]> {
    (frame.get(12..14)? == ETHERTYPE_IPV4)
        .then(|| frame.get(14..))
        .flatten()
}

impl Mesh {
    /// Brings the router's groups in line with the device's and refreshes what classification
    /// knows (every tick, and after an IGMP report).
    pub(super) fn sync_groups(&mut self) {
        let vip = self.local_vip();
        let anycast = self.shared.local_anycast.load();
        self.modes.groups.set_anycast(&anycast, vip);
        if self.modes.applied_to != self.router_vip {
            self.modes.applied.clear();
            self.modes.applied_to = self.router_vip;
        }
        let counters = &self.shared.totals.modes;
        let groups = &self.modes.groups;
        counters
            .multicast_groups
            .store(groups.multicast_count() as u64, Relaxed);
        counters
            .anycast_addresses
            .store(groups.anycast_count() as u64, Relaxed);
        let Some(router) = self.router.as_mut() else {
            return;
        };
        let (join, leave) = groups.reconcile(&self.modes.applied);
        for g in join {
            // refused only at the crate's group limit: tried again next time
            if router.join_group(g) || router.is_group_member(g) {
                self.modes.applied.insert(g);
            }
        }
        for g in leave {
            router.leave_group(g);
            self.modes.applied.remove(&g);
        }
        self.refresh_network();
    }

    pub(super) fn refresh_network(&mut self) {
        let known = self
            .router
            .as_ref()
            .map(|r| r.known_groups())
            .unwrap_or_default();
        self.modes.network = MeshNetwork::new(self.shared.network(), self.local_vip(), known);
    }

    /// An IGMP report from the device (TUN: the packet, TAP: the frame's packet): the groups
    /// change and the router announces them at once. False when `packet` is not IGMP.
    fn igmp_from_device(&mut self, packet: &[u8]) -> bool {
        let Some(changes) = membership::igmp_changes(packet) else {
            return false;
        };
        if self.modes.groups.apply(&changes) {
            tracing::debug!(?changes, "mesh device group membership changed");
            self.ensure_router();
            self.sync_groups();
            self.drive_router(Instant::now());
        }
        true
    }

    /// TUN mode: an IP packet read from the device.
    pub(super) fn device_ip_packet(&mut self, packet: &[u8]) {
        if self.igmp_from_device(packet) {
            return;
        }
        match classify_destination(packet, &self.modes.network) {
            Ok(Delivery::Unicast(_)) => self.send_to_mesh(packet),
            Ok(Delivery::Broadcast) => self.originate(FloodMode::Broadcast, packet),
            Ok(Delivery::Multicast(g)) if g == ALL_HOSTS => {
                self.originate(FloodMode::Broadcast, packet)
            }
            Ok(Delivery::Multicast(g)) => self.originate(FloodMode::Multicast(g), packet),
            Ok(Delivery::Anycast(a)) => {
                if self.send_anycast(a, packet) {
                    self.shared.totals.modes.anycast_sent.fetch_add(1, Relaxed);
                }
            }
            Ok(Delivery::Local | Delivery::NotMesh) | Err(_) => {
                self.shared.totals.no_route.fetch_add(1, Relaxed);
            }
        }
    }

    /// TAP mode: a frame read from the device.
    pub(super) fn device_frame(&mut self, frame: &[u8]) {
        let Some(dst) = MacAddr::destination_of(frame) else {
            self.shared.totals.no_route.fetch_add(1, Relaxed);
            return;
        };
        let ip = ipv4_of_frame(frame);
        if ip.is_some_and(|p| self.igmp_from_device(p)) {
            return;
        }
        if !dst.is_multicast() {
            let owner = self
                .modes
                .macs
                .lookup(dst, Instant::now())
                .and_then(|id| self.table.peers.iter().find(|p| p.id == id))
                .map(|p| p.vip);
            if let Some(vip) = owner {
                let packet = wire::etherip_packet(self.local_vip(), vip, frame);
                self.send_to_mesh(&packet);
                return;
            }
        }
        let group = ip
            .and_then(wire::ipv4_addresses)
            .map(|(_, g)| g)
            .filter(|g| dst.is_multicast() && g.is_multicast() && *g != ALL_HOSTS);
        match group {
            Some(g) => self.originate(FloodMode::Multicast(g), frame),
            // broadcast, non-IPv4 multicast (IPv6 neighbour discovery...), unknown unicast
            None => self.originate(FloodMode::Broadcast, frame),
        }
    }

    /// Sends `payload` to every reachable member (broadcast) or to the reachable members of
    /// a group, one copy each in our own session with it (TAP: as EtherIP to its address). A
    /// multicast nobody reachable joined is not sent at all.
    fn originate(&mut self, mode: FloodMode, payload: &[u8]) {
        self.ensure_router();
        let targets: Vec<u32> = match (mode, self.router.as_ref()) {
            (FloodMode::Multicast(g), Some(router)) => router
                .group_members(g)
                .iter()
                .filter_map(|(_, vip)| self.by_vip.get(vip).copied())
                .collect(),
            (FloodMode::Multicast(_), None) => Vec::new(),
            (FloodMode::Broadcast, router) => self
                .sessions
                .values()
                .filter(|s| {
                    s.connected() || router.is_some_and(|r| r.next_hop_to(&s.entry.id).is_some())
                })
                .map(|s| s.index)
                .collect(),
        };
        let counters = &self.shared.totals.modes;
        match mode {
            FloodMode::Multicast(_) if targets.is_empty() => return,
            FloodMode::Multicast(_) => counters.multicast_sent.fetch_add(1, Relaxed),
            FloodMode::Broadcast => counters.broadcast_sent.fetch_add(1, Relaxed),
        };
        let (layer2, local) = (self.settings.layer2, self.local_vip());
        for i in targets {
            self.send_to_session(i, |s| {
                if layer2 {
                    wire::etherip_packet(local, s.entry.vip, payload)
                } else {
                    payload.to_vec()
                }
            });
        }
    }

    /// An anycast packet to the closest member of `group`, in our session with it; false
    /// when no member is reachable.
    fn send_anycast(&mut self, group: Ipv4Addr, packet: &[u8]) -> bool {
        let target = self.router.as_ref().and_then(|r| r.anycast_target(group));
        let index = match target {
            Some(AnycastTarget::Remote(hop)) => self.session_of(&hop.dest_peer_id),
            Some(AnycastTarget::Local) => {
                self.write_device(packet);
                return true;
            }
            None => None,
        };
        match index {
            Some(i) => {
                self.send_to_session(i, |_| packet.to_vec());
                true
            }
            None => {
                self.shared.totals.no_route.fetch_add(1, Relaxed);
                false
            }
        }
    }

    /// Whether a decrypted IP packet for `dst` (not ours) is a broadcast, or a multicast of a
    /// group we joined, to write to the device (counted as such).
    pub(super) fn flooded_packet(&self, dst: Ipv4Addr) -> bool {
        let counters = &self.shared.totals.modes;
        match classify_address(dst, &self.modes.network) {
            Delivery::Broadcast => {
                counters.broadcast_received.fetch_add(1, Relaxed);
                true
            }
            Delivery::Multicast(g) if g == ALL_HOSTS => {
                counters.broadcast_received.fetch_add(1, Relaxed);
                true
            }
            Delivery::Multicast(g) if self.modes.groups.is_multicast_member(g) => {
                counters.multicast_received.fetch_add(1, Relaxed);
                true
            }
            _ => false,
        }
    }

    /// TAP mode: counts a frame from a peer that went to several (broadcast and multicast
    /// destination MACs; IPv4 multicast of a group as multicast).
    pub(super) fn count_flooded_frame(&self, frame: &[u8]) {
        if !MacAddr::destination_of(frame).is_some_and(|d| d.is_multicast()) {
            return;
        }
        let group = ipv4_of_frame(frame)
            .and_then(wire::ipv4_addresses)
            .map(|(_, g)| g)
            .filter(|g| g.is_multicast() && *g != ALL_HOSTS);
        let counters = &self.shared.totals.modes;
        match group {
            Some(_) => counters.multicast_received.fetch_add(1, Relaxed),
            None => counters.broadcast_received.fetch_add(1, Relaxed),
        };
    }

    /// Whether a decrypted packet for `dst` is ours: our virtual IP, or one of our anycast
    /// addresses (counted as an anycast arrival).
    pub(super) fn is_for_us(&self, dst: Ipv4Addr) -> bool {
        if dst == self.local_vip() {
            return true;
        }
        let anycast = self.modes.groups.is_anycast(dst);
        if anycast {
            self.shared
                .totals
                .modes
                .anycast_received
                .fetch_add(1, Relaxed);
        }
        anycast
    }

    /// Whether peer `s` may send from `src` as an anycast member (the answers of a member
    /// come from the anycast address): the registry lists that address for it.
    pub(super) fn anycast_source(&self, s: &Session, src: Ipv4Addr) -> bool {
        s.entry.anycast.contains(&src)
    }

    /// TAP mode: a frame from the peer whose virtual IP is `from`: its source MAC lives there.
    /// False when that MAC lives behind another active peer: the frame speaks for a neighbour
    /// and is not written (counted in `mac_claims_refused`).
    pub(super) fn learn_mac(&mut self, frame: &[u8], from: Ipv4Addr) -> bool {
        let Some(id) = self.table.peers.iter().find(|p| p.vip == from) else {
            return true;
        };
        let learnt = self
            .modes
            .macs
            .learn_from_frame(frame, &id.id, Instant::now());
        if learnt == Learning::Refused {
            self.shared.totals.mac_claims_refused.fetch_add(1, Relaxed);
            return false;
        }
        true
    }
}
