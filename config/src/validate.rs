//! Semantic validation of a loaded [`ServerConfig`]: every problem is reported, not the first.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::listen::{parse_listen, ListenAddr};
use crate::model::{AuthMode, BackendType, ServerConfig, UpstreamProxyConfig, LOG_LEVELS};
use crate::origin::AllowedOrigins;
#[cfg(test)]
use crate::origin::OriginPattern;

/// One validation problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// Top-level section: `server`, `backends`, `routes`, `auth`, `access_control`,
    /// `rate_limit`, `api`, `logging`, `metrics`, `cache`.
    pub section: String,
    /// Full key path, e.g. `backends[2].http_proxy.address`.
    pub field: String,
    /// What is wrong, in one line.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

struct Problems(Vec<Problem>);

impl Problems {
    fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        let field = field.into();
        let section = field
            .split(['.', '['])
            .next()
            .unwrap_or_default()
            .to_string();
        self.0.push(Problem {
            section,
            field,
            message: message.into(),
        });
    }
}

/// Check everything that parsing cannot: references between sections, duplicates, address
/// and pattern syntax, unimplemented features. An empty result means the config is valid.
pub fn validate(cfg: &ServerConfig) -> Vec<Problem> {
    let mut p = Problems(Vec::new());
    check_server(cfg, &mut p);
    check_backends(cfg, &mut p);
    for (field, message) in crate::health_check::problems(cfg) {
        p.push(field, message);
    }
    check_routes(cfg, &mut p);
    check_auth(cfg, &mut p);
    check_rate_limit(cfg, &mut p);
    check_api(cfg, &mut p);
    check_logging(cfg, &mut p);
    check_metrics(cfg, &mut p);
    check_cache(&cfg.cache, &mut p);
    for (field, message) in cfg.mesh.registry.problems() {
        p.push(field, message);
    }
    check_listener_conflicts(cfg, &mut p);
    p.0
}

fn check_listen(field: &str, value: &str, p: &mut Problems) -> Option<ListenAddr> {
    match parse_listen(value) {
        Ok(a) => Some(a),
        Err(e) => {
            p.push(field, e.to_string());
            None
        }
    }
}

fn check_server(cfg: &ServerConfig, p: &mut Problems) {
    let s = &cfg.server;
    check_listen("server.http.listen", &s.http.listen, p);
    check_listen("server.socks5.listen", &s.socks5.listen, p);
    if !s.quic.listen.is_empty() {
        check_listen("server.quic.listen", &s.quic.listen, p);
        if s.quic.max_connections == 0 {
            p.push(
                "server.quic.max_connections",
                "must be at least 1 (default 1024)",
            );
        }
        if s.quic.max_connections_per_client == 0 {
            p.push(
                "server.quic.max_connections_per_client",
                "must be at least 1 (default 16)",
            );
        }
    }
    if s.http.max_header_size.0 == 0 {
        p.push(
            "server.http.max_header_size",
            "must be greater than 0 (default 64KiB)",
        );
    }
    if let Some(host) = &s.pac.proxy_host {
        if let Err(e) = check_host_port(host) {
            p.push("server.pac.proxy_host", e);
        }
    }
}

fn check_listener_conflicts(cfg: &ServerConfig, p: &mut Problems) {
    let mut listeners: Vec<(&str, ListenAddr)> = Vec::new();
    let mut add = |field: &'static str, enabled: bool, value: &str| {
        if enabled {
            if let Ok(a) = parse_listen(value) {
                listeners.push((field, a));
            }
        }
    };
    add("server.http.listen", true, &cfg.server.http.listen);
    add(
        "server.socks5.listen",
        cfg.server.socks5.enabled,
        &cfg.server.socks5.listen,
    );
    add("api.listen", cfg.api.enabled, &cfg.api.listen);
    add("metrics.listen", cfg.metrics.enabled, &cfg.metrics.listen);
    for (i, (field, addr)) in listeners.iter().enumerate() {
        if let Some((other, _)) = listeners[..i].iter().find(|(_, a)| a.conflicts_with(addr)) {
            p.push(
                *field,
                format!("listen address {addr} conflicts with {other}"),
            );
        }
    }
}

/// Names appear in API paths: non-empty, no whitespace, no `/`.
fn check_name(field: String, name: &str, what: &str, p: &mut Problems) {
    if name.is_empty() {
        p.push(field, format!("{what} name is required"));
    } else if name
        .chars()
        .any(|c| c.is_whitespace() || c == '/' || c.is_control())
    {
        p.push(
            field,
            format!("{what} name `{name}` must not contain whitespace or `/`"),
        );
    }
}

fn check_backends(cfg: &ServerConfig, p: &mut Problems) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, b) in cfg.backends.iter().enumerate() {
        let base = format!("backends[{i}]");
        check_name(format!("{base}.name"), &b.name, "backend", p);
        if !b.name.is_empty() {
            if let Some(first) = seen.get(b.name.as_str()) {
                p.push(
                    format!("{base}.name"),
                    format!(
                        "duplicate backend name `{}` (also backends[{first}])",
                        b.name
                    ),
                );
            } else {
                seen.insert(&b.name, i);
            }
        }
        let check_upstream =
            |key: &str, settings: &Option<UpstreamProxyConfig>, p: &mut Problems| match settings {
                None => p.push(
                    format!("{base}.{key}"),
                    format!(
                        "{} backend `{}` needs `{key}: {{address: host:port}}`",
                        b.kind, b.name
                    ),
                ),
                Some(s) if s.address.is_empty() => p.push(
                    format!("{base}.{key}.address"),
                    "address is required (host:port)",
                ),
                Some(s) => {
                    if let Err(e) = check_host_port(&s.address) {
                        p.push(format!("{base}.{key}.address"), e);
                    }
                }
            };
        match b.kind {
            BackendType::HttpProxy => check_upstream("http_proxy", &b.http_proxy, p),
            BackendType::Socks5 => check_upstream("socks5", &b.socks5, p),
            BackendType::Wireguard => match &b.other {
                None => p.push(
                    format!("{base}.wireguard"),
                    format!(
                        "wireguard backend `{}` needs a `wireguard:` settings object",
                        b.name
                    ),
                ),
                Some(v) => {
                    if let Err(e) = crate::wireguard::WireguardSettings::from_value(v) {
                        p.push(format!("{base}.wireguard.{}", e.key), e.message);
                    }
                }
            },
            BackendType::Openvpn => match &b.other {
                None => p.push(
                    format!("{base}.openvpn"),
                    format!(
                        "openvpn backend `{}` needs an `openvpn:` settings object",
                        b.name
                    ),
                ),
                Some(v) => {
                    if let Err(e) = crate::openvpn::OpenvpnSettings::from_value(v) {
                        p.push(format!("{base}.openvpn.{}", e.key), e.message);
                    }
                }
            },
            BackendType::Provider(kind) => match &b.other {
                None => p.push(
                    format!("{base}.config"),
                    format!(
                        "{kind} backend `{}` needs a `config:` object (at least `country`)",
                        b.name
                    ),
                ),
                Some(v) => {
                    if let Err(e) = crate::provider::ProviderSettings::from_value(kind, v) {
                        let field = if e.key == "config" {
                            format!("{base}.config")
                        } else {
                            format!("{base}.config.{}", e.key)
                        };
                        p.push(field, e.message);
                    }
                }
            },
            _ => {}
        }
        if b.http_proxy.is_some() && b.kind != BackendType::HttpProxy {
            p.push(
                format!("{base}.http_proxy"),
                format!("http_proxy settings do not apply to a {} backend", b.kind),
            );
        }
        if b.socks5.is_some() && b.kind != BackendType::Socks5 {
            p.push(
                format!("{base}.socks5"),
                format!("socks5 settings do not apply to a {} backend", b.kind),
            );
        }
    }
}

fn check_routes(cfg: &ServerConfig, p: &mut Problems) {
    let backend_names: std::collections::HashSet<&str> =
        cfg.backends.iter().map(|b| b.name.as_str()).collect();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, r) in cfg.routes.iter().enumerate() {
        let base = format!("routes[{i}]");
        check_name(format!("{base}.name"), &r.name, "route", p);
        if !r.name.is_empty() {
            if let Some(first) = seen.get(r.name.as_str()) {
                p.push(
                    format!("{base}.name"),
                    format!("duplicate route name `{}` (also routes[{first}])", r.name),
                );
            } else {
                seen.insert(&r.name, i);
            }
        }

        let check_ref = |field: String, name: &str, p: &mut Problems| {
            if name.is_empty() {
                p.push(field, "backend name is empty");
            } else if !backend_names.contains(name) {
                p.push(field, format!("unknown backend `{name}`"));
            }
        };
        match (&r.backend, r.backends.is_empty()) {
            (None, true) => p.push(
                format!("{base}.backend"),
                "route needs `backend` (one name) or a non-empty `backends` list",
            ),
            (Some(_), false) => p.push(
                format!("{base}.backends"),
                "set either `backend` or `backends`, not both",
            ),
            (Some(b), true) => check_ref(format!("{base}.backend"), b, p),
            (None, false) => {
                for (j, b) in r.backends.iter().enumerate() {
                    check_ref(format!("{base}.backends[{j}]"), b, p);
                    if r.backends[..j].contains(b) {
                        p.push(
                            format!("{base}.backends[{j}]"),
                            format!("backend `{b}` is listed twice"),
                        );
                    }
                }
            }
        }

        if r.domains.is_empty() {
            p.push(
                format!("{base}.domains"),
                "at least one domain pattern is required (`*` matches all)",
            );
        }
        for (j, d) in r.domains.iter().enumerate() {
            if let Err(e) = check_domain_pattern(d) {
                p.push(format!("{base}.domains[{j}]"), e);
            }
        }
    }
}

/// Domain patterns: `*` alone, an exact name, `*.name`, or labels containing `*`
/// (`cdn*.example.com`). No empty labels, no whitespace; labels are letters, digits, `-`, `_`.
pub fn check_domain_pattern(pattern: &str) -> Result<(), String> {
    if pattern == "*" {
        return Ok(());
    }
    if pattern.is_empty() {
        return Err("empty domain pattern".into());
    }
    if pattern.chars().any(char::is_whitespace) {
        return Err(format!("domain pattern `{pattern}` contains whitespace"));
    }
    if pattern.len() > 253 {
        return Err(format!(
            "domain pattern `{pattern}` is longer than 253 characters"
        ));
    }
    for label in pattern.split('.') {
        if label.is_empty() {
            return Err(format!(
                "domain pattern `{pattern}` has an empty label (leading, trailing or doubled `.`)"
            ));
        }
        if label.len() > 63 {
            return Err(format!(
                "domain pattern `{pattern}` has a label longer than 63 characters"
            ));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '*')))
        {
            return Err(format!(
                "domain pattern `{pattern}` contains `{c}` (allowed: letters, digits, `-`, `_`, `.`, `*`)"
            ));
        }
    }
    Ok(())
}

/// `host:port` with a host name, IPv4 address or bracketed IPv6 address and a port 1–65535.
pub fn check_host_port(s: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("`{s}` is not host:port: {why}"));
    if s.chars().any(char::is_whitespace) {
        return bad("contains whitespace");
    }
    if s.contains("://") {
        return bad("write host:port without a scheme");
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some((h, after)) = rest.split_once(']') else {
            return bad("missing `]`");
        };
        if h.parse::<std::net::Ipv6Addr>().is_err() {
            return bad("bad IPv6 address");
        }
        match after.strip_prefix(':') {
            Some(port) => (h, port),
            None => return bad("missing `:port`"),
        }
    } else {
        let Some((h, port)) = s.rsplit_once(':') else {
            return bad("missing `:port`");
        };
        if h.is_empty() {
            return bad("missing host");
        }
        if h.contains(':') {
            return bad("IPv6 addresses must be in brackets, e.g. [2001:db8::1]:1080");
        }
        if !h
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        {
            return bad("bad host name");
        }
        (h, port)
    };
    let _ = host;
    match port.parse::<u16>() {
        Ok(n) if n > 0 && port.bytes().all(|b| b.is_ascii_digit()) => Ok(()),
        _ => bad("port must be a number from 1 to 65535"),
    }
}

/// A bcrypt hash: `$2a$`, `$2b$` or `$2y$`, a two-digit cost 04–31, `$`, then 53 characters of
/// the bcrypt alphabet (`./A-Za-z0-9`).
pub fn is_bcrypt_hash(h: &str) -> bool {
    let b = h.as_bytes();
    if b.len() != 60 {
        return false;
    }
    if !(h.starts_with("$2a$") || h.starts_with("$2b$") || h.starts_with("$2y$")) {
        return false;
    }
    let cost = &h[4..6];
    if !cost.bytes().all(|c| c.is_ascii_digit()) {
        return false;
    }
    if !matches!(cost.parse::<u32>(), Ok(4..=31)) || b[6] != b'$' {
        return false;
    }
    b[7..]
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || *c == b'.' || *c == b'/')
}

fn check_auth(cfg: &ServerConfig, p: &mut Problems) {
    let a = &cfg.auth;
    if !a.mode.is_implemented() {
        let usable: Vec<&str> = AuthMode::ALL
            .iter()
            .filter(|m| m.is_implemented())
            .map(|m| m.api_name())
            .collect();
        p.push(
            "auth.mode",
            format!(
                "auth mode `{}` is not implemented in this build (availability: unimplemented); use {}",
                a.mode,
                usable.join(", ")
            ),
        );
    }
    if a.mode == AuthMode::Ldap {
        check_ldap(a.ldap.as_ref(), p);
    }
    if a.mode == AuthMode::Oauth {
        check_oauth(a.oauth.as_ref(), p);
    }
    if a.mode == AuthMode::System
        && a.system
            .as_ref()
            .is_some_and(|s| !is_pam_service(&s.service))
    {
        p.push(
            "auth.system.service",
            "a PAM service name (a file name under /etc/pam.d: letters, digits, `.`, `_`, `-`)",
        );
    }
    if let Some(n) = a.negotiate.as_ref().filter(|n| n.enabled) {
        for (key, value) in [
            ("keytab", &n.keytab),
            ("service_principal", &n.service_principal),
        ] {
            if value.trim().is_empty() {
                p.push(
                    format!("auth.negotiate.{key}"),
                    "required when auth.negotiate.enabled",
                );
            }
        }
    }
    if a.mode == AuthMode::Native && a.native.users.is_empty() {
        p.push(
            "auth.native.users",
            "auth mode native needs at least one user",
        );
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, u) in a.native.users.iter().enumerate() {
        let base = format!("auth.native.users[{i}]");
        if u.username.is_empty() {
            p.push(format!("{base}.username"), "username is required");
        } else if u.username.contains(':') || u.username.chars().any(char::is_control) {
            p.push(
                format!("{base}.username"),
                format!(
                    "username `{}` must not contain `:` or control characters",
                    u.username
                ),
            );
        } else if let Some(first) = seen.get(u.username.as_str()) {
            p.push(
                format!("{base}.username"),
                format!(
                    "duplicate username `{}` (also auth.native.users[{first}])",
                    u.username
                ),
            );
        } else {
            seen.insert(&u.username, i);
        }
        if !is_bcrypt_hash(&u.password_hash) {
            p.push(
                format!("{base}.password_hash"),
                "not a bcrypt hash (expected $2a$/$2b$/$2y$, a cost 04-31, `$` and 53 characters)",
            );
        }
    }
}

fn is_pam_service(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

fn check_oauth(oauth: Option<&crate::model::OAuthAuthConfig>, p: &mut Problems) {
    let Some(o) = oauth else {
        p.push(
            "auth.oauth",
            "auth mode oauth needs auth.oauth (issuer_url, client_id)",
        );
        return;
    };
    let is_http = |u: &str| u.starts_with("https://") || u.starts_with("http://");
    if !is_http(&o.issuer_url) {
        p.push(
            "auth.oauth.issuer_url",
            "must be an http(s) URL (the OpenID issuer)",
        );
    } else if !is_https_or_loopback(&o.issuer_url) {
        p.push(
            "auth.oauth.issuer_url",
            "must be https:// (plain http only to a loopback issuer): its signing keys decide who gets in",
        );
    }
    if o.client_id.trim().is_empty() {
        p.push(
            "auth.oauth.client_id",
            "required (the audience access tokens must name)",
        );
    }
    if let Some(url) = &o.introspection_url {
        if !is_http(url) {
            p.push("auth.oauth.introspection_url", "must be an http(s) URL");
        } else if !is_https_or_loopback(url) {
            p.push(
                "auth.oauth.introspection_url",
                "must be https:// (plain http only to a loopback address): it carries the client secret and decides who gets in",
            );
        }
        if o.client_secret.is_none() {
            p.push(
                "auth.oauth.client_secret",
                "required with introspection_url (the proxy authenticates as the client)",
            );
        }
    }
}

/// Whether `url` is `https://`, or `http://` to a loopback host (`127.0.0.0/8`, `[::1]`,
/// `localhost`), where plain text never leaves the machine.
pub fn is_https_or_loopback(url: &str) -> bool {
    if url
        .get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
    {
        return true;
    }
    let Some(rest) = url
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case("http://"))
        .and_then(|_| url.get(7..))
    else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return false; // credentials in the URL: not worth a special case
    }
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn check_ldap(ldap: Option<&crate::model::LdapAuthConfig>, p: &mut Problems) {
    let Some(l) = ldap else {
        p.push(
            "auth.ldap",
            "auth mode ldap needs auth.ldap (url, base_dn, user_filter)",
        );
        return;
    };
    let scheme = l.url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("ldap") => {}
        Some("ldaps") if !l.url["ldaps://".len()..].is_empty() => {}
        _ => p.push(
            "auth.ldap.url",
            format!("`{}` is not an ldap:// or ldaps:// URL", l.url),
        ),
    }
    if l.base_dn.trim().is_empty() {
        p.push(
            "auth.ldap.base_dn",
            "required (the search base, e.g. ou=people,dc=example,dc=org)",
        );
    }
    let filter = l.user_filter.trim();
    if !filter.contains("%s") {
        p.push(
            "auth.ldap.user_filter",
            "must contain %s (replaced by the escaped user name), e.g. (uid=%s)",
        );
    } else if !(filter.starts_with('(') && filter.ends_with(')')) {
        p.push(
            "auth.ldap.user_filter",
            format!("`{filter}` is not an LDAP filter (it must be in parentheses)"),
        );
    }
}

fn check_rate_limit(cfg: &ServerConfig, p: &mut Problems) {
    let r = &cfg.rate_limit;
    if r.enabled {
        if !(r.requests_per_second.is_finite() && r.requests_per_second > 0.0) {
            p.push(
                "rate_limit.requests_per_second",
                format!(
                    "must be greater than 0 when rate limiting is enabled (got {})",
                    r.requests_per_second
                ),
            );
        }
        if r.burst_size == 0 {
            p.push(
                "rate_limit.burst_size",
                "must be at least 1 when rate limiting is enabled",
            );
        }
    }
}

fn check_api(cfg: &ServerConfig, p: &mut Problems) {
    let a = &cfg.api;
    check_listen("api.listen", &a.listen, p);
    if let Err(e) = check_host_port(&a.backend_test_target) {
        p.push("api.backend_test_target", &e);
    }
    if a.request_log_size == 0 {
        p.push("api.request_log_size", "must be at least 1 (default 1000)");
    }
    if a.token.as_deref() == Some("") {
        p.push(
            "api.token",
            "empty token; remove the key to run the API without authentication",
        );
    }
    if let Err(errors) = AllowedOrigins::parse(&a.allowed_origins) {
        for (i, e) in errors {
            match i {
                Some(i) => p.push(format!("api.allowed_origins[{i}]"), e.to_string()),
                None => p.push("api.allowed_origins", e.to_string()),
            }
        }
    }
    if !a.stats_interval.is_zero()
        && a.stats_interval.as_std() < std::time::Duration::from_millis(100)
    {
        p.push(
            "api.stats_interval",
            "must be 0s (no stats.update events) or at least 100ms",
        );
    }
    if a.ws_read_timeout.is_zero() {
        p.push(
            "api.ws_read_timeout",
            "must be greater than 0 (default 60s)",
        );
    }
    if let Some(tls) = &a.tls {
        if tls.cert.is_empty() {
            p.push("api.tls.cert", "PEM certificate (chain) path is required");
        }
        if tls.key.is_empty() {
            p.push("api.tls.key", "PEM private key path is required");
        }
    }
}

/// An `api.allowed_origins` entry: `*`, a host pattern with optional port, or a
/// scheme-qualified origin (see [`crate::origin`]).
#[cfg(test)]
fn check_origin_pattern(o: &str) -> Result<(), String> {
    if o == "*" {
        return Ok(());
    }
    OriginPattern::parse(o)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn check_logging(cfg: &ServerConfig, p: &mut Problems) {
    let l = &cfg.logging;
    if !LOG_LEVELS.contains(&l.level.as_str()) {
        p.push(
            "logging.level",
            format!(
                "unknown level `{}` (one of {})",
                l.level,
                LOG_LEVELS.join(", ")
            ),
        );
    }
    if l.output.as_deref() == Some("") {
        p.push(
            "logging.output",
            "empty path; remove the key to log to stderr",
        );
    }
}

fn check_metrics(cfg: &ServerConfig, p: &mut Problems) {
    check_listen("metrics.listen", &cfg.metrics.listen, p);
}

/// The `cache:` section alone (shared by the server and the client configuration).
pub fn validate_cache(c: &crate::cache::CacheConfig) -> Vec<Problem> {
    let mut p = Problems(Vec::new());
    check_cache(c, &mut p);
    p.0
}

fn check_cache(c: &crate::cache::CacheConfig, p: &mut Problems) {
    let st = &c.storage;
    if c.default_ttl.is_zero() {
        p.push("cache.default_ttl", "must be greater than 0 (default 30d)");
    }
    if c.max_file_size.is_zero() {
        p.push(
            "cache.max_file_size",
            "must be greater than 0 (default 50GB); set cache.enabled: false to cache nothing",
        );
    }
    if st.r#type.uses_memory() && st.memory.max_size.is_zero() {
        p.push(
            "cache.storage.memory.max_size",
            format!(
                "must be greater than 0 with storage type {} (default 256MiB)",
                st.r#type
            ),
        );
    }
    if st.r#type.uses_disk() {
        if st.disk.path.trim().is_empty() {
            p.push(
                "cache.storage.disk.path",
                format!(
                    "a directory is required with storage type {} (default ./data/cache)",
                    st.r#type
                ),
            );
        }
        if st.disk.max_size.is_zero() {
            p.push(
                "cache.storage.disk.max_size",
                format!(
                    "must be greater than 0 with storage type {} (default 10GB)",
                    st.r#type
                ),
            );
        }
        if st.disk.cleanup_interval.is_zero() {
            p.push(
                "cache.storage.disk.cleanup_interval",
                "must be greater than 0 (default 1h)",
            );
        }
    }
    if st.r#type == crate::cache::StorageType::Tiered
        && st.tiered.memory_threshold > st.memory.max_size
    {
        p.push(
            "cache.storage.tiered.memory_threshold",
            format!(
                "{} is larger than cache.storage.memory.max_size ({}): such entries could never fit in memory",
                st.tiered.memory_threshold, st.memory.max_size
            ),
        );
    }

    for (i, name) in c.presets.iter().enumerate() {
        let field = format!("cache.presets[{i}]");
        if switchyard_proto::cache::presets::find(name).is_none() {
            p.push(
                field,
                format!(
                    "unknown preset `{name}` (one of {})",
                    switchyard_proto::cache::presets::names()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        } else if c.presets[..i].contains(name) {
            p.push(field, format!("preset `{name}` is listed twice"));
        }
    }

    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, r) in c.rules.iter().enumerate() {
        let base = format!("cache.rules[{i}]");
        check_name(format!("{base}.name"), &r.name, "cache rule", p);
        if !r.name.is_empty() {
            if let Some(first) = seen.get(r.name.as_str()) {
                p.push(
                    format!("{base}.name"),
                    format!(
                        "duplicate cache rule name `{}` (also cache.rules[{first}])",
                        r.name
                    ),
                );
            } else {
                seen.insert(&r.name, i);
            }
            if switchyard_proto::cache::presets::find(&r.name).is_some() {
                p.push(
                    format!("{base}.name"),
                    format!(
                        "`{}` is the name of a built-in preset; enable it under cache.presets or pick another name",
                        r.name
                    ),
                );
            }
        }
        if r.domains.is_empty() {
            p.push(
                format!("{base}.domains"),
                "at least one domain pattern is required (`*` matches all)",
            );
        }
        for (j, d) in r.domains.iter().enumerate() {
            if let Err(e) = switchyard_proto::route_matcher::DomainPattern::parse(d) {
                p.push(format!("{base}.domains[{j}]"), e.to_string());
            }
        }
        if r.ttl.is_zero() {
            p.push(
                format!("{base}.ttl"),
                "must be greater than 0 (default 30d); set enabled: false to turn the rule off",
            );
        }
        if r.methods.is_empty() {
            p.push(
                format!("{base}.methods"),
                "at least one method is required (default [GET])",
            );
        }
        for (j, m) in r.methods.iter().enumerate() {
            let field = format!("{base}.methods[{j}]");
            if !crate::cache::CACHEABLE_METHODS.contains(&m.as_str()) {
                p.push(
                    field,
                    format!(
                        "method `{m}` is not cacheable (one of {}, upper case)",
                        crate::cache::CACHEABLE_METHODS.join(", ")
                    ),
                );
            } else if r.methods[..j].contains(m) {
                p.push(field, format!("method `{m}` is listed twice"));
            }
        }
        for (j, t) in r.content_types.iter().enumerate() {
            if let Err(e) = check_content_type_filter(t) {
                p.push(format!("{base}.content_types[{j}]"), e);
            }
        }
    }
}

/// A `content_types` entry: `type/subtype` (exact) or `type/` (every subtype), token
/// characters only, no parameters.
fn check_content_type_filter(t: &str) -> Result<(), String> {
    let token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    match t.split_once('/') {
        Some((ty, sub)) if token(ty) && (sub.is_empty() || token(sub)) => Ok(()),
        _ => Err(format!(
            "`{t}` is not a media type filter (write `video/mp4` for one type or `application/` for all subtypes)"
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::model::*;

    const HASH: &str = "$2b$10$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy";

    fn load(text: &str) -> ServerConfig {
        ServerConfig::from_yaml_str(text, &|_| None).unwrap()
    }

    fn fields(problems: &[Problem]) -> Vec<&str> {
        problems.iter().map(|p| p.field.as_str()).collect()
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(validate(&ServerConfig::default()), vec![]);
    }

    #[test]
    fn reports_every_problem() {
        let cfg = load(
            r#"
server:
  http: {listen: "nope", max_header_size: 0}
  socks5: {listen: ":7080"}
backends:
  - {name: a, type: direct}
  - {name: a, type: direct}
  - {name: h, type: httpproxy}
  - {name: h2, type: httpproxy, http_proxy: {address: "no-port"}}
  - {name: s, type: socks5, socks5: {address: ""}}
  - {name: "", type: direct, socks5: {address: "x:1"}}
routes:
  - {name: r, domains: ["*"], backend: missing}
  - {name: r, domains: [], backends: [a, a, ghost]}
  - {name: x, domains: ["bad domain", "a..b", ".x.com", "cdn*.example.com", "*.ok.org", "a/b"]}
  - {name: y, domains: ["*"], backend: a, backends: [a]}
auth:
  mode: native
  native:
    users:
      - {username: alice, password_hash: "plaintext"}
      - {username: alice, password_hash: "HASH"}
      - {username: "b:c", password_hash: "HASH"}
rate_limit: {enabled: true, requests_per_second: 0, burst_size: 0}
api: {listen: "1.2.3.4", request_log_size: 0, token: "", allowed_origins: ["*", "a.com/x", " b.com", "c.com:99999"]}
logging: {level: verbose, output: ""}
metrics: {listen: "x"}
"#
            .replace("HASH", HASH)
            .as_str(),
        );
        let problems = validate(&cfg);
        let f = fields(&problems);
        let want = [
            "server.http.listen",
            "server.http.max_header_size",
            "backends[1].name",
            "backends[2].http_proxy",
            "backends[3].http_proxy.address",
            "backends[4].socks5.address",
            "backends[5].name",
            "backends[5].socks5",
            "routes[0].backend",
            "routes[1].name",
            "routes[1].backends[1]",
            "routes[1].backends[2]",
            "routes[1].domains",
            "routes[2].domains[0]",
            "routes[2].domains[1]",
            "routes[2].domains[2]",
            "routes[2].domains[5]",
            "routes[3].backends",
            "auth.native.users[0].password_hash",
            "auth.native.users[1].username",
            "auth.native.users[2].username",
            "rate_limit.requests_per_second",
            "rate_limit.burst_size",
            "api.listen",
            "api.request_log_size",
            "api.token",
            "api.allowed_origins",
            "api.allowed_origins[1]",
            "api.allowed_origins[2]",
            "api.allowed_origins[3]",
            "logging.level",
            "logging.output",
            "metrics.listen",
        ];
        for w in want {
            assert!(f.contains(&w), "missing {w} in {problems:#?}");
        }
        assert!(!f.contains(&"routes[2].domains[3]"));
        assert!(!f.contains(&"routes[2].domains[4]"));
        // socks5 on :7080 conflicts with... http listen is invalid, so no conflict reported
        assert!(!f.contains(&"server.socks5.listen"));
        // sections are the top-level keys
        for p in &problems {
            assert!(p.field.starts_with(&p.section), "{p:?}");
        }
        let dup = problems
            .iter()
            .find(|p| p.field == "backends[1].name")
            .unwrap();
        assert!(dup.message.contains("duplicate") && dup.message.contains("backends[0]"));
        let missing = problems
            .iter()
            .find(|p| p.field == "routes[0].backend")
            .unwrap();
        assert!(missing.message.contains("missing"), "{missing:?}");
        let json = serde_json::to_value(&problems[0]).unwrap();
        assert!(json.get("section").is_some() && json.get("field").is_some());
    }

    #[test]
    fn route_without_any_backend() {
        let cfg =
            load("backends: [{name: a, type: direct}]\nroutes: [{name: r, domains: [\"*\"]}]");
        let p = validate(&cfg);
        assert_eq!(fields(&p), ["routes[0].backend"]);
        let cfg = load("backends: [{name: a, type: direct}]\nroutes: [{name: r, domains: [\"*\"], backends: []}]");
        assert_eq!(fields(&validate(&cfg)), ["routes[0].backend"]);
    }

    #[test]
    fn native_without_users_and_unimplemented_modes() {
        let p = validate(&load("auth: {mode: native}"));
        assert_eq!(fields(&p), ["auth.native.users"]);
        let unimplemented = AuthMode::ALL.into_iter().filter(|m| !m.is_implemented());
        for mode in unimplemented {
            let p = validate(&load(&format!("auth: {{mode: {mode}}}")));
            assert_eq!(fields(&p), ["auth.mode"], "{mode}");
            assert!(p[0]
                .message
                .contains("not implemented in this build (availability: unimplemented)"));
            assert_eq!(p[0].section, "auth");
        }
    }

    #[test]
    fn oauth_settings() {
        let ok = "auth: {mode: oauth, oauth: {issuer_url: \"https://id\", client_id: proxy}}";
        assert!(validate(&load(ok)).is_empty());
        assert_eq!(
            fields(&validate(&load("auth: {mode: oauth}"))),
            ["auth.oauth"]
        );
        let bad = "auth: {mode: oauth, oauth: {issuer_url: id, client_id: \"\", introspection_url: \"https://id/i\"}}";
        assert_eq!(
            fields(&validate(&load(bad))),
            [
                "auth.oauth.issuer_url",
                "auth.oauth.client_id",
                "auth.oauth.client_secret"
            ]
        );
    }

    #[test]
    fn plain_http_only_to_loopback() {
        for ok in [
            "https://id.example",
            "HTTPS://id.example/realms/x",
            "http://127.0.0.1:8080",
            "http://127.9.9.9/x",
            "http://[::1]:9000/",
            "http://localhost",
            "http://LOCALHOST:80/realm",
        ] {
            assert!(is_https_or_loopback(ok), "{ok}");
        }
        for bad in [
            "http://id.example",
            "http://10.0.0.1:8080",
            "http://127.0.0.1.evil.example/",
            "http://localhost.evil.example",
            "http://127.0.0.1@evil.example/",
            "http://[::ffff:10.0.0.1]/",
            "ftp://127.0.0.1",
            "http:/127.0.0.1",
        ] {
            assert!(!is_https_or_loopback(bad), "{bad}");
        }
        let plain = "auth: {mode: oauth, oauth: {issuer_url: \"http://id.example\", client_id: proxy, client_secret: s, introspection_url: \"http://id.example/i\"}}";
        assert_eq!(
            fields(&validate(&load(plain))),
            ["auth.oauth.issuer_url", "auth.oauth.introspection_url"]
        );
        let local =
            "auth: {mode: oauth, oauth: {issuer_url: \"http://127.0.0.1:9000\", client_id: proxy}}";
        assert!(validate(&load(local)).is_empty());
    }

    #[test]
    fn ldap_settings() {
        let ok = "auth: {mode: ldap, ldap: {url: \"ldaps://127.0.0.1:636\", base_dn: \"dc=x\", user_filter: \"(uid=%s)\"}}";
        assert!(validate(&load(ok)).is_empty());
        assert_eq!(
            fields(&validate(&load("auth: {mode: ldap}"))),
            ["auth.ldap"]
        );
        let bad =
            "auth: {mode: ldap, ldap: {url: \"http://x\", base_dn: \"\", user_filter: \"uid=%s\"}}";
        assert_eq!(
            fields(&validate(&load(bad))),
            [
                "auth.ldap.url",
                "auth.ldap.base_dn",
                "auth.ldap.user_filter"
            ]
        );
        let no_placeholder =
            "auth: {mode: ldap, ldap: {url: \"ldap://x\", base_dn: b, user_filter: \"(uid=bob)\"}}";
        assert_eq!(
            fields(&validate(&load(no_placeholder))),
            ["auth.ldap.user_filter"]
        );
    }

    #[test]
    fn negotiate_is_refused_as_a_mode_and_checked_as_middleware() {
        let err = ServerConfig::from_yaml_str("auth: {mode: negotiate}", &|_| None).unwrap_err();
        assert!(err.to_string().contains("auth.negotiate"), "{err}");
        let p = validate(&load("auth: {negotiate: {enabled: true}}"));
        assert!(fields(&p).contains(&"auth.negotiate.keytab"), "{p:?}");
        assert!(validate(&load("auth: {negotiate: {enabled: false}}")).is_empty());
    }

    #[test]
    fn listener_conflicts() {
        let p = validate(&load("api: {listen: \"127.0.0.1:7080\"}"));
        assert_eq!(fields(&p), ["api.listen"]);
        assert!(p[0].message.contains("server.http.listen"));
        // disabled listeners don't conflict
        assert!(validate(&load(
            "server: {socks5: {enabled: false, listen: \":7080\"}}"
        ))
        .is_empty());
        assert!(validate(&load("metrics: {listen: \":7082\"}")).is_empty());
        assert_eq!(
            fields(&validate(&load(
                "metrics: {enabled: true, listen: \":7082\"}"
            ))),
            ["metrics.listen"]
        );
    }

    #[test]
    fn api_tls_and_websocket_keys() {
        assert!(validate(&load(
            "api: {tls: {cert: /a.crt, key: /a.key}, stats_interval: 5s, ws_read_timeout: 1s}"
        ))
        .is_empty());
        let p = validate(&load(
            "api: {tls: {cert: \"\"}, ws_read_timeout: 0s, stats_interval: 10ms}",
        ));
        assert_eq!(
            fields(&p),
            [
                "api.stats_interval",
                "api.ws_read_timeout",
                "api.tls.cert",
                "api.tls.key"
            ]
        );
        let p = validate(&load("api: {allowed_origins: [\"*\", \"[a-z].x\"]}"));
        assert_eq!(
            fields(&p),
            ["api.allowed_origins", "api.allowed_origins[1]"]
        );
        assert!(p[1].message.contains("invalid wildcard"), "{p:?}");
    }

    #[test]
    fn rate_limit_only_checked_when_enabled() {
        assert!(validate(&load("rate_limit: {enabled: false}")).is_empty());
        assert!(validate(&load(
            "rate_limit: {enabled: true, requests_per_second: 0.5, burst_size: 1}"
        ))
        .is_empty());
        let p = validate(&load(
            "rate_limit: {enabled: true, requests_per_second: -1, burst_size: 1}",
        ));
        assert_eq!(fields(&p), ["rate_limit.requests_per_second"]);
    }

    #[test]
    fn domain_patterns() {
        for ok in [
            "*",
            "example.com",
            "*.example.com",
            "cdn*.example.com",
            "a*b*c.x",
            "localhost",
            "x_y.z",
            "10.0.0.1",
        ] {
            assert!(check_domain_pattern(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            " ",
            "a b.com",
            "a..b",
            ".a",
            "a.",
            "ex!.com",
            "a.*.",
            &"a".repeat(64),
        ] {
            assert!(check_domain_pattern(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn host_port() {
        for ok in [
            "proxy:3128",
            "1.2.3.4:1080",
            "[::1]:1080",
            "a.b-c.example:65535",
        ] {
            assert!(check_host_port(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "proxy",
            ":80",
            "proxy:0",
            "proxy:70000",
            "proxy:x",
            "::1:80",
            "http://p:1",
            "a b:1",
            "[::1]",
            "[zz]:1",
        ] {
            let e = check_host_port(bad);
            assert!(e.is_err(), "{bad}");
        }
    }

    #[test]
    fn bcrypt_hash_shape() {
        assert!(is_bcrypt_hash(HASH));
        assert!(is_bcrypt_hash(&HASH.replace("$2b$", "$2a$")));
        assert!(is_bcrypt_hash(&HASH.replace("$2b$", "$2y$")));
        assert!(!is_bcrypt_hash(&HASH.replace("$2b$", "$2x$")));
        assert!(!is_bcrypt_hash(&HASH.replace("$10$", "$03$")));
        assert!(!is_bcrypt_hash(&HASH.replace("$10$", "$32$")));
        assert!(!is_bcrypt_hash(&HASH[..59]));
        assert!(!is_bcrypt_hash(&format!("{}!", &HASH[..59])));
        assert!(!is_bcrypt_hash("wonderland"));
        let real = bcrypt::hash("pw", 4).unwrap();
        assert!(is_bcrypt_hash(&real), "{real}");
    }

    #[test]
    fn origin_patterns() {
        for ok in [
            "*",
            "admin.example.com",
            "*.example.com:8443",
            "https://admin.example.com",
            "http://[::1]:8080",
            "localhost:3000",
        ] {
            assert!(check_origin_pattern(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            " a.com",
            "a.com/",
            "https://a.com/x",
            "a.com:",
            "a.com:x",
            "a[b.com",
            "://a.com",
        ] {
            assert!(check_origin_pattern(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cache_problems() {
        let cfg = load(
            r#"
cache:
  default_ttl: 0s
  max_file_size: 0
  storage:
    type: tiered
    memory: {max_size: 0}
    disk: {path: "", max_size: 0, cleanup_interval: 0s}
    tiered: {memory_threshold: 1MiB}
  presets: [steam, steam, stean]
  rules:
    - {name: a, domains: ["*.ok.org", "cdn*.ok.net", "bad domain", ".x.com", "a/b"]}
    - {name: debian, domains: [x.com]}
    - {name: linux, domains: [x.com]}
    - {name: a, domains: [], ttl: 0s, methods: []}
    - {name: "", domains: [x.com], methods: [GET, POST, get, GET]}
    - {name: c, domains: [x.com], content_types: ["video/mp4", "application/", "video", "a b/c", "/x", "text/html; charset=utf-8"]}
"#,
        );
        let problems = validate(&cfg);
        let f = fields(&problems);
        let want = [
            "cache.default_ttl",
            "cache.max_file_size",
            "cache.storage.memory.max_size",
            "cache.storage.disk.path",
            "cache.storage.disk.max_size",
            "cache.storage.disk.cleanup_interval",
            "cache.storage.tiered.memory_threshold",
            "cache.presets[1]",
            "cache.presets[2]",
            "cache.rules[2].name",
            "cache.rules[0].domains[2]",
            "cache.rules[0].domains[3]",
            "cache.rules[0].domains[4]",
            "cache.rules[3].name",
            "cache.rules[3].domains",
            "cache.rules[3].ttl",
            "cache.rules[3].methods",
            "cache.rules[4].name",
            "cache.rules[4].methods[1]",
            "cache.rules[4].methods[2]",
            "cache.rules[4].methods[3]",
            "cache.rules[5].content_types[2]",
            "cache.rules[5].content_types[3]",
            "cache.rules[5].content_types[4]",
            "cache.rules[5].content_types[5]",
        ];
        for w in want {
            assert!(f.contains(&w), "missing {w} in {problems:#?}");
        }
        for not in [
            "cache.rules[0].domains[0]",
            "cache.rules[0].domains[1]",
            "cache.rules[4].methods[0]",
            "cache.rules[5].content_types[0]",
            "cache.rules[5].content_types[1]",
            "cache.presets[0]",
            "cache.rules[1].name",
        ] {
            assert!(!f.contains(&not), "unexpected {not} in {problems:#?}");
        }
        assert!(
            problems.iter().all(|p| p.section == "cache"),
            "{problems:#?}"
        );
        let dup = problems
            .iter()
            .find(|p| p.field == "cache.rules[3].name")
            .unwrap();
        assert!(dup.message.contains("cache.rules[0]"), "{dup:?}");
        let unknown = problems
            .iter()
            .find(|p| p.field == "cache.presets[2]")
            .unwrap();
        assert!(
            unknown.message.contains("stean") && unknown.message.contains("steam, epic"),
            "{unknown:?}"
        );
    }

    #[test]
    fn cache_storage_checks_follow_the_type() {
        // Memory storage: the disk settings are not used, so they are not checked.
        let cfg = load("cache: {storage: {type: memory, disk: {path: '', max_size: 0}}}");
        assert_eq!(validate(&cfg), vec![]);
        // Disk storage: the memory settings are not used.
        let cfg = load("cache: {storage: {type: disk, memory: {max_size: 0}}}");
        assert_eq!(validate(&cfg), vec![]);
        let cfg = load("cache: {storage: {type: disk, disk: {max_size: 0}}}");
        assert_eq!(fields(&validate(&cfg)), ["cache.storage.disk.max_size"]);
    }
}
