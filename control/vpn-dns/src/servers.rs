//! Reading upstream server addresses as people write them: `vpn.dns.servers` entries and the
//! `nameserver` lines of resolv.conf (the fallback a caller may use when the list is empty).

use std::net::{IpAddr, SocketAddr};

/// The DNS port used when an entry names none.
pub const DNS_PORT: u16 = 53;

/// Parses `1.1.1.1`, `1.1.1.1:5353`, `2606:4700::1111`, `[2606:4700::1111]:53`. Host names are
/// refused: resolving the resolver's own servers would need a resolver.
pub fn parse_server(entry: &str) -> Result<SocketAddr, crate::Error> {
    let entry = entry.trim();
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, DNS_PORT));
    }
    entry
        .parse::<SocketAddr>()
        .map_err(|_| crate::Error::BadServer(entry.to_owned()))
}

/// Parses every entry; the first bad one is the error.
pub fn parse_servers(entries: &[String]) -> Result<Vec<SocketAddr>, crate::Error> {
    entries.iter().map(|e| parse_server(e)).collect()
}

/// The `nameserver` addresses of a resolv.conf text, in order (comments and other options
/// ignored, an IPv6 zone suffix `%eth0` dropped).
pub fn parse_resolv_conf(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .map(|l| l.split(['#', ';']).next().unwrap_or_default())
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver"))
                .then(|| words.next())
                .flatten()
        })
        .filter_map(|addr| addr.split('%').next()?.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, DNS_PORT))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn server_entries() {
        assert_eq!(
            parse_server("1.1.1.1").unwrap(),
            "1.1.1.1:53".parse().unwrap()
        );
        assert_eq!(
            parse_server(" 10.0.0.1:5353 ").unwrap(),
            "10.0.0.1:5353".parse().unwrap()
        );
        assert_eq!(
            parse_server("2606:4700::1111").unwrap(),
            "[2606:4700::1111]:53".parse().unwrap()
        );
        assert_eq!(
            parse_server("[::1]:5300").unwrap(),
            "[::1]:5300".parse().unwrap()
        );
        for bad in ["dns.example", "1.1.1.1:", "", "1.1.1.1:99999"] {
            assert!(
                matches!(parse_server(bad), Err(crate::Error::BadServer(_))),
                "{bad}"
            );
        }
        let list = vec!["9.9.9.9".to_owned(), "nope".to_owned()];
        assert!(parse_servers(&list).is_err());
    }

    #[test]
    fn resolv_conf_nameservers() {
        let text =
            "# generated\nsearch lan\nnameserver 192.168.1.1\nnameserver fe80::1%eth0 # router\n\
                    ;nameserver 8.8.8.8\noptions edns0\nnameserver bogus\nnameserver   ::1\n";
        let got: Vec<String> = parse_resolv_conf(text)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(got, ["192.168.1.1:53", "[fe80::1]:53", "[::1]:53"]);
    }
}
