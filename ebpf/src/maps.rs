//! Rust mirrors of the structs in `split_tunnel.bpf.c` (same layout, `#[repr(C)]`) and the
//! conversions between rule values and map keys. Runtime-free; the only `unsafe` is aya's `Pod`
//! marker.
#![allow(unsafe_code)]

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Which destinations are tunnelled (see `MODE_*` in the C source).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Everything in scope goes through the tunnel except matches.
    Exclude,
    /// Only matches go through the tunnel.
    Include,
}

/// What the programs do with sockets created in one cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppClass {
    /// An app named by the split rules: counts as a match.
    Selected = 1,
    /// Never classified nor redirected (the client's own cgroup).
    Bypass = 2,
}

/// Where intercepted DNS goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DnsRedirect {
    /// Destination port that is intercepted (53).
    pub intercept_port: u16,
    /// The client's resolver for IPv4 queries; `None` leaves IPv4 DNS alone.
    pub resolver4: Option<SocketAddrV4>,
    /// The client's resolver for IPv6 queries; `None` leaves IPv6 DNS alone.
    pub resolver6: Option<SocketAddrV6>,
}

/// Classification settings, the single entry of the `sy_config` map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassifierConfig {
    pub mode: Mode,
    /// SO_MARK given to tunnelled sockets; never 0.
    pub tunnel_mark: u32,
    pub dns: Option<DnsRedirect>,
    /// The network namespace whose sockets the programs act on ([`crate::netns_cookie`]); sockets
    /// of every other namespace in the cgroup tree are left untouched. Never 0.
    pub netns_cookie: u64,
}

impl ClassifierConfig {
    /// Refuses values the programs cannot work with.
    pub(crate) fn check(&self) -> Result<(), crate::Error> {
        if self.tunnel_mark == 0 {
            return Err(crate::Error::ZeroMark);
        }
        if self.netns_cookie == 0 {
            return Err(crate::Error::ZeroNetnsCookie);
        }
        Ok(())
    }
}

const FLAG_DNS4: u32 = 1;
const FLAG_DNS6: u32 = 2;

/// `struct config` of the C source. Addresses and ports in network order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawConfig {
    pub mode: u32,
    pub tunnel_mark: u32,
    pub flags: u32,
    pub resolver4: u32,
    pub resolver6: [u32; 4],
    pub resolver4_port: u16,
    pub resolver6_port: u16,
    pub dns_port: u16,
    pub pad: u16,
    pub netns_cookie: u64,
}

// SAFETY: repr(C), only integer fields, explicit padding field: every bit pattern is valid and
// there are no implicit padding bytes.
unsafe impl aya::Pod for RawConfig {}

impl From<&ClassifierConfig> for RawConfig {
    fn from(c: &ClassifierConfig) -> Self {
        let mut raw = RawConfig {
            mode: match c.mode {
                Mode::Exclude => 0,
                Mode::Include => 1,
            },
            tunnel_mark: c.tunnel_mark,
            netns_cookie: c.netns_cookie,
            ..RawConfig::default()
        };
        if let Some(dns) = c.dns {
            raw.dns_port = dns.intercept_port.to_be();
            if let Some(r4) = dns.resolver4 {
                raw.flags |= FLAG_DNS4;
                raw.resolver4 = v4_word(*r4.ip());
                raw.resolver4_port = r4.port().to_be();
            }
            if let Some(r6) = dns.resolver6 {
                raw.flags |= FLAG_DNS6;
                raw.resolver6 = v6_words(*r6.ip());
                raw.resolver6_port = r6.port().to_be();
            }
        }
        raw
    }
}

/// An IPv4 address as the kernel stores it in a `__u32` (network byte order in memory).
pub(crate) fn v4_word(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

/// An IPv6 address as four `__u32` words in network byte order in memory.
pub(crate) fn v6_words(ip: Ipv6Addr) -> [u32; 4] {
    let o = ip.octets();
    let word = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
    [word(0), word(4), word(8), word(12)]
}

/// LPM-trie key of one network, v4 or v6.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NetKey {
    V4 { prefix: u32, addr: u32 },
    V6 { prefix: u32, addr: [u32; 4] },
}

impl From<IpNet> for NetKey {
    fn from(net: IpNet) -> Self {
        // the trie keys by the network address: host bits must be zero
        match net.trunc() {
            IpNet::V4(n) => NetKey::V4 {
                prefix: u32::from(n.prefix_len()),
                addr: v4_word(n.network()),
            },
            IpNet::V6(n) => NetKey::V6 {
                prefix: u32::from(n.prefix_len()),
                addr: v6_words(n.network()),
            },
        }
    }
}

/// `COMM_LEN` of the C source: the kernel's TASK_COMM_LEN (15 bytes of name and a NUL).
pub const COMM_LEN: usize = 16;
/// `PATH_LEN` of the C source: the longest rule path the exec hook compares, with its NUL.
pub const PATH_LEN: usize = 256;

/// A name or path an app rule matches at exec (see `sy_app_names`, `sy_app_paths`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum AppImage {
    /// Process name, compared with the comm the kernel gives the new image (its base name cut at
    /// 15 bytes); the rule's name is cut the same way.
    Name(String),
    /// Absolute executable path, compared with the file name the image was exec'd by.
    Path(String),
}

/// Zero-padded key of `N` bytes holding `text` and at least one NUL; `None` when it does not
/// fit (or is empty).
fn padded<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    if text.is_empty() || text.len() >= N || text.contains(&0) {
        return None;
    }
    let mut key = [0u8; N];
    key[..text.len()].copy_from_slice(text);
    Some(key)
}

/// The `sy_app_names` key of a rule name: cut at 15 bytes like the kernel's comm.
pub(crate) fn comm_key(name: &str) -> Option<[u8; COMM_LEN]> {
    let bytes = name.as_bytes();
    padded(&bytes[..bytes.len().min(COMM_LEN - 1)])
}

/// The `sy_app_paths` key of a rule path; `None` for a path too long for the exec hook (the /proc
/// scan still matches it).
pub(crate) fn path_key(path: &str) -> Option<[u8; PATH_LEN]> {
    padded(path.as_bytes())
}

/// Converts an exact address into the host network (`/32`, `/128`).
pub fn host_net(ip: std::net::IpAddr) -> IpNet {
    match ip {
        std::net::IpAddr::V4(a) => IpNet::V4(Ipv4Net::from(a)),
        std::net::IpAddr::V6(a) => IpNet::V6(Ipv6Net::from(a)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_laid_out_like_the_c_struct() {
        // 4 u32 + 4 u32 + 4 u16 + 1 u64 = 48 bytes, as `struct config` (checked against BTF by
        // the kernel on every map update: a size mismatch fails there); the u64 starts at 40, a
        // multiple of 8, so there is no implicit padding
        assert_eq!(std::mem::size_of::<RawConfig>(), 48);
        assert_eq!(std::mem::offset_of!(RawConfig, netns_cookie), 40);
    }

    #[test]
    fn config_carries_network_order_addresses_and_flags() {
        let raw = RawConfig::from(&ClassifierConfig {
            mode: Mode::Include,
            tunnel_mark: 0x5359,
            dns: Some(DnsRedirect {
                intercept_port: 53,
                resolver4: Some("127.0.0.1:5353".parse().expect("addr")),
                resolver6: None,
            }),
            netns_cookie: 0x1234_5678_9abc,
        });
        assert_eq!(raw.mode, 1);
        assert_eq!(raw.flags, FLAG_DNS4);
        assert_eq!(raw.resolver4.to_ne_bytes(), [127, 0, 0, 1]);
        assert_eq!(raw.resolver4_port.to_ne_bytes(), [0x14, 0xe9]);
        assert_eq!(raw.dns_port.to_ne_bytes(), [0, 53]);
        assert_eq!(raw.netns_cookie, 0x1234_5678_9abc);
    }

    #[test]
    fn comm_keys_are_cut_like_the_kernel_comm_and_zero_padded() {
        let key = comm_key("thunderbird-binary").expect("key");
        assert_eq!(&key[..15], b"thunderbird-bin");
        assert_eq!(key[15], 0);
        let short = comm_key("curl").expect("key");
        assert_eq!(&short[..5], b"curl\0");
        assert!(short[4..].iter().all(|b| *b == 0));
        assert_eq!(comm_key(""), None);
        assert_eq!(comm_key("a\0b"), None);
    }

    #[test]
    fn path_keys_fit_the_c_buffer_with_a_nul() {
        let key = path_key("/usr/bin/curl").expect("key");
        assert_eq!(&key[..14], b"/usr/bin/curl\0");
        assert!(path_key(&"x".repeat(PATH_LEN - 1)).is_some());
        assert_eq!(path_key(&"x".repeat(PATH_LEN)), None);
    }

    #[test]
    fn net_keys_drop_host_bits() {
        let key = NetKey::from("10.1.2.3/8".parse::<IpNet>().expect("net"));
        assert_eq!(
            key,
            NetKey::V4 {
                prefix: 8,
                addr: u32::from_ne_bytes([10, 0, 0, 0])
            }
        );
        let key6 = NetKey::from("2001:db8::1/32".parse::<IpNet>().expect("net"));
        match key6 {
            NetKey::V6 { prefix, addr } => {
                assert_eq!(prefix, 32);
                assert_eq!(addr[0].to_ne_bytes(), [0x20, 0x01, 0x0d, 0xb8]);
                assert_eq!(addr[1..], [0, 0, 0]);
            }
            NetKey::V4 { .. } => panic!("v6 net gave a v4 key"),
        }
    }
}
