//! Verifiers of proxy credentials for the `auth.mode`s beyond native users (LDAP, system/PAM,
//! OAuth/OIDC) and for SPNEGO under `auth.negotiate.*`. Each is a [`CredentialVerifier`] the
//! control plane builds once at start-up (authentication needs a restart to change) and hands to
//! the data plane's snapshot; the data plane runs its checks on the control plane's tokio
//! runtime, behind the outcome caches, the verification slots and the per-client failure budget
//! (`switchyard_dataplane::proxy_auth`). This crate also answers which modes this build can serve
//! ([`availability`]).

pub mod ldap;
#[cfg(feature = "negotiate")]
pub mod negotiate;
pub mod oidc;
#[cfg(all(unix, feature = "pam"))]
pub mod pam;

use std::sync::Arc;
use switchyard_config::{AuthConfig, AuthMode};
use switchyard_dataplane::proxy_auth::CredentialVerifier;

/// Why the configured mode cannot run; start-up fails with this message.
#[derive(Debug, thiserror::Error)]
pub enum ProxyAuthError {
    #[error("auth.{section}: {message}")]
    Settings {
        section: &'static str,
        message: String,
    },
    #[error("{0}")]
    Unavailable(String),
}

/// A mode's availability in this build (`GET /api/v1/auth/plugins`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    Available,
    /// A cargo feature turned off: accepted with a warning, fails closed.
    BuildDisabled(&'static str),
    Unimplemented(&'static str),
}

impl Availability {
    pub fn state(&self) -> &'static str {
        match self {
            Availability::Available => "available",
            Availability::BuildDisabled(_) => "build_disabled",
            Availability::Unimplemented(_) => "unimplemented",
        }
    }

    pub fn reason(&self) -> Option<&'static str> {
        match self {
            Availability::Available => None,
            Availability::BuildDisabled(r) | Availability::Unimplemented(r) => Some(r),
        }
    }
}

/// Start-up fails with this when `system` is configured where PAM is missing.
pub const NO_PAM: &str = "system authentication (PAM) is not supported on this platform or build; use native, ldap or oauth";

const PAM_BUILT: bool = cfg!(all(unix, feature = "pam"));

/// Whether this build can authenticate with `mode`.
pub fn availability(mode: AuthMode) -> Availability {
    if !mode.is_implemented() {
        return Availability::Unimplemented("not implemented in this build");
    }
    match mode {
        AuthMode::System if !PAM_BUILT => Availability::BuildDisabled(NO_PAM),
        _ => Availability::Available,
    }
}

/// The verifier of the configured mode; `None` for `none` and `native` (the data plane checks
/// native users itself).
pub fn verifier(auth: &AuthConfig) -> Result<Option<Arc<dyn CredentialVerifier>>, ProxyAuthError> {
    match auth.mode {
        AuthMode::None | AuthMode::Native => Ok(None),
        AuthMode::Ldap => {
            let settings = auth.ldap.as_ref().ok_or(ProxyAuthError::Settings {
                section: "ldap",
                message: "missing (url, base_dn, user_filter)".into(),
            })?;
            Ok(Some(Arc::new(ldap::LdapVerifier::new(settings)?)))
        }
        AuthMode::System => system_verifier(auth),
        AuthMode::Oauth => {
            let settings = auth.oauth.as_ref().ok_or(ProxyAuthError::Settings {
                section: "oauth",
                message: "missing (issuer_url, client_id)".into(),
            })?;
            Ok(Some(Arc::new(oidc::OidcVerifier::new(settings)?)))
        }
    }
}

/// Whether SPNEGO (`auth.negotiate.*`) is built into this binary.
pub const NEGOTIATE_BUILT: bool = cfg!(feature = "negotiate");

/// Points GSS-API at `auth.negotiate.keytab` through `KRB5_KTNAME`, the only way libgssapi
/// offers. Changing the environment is sound only while the process has one thread: the server
/// calls this first thing at start-up, before logging, the runtime and the data plane start
/// theirs. An operator's own `KRB5_KTNAME` wins.
pub fn set_keytab_environment(auth: &AuthConfig) {
    let Some(cfg) = auth.negotiate.as_ref().filter(|n| n.enabled) else {
        return;
    };
    if cfg!(feature = "negotiate") && std::env::var_os("KRB5_KTNAME").is_none() {
        std::env::set_var("KRB5_KTNAME", format!("FILE:{}", cfg.keytab));
    }
}

/// The SPNEGO verifier when `auth.negotiate.enabled`. `Ok(None)` also when this build lacks
/// the `negotiate` feature: then the data plane fails closed (and start-up warns).
pub fn negotiate_verifier(
    auth: &AuthConfig,
) -> Result<Option<Arc<dyn CredentialVerifier>>, ProxyAuthError> {
    let Some(cfg) = auth.negotiate.as_ref().filter(|n| n.enabled) else {
        return Ok(None);
    };
    #[cfg(feature = "negotiate")]
    {
        Ok(Some(Arc::new(negotiate::NegotiateVerifier::new(cfg)?)))
    }
    #[cfg(not(feature = "negotiate"))]
    {
        let _ = cfg;
        tracing::warn!("auth.negotiate is enabled but this build has no SPNEGO support (build_disabled): every request is refused");
        Ok(None)
    }
}

#[cfg(all(unix, feature = "pam"))]
fn system_verifier(
    auth: &AuthConfig,
) -> Result<Option<Arc<dyn CredentialVerifier>>, ProxyAuthError> {
    let service = auth.system.clone().unwrap_or_default().service;
    Ok(Some(Arc::new(pam::PamVerifier::new(&service))))
}

#[cfg(not(all(unix, feature = "pam")))]
fn system_verifier(_: &AuthConfig) -> Result<Option<Arc<dyn CredentialVerifier>>, ProxyAuthError> {
    Err(ProxyAuthError::Unavailable(NO_PAM.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn availability_follows_the_build() {
        assert_eq!(availability(AuthMode::Ldap), Availability::Available);
        assert_eq!(availability(AuthMode::Native), Availability::Available);
        let system = availability(AuthMode::System);
        if PAM_BUILT {
            assert_eq!(system, Availability::Available);
        } else {
            assert_eq!(system.state(), "build_disabled");
            let cfg = AuthConfig {
                mode: AuthMode::System,
                ..Default::default()
            };
            let err = verifier(&cfg).map(|_| ()).expect_err("no PAM");
            assert!(
                err.to_string().contains("use native, ldap or oauth"),
                "{err}"
            );
        }
    }
}
