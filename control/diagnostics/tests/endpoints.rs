//! The diagnostics endpoints served by axum on a loopback port and driven by a real HTTP client
//! (reqwest), with log entries produced through the real tracing layer.

use std::io::Read as _;
use std::time::{Duration, Instant};
use switchyard_api::diagnostics::{LogEntry, LogLevel, LogPage, MemoryStats};
use switchyard_api::ErrorBody;
use switchyard_diagnostics::{DiagnosticsApiDoc, DiagnosticsState, LogStore, ROUTES};
use tracing_subscriber::layer::SubscriberExt as _;

/// Serves the diagnostics routes on a random loopback port; returns the base URL.
async fn serve(state: DiagnosticsState) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let app: axum::Router = switchyard_diagnostics::routes(state);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

/// GETs `url` and reads a JSON body of type `T` (any status).
async fn get_json<T: serde::de::DeserializeOwned>(client: &reqwest::Client, url: String) -> T {
    client
        .get(&url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("JSON from {url}: {e}"))
}

/// Runs `f` with `logs`' capture layer as this thread's subscriber.
fn emit(logs: &LogStore, f: impl FnOnce()) {
    let subscriber = tracing_subscriber::registry().with(logs.layer());
    tracing::subscriber::with_default(subscriber, f);
}

/// Reads SSE `data:` payloads from a streaming response, one at a time.
struct SseReader {
    response: reqwest::Response,
    buffer: String,
}

impl SseReader {
    fn new(response: reqwest::Response) -> Self {
        Self {
            response,
            buffer: String::new(),
        }
    }

    /// The next `data:` payload (comments and blank lines skipped); None when the stream ends.
    async fn next_data(&mut self) -> Option<String> {
        loop {
            while let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if !data.is_empty() {
                    return Some(data.join("\n"));
                }
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.response.chunk())
                .await
                .expect("an SSE message within 10 s")
                .expect("reading the stream")?;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

#[tokio::test]
async fn logs_page_filters_by_minimum_level_newest_first() {
    let logs = LogStore::new(100);
    let base = serve(DiagnosticsState::new(logs.clone())).await;
    emit(&logs, || {
        tracing::debug!("d0");
        tracing::info!(method = "GET", status_code = 200, "i1");
        tracing::warn!(host = "a.test", "w2");
        tracing::error!(error = "refused", "e3");
        tracing::info!("i4");
    });
    let client = http_client();
    let page: LogPage = get_json(&client, format!("{base}/api/v1/logs")).await;
    assert_eq!((page.total, page.limit, page.offset), (5, 100, 0));
    let messages: Vec<_> = page.entries.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(messages, ["i4", "e3", "w2", "i1", "d0"]);
    assert_eq!(page.entries[3].fields["status_code"], 200);

    let warn: LogPage = get_json(
        &client,
        format!("{base}/api/v1/logs?level=warn&limit=1&offset=1"),
    )
    .await;
    assert_eq!((warn.total, warn.limit, warn.offset), (2, 1, 1));
    assert_eq!(warn.entries.len(), 1);
    assert_eq!(warn.entries[0].message, "w2");
    assert_eq!(warn.entries[0].level, LogLevel::Warn);

    let bad = client
        .get(format!("{base}/api/v1/logs?level=loud"))
        .send()
        .await
        .expect("GET logs");
    assert_eq!(bad.status(), 400);
    let body: ErrorBody = bad.json().await.expect("error body");
    assert_eq!(body.code, "INVALID_LEVEL");
    let bad = client
        .get(format!("{base}/api/v1/logs?limit=many"))
        .send()
        .await
        .expect("GET logs");
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn log_stream_sends_connected_then_live_entries() {
    let logs = LogStore::new(100);
    let base = serve(DiagnosticsState::new(logs.clone())).await;
    let response = http_client()
        .get(format!("{base}/api/v1/logs/stream"))
        .send()
        .await
        .expect("GET stream");
    assert_eq!(response.status(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let mut sse = SseReader::new(response);
    let first: serde_json::Value =
        serde_json::from_str(&sse.next_data().await.expect("first message")).expect("JSON");
    assert_eq!(first, serde_json::json!({"type": "connected"}));
    emit(&logs, || {
        tracing::info!(url = "http://origin.test/", duration_ms = 7, "request done");
        tracing::trace!("fine detail");
    });
    let entry: LogEntry =
        serde_json::from_str(&sse.next_data().await.expect("an entry")).expect("a log entry");
    assert_eq!(entry.message, "request done");
    assert_eq!(entry.level, LogLevel::Info);
    assert_eq!(entry.fields["url"], "http://origin.test/");
    assert_eq!(entry.fields["duration_ms"], 7);
    let entry: LogEntry =
        serde_json::from_str(&sse.next_data().await.expect("an entry")).expect("a log entry");
    assert_eq!(entry.level, LogLevel::Debug, "TRACE is reported as debug");
}

#[tokio::test]
async fn the_101st_stream_subscriber_is_refused() {
    let logs = LogStore::new(10);
    let base = serve(DiagnosticsState::new(logs.clone())).await;
    let client = http_client();
    let mut held = Vec::new();
    for _ in 0..100 {
        let r = client
            .get(format!("{base}/api/v1/logs/stream"))
            .send()
            .await
            .expect("GET stream");
        assert_eq!(r.status(), 200);
        held.push(r);
    }
    let refused = client
        .get(format!("{base}/api/v1/logs/stream"))
        .send()
        .await
        .expect("GET stream");
    assert_eq!(refused.status(), 503);
    let body: ErrorBody = refused.json().await.expect("error body");
    assert_eq!(body.code, "LOG_STREAM_FULL");
    let memory: MemoryStats = get_json(&client, format!("{base}/api/v1/debug/memory")).await;
    assert_eq!(memory.log_subscribers, 100);
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stops_reading_is_dropped_while_others_keep_receiving() {
    let logs = LogStore::new(10);
    let base = serve(DiagnosticsState::new(logs.clone())).await;
    let addr = base.trim_start_matches("http://").to_owned();

    // The slow client: a raw connection with a small receive buffer that never reads.
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let sockaddr: std::net::SocketAddr = addr.parse().expect("address");
    socket.connect(&sockaddr.into()).expect("connect");
    let mut slow: std::net::TcpStream = socket.into();
    std::io::Write::write_all(
        &mut slow,
        format!("GET /api/v1/logs/stream HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes(),
    )
    .expect("request");

    // The healthy client reads everything.
    let response = http_client()
        .get(format!("{base}/api/v1/logs/stream"))
        .send()
        .await
        .expect("GET stream");
    let mut fast = SseReader::new(response);
    fast.next_data().await.expect("connected");
    let deadline = Instant::now() + Duration::from_secs(20);
    while logs.subscriber_count() < 2 {
        assert!(Instant::now() < deadline, "slow client never subscribed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Entries big enough to fill the socket buffers, paced so the healthy client keeps up.
    let padding = "x".repeat(3000);
    let mut sent = 0u64;
    while logs.subscriber_count() == 2 {
        assert!(
            sent < 20_000 && Instant::now() < deadline,
            "the slow subscriber was never dropped"
        );
        for _ in 0..10 {
            emit(
                &logs,
                || tracing::info!(n = sent, padding = %padding, "bulk"),
            );
            sent += 1;
        }
        for _ in 0..10 {
            let entry: LogEntry =
                serde_json::from_str(&fast.next_data().await.expect("entry")).expect("JSON");
            assert_eq!(entry.message, "bulk");
        }
    }
    assert_eq!(
        logs.subscriber_count(),
        1,
        "only the healthy client remains"
    );
    emit(&logs, || tracing::info!("after the drop"));
    let entry: LogEntry =
        serde_json::from_str(&fast.next_data().await.expect("entry")).expect("JSON");
    assert_eq!(entry.message, "after the drop");
    drop(slow);
}

#[tokio::test]
async fn memory_stats_are_measured() {
    let logs = LogStore::new(10);
    let base = serve(DiagnosticsState::new(logs)).await;
    let body: serde_json::Value =
        get_json(&http_client(), format!("{base}/api/v1/debug/memory")).await;
    for field in [
        "heap_alloc",
        "heap_sys",
        "heap_idle",
        "heap_inuse",
        "heap_released",
        "heap_objects",
        "stack_inuse",
        "stack_sys",
        "num_gc",
        "last_gc_pause_ns",
        "total_gc_pause_ns",
        "gc_cpu_fraction",
        "num_goroutines",
        "log_subscribers",
    ] {
        assert!(body.get(field).is_some(), "{field} missing from {body}");
    }
    let m: MemoryStats = serde_json::from_value(body).expect("memory stats");
    assert!(m.heap_inuse > 0, "{m:?}");
    assert!(m.heap_sys >= m.heap_inuse, "{m:?}");
    assert!(m.stack_sys > 0 && m.stack_inuse <= m.stack_sys, "{m:?}");
    assert!(
        m.num_goroutines >= 2,
        "the test and the runtime threads: {m:?}"
    );
    assert_eq!(m.num_gc, 0);
}

/// Spins for about `for_how_long` so the profiler has CPU time to sample.
fn busy_loop(for_how_long: Duration) -> u64 {
    let end = Instant::now() + for_how_long;
    let mut x = 1u64;
    while Instant::now() < end {
        for i in 0..100_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    x
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_profile_is_gzipped_pprof_with_samples_one_at_a_time() {
    let state = DiagnosticsState::new(LogStore::new(10));
    let profiler = state.profiler.clone();
    let base = serve(state).await;
    let client = http_client();

    for bad in ["0", "301", "abc"] {
        let r = client
            .get(format!("{base}/debug/pprof/profile?seconds={bad}"))
            .send()
            .await
            .expect("GET profile");
        assert_eq!(r.status(), 400, "seconds={bad}");
    }

    let busy = std::thread::spawn(|| busy_loop(Duration::from_secs(3)));
    let url = format!("{base}/debug/pprof/profile?seconds=2");
    let request = client.get(&url).send();
    let profile = tokio::spawn(request);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !profiler.is_busy() {
        assert!(Instant::now() < deadline, "the profile never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = client.get(&url).send().await.expect("GET profile");
    assert_eq!(second.status(), 409, "a second profile at the same time");
    let body: ErrorBody = second.json().await.expect("error body");
    assert_eq!(body.code, "PROFILE_IN_PROGRESS");

    let response = profile.await.expect("task").expect("GET profile");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers().get("content-type").map(|v| v.as_bytes()),
        Some(&b"application/octet-stream"[..])
    );
    let gz = response.bytes().await.expect("body");
    busy.join().expect("busy loop");
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut raw)
        .expect("gzip");
    use pprof::protos::Message as _;
    let decoded = pprof::protos::Profile::decode(&raw[..]).expect("pprof protobuf");
    assert!(!decoded.sample.is_empty(), "no samples");
    assert!(decoded
        .sample
        .iter()
        .any(|s| s.value.iter().any(|v| *v > 0)));
    let names: Vec<&str> = decoded
        .sample_type
        .iter()
        .filter_map(|t| decoded.string_table.get(t.ty as usize).map(String::as_str))
        .collect();
    assert!(names.contains(&"cpu"), "sample types {names:?}");
    assert!(!profiler.is_busy(), "the slot is free again");
}

#[tokio::test]
async fn pprof_index_cmdline_heap_goroutine_and_the_unavailable_ones() {
    let base = serve(DiagnosticsState::new(LogStore::new(10))).await;
    let get = |path: &str| http_client().get(format!("{base}{path}")).send();

    for path in ["/debug/pprof/", "/debug/pprof"] {
        let index = get(path).await.expect("index");
        assert_eq!(index.status(), 200);
        let html = index.text().await.expect("text");
        assert!(html.contains("href=\"profile\"") && html.contains("goroutine"));
    }

    let cmdline = get("/debug/pprof/cmdline")
        .await
        .expect("cmdline")
        .text()
        .await
        .expect("text");
    let argv0 = std::env::args().next().expect("argv[0]");
    assert_eq!(cmdline.split('\0').next(), Some(argv0.as_str()));

    let heap = get("/debug/pprof/heap").await.expect("heap");
    assert_eq!(heap.status(), 200);
    let heap = heap.text().await.expect("text");
    assert!(
        heap.contains("mallinfo2") && heap.contains("VmRSS"),
        "{heap}"
    );

    let goroutine = get("/debug/pprof/goroutine")
        .await
        .expect("goroutine")
        .text()
        .await
        .expect("text");
    let total: usize = goroutine
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("threads profile: total "))
        .and_then(|n| n.parse().ok())
        .expect("a thread count line");
    assert!(total >= 1);

    for name in ["allocs", "block", "mutex", "threadcreate"] {
        let r = get(&format!("/debug/pprof/{name}")).await.expect("GET");
        assert_eq!(r.status(), 501, "{name}");
        let body: ErrorBody = r.json().await.expect("error body");
        assert_eq!(body.code, "PROFILE_NOT_AVAILABLE");
        assert!(body.message.contains(name));
    }
}

#[tokio::test]
async fn openapi_document_matches_the_router() {
    use utoipa::OpenApi as _;
    let doc = DiagnosticsApiDoc::openapi();
    let documented: Vec<&String> = doc.paths.paths.keys().collect();
    assert_eq!(documented.len(), ROUTES.len(), "{documented:?}");
    for (method, path) in ROUTES {
        let item = doc
            .paths
            .paths
            .get(*path)
            .unwrap_or_else(|| panic!("{path} is not documented"));
        assert_eq!(*method, "get");
        assert!(item.get.is_some(), "{path} has no GET");
    }
    // And each listed route is served (none falls through to 404).
    let base = serve(DiagnosticsState::new(LogStore::new(10))).await;
    let client = http_client();
    for (_, path) in ROUTES {
        if path.ends_with("/profile") || path.ends_with("/stream") {
            continue; // long-running; covered above
        }
        let r = client
            .get(format!("{base}{path}"))
            .send()
            .await
            .expect("GET");
        assert_ne!(r.status(), 404, "{path}");
    }
}

/// reqwest is built without a bundled TLS provider in the workspace (issue 14: one crypto
/// library): it needs rustls' process default before it builds a client.
fn http_client() -> reqwest::Client {
    switchyard_service::tls::use_ring_provider();
    reqwest::Client::new()
}
