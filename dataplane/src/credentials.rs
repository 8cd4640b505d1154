//! Proxy credentials of native users: `Basic` parsing and bcrypt verification with a per-core
//! cache of recent successes. bcrypt costs tens of milliseconds, so it runs on the control
//! plane's blocking pool, and a verified (user, password, hash) is remembered for a bounded time
//! under a SHA-256 digest (the password itself is never stored).

use crate::offload::Offload;
use base64::Engine as _;
use sha2::{Digest, Sha256};
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

const CACHE_TTL: Duration = Duration::from_secs(300);
const CACHE_CAPACITY: usize = 4096;

#[derive(Debug, Clone, Default)]
pub struct Users {
    /// username → bcrypt hash
    hashes: HashMap<String, String>,
}

impl Users {
    pub fn new(users: impl IntoIterator<Item = (String, String)>) -> Self {
        Self {
            hashes: users.into_iter().collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// Verifies `username`/`password`; unknown users cost no bcrypt work.
    pub async fn verify(&self, offload: &Offload, username: &str, password: &str) -> bool {
        let Some(hash) = self.hashes.get(username) else {
            return false;
        };
        let key = cache_key(username, password, hash);
        if cache_hit(&key) {
            return true;
        }
        let (password, hash) = (password.to_owned(), hash.clone());
        let ok = offload
            .blocking(move || bcrypt::verify(password, &hash).unwrap_or(false))
            .await
            .unwrap_or(false);
        if ok {
            cache_insert(key);
        }
        ok
    }
}

thread_local! {
    static VERIFIED: RefCell<HashMap<[u8; 32], Instant>> = RefCell::new(HashMap::new());
}

fn cache_key(user: &str, password: &str, hash: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [user, password, hash] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().into()
}

fn cache_hit(key: &[u8; 32]) -> bool {
    VERIFIED.with(|c| {
        let mut c = c.borrow_mut();
        match c.get(key) {
            Some(at) if at.elapsed() < CACHE_TTL => true,
            Some(_) => {
                c.remove(key);
                false
            }
            None => false,
        }
    })
}

fn cache_insert(key: [u8; 32]) {
    VERIFIED.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= CACHE_CAPACITY {
            c.retain(|_, at| at.elapsed() < CACHE_TTL);
            if c.len() >= CACHE_CAPACITY {
                c.clear();
            }
        }
        c.insert(key, Instant::now());
    });
}

/// Decodes a `Basic` credential (`Proxy-Authorization` value) into user and password.
pub fn parse_basic(value: &[u8]) -> Option<(String, String)> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, rest) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, pass) = decoded.split_once(':')?;
    Some((user.to_owned(), pass.to_owned()))
}

/// Encodes a `Basic` credential for an upstream proxy.
pub fn encode_basic(user: &str, password: &str) -> String {
    let raw = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_roundtrip() {
        let v = encode_basic("alice", "won:der");
        assert_eq!(
            parse_basic(v.as_bytes()),
            Some(("alice".into(), "won:der".into()))
        );
        assert_eq!(parse_basic(b"Bearer abc"), None);
        assert_eq!(parse_basic(b"Basic !!!"), None);
        assert_eq!(parse_basic(b"Basic"), None);
        assert_eq!(parse_basic(&[0xff, 0xfe]), None);
    }

    #[test]
    fn cache_key_depends_on_every_part() {
        assert_ne!(cache_key("a", "b", "h"), cache_key("a", "c", "h"));
        assert_ne!(cache_key("ab", "", "h"), cache_key("a", "b", "h"));
        assert_ne!(cache_key("a", "b", "h1"), cache_key("a", "b", "h2"));
    }

    #[test]
    fn cache_expires_and_bounds() {
        let k = cache_key("x", "y", "z");
        assert!(!cache_hit(&k));
        cache_insert(k);
        assert!(cache_hit(&k));
    }

    #[test]
    fn verify_uses_bcrypt_off_thread() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("rt");
        let offload = Offload::new(rt.handle().clone(), 4);
        let hash = bcrypt::hash("secret", 4).expect("hash");
        let users = Users::new([("bob".to_string(), hash)]);
        let ok = futures_lite::future::block_on(users.verify(&offload, "bob", "secret"));
        let bad = futures_lite::future::block_on(users.verify(&offload, "bob", "wrong"));
        let unknown = futures_lite::future::block_on(users.verify(&offload, "eve", "secret"));
        assert!(ok && !bad && !unknown);
    }
}
