//! Authentication: `Authorization: Bearer <token>` or `Basic` (users with bcrypt hashes).
//!
//! Which endpoints it covers is `auth.protect` (default: packages only — health probes and
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

/// Remembered successful Basic credentials (cleared when full).
const VERIFIED_MAX: usize = 1024;

/// The endpoint group a path belongs to.
pub fn scope_of(path: &str) -> PkgcacheScope {
    if path == "/health" || path.starts_with("/health/") {
        PkgcacheScope::Health
    } else if path == "/metrics" {
        PkgcacheScope::Metrics
    } else if path == "/api" || path.starts_with("/api/") {
        PkgcacheScope::Docs
    } else {
        PkgcacheScope::Packages
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

    /// Whether a request to `path` with `method` needs credentials.
    pub fn required(&self, method: &str, path: &str) -> bool {
        if !self.enabled {
            return false;
        }
        let scope = scope_of(path);
        if !self.protect.contains(&scope) {
            return false;
        }
        !(scope == PkgcacheScope::Packages && method == "HEAD" && self.anonymous_head)
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

    #[test]
    fn scopes_and_requirements() {
        assert_eq!(scope_of("/health/ready"), PkgcacheScope::Health);
        assert_eq!(scope_of("/metrics"), PkgcacheScope::Metrics);
        assert_eq!(scope_of("/api/docs"), PkgcacheScope::Docs);
        assert_eq!(scope_of("/zlib/1/ab"), PkgcacheScope::Packages);
        let a = auth(true, vec![PkgcacheScope::Packages]);
        assert!(!a.required("HEAD", "/zlib/1/ab"));
        assert!(a.required("GET", "/zlib/1/ab"));
        assert!(a.required("PUT", "/zlib/1/ab"));
        assert!(!a.required("GET", "/health"));
        assert!(!a.required("GET", "/metrics"));
        let a = auth(false, vec![PkgcacheScope::Packages, PkgcacheScope::Metrics]);
        assert!(a.required("HEAD", "/zlib/1/ab"));
        assert!(a.required("GET", "/metrics"));
        let off = Auth::new(&PkgcacheAuth::default());
        assert!(!off.required("PUT", "/zlib/1/ab"));
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
