//! Listen addresses: `:7080`, `0.0.0.0:7080`, `127.0.0.1:7080`, `[::1]:7080`, `localhost:7080`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// A parsed listen address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ListenAddr {
    /// `None` = all interfaces (written `:PORT`, `0.0.0.0:PORT`, `[::]:PORT` or `*:PORT`).
    pub host: Option<IpAddr>,
    /// Port; 0 lets the OS choose (useful in tests).
    pub port: u16,
}

/// A listen address that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid listen address {value:?}: {reason} (examples: :7080, 127.0.0.1:7080, [::1]:7080)")]
pub struct ListenAddrError {
    /// The text as written.
    pub value: String,
    /// Why it was refused.
    pub reason: String,
}

impl ListenAddr {
    /// True when bound to all interfaces.
    pub fn is_all_interfaces(&self) -> bool {
        self.host.is_none()
    }

    /// True when only local clients can connect (loopback host).
    pub fn is_loopback(&self) -> bool {
        self.host.is_some_and(|h| h.is_loopback())
    }

    /// The addresses to try binding, in order. For a specific host: that address. For all
    /// interfaces: `[::]:PORT` first — bind it with `IPV6_V6ONLY` off so it is dual-stack and
    /// also accepts IPv4 — then `0.0.0.0:PORT` as the fallback for hosts without IPv6.
    /// Bind the first that succeeds; do not bind both.
    pub fn socket_addrs_all_interfaces(&self) -> Vec<SocketAddr> {
        match self.host {
            Some(ip) => vec![SocketAddr::new(ip, self.port)],
            None => vec![
                SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), self.port),
                SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), self.port),
            ],
        }
    }

    /// Whether two listeners would collide: same non-zero port and overlapping hosts.
    pub fn conflicts_with(&self, other: &ListenAddr) -> bool {
        self.port != 0
            && self.port == other.port
            && (self.host.is_none() || other.host.is_none() || self.host == other.host)
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.host {
            None => write!(f, ":{}", self.port),
            Some(ip) => write!(f, "{}", SocketAddr::new(ip, self.port)),
        }
    }
}

impl std::str::FromStr for ListenAddr {
    type Err = ListenAddrError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_listen(s)
    }
}

/// Parse a listen address. Host forms: empty / `0.0.0.0` / `::` / `*` (all interfaces),
/// an IPv4 literal, a bracketed IPv6 literal, or `localhost` (= 127.0.0.1). Host names other
/// than `localhost` are refused: a listener binds to addresses, not names.
pub fn parse_listen(s: &str) -> Result<ListenAddr, ListenAddrError> {
    let err = |reason: &str| ListenAddrError {
        value: s.to_string(),
        reason: reason.to_string(),
    };
    if s.is_empty() {
        return Err(err("empty"));
    }
    if s.chars().any(char::is_whitespace) {
        return Err(err("contains whitespace"));
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| err("missing `]` after the IPv6 address"))?;
        let port = after
            .strip_prefix(':')
            .ok_or_else(|| err("missing `:PORT` after `]`"))?;
        let ip: Ipv6Addr = h.parse().map_err(|_| err("bad IPv6 address"))?;
        (Some(IpAddr::V6(ip)), port)
    } else {
        let (h, port) = s.rsplit_once(':').ok_or_else(|| err("missing `:PORT`"))?;
        let host = match h {
            "" | "*" => None,
            "localhost" => Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            _ if h.contains(':') => {
                return Err(err("IPv6 addresses must be in brackets, e.g. [::1]:7080"))
            }
            _ => Some(IpAddr::V4(h.parse::<Ipv4Addr>().map_err(|_| {
                err("host must be an IP address, `localhost` or empty for all interfaces")
            })?)),
        };
        (host, port)
    };
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err("port must be a number"));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| err("port must be at most 65535"))?;
    let host = host.filter(|h| !h.is_unspecified());
    Ok(ListenAddr { host, port })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ok(s: &str) -> ListenAddr {
        parse_listen(s).unwrap()
    }

    #[test]
    fn accepted_forms() {
        assert_eq!(
            ok(":7080"),
            ListenAddr {
                host: None,
                port: 7080
            }
        );
        assert_eq!(
            ok("0.0.0.0:7080"),
            ListenAddr {
                host: None,
                port: 7080
            }
        );
        assert_eq!(
            ok("[::]:7080"),
            ListenAddr {
                host: None,
                port: 7080
            }
        );
        assert_eq!(
            ok("*:7080"),
            ListenAddr {
                host: None,
                port: 7080
            }
        );
        assert_eq!(
            ok("127.0.0.1:7080").host,
            Some("127.0.0.1".parse().unwrap())
        );
        assert_eq!(ok("[::1]:7080").host, Some("::1".parse().unwrap()));
        assert_eq!(
            ok("localhost:7080").host,
            Some("127.0.0.1".parse().unwrap())
        );
        assert!(ok("localhost:1").is_loopback());
        assert_eq!(ok(":0").port, 0);
    }

    #[test]
    fn rejected_forms_name_the_value() {
        for bad in [
            "",
            "7080",
            ":",
            ":http",
            ":70800",
            "example.com:80",
            "::1:80",
            "[::1]",
            "[::1:80",
            "1.2.3:80",
            " :80",
            "[zz]:1",
        ] {
            let e = parse_listen(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }

    #[test]
    fn bind_addresses() {
        let all = ok(":7080").socket_addrs_all_interfaces();
        assert_eq!(all[0], "[::]:7080".parse().unwrap());
        assert_eq!(all[1], "0.0.0.0:7080".parse().unwrap());
        assert_eq!(
            ok("127.0.0.1:9").socket_addrs_all_interfaces(),
            vec!["127.0.0.1:9".parse().unwrap()]
        );
    }

    #[test]
    fn display_and_conflicts() {
        assert_eq!(ok("0.0.0.0:80").to_string(), ":80");
        assert_eq!(ok("[::1]:80").to_string(), "[::1]:80");
        assert!(ok(":80").conflicts_with(&ok("127.0.0.1:80")));
        assert!(ok("127.0.0.1:80").conflicts_with(&ok("localhost:80")));
        assert!(!ok("127.0.0.1:80").conflicts_with(&ok("127.0.0.2:80")));
        assert!(!ok(":80").conflicts_with(&ok(":81")));
        assert!(!ok(":0").conflicts_with(&ok(":0")));
    }
}
