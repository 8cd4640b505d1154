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
