//! `auth.mode: ldap`: find the user's entry with `user_filter` (the name escaped per RFC 4515),
//! then bind as that entry with the password. Connections are reused: after the user's bind
//! the connection binds back to anonymous and waits in a small pool for the next check.
//! `ldaps://` URLs speak TLS from the start, `tls: true` on `ldap://` upgrades with StartTLS;
//! server certificates are checked against the system's roots (`SSL_CERT_FILE` and
//! `SSL_CERT_DIR` are honoured) unless `insecure_skip_verify`.

use crate::ProxyAuthError;
use futures::future::BoxFuture;
use ldap3::{Ldap, LdapConnAsync, LdapConnSettings, LdapError, Scope, SearchEntry};
use std::sync::Arc;
use std::time::Duration;
use switchyard_config::LdapAuthConfig;
use switchyard_dataplane::credentials::Credential;
use switchyard_dataplane::proxy_auth::{
    CredentialVerifier, Decision, VerifierUnavailable, BASIC_CHALLENGE,
};

/// Connect and per-operation limit: a directory slower than this counts as down.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Idle connections kept for reuse.
const IDLE_MAX: usize = 8;
/// LDAP result code invalidCredentials (RFC 4511).
const INVALID_CREDENTIALS: u32 = 49;

#[derive(Debug, Clone)]
pub struct LdapVerifier {
    inner: Arc<Directory>,
}

struct Directory {
    url: String,
    base_dn: String,
    user_filter: String,
    starttls: bool,
    insecure_skip_verify: bool,
    identity: String,
    idle: parking_lot::Mutex<Vec<Ldap>>,
}

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Directory")
            .field("url", &self.url)
            .field("base_dn", &self.base_dn)
            .field("user_filter", &self.user_filter)
            .field("starttls", &self.starttls)
            .finish_non_exhaustive()
    }
}

/// `template` with every `%s` replaced by `user`, escaped per RFC 4515 (`*`, `(`, `)`, `\` and
/// NUL as `\XX`), so a name can never add filter syntax.
pub fn user_filter(template: &str, user: &str) -> String {
    template.replace("%s", &ldap3::ldap_escape(user))
}

/// What went wrong talking to the directory.
enum Failure {
    /// The connection broke or the directory answered an operation with an error: worth one
    /// try on a fresh connection.
    Directory(String),
}

impl From<LdapError> for Failure {
    fn from(e: LdapError) -> Self {
        Failure::Directory(e.to_string())
    }
}

impl LdapVerifier {
    pub fn new(cfg: &LdapAuthConfig) -> Result<Self, ProxyAuthError> {
        let scheme = cfg
            .url
            .split_once("://")
            .map(|(s, _)| s.to_ascii_lowercase());
        let ldaps = match scheme.as_deref() {
            Some("ldaps") => true,
            Some("ldap") => false,
            _ => {
                return Err(ProxyAuthError::Settings {
                    section: "ldap.url",
                    message: format!("`{}` is not an ldap:// or ldaps:// URL", cfg.url),
                })
            }
        };
        if !cfg.user_filter.contains("%s") {
            return Err(ProxyAuthError::Settings {
                section: "ldap.user_filter",
                message: "must contain %s".into(),
            });
        }
        Ok(Self {
            inner: Arc::new(Directory {
                url: cfg.url.clone(),
                base_dn: cfg.base_dn.clone(),
                user_filter: cfg.user_filter.clone(),
                starttls: cfg.tls && !ldaps,
                insecure_skip_verify: cfg.insecure_skip_verify,
                identity: format!("{}\n{}\n{}", cfg.url, cfg.base_dn, cfg.user_filter),
                idle: parking_lot::Mutex::new(Vec::new()),
            }),
        })
    }
}

impl CredentialVerifier for LdapVerifier {
    fn mode(&self) -> &'static str {
        "ldap"
    }

    fn identity(&self) -> &str {
        &self.inner.identity
    }

    fn challenges(&self) -> &'static [&'static str] {
        BASIC_CHALLENGE
    }

    fn verify(
        &self,
        credential: Credential,
    ) -> BoxFuture<'static, Result<Decision, VerifierUnavailable>> {
        let directory = self.inner.clone();
        Box::pin(async move {
            match credential {
                Credential::Basic { user, password } => {
                    directory.check(&user, &password).await.map(Decision::from)
                }
                Credential::Bearer(_) | Credential::Negotiate(_) => Ok(Decision::Rejected),
            }
        })
    }
}

impl Directory {
    async fn check(&self, user: &str, password: &str) -> Result<bool, VerifierUnavailable> {
        // An empty password is an "unauthenticated bind" (RFC 4513 5.1.2), which many
        // directories answer with success: it must never count as a password.
        if user.is_empty() || password.is_empty() {
            return Ok(false);
        }
        let filter = user_filter(&self.user_filter, user);
        let pooled = self.idle.lock().pop();
        if let Some(ldap) = pooled {
            match self.check_on(ldap, &filter, password).await {
                Ok(ok) => return Ok(ok),
                // Most likely closed by the directory while idle (restart, idle timeout).
                Err(Failure::Directory(e)) => {
                    tracing::debug!(url = %self.url, error = %e, "pooled LDAP connection failed; reconnecting");
                }
            }
        }
        let ldap = self.connect().await?;
        self.check_on(ldap, &filter, password)
            .await
            .map_err(|Failure::Directory(e)| {
                VerifierUnavailable(format!("LDAP directory {}: {e}", self.url))
            })
    }

    async fn connect(&self) -> Result<Ldap, VerifierUnavailable> {
        let settings = LdapConnSettings::new()
            .set_conn_timeout(TIMEOUT)
            .set_starttls(self.starttls)
            .set_no_tls_verify(self.insecure_skip_verify);
        let (conn, ldap) = LdapConnAsync::with_settings(settings, &self.url)
            .await
            .map_err(|e| {
                VerifierUnavailable(format!("LDAP directory {} unreachable: {e}", self.url))
            })?;
        let url = self.url.clone();
        tokio::spawn(async move {
            if let Err(e) = conn.drive().await {
                tracing::debug!(%url, error = %e, "LDAP connection closed");
            }
        });
        Ok(ldap)
    }

    /// Search, bind as the entry found, bind back to anonymous and return the connection to
    /// the pool.
    async fn check_on(
        &self,
        mut ldap: Ldap,
        filter: &str,
        password: &str,
    ) -> Result<bool, Failure> {
        let (entries, _) = ldap
            .with_timeout(TIMEOUT)
            .search(&self.base_dn, Scope::Subtree, filter, vec!["1.1"])
            .await?
            .success()?;
        let dn = match entries.len() {
            1 => entries
                .into_iter()
                .next()
                .map(|e| SearchEntry::construct(e).dn)
                .unwrap_or_default(),
            0 => {
                self.give_back(ldap);
                return Ok(false);
            }
            n => {
                tracing::warn!(url = %self.url, %filter, entries = n, "LDAP user filter matches more than one entry; refusing");
                self.give_back(ldap);
                return Ok(false);
            }
        };
        let bound = ldap
            .with_timeout(TIMEOUT)
            .simple_bind(&dn, password)
            .await?;
        let ok = match bound.rc {
            0 => true,
            INVALID_CREDENTIALS => false,
            _ => return Err(Failure::Directory(bound.to_string())),
        };
        // The next search runs with the directory's anonymous rights again, not the user's.
        let reset = ldap.with_timeout(TIMEOUT).simple_bind("", "").await;
        if matches!(reset, Ok(ref r) if r.rc == 0) {
            self.give_back(ldap);
        }
        Ok(ok)
    }

    fn give_back(&self, ldap: Ldap) {
        let mut idle = self.idle.lock();
        if idle.len() < IDLE_MAX {
            idle.push(ldap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_names_cannot_add_filter_syntax() {
        assert_eq!(user_filter("(uid=%s)", "alice"), "(uid=alice)");
        assert_eq!(
            user_filter("(uid=%s)", "*)(uid=*"),
            "(uid=\\2a\\29\\28uid=\\2a)"
        );
        assert_eq!(user_filter("(uid=%s)", "a\\b\0"), "(uid=a\\5cb\\00)");
        assert_eq!(
            user_filter("(|(uid=%s)(mail=%s))", "x*"),
            "(|(uid=x\\2a)(mail=x\\2a))"
        );
    }

    #[test]
    fn settings_are_checked() {
        let mut cfg = LdapAuthConfig {
            url: "ldap://127.0.0.1:389".into(),
            base_dn: "dc=example,dc=org".into(),
            user_filter: "(uid=%s)".into(),
            tls: true,
            insecure_skip_verify: false,
        };
        let v = LdapVerifier::new(&cfg).expect("valid");
        assert!(v.inner.starttls);
        cfg.url = "ldaps://127.0.0.1:636".into();
        assert!(!LdapVerifier::new(&cfg).expect("valid").inner.starttls);
        cfg.url = "http://x".into();
        assert!(LdapVerifier::new(&cfg).is_err());
    }

    #[test]
    fn empty_passwords_never_bind() {
        let cfg = LdapAuthConfig {
            // Nothing listens there: an attempt to ask would fail as unavailable.
            url: "ldap://127.0.0.1:1".into(),
            base_dn: "dc=x".into(),
            user_filter: "(uid=%s)".into(),
            ..Default::default()
        };
        let v = LdapVerifier::new(&cfg).expect("valid");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        let empty = Credential::Basic {
            user: "alice".into(),
            password: String::new(),
        };
        assert_eq!(rt.block_on(v.verify(empty)), Ok(Decision::Rejected));
        let asked = Credential::Basic {
            user: "alice".into(),
            password: "pw".into(),
        };
        assert!(rt.block_on(v.verify(asked)).is_err());
    }
}
