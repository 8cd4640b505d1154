//! MAC addresses, and the device address generated when `mesh.device.mac_address` is empty.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

use super::L2Error;

/// A 48-bit Ethernet address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// Group bit set (multicast or broadcast).
    pub fn is_multicast(self) -> bool {
        self.0[0] & 0x01 != 0
    }

    pub fn is_broadcast(self) -> bool {
        self == MacAddr::BROADCAST
    }

    pub fn is_locally_administered(self) -> bool {
        self.0[0] & 0x02 != 0
    }

    /// The destination address of an Ethernet frame.
    pub fn destination_of(frame: &[u8]) -> Option<MacAddr> {
        Some(MacAddr(frame.get(0..6)?.try_into().ok()?))
    }

    /// The source address of an Ethernet frame.
    pub fn source_of(frame: &[u8]) -> Option<MacAddr> {
        Some(MacAddr(frame.get(6..12)?.try_into().ok()?))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl FromStr for MacAddr {
    type Err = L2Error;

    /// `aa:bb:cc:dd:ee:ff` or `aa-bb-cc-dd-ee-ff`, either case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || L2Error::BadMac(s.to_owned());
        let parts: Vec<&str> = s.split([':', '-']).collect();
        if parts.len() != 6 {
            return Err(bad());
        }
        let mut out = [0u8; 6];
        for (slot, part) in out.iter_mut().zip(parts) {
            if part.len() != 2 {
                return Err(bad());
            }
            *slot = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        Ok(MacAddr(out))
    }
}

/// A MAC address for `peer_id`: the first six bytes of SHA-256 over the id, with the
/// locally-administered bit set and the multicast bit cleared — the same every start, and
/// different peers collide only with hash-collision odds (2⁻⁴⁶ per pair).
pub fn generate_mac(peer_id: &str) -> MacAddr {
    let digest = Sha256::digest(peer_id.as_bytes());
    let mut mac = [0u8; 6];
    for (m, d) in mac.iter_mut().zip(digest.iter()) {
        *m = *d;
    }
    mac[0] = (mac[0] & 0xfc) | 0x02;
    MacAddr(mac)
}

/// The device MAC from `mesh.device.mac_address`: parsed when set (must be unicast),
/// generated from the peer id when empty.
pub fn device_mac(configured: &str, peer_id: &str) -> Result<MacAddr, L2Error> {
    let configured = configured.trim();
    if configured.is_empty() {
        return Ok(generate_mac(peer_id));
    }
    let mac: MacAddr = configured.parse()?;
    if mac.is_multicast() {
        return Err(L2Error::MulticastMac);
    }
    Ok(mac)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn generated_macs_are_stable_unicast_and_locally_administered() {
        let a = generate_mac("peer-a");
        assert_eq!(a, generate_mac("peer-a"));
        assert_ne!(a, generate_mac("peer-b"));
        for id in [
            "peer-a",
            "peer-b",
            "x",
            "a-much-longer-peer-identifier-0123456789",
        ] {
            let m = generate_mac(id);
            assert!(!m.is_multicast(), "{m}");
            assert!(m.is_locally_administered(), "{m}");
        }
    }

    #[test]
    fn configured_macs_are_parsed_and_checked() {
        assert_eq!(
            device_mac("02:00:5E:10:00:01", "p").unwrap(),
            MacAddr([0x02, 0, 0x5e, 0x10, 0, 1])
        );
        assert_eq!(
            device_mac("02-00-5e-10-00-01", "p").unwrap().to_string(),
            "02:00:5e:10:00:01"
        );
        assert_eq!(device_mac("", "p").unwrap(), generate_mac("p"));
        assert_eq!(
            device_mac("01:00:5e:00:00:01", "p"),
            Err(L2Error::MulticastMac)
        );
        for bad in [
            "02:00:5e:10:00",
            "02:00:5e:10:00:01:02",
            "zz:00:5e:10:00:01",
            "2:0:5e:10:0:1",
        ] {
            assert!(device_mac(bad, "p").is_err(), "{bad}");
        }
    }

    #[test]
    fn frame_addresses() {
        let mut f = vec![0xff; 6];
        f.extend([2, 0, 0, 0, 0, 9]);
        assert_eq!(MacAddr::destination_of(&f), Some(MacAddr::BROADCAST));
        assert_eq!(MacAddr::source_of(&f), Some(MacAddr([2, 0, 0, 0, 0, 9])));
        assert_eq!(MacAddr::source_of(&f[..11]), None);
        assert!(MacAddr::BROADCAST.is_broadcast() && MacAddr::BROADCAST.is_multicast());
    }
}
