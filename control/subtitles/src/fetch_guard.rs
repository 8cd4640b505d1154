//! The fetch guard against server-side request forgery: a caller names URLs (the video page,
//! through it caption tracks and media, a tier 1–2 `api_url`), and without a guard the
//! appliance would fetch its own services and its LAN for them. [`FetchPolicy`] (runtime-free)
//! says which addresses may be fetched: public ones, plus what `fetch.allow` lists, or
//! everything with `fetch.allow_private`.
//!
//! Enforcement happens where addresses are chosen, so DNS cannot answer differently between
//! the check and the connection: [`GuardedResolver`] is the HTTP client's resolver (a name is
//! resolved once, refused addresses are dropped, the connection goes to what was checked), and
//! [`check_url_static`] covers what never reaches a resolver — IP-literal hosts, before a
//! request and on every redirect ([`redirect_policy`]). [`check_url`] resolves ahead of time
//! only to refuse a bad URL with a clear 400 before a job starts; it is not what keeps the
//! connection safe. yt-dlp's own traffic goes through [`crate::guard_proxy`], which applies
//! the same [`resolve_checked`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use switchyard_config::subtitles::{FetchAllow, SubtitlesFetch};
use url::{Host, Url};

/// Which addresses may be fetched for a caller.
#[derive(Debug, Clone, Default)]
pub struct FetchPolicy {
    allow_private: bool,
    nets: Vec<IpNet>,
    /// Lowercase host names without a trailing dot.
    hosts: Vec<String>,
}

/// Why a fetch was refused. Carried through reqwest's error chain (see [`refused_in`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{host} {why}; refused (allow it with fetch.allow or fetch.allow_private)")]
pub struct Refused {
    pub host: String,
    pub why: String,
}

impl Refused {
    fn address(host: &str, ip: IpAddr) -> Refused {
        Refused {
            host: host.to_string(),
            why: if host == ip.to_string() || host.trim_matches(['[', ']']) == ip.to_string() {
                format!("is an internal address ({})", kind(ip))
            } else {
                format!("resolves to an internal address ({ip}, {})", kind(ip))
            },
        }
    }
}

impl FetchPolicy {
    /// From `fetch:`; entries that do not parse were reported by config validation and are
    /// ignored here.
    pub fn from_config(cfg: &SubtitlesFetch) -> FetchPolicy {
        let mut policy = FetchPolicy {
            allow_private: cfg.allow_private,
            ..FetchPolicy::default()
        };
        for entry in &cfg.allow {
            match FetchAllow::parse(entry) {
                Ok(FetchAllow::Net(n)) => policy.nets.push(n),
                Ok(FetchAllow::Host(h)) => policy.hosts.push(h),
                Err(_) => {}
            }
        }
        policy
    }

    /// Whether internal addresses are allowed across the board.
    pub fn allows_private(&self) -> bool {
        self.allow_private
    }

    /// Whether a connection to `ip` is allowed.
    pub fn permits_ip(&self, ip: IpAddr) -> bool {
        self.allow_private
            || !is_internal(ip)
            || self
                .nets
                .iter()
                .any(|n| n.contains(&ip) || canonical(ip).is_some_and(|v4| n.contains(&v4)))
    }

    /// Whether the host name is listed in `fetch.allow` (then every address it has is allowed).
    pub fn permits_host_name(&self, host: &str) -> bool {
        let h = host.trim_end_matches('.').to_ascii_lowercase();
        self.hosts.contains(&h)
    }
}

/// The IPv4 address an IPv6 address carries (mapped, compatible, NAT64, 6to4), if any.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let v4 = |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    match s {
        // ::ffff:a.b.c.d (mapped) and ::a.b.c.d (compatible, deprecated; not :: or ::1)
        [0, 0, 0, 0, 0, 0xffff, hi, lo] => Some(v4(hi, lo)),
        [0, 0, 0, 0, 0, 0, hi, lo] if hi != 0 => Some(v4(hi, lo)),
        // 64:ff9b::/96 (NAT64 well-known prefix)
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(v4(hi, lo)),
        // 2002:AABB:CCDD::/48 (6to4)
        [0x2002, hi, lo, ..] => Some(v4(hi, lo)),
        _ => None,
    }
}

fn canonical(ip: IpAddr) -> Option<IpAddr> {
    match ip {
        IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
        IpAddr::V4(_) => None,
    }
}

/// What kind of internal address `ip` is (for messages).
fn kind(ip: IpAddr) -> &'static str {
    match ip {
        IpAddr::V4(v4) => kind_v4(v4).unwrap_or("public"),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) if kind_v4(v4).is_some() => "an IPv4 internal address inside IPv6",
            _ => kind_v6(v6).unwrap_or("public"),
        },
    }
}

fn kind_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_private() {
        Some("private")
    } else if ip.is_link_local() {
        Some("link-local")
    } else if a == 0 {
        Some("unspecified / this network")
    } else if a == 100 && (64..128).contains(&b) {
        Some("carrier-grade NAT")
    } else if a == 192 && b == 0 && ip.octets()[2] == 0 {
        Some("IETF protocol assignments")
    } else if a == 198 && (b == 18 || b == 19) {
        Some("benchmarking")
    } else if ip.is_multicast() {
        Some("multicast")
    } else if a >= 240 {
        Some("reserved / broadcast")
    } else {
        None
    }
}

fn kind_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() {
        Some("unspecified")
    } else if first & 0xfe00 == 0xfc00 {
        Some("unique-local")
    } else if first & 0xffc0 == 0xfe80 {
        Some("link-local")
    } else if first & 0xffc0 == 0xfec0 {
        Some("site-local")
    } else if first & 0xff00 == 0xff00 {
        Some("multicast")
    } else {
        None
    }
}

/// Loopback, private, link-local, unique-local, CGNAT, multicast, unspecified, reserved — and
/// IPv6 addresses that carry such an IPv4 address.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => kind_v4(v4).is_some(),
        IpAddr::V6(v6) => {
            kind_v6(v6).is_some() || embedded_v4(v6).is_some_and(|v4| kind_v4(v4).is_some())
        }
    }
}

/// The checks that need no DNS: the scheme is http(s), and an IP-literal host is allowed.
/// Host names pass here; the resolver checks them when the connection is made.
pub fn check_url_static(policy: &FetchPolicy, url: &Url) -> Result<(), Refused> {
    let refused = |why: &str| Refused {
        host: url.host_str().unwrap_or_default().to_string(),
        why: why.to_string(),
    };
    if !matches!(url.scheme(), "http" | "https") {
        return Err(refused("is not an http(s) URL"));
    }
    match url.host() {
        Some(Host::Ipv4(v4)) if !policy.permits_ip(IpAddr::V4(v4)) => {
            Err(Refused::address(&v4.to_string(), IpAddr::V4(v4)))
        }
        Some(Host::Ipv6(v6)) if !policy.permits_ip(IpAddr::V6(v6)) => {
            Err(Refused::address(&v6.to_string(), IpAddr::V6(v6)))
        }
        Some(_) => Ok(()),
        None => Err(refused("(no host)")),
    }
}

/// Why [`resolve_checked`] gave no address.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error("cannot resolve {host}: {source}")]
    Lookup {
        host: String,
        #[source]
        source: std::io::Error,
    },
}

/// Resolves `host` (a name or an IP literal, IPv6 with or without brackets) and keeps the
/// addresses the policy allows; refused when none is left.
pub async fn resolve_checked(
    policy: &FetchPolicy,
    host: &str,
) -> Result<Vec<IpAddr>, ResolveError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return if policy.permits_ip(ip) {
            Ok(vec![ip])
        } else {
            Err(Refused::address(bare, ip).into())
        };
    }
    let found: Vec<IpAddr> = tokio::net::lookup_host((bare, 0))
        .await
        .map_err(|source| ResolveError::Lookup {
            host: bare.to_string(),
            source,
        })?
        .map(|a| a.ip())
        .collect();
    if policy.permits_host_name(bare) {
        return Ok(found);
    }
    let mut refused = None;
    let allowed: Vec<IpAddr> = found
        .into_iter()
        .filter(|ip| {
            let ok = policy.permits_ip(*ip);
            if !ok && refused.is_none() {
                refused = Some(*ip);
            }
            ok
        })
        .collect();
    match (allowed.is_empty(), refused) {
        (true, Some(ip)) => Err(Refused::address(bare, ip).into()),
        _ => Ok(allowed),
    }
}

/// Checks a URL ahead of a job, resolving its host, so a refused URL is a clear 400. A name
/// that does not resolve passes (the fetch reports it as it always did).
pub async fn check_url(policy: &FetchPolicy, url: &Url) -> Result<(), Refused> {
    check_url_static(policy, url)?;
    if policy.allows_private() {
        return Ok(());
    }
    if let Some(Host::Domain(name)) = url.host() {
        if let Err(ResolveError::Refused(r)) = resolve_checked(policy, name).await {
            return Err(r);
        }
    }
    Ok(())
}

/// The HTTP client's resolver: every connection to a name goes only to addresses the policy
/// allows, and to exactly the addresses this lookup returned.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    policy: Arc<FetchPolicy>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let ips = resolve_checked(&policy, &host).await.map_err(
                |e| -> Box<dyn std::error::Error + Send + Sync> {
                    match e {
                        ResolveError::Refused(r) => Box::new(r),
                        other => Box::new(other),
                    }
                },
            )?;
            let addrs: reqwest::dns::Addrs =
                Box::new(ips.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

/// Follows up to 10 redirects, each checked with [`check_url_static`] (names are checked by
/// the resolver when the redirect's connection is made).
pub fn redirect_policy(policy: Arc<FetchPolicy>) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() > 10 {
            return attempt.error("more than 10 redirects");
        }
        match check_url_static(&policy, attempt.url()) {
            Ok(()) => attempt.follow(),
            Err(r) => attempt.error(r),
        }
    })
}

/// An HTTP client for caller-named URLs: guarded resolver and redirects, and no proxy from the
/// environment (a proxy would resolve names where the guard cannot see them).
pub fn guarded_client(
    policy: Arc<FetchPolicy>,
    user_agent: &str,
    connect_timeout: Duration,
) -> reqwest::Result<reqwest::Client> {
    switchyard_service::tls::use_ring_provider();
    reqwest::Client::builder()
        .user_agent(user_agent)
        .connect_timeout(connect_timeout)
        .no_proxy()
        .dns_resolver(Arc::new(GuardedResolver {
            policy: policy.clone(),
        }))
        .redirect(redirect_policy(policy))
        .build()
}

/// The [`Refused`] somewhere in an error's source chain, if the guard caused the error.
pub fn refused_in<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refused> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(r) = e.downcast_ref::<Refused>() {
            return Some(r);
        }
        cur = e.source();
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn policy(allow_private: bool, allow: &[&str]) -> FetchPolicy {
        FetchPolicy::from_config(&SubtitlesFetch {
            allow_private,
            allow: allow.iter().map(|s| s.to_string()).collect(),
        })
    }

    #[test]
    fn internal_addresses() {
        for s in [
            "127.0.0.1",
            "127.255.0.9",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.2.3",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:c0a8:0101::1",
        ] {
            assert!(is_internal(ip(s)), "{s}");
        }
        for s in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "2002:0808:0808::1",
        ] {
            assert!(!is_internal(ip(s)), "{s}");
        }
    }

    #[test]
    fn default_refuses_internal_and_allow_entries_open_exceptions() {
        let p = policy(false, &[]);
        assert!(!p.permits_ip(ip("127.0.0.1")));
        assert!(p.permits_ip(ip("93.184.216.34")));
        let p = policy(false, &["127.0.0.1", "10.20.0.0/16", "Media.Lan"]);
        assert!(p.permits_ip(ip("127.0.0.1")));
        assert!(
            p.permits_ip(ip("::ffff:127.0.0.1")),
            "the mapped form of an allowed address"
        );
        assert!(!p.permits_ip(ip("127.0.0.2")));
        assert!(p.permits_ip(ip("10.20.9.9")));
        assert!(!p.permits_ip(ip("10.21.0.1")));
        assert!(!p.permits_ip(ip("::1")));
        assert!(p.permits_host_name("media.lan."));
        assert!(!p.permits_host_name("other.lan"));
        assert!(policy(true, &[]).permits_ip(ip("192.168.0.1")));
    }

    #[test]
    fn static_url_checks() {
        let p = policy(false, &["127.0.0.1"]);
        let u = |s: &str| Url::parse(s).unwrap();
        assert!(check_url_static(&p, &u("http://127.0.0.1:8080/x")).is_ok());
        assert!(check_url_static(&p, &u("https://example.com/x")).is_ok());
        assert!(
            check_url_static(&p, &u("http://localhost/x")).is_ok(),
            "names are the resolver's job"
        );
        for bad in [
            "http://127.0.0.2/",
            "http://[::1]:80/",
            "http://[::ffff:7f00:2]/",
            "http://0x7f.2/",
            "http://2130706434/",
            "http://169.254.169.254/latest/meta-data/",
            "ftp://1.1.1.1/",
            "file:///etc/passwd",
        ] {
            let err = check_url_static(&p, &u(bad)).unwrap_err();
            assert!(err.to_string().contains("refused"), "{bad}: {err}");
        }
        let err = check_url_static(&p, &u("http://10.0.0.7/")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "10.0.0.7 is an internal address (private); refused (allow it with fetch.allow or fetch.allow_private)"
        );
    }

    /// A loopback origin: `/r` redirects to `location`, anything else is `200 ok`.
    async fn origin(location: String) -> u16 {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = vec![0u8; 2048];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                let resp = if req.starts_with("GET /r ") {
                    format!("HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                } else {
                    "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok".into()
                };
                let _ = s.write_all(resp.as_bytes()).await;
            }
        });
        port
    }

    async fn get(policy: FetchPolicy, url: String) -> Result<u16, Option<Refused>> {
        let client = guarded_client(Arc::new(policy), "t", Duration::from_secs(5)).unwrap();
        match client.get(url).send().await {
            Ok(r) => Ok(r.status().as_u16()),
            Err(e) => Err(refused_in(&e).cloned()),
        }
    }

    #[tokio::test]
    async fn the_client_resolves_through_the_guard_and_checks_redirects() {
        let port = origin("http://127.0.0.1:1/x".into()).await;
        // a name is refused by the resolver when the connection is made (no pre-check here)
        let err = get(policy(false, &[]), format!("http://localhost:{port}/"))
            .await
            .unwrap_err();
        assert!(
            err.is_some_and(|r| r.host == "localhost"),
            "refused by the resolver"
        );
        // the same name, allowed: fetched
        assert_eq!(
            get(
                policy(false, &["localhost"]),
                format!("http://localhost:{port}/")
            )
            .await,
            Ok(200)
        );
        // an allowed page redirecting to a refused IP literal: refused at the redirect
        let err = get(
            policy(false, &["localhost"]),
            format!("http://localhost:{port}/r"),
        )
        .await
        .unwrap_err();
        assert!(err.is_some_and(|r| r.host == "127.0.0.1"));
        // a redirect to an allowed address is followed
        let port2 = origin(format!("http://localhost:{port}/x")).await;
        assert_eq!(
            get(
                policy(false, &["localhost"]),
                format!("http://localhost:{port2}/r")
            )
            .await,
            Ok(200)
        );
        // with allow_private everything is fetched
        assert_eq!(
            get(policy(true, &[]), format!("http://localhost:{port}/")).await,
            Ok(200)
        );
    }

    #[tokio::test]
    async fn resolution_is_checked() {
        let p = policy(false, &[]);
        let err = resolve_checked(&p, "localhost").await.unwrap_err();
        assert!(
            matches!(&err, ResolveError::Refused(r) if r.why.contains("resolves to an internal address")),
            "{err}"
        );
        assert!(matches!(
            resolve_checked(&p, "[::1]").await,
            Err(ResolveError::Refused(_))
        ));
        let p = policy(false, &["127.0.0.1"]);
        assert_eq!(
            resolve_checked(&p, "localhost").await.unwrap(),
            [ip("127.0.0.1")],
            "only the allowed address of localhost is kept"
        );
        let p = policy(false, &["localhost"]);
        assert!(resolve_checked(&p, "LOCALHOST").await.is_ok());
        assert!(check_url(
            &policy(false, &[]),
            &Url::parse("http://localhost:1/").unwrap()
        )
        .await
        .is_err());
        assert!(check_url(
            &policy(true, &[]),
            &Url::parse("http://localhost:1/").unwrap()
        )
        .await
        .is_ok());
    }
}
