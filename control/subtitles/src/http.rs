//! The router: `GET /health`, `POST /api/translate`, `POST /api/stream` (SSE), `GET
//! /api/status/{job_id}` and `GET /api/status/{job_id}/subtitles?format=srt|vtt|json`, with
//! CORS, a body limit and the optional rate limits. A job runs in its own task; when the
//! client goes away (closed connection) the task is dropped — with it any provider request in
//! flight and any yt-dlp/ffmpeg child — and the job is marked failed.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::error::{Error, ErrorCode};
use crate::formats::{self, Cue};
use crate::pipeline::{self, Done, EventSink};
use crate::request::{self, Endpoint, Validated};
use crate::App;

pub fn router(app: Arc<App>) -> Router {
    let max_body = usize::try_from(app.cfg.limits.max_body_size.0).unwrap_or(usize::MAX);
    Router::new()
        .route("/health", get(health))
        .route("/api/translate", post(translate))
        .route("/api/stream", post(stream))
        .route("/api/status/{job_id}", get(status))
        .route("/api/status/{job_id}/subtitles", get(download))
        .fallback(|| async { Error::new(ErrorCode::NotFound, "no such endpoint") })
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .layer(cors(&app.cors_origins))
        .with_state(app)
}

fn cors(origins: &[String]) -> CorsLayer {
    let allow = if origins.is_empty() || origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            origins
                .iter()
                .filter_map(|o| HeaderValue::from_str(o.trim_end_matches('/')).ok()),
        )
    };
    CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
        .allow_headers([header::CONTENT_TYPE, header::ACCEPT, header::AUTHORIZATION])
        .expose_headers([header::HeaderName::from_static("x-job-id")])
        .max_age(Duration::from_secs(3600))
}

async fn health(State(app): State<Arc<App>>) -> Json<Value> {
    let tool = |t: &Option<crate::tools::Tool>| match t {
        Some(t) => json!({"available": true, "version": t.version}),
        None => json!({"available": false}),
    };
    let server_key = app.defaults.server.is_some();
    let mut tiers = vec![1, 2];
    if server_key {
        tiers.extend([3, 4]);
    }
    Json(json!({
        "status": "healthy",
        "service": "switchyard-subtitles",
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {
            "yt_dlp": tool(&app.tools.yt_dlp),
            "ffmpeg": tool(&app.tools.ffmpeg),
            "transcription": {
                "backend": "openai-compatible",
                "configured": app.server_transcription.is_some(),
                "key_configured": app.server_transcription.as_ref().is_some_and(|t| t.api_key.is_some()),
                "model": app.cfg.transcription.model,
                "response_format": app.cfg.transcription.response_format,
            },
            "server_key_configured": server_key,
            "tiers": tiers,
            "fetch_guard": {
                "allow_private": app.cfg.fetch.allow_private,
                "allow": app.cfg.fetch.allow,
            },
            "rate_limit": {
                "per_ip": app.cfg.rate_limit.per_ip,
                "per_key": app.cfg.rate_limit.per_key,
                "window_seconds": app.cfg.rate_limit.window.0.as_secs(),
            },
        },
        "supported_languages": crate::languages::SUPPORTED,
    }))
}

/// Body → validated request, with the rate limits.
fn prepare(
    app: &App,
    peer: SocketAddr,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
) -> Result<Validated, Error> {
    let now = Instant::now();
    app.ip_limiter
        .lock()
        .check(&peer.ip().to_string(), now)
        .map_err(rate_limited)?;
    let body = body.map_err(|e| {
        let msg = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            "the body is larger than limits.max_body_size".to_string()
        } else {
            "cannot read the body".to_string()
        };
        Error::new(ErrorCode::InvalidRequest, msg)
    })?;
    let value: Value = serde_json::from_slice(&body)
        .map_err(|_| Error::new(ErrorCode::InvalidRequest, "the body is not JSON"))?;
    let req = request::validate(&value, endpoint, &app.defaults)?;
    if let Some(key) = &req.caller_key {
        app.key_limiter
            .lock()
            .check(key.expose(), now)
            .map_err(rate_limited)?;
    }
    Ok(req)
}

/// The fetch guard's early check of the URLs a caller named, so a refused one is a 400 before
/// a job exists: `video_url` → INVALID_URL, a tier 1–2 `api_url` → INVALID_REQUEST. (The
/// connections themselves are checked again where they are made.)
async fn check_caller_urls(app: &App, req: &Validated) -> Result<(), Error> {
    let policy = &app.fetch_policy;
    let video = url::Url::parse(&req.video_url)
        .map_err(|_| Error::new(ErrorCode::InvalidUrl, "video_url is not a valid URL"))?;
    crate::fetch_guard::check_url(policy, &video)
        .await
        .map_err(|r| Error::new(ErrorCode::InvalidUrl, format!("video_url: {r}")))?;
    if req.translation.url_from_caller {
        let api = url::Url::parse(&req.translation.api_url)
            .map_err(|_| Error::new(ErrorCode::InvalidRequest, "api_url is not a valid URL"))?;
        crate::fetch_guard::check_url(policy, &api)
            .await
            .map_err(|r| Error::new(ErrorCode::InvalidRequest, format!("api_url: {r}")))?;
    }
    Ok(())
}

fn rate_limited(retry_after: u64) -> Error {
    Error {
        retry_after: Some(retry_after),
        ..Error::new(
            ErrorCode::RateLimited,
            format!("rate limit reached; retry in {retry_after} s"),
        )
    }
}

fn log_url(u: &str) -> String {
    match url::Url::parse(u) {
        Ok(u) => format!(
            "{}://{}{}",
            u.scheme(),
            u.host_str().unwrap_or_default(),
            u.path()
        ),
        Err(_) => "?".into(),
    }
}

async fn create_job(app: &App, req: &Validated) -> Result<String, Error> {
    let job_id = uuid::Uuid::new_v4().to_string();
    app.store
        .create_job(
            &job_id,
            &req.video_url,
            req.target_language,
            req.source_language,
            req.tier,
        )
        .await?;
    tracing::info!(
        job_id,
        tier = req.tier,
        video = %log_url(&req.video_url),
        target = req.target_language,
        force_whisper = req.force_whisper,
        "job created"
    );
    Ok(job_id)
}

/// Waits for a job slot (`pending` until then), runs the job and records the outcome.
async fn execute(
    app: &Arc<App>,
    job_id: &str,
    req: &Validated,
    sink: &EventSink,
) -> Result<Done, Error> {
    let _slot = app
        .job_slots
        .acquire()
        .await
        .map_err(|_| Error::new(ErrorCode::InternalError, "the service is stopping"))?;
    app.store.set_progress(job_id, 0.0, 0).await?;
    let result = pipeline::run_job(app, job_id, req, sink).await;
    match &result {
        Ok(done) => {
            app.store
                .complete(job_id, &done.source_language, &done.subtitles)
                .await?;
            tracing::info!(
                job_id,
                segments = done.subtitles.len(),
                cached = done.cached,
                "job completed"
            );
        }
        Err(e) => {
            app.store.fail(job_id, e.code.as_str(), &e.message).await?;
            tracing::warn!(job_id, code = e.code.as_str(), "job failed: {}", e.message);
        }
    }
    result
}

async fn mark_cancelled(app: &App, job_id: &str) {
    let e = Error::new(ErrorCode::Cancelled, "cancelled: the client disconnected");
    if let Err(err) = app.store.fail(job_id, e.code.as_str(), &e.message).await {
        tracing::warn!(job_id, "recording the cancellation: {err}");
    }
    tracing::info!(job_id, "client disconnected; job cancelled");
}

async fn translate(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let req = match prepare(&app, peer, body, Endpoint::Translate) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = check_caller_urls(&app, &req).await {
        return e.into_response();
    }
    let job_id = match create_job(&app, &req).await {
        Ok(id) => id,
        Err(e) => return e.into_response(),
    };
    let target_language = req.target_language;
    let (tx, rx) = oneshot::channel::<Result<Done, Error>>();
    let task_app = app.clone();
    let task_job = job_id.clone();
    tokio::spawn(async move {
        let mut tx = tx;
        let no_events = EventSink::default();
        let outcome = {
            let run = execute(&task_app, &task_job, &req, &no_events);
            tokio::pin!(run);
            tokio::select! {
                r = &mut run => Some(r),
                _ = tx.closed() => None,
            }
        };
        match outcome {
            Some(r) => {
                let _ = tx.send(r);
            }
            None => mark_cancelled(&task_app, &task_job).await,
        }
    });
    let done = match rx.await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => return e.into_response_for_job(&job_id),
        Err(_) => {
            return Error::new(ErrorCode::InternalError, "the job stopped unexpectedly")
                .into_response_for_job(&job_id)
        }
    };
    let mut resp = Json(json!({
        "success": true,
        "job_id": job_id,
        "subtitles": done.subtitles,
        "source_language": done.source_language,
        "target_language": target_language,
    }))
    .into_response();
    if let Ok(v) = HeaderValue::from_str(&job_id) {
        resp.headers_mut().insert("x-job-id", v);
    }
    resp
}

async fn stream(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let req = match prepare(&app, peer, body, Endpoint::Stream) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = check_caller_urls(&app, &req).await {
        return e.into_response();
    }
    let job_id = match create_job(&app, &req).await {
        Ok(id) => id,
        Err(e) => return e.into_response(),
    };
    let (tx, rx) = mpsc::channel::<Value>(64);
    let task_app = app.clone();
    let task_job = job_id.clone();
    tokio::spawn(async move {
        let target_language = req.target_language;
        let _ = tx
            .send(EventSink::progress_event(&task_job, "queued", 0.0, 0, 0))
            .await;
        let sink = EventSink(Some(tx.clone()));
        let outcome = {
            let run = execute(&task_app, &task_job, &req, &sink);
            tokio::pin!(run);
            tokio::select! {
                r = &mut run => Some(r),
                _ = tx.closed() => None,
            }
        };
        drop(sink);
        let last = match outcome {
            Some(Ok(done)) => json!({
                "type": "complete",
                "job_id": task_job,
                "total_subtitles": done.subtitles.len(),
                "source_language": done.source_language,
                "target_language": target_language,
            }),
            Some(Err(e)) if e.code != ErrorCode::Cancelled => json!({
                "type": "error",
                "job_id": task_job,
                "error": e.message,
                "code": e.code.as_str(),
            }),
            _ => {
                mark_cancelled(&task_app, &task_job).await;
                return;
            }
        };
        let _ = tx.send(last).await;
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        let v = rx.recv().await?;
        Some((
            Ok::<_, Infallible>(Event::default().data(v.to_string())),
            rx,
        ))
    });
    let mut resp = Sse::new(body)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response();
    let headers = resp.headers_mut();
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    if let Ok(v) = HeaderValue::from_str(&job_id) {
        headers.insert("x-job-id", v);
    }
    resp
}

async fn status(State(app): State<Arc<App>>, Path(job_id): Path<String>) -> Response {
    match app.store.job(&job_id).await {
        Ok(Some(job)) => Json(job).into_response(),
        Ok(None) => {
            Error::new(ErrorCode::JobNotFound, format!("no job {job_id:?}")).into_response()
        }
        Err(e) => e.into_response(),
    }
}

#[derive(serde::Deserialize)]
struct DownloadQuery {
    format: Option<String>,
}

/// The result of a completed job as SRT, WebVTT or JSON.
async fn download(
    State(app): State<Arc<App>>,
    Path(job_id): Path<String>,
    Query(q): Query<DownloadQuery>,
) -> Response {
    let subs = match app.store.job_result(&job_id).await {
        Ok(Some(s)) => s,
        Ok(None) => {
            return Error::new(
                ErrorCode::JobNotFound,
                format!("no completed job {job_id:?}"),
            )
            .into_response()
        }
        Err(e) => return e.into_response(),
    };
    let cues: Vec<Cue> = subs
        .iter()
        .map(|s| Cue {
            start_ms: formats::seconds_to_ms(s.start).unwrap_or(0),
            end_ms: formats::seconds_to_ms(s.end).unwrap_or(0),
            text: s.text.clone(),
        })
        .collect();
    match q.format.as_deref().unwrap_or("vtt") {
        "srt" => (
            [(header::CONTENT_TYPE, "application/x-subrip; charset=utf-8")],
            formats::srt::emit(&cues),
        )
            .into_response(),
        "vtt" => (
            [(header::CONTENT_TYPE, "text/vtt; charset=utf-8")],
            formats::vtt::emit(&cues),
        )
            .into_response(),
        "json" => Json(subs).into_response(),
        other => Error::new(
            ErrorCode::InvalidRequest,
            format!("format {other:?}: expected srt, vtt or json"),
        )
        .into_response(),
    }
}
