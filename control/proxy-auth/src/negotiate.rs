//! `auth.negotiate.*`: SPNEGO (Kerberos) for HTTP and CONNECT. The client sends
//! `Proxy-Authorization: Negotiate <token>` (a Kerberos AP-REQ for the service principal wrapped
//! in SPNEGO); the proxy accepts it with the system's GSS-API using the keys of `keytab`. One
//! round trip suffices for Kerberos, so a token either completes a context or is refused. With
//! `realm` set, the client's principal must belong to it. Tokens are never cached (each is
//! single-use; GSS-API's replay cache refuses a repeated one). GSS-API is loaded at run time
//! ([`crate::libgssapi`]).

use crate::libgssapi::AcceptorCredential;
use crate::ProxyAuthError;
use base64::Engine as _;
use futures::future::BoxFuture;
use std::sync::Arc;
use switchyard_config::NegotiateAuthConfig;
use switchyard_dataplane::credentials::Credential;
use switchyard_dataplane::proxy_auth::{
    CredentialVerifier, Decision, VerifierUnavailable, NEGOTIATE_CHALLENGE,
};

const CHALLENGES: &[&str] = &[NEGOTIATE_CHALLENGE];

#[derive(Debug, Clone)]
pub struct NegotiateVerifier {
    inner: Arc<Acceptor>,
}

#[derive(Debug)]
struct Acceptor {
    cred: AcceptorCredential,
    principal: String,
    realm: Option<String>,
}

impl NegotiateVerifier {
    pub fn new(cfg: &NegotiateAuthConfig) -> Result<Self, ProxyAuthError> {
        let bad = |message: String| ProxyAuthError::Settings {
            section: "negotiate",
            message,
        };
        if !std::path::Path::new(&cfg.keytab).is_file() {
            return Err(bad(format!("keytab {} is not a readable file", cfg.keytab)));
        }
        // GSS-API reads the acceptor keytab from KRB5_KTNAME: `set_keytab_environment` set it
        // at start-up, while the process had one thread
        let realm = (!cfg.realm.is_empty()).then(|| cfg.realm.clone());
        let principal = match &realm {
            Some(r) if !cfg.service_principal.contains('@') => {
                format!("{}@{r}", cfg.service_principal)
            }
            _ => cfg.service_principal.clone(),
        };
        let cred = AcceptorCredential::acquire(&principal).map_err(|e| {
            bad(format!(
                "no keys for {principal} in keytab {}: {e}",
                cfg.keytab
            ))
        })?;
        Ok(Self {
            inner: Arc::new(Acceptor {
                cred,
                principal,
                realm,
            }),
        })
    }
}

impl CredentialVerifier for NegotiateVerifier {
    fn mode(&self) -> &'static str {
        "negotiate"
    }

    fn identity(&self) -> &str {
        &self.inner.principal
    }

    fn challenges(&self) -> &'static [&'static str] {
        CHALLENGES
    }

    fn verify(
        &self,
        credential: Credential,
    ) -> BoxFuture<'static, Result<Decision, VerifierUnavailable>> {
        let acceptor = self.inner.clone();
        Box::pin(async move {
            let Credential::Negotiate(token) = credential else {
                return Ok(Decision::Rejected);
            };
            let Ok(token) = base64::engine::general_purpose::STANDARD.decode(token) else {
                return Ok(Decision::Rejected);
            };
            // GSS-API may read the keytab and the replay cache from disk.
            tokio::task::spawn_blocking(move || Ok(acceptor.accept(&token)))
                .await
                .map_err(|e| VerifierUnavailable(format!("SPNEGO check did not finish: {e}")))?
        })
    }
}

impl Acceptor {
    fn accept(&self, token: &[u8]) -> Decision {
        let client = match self.cred.accept(token) {
            Ok(Some(client)) => client,
            // Kerberos completes in one leg; anything needing more (NTLM) is not offered.
            Ok(None) => return Decision::Rejected,
            Err(e) => {
                tracing::debug!(error = %e, "SPNEGO token refused");
                return Decision::Rejected;
            }
        };
        if !in_realm(&client, self.realm.as_deref()) {
            tracing::debug!(%client, "SPNEGO principal outside auth.negotiate.realm");
            return Decision::Rejected;
        }
        tracing::debug!(%client, "SPNEGO authenticated");
        Decision::Accepted {
            expires_in: None,
            subject: Some(client),
        }
    }
}

/// Whether `principal` (`user@REALM`) belongs to `realm` (any realm when `None`).
fn in_realm(principal: &str, realm: Option<&str>) -> bool {
    match realm {
        None => true,
        Some(r) => principal.rsplit_once('@').is_some_and(|(_, own)| own == r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn realm_membership() {
        assert!(in_realm("alice@EXAMPLE.ORG", Some("EXAMPLE.ORG")));
        assert!(!in_realm("alice@EVIL.ORG", Some("EXAMPLE.ORG")));
        assert!(!in_realm("alice", Some("EXAMPLE.ORG")));
        assert!(!in_realm("alice@EXAMPLE.ORG.EVIL", Some("EXAMPLE.ORG")));
        assert!(in_realm("alice@ANY", None));
    }

    #[test]
    fn a_missing_keytab_is_a_settings_error() {
        let cfg = NegotiateAuthConfig {
            enabled: true,
            keytab: "/nonexistent/proxy.keytab".into(),
            service_principal: "HTTP/proxy.example.org".into(),
            realm: "EXAMPLE.ORG".into(),
        };
        let err = NegotiateVerifier::new(&cfg)
            .map(|_| ())
            .expect_err("no keytab");
        assert!(err.to_string().contains("keytab"), "{err}");
    }
}
