//! `auth.mode: oauth`: the client presents an OAuth 2 access token — `Proxy-Authorization:
//! Bearer <token>`, or as the password of Basic credentials for clients that only speak Basic
//! (and SOCKS5). Without `introspection_url` the token must be a JWT signed by a key of the
//! issuer's JWKS (found through its discovery document) with `iss` = `issuer_url`, `aud`
//! containing `client_id` and an `exp` in the future; the key set is fetched again when a token
//! names an unknown key id (rotation) or after an hour, at most once per [`REFRESH_EVERY`].
//! With `introspection_url` the issuer is asked (RFC 7662), authenticated as
//! `client_id`/`client_secret`. An accepted token is remembered no longer than it is valid, and
//! not before its `nbf` (with [`NBF_LEEWAY`] for clocks a little apart). The issuer, its JWKS
//! and the introspection endpoint must be `https://` (plain `http://` only on loopback: the keys
//! decide who gets in). An accepted token's `sub` is what the request log records as the user.

use crate::ProxyAuthError;
use futures::future::BoxFuture;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use switchyard_config::validate::is_https_or_loopback;
use switchyard_config::OAuthAuthConfig;
use switchyard_dataplane::credentials::Credential;
use switchyard_dataplane::proxy_auth::{CredentialVerifier, Decision, VerifierUnavailable};

/// Key-set fetches at most this often (a flood of tokens with made-up key ids must not turn
/// into a flood of requests to the issuer).
pub const REFRESH_EVERY: Duration = Duration::from_secs(2);
/// Keys older than this are fetched again before use.
const KEYS_MAX_AGE: Duration = Duration::from_secs(3600);
const TIMEOUT: Duration = Duration::from_secs(5);
/// A token whose `nbf` is at most this far ahead is accepted: the issuer's clock may run a
/// little ahead of ours, and a token is used moments after it is issued.
pub const NBF_LEEWAY: Duration = Duration::from_secs(60);

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
    #[serde(default)]
    nbf: Option<u64>,
    #[serde(default)]
    sub: Option<String>,
}

#[derive(serde::Deserialize)]
struct Introspection {
    #[serde(default)]
    active: bool,
    #[serde(default)]
    aud: Option<serde_json::Value>,
    #[serde(default)]
    exp: Option<u64>,
    #[serde(default)]
    nbf: Option<u64>,
    #[serde(default)]
    sub: Option<String>,
    #[serde(default)]
    username: Option<String>,
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
        if !is_https_or_loopback(&cfg.issuer_url) {
            return Err(bad(
                "oauth.issuer_url",
                "must be https:// (plain http only to a loopback issuer)",
            ));
        }
        if cfg
            .introspection_url
            .as_deref()
            .is_some_and(|u| !is_https_or_loopback(u))
        {
            return Err(bad(
                "oauth.introspection_url",
                "must be https:// (plain http only to a loopback address)",
            ));
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

/// Accepted until `exp`, naming `subject` (an empty subject when the token names none: never
/// the user name the client typed beside the token).
fn accepted_until(exp: u64, subject: Option<String>) -> Decision {
    Decision::Accepted {
        expires_in: Some(Duration::from_secs(exp.saturating_sub(now_secs()))),
        subject: Some(subject.unwrap_or_default()),
    }
}

/// Whether a token with this `nbf` is not valid yet.
fn not_yet_valid(nbf: Option<u64>) -> bool {
    nbf.is_some_and(|nbf| nbf > now_secs().saturating_add(NBF_LEEWAY.as_secs()))
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
            Ok(data) if not_yet_valid(data.claims.nbf) => {
                tracing::debug!(nbf = ?data.claims.nbf, "OAuth token refused: not valid yet");
                Ok(Decision::Rejected)
            }
            Ok(data) => Ok(accepted_until(data.claims.exp, data.claims.sub)),
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
                if !is_https_or_loopback(&doc.jwks_uri) {
                    return Err(self.unavailable(format!(
                        "discovery document names the key set {}: not https",
                        doc.jwks_uri
                    )));
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
        if not_yet_valid(answer.nbf) {
            return Ok(Decision::Rejected);
        }
        let subject = answer.sub.or(answer.username);
        Ok(match answer.exp {
            Some(exp) if exp <= now_secs() => Decision::Rejected,
            Some(exp) => accepted_until(exp, subject),
            None => Decision::Accepted {
                expires_in: None,
                subject: Some(subject.unwrap_or_default()),
            },
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
        // Plain http only to loopback (JWKS and introspection in clear text decide who gets in).
        cfg.issuer_url = "http://127.0.0.1:9000".into();
        cfg.introspection_url = Some("http://127.0.0.1:9000/introspect".into());
        assert!(OidcVerifier::new(&cfg).is_ok());
        cfg.introspection_url = Some("http://id.example/introspect".into());
        assert!(OidcVerifier::new(&cfg).is_err());
        cfg.introspection_url = None;
        cfg.issuer_url = "http://id.example".into();
        let e = OidcVerifier::new(&cfg).expect_err("plain http issuer");
        assert!(e.to_string().contains("https"), "{e}");
    }

    /// A test-only Ed25519 key pair (PKCS#8 DER private key in base64, raw public key
    /// base64url), made with `openssl genpkey -algorithm ed25519`.
    const ED_PRIVATE_PKCS8: &str =
        "MC4CAQAwBQYDK2VwBCIEII7hq3gv9RQT97qiCxv5pMRmzfHhCNxk3nMxB5ube/Z9";
    const ED_PUBLIC_X: &str = "OSKKPGSDSdOixZ4oMQPn-naqSc0rov8z3sA_qf9SrYg";

    /// A verifier whose key set is already there (nothing is fetched).
    fn verifier_with_test_key() -> OidcVerifier {
        let cfg = OAuthAuthConfig {
            issuer_url: "http://127.0.0.1:1".into(),
            client_id: "proxy".into(),
            ..Default::default()
        };
        let v = OidcVerifier::new(&cfg).expect("valid");
        let set: JwkSet = serde_json::from_value(serde_json::json!({"keys": [
            {"kty": "OKP", "crv": "Ed25519", "kid": "test", "alg": "EdDSA", "x": ED_PUBLIC_X},
        ]}))
        .expect("jwks");
        let mut keys = v.inner.keys.try_lock().expect("unlocked");
        keys.set = Some(set);
        keys.fetched = Some(Instant::now());
        drop(keys);
        v
    }

    fn signed(claims: &serde_json::Value) -> String {
        let mut header = jsonwebtoken::Header::new(Algorithm::EdDSA);
        header.kid = Some("test".into());
        use base64::Engine as _;
        let der = base64::engine::general_purpose::STANDARD
            .decode(ED_PRIVATE_PKCS8)
            .expect("base64");
        let key = jsonwebtoken::EncodingKey::from_ed_der(&der);
        jsonwebtoken::encode(&header, claims, &key).expect("sign")
    }

    #[test]
    fn nbf_in_the_future_is_refused_and_the_subject_is_named() {
        let v = verifier_with_test_key();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        let now = now_secs();
        let claims = |extra: serde_json::Value| {
            let mut c = serde_json::json!({"iss": "http://127.0.0.1:1", "aud": "proxy",
                "exp": now + 600, "sub": "alice"});
            if let (Some(c), Some(e)) = (c.as_object_mut(), extra.as_object()) {
                c.extend(e.clone());
            }
            c
        };
        let check = |claims: serde_json::Value| {
            rt.block_on(v.verify(Credential::Basic {
                user: "mallory".into(),
                password: signed(&claims),
            }))
        };
        let accepted = |d: &Result<Decision, VerifierUnavailable>| matches!(d, Ok(Decision::Accepted { subject: Some(s), .. }) if s == "alice");
        assert!(accepted(&check(claims(serde_json::json!({})))));
        assert!(accepted(&check(claims(
            serde_json::json!({"nbf": now - 10})
        ))));
        // Within the leeway (the issuer's clock a little ahead), then beyond it.
        assert!(accepted(&check(claims(
            serde_json::json!({"nbf": now + 30})
        ))));
        let later = now + NBF_LEEWAY.as_secs() + 600;
        assert_eq!(
            check(claims(
                serde_json::json!({"nbf": later, "exp": later + 600})
            )),
            Ok(Decision::Rejected)
        );
        // Still checked as before: expired, another audience.
        assert_eq!(
            check(claims(serde_json::json!({"exp": now - 1}))),
            Ok(Decision::Rejected)
        );
        assert_eq!(
            check(claims(serde_json::json!({"aud": "other"}))),
            Ok(Decision::Rejected)
        );
        // No subject: an empty one, never the typed user name.
        let mut nameless = claims(serde_json::json!({}));
        if let Some(c) = nameless.as_object_mut() {
            c.remove("sub");
        }
        assert!(matches!(
            check(nameless),
            Ok(Decision::Accepted { subject: Some(s), .. }) if s.is_empty()
        ));
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
