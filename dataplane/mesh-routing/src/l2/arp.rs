//! ARP (RFC 826) for Ethernet/IPv4, just enough to learn virtual IP ⇄ MAC from the requests
//! and replies that cross the bridge.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use super::mac::MacAddr;
use super::{array_at, L2Error};

pub const ETHERTYPE_ARP: u16 = 0x0806;
const ETHERTYPE_VLAN: u16 = 0x8100;

/// ARP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArpOp {
    Request,
    Reply,
    Other(u16),
}

/// An Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpPacket {
    pub op: ArpOp,
    pub sender_mac: MacAddr,
    pub sender_ip: Ipv4Addr,
    pub target_mac: MacAddr,
    pub target_ip: Ipv4Addr,
}

/// The ARP packet in an Ethernet frame (one 802.1Q tag allowed); `Ok(None)` when the frame is
/// not ARP, an error when it claims to be ARP but is not Ethernet/IPv4 ARP.
pub fn parse_arp(frame: &[u8]) -> Result<Option<ArpPacket>, L2Error> {
    let ethertype_at = |at: usize| {
        array_at::<2>(frame, at)
            .map(u16::from_be_bytes)
            .ok_or(L2Error::Truncated("Ethernet header"))
    };
    let mut at = 12;
    let mut ethertype = ethertype_at(at)?;
    if ethertype == ETHERTYPE_VLAN {
        at += 4;
        ethertype = ethertype_at(at)?;
    }
    if ethertype != ETHERTYPE_ARP {
        return Ok(None);
    }
    let arp = frame
        .get(at + 2..)
        .and_then(|body| body.get(..28))
        .ok_or(L2Error::Truncated("ARP"))?;
    let truncated = || L2Error::Truncated("ARP");
    let be16 = |i: usize| {
        array_at::<2>(arp, i)
            .map(u16::from_be_bytes)
            .ok_or_else(truncated)
    };
    let mac = |i: usize| array_at::<6>(arp, i).map(MacAddr).ok_or_else(truncated);
    let ip = |i: usize| {
        array_at::<4>(arp, i)
            .map(Ipv4Addr::from)
            .ok_or_else(truncated)
    };
    // Hardware Ethernet (1), protocol IPv4, address lengths 6 and 4.
    if be16(0)? != 1 || be16(2)? != 0x0800 || array_at::<2>(arp, 4) != Some([6, 4]) {
        return Err(L2Error::NotEthernetIpv4Arp);
    }
    let op = match be16(6)? {
        1 => ArpOp::Request,
        2 => ArpOp::Reply,
        other => ArpOp::Other(other),
    };
    Ok(Some(ArpPacket {
        op,
        sender_mac: mac(8)?,
        sender_ip: ip(14)?,
        target_mac: mac(18)?,
        target_ip: ip(24)?,
    }))
}

impl ArpPacket {
    /// "Who has `target_ip`? Tell `sender_ip`."
    pub fn request(sender_mac: MacAddr, sender_ip: Ipv4Addr, target_ip: Ipv4Addr) -> ArpPacket {
        ArpPacket {
            op: ArpOp::Request,
            sender_mac,
            sender_ip,
            target_mac: MacAddr([0; 6]),
            target_ip,
        }
    }

    /// The answer to this request from the owner of its target address.
    pub fn reply(&self, owner_mac: MacAddr) -> ArpPacket {
        ArpPacket {
            op: ArpOp::Reply,
            sender_mac: owner_mac,
            sender_ip: self.target_ip,
            target_mac: self.sender_mac,
            target_ip: self.sender_ip,
        }
    }

    /// The packet in an untagged Ethernet frame: requests to the broadcast address, replies
    /// to the target (e.g. for a gratuitous ARP when the device comes up).
    pub fn to_frame(&self) -> Vec<u8> {
        let (dst, op) = match self.op {
            ArpOp::Request => (MacAddr::BROADCAST, 1),
            ArpOp::Reply => (self.target_mac, 2),
            ArpOp::Other(op) => (self.target_mac, op),
        };
        let mut f = Vec::with_capacity(42);
        f.extend(dst.0);
        f.extend(self.sender_mac.0);
        f.extend(ETHERTYPE_ARP.to_be_bytes());
        f.extend([0, 1, 0x08, 0, 6, 4]);
        f.extend(u16::to_be_bytes(op));
        f.extend(self.sender_mac.0);
        f.extend(self.sender_ip.octets());
        f.extend(self.target_mac.0);
        f.extend(self.target_ip.octets());
        f
    }
}

/// Most bindings an [`ArpTable`] holds; new addresses beyond it are not learned.
pub const ARP_CAPACITY: usize = 4096;

/// Virtual IP ⇄ MAC, learned from ARP senders, with ageing.
#[derive(Debug, Default)]
pub struct ArpTable {
    by_ip: BTreeMap<Ipv4Addr, (MacAddr, Instant)>,
}

impl ArpTable {
    /// Learns the sender of an ARP packet in `frame`; returns the binding learned. Probes
    /// (sender 0.0.0.0) and group sender MACs teach nothing.
    pub fn learn_from_frame(&mut self, frame: &[u8], now: Instant) -> Option<(Ipv4Addr, MacAddr)> {
        let arp = parse_arp(frame).ok()??;
        if arp.sender_ip.is_unspecified() || arp.sender_mac.is_multicast() {
            return None;
        }
        if self.by_ip.len() >= ARP_CAPACITY && !self.by_ip.contains_key(&arp.sender_ip) {
            return None;
        }
        self.by_ip.insert(arp.sender_ip, (arp.sender_mac, now));
        Some((arp.sender_ip, arp.sender_mac))
    }

    pub fn mac_of(&self, ip: Ipv4Addr, now: Instant, ageing: Duration) -> Option<MacAddr> {
        let (mac, seen) = self.by_ip.get(&ip)?;
        (now.saturating_duration_since(*seen) < ageing).then_some(*mac)
    }

    pub fn ip_of(&self, mac: MacAddr, now: Instant, ageing: Duration) -> Option<Ipv4Addr> {
        self.by_ip
            .iter()
            .find(|(_, (m, seen))| *m == mac && now.saturating_duration_since(*seen) < ageing)
            .map(|(ip, _)| *ip)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const A_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xa]);
    const B_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xb]);
    const A_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
    const B_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);

    fn request(smac: MacAddr, sip: Ipv4Addr, tip: Ipv4Addr) -> Vec<u8> {
        ArpPacket::request(smac, sip, tip).to_frame()
    }

    #[test]
    fn frames_are_built_byte_for_byte() {
        let f = request(A_MAC, A_IP, B_IP);
        let mut want = vec![0xff; 6];
        want.extend(A_MAC.0);
        want.extend([0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
        want.extend(A_MAC.0);
        want.extend(A_IP.octets());
        want.extend([0; 6]);
        want.extend(B_IP.octets());
        assert_eq!(f, want);
        let reply = ArpPacket::request(A_MAC, A_IP, B_IP)
            .reply(B_MAC)
            .to_frame();
        assert_eq!(&reply[..6], &A_MAC.0);
    }

    #[test]
    fn requests_and_replies_are_parsed() {
        let req = request(A_MAC, A_IP, B_IP);
        let p = parse_arp(&req).unwrap().unwrap();
        assert_eq!(
            (p.op, p.sender_mac, p.sender_ip, p.target_ip),
            (ArpOp::Request, A_MAC, A_IP, B_IP)
        );
        let rep = ArpPacket::request(A_MAC, A_IP, B_IP)
            .reply(B_MAC)
            .to_frame();
        assert_eq!(parse_arp(&rep).unwrap().unwrap().op, ArpOp::Reply);
    }

    #[test]
    fn vlan_tagged_arp_is_parsed_and_other_frames_are_not_arp() {
        let req = request(A_MAC, A_IP, B_IP);
        let mut tagged = req[..12].to_vec();
        tagged.extend([0x81, 0x00, 0x00, 0x05]);
        tagged.extend(&req[12..]);
        assert_eq!(parse_arp(&tagged).unwrap(), parse_arp(&req).unwrap());
        let mut ipv4 = req.clone();
        ipv4[12..14].copy_from_slice(&[0x08, 0x00]);
        assert_eq!(parse_arp(&ipv4), Ok(None));
    }

    #[test]
    fn truncated_and_foreign_arp_is_an_error() {
        let req = request(A_MAC, A_IP, B_IP);
        for cut in 0..req.len() {
            assert!(parse_arp(&req[..cut]).is_err(), "cut at {cut}");
        }
        let mut ipv6ish = req.clone();
        ipv6ish[16..18].copy_from_slice(&[0x86, 0xdd]);
        assert!(parse_arp(&ipv6ish).is_err());
    }

    #[test]
    fn the_table_learns_senders_both_ways_and_ages_them() {
        let t0 = Instant::now();
        let ageing = Duration::from_secs(60);
        let mut t = ArpTable::default();
        let req = request(A_MAC, A_IP, B_IP);
        assert_eq!(t.learn_from_frame(&req, t0), Some((A_IP, A_MAC)));
        let probe = request(B_MAC, Ipv4Addr::UNSPECIFIED, B_IP);
        assert_eq!(t.learn_from_frame(&probe, t0), None);
        assert_eq!(t.mac_of(A_IP, t0, ageing), Some(A_MAC));
        assert_eq!(t.ip_of(A_MAC, t0, ageing), Some(A_IP));
        assert_eq!(t.mac_of(B_IP, t0, ageing), None);
        assert_eq!(t.mac_of(A_IP, t0 + ageing, ageing), None);
    }

    #[test]
    fn the_table_is_bounded() {
        let t0 = Instant::now();
        let mut t = ArpTable::default();
        for i in 0..ARP_CAPACITY as u32 + 10 {
            let ip = Ipv4Addr::from(0x0a00_0000 + i);
            t.learn_from_frame(&request(A_MAC, ip, B_IP), t0);
        }
        assert_eq!(t.by_ip.len(), ARP_CAPACITY);
        // Known addresses are still refreshed.
        let first = Ipv4Addr::from(0x0a00_0000);
        assert!(t
            .learn_from_frame(&request(B_MAC, first, B_IP), t0)
            .is_some());
    }

    proptest::proptest! {
        #[test]
        fn random_frames_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..80)) {
            let _ = parse_arp(&bytes);
            let _ = ArpTable::default().learn_from_frame(&bytes, Instant::now());
        }
    }
}
