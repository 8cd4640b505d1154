//! Name resolution that never blocks a core: lookups run on the control plane's tokio runtime
//! (hickory, reading `/etc/resolv.conf` and `/etc/hosts`) and each core caches answers until
//! their DNS TTL runs out.

use crate::error::DataplaneError;
use crate::offload::Offload;
use hickory_resolver::config::LookupIpStrategy;
use hickory_resolver::TokioAsyncResolver;
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

const CACHE_CAPACITY: usize = 10_000;

#[derive(Clone)]
pub struct Resolver {
    inner: Arc<TokioAsyncResolver>,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Resolver")
    }
}

thread_local! {
    static CACHE: RefCell<HashMap<String, (Vec<IpAddr>, Instant)>> = RefCell::new(HashMap::new());
}

impl Resolver {
    /// Reads the system configuration; asks for both address families (RFC 8305 needs both).
    pub fn from_system() -> Result<Self, DataplaneError> {
        let (config, mut opts) = hickory_resolver::system_conf::read_system_conf()
            .map_err(|e| DataplaneError::Start(format!("reading /etc/resolv.conf: {e}")))?;
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        opts.use_hosts_file = true;
        Ok(Self {
            inner: Arc::new(TokioAsyncResolver::tokio(config, opts)),
        })
    }

    /// Resolves `host` to socket addresses ordered for connection racing (RFC 8305: families
    /// interleaved, IPv6 first).
    pub async fn resolve(
        &self,
        offload: &Offload,
        host: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, DataplaneError> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let key = host.to_ascii_lowercase();
        let cached = CACHE.with(|c| {
            let mut c = c.borrow_mut();
            match c.get(&key) {
                Some((ips, until)) if *until > Instant::now() => Some(ips.clone()),
                Some(_) => {
                    c.remove(&key);
                    None
                }
                None => None,
            }
        });
        let ips = match cached {
            Some(ips) => ips,
            None => {
                let inner = self.inner.clone();
                let name = key.clone();
                let answer = offload
                    .spawn(async move {
                        inner
                            .lookup_ip(name.as_str())
                            .await
                            .map(|l| (l.iter().collect::<Vec<_>>(), l.valid_until()))
                    })
                    .await?
                    .map_err(|e| DataplaneError::Resolve {
                        host: host.to_owned(),
                        reason: e.to_string(),
                    })?;
                let (ips, until) = answer;
                CACHE.with(|c| {
                    let mut c = c.borrow_mut();
                    if c.len() >= CACHE_CAPACITY {
                        let now = Instant::now();
                        c.retain(|_, (_, u)| *u > now);
                        if c.len() >= CACHE_CAPACITY {
                            c.clear();
                        }
                    }
                    c.insert(key, (ips.clone(), until));
                });
                ips
            }
        };
        if ips.is_empty() {
            return Err(DataplaneError::Resolve {
                host: host.to_owned(),
                reason: "no addresses".into(),
            });
        }
        Ok(interleave_families(&ips)
            .into_iter()
            .map(|ip| SocketAddr::new(ip, port))
            .collect())
    }
}

/// IPv6 first, then alternating families (RFC 8305 §4), keeping each family's order.
pub fn interleave_families(ips: &[IpAddr]) -> Vec<IpAddr> {
    let mut v6 = ips.iter().filter(|ip| ip.is_ipv6()).copied();
    let mut v4 = ips.iter().filter(|ip| ip.is_ipv4()).copied();
    let mut out = Vec::with_capacity(ips.len());
    loop {
        match (v6.next(), v4.next()) {
            (None, None) => return out,
            (a, b) => out.extend(a.into_iter().chain(b)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaves_v6_first() {
        let ips: Vec<IpAddr> = ["1.1.1.1", "2.2.2.2", "::1", "::2", "::3"]
            .iter()
            .map(|s| s.parse().expect("ip"))
            .collect();
        let out: Vec<String> = interleave_families(&ips)
            .iter()
            .map(|i| i.to_string())
            .collect();
        assert_eq!(out, ["::1", "1.1.1.1", "::2", "2.2.2.2", "::3"]);
    }
}
