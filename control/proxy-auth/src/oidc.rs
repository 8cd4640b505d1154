//! `auth.mode: oauth`: the client presents an OAuth 2 access token — `Proxy-Authorization:
//! Bearer <token>`, or as the password of Basic credentials for clients that only speak Basic
//! (and SOCKS5). Without `introspection_url` the token must be a JWT signed by a key of the
//! issuer's JWKS (found through its discovery document) with `iss` = `issuer_url`, `aud`
//! containing `client_id` and an `exp` in the future; the key set is fetched again when a token
//! names an unknown key id (rotation) or after an hour, at most once per [`REFRESH_EVERY`].
//! With `introspection_url` the issuer is asked (RFC 7662), authenticated as
//! `client_id`/`client_secret`. An accepted token is remembered no longer than it is valid.

use crate::ProxyAuthError;
use futures::future::BoxFuture;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use switchyard_config::OAuthAuthConfig;
use switchyard_dataplane::credentials::Credential;
use switchyard_dataplane::proxy_auth::{CredentialVerifier, Decision, VerifierUnavailable};

/// Key-set fetches at most this often (a flood of tokens with made-up key ids must not turn
/// into a flood of requests to the issuer).
pub const REFRESH_EVERY: Duration = Duration::from_secs(2);
/// Keys older than this are fetched again before use.
const KEYS_MAX_AGE: Duration = Duration::from_secs(3600);
const TIMEOUT: Duration = Duration::from_secs(5);

const CHALLENGES: &[&str] = &["Bearer realm=\"switchyard\"", "Basic realm=\"switchyard\""];

/// Signature algorithms accepted: asymmetric only (an HMAC "signature" made with a public key
/// as the secret is the classic JWT forgery).
const ALGORITHMS: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

#[derive(Debug, Clone)]
pub struct OidcVerifier {
    inner: Arc<Issuer>,
}

#[derive(Debug)]
struct Issuer {
    issuer: String,
    client_id: String,
    client_secret: Option<String>,
    introspection_url: Option<String>,
    identity: String,
    http: reqwest::Client,
    keys: tokio::sync::Mutex<KeyCache>,
}

#[derive(Debug, Default)]
struct KeyCache {
    jwks_uri: Option<String>,
    set: Option<JwkSet>,
    fetched: Option<Instant>,
    attempted: Option<Instant>,
}

#[derive(serde::Deserialize)]
struct Discovery {
    issuer: String,
    jwks_uri: String,
}

#[derive(serde::Deserialize)]
struct Claims {
    exp: u64,
}

#[derive(serde::Deserialize)]
struct Introspection {
    #[serde(default)]
    active: bool,
    #[serde(default)]
    aud: Option<serde_json::Value>,
    #[serde(default)]
    exp: Option<u64>,
}

impl OidcVerifier {
    pub fn new(cfg: &OAuthAuthConfig) -> Result<Self, ProxyAuthError> {
        let bad = |section, message: &str| ProxyAuthError::Settings {
            section,
            message: message.into(),
        };
        if !(cfg.issuer_url.starts_with("https://") || cfg.issuer_url.starts_with("http://")) {
            return Err(bad("oauth.issuer_url", "must be an http(s) URL"));
        }
        if cfg.client_id.is_empty() {
            return Err(bad(
                "oauth.client_id",
                "required (the audience tokens must name)",
            ));
        }
        if cfg.introspection_url.is_some() && cfg.client_secret.is_none() {
            return Err(bad(
                "oauth.client_secret",
                "required with introspection_url (the proxy authenticates as the client)",
            ));
        }
        switchyard_service::tls::use_ring_provider();
        let http = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .build()
            .map_err(|e| ProxyAuthError::Unavailable(format!("HTTP client: {e}")))?;
        let issuer = cfg.issuer_url.trim_end_matches('/').to_owned();
        Ok(Self {
            inner: Arc::new(Issuer {
                identity: format!(
                    "{issuer}\n{}\n{}",
                    cfg.client_id,
                    cfg.introspection_url.as_deref().unwrap_or_default()
                ),
                issuer,
                client_id: cfg.client_id.clone(),
                client_secret: cfg.client_secret.clone(),
                introspection_url: cfg.introspection_url.clone(),
                http,
                keys: tokio::sync::Mutex::default(),
            }),
        })
    }
}

impl CredentialVerifier for OidcVerifier {
    fn mode(&self) -> &'static str {
        "oauth"
    }

    fn identity(&self) -> &str {
        &self.inner.identity
    }

    fn challenges(&self) -> &'static [&'static str] {
        CHALLENGES
    }

    fn verify(
        &self,
        credential: Credential,
    ) -> BoxFuture<'static, Result<Decision, VerifierUnavailable>> {
        let issuer = self.inner.clone();
        Box::pin(async move {
            let token = match credential {
                Credential::Bearer(t) => t,
                Credential::Basic { password, .. } => password,
                Credential::Negotiate(_) => return Ok(Decision::Rejected),
            };
            if token.is_empty() {
                return Ok(Decision::Rejected);
            }
            match &issuer.introspection_url {
                Some(url) => issuer.introspect(url, &token).await,
                None => issuer.check_jwt(&token).await,
            }
        })
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn accepted_until(exp: u64) -> Decision {
    Decision::Accepted {
        expires_in: Some(Duration::from_secs(exp.saturating_sub(now_secs()))),
    }
}

/// The key `kid` names; without a kid, the set's only key.
fn find_key(set: &JwkSet, kid: Option<&str>) -> Option<Jwk> {
    match kid {
        Some(kid) => set.find(kid).cloned(),
        None if set.keys.len() == 1 => set.keys.first().cloned(),
        None => None,
    }
}

/// Whether an `aud` value (a string or an array of strings) names `client_id`.
fn audience_names(aud: &serde_json::Value, client_id: &str) -> bool {
    match aud {
        serde_json::Value::String(s) => s == client_id,
        serde_json::Value::Array(items) => items.iter().any(|a| a.as_str() == Some(client_id)),
        _ => false,
    }
}

impl Issuer {
    fn unavailable(&self, what: impl std::fmt::Display) -> VerifierUnavailable {
        VerifierUnavailable(format!("OAuth issuer {}: {what}", self.issuer))
    }

    async fn check_jwt(&self, token: &str) -> Result<Decision, VerifierUnavailable> {
        let Ok(header) = jsonwebtoken::decode_header(token) else {
            return Ok(Decision::Rejected);
        };
        if !ALGORITHMS.contains(&header.alg) {
            return Ok(Decision::Rejected);
        }
        let Some(jwk) = self.key_for(header.kid.as_deref()).await? else {
            return Ok(Decision::Rejected);
        };
        let Ok(key) = DecodingKey::from_jwk(&jwk) else {
            return Ok(Decision::Rejected);
        };
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.client_id]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        // Expired means expired: the proxy's and the issuer's clocks are NTP-synchronised.
        validation.leeway = 0;
        match jsonwebtoken::decode::<Claims>(token, &key, &validation) {
            Ok(data) => Ok(accepted_until(data.claims.exp)),
            Err(e) => {
                tracing::debug!(error = %e, "OAuth token refused");
                Ok(Decision::Rejected)
            }
        }
    }

    /// The issuer's key `kid`, fetching the key set when it is unknown or old. `Ok(None)`: the
    /// issuer has no such key.
    async fn key_for(&self, kid: Option<&str>) -> Result<Option<Jwk>, VerifierUnavailable> {
        let mut cache = self.keys.lock().await;
        let fresh = cache.fetched.is_some_and(|t| t.elapsed() < KEYS_MAX_AGE);
        if fresh {
            if let Some(key) = cache.set.as_ref().and_then(|s| find_key(s, kid)) {
                return Ok(Some(key));
            }
        }
        if cache.attempted.is_some_and(|t| t.elapsed() < REFRESH_EVERY) {
            // Not an answer about the token: it may name a key published moments ago.
            return Err(
                self.unavailable("token names an unknown key; the key set was fetched moments ago")
            );
        }
        cache.attempted = Some(Instant::now());
        let set = self.fetch_keys(&mut cache).await?;
        tracing::info!(issuer = %self.issuer, keys = set.keys.len(), "OAuth key set fetched");
        let key = find_key(&set, kid);
        cache.set = Some(set);
        cache.fetched = Some(Instant::now());
        Ok(key)
    }

    async fn fetch_keys(&self, cache: &mut KeyCache) -> Result<JwkSet, VerifierUnavailable> {
        let jwks_uri = match &cache.jwks_uri {
            Some(u) => u.clone(),
            None => {
                let url = format!("{}/.well-known/openid-configuration", self.issuer);
                let doc: Discovery = self.get_json(&url).await?;
                if doc.issuer.trim_end_matches('/') != self.issuer {
                    return Err(
                        self.unavailable(format!("discovery document names issuer {}", doc.issuer))
                    );
                }
                cache.jwks_uri = Some(doc.jwks_uri.clone());
                doc.jwks_uri
            }
        };
        match self.get_json::<JwkSet>(&jwks_uri).await {
            Ok(set) => Ok(set),
            Err(e) => {
                // Maybe moved: discover again next time.
                cache.jwks_uri = None;
                Err(e)
            }
        }
    }

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        url: &str,
    ) -> Result<T, VerifierUnavailable> {
        let response = self
            .http
            .get(url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| self.unavailable(format!("GET {url}: {e}")))?;
        response
            .json()
            .await
            .map_err(|e| self.unavailable(format!("GET {url}: {e}")))
    }

    async fn introspect(&self, url: &str, token: &str) -> Result<Decision, VerifierUnavailable> {
        let response = self
            .http
            .post(url)
            .basic_auth(&self.client_id, self.client_secret.as_deref())
            .form(&[("token", token), ("token_type_hint", "access_token")])
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| self.unavailable(format!("introspection: {e}")))?;
        let answer: Introspection = response
            .json()
            .await
            .map_err(|e| self.unavailable(format!("introspection answer: {e}")))?;
        if !answer.active {
            return Ok(Decision::Rejected);
        }
        if answer
            .aud
            .as_ref()
            .is_some_and(|aud| !audience_names(aud, &self.client_id))
        {
            return Ok(Decision::Rejected);
        }
        Ok(match answer.exp {
            Some(exp) if exp <= now_secs() => Decision::Rejected,
            Some(exp) => accepted_until(exp),
            None => Decision::Accepted { expires_in: None },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audiences_and_keys() {
        let id = "switchyard-proxy";
        assert!(audience_names(&serde_json::json!(id), id));
        assert!(audience_names(&serde_json::json!(["x", id]), id));
        assert!(!audience_names(&serde_json::json!(["x"]), id));
        assert!(!audience_names(&serde_json::json!(7), id));
        let set: JwkSet = serde_json::from_value(serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "k1", "n": "sXch", "e": "AQAB"},
        ]}))
        .expect("jwks");
        assert!(find_key(&set, Some("k1")).is_some());
        assert!(find_key(&set, Some("k2")).is_none());
        assert!(find_key(&set, None).is_some());
    }

    #[test]
    fn settings_are_checked() {
        let mut cfg = OAuthAuthConfig {
            issuer_url: "https://id.example".into(),
            client_id: "proxy".into(),
            ..Default::default()
        };
        assert!(OidcVerifier::new(&cfg).is_ok());
        cfg.introspection_url = Some("https://id.example/introspect".into());
        assert!(OidcVerifier::new(&cfg).is_err());
        cfg.client_secret = Some("s".into());
        assert!(OidcVerifier::new(&cfg).is_ok());
        cfg.issuer_url = "id.example".into();
        assert!(OidcVerifier::new(&cfg).is_err());
    }

    #[test]
    fn unsigned_and_symmetric_tokens_are_refused_unasked() {
        let cfg = OAuthAuthConfig {
            // Nothing listens: a fetch would make the answer "unavailable", not a refusal.
            issuer_url: "http://127.0.0.1:1".into(),
            client_id: "proxy".into(),
            ..Default::default()
        };
        let v = OidcVerifier::new(&cfg).expect("valid");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        // {"alg":"HS256","typ":"JWT"}.{"exp":9999999999}.sig
        let hs = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJleHAiOjk5OTk5OTk5OTl9.c2ln";
        // {"alg":"none"}.{}.
        let none = "eyJhbGciOiJub25lIn0.e30.";
        for token in [hs, none, "not-a-jwt", ""] {
            let answer = rt.block_on(v.verify(Credential::Bearer(token.into())));
            assert_eq!(answer, Ok(Decision::Rejected), "{token}");
        }
    }
}
