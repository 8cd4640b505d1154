//! Which proxy authentication a snapshot enforces, and the one path every mode's check takes:
//! native users verify with bcrypt ([`crate::credentials::Users`]); the other modes (LDAP, PAM,
//! OAuth) are [`CredentialVerifier`]s the control plane builds, whose checks run on the control
//! plane's runtime through [`Offload`] — never on a data-plane core — behind the same per-core
//! outcome cache, verification slots and per-client failure budget as native users. A second,
//! shared outcome cache sits on the control-plane side of the hand-off (cores never lock it),
//! so a credential reaches the outside authority once per lifetime of its outcome, not once
//! per core.

use crate::credentials::{
    cache_key_of, cached, remember_for, AuthGuard, Credential, Outcomes, Subject, Users, Verdict,
};
use crate::offload::Offload;
use futures::future::BoxFuture;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A verifier's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// `expires_in`: how long the credential stays valid, when it says so (a token's `exp`);
    /// the outcome is not remembered beyond it. `subject`: who the credential names when that is
    /// not the user name the client sent (an OAuth token's `sub`); the request log records it.
    Accepted {
        expires_in: Option<Duration>,
        subject: Option<String>,
    },
    Rejected,
}

impl From<bool> for Decision {
    fn from(ok: bool) -> Self {
        if ok {
            Decision::Accepted {
                expires_in: None,
                subject: None,
            }
        } else {
            Decision::Rejected
        }
    }
}

/// Why a verifier could not decide (its service is down or answered nonsense). The message is
/// logged; the client gets a 407.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct VerifierUnavailable(pub String);

/// A check of credentials against an outside authority (a directory, PAM, an identity
/// provider). Implementations live in the control plane; `verify` runs on its tokio runtime.
pub trait CredentialVerifier: Send + Sync + std::fmt::Debug {
    /// The mode's name (`ldap`, `system`, `oauth`), for logs.
    fn mode(&self) -> &'static str;
    /// What distinguishes this verifier's answers from another's (e.g. the directory URL and
    /// base DN): part of the cache key, so a changed configuration never reuses old outcomes.
    fn identity(&self) -> &str;
    /// `Proxy-Authenticate` challenges a 407 carries.
    fn challenges(&self) -> &'static [&'static str];
    /// `Err` when no verdict could be had.
    fn verify(
        &self,
        credential: Credential,
    ) -> BoxFuture<'static, Result<Decision, VerifierUnavailable>>;
}

pub const BASIC_CHALLENGE: &[&str] = &["Basic realm=\"switchyard\""];

/// The authentication a snapshot enforces.
#[derive(Debug, Clone)]
pub enum ProxyAuth {
    /// `auth.mode: native`.
    Native(Users),
    /// `ldap`, `system`, `oauth`.
    External(Arc<External>),
    /// A mode whose verifier is missing (not built into this binary, or not handed over yet):
    /// every request is refused.
    FailClosed { mode: &'static str },
}

/// A verifier and the outcomes it gave, shared by every core (only locked on the control
/// plane's runtime).
#[derive(Debug)]
pub struct External {
    pub verifier: Arc<dyn CredentialVerifier>,
    outcomes: Arc<parking_lot::Mutex<Outcomes>>,
}

impl External {
    pub fn new(verifier: Arc<dyn CredentialVerifier>) -> Self {
        Self {
            verifier,
            outcomes: Arc::default(),
        }
    }
}

impl ProxyAuth {
    pub fn challenges(&self) -> &'static [&'static str] {
        match self {
            ProxyAuth::External(e) => e.verifier.challenges(),
            _ => BASIC_CHALLENGE,
        }
    }

    /// Verifies what `client` presented.
    pub async fn verify(
        &self,
        guard: &AuthGuard,
        offload: &Offload,
        client: IpAddr,
        credential: &Credential,
    ) -> Verdict {
        self.verify_naming(guard, offload, client, credential)
            .await
            .0
    }

    /// [`ProxyAuth::verify`], and who an accepted credential names when the verifier says so
    /// (an OAuth token's subject, which the client's Basic user name need not match).
    pub async fn verify_naming(
        &self,
        guard: &AuthGuard,
        offload: &Offload,
        client: IpAddr,
        credential: &Credential,
    ) -> (Verdict, Subject) {
        match self {
            ProxyAuth::Native(users) => match credential {
                Credential::Basic { user, password } => (
                    users.verify(guard, offload, client, user, password).await,
                    None,
                ),
                Credential::Bearer(_) | Credential::Negotiate(_) => (reject(guard, client), None),
            },
            ProxyAuth::External(external) => {
                verify_external(external, guard, offload, client, credential, true).await
            }
            ProxyAuth::FailClosed { .. } => (Verdict::Rejected, None),
        }
    }
}

fn reject(guard: &AuthGuard, client: IpAddr) -> Verdict {
    guard.record_failure(client);
    Verdict::Rejected
}

/// SPNEGO (`auth.negotiate.*`), in front of the mode: `Negotiate` credentials go here.
#[derive(Debug, Clone)]
pub enum NegotiateAuth {
    Ready(Arc<External>),
    /// Enabled in the configuration but not built into this binary: refuses everything.
    FailClosed,
}

pub const NEGOTIATE_CHALLENGE: &str = "Negotiate";

impl NegotiateAuth {
    /// Verifies a `Negotiate` token; with the client's principal when accepted. Never cached:
    /// each token is single-use (a remembered acceptance would accept a replayed token).
    pub async fn verify(
        &self,
        guard: &AuthGuard,
        offload: &Offload,
        client: IpAddr,
        credential: &Credential,
    ) -> (Verdict, Subject) {
        match self {
            NegotiateAuth::Ready(external) => {
                verify_external(external, guard, offload, client, credential, false).await
            }
            NegotiateAuth::FailClosed => (reject(guard, client), None),
        }
    }
}

async fn verify_external(
    external: &External,
    guard: &AuthGuard,
    offload: &Offload,
    client: IpAddr,
    credential: &Credential,
    cache: bool,
) -> (Verdict, Subject) {
    if guard.throttled(client) {
        return (Verdict::Throttled, None);
    }
    let verifier = &external.verifier;
    let (mode, identity) = (verifier.mode(), verifier.identity());
    let key = match credential {
        Credential::Basic { user, password } => {
            cache_key_of(&[mode, identity, "basic", user, password])
        }
        Credential::Bearer(token) => cache_key_of(&[mode, identity, "bearer", token]),
        Credential::Negotiate(token) => cache_key_of(&[mode, identity, "negotiate", token]),
    };
    if cache {
        match cached(&key) {
            Some((true, subject)) => return (Verdict::Accepted, subject),
            Some((false, _)) => return (reject(guard, client), None),
            None => {}
        }
    }
    let Some(_slot) = guard.enter() else {
        return (Verdict::Busy, None);
    };
    let shared = external.outcomes.clone();
    let (asked, presented) = (verifier.clone(), credential.clone());
    // Runs on the control plane: the shared cache's lock is never taken on a core.
    let check = async move {
        if let Some((ok, subject)) = cache.then(|| shared.lock().get(&key)).flatten() {
            return Ok((ok, subject, None));
        }
        let answer = asked.verify(presented).await;
        answer.map(|decision| {
            let (ok, subject, valid_for) = match decision {
                Decision::Accepted {
                    expires_in,
                    subject,
                } => (true, subject.map(Arc::from), expires_in),
                Decision::Rejected => (false, None, None),
            };
            if cache {
                shared
                    .lock()
                    .insert_for(key, ok, subject.clone(), valid_for);
            }
            // The core remembers it until the same moment.
            (ok, subject, valid_for.map(|v| Instant::now() + v))
        })
    };
    let Ok(answer) = offload.spawn(check).await else {
        return (Verdict::Busy, None);
    };
    match answer {
        Ok((ok, subject, until)) => {
            if cache {
                let valid_for = until.map(|u| u.saturating_duration_since(Instant::now()));
                remember_for(key, ok, subject.clone(), valid_for);
            }
            if ok {
                (Verdict::Accepted, subject)
            } else {
                (reject(guard, client), None)
            }
        }
        Err(e) => {
            tracing::warn!(
                mode = verifier.mode(),
                %client,
                user = credential.user(),
                error = %e,
                "proxy authentication could not be checked; answering 407"
            );
            (Verdict::Unavailable, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Accepts `good`, rejects anything else, fails while `down`; counts calls.
    #[derive(Debug, Default)]
    struct Counting {
        calls: Arc<AtomicUsize>,
        down: bool,
    }

    impl CredentialVerifier for Counting {
        fn mode(&self) -> &'static str {
            "test"
        }
        fn identity(&self) -> &str {
            "counting"
        }
        fn challenges(&self) -> &'static [&'static str] {
            BASIC_CHALLENGE
        }
        fn verify(
            &self,
            c: Credential,
        ) -> BoxFuture<'static, Result<Decision, VerifierUnavailable>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let down = self.down;
            Box::pin(async move {
                if down {
                    return Err(VerifierUnavailable("down".into()));
                }
                Ok(matches!(c, Credential::Basic { password, .. } if password == "good").into())
            })
        }
    }

    fn basic(user: &str, password: &str) -> Credential {
        Credential::Basic {
            user: user.into(),
            password: password.into(),
        }
    }

    #[test]
    fn external_outcomes_are_cached_and_outages_are_not() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("rt");
        let offload = Offload::new(rt.handle().clone(), 4);
        let guard = AuthGuard::new(4);
        let calls = Arc::new(AtomicUsize::new(0));
        let auth = ProxyAuth::External(Arc::new(External::new(Arc::new(Counting {
            calls: calls.clone(),
            down: false,
        }))));
        let client: IpAddr = "10.9.0.1".parse().expect("ip");
        let check = |c: Credential| {
            futures_lite::future::block_on(auth.verify(&guard, &offload, client, &c))
        };
        assert_eq!(check(basic("ext-a", "good")), Verdict::Accepted);
        assert_eq!(check(basic("ext-a", "good")), Verdict::Accepted);
        assert_eq!(check(basic("ext-a", "bad")), Verdict::Rejected);
        assert_eq!(check(basic("ext-a", "bad")), Verdict::Rejected);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // Another core (thread) has its own cache but finds the shared one.
        std::thread::scope(|s| {
            s.spawn(|| {
                assert_eq!(check(basic("ext-a", "good")), Verdict::Accepted);
                assert_eq!(check(basic("ext-a", "bad")), Verdict::Rejected);
            });
        });
        assert_eq!(calls.load(Ordering::SeqCst), 2);

        let down_calls = Arc::new(AtomicUsize::new(0));
        let down = ProxyAuth::External(Arc::new(External::new(Arc::new(Counting {
            calls: down_calls.clone(),
            down: true,
        }))));
        for _ in 0..FAILURES_PLUS_ONE {
            let c = basic("ext-b", "good");
            let v = down.verify(&guard, &offload, client, &c);
            assert_eq!(futures_lite::future::block_on(v), Verdict::Unavailable);
        }
        // Every attempt asked (nothing cached), none spent the client's budget.
        assert_eq!(
            down_calls.load(Ordering::SeqCst),
            FAILURES_PLUS_ONE as usize
        );
        assert_eq!(check(basic("ext-c", "good")), Verdict::Accepted);
    }

    const FAILURES_PLUS_ONE: u64 = crate::credentials::FAILURE_BURST + 1;

    /// Accepts the password `token-of-alice` as a credential naming `alice`.
    #[derive(Debug)]
    struct Naming;

    impl CredentialVerifier for Naming {
        fn mode(&self) -> &'static str {
            "test"
        }
        fn identity(&self) -> &str {
            "naming"
        }
        fn challenges(&self) -> &'static [&'static str] {
            BASIC_CHALLENGE
        }
        fn verify(
            &self,
            c: Credential,
        ) -> BoxFuture<'static, Result<Decision, VerifierUnavailable>> {
            Box::pin(async move {
                Ok(match c {
                    Credential::Basic { password, .. } if password == "token-of-alice" => {
                        Decision::Accepted {
                            expires_in: None,
                            subject: Some("alice".into()),
                        }
                    }
                    _ => Decision::Rejected,
                })
            })
        }
    }

    #[test]
    fn the_verifiers_subject_comes_back_also_from_the_caches() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("rt");
        let offload = Offload::new(rt.handle().clone(), 4);
        let guard = AuthGuard::new(4);
        let auth = ProxyAuth::External(Arc::new(External::new(Arc::new(Naming))));
        let client: IpAddr = "10.9.0.3".parse().expect("ip");
        let check = |c: Credential| {
            futures_lite::future::block_on(auth.verify_naming(&guard, &offload, client, &c))
        };
        let alice = Some(Arc::<str>::from("alice"));
        // Asked, then this core's cache, then (another core) the shared cache.
        for _ in 0..2 {
            let answer = check(basic("mallory", "token-of-alice"));
            assert_eq!(answer, (Verdict::Accepted, alice.clone()));
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                let answer = check(basic("mallory", "token-of-alice"));
                assert_eq!(answer, (Verdict::Accepted, alice.clone()));
            });
        });
        assert_eq!(check(basic("alice", "wrong")), (Verdict::Rejected, None));
        let native = ProxyAuth::Native(Users::default());
        let answer = futures_lite::future::block_on(native.verify_naming(
            &guard,
            &offload,
            client,
            &basic("bob", "pw"),
        ));
        assert_eq!(answer, (Verdict::Rejected, None));
    }

    #[test]
    fn fail_closed_and_native_refuse_what_they_cannot_check() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("rt");
        let offload = Offload::new(rt.handle().clone(), 4);
        let guard = AuthGuard::new(4);
        let client: IpAddr = "10.9.0.2".parse().expect("ip");
        let closed = ProxyAuth::FailClosed { mode: "system" };
        let c = basic("u", "good");
        let v = closed.verify(&guard, &offload, client, &c);
        assert_eq!(futures_lite::future::block_on(v), Verdict::Rejected);
        let native = ProxyAuth::Native(Users::default());
        let c = Credential::Bearer("t".into());
        let v = native.verify(&guard, &offload, client, &c);
        assert_eq!(futures_lite::future::block_on(v), Verdict::Rejected);
    }
}
