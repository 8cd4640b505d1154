//! Settings of an `openvpn` backend (the object under `openvpn:` of a backend entry), typed and
//! checked. The backend entry keeps the object as raw JSON for round-tripping; validation and
//! the control plane's process supervisor read it through [`OpenvpnSettings::from_value`].
//! Provider backends build an [`OpenvpnSettings`] directly and store
//! [`OpenvpnSettings::to_value`].
//!
//! Either an existing OpenVPN client file or inline settings:
//!
//! ```yaml
//! openvpn:
//!   config_file: /etc/switchyard/vpn.ovpn      # an .ovpn file (its relative paths are relative to it)
//! # or
//! openvpn:
//!   remote: vpn.example.net                     # required without config_file: host name or address
//!   port: 1194                                  # default 1194
//!   proto: udp                                  # udp (default) or tcp
//!   ca: /etc/switchyard/ca.crt                  # PEM text or a file path (also cert, key, tls_crypt, tls_auth)
//!   cert: "-----BEGIN CERTIFICATE-----\n..."
//!   key: "-----BEGIN PRIVATE KEY-----\n..."     # secret (masked in GET /api/v1/config)
//!   tls_crypt: ...                              # or tls_auth + key_direction (0 or 1)
//!   peer_fingerprint: "AB:CD:…"                 # OpenVPN 2.6 self-signed mode instead of a CA
//!   username: user                              # auth-user-pass, written to a 0600 file
//!   password: secret                            # secret
//!   data_ciphers: [AES-256-GCM, CHACHA20-POLY1305]
//!   extra: ["verb 4", "mssfix 1400"]            # raw directives, only those of the allow-list
//!                                               # (crate::openvpn_options)
//! ```
//!
//! With `config_file`, the connection keys (`remote`, `port`, `proto`, `ca`, `cert`, `key`,
//! `tls_crypt`, `tls_auth`, `key_direction`, `peer_fingerprint`) come from the file and may not
//! be given inline; `username`/`password`, `data_ciphers` and `extra` still apply. The file's
//! lines pass the same allow-list when the process is started
//! ([`crate::openvpn_options::check_config_text`]).

use serde::{Deserialize, Serialize};

/// The default server port.
pub const DEFAULT_PORT: u16 = 1194;

/// Transport to the OpenVPN server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    #[default]
    Udp,
    Tcp,
}

impl Proto {
    /// The value of OpenVPN's `proto` directive for a client.
    pub fn directive(self) -> &'static str {
        match self {
            Proto::Udp => "udp",
            Proto::Tcp => "tcp-client",
        }
    }
}

/// The typed `openvpn` settings object. Fields are public so provider backends can build one.
/// PEM fields hold either the PEM text itself or a path to a PEM file ([`PemSource::of`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenvpnSettings {
    /// Path of an OpenVPN client configuration (`.ovpn`) instead of inline settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_file: Option<String>,
    /// Server host name or address (required without `config_file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    /// Server port; `None` = [`DEFAULT_PORT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// `udp` (default) or `tcp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proto: Option<Proto>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_crypt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_auth: Option<String>,
    /// `key-direction` of `tls_auth`: 0 or 1 (clients usually 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_direction: Option<u8>,
    /// SHA-256 fingerprint(s) of the server certificate (`AB:CD:…`), separated by commas or
    /// new lines: OpenVPN 2.6's self-signed mode, in place of `ca`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_fingerprint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// `data-ciphers`, in order of preference; empty = OpenVPN's default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data_ciphers: Vec<String>,
    /// Raw directive lines appended to the generated configuration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra: Vec<String>,
}

/// Where a PEM field's content comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PemSource<'a> {
    /// The PEM text itself.
    Inline(&'a str),
    /// A file path.
    Path(&'a str),
}

impl<'a> PemSource<'a> {
    /// PEM text when the value holds a `-----BEGIN` marker, a path otherwise.
    pub fn of(value: &'a str) -> Self {
        if value.contains("-----BEGIN ") {
            PemSource::Inline(value)
        } else {
            PemSource::Path(value.trim())
        }
    }
}

use crate::settings_error::err;
pub use crate::settings_error::SettingsError;

/// The connection keys that `config_file` provides and inline settings may not repeat.
const FILE_PROVIDED: [&str; 10] = [
    "remote",
    "port",
    "proto",
    "ca",
    "cert",
    "key",
    "tls_crypt",
    "tls_auth",
    "key_direction",
    "peer_fingerprint",
];

impl OpenvpnSettings {
    /// Reads and checks the raw `openvpn` object.
    pub fn from_value(value: &serde_json::Value) -> Result<Self, SettingsError> {
        let s: OpenvpnSettings =
            serde_json::from_value(value.clone()).map_err(|e| err("openvpn", e.to_string()))?;
        s.check()?;
        Ok(s)
    }

    /// The settings as the JSON object stored in a backend entry.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    pub fn port(&self) -> u16 {
        self.port.unwrap_or(DEFAULT_PORT)
    }

    pub fn proto(&self) -> Proto {
        self.proto.unwrap_or_default()
    }

    /// The fingerprints of `peer_fingerprint`, upper case with colons.
    pub fn fingerprints(&self) -> Vec<String> {
        self.peer_fingerprint
            .as_deref()
            .unwrap_or_default()
            .split([',', '\n', ' '])
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .map(normalize_fingerprint)
            .collect()
    }

    /// Every problem that makes the settings unusable, the first one found.
    pub fn check(&self) -> Result<(), SettingsError> {
        match (&self.config_file, &self.remote) {
            (None, None) => {
                return Err(err(
                    "remote",
                    "either `config_file` (an .ovpn file) or `remote` (the server) is required",
                ))
            }
            (Some(file), _) => {
                if file.trim().is_empty() || file.contains('\n') {
                    return Err(err("config_file", "must be a file path"));
                }
                let given = self.inline_keys_given();
                if let Some(key) = given.first() {
                    return Err(err(
                        key,
                        "comes from `config_file`; give either the file or inline settings",
                    ));
                }
            }
            (None, Some(remote)) => check_remote(remote)?,
        }
        if self.port == Some(0) {
            return Err(err("port", "0 is not a port"));
        }
        for (key, value) in self.pem_fields() {
            if let Some(v) = value {
                check_pem(key, v)?;
            }
        }
        if self.config_file.is_none() {
            if self.ca.is_none() && self.peer_fingerprint.is_none() {
                return Err(err(
                    "ca",
                    "the server must be verified: give `ca` or `peer_fingerprint`",
                ));
            }
            match (&self.cert, &self.key) {
                (Some(_), None) => return Err(err("key", "`cert` needs its private `key`")),
                (None, Some(_)) => return Err(err("cert", "`key` needs its `cert`")),
                (None, None) if self.username.is_none() => {
                    return Err(err(
                        "cert",
                        "the client must authenticate: give `cert` and `key`, or `username` and `password`",
                    ))
                }
                _ => {}
            }
        }
        if self.tls_crypt.is_some() && self.tls_auth.is_some() {
            return Err(err("tls_auth", "use either `tls_crypt` or `tls_auth`"));
        }
        match self.key_direction {
            Some(d) if d > 1 => return Err(err("key_direction", "must be 0 or 1")),
            Some(_) if self.tls_auth.is_none() && self.config_file.is_none() => {
                return Err(err("key_direction", "applies to `tls_auth` only"))
            }
            _ => {}
        }
        if self.peer_fingerprint.is_some() {
            let fps = self.fingerprints();
            if fps.is_empty() {
                return Err(err("peer_fingerprint", "no fingerprint given"));
            }
            for fp in &fps {
                if !is_sha256_fingerprint(fp) {
                    return Err(err(
                        "peer_fingerprint",
                        format!("`{fp}` is not a SHA-256 fingerprint (32 hex bytes, AB:CD:…)"),
                    ));
                }
            }
        }
        match (&self.username, &self.password) {
            (Some(_), None) => return Err(err("password", "`username` needs a `password`")),
            (None, Some(_)) => return Err(err("username", "`password` needs a `username`")),
            (Some(u), Some(p)) => {
                if u.is_empty() || u.contains(['\n', '\r']) {
                    return Err(err("username", "must be one non-empty line"));
                }
                if p.contains(['\n', '\r']) {
                    return Err(err("password", "must be one line"));
                }
            }
            (None, None) => {}
        }
        for c in &self.data_ciphers {
            if c.is_empty()
                || !c
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_')
            {
                return Err(err(
                    "data_ciphers",
                    format!("`{c}` is not a cipher name (e.g. AES-256-GCM)"),
                ));
            }
        }
        for line in &self.extra {
            check_extra(line)?;
        }
        Ok(())
    }

    fn inline_keys_given(&self) -> Vec<&'static str> {
        let given = [
            self.remote.is_some(),
            self.port.is_some(),
            self.proto.is_some(),
            self.ca.is_some(),
            self.cert.is_some(),
            self.key.is_some(),
            self.tls_crypt.is_some(),
            self.tls_auth.is_some(),
            self.key_direction.is_some(),
            self.peer_fingerprint.is_some(),
        ];
        FILE_PROVIDED
            .iter()
            .zip(given)
            .filter_map(|(k, g)| g.then_some(*k))
            .collect()
    }

    /// (key, value) of every PEM field, in configuration order.
    pub fn pem_fields(&self) -> [(&'static str, Option<&str>); 5] {
        [
            ("ca", self.ca.as_deref()),
            ("cert", self.cert.as_deref()),
            ("key", self.key.as_deref()),
            ("tls_crypt", self.tls_crypt.as_deref()),
            ("tls_auth", self.tls_auth.as_deref()),
        ]
    }
}

fn check_remote(remote: &str) -> Result<(), SettingsError> {
    // A colon is only allowed in an IPv6 address: `host:port` is a common mistake.
    let ok = if remote.contains(':') {
        remote.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !remote.is_empty()
            && remote.len() <= 253
            && remote
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    };
    if ok {
        Ok(())
    } else {
        Err(err(
            "remote",
            format!("`{remote}` is not a host name or address (the port goes in `port`)"),
        ))
    }
}

fn check_pem(key: &str, value: &str) -> Result<(), SettingsError> {
    match PemSource::of(value) {
        PemSource::Inline(text) => {
            if !text.contains("-----END ") {
                return Err(err(key, "PEM text without its -----END line"));
            }
            // The text goes into an inline <tag> block; a closing tag inside would end it.
            if text.contains("</") {
                return Err(err(key, "PEM text may not contain `</`"));
            }
            Ok(())
        }
        PemSource::Path(path) => {
            if path.is_empty() || path.contains(['\n', '\r']) {
                Err(err(key, "neither PEM text nor a file path"))
            } else {
                Ok(())
            }
        }
    }
}

fn normalize_fingerprint(fp: &str) -> String {
    let hex: String = fp
        .chars()
        .filter(|c| *c != ':')
        .map(|c| c.to_ascii_uppercase())
        .collect();
    if !hex.len().is_multiple_of(2) || !hex.is_ascii() {
        return fp.to_owned();
    }
    hex.as_bytes()
        .chunks(2)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect::<Vec<_>>()
        .join(":")
}

fn is_sha256_fingerprint(fp: &str) -> bool {
    let parts: Vec<&str> = fp.split(':').collect();
    parts.len() == 32
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

fn check_extra(line: &str) -> Result<(), SettingsError> {
    crate::openvpn_options::check_extra_line(line).map_err(|message| err("extra", message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FP: &str = "ab:cd:ef:01:23:45:67:89:ab:cd:ef:01:23:45:67:89:ab:cd:ef:01:23:45:67:89:ab:cd:ef:01:23:45:67:89";
    const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    fn inline() -> serde_json::Value {
        json!({"remote": "10.0.0.1", "peer_fingerprint": FP, "cert": PEM, "key": "/etc/k.pem"})
    }

    #[test]
    fn defaults_and_sources() {
        let s = OpenvpnSettings::from_value(&inline()).expect("valid");
        assert_eq!(s.port(), 1194);
        assert_eq!(s.proto(), Proto::Udp);
        assert_eq!(s.proto().directive(), "udp");
        assert_eq!(s.fingerprints(), [FP.to_ascii_uppercase()]);
        assert_eq!(PemSource::of(PEM), PemSource::Inline(PEM));
        assert_eq!(PemSource::of(" /etc/k.pem"), PemSource::Path("/etc/k.pem"));
        let file = OpenvpnSettings::from_value(&json!({"config_file": "/etc/v.ovpn",
            "username": "u", "password": "p", "extra": ["--verb 4"]}))
        .expect("valid");
        assert_eq!(file.config_file.as_deref(), Some("/etc/v.ovpn"));
        // Round trip through the stored JSON.
        assert_eq!(
            OpenvpnSettings::from_value(&s.to_value()).expect("valid"),
            s
        );
    }

    #[test]
    fn fingerprints_are_normalized_and_split() {
        let compact = FP.replace(':', "");
        let s = OpenvpnSettings {
            peer_fingerprint: Some(format!("{compact},\n{FP}")),
            ..OpenvpnSettings::default()
        };
        let fps = s.fingerprints();
        assert_eq!(fps.len(), 2);
        assert_eq!(fps[0], fps[1]);
    }

    #[test]
    fn bad_values_name_their_key() {
        let cases = [
            ("remote", json!("vpn.example:1194")),
            ("port", json!(0)),
            ("proto", json!("icmp")),
            ("peer_fingerprint", json!("AB:CD")),
            ("cert", json!("-----BEGIN CERTIFICATE-----\nno end")),
            ("data_ciphers", json!(["AES 256"])),
            ("extra", json!(["up /tmp/x.sh"])),
            ("extra", json!(["--script-security 2"])),
            ("extra", json!(["management 127.0.0.1 7505"])),
            ("extra", json!(["<ca>"])),
            ("key_direction", json!(1)),
        ];
        for (key, value) in cases {
            let mut v = inline();
            v[key] = value.clone();
            let e = OpenvpnSettings::from_value(&v).expect_err(key);
            if key == "proto" {
                assert_eq!(e.key, "openvpn", "{e}");
                assert!(e.message.contains("icmp"), "{e}");
            } else {
                assert_eq!(e.key, key, "{key}={value}: {e}");
            }
        }
    }

    #[test]
    fn required_combinations() {
        let e = OpenvpnSettings::from_value(&json!({})).expect_err("empty");
        assert!(e.message.contains("config_file"), "{e}");
        let e = OpenvpnSettings::from_value(&json!({"remote": "h", "cert": PEM, "key": PEM}))
            .expect_err("no verification");
        assert_eq!(e.key, "ca");
        let e = OpenvpnSettings::from_value(&json!({"remote": "h", "ca": PEM}))
            .expect_err("no client auth");
        assert_eq!(e.key, "cert");
        let ok = OpenvpnSettings::from_value(
            &json!({"remote": "h", "ca": PEM, "username": "u", "password": "p"}),
        );
        assert!(ok.is_ok(), "{ok:?}");
        let e = OpenvpnSettings::from_value(&json!({"remote": "h", "ca": PEM, "username": "u"}))
            .expect_err("no password");
        assert_eq!(e.key, "password");
        let e = OpenvpnSettings::from_value(&json!({"config_file": "/x.ovpn", "remote": "h"}))
            .expect_err("both");
        assert_eq!(e.key, "remote");
        let mut both = inline();
        both["tls_crypt"] = json!(PEM);
        both["tls_auth"] = json!(PEM);
        assert_eq!(
            OpenvpnSettings::from_value(&both).expect_err("both").key,
            "tls_auth"
        );
        let mut v = inline();
        v["unknown"] = json!(1);
        assert!(OpenvpnSettings::from_value(&v).is_err());
        let mut v = inline();
        v["extra"] = json!(["verb 4", "# a comment", "mssfix 1400"]);
        assert!(OpenvpnSettings::from_value(&v).is_ok());
    }
}
