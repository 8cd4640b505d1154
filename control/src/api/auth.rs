//! API authentication. When `api.token` is set, every endpoint except health, the PAC files,
//! login and logout needs one of:
//!
//! 1. `Authorization: Bearer <token>`;
//! 2. a `token=<token>` query parameter: [`strip_token_query`] (the router's outermost layer)
//!    removes it from the URL before any other code sees the request, so it is never logged;
//! 3. the session cookie from `POST /api/v1/login {token}` (HttpOnly, SameSite=Strict, Secure
//!    when the API is served over TLS), which is what a browser's WebSocket handshake can carry.
//!
//! CSRF: a request authenticated only by the session cookie that changes state (any method but
//! GET/HEAD/OPTIONS) must also carry `X-CSRF-Token`, a value derived from the session id that
//! every cookie-authenticated response carries in the same header (a cross-site page can neither
//! read it nor set a custom header without CORS). Bearer and query-token clients are unaffected.
//!
//! Tokens are compared in constant time. Sessions are 256 random bits from the OS, stored
//! server-side only as their SHA-256 (so a lookup's timing says nothing about a valid id),
//! expire after [`SESSION_TTL`], and end at `POST /api/v1/logout`.

use super::error::{ApiError, ApiJson};
use crate::mesh::credential::{peer_route, Caller, PeerRoute};
use crate::server::ServerState;
use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::uri::PathAndQuery;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::Utc;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_api::{LoginRequest, MessageWithTime};

/// Name of the session cookie.
pub const COOKIE_NAME: &str = "switchyard_session";
/// Name of the client API's session cookie: cookies do not tell ports apart, so a client and a
/// server on one host would otherwise overwrite each other's session.
pub const CLIENT_COOKIE_NAME: &str = "switchyard_client_session";
/// A session lasts this long after login.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Header of the CSRF token (in cookie-authenticated responses and state-changing requests).
pub const CSRF_HEADER: &str = "x-csrf-token";
/// Live sessions kept at most; beyond, the one closest to expiry is dropped.
pub const MAX_SESSIONS: usize = 1024;

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The `token` query parameter, moved out of the URL by [`strip_token_query`].
#[derive(Clone)]
pub struct QueryToken(pub String);

/// Server-side session store: SHA-256 of the session id → expiry.
pub struct Sessions {
    map: Mutex<HashMap<[u8; 32], Instant>>,
    ttl: Duration,
    /// The cookie that carries these sessions' ids.
    cookie: &'static str,
}

impl Default for Sessions {
    fn default() -> Self {
        Self::new(SESSION_TTL)
    }
}

fn digest(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    pub fn new(ttl: Duration) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            ttl,
            cookie: COOKIE_NAME,
        }
    }

    /// Sessions carried by the cookie `cookie` (instead of [`COOKIE_NAME`]).
    pub fn named(cookie: &'static str) -> Self {
        Self {
            cookie,
            ..Self::default()
        }
    }

    /// The session id the request's cookie carries, valid or not.
    pub fn id_in<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        cookie_value(headers, self.cookie)
    }

    /// The `Set-Cookie` value of a session id (an empty one with `max_age` 0 clears it).
    pub fn set_cookie(
        &self,
        id: &str,
        max_age: u64,
        secure: bool,
    ) -> Result<HeaderValue, ApiError> {
        let secure = if secure { "; Secure" } else { "" };
        HeaderValue::from_str(&format!(
            "{}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}",
            self.cookie
        ))
        .map_err(|_| ApiError::internal("cannot build the session cookie"))
    }

    /// Starts a session and returns its id (64 hex digits).
    pub fn create(&self) -> Result<String, getrandom::Error> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw)?;
        let id: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let now = Instant::now();
        let mut map = self.map.lock();
        map.retain(|_, expiry| *expiry > now);
        if map.len() >= MAX_SESSIONS {
            if let Some(oldest) = map.iter().min_by_key(|(_, e)| **e).map(|(k, _)| *k) {
                map.remove(&oldest);
                tracing::warn!(
                    max = MAX_SESSIONS,
                    "API session store full: the oldest session was ended"
                );
            }
        }
        map.insert(digest(&id), now + self.ttl);
        Ok(id)
    }

    pub fn is_valid(&self, id: &str) -> bool {
        let key = digest(id);
        let mut map = self.map.lock();
        match map.get(&key) {
            Some(expiry) if *expiry > Instant::now() => true,
            Some(_) => {
                map.remove(&key);
                false
            }
            None => false,
        }
    }

    /// Ends a session; true when it existed.
    pub fn remove(&self, id: &str) -> bool {
        self.map.lock().remove(&digest(id)).is_some()
    }

    pub fn len(&self) -> usize {
        self.map.lock().len()
    }
}

/// Splits a raw query into (the query without `token` pairs, the first token value decoded).
/// `None` when there is no `token` pair.
fn split_token_query(query: &str) -> Option<(String, String)> {
    let mut token = None;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        let key = form_urlencoded::parse(pair.as_bytes())
            .next()
            .map(|(k, v)| (k.into_owned(), v.into_owned()));
        match key {
            Some((k, v)) if k == "token" => {
                token.get_or_insert(v);
            }
            _ => kept.push(pair),
        }
    }
    token.map(|t| (kept.join("&"), t))
}

/// Outermost layer of the API router: moves a `token` query parameter out of the URL into a
/// [`QueryToken`] extension, before anything else (auth, handlers, logs) sees the request.
pub async fn strip_token_query(mut req: Request) -> Request {
    let Some((rest, token)) = req.uri().query().and_then(split_token_query) else {
        return req;
    };
    let path = req.uri().path().to_owned();
    let pq = if rest.is_empty() {
        path.clone()
    } else {
        format!("{path}?{rest}")
    };
    // The remaining pairs came from a valid URI, so this parses; if it did not, the whole
    // query goes (never the token alone staying behind).
    let pq = PathAndQuery::try_from(pq)
        .or_else(|_| PathAndQuery::try_from(path))
        .unwrap_or_else(|_| PathAndQuery::from_static("/"));
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(pq.clone());
    *req.uri_mut() = Uri::from_parts(parts).unwrap_or_else(|_| Uri::from(pq));
    req.extensions_mut().insert(QueryToken(token));
    req
}

/// The server session cookie's value, if the request carries one.
#[cfg(test)]
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    cookie_value(headers, COOKIE_NAME)
}

/// The value of the cookie `cookie`, if the request carries one.
fn cookie_value<'h>(headers: &'h HeaderMap, cookie: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == cookie)
        .map(|(_, value)| value.trim_matches('"'))
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, value) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| value.trim())
}

/// True when the request carries a valid token (any of the three forms) or no token is set.
pub fn is_authorized(state: &ServerState, req: &Request) -> bool {
    let cfg = state.config.load();
    carries_token(cfg.api.token.as_deref(), &state.sessions, req)
}

/// True when `expected` is `None` or the request carries it (Bearer, `token` query moved out by
/// [`strip_token_query`], or a session of `sessions`). Shared by the server and client APIs.
pub fn carries_token(expected: Option<&str>, sessions: &Sessions, req: &Request) -> bool {
    let Some(expected) = expected else {
        return true;
    };
    let matches = |t: &str| constant_time_eq(t.as_bytes(), expected.as_bytes());
    bearer(req.headers()).is_some_and(matches)
        || req
            .extensions()
            .get::<QueryToken>()
            .is_some_and(|t| matches(&t.0))
        || sessions
            .id_in(req.headers())
            .is_some_and(|id| sessions.is_valid(id))
}

/// The CSRF token of a session: SHA-256 over a fixed label and the (secret) session id, so it
/// is unguessable without the cookie and needs no storage of its own.
pub fn csrf_token(session_id: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"switchyard csrf v1\0");
    h.update(session_id.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The session id when the request is authorized by its session cookie alone (no valid Bearer
/// or query token beside it); `None` otherwise (also when no token is configured).
pub fn cookie_only_session<'r>(
    expected: Option<&str>,
    sessions: &Sessions,
    req: &'r Request,
) -> Option<&'r str> {
    let expected = expected?;
    let matches = |t: &str| constant_time_eq(t.as_bytes(), expected.as_bytes());
    let by_token = bearer(req.headers()).is_some_and(matches)
        || req
            .extensions()
            .get::<QueryToken>()
            .is_some_and(|t| matches(&t.0));
    if by_token {
        return None;
    }
    sessions
        .id_in(req.headers())
        .filter(|id| sessions.is_valid(id))
}

/// True when a cookie-authenticated request of this method must carry the CSRF token.
pub fn changes_state(method: &axum::http::Method) -> bool {
    use axum::http::Method;
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// True when the request carries the CSRF token of `session_id`.
pub fn csrf_matches(headers: &HeaderMap, session_id: &str) -> bool {
    headers
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| constant_time_eq(t.as_bytes(), csrf_token(session_id).as_bytes()))
}

/// The server API's gate: the API token (any form) makes the caller the admin; otherwise a
/// mesh peer credential is admitted on the routes a peer may use (decided by the matched
/// route, [`peer_route`]) and refused with 403 on every other; anything else is 401. The
/// handler gets the [`Caller`] as an extension.
pub async fn require_token(
    State(state): State<Arc<ServerState>>,
    mut req: Request,
    next: Next,
) -> Response {
    if !is_authorized(&state, &req) {
        return match mesh_caller(&state, &mut req).await {
            Ok(caller) => {
                req.extensions_mut().insert(caller);
                next.run(req).await
            }
            Err(refusal) => refusal,
        };
    }
    req.extensions_mut().insert(Caller::Admin);
    let cfg = state.config.load();
    with_csrf_check(cfg.api.token.as_deref(), &state.sessions, req, next).await
}

/// The caller of a request without the API token, by its Bearer (or `?token=`) secret: a mesh
/// peer, or at registration a possible enrollment key. Err is the answer to send.
async fn mesh_caller(state: &ServerState, req: &mut Request) -> Result<Caller, Response> {
    let access = req
        .extensions()
        .get::<MatchedPath>()
        .and_then(|route| peer_route(req.method().as_str(), route.as_str()));
    let secret = bearer(req.headers())
        .or_else(|| req.extensions().get::<QueryToken>().map(|t| t.0.as_str()))
        .filter(|s| !s.is_empty())
        .map(str::to_owned);
    let (Some(secret), Some(registry)) = (secret, state.mesh.clone()) else {
        return Err(refused(req));
    };
    // `&mut`: a shared reference to the request (its body is not Sync) is not Send.
    let (path, method) = (req.uri().path().to_owned(), req.method().clone());
    let caller = registry
        .caller(&secret)
        .await
        .map_err(|e| ApiError::from(e).into_response())?;
    match (access, &caller) {
        // Checked by the registration itself, as an enrollment key of the path's network.
        (Some(PeerRoute::Register), _) => Ok(caller),
        (Some(_), Caller::Peer { .. }) => Ok(caller),
        (None, Caller::Peer { network, peer, .. }) => {
            tracing::warn!(%path, %method, %network, %peer, "API request refused: a mesh peer credential outside the peer's routes");
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "FORBIDDEN",
                "a mesh peer credential may only register, heartbeat, update or delete its own peer and read its own network's peers and events",
            )
            .into_response())
        }
        _ => Err(refused(req)),
    }
}

/// Runs an authorised request, refusing a state change authenticated by the session cookie
/// alone unless it carries the session's CSRF token, and handing the token out on every
/// cookie-authenticated response. Bearer and `?token=` requests pass untouched. Shared by the
/// server and the client API.
pub async fn with_csrf_check(
    expected: Option<&str>,
    sessions: &Sessions,
    req: Request,
    next: Next,
) -> Response {
    let Some(session) = cookie_only_session(expected, sessions, &req).map(str::to_owned) else {
        return next.run(req).await;
    };
    if changes_state(req.method()) && !csrf_matches(req.headers(), &session) {
        tracing::warn!(path = %req.uri().path(), method = %req.method(), "API request refused: cookie-authenticated without the CSRF token");
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "CSRF_TOKEN_REQUIRED",
            "a request authenticated by the session cookie must carry the X-CSRF-Token header of the session (sent in every cookie-authenticated response)",
        )
        .into_response();
    }
    let mut resp = next.run(req).await;
    if let Ok(v) = HeaderValue::from_str(&csrf_token(&session)) {
        resp.headers_mut().insert(CSRF_HEADER, v);
    }
    resp
}

/// The 401 answer of a request without a valid token.
pub fn refused(req: &Request) -> Response {
    tracing::debug!(path = %req.uri().path(), "API request refused: no valid token");
    let mut r = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "UNAUTHORIZED",
        "a valid API token is required (Authorization: Bearer <token>, ?token=<token> or the session cookie of POST /api/v1/login)",
    )
    .into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"switchyard\""),
    );
    r
}

pub(crate) fn message(text: &str) -> Json<MessageWithTime> {
    Json(MessageWithTime {
        message: text.into(),
        time: Utc::now(),
    })
}

/// Exchanges the API token for a session cookie.
#[utoipa::path(post, path = "/api/v1/login", tag = "auth", security(()), request_body = LoginRequest,
    responses(
        (status = 200, description = "session started: the HttpOnly, SameSite=Strict cookie `switchyard_session` is set (Secure over TLS), valid 12 h; without a configured token, nothing to do and no cookie", body = MessageWithTime),
        (status = 400, description = "body is not {token: string}", body = switchyard_api::ErrorBody),
        (status = 401, description = "wrong token", body = switchyard_api::ErrorBody),
    ))]
pub async fn login(
    State(state): State<Arc<ServerState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    ApiJson(body): ApiJson<LoginRequest>,
) -> Result<Response, ApiError> {
    let cfg = state.config.load();
    let Some(expected) = cfg.api.token.as_deref() else {
        return Ok(message("no API token is configured: the API needs no login").into_response());
    };
    if !constant_time_eq(body.token.as_bytes(), expected.as_bytes()) {
        tracing::warn!(client = %peer.ip(), "API login refused: wrong token");
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            "wrong API token",
        ));
    }
    let id = state.sessions.create().map_err(|e| {
        tracing::error!(error = %e, "cannot create an API session: no randomness from the OS");
        ApiError::internal("cannot create a session")
    })?;
    tracing::info!(client = %peer.ip(), sessions = state.sessions.len(), "API login: session started");
    let mut r = message("logged in").into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        state
            .sessions
            .set_cookie(&id, SESSION_TTL.as_secs(), state.api_tls)?,
    );
    Ok(r)
}

/// Ends the session of the request's cookie and clears the cookie.
#[utoipa::path(post, path = "/api/v1/logout", tag = "auth", security(()),
    responses((status = 200, description = "session ended (if there was one); the cookie is cleared", body = MessageWithTime)))]
pub async fn logout(
    State(state): State<Arc<ServerState>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let ended = state
        .sessions
        .id_in(&headers)
        .is_some_and(|id| state.sessions.remove(id));
    if ended {
        tracing::info!("API logout: session ended");
    }
    let mut r = message(if ended { "logged out" } else { "no session" }).into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        state.sessions.set_cookie("", 0, state.api_tls)?,
    );
    Ok(r)
}

/// The startup warning of an API without a token that listens beyond loopback.
pub fn warn_if_unauthenticated(state: &ServerState, listen: SocketAddr) {
    if state.config.load().api.token.is_none() && !listen.ip().is_loopback() {
        tracing::warn!(
            listen = %listen,
            "api.token is not set: the management API (and /api/v1/ws) has no authentication and listens beyond loopback; set api.token or listen on 127.0.0.1"
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn token_query_is_split_out() {
        let cases = [
            ("token=abc", Some(("", "abc"))),
            ("limit=5&token=abc", Some(("limit=5", "abc"))),
            (
                "token=abc&limit=5&offset=1",
                Some(("limit=5&offset=1", "abc")),
            ),
            ("token=a%2Bb%3D&x=1", Some(("x=1", "a+b="))),
            ("to%6Ben=abc", Some(("", "abc"))),
            ("token=1&token=2", Some(("", "1"))),
            ("token", Some(("", ""))),
            ("limit=5", None),
            ("tokens=5", None),
            ("", None),
        ];
        for (q, want) in cases {
            let got = split_token_query(q);
            assert_eq!(
                got.as_ref().map(|(a, b)| (a.as_str(), b.as_str())),
                want,
                "{q}"
            );
        }
    }

    #[tokio::test]
    async fn strip_layer_removes_the_token_from_the_uri() {
        for (uri, want_uri, want_token) in [
            (
                "/api/v1/requests?limit=5&token=s3cret",
                "/api/v1/requests?limit=5",
                Some("s3cret"),
            ),
            ("/api/v1/ws?token=s3cret", "/api/v1/ws", Some("s3cret")),
            ("/api/v1/ws?x=1", "/api/v1/ws?x=1", None),
            ("/api/v1/ws", "/api/v1/ws", None),
        ] {
            let req = Request::builder()
                .uri(uri)
                .body(axum::body::Body::empty())
                .unwrap();
            let req = strip_token_query(req).await;
            assert_eq!(req.uri().to_string(), want_uri);
            assert!(!req.uri().to_string().contains("s3cret"));
            assert_eq!(
                req.extensions().get::<QueryToken>().map(|t| t.0.as_str()),
                want_token
            );
        }
    }

    #[test]
    fn cookies_and_bearer() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("a=b; switchyard_session=xyz; c=d"),
        );
        assert_eq!(session_cookie(&h), Some("xyz"));
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, HeaderValue::from_static("a=b"));
        h.append(
            header::COOKIE,
            HeaderValue::from_static("switchyard_session=\"q\""),
        );
        assert_eq!(session_cookie(&h), Some("q"));
        assert_eq!(session_cookie(&HeaderMap::new()), None);
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  t0k "),
        );
        assert_eq!(bearer(&h), Some("t0k"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic dTpw"),
        );
        assert_eq!(bearer(&h), None);
    }

    #[test]
    fn named_sessions_read_and_set_their_own_cookie() {
        let client = Sessions::named(CLIENT_COOKIE_NAME);
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("switchyard_session=server; switchyard_client_session=client"),
        );
        assert_eq!(client.id_in(&h), Some("client"));
        assert_eq!(Sessions::default().id_in(&h), Some("server"));
        let set = client.set_cookie("abc", 60, false).unwrap();
        assert!(set
            .to_str()
            .unwrap()
            .starts_with("switchyard_client_session=abc; Path=/; HttpOnly; SameSite=Strict"));
    }

    #[test]
    fn sessions_expire_and_end() {
        let s = Sessions::new(Duration::from_secs(60));
        let a = s.create().unwrap();
        let b = s.create().unwrap();
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert!(s.is_valid(&a) && s.is_valid(&b));
        assert!(!s.is_valid("nope"));
        assert!(s.remove(&a));
        assert!(!s.is_valid(&a) && s.is_valid(&b));
        assert!(!s.remove(&a));
        let expired = Sessions::new(Duration::ZERO);
        let c = expired.create().unwrap();
        assert!(!expired.is_valid(&c));
    }

    #[test]
    fn session_store_is_bounded() {
        let s = Sessions::new(Duration::from_secs(60));
        let first = s.create().unwrap();
        for _ in 0..MAX_SESSIONS {
            s.create().unwrap();
        }
        assert_eq!(s.len(), MAX_SESSIONS);
        assert!(!s.is_valid(&first));
    }

    fn request(method: &str, headers: &[(&str, &str)]) -> Request {
        let mut b = Request::builder().method(method).uri("/api/v1/routes");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn csrf_applies_only_to_cookie_authenticated_requests() {
        let sessions = Sessions::new(Duration::from_secs(60));
        let id = sessions.create().unwrap();
        let cookie = format!("{COOKIE_NAME}={id}");
        let token = Some("s3cret");
        // cookie alone: the session is returned, so the CSRF check applies
        let r = request("POST", &[("cookie", &cookie)]);
        assert_eq!(cookie_only_session(token, &sessions, &r), Some(id.as_str()));
        // a Bearer token beside it (or alone): no CSRF check
        let r = request(
            "POST",
            &[("cookie", &cookie), ("authorization", "Bearer s3cret")],
        );
        assert_eq!(cookie_only_session(token, &sessions, &r), None);
        // a wrong Bearer does not exempt the cookie
        let r = request(
            "POST",
            &[("cookie", &cookie), ("authorization", "Bearer wrong")],
        );
        assert_eq!(cookie_only_session(token, &sessions, &r), Some(id.as_str()));
        // a query token exempts as well
        let mut r = request("POST", &[("cookie", &cookie)]);
        r.extensions_mut().insert(QueryToken("s3cret".into()));
        assert_eq!(cookie_only_session(token, &sessions, &r), None);
        // an unknown session or no configured token: nothing to check
        let r = request("POST", &[("cookie", "switchyard_session=unknown")]);
        assert_eq!(cookie_only_session(token, &sessions, &r), None);
        let r = request("POST", &[("cookie", &cookie)]);
        assert_eq!(cookie_only_session(None, &sessions, &r), None);
    }

    #[test]
    fn csrf_token_is_per_session_and_checked_on_state_changes() {
        use axum::http::Method;
        let a = csrf_token("session-a");
        assert_eq!(a.len(), 64);
        assert_eq!(a, csrf_token("session-a"));
        assert_ne!(a, csrf_token("session-b"));
        assert!(!a.contains("session-a"));
        let mut h = HeaderMap::new();
        assert!(!csrf_matches(&h, "session-a"));
        h.insert(CSRF_HEADER, HeaderValue::from_str(&a).unwrap());
        assert!(csrf_matches(&h, "session-a"));
        assert!(!csrf_matches(&h, "session-b"));
        for m in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
            assert!(changes_state(&m), "{m}");
        }
        for m in [Method::GET, Method::HEAD, Method::OPTIONS] {
            assert!(!changes_state(&m), "{m}");
        }
    }

    #[test]
    fn constant_time_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(constant_time_eq(b"", b""));
    }
}
