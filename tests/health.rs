//! End-to-end: active backend health checks and failover. The real binary balances a route over
//! two real upstream proxies (tinyproxy); killing one takes it out after its checks fail (seen
//! in the API, the metrics and by a real WebSocket client as `backend.health`), traffic goes to
//! the other, and a restarted proxy is checked back in and gets traffic again. A backend that
//! never answers fails its checks by timeout; without checks, a proxy taken out by failing
//! connects is tried again and comes back; bad settings are refused by `config validate` and by
//! the API.

mod support;

use futures::StreamExt;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use support::{api_call, curl, require, start_nginx, start_peer, start_server, Proc, Server, BIN};
use tokio_tungstenite::tungstenite::Message;

/// A bound on waiting for something that must happen; never an assertion on speed.
const PATIENCE: Duration = Duration::from_secs(30);

const PAGE: &[u8] = b"hello through a checked backend\n";

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn ws(api: SocketAddr) -> Ws {
    let (ws, resp) = tokio_tungstenite::connect_async(format!("ws://{api}/api/v1/ws"))
        .await
        .expect("WebSocket upgrade");
    assert_eq!(resp.status(), 101);
    ws
}

/// Reads the event stream until `backend.health` for `name` with `healthy` arrives.
async fn health_event(ws: &mut Ws, name: &str, healthy: bool) -> Value {
    let wait = async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str()).expect("envelope is JSON");
                    if v["type"] == "backend.health"
                        && v["data"]["name"] == name
                        && v["data"]["healthy"] == healthy
                    {
                        return v;
                    }
                }
                Some(Ok(_)) => {}
                other => panic!("event stream ended: {other:?}"),
            }
        }
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .unwrap_or_else(|_| panic!("no backend.health event {{name: {name}, healthy: {healthy}}}"))
}

/// Polls `probe` until it returns true, within [`PATIENCE`].
fn wait_until(what: &str, mut probe: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !probe() {
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn healthy(server: &Server, backend: &str) -> bool {
    let v = server.api_get(&format!("/api/v1/backends/{backend}"));
    v["healthy"].as_bool().unwrap_or_else(|| panic!("{v}"))
}

/// A tinyproxy on `port` that names itself `name` in its Via header.
fn tinyproxy(program: &Path, dir: &Path, name: &str, port: u16) -> Proc {
    let conf = dir.join(format!("{name}.conf"));
    std::fs::write(
        &conf,
        format!(
            "Port {port}\nListen 127.0.0.1\nTimeout 60\nMaxClients 50\nAllow 127.0.0.1\nLogLevel Error\nViaProxyName \"{name}\"\n"
        ),
    )
    .expect("tinyproxy conf");
    start_peer(program, &["-d", "-c", conf.to_str().expect("path")], port)
}

/// Fetches `url` through the server's HTTP proxy; returns which upstream proxy carried it.
fn carried_by(server: &Server, url: &str) -> String {
    let out = curl(&[
        "-sS",
        "--max-time",
        "20",
        "-D",
        "-",
        "-x",
        &format!("http://{}", server.http),
        url,
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.starts_with("HTTP/1.1 200")
            && text.ends_with(std::str::from_utf8(PAGE).expect("utf8")),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let via = text
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("via:"))
        .unwrap_or_else(|| panic!("no Via header: {text}"));
    ["tp-a", "tp-b"]
        .into_iter()
        .find(|n| via.contains(n))
        .unwrap_or_else(|| panic!("Via names neither proxy: {via}"))
        .to_owned()
}

fn spread(server: &Server, url: &str, n: usize) -> Vec<String> {
    (0..n).map(|_| carried_by(server, url)).collect()
}

/// The metrics listener's address, from its log line.
fn metrics_addr(server: &Server) -> SocketAddr {
    let mut found = None;
    wait_until("the metrics listener's log line", || {
        let logs = server.logs.lock().map(|l| l.clone()).unwrap_or_default();
        found = logs.iter().find_map(|l| {
            let v: Value = serde_json::from_str(l).ok()?;
            (v["fields"]["message"] == "metrics listening")
                .then(|| v["fields"]["listen"].as_str()?.parse().ok())?
        });
        found.is_some()
    });
    found.expect("metrics address")
}

/// The value of one series (`name{labels}`) in a scrape.
fn metric(addr: SocketAddr, series: &str) -> Option<f64> {
    let out = curl(&["-sS", "--max-time", "10", &format!("http://{addr}/metrics")]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// An origin (nginx) and two tinyproxies, tp-a and tp-b, in front of it.
struct ProxyPair {
    origin: support::Nginx,
    program: std::path::PathBuf,
    dir: tempfile::TempDir,
    port_a: u16,
    port_b: u16,
    tp_a: Option<Proc>,
    _tp_b: Proc,
}

impl ProxyPair {
    /// Starts them, or prints why the test skips.
    fn start() -> Option<ProxyPair> {
        let origin = start_nginx(&[("index.html", PAGE)])?;
        let program = require("tinyproxy")?;
        let dir = tempfile::tempdir().expect("tempdir");
        let (port_a, port_b) = (support::free_port(), support::free_port());
        let tp_a = tinyproxy(&program, dir.path(), "tp-a", port_a);
        let tp_b = tinyproxy(&program, dir.path(), "tp-b", port_b);
        Some(ProxyPair {
            origin,
            program,
            dir,
            port_a,
            port_b,
            tp_a: Some(tp_a),
            _tp_b: tp_b,
        })
    }

    /// Kills (by PID) or restarts tp-a on its port.
    fn set_a_running(&mut self, running: bool) {
        self.tp_a = running.then(|| tinyproxy(&self.program, self.dir.path(), "tp-a", self.port_a));
    }

    /// Backends `a` and `b` (with `extra` settings) and a route balancing over them.
    fn config(&self, extra: &str) -> String {
        format!(
            "backends:\n  - {{ name: a, type: http_proxy, http_proxy: {{ address: \"127.0.0.1:{}\" }}{extra} }}\n\
             \x20 - {{ name: b, type: http_proxy, http_proxy: {{ address: \"127.0.0.1:{}\" }}{extra} }}\n\
             routes:\n  - {{ name: pair, domains: [\"127.0.0.1\"], backends: [a, b], load_balance: round_robin }}\n",
            self.port_a, self.port_b
        )
    }
}

#[tokio::test]
async fn a_balanced_route_fails_over_to_the_healthy_proxy_and_back() {
    let Some(mut pair) = ProxyPair::start() else {
        return;
    };
    // Each check is a CONNECT through the proxy to the origin's port.
    let check = format!(
        ", health_check: {{ interval: 1s, timeout: 500ms, target: \"127.0.0.1:{}\", unhealthy_after: 2, healthy_after: 2 }}",
        pair.origin.port
    );
    let server = start_server(&format!(
        "metrics: {{ enabled: true, listen: \"127.0.0.1:0\" }}\n{}",
        pair.config(&check)
    ));
    let metrics = metrics_addr(&server);
    let mut events = ws(server.api).await;
    let url = pair.origin.url("/index.html");

    // Both are checked and pass; both carry traffic.
    wait_until("passed checks of both proxies", || {
        ["a", "b"].iter().all(|b| {
            metric(
                metrics,
                &format!("switchyard_backend_health_check_duration_seconds_count{{backend=\"{b}\",result=\"pass\"}}"),
            )
            .is_some_and(|n| n >= 1.0)
        })
    });
    let seen = spread(&server, &url, 6);
    assert!(
        seen.contains(&"tp-a".to_owned()) && seen.contains(&"tp-b".to_owned()),
        "{seen:?}"
    );

    // tp-a goes away: its checks fail, it is taken out, everything goes through tp-b.
    pair.set_a_running(false);
    health_event(&mut events, "a", false).await;
    assert!(!healthy(&server, "a"));
    assert!(healthy(&server, "b"));
    let stats = server.api_get("/api/v1/stats");
    assert_eq!(
        stats["backends"],
        json!({"total": 2, "healthy": 1}),
        "{stats}"
    );
    let health = server.api_get("/api/v1/health");
    assert_eq!(health["status"], "degraded", "{health}");
    assert!(
        health.to_string().contains("health checks fail"),
        "{health}"
    );
    assert_eq!(
        metric(
            metrics,
            "switchyard_backend_up{backend=\"a\",type=\"httpproxy\"}"
        ),
        Some(0.0)
    );
    assert!(metric(
        metrics,
        "switchyard_backend_health_check_duration_seconds_count{backend=\"a\",result=\"fail\"}"
    )
    .is_some_and(|n| n >= 2.0));
    assert_eq!(spread(&server, &url, 6), vec!["tp-b"; 6]);

    // tp-a is back on its port: two passed checks bring it back into the rotation.
    pair.set_a_running(true);
    health_event(&mut events, "a", true).await;
    assert!(healthy(&server, "a"));
    let stats = server.api_get("/api/v1/stats");
    assert_eq!(stats["backends"]["healthy"], 2, "{stats}");
    assert_eq!(server.api_get("/api/v1/health")["status"], "healthy");
    let seen = spread(&server, &url, 6);
    assert!(
        seen.contains(&"tp-a".to_owned()) && seen.contains(&"tp-b".to_owned()),
        "{seen:?}"
    );
}

#[test]
fn without_checks_a_proxy_out_for_failing_connects_is_retried_and_comes_back() {
    let Some(mut pair) = ProxyPair::start() else {
        return;
    };
    let server = start_server(&pair.config(""));
    let url = pair.origin.url("/index.html");
    let proxy = format!("http://{}", server.http);
    let fetch = || {
        curl(&[
            "-s",
            "--max-time",
            "20",
            "-o",
            "/dev/null",
            "-x",
            &proxy,
            &url,
        ]);
    };
    pair.set_a_running(false);
    // Only traffic tells: failed connects through a take it out.
    wait_until("a taken out by failing connects", || {
        fetch();
        !healthy(&server, "a")
    });
    assert_eq!(spread(&server, &url, 4), vec!["tp-b"; 4]);
    // Back on its port: a later connection tries it again, succeeds, and it is back.
    pair.set_a_running(true);
    wait_until("a tried again and healthy", || {
        fetch();
        std::thread::sleep(Duration::from_millis(400));
        healthy(&server, "a")
    });
    let seen = spread(&server, &url, 6);
    assert!(
        seen.contains(&"tp-a".to_owned()) && seen.contains(&"tp-b".to_owned()),
        "{seen:?}"
    );
}

/// Accepts connections and never answers on them (an upstream proxy that hangs).
fn start_tarpit() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    port
}

#[tokio::test]
async fn a_backend_that_never_answers_fails_its_checks_by_timeout() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let tarpit = start_tarpit();
    let target = format!("127.0.0.1:{}", origin.port);
    let server = start_server(&format!(
        "backends:\n  - {{ name: hung, type: http_proxy, http_proxy: {{ address: \"127.0.0.1:{tarpit}\" }}, \
         health_check: {{ interval: 1s, timeout: 300ms, target: \"{target}\" }} }}\n\
         \x20 - {{ name: straight, type: direct, health_check: {{ interval: 1s, timeout: 300ms, target: \"{target}\" }} }}\n\
         \x20 - {{ name: idle, type: http_proxy, enabled: false, http_proxy: {{ address: \"127.0.0.1:{tarpit}\" }}, \
         health_check: {{ interval: 1s, timeout: 300ms, target: \"{target}\" }} }}\n\
         routes:\n  - {{ name: pair, domains: [\"127.0.0.1\"], backends: [hung, straight] }}\n"
    ));
    let mut events = ws(server.api).await;
    // Never checked before: the first result decides, a timeout takes it out.
    health_event(&mut events, "hung", false).await;
    assert!(!healthy(&server, "hung"));
    assert!(healthy(&server, "straight"));
    let logs = server.logs.lock().map(|l| l.join("\n")).unwrap_or_default();
    assert!(
        logs.contains("timed out") && logs.contains("\"backend\":\"hung\""),
        "the reason is logged: {logs}"
    );
    // A disabled backend is not checked.
    assert!(
        !logs.contains("\"backend\":\"idle\""),
        "the disabled backend was checked: {logs}"
    );
    // The test endpoint gives the same verdict for the same path.
    let (status, v) = api_call(
        &server,
        "POST",
        "/api/v1/backends/hung/test",
        Some(&json!({"target": target, "timeout": "300ms"}).to_string()),
        None,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["status"].as_str(), v["healthy"].as_bool()),
        (Some("failed"), Some(false)),
        "{v}"
    );
    assert!(
        v["error"].as_str().is_some_and(|e| e.contains("timed out")),
        "{v}"
    );
    // Every request goes the direct way, none waits on the hung proxy.
    for _ in 0..4 {
        let out = curl(&[
            "-sS",
            "--max-time",
            "5",
            "-x",
            &format!("http://{}", server.http),
            &origin.url("/index.html"),
        ]);
        assert_eq!(out.stdout, PAGE, "{}", String::from_utf8_lossy(&out.stderr));
    }
}

#[tokio::test]
async fn backends_created_through_the_api_are_checked() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let Some(microsocks) = require("microsocks") else {
        return;
    };
    let socks_port = support::free_port();
    let socks = start_peer(
        &microsocks,
        &["-i", "127.0.0.1", "-p", &socks_port.to_string()],
        socks_port,
    );
    let server = start_server("");
    let mut events = ws(server.api).await;
    let target = format!("127.0.0.1:{}", origin.port);
    let create = |body: Value| {
        api_call(
            &server,
            "POST",
            "/api/v1/backends",
            Some(&body.to_string()),
            None,
        )
    };
    // Settings the configuration refuses are a 400 naming the key.
    let (status, v) = create(json!({"name": "s", "type": "socks5",
        "socks5": {"address": format!("127.0.0.1:{socks_port}")},
        "health_check": {"interval": "1s", "timeout": "1s", "target": target}}));
    assert_eq!(status, 400, "{v}");
    assert!(
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("health_check.timeout")),
        "{v}"
    );
    let (status, v) = create(json!({"name": "s", "type": "socks5",
        "socks5": {"address": format!("127.0.0.1:{socks_port}")},
        "health_check": {"every": "1s"}}));
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["code"], "INVALID_HEALTH_CHECK", "{v}");

    let (status, v) = create(json!({"name": "s", "type": "socks5",
        "socks5": {"address": format!("127.0.0.1:{socks_port}")},
        "health_check": {"interval": "1s", "timeout": "500ms", "target": target, "unhealthy_after": 1}}));
    assert_eq!(status, 201, "{v}");
    let (status, v) = api_call(
        &server,
        "POST",
        "/api/v1/backends/s/test",
        Some(&json!({ "target": target }).to_string()),
        None,
    );
    assert_eq!((status, v["healthy"].as_bool()), (200, Some(true)), "{v}");
    // The SOCKS5 proxy goes away: the next check takes its backend out.
    drop(socks);
    health_event(&mut events, "s", false).await;
    assert!(!healthy(&server, "s"));
    let health = server.api_get("/api/v1/health");
    assert_eq!(health["status"], "degraded", "{health}");
}

/// `switchyard config validate FILE`: (valid, output).
fn validate(file: &Path) -> (bool, String) {
    let out = std::process::Command::new(BIN)
        .args(["config", "validate"])
        .arg(file)
        .output()
        .expect("run");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn bad_health_check_settings_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "server:\n  health_check: { interval: 5s, timeout: 5s, healthy_after: 0 }\n\
         backends:\n  - { name: a, type: direct, health_check: { interval: 200ms, timeout: 100ms } }\n\
         \x20 - { name: b, type: direct, health_check: { interval: 1s } }\n\
         \x20 - { name: c, type: direct, health_check: { target: \"no-port\" } }\n",
    )
    .expect("write");
    let (valid, text) = validate(&bad);
    assert!(!valid);
    for wanted in [
        "server.health_check.timeout",
        "server.health_check.healthy_after",
        "backends[0].health_check.interval",
        "backends[1].health_check.timeout (from server.health_check)",
        "backends[2].health_check.target",
    ] {
        assert!(text.contains(wanted), "{wanted} missing: {text}");
    }
    let unknown = dir.path().join("unknown.yaml");
    std::fs::write(
        &unknown,
        "backends:\n  - { name: a, type: direct, health_check: { intervall: 5s } }\n",
    )
    .expect("write");
    let (valid, text) = validate(&unknown);
    assert!(!valid);
    assert!(text.contains("intervall"), "{text}");
}
