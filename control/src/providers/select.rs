//! Provider servers in one shape, and server selection: plain code, no I/O. Each provider's
//! client turns its published list into [`Server`]s; [`select`] applies a backend's options
//! (country, city, protocol, features, tier, Secure Core, load limit, server id, auto select).

use std::net::IpAddr;
use switchyard_config::provider::{NordFeature, ProviderSettings, VpnProtocol};

/// One VPN server as a provider lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Server {
    /// The provider's identifier (NordVPN id, Mullvad/PIA host name, ProtonVPN logical name).
    pub id: String,
    pub hostname: String,
    /// Upper-case ISO 3166-1 alpha-2 code.
    pub country: String,
    pub city: String,
    /// Percent; `None` when the provider publishes no load.
    pub load: Option<u32>,
    pub online: bool,
    /// NordVPN groups the server belongs to.
    pub features: Vec<NordFeature>,
    /// ProtonVPN tier number (0 free … 3 visionary).
    pub tier: u8,
    pub secure_core: bool,
    /// PIA: the region offers port forwarding.
    pub port_forward: bool,
    pub wireguard: Option<WireguardEndpoint>,
    pub openvpn: Option<OpenvpnEndpoint>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireguardEndpoint {
    pub ip: IpAddr,
    pub port: u16,
    /// The server's key when the list carries it (NordVPN, Mullvad); PIA hands it out when a
    /// key is added.
    pub public_key: Option<String>,
    /// The resolver inside the tunnel when the list names one (Mullvad's gateway).
    pub dns: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenvpnEndpoint {
    pub ip: IpAddr,
    pub udp_port: Option<u16>,
    pub tcp_port: Option<u16>,
}

impl Server {
    /// A blank server for tests and builders.
    pub fn new(id: &str, country: &str) -> Self {
        Server {
            id: id.to_owned(),
            hostname: id.to_owned(),
            country: country.to_owned(),
            city: String::new(),
            load: None,
            online: true,
            features: Vec::new(),
            tier: 0,
            secure_core: false,
            port_forward: false,
            wireguard: None,
            openvpn: None,
        }
    }

    fn speaks(&self, protocol: VpnProtocol) -> bool {
        match protocol {
            VpnProtocol::Wireguard => self.wireguard.is_some(),
            VpnProtocol::Openvpn => self.openvpn.is_some(),
        }
    }
}

/// Why no server fits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error("the server list is empty")]
    EmptyList,
    #[error("server {0} is not in the provider's list")]
    UnknownServer(String),
    #[error("server {id} does not fit the options: {why}")]
    ServerDoesNotFit { id: String, why: String },
    #[error("no {what} server fits ({candidates} servers in the list)")]
    NoMatch { what: String, candidates: usize },
}

/// Why `s` does not fit `o`, or None when it does.
fn misfit(s: &Server, o: &ProviderSettings) -> Option<String> {
    if !s.online {
        return Some("offline".into());
    }
    if !s.country.eq_ignore_ascii_case(&o.country) {
        return Some(format!("in {} not {}", s.country, o.country));
    }
    if !o.city.is_empty() && !s.city.eq_ignore_ascii_case(&o.city) {
        return Some(format!("in {} not {}", s.city, o.city));
    }
    if !s.speaks(o.protocol) {
        return Some(format!("no {}", o.protocol.name()));
    }
    if o.max_load > 0 && s.load.is_some_and(|l| l > o.max_load) {
        return Some(format!(
            "load {}% above {}%",
            s.load.unwrap_or(0),
            o.max_load
        ));
    }
    if let Some(f) = o.features.iter().find(|f| !s.features.contains(f)) {
        return Some(format!("not a {} server", f.name()));
    }
    if s.tier > o.tier.number() {
        return Some(format!(
            "tier {} above the plan's {}",
            s.tier,
            o.tier.number()
        ));
    }
    if s.secure_core != o.secure_core {
        return Some(if o.secure_core {
            "not a Secure Core server".into()
        } else {
            "a Secure Core server (secure_core is false)".into()
        });
    }
    if o.port_forwarding && !s.port_forward {
        return Some("no port forwarding".into());
    }
    None
}

fn describe(o: &ProviderSettings) -> String {
    let mut what = vec![o.protocol.name().to_owned(), o.country.clone()];
    if !o.city.is_empty() {
        what.push(o.city.clone());
    }
    what.extend(o.features.iter().map(|f| f.name().to_owned()));
    if o.max_load > 0 {
        what.push(format!("load <= {}%", o.max_load));
    }
    if o.secure_core {
        what.push("secure core".into());
    }
    if o.port_forwarding {
        what.push("port forwarding".into());
    }
    what.join(" ")
}

/// Picks the server for a backend: `server_id` names one (which must fit); otherwise the
/// fitting server with the lowest load when `auto_select` (ties and unknown loads keep the
/// list's order), else the first fitting one in the list's order. `keep` (the server in use)
/// is kept while it still fits, so a list refresh does not move a working tunnel.
pub fn select<'a>(
    servers: &'a [Server],
    o: &ProviderSettings,
    keep: Option<&str>,
) -> Result<&'a Server, SelectError> {
    if servers.is_empty() {
        return Err(SelectError::EmptyList);
    }
    if let Some(id) = &o.server_id {
        let s = servers
            .iter()
            .find(|s| s.id.eq_ignore_ascii_case(id) || s.hostname.eq_ignore_ascii_case(id))
            .ok_or_else(|| SelectError::UnknownServer(id.clone()))?;
        return match misfit(s, o) {
            None => Ok(s),
            Some(why) => Err(SelectError::ServerDoesNotFit {
                id: id.clone(),
                why,
            }),
        };
    }
    let mut fitting = servers.iter().filter(|s| misfit(s, o).is_none());
    if let Some(kept) = keep.and_then(|k| servers.iter().find(|s| s.id == k)) {
        if misfit(kept, o).is_none() {
            return Ok(kept);
        }
    }
    let chosen = if o.auto_select {
        // min_by_key keeps the first of equal keys: the list's order breaks ties.
        fitting.min_by_key(|s| s.load.unwrap_or(u32::MAX))
    } else {
        fitting.next()
    };
    chosen.ok_or_else(|| SelectError::NoMatch {
        what: describe(o),
        candidates: servers.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use switchyard_config::provider::ProviderKind;

    const KEY: &str = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";

    fn wg() -> Option<WireguardEndpoint> {
        Some(WireguardEndpoint {
            ip: "192.0.2.1".parse().expect("ip"),
            port: 51820,
            public_key: Some(KEY.into()),
            dns: None,
        })
    }

    fn ovpn() -> Option<OpenvpnEndpoint> {
        Some(OpenvpnEndpoint {
            ip: "192.0.2.2".parse().expect("ip"),
            udp_port: Some(1194),
            tcp_port: Some(443),
        })
    }

    fn server(id: &str, country: &str, city: &str, load: u32) -> Server {
        Server {
            city: city.into(),
            load: Some(load),
            wireguard: wg(),
            openvpn: ovpn(),
            features: vec![NordFeature::Standard],
            ..Server::new(id, country)
        }
    }

    fn nord(extra: serde_json::Value) -> ProviderSettings {
        let mut v = json!({"country": "SE", "private_key": KEY});
        if let (Some(m), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            m.extend(e.clone());
        }
        ProviderSettings::from_value(ProviderKind::Nordvpn, &v).expect("valid options")
    }

    fn list() -> Vec<Server> {
        let mut p2p = server("4", "SE", "Gothenburg", 5);
        p2p.features.push(NordFeature::P2p);
        let mut offline = server("5", "SE", "Stockholm", 1);
        offline.online = false;
        vec![
            server("1", "SE", "Stockholm", 40),
            server("2", "SE", "Stockholm", 20),
            server("3", "DE", "Berlin", 2),
            p2p,
            offline,
            server("6", "SE", "Malmo", 20),
        ]
    }

    #[test]
    fn auto_select_takes_the_lowest_load_in_the_country() {
        let l = list();
        assert_eq!(select(&l, &nord(json!({})), None).expect("fits").id, "4");
        let city = nord(json!({"city": "stockholm"}));
        assert_eq!(select(&l, &city, None).expect("fits").id, "2");
    }

    #[test]
    fn without_auto_select_the_list_order_rules() {
        let l = list();
        let o = nord(json!({"auto_select": false}));
        assert_eq!(select(&l, &o, None).expect("fits").id, "1");
    }

    #[test]
    fn features_and_max_load_filter() {
        let l = list();
        let p2p = nord(json!({"features": ["p2p"]}));
        assert_eq!(select(&l, &p2p, None).expect("fits").id, "4");
        let o = nord(json!({"max_load": 10, "city": "Stockholm"}));
        let e = select(&l, &o, None).expect_err("none fits");
        assert!(
            matches!(&e, SelectError::NoMatch { what, .. } if what.contains("load <= 10%")),
            "{e}"
        );
        let double = nord(json!({"features": ["double_vpn"]}));
        assert!(select(&l, &double, None).is_err());
    }

    #[test]
    fn server_id_names_one_server_which_must_fit() {
        let l = list();
        assert_eq!(
            select(&l, &nord(json!({"server_id": "6"})), None)
                .expect("fits")
                .id,
            "6"
        );
        assert_eq!(
            select(&l, &nord(json!({"server_id": "3"})), None),
            Err(SelectError::ServerDoesNotFit {
                id: "3".into(),
                why: "in DE not SE".into()
            })
        );
        assert_eq!(
            select(&l, &nord(json!({"server_id": "99"})), None),
            Err(SelectError::UnknownServer("99".into()))
        );
        assert_eq!(
            select(&[], &nord(json!({})), None),
            Err(SelectError::EmptyList)
        );
    }

    #[test]
    fn the_server_in_use_is_kept_while_it_fits() {
        let l = list();
        assert_eq!(
            select(&l, &nord(json!({})), Some("1")).expect("fits").id,
            "1"
        );
        // Server 3 is in another country: the lowest-load fitting one replaces it.
        assert_eq!(
            select(&l, &nord(json!({})), Some("3")).expect("fits").id,
            "4"
        );
    }

    #[test]
    fn protonvpn_tiers_and_secure_core() {
        let mut free = server("CH-FREE#1", "CH", "Zurich", 70);
        free.wireguard = None;
        let mut plus = server("CH#2", "CH", "Zurich", 10);
        plus.tier = 2;
        let mut sc = server("IS-CH#1", "CH", "Zurich", 5);
        sc.tier = 2;
        sc.secure_core = true;
        let l = vec![free, plus, sc];
        let proton = |extra: serde_json::Value| {
            let mut v = json!({"country": "CH", "username": "u", "password": "p", "ca": "x"});
            if let (Some(m), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                m.extend(e.clone());
            }
            ProviderSettings::from_value(ProviderKind::Protonvpn, &v).expect("valid")
        };
        assert_eq!(
            select(&l, &proton(json!({})), None).expect("fits").id,
            "CH-FREE#1"
        );
        assert_eq!(
            select(&l, &proton(json!({"tier": "plus"})), None)
                .expect("fits")
                .id,
            "CH#2"
        );
        assert_eq!(
            select(
                &l,
                &proton(json!({"tier": "visionary", "secure_core": true})),
                None
            )
            .expect("fits")
            .id,
            "IS-CH#1"
        );
        assert!(select(&l, &proton(json!({"secure_core": true})), None).is_err());
    }

    #[test]
    fn protocol_and_port_forwarding_filter() {
        let mut no_wg = server("a", "US", "", 1);
        no_wg.wireguard = None;
        let mut pf = server("b", "US", "", 50);
        pf.port_forward = true;
        let l = vec![no_wg, pf, server("c", "US", "", 10)];
        let pia = |extra: serde_json::Value| {
            let mut v = json!({"country": "US", "username": "u", "password": "p"});
            if let (Some(m), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                m.extend(e.clone());
            }
            ProviderSettings::from_value(ProviderKind::PrivateInternetAccess, &v).expect("valid")
        };
        assert_eq!(select(&l, &pia(json!({})), None).expect("fits").id, "c");
        assert_eq!(
            select(&l, &pia(json!({"port_forwarding": true})), None)
                .expect("fits")
                .id,
            "b"
        );
    }
}
