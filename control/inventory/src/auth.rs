//! Accounts and sessions: register, CSRF token, sign-in (NextAuth-style credentials callback),
//! session, sign-out. Registration is rate limited per client IP; failed sign-ins per client
//! IP and per account *and* client IP, so failures from one client never lock an account out
//! for its owner elsewhere. The client IP is the socket peer unless it is a trusted proxy
//! ([`crate::http::forwarded_client`]).

use std::net::SocketAddr;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::db;
use crate::error::ApiError;
use crate::http::{now_secs, parse_body, Shared};
use crate::limiter::retry_after_secs;
use crate::session::{self, Claims};
use crate::validate;

/// bcrypt cost of stored passwords.
pub const BCRYPT_COST: u32 = 12;

/// A body that failed to read: too large → 413, else 400.
pub fn body_or_error(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge("Request body too large".into())
        } else {
            ApiError::BadRequest(format!("Cannot read the body: {e}"))
        }
    })
}

fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(|x| x.as_str())
}

/// Only same-origin relative paths are followed after sign-in/out (no open redirect): one
/// leading `/` not followed by `/` or `\`, and no backslash, control character or space
/// anywhere — browsers drop tabs and newlines from URLs and read `\` as `/`, so
/// `/\t/evil.example` would become `//evil.example`. Anything else goes to `/`.
pub fn safe_callback(url: Option<&str>) -> String {
    let Some(u) = url else {
        return "/".into();
    };
    let local = u.starts_with('/')
        && !u.starts_with("//")
        && !u.starts_with("/\\")
        && !u
            .chars()
            .any(|c| c == '\\' || c.is_control() || c.is_whitespace());
    if local {
        u.into()
    } else {
        "/".into()
    }
}

/// 302 to `to` with `cookies`; the body names the target and the new CSRF token.
fn redirect(to: &str, cookies: Vec<String>, csrf_token: &str) -> Response {
    let mut resp = (
        StatusCode::FOUND,
        Json(json!({"url": to, "csrfToken": csrf_token})),
    )
        .into_response();
    if let Ok(v) = HeaderValue::try_from(to) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    for c in cookies {
        if let Ok(v) = HeaderValue::try_from(c) {
            resp.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    resp
}

fn limited(st: &Shared, key: &str, limit: u32) -> Result<(), ApiError> {
    let window = st.cfg.limits.window.0;
    st.limiter
        .lock()
        .check(key, limit, window, Instant::now())
        .map_err(|d| ApiError::TooManyRequests(retry_after_secs(d)))
}

fn record(st: &Shared, key: &str) {
    st.limiter
        .lock()
        .record(key, st.cfg.limits.window.0, Instant::now());
}

/// `POST /api/auth/register`.
pub async fn register(
    State(st): State<Shared>,
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let ip_key = format!("register:{}", st.client_ip(&addr, &headers));
    limited(&st, &ip_key, st.cfg.limits.registrations_per_ip)?;
    record(&st, &ip_key);
    let body = parse_body(&headers, &body_or_error(body)?, false)?;
    let reg = validate::registration(&body)?;
    if db::user_by_email(&st.pool, &reg.email).await?.is_some() {
        return Err(ApiError::Conflict(
            "User with this email already exists".into(),
        ));
    }
    let password = reg.password.clone();
    let hash = tokio::task::spawn_blocking(move || bcrypt::hash(password, BCRYPT_COST))
        .await
        .map_err(|e| ApiError::Internal(format!("hashing task: {e}")))?
        .map_err(|e| ApiError::Internal(format!("bcrypt: {e}")))?;
    let user = db::create_user(&st.pool, reg.name.as_deref(), &reg.email, &hash).await?;
    tracing::info!(user = %user.id, role = %user.role, "registered");
    Ok((StatusCode::CREATED, Json(user.public_json())).into_response())
}

/// The id of the caller's valid session, empty without one: what CSRF tokens are bound to.
async fn session_id(st: &Shared, headers: &HeaderMap) -> Result<String, ApiError> {
    Ok(st
        .session_of(headers)
        .await?
        .map(|(claims, _)| claims.sid)
        .unwrap_or_default())
}

/// `GET /api/auth/csrf`: `{csrfToken}`, and the signed cookie it pairs with, bound to the
/// caller's session (or to none). A cookie valid for that session keeps its token.
pub async fn csrf(State(st): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    let sid = session_id(&st, &headers).await?;
    let existing = crate::http::cookie(&headers, st.cookie_names(&headers).1)
        .and_then(|c| st.keys.csrf_from_cookie(c, &sid));
    let (token, cookie) = match existing {
        Some(token) => (token, None),
        None => {
            let (token, cookie) = st.new_csrf(&sid, &headers)?;
            (token, Some(cookie))
        }
    };
    let mut resp = Json(json!({"csrfToken": token})).into_response();
    if let Some(v) = cookie.and_then(|c| HeaderValue::try_from(c).ok()) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(resp)
}

/// `GET /api/auth/session`: the session (and a renewed cookie), or `null`.
pub async fn session(State(st): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    let Some((claims, user)) = st.session_of(&headers).await? else {
        return Ok(Json(Value::Null).into_response());
    };
    let renewed = claims.renewed(now_secs(), st.idle_secs());
    let expires = chrono::DateTime::from_timestamp(renewed.exp, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
    let mut resp = Json(json!({
        "user": {"id": user.id, "name": user.name, "email": user.email, "role": user.role},
        "expires": expires,
    }))
    .into_response();
    if let Ok(v) = HeaderValue::try_from(st.session_cookie(&renewed, &headers)?) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(resp)
}

/// `POST /api/auth/callback/credentials` (JSON or form): `{email, password, csrfToken,
/// callbackUrl?}` → 302 with the session cookie and a new CSRF cookie bound to the new session
/// (body `{url, csrfToken}`); 401 on wrong credentials, 403 without the CSRF token, 429 when
/// limited.
pub async fn signin(
    State(st): State<Shared>,
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = parse_body(&headers, &body_or_error(body)?, true)?;
    let current = session_id(&st, &headers).await?;
    if !st.csrf_ok(&headers, str_field(&body, "csrfToken"), &current) {
        return Err(ApiError::Forbidden("Invalid CSRF token".into()));
    }
    let email = validate::normalize_email(str_field(&body, "email").unwrap_or(""));
    let password = str_field(&body, "password").unwrap_or("").to_string();
    let client = st.client_ip(&addr, &headers);
    let ip_key = format!("signin-ip:{client}");
    // Per account *and* client: failures from elsewhere never lock the owner out.
    let account_key = format!("signin-account:{email} from {client}");
    limited(&st, &ip_key, st.cfg.limits.signin_failures_per_ip)?;
    limited(&st, &account_key, st.cfg.limits.signin_failures_per_account)?;
    let user = if email.is_empty() {
        None
    } else {
        db::user_by_email(&st.pool, &email).await?
    };
    let hash = user
        .as_ref()
        .map(|u| u.password_hash.clone())
        .unwrap_or_else(|| st.dummy_hash.clone());
    let ok = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash).unwrap_or(false))
        .await
        .map_err(|e| ApiError::Internal(format!("verify task: {e}")))?;
    let Some(user) = user.filter(|_| ok) else {
        record(&st, &ip_key);
        record(&st, &account_key);
        tracing::info!(ip = %client, "sign-in failed");
        return Err(ApiError::Unauthorized("Invalid email or password".into()));
    };
    st.limiter.lock().clear(&account_key);
    let sid = db::new_session_id();
    let claims = Claims::new(&user.id, &sid, now_secs(), st.idle_secs(), st.max_secs());
    db::create_session(&st.pool, &sid, &user.id, claims.mx).await?;
    let cookie = st.session_cookie(&claims, &headers)?;
    tracing::info!(user = %user.id, "signed in");
    let to = safe_callback(str_field(&body, "callbackUrl"));
    // A new session gets a new CSRF token: one known before sign-in is worthless after it.
    let (token, csrf_cookie) = st.new_csrf(&sid, &headers)?;
    Ok(redirect(&to, vec![cookie, csrf_cookie], &token))
}

/// `POST /api/auth/signout` (CSRF token as header or `csrfToken` field): deletes the session
/// record (server-side revocation), clears the cookie and redirects to `callbackUrl` (local) or
/// `/`.
pub async fn signout(
    State(st): State<Shared>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let raw = body_or_error(body)?;
    let body = if raw.is_empty() {
        Value::Null
    } else {
        parse_body(&headers, &raw, true)?
    };
    let current = session_id(&st, &headers).await?;
    if !st.csrf_ok(&headers, str_field(&body, "csrfToken"), &current) {
        return Err(ApiError::Forbidden("Invalid CSRF token".into()));
    }
    // Revoke the session on the server too, so a copy of the cookie is useless from now on.
    if !current.is_empty() {
        db::delete_session(&st.pool, &current).await?;
        tracing::info!(sid = %current, "signed out");
    }
    let (session_name, _) = st.cookie_names(&headers);
    let clear = session::set_cookie(session_name, "", None, st.secure(&headers), true);
    let to = safe_callback(str_field(&body, "callbackUrl"));
    let (token, csrf_cookie) = st.new_csrf("", &headers)?;
    Ok(redirect(&to, vec![clear, csrf_cookie], &token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callbacks_stay_local() {
        assert_eq!(safe_callback(Some("/items?x=1")), "/items?x=1");
        assert_eq!(safe_callback(Some("/a/b#c")), "/a/b#c");
        for bad in [
            "//evil.example",
            "https://evil.example",
            "/\\evil",
            "",
            "/\t/evil.example",
            "/\n/evil.example",
            "/\r\n/evil.example",
            "/ /evil.example",
            "/x\\..\\evil",
            "\t//evil.example",
            "/\u{7f}/evil.example",
            "evil.example",
        ] {
            assert_eq!(safe_callback(Some(bad)), "/", "{bad}");
        }
        assert_eq!(safe_callback(None), "/");
    }
}
