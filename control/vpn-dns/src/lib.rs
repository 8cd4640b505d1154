//! The DNS interception resolver of `switchyard client`'s VPN mode.
//!
//! The split tunnel's DNS redirect (eBPF `cgroup/connect4`/`sendmsg4`, or the nftables fallback)
//! sends port-53 traffic (UDP and TCP) of in-scope sockets to [`DnsInterceptor`]'s listener. It
//! answers from its cache when fresh (TTLs counted down, capped by `vpn.dns.cache_ttl`; negative
//! answers kept for the SOA's negative TTL), otherwise forwards to `vpn.dns.servers` in order with
//! failover and a per-server timeout — through the tunnel ([`Upstream::Proxy`]: DNS over TCP via
//! the selected server's HTTP CONNECT or SOCKS5 proxy, one pipelined connection per server) or
//! directly ([`Upstream::Direct`]: UDP, TCP on truncation, optionally from sockets carrying the
//! tunnel's SO_MARK). When every server fails the client gets SERVFAIL, never silence. Identical
//! questions asked at once share one upstream fetch. Every answer with A/AAAA records is reported
//! through [`OnResolved`] — under the queried name and every name of its CNAME chain — before it
//! is sent, which is how domain rules become addresses in the split-tunnel maps.
//!
//! What it does not: no recursion of its own, no DNSSEC validation (the upstream's answer is
//! passed on, without the DO/AD semantics), no DNS over TLS/HTTPS. Its upstream sockets belong
//! to the client process, which the split tunnel runs in a bypass cgroup: the redirect never
//! applies to them, and they must not, or a forwarded query would loop back here.
//!
//! It runs on the tokio control plane; the glommio data plane is not involved (DNS is a few
//! packets per flow, and the hook into the split tunnel is control-plane state).
//!
//! Runtime-free parts with unit tests: [`message`] (reading queries, building answers, UDP
//! truncation, CNAME chains), [`cache`] (TTL policy, expiry with an injected clock), [`name`],
//! [`server_order`] (failover order), [`servers`] (`vpn.dns.servers` entries, resolv.conf).

pub mod cache;
mod listener;
pub mod message;
pub mod name;
mod resolver;
pub mod server_order;
pub mod servers;
pub mod upstream;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use switchyard_api::client::{DnsCacheEntry, DnsCacheView};
use tokio::net::{TcpListener, UdpSocket};
use tokio::task::JoinHandle;

pub use resolver::ResolverStats;
pub use upstream::{ProxyProtocol, Upstream};

use resolver::Resolver;

/// Called with a name (lower case, no root dot) and the addresses an answer gave for it; once
/// per name of the CNAME chain. Runs on the resolver's task before the answer is sent, so keep
/// it short (a map update).
pub type OnResolved = Arc<dyn Fn(&str, &[IpAddr]) + Send + Sync>;

/// Whether a question for a name (lower case, no root dot) is answered REFUSED instead of being
/// answered from the cache or forwarded: the client's kill switch refuses names it would resolve
/// through a server that is not connected, and never sends them anywhere else.
pub type Refuse = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Settings of the resolver (the `vpn.dns.*` keys plus what the VPN decides).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolverConfig {
    /// Where the resolver listens, UDP and TCP on the same port (port 0: any free port, the same
    /// for both).
    pub listen: SocketAddr,
    /// A second pair of listeners, for the IPv6 redirect (port 0: `listen`'s port when free,
    /// else any). `None`: IPv4 only.
    pub listen6: Option<SocketAddr>,
    /// Upstream servers, tried in order (`vpn.dns.servers`).
    pub servers: Vec<SocketAddr>,
    /// Upper bound on the TTLs kept and handed out (`vpn.dns.cache_ttl`).
    pub cache_ttl: Duration,
    pub upstream: Upstream,
    /// How long one upstream server gets to answer before the next one is tried.
    pub timeout: Duration,
}

impl Default for ResolverConfig {
    fn default() -> Self {
        ResolverConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            listen6: None,
            servers: Vec::new(),
            cache_ttl: Duration::from_secs(300),
            upstream: Upstream::Direct { mark: None },
            timeout: Duration::from_secs(2),
        }
    }
}

/// Why the resolver could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen on {addr} ({proto}): {source}")]
    Bind {
        addr: SocketAddr,
        proto: &'static str,
        source: std::io::Error,
    },
    #[error("upstream server {0} is the resolver's own address: queries would loop")]
    Loop(SocketAddr),
    #[error("cannot mark upstream sockets with {mark:#x} (CAP_NET_ADMIN needed): {source}")]
    Mark {
        mark: u32,
        source: upstream::UpstreamError,
    },
    #[error("`{0}` is not a DNS server address (IP or IP:port)")]
    BadServer(String),
}

/// The running resolver: a UDP and a TCP listener on one port (and a second pair with
/// `listen6`). Dropping it stops the listeners; [`DnsInterceptor::shutdown`] also waits for them.
pub struct DnsInterceptor {
    local_addr: SocketAddr,
    local_addr6: Option<SocketAddr>,
    resolver: Arc<Resolver>,
    tasks: Vec<JoinHandle<()>>,
}

impl DnsInterceptor {
    /// Binds the listeners and starts serving.
    pub async fn start(cfg: ResolverConfig, on_resolved: OnResolved) -> Result<Self, Error> {
        let (udp, tcp) = bind_pair(cfg.listen).await?;
        let local_addr = bound_addr(&udp, cfg.listen)?;
        let (pair6, local_addr6) = match cfg.listen6 {
            Some(listen6) => {
                let (udp6, tcp6) = bind_pair6(listen6, local_addr.port()).await?;
                let addr6 = bound_addr(&udp6, listen6)?;
                (Some((udp6, tcp6)), Some(addr6))
            }
            None => (None, None),
        };
        let own = [Some(local_addr), local_addr6];
        if let Some(&looped) = cfg.servers.iter().find(|s| own.contains(&Some(**s))) {
            return Err(Error::Loop(looped));
        }
        if let Upstream::Direct { mark: Some(mark) } = cfg.upstream {
            // Setting SO_MARK needs CAP_NET_ADMIN: say so now rather than SERVFAIL every query.
            upstream::udp::socket(local_addr, Some(mark))
                .map_err(|source| Error::Mark { mark, source })?;
        }
        let resolver = Arc::new(Resolver::new(
            cfg.servers,
            cfg.timeout,
            cfg.cache_ttl,
            cfg.upstream,
            on_resolved,
        ));
        let mut tasks = Vec::new();
        for (udp, tcp) in std::iter::once((udp, tcp)).chain(pair6) {
            tasks.push(tokio::spawn(listener::serve_udp(
                Arc::new(udp),
                resolver.clone(),
            )));
            tasks.push(tokio::spawn(listener::serve_tcp(tcp, resolver.clone())));
        }
        tracing::info!(listen = %local_addr, listen6 = ?local_addr6, "VPN DNS resolver listening");
        Ok(DnsInterceptor {
            local_addr,
            local_addr6,
            resolver,
            tasks,
        })
    }

    /// The address both listeners are bound to (the one for the DNS redirect).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address of the second pair (`listen6`), the one for the IPv6 redirect.
    pub fn local_addr6(&self) -> Option<SocketAddr> {
        self.local_addr6
    }

    /// The cache as `GET /api/v1/vpn/dns/cache` shows it: one entry per cached question (name,
    /// its A/AAAA addresses — empty for other types and negative answers — and expiry).
    pub fn cache_view(&self) -> DnsCacheView {
        let now = Instant::now();
        let wall = Utc::now();
        let cache = self.resolver.cache().lock();
        let entries: Vec<DnsCacheEntry> = cache
            .fresh(now)
            .into_iter()
            .map(|(key, answer, expires)| DnsCacheEntry {
                domain: key.name.clone(),
                addresses: message::addresses(&answer.answers)
                    .iter()
                    .map(IpAddr::to_string)
                    .collect(),
                expires_at: wall
                    + chrono::Duration::from_std(expires.saturating_duration_since(now))
                        .unwrap_or_default(),
            })
            .collect();
        DnsCacheView {
            enabled: true,
            count: entries.len() as u64,
            entries,
        }
    }

    /// Counters since start.
    pub fn stats(&self) -> ResolverStats {
        self.resolver.stats()
    }

    /// Switches the upstream path (the VPN selected another server). Queries already running
    /// finish on the old path; pooled connections of the old path close.
    pub fn set_upstream(&self, up: Upstream) {
        if let Upstream::Direct { mark: Some(mark) } = up {
            if let Err(e) = upstream::udp::socket(self.local_addr, Some(mark)) {
                tracing::warn!(mark, error = %e, "upstream sockets cannot be marked: queries will fail");
            }
        }
        self.resolver.set_upstream(up);
    }

    /// Sets (or clears) the rule of names answered REFUSED and never forwarded (see
    /// [`Refuse`]); it is asked for every question.
    pub fn set_refuse(&self, refuse: Option<Refuse>) {
        self.resolver.set_refuse(refuse);
    }

    /// The upstream path in use.
    pub fn upstream(&self) -> Upstream {
        self.resolver.upstream()
    }

    /// Forgets every cached answer.
    pub fn clear_cache(&self) {
        self.resolver.cache().lock().clear();
    }

    /// Stops the listeners and every query task and waits until they are gone.
    pub async fn shutdown(mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

impl Drop for DnsInterceptor {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The address `udp` (bound for `listen`) is bound to.
fn bound_addr(udp: &UdpSocket, listen: SocketAddr) -> Result<SocketAddr, Error> {
    udp.local_addr().map_err(|source| Error::Bind {
        addr: listen,
        proto: "udp",
        source,
    })
}

/// Binds the second pair: on `port` (the first pair's) when `listen6` leaves the port open and
/// it is free there, else as [`bind_pair`] does.
async fn bind_pair6(listen6: SocketAddr, port: u16) -> Result<(UdpSocket, TcpListener), Error> {
    if listen6.port() == 0 {
        if let Ok(pair) = bind_pair(SocketAddr::new(listen6.ip(), port)).await {
            return Ok(pair);
        }
    }
    bind_pair(listen6).await
}

/// Binds UDP and TCP on the same address. With port 0 the UDP socket picks the port and TCP
/// takes the same one, retried a few times in case another program holds it for TCP.
async fn bind_pair(listen: SocketAddr) -> Result<(UdpSocket, TcpListener), Error> {
    let bind_err = |proto| {
        move |source| Error::Bind {
            addr: listen,
            proto,
            source,
        }
    };
    let mut attempts = if listen.port() == 0 { 8 } else { 1 };
    loop {
        attempts -= 1;
        let udp = UdpSocket::bind(listen).await.map_err(bind_err("udp"))?;
        let addr = udp.local_addr().map_err(bind_err("udp"))?;
        match TcpListener::bind(addr).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) if attempts > 0 && e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) => return Err(bind_err("tcp")(e)),
        }
    }
}
