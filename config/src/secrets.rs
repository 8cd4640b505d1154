//! Secrets in the configurations the APIs show and take back: which keys are masked, and how a
//! masked value sent back (GET → edit → PUT) gets its secret again.
//!
//! - Server ([`mask_server`]): every key named like a secret ([`SECRET_KEYS`], also as the end
//!   of a key: `client_secret`), and the private key material (`key`, `tls_auth`, `tls_crypt`)
//!   of `openvpn` settings and of provider backends' `config`.
//! - Client ([`crate::client::masked`]): `servers[].password`, `servers[].token`, `api.token`,
//!   `mesh.discovery.token`, `mesh.discovery.enrollment_key`, `mesh.connection.preshared_key`, `mesh.turn.servers[].password`.
//! - [`unmask`]: where the posted value still holds [`MASKED`], the running value at the same
//!   place comes back; array entries with a `name` (or `url`, `username`) are matched by it, not
//!   by position, so a reordered list keeps each entry's own secret.

use serde_json::Value;

/// What a masked secret shows; sent back, it keeps the secret.
pub const MASKED: &str = "********";

/// Key names (or key name endings after `_`) whose string values are secrets.
pub const SECRET_KEYS: [&str; 8] = [
    "password",
    // mesh.registry.database_url: a PostgreSQL URL may carry a password.
    "database_url",
    "account_id",
    "password_hash",
    "token",
    "secret",
    "private_key",
    "preshared_key",
];

/// Keys of `openvpn` settings and of provider backends' `config` holding private key material
/// (PEM text or a path).
pub const KEY_MATERIAL: [&str; 3] = ["key", "tls_crypt", "tls_auth"];

fn is_secret_key(k: &str) -> bool {
    SECRET_KEYS
        .iter()
        .any(|s| k.eq_ignore_ascii_case(s) || k.ends_with(&format!("_{s}")))
}

fn mask_string(v: &mut Value) {
    if v.as_str().is_some_and(|s| !s.is_empty()) {
        *v = Value::String(MASKED.into());
    }
}

/// Masks every value of a secret-named key, at any depth (empty values stay visible as unset).
pub fn mask_named(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if is_secret_key(k) && v.is_string() {
                    mask_string(v);
                } else {
                    mask_named(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mask_named),
        _ => {}
    }
}

/// [`mask_named`] and the key material of one backend settings object (`openvpn`, a provider's
/// `config`, or the settings a provider backend resolved to).
pub fn mask_settings(v: &mut Value) {
    mask_named(v);
    for key in KEY_MATERIAL {
        if let Some(value) = v.get_mut(key) {
            mask_string(value);
        }
    }
}

/// The server configuration (as its JSON value) with every secret masked.
pub fn mask_server(v: &mut Value) {
    mask_named(v);
    if let Some(backends) = v.get_mut("backends").and_then(Value::as_array_mut) {
        for backend in backends.iter_mut() {
            for object in ["openvpn", "config"] {
                if let Some(settings) = backend.get_mut(object) {
                    mask_settings(settings);
                }
            }
        }
    }
}

/// The key an array entry is known by: its `name`, else its `url` (TURN servers), else its
/// `username` (native users).
fn identity(v: &Value) -> Option<&str> {
    ["name", "url", "username"]
        .iter()
        .find_map(|k| v.get(k).and_then(Value::as_str))
}

/// Puts the running value back wherever `posted` still holds [`MASKED`]. Objects are matched
/// key by key; array entries by their `name` (or `url`, `username`) when they have one, else
/// by position.
pub fn unmask(posted: &mut Value, running: &Value) {
    match (posted, running) {
        (Value::Object(p), Value::Object(r)) => {
            for (k, v) in p.iter_mut() {
                match r.get(k) {
                    Some(orig) if v.as_str() == Some(MASKED) => *v = orig.clone(),
                    Some(orig) => unmask(v, orig),
                    None => {}
                }
            }
        }
        (Value::Array(p), Value::Array(r)) => {
            for (i, v) in p.iter_mut().enumerate() {
                let orig = match identity(v) {
                    Some(id) => r.iter().find(|o| identity(o) == Some(id)),
                    None => r.get(i),
                };
                if let Some(orig) = orig {
                    unmask(v, orig);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::client::{masked, merge_partial, ClientConfig};
    use crate::ServerConfig;

    /// A server configuration with a value for every secret-bearing key (two entries of each
    /// list, so a reordered list shows whether secrets follow their entry).
    const SERVER: &str = r#"
server:
  quic: {token: quic-token}
api: {token: api-token}
auth:
  mode: native
  native:
    users:
      - {username: ann, password_hash: "$2b$10$hash-of-ann"}
      - {username: bob, password_hash: "$2b$10$hash-of-bob"}
  oauth: {issuer_url: "https://id.example", client_id: proxy, client_secret: oauth-secret}
mesh:
  registry: {database_url: "postgres://u:db-password@db/registry"}
backends:
  - {name: up-a, type: httpproxy, http_proxy: {address: "a:1", username: u, password: up-a-password}}
  - {name: up-b, type: socks5, socks5: {address: "b:1", username: u, password: up-b-password}}
  - name: wg
    type: wireguard
    wireguard: {private_key: wg-private, preshared_key: wg-psk, public_key: wg-public}
  - name: ovpn-a
    type: openvpn
    openvpn: {remote: a, key: ovpn-a-key, tls_auth: ovpn-a-tls-auth, password: ovpn-a-password}
  - name: ovpn-b
    type: openvpn
    openvpn: {remote: b, key: ovpn-b-key, tls_crypt: ovpn-b-tls-crypt, password: ovpn-b-password}
  - name: prov-a
    type: protonvpn
    config: {country: SE, password: prov-a-password, key: prov-a-key, tls_auth: prov-a-tls-auth}
  - name: prov-b
    type: nordvpn
    config: {country: SE, private_key: prov-b-private, password: prov-b-password, tls_crypt: prov-b-tls-crypt}
  - name: prov-c
    type: mullvad
    config: {country: SE, account_id: "1234567890123456"}
routes: []
"#;

    /// Every secret-bearing key of the server model: (JSON pointer, its value in [`SERVER`]).
    const SERVER_SECRETS: [(&str, &str); 23] = [
        ("/server/quic/token", "quic-token"),
        ("/api/token", "api-token"),
        ("/auth/native/users/0/password_hash", "$2b$10$hash-of-ann"),
        ("/auth/native/users/1/password_hash", "$2b$10$hash-of-bob"),
        ("/auth/oauth/client_secret", "oauth-secret"),
        (
            "/mesh/registry/database_url",
            "postgres://u:db-password@db/registry",
        ),
        ("/backends/0/http_proxy/password", "up-a-password"),
        ("/backends/1/socks5/password", "up-b-password"),
        ("/backends/2/wireguard/private_key", "wg-private"),
        ("/backends/2/wireguard/preshared_key", "wg-psk"),
        ("/backends/3/openvpn/key", "ovpn-a-key"),
        ("/backends/3/openvpn/tls_auth", "ovpn-a-tls-auth"),
        ("/backends/3/openvpn/password", "ovpn-a-password"),
        ("/backends/4/openvpn/key", "ovpn-b-key"),
        ("/backends/4/openvpn/tls_crypt", "ovpn-b-tls-crypt"),
        ("/backends/4/openvpn/password", "ovpn-b-password"),
        ("/backends/5/config/password", "prov-a-password"),
        ("/backends/5/config/key", "prov-a-key"),
        ("/backends/5/config/tls_auth", "prov-a-tls-auth"),
        ("/backends/6/config/private_key", "prov-b-private"),
        ("/backends/6/config/password", "prov-b-password"),
        ("/backends/6/config/tls_crypt", "prov-b-tls-crypt"),
        ("/backends/7/config/account_id", "1234567890123456"),
    ];

    /// Every secret-bearing key of the client model.
    const CLIENT: &str = r#"
servers:
  - {name: one, address: "a:1", protocol: HTTP, username: u, password: one-password}
  - {name: two, address: "b:1", protocol: QUIC, token: two-token, fingerprint: "00"}
api: {token: client-api-token}
mesh:
  discovery: {server: "http://r:1", token: registry-token}
  connection: {preshared_key: "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="}
  turn:
    servers:
      - {url: "turn:a:3478", username: u, password: turn-a-password}
      - {url: "turn:b:3478", username: u, password: turn-b-password}
"#;

    const CLIENT_SECRETS: [(&str, &str); 7] = [
        ("/servers/0/password", "one-password"),
        ("/servers/1/token", "two-token"),
        ("/api/token", "client-api-token"),
        ("/mesh/discovery/token", "registry-token"),
        (
            "/mesh/connection/preshared_key",
            "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=",
        ),
        ("/mesh/turn/servers/0/password", "turn-a-password"),
        ("/mesh/turn/servers/1/password", "turn-b-password"),
    ];

    fn reversed_list(v: &mut Value, pointer: &str) {
        if let Some(list) = v.pointer_mut(pointer).and_then(Value::as_array_mut) {
            list.reverse();
        }
    }

    /// The value at `pointer` of `v` after `list` was reversed: the same entry, found by its
    /// new index.
    fn moved(pointer: &str, lists: &[(&str, usize)]) -> String {
        for (list, len) in lists {
            if let Some(rest) = pointer.strip_prefix(&format!("{list}/")) {
                let (index, tail) = rest.split_once('/').unwrap_or((rest, ""));
                let index: usize = index.parse().unwrap();
                return format!("{list}/{}/{tail}", len - 1 - index);
            }
        }
        pointer.to_owned()
    }

    #[test]
    fn every_secret_is_masked_and_comes_back_by_name_after_reordering() {
        // Server: masked by GET /api/v1/config; sent back reordered, each secret returns to
        // its own entry.
        let cfg = ServerConfig::from_yaml_str(SERVER, &|_| None).unwrap();
        let running = cfg.to_json_value().unwrap();
        let mut shown = running.clone();
        mask_server(&mut shown);
        for (pointer, secret) in SERVER_SECRETS {
            assert_eq!(
                running.pointer(pointer),
                Some(&Value::from(secret)),
                "{pointer}"
            );
            assert_eq!(
                shown.pointer(pointer),
                Some(&Value::from(MASKED)),
                "{pointer}"
            );
        }
        // What is not secret stays readable.
        assert_eq!(
            shown.pointer("/auth/native/users/0/username"),
            Some(&Value::from("ann"))
        );
        assert_eq!(
            shown.pointer("/backends/2/wireguard/public_key"),
            Some(&Value::from("wg-public"))
        );
        let lists = [("/backends", 8), ("/auth/native/users", 2)];
        for (list, _) in lists {
            reversed_list(&mut shown, list);
        }
        unmask(&mut shown, &running);
        for (pointer, secret) in SERVER_SECRETS {
            let at = moved(pointer, &lists);
            assert_eq!(shown.pointer(&at), Some(&Value::from(secret)), "{at}");
        }

        // Client: masked by GET /api/v1/config; PUT merges the masked (and reordered) lists
        // back with each entry's own secret.
        let client = ClientConfig::from_yaml_str(CLIENT, &|_| None).unwrap();
        let running = serde_json::to_value(&client).unwrap();
        let mut shown = serde_json::to_value(masked(&client)).unwrap();
        for (pointer, secret) in CLIENT_SECRETS {
            assert_eq!(
                running.pointer(pointer),
                Some(&Value::from(secret)),
                "{pointer}"
            );
            assert_eq!(
                shown.pointer(pointer),
                Some(&Value::from(MASKED)),
                "{pointer}"
            );
        }
        let lists = [("/servers", 2), ("/mesh/turn/servers", 2)];
        for (list, _) in lists {
            reversed_list(&mut shown, list);
        }
        let back = serde_json::to_value(merge_partial(&client, &shown).unwrap()).unwrap();
        for (pointer, secret) in CLIENT_SECRETS {
            let at = moved(pointer, &lists);
            assert_eq!(back.pointer(&at), Some(&Value::from(secret)), "{at}");
        }
    }

    #[test]
    fn entries_without_a_name_match_by_position_and_new_values_stay() {
        let running = serde_json::json!({"a": [{"password": "p0"}, {"password": "p1"}], "t": "x"});
        let mut posted =
            serde_json::json!({"a": [{"password": MASKED}, {"password": "new"}], "t": MASKED});
        unmask(&mut posted, &running);
        assert_eq!(
            posted,
            serde_json::json!({"a": [{"password": "p0"}, {"password": "new"}], "t": "x"})
        );
        // A new entry (no running entry by that name) keeps what was posted.
        let running = serde_json::json!([{"name": "a", "password": "pa"}]);
        let mut posted = serde_json::json!([{"name": "b", "password": MASKED}]);
        unmask(&mut posted, &running);
        assert_eq!(posted[0]["password"], MASKED);
    }
}
