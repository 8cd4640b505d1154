//! NordVPN (kind A): the public server list, no account call.
//!
//! Shape (NordVPN's public API as its apps and nordvpn.com/servers/tools use it):
//! `GET /v1/servers/recommendations?limit=N` answers an array of servers
//! `{id, name, hostname, station, load, status, locations[].country{code, city{name}},
//! groups[].identifier, technologies[]{identifier, metadata[]{name, value}}}`; the WireGuard
//! (NordLynx) technology `wireguard_udp` carries the server's key as metadata `public_key`.
//! NordLynx clients use the interface address 10.5.0.2 and port 51820; the account's private
//! key comes from the options.

use super::http::{self, ApiError};
use super::select::{OpenvpnEndpoint, Server, WireguardEndpoint};
use serde::Deserialize;
use switchyard_config::provider::NordFeature;

/// The interface address every NordLynx client uses.
pub const NORDLYNX_ADDRESS: &str = "10.5.0.2/32";
pub const NORDLYNX_PORT: u16 = 51820;
/// NordVPN's resolvers, reached through the tunnel.
pub const DNS: [&str; 2] = ["103.86.96.100", "103.86.99.100"];

#[derive(Deserialize)]
struct RawServer {
    id: serde_json::Value,
    #[serde(default)]
    hostname: String,
    station: String,
    #[serde(default)]
    load: Option<u32>,
    #[serde(default)]
    status: String,
    #[serde(default)]
    locations: Vec<RawLocation>,
    #[serde(default)]
    groups: Vec<RawIdentified>,
    #[serde(default)]
    technologies: Vec<RawTechnology>,
}

#[derive(Deserialize)]
struct RawLocation {
    country: RawCountry,
}

#[derive(Deserialize)]
struct RawCountry {
    code: String,
    #[serde(default)]
    city: Option<RawCity>,
}

#[derive(Deserialize)]
struct RawCity {
    name: String,
}

#[derive(Deserialize)]
struct RawIdentified {
    identifier: String,
}

#[derive(Deserialize)]
struct RawTechnology {
    identifier: String,
    #[serde(default)]
    metadata: Vec<RawMetadata>,
}

#[derive(Deserialize)]
struct RawMetadata {
    name: String,
    value: serde_json::Value,
}

fn feature(group: &str) -> Option<NordFeature> {
    Some(match group {
        "legacy_standard" => NordFeature::Standard,
        "legacy_p2p" => NordFeature::P2p,
        "legacy_double_vpn" => NordFeature::DoubleVpn,
        "legacy_onion_over_vpn" => NordFeature::OnionOverVpn,
        "legacy_dedicated_ip" => NordFeature::DedicatedIp,
        _ => return None,
    })
}

/// Turns the published list into servers (entries without a usable address are skipped).
pub fn parse(url: &str, body: &[u8]) -> Result<Vec<Server>, ApiError> {
    let raw: Vec<RawServer> = http::parse(url, body)?;
    Ok(raw
        .into_iter()
        .filter_map(|r| {
            let ip = r.station.parse().ok()?;
            let location = r.locations.first()?;
            let id = match &r.id {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let tech = |name: &str| r.technologies.iter().find(|t| t.identifier == name);
            let wireguard = tech("wireguard_udp").map(|t| WireguardEndpoint {
                ip,
                port: NORDLYNX_PORT,
                public_key: t
                    .metadata
                    .iter()
                    .find(|m| m.name == "public_key")
                    .and_then(|m| m.value.as_str())
                    .map(str::to_owned),
                dns: None,
            });
            let (udp, tcp) = (tech("openvpn_udp"), tech("openvpn_tcp"));
            let openvpn = (udp.is_some() || tcp.is_some()).then_some(OpenvpnEndpoint {
                ip,
                udp_port: udp.map(|_| 1194),
                tcp_port: tcp.map(|_| 443),
            });
            Some(Server {
                hostname: if r.hostname.is_empty() {
                    id.clone()
                } else {
                    r.hostname.clone()
                },
                id,
                country: location.country.code.to_ascii_uppercase(),
                city: location
                    .country
                    .city
                    .as_ref()
                    .map(|c| c.name.clone())
                    .unwrap_or_default(),
                load: r.load,
                online: r.status.is_empty() || r.status == "online",
                features: r
                    .groups
                    .iter()
                    .filter_map(|g| feature(&g.identifier))
                    .collect(),
                tier: 0,
                secure_core: false,
                port_forward: false,
                wireguard,
                openvpn,
            })
        })
        .collect())
}

pub async fn fetch(client: &reqwest::Client, api: &str) -> Result<Vec<Server>, ApiError> {
    let url = format!("{api}/v1/servers/recommendations?limit=16384");
    let body = http::body(&url, client.get(&url)).await?;
    parse(&url, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_published_shape() {
        let body = br#"[{"id": 929912, "name": "Sweden #1", "station": "192.0.2.7", "hostname": "se1.nordvpn.com",
            "load": 17, "status": "online",
            "locations": [{"country": {"id": 208, "name": "Sweden", "code": "SE", "city": {"id": 1, "name": "Stockholm"}}}],
            "groups": [{"id": 11, "identifier": "legacy_standard"}, {"id": 15, "identifier": "legacy_p2p"}, {"identifier": "europe"}],
            "technologies": [{"id": 35, "identifier": "wireguard_udp", "metadata": [{"name": "public_key", "value": "KEY="}]},
                             {"id": 3, "identifier": "openvpn_udp", "metadata": []}]},
            {"id": 1, "station": "not an ip", "locations": []}]"#;
        let l = parse("u", body).expect("parsed");
        assert_eq!(l.len(), 1);
        let s = &l[0];
        assert_eq!(
            (s.id.as_str(), s.country.as_str(), s.city.as_str()),
            ("929912", "SE", "Stockholm")
        );
        assert_eq!(s.load, Some(17));
        assert_eq!(s.features, vec![NordFeature::Standard, NordFeature::P2p]);
        assert_eq!(
            s.wireguard.as_ref().and_then(|w| w.public_key.as_deref()),
            Some("KEY=")
        );
        assert_eq!(
            s.openvpn.as_ref().map(|o| (o.udp_port, o.tcp_port)),
            Some((Some(1194), None))
        );
    }

    #[test]
    fn garbage_is_a_clear_error() {
        let e = parse("http://x/v1/servers/recommendations?limit=1", b"<html>oops")
            .expect_err("garbage");
        assert!(
            matches!(&e, ApiError::Garbage { url, .. } if url == "http://x/v1/servers/recommendations"),
            "{e}"
        );
    }
}
