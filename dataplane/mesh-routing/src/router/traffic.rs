//! Traffic modes on top of the routing table: group membership (flooded with per-origin
//! sequence numbers), anycast to the closest member, and broadcast/multicast down the origin's
//! delivery tree with duplicate suppression.
//!
//! The delivery tree of an origin O is the set of next-hop links towards O, walked backwards:
//! our children for O are the neighbours whose route to O runs through us, which they tell us
//! (poisoned reverse, or the path vector when split horizon is off). Each peer forwards a flood
//! to its children only, so on a converged mesh every peer gets exactly one copy over one
//! transmission per tree edge; a neighbour that has not told us anything about O yet gets a
//! copy too (so nothing is lost while routes converge) and the (origin, id) seen-cache drops
//! the duplicates that causes.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Instant;

use super::{push_message, AnycastTarget, Router, RoutingError};
use crate::wire::{Flood, FloodMode, Membership, Message};

impl Router {
    /// Joins a multicast (224.0.0.0/4) or anycast group; announced at the next poll.
    pub fn join_group(&mut self, group: Ipv4Addr) -> bool {
        self.groups.join(group)
    }

    pub fn leave_group(&mut self, group: Ipv4Addr) -> bool {
        self.groups.leave(group)
    }

    pub fn is_group_member(&self, group: Ipv4Addr) -> bool {
        self.groups.is_local_member(group)
    }

    /// Every group address anyone announced (the anycast addresses for
    /// [`crate::MeshNetwork`] are the ones outside 224.0.0.0/4).
    pub fn known_groups(&self) -> BTreeSet<Ipv4Addr> {
        self.groups.all_groups()
    }

    /// The reachable remote members of a group (peer id, vip).
    pub fn group_members(&self, group: Ipv4Addr) -> Vec<(String, Ipv4Addr)> {
        self.groups
            .remote_members(group)
            .into_iter()
            .filter(|(id, _)| self.routes.contains_key(id))
            .collect()
    }

    /// A membership announcement from neighbour `from`: stored when newer than what we hold,
    /// and then passed on to every other neighbour (the sequence number stops the flood).
    pub fn handle_membership(
        &mut self,
        from: &str,
        m: &Membership,
        now: Instant,
    ) -> Result<Vec<(String, Vec<u8>)>, RoutingError> {
        self.last_now = now;
        if !self.neighbours.contains_key(from) {
            return Err(RoutingError::NotNeighbour(from.to_owned()));
        }
        if m.origin == self.local_id {
            return Ok(Vec::new());
        }
        // the origin must be the registry's member at that address, and no group may be a
        // member's address (an anycast "group" at a victim's address would draw its traffic)
        let member_vips = || self.members.values();
        if self.members.get(&m.origin) != Some(&m.vip)
            || m.groups.iter().any(|g| member_vips().any(|v| v == g))
        {
            self.stats.claims_refused += 1;
            return Ok(Vec::new());
        }
        // an anycast group the registry does not list for the origin is kept (the listing may
        // arrive after the membership) but reaches nobody (`anycast_target`); counted
        if m.groups
            .iter()
            .any(|g| !g.is_multicast() && !self.anycast_listed(&m.origin, *g))
        {
            self.stats.claims_refused += 1;
        }
        if !self.groups.accept(m, now) {
            return Ok(Vec::new());
        }
        self.stats.memberships_accepted += 1;
        let to: Vec<String> = self
            .neighbours
            .keys()
            .filter(|n| *n != from && **n != m.origin)
            .cloned()
            .collect();
        let mut out = Vec::new();
        push_message(&mut out, &to, &Message::Membership(m.clone()));
        Ok(out)
    }

    /// The closest member of an anycast group (lowest metric; we win when we are a member).
    pub fn anycast_target(&self, group: Ipv4Addr) -> Option<AnycastTarget> {
        if self.groups.is_local_member(group) {
            return Some(AnycastTarget::Local);
        }
        self.groups
            .remote_members(group)
            .into_iter()
            .filter(|(id, _)| self.anycast_listed(id, group))
            .filter_map(|(id, _)| self.next_hop_to(&id))
            .min_by(|a, b| {
                (a.metric, a.hop_count, &a.dest_peer_id).cmp(&(
                    b.metric,
                    b.hop_count,
                    &b.dest_peer_id,
                ))
            })
            .map(AnycastTarget::Remote)
    }

    /// Starts a broadcast or multicast: the packet goes to our children in our own delivery
    /// tree (neighbours that route to us directly) and travels down from there.
    pub fn originate_flood(
        &mut self,
        mode: FloodMode,
        payload: Vec<u8>,
        now: Instant,
    ) -> Result<Vec<(String, Vec<u8>)>, RoutingError> {
        self.last_now = now;
        self.flood_seq = self.flood_seq.wrapping_add(1);
        self.stats.floods_originated += 1;
        let flood = Flood {
            origin: self.local_id.clone(),
            id: self.flood_seq,
            ttl: self.config.max_hops.saturating_add(1),
            mode,
            payload,
        };
        self.seen.insert(&flood.origin, flood.id, now);
        let to = self.tree_children(&flood.origin, None);
        let bytes = Message::Flood(flood).encode()?;
        Ok(to.into_iter().map(|t| (t, bytes.clone())).collect())
    }

    /// A flooded packet from neighbour `from`: returns the payload to deliver locally (first
    /// copy only; multicast only when we joined the group) and the copies for our children in
    /// the origin's delivery tree.
    #[allow(clippy::type_complexity)]
    pub fn handle_flood(
        &mut self,
        from: &str,
        mut flood: Flood,
        now: Instant,
    ) -> Result<(Option<Vec<u8>>, Vec<(String, Vec<u8>)>), RoutingError> {
        self.last_now = now;
        if !self.neighbours.contains_key(from) {
            return Err(RoutingError::NotNeighbour(from.to_owned()));
        }
        // a flood names its origin; only a listed member can be one (an unlisted name would
        // still fill the seen-cache and the trees)
        if !self.members.contains_key(&flood.origin) && flood.origin != self.local_id {
            self.stats.claims_refused += 1;
            return Ok((None, Vec::new()));
        }
        if flood.origin == self.local_id || !self.seen.insert(&flood.origin, flood.id, now) {
            self.stats.flood_duplicates += 1;
            return Ok((None, Vec::new()));
        }
        let mut send = Vec::new();
        if flood.ttl > 1 {
            flood.ttl -= 1;
            let to = self.tree_children(&flood.origin, Some(from));
            if !to.is_empty() {
                let bytes = Message::Flood(flood.clone()).encode()?;
                send = to.into_iter().map(|t| (t, bytes.clone())).collect();
                self.stats.floods_forwarded += send.len() as u64;
            }
        }
        let deliver = match flood.mode {
            FloodMode::Broadcast => true,
            FloodMode::Multicast(g) => self.groups.is_local_member(g),
        };
        self.stats.floods_delivered += u64::from(deliver);
        Ok((deliver.then_some(flood.payload), send))
    }

    /// Neighbours below us in `origin`'s delivery tree: those whose route to `origin` runs
    /// through us — and, so a copy is not lost while routes converge, those that told us
    /// nothing about `origin` yet (duplicates are dropped by the seen-cache).
    fn tree_children(&self, origin: &str, from: Option<&str>) -> Vec<String> {
        self.neighbours
            .iter()
            .filter(|(id, _)| Some(id.as_str()) != from && *id != origin)
            .filter(|(_, n)| n.adverts.get(origin).is_none_or(|a| a.via_us))
            .map(|(id, _)| id.clone())
            .collect()
    }
}
