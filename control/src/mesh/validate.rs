//! Checks of what clients send to the registry. Each failure names the field it is about, so
//! the API can answer `400` with a message a person (or a peer's log) can act on.

use base64::Engine as _;
use ipnet::Ipv4Net;
use switchyard_api::MeshEndpoint;

/// Most endpoints a peer may announce.
pub const MAX_ENDPOINTS: usize = 16;
/// Largest `metadata` object, as JSON.
pub const MAX_METADATA_BYTES: usize = 4096;
/// Most anycast addresses a peer may list in `metadata.anycast`.
pub const MAX_ANYCAST: usize = 16;
/// Longest id and name.
pub const MAX_ID_LEN: usize = 64;
pub const MAX_NAME_LEN: usize = 128;

/// A refused field: its name (`peer.public_key`, `endpoints[1].port`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct Invalid {
    pub field: String,
    pub reason: String,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Invalid {
    Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// A network or peer id: 1–64 of `A-Z a-z 0-9 . _ -`, starting with a letter or digit (ids
/// appear in URL paths and log lines).
pub fn id(field: &str, value: &str) -> Result<(), Invalid> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    match value.chars().next() {
        None => Err(invalid(field, "must not be empty")),
        Some(_) if value.len() > MAX_ID_LEN => Err(invalid(
            field,
            format!("at most {MAX_ID_LEN} characters (got {})", value.len()),
        )),
        Some(c) if !c.is_ascii_alphanumeric() => {
            Err(invalid(field, "must start with a letter or digit"))
        }
        Some(_) if !value.chars().all(ok_char) => Err(invalid(
            field,
            "only letters, digits, '.', '_' and '-' are allowed",
        )),
        Some(_) => Ok(()),
    }
}

/// A display name: at most 128 characters, no control characters; `required` refuses empty.
pub fn name(field: &str, value: &str, required: bool) -> Result<(), Invalid> {
    if required && value.trim().is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if value.chars().count() > MAX_NAME_LEN {
        return Err(invalid(field, format!("at most {MAX_NAME_LEN} characters")));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(field, "must not contain control characters"));
    }
    Ok(())
}

/// A network's CIDR: IPv4, written as its network address, /8 to /30 (a /31 or /32 has no
/// address left once the network and broadcast addresses are kept out).
pub fn cidr(field: &str, value: &str) -> Result<Ipv4Net, Invalid> {
    let value = value.trim();
    let net: Ipv4Net = match value.parse() {
        Ok(n) => n,
        Err(_) if value.parse::<ipnet::Ipv6Net>().is_ok() => {
            return Err(invalid(field, "only IPv4 networks are supported"))
        }
        Err(_) => {
            return Err(invalid(
                field,
                format!("{value:?} is not an IPv4 network such as 10.100.0.0/24"),
            ))
        }
    };
    if net.network() != net.addr() {
        return Err(invalid(
            field,
            format!("{value} has host bits set; the network is {}", net.trunc()),
        ));
    }
    if !(8..=30).contains(&net.prefix_len()) {
        return Err(invalid(
            field,
            format!(
                "prefix /{} is outside /8 … /30 (a /31 or /32 leaves no address for peers)",
                net.prefix_len()
            ),
        ));
    }
    Ok(net)
}

/// A public key: standard base64 of exactly 32 bytes (an X25519 key).
pub fn public_key(field: &str, value: &str) -> Result<(), Invalid> {
    match base64::engine::general_purpose::STANDARD.decode(value.trim()) {
        Ok(bytes) if bytes.len() == 32 => Ok(()),
        Ok(bytes) => Err(invalid(
            field,
            format!(
                "must be base64 of 32 bytes (decodes to {} bytes)",
                bytes.len()
            ),
        )),
        Err(_) => Err(invalid(field, "must be base64 of 32 bytes (not base64)")),
    }
}

/// Announced endpoints: at most 16; each an IP literal or DNS name, a port 1–65535 and a
/// type of 1–16 of `a-z 0-9 _ -` (`lan` is the spec's example; `wan`, `stun`, `relay` fit).
pub fn endpoints(field: &str, list: &[MeshEndpoint]) -> Result<(), Invalid> {
    if list.len() > MAX_ENDPOINTS {
        return Err(invalid(
            field,
            format!("at most {MAX_ENDPOINTS} endpoints (got {})", list.len()),
        ));
    }
    for (i, e) in list.iter().enumerate() {
        let at = |f: &str| format!("{field}[{i}].{f}");
        if e.address.parse::<std::net::IpAddr>().is_err() && !is_dns_name(&e.address) {
            return Err(invalid(
                at("address"),
                format!("{:?} is neither an IP address nor a host name", e.address),
            ));
        }
        if e.port == 0 {
            return Err(invalid(at("port"), "must be 1–65535"));
        }
        let kind_ok = (1..=16).contains(&e.kind.len())
            && e.kind
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-'));
        if !kind_ok {
            return Err(invalid(
                at("type"),
                format!("{:?} is not 1–16 of a-z, 0-9, '_', '-' (e.g. lan)", e.kind),
            ));
        }
    }
    Ok(())
}

fn is_dns_name(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// `metadata`: at most 4 KiB as JSON.
pub fn metadata(
    field: &str,
    value: &serde_json::Map<String, serde_json::Value>,
) -> Result<String, Invalid> {
    let text = serde_json::to_string(value).map_err(|e| invalid(field, e.to_string()))?;
    if text.len() > MAX_METADATA_BYTES {
        return Err(invalid(
            field,
            format!(
                "at most {MAX_METADATA_BYTES} bytes as JSON (got {})",
                text.len()
            ),
        ));
    }
    Ok(text)
}

/// `metadata.anycast`: the anycast addresses a peer serves, the only ones the data plane
/// accepts it for (a group claim in a datagram proves nothing). Absent: none. Each must be an
/// address `net` could lease (not its network, broadcast or a multicast address); whether a
/// member holds it is the store's check, inside its transaction.
pub fn anycast(
    field: &str,
    metadata: &serde_json::Map<String, serde_json::Value>,
    net: Ipv4Net,
) -> Result<Vec<std::net::Ipv4Addr>, Invalid> {
    let Some(value) = metadata.get("anycast") else {
        return Ok(Vec::new());
    };
    let list = value
        .as_array()
        .ok_or_else(|| invalid(field, "a list of IPv4 addresses"))?;
    if list.len() > MAX_ANYCAST {
        return Err(invalid(
            field,
            format!("at most {MAX_ANYCAST} addresses (got {})", list.len()),
        ));
    }
    let leasable = super::lease::leasable(net);
    let mut out = Vec::with_capacity(list.len());
    for (i, v) in list.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let ip: std::net::Ipv4Addr = v
            .as_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| invalid(&at, "an IPv4 address as a string"))?;
        if !leasable.contains(&u32::from(ip)) {
            return Err(invalid(
                at,
                format!("{ip} is not an address of the network {net} a member could hold"),
            ));
        }
        if out.contains(&ip) {
            return Err(invalid(at, format!("{ip} is listed twice")));
        }
        out.push(ip);
    }
    Ok(out)
}

/// An anycast list may not name an address a member holds (`holders`: address → peer id),
/// the listing peer's own included: a "group" at a member's address would draw its traffic.
pub fn anycast_not_held(
    field: &str,
    list: &[std::net::Ipv4Addr],
    holders: &std::collections::BTreeMap<std::net::Ipv4Addr, String>,
) -> Result<(), Invalid> {
    for (i, ip) in list.iter().enumerate() {
        if let Some(peer) = holders.get(ip) {
            return Err(invalid(
                format!("{field}[{i}]"),
                format!("{ip} is the address of member {peer:?}"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ep(address: &str, port: u16, kind: &str) -> MeshEndpoint {
        MeshEndpoint {
            address: address.into(),
            port,
            kind: kind.into(),
            priority: 0,
        }
    }

    #[test]
    fn ids() {
        assert!(id("id", "office-1").is_ok());
        assert!(id("id", "a.b_c").is_ok());
        assert_eq!(id("id", "").unwrap_err().reason, "must not be empty");
        assert_eq!(id("peer.id", "-x").unwrap_err().field, "peer.id");
        assert!(id("id", "a/b").is_err());
        assert!(id("id", "a b").is_err());
        assert!(id("id", &"a".repeat(65)).is_err());
        assert!(id("id", &"a".repeat(64)).is_ok());
    }

    #[test]
    fn names() {
        assert!(name("name", "Office LAN", true).is_ok());
        assert!(name("name", " ", true).is_err());
        assert!(name("peer.name", "", false).is_ok());
        assert!(name("name", "a\nb", false).is_err());
        assert!(name("name", &"é".repeat(128), true).is_ok());
        assert!(name("name", &"é".repeat(129), true).is_err());
    }

    #[test]
    fn cidrs() {
        assert_eq!(
            cidr("cidr", "10.100.0.0/24").unwrap(),
            "10.100.0.0/24".parse().unwrap()
        );
        let e = cidr("cidr", "10.100.0.1/24").unwrap_err();
        assert!(e.reason.contains("10.100.0.0/24"), "{e}");
        assert!(cidr("cidr", "10.0.0.0/31").is_err());
        assert!(cidr("cidr", "10.0.0.0/32").is_err());
        assert!(cidr("cidr", "10.0.0.0/30").is_ok());
        assert!(cidr("cidr", "10.0.0.0/7").is_err());
        assert!(cidr("cidr", "fd00::/64")
            .unwrap_err()
            .reason
            .contains("IPv4"));
        assert!(cidr("cidr", "banana").is_err());
        assert!(cidr("cidr", "10.0.0.0").is_err());
    }

    #[test]
    fn public_keys() {
        let k = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
        assert!(public_key("peer.public_key", &k).is_ok());
        let short = base64::engine::general_purpose::STANDARD.encode([7u8; 31]);
        let e = public_key("peer.public_key", &short).unwrap_err();
        assert!(e.to_string().starts_with("peer.public_key: "), "{e}");
        assert!(e.reason.contains("31 bytes"));
        assert!(public_key("peer.public_key", "not base64!").is_err());
    }

    #[test]
    fn endpoint_lists() {
        assert!(endpoints("endpoints", &[ep("192.0.2.1", 51820, "lan")]).is_ok());
        assert!(endpoints("endpoints", &[ep("2001:db8::1", 1, "wan")]).is_ok());
        assert!(endpoints("endpoints", &[ep("peer.example.net", 1, "relay")]).is_ok());
        let e = endpoints(
            "peer.endpoints",
            &[ep("192.0.2.1", 1, "lan"), ep("192.0.2.1", 0, "lan")],
        )
        .unwrap_err();
        assert_eq!(e.field, "peer.endpoints[1].port");
        let e = endpoints("endpoints", &[ep("not an address", 1, "lan")]).unwrap_err();
        assert_eq!(e.field, "endpoints[0].address");
        let e = endpoints("endpoints", &[ep("192.0.2.1", 1, "LAN!")]).unwrap_err();
        assert_eq!(e.field, "endpoints[0].type");
        let many: Vec<_> = (0..17).map(|_| ep("192.0.2.1", 1, "lan")).collect();
        assert_eq!(
            endpoints("endpoints", &many).unwrap_err().field,
            "endpoints"
        );
    }

    #[test]
    fn metadata_size() {
        let mut m = serde_json::Map::new();
        m.insert("os".into(), "linux".into());
        assert_eq!(metadata("metadata", &m).unwrap(), r#"{"os":"linux"}"#);
        m.insert("big".into(), "x".repeat(5000).into());
        assert!(metadata("metadata", &m).is_err());
    }

    #[test]
    fn anycast_lists() {
        let net: Ipv4Net = "10.100.0.0/24".parse().unwrap();
        let meta = |v: serde_json::Value| v.as_object().unwrap().clone();
        assert!(anycast("m", &meta(serde_json::json!({})), net)
            .unwrap()
            .is_empty());
        assert_eq!(
            anycast(
                "m",
                &meta(serde_json::json!({"anycast": ["10.100.0.200"]})),
                net
            )
            .unwrap(),
            vec!["10.100.0.200".parse::<std::net::Ipv4Addr>().unwrap()]
        );
        for bad in [
            serde_json::json!({"anycast": "10.100.0.200"}),
            serde_json::json!({"anycast": ["10.100.1.1"]}),
            serde_json::json!({"anycast": ["10.100.0.255"]}),
            serde_json::json!({"anycast": ["10.100.0.0"]}),
            serde_json::json!({"anycast": ["224.0.0.5"]}),
            serde_json::json!({"anycast": [7]}),
            serde_json::json!({"anycast": ["10.100.0.9", "10.100.0.9"]}),
        ] {
            assert!(anycast("m", &meta(bad.clone()), net).is_err(), "{bad}");
        }
        let many: Vec<String> = (1..=17).map(|i| format!("10.100.0.{i}")).collect();
        assert!(anycast("m", &meta(serde_json::json!({ "anycast": many })), net).is_err());
    }
}
