//! Settings of a `wireguard` backend (the object under `wireguard:` of a backend entry), typed
//! and checked. The backend entry keeps the object as raw JSON for round-tripping; the data
//! plane and validation read it through [`WireguardSettings::from_value`].
//!
//! ```yaml
//! wireguard:
//!   private_key: "base64 X25519 key"          # required, secret (masked in GET /api/v1/config)
//!   address: ["10.66.0.2/32"]                 # required: the interface address(es) in the tunnel
//!   public_key: "base64 key of the peer"      # required
//!   endpoint: "vpn.example:51820"             # required: host:port, names are re-resolved
//!   allowed_ips: ["0.0.0.0/0", "::/0"]        # default: everything
//!   preshared_key: "base64"                   # optional, secret
//!   persistent_keepalive: 25                  # seconds, 0 (default) = off
//!   mtu: 1420                                 # default 1420
//!   dns: ["10.66.0.1"]                        # resolvers reached through the tunnel; empty =
//!                                             # names are resolved by the host
//! ```

use base64::Engine;
use ipnet::IpNet;
use serde::Deserialize;
use std::net::IpAddr;

/// One X25519 key (32 bytes, standard base64 as `wg genkey` prints it).
pub type Key = [u8; 32];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireguardSettings {
    pub private_key: Key,
    /// Interface addresses; the first IPv4 (or IPv6) one is the source of proxied flows.
    pub address: Vec<IpNet>,
    pub public_key: Key,
    /// `host:port` as written (resolved again when the tunnel restarts a handshake).
    pub endpoint: String,
    pub allowed_ips: Vec<IpNet>,
    pub preshared_key: Option<Key>,
    /// Seconds; `None` = off.
    pub persistent_keepalive: Option<u16>,
    pub mtu: u16,
    pub dns: Vec<IpAddr>,
    /// Flows (TCP connections and SOCKS5 UDP associations) open at once through the tunnel;
    /// each holds one local port of the dynamic range, so at most [`MAX_FLOWS`].
    pub max_flows: u16,
}

pub const DEFAULT_MTU: u16 = 1420;
/// The local ports 49152–65000 a tunnel gives its flows.
pub const MAX_FLOWS: u16 = 15_849;

/// One address or a list of them.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    private_key: String,
    address: OneOrMany,
    public_key: String,
    endpoint: String,
    #[serde(default)]
    allowed_ips: Option<OneOrMany>,
    #[serde(default)]
    preshared_key: Option<String>,
    #[serde(default)]
    persistent_keepalive: u16,
    #[serde(default)]
    mtu: Option<u16>,
    #[serde(default)]
    dns: Option<OneOrMany>,
    #[serde(default)]
    max_flows: Option<u16>,
}

use crate::settings_error::err;
pub use crate::settings_error::SettingsError;

/// Decodes a base64 WireGuard key.
pub fn decode_key(key_name: &str, text: &str) -> Result<Key, SettingsError> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| err(key_name, format!("not base64: {e}")))?;
    bytes
        .try_into()
        .map_err(|b: Vec<u8>| err(key_name, format!("a key is 32 bytes, got {}", b.len())))
}

/// `10.0.0.2/24`, or a bare address meaning a host route (/32, /128).
fn parse_net(key: &str, text: &str) -> Result<IpNet, SettingsError> {
    if let Ok(net) = text.parse::<IpNet>() {
        return Ok(net);
    }
    text.parse::<IpAddr>()
        .map(IpNet::from)
        .map_err(|_| err(key, format!("`{text}` is not an address or CIDR")))
}

impl WireguardSettings {
    /// Reads and checks the raw `wireguard` object.
    pub fn from_value(value: &serde_json::Value) -> Result<Self, SettingsError> {
        let raw: Raw =
            serde_json::from_value(value.clone()).map_err(|e| err("wireguard", e.to_string()))?;
        let address = raw
            .address
            .into_vec()
            .iter()
            .map(|a| parse_net("address", a))
            .collect::<Result<Vec<_>, _>>()?;
        if address.is_empty() {
            return Err(err("address", "at least one interface address is required"));
        }
        let allowed_ips = match raw.allowed_ips {
            Some(list) => list
                .into_vec()
                .iter()
                .map(|a| parse_net("allowed_ips", a))
                .collect::<Result<Vec<_>, _>>()?,
            None => vec![
                IpNet::V4(ipnet::Ipv4Net::default()),
                IpNet::V6(ipnet::Ipv6Net::default()),
            ],
        };
        let dns = raw
            .dns
            .map(OneOrMany::into_vec)
            .unwrap_or_default()
            .iter()
            .map(|d| {
                d.parse::<IpAddr>()
                    .map_err(|_| err("dns", format!("`{d}` is not an IP address")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if crate::validate::check_host_port(&raw.endpoint).is_err() {
            return Err(err(
                "endpoint",
                format!("`{}` is not host:port", raw.endpoint),
            ));
        }
        let mtu = raw.mtu.unwrap_or(DEFAULT_MTU);
        if !(576..=9000).contains(&mtu) {
            return Err(err("mtu", format!("{mtu} is outside 576..=9000")));
        }
        let max_flows = raw.max_flows.unwrap_or(MAX_FLOWS);
        if !(1..=MAX_FLOWS).contains(&max_flows) {
            return Err(err(
                "max_flows",
                format!("{max_flows} is outside 1..={MAX_FLOWS} (one local port per flow)"),
            ));
        }
        Ok(Self {
            private_key: decode_key("private_key", &raw.private_key)?,
            address,
            public_key: decode_key("public_key", &raw.public_key)?,
            endpoint: raw.endpoint,
            allowed_ips,
            preshared_key: raw
                .preshared_key
                .filter(|k| !k.is_empty())
                .map(|k| decode_key("preshared_key", &k))
                .transpose()?,
            persistent_keepalive: (raw.persistent_keepalive > 0)
                .then_some(raw.persistent_keepalive),
            mtu,
            dns,
            max_flows,
        })
    }

    /// Whether `ip` may be sent into the tunnel.
    pub fn allows(&self, ip: IpAddr) -> bool {
        self.allowed_ips.iter().any(|net| net.contains(&ip))
    }

    /// The interface address used as the source towards `ip` (same family).
    pub fn source_for(&self, ip: IpAddr) -> Option<IpAddr> {
        self.address
            .iter()
            .map(IpNet::addr)
            .find(|a| a.is_ipv4() == ip.is_ipv4())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const KEY: &str = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";

    fn minimal() -> serde_json::Value {
        json!({"private_key": KEY, "address": "10.66.0.2/32", "public_key": KEY,
               "endpoint": "vpn.example:51820"})
    }

    #[test]
    fn defaults_fill_the_rest() {
        let s = WireguardSettings::from_value(&minimal()).expect("valid");
        assert_eq!(s.mtu, DEFAULT_MTU);
        assert_eq!(s.max_flows, MAX_FLOWS);
        assert_eq!(s.persistent_keepalive, None);
        assert!(s.allows("192.0.2.1".parse().expect("ip")));
        assert!(s.allows("2001:db8::1".parse().expect("ip")));
        assert_eq!(
            s.source_for("192.0.2.1".parse().expect("ip")),
            Some("10.66.0.2".parse().expect("ip"))
        );
        assert_eq!(s.source_for("2001:db8::1".parse().expect("ip")), None);
    }

    #[test]
    fn every_key_is_read() {
        let mut v = minimal();
        v["allowed_ips"] = json!(["10.66.0.0/24"]);
        v["preshared_key"] = json!(KEY);
        v["persistent_keepalive"] = json!(25);
        v["mtu"] = json!(1280);
        v["dns"] = json!(["10.66.0.1"]);
        v["max_flows"] = json!(64);
        v["address"] = json!(["10.66.0.2", "fd00::2/128"]);
        let s = WireguardSettings::from_value(&v).expect("valid");
        assert!(!s.allows("192.0.2.1".parse().expect("ip")));
        assert!(s.allows("10.66.0.9".parse().expect("ip")));
        assert_eq!(s.persistent_keepalive, Some(25));
        assert_eq!(s.mtu, 1280);
        assert_eq!(s.dns.len(), 1);
        assert!(s.preshared_key.is_some());
        assert_eq!(s.address.len(), 2);
        assert_eq!(s.max_flows, 64);
    }

    #[test]
    fn bad_values_name_their_key() {
        let cases = [
            ("private_key", json!("c2hvcnQ=")),
            ("public_key", json!("%%%")),
            ("endpoint", json!("no-port")),
            ("address", json!("10.0.0.300")),
            ("mtu", json!(100)),
            ("max_flows", json!(0)),
            ("max_flows", json!(15_850)),
            ("dns", json!(["resolver.example"])),
        ];
        for (key, value) in cases {
            let mut v = minimal();
            v[key] = value;
            let e = WireguardSettings::from_value(&v).expect_err(key);
            assert_eq!(e.key, key, "{e}");
        }
        let mut v = minimal();
        v["peers"] = json!([]);
        assert!(
            WireguardSettings::from_value(&v).is_err(),
            "unknown keys are refused"
        );
    }
}
