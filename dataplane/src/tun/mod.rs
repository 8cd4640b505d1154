//! The client's VPN (TUN) path on the data plane, "system stack" style.
//!
//! Policy routing (the split tunnel) sends the selected applications' TCP connections into the
//! TUN device. The [`pump`] thread reads each segment and rewrites it with the [`nat`]
//! (`app → dst` becomes `gateway:nat_port → tun_ip:listen_port`) and writes it back, so the
//! kernel's own TCP stack terminates the flow on the data plane's VPN listener; replies are
//! rewritten back (`dst → app`). The glommio cores accept the flows like any proxy connection,
//! read the original destination from the shared NAT table (atomics, no lock), route it with the
//! client's rules (by the domain learnt from DNS answers when there is one, else by address) and
//! relay it through the chosen backend — the selected server (CONNECT / SOCKS5) or direct.
//!
//! Why the kernel stack and not smoltcp (which the tree has for WireGuard): the kernel does
//! congestion control, SACK, window scaling and retransmission for both halves at full speed and
//! with no per-packet user-space work beyond a header rewrite (incremental checksums, a few
//! additions per packet); flows land on the cores' ordinary io_uring sockets, so the relay,
//! backends, metrics, live table and debug entries are the proxy's own. A user-space stack would
//! reimplement all of that per packet on the cores (smoltcp ignores SACK; see FIELD-NOTES). The
//! price: the kernel must see each flow addressed to a listener of its own family, so IPv6 has
//! its own TUN address, listener and UDP socket ([`packet6`]); IPv6 packets with extension
//! headers (fragments included) are dropped and counted.
//!
//! ICMP is not carried either, but ping works: the pump hands each echo request to the cores
//! (as the payload of a UDP datagram to the VPN UDP socket), a core probes the destination over
//! its route and answers with an echo reply, "host unreachable" or "administratively
//! prohibited", or not at all when the probe has no verdict ([`echo`], packets in [`icmp`]).
//!
//! UDP takes the same path ([`udp_nat`]): datagrams are rewritten to the data plane's VPN UDP
//! socket, and [`udp_relay`] on the cores relays each flow (one per NAT port) direct or through
//! the server's SOCKS5 UDP ASSOCIATE. DNS normally never gets here: the split tunnel redirects it
//! to the resolver before the TUN.
//!
//! Why a pump thread and not the cores: glommio 0.9 cannot poll a generic descriptor, and the
//! per-packet work is a constant-time rewrite, so one thread that blocks in `poll(2)` on the
//! device is both simplest and cheapest; it shares only atomics with the cores.

pub mod echo;
pub mod frag;
pub mod icmp;
pub mod nat;
pub mod packet;
pub mod packet6;
pub mod pump;
pub(crate) mod serve;
pub mod udp_nat;
pub mod udp_relay;
pub mod vnet;

use arc_swap::{ArcSwap, ArcSwapOption};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::AtomicU16;
use std::sync::Arc;

pub use nat::{NatAddresses, NatAddresses6, NatTable, Translator};
pub use pump::{TunPump, TunStats};
pub use udp_nat::UdpNat;
pub use udp_relay::UdpRelayStats;

/// Most addresses whose DNS name the VPN path keeps for routing by name.
pub const MAX_NAMES: usize = 65_536;

/// What the data plane's VPN listener shares with the pump and the control plane.
pub struct VpnPath {
    pub nat: Arc<NatTable>,
    pub stats: Arc<TunStats>,
    /// The TUN device's address (the listener is bound to it before the device exists).
    pub tun_ip: Ipv4Addr,
    /// Source address of translated flows; the listener accepts nothing else.
    pub gateway: Ipv4Addr,
    /// The TUN's IPv6 address and gateway, when IPv6 is carried (`vpn.tun.address6`).
    pub v6: Option<Addresses6>,
    /// Domains learnt from DNS answers, by address: flows are routed by name when known.
    pub names: ArcSwap<HashMap<IpAddr, String>>,
    /// Original destinations of TCP and UDP flows of either family, by UDP NAT port.
    pub udp_nat: Arc<NatTable>,
    /// The VPN UDP socket's port on `tun_ip` (set by the data plane at start; 0 = no UDP relay).
    pub udp_port: AtomicU16,
    /// The IPv6 listener's and UDP socket's ports on the TUN's IPv6 address (set by the data
    /// plane at start; 0 = none).
    pub listen_port6: AtomicU16,
    pub udp_port6: AtomicU16,
    pub udp_stats: Arc<UdpRelayStats>,
    /// Ports of the loopback listeners (127.0.0.1 and ::1) that the eBPF classifier sends
    /// tunnelled TCP connections to straight from `connect(2)`, past the TUN (set by the data
    /// plane at start; 0 = none).
    pub redirect_port4: AtomicU16,
    pub redirect_port6: AtomicU16,
    /// Where the redirected connections were going (the classifier's map; a core takes an
    /// entry with one `bpf(2)` call, no lock); set while the eBPF classifier runs.
    pub redirect_origins: ArcSwapOption<switchyard_ebpf::FlowOrigins>,
}

/// The TUN's IPv6 side: translated IPv6 flows come from `gateway` to listeners on `tun_ip`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addresses6 {
    pub tun_ip: Ipv6Addr,
    pub gateway: Ipv6Addr,
}

/// `host:port` for logs and the connections table, with an IPv6 literal in brackets.
pub(crate) fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl std::fmt::Debug for VpnPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VpnPath")
            .field("tun_ip", &self.tun_ip)
            .field("gateway", &self.gateway)
            .finish_non_exhaustive()
    }
}

impl VpnPath {
    pub fn new(tun_ip: Ipv4Addr, gateway: Ipv4Addr) -> Self {
        VpnPath {
            nat: Arc::new(NatTable::new(nat::FIRST_PORT, nat::PORTS)),
            stats: Arc::new(TunStats::default()),
            tun_ip,
            gateway,
            names: ArcSwap::from_pointee(HashMap::new()),
            udp_nat: Arc::new(NatTable::new(nat::FIRST_PORT, nat::PORTS)),
            udp_port: AtomicU16::new(0),
            v6: None,
            listen_port6: AtomicU16::new(0),
            udp_port6: AtomicU16::new(0),
            udp_stats: Arc::new(UdpRelayStats::default()),
            redirect_port4: AtomicU16::new(0),
            redirect_port6: AtomicU16::new(0),
            redirect_origins: ArcSwapOption::empty(),
        }
    }

    /// Carries IPv6 too, with these TUN addresses.
    pub fn with_v6(mut self, tun_ip: Ipv6Addr, gateway: Ipv6Addr) -> Self {
        self.v6 = Some(Addresses6 { tun_ip, gateway });
        self
    }

    /// Whether `ip` is a gateway address (the source of every translated flow).
    pub fn is_gateway(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => v4 == self.gateway,
            IpAddr::V6(v6) => self.v6.is_some_and(|a| a.gateway == v6),
        }
    }

    /// Records that `name` resolved to `addresses` (copy on write; DNS answers are rare next to
    /// packets, and an answer that changes nothing — most cache hits — copies nothing). The map
    /// is bounded: past [`MAX_NAMES`] addresses it starts afresh (a flow whose name was dropped
    /// is routed by address until the name is resolved again).
    pub fn learn_names(&self, name: &str, addresses: &[IpAddr]) {
        if addresses.is_empty() {
            return;
        }
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let known = self.names.load();
        if addresses.iter().all(|ip| known.get(ip) == Some(&name)) {
            return;
        }
        self.names.rcu(|old| {
            let mut map = if old.len() + addresses.len() > MAX_NAMES {
                HashMap::new()
            } else {
                HashMap::clone(old)
            };
            for ip in addresses {
                map.insert(*ip, name.clone());
            }
            map
        });
    }
}

/// Creates the TUN device `name` (see [`crate::sys::open_tun`]: gone when the descriptor closes).
pub fn open_device(name: &str) -> std::io::Result<std::fs::File> {
    crate::sys::open_tun(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + last))
    }

    #[test]
    fn names_are_learnt_lowercase_and_an_unchanged_answer_copies_nothing() {
        let path = VpnPath::new(Ipv4Addr::new(10, 255, 0, 2), Ipv4Addr::new(10, 255, 0, 1));
        path.learn_names("Example.COM.", &[ip(1), "::1".parse().expect("v6")]);
        let first = path.names.load_full();
        assert_eq!(first.get(&ip(1)).map(String::as_str), Some("example.com"));
        let v6: IpAddr = "::1".parse().expect("v6");
        assert_eq!(
            first.get(&v6).map(String::as_str),
            Some("example.com"),
            "AAAA answers are learnt too"
        );
        path.learn_names("example.com", &[ip(1)]);
        assert!(
            Arc::ptr_eq(&first, &path.names.load_full()),
            "same answer, same map"
        );
        path.learn_names("other.example", &[ip(1)]);
        assert_eq!(
            path.names.load().get(&ip(1)).map(String::as_str),
            Some("other.example")
        );
    }

    #[test]
    fn the_name_map_is_bounded() {
        let path = VpnPath::new(Ipv4Addr::new(10, 255, 0, 2), Ipv4Addr::new(10, 255, 0, 1));
        let batch: Vec<IpAddr> = (0..1024).map(ip).collect();
        for round in 0..(MAX_NAMES / 1024 + 2) {
            path.learn_names(&format!("n{round}.example"), &batch);
        }
        let many: Vec<IpAddr> = (0..MAX_NAMES as u32).map(|i| ip(i + 5000)).collect();
        path.learn_names("many.example", &many);
        assert!(path.names.load().len() <= MAX_NAMES);
        path.learn_names("one.more", &[ip(MAX_NAMES as u32 + 9000)]);
        assert!(path.names.load().len() <= MAX_NAMES);
        assert_eq!(
            path.names
                .load()
                .get(&ip(MAX_NAMES as u32 + 9000))
                .map(String::as_str),
            Some("one.more")
        );
    }
}
