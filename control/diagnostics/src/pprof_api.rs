//! `/debug/pprof/*`: Go's profiling endpoints, each answered with what a Rust process can
//! honestly report: a real CPU profile, the command line, the thread list for `goroutine`, the
//! allocator's figures for `heap`, and 501 with the reason for profiles that have no source.

use crate::cpu_profile::{ProfileError, DEFAULT_SECONDS};
use crate::error::ApiError;
use crate::{memory, sys, threads, DiagnosticsState};
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use serde::Deserialize;

const TEXT: &str = "text/plain; charset=utf-8";

/// What the index lists: path, what it gives here.
const PROFILES: &[(&str, &str)] = &[
    (
        "profile",
        "CPU profile (pprof protobuf, gzip). ?seconds=N, default 30, 1..=300; one at a time.",
    ),
    (
        "cmdline",
        "The command line, arguments separated by NUL bytes.",
    ),
    (
        "heap",
        "Allocator statistics as text (no allocation-site profile exists in this binary).",
    ),
    (
        "goroutine",
        "The process's threads (Rust has no goroutines): id, state, CPU time, name.",
    ),
    (
        "allocs",
        "Not available (501): allocation sites are not recorded.",
    ),
    (
        "block",
        "Not available (501): blocking events are not recorded.",
    ),
    (
        "mutex",
        "Not available (501): lock contention is not recorded.",
    ),
    (
        "threadcreate",
        "Not available (501): thread creation sites are not recorded; see goroutine.",
    ),
];

fn text(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, TEXT)], body).into_response()
}

#[utoipa::path(get, path = "/debug/pprof/", tag = "pprof",
    responses((status = 200, content_type = "text/html", description = "index of the profiles")))]
pub async fn index() -> Html<String> {
    let mut rows = String::new();
    for (name, what) in PROFILES {
        rows.push_str(&format!(
            "<tr><td><a href=\"{name}\">{name}</a></td><td>{what}</td></tr>\n"
        ));
    }
    Html(format!(
        "<!DOCTYPE html>\n<html><head><title>/debug/pprof/</title></head><body>\n\
         <h1>/debug/pprof/</h1>\n<table>\n{rows}</table>\n\
         <p>Fetch a CPU profile with <code>go tool pprof http://HOST/debug/pprof/profile?seconds=30</code>.</p>\n\
         </body></html>\n"
    ))
}

#[utoipa::path(get, path = "/debug/pprof", tag = "pprof",
    responses((status = 200, content_type = "text/html", description = "the same index as /debug/pprof/")))]
pub async fn index_without_slash() -> Html<String> {
    index().await
}

#[utoipa::path(get, path = "/debug/pprof/cmdline", tag = "pprof",
    responses((status = 200, content_type = "text/plain", description = "arguments separated by NUL bytes")))]
pub async fn cmdline() -> Response {
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    text(StatusCode::OK, args.join("\0"))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ProfileQuery {
    /// Seconds to sample, 1..=300 (default 30).
    seconds: Option<String>,
}

/// Reads `seconds` as Go does (an integer); empty means the default.
pub fn parse_seconds(raw: Option<&str>) -> Result<u64, ApiError> {
    match raw.map(str::trim) {
        None | Some("") => Ok(DEFAULT_SECONDS),
        Some(s) => s.parse::<u64>().map_err(|_| {
            ApiError::bad_request(
                "INVALID_SECONDS",
                format!("seconds must be a whole number, not {s:?}"),
            )
        }),
    }
}

#[utoipa::path(get, path = "/debug/pprof/profile", tag = "pprof", params(ProfileQuery),
    responses(
        (status = 200, content_type = "application/octet-stream",
         description = "gzip-compressed pprof protobuf CPU profile of the whole process"),
        (status = 400, body = switchyard_api::ErrorBody, description = "seconds out of 1..=300"),
        (status = 409, body = switchyard_api::ErrorBody, description = "another profile is being taken")))]
pub async fn profile(
    State(state): State<DiagnosticsState>,
    query: Result<Query<ProfileQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request("INVALID_QUERY", e.body_text()))?;
    let seconds = parse_seconds(q.seconds.as_deref())?;
    let body = state.profiler.profile(seconds).await.map_err(|e| match e {
        ProfileError::Seconds(_) => ApiError::bad_request("INVALID_SECONDS", e.to_string()),
        ProfileError::Busy => {
            ApiError::new(StatusCode::CONFLICT, "PROFILE_IN_PROGRESS", e.to_string())
        }
        ProfileError::Start(_) | ProfileError::Report(_) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "PROFILE_FAILED",
            e.to_string(),
        ),
    })?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"profile\"",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response())
}

#[utoipa::path(get, path = "/debug/pprof/heap", tag = "pprof",
    responses((status = 200, content_type = "text/plain",
        description = "the allocator's statistics (glibc mallinfo2) and the process's memory lines of /proc/self/status; \
                       no allocation-site profile exists in this binary")))]
pub async fn heap() -> Response {
    let report = tokio::task::spawn_blocking(|| {
        let status = std::fs::read_to_string("/proc/self/status").ok();
        memory::heap_report(sys::mallinfo(), status.as_deref())
    })
    .await;
    match report {
        Ok(body) => text(StatusCode::OK, body),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

#[utoipa::path(get, path = "/debug/pprof/goroutine", tag = "pprof",
    responses((status = 200, content_type = "text/plain",
        description = "the process's threads from /proc/self/task: id, state, CPU seconds, name")))]
pub async fn goroutine() -> Response {
    let listed = tokio::task::spawn_blocking(|| {
        threads::list().map(|t| threads::render(&t, sys::clock_ticks_per_second()))
    })
    .await;
    match listed {
        Ok(Ok(body)) => text(StatusCode::OK, body),
        Ok(Err(e)) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading /proc/self/task: {e}\n"),
        ),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

fn not_available(profile: &str, why: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "PROFILE_NOT_AVAILABLE",
        format!("the {profile} profile is not available in this Rust binary: {why}"),
    )
}

#[utoipa::path(get, path = "/debug/pprof/allocs", tag = "pprof",
    responses((status = 501, body = switchyard_api::ErrorBody)))]
pub async fn allocs() -> ApiError {
    not_available(
        "allocs",
        "the C library's allocator records no allocation sites; /debug/pprof/heap gives its figures",
    )
}

#[utoipa::path(get, path = "/debug/pprof/block", tag = "pprof",
    responses((status = 501, body = switchyard_api::ErrorBody)))]
pub async fn block() -> ApiError {
    not_available(
        "block",
        "no runtime records where threads wait; /debug/pprof/goroutine shows thread states",
    )
}

#[utoipa::path(get, path = "/debug/pprof/mutex", tag = "pprof",
    responses((status = 501, body = switchyard_api::ErrorBody)))]
pub async fn mutex() -> ApiError {
    not_available("mutex", "Rust's locks record no contention")
}

#[utoipa::path(get, path = "/debug/pprof/threadcreate", tag = "pprof",
    responses((status = 501, body = switchyard_api::ErrorBody)))]
pub async fn threadcreate() -> ApiError {
    not_available(
        "threadcreate",
        "thread creation sites are not recorded; /debug/pprof/goroutine lists the threads",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_default_and_invalid() {
        assert_eq!(parse_seconds(None).expect("default"), 30);
        assert_eq!(parse_seconds(Some("")).expect("default"), 30);
        assert_eq!(parse_seconds(Some(" 5 ")).expect("five"), 5);
        assert!(parse_seconds(Some("-1")).is_err());
        assert!(parse_seconds(Some("1.5")).is_err());
    }
}
