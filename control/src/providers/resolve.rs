//! What a provider backend becomes: the `wireguard` or `openvpn` settings object of the server
//! chosen, in the shape those backend types take in the configuration. Plain code.

use super::select::Server;
use serde_json::{json, Map, Value};
use switchyard_config::provider::{ProviderKind, ProviderSettings};

/// WireGuard settings for `server` with the local key and address.
pub fn wireguard(
    server_ip: std::net::IpAddr,
    port: u16,
    server_key: &str,
    private_key: &str,
    address: &[String],
    dns: &[String],
) -> Value {
    let endpoint = std::net::SocketAddr::new(server_ip, port).to_string();
    let mut v = json!({
        "private_key": private_key,
        "address": address,
        "public_key": server_key,
        "endpoint": endpoint,
        // Provider servers drop idle NAT mappings; keep the session alive.
        "persistent_keepalive": 25,
    });
    if !dns.is_empty() {
        v["dns"] = json!(dns);
    }
    v
}

/// The data ciphers each provider's OpenVPN servers offer (from their published configs).
fn data_ciphers(kind: ProviderKind) -> &'static [&'static str] {
    match kind {
        ProviderKind::Nordvpn => &["AES-256-GCM", "AES-256-CBC"],
        ProviderKind::Mullvad => &["AES-256-GCM", "CHACHA20-POLY1305"],
        ProviderKind::PrivateInternetAccess => &["AES-128-GCM", "AES-128-CBC"],
        ProviderKind::Protonvpn => &["AES-256-GCM", "AES-256-CBC"],
    }
}

/// OpenVPN settings (`remote, port, proto, ca, cert, key, tls_crypt, tls_auth, key_direction,
/// username, password, data_ciphers, extra`) for `server`; keys without a value are left out.
pub fn openvpn(server: &Server, o: &ProviderSettings) -> Option<Value> {
    let ep = server.openvpn.as_ref()?;
    let (proto, port) = match (ep.udp_port, ep.tcp_port) {
        (Some(p), _) => ("udp", p),
        (None, Some(p)) => ("tcp", p),
        (None, None) => return None,
    };
    let (username, password) = match o.kind {
        // Mullvad's OpenVPN servers take the account number and the fixed password "m".
        ProviderKind::Mullvad => (o.account_id.clone(), Some("m".to_owned())),
        _ => (o.username.clone(), o.password.clone()),
    };
    let mut m = Map::new();
    m.insert("remote".into(), json!(ep.ip.to_string()));
    m.insert("port".into(), json!(port));
    m.insert("proto".into(), json!(proto));
    let material = &o.openvpn;
    for (key, value) in [
        ("ca", &material.ca),
        ("cert", &material.cert),
        ("key", &material.key),
        ("tls_crypt", &material.tls_crypt),
        ("tls_auth", &material.tls_auth),
        ("username", &username),
        ("password", &password),
    ] {
        if let Some(v) = value {
            m.insert(key.into(), json!(v));
        }
    }
    if let Some(d) = material.key_direction {
        m.insert("key_direction".into(), json!(d));
    }
    m.insert("data_ciphers".into(), json!(data_ciphers(o.kind)));
    // The server's certificate must be a server certificate with the listed host name.
    let mut extra = vec!["remote-cert-tls server".to_owned()];
    if server.hostname.contains('.') {
        extra.push(format!("verify-x509-name {} name", server.hostname));
    }
    m.insert("extra".into(), json!(extra));
    Some(Value::Object(m))
}

/// PEM text given inline, or read from the path given.
pub fn pem_text(value: &str) -> Result<String, String> {
    if value.contains("-----BEGIN") {
        return Ok(value.to_owned());
    }
    std::fs::read_to_string(value).map_err(|e| format!("reading {value}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::select::OpenvpnEndpoint;

    #[test]
    fn openvpn_settings_have_the_backend_shape() {
        let o = ProviderSettings::from_value(
            ProviderKind::Protonvpn,
            &json!({"country": "CH", "username": "u+pmp", "password": "pw", "ca": "PEMTEXT", "tls_crypt": "/k"}),
        )
        .expect("valid");
        let mut s = Server::new("CH#1", "CH");
        s.hostname = "node-ch-01.protonvpn.net".into();
        s.openvpn = Some(OpenvpnEndpoint {
            ip: "192.0.2.8".parse().expect("ip"),
            udp_port: Some(1194),
            tcp_port: Some(443),
        });
        let v = openvpn(&s, &o).expect("settings");
        assert_eq!(v["remote"], "192.0.2.8");
        assert_eq!(v["port"], 1194);
        assert_eq!(v["proto"], "udp");
        assert_eq!(v["username"], "u+pmp");
        assert_eq!(v["ca"], "PEMTEXT");
        assert_eq!(v["tls_crypt"], "/k");
        assert!(v.get("tls_auth").is_none() && v.get("config_file").is_none());
        assert_eq!(v["data_ciphers"][0], "AES-256-GCM");
        assert_eq!(
            v["extra"][1],
            "verify-x509-name node-ch-01.protonvpn.net name"
        );
    }

    #[test]
    fn wireguard_settings_parse_as_a_wireguard_backend() {
        let key = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
        let v = wireguard(
            "192.0.2.1".parse().expect("ip"),
            51820,
            key,
            key,
            &["10.64.1.2/32".into()],
            &["10.64.0.1".into()],
        );
        let s = switchyard_config::wireguard::WireguardSettings::from_value(&v).expect("valid");
        assert_eq!(s.endpoint, "192.0.2.1:51820");
        assert_eq!(s.dns.len(), 1);
    }
}
