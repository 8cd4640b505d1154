//! Proxy credentials of native users: `Basic` parsing and bcrypt verification, hardened against
//! being used as a CPU attack. bcrypt costs tens of milliseconds, so it runs on the control
//! plane's blocking pool; per core, recent outcomes — successes *and* failures — are remembered
//! for a bounded time under a SHA-256 digest (the password itself is never stored), so repeating
//! a wrong password costs no bcrypt. Across cores, an [`AuthGuard`] bounds how many
//! verifications run at once (beyond that the caller answers "busy" at once instead of queueing)
//! and gives every client address a budget of failures: once spent, credentials from that
//! address are refused without being verified until the budget refills.

use crate::offload::Offload;
use crate::rate_limit::BucketTable;
use base64::Engine as _;
use sha2::{Digest, Sha256};
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SUCCESS_TTL: Duration = Duration::from_secs(300);
/// Short, so a password changed in the config (new hash, new key anyway) or a typo corrected is
/// not held against a user for long.
const FAILURE_TTL: Duration = Duration::from_secs(60);
const CACHE_CAPACITY: usize = 4096;

/// Failed authentications a client address may make in a burst before it is throttled...
pub const FAILURE_BURST: u64 = 10;
/// ...and how often it earns one more attempt after that.
pub const FAILURE_REFILL: Duration = Duration::from_secs(6);

/// The result of checking one set of credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    Rejected,
    /// Refused without verifying: this client address spent its failure budget.
    Throttled,
    /// Refused without verifying: as many verifications as allowed are running right now.
    Busy,
    /// Not verified: the verifier's service (directory, identity provider) could not be asked.
    /// Never remembered and never charged to the client.
    Unavailable,
}

/// Shared by every core and carried over between snapshots (a reload must not reset a client's
/// failure budget): the per-address failure budgets and the count of running verifications.
#[derive(Debug)]
pub struct AuthGuard {
    failures: BucketTable,
    verifying: AtomicUsize,
    max_verifying: usize,
}

/// Milli-failures per failure, so the refill (one per [`FAILURE_REFILL`]) is exact.
const MILLI: u64 = 1000;

impl AuthGuard {
    /// `max_verifying`: bcrypt runs allowed at once (about the number of CPUs: more in
    /// parallel only queue).
    pub fn new(max_verifying: usize) -> Self {
        let per_second = MILLI * 1000 / FAILURE_REFILL.as_millis().max(1) as u64;
        Self {
            failures: BucketTable::new(16_384, per_second, FAILURE_BURST * MILLI),
            verifying: AtomicUsize::new(0),
            max_verifying,
        }
    }

    /// A guard sized for this machine.
    pub fn for_this_host() -> Self {
        Self::new(std::thread::available_parallelism().map_or(2, |n| n.get().max(2)))
    }

    pub(crate) fn throttled(&self, client: IpAddr) -> bool {
        self.failures.available(Some(client)) < MILLI
    }

    pub(crate) fn record_failure(&self, client: IpAddr) {
        let _ = self.failures.take(Some(client), MILLI);
    }

    pub(crate) fn enter(&self) -> Option<VerifySlot<'_>> {
        let before = self.verifying.fetch_add(1, Ordering::AcqRel);
        let slot = VerifySlot(&self.verifying);
        (before < self.max_verifying).then_some(slot)
    }
}

/// One running verification; frees its place when dropped.
pub(crate) struct VerifySlot<'a>(&'a AtomicUsize);

impl Drop for VerifySlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

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

    /// Verifies `username`/`password` sent from `client`. Unknown users and remembered outcomes
    /// cost no bcrypt work; every rejection spends from the client's failure budget.
    pub async fn verify(
        &self,
        guard: &AuthGuard,
        offload: &Offload,
        client: IpAddr,
        username: &str,
        password: &str,
    ) -> Verdict {
        if guard.throttled(client) {
            return Verdict::Throttled;
        }
        let Some(hash) = self.hashes.get(username) else {
            guard.record_failure(client);
            return Verdict::Rejected;
        };
        let key = cache_key(username, password, hash);
        match cached(&key) {
            Some((true, _)) => return Verdict::Accepted,
            Some((false, _)) => {
                guard.record_failure(client);
                return Verdict::Rejected;
            }
            None => {}
        }
        let Some(_slot) = guard.enter() else {
            return Verdict::Busy;
        };
        let (password, hash) = (password.to_owned(), hash.clone());
        let Ok(ok) = offload
            .blocking(move || bcrypt::verify(password, &hash).unwrap_or(false))
            .await
        else {
            return Verdict::Busy;
        };
        remember(key, ok);
        if ok {
            Verdict::Accepted
        } else {
            guard.record_failure(client);
            Verdict::Rejected
        }
    }
}

/// The identity a verifier named for an accepted credential (an OAuth token's subject), when it
/// named one: what the request log records instead of the user name the client typed.
pub type Subject = Option<Arc<str>>;

/// Remembered outcomes: digest → (accepted, the verifier's subject, until when). Bounded;
/// entries expire after [`SUCCESS_TTL`] / [`FAILURE_TTL`], or earlier when the credential itself
/// expires sooner.
#[derive(Debug, Default)]
pub(crate) struct Outcomes(HashMap<[u8; 32], (bool, Subject, Instant)>);

impl Outcomes {
    /// The remembered outcome for `key` and its subject, if still fresh.
    pub(crate) fn get(&mut self, key: &[u8; 32]) -> Option<(bool, Subject)> {
        match self.0.get(key) {
            Some((ok, subject, until)) if Instant::now() < *until => Some((*ok, subject.clone())),
            Some(_) => {
                self.0.remove(key);
                None
            }
            None => None,
        }
    }

    /// Remembers `ok` (with `subject`) for its TTL, or for `valid_for` when that is shorter.
    pub(crate) fn insert_for(
        &mut self,
        key: [u8; 32],
        ok: bool,
        subject: Subject,
        valid_for: Option<Duration>,
    ) {
        let now = Instant::now();
        let c = &mut self.0;
        if c.len() >= CACHE_CAPACITY {
            c.retain(|_, (_, _, until)| now < *until);
            if c.len() >= CACHE_CAPACITY {
                // Failures go first: losing them costs one verification each, losing successes
                // costs every user a slow request.
                c.retain(|_, (ok, _, _)| *ok);
            }
            if c.len() >= CACHE_CAPACITY {
                c.clear();
            }
        }
        let ttl = valid_for.map_or(ttl(ok), |v| v.min(ttl(ok)));
        c.insert(key, (ok, subject, now + ttl));
    }
}

thread_local! {
    /// This core's remembered outcomes.
    static OUTCOMES: RefCell<Outcomes> = RefCell::new(Outcomes::default());
}

/// The digest under which an outcome is remembered: every part, length-prefixed (so `ab`+`c`
/// and `a`+`bc` differ).
pub(crate) fn cache_key(user: &str, password: &str, hash: &str) -> [u8; 32] {
    cache_key_of(&[user, password, hash])
}

pub(crate) fn cache_key_of(parts: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in parts {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().into()
}

fn ttl(ok: bool) -> Duration {
    if ok {
        SUCCESS_TTL
    } else {
        FAILURE_TTL
    }
}

/// This core's remembered outcome for `key` and its subject, if still fresh.
pub(crate) fn cached(key: &[u8; 32]) -> Option<(bool, Subject)> {
    OUTCOMES.with(|c| c.borrow_mut().get(key))
}

pub(crate) fn remember(key: [u8; 32], ok: bool) {
    remember_for(key, ok, None, None);
}

pub(crate) fn remember_for(key: [u8; 32], ok: bool, subject: Subject, valid_for: Option<Duration>) {
    OUTCOMES.with(|c| c.borrow_mut().insert_for(key, ok, subject, valid_for));
}

/// What a client presented in `Proxy-Authorization` (or SOCKS5 RFC 1929).
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    Basic {
        user: String,
        password: String,
    },
    /// An OAuth 2 access token (`Bearer`).
    Bearer(String),
    /// A SPNEGO token (`Negotiate`, base64 as sent).
    Negotiate(String),
}

impl std::fmt::Debug for Credential {
    /// Never prints the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Basic { user, .. } => write!(f, "Basic({user:?}, ****)"),
            Credential::Bearer(_) => f.write_str("Bearer(****)"),
            Credential::Negotiate(_) => f.write_str("Negotiate(****)"),
        }
    }
}

impl Credential {
    /// The user name to log (none for tokens: their subject is only known once verified).
    pub fn user(&self) -> &str {
        match self {
            Credential::Basic { user, .. } => user,
            Credential::Bearer(_) | Credential::Negotiate(_) => "",
        }
    }
}

/// Decodes a `Proxy-Authorization` value: `Basic` or `Bearer`.
pub fn parse_proxy_authorization(value: &[u8]) -> Option<Credential> {
    if let Some((user, password)) = parse_basic(value) {
        return Some(Credential::Basic { user, password });
    }
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, rest) = value.split_once(' ')?;
    let token = rest.trim();
    if token.is_empty() || token.contains(' ') {
        return None;
    }
    if scheme.eq_ignore_ascii_case("bearer") {
        Some(Credential::Bearer(token.to_owned()))
    } else if scheme.eq_ignore_ascii_case("negotiate") {
        Some(Credential::Negotiate(token.to_owned()))
    } else {
        None
    }
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
    fn proxy_authorization_schemes() {
        let basic = encode_basic("alice", "pw");
        assert_eq!(
            parse_proxy_authorization(basic.as_bytes()),
            Some(Credential::Basic {
                user: "alice".into(),
                password: "pw".into()
            })
        );
        assert_eq!(
            parse_proxy_authorization(b"bearer  abc.def.ghi "),
            Some(Credential::Bearer("abc.def.ghi".into()))
        );
        assert_eq!(parse_proxy_authorization(b"Bearer "), None);
        assert_eq!(parse_proxy_authorization(b"Bearer a b"), None);
        assert_eq!(
            parse_proxy_authorization(b"Negotiate YIIC"),
            Some(Credential::Negotiate("YIIC".into()))
        );
        assert_eq!(parse_proxy_authorization(b"NTLM abc"), None);
        let shown = format!("{:?}", parse_proxy_authorization(basic.as_bytes()));
        assert!(!shown.contains("pw"), "{shown}");
    }

    #[test]
    fn cache_key_depends_on_every_part() {
        assert_ne!(cache_key("a", "b", "h"), cache_key("a", "c", "h"));
        assert_ne!(cache_key("ab", "", "h"), cache_key("a", "b", "h"));
        assert_ne!(cache_key("a", "b", "h1"), cache_key("a", "b", "h2"));
    }

    #[test]
    fn cache_remembers_both_outcomes() {
        let k = cache_key("x", "y", "z");
        assert_eq!(cached(&k), None);
        remember(k, true);
        assert_eq!(cached(&k), Some((true, None)));
        let k = cache_key("x", "wrong", "z");
        remember(k, false);
        assert_eq!(cached(&k), Some((false, None)));
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("rt")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn verify_uses_bcrypt_off_thread() {
        let rt = runtime();
        let offload = Offload::new(rt.handle().clone(), 4);
        let guard = AuthGuard::new(4);
        let hash = bcrypt::hash("secret", 4).expect("hash");
        let users = Users::new([("bob".to_string(), hash)]);
        let client = ip("10.0.0.1");
        let check = |u: &str, p: &str| {
            futures_lite::future::block_on(users.verify(&guard, &offload, client, u, p))
        };
        assert_eq!(check("bob", "secret"), Verdict::Accepted);
        assert_eq!(check("bob", "wrong"), Verdict::Rejected);
        assert_eq!(check("eve", "secret"), Verdict::Rejected);
    }

    #[test]
    fn failures_are_remembered_and_cost_no_verification() {
        let rt = runtime();
        let offload = Offload::new(rt.handle().clone(), 4);
        let hash = bcrypt::hash("secret", 4).expect("hash");
        let users = Users::new([("carol".to_string(), hash)]);
        let client = ip("10.0.0.2");
        let open = AuthGuard::new(4);
        let first = users.verify(&open, &offload, client, "carol", "guess");
        assert_eq!(futures_lite::future::block_on(first), Verdict::Rejected);
        // No verification may run now: the same wrong password is still answered (from the
        // cache), a new one is not.
        let shut = AuthGuard::new(0);
        let again = users.verify(&shut, &offload, client, "carol", "guess");
        assert_eq!(futures_lite::future::block_on(again), Verdict::Rejected);
        let other = users.verify(&shut, &offload, client, "carol", "guess2");
        assert_eq!(futures_lite::future::block_on(other), Verdict::Busy);
    }

    #[test]
    fn a_client_out_of_failures_is_refused_unverified() {
        let rt = runtime();
        let offload = Offload::new(rt.handle().clone(), 4);
        let guard = AuthGuard::new(4);
        let users = Users::new([("dave".to_string(), bcrypt::hash("pw", 4).expect("hash"))]);
        let attacker = ip("192.0.2.7");
        for i in 0..FAILURE_BURST {
            let guess = format!("p{i}");
            let v = users.verify(&guard, &offload, attacker, "nobody", &guess);
            assert_eq!(futures_lite::future::block_on(v), Verdict::Rejected);
        }
        let right = users.verify(&guard, &offload, attacker, "dave", "pw");
        assert_eq!(futures_lite::future::block_on(right), Verdict::Throttled);
        let neighbour = users.verify(&guard, &offload, ip("192.0.2.8"), "dave", "pw");
        assert_eq!(futures_lite::future::block_on(neighbour), Verdict::Accepted);
    }

    #[test]
    fn verification_slots_are_bounded_and_released() {
        let guard = AuthGuard::new(1);
        let slot = guard.enter();
        assert!(slot.is_some());
        assert!(guard.enter().is_none());
        drop(slot);
        assert!(guard.enter().is_some());
    }
}
