//! Layer-2 (TAP mode) helpers: Ethernet frames travel between peers as EtherIP (RFC 3378,
//! IPv4 protocol 97) from virtual IP to virtual IP, because the sessions carry IP packets only.
//!
//! * [`etherip`]: encapsulation and decapsulation (IPv4 header with checksum and TTL).
//! * [`mac`]: MAC addresses, and the stable one generated when `mesh.device.mac_address` is
//!   empty.
//! * [`learning`]: the bridge's MAC → peer learning table and the per-frame decision (unicast
//!   to the peer that owns the MAC, or flood).
//! * [`arp`]: just enough ARP to learn virtual IP ⇄ MAC.

pub mod arp;
pub mod etherip;
pub mod learning;
pub mod mac;

use thiserror::Error;

/// Why a frame or EtherIP packet was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum L2Error {
    #[error("truncated {0}")]
    Truncated(&'static str),
    #[error("not an IPv4 packet")]
    NotIpv4,
    #[error("IPv4 protocol {0} is not EtherIP (97)")]
    NotEtherIp(u8),
    #[error("bad IPv4 header checksum")]
    BadChecksum,
    #[error("fragmented EtherIP packets are not reassembled")]
    Fragmented,
    #[error("EtherIP header {0:#06x}: version must be 3 with the reserved bits zero")]
    BadEtherIpHeader(u16),
    #[error("frame of {0} bytes does not fit one IPv4 packet")]
    FrameTooLarge(usize),
    #[error("invalid MAC address {0:?}")]
    BadMac(String),
    #[error("a device MAC address must be unicast")]
    MulticastMac,
    #[error("ARP for other than Ethernet and IPv4")]
    NotEthernetIpv4Arp,
}

/// The `N` bytes at `at`, if the buffer holds them.
pub(crate) fn array_at<const N: usize>(buf: &[u8], at: usize) -> Option<[u8; N]> {
    buf.get(at..at.checked_add(N)?)?.try_into().ok()
}
