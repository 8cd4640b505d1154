//! This peer's host candidates: the IPv4 addresses of the machine's interfaces that are up
//! (not loopback, not the mesh device itself) with the mesh UDP port, as the registry's Mesh
//! endpoints (`type` `lan`). Priorities follow RFC 8445 §5.1.2 for host candidates (type
//! preference 126, local preference by interface order, component 1), so the ICE crate's
//! server-reflexive and relay candidates rank below them. [`with_gathered`] adds those (the
//! data plane's NAT traversal gathers them) to what the peer publishes.
//!
//! The same interface list gives this peer's anycast addresses: extra addresses of the mesh
//! device inside the network (`ip addr add 10.100.0.200/32 dev symesh0`).

use std::net::Ipv4Addr;
use switchyard_api::MeshEndpoint;
use switchyard_dataplane::mesh::CandidateEndpoint;

/// RFC 8445 priority of a host candidate with local preference `local`, component 1.
pub fn host_priority(local: u16) -> i32 {
    ((126u32 << 24) + (u32::from(local) << 8) + 255) as i32
}

/// Host endpoints from `(interface, address)` pairs, in order, without duplicates.
pub fn host_endpoints(
    addresses: &[(String, Ipv4Addr)],
    mesh_device: &str,
    port: u16,
) -> Vec<MeshEndpoint> {
    let mut out: Vec<MeshEndpoint> = Vec::new();
    for (ifname, ip) in addresses {
        if ifname == mesh_device || ip.is_loopback() || ip.is_unspecified() || ip.is_link_local() {
            continue;
        }
        let address = ip.to_string();
        if out.iter().any(|e| e.address == address) {
            continue;
        }
        let local = u16::MAX.saturating_sub(out.len() as u16);
        out.push(MeshEndpoint {
            address,
            port,
            kind: "lan".into(),
            priority: host_priority(local),
        });
    }
    out
}

/// The host endpoints followed by the server-reflexive and relayed candidates NAT traversal
/// gathered (its host candidates are the host endpoints already), without duplicates.
pub fn with_gathered(
    hosts: Vec<MeshEndpoint>,
    gathered: &[CandidateEndpoint],
) -> Vec<MeshEndpoint> {
    let mut out = hosts;
    for c in gathered.iter().filter(|c| c.kind != "lan") {
        if out
            .iter()
            .any(|e| e.address == c.address && e.port == c.port)
        {
            continue;
        }
        out.push(MeshEndpoint {
            address: c.address.clone(),
            port: c.port,
            kind: c.kind.clone(),
            priority: c.priority,
        });
    }
    out
}

/// The IPv4 addresses of the interfaces that are up.
pub fn interface_addresses() -> Vec<(String, Ipv4Addr)> {
    use nix::net::if_::InterfaceFlags;
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter(|a| a.flags.contains(InterfaceFlags::IFF_UP))
        .filter_map(|a| {
            let ip = a.address?.as_sockaddr_in()?.ip();
            Some((a.interface_name, ip))
        })
        .collect()
}

/// The anycast addresses among `(interface, address)` pairs: the addresses of `mesh_device`
/// inside `network` other than the leased `vip` and the network and broadcast addresses.
pub fn anycast_addresses(
    addresses: &[(String, Ipv4Addr)],
    mesh_device: &str,
    network: ipnet::Ipv4Net,
    vip: Ipv4Addr,
) -> Vec<Ipv4Addr> {
    addresses
        .iter()
        .filter(|(ifname, ip)| {
            ifname == mesh_device
                && *ip != vip
                && network.contains(ip)
                && *ip != network.network()
                && *ip != network.broadcast()
        })
        .map(|(_, ip)| *ip)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anycast_addresses_are_the_mesh_devices_extra_addresses_in_the_network() {
        let a = |n: &str, ip: &str| (n.to_string(), ip.parse::<Ipv4Addr>().expect("ip"));
        let net: ipnet::Ipv4Net = "10.100.0.0/24".parse().expect("net");
        let vip = Ipv4Addr::new(10, 100, 0, 2);
        let got = anycast_addresses(
            &[
                a("symesh0", "10.100.0.2"),
                a("symesh0", "10.100.0.200"),
                a("symesh0", "192.168.7.1"),
                a("symesh0", "10.100.0.255"),
                a("eth0", "10.100.0.201"),
            ],
            "symesh0",
            net,
            vip,
        );
        assert_eq!(got, [Ipv4Addr::new(10, 100, 0, 200)]);
    }

    #[test]
    fn host_candidates_skip_loopback_the_mesh_device_and_duplicates() {
        let a = |n: &str, ip: &str| (n.to_string(), ip.parse::<Ipv4Addr>().expect("ip"));
        let list = host_endpoints(
            &[
                a("lo", "127.0.0.1"),
                a("eth0", "192.168.1.5"),
                a("symesh0", "10.100.0.2"),
                a("eth1", "169.254.3.3"),
                a("eth1", "10.0.0.7"),
                a("eth2", "192.168.1.5"),
            ],
            "symesh0",
            41000,
        );
        let got: Vec<(&str, u16, &str)> = list
            .iter()
            .map(|e| (e.address.as_str(), e.port, e.kind.as_str()))
            .collect();
        assert_eq!(
            got,
            [("192.168.1.5", 41000, "lan"), ("10.0.0.7", 41000, "lan")]
        );
        assert!(list[0].priority > list[1].priority);
        assert_eq!(host_priority(65535), 2_130_706_431);
    }

    #[test]
    fn gathered_candidates_follow_the_host_ones_once() {
        let c = |address: &str, port, kind: &str, priority| CandidateEndpoint {
            address: address.into(),
            port,
            kind: kind.into(),
            priority,
        };
        let hosts = host_endpoints(
            &[("eth0".into(), "10.0.0.7".parse().expect("ip"))],
            "symesh0",
            41000,
        );
        let all = with_gathered(
            hosts,
            &[
                c("10.0.0.7", 41000, "lan", 7),
                c("198.51.100.2", 41000, "srflx", 5),
                c("203.0.113.1", 50000, "relay", 3),
                c("198.51.100.2", 41000, "srflx", 5),
            ],
        );
        let got: Vec<(&str, &str)> = all
            .iter()
            .map(|e| (e.address.as_str(), e.kind.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("10.0.0.7", "lan"),
                ("198.51.100.2", "srflx"),
                ("203.0.113.1", "relay")
            ]
        );
    }
}
