//! `auth.mode: system`: operating-system accounts through PAM (`auth.system.service`, default
//! `switchyard`, a file under /etc/pam.d/). Each check is a PAM transaction — authenticate, then
//! account management (expired or locked accounts are refused) — on tokio's blocking pool, as
//! PAM modules block (pam_unix reads /etc/shadow and may sleep after a failure). libpam itself
//! is loaded at run time ([`crate::libpam`]).

use crate::libpam::{self, TransactionError};
use futures::future::BoxFuture;
use std::ffi::c_int;
use std::sync::Arc;
use switchyard_dataplane::credentials::Credential;
use switchyard_dataplane::proxy_auth::{
    CredentialVerifier, Decision, VerifierUnavailable, BASIC_CHALLENGE,
};

#[derive(Debug, Clone)]
pub struct PamVerifier {
    service: Arc<str>,
}

impl PamVerifier {
    pub fn new(service: &str) -> Self {
        let file = std::path::Path::new("/etc/pam.d").join(service);
        if !file.exists() {
            // PAM then applies the `other` service, which may be stricter or looser than meant.
            tracing::warn!(service, path = %file.display(), "auth.system.service has no PAM service file; PAM uses its `other` service");
        }
        Self {
            service: service.into(),
        }
    }
}

impl CredentialVerifier for PamVerifier {
    fn mode(&self) -> &'static str {
        "system"
    }

    fn identity(&self) -> &str {
        &self.service
    }

    fn challenges(&self) -> &'static [&'static str] {
        BASIC_CHALLENGE
    }

    fn verify(
        &self,
        credential: Credential,
    ) -> BoxFuture<'static, Result<Decision, VerifierUnavailable>> {
        let service = self.service.clone();
        Box::pin(async move {
            let Credential::Basic { user, password } = credential else {
                return Ok(Decision::Rejected);
            };
            tokio::task::spawn_blocking(move || authenticate(&service, &user, &password))
                .await
                .map_err(|e| VerifierUnavailable(format!("PAM check did not finish: {e}")))?
                .map(Decision::from)
        })
    }
}

/// One PAM transaction for `user`/`password`.
fn authenticate(service: &str, user: &str, password: &str) -> Result<bool, VerifierUnavailable> {
    // PAM takes C strings; an empty password never counts (DISALLOW_NULL_AUTHTOK covers
    // accounts without one, this covers the client sending none).
    if user.is_empty() || password.is_empty() || user.contains('\0') || password.contains('\0') {
        return Ok(false);
    }
    let flags = libpam::PAM_SILENT | libpam::PAM_DISALLOW_NULL_AUTHTOK;
    match libpam::authenticate(service, user, password, flags) {
        Ok(()) => Ok(true),
        Err(TransactionError::Step(e)) if refuses(e.code) => Ok(false),
        Err(TransactionError::Step(e)) => Err(VerifierUnavailable(format!(
            "PAM service `{service}` failed: {e}"
        ))),
        Err(e @ TransactionError::Start(_)) => Err(VerifierUnavailable(format!(
            "PAM service `{service}` could not start: {e}"
        ))),
        Err(TransactionError::Unavailable(e)) => Err(VerifierUnavailable(e.to_string())),
    }
}

/// PAM answers that mean "not these credentials" (as opposed to "could not check").
fn refuses(code: c_int) -> bool {
    matches!(
        code,
        libpam::PAM_AUTH_ERR
            | libpam::PAM_USER_UNKNOWN
            | libpam::PAM_PERM_DENIED
            | libpam::PAM_CRED_INSUFFICIENT
            | libpam::PAM_MAXTRIES
            | libpam::PAM_ACCT_EXPIRED
            | libpam::PAM_NEW_AUTHTOK_REQD
            | libpam::PAM_AUTHTOK_ERR
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_and_outages_are_told_apart() {
        assert!(refuses(libpam::PAM_AUTH_ERR));
        assert!(refuses(libpam::PAM_USER_UNKNOWN));
        assert!(refuses(libpam::PAM_ACCT_EXPIRED));
        assert!(!refuses(libpam::PAM_AUTHINFO_UNAVAIL));
        assert!(!refuses(libpam::PAM_SYSTEM_ERR));
    }

    /// Through the real libpam (opened at run time): an account that does not exist is a
    /// refusal, not an outage. A service without a file under /etc/pam.d gets PAM's `other`.
    #[test]
    fn the_real_libpam_refuses_an_unknown_account() {
        if let Err(e) = libpam::available() {
            eprintln!("SKIP: {e}");
            return;
        }
        assert_eq!(
            authenticate("switchyard-unit-test", "no-such-user-7f3a", "wrong"),
            Ok(false)
        );
    }

    #[test]
    fn empty_or_nul_credentials_never_reach_pam() {
        // A service that cannot exist: PAM would be asked (and fail) if these got through.
        assert_eq!(authenticate("no/such", "root", ""), Ok(false));
        assert_eq!(authenticate("no/such", "", "pw"), Ok(false));
        assert_eq!(authenticate("no/such", "ro\0ot", "pw"), Ok(false));
    }
}
