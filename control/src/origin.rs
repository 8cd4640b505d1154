//! Origin and Host checks of the management APIs and web UIs, as plain functions: no runtime,
//! no I/O. The entries of `api.allowed_origins` are parsed by the config crate
//! ([`switchyard_config::AllowedOrigins`], which validation also uses); this module decides.
//! [`OriginPolicy::check`] is the WebSocket upgrade's rule (Host and Origin);
//! [`OriginPolicy::admit`] is the rule of every HTTP request (the API guard layer,
//! `control/src/api/guard.rs`): the Host always, the Origin and `Sec-Fetch-Site` on state
//! changes, and no body a browser may send cross-site without a CORS preflight.
//!
//! A WebSocket upgrade passes when both hold:
//!
//! - **Host**: the request's Host is an IP literal, `localhost` or a name under `.localhost`,
//!   or is named by an entry (its host pattern matches the Host's name, and its port, when the
//!   entry has one, equals the Host's port). A missing or malformed Host fails.
//! - **Origin**: there is no Origin header; or the Origin's host and port equal the Host's
//!   (an omitted port is the Origin scheme's default, so `https://a` equals Host `a:443` or
//!   `a`); or an entry matches the Origin: same scheme when the entry names one, the host
//!   pattern matches the whole host, and the ports are equal (an entry without port means the
//!   default port of the Origin's scheme, so `a.example` never matches `http://a.example:8080`).
//!
//! Patterns are case-insensitive shell-style globs: `*` is any run of characters including
//! dots (but the port is never part of the text it sees), `?` one character. A lone `*` entry
//! turns both checks off. The policy is built once at startup (rule 7).

use switchyard_config::{AllowedOrigins, OriginPattern, OriginPatternError};

/// Why a request is refused (answered with 403, or 415 for the body type, and logged).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the request has no Host header")]
    MissingHost,
    #[error("the Host header `{0}` is not a valid host[:port]")]
    BadHost(String),
    #[error("the Host `{0}` is neither an IP literal nor localhost (or *.localhost), and not listed in api.allowed_origins")]
    HostNotAllowed(String),
    #[error("the Origin `{0}` is not the request's Host and matches no api.allowed_origins entry")]
    OriginNotAllowed(String),
    #[error("a state-changing request from another site (Sec-Fetch-Site: cross-site) whose Origin is not listed in api.allowed_origins")]
    CrossSite,
    #[error("a request body of type `{0}` (one a web page may send to any site without asking): send JSON as application/json")]
    SimpleBodyType(String),
}

impl Refusal {
    /// The answer's status (403, or 415 for the body type) and error code.
    pub fn status_and_code(&self) -> (u16, &'static str) {
        match self {
            Refusal::MissingHost | Refusal::BadHost(_) | Refusal::HostNotAllowed(_) => {
                (403, "HOST_NOT_ALLOWED")
            }
            Refusal::OriginNotAllowed(_) => (403, "ORIGIN_NOT_ALLOWED"),
            Refusal::CrossSite => (403, "CROSS_SITE_REQUEST"),
            Refusal::SimpleBodyType(_) => (415, "UNSUPPORTED_MEDIA_TYPE"),
        }
    }
}

/// What [`OriginPolicy::admit`] looks at in an HTTP request.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestFacts<'a> {
    /// Any method but GET, HEAD and OPTIONS.
    pub changes_state: bool,
    pub host: Option<&'a str>,
    pub origin: Option<&'a str>,
    pub sec_fetch_site: Option<&'a str>,
    pub content_type: Option<&'a str>,
    /// The request has a body (a non-zero or unknown length).
    pub has_body: bool,
    /// It came over TLS (the default port of the Host).
    pub tls: bool,
}

/// The body types a page may send cross-site without a CORS preflight (the Fetch standard's
/// CORS-safelisted `Content-Type` values).
const SIMPLE_BODY_TYPES: [&str; 3] = [
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data",
];

/// The media type of a `Content-Type` value, lowercase, without parameters.
pub fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// `api.allowed_origins` could not be turned into a policy (the server refuses to start).
#[derive(Debug, thiserror::Error)]
#[error("api.allowed_origins: {}", .0.iter().map(|(i, e)| match i { Some(i) => format!("entry {i}: {e}"), None => e.to_string() }).collect::<Vec<_>>().join("; "))]
pub struct PolicyError(pub Vec<(Option<usize>, OriginPatternError)>);

/// The checks, built from `api.allowed_origins` at startup.
#[derive(Debug, Clone)]
pub struct OriginPolicy {
    allowed: AllowedOrigins,
}

/// `scheme`, lowercase host (IPv6 in brackets, one trailing dot removed) and explicit port.
#[derive(Debug, PartialEq, Eq)]
struct Authority {
    host: String,
    port: Option<u16>,
}

impl OriginPolicy {
    pub fn new(entries: &[String]) -> Result<Self, PolicyError> {
        AllowedOrigins::parse(entries)
            .map(|allowed| Self { allowed })
            .map_err(PolicyError)
    }

    /// No entries: IP literals, loopback names and same-origin requests only.
    pub fn strict() -> Self {
        Self {
            allowed: AllowedOrigins::Patterns(Vec::new()),
        }
    }

    /// True for the lone `*` entry: nothing is checked.
    pub fn checks_disabled(&self) -> bool {
        matches!(self.allowed, AllowedOrigins::Any)
    }

    /// Checks an upgrade request: its `Origin` and `Host` header values and whether it came
    /// over TLS (the default port of the Host).
    pub fn check(
        &self,
        origin: Option<&str>,
        host: Option<&str>,
        tls: bool,
    ) -> Result<(), Refusal> {
        let patterns = match &self.allowed {
            AllowedOrigins::Any => return Ok(()),
            AllowedOrigins::Patterns(p) => p.as_slice(),
        };
        let host = check_host(patterns, host, tls)?;
        let Some(origin_value) = origin else {
            return Ok(());
        };
        check_origin(patterns, origin_value, &host)
    }

    /// Checks an HTTP request of the APIs or web UIs:
    ///
    /// 1. the Host, whatever the method (DNS rebinding: a page whose name now resolves to this
    ///    listener sends its own name as Host);
    /// 2. on a state change, an Origin that is not this listener's own or a listed one, and
    ///    `Sec-Fetch-Site: cross-site` unless the Origin is listed (cross-site requests);
    /// 3. on a state change with a body, a missing Content-Type or one of the three a page may
    ///    send anywhere without a preflight (`text/plain`, forms): refused even with `*`, as
    ///    no endpoint reads such a body.
    pub fn admit(&self, r: &RequestFacts<'_>) -> Result<(), Refusal> {
        if let AllowedOrigins::Patterns(patterns) = &self.allowed {
            let host = check_host(patterns, r.host, r.tls)?;
            if r.changes_state {
                if let Some(origin) = r.origin {
                    check_origin(patterns, origin, &host)?;
                }
                let listed = r.origin.is_some_and(|o| is_listed(patterns, o));
                if r.sec_fetch_site
                    .is_some_and(|s| s.trim().eq_ignore_ascii_case("cross-site"))
                    && !listed
                {
                    return Err(Refusal::CrossSite);
                }
            }
        }
        if r.changes_state && r.has_body {
            let media = r.content_type.map(media_type).unwrap_or_default();
            if media.is_empty() || SIMPLE_BODY_TYPES.contains(&media.as_str()) {
                let shown = r.content_type.unwrap_or("none").to_owned();
                return Err(Refusal::SimpleBodyType(shown));
            }
        }
        Ok(())
    }
}

/// A Host that is an IP literal, a loopback name or listed; its parsed authority.
fn check_host(
    patterns: &[OriginPattern],
    host: Option<&str>,
    tls: bool,
) -> Result<HostSeen, Refusal> {
    let host_value = host.ok_or(Refusal::MissingHost)?;
    let host =
        parse_authority(host_value).ok_or_else(|| Refusal::BadHost(host_value.to_owned()))?;
    let request_scheme = if tls { "https" } else { "http" };
    let host_port = host.port.or(default_port(request_scheme));
    let named = patterns
        .iter()
        .any(|p| glob(&p.host, &host.host) && p.port.is_none_or(|port| Some(port) == host_port));
    if !(is_ip_literal(&host.host) || is_loopback_name(&host.host) || named) {
        return Err(Refusal::HostNotAllowed(host_value.to_owned()));
    }
    Ok(HostSeen(host))
}

/// A Host that passed [`check_host`].
struct HostSeen(Authority);

/// An Origin that is the Host's own (same origin) or matches an entry.
fn check_origin(
    patterns: &[OriginPattern],
    origin_value: &str,
    host: &HostSeen,
) -> Result<(), Refusal> {
    let host = &host.0;
    let refused = || Refusal::OriginNotAllowed(origin_value.to_owned());
    let (scheme, origin) = parse_origin(origin_value).ok_or_else(refused)?;
    let origin_port = origin.port.or(default_port(&scheme));
    // Same origin: the Host as the browser addressed it (its port defaults like the Origin's).
    if origin.host == host.host && origin_port == host.port.or(default_port(&scheme)) {
        return Ok(());
    }
    if is_listed(patterns, origin_value) {
        return Ok(());
    }
    Err(refused())
}

/// The Origin matches an `api.allowed_origins` entry.
fn is_listed(patterns: &[OriginPattern], origin_value: &str) -> bool {
    let Some((scheme, origin)) = parse_origin(origin_value) else {
        return false;
    };
    let origin_port = origin.port.or(default_port(&scheme));
    patterns
        .iter()
        .any(|p| origin_matches(p, &scheme, &origin.host, origin_port))
}

fn origin_matches(p: &OriginPattern, scheme: &str, host: &str, port: Option<u16>) -> bool {
    if p.scheme.as_deref().is_some_and(|s| s != scheme) {
        return false;
    }
    let pattern_port = p.port.or(default_port(scheme));
    glob(&p.host, host) && pattern_port == port
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" | "ws" => Some(80),
        "https" | "wss" => Some(443),
        _ => None,
    }
}

fn is_ip_literal(host: &str) -> bool {
    host.parse::<std::net::Ipv4Addr>().is_ok()
        || host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok())
}

fn is_loopback_name(host: &str) -> bool {
    host == "localhost" || host.ends_with(".localhost")
}

/// `host[:port]` as in a Host header or an origin's authority.
fn parse_authority(s: &str) -> Option<Authority> {
    if s.is_empty()
        || s.bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return None;
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        h.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            a => Some(a.strip_prefix(':')?),
        };
        (format!("[{}]", h.to_ascii_lowercase()), port)
    } else {
        let (h, port) = match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        };
        if h.is_empty() || h.contains([':', '/', '@', '[', ']', '?', '#']) {
            return None;
        }
        let h = h.strip_suffix('.').unwrap_or(h);
        (h.to_ascii_lowercase(), port)
    };
    let port = match port {
        None => None,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            Some(p.parse::<u16>().ok()?)
        }
        Some(_) => return None,
    };
    Some(Authority { host, port })
}

/// An `Origin` header value: `scheme://host[:port]` (`null` and anything with a path are not
/// origins that can match).
fn parse_origin(s: &str) -> Option<(String, Authority)> {
    let (scheme, rest) = s.split_once("://")?;
    if scheme.is_empty()
        || !scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        || !scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    {
        return None;
    }
    Some((scheme.to_ascii_lowercase(), parse_authority(rest)?))
}

/// Shell-style glob over the whole of `text` (both lowercase): `*` any run (dots included),
/// `?` one character, everything else literal.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == b'?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn policy(entries: &[&str]) -> OriginPolicy {
        OriginPolicy::new(&entries.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).unwrap()
    }

    /// (rule, allowed_origins, Origin, Host, tls, accepted)
    type Case = (
        &'static str,
        &'static [&'static str],
        Option<&'static str>,
        Option<&'static str>,
        bool,
        bool,
    );

    const CASES: &[Case] = &[
        // The table: same origin, listed origin, no Origin, anything else.
        (
            "same origin",
            &[],
            Some("http://127.0.0.1:7082"),
            Some("127.0.0.1:7082"),
            false,
            true,
        ),
        (
            "same origin, names differ in case",
            &[],
            Some("http://LocalHost:7082"),
            Some("localhost:7082"),
            false,
            true,
        ),
        (
            "same origin, default port omitted",
            &[],
            Some("http://127.0.0.1"),
            Some("127.0.0.1:80"),
            false,
            true,
        ),
        (
            "same origin, https default port",
            &[],
            Some("https://localhost"),
            Some("localhost"),
            true,
            true,
        ),
        (
            "same host, other port",
            &[],
            Some("http://127.0.0.1:9999"),
            Some("127.0.0.1:7082"),
            false,
            false,
        ),
        (
            "Host without port takes the Origin's default",
            &[],
            Some("https://127.0.0.1"),
            Some("127.0.0.1"),
            false,
            true,
        ),
        (
            "same host, other default port",
            &[],
            Some("https://127.0.0.1"),
            Some("127.0.0.1:80"),
            false,
            false,
        ),
        ("no Origin", &[], None, Some("127.0.0.1:7082"), false, true),
        (
            "foreign origin",
            &[],
            Some("http://evil.example"),
            Some("127.0.0.1:7082"),
            false,
            false,
        ),
        (
            "null origin",
            &[],
            Some("null"),
            Some("127.0.0.1:7082"),
            false,
            false,
        ),
        (
            "origin with a path",
            &[],
            Some("http://127.0.0.1:7082/x"),
            Some("127.0.0.1:7082"),
            false,
            false,
        ),
        (
            "garbage origin",
            &[],
            Some("127.0.0.1:7082"),
            Some("127.0.0.1:7082"),
            false,
            false,
        ),
        // Host: IP literal, loopback names, listed, else refused.
        ("host ipv4", &[], None, Some("10.1.2.3:7082"), false, true),
        ("host ipv6", &[], None, Some("[::1]:7082"), false, true),
        (
            "host ipv6 no port",
            &[],
            None,
            Some("[2001:db8::1]"),
            false,
            true,
        ),
        (
            "host localhost",
            &[],
            None,
            Some("localhost:7082"),
            false,
            true,
        ),
        ("host LOCALHOST", &[], None, Some("LOCALHOST"), false, true),
        (
            "host under .localhost",
            &[],
            None,
            Some("app.dev.localhost:7082"),
            false,
            true,
        ),
        (
            "host localhost. (trailing dot)",
            &[],
            None,
            Some("localhost.:7082"),
            false,
            true,
        ),
        (
            "host not loopback-like",
            &[],
            None,
            Some("localhost.evil.com"),
            false,
            false,
        ),
        (
            "host suffix trick",
            &[],
            None,
            Some("evillocalhost"),
            false,
            false,
        ),
        (
            "host name unlisted",
            &[],
            None,
            Some("gw.lan:7082"),
            false,
            false,
        ),
        (
            "host name unlisted even if same origin",
            &[],
            Some("http://gw.lan:7082"),
            Some("gw.lan:7082"),
            false,
            false,
        ),
        (
            "host listed by name",
            &["gw.lan"],
            Some("http://gw.lan:7082"),
            Some("gw.lan:7082"),
            false,
            true,
        ),
        (
            "host listed with its port",
            &["gw.lan:7082"],
            None,
            Some("GW.LAN:7082"),
            false,
            true,
        ),
        (
            "host listed with another port",
            &["gw.lan:9000"],
            None,
            Some("gw.lan:7082"),
            false,
            false,
        ),
        (
            "host listed by wildcard",
            &["*.lan"],
            None,
            Some("gw.lan:7082"),
            false,
            true,
        ),
        (
            "host listed by scheme-qualified entry",
            &["https://gw.lan"],
            None,
            Some("gw.lan"),
            true,
            true,
        ),
        ("host missing", &[], None, None, false, false),
        (
            "host not an ipv4 (octal-ish)",
            &[],
            None,
            Some("127.1"),
            false,
            false,
        ),
        ("host malformed", &[], None, Some("a b"), false, false),
        ("host bare ipv6", &[], None, Some("::1"), false, false),
        // Rule 1: host patterns, scheme-qualified origins, case-insensitive, shell wildcards.
        (
            "r1 host pattern",
            &["admin.example.com"],
            Some("https://admin.example.com"),
            Some("127.0.0.1"),
            false,
            true,
        ),
        (
            "r1 case-insensitive",
            &["Admin.Example.com"],
            Some("HTTPS://ADMIN.example.COM"),
            Some("127.0.0.1"),
            false,
            true,
        ),
        (
            "r1 scheme-qualified",
            &["https://admin.example.com"],
            Some("https://admin.example.com"),
            Some("127.0.0.1"),
            false,
            true,
        ),
        (
            "r1 scheme must match",
            &["https://admin.example.com"],
            Some("http://admin.example.com"),
            Some("127.0.0.1"),
            false,
            false,
        ),
        (
            "r1 ? is one character",
            &["app?.example.com"],
            Some("https://app1.example.com"),
            Some("127.0.0.1"),
            false,
            true,
        ),
        (
            "r1 ? is exactly one",
            &["app?.example.com"],
            Some("https://app.example.com"),
            Some("127.0.0.1"),
            false,
            false,
        ),
        (
            "r1 wildcard inside a label",
            &["cdn*.example.com"],
            Some("https://cdn42.example.com"),
            Some("127.0.0.1"),
            false,
            true,
        ),
        (
            "r1 other scheme",
            &["chrome-extension://abcdef"],
            Some("chrome-extension://abcdef"),
            Some("127.0.0.1"),
            false,
            true,
        ),
        // Rule 2: ports literal; no port in the entry = the scheme's default port only.
        (
            "r2 port literal",
            &["a.example:8443"],
            Some("https://a.example:8443"),
            Some("127.0.0.1"),
            false,
            true,
        ),
        (
            "r2 other port",
            &["a.example:8443"],
            Some("https://a.example:8444"),
            Some("127.0.0.1"),
            false,
            false,
        ),
        (
            "r2 entry port, origin default",
            &["a.example:8443"],
            Some("https://a.example"),
            Some("127.0.0.1"),
            false,
            false,
        ),
        (
            "r2 no port vs origin port",
            &["a.example"],
            Some("http://a.example:8080"),
            Some("127.0.0.1"),
            false,
            false,
        ),
        (
            "r2 no port vs http",
            &["a.example"],
            Some("http://a.example"),
            Some("127.0.0.1"),
            false,
            true,
        ),
        (
            "r2 no port vs https",
            &["a.example"],
            Some("https://a.example"),
            Some("127.0.0.1"),
            false,
            true,
        ),
        (
            "r2 explicit 443 vs https",
            &["a.example:443"],
            Some("https://a.example"),
            Some("127.0.0.1"),
            false,
            true,
        ),
        (
            "r2 https entry with 443",
            &["https://a.example:443"],
            Some("https://a.example"),
            Some("127.0.0.1"),
            false,
            true,
        ),
        (
            "r2 http default port written",
            &["a.example"],
            Some("http://a.example:80"),
            Some("127.0.0.1"),
            false,
            true,
        ),
        (
            "r2 https entry vs 443 on http",
            &["a.example"],
            Some("http://a.example:443"),
            Some("127.0.0.1"),
            false,
            false,
        ),
        // Rule 3: `*` spans dots but never the port separator.
        (
            "r3 one label",
            &["*.x.y"],
            Some("https://a.x.y"),
            Some("127.0.0.1"),
            false,
            true,
        ),
        (
            "r3 spans dots",
            &["*.x.y"],
            Some("https://a.b.x.y"),
            Some("127.0.0.1"),
            false,
            true,
        ),
        (
            "r3 not the port",
            &["*.x.y"],
            Some("https://a.x.y:1234"),
            Some("127.0.0.1"),
            false,
            false,
        ),
        (
            "r3 needs the dot",
            &["*.x.y"],
            Some("https://x.y"),
            Some("127.0.0.1"),
            false,
            false,
        ),
        (
            "r3 with port",
            &["*.x.y:1234"],
            Some("https://a.b.x.y:1234"),
            Some("127.0.0.1"),
            false,
            true,
        ),
        (
            "r3 star host with port",
            &["*:3000"],
            Some("http://anything.example:3000"),
            Some("127.0.0.1"),
            false,
            true,
        ),
        (
            "r3 star host other port",
            &["*:3000"],
            Some("http://anything.example:3001"),
            Some("127.0.0.1"),
            false,
            false,
        ),
        // Rule 4: whole host only.
        (
            "r4 longer suffix",
            &["example.com"],
            Some("https://evilexample.com"),
            Some("127.0.0.1"),
            false,
            false,
        ),
        (
            "r4 subdomain",
            &["example.com"],
            Some("https://a.example.com"),
            Some("127.0.0.1"),
            false,
            false,
        ),
        (
            "r4 prefix",
            &["example.com"],
            Some("https://example.com.evil.net"),
            Some("127.0.0.1"),
            false,
            false,
        ),
        (
            "r4 wildcard prefix",
            &["*.example.com"],
            Some("https://a.example.com.evil.net"),
            Some("127.0.0.1"),
            false,
            false,
        ),
        (
            "r4 wildcard suffix trick",
            &["*.example.com"],
            Some("https://evil-example.com"),
            Some("127.0.0.1"),
            false,
            false,
        ),
        // Rule 6: a lone `*` disables both checks.
        (
            "r6 star: any origin",
            &["*"],
            Some("http://evil.example"),
            Some("evil.example"),
            false,
            true,
        ),
        ("r6 star: no host", &["*"], Some("null"), None, false, true),
    ];

    #[test]
    fn the_table_and_the_rules() {
        let mut failures = Vec::new();
        for (name, entries, origin, host, tls, accepted) in CASES {
            let got = policy(entries).check(*origin, *host, *tls);
            if got.is_ok() != *accepted {
                failures.push(format!(
                    "{name}: {entries:?} origin={origin:?} host={host:?} tls={tls} -> {got:?}"
                ));
            }
        }
        assert!(
            failures.is_empty(),
            "{} cases wrong:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    /// (rule, allowed_origins, method is a write, Host, Origin, Sec-Fetch-Site, Content-Type,
    /// has a body, refused with this code or accepted)
    type RequestCase = (
        &'static str,
        &'static [&'static str],
        bool,
        Option<&'static str>,
        Option<&'static str>,
        Option<&'static str>,
        Option<&'static str>,
        bool,
        Option<&'static str>,
    );

    const H: Option<&str> = Some("127.0.0.1:7383");
    const SAME: Option<&str> = Some("http://127.0.0.1:7383");
    const EVIL: Option<&str> = Some("http://evil.example");
    const JSON: Option<&str> = Some("application/json");

    const REQUEST_CASES: &[RequestCase] = &[
        // Host: every method.
        (
            "GET, loopback IP",
            &[],
            false,
            H,
            None,
            None,
            None,
            false,
            None,
        ),
        (
            "GET, localhost",
            &[],
            false,
            Some("localhost:7383"),
            None,
            None,
            None,
            false,
            None,
        ),
        (
            "GET, LAN IP (PAC)",
            &[],
            false,
            Some("192.168.1.2:7082"),
            None,
            None,
            None,
            false,
            None,
        ),
        (
            "GET, rebinding name",
            &[],
            false,
            Some("evil.example:7082"),
            None,
            None,
            None,
            false,
            Some("HOST_NOT_ALLOWED"),
        ),
        (
            "GET, no Host",
            &[],
            false,
            None,
            None,
            None,
            None,
            false,
            Some("HOST_NOT_ALLOWED"),
        ),
        (
            "GET, gateway name listed",
            &["gw.lan"],
            false,
            Some("gw.lan:7082"),
            None,
            None,
            None,
            false,
            None,
        ),
        (
            "GET, gateway name unlisted",
            &[],
            false,
            Some("gw.lan:7082"),
            None,
            None,
            None,
            false,
            Some("HOST_NOT_ALLOWED"),
        ),
        (
            "POST, rebinding name, same origin",
            &[],
            true,
            Some("evil.example:7383"),
            Some("http://evil.example:7383"),
            Some("same-origin"),
            JSON,
            true,
            Some("HOST_NOT_ALLOWED"),
        ),
        // GET: a foreign Origin or cross-site fetch cannot change anything, and cannot read
        // the answer without CORS.
        (
            "GET, foreign Origin",
            &[],
            false,
            H,
            EVIL,
            Some("cross-site"),
            None,
            false,
            None,
        ),
        // Writes: Origin.
        (
            "POST, no Origin (curl, mobile app)",
            &[],
            true,
            H,
            None,
            None,
            None,
            false,
            None,
        ),
        (
            "POST, no Origin, JSON",
            &[],
            true,
            H,
            None,
            None,
            JSON,
            true,
            None,
        ),
        (
            "POST, same origin (dashboard)",
            &[],
            true,
            H,
            SAME,
            Some("same-origin"),
            JSON,
            true,
            None,
        ),
        (
            "POST, same origin, body-less",
            &[],
            true,
            H,
            SAME,
            Some("same-origin"),
            None,
            false,
            None,
        ),
        (
            "POST, foreign Origin, body-less",
            &[],
            true,
            H,
            EVIL,
            None,
            None,
            false,
            Some("ORIGIN_NOT_ALLOWED"),
        ),
        (
            "DELETE, foreign Origin",
            &[],
            true,
            H,
            EVIL,
            Some("cross-site"),
            None,
            false,
            Some("ORIGIN_NOT_ALLOWED"),
        ),
        (
            "PUT, foreign Origin, JSON",
            &[],
            true,
            H,
            EVIL,
            None,
            JSON,
            true,
            Some("ORIGIN_NOT_ALLOWED"),
        ),
        (
            "POST, null Origin",
            &[],
            true,
            H,
            Some("null"),
            None,
            None,
            false,
            Some("ORIGIN_NOT_ALLOWED"),
        ),
        (
            "POST, other loopback port",
            &[],
            true,
            H,
            Some("http://127.0.0.1:9000"),
            Some("same-site"),
            None,
            false,
            Some("ORIGIN_NOT_ALLOWED"),
        ),
        (
            "POST, listed Origin",
            &["https://admin.example.com"],
            true,
            H,
            Some("https://admin.example.com"),
            Some("cross-site"),
            JSON,
            true,
            None,
        ),
        // Writes: Sec-Fetch-Site.
        (
            "POST, cross-site without Origin",
            &[],
            true,
            H,
            None,
            Some("cross-site"),
            None,
            false,
            Some("CROSS_SITE_REQUEST"),
        ),
        (
            "POST, cross-site, case",
            &[],
            true,
            H,
            None,
            Some("Cross-Site"),
            None,
            false,
            Some("CROSS_SITE_REQUEST"),
        ),
        (
            "POST, same-site without Origin",
            &[],
            true,
            H,
            None,
            Some("same-site"),
            None,
            false,
            None,
        ),
        (
            "POST, user typed (none)",
            &[],
            true,
            H,
            None,
            Some("none"),
            None,
            false,
            None,
        ),
        // Writes: bodies a page may send without a preflight.
        (
            "POST, text/plain",
            &[],
            true,
            H,
            None,
            None,
            Some("text/plain"),
            true,
            Some("UNSUPPORTED_MEDIA_TYPE"),
        ),
        (
            "POST, text/plain, same origin",
            &[],
            true,
            H,
            SAME,
            None,
            Some("text/plain;charset=UTF-8"),
            true,
            Some("UNSUPPORTED_MEDIA_TYPE"),
        ),
        (
            "POST, form",
            &[],
            true,
            H,
            None,
            None,
            Some("application/x-www-form-urlencoded"),
            true,
            Some("UNSUPPORTED_MEDIA_TYPE"),
        ),
        (
            "POST, multipart",
            &[],
            true,
            H,
            None,
            None,
            Some("Multipart/Form-Data; boundary=x"),
            true,
            Some("UNSUPPORTED_MEDIA_TYPE"),
        ),
        (
            "POST, body without type",
            &[],
            true,
            H,
            None,
            None,
            None,
            true,
            Some("UNSUPPORTED_MEDIA_TYPE"),
        ),
        (
            "POST, yaml",
            &[],
            true,
            H,
            None,
            None,
            Some("application/yaml"),
            true,
            None,
        ),
        (
            "POST, octet-stream",
            &[],
            true,
            H,
            None,
            None,
            Some("application/octet-stream"),
            true,
            None,
        ),
        (
            "POST, text/plain type but no body",
            &[],
            true,
            H,
            None,
            None,
            Some("text/plain"),
            false,
            None,
        ),
        (
            "GET, text/plain body",
            &[],
            false,
            H,
            None,
            None,
            Some("text/plain"),
            true,
            None,
        ),
        // `*`: no Host, Origin or site checks; the body rule stays.
        (
            "star: foreign everything",
            &["*"],
            true,
            Some("evil.example"),
            EVIL,
            Some("cross-site"),
            JSON,
            true,
            None,
        ),
        (
            "star: text/plain",
            &["*"],
            true,
            Some("evil.example"),
            EVIL,
            None,
            Some("text/plain"),
            true,
            Some("UNSUPPORTED_MEDIA_TYPE"),
        ),
    ];

    #[test]
    fn request_table() {
        let mut failures = Vec::new();
        for &(name, entries, changes_state, host, origin, site, ctype, has_body, want) in
            REQUEST_CASES
        {
            let facts = RequestFacts {
                changes_state,
                host,
                origin,
                sec_fetch_site: site,
                content_type: ctype,
                has_body,
                tls: false,
            };
            let got = policy(entries).admit(&facts);
            let code = got.as_ref().err().map(|r| r.status_and_code().1);
            if code != want {
                failures.push(format!("{name}: want {want:?}, got {got:?}"));
            }
        }
        assert!(
            failures.is_empty(),
            "{} cases wrong:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    #[test]
    fn body_type_refusal_is_415() {
        let r = Refusal::SimpleBodyType("text/plain".into());
        assert_eq!(r.status_and_code(), (415, "UNSUPPORTED_MEDIA_TYPE"));
        assert_eq!(Refusal::CrossSite.status_and_code().0, 403);
        assert_eq!(
            media_type(" Application/JSON ; charset=utf-8"),
            "application/json"
        );
    }

    #[test]
    fn refusals_say_what_failed() {
        let p = policy(&[]);
        assert_eq!(p.check(None, None, false), Err(Refusal::MissingHost));
        assert_eq!(
            p.check(None, Some("gw.lan"), false),
            Err(Refusal::HostNotAllowed("gw.lan".into()))
        );
        assert!(p
            .check(None, Some("gw.lan"), false)
            .unwrap_err()
            .to_string()
            .contains("neither an IP literal"));
        assert_eq!(
            p.check(None, Some("a:b:c"), false),
            Err(Refusal::BadHost("a:b:c".into()))
        );
        assert_eq!(
            p.check(Some("http://evil"), Some("127.0.0.1"), false),
            Err(Refusal::OriginNotAllowed("http://evil".into()))
        );
    }

    /// Rule 5 (bad entries refuse startup) and rule 6 (`*` alone, with a warning at startup).
    #[test]
    fn bad_lists_refuse_to_build() {
        for bad in [
            &["a.example/path"][..],
            &[" a.example"],
            &["a.example "],
            &["[a-z].example"],
            &["{a,b}.example"],
            &["a.example:*"],
            &["*", "a.example"],
            &["a.example", "*"],
        ] {
            let entries: Vec<String> = bad.iter().map(|s| (*s).to_owned()).collect();
            let err = OriginPolicy::new(&entries).expect_err(&format!("{bad:?}"));
            assert!(
                err.to_string().starts_with("api.allowed_origins: "),
                "{err}"
            );
        }
        assert!(policy(&["*"]).checks_disabled());
        assert!(!policy(&[]).checks_disabled());
        assert!(!policy(&["*.a"]).checks_disabled());
    }

    #[test]
    fn glob_edge_cases() {
        for (p, t, want) in [
            ("*", "", true),
            ("*", "a.b.c", true),
            ("a*", "a", true),
            ("*a", "ba", true),
            ("*a*b", "xaxxb", true),
            ("*a*b", "xaxxbx", false),
            ("a**b", "ab", true),
            ("?", "", false),
            ("a?c", "abc", true),
            ("", "", true),
            ("", "a", false),
        ] {
            assert_eq!(glob(p, t), want, "{p} vs {t}");
        }
    }
}
