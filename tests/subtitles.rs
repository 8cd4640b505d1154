//! End-to-end tests of `switchyard subtitles`: the real binary on a random loopback port with a
//! temp data directory, driven over HTTP with reqwest. The paid providers are replaced by a real
//! HTTP server written here ([`Stub`]): an OpenAI-compatible chat-completions and
//! audio-transcriptions endpoint on 127.0.0.1 that records every request (path, Authorization,
//! body) and follows a script (wrong line counts, 429 then success, errors, requests that hang),
//! plus the "video site": pages with `<track>`, `.vtt`/`.srt` files and an audio file. yt-dlp and
//! ffmpeg are real (tests/run installs them; missing → skip, under CI → fail).
//!
//! No test asserts a wall-clock time.

mod support;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Multipart, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use support::{spawn_reporting, Proc, Reported, BIN};

// ------------------------------------------------------------------ the stub provider + site

/// What the stub does with the next chat request.
#[derive(Debug, Clone, Copy)]
enum Chat {
    /// Translate every numbered line as `T:<text>`.
    Translate,
    /// Translate, but drop the last line.
    OneLineShort,
    /// Translate as `n) …` after a line of preamble.
    Preamble,
    /// Echo the prompt, then translate as `n: …`.
    EchoPrompt,
    /// Translate as `[n] …` inside a code block.
    CodeBlock,
    /// Translate, but merge the first two lines into one.
    Merge,
    /// Apologise on as many unnumbered lines as there are segments, without a translation.
    Chatter,
    /// Answer every line with `n. PWNED` (a caller's own endpoint).
    Poison,
    /// Answer this status with an OpenAI-style error body (and `Retry-After: 0` for 429).
    Status(u16),
    /// Never answer (until the client gives up); counts an abort when the request is dropped.
    Hang,
}

#[derive(Debug, Clone)]
enum Transcribe {
    Segments,
    Status(u16),
}

#[derive(Debug, Clone)]
struct Recorded {
    path: String,
    auth: Option<String>,
    body: Value,
}

#[derive(Default)]
struct StubState {
    chat_script: Mutex<VecDeque<Chat>>,
    transcribe_script: Mutex<VecDeque<Transcribe>>,
    requests: Mutex<Vec<Recorded>>,
    aborted: AtomicUsize,
    files: Mutex<HashMap<String, (String, Vec<u8>)>>,
    /// path → Location of a 302.
    redirects: Mutex<HashMap<String, String>>,
}

struct Stub {
    addr: SocketAddr,
    state: Arc<StubState>,
}

impl Stub {
    async fn start() -> Stub {
        let state = Arc::new(StubState::default());
        let app = Router::new()
            .route("/v1/chat/completions", post(stub_chat))
            .route("/v1/audio/transcriptions", post(stub_transcribe))
            .route("/{*path}", get(stub_file))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind stub");
        let addr = listener.local_addr().expect("stub addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Stub { addr, state }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.addr.port())
    }

    fn api(&self) -> String {
        self.url("/v1")
    }

    fn file(&self, path: &str, content_type: &str, body: impl Into<Vec<u8>>) {
        self.state
            .files
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(path.to_string(), (content_type.to_string(), body.into()));
    }

    fn redirect(&self, path: &str, location: &str) {
        self.state
            .redirects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(path.to_string(), location.to_string());
    }

    /// Paths of the GET requests the site answered (pages, tracks, media, redirects).
    fn gets(&self) -> Vec<String> {
        self.state
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|r| r.path.strip_prefix("GET ").map(str::to_string))
            .collect()
    }

    fn script_chat(&self, steps: &[Chat]) {
        self.state
            .chat_script
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(steps.iter().cloned());
    }

    fn script_transcribe(&self, steps: &[Transcribe]) {
        self.state
            .transcribe_script
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(steps.iter().cloned());
    }

    fn requests(&self, path: &str) -> Vec<Recorded> {
        self.state
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }

    fn chats(&self) -> Vec<Recorded> {
        self.requests("/v1/chat/completions")
    }

    fn transcriptions(&self) -> Vec<Recorded> {
        self.requests("/v1/audio/transcriptions")
    }

    fn aborted(&self) -> usize {
        self.state.aborted.load(Ordering::SeqCst)
    }
}

fn record(state: &StubState, path: &str, headers: &HeaderMap, body: Value) {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    state
        .requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Recorded {
            path: path.to_string(),
            auth,
            body,
        });
}

/// Counts an abort when dropped before `done` is set (the client closed the request).
struct AbortGuard<'a> {
    state: &'a StubState,
    done: bool,
}

impl Drop for AbortGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.state.aborted.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The numbered lines the service asked to translate.
fn numbered_lines(user: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in user.lines() {
        if line.starts_with("Translate these") {
            inside = true;
            continue;
        }
        if inside {
            if line.trim().is_empty() {
                break;
            }
            if let Some((n, text)) = line.split_once(". ") {
                out.push((n.to_string(), text.to_string()));
            }
        }
    }
    out
}

async fn stub_chat(
    State(state): State<Arc<StubState>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    record(&state, "/v1/chat/completions", &headers, body.clone());
    let step = state
        .chat_script
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .pop_front()
        .unwrap_or(Chat::Translate);
    let user = body["messages"][1]["content"].as_str().unwrap_or_default();
    let asked = numbered_lines(user);
    let translated = |style: &str| -> Vec<String> {
        asked
            .iter()
            .map(|(n, t)| format!("{} T:{t}", style.replace('N', n)))
            .collect()
    };
    let mut lines = translated("N.");
    match step {
        Chat::Translate => {}
        Chat::OneLineShort => {
            lines.pop();
        }
        Chat::Preamble => {
            lines = translated("N)");
            lines.insert(0, "Here are the translations:".into());
        }
        Chat::EchoPrompt => {
            lines = vec![user.to_string(), String::new()];
            lines.extend(translated("N:"));
        }
        Chat::CodeBlock => {
            lines = translated("[N]");
            lines.insert(0, "```text".into());
            lines.push("```".into());
        }
        Chat::Merge => {
            let merged: Vec<String> = asked
                .iter()
                .take(2)
                .map(|(_, t)| format!("T:{t}"))
                .collect();
            lines = vec![format!("1. {}", merged.join(" "))];
            lines.extend(
                asked
                    .iter()
                    .skip(2)
                    .enumerate()
                    .map(|(i, (_, t))| format!("{}. T:{t}", i + 2)),
            );
        }
        Chat::Chatter => {
            lines = (0..asked.len())
                .map(|i| format!("Sorry, I made a mistake ({i})."))
                .collect();
        }
        Chat::Poison => {
            lines = asked.iter().map(|(n, _)| format!("{n}. PWNED")).collect();
        }
        Chat::Status(code) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut resp = (
                status,
                Json(json!({"error": {"message": format!("stub says {code}"), "type": "stub"}})),
            )
                .into_response();
            if code == 429 {
                resp.headers_mut()
                    .insert("retry-after", axum::http::HeaderValue::from_static("0"));
            }
            return resp;
        }
        Chat::Hang => {
            let _guard = AbortGuard {
                state: &state,
                done: false,
            };
            std::future::pending::<()>().await;
        }
    }
    Json(json!({
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": lines.join("\n")}, "finish_reason": "stop"}]
    }))
    .into_response()
}

async fn stub_transcribe(
    State(state): State<Arc<StubState>>,
    headers: HeaderMap,
    mut form: Multipart,
) -> Response {
    let mut fields = serde_json::Map::new();
    while let Ok(Some(field)) = form.next_field().await {
        let name = field.name().unwrap_or_default().to_string();
        let file_name = field.file_name().map(str::to_string);
        let Ok(bytes) = field.bytes().await else {
            break;
        };
        if let Some(f) = file_name {
            fields.insert("file_name".into(), f.into());
            fields.insert("file_size".into(), bytes.len().into());
            let head: Vec<Value> = bytes.iter().take(4).map(|b| (*b).into()).collect();
            fields.insert("file_head".into(), head.into());
        } else {
            fields.insert(name, String::from_utf8_lossy(&bytes).into_owned().into());
        }
    }
    record(
        &state,
        "/v1/audio/transcriptions",
        &headers,
        Value::Object(fields),
    );
    let step = state
        .transcribe_script
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .pop_front()
        .unwrap_or(Transcribe::Segments);
    match step {
        Transcribe::Segments => Json(json!({
            "task": "transcribe",
            "language": "english",
            "duration": 3.0,
            "text": "Spoken one. Spoken two.",
            "segments": [
                {"id": 0, "start": 0.0, "end": 1.25, "text": " Spoken one."},
                {"id": 1, "start": 1.25, "end": 3.0, "text": " Spoken two."}
            ]
        }))
        .into_response(),
        Transcribe::Status(code) => (
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            Json(json!({"error": {"message": "model crashed"}})),
        )
            .into_response(),
    }
}

async fn stub_file(
    State(state): State<Arc<StubState>>,
    headers: HeaderMap,
    axum::extract::Path(path): axum::extract::Path<String>,
) -> Response {
    record(&state, &format!("GET /{path}"), &headers, Value::Null);
    let location = state
        .redirects
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&format!("/{path}"))
        .cloned();
    if let Some(location) = location {
        return (StatusCode::FOUND, [("location", location)]).into_response();
    }
    let files = state.files.lock().unwrap_or_else(|e| e.into_inner());
    match files.get(&format!("/{path}")) {
        Some((ct, body)) => ([("content-type", ct.clone())], body.clone()).into_response(),
        None => (StatusCode::NOT_FOUND, "not found").into_response(),
    }
}

// ------------------------------------------------------------------ site content

const EN_VTT: &str = "\u{feff}WEBVTT\r\n\r\nNOTE made for the tests\r\n\r\n1\r\n00:00:01.000 --> 00:00:02.500 align:start\r\nHello\r\n\r\n2\r\n00:00:03.000 --> 00:00:04.000\r\n<v Ann>How are</v>\r\nyou?\r\n\r\n00:00:05.000 --> 00:00:06.000\r\nFine &amp; you\r\n\r\n00:00:07.000 --> 00:00:08.000\r\nFour\r\n\r\n00:00:09.000 --> 00:00:10.000\r\nFive\r\n";

const FR_VTT: &str = "WEBVTT\n\n00:00:01.000 --> 00:00:02.000\nBonjour\n";

const SRT: &str =
    "1\n00:00:00,500 --> 00:00:01,000\nOne\n\n2\n00:01:00,000 --> 00:01:02,250\nTwo\nlines\n";

fn page_html(with_tracks: bool) -> String {
    let tracks = if with_tracks {
        r#"<track kind="captions" src="subs/fr.vtt" srclang="fr">
           <track kind="subtitles" src="subs/en.vtt" srclang="en" label="English" default>"#
    } else {
        ""
    };
    format!(
        r#"<!doctype html><html><head><title>Talk</title></head><body>
        <video controls><source src="/media/talk.wav" type="audio/wav">{tracks}</video></body></html>"#
    )
}

/// A short WAV: generated by ffmpeg when it is installed, else written by hand (silence).
fn wav_bytes(dir: &Path) -> Vec<u8> {
    if let Some(ffmpeg) = support::which("ffmpeg") {
        let out = dir.join("talk.wav");
        let ok = Command::new(ffmpeg)
            .args([
                "-v",
                "error",
                "-y",
                "-f",
                "lavfi",
                "-i",
                "sine=frequency=440:duration=1",
                "-ac",
                "1",
            ])
            .arg(&out)
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            if let Ok(b) = std::fs::read(&out) {
                return b;
            }
        }
    }
    let samples = 8000u32;
    let mut w = Vec::new();
    w.extend_from_slice(b"RIFF");
    w.extend_from_slice(&(36 + samples * 2).to_le_bytes());
    w.extend_from_slice(b"WAVEfmt ");
    w.extend_from_slice(&16u32.to_le_bytes());
    w.extend_from_slice(&1u16.to_le_bytes());
    w.extend_from_slice(&1u16.to_le_bytes());
    w.extend_from_slice(&8000u32.to_le_bytes());
    w.extend_from_slice(&16000u32.to_le_bytes());
    w.extend_from_slice(&2u16.to_le_bytes());
    w.extend_from_slice(&16u16.to_le_bytes());
    w.extend_from_slice(b"data");
    w.extend_from_slice(&(samples * 2).to_le_bytes());
    w.resize(w.len() + samples as usize * 2, 0);
    w
}

/// The stub with the site's pages and files.
async fn stub_with_site(dir: &Path) -> Stub {
    let stub = Stub::start().await;
    stub.file("/watch.html", "text/html; charset=utf-8", page_html(true));
    stub.file("/media.html", "text/html", page_html(false));
    stub.file(
        "/empty.html",
        "text/html",
        "<html><body><p>nothing here</p></body></html>",
    );
    stub.file("/subs/en.vtt", "text/vtt", EN_VTT);
    stub.file("/subs/fr.vtt", "text/vtt", FR_VTT);
    stub.file("/talk.srt", "application/x-subrip", SRT);
    stub.file("/media/talk.wav", "audio/wav", wav_bytes(dir));
    stub
}

// ------------------------------------------------------------------ the service under test

struct Service {
    proc: Option<Proc>,
    addr: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
    http: reqwest::Client,
}

impl Service {
    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    fn logs(&self) -> String {
        self.logs.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// POST a JSON body: (status, body).
    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let resp = self
            .http
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self.http.get(self.url(path)).send().await.expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn translate(&self, body: Value) -> (u16, Value) {
        self.post("/api/translate", body).await
    }

    /// Kills the process (SIGKILL) and waits for it.
    fn kill(&mut self) {
        self.proc = None;
    }
}

/// Starts `switchyard subtitles --listen 127.0.0.1:0 --data-dir DIR --config DIR/cfg.yaml`,
/// with the provider environment cleared and `envs` set, waiting for "listening on".
fn start(dir: &Path, yaml: &str, envs: &[(&str, &str)]) -> Service {
    let config = dir.join("subtitles-test.yaml");
    std::fs::write(&config, yaml).expect("write config");
    let mut cmd = Command::new(BIN);
    cmd.args(["subtitles", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "debug");
    for v in [
        "SERVER_API_KEY",
        "SERVER_API_URL",
        "SERVER_MODEL",
        "SERVERLESS_HOST_API_KEY",
        "CORS_ORIGINS",
        "SWITCHYARD_SUBTITLES_CONFIG",
    ] {
        cmd.env_remove(v);
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let Reported { proc, addr, logs } = spawn_reporting(cmd, "switchyard subtitles");
    Service {
        proc: Some(proc),
        addr,
        logs,
        http: support::http_client(),
    }
}

/// A config pointing every provider at the stub, with fast retries. The fetch guard refuses
/// loopback by default, so the stub's address 127.0.0.1 (only that one) is allowed explicitly
/// unless `extra` has its own `fetch:` section.
fn config(stub: &Stub, extra: &str) -> String {
    let fetch = if extra.contains("fetch:") {
        ""
    } else {
        "fetch: { allow_private: false, allow: [\"127.0.0.1\"] }\n"
    };
    format!(
        "{fetch}tools: {{ yt_dlp: \"\", ffmpeg: \"\" }}\n\
         transcription: {{ url: \"{api}\" }}\n\
         translation:\n  default_api_url: \"{api}\"\n  default_model: caller-default-model\n  \
         batch_size: 3\n  context_lines: 1\n  server: {{ api_url: \"{api}\", model: server-model }}\n  \
         retry: {{ max_attempts: 3, base_delay: 10ms, max_delay: 50ms }}\n{extra}",
        api = stub.api()
    )
}

fn texts(v: &Value) -> Vec<String> {
    v["subtitles"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| s["text"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn assert_error(status: u16, body: &Value, want_status: u16, want_code: &str) {
    assert_eq!(status, want_status, "{body}");
    assert_eq!(body["success"], false, "{body}");
    assert_eq!(body["code"], want_code, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{body}"
    );
}

/// [`assert_error`], and the message contains `fragment`.
fn assert_error_says(status: u16, body: &Value, want_status: u16, want_code: &str, fragment: &str) {
    assert_error(status, body, want_status, want_code);
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains(fragment)),
        "{fragment:?}: {body}"
    );
}

/// Polls the job until `done(status)` holds.
async fn wait_job(svc: &Service, job_id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, job) = svc.get(&format!("/api/status/{job_id}")).await;
        assert_eq!(code, 200, "{job}");
        if done(&job) {
            return job;
        }
        assert!(
            Instant::now() < deadline,
            "job never reached the state: {job}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads SSE `data:` events from a streaming response.
struct Events {
    resp: reqwest::Response,
    buf: String,
    queue: VecDeque<Value>,
}

impl Events {
    async fn open(svc: &Service, body: Value) -> Events {
        let resp = svc
            .http
            .post(svc.url("/api/stream"))
            .header("accept", "text/event-stream")
            .json(&body)
            .send()
            .await
            .expect("stream request");
        assert_eq!(resp.status(), 200);
        let ct = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        assert!(ct.starts_with("text/event-stream"), "{ct}");
        Events {
            resp,
            buf: String::new(),
            queue: VecDeque::new(),
        }
    }

    /// The next event, `None` at the end of the stream.
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(v) = self.queue.pop_front() {
                return Some(v);
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), self.resp.chunk())
                .await
                .expect("an event within 30 s")
                .expect("stream read")?;
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                for line in block.lines() {
                    if let Some(data) = line.strip_prefix("data:") {
                        let v: Value = serde_json::from_str(data.trim()).expect("event JSON");
                        self.queue.push_back(v);
                    }
                }
            }
        }
    }

    async fn all(mut self) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(v) = self.next().await {
            out.push(v);
        }
        out
    }
}

// ------------------------------------------------------------------ tests

#[tokio::test(flavor = "multi_thread")]
async fn health_errors_and_cors_defaults() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    let svc = start(
        dir.path(),
        &config(&stub, ""),
        &[
            ("SERVER_API_KEY", "sk-server-very-secret"),
            ("SERVERLESS_HOST_API_KEY", "host-key-very-secret"),
        ],
    );
    let (code, health) = svc.get("/health").await;
    assert_eq!(code, 200);
    assert_eq!(health["status"], "healthy");
    let caps = &health["capabilities"];
    assert_eq!(caps["server_key_configured"], true);
    assert_eq!(caps["transcription"]["configured"], true);
    assert_eq!(caps["transcription"]["key_configured"], true);
    assert_eq!(caps["yt_dlp"]["available"], false, "disabled in the config");
    assert_eq!(caps["ffmpeg"]["available"], false);
    assert_eq!(caps["tiers"], json!([1, 2, 3, 4]));
    let text = health.to_string();
    assert!(!text.contains("very-secret"), "{text}");

    // every validation error in the spec's shape
    let ok_url = stub.url("/watch.html");
    let cases = [
        (json!({"target_language": "es"}), 400, "INVALID_URL"),
        (
            json!({"video_url": "ftp://x/y", "target_language": "es"}),
            400,
            "INVALID_URL",
        ),
        (
            json!({"video_url": "not a url", "target_language": "es"}),
            400,
            "INVALID_URL",
        ),
        (json!({"video_url": ok_url}), 400, "INVALID_LANGUAGE"),
        (
            json!({"video_url": ok_url, "target_language": "xx"}),
            400,
            "INVALID_LANGUAGE",
        ),
        (
            json!({"video_url": ok_url, "target_language": "es", "source_language": "klingon"}),
            400,
            "INVALID_LANGUAGE",
        ),
        (
            json!({"video_url": ok_url, "target_language": "es", "tier": 1}),
            400,
            "MISSING_API_KEY",
        ),
        (
            json!({"video_url": ok_url, "target_language": "es", "tier": 2, "api_key": ""}),
            400,
            "MISSING_API_KEY",
        ),
        (
            json!({"video_url": ok_url, "target_language": "es", "tier": 9}),
            400,
            "INVALID_REQUEST",
        ),
        (json!(["not", "an", "object"]), 400, "INVALID_REQUEST"),
    ];
    for (body, status, code) in cases {
        for path in ["/api/translate", "/api/stream"] {
            let (s, b) = svc.post(path, body.clone()).await;
            assert_error(s, &b, status, code);
        }
    }
    let resp = svc
        .http
        .post(svc.url("/api/translate"))
        .body("{not json")
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), 400);
    let too_big =
        json!({"video_url": ok_url, "target_language": "es", "pad": "x".repeat(100 * 1024)});
    let (s, b) = svc.post("/api/translate", too_big).await;
    assert_error(s, &b, 400, "INVALID_REQUEST");
    assert!(
        b["error"]
            .as_str()
            .is_some_and(|e| e.contains("max_body_size")),
        "{b}"
    );
    let (s, b) = svc.get("/api/status/no-such-job").await;
    assert_error(s, &b, 404, "JOB_NOT_FOUND");
    let (s, b) = svc.get("/nowhere").await;
    assert_error(s, &b, 404, "NOT_FOUND");
    assert!(
        stub.chats().is_empty(),
        "validation failures call no provider"
    );

    // CORS: any origin by default
    let resp = svc
        .http
        .request(reqwest::Method::OPTIONS, svc.url("/api/translate"))
        .header("origin", "https://anywhere.example")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type")
        .send()
        .await
        .expect("preflight");
    assert!(resp.status().is_success());
    assert_eq!(
        resp.headers()
            .get("access-control-allow-origin")
            .and_then(|v| v.to_str().ok()),
        Some("*")
    );
    let logs = svc.logs();
    assert!(!logs.contains("very-secret"), "keys never logged:\n{logs}");
}

#[tokio::test(flavor = "multi_thread")]
async fn tier1_page_tracks_translated_in_batches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    let svc = start(dir.path(), &config(&stub, ""), &[]);
    let caller_key = "sk-caller-abcdef-123456";
    let body = json!({
        "video_url": stub.url("/watch.html"),
        "target_language": "es",
        "api_key": caller_key,
        "api_url": stub.api(),
        "model": "caller-model",
        "tier": 1,
    });
    let (code, res) = svc.translate(body.clone()).await;
    assert_eq!(code, 200, "{res}");
    assert_eq!(res["success"], true);
    assert_eq!(res["target_language"], "es");
    assert_eq!(
        res["source_language"], "en",
        "the default <track> is English"
    );
    assert_eq!(
        texts(&res),
        [
            "T:Hello",
            "T:How are\nyou?",
            "T:Fine & you",
            "T:Four",
            "T:Five"
        ]
    );
    let first = &res["subtitles"][0];
    assert_eq!(
        (first["start"].as_f64(), first["end"].as_f64()),
        (Some(1.0), Some(2.5))
    );
    assert_eq!(res["subtitles"][4]["end"].as_f64(), Some(10.0));

    // two batches (size 3), with the caller's key, model and context lines
    let chats = stub.chats();
    assert_eq!(chats.len(), 2);
    for c in &chats {
        assert_eq!(c.auth.as_deref(), Some(&*format!("Bearer {caller_key}")));
        assert_eq!(c.body["model"], "caller-model");
        assert!(c.body["messages"][0]["content"]
            .as_str()
            .is_some_and(|s| s.contains("from English into Spanish")));
    }
    let second_user = chats[1].body["messages"][1]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(
        second_user.contains("Context before (do not translate):\n- Fine & you\n"),
        "{second_user}"
    );
    assert!(second_user.contains("1. Four\n2. Five\n"), "{second_user}");

    let job_id = res["job_id"].as_str().expect("job_id").to_string();
    let job = wait_job(&svc, &job_id, |j| j["status"] != "processing").await;
    assert_eq!(job["status"], "completed");
    assert_eq!(job["progress"].as_f64(), Some(100.0));
    assert_eq!(job["subtitles_count"], 5);
    assert_eq!(job["error"], Value::Null);

    // the result as SRT and WebVTT
    let srt = svc
        .http
        .get(svc.url(&format!("/api/status/{job_id}/subtitles?format=srt")))
        .send()
        .await
        .expect("srt")
        .text()
        .await
        .expect("srt text");
    assert!(
        srt.starts_with("1\n00:00:01,000 --> 00:00:02,500\nT:Hello\n\n2\n"),
        "{srt}"
    );
    let vtt = svc
        .http
        .get(svc.url(&format!("/api/status/{job_id}/subtitles?format=vtt")))
        .send()
        .await
        .expect("vtt")
        .text()
        .await
        .expect("vtt text");
    assert!(
        vtt.contains("00:00:05.000 --> 00:00:06.000\nT:Fine &amp; you\n"),
        "{vtt}"
    );

    // the caller's own provider is asked again for a repeat (tier 1-2 results are not cached,
    // see caller_providers_never_fill_the_shared_translation_cache)
    let (code, again) = svc.translate(body.clone()).await;
    assert_eq!(code, 200);
    assert_eq!(again["subtitles"], res["subtitles"]);
    assert_ne!(again["job_id"], res["job_id"]);
    assert_eq!(stub.chats().len(), 4, "asked the caller's provider again");

    // asking for French picks the French track; the key never lands in logs or the database
    let (code, fr) = svc
        .translate(
            json!({"video_url": stub.url("/watch.html"), "target_language": "de",
                          "source_language": "fr", "api_key": caller_key, "api_url": stub.api()}),
        )
        .await;
    assert_eq!(code, 200, "{fr}");
    assert_eq!(texts(&fr), ["T:Bonjour"]);
    assert_eq!(fr["source_language"], "fr");
    assert_eq!(
        stub.chats().last().map(|c| c.body["model"].clone()),
        Some(json!("caller-default-model"))
    );
    let logs = svc.logs();
    assert!(!logs.contains(caller_key), "{logs}");
    for f in ["subtitles.db", "subtitles.db-wal"] {
        let bytes = std::fs::read(dir.path().join(f)).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains(caller_key), "the key is stored in {f}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tier2_direct_srt_and_tier3_server_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    let svc = start(
        dir.path(),
        &config(&stub, ""),
        &[("SERVER_API_KEY", "sk-server-key-0001")],
    );
    let (code, res) = svc
        .translate(
            json!({"video_url": stub.url("/talk.srt"), "target_language": "fr",
                          "source_language": "en", "api_key": "sk-caller-2", "tier": 2}),
        )
        .await;
    assert_eq!(code, 200, "{res}");
    assert_eq!(texts(&res), ["T:One", "T:Two\nlines"]);
    assert_eq!(res["subtitles"][1]["start"].as_f64(), Some(60.0));
    assert_eq!(res["subtitles"][1]["end"].as_f64(), Some(62.25));
    assert_eq!(stub.chats()[0].auth.as_deref(), Some("Bearer sk-caller-2"));

    // tier 3: the server's key and model; api_url and model from the body are ignored
    let (code, res) = svc
        .translate(
            json!({"video_url": stub.url("/talk.srt"), "target_language": "ja",
                          "api_url": "http://127.0.0.1:9/v1", "model": "caller-choice"}),
        )
        .await;
    assert_eq!(code, 200, "{res}");
    let last = stub.chats().last().cloned().expect("a chat");
    assert_eq!(last.auth.as_deref(), Some("Bearer sk-server-key-0001"));
    assert_eq!(last.body["model"], "server-model");
    let job = wait_job(&svc, res["job_id"].as_str().unwrap_or_default(), |j| {
        j["status"] == "completed"
    })
    .await;
    assert_eq!(job["tier"], 3);
    assert!(!svc.logs().contains("sk-server-key-0001"));

    // same source and target: returned as is, no provider call
    let before = stub.chats().len();
    let (code, res) = svc
        .translate(
            json!({"video_url": stub.url("/talk.srt"), "target_language": "en",
                          "source_language": "en"}),
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(texts(&res), ["One", "Two\nlines"]);
    assert_eq!(stub.chats().len(), before);
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_line_counts_are_reasked_split_or_fail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    let svc = start(
        dir.path(),
        &config(&stub, ""),
        &[("SERVER_API_KEY", "k-server")],
    );
    // batch 1 (3 lines): short, short again → split into 1 + 2, both fine; batch 2 fine
    stub.script_chat(&[Chat::OneLineShort, Chat::OneLineShort]);
    let (code, res) = svc
        .translate(json!({"video_url": stub.url("/watch.html"), "target_language": "es"}))
        .await;
    assert_eq!(code, 200, "{res}");
    assert_eq!(
        texts(&res),
        [
            "T:Hello",
            "T:How are\nyou?",
            "T:Fine & you",
            "T:Four",
            "T:Five"
        ]
    );
    let chats = stub.chats();
    let asked: Vec<usize> = chats
        .iter()
        .map(|c| {
            numbered_lines(
                c.body["messages"][1]["content"]
                    .as_str()
                    .unwrap_or_default(),
            )
            .len()
        })
        .collect();
    assert_eq!(
        asked,
        [3, 3, 1, 2, 2],
        "first, re-ask, two halves, second batch"
    );
    let reask = &chats[1].body["messages"];
    assert_eq!(reask.as_array().map(Vec::len), Some(4));
    assert_eq!(reask[2]["role"], "assistant");
    assert!(reask[3]["content"]
        .as_str()
        .is_some_and(|s| s.contains("exactly 3")));

    // a provider that never gets the count right: TRANSLATION_FAILED
    stub.script_chat(&[Chat::OneLineShort; 10]);
    let (code, res) = svc
        .translate(json!({"video_url": stub.url("/talk.srt"), "target_language": "es"}))
        .await;
    assert_error(code, &res, 500, "TRANSLATION_FAILED");
    let job = wait_job(&svc, res["job_id"].as_str().unwrap_or_default(), |j| {
        j["status"] == "failed"
    })
    .await;
    assert!(
        job["error"]
            .as_str()
            .is_some_and(|e| e.contains("one line")),
        "{job}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_retries_errors_and_outage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    let svc = start(
        dir.path(),
        &config(&stub, ""),
        &[("SERVER_API_KEY", "k-server")],
    );
    // 429 then 503, then success: retried with backoff
    stub.script_chat(&[Chat::Status(429), Chat::Status(503)]);
    let (code, res) = svc
        .translate(json!({"video_url": stub.url("/talk.srt"), "target_language": "es"}))
        .await;
    assert_eq!(code, 200, "{res}");
    assert_eq!(stub.chats().len(), 3);

    // 401 is not retried: API_ERROR 502 naming the provider's answer, key scrubbed
    stub.script_chat(&[Chat::Status(401)]);
    let (code, res) = svc
        .translate(json!({"video_url": stub.url("/talk.srt"), "target_language": "de"}))
        .await;
    assert_error(code, &res, 502, "API_ERROR");
    assert!(
        res["error"].as_str().is_some_and(|e| e.contains("401")),
        "{res}"
    );
    assert_eq!(stub.chats().len(), 4);

    // 5xx every time: retried up to max_attempts (3), then API_ERROR
    stub.script_chat(&[Chat::Status(500); 3]);
    let (code, res) = svc
        .translate(json!({"video_url": stub.url("/talk.srt"), "target_language": "it"}))
        .await;
    assert_error(code, &res, 502, "API_ERROR");
    assert_eq!(stub.chats().len(), 7);
    let job = wait_job(&svc, res["job_id"].as_str().unwrap_or_default(), |j| {
        j["status"] == "failed"
    })
    .await;
    assert!(
        job["error"].as_str().is_some_and(|e| e.contains("500")),
        "{job}"
    );

    // provider down (nothing listens): API_ERROR 502
    let down = support::free_port();
    let (code, res) = svc
        .translate(
            json!({"video_url": stub.url("/talk.srt"), "target_language": "ko",
                          "api_key": "sk-x", "api_url": format!("http://127.0.0.1:{down}/v1")}),
        )
        .await;
    assert_error(code, &res, 502, "API_ERROR");
}

#[tokio::test(flavor = "multi_thread")]
async fn unreachable_or_missing_videos() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    let svc = start(dir.path(), &config(&stub, ""), &[("SERVER_API_KEY", "k")]);
    let closed = support::free_port();
    for url in [
        stub.url("/no-such-video"),
        format!("http://127.0.0.1:{closed}/watch"),
        stub.url("/empty.html"),
    ] {
        let (code, res) = svc
            .translate(json!({"video_url": url, "target_language": "es"}))
            .await;
        assert_error(code, &res, 404, "VIDEO_NOT_FOUND");
        assert!(res["job_id"].is_string(), "{res}");
    }
    assert!(stub.chats().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn transcription_tiers_and_failures_without_ffmpeg() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    let svc = start(
        dir.path(),
        &config(&stub, ""),
        &[
            ("SERVER_API_KEY", "k-server"),
            ("SERVERLESS_HOST_API_KEY", "gpu-host-key"),
        ],
    );
    // tier 3, page without tracks: the media is uploaded as fetched (ffmpeg disabled)
    let (code, res) = svc
        .translate(json!({"video_url": stub.url("/media.html"), "target_language": "es"}))
        .await;
    assert_eq!(code, 200, "{res}");
    assert_eq!(texts(&res), ["T:Spoken one.", "T:Spoken two."]);
    assert_eq!(res["source_language"], "en", "Whisper's 'english'");
    assert_eq!(res["subtitles"][0]["end"].as_f64(), Some(1.25));
    let t = stub.transcriptions();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].auth.as_deref(), Some("Bearer gpu-host-key"));
    assert_eq!(t[0].body["file_name"], "media.wav");
    assert_eq!(
        t[0].body["file_head"],
        json!([82, 73, 70, 70]),
        "RIFF as served"
    );
    assert_eq!(t[0].body["model"], "whisper-1");
    assert_eq!(t[0].body["response_format"], "verbose_json");

    // tier 1 transcribes at the caller's provider with the caller's key; force_whisper skips tracks
    let (code, res) = svc
        .translate(json!({"video_url": stub.url("/watch.html"), "target_language": "es", "force_whisper": true,
                          "source_language": "en", "api_key": "sk-caller-9", "api_url": stub.api()}))
        .await;
    assert_eq!(code, 200, "{res}");
    assert_eq!(texts(&res), ["T:Spoken one.", "T:Spoken two."]);
    let t = stub.transcriptions();
    assert_eq!(t.len(), 2);
    assert_eq!(t[1].auth.as_deref(), Some("Bearer sk-caller-9"));
    assert_eq!(t[1].body["language"], "en");

    // the backend fails: TRANSCRIPTION_FAILED
    stub.script_transcribe(&[Transcribe::Status(400)]);
    let (code, res) = svc
        .translate(json!({"video_url": stub.url("/media.html"), "target_language": "de"}))
        .await;
    assert_error(code, &res, 500, "TRANSCRIPTION_FAILED");

    // no server backend configured: tiers 2-4 cannot transcribe
    let dir2 = tempfile::tempdir().expect("tempdir");
    let yaml = config(&stub, "").replace(
        &format!("transcription: {{ url: \"{}\" }}\n", stub.api()),
        "",
    );
    let svc2 = start(dir2.path(), &yaml, &[("SERVER_API_KEY", "k-server")]);
    let (_, health) = svc2.get("/health").await;
    assert_eq!(health["capabilities"]["transcription"]["configured"], false);
    let (code, res) = svc2
        .translate(json!({"video_url": stub.url("/media.html"), "target_language": "es"}))
        .await;
    assert_error(code, &res, 500, "TRANSCRIPTION_FAILED");
    assert_eq!(stub.transcriptions().len(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn ffmpeg_transcodes_before_upload() {
    if support::require("ffmpeg").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    let yaml = config(&stub, "").replace("ffmpeg: \"\"", "ffmpeg: ffmpeg");
    let svc = start(dir.path(), &yaml, &[("SERVER_API_KEY", "k-server")]);
    let (_, health) = svc.get("/health").await;
    assert_eq!(health["capabilities"]["ffmpeg"]["available"], true);
    let (code, res) = svc
        .translate(json!({"video_url": stub.url("/media/talk.wav"), "target_language": "es"}))
        .await;
    assert_eq!(code, 200, "{res}");
    let t = stub.transcriptions();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].body["file_name"], "audio.mp3");
    let head: Vec<u64> = t[0].body["file_head"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let is_mp3 = head.starts_with(&[73, 68, 51]) || (head.first() == Some(&255));
    assert!(is_mp3, "an MP3 (ID3 tag or frame sync): {head:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn yt_dlp_reads_video_site_tracks_and_audio() {
    if support::require("yt-dlp").is_none() || support::require("ffmpeg").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    let yaml = config(&stub, "").replace(
        "tools: { yt_dlp: \"\", ffmpeg: \"\" }",
        "tools: { yt_dlp: yt-dlp, ffmpeg: ffmpeg, video_sites: [localhost] }",
    );
    let svc = start(dir.path(), &yaml, &[("SERVER_API_KEY", "k-server")]);
    let (_, health) = svc.get("/health").await;
    assert_eq!(
        health["capabilities"]["yt_dlp"]["available"], true,
        "{health}"
    );
    // "localhost" is configured as a video site: pages go through yt-dlp -J
    let page = format!("http://localhost:{}/watch.html", stub.addr.port());
    let (code, res) = svc
        .translate(json!({"video_url": page, "target_language": "es", "source_language": "en"}))
        .await;
    assert_eq!(code, 200, "{res}\n{}", svc.logs());
    assert_eq!(
        texts(&res),
        [
            "T:Hello",
            "T:How are\nyou?",
            "T:Fine & you",
            "T:Four",
            "T:Five"
        ]
    );
    assert!(stub.transcriptions().is_empty());
    // force_whisper: yt-dlp downloads the media, ffmpeg extracts the audio, it is transcribed
    let (code, res) = svc
        .translate(json!({"video_url": page, "target_language": "es", "force_whisper": true}))
        .await;
    assert_eq!(code, 200, "{res}\n{}", svc.logs());
    assert_eq!(texts(&res), ["T:Spoken one.", "T:Spoken two."]);
    assert_eq!(stub.transcriptions().len(), 1);
    // a page yt-dlp cannot read: VIDEO_NOT_FOUND
    let missing = format!("http://localhost:{}/missing.html", stub.addr.port());
    let (code, res) = svc
        .translate(json!({"video_url": missing, "target_language": "es"}))
        .await;
    assert_error(code, &res, 404, "VIDEO_NOT_FOUND");
}

#[tokio::test(flavor = "multi_thread")]
async fn stream_events_in_order_job_states_and_cancellation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    let yaml =
        config(&stub, "jobs: { max_concurrent: 1 }\n").replace("batch_size: 3", "batch_size: 2");
    let svc = start(dir.path(), &yaml, &[("SERVER_API_KEY", "k-server")]);

    // a whole stream: progress, subtitles in order, complete
    let events = Events::open(
        &svc,
        json!({"video_url": stub.url("/watch.html"), "target_language": "es"}),
    )
    .await
    .all()
    .await;
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"progress"));
    assert_eq!(kinds.last(), Some(&"complete"));
    let job_id = events[0]["job_id"].as_str().expect("job id").to_string();
    let subs: Vec<&Value> = events.iter().filter(|e| e["type"] == "subtitle").collect();
    let indexes: Vec<u64> = subs.iter().filter_map(|e| e["index"].as_u64()).collect();
    assert_eq!(indexes, [0, 1, 2, 3, 4]);
    assert_eq!(subs[1]["text"], "T:How are\nyou?");
    assert_eq!(subs[1]["start"].as_f64(), Some(3.0));
    let complete = events.last().expect("complete");
    assert_eq!(complete["total_subtitles"], 5);
    let progress: Vec<f64> = events
        .iter()
        .filter(|e| e["type"] == "progress")
        .filter_map(|e| e["progress"].as_f64())
        .collect();
    assert!(progress.windows(2).all(|w| w[0] <= w[1]), "{progress:?}");
    // progress arrives as batches finish: between the subtitles, not only at the end
    let first_sub = kinds.iter().position(|k| *k == "subtitle").unwrap_or(0);
    assert!(kinds[first_sub..].contains(&"progress"), "{kinds:?}");
    let job = wait_job(&svc, &job_id, |j| j["status"] == "completed").await;
    assert_eq!(job["subtitles_count"], 5);
    assert_eq!(job["tier"], 4, "/api/stream without api_key is tier 4");

    // job A hangs on its second batch; job B waits (max_concurrent 1) as pending
    stub.script_chat(&[Chat::Translate, Chat::Hang]);
    let mut a = Events::open(
        &svc,
        json!({"video_url": stub.url("/watch.html"), "target_language": "fr"}),
    )
    .await;
    let a_id = a.next().await.expect("first event")["job_id"]
        .as_str()
        .expect("id")
        .to_string();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let e = a.next().await.expect("event");
        if e["type"] == "subtitle" {
            seen.push(e["text"].as_str().unwrap_or_default().to_string());
        }
    }
    assert_eq!(seen, ["T:Hello", "T:How are\nyou?"]);
    // the first stream made 3 requests (batches of 2); A's second batch is the one hanging
    let deadline = Instant::now() + Duration::from_secs(30);
    while stub.chats().len() < 5 {
        assert!(
            Instant::now() < deadline,
            "A's second batch never reached the provider"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let job_a = wait_job(&svc, &a_id, |j| {
        j["status"] == "processing" && j["subtitles_count"] == 2
    })
    .await;
    let p = job_a["progress"].as_f64().unwrap_or(0.0);
    assert!(p > 0.0 && p < 100.0, "{job_a}");

    let mut b = Events::open(
        &svc,
        json!({"video_url": stub.url("/watch.html"), "target_language": "de"}),
    )
    .await;
    let b_id = b.next().await.expect("first event")["job_id"]
        .as_str()
        .expect("id")
        .to_string();
    let job_b = wait_job(&svc, &b_id, |_| true).await;
    assert_eq!(job_b["status"], "pending", "{job_b}");
    assert_eq!(job_b["progress"].as_f64(), Some(0.0));

    // the client of A disconnects: the hanging provider request is aborted, no further batch
    let chats_at_cancel = stub.chats().len();
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(30);
    while stub.aborted() == 0 {
        assert!(
            Instant::now() < deadline,
            "the provider request was not aborted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let job_a = wait_job(&svc, &a_id, |j| j["status"] == "failed").await;
    assert!(
        job_a["error"]
            .as_str()
            .is_some_and(|e| e.contains("cancelled")),
        "{job_a}"
    );
    // B now runs to the end; A asked nothing more
    let rest = b.all().await;
    assert_eq!(
        rest.last().map(|e| e["type"].clone()),
        Some(json!("complete"))
    );
    assert_eq!(
        wait_job(&svc, &b_id, |j| j["status"] != "pending"
            && j["status"] != "processing")
        .await["status"],
        "completed"
    );
    let a_chats = stub
        .chats()
        .iter()
        .skip(chats_at_cancel)
        .filter(|c| {
            c.body["messages"][0]["content"]
                .as_str()
                .is_some_and(|s| s.contains("French"))
        })
        .count();
    assert_eq!(
        a_chats, 0,
        "no batch of the cancelled job after the disconnect"
    );

    // errors arrive as an `error` event
    stub.script_chat(&[Chat::Status(403)]);
    let events = Events::open(
        &svc,
        json!({"video_url": stub.url("/talk.srt"), "target_language": "hi"}),
    )
    .await
    .all()
    .await;
    let last = events.last().expect("an event");
    assert_eq!(last["type"], "error");
    assert_eq!(last["code"], "API_ERROR");
}

#[tokio::test(flavor = "multi_thread")]
async fn jobs_and_cache_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    let yaml = config(&stub, "");
    let mut svc = start(dir.path(), &yaml, &[("SERVER_API_KEY", "k-server")]);
    let body = json!({"video_url": stub.url("/watch.html"), "target_language": "ru"});
    let (code, done) = svc.translate(body.clone()).await;
    assert_eq!(code, 200);
    let done_id = done["job_id"].as_str().expect("id").to_string();

    stub.script_chat(&[Chat::Hang]);
    let mut hanging = Events::open(
        &svc,
        json!({"video_url": stub.url("/talk.srt"), "target_language": "ar"}),
    )
    .await;
    let hang_id = hanging.next().await.expect("event")["job_id"]
        .as_str()
        .expect("id")
        .to_string();
    wait_job(&svc, &hang_id, |j| j["status"] == "processing").await;
    svc.kill();
    drop(hanging);

    let svc = start(dir.path(), &yaml, &[("SERVER_API_KEY", "k-server")]);
    let job = wait_job(&svc, &hang_id, |_| true).await;
    assert_eq!(job["status"], "failed");
    assert!(
        job["error"]
            .as_str()
            .is_some_and(|e| e.contains("interrupted")),
        "{job}"
    );
    let job = wait_job(&svc, &done_id, |_| true).await;
    assert_eq!(
        (job["status"].as_str(), job["subtitles_count"].as_u64()),
        (Some("completed"), Some(5))
    );
    let chats = stub.chats().len();
    let (code, again) = svc.translate(body).await;
    assert_eq!(code, 200);
    assert_eq!(again["subtitles"], done["subtitles"]);
    assert_eq!(stub.chats().len(), chats, "the cache survived the restart");
}

#[tokio::test(flavor = "multi_thread")]
async fn rate_limits_and_cors_origins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    let svc = start(
        dir.path(),
        &config(
            &stub,
            "rate_limit: { per_ip: 100, per_key: 2, window: 1h }\n",
        ),
        &[("CORS_ORIGINS", "https://app.example")],
    );
    let body = json!({"video_url": stub.url("/talk.srt"), "target_language": "es", "api_key": "sk-limited"});
    for _ in 0..2 {
        assert_eq!(svc.translate(body.clone()).await.0, 200);
    }
    let resp = svc
        .http
        .post(svc.url("/api/translate"))
        .json(&body)
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().get("retry-after").is_some());
    let b: Value = resp.json().await.expect("json");
    assert_error(429, &b, 429, "RATE_LIMITED");
    let mut other = body.clone();
    other["api_key"] = json!("sk-another");
    assert_eq!(svc.translate(other).await.0, 200, "limits are per key");

    let preflight = |origin: &'static str| {
        svc.http
            .request(reqwest::Method::OPTIONS, svc.url("/api/stream"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .send()
    };
    let allowed = preflight("https://app.example").await.expect("preflight");
    assert_eq!(
        allowed
            .headers()
            .get("access-control-allow-origin")
            .and_then(|v| v.to_str().ok()),
        Some("https://app.example")
    );
    let denied = preflight("https://evil.example").await.expect("preflight");
    assert!(denied
        .headers()
        .get("access-control-allow-origin")
        .is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn fetch_guard_refuses_internal_addresses_by_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    let port = stub.addr.port();
    // no fetch section: the embedded default (allow_private false, nothing allowed)
    let svc = start(
        dir.path(),
        &config(&stub, "").replace(
            "fetch: { allow_private: false, allow: [\"127.0.0.1\"] }\n",
            "",
        ),
        &[("SERVER_API_KEY", "k-server")],
    );
    let (_, health) = svc.get("/health").await;
    assert_eq!(
        health["capabilities"]["fetch_guard"],
        json!({"allow_private": false, "allow": []}),
        "{health}"
    );
    for video_url in [
        stub.url("/talk.srt"),
        format!("http://localhost:{port}/talk.srt"),
        format!("http://[::1]:{port}/talk.srt"),
        format!("http://[::ffff:127.0.0.1]:{port}/talk.srt"),
        format!("http://0x7f.1:{port}/talk.srt"),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "http://10.0.0.1/".to_string(),
    ] {
        for path in ["/api/translate", "/api/stream"] {
            let (code, res) = svc
                .post(
                    path,
                    json!({"video_url": video_url, "target_language": "es"}),
                )
                .await;
            assert_error(code, &res, 400, "INVALID_URL");
            assert!(
                res["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("internal address") && e.contains("fetch.allow")),
                "{video_url}: {res}"
            );
            assert!(res.get("job_id").is_none(), "refused before a job: {res}");
        }
    }
    // a tier 1-2 provider URL on loopback: refused before the job (the video URL is a public
    // documentation address that is never contacted)
    let (code, res) = svc
        .translate(
            json!({"video_url": "http://192.0.2.10/talk.srt", "target_language": "es",
                          "api_key": "sk-x", "api_url": stub.api()}),
        )
        .await;
    assert_error_says(code, &res, 400, "INVALID_REQUEST", "api_url:");
    assert!(
        stub.gets().is_empty(),
        "nothing was fetched: {:?}",
        stub.gets()
    );
    assert!(stub.chats().is_empty());
    assert!(stub.transcriptions().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn fetch_guard_checks_tracks_and_redirects_and_allows_listed_addresses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    let port = stub.addr.port();
    // only 127.0.0.1 is allowed; 127.0.0.2 and ::1 stay refused
    let svc = start(
        dir.path(),
        &config(&stub, ""),
        &[("SERVER_API_KEY", "k-server")],
    );
    stub.file(
        "/internal-track.html",
        "text/html",
        format!(
            r#"<html><video><track kind="subtitles" srclang="en" src="http://127.0.0.2:{port}/subs/en.vtt"></video></html>"#
        ),
    );
    stub.file(
        "/internal-media.html",
        "text/html",
        format!(r#"<html><video src="http://[::1]:{port}/media/talk.wav"></video></html>"#),
    );
    stub.redirect(
        "/redirect-internal.srt",
        &format!("http://127.0.0.2:{port}/talk.srt"),
    );
    stub.redirect("/redirect-ok.srt", "/talk.srt");

    // allowed address, redirect followed: works (so the refusals below are the guard's doing)
    let (code, res) = svc
        .translate(json!({"video_url": stub.url("/redirect-ok.srt"), "target_language": "es"}))
        .await;
    assert_eq!(code, 200, "{res}");
    assert_eq!(texts(&res), ["T:One", "T:Two\nlines"]);

    for (page, why) in [
        ("/internal-track.html", "127.0.0.2 is an internal address"),
        ("/redirect-internal.srt", "127.0.0.2 is an internal address"),
        ("/internal-media.html", "is an internal address (loopback)"),
    ] {
        let (code, res) = svc
            .translate(json!({"video_url": stub.url(page), "target_language": "es", "force_whisper": page.contains("media")}))
            .await;
        assert_error(code, &res, 400, "INVALID_URL");
        assert!(
            res["error"].as_str().is_some_and(|e| e.contains(why)),
            "{page}: {res}"
        );
        let job_id = res["job_id"].as_str().expect("the job had started");
        let job = wait_job(&svc, job_id, |j| j["status"] == "failed").await;
        assert_eq!(job["error_code"], "INVALID_URL", "{job}");
    }
    // in a stream a refusal is an `error` event
    let events = Events::open(
        &svc,
        json!({"video_url": stub.url("/internal-track.html"), "target_language": "fr"}),
    )
    .await
    .all()
    .await;
    let last = events.last().expect("an event");
    assert_eq!(
        (last["type"].as_str(), last["code"].as_str()),
        (Some("error"), Some("INVALID_URL"))
    );
    assert!(
        stub.transcriptions().is_empty(),
        "the internal media was never fetched"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn fetch_guard_covers_yt_dlp_through_its_proxy() {
    if support::require("yt-dlp").is_none() || support::require("ffmpeg").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    let port = stub.addr.port();
    // the page is on an allowed host name; its media is at an IP literal that is not allowed
    stub.file(
        "/guarded.html",
        "text/html",
        format!(
            r#"<!doctype html><html><body><video controls><source src="http://127.0.0.1:{port}/media/talk.wav" type="audio/wav"></video></body></html>"#
        ),
    );
    let page = format!("http://localhost:{port}/guarded.html");
    let with_allow = |allow: &str| {
        config(&stub, &format!("fetch: {{ allow: [{allow}] }}\n")).replace(
            "tools: { yt_dlp: \"\", ffmpeg: \"\" }",
            "tools: { yt_dlp: yt-dlp, ffmpeg: ffmpeg, video_sites: [localhost] }",
        )
    };

    let strict_dir = tempfile::tempdir().expect("tempdir");
    let strict = start(
        strict_dir.path(),
        &with_allow("localhost"),
        &[("SERVER_API_KEY", "k")],
    );
    let (code, res) = strict
        .translate(json!({"video_url": page, "target_language": "es", "force_whisper": true}))
        .await;
    assert_error(code, &res, 404, "VIDEO_NOT_FOUND");
    assert!(
        stub.gets().contains(&"/guarded.html".to_string()),
        "{:?}",
        stub.gets()
    );
    assert!(
        !stub.gets().contains(&"/media/talk.wav".to_string()),
        "yt-dlp reached a refused address: {:?}\n{}",
        stub.gets(),
        strict.logs()
    );
    assert!(
        strict.logs().contains("refused by the fetch guard"),
        "{}",
        strict.logs()
    );
    assert!(stub.transcriptions().is_empty());

    // the same with the address allowed: yt-dlp downloads it through the proxy
    let open = start(
        dir.path(),
        &with_allow("localhost, 127.0.0.1"),
        &[("SERVER_API_KEY", "k")],
    );
    let (code, res) = open
        .translate(json!({"video_url": page, "target_language": "es", "force_whisper": true}))
        .await;
    assert_eq!(code, 200, "{res}\n{}", open.logs());
    assert!(stub.gets().contains(&"/media/talk.wav".to_string()));
    assert_eq!(stub.transcriptions().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn translate_client_disconnect_cancels_the_job() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    let svc = start(
        dir.path(),
        &config(&stub, ""),
        &[("SERVER_API_KEY", "k-server")],
    );
    stub.script_chat(&[Chat::Hang]);
    let client = svc.http.clone();
    let url = svc.url("/api/translate");
    let video = stub.url("/talk.srt");
    let request = tokio::spawn(async move {
        let _ = client
            .post(url)
            .json(&json!({"video_url": video, "target_language": "es"}))
            .send()
            .await;
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while stub.chats().is_empty() {
        assert!(Instant::now() < deadline, "the provider was never asked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // the job id is only in the (never sent) response; the service logs it at creation
    let logs = svc.logs();
    let job_id = logs
        .lines()
        .filter(|l| l.contains("job created"))
        .find_map(|l| l.split("job_id=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .map(|id| id.trim_matches('"').to_string())
        .expect("job created log line");
    let job = wait_job(&svc, &job_id, |_| true).await;
    assert_eq!(job["status"], "processing", "{job}");
    assert_eq!(stub.aborted(), 0);

    // the caller goes away: the connection closes, the job stops, the provider request is
    // aborted and the job is recorded as failed (cancelled)
    request.abort();
    let deadline = Instant::now() + Duration::from_secs(30);
    while stub.aborted() == 0 {
        assert!(
            Instant::now() < deadline,
            "the provider request was not aborted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let job = wait_job(&svc, &job_id, |j| j["status"] == "failed").await;
    assert_eq!(job["error_code"], "CANCELLED", "{job}");
    assert_eq!(
        stub.chats().len(),
        1,
        "no retry or further batch after the cancel"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn model_replies_are_read_by_their_numbers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    let svc = start(
        dir.path(),
        &config(&stub, ""),
        &[("SERVER_API_KEY", "k-server")],
    );
    // talk.srt has two segments: one batch. (script, target, chat requests it takes)
    let cases: [(&[Chat], &str, usize); 6] = [
        (&[Chat::Preamble], "es", 1),
        (&[Chat::EchoPrompt], "fr", 1),
        (&[Chat::CodeBlock], "de", 1),
        // merged or dropped lines: asked again once, then fine
        (&[Chat::Merge], "it", 2),
        (&[Chat::OneLineShort], "pt", 2),
        // the confirmed defect: after a mismatch the model apologises on exactly as many lines
        // as were asked; that is no answer, so the batch is split and each half asked alone
        (&[Chat::Merge, Chat::Chatter], "ru", 4),
    ];
    for (script, target, requests) in cases {
        let before = stub.chats().len();
        stub.script_chat(script);
        let (code, res) = svc
            .translate(json!({"video_url": stub.url("/talk.srt"), "target_language": target}))
            .await;
        assert_eq!(code, 200, "{script:?}: {res}");
        assert_eq!(res["success"], true, "{script:?}: {res}");
        assert_eq!(texts(&res), ["T:One", "T:Two\nlines"], "{script:?}: {res}");
        assert_eq!(stub.chats().len() - before, requests, "{script:?}");
    }
    // the re-ask quotes the reply and names what was wrong
    let reask = stub.chats()[4].body["messages"].clone();
    assert_eq!(reask[2]["content"], "1. T:One T:Two <br> lines");
    assert!(
        reask[3]["content"]
            .as_str()
            .is_some_and(|s| s.contains("had 1 numbered lines, but exactly 2")),
        "{reask}"
    );

    // a model that only ever apologises: TRANSLATION_FAILED, never its text as subtitles
    stub.script_chat(&[Chat::Chatter; 10]);
    let (code, res) = svc
        .translate(json!({"video_url": stub.url("/talk.srt"), "target_language": "ja"}))
        .await;
    assert_error(code, &res, 500, "TRANSLATION_FAILED");
    assert!(!res.to_string().contains("Sorry"), "{res}");
    let events = Events::open(
        &svc,
        json!({"video_url": stub.url("/talk.srt"), "target_language": "ko"}),
    )
    .await
    .all()
    .await;
    assert!(
        events
            .iter()
            .all(|e| e["type"] != "subtitle" && !e.to_string().contains("Sorry")),
        "{events:?}"
    );
    assert_eq!(
        events.last().map(|e| e["code"].clone()),
        Some(json!("TRANSLATION_FAILED"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn caller_providers_never_fill_the_shared_translation_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    // a caller's own endpoint, answering with the same model name the server uses
    let attacker = Stub::start().await;
    attacker.script_chat(&[Chat::Poison; 20]);
    let svc = start(
        dir.path(),
        &config(&stub, ""),
        &[("SERVER_API_KEY", "k-server")],
    );
    let video = stub.url("/talk.srt");
    let from_attacker = |tier: u8| {
        json!({"video_url": video, "target_language": "es", "tier": tier, "api_key": "sk-attacker",
               "api_url": attacker.api(), "model": "server-model"})
    };
    let (code, res) = svc.translate(from_attacker(1)).await;
    assert_eq!(code, 200, "{res}");
    assert_eq!(
        texts(&res),
        ["PWNED", "PWNED"],
        "the caller gets what they asked for"
    );
    assert_eq!(attacker.chats().len(), 1);

    // tiers 3-4 ask the server's provider, and from then on are served from the cache
    for (path, round) in [
        ("/api/translate", 1),
        ("/api/translate", 2),
        ("/api/stream", 3),
    ] {
        let body = json!({"video_url": video, "target_language": "es"});
        let got = if path == "/api/stream" {
            Events::open(&svc, body)
                .await
                .all()
                .await
                .iter()
                .filter(|e| e["type"] == "subtitle")
                .map(|e| e["text"].as_str().unwrap_or_default().to_string())
                .collect()
        } else {
            let (code, res) = svc.translate(body).await;
            assert_eq!(code, 200, "{res}");
            texts(&res)
        };
        assert_eq!(got, ["T:One", "T:Two\nlines"], "round {round}");
        assert_eq!(stub.chats().len(), 1, "round {round}");
    }
    assert_eq!(stub.chats()[0].auth.as_deref(), Some("Bearer k-server"));

    // a caller is served neither their own earlier answer nor the server provider's entry:
    // their provider is asked again
    for tier in [1, 2] {
        let (code, res) = svc.translate(from_attacker(tier)).await;
        assert_eq!(code, 200, "{res}");
        assert_eq!(texts(&res), ["PWNED", "PWNED"]);
    }
    assert_eq!(attacker.chats().len(), 3);
}

/// An HLS playlist (`#EXTM3U`) naming a segment on `watch`.
fn hls_playlist(watch: u16) -> String {
    format!(
        "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:10\n#EXT-X-MEDIA-SEQUENCE:0\n\
         #EXTINF:10.0,\nhttp://127.0.0.1:{watch}/seg0.ts\n#EXT-X-ENDLIST\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn media_that_is_a_playlist_never_reaches_ffmpeg_or_the_backend() {
    let ffmpeg = support::require("ffmpeg");
    let dir = tempfile::tempdir().expect("tempdir");
    let stub = stub_with_site(dir.path()).await;
    // a listener ffmpeg would contact if it followed a playlist; it must see no connection
    let watched = std::net::TcpListener::bind("127.0.0.1:0").expect("bind watched");
    watched.set_nonblocking(true).expect("nonblocking");
    let watch = watched.local_addr().expect("addr").port();
    stub.file("/media/evil.m3u8", "audio/x-mpegurl", hls_playlist(watch));
    stub.file("/media/evil.mp3", "audio/mpeg", hls_playlist(watch));
    stub.file(
        "/media/list.wav",
        "audio/wav",
        format!("ffconcat version 1.0\nfile 'http://127.0.0.1:{watch}/a.wav'\n"),
    );
    // real audio under a caller-chosen playlist extension: accepted, by its bytes
    stub.file("/media/real.m3u8", "audio/x-mpegurl", wav_bytes(dir.path()));

    let mut configs = Vec::new();
    if ffmpeg.is_some() {
        configs.push((
            "with ffmpeg",
            config(&stub, "").replace("ffmpeg: \"\"", "ffmpeg: ffmpeg"),
        ));
    }
    configs.push(("without ffmpeg", config(&stub, "")));
    for (name, yaml) in configs {
        let svc_dir = tempfile::tempdir().expect("tempdir");
        let svc = start(svc_dir.path(), &yaml, &[("SERVER_API_KEY", "k-server")]);
        let uploads = stub.transcriptions().len();
        for media in ["/media/evil.m3u8", "/media/evil.mp3", "/media/list.wav"] {
            let (code, res) = svc
                .translate(json!({"video_url": stub.url(media), "target_language": "es"}))
                .await;
            let why = "not an audio or video container";
            assert_error_says(code, &res, 404, "VIDEO_NOT_FOUND", why);
        }
        assert_eq!(
            stub.transcriptions().len(),
            uploads,
            "{name}: nothing uploaded"
        );
        match watched.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("{name}: the playlist's URL was contacted: {other:?}"),
        }

        let (code, res) = svc
            .translate(json!({"video_url": stub.url("/media/real.m3u8"), "target_language": "es"}))
            .await;
        assert_eq!(code, 200, "{name}: {res}\n{}", svc.logs());
        let t = stub.transcriptions();
        let want = if name == "with ffmpeg" {
            "audio.mp3"
        } else {
            "media.wav"
        };
        assert_eq!(
            t.last().map(|t| t.body["file_name"].clone()),
            Some(json!(want)),
            "{name}"
        );
    }
}
