//! Session cookies and CSRF tokens, runtime-free.
//!
//! The session is an encrypted JWT: JWE compact serialization with `alg: dir`, `enc: A256GCM`
//! (RFC 7516/7518): `BASE64URL(header) . "" . BASE64URL(iv) . BASE64URL(ciphertext) .
//! BASE64URL(tag)`, the protected header as additional authenticated data. The 256-bit key is
//! derived from the service secret with HKDF-SHA256, so rotating the secret ends every session.
//! The payload carries the user id, the session id (`sid`, a row of the `sessions` table, so
//! signing out revokes the session on the server and a copied cookie stops working), the
//! absolute expiry (`mx`, max lifetime from sign-in) and the inactivity expiry (`exp`), which
//! every authenticated request pushes forward (renewal).
//!
//! CSRF is a signed double-submit token bound to the session: `GET /api/auth/csrf` returns a
//! random token and sets a cookie `TOKEN.HMAC(SID, TOKEN)`, where `SID` is the session id of the
//! caller's session (empty before sign-in); a state-changing request must echo the token
//! (header `X-CSRF-Token` or field `csrfToken`) and carry a cookie whose signature checks out
//! for the session it comes with. So a pair obtained by someone else (anonymously or with their
//! own session) is useless with a victim's session, and sign-in and sign-out issue a new token.
//!
//! Over TLS both cookies carry the `__Host-` prefix ([`cookie_names`]), which browsers accept
//! only from a secure origin, with `Path=/` and no `Domain`: a sibling host cannot plant them.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// Session cookie name (plain HTTP).
pub const SESSION_COOKIE: &str = "inventory.session-token";
/// CSRF cookie name (plain HTTP).
pub const CSRF_COOKIE: &str = "inventory.csrf-token";
/// Session cookie name over TLS.
pub const SECURE_SESSION_COOKIE: &str = "__Host-inventory.session-token";
/// CSRF cookie name over TLS.
pub const SECURE_CSRF_COOKIE: &str = "__Host-inventory.csrf-token";

/// Names of the session and CSRF cookies: `__Host-` prefixed when the cookies are `Secure`.
/// Only these names are read, so a plain cookie planted next to a secure one is ignored.
pub fn cookie_names(secure: bool) -> (&'static str, &'static str) {
    if secure {
        (SECURE_SESSION_COOKIE, SECURE_CSRF_COOKIE)
    } else {
        (SESSION_COOKIE, CSRF_COOKIE)
    }
}
/// The JWE protected header (fixed).
const JWE_HEADER: &str = r#"{"alg":"dir","enc":"A256GCM"}"#;

/// What a session token carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// User id.
    pub sub: String,
    /// Session id: the server-side record that sign-out deletes.
    pub sid: String,
    /// Issued at (Unix seconds, sign-in time).
    pub iat: i64,
    /// Inactivity expiry (Unix seconds).
    pub exp: i64,
    /// Absolute expiry (Unix seconds).
    pub mx: i64,
}

impl Claims {
    /// A fresh session `sid` for `user` signed in at `now`.
    pub fn new(user: &str, sid: &str, now: i64, idle: i64, max: i64) -> Self {
        let mx = now.saturating_add(max);
        Claims {
            sub: user.to_string(),
            sid: sid.to_string(),
            iat: now,
            exp: now.saturating_add(idle).min(mx),
            mx,
        }
    }

    /// Valid at `now`?
    pub fn valid_at(&self, now: i64) -> bool {
        now < self.exp && now < self.mx
    }

    /// The same session used at `now`: inactivity expiry pushed forward, never past `mx`.
    pub fn renewed(&self, now: i64, idle: i64) -> Self {
        Claims {
            exp: now.saturating_add(idle).min(self.mx),
            ..self.clone()
        }
    }
}

/// Keys derived from the service secret.
#[derive(Clone)]
pub struct Keys {
    jwe: [u8; 32],
    csrf: [u8; 32],
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(..)")
    }
}

fn derive(secret: &[u8], info: &[u8]) -> [u8; 32] {
    let hk = hkdf::Hkdf::<Sha256>::new(Some(b"switchyard-inventory"), secret);
    let mut out = [0u8; 32];
    // 32 bytes is far below HKDF-SHA256's limit (255 * 32), so expand cannot fail.
    if hk.expand(info, &mut out).is_err() {
        out = [0u8; 32];
    }
    out
}

fn random<const N: usize>() -> Result<[u8; N], getrandom::Error> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b)?;
    Ok(b)
}

/// Why a token was refused (all mean "no session").
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("malformed token")]
    Malformed,
    #[error("token does not decrypt with this key")]
    Decrypt,
    #[error("the operating system's random source failed")]
    Random,
}

impl Keys {
    /// Derive the session and CSRF keys from a secret.
    pub fn from_secret(secret: &[u8]) -> Self {
        Keys {
            jwe: derive(secret, b"session jwe A256GCM"),
            csrf: derive(secret, b"csrf hmac-sha256"),
        }
    }

    /// Encrypt claims into a JWE compact token.
    pub fn seal(&self, claims: &Claims) -> Result<String, TokenError> {
        let header = B64.encode(JWE_HEADER);
        let iv: [u8; 12] = random().map_err(|_| TokenError::Random)?;
        let plain = serde_json::to_vec(claims).map_err(|_| TokenError::Malformed)?;
        let cipher = Aes256Gcm::new((&self.jwe).into());
        let mut ct = cipher
            .encrypt(
                Nonce::from_slice(&iv),
                Payload {
                    msg: &plain,
                    aad: header.as_bytes(),
                },
            )
            .map_err(|_| TokenError::Decrypt)?;
        let tag = ct.split_off(ct.len().saturating_sub(16));
        Ok(format!(
            "{header}..{}.{}.{}",
            B64.encode(iv),
            B64.encode(ct),
            B64.encode(tag)
        ))
    }

    /// Decrypt and parse a JWE compact token (expiry is the caller's business).
    pub fn open(&self, token: &str) -> Result<Claims, TokenError> {
        let parts: Vec<&str> = token.split('.').collect();
        let [header, key, iv, ct, tag] = parts.as_slice() else {
            return Err(TokenError::Malformed);
        };
        let hdr = B64.decode(header).map_err(|_| TokenError::Malformed)?;
        let hdr: serde_json::Value =
            serde_json::from_slice(&hdr).map_err(|_| TokenError::Malformed)?;
        if hdr.get("alg").and_then(|v| v.as_str()) != Some("dir")
            || hdr.get("enc").and_then(|v| v.as_str()) != Some("A256GCM")
            || !key.is_empty()
        {
            return Err(TokenError::Malformed);
        }
        let iv = B64.decode(iv).map_err(|_| TokenError::Malformed)?;
        if iv.len() != 12 {
            return Err(TokenError::Malformed);
        }
        let mut data = B64.decode(ct).map_err(|_| TokenError::Malformed)?;
        let tag = B64.decode(tag).map_err(|_| TokenError::Malformed)?;
        if tag.len() != 16 {
            return Err(TokenError::Malformed);
        }
        data.extend_from_slice(&tag);
        let cipher = Aes256Gcm::new((&self.jwe).into());
        let plain = cipher
            .decrypt(
                Nonce::from_slice(&iv),
                Payload {
                    msg: &data,
                    aad: header.as_bytes(),
                },
            )
            .map_err(|_| TokenError::Decrypt)?;
        serde_json::from_slice(&plain).map_err(|_| TokenError::Malformed)
    }

    /// HMAC of the token and the session it is bound to (`sid`, empty before sign-in).
    fn csrf_sig(&self, sid: &str, token: &str) -> String {
        let mut mac = match <Hmac<Sha256> as Mac>::new_from_slice(&self.csrf) {
            Ok(m) => m,
            // HMAC accepts keys of any length.
            Err(_) => return String::new(),
        };
        // Length-prefixed, so no (sid, token) pair can pass for another.
        mac.update(&(sid.len() as u64).to_be_bytes());
        mac.update(sid.as_bytes());
        mac.update(token.as_bytes());
        B64.encode(mac.finalize().into_bytes())
    }

    /// A new CSRF token bound to session `sid` and the cookie value that goes with it.
    pub fn new_csrf(&self, sid: &str) -> Result<(String, String), TokenError> {
        let raw: [u8; 32] = random().map_err(|_| TokenError::Random)?;
        let token = B64.encode(raw);
        let cookie = format!("{token}.{}", self.csrf_sig(sid, &token));
        Ok((token, cookie))
    }

    /// The token inside a CSRF cookie value, if its signature is ours for session `sid`.
    pub fn csrf_from_cookie(&self, cookie: &str, sid: &str) -> Option<String> {
        let (token, sig) = cookie.split_once('.')?;
        if token.is_empty() || !constant_eq(sig.as_bytes(), self.csrf_sig(sid, token).as_bytes()) {
            return None;
        }
        Some(token.to_string())
    }

    /// Does `submitted` match the token of a CSRF cookie bound to session `sid`?
    pub fn csrf_ok(&self, cookie: Option<&str>, submitted: Option<&str>, sid: &str) -> bool {
        match (
            cookie.and_then(|c| self.csrf_from_cookie(c, sid)),
            submitted,
        ) {
            (Some(expected), Some(got)) => constant_eq(expected.as_bytes(), got.as_bytes()),
            _ => false,
        }
    }
}

/// Length-revealing but content-constant-time comparison.
pub fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A new random secret (hex of 32 bytes) for `DATA_DIR/auth_secret`.
pub fn generate_secret() -> Result<String, TokenError> {
    let b: [u8; 32] = random().map_err(|_| TokenError::Random)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The value of cookie `name` in a `Cookie` header.
pub fn cookie_value<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        (k.trim() == name).then(|| v.trim())
    })
}

/// A `Set-Cookie` value: HttpOnly (unless `http_only` is false), SameSite=Lax, Path=/.
/// `max_age` None = delete the cookie.
pub fn set_cookie(
    name: &str,
    value: &str,
    max_age: Option<i64>,
    secure: bool,
    http_only: bool,
) -> String {
    let mut s = format!("{name}={value}; Path=/; SameSite=Lax");
    if http_only {
        s.push_str("; HttpOnly");
    }
    if secure {
        s.push_str("; Secure");
    }
    match max_age {
        Some(a) => s.push_str(&format!("; Max-Age={}", a.max(0))),
        None => s.push_str("; Max-Age=0"),
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn jwe_round_trip_and_tamper() {
        let k = Keys::from_secret(b"0123456789abcdef0123456789abcdef");
        let c = Claims::new("u1", "s1", 1000, 60, 3600);
        let t = k.seal(&c).unwrap();
        assert_eq!(t.split('.').count(), 5);
        assert!(t.starts_with("eyJhbGciOiJkaXIiLCJlbmMiOiJBMjU2R0NNIn0.."));
        assert_eq!(k.open(&t).unwrap(), c);
        // another secret, a flipped byte, garbage: refused
        let other = Keys::from_secret(b"another secret another secret!!!");
        assert_eq!(other.open(&t), Err(TokenError::Decrypt));
        let mut bad = t.clone().into_bytes();
        let i = bad.len() - 30;
        bad[i] = if bad[i] == b'A' { b'B' } else { b'A' };
        assert!(k.open(std::str::from_utf8(&bad).unwrap()).is_err());
        assert!(k.open("a.b.c").is_err());
        assert!(k.open("").is_err());
    }

    #[test]
    fn expiry_and_renewal() {
        let c = Claims::new("u", "s", 0, 10, 25);
        assert!(c.valid_at(9) && !c.valid_at(10));
        let r = c.renewed(9, 10);
        assert_eq!(r.exp, 19);
        assert!(r.valid_at(18));
        let r = r.renewed(18, 10);
        assert_eq!(r.exp, 25, "never past the max lifetime");
        assert!(!r.valid_at(25));
    }

    #[test]
    fn csrf_double_submit_bound_to_the_session() {
        let k = Keys::from_secret(b"secret secret secret secret secret");
        let (token, cookie) = k.new_csrf("sid-1").unwrap();
        assert!(k.csrf_ok(Some(&cookie), Some(&token), "sid-1"));
        assert!(!k.csrf_ok(Some(&cookie), Some("nope"), "sid-1"));
        assert!(!k.csrf_ok(Some(&cookie), None, "sid-1"));
        assert!(!k.csrf_ok(None, Some(&token), "sid-1"));
        // another session, or none, does not accept the pair
        assert!(!k.csrf_ok(Some(&cookie), Some(&token), "sid-2"));
        assert!(!k.csrf_ok(Some(&cookie), Some(&token), ""));
        let (anon, anon_cookie) = k.new_csrf("").unwrap();
        assert!(k.csrf_ok(Some(&anon_cookie), Some(&anon), ""));
        assert!(!k.csrf_ok(Some(&anon_cookie), Some(&anon), "sid-1"));
        // a planted cookie with a made-up signature is refused
        assert!(!k.csrf_ok(Some("abc.def"), Some("abc"), ""));
        let other = Keys::from_secret(b"other other other other other other");
        assert!(!other.csrf_ok(Some(&cookie), Some(&token), "sid-1"));
        assert_eq!(cookie_names(true).0, "__Host-inventory.session-token");
        assert_eq!(cookie_names(false).1, "inventory.csrf-token");
    }

    #[test]
    fn cookies() {
        let h = "a=1; inventory.session-token=xyz ; b=2";
        assert_eq!(cookie_value(h, SESSION_COOKIE), Some("xyz"));
        assert_eq!(cookie_value(h, "c"), None);
        let s = set_cookie("n", "v", Some(60), true, true);
        assert_eq!(s, "n=v; Path=/; SameSite=Lax; HttpOnly; Secure; Max-Age=60");
        assert!(set_cookie("n", "", None, false, true).ends_with("Max-Age=0"));
        assert_eq!(generate_secret().unwrap().len(), 64);
    }
}
