//! Settings of provider backends: a backend whose `type` is a commercial VPN provider's
//! lowercase name (`nordvpn`, `mullvad`, `privateinternetaccess` or its alias `pia`,
//! `protonvpn`) with its options in a `config` object. The control plane resolves such a backend
//! to a `wireguard` or `openvpn` backend from the provider's server list; this module only types
//! and checks the options (the backend entry keeps the object as raw JSON for round-tripping).
//!
//! ```yaml
//! - name: nord
//!   type: nordvpn
//!   config:
//!     country: SE              # required, ISO 3166-1 alpha-2
//!     city: ""                 # default: any city
//!     protocol: wireguard      # wireguard | openvpn (protonvpn: openvpn only, the default)
//!     auto_select: true        # pick the lowest load (false: the provider's list order)
//!     max_load: 0              # nordvpn: 0 = no limit
//!     server_id: ""            # nordvpn: a server's id or hostname
//!     features: [p2p]          # nordvpn: standard, p2p, double_vpn, onion_over_vpn, dedicated_ip
//!     private_key: "base64"    # nordvpn + wireguard: the account's NordLynx key (secret)
//! ```
//!
//! Kind-specific keys: `nordvpn` `username`, `password` (the service credentials, required with
//! `protocol: openvpn`); `mullvad` `account_id` (16 digits, secret); `privateinternetaccess`
//! `username`, `password`, `port_forwarding`, `server_ca`; `protonvpn` `username`, `password`
//! (the OpenVPN credentials), `tier`, `secure_core`. With `protocol: openvpn`: `ca` (required),
//! `tls_auth`, `tls_crypt`, `key_direction`, `cert`, `key` (PEM text or a file path) are handed
//! to the generated OpenVPN settings. `api_url` (hidden; default the provider's own API) points
//! the control plane at another base URL, which is how the tests reach their stand-ins.

use serde::Deserialize;

/// The provider kinds (the spec's kinds A–D).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProviderKind {
    /// Kind A: public server list.
    Nordvpn,
    /// Kind B: account number; a WireGuard key is generated and registered.
    Mullvad,
    /// Kind C: user name and password; token session, port forwarding.
    PrivateInternetAccess,
    /// Kind D: OpenVPN only, tiers and Secure Core.
    Protonvpn,
}

impl ProviderKind {
    pub const ALL: [ProviderKind; 4] = [
        ProviderKind::Nordvpn,
        ProviderKind::Mullvad,
        ProviderKind::PrivateInternetAccess,
        ProviderKind::Protonvpn,
    ];

    /// The `type` value (lowercase provider name).
    pub const fn name(self) -> &'static str {
        match self {
            ProviderKind::Nordvpn => "nordvpn",
            ProviderKind::Mullvad => "mullvad",
            ProviderKind::PrivateInternetAccess => "privateinternetaccess",
            ProviderKind::Protonvpn => "protonvpn",
        }
    }

    /// Parses a name or the alias `pia`.
    pub fn from_name(name: &str) -> Option<ProviderKind> {
        match name {
            "pia" => Some(ProviderKind::PrivateInternetAccess),
            _ => ProviderKind::ALL.into_iter().find(|k| k.name() == name),
        }
    }

    /// The provider's own API base URL (used when `api_url` is not set).
    pub const fn default_api_url(self) -> &'static str {
        match self {
            ProviderKind::Nordvpn => "https://api.nordvpn.com",
            ProviderKind::Mullvad => "https://api.mullvad.net",
            // Token and server list live on two hosts; the client knows both (see
            // `pia::Endpoints`); this is the token host.
            ProviderKind::PrivateInternetAccess => "https://www.privateinternetaccess.com",
            ProviderKind::Protonvpn => "https://api.protonvpn.ch",
        }
    }

    fn protocols(self) -> &'static [VpnProtocol] {
        match self {
            ProviderKind::Protonvpn => &[VpnProtocol::Openvpn],
            _ => &[VpnProtocol::Wireguard, VpnProtocol::Openvpn],
        }
    }

    fn default_protocol(self) -> VpnProtocol {
        match self {
            ProviderKind::Protonvpn => VpnProtocol::Openvpn,
            _ => VpnProtocol::Wireguard,
        }
    }
}

impl std::fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The tunnel a provider backend resolves to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VpnProtocol {
    Wireguard,
    Openvpn,
}

impl VpnProtocol {
    pub const fn name(self) -> &'static str {
        match self {
            VpnProtocol::Wireguard => "wireguard",
            VpnProtocol::Openvpn => "openvpn",
        }
    }
}

/// NordVPN server groups selectable with `features`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NordFeature {
    Standard,
    P2p,
    DoubleVpn,
    OnionOverVpn,
    DedicatedIp,
}

impl NordFeature {
    pub const fn name(self) -> &'static str {
        match self {
            NordFeature::Standard => "standard",
            NordFeature::P2p => "p2p",
            NordFeature::DoubleVpn => "double_vpn",
            NordFeature::OnionOverVpn => "onion_over_vpn",
            NordFeature::DedicatedIp => "dedicated_ip",
        }
    }
}

/// ProtonVPN plan tiers; a tier may use the servers of every tier up to its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProtonTier {
    #[default]
    Free,
    Basic,
    Plus,
    Visionary,
}

impl ProtonTier {
    /// The number ProtonVPN's `/vpn/logicals` uses in `Tier`.
    pub const fn number(self) -> u8 {
        match self {
            ProtonTier::Free => 0,
            ProtonTier::Basic => 1,
            ProtonTier::Plus => 2,
            ProtonTier::Visionary => 3,
        }
    }
}

/// Material handed to the generated OpenVPN settings (PEM text or a file path each).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OpenvpnMaterial {
    pub ca: Option<String>,
    pub tls_auth: Option<String>,
    pub tls_crypt: Option<String>,
    pub key_direction: Option<u8>,
    pub cert: Option<String>,
    pub key: Option<String>,
}

/// The checked options of one provider backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderSettings {
    pub kind: ProviderKind,
    /// Upper-case ISO 3166-1 alpha-2 code.
    pub country: String,
    /// Empty = any city.
    pub city: String,
    pub protocol: VpnProtocol,
    pub auto_select: bool,
    /// The spec's common `enabled` option; the backend runs only when this and the entry's own
    /// `enabled` are both true.
    pub enabled: bool,
    /// Base URL of the provider's API, without a trailing `/`.
    pub api_url: String,
    /// NordVPN: highest acceptable load in percent; 0 = no limit.
    pub max_load: u32,
    /// NordVPN: the one server to use (id or hostname).
    pub server_id: Option<String>,
    pub features: Vec<NordFeature>,
    /// NordVPN WireGuard (NordLynx) private key.
    pub private_key: Option<String>,
    /// Mullvad account number.
    pub account_id: Option<String>,
    pub username: Option<String>,
    pub password: Option<String>,
    /// PIA: request a forwarded port and keep it bound while connected.
    pub port_forwarding: bool,
    /// PIA: CA certificate (PEM text or path) of the WireGuard servers' key API.
    pub server_ca: Option<String>,
    pub tier: ProtonTier,
    pub secure_core: bool,
    pub openvpn: OpenvpnMaterial,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    country: Option<String>,
    #[serde(default)]
    city: String,
    protocol: Option<VpnProtocol>,
    auto_select: Option<bool>,
    enabled: Option<bool>,
    api_url: Option<String>,
    max_load: Option<u32>,
    server_id: Option<String>,
    features: Option<Vec<NordFeature>>,
    private_key: Option<String>,
    account_id: Option<String>,
    username: Option<String>,
    password: Option<String>,
    port_forwarding: Option<bool>,
    server_ca: Option<String>,
    tier: Option<ProtonTier>,
    secure_core: Option<bool>,
    ca: Option<String>,
    tls_auth: Option<String>,
    tls_crypt: Option<String>,
    key_direction: Option<u8>,
    cert: Option<String>,
    key: Option<String>,
}

use crate::settings_error::err;
pub use crate::settings_error::SettingsError;

/// Which kinds each kind-specific key applies to.
fn applies(key: &str, kind: ProviderKind) -> bool {
    use ProviderKind::*;
    match key {
        "max_load" | "server_id" | "features" | "private_key" => kind == Nordvpn,
        "account_id" => kind == Mullvad,
        // NordVPN: its OpenVPN servers take the account's service credentials.
        "username" | "password" => matches!(kind, PrivateInternetAccess | Protonvpn | Nordvpn),
        "port_forwarding" | "server_ca" => kind == PrivateInternetAccess,
        "tier" | "secure_core" => kind == Protonvpn,
        _ => true,
    }
}

fn non_empty(v: Option<String>) -> Option<String> {
    v.filter(|s| !s.trim().is_empty())
}

impl ProviderSettings {
    /// Reads and checks the raw `config` object of a `kind` backend.
    pub fn from_value(
        kind: ProviderKind,
        value: &serde_json::Value,
    ) -> Result<Self, SettingsError> {
        let raw: Raw =
            serde_json::from_value(value.clone()).map_err(|e| err("config", e.to_string()))?;
        let present = [
            ("max_load", raw.max_load.is_some()),
            ("server_id", raw.server_id.is_some()),
            ("features", raw.features.is_some()),
            ("private_key", raw.private_key.is_some()),
            ("account_id", raw.account_id.is_some()),
            ("username", raw.username.is_some()),
            ("password", raw.password.is_some()),
            ("port_forwarding", raw.port_forwarding.is_some()),
            ("server_ca", raw.server_ca.is_some()),
            ("tier", raw.tier.is_some()),
            ("secure_core", raw.secure_core.is_some()),
        ];
        if let Some((key, _)) = present.iter().find(|(k, p)| *p && !applies(k, kind)) {
            return Err(err(key, format!("does not apply to {kind} backends")));
        }

        let country = raw
            .country
            .filter(|c| !c.trim().is_empty())
            .ok_or_else(|| err("country", "required: an ISO 3166-1 alpha-2 code such as SE"))?;
        let country = country.trim().to_ascii_uppercase();
        if !is_country_code(&country) {
            return Err(err(
                "country",
                format!("`{country}` is not an ISO 3166-1 alpha-2 country code (e.g. SE, US, GB)"),
            ));
        }

        let protocol = raw.protocol.unwrap_or(kind.default_protocol());
        if !kind.protocols().contains(&protocol) {
            return Err(err(
                "protocol",
                format!("{kind} backends support openvpn only"),
            ));
        }

        let api_url = match raw.api_url {
            Some(u) => {
                let u = u.trim().trim_end_matches('/').to_owned();
                if !(u.starts_with("http://") || u.starts_with("https://")) || u.len() < 10 {
                    return Err(err("api_url", format!("`{u}` is not an http(s) URL")));
                }
                u
            }
            None => kind.default_api_url().to_owned(),
        };

        let account_id = non_empty(raw.account_id);
        let username = non_empty(raw.username);
        let password = non_empty(raw.password);
        match kind {
            ProviderKind::Mullvad => match &account_id {
                None => return Err(err("account_id", "required: the 16-digit account number")),
                Some(a) if a.len() != 16 || !a.bytes().all(|b| b.is_ascii_digit()) => {
                    return Err(err("account_id", "must be exactly 16 digits"))
                }
                Some(_) => {}
            },
            ProviderKind::PrivateInternetAccess | ProviderKind::Protonvpn => {
                if username.is_none() {
                    return Err(err("username", "required"));
                }
                if password.is_none() {
                    return Err(err("password", "required"));
                }
            }
            ProviderKind::Nordvpn if protocol == VpnProtocol::Openvpn => {
                // NordVPN's OpenVPN servers refuse clients without the service credentials.
                if username.is_none() || password.is_none() {
                    let missing = if username.is_none() {
                        "username"
                    } else {
                        "password"
                    };
                    return Err(err(
                        missing,
                        "required with protocol openvpn: the account's service credentials",
                    ));
                }
            }
            ProviderKind::Nordvpn => {}
        }

        let private_key = non_empty(raw.private_key);
        if let Some(k) = &private_key {
            crate::wireguard::decode_key("private_key", k)?;
        }
        if kind == ProviderKind::Nordvpn
            && protocol == VpnProtocol::Wireguard
            && private_key.is_none()
        {
            return Err(err(
                "private_key",
                "required with protocol wireguard: the account's NordLynx private key",
            ));
        }

        let openvpn = OpenvpnMaterial {
            ca: non_empty(raw.ca),
            tls_auth: non_empty(raw.tls_auth),
            tls_crypt: non_empty(raw.tls_crypt),
            key_direction: raw.key_direction,
            cert: non_empty(raw.cert),
            key: non_empty(raw.key),
        };
        if protocol == VpnProtocol::Openvpn && openvpn.ca.is_none() {
            return Err(err(
                "ca",
                "required with protocol openvpn: the provider's CA certificate (PEM text or path)",
            ));
        }
        if let Some(d) = openvpn.key_direction {
            if d > 1 {
                return Err(err("key_direction", "must be 0 or 1"));
            }
        }

        let mut features = raw.features.unwrap_or_default();
        features.dedup();
        Ok(ProviderSettings {
            kind,
            country,
            city: raw.city.trim().to_owned(),
            protocol,
            auto_select: raw.auto_select.unwrap_or(true),
            enabled: raw.enabled.unwrap_or(true),
            api_url,
            max_load: raw.max_load.unwrap_or(0),
            server_id: non_empty(raw.server_id),
            features,
            private_key,
            account_id,
            username,
            password,
            port_forwarding: raw.port_forwarding.unwrap_or(false),
            server_ca: non_empty(raw.server_ca),
            tier: raw.tier.unwrap_or_default(),
            secure_core: raw.secure_core.unwrap_or(false),
            openvpn,
        })
    }
}

/// Every officially assigned ISO 3166-1 alpha-2 code (249).
pub const COUNTRY_CODES: [&str; 249] = [
    "AD", "AE", "AF", "AG", "AI", "AL", "AM", "AO", "AQ", "AR", "AS", "AT", "AU", "AW", "AX", "AZ",
    "BA", "BB", "BD", "BE", "BF", "BG", "BH", "BI", "BJ", "BL", "BM", "BN", "BO", "BQ", "BR", "BS",
    "BT", "BV", "BW", "BY", "BZ", "CA", "CC", "CD", "CF", "CG", "CH", "CI", "CK", "CL", "CM", "CN",
    "CO", "CR", "CU", "CV", "CW", "CX", "CY", "CZ", "DE", "DJ", "DK", "DM", "DO", "DZ", "EC", "EE",
    "EG", "EH", "ER", "ES", "ET", "FI", "FJ", "FK", "FM", "FO", "FR", "GA", "GB", "GD", "GE", "GF",
    "GG", "GH", "GI", "GL", "GM", "GN", "GP", "GQ", "GR", "GS", "GT", "GU", "GW", "GY", "HK", "HM",
    "HN", "HR", "HT", "HU", "ID", "IE", "IL", "IM", "IN", "IO", "IQ", "IR", "IS", "IT", "JE", "JM",
    "JO", "JP", "KE", "KG", "KH", "KI", "KM", "KN", "KP", "KR", "KW", "KY", "KZ", "LA", "LB", "LC",
    "LI", "LK", "LR", "LS", "LT", "LU", "LV", "LY", "MA", "MC", "MD", "ME", "MF", "MG", "MH", "MK",
    "ML", "MM", "MN", "MO", "MP", "MQ", "MR", "MS", "MT", "MU", "MV", "MW", "MX", "MY", "MZ", "NA",
    "NC", "NE", "NF", "NG", "NI", "NL", "NO", "NP", "NR", "NU", "NZ", "OM", "PA", "PE", "PF", "PG",
    "PH", "PK", "PL", "PM", "PN", "PR", "PS", "PT", "PW", "PY", "QA", "RE", "RO", "RS", "RU", "RW",
    "SA", "SB", "SC", "SD", "SE", "SG", "SH", "SI", "SJ", "SK", "SL", "SM", "SN", "SO", "SR", "SS",
    "ST", "SV", "SX", "SY", "SZ", "TC", "TD", "TF", "TG", "TH", "TJ", "TK", "TL", "TM", "TN", "TO",
    "TR", "TT", "TV", "TW", "TZ", "UA", "UG", "UM", "US", "UY", "UZ", "VA", "VC", "VE", "VG", "VI",
    "VN", "VU", "WF", "WS", "YE", "YT", "ZA", "ZM", "ZW",
];

/// Whether `code` (upper case) is an assigned ISO 3166-1 alpha-2 code.
pub fn is_country_code(code: &str) -> bool {
    COUNTRY_CODES.binary_search(&code).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const KEY: &str = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";

    #[test]
    fn country_codes_are_sorted_and_complete() {
        assert!(COUNTRY_CODES.windows(2).all(|w| w[0] < w[1]));
        for c in ["SE", "US", "GB", "CH", "AX", "SS", "XK"] {
            assert_eq!(is_country_code(c), c != "XK", "{c}");
        }
        assert!(!is_country_code("UK"), "the UK is GB in ISO 3166-1");
    }

    #[test]
    fn defaults_per_kind() {
        let nord = ProviderSettings::from_value(
            ProviderKind::Nordvpn,
            &json!({"country": "se", "private_key": KEY}),
        )
        .expect("valid");
        assert_eq!(nord.country, "SE");
        assert_eq!(nord.protocol, VpnProtocol::Wireguard);
        assert!(nord.auto_select);
        assert_eq!(nord.max_load, 0);
        assert_eq!(nord.api_url, "https://api.nordvpn.com");
        assert_eq!(nord.city, "");

        let proton = ProviderSettings::from_value(
            ProviderKind::Protonvpn,
            &json!({"country": "CH", "username": "u", "password": "p", "ca": "/etc/ca.pem"}),
        )
        .expect("valid");
        assert_eq!(proton.protocol, VpnProtocol::Openvpn);
        assert_eq!(proton.tier, ProtonTier::Free);
        assert!(!proton.secure_core);

        let pia = ProviderSettings::from_value(
            ProviderKind::PrivateInternetAccess,
            &json!({"country": "US", "username": "p1234567", "password": "pw",
                    "api_url": "http://127.0.0.1:9/"}),
        )
        .expect("valid");
        assert!(!pia.port_forwarding);
        assert_eq!(pia.api_url, "http://127.0.0.1:9");
        assert_eq!(ProviderKind::from_name("pia"), Some(pia.kind));
    }

    #[test]
    fn problems_name_their_key() {
        let cases: [(ProviderKind, serde_json::Value, &str); 13] = [
            (
                ProviderKind::Mullvad,
                json!({"account_id": "1234567890123456"}),
                "country",
            ),
            (
                ProviderKind::Mullvad,
                json!({"country": "ZZ", "account_id": "1234567890123456"}),
                "country",
            ),
            (
                ProviderKind::Mullvad,
                json!({"country": "SE"}),
                "account_id",
            ),
            (
                ProviderKind::Mullvad,
                json!({"country": "SE", "account_id": "12345"}),
                "account_id",
            ),
            (
                ProviderKind::Mullvad,
                json!({"country": "SE", "account_id": "1234567890123456", "max_load": 5}),
                "max_load",
            ),
            (
                ProviderKind::Protonvpn,
                json!({"country": "CH", "username": "u", "password": "p", "protocol": "wireguard"}),
                "protocol",
            ),
            (
                ProviderKind::Protonvpn,
                json!({"country": "CH", "username": "u", "password": "p"}),
                "ca",
            ),
            (
                ProviderKind::PrivateInternetAccess,
                json!({"country": "US", "username": "u"}),
                "password",
            ),
            (
                ProviderKind::Nordvpn,
                json!({"country": "SE"}),
                "private_key",
            ),
            (
                ProviderKind::Nordvpn,
                json!({"country": "SE", "protocol": "openvpn", "ca": "/etc/ca.pem", "username": "u"}),
                "password",
            ),
            (
                ProviderKind::Nordvpn,
                json!({"country": "SE", "private_key": KEY, "features": ["fast"]}),
                "config",
            ),
            (
                ProviderKind::Nordvpn,
                json!({"country": "SE", "private_key": KEY, "api_url": "ftp://x"}),
                "api_url",
            ),
            (
                ProviderKind::Nordvpn,
                json!({"country": "SE", "private_key": KEY, "port": 1}),
                "config",
            ),
        ];
        for (kind, value, key) in cases {
            let e = ProviderSettings::from_value(kind, &value).expect_err(key);
            assert_eq!(e.key, key, "{value}: {e}");
        }
    }

    #[test]
    fn provider_backends_parse_round_trip_and_validate() {
        use crate::ServerConfig;
        let parse = |y: &str| ServerConfig::from_yaml_str(y, &|_| None);
        let yaml = "backends:\n  - name: vpn\n    type: pia\n    config: {country: us, username: p1, password: pw, port_forwarding: true}\n\
                    routes:\n  - {name: all, domains: [\"*\"], backend: vpn}\n";
        let cfg = parse(yaml).expect("parses");
        assert_eq!(
            cfg.backends[0].kind,
            crate::BackendType::Provider(ProviderKind::PrivateInternetAccess)
        );
        assert!(
            crate::validate(&cfg).is_empty(),
            "{:?}",
            crate::validate(&cfg)
        );
        let again = parse(&cfg.to_yaml_string().expect("yaml")).expect("re-parses");
        assert_eq!(again, cfg);
        assert_eq!(
            cfg.to_json_value().expect("json")["backends"][0]["type"],
            "privateinternetaccess"
        );

        let bad = parse(&yaml.replace("country: us", "country: uk")).expect("parses");
        let problems = crate::validate(&bad);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].field, "backends[0].config.country");
        let missing =
            parse("backends:\n  - {name: m, type: mullvad}\nroutes: []\n").expect("parses");
        assert_eq!(crate::validate(&missing)[0].field, "backends[0].config");
        assert!(
            parse("backends:\n  - {name: d, type: direct, config: {country: SE}}\n").is_err(),
            "config belongs to provider backends"
        );
        assert!(
            parse("backends:\n  - {name: n, type: nordvpn, wireguard: {}}\n").is_err(),
            "provider options go in config"
        );
    }
}
