//! `stun:host[:port]` and `turn:host[:port][?transport=udp]` server URLs (RFC 7064, RFC 7065).
//! Only plain UDP is supported: `stuns:`/`turns:` and `transport=tcp` are refused, so a
//! configuration that asks for them fails loudly instead of silently using something else.

use std::net::{IpAddr, SocketAddr};

use crate::IceError;

pub const DEFAULT_PORT: u16 = 3478;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerUrl {
    /// Host name or IP literal (without brackets); the caller resolves names.
    pub host: String,
    pub port: u16,
}

impl ServerUrl {
    pub fn parse_stun(url: &str) -> Result<ServerUrl, IceError> {
        parse(url, "stun:")
    }

    pub fn parse_turn(url: &str) -> Result<ServerUrl, IceError> {
        parse(url, "turn:")
    }

    /// The address when the host is an IP literal (names are resolved by the caller).
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        let ip: IpAddr = self.host.parse().ok()?;
        Some(SocketAddr::new(ip, self.port))
    }
}

fn parse(url: &str, scheme: &str) -> Result<ServerUrl, IceError> {
    let bad = |why: &str| IceError::BadUrl {
        url: url.to_string(),
        why: why.to_string(),
    };
    let rest = url
        .get(..scheme.len())
        .filter(|s| s.eq_ignore_ascii_case(scheme))
        .map(|_| &url[scheme.len()..])
        .ok_or_else(|| bad(&format!("must start with {scheme} (only UDP without TLS)")))?;
    let (authority, query) = match rest.split_once('?') {
        Some((a, q)) => (a, Some(q)),
        None => (rest, None),
    };
    if let Some(query) = query {
        for param in query.split('&') {
            match param.split_once('=') {
                Some(("transport", t)) if t.eq_ignore_ascii_case("udp") => {}
                Some(("transport", _)) => return Err(bad("only transport=udp is supported")),
                _ => return Err(bad("unknown query parameter")),
            }
        }
    }
    let authority = authority.trim_start_matches("//");
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(|| bad("unclosed ["))?;
        match after {
            "" => (host, None),
            p => (
                host,
                Some(p.strip_prefix(':').ok_or_else(|| bad("junk after ]"))?),
            ),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() || host.contains(['/', '@', ' ']) {
        return Err(bad("missing or invalid host"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| bad("bad port"))?,
    };
    Ok(ServerUrl {
        host: host.to_string(),
        port,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_forms_and_defaults() {
        let u = ServerUrl::parse_stun("stun:stun.example.org").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("stun.example.org", 3478));
        assert_eq!(u.socket_addr(), None);
        let u = ServerUrl::parse_stun("STUN:127.0.0.1:9").unwrap();
        assert_eq!(u.socket_addr(), Some("127.0.0.1:9".parse().unwrap()));
        let u = ServerUrl::parse_turn("turn:[::1]:5349?transport=udp").unwrap();
        assert_eq!(u.socket_addr(), Some("[::1]:5349".parse().unwrap()));
        let u = ServerUrl::parse_turn("turn:[::1]").unwrap();
        assert_eq!(u.port, 3478);
    }

    #[test]
    fn refuses_what_is_not_supported() {
        for bad in [
            "turns:x",
            "stuns:x",
            "turn:x?transport=tcp",
            "stun:",
            "stun:x:0",
            "stun:x:99999",
            "stun:[::1",
            "http://x",
            "turn:x?foo=bar",
            "s",
            "",
        ] {
            let r = if bad.starts_with("turn") {
                ServerUrl::parse_turn(bad)
            } else {
                ServerUrl::parse_stun(bad)
            };
            assert!(r.is_err(), "{bad} accepted");
        }
    }
}
