//! Client admission by address: a whitelist (when non-empty, only these) and a blacklist.

use ipnet::IpNet;
use std::net::IpAddr;

#[derive(Debug, Clone, Default)]
pub struct AccessControl {
    whitelist: Vec<IpNet>,
    blacklist: Vec<IpNet>,
}

impl AccessControl {
    pub fn new(whitelist: Vec<IpNet>, blacklist: Vec<IpNet>) -> Self {
        Self {
            whitelist,
            blacklist,
        }
    }

    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        if !self.whitelist.is_empty() && !self.whitelist.iter().any(|n| n.contains(&ip)) {
            return false;
        }
        !self.blacklist.iter().any(|n| n.contains(&ip))
    }
}

/// IPv4 clients on a dual-stack listener appear as `::ffff:a.b.c.d`; match them as IPv4.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(s: &[&str]) -> Vec<IpNet> {
        s.iter().map(|x| x.parse().expect("net")).collect()
    }

    #[test]
    fn whitelist_then_blacklist() {
        let acl = AccessControl::new(nets(&["10.0.0.0/8", "::1/128"]), nets(&["10.1.0.0/16"]));
        assert!(acl.allows("10.2.3.4".parse().expect("ip")));
        assert!(!acl.allows("10.1.3.4".parse().expect("ip")));
        assert!(!acl.allows("192.168.1.1".parse().expect("ip")));
        assert!(acl.allows("::1".parse().expect("ip")));
    }

    #[test]
    fn mapped_v4_matches_v4_rules() {
        let acl = AccessControl::new(vec![], nets(&["127.0.0.1/32"]));
        assert!(!acl.allows("::ffff:127.0.0.1".parse().expect("ip")));
        assert!(AccessControl::default().allows("::ffff:127.0.0.1".parse().expect("ip")));
    }
}
