//! The HTTP edge: dispatch by [`crate::route::resolve`] (authentication decided from the
//! endpoint it resolved), package handlers, health, metrics, docs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use futures::TryStreamExt;
use serde::Serialize;
use switchyard_config::pkgcache::PkgcacheMode;
use utoipa::ToSchema;

use crate::auth::Auth;
use crate::docs;
use crate::error::Error;
use crate::key::PackageKey;
use crate::metrics::{hit_rate, human_duration, Metrics};
use crate::route::{self, Endpoint};
use crate::store::{ByteStream, PackageBody, PackageMeta, Store};

/// Shared state of the server.
pub struct AppState {
    pub store: Store,
    pub mode: PkgcacheMode,
    pub auth: Auth,
    pub metrics: Metrics,
    /// `limits.max_package_size` in bytes (0 = none).
    pub limit: u64,
    pub started: Instant,
}

pub type Shared = Arc<AppState>;

/// The version reported in health responses.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The router of the whole service: every request goes through [`dispatch`]. Serve it with
/// `into_make_service_with_connect_info::<SocketAddr>()`: without the peer's address, writes
/// without credentials are refused.
pub fn router(state: Shared) -> Router {
    Router::new()
        .fallback(dispatch)
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

/// Methods counted under their own name in `requests_total`; any other is `other`, so a
/// client cannot create metric series at will.
pub fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::POST => "POST",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        _ => "other",
    }
}

/// Resolves the path ([`crate::route::resolve`]), authenticates for the endpoint that matched,
/// runs its handler, counts the request.
async fn dispatch(State(st): State<Shared>, req: Request) -> Response {
    let method = req.method().clone();
    let endpoint = route::resolve(req.uri().path());
    let resp = if st.auth.required(method.as_str(), endpoint.scope()) {
        let header = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if st.auth.check(header).await {
            serve(&st, endpoint, req).await
        } else {
            tracing::debug!(method = %method, path = req.uri().path(), "401: missing or wrong credentials");
            Error::Unauthorized.into_response()
        }
    } else {
        let peer = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip());
        if st
            .auth
            .anonymous_request_allowed(method.as_str(), endpoint.scope(), peer)
        {
            serve(&st, endpoint, req).await
        } else {
            tracing::info!(method = %method, path = req.uri().path(), peer = ?peer,
                "403: write without credentials from a non-loopback address");
            Error::AnonymousWrite.into_response()
        }
    };
    st.metrics
        .requests
        .with_label_values(&[method_label(&method), resp.status().as_str()])
        .inc();
    resp
}

fn method_not_allowed(allow: &'static str) -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, HeaderValue::from_static(allow))],
    )
        .into_response()
}

/// The handler of an endpoint for a method.
async fn serve(st: &Shared, endpoint: Endpoint, req: Request) -> Response {
    let method = req.method().clone();
    let key = match endpoint {
        Endpoint::Package(key) => Ok(key),
        Endpoint::InvalidPackage(e) => Err(Error::InvalidKey(e)),
        Endpoint::NotFound => return Error::NotFound.into_response(),
        other => {
            // Fixed endpoints answer GET (and HEAD, whose body hyper drops).
            if method != Method::GET && method != Method::HEAD {
                return method_not_allowed("GET, HEAD");
            }
            return match other {
                Endpoint::Health => health().await.into_response(),
                Endpoint::Live => live().await.into_response(),
                Endpoint::Ready => ready(st).await,
                Endpoint::Details => details(st).await.into_response(),
                Endpoint::Metrics => metrics(st).await,
                Endpoint::Doc(page) => {
                    let gzip = req
                        .headers()
                        .get(header::ACCEPT_ENCODING)
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(docs::accepts_gzip);
                    docs::page(page, gzip)
                }
                Endpoint::Package(_) | Endpoint::InvalidPackage(_) | Endpoint::NotFound => {
                    Error::NotFound.into_response()
                }
            };
        }
    };
    let result = match method {
        Method::HEAD => head_package(st, key).await,
        Method::GET => get_package(st, key).await,
        Method::PUT => put_package(st, key, req).await,
        Method::DELETE => delete_package(st, key).await,
        _ => return method_not_allowed("HEAD, GET, PUT, DELETE"),
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

fn timestamp() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

// ------------------------------------------------------------------ packages

/// Upload result (`PUT`).
#[derive(Debug, Serialize, ToSchema)]
pub struct UploadResult {
    /// `uploaded`.
    pub status: String,
    pub name: String,
    pub version: String,
    pub sha: String,
    /// Bytes stored.
    pub size: u64,
    /// SHA-256 of the bytes (also the `ETag` of HEAD/GET).
    pub etag: String,
}

/// Delete result (`DELETE`).
#[derive(Debug, Serialize, ToSchema)]
pub struct DeleteResult {
    /// `deleted`.
    pub status: String,
    pub name: String,
    pub version: String,
    pub sha: String,
    pub size: u64,
}

/// Error body of every 4xx/5xx answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// Machine-readable code (`not_found`, `already_exists`, `invalid_path`, …).
    pub error: String,
    pub message: String,
    /// Whether the same request may succeed later.
    pub retryable: bool,
}

fn meta_headers(meta: &PackageMeta) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(meta.size));
    if let Some(etag) = &meta.etag {
        if let Ok(v) = HeaderValue::from_str(&format!("\"{etag}\"")) {
            h.insert(header::ETAG, v);
        }
    }
    h
}

fn readable(st: &AppState) -> Result<(), Error> {
    if st.mode.can_read() {
        Ok(())
    } else {
        Err(Error::ModeForbidden(
            "the cache is write-only: HEAD and GET are disabled",
        ))
    }
}

fn writable(st: &AppState) -> Result<(), Error> {
    if st.mode.can_write() {
        Ok(())
    } else {
        Err(Error::ModeForbidden(
            "the cache is read-only: PUT and DELETE are disabled",
        ))
    }
}

async fn do_head(st: &AppState, key: Result<PackageKey, Error>) -> Result<Response, Error> {
    readable(st)?;
    let key = key?;
    match st.store.head(&key).await? {
        Some(meta) => {
            st.metrics.hits.inc();
            Ok((StatusCode::OK, meta_headers(&meta)).into_response())
        }
        None => {
            st.metrics.misses.inc();
            Err(Error::NotFound)
        }
    }
}

async fn do_get(st: &AppState, key: Result<PackageKey, Error>) -> Result<Response, Error> {
    readable(st)?;
    let key = key?;
    let Some((meta, body)) = st.store.get(&key).await? else {
        st.metrics.misses.inc();
        return Err(Error::NotFound);
    };
    st.metrics.hits.inc();
    tracing::debug!(package = %key, size = meta.size, "serving");
    let body = match body {
        PackageBody::Full(bytes) => {
            st.metrics.sent.inc_by(bytes.len() as u64);
            Body::from(bytes)
        }
        PackageBody::Stream(stream) => {
            let sent = st.metrics.sent.clone();
            Body::from_stream(stream.inspect_ok(move |b| sent.inc_by(b.len() as u64)))
        }
    };
    Ok((StatusCode::OK, meta_headers(&meta), body).into_response())
}

async fn do_put(
    st: &AppState,
    key: Result<PackageKey, Error>,
    req: Request,
) -> Result<Response, Error> {
    writable(st)?;
    let key = key?;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(len) = declared {
        crate::store::check_limit(len, st.limit)?;
    }
    let body: ByteStream = Box::pin(
        req.into_body()
            .into_data_stream()
            .map_err(std::io::Error::other),
    );
    let started = Instant::now();
    match st.store.put(&key, body, st.limit).await {
        Ok(meta) => {
            st.metrics.stored(meta.size);
            st.metrics.received.inc_by(meta.size);
            st.metrics.uploads.with_label_values(&["stored"]).inc();
            let etag = meta.etag.clone().unwrap_or_default();
            tracing::info!(
                package = %key,
                size = meta.size,
                etag = %etag,
                ms = started.elapsed().as_millis() as u64,
                "stored"
            );
            Ok((
                StatusCode::OK,
                Json(UploadResult {
                    status: "uploaded".into(),
                    name: key.name,
                    version: key.version,
                    sha: key.sha,
                    size: meta.size,
                    etag,
                }),
            )
                .into_response())
        }
        Err(e) => {
            st.metrics.uploads.with_label_values(&[e.code()]).inc();
            match &e {
                Error::AlreadyExists | Error::UploadInProgress => {
                    tracing::debug!(package = %key, "upload refused: {e}")
                }
                Error::UploadFailed(_) | Error::Storage(_) => {
                    tracing::error!(package = %key, "upload failed: {e}")
                }
                _ => tracing::info!(package = %key, "upload not stored: {e}"),
            }
            Err(e)
        }
    }
}

async fn do_delete(st: &AppState, key: Result<PackageKey, Error>) -> Result<Response, Error> {
    writable(st)?;
    let key = key?;
    match st.store.delete(&key).await? {
        Some(size) => {
            st.metrics.removed(size);
            tracing::info!(package = %key, size, "deleted");
            Ok(Json(DeleteResult {
                status: "deleted".into(),
                name: key.name,
                version: key.version,
                sha: key.sha,
                size,
            })
            .into_response())
        }
        None => Err(Error::NotFound),
    }
}

/// Whether a package exists (200 with Content-Length and ETag) or not (404).
#[utoipa::path(head, path = "/{name}/{version}/{sha}", tag = "packages",
    params(("name" = String, Path), ("version" = String, Path), ("sha" = String, Path, description = "ABI hash, hex")),
    responses((status = 200, description = "exists"), (status = 404, description = "absent"),
              (status = 400, description = "invalid path"), (status = 403, description = "write-only mode"),
              (status = 401, description = "credentials required (only with auth.anonymous_head false)")))]
pub async fn head_package(
    st: &AppState,
    key: Result<PackageKey, Error>,
) -> Result<Response, Error> {
    do_head(st, key).await
}

/// Download a package (streamed).
#[utoipa::path(get, path = "/{name}/{version}/{sha}", tag = "packages",
    params(("name" = String, Path), ("version" = String, Path), ("sha" = String, Path, description = "ABI hash, hex")),
    responses((status = 200, description = "the package bytes", content_type = "application/octet-stream"),
              (status = 404, description = "absent", body = ErrorBody), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 403, description = "write-only mode", body = ErrorBody)))]
pub async fn get_package(st: &AppState, key: Result<PackageKey, Error>) -> Result<Response, Error> {
    do_get(st, key).await
}

/// Upload a package (Content-Length or chunked body). Packages are immutable.
#[utoipa::path(put, path = "/{name}/{version}/{sha}", tag = "packages",
    params(("name" = String, Path), ("version" = String, Path), ("sha" = String, Path, description = "ABI hash, hex")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, body = UploadResult), (status = 409, description = "already exists or upload in progress", body = ErrorBody),
              (status = 403, description = "read-only mode, or without credentials from a non-loopback address (auth.allow_anonymous_writes)", body = ErrorBody), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 413, description = "larger than limits.max_package_size", body = ErrorBody),
              (status = 500, description = "upload failed, nothing stored", body = ErrorBody)))]
pub async fn put_package(
    st: &AppState,
    key: Result<PackageKey, Error>,
    req: Request,
) -> Result<Response, Error> {
    do_put(st, key, req).await
}

/// Delete a package.
#[utoipa::path(delete, path = "/{name}/{version}/{sha}", tag = "packages",
    params(("name" = String, Path), ("version" = String, Path), ("sha" = String, Path, description = "ABI hash, hex")),
    responses((status = 200, body = DeleteResult), (status = 404, body = ErrorBody),
              (status = 403, description = "read-only mode, or without credentials from a non-loopback address (auth.allow_anonymous_writes)", body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn delete_package(
    st: &AppState,
    key: Result<PackageKey, Error>,
) -> Result<Response, Error> {
    do_delete(st, key).await
}

// ------------------------------------------------------------------ health, metrics

/// Health.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `healthy`.
    pub status: String,
    pub version: String,
    pub timestamp: String,
}

/// Liveness.
#[derive(Debug, Serialize, ToSchema)]
pub struct Liveness {
    /// `alive`.
    pub status: String,
    pub timestamp: String,
}

/// Readiness.
#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    /// `ready` or `not ready`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub timestamp: String,
}

/// Storage part of the detailed health.
#[derive(Debug, Serialize, ToSchema)]
pub struct StorageHealth {
    pub healthy: bool,
    /// `filesystem` or `s3`.
    pub backend: String,
    pub total_packages: u64,
    pub total_size_bytes: u64,
}

/// Cache part of the detailed health.
#[derive(Debug, Serialize, ToSchema)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// `NN.N%`.
    pub hit_rate: String,
}

/// Detailed health.
#[derive(Debug, Serialize, ToSchema)]
pub struct DetailedHealth {
    /// `healthy` or `unhealthy` (store not ready).
    pub status: String,
    pub version: String,
    /// e.g. `1h 2m 3s`.
    pub uptime: String,
    pub mode: String,
    pub storage: StorageHealth,
    pub cache: CacheStats,
}

/// Service health.
#[utoipa::path(get, path = "/health", tag = "health", responses((status = 200, body = Health)))]
pub async fn health() -> Json<Health> {
    Json(Health {
        status: "healthy".into(),
        version: VERSION.into(),
        timestamp: timestamp(),
    })
}

/// Liveness probe.
#[utoipa::path(get, path = "/health/live", tag = "health", responses((status = 200, body = Liveness)))]
pub async fn live() -> Json<Liveness> {
    Json(Liveness {
        status: "alive".into(),
        timestamp: timestamp(),
    })
}

/// Readiness probe: 503 while the store is unreachable, or not writable in a writable mode.
#[utoipa::path(get, path = "/health/ready", tag = "health",
    responses((status = 200, body = Readiness), (status = 503, body = Readiness)))]
pub async fn ready(st: &AppState) -> Response {
    match st.store.probe(st.mode.can_write()).await {
        Ok(()) => Json(Readiness {
            status: "ready".into(),
            reason: None,
            timestamp: timestamp(),
        })
        .into_response(),
        Err(e) => {
            tracing::warn!("not ready: {e}");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(Readiness {
                    status: "not ready".into(),
                    reason: Some(e.to_string()),
                    timestamp: timestamp(),
                }),
            )
                .into_response()
        }
    }
}

/// Detailed health: uptime, storage totals, cache hit rate.
#[utoipa::path(get, path = "/health/details", tag = "health", responses((status = 200, body = DetailedHealth)))]
pub async fn details(st: &AppState) -> Json<DetailedHealth> {
    let healthy = st.store.probe(st.mode.can_write()).await.is_ok();
    let (hits, misses) = (st.metrics.hits.get(), st.metrics.misses.get());
    Json(DetailedHealth {
        status: if healthy { "healthy" } else { "unhealthy" }.into(),
        version: VERSION.into(),
        uptime: human_duration(st.started.elapsed().as_secs()),
        mode: st.mode.as_str().into(),
        storage: StorageHealth {
            healthy,
            backend: st.store.backend().into(),
            total_packages: u64::try_from(st.metrics.packages.get()).unwrap_or(0),
            total_size_bytes: u64::try_from(st.metrics.bytes.get()).unwrap_or(0),
        },
        cache: CacheStats {
            hits,
            misses,
            hit_rate: hit_rate(hits, misses),
        },
    })
}

/// Prometheus metrics (text exposition format).
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain")))]
pub async fn metrics(st: &AppState) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        st.metrics.render(),
    )
        .into_response()
}
