//! End-to-end tests of the management API's WebSocket (`/api/v1/ws`), its Origin/Host rules,
//! token forms and login sessions, TLS, and the Prometheus metrics listener, against the real
//! binary with real clients (tokio-tungstenite, curl, rustls).

mod support;

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{curl, start_server_with_file, Server, BIN};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::WebSocketStream;

/// Long enough for a loaded machine; only ever a bound on waiting, never an assertion on speed.
const PATIENCE: Duration = Duration::from_secs(20);

/// Starts the server with `api_fields` inside `api: { listen: 127.0.0.1:0, … }` and `tail`
/// appended (other top-level sections).
fn server(api_fields: &str, tail: &str) -> Server {
    server_listening("127.0.0.1:0", api_fields, tail)
}

fn server_listening(api_listen: &str, api_fields: &str, tail: &str) -> Server {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("server.yaml");
    let sep = if api_fields.is_empty() { "" } else { ", " };
    std::fs::write(
        &path,
        format!(
            "server:\n  http: {{ listen: \"127.0.0.1:0\" }}\n  socks5: {{ listen: \"127.0.0.1:0\" }}\n  cores: 2\n\
             api: {{ listen: \"{api_listen}\"{sep}{api_fields} }}\nlogging: {{ level: info, format: json }}\n{tail}"
        ),
    )
    .expect("config");
    start_server_with_file(dir, path)
}

fn logs(s: &Server) -> Vec<String> {
    s.logs.lock().map(|l| l.clone()).unwrap_or_default()
}

/// Waits until a log line satisfies `pred`; returns it.
fn wait_log(s: &Server, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(l) = logs(s).into_iter().find(|l| pred(l)) {
            return l;
        }
        assert!(
            Instant::now() < deadline,
            "no such log line; log:\n{}",
            logs(s).join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The metrics listener's address from the "metrics listening" log line.
fn metrics_addr(s: &Server) -> SocketAddr {
    let line = wait_log(s, |l| l.contains("\"metrics listening\""));
    let v: Value = serde_json::from_str(&line).expect("json log");
    v["fields"]["listen"]
        .as_str()
        .expect("listen field")
        .parse()
        .expect("addr")
}

type Ws<S> = WebSocketStream<S>;

/// Opens `/api/v1/ws{query}` with extra headers; `Err((status, body))` when refused.
async fn ws_connect(
    api: SocketAddr,
    query: &str,
    headers: &[(&str, &str)],
) -> Result<Ws<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>, (u16, Value)> {
    let mut req = format!("ws://{api}/api/v1/ws{query}")
        .into_client_request()
        .expect("request");
    for (k, v) in headers {
        req.headers_mut().insert(
            tungstenite::http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
            v.parse().expect("value"),
        );
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, resp)) => {
            assert_eq!(resp.status(), 101);
            Ok(ws)
        }
        Err(tungstenite::Error::Http(resp)) => {
            let body = resp
                .body()
                .as_ref()
                .map(|b| serde_json::from_slice(b).unwrap_or(Value::Null));
            Err((resp.status().as_u16(), body.unwrap_or(Value::Null)))
        }
        Err(e) => panic!("WebSocket connect to {api}: {e}"),
    }
}

async fn ws(api: SocketAddr) -> Ws<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    ws_connect(api, "", &[]).await.expect("upgrade accepted")
}

/// Reads until an envelope of type `kind` satisfying `pred` arrives.
async fn next_event<S>(ws: &mut Ws<S>, kind: &str, pred: impl Fn(&Value) -> bool) -> Value
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let wait = async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str()).expect("envelope is JSON");
                    assert!(
                        v["type"].is_string()
                            && v["timestamp"].is_string()
                            && v["data"].is_object(),
                        "{v}"
                    );
                    if v["type"] == kind && pred(&v["data"]) {
                        return v;
                    }
                }
                Some(Ok(_)) => {}
                other => panic!("stream ended waiting for {kind}: {other:?}"),
            }
        }
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .unwrap_or_else(|_| panic!("no {kind} event"))
}

/// Sends `ping` and expects the text `pong` (skipping events).
async fn ping<S>(ws: &mut Ws<S>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    ws.send(Message::Text("ping".into()))
        .await
        .expect("send ping");
    let wait = async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) if t.as_str() == "pong" => return,
                Some(Ok(Message::Text(t))) => {
                    assert!(t.as_str().starts_with('{'), "unexpected text {t}");
                }
                Some(Ok(_)) => {}
                other => panic!("stream ended waiting for pong: {other:?}"),
            }
        }
    };
    tokio::time::timeout(PATIENCE, wait).await.expect("pong");
}

/// Waits for the server to end the stream (close frame or EOF).
async fn closed_by_server<S>(ws: &mut Ws<S>) -> Option<u16>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let wait = async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Close(frame))) => return frame.map(|f| u16::from(f.code)),
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return None,
            }
        }
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .expect("server closes the stream")
}

fn http(args: &[&str]) -> (u16, String) {
    let mut all = vec!["-sS", "--max-time", "20", "-o", "-", "-w", "\n%{http_code}"];
    all.extend_from_slice(args);
    let out = curl(&all);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn scrape(addr: SocketAddr) -> String {
    let (status, body) = http(&[&format!("http://{addr}/metrics")]);
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of one series (`name{labels}`) in a scrape.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A proxied HTTP request through the server to its own health endpoint.
fn proxied_request(s: &Server) {
    let (status, body) = http(&[
        "-x",
        &format!("http://{}", s.http),
        &format!("http://{}/api/v1/health", s.api),
    ]);
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_pong_and_connection_events() {
    let s = server("", "");
    let mut c = ws(s.api).await;
    ping(&mut c).await;

    let api_port = s.api.port().to_string();
    let target = format!("127.0.0.1:{api_port}");
    let s2 = &s;
    tokio::task::block_in_place(|| proxied_request(s2));
    let new = next_event(&mut c, "connection.new", |d| d["protocol"] == "HTTP").await;
    assert_eq!(new["data"]["host"], target.as_str(), "{new}");
    assert_eq!(new["data"]["client_ip"], "127.0.0.1");
    assert_eq!(new["data"]["backend"], "direct");
    let close = next_event(&mut c, "connection.close", |d| d["protocol"] == "HTTP").await;
    assert_eq!(close["data"]["host"], target.as_str());

    // A CONNECT tunnel.
    tokio::task::block_in_place(|| {
        let (status, _) = http(&[
            "-p",
            "-x",
            &format!("http://{}", s2.http),
            &format!("http://{}/api/v1/health", s2.api),
        ]);
        assert_eq!(status, 200);
    });
    let new = next_event(&mut c, "connection.new", |d| d["protocol"] == "CONNECT").await;
    assert_eq!(new["data"]["host"], target.as_str());
    next_event(&mut c, "connection.close", |d| d["protocol"] == "CONNECT").await;
    ping(&mut c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_reload_events_from_the_api_and_sighup() {
    let s = server("", "");
    let mut c = ws(s.api).await;
    let (status, body) = tokio::task::block_in_place(|| {
        http(&[
            "-X",
            "POST",
            &format!("http://{}/api/v1/config/reload", s.api),
        ])
    });
    assert_eq!(status, 200, "{body}");
    let e = next_event(&mut c, "config.reload", |_| true).await;
    assert!(e["data"]["changed_sections"].is_array(), "{e}");
    assert_eq!(e["data"]["requires_restart"], false);

    // Change a hot section on disk and send SIGHUP.
    let text = std::fs::read_to_string(&s.config_path).expect("config");
    std::fs::write(
        &s.config_path,
        format!("{text}routes:\n  - {{ name: all, domains: [\"*\"], backend: direct }}\nbackends:\n  - {{ name: direct, type: direct }}\n"),
    )
    .expect("write");
    let pid = s.pid().to_string();
    assert!(Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .expect("kill")
        .success());
    let e = next_event(&mut c, "config.reload", |d| {
        d["changed_sections"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "routes"))
    })
    .await;
    assert_eq!(e["data"]["requires_restart"], false, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_update_when_enabled() {
    let s = server("stats_interval: 100ms", "");
    let mut c = ws(s.api).await;
    let e = next_event(&mut c, "stats.update", |_| true).await;
    for k in [
        "active_connections",
        "total_connections",
        "bytes_sent",
        "bytes_received",
    ] {
        assert!(e["data"][k].is_u64(), "{k} in {e}");
    }
    let before = e["data"]["total_connections"].as_u64().unwrap_or(0);
    tokio::task::block_in_place(|| proxied_request(&s));
    next_event(&mut c, "stats.update", |d| {
        d["total_connections"].as_u64().unwrap_or(0) > before
    })
    .await;

    // Off by default: no stats.update while other events flow.
    let quiet = server("", "");
    let mut c = ws(quiet.api).await;
    tokio::task::block_in_place(|| proxied_request(&quiet));
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match tokio::time::timeout(PATIENCE, c.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => {
                let v: Value = serde_json::from_str(t.as_str()).expect("json");
                seen.push(v["type"].as_str().unwrap_or_default().to_owned());
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seen, ["connection.new", "connection.close"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_and_host_rules_over_the_wire() {
    let s = server(
        r#"allowed_origins: ["https://admin.example.com", "*.ops.example:8443", "gw.lan"]"#,
        "",
    );
    let port = s.api.port();
    let own = format!("127.0.0.1:{port}");
    let gw = format!("gw.lan:{port}");
    let gw_origin = format!("http://gw.lan:{port}");
    let same = format!("http://127.0.0.1:{port}");
    let lh = format!("localhost:{port}");
    let v6 = format!("[::1]:{port}");
    // (Origin, Host (None = the real address), accepted)
    let cases: Vec<(Option<&str>, Option<&str>, bool)> = vec![
        (None, None, true),                                         // no Origin
        (Some(&same), None, true),                                  // Origin host equals Host
        (Some("http://evil.example"), None, false),                 // anything else
        (Some("null"), None, false),                                // opaque origin
        (Some("https://admin.example.com"), None, true),            // rule 1: scheme-qualified
        (Some("HTTPS://Admin.Example.COM"), None, true),            // rule 1: case-insensitive
        (Some("http://admin.example.com"), None, false),            // rule 1: scheme differs
        (Some("https://a.ops.example:8443"), None, true),           // rule 3: one label
        (Some("https://a.b.ops.example:8443"), None, true),         // rule 3: spans dots
        (Some("https://a.ops.example"), None, false),               // rule 2: port missing
        (Some("https://a.ops.example:8444"), None, false),          // rule 2: other port
        (Some("https://ops.example:8443"), None, false),            // rule 3: needs a label
        (Some("https://gw.lan:8080"), None, false),                 // rule 2: no port in entry
        (Some("https://admin.example.com.evil.net"), None, false),  // rule 4: whole host
        (Some("https://xadmin.example.com"), None, false),          // rule 4: no suffix match
        (None, Some(&gw), true),                                    // Host listed by name
        (Some(&gw_origin), Some(&gw), true),                        // same origin on a listed Host
        (None, Some("evil.example"), false),                        // Host neither IP nor listed
        (Some("http://evil.example"), Some("evil.example"), false), // DNS rebinding shape
        (None, Some(&lh), true),                                    // localhost
        (None, Some("app.localhost"), true),                        // *.localhost
        (None, Some(&v6), true),                                    // IPv6 literal
        (None, Some("10.9.8.7:1"), true),                           // IPv4 literal
        (None, Some("localhost.evil.example"), false),              // not under .localhost
    ];
    let mut wrong = Vec::new();
    for (origin, host, accepted) in &cases {
        let mut headers = Vec::new();
        if let Some(o) = origin {
            headers.push(("Origin", *o));
        }
        headers.push(("Host", host.unwrap_or(&own)));
        match ws_connect(s.api, "", &headers).await {
            Ok(mut c) => {
                if !accepted {
                    wrong.push(format!("{origin:?} {host:?}: accepted"));
                }
                let _ = c.close(None).await;
            }
            Err((status, body)) => {
                if *accepted || status != 403 {
                    wrong.push(format!("{origin:?} {host:?}: {status} {body}"));
                }
                let code = body["code"].as_str().unwrap_or_default();
                assert!(
                    code == "ORIGIN_NOT_ALLOWED" || code == "HOST_NOT_ALLOWED",
                    "{body}"
                );
                assert_eq!(body["error"], "forbidden");
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    wait_log(&s, |l| {
        // the Host is refused by the API guard, before the upgrade's own checks
        l.contains("API request refused") && l.contains("neither an IP literal")
    });
    wait_log(&s, |l| {
        l.contains("WebSocket upgrade refused (403)") && l.contains("http://evil.example")
    });

    // Rule 7: the list is read at startup; a reload does not widen it.
    let text = std::fs::read_to_string(&s.config_path).expect("config");
    std::fs::write(
        &s.config_path,
        text.replace("\"gw.lan\"", "\"gw.lan\", \"https://late.example\""),
    )
    .expect("write");
    let (status, body) = tokio::task::block_in_place(|| {
        http(&[
            "-X",
            "POST",
            &format!("http://{}/api/v1/config/reload", s.api),
        ])
    });
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("restart required for [api]"), "{body}");
    let refused = ws_connect(s.api, "", &[("Origin", "https://late.example")]).await;
    assert_eq!(refused.err().map(|e| e.0), Some(403));
}

/// Runs the server on `yaml` expecting it to refuse to start; returns its stderr.
fn refused_startup(yaml: &str) -> String {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("server.yaml");
    std::fs::write(&path, yaml).expect("config");
    let mut child = Command::new(BIN)
        .args(["server", "--config"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start");
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            assert!(!status.success());
            let out = child.wait_with_output().expect("output");
            return String::from_utf8_lossy(&out.stderr).into_owned();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("server started with {yaml}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn bad_allowed_origins_refuse_startup() {
    let cases = [
        (r#"["https://admin.example.com/ui"]"#, "has a path"),
        (r#"["admin.example.com/"]"#, "has a path"),
        (r#"[" admin.example.com"]"#, "contains whitespace"),
        (r#"["admin.example.com "]"#, "contains whitespace"),
        (r#"["[a-z].example.com"]"#, "invalid wildcard"),
        (r#"["{a,b}.example.com"]"#, "invalid wildcard"),
        (r#"["a.example.com:*"]"#, "invalid port"),
        (r#"["*", "a.example.com"]"#, "must be the only entry"),
    ];
    for (list, reason) in cases {
        let yaml = format!(
            "server:\n  http: {{ listen: \"127.0.0.1:0\" }}\n  socks5: {{ listen: \"127.0.0.1:0\" }}\n\
             api: {{ listen: \"127.0.0.1:0\", allowed_origins: {list} }}\n"
        );
        let err = refused_startup(&yaml);
        assert!(
            err.contains("invalid configuration") && err.contains("api.allowed_origins"),
            "{list}: {err}"
        );
        assert!(err.contains(reason), "{list}: want {reason:?} in {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lone_star_disables_the_checks_with_a_warning() {
    let s = server(r#"allowed_origins: ["*"]"#, "");
    wait_log(&s, |l| {
        l.contains("WARN") && l.contains("Host and Origin checks of the API are disabled")
    });
    let mut c = ws_connect(
        s.api,
        "",
        &[("Origin", "http://evil.example"), ("Host", "evil.example")],
    )
    .await
    .expect("accepted with checks off");
    ping(&mut c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_most_100_clients() {
    let s = server("", "metrics: { enabled: true, listen: \"127.0.0.1:0\" }\n");
    let metrics = metrics_addr(&s);
    let mut clients = Vec::new();
    for _ in 0..100 {
        clients.push(ws(s.api).await);
    }
    let (status, body) = ws_connect(s.api, "", &[]).await.expect_err("101st refused");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "TOO_MANY_CLIENTS");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("100 clients"),
        "{body}"
    );
    wait_log(&s, |l| l.contains("client limit reached"));
    let text = tokio::task::block_in_place(|| scrape(metrics));
    assert_eq!(metric(&text, "switchyard_websocket_clients"), Some(100.0));
    // Every one of the 100 is served.
    for c in clients.iter_mut() {
        ping(c).await;
    }
    // One leaves: a new client gets in (once the server has seen the close).
    let mut gone = clients.pop().expect("client");
    gone.close(None).await.expect("close");
    let _ = closed_by_server(&mut gone).await;
    let deadline = Instant::now() + PATIENCE;
    let mut again = loop {
        match ws_connect(s.api, "", &[]).await {
            Ok(c) => break c,
            Err((503, _)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    ping(&mut again).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_clients_are_closed_after_the_read_timeout() {
    let s = server("ws_read_timeout: 2s", "");
    let mut silent = ws(s.api).await;
    let mut chatty = ws(s.api).await;
    // The chatty one pings well within the timeout until the silent one has been closed.
    let silent_end = tokio::spawn(async move { closed_by_server(&mut silent).await });
    while !silent_end.is_finished() {
        ping(&mut chatty).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(silent_end.await.expect("join"), Some(1001));
    ping(&mut chatty).await;
    wait_log(&s, |l| {
        l.contains("WebSocket client disconnected") && l.contains("read timeout")
    });
    // Then it goes quiet too and is closed.
    assert_eq!(closed_by_server(&mut chatty).await, Some(1001));
}

/// A client that never reads must not slow the others: a burst of events larger than the
/// broadcast buffer (1024) reaches a reading client complete and in order while a stalled
/// client is connected. (Dropping the stalled client needs its kernel buffers, megabytes on
/// loopback, to fill first; the drop itself is covered by the unit tests of `api::ws`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_client_does_not_slow_the_others() {
    let s = server("", "");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(2048).expect("rcvbuf");
    let stream = socket.connect(s.api).await.expect("connect");
    let (stalled, _) = tokio_tungstenite::client_async(format!("ws://{}/api/v1/ws", s.api), stream)
        .await
        .expect("stalled client");
    let mut reader = ws(s.api).await;
    ping(&mut reader).await;

    // 2000 config.reload events, requested by 8 senders over pooled keep-alive connections
    // (not HTTP/1.1 pipelining: hyper does not promise it, and one CI run saw a pipelining
    // connection reset mid-burst).
    const RELOADS: usize = 2000;
    const SENDERS: usize = 8;
    let http = support::http_client();
    let url = format!("http://{}/api/v1/config/reload", s.api);
    let flood = futures::future::join_all((0..SENDERS).map(|_| {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move {
            for _ in 0..RELOADS / SENDERS {
                let res = http.post(&url).send().await.expect("reload request");
                assert_eq!(res.status(), 200, "reload");
            }
        })
    }));
    let flood = tokio::spawn(flood);
    let mut last = None;
    for _ in 0..RELOADS {
        let e = next_event(&mut reader, "config.reload", |_| true).await;
        let ts = e["timestamp"].as_str().unwrap_or_default().to_owned();
        assert!(
            last.as_ref().is_none_or(|l: &String| *l <= ts),
            "out of order"
        );
        last = Some(ts);
    }
    for sender in flood.await.expect("flood") {
        sender.expect("sender");
    }
    // Still connected and answering after the burst.
    ping(&mut reader).await;
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_by_header_query_and_session_cookie() {
    const TOKEN: &str = "s3cret-t0ken";
    let s = server(&format!("token: \"{TOKEN}\""), "");
    let base = format!("http://{}", s.api);
    let status = format!("{base}/api/v1/status");

    // WebSocket: no token, wrong token, header, query.
    assert_eq!(
        ws_connect(s.api, "", &[]).await.err().map(|e| e.0),
        Some(401)
    );
    assert_eq!(
        ws_connect(s.api, "?token=wrong", &[])
            .await
            .err()
            .map(|e| e.0),
        Some(401)
    );
    let bearer = format!("Bearer {TOKEN}");
    ping(
        &mut ws_connect(s.api, "", &[("Authorization", &bearer)])
            .await
            .expect("bearer"),
    )
    .await;
    ping(
        &mut ws_connect(s.api, &format!("?token={TOKEN}"), &[])
            .await
            .expect("query"),
    )
    .await;
    // Auth comes before the origin check, which still applies to an authenticated upgrade.
    let refused = ws_connect(
        s.api,
        &format!("?token={TOKEN}"),
        &[("Origin", "http://evil.example")],
    )
    .await;
    assert_eq!(refused.err().map(|e| e.0), Some(403));

    let dir = tempfile::tempdir().expect("dir");
    let jar = dir.path().join("cookies");
    let jar = jar.to_str().expect("path");
    let (code, body, headers) = tokio::task::block_in_place(|| {
        assert_eq!(http(&[&status]).0, 401);
        assert_eq!(http(&[&format!("{status}?token={TOKEN}")]).0, 200);
        assert_eq!(
            http(&["-H", &format!("Authorization: Bearer {TOKEN}"), &status]).0,
            200
        );
        // Login: wrong token, bad body, then the right one.
        let login = format!("{base}/api/v1/login");
        let json = ["-H", "Content-Type: application/json"];
        let (c, b) = http(&[json[0], json[1], "--data", "{\"token\":\"nope\"}", &login]);
        assert_eq!(c, 401, "{b}");
        let (c, b) = http(&[json[0], json[1], "--data", "{\"token\":5}", &login]);
        assert_eq!(c, 400, "{b}");
        let hdr = dir.path().join("headers");
        let hdr_s = hdr.to_str().expect("path");
        let (c, b) = http(&[
            json[0],
            json[1],
            "--data",
            &format!("{{\"token\":\"{TOKEN}\"}}"),
            "-c",
            jar,
            "-D",
            hdr_s,
            &login,
        ]);
        (c, b, std::fs::read_to_string(&hdr).unwrap_or_default())
    });
    assert_eq!(code, 200, "{body}");
    let set_cookie = headers
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .expect("Set-Cookie")
        .to_owned();
    assert!(set_cookie.contains("switchyard_session="), "{set_cookie}");
    assert!(
        set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Strict"),
        "{set_cookie}"
    );
    assert!(!set_cookie.contains("Secure"), "plain HTTP: {set_cookie}");
    let id = set_cookie
        .split("switchyard_session=")
        .nth(1)
        .and_then(|r| r.split(';').next())
        .expect("id")
        .trim()
        .to_owned();
    assert!(
        id.len() >= 32 && id.chars().all(|c| c.is_ascii_hexdigit()),
        "{id}"
    );

    // The cookie opens the API and the WebSocket.
    tokio::task::block_in_place(|| assert_eq!(http(&["-b", jar, &status]).0, 200));
    let cookie = format!("switchyard_session={id}");
    ping(
        &mut ws_connect(s.api, "", &[("Cookie", &cookie)])
            .await
            .expect("cookie"),
    )
    .await;
    let forged = "switchyard_session=00000000000000000000000000000000";
    assert_eq!(
        ws_connect(s.api, "", &[("Cookie", forged)])
            .await
            .err()
            .map(|e| e.0),
        Some(401)
    );

    // Logout ends the session server-side.
    tokio::task::block_in_place(|| {
        let (c, b) = http(&["-X", "POST", "-b", jar, &format!("{base}/api/v1/logout")]);
        assert_eq!(c, 200, "{b}");
        assert_eq!(http(&["-H", &format!("Cookie: {cookie}"), &status]).0, 401);
    });
    assert_eq!(
        ws_connect(s.api, "", &[("Cookie", &cookie)])
            .await
            .err()
            .map(|e| e.0),
        Some(401)
    );

    // Health stays open; the token never shows in the logs.
    tokio::task::block_in_place(|| assert_eq!(http(&[&format!("{base}/api/v1/health")]).0, 200));
    let all = logs(&s).join("\n");
    assert!(
        !all.contains(TOKEN),
        "the token leaked into the log:\n{all}"
    );
    assert!(all.contains("API login refused: wrong token"));
    assert!(!all.contains("api.token is not set"));
}

#[test]
fn no_token_beyond_loopback_warns() {
    let s = server_listening("0.0.0.0:0", "", "");
    wait_log(&s, |l| {
        l.contains("WARN") && l.contains("api.token is not set")
    });
    let loopback = server("", "");
    std::thread::sleep(Duration::from_millis(200));
    assert!(!logs(&loopback).join("\n").contains("api.token is not set"));
}

fn write_cert(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, Vec<u8>) {
    let ck =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("cert");
    let cert = dir.join("api.crt");
    let key = dir.join("api.key");
    std::fs::write(&cert, ck.cert.pem()).expect("cert");
    std::fs::write(&key, ck.signing_key.serialize_pem()).expect("key");
    (cert, key, ck.cert.der().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_api_with_secure_cookie_and_wss() {
    let certs = tempfile::tempdir().expect("dir");
    let (cert, key, der) = write_cert(certs.path());
    let s = server(
        &format!(
            "token: \"tls-token\", tls: {{ cert: \"{}\", key: \"{}\" }}",
            cert.display(),
            key.display()
        ),
        "",
    );
    let port = s.api.port();
    let url = |p: &str| format!("https://localhost:{port}{p}");
    let resolve = format!("localhost:{port}:127.0.0.1");
    let cacert = cert.to_str().expect("path").to_owned();
    let headers = tokio::task::block_in_place(|| {
        let (c, b) = http(&[
            "--cacert",
            &cacert,
            "--resolve",
            &resolve,
            &url("/api/v1/health"),
        ]);
        assert_eq!(c, 200, "{b}");
        assert_eq!(
            http(&[
                "--cacert",
                &cacert,
                "--resolve",
                &resolve,
                &url("/api/v1/status")
            ])
            .0,
            401
        );
        // Plain HTTP on the TLS port is not served.
        assert_ne!(
            http(&[&format!("http://127.0.0.1:{port}/api/v1/health")]).0,
            200
        );
        let hdr = certs.path().join("headers");
        let (c, b) = http(&[
            "--cacert",
            &cacert,
            "--resolve",
            &resolve,
            "-H",
            "Content-Type: application/json",
            "--data",
            "{\"token\":\"tls-token\"}",
            "-D",
            hdr.to_str().expect("path"),
            &url("/api/v1/login"),
        ]);
        assert_eq!(c, 200, "{b}");
        std::fs::read_to_string(hdr).unwrap_or_default()
    });
    let set_cookie = headers
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .expect("Set-Cookie")
        .to_owned();
    assert!(set_cookie.contains("; Secure"), "{set_cookie}");
    assert!(set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Strict"));

    // wss:// with the token in the query.
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::CertificateDer::from(der))
        .expect("root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(s.api).await.expect("tcp");
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("tls handshake");
    let (mut c, resp) = tokio_tungstenite::client_async(
        format!("wss://localhost:{port}/api/v1/ws?token=tls-token"),
        tls,
    )
    .await
    .expect("wss upgrade");
    assert_eq!(resp.status(), 101);
    ping(&mut c).await;
    let (status, body) = tokio::task::block_in_place(|| {
        http(&[
            "-X",
            "POST",
            "--cacert",
            &cacert,
            "--resolve",
            &resolve,
            "-H",
            "Authorization: Bearer tls-token",
            &url("/api/v1/config/reload"),
        ])
    });
    assert_eq!(status, 200, "{body}");
    next_event(&mut c, "config.reload", |_| true).await;
}

#[test]
fn tls_with_missing_files_refuses_startup() {
    let err = refused_startup(
        "server:\n  http: { listen: \"127.0.0.1:0\" }\n  socks5: { listen: \"127.0.0.1:0\" }\n\
         api: { listen: \"127.0.0.1:0\", tls: { cert: /nonexistent/api.crt, key: /nonexistent/api.key } }\n",
    );
    assert!(err.contains("api.tls.cert /nonexistent/api.crt"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_scrape_changes_with_traffic() {
    let s = server("", "metrics: { enabled: true, listen: \"127.0.0.1:0\" }\n");
    let addr = metrics_addr(&s);
    let before = tokio::task::block_in_place(|| scrape(addr));
    for name in [
        "switchyard_connections_total",
        "switchyard_connections_active",
        "switchyard_bytes_sent_total",
        "switchyard_bytes_received_total",
        "switchyard_requests_total{protocol=\"HTTP\"}",
        "switchyard_requests_total{protocol=\"CONNECT\"}",
        "switchyard_requests_total{protocol=\"SOCKS5\"}",
        "switchyard_responses_total{class=\"2xx\"}",
        "switchyard_backend_connections_total{backend=\"direct\"}",
        "switchyard_backend_errors_total{backend=\"direct\"}",
        "switchyard_backend_up{backend=\"direct\",type=\"direct\"}",
        "switchyard_config_reloads_total",
        "switchyard_events_dropped_total{queue=\"events\"}",
        "switchyard_events_dropped_total{queue=\"request_log\"}",
        "switchyard_core_connections_active{core=\"0\"}",
        "switchyard_core_connections_total{core=\"1\"}",
        "switchyard_websocket_clients",
    ] {
        assert!(
            metric(&before, name).is_some(),
            "{name} missing in\n{before}"
        );
    }
    assert!(before.contains("# TYPE switchyard_connections_total counter"));
    assert_eq!(
        metric(
            &before,
            "switchyard_backend_up{backend=\"direct\",type=\"direct\"}"
        ),
        Some(1.0)
    );

    let mut c = ws(s.api).await;
    tokio::task::block_in_place(|| {
        proxied_request(&s);
        proxied_request(&s);
        // A CONNECT tunnel moves bytes both ways (a plain GET has no request body to count).
        let (status, _) = http(&[
            "-p",
            "-x",
            &format!("http://{}", s.http),
            &format!("http://{}/api/v1/health", s.api),
        ]);
        assert_eq!(status, 200);
        let (status, _) = http(&[
            "-X",
            "POST",
            &format!("http://{}/api/v1/config/reload", s.api),
        ]);
        assert_eq!(status, 200);
        assert_eq!(s.wait_idle(), 0);
    });
    let after = tokio::task::block_in_place(|| scrape(addr));
    let grew = |name: &str, by: f64| {
        let (a, b) = (
            metric(&before, name).unwrap_or(0.0),
            metric(&after, name).unwrap_or(0.0),
        );
        assert!(b >= a + by, "{name}: {a} -> {b}");
    };
    grew("switchyard_connections_total", 3.0);
    grew("switchyard_requests_total{protocol=\"CONNECT\"}", 1.0);
    grew("switchyard_requests_total{protocol=\"HTTP\"}", 2.0);
    grew("switchyard_responses_total{class=\"2xx\"}", 2.0);
    grew("switchyard_bytes_sent_total", 1.0);
    grew("switchyard_bytes_received_total", 1.0);
    grew(
        "switchyard_backend_connections_total{backend=\"direct\"}",
        3.0,
    );
    grew("switchyard_config_reloads_total", 1.0);
    let per_core: f64 = (0..2)
        .map(|i| {
            metric(
                &after,
                &format!("switchyard_core_connections_total{{core=\"{i}\"}}"),
            )
            .unwrap_or(0.0)
        })
        .sum();
    assert_eq!(
        Some(per_core),
        metric(&after, "switchyard_connections_total")
    );
    assert_eq!(metric(&after, "switchyard_connections_active"), Some(0.0));
    assert_eq!(metric(&after, "switchyard_websocket_clients"), Some(1.0));
    ping(&mut c).await;

    let (status, _) = tokio::task::block_in_place(|| http(&[&format!("http://{addr}/other")]));
    assert_eq!(status, 404);
}
