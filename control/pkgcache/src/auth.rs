//! Authentication: `Authorization: Bearer <token>` or `Basic` (users with bcrypt hashes).
//!
//! Which endpoints it covers is `auth.protect`, applied to the endpoint the router resolved
//! ([`crate::route::resolve`]) (default: packages only — health probes and
//! metrics stay open for load balancers and Prometheus). HEAD on a package passes without
//! credentials while `auth.anonymous_head` is true (default), because vcpkg's precheck sends its
//! HEAD without the configured header; GET, PUT and DELETE always need credentials when covered.
//! A successful Basic check is remembered (by SHA-256 of the header) so bcrypt runs once per
//! credential, not once per request.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use sha2::{Digest, Sha256};
use switchyard_config::pkgcache::{PkgcacheAuth, PkgcacheScope};

use crate::route::Scope;

/// Remembered successful Basic credentials (cleared when full).
const VERIFIED_MAX: usize = 1024;

/// The configuration's name of a router scope.
fn config_scope(scope: Scope) -> PkgcacheScope {
    match scope {
        Scope::Packages => PkgcacheScope::Packages,
        Scope::Health => PkgcacheScope::Health,
        Scope::Metrics => PkgcacheScope::Metrics,
        Scope::Docs => PkgcacheScope::Docs,
    }
}

/// Compares without an early exit on the first differing byte.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The configured authentication.
pub struct Auth {
    enabled: bool,
    tokens: Vec<String>,
    users: Arc<HashMap<String, String>>,
    anonymous_head: bool,
    protect: Vec<PkgcacheScope>,
    allow_anonymous_writes: bool,
    verified: Arc<Mutex<HashSet<[u8; 32]>>>,
}

impl Auth {
    pub fn new(cfg: &PkgcacheAuth) -> Auth {
        Auth {
            enabled: cfg.enabled,
            tokens: cfg.tokens.clone(),
            users: Arc::new(
                cfg.users
                    .iter()
                    .map(|u| (u.username.clone(), u.password_hash.clone()))
                    .collect(),
            ),
            anonymous_head: cfg.anonymous_head,
            protect: cfg.protect.clone(),
            allow_anonymous_writes: cfg.allow_anonymous_writes,
            verified: Arc::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether a request with `method` to an endpoint of `scope` (the router's answer for the
    /// path, never a guess from its prefix) needs credentials. Paths that name no endpoint
    /// (`None`) are answered 404 without looking at credentials.
    pub fn required(&self, method: &str, scope: Option<Scope>) -> bool {
        let Some(scope) = scope else {
            return false;
        };
        if !self.enabled || !self.protect.contains(&config_scope(scope)) {
            return false;
        }
        !(scope == Scope::Packages && method == "HEAD" && self.anonymous_head)
    }

    /// Whether a request that [`Auth::required`] let through without credentials may run, given
    /// the peer's address (`None`: unknown). Writes to packages (PUT, DELETE) without
    /// credentials come only from loopback unless `auth.allow_anonymous_writes`.
    pub fn anonymous_request_allowed(
        &self,
        method: &str,
        scope: Option<Scope>,
        peer: Option<IpAddr>,
    ) -> bool {
        let write = matches!(method, "PUT" | "DELETE");
        !write
            || scope != Some(Scope::Packages)
            || self.allow_anonymous_writes
            || peer.is_some_and(|ip| ip.to_canonical().is_loopback())
    }

    /// Who may write packages, for the start-up log.
    pub fn writers(&self, can_write: bool) -> &'static str {
        if !can_write {
            "nobody (read-only mode)"
        } else if self.required("PUT", Some(Scope::Packages)) {
            "clients with a listed token or user"
        } else if self.allow_anonymous_writes {
            "anyone who reaches the port (auth.allow_anonymous_writes)"
        } else {
            "loopback clients only (turn auth on, or set auth.allow_anonymous_writes, to accept writes from other hosts)"
        }
    }

    /// Whether the `Authorization` header value is a valid token or user.
    pub async fn check(&self, header: Option<&str>) -> bool {
        let Some(value) = header else {
            return false;
        };
        let (scheme, rest) = value.trim().split_once(' ').unwrap_or((value, ""));
        let rest = rest.trim();
        if scheme.eq_ignore_ascii_case("bearer") {
            return !rest.is_empty()
                && self
                    .tokens
                    .iter()
                    .any(|t| same(t.as_bytes(), rest.as_bytes()));
        }
        if !scheme.eq_ignore_ascii_case("basic") {
            return false;
        }
        let digest: [u8; 32] = Sha256::digest(rest.as_bytes()).into();
        if self
            .verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&digest)
        {
            return true;
        }
        let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(rest) else {
            return false;
        };
        let Ok(text) = String::from_utf8(decoded) else {
            return false;
        };
        let Some((user, password)) = text.split_once(':') else {
            return false;
        };
        let Some(hash) = self.users.get(user).cloned() else {
            return false;
        };
        let password = password.to_string();
        let ok =
            tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash).unwrap_or(false))
                .await
                .unwrap_or(false);
        if ok {
            let mut v = self.verified.lock().unwrap_or_else(|e| e.into_inner());
            if v.len() >= VERIFIED_MAX {
                v.clear();
            }
            v.insert(digest);
        }
        ok
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use switchyard_config::pkgcache::PkgcacheUser;

    fn auth(anonymous_head: bool, protect: Vec<PkgcacheScope>) -> Auth {
        Auth::new(&PkgcacheAuth {
            enabled: true,
            tokens: vec!["s3cret".into()],
            users: vec![PkgcacheUser {
                username: "ci".into(),
                password_hash: bcrypt::hash("pw", 4).unwrap(),
            }],
            anonymous_head,
            protect,
            allow_anonymous_writes: false,
        })
    }

    fn required(a: &Auth, method: &str, path: &str) -> bool {
        a.required(method, crate::route::resolve(path).scope())
    }

    #[test]
    fn requirements_follow_the_matched_route() {
        let a = auth(true, vec![PkgcacheScope::Packages]);
        assert!(!required(&a, "HEAD", "/zlib/1/ab"));
        assert!(required(&a, "GET", "/zlib/1/ab"));
        assert!(required(&a, "PUT", "/zlib/1/ab"));
        assert!(!required(&a, "GET", "/health"));
        assert!(!required(&a, "GET", "/metrics"));
        // reserved first segments as package names are packages
        assert!(required(&a, "PUT", "/health/1/abcdef0123"));
        assert!(required(&a, "PUT", "/api/x/abcdef0123"));
        assert!(required(&a, "GET", "/metrics/1/ab/x64-linux"));
        assert!(!required(&a, "GET", "/nothing/here"));
        let a = auth(false, vec![PkgcacheScope::Packages, PkgcacheScope::Metrics]);
        assert!(required(&a, "HEAD", "/zlib/1/ab"));
        assert!(required(&a, "GET", "/metrics"));
        let off = Auth::new(&PkgcacheAuth::default());
        assert!(!required(&off, "PUT", "/zlib/1/ab"));
    }

    #[test]
    fn anonymous_writes_only_from_loopback_unless_allowed() {
        let pkg = crate::route::resolve("/zlib/1/ab").scope();
        let lan: Option<IpAddr> = "192.0.2.7".parse().ok();
        let lo4: Option<IpAddr> = "127.0.0.2".parse().ok();
        let lo6: Option<IpAddr> = "::1".parse().ok();
        let mapped: Option<IpAddr> = "::ffff:127.0.0.1".parse().ok();
        let off = Auth::new(&PkgcacheAuth::default());
        for method in ["PUT", "DELETE"] {
            assert!(!off.anonymous_request_allowed(method, pkg, lan), "{method}");
            assert!(
                !off.anonymous_request_allowed(method, pkg, None),
                "{method}"
            );
            for lo in [lo4, lo6, mapped] {
                assert!(off.anonymous_request_allowed(method, pkg, lo), "{lo:?}");
            }
        }
        assert!(off.anonymous_request_allowed("GET", pkg, lan));
        assert!(off.anonymous_request_allowed("HEAD", pkg, lan));
        let health = crate::route::resolve("/health").scope();
        assert!(off.anonymous_request_allowed("PUT", health, lan));
        assert!(off.writers(true).starts_with("loopback clients only"));
        assert!(off.writers(false).starts_with("nobody"));
        let open = Auth::new(&PkgcacheAuth {
            allow_anonymous_writes: true,
            ..PkgcacheAuth::default()
        });
        assert!(open.anonymous_request_allowed("PUT", pkg, lan));
        assert!(open.writers(true).starts_with("anyone"));
        let on = auth(true, vec![PkgcacheScope::Packages]);
        assert!(on.writers(true).starts_with("clients with a listed token"));
    }

    #[tokio::test]
    async fn tokens_and_users() {
        let a = auth(true, vec![PkgcacheScope::Packages]);
        assert!(a.check(Some("Bearer s3cret")).await);
        assert!(a.check(Some("bearer s3cret")).await);
        assert!(!a.check(Some("Bearer wrong")).await);
        assert!(!a.check(Some("Bearer ")).await);
        assert!(!a.check(None).await);
        let good = base64::engine::general_purpose::STANDARD.encode("ci:pw");
        let bad = base64::engine::general_purpose::STANDARD.encode("ci:nope");
        assert!(a.check(Some(&format!("Basic {good}"))).await);
        assert!(a.check(Some(&format!("Basic {good}"))).await); // cached
        assert!(!a.check(Some(&format!("Basic {bad}"))).await);
        assert!(!a.check(Some("Basic !!!")).await);
        assert!(!a.check(Some("Digest x")).await);
    }
}
