//! Private Internet Access (kind C): token session, server list, a WireGuard key added per
//! connection, and port forwarding.
//!
//! Shapes (PIA's published "manual-connections" scripts, github.com/pia-foss/manual-connections):
//! - `GET /gtoken/generateToken` with HTTP basic auth → `{status: "OK", token}`; a token lives
//!   24 h.
//! - `GET https://serverlist.piaservers.net/vpninfo/servers/v6`: the first line is JSON
//!   `{groups: {wg: [{ports}], ovpnudp: [{ports}], ovpntcp: [{ports}]}, regions: [{id, name,
//!   country, port_forward, offline, servers: {wg: [{ip, cn}], ovpnudp: [...], ovpntcp:
//!   [...]}}]}`, followed by a signature. PIA publishes no load.
//! - `GET https://{cn}:1337/addKey?pt=TOKEN&pubkey=KEY` (PIA's own CA) → `{status: "OK",
//!   server_key, server_port, server_ip, server_vip, peer_ip, dns_servers}`.
//! - `GET https://{gateway}:19999/getSignature?token=TOKEN` → `{status, payload, signature}`,
//!   the payload being base64 JSON `{token, port, expires_at}`; `GET /bindPort?payload=…&
//!   signature=…` → `{status: "OK", message}`, repeated every 15 minutes.
//!
//! With `api_url` set, every call goes to that base (the tests' stand-in).

use super::http::{self, ApiError};
use super::select::{OpenvpnEndpoint, Server, WireguardEndpoint};
use base64::Engine;
use serde::Deserialize;
use std::net::IpAddr;
use std::time::Duration;
use switchyard_config::provider::{ProviderKind, ProviderSettings};

/// Tokens are valid 24 h; a fresh one is fetched after this.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(23 * 3600);
/// PIA asks clients to call bindPort every 15 minutes.
pub const BIND_INTERVAL: Duration = Duration::from_secs(15 * 60);
const SERVER_LIST: &str = "https://serverlist.piaservers.net";

/// Where each call goes: PIA's hosts, or all to `api_url`.
pub struct Endpoints {
    pub token: String,
    pub list: String,
    /// `None`: the selected server itself (`https://{cn}:1337`).
    pub server: Option<String>,
}

impl Endpoints {
    pub fn of(o: &ProviderSettings) -> Self {
        if o.api_url == ProviderKind::PrivateInternetAccess.default_api_url() {
            Endpoints {
                token: o.api_url.clone(),
                list: SERVER_LIST.to_owned(),
                server: None,
            }
        } else {
            Endpoints {
                token: o.api_url.clone(),
                list: o.api_url.clone(),
                server: Some(o.api_url.clone()),
            }
        }
    }
}

#[derive(Deserialize)]
struct Status {
    status: String,
    #[serde(default)]
    message: Option<String>,
}

fn check_status(url: &str, bytes: &[u8]) -> Result<(), ApiError> {
    let s: Status = http::parse(url, bytes)?;
    if s.status != "OK" {
        return Err(ApiError::Refused(format!(
            "{}: status {}{}",
            http::shown(url),
            s.status,
            s.message.map(|m| format!(": {m}")).unwrap_or_default()
        )));
    }
    Ok(())
}

pub async fn token(
    client: &reqwest::Client,
    base: &str,
    username: &str,
    password: &str,
) -> Result<String, ApiError> {
    #[derive(Deserialize)]
    struct Token {
        token: String,
    }
    let url = format!("{base}/gtoken/generateToken");
    let body = http::body(&url, client.get(&url).basic_auth(username, Some(password))).await?;
    check_status(&url, &body)?;
    Ok(http::parse::<Token>(&url, &body)?.token)
}

#[derive(Deserialize)]
struct RawList {
    #[serde(default)]
    groups: std::collections::HashMap<String, Vec<RawGroup>>,
    regions: Vec<RawRegion>,
}

#[derive(Deserialize)]
struct RawGroup {
    #[serde(default)]
    ports: Vec<u16>,
}

#[derive(Deserialize)]
struct RawRegion {
    id: String,
    name: String,
    country: String,
    #[serde(default)]
    port_forward: bool,
    #[serde(default)]
    offline: bool,
    servers: std::collections::HashMap<String, Vec<RawHost>>,
}

#[derive(Deserialize)]
struct RawHost {
    ip: String,
    cn: String,
}

/// A server as PIA lists it, with the common-name its TLS certificate carries.
pub fn parse(url: &str, body: &[u8]) -> Result<Vec<Server>, ApiError> {
    // The JSON is the first line; a signature follows it.
    let first = body.split(|b| *b == b'\n').next().unwrap_or_default();
    let raw: RawList = http::parse(url, first)?;
    let port = |group: &str| {
        raw.groups
            .get(group)
            .and_then(|g| g.first())
            .and_then(|g| g.ports.first().copied())
    };
    let mut servers = Vec::new();
    for region in &raw.regions {
        let first_host = |group: &str| {
            region
                .servers
                .get(group)
                .and_then(|h| h.first())
                .and_then(|h| Some((h.ip.parse::<IpAddr>().ok()?, h.cn.clone())))
        };
        let wg = first_host("wg");
        let udp = first_host("ovpnudp");
        let tcp = first_host("ovpntcp");
        let Some((_, cn)) = wg.clone().or(udp.clone()).or(tcp.clone()) else {
            continue;
        };
        let openvpn_ip = udp.as_ref().or(tcp.as_ref()).map(|(ip, _)| *ip);
        servers.push(Server {
            // The region name is the closest PIA has to a city ("US Seattle").
            city: region.name.clone(),
            online: !region.offline,
            port_forward: region.port_forward,
            hostname: cn,
            wireguard: wg.map(|(ip, _)| WireguardEndpoint {
                ip,
                port: port("wg").unwrap_or(1337),
                public_key: None,
                dns: None,
            }),
            openvpn: openvpn_ip.map(|ip| OpenvpnEndpoint {
                ip,
                udp_port: udp.as_ref().and(port("ovpnudp")),
                tcp_port: tcp.as_ref().and(port("ovpntcp")),
            }),
            ..Server::new(&region.id, &region.country.to_ascii_uppercase())
        });
    }
    Ok(servers)
}

pub async fn fetch(client: &reqwest::Client, base: &str) -> Result<Vec<Server>, ApiError> {
    let url = format!("{base}/vpninfo/servers/v6");
    let body = http::body(&url, client.get(&url)).await?;
    parse(&url, &body)
}

/// The answer of addKey.
#[derive(Debug, Clone, Deserialize)]
pub struct AddedKey {
    pub server_key: String,
    pub server_port: u16,
    pub server_ip: String,
    #[serde(default)]
    pub server_vip: Option<String>,
    pub peer_ip: String,
    #[serde(default)]
    pub dns_servers: Vec<String>,
}

/// A client for the selected server's own API: PIA's CA, the certificate's name resolved to
/// the listed address.
pub fn server_client(
    cn: &str,
    ip: IpAddr,
    port: u16,
    ca: Option<&str>,
) -> Result<reqwest::Client, ApiError> {
    switchyard_service::tls::use_ring_provider();
    let mut b = reqwest::Client::builder().resolve(cn, std::net::SocketAddr::new(ip, port));
    if let Some(ca) = ca {
        let pem = super::resolve::pem_text(ca)
            .map_err(|e| ApiError::Refused(format!("server_ca: {e}")))?;
        let cert = reqwest::Certificate::from_pem(pem.as_bytes())
            .map_err(|e| ApiError::Refused(format!("server_ca: {e}")))?;
        b = b.add_root_certificate(cert);
    }
    b.build()
        .map_err(|e| ApiError::Refused(format!("building the PIA server client: {e}")))
}

pub async fn add_key(
    client: &reqwest::Client,
    base: &str,
    token: &str,
    public_key: &str,
) -> Result<AddedKey, ApiError> {
    let url = format!("{base}/addKey");
    let body = http::body(
        &url,
        client
            .get(&url)
            .query(&[("pt", token), ("pubkey", public_key)]),
    )
    .await?;
    check_status(&url, &body)?;
    let added: AddedKey = http::parse(&url, &body)?;
    if added.peer_ip.parse::<IpAddr>().is_err() {
        return Err(ApiError::Garbage {
            url: http::shown(&url),
            reason: format!("peer_ip `{}` is not an address", added.peer_ip),
        });
    }
    Ok(added)
}

/// A forwarded port and what renews it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    pub port: u16,
    pub payload: String,
    pub signature: String,
}

pub async fn get_signature(
    client: &reqwest::Client,
    base: &str,
    token: &str,
) -> Result<Forward, ApiError> {
    #[derive(Deserialize)]
    struct Signature {
        payload: String,
        signature: String,
    }
    #[derive(Deserialize)]
    struct Payload {
        port: u16,
    }
    let url = format!("{base}/getSignature");
    let body = http::body(&url, client.get(&url).query(&[("token", token)])).await?;
    check_status(&url, &body)?;
    let s: Signature = http::parse(&url, &body)?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(s.payload.trim())
        .map_err(|e| ApiError::Garbage {
            url: http::shown(&url),
            reason: format!("payload is not base64: {e}"),
        })?;
    let payload: Payload = http::parse(&url, &decoded)?;
    Ok(Forward {
        port: payload.port,
        payload: s.payload,
        signature: s.signature,
    })
}

pub async fn bind_port(client: &reqwest::Client, base: &str, f: &Forward) -> Result<(), ApiError> {
    let url = format!("{base}/bindPort");
    let body = http::body(
        &url,
        client
            .get(&url)
            .query(&[("payload", &f.payload), ("signature", &f.signature)]),
    )
    .await?;
    check_status(&url, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_first_line_of_the_v6_list() {
        let body = b"{\"groups\": {\"wg\": [{\"name\": \"wg\", \"ports\": [1337]}], \"ovpnudp\": [{\"name\": \"openvpn_udp\", \"ports\": [8080, 53]}]},\
            \"regions\": [{\"id\": \"us_seattle\", \"name\": \"US Seattle\", \"country\": \"US\", \"port_forward\": false, \"geo\": false, \"offline\": false,\
              \"servers\": {\"wg\": [{\"ip\": \"192.0.2.1\", \"cn\": \"seattle402\"}], \"ovpnudp\": [{\"ip\": \"192.0.2.2\", \"cn\": \"seattle403\"}]}},\
              {\"id\": \"nowhere\", \"name\": \"X\", \"country\": \"US\", \"servers\": {}}]}\nSIGNATURE-BYTES\n";
        let l = parse("u", body).expect("parsed");
        assert_eq!(l.len(), 1);
        let s = &l[0];
        assert_eq!(
            (s.id.as_str(), s.hostname.as_str(), s.city.as_str()),
            ("us_seattle", "seattle402", "US Seattle")
        );
        assert_eq!(s.wireguard.as_ref().map(|w| w.port), Some(1337));
        assert_eq!(
            s.openvpn.as_ref().map(|o| (o.ip.to_string(), o.udp_port)),
            Some(("192.0.2.2".into(), Some(8080)))
        );
        assert!(parse("u", b"SIGNATURE\n{}").is_err());
    }
}
