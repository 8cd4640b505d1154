//! Mullvad (kind B): relay list, and a WireGuard key registered with the account.
//!
//! Shapes (Mullvad's API as the Mullvad app and its `mullvad-wg.sh` use it):
//! - `GET /app/v1/relays`: `{locations: {"se-got": {country, city, …}}, wireguard:
//!   {ipv4_gateway, relays: [{hostname, location, active, ipv4_addr_in, public_key, …}]},
//!   openvpn: {ports: [{port, protocol}], relays: [{hostname, location, active, ipv4_addr_in}]}}`;
//!   the location key starts with the country code. Mullvad publishes no load.
//! - `POST /auth/v1/token {"account_number"}` → `{access_token, expiry}`, then
//!   `POST /accounts/v1/devices {"pubkey", "hijack_dns": false}` with the bearer token →
//!   `{id, name, pubkey, ipv4_address: "10.x.y.z/32", ipv6_address}`: the assigned address.

use super::http::{self, ApiError};
use super::select::{OpenvpnEndpoint, Server, WireguardEndpoint};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

pub const WIREGUARD_PORT: u16 = 51820;

#[derive(Deserialize)]
struct RawList {
    locations: HashMap<String, RawLocation>,
    #[serde(default)]
    wireguard: Option<RawWireguard>,
    #[serde(default)]
    openvpn: Option<RawOpenvpn>,
}

#[derive(Deserialize)]
struct RawLocation {
    #[serde(default)]
    city: String,
}

#[derive(Deserialize)]
struct RawWireguard {
    #[serde(default)]
    ipv4_gateway: Option<String>,
    relays: Vec<RawRelay>,
}

#[derive(Deserialize)]
struct RawOpenvpn {
    #[serde(default)]
    ports: Vec<RawPort>,
    relays: Vec<RawRelay>,
}

#[derive(Deserialize)]
struct RawPort {
    port: u16,
    protocol: String,
}

#[derive(Deserialize)]
struct RawRelay {
    hostname: String,
    location: String,
    #[serde(default = "yes")]
    active: bool,
    ipv4_addr_in: String,
    #[serde(default)]
    public_key: Option<String>,
}

fn yes() -> bool {
    true
}

/// The relays; WireGuard relays carry the resolver inside the tunnel
/// (`wireguard.ipv4_gateway`).
pub struct RelayList {
    pub servers: Vec<Server>,
}

pub fn parse(url: &str, body: &[u8]) -> Result<RelayList, ApiError> {
    let raw: RawList = http::parse(url, body)?;
    let place = |location: &str| {
        let country = location
            .split('-')
            .next()
            .unwrap_or_default()
            .to_ascii_uppercase();
        let city = raw
            .locations
            .get(location)
            .map(|l| l.city.clone())
            .unwrap_or_default();
        (country, city)
    };
    // A relay's address and its server without endpoints.
    let relay = |r: &RawRelay| {
        let ip: std::net::IpAddr = r.ipv4_addr_in.parse().ok()?;
        let (country, city) = place(&r.location);
        Some((
            ip,
            Server {
                city,
                online: r.active,
                ..Server::new(&r.hostname, &country)
            },
        ))
    };
    let mut servers = Vec::new();
    if let Some(wg) = &raw.wireguard {
        for r in &wg.relays {
            let Some((ip, mut server)) = relay(r) else {
                continue;
            };
            server.wireguard = Some(WireguardEndpoint {
                ip,
                port: WIREGUARD_PORT,
                public_key: r.public_key.clone(),
                dns: wg.ipv4_gateway.clone(),
            });
            servers.push(server);
        }
    }
    if let Some(ovpn) = &raw.openvpn {
        let port = |proto: &str| {
            ovpn.ports
                .iter()
                .find(|p| p.protocol == proto)
                .map(|p| p.port)
        };
        for r in &ovpn.relays {
            let Some((ip, mut server)) = relay(r) else {
                continue;
            };
            server.openvpn = Some(OpenvpnEndpoint {
                ip,
                udp_port: port("udp"),
                tcp_port: port("tcp"),
            });
            servers.push(server);
        }
    }
    Ok(RelayList { servers })
}

pub async fn fetch(client: &reqwest::Client, api: &str) -> Result<RelayList, ApiError> {
    let url = format!("{api}/app/v1/relays");
    let body = http::body(&url, client.get(&url)).await?;
    parse(&url, &body)
}

#[derive(Deserialize)]
struct Token {
    access_token: String,
}

/// What Mullvad assigned to a registered key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    #[serde(default)]
    pub id: String,
    pub ipv4_address: String,
    #[serde(default)]
    pub ipv6_address: Option<String>,
}

/// Registers `public_key` as a device of `account` and returns the assigned addresses.
pub async fn register(
    client: &reqwest::Client,
    api: &str,
    account: &str,
    public_key: &str,
) -> Result<Device, ApiError> {
    let url = format!("{api}/auth/v1/token");
    let token: Token = http::json(
        &url,
        client
            .post(&url)
            .json(&serde_json::json!({"account_number": account})),
    )
    .await?;
    let url = format!("{api}/accounts/v1/devices");
    let device: Device = http::json(
        &url,
        client
            .post(&url)
            .bearer_auth(&token.access_token)
            .json(&serde_json::json!({"pubkey": public_key, "hijack_dns": false})),
    )
    .await?;
    if device.ipv4_address.parse::<ipnet::IpNet>().is_err() {
        return Err(ApiError::Garbage {
            url,
            reason: format!("assigned address `{}` is not a CIDR", device.ipv4_address),
        });
    }
    Ok(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_relay_list() {
        let body = br#"{"locations": {"se-got": {"country": "Sweden", "city": "Gothenburg", "latitude": 57.7, "longitude": 11.9}},
            "wireguard": {"port_ranges": [[53, 53]], "ipv4_gateway": "10.64.0.1",
                "relays": [{"hostname": "se-got-wg-001", "location": "se-got", "active": true, "owned": true,
                            "ipv4_addr_in": "192.0.2.9", "public_key": "PK=", "weight": 100}]},
            "openvpn": {"ports": [{"port": 1194, "protocol": "udp"}, {"port": 443, "protocol": "tcp"}],
                "relays": [{"hostname": "se-got-ovpn-001", "location": "se-got", "active": false, "ipv4_addr_in": "192.0.2.10"}]}}"#;
        let l = parse("u", body).expect("parsed");
        assert_eq!(l.servers.len(), 2);
        let wg = &l.servers[0];
        assert_eq!(
            (wg.country.as_str(), wg.city.as_str()),
            ("SE", "Gothenburg")
        );
        assert_eq!(
            wg.wireguard.as_ref().and_then(|w| w.public_key.as_deref()),
            Some("PK=")
        );
        assert_eq!(
            wg.wireguard.as_ref().and_then(|w| w.dns.as_deref()),
            Some("10.64.0.1")
        );
        assert!(!l.servers[1].online);
        assert_eq!(
            l.servers[1].openvpn.as_ref().and_then(|o| o.tcp_port),
            Some(443)
        );
        assert!(parse("u", b"{\"relays\": []}").is_err());
    }
}
