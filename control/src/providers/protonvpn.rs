//! ProtonVPN (kind D): OpenVPN with the account's OpenVPN credentials.
//!
//! Shape (ProtonVPN's API as its open-source Linux client reads it):
//! `GET /vpn/logicals` → `{Code: 1000, LogicalServers: [{ID, Name, EntryCountry, ExitCountry,
//! City, Tier, Features, Load, Status, Servers: [{EntryIP, ExitIP, Domain, Status}]}]}`.
//! `Features` is a bit set (1 Secure Core, 2 Tor, 4 P2P, 8 streaming, 16 IPv6); `Tier` is 0
//! free, 1 basic, 2 plus, 3 visionary; `Status` 1 is online. Secure Core servers enter in one
//! country and leave in `ExitCountry`, which is the country selected.

use super::http::{self, ApiError};
use super::select::{OpenvpnEndpoint, Server};
use serde::Deserialize;

pub const SECURE_CORE: u32 = 1;
/// The OpenVPN ports ProtonVPN's configuration files use first.
pub const UDP_PORT: u16 = 1194;
pub const TCP_PORT: u16 = 443;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawList {
    #[serde(default)]
    code: Option<u32>,
    logical_servers: Vec<RawLogical>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawLogical {
    name: String,
    exit_country: String,
    #[serde(default)]
    city: Option<String>,
    #[serde(default)]
    tier: u8,
    #[serde(default)]
    features: u32,
    #[serde(default)]
    load: Option<u32>,
    #[serde(default = "one")]
    status: u8,
    servers: Vec<RawPhysical>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawPhysical {
    #[serde(rename = "EntryIP")]
    entry_ip: String,
    #[serde(default)]
    domain: String,
    #[serde(default = "one")]
    status: u8,
}

fn one() -> u8 {
    1
}

pub fn parse(url: &str, body: &[u8]) -> Result<Vec<Server>, ApiError> {
    let raw: RawList = http::parse(url, body)?;
    if let Some(code) = raw.code.filter(|c| *c != 1000) {
        return Err(ApiError::Refused(format!(
            "{}: answer Code {code} (1000 is success)",
            http::shown(url)
        )));
    }
    Ok(raw
        .logical_servers
        .into_iter()
        .filter_map(|l| {
            let physical = l
                .servers
                .iter()
                .find(|p| p.status == 1 && p.entry_ip.parse::<std::net::IpAddr>().is_ok())?;
            let ip = physical.entry_ip.parse().ok()?;
            Some(Server {
                hostname: if physical.domain.is_empty() {
                    l.name.clone()
                } else {
                    physical.domain.clone()
                },
                city: l.city.clone().unwrap_or_default(),
                load: l.load,
                online: l.status == 1,
                tier: l.tier,
                secure_core: l.features & SECURE_CORE != 0,
                openvpn: Some(OpenvpnEndpoint {
                    ip,
                    udp_port: Some(UDP_PORT),
                    tcp_port: Some(TCP_PORT),
                }),
                ..Server::new(&l.name, &l.exit_country.to_ascii_uppercase())
            })
        })
        .collect())
}

pub async fn fetch(client: &reqwest::Client, api: &str) -> Result<Vec<Server>, ApiError> {
    let url = format!("{api}/vpn/logicals");
    // The API asks every client to name itself.
    let req = client
        .get(&url)
        .header("x-pm-appversion", "linux-vpn@4.0.0");
    let body = http::body(&url, req).await?;
    parse(&url, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_logicals() {
        let body = br#"{"Code": 1000, "LogicalServers": [
            {"ID": "a", "Name": "IS-CH#1", "EntryCountry": "IS", "ExitCountry": "CH", "City": "Zurich", "Tier": 2, "Features": 1, "Load": 30, "Status": 1,
             "Servers": [{"EntryIP": "192.0.2.3", "ExitIP": "192.0.2.4", "Domain": "is-ch-01.protonvpn.net", "Status": 1}]},
            {"ID": "b", "Name": "CH-FREE#1", "EntryCountry": "CH", "ExitCountry": "CH", "Tier": 0, "Features": 0, "Load": 80, "Status": 0,
             "Servers": [{"EntryIP": "192.0.2.5", "Status": 1}]}]}"#;
        let l = parse("u", body).expect("parsed");
        assert_eq!(l.len(), 2);
        assert!(l[0].secure_core && l[0].tier == 2 && l[0].country == "CH");
        assert_eq!(l[0].hostname, "is-ch-01.protonvpn.net");
        assert!(!l[1].online);
        let refused = parse("u", br#"{"Code": 2011, "LogicalServers": []}"#).expect_err("code");
        assert!(refused.to_string().contains("2011"), "{refused}");
    }
}
