//! The router: the web UI ([`crate::ui`]), accounts and sessions ([`crate::auth`]),
//! categories, locations and items ([`crate::resources`]). Data routes sit behind [`require_session`], which authenticates the
//! session cookie, enforces CSRF on state-changing methods and renews the cookie.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use ipnet::IpNet;
use parking_lot::Mutex;
use serde_json::{Map, Value};
use sqlx::AnyPool;
use switchyard_config::inventory::InventoryConfig;

use crate::db::{self, User};
use crate::error::ApiError;
use crate::limiter::Limiter;
use crate::session::{self, Claims, Keys};

/// Shared state of the service.
pub struct AppState {
    pub pool: AnyPool,
    /// Which database `pool` talks to (write transactions differ, see [`db::begin_write`]).
    pub engine: db::Engine,
    /// Data directory.
    pub data_dir: std::path::PathBuf,
    /// Where image bytes are kept.
    pub images: crate::image_store::ImageStore,
    pub keys: Keys,
    pub cfg: InventoryConfig,
    pub limiter: Mutex<Limiter>,
    /// A bcrypt hash checked when the e-mail is unknown, so timing does not reveal accounts.
    pub dummy_hash: String,
}

pub type Shared = Arc<AppState>;

/// The authenticated caller, put into request extensions by [`require_session`].
#[derive(Clone, Debug)]
pub struct CurrentUser(pub User);

/// Unix seconds now.
pub fn now_secs() -> i64 {
    chrono::Utc::now().timestamp()
}

impl AppState {
    pub fn idle_secs(&self) -> i64 {
        i64::try_from(self.cfg.session.idle_timeout.0.as_secs()).unwrap_or(i64::MAX)
    }

    pub fn max_secs(&self) -> i64 {
        i64::try_from(self.cfg.session.max_lifetime.0.as_secs()).unwrap_or(i64::MAX)
    }

    /// Secure cookies: configured, else when a TLS-terminating proxy says https.
    pub fn secure(&self, headers: &HeaderMap) -> bool {
        self.cfg.session.secure_cookies.unwrap_or_else(|| {
            headers
                .get("x-forwarded-proto")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.eq_ignore_ascii_case("https"))
        })
    }

    /// Names of the session and CSRF cookies for this request (`__Host-` over TLS).
    pub fn cookie_names(&self, headers: &HeaderMap) -> (&'static str, &'static str) {
        session::cookie_names(self.secure(headers))
    }

    /// `Set-Cookie` carrying `claims` (expires with the inactivity expiry).
    pub fn session_cookie(&self, claims: &Claims, headers: &HeaderMap) -> Result<String, ApiError> {
        let token = self
            .keys
            .seal(claims)
            .map_err(|e| ApiError::Internal(format!("sealing a session: {e}")))?;
        Ok(session::set_cookie(
            self.cookie_names(headers).0,
            &token,
            Some(claims.exp - now_secs()),
            self.secure(headers),
            true,
        ))
    }

    /// A new CSRF token bound to session `sid` (empty: none) and its `Set-Cookie`.
    pub fn new_csrf(&self, sid: &str, headers: &HeaderMap) -> Result<(String, String), ApiError> {
        let (token, value) = self
            .keys
            .new_csrf(sid)
            .map_err(|e| ApiError::Internal(format!("csrf token: {e}")))?;
        let cookie = session::set_cookie(
            self.cookie_names(headers).1,
            &value,
            Some(self.max_secs()),
            self.secure(headers),
            true,
        );
        Ok((token, cookie))
    }

    /// The client's address: the socket peer, or — when the peer is one of
    /// `trusted_proxies` — the address its `X-Forwarded-For` names (see [`forwarded_client`]).
    pub fn client_ip(&self, peer: &SocketAddr, headers: &HeaderMap) -> IpAddr {
        forwarded_client(peer.ip(), headers, &self.cfg.trusted_proxies)
    }

    /// The valid session of a request, if any: claims and the user (the session must not be
    /// signed out, the user must still exist).
    pub async fn session_of(
        &self,
        headers: &HeaderMap,
    ) -> Result<Option<(Claims, User)>, ApiError> {
        let Some(token) = cookie(headers, self.cookie_names(headers).0) else {
            return Ok(None);
        };
        let claims = match self.keys.open(token) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!("session cookie refused: {e}");
                return Ok(None);
            }
        };
        if !claims.valid_at(now_secs()) {
            return Ok(None);
        }
        // The session row must still exist: sign-out deletes it.
        Ok(db::user_by_session(&self.pool, &claims.sid, &claims.sub)
            .await?
            .map(|u| (claims, u)))
    }

    /// Is the CSRF token submitted with this request (header or `field`) the one of its cookie,
    /// and that cookie bound to session `sid` (empty: no session)?
    pub fn csrf_ok(&self, headers: &HeaderMap, field: Option<&str>, sid: &str) -> bool {
        let submitted = headers
            .get("x-csrf-token")
            .and_then(|v| v.to_str().ok())
            .or(field);
        let name = self.cookie_names(headers).1;
        self.keys.csrf_ok(cookie(headers, name), submitted, sid)
    }
}

/// Value of cookie `name` of a request.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|h| session::cookie_value(h, name))
}

/// The client address of a request from `peer`. `X-Forwarded-For` counts only when `peer` is a
/// trusted proxy: its addresses are walked from the right (the one the nearest proxy added)
/// past further trusted proxies, and the first untrusted one is the client. A malformed entry
/// stops the walk at the last address known good, so a client cannot choose its own address by
/// sending the header itself.
pub fn forwarded_client(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(&canonical(*ip)));
    if !is_trusted(&peer) {
        return peer;
    }
    let mut client = peer;
    let hops = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .collect::<Vec<_>>();
    for hop in hops.iter().rev() {
        let Ok(ip) = hop.trim().parse::<IpAddr>() else {
            break;
        };
        client = canonical(ip);
        if !is_trusted(&client) {
            break;
        }
    }
    client
}

/// IPv4-mapped IPv6 addresses as IPv4, so `::ffff:10.0.0.1` matches `10.0.0.0/8`.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// A request body as a JSON value: JSON, or (with `allow_form`) a urlencoded form as an object
/// of strings.
pub fn parse_body(headers: &HeaderMap, body: &Bytes, allow_form: bool) -> Result<Value, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if allow_form && ct.starts_with("application/x-www-form-urlencoded") {
        let map: Map<String, Value> = form_urlencoded::parse(body)
            .map(|(k, v)| (k.into_owned(), Value::String(v.into_owned())))
            .collect();
        return Ok(Value::Object(map));
    }
    if !(ct.starts_with("application/json") || ct.contains("+json")) {
        return Err(ApiError::BadRequest(
            "Content-Type must be application/json".into(),
        ));
    }
    serde_json::from_slice(body).map_err(|_| ApiError::BadRequest("Invalid JSON body".into()))
}

/// Authenticate data routes: 401 without a valid session, 403 on a state-changing request
/// without the CSRF token; the response carries the renewed session cookie.
async fn require_session(State(st): State<Shared>, mut req: Request, next: Next) -> Response {
    let (claims, user) = match st.session_of(req.headers()).await {
        Ok(Some(s)) => s,
        Ok(None) => return ApiError::Unauthorized("Unauthorized".into()).into_response(),
        Err(e) => return e.into_response(),
    };
    let safe = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if !safe && !st.csrf_ok(req.headers(), None, &claims.sid) {
        tracing::info!(user = %user.id, path = %req.uri().path(), "CSRF token missing or wrong");
        return ApiError::Forbidden("Invalid CSRF token".into()).into_response();
    }
    let renewed = claims.renewed(now_secs(), st.idle_secs());
    let set = st.session_cookie(&renewed, req.headers());
    req.extensions_mut().insert(CurrentUser(user));
    let mut resp = next.run(req).await;
    if let Ok(Ok(v)) = set.map(HeaderValue::try_from) {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
    resp
}

/// Largest import body (a JSON export or CSV of ~100,000 items fits).
pub const IMPORT_LIMIT: usize = 64 * 1024 * 1024;

/// The whole router.
pub fn router(state: Shared) -> Router {
    use crate::{auth, images, resources as r, transfer};
    // multipart framing on top of the largest image
    let upload_limit = usize::try_from(state.cfg.limits.max_image_size.0.saturating_add(64 * 1024))
        .unwrap_or(usize::MAX);
    let data = Router::new()
        .route("/api/items", get(r::list_items).post(r::create_item))
        .route(
            "/api/items/{id}",
            get(r::get_item).put(r::update_item).delete(r::delete_item),
        )
        .route(
            "/api/items/{id}/images",
            get(images::list)
                .post(images::upload)
                .layer(axum::extract::DefaultBodyLimit::max(upload_limit))
                .delete(images::delete),
        )
        .route("/api/images/{id}", get(images::serve))
        .route("/api/export", get(transfer::export))
        .route(
            "/api/import",
            post(transfer::import).layer(axum::extract::DefaultBodyLimit::max(IMPORT_LIMIT)),
        )
        .route(
            "/api/categories",
            get(r::list_categories).post(r::create_category),
        )
        .route(
            "/api/categories/{id}",
            axum::routing::put(r::update_category).delete(r::delete_category),
        )
        .route(
            "/api/locations",
            get(r::list_locations).post(r::create_location),
        )
        .route(
            "/api/locations/{id}",
            axum::routing::put(r::update_location).delete(r::delete_location),
        )
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_session,
        ));
    let limit = usize::try_from(state.cfg.limits.max_body_size.0).unwrap_or(usize::MAX);
    Router::new()
        .route("/api/auth/register", post(auth::register))
        .route("/api/auth/csrf", get(auth::csrf))
        .route("/api/auth/session", get(auth::session))
        .route("/api/auth/callback/credentials", post(auth::signin))
        .route("/api/auth/signout", post(auth::signout))
        .route("/", get(crate::ui::index))
        .route("/index.html", get(crate::ui::index))
        .route("/assets/app.js", get(crate::ui::app_js))
        .route("/assets/style.css", get(crate::ui::style_css))
        .route(
            "/health",
            get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
        )
        .merge(data)
        .fallback(|| async { ApiError::NotFound("Route") })
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .with_state(state)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn xff(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn forwarded_for_counts_only_from_trusted_proxies() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let h = xff("203.0.113.9, 198.51.100.7");
        // an untrusted peer: the header is ignored
        assert_eq!(
            forwarded_client(ip("192.0.2.1"), &h, &trusted),
            ip("192.0.2.1")
        );
        assert_eq!(forwarded_client(ip("10.1.1.1"), &h, &[]), ip("10.1.1.1"));
        // a trusted peer: the rightmost untrusted hop (a client-written left part is not believed)
        assert_eq!(
            forwarded_client(ip("10.1.1.1"), &h, &trusted),
            ip("198.51.100.7")
        );
        let chain = xff("6.6.6.6, 198.51.100.7, 10.2.2.2");
        assert_eq!(
            forwarded_client(ip("10.1.1.1"), &chain, &trusted),
            ip("198.51.100.7")
        );
        // malformed hop: stop at the last good address; no header: the proxy itself
        assert_eq!(
            forwarded_client(ip("10.1.1.1"), &xff("junk"), &trusted),
            ip("10.1.1.1")
        );
        assert_eq!(
            forwarded_client(ip("10.1.1.1"), &HeaderMap::new(), &trusted),
            ip("10.1.1.1")
        );
        assert_eq!(
            forwarded_client(ip("::ffff:10.1.1.1"), &h, &trusted),
            ip("198.51.100.7")
        );
    }
}
