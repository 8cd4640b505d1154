//! What enabling the VPN sets up on the host besides the split tunnel: the TUN device's address,
//! MTU and reverse-path filter, the client's own bypass cgroup, and the networks that never go
//! into the tunnel (the server's addresses and the directly connected LAN).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use switchyard_split_tunnel::host::Host;
use switchyard_split_tunnel::{cgroup, Error};

/// `vpn.tun.address` (`10.255.0.2/24`) → the address and the CIDR as given.
pub fn tun_address(address: &str) -> Option<(Ipv4Addr, u8)> {
    let (ip, prefix) = address.split_once('/').unwrap_or((address, "32"));
    let ip: Ipv4Addr = ip.trim().parse().ok()?;
    let prefix: u8 = prefix.trim().parse().ok().filter(|p| *p <= 32)?;
    Some((ip, prefix))
}

/// `vpn.tun.address6` (`fd7a:5359:5400::2/64`) → the address and prefix; `None` when empty or
/// not an IPv6 CIDR.
pub fn tun_address6(address: &str) -> Option<(Ipv6Addr, u8)> {
    let (ip, prefix) = address.split_once('/').unwrap_or((address, "128"));
    let ip: Ipv6Addr = ip.trim().parse().ok()?;
    let prefix: u8 = prefix.trim().parse().ok().filter(|p| *p <= 128)?;
    Some((ip, prefix))
}

/// Gives the TUN device its IPv6 address, at once usable (`nodad`: the pump's gateway never
/// answers duplicate address detection, and a tentative address would refuse the listener's
/// replies for a second).
pub fn configure_tun6(name: &str, ip: Ipv6Addr, prefix: u8) -> Result<(), Error> {
    Host::default().run(
        "ip",
        &[
            "-6",
            "addr",
            "replace",
            &format!("{ip}/{prefix}"),
            "dev",
            name,
            "nodad",
        ],
        None,
    )?;
    Ok(())
}

/// Gives the TUN device its address and MTU, brings it up, and turns its reverse-path filter off:
/// replies the pump writes into the device come from the flows' real destinations, which the
/// main table routes elsewhere (strict `rp_filter` would drop them).
pub fn configure_tun(name: &str, ip: Ipv4Addr, prefix: u8, mtu: u32) -> Result<(), Error> {
    let host = Host::default();
    host.run(
        "ip",
        &["addr", "replace", &format!("{ip}/{prefix}"), "dev", name],
        None,
    )?;
    host.run(
        "ip",
        &["link", "set", "dev", name, "mtu", &mtu.to_string(), "up"],
        None,
    )?;
    let rp = format!("/proc/sys/net/ipv4/conf/{name}/rp_filter");
    std::fs::write(&rp, "0").map_err(|e| Error::Io(format!("write {rp}"), e))?;
    let all = std::fs::read_to_string("/proc/sys/net/ipv4/conf/all/rp_filter").unwrap_or_default();
    if all.trim() == "1" {
        tracing::warn!("net.ipv4.conf.all.rp_filter is 1 (strict): replies through the VPN may be dropped; use 0 or 2");
    }
    Ok(())
}

/// Deletes a TUN device left by something other than a live descriptor (a persistent device of
/// the same name): the client's own device never outlives it, as the kernel removes a
/// non-persistent TUN with its last descriptor.
pub fn remove_leftover_tun(name: &str) {
    let sys = Path::new("/sys/class/net").join(name);
    if sys.join("tun_flags").exists() {
        match Host::default().run("ip", &["link", "del", "dev", name], None) {
            Ok(_) => tracing::info!(device = name, "removed a leftover TUN device"),
            Err(e) => {
                tracing::warn!(device = name, error = %e, "cannot remove a leftover TUN device")
            }
        }
    }
}

/// The cgroup whose sockets are never tunnelled: the client's own. When the client runs in the
/// classified scope itself (its cgroup *is* the scope), it moves into `<scope>/switchyard-client`
/// first, so bypassing it does not bypass everything.
pub fn own_bypass_cgroup(scope: &Path) -> Result<PathBuf, Error> {
    let mount = cgroup::cgroup2_mount()?;
    let own = cgroup::cgroup_of(&mount, std::process::id()).ok_or_else(|| {
        Error::Io(
            "read /proc/self/cgroup".into(),
            std::io::ErrorKind::NotFound.into(),
        )
    })?;
    if own != scope {
        return Ok(own);
    }
    let dir = scope.join("switchyard-client");
    if !dir.exists() {
        std::fs::create_dir(&dir).map_err(|e| Error::Io(format!("create {}", dir.display()), e))?;
    }
    cgroup::move_process(&dir, std::process::id())?;
    tracing::info!(cgroup = %dir.display(), "the client moved into its own cgroup (bypassed by the split tunnel)");
    Ok(dir)
}

/// The addresses of `host:port` (a literal or a name), as host networks.
pub fn server_addresses(address: &str) -> Vec<String> {
    let with_port = if address
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        address.to_string()
    } else {
        format!("{address}:0")
    };
    with_port
        .to_socket_addrs()
        .map(|addrs| addrs.map(|a| host_cidr(a.ip())).collect())
        .unwrap_or_default()
}

fn host_cidr(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}/32"),
        IpAddr::V6(v6) => format!("{v6}/128"),
    }
}

/// Directly connected networks (`ip route show scope link` in the main table) except the TUN's.
pub fn lan_networks(tun: &str) -> Vec<String> {
    let mut nets = Vec::new();
    for family in ["-4", "-6"] {
        let Ok(out) = Host::default().run(
            "ip",
            &[
                family, "-j", "route", "show", "table", "main", "scope", "link",
            ],
            None,
        ) else {
            continue;
        };
        nets.extend(parse_link_routes(&out, tun));
    }
    nets
}

/// The `dst` of `ip -j route` entries that are networks (not `default`) on devices other than `tun`.
pub fn parse_link_routes(json: &str, tun: &str) -> Vec<String> {
    let routes: Vec<serde_json::Value> = serde_json::from_str(json).unwrap_or_default();
    routes
        .iter()
        .filter(|r| r["dev"].as_str() != Some(tun))
        .filter_map(|r| r["dst"].as_str())
        .filter(|d| *d != "default" && !d.starts_with("fe80:") && !d.starts_with("ff00:"))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tun_addresses() {
        assert_eq!(
            tun_address("10.255.0.2/24"),
            Some(("10.255.0.2".parse().expect("ip"), 24))
        );
        assert_eq!(
            tun_address("10.9.0.1"),
            Some(("10.9.0.1".parse().expect("ip"), 32))
        );
        assert_eq!(tun_address("fd00::1/64"), None);
        assert_eq!(
            tun_address6("fd7a:5359:5400::2/64"),
            Some(("fd7a:5359:5400::2".parse().expect("ip"), 64))
        );
        assert_eq!(tun_address6(""), None);
        assert_eq!(tun_address6("10.0.0.1/24"), None);
        assert_eq!(tun_address6("fd00::1/129"), None);
        assert_eq!(tun_address("10.0.0.1/40"), None);
    }

    #[test]
    fn link_routes_skip_the_tunnel_default_and_link_local() {
        let json = r#"[{"dst":"10.1.0.0/24","dev":"eth0","protocol":"kernel","scope":"link"},
            {"dst":"10.255.0.0/24","dev":"sy0"},{"dst":"default","dev":"eth0"},
            {"dst":"fe80::/64","dev":"eth0"},{"dst":"fd00:1::/64","dev":"eth0"}]"#;
        assert_eq!(
            parse_link_routes(json, "sy0"),
            ["10.1.0.0/24", "fd00:1::/64"]
        );
        assert!(parse_link_routes("not json", "sy0").is_empty());
    }

    #[test]
    fn server_addresses_resolve_literals_with_or_without_a_port() {
        assert_eq!(server_addresses("10.1.2.3:8080"), ["10.1.2.3/32"]);
        assert_eq!(server_addresses("10.1.2.3"), ["10.1.2.3/32"]);
        assert_eq!(server_addresses("[fd00::5]:1"), ["fd00::5/128"]);
    }
}
