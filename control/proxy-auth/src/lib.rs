//! Verifiers of proxy credentials for the `auth.mode`s beyond native users (LDAP, system/PAM,
//! OAuth/OIDC) and for SPNEGO under `auth.negotiate.*`. Each is a [`CredentialVerifier`] the
//! control plane builds once at start-up (authentication needs a restart to change) and hands to
//! the data plane's snapshot; the data plane runs its checks on the control plane's tokio
//! runtime, behind the outcome caches, the verification slots and the per-client failure budget
//! (`switchyard_dataplane::proxy_auth`). This crate also answers which modes this host can serve
//! ([`availability`], [`host_problems`]): PAM and GSS-API are loaded at run time, so the build
//! needs neither their headers nor their libraries.

pub mod ldap;
#[cfg(unix)]
mod libgssapi;
#[cfg(unix)]
mod libpam;
#[cfg(unix)]
pub mod negotiate;
pub mod oidc;
#[cfg(unix)]
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

/// A mode's availability on this host (`GET /api/v1/auth/plugins`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    Available,
    /// Not on this platform, or a library the mode loads at run time is missing (the reason
    /// names the package): validation and start-up refuse the mode.
    BuildDisabled(String),
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

    pub fn reason(&self) -> Option<&str> {
        match self {
            Availability::Available => None,
            Availability::BuildDisabled(r) => Some(r),
            Availability::Unimplemented(r) => Some(r),
        }
    }
}

/// Start-up fails with this when `system` is configured on a platform without PAM.
pub const NO_PAM: &str = "system authentication (PAM) is not supported on this platform or build; use native, ldap or oauth";

/// Whether this host can authenticate with `mode` (loads libpam on first ask for `system`).
pub fn availability(mode: AuthMode) -> Availability {
    if !mode.is_implemented() {
        return Availability::Unimplemented("not implemented in this build");
    }
    match mode {
        AuthMode::System => match pam_available() {
            Ok(()) => Availability::Available,
            Err(reason) => Availability::BuildDisabled(reason),
        },
        _ => Availability::Available,
    }
}

#[cfg(unix)]
fn pam_available() -> Result<(), String> {
    libpam::available().map_err(|e| format!("{e}, or use native, ldap or oauth"))
}

#[cfg(not(unix))]
fn pam_available() -> Result<(), String> {
    Err(NO_PAM.into())
}

#[cfg(unix)]
fn gssapi_available() -> Result<(), String> {
    libgssapi::available().map_err(|e| e.to_string())
}

#[cfg(not(unix))]
fn gssapi_available() -> Result<(), String> {
    Err("SPNEGO (GSS-API) is not supported on this platform".into())
}

/// What keeps this host from serving the configured authentication, as (key path, message)
/// pairs for validation: a mode or `auth.negotiate` whose run-time library is missing (the
/// message names the package to install). Loads the libraries on first call.
pub fn host_problems(auth: &AuthConfig) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    if let Availability::BuildDisabled(reason) = availability(auth.mode) {
        problems.push(("auth.mode", reason));
    }
    if auth.negotiate.as_ref().is_some_and(|n| n.enabled) {
        if let Err(reason) = gssapi_available() {
            problems.push(("auth.negotiate.enabled", reason));
        }
    }
    problems
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

/// Points GSS-API at `auth.negotiate.keytab` through `KRB5_KTNAME`, the only way libgssapi
/// offers. Changing the environment is sound only while the process has one thread: the server
/// calls this first thing at start-up, before logging, the runtime and the data plane start
/// theirs. An operator's own `KRB5_KTNAME` wins.
pub fn set_keytab_environment(auth: &AuthConfig) {
    let Some(cfg) = auth.negotiate.as_ref().filter(|n| n.enabled) else {
        return;
    };
    if std::env::var_os("KRB5_KTNAME").is_none() {
        std::env::set_var("KRB5_KTNAME", format!("FILE:{}", cfg.keytab));
    }
}

/// The SPNEGO verifier when `auth.negotiate.enabled`; an error (start-up fails) when GSS-API
/// cannot be loaded or the keytab has no keys for the principal.
pub fn negotiate_verifier(
    auth: &AuthConfig,
) -> Result<Option<Arc<dyn CredentialVerifier>>, ProxyAuthError> {
    let Some(cfg) = auth.negotiate.as_ref().filter(|n| n.enabled) else {
        return Ok(None);
    };
    gssapi_available().map_err(ProxyAuthError::Unavailable)?;
    #[cfg(unix)]
    {
        Ok(Some(Arc::new(negotiate::NegotiateVerifier::new(cfg)?)))
    }
    #[cfg(not(unix))]
    {
        let _ = cfg;
        Ok(None)
    }
}

fn system_verifier(
    auth: &AuthConfig,
) -> Result<Option<Arc<dyn CredentialVerifier>>, ProxyAuthError> {
    pam_available().map_err(ProxyAuthError::Unavailable)?;
    #[cfg(unix)]
    {
        let service = auth.system.clone().unwrap_or_default().service;
        Ok(Some(Arc::new(pam::PamVerifier::new(&service))))
    }
    #[cfg(not(unix))]
    {
        let _ = auth;
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn availability_follows_the_host() {
        assert_eq!(availability(AuthMode::Ldap), Availability::Available);
        assert_eq!(availability(AuthMode::Native), Availability::Available);
        let system = availability(AuthMode::System);
        let cfg = AuthConfig {
            mode: AuthMode::System,
            ..Default::default()
        };
        match pam_available() {
            Ok(()) => {
                assert_eq!(system, Availability::Available);
                assert!(host_problems(&cfg).is_empty());
            }
            Err(reason) => {
                assert_eq!(system.state(), "build_disabled");
                assert_eq!(system.reason(), Some(reason.as_str()));
                let err = verifier(&cfg).map(|_| ()).expect_err("no PAM");
                assert!(err.to_string().contains("libpam0g"), "{err}");
                assert_eq!(host_problems(&cfg)[0].0, "auth.mode");
            }
        }
    }
}
