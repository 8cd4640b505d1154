//! Rust mirrors of the structs in `split_tunnel.bpf.c` (same layout, `#[repr(C)]`) and the
//! conversions between rule values and map keys. Runtime-free; the only `unsafe` is aya's `Pod`
//! marker.
#![allow(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

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

/// Where tunnelled TCP goes instead of the TUN: the data plane's loopback listeners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpRedirect {
    /// Port of the listener on 127.0.0.1 (IPv4 destinations, also v4-mapped ones of dual-stack
    /// sockets); 0: IPv4 keeps the TUN.
    pub port4: u16,
    /// Port of the listener on [::1] (IPv6 destinations); 0: IPv6 keeps the TUN.
    pub port6: u16,
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
    /// Tunnelled TCP connects go to these listeners instead of the TUN; `None`: all to the TUN.
    pub tcp_redirect: Option<TcpRedirect>,
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
    pub tcp_redirect4_port: u16,
    pub tcp_redirect6_port: u16,
    pub pad2: u32,
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
        if let Some(redirect) = c.tcp_redirect {
            raw.tcp_redirect4_port = redirect.port4.to_be();
            raw.tcp_redirect6_port = redirect.port6.to_be();
        }
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

/// `struct orig_dst` of the C source: the original destination of a redirected socket.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawOrigDst {
    /// Network order; IPv4 in `addr[0]`.
    pub addr: [u32; 4],
    /// Network order.
    pub port: u16,
    /// AF_INET or AF_INET6.
    pub family: u16,
}

/// `struct flow_key` of the C source: a redirected connection's client as the listener sees it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RawFlowKey {
    /// IPv6, network order; IPv4 as ::ffff:a.b.c.d.
    pub addr: [u32; 4],
    /// Host order (as `bpf_sock_ops.local_port`).
    pub port: u16,
    pub pad: u16,
}

// SAFETY: repr(C), only integer fields, 20 bytes with the u16 pair filling the last word: every
// bit pattern is valid and there are no implicit padding bytes.
unsafe impl aya::Pod for RawOrigDst {}
// SAFETY: as for RawOrigDst.
unsafe impl aya::Pod for RawFlowKey {}

const AF_INET: u16 = libc::AF_INET as u16;
const AF_INET6: u16 = libc::AF_INET6 as u16;

impl From<SocketAddr> for RawFlowKey {
    /// The `sy_tcp_flows` key of an accepted connection's peer.
    fn from(client: SocketAddr) -> Self {
        let ip = match client.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        RawFlowKey {
            addr: v6_words(ip),
            port: client.port(),
            pad: 0,
        }
    }
}

impl RawOrigDst {
    /// The destination the app asked for; a v4-mapped IPv6 one (a dual-stack socket's) as the
    /// IPv4 address it stands for. `None` for an unknown family.
    pub(crate) fn socket_addr(&self) -> Option<SocketAddr> {
        let port = u16::from_be(self.port);
        match self.family {
            AF_INET => Some(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::from(self.addr[0].to_ne_bytes())),
                port,
            )),
            AF_INET6 => {
                let mut octets = [0u8; 16];
                for (chunk, word) in octets.chunks_exact_mut(4).zip(self.addr) {
                    chunk.copy_from_slice(&word.to_ne_bytes());
                }
                Some(SocketAddr::new(Ipv6Addr::from(octets).to_canonical(), port))
            }
            _ => None,
        }
    }
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
        // 4 u32 + 4 u32 + 4 u16 + 1 u64 + 2 u16 + 1 u32 = 56 bytes, as `struct config` (checked
        // against BTF by the kernel on every map update: a size mismatch fails there); the u64
        // starts at 40, a multiple of 8, and the fields after it fill one more 8-byte word, so
        // there is no implicit padding
        assert_eq!(std::mem::size_of::<RawConfig>(), 56);
        assert_eq!(std::mem::offset_of!(RawConfig, netns_cookie), 40);
        assert_eq!(std::mem::offset_of!(RawConfig, tcp_redirect4_port), 48);
        assert_eq!(std::mem::offset_of!(RawConfig, tcp_redirect6_port), 50);
        assert_eq!(std::mem::offset_of!(RawConfig, pad2), 52);
        assert_eq!(std::mem::size_of::<RawOrigDst>(), 20);
        assert_eq!(std::mem::size_of::<RawFlowKey>(), 20);
        assert_eq!(std::mem::offset_of!(RawFlowKey, port), 16);
    }

    #[test]
    fn config_carries_tcp_redirect_ports_in_network_order() {
        let config = |tcp_redirect| ClassifierConfig {
            mode: Mode::Exclude,
            tunnel_mark: 0x5359,
            dns: None,
            netns_cookie: 1,
            tcp_redirect,
        };
        let raw = RawConfig::from(&config(Some(TcpRedirect {
            port4: 0x1234,
            port6: 0,
        })));
        assert_eq!(raw.tcp_redirect4_port.to_ne_bytes(), [0x12, 0x34]);
        assert_eq!(raw.tcp_redirect6_port, 0, "0: IPv6 keeps the TUN");
        assert_eq!(raw.pad2, 0);
        let raw = RawConfig::from(&config(Some(TcpRedirect {
            port4: 0,
            port6: 443,
        })));
        assert_eq!(
            (raw.tcp_redirect4_port, raw.tcp_redirect6_port.to_ne_bytes()),
            (0, [0x01, 0xbb])
        );
        let raw = RawConfig::from(&config(None));
        assert_eq!((raw.tcp_redirect4_port, raw.tcp_redirect6_port), (0, 0));
    }

    #[test]
    fn flow_keys_are_the_clients_address_as_ipv6_and_its_port_in_host_order() {
        let v4 = RawFlowKey::from("127.0.0.1:40000".parse::<SocketAddr>().expect("addr"));
        assert_eq!(v4.addr[..3], [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff])]);
        assert_eq!(v4.addr[3].to_ne_bytes(), [127, 0, 0, 1]);
        assert_eq!((v4.port, v4.pad), (40000, 0));
        // a dual-stack listener sees the same client as ::ffff:127.0.0.1: the same key
        let mapped = RawFlowKey::from(
            "[::ffff:127.0.0.1]:40000"
                .parse::<SocketAddr>()
                .expect("addr"),
        );
        assert_eq!(mapped, v4);
        let v6 = RawFlowKey::from("[::1]:443".parse::<SocketAddr>().expect("addr"));
        assert_eq!(v6.addr[..3], [0, 0, 0]);
        assert_eq!(v6.addr[3].to_ne_bytes(), [0, 0, 0, 1]);
        assert_eq!(v6.port, 443);
    }

    #[test]
    fn original_destinations_decode_by_family() {
        let v4 = RawOrigDst {
            addr: [u32::from_ne_bytes([10, 201, 9, 1]), 0, 0, 0],
            port: 8080u16.to_be(),
            family: AF_INET,
        };
        assert_eq!(v4.socket_addr(), "10.201.9.1:8080".parse().ok());
        let v6 = RawOrigDst {
            addr: v6_words("fd53:9::1".parse().expect("ip")),
            port: 8080u16.to_be(),
            family: AF_INET6,
        };
        assert_eq!(v6.socket_addr(), "[fd53:9::1]:8080".parse().ok());
        // what a dual-stack socket connected to: the IPv4 destination it stands for
        let mapped = RawOrigDst {
            addr: v6_words("::ffff:10.201.9.1".parse().expect("ip")),
            ..v6
        };
        assert_eq!(mapped.socket_addr(), "10.201.9.1:8080".parse().ok());
        assert_eq!(RawOrigDst { family: 1, ..v4 }.socket_addr(), None);
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
            tcp_redirect: None,
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
