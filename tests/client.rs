//! End-to-end tests of `switchyard client`: the real binary as client and as server, nginx as the
//! origin, curl as the proxy client, all on loopback with random ports and temp dirs.

mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{
    curl, free_port, spawn_with_listeners, start_nginx, start_server_with_file, Nginx, Proc,
    Server, BIN,
};

/// A running `switchyard client` and the addresses it reported.
struct Client {
    _proc: Proc,
    http: SocketAddr,
    socks5: SocketAddr,
    api: SocketAddr,
    dir: tempfile::TempDir,
    logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

fn client_yaml(body: &str) -> String {
    format!(
        "proxy:\n  http: {{listen: \"127.0.0.1:0\"}}\n  socks5: {{listen: \"127.0.0.1:0\"}}\n\
         api: {{listen: \"127.0.0.1:0\"}}\nlogging: {{level: info, format: json}}\n{body}"
    )
}

fn start_client(yaml: &str) -> Client {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("client.yaml"), yaml).expect("write config");
    start_client_in(dir)
}

/// Starts a client on `dir/client.yaml` with `dir/data` as its data directory.
fn start_client_in(dir: tempfile::TempDir) -> Client {
    let mut cmd = Command::new(BIN);
    cmd.arg("client")
        .arg("--config")
        .arg(dir.path().join("client.yaml"))
        .arg("--data-dir")
        .arg(dir.path().join("data"));
    let started = spawn_with_listeners(
        cmd,
        "switchyard client",
        &[
            "client HTTP proxy listening",
            "client SOCKS5 proxy listening",
            "client API listening",
        ],
    );
    let [http, socks5, api] = started.addrs[..] else {
        unreachable!()
    };
    Client {
        _proc: started.proc,
        http,
        socks5,
        api,
        dir,
        logs: started.logs,
    }
}

/// (status, body) of a request with curl; the body as JSON when it is JSON.
fn call_raw(api: SocketAddr, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut args: Vec<String> = [
        "-sS",
        "--max-time",
        "30",
        "-X",
        method,
        "-w",
        "\n%{http_code}",
    ]
    .map(String::from)
    .to_vec();
    if let Some(b) = body {
        args.extend([
            "-H".into(),
            "Content-Type: application/json".into(),
            "--data-binary".into(),
            b.into(),
        ]);
    }
    args.push(format!("http://{api}{path}"));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = curl(&refs);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn call(api: SocketAddr, method: &str, path: &str, body: Option<&str>) -> (u16, serde_json::Value) {
    let (status, text) = call_raw(api, method, path, body);
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
    )
}

impl Client {
    fn get(&self, path: &str) -> serde_json::Value {
        let (status, v) = call(self.api, "GET", path, None);
        assert_eq!(status, 200, "GET {path}: {v}");
        v
    }

    fn log_text(&self) -> String {
        self.logs.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// Polls `GET /api/v1/health` until it reports `want` (bounded: 20 s).
    fn wait_health(&self, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.get("/api/v1/health")["status"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "health stayed {got}, wanted {want}; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Polls the debug entries until `n` for `host` exist (bounded) and returns them all.
    fn debug_entries_for(&self, host: &str, n: usize) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let all = self.get("/api/v1/debug/entries");
            let found: Vec<serde_json::Value> = all
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| e["host"].as_str().is_some_and(|h| h.contains(host)))
                .cloned()
                .collect();
            if found.len() >= n || Instant::now() > deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A server on fixed loopback ports with its request log on (restartable on the same ports).
fn start_gateway(http_port: u16, socks_port: u16) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let config_path = dir.path().join("server.yaml");
    let yaml = format!(
        "server:\n  http: {{ listen: \"127.0.0.1:{http_port}\" }}\n  socks5: {{ listen: \"127.0.0.1:{socks_port}\" }}\n  cores: 1\n\
         api: {{ listen: \"127.0.0.1:0\", enable_request_log: true }}\nlogging: {{ level: info, format: json }}\n"
    );
    std::fs::write(&config_path, yaml).expect("write config");
    start_server_with_file(dir, config_path)
}

fn gateway() -> Server {
    start_gateway(free_port(), free_port())
}

/// (host, protocol) of every request the server handled: its request log (a record is written
/// when the connection closes) plus its live connections (the client keeps tunnels pooled).
fn server_saw(server: &Server) -> Vec<(String, String)> {
    let requests = server.api_get("/api/v1/requests")["requests"].clone();
    let live = server.api_get("/api/v1/connections")["connections"].clone();
    [requests, live]
        .iter()
        .filter_map(|v| v.as_array())
        .flatten()
        .filter_map(|r| {
            Some((
                r["host"].as_str()?.to_owned(),
                r["protocol"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

/// Waits (bounded) until `want` holds for what the server saw, and returns it.
fn wait_server_saw(
    server: &Server,
    want: impl Fn(&[(String, String)]) -> bool,
) -> Vec<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = server_saw(server);
        if want(&seen) || Instant::now() > deadline {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Proxied connections the server finished (its request log). The client's probes connect too,
/// so the server's connection counter would count them; they are no proxy requests.
fn server_connections(server: &Server) -> u64 {
    server.api_get("/api/v1/requests")["requests"]
        .as_array()
        .map_or(0, |r| r.len() as u64)
}

/// Waits (bounded) until the server logged at least `n` proxied connections; returns the count.
fn wait_server_connections(server: &Server, n: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = server_connections(server);
        if c >= n || Instant::now() > deadline {
            return c;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn server_entry(name: &str, server: &Server, protocol: &str) -> String {
    let addr = if protocol == "SOCKS5" {
        server.socks5
    } else {
        server.http
    };
    format!("  - {{name: {name}, id: {name}-id, address: \"{addr}\", protocol: {protocol}}}\n")
}

fn origin() -> Option<Nginx> {
    start_nginx(&[("hello.txt", b"hello through switchyard")])
}

fn curl_via_http(client: &Client, url: &str) -> std::process::Output {
    curl(&[
        "-sS",
        "--max-time",
        "20",
        "-x",
        &format!("http://{}", client.http),
        url,
    ])
}

fn curl_via_socks(client: &Client, url: &str) -> std::process::Output {
    curl(&[
        "-sS",
        "--max-time",
        "20",
        "--socks5-hostname",
        &client.socks5.to_string(),
        url,
    ])
}

#[test]
fn http_and_socks5_reach_the_origin_through_the_server() {
    let Some(nginx) = origin() else { return };
    let server = gateway();
    let yaml = client_yaml(&format!(
        "servers:\n{}{}",
        server_entry("http-gw", &server, "HTTP"),
        server_entry("socks-gw", &server, "SOCKS5")
    ));
    let client = start_client(&yaml);
    let url = nginx.url("/hello.txt");
    for out in [curl_via_http(&client, &url), curl_via_socks(&client, &url)] {
        assert!(
            out.status.success(),
            "curl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, b"hello through switchyard");
    }
    // The server saw both requests: the plain-HTTP one forwarded as an absolute-form request,
    // the SOCKS5 one as a CONNECT tunnel (the client's HTTP server leg).
    let origin_host = format!("127.0.0.1:{}", nginx.port);
    let seen = wait_server_saw(&server, |s| {
        s.iter().any(|(h, p)| *h == origin_host && p == "HTTP")
            && s.iter().any(|(h, p)| *h == origin_host && p == "CONNECT")
    });
    assert!(
        seen.iter().any(|(h, p)| *h == origin_host && p == "HTTP")
            && seen
                .iter()
                .any(|(h, p)| *h == origin_host && p == "CONNECT"),
        "the server saw: {seen:?}"
    );
    let entries = client.debug_entries_for("127.0.0.1", 2);
    assert!(entries.len() >= 2, "{entries:?}");
    for e in &entries {
        assert_eq!(e["action"], "server", "{e}");
        assert_eq!(e["backend"], "http-gw", "{e}");
        assert_eq!(e["error"], "", "{e}");
    }
    let status = client.get("/api/v1/status");
    assert_eq!(status["server_connected"], true);
    assert_eq!(status["server_address"], server.http.to_string());
    assert!(
        status["bytes_sent"].as_u64().unwrap_or(0) >= 2 * 24,
        "{status}"
    );
    assert!(
        status["bytes_received"].as_u64().unwrap_or(0) > 0,
        "{status}"
    );
    assert_eq!(status["http_proxy"], client.http.to_string());
    let servers = client.get("/api/v1/servers");
    assert_eq!(servers[0]["status"], "connected", "{servers}");
    assert_eq!(servers[0]["protocol"], "HTTP");
    assert_eq!(servers[1]["protocol"], "SOCKS5");

    // Selecting the SOCKS5 entry moves the server leg to SOCKS5 (the server logs a SOCKS5 request).
    let (st, v) = call(
        client.api,
        "POST",
        "/api/v1/server/select",
        Some(r#"{"server":"socks-gw"}"#),
    );
    assert_eq!(
        (st, &v["status"]),
        (200, &serde_json::json!("selected")),
        "{v}"
    );
    let out = curl_via_http(&client, &url);
    assert!(out.status.success());
    let seen = wait_server_saw(&server, |s| s.iter().any(|(_, p)| p == "SOCKS5"));
    assert!(
        seen.iter().any(|(h, p)| *h == origin_host && p == "SOCKS5"),
        "the SOCKS5 server leg was not used: {seen:?}"
    );
}

#[test]
fn direct_routes_bypass_the_server_and_routes_test_answers() {
    let Some(nginx) = origin() else { return };
    let server = gateway();
    let yaml = client_yaml(&format!(
        "servers:\n{}",
        server_entry("gw", &server, "HTTP")
    ));
    let client = start_client(&yaml);

    // A bad pattern is refused; an unknown route cannot be deleted.
    let (st, _) = call(
        client.api,
        "POST",
        "/api/v1/routes",
        Some(r#"{"name":"bad","domains":["bad pattern"],"action":"direct"}"#),
    );
    assert_eq!(st, 400);
    let (st, _) = call(
        client.api,
        "POST",
        "/api/v1/routes",
        Some(r#"{"name":"bad","domains":["x.example"],"action":"vpn"}"#),
    );
    assert_eq!(st, 400);
    let (st, _) = call(client.api, "DELETE", "/api/v1/routes/nope", None);
    assert_eq!(st, 404);

    let (st, v) = call(
        client.api,
        "POST",
        "/api/v1/routes",
        Some(r#"{"name":"local","domains":["127.0.0.1","*.lan"],"action":"direct","priority":5}"#),
    );
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["status"], "created");
    let (st, _) = call(
        client.api,
        "POST",
        "/api/v1/routes",
        Some(r#"{"name":"local","domains":["x.lan"],"action":"direct"}"#),
    );
    assert_eq!(st, 409);
    let routes = client.get("/api/v1/routes");
    assert_eq!(
        routes[0]["patterns"],
        serde_json::json!(["127.0.0.1", "*.lan"])
    );

    let t = client.get("/api/v1/routes/test?domain=nas.lan");
    assert_eq!(
        (t["action"].as_str(), t["matched_route"].as_str()),
        (Some("direct"), Some("local"))
    );
    let t = client.get("/api/v1/routes/test?domain=example.org");
    assert_eq!(t["action"], "server");
    assert!(t.get("matched_route").is_none(), "{t}");

    let before = server_connections(&server);
    let url = nginx.url("/hello.txt");
    for out in [curl_via_http(&client, &url), curl_via_socks(&client, &url)] {
        assert!(
            out.status.success(),
            "curl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, b"hello through switchyard");
    }
    let entries = client.debug_entries_for("127.0.0.1", 2);
    assert!(entries.len() >= 2, "{entries:?}");
    assert!(
        entries.iter().all(|e| e["action"] == "direct"),
        "{entries:?}"
    );
    assert_eq!(
        before,
        server_connections(&server),
        "a direct route reached the server"
    );
    assert!(server_saw(&server).is_empty());

    // Removing the route sends the origin through the server again.
    let (st, v) = call(client.api, "DELETE", "/api/v1/routes/local", None);
    assert_eq!((st, &v["status"]), (200, &serde_json::json!("removed")));
    assert!(curl_via_socks(&client, &url).status.success());
    assert_eq!(wait_server_connections(&server, before + 1), before + 1);
}

#[test]
fn server_down_is_degraded_with_502_and_socks_failure_then_healthy_again() {
    let Some(nginx) = origin() else { return };
    let (http_port, socks_port) = (free_port(), free_port());
    let server = start_gateway(http_port, socks_port);
    let yaml = client_yaml(&format!(
        "server: {{probe_interval: 200ms, connect_timeout: 2s}}\nservers:\n{}",
        server_entry("gw", &server, "HTTP")
    ));
    let client = start_client(&yaml);
    client.wait_health("healthy");
    let url = nginx.url("/hello.txt");
    assert!(curl_via_http(&client, &url).status.success());

    drop(server); // killed by PID
    client.wait_health("degraded");
    let servers = client.get("/api/v1/servers");
    assert_eq!(servers[0]["status"], "offline", "{servers}");
    let out = curl(&[
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "20",
        "-x",
        &format!("http://{}", client.http),
        &url,
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "502");
    let out = curl_via_socks(&client, &url);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("SOCKS") || stderr.contains("socks"),
        "{stderr}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let errors = loop {
        let e = client.get("/api/v1/debug/errors");
        if e.as_array().is_some_and(|a| a.len() >= 2) || Instant::now() > deadline {
            break e;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let errors = errors.as_array().cloned().unwrap_or_default();
    assert!(errors.len() >= 2, "{errors:?}");
    assert!(
        errors
            .iter()
            .all(|e| e["action"] == "server" && !e["error"].as_str().unwrap_or("").is_empty()),
        "{errors:?}"
    );

    let _server = start_gateway(http_port, socks_port);
    client.wait_health("healthy");
    let out = curl_via_http(&client, &url);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn selecting_another_server_moves_traffic() {
    let Some(nginx) = origin() else { return };
    let (a, b) = (gateway(), gateway());
    let yaml = client_yaml(&format!(
        "servers:\n{}{}",
        server_entry("a", &a, "HTTP"),
        server_entry("b", &b, "HTTP")
    ));
    let client = start_client(&yaml);
    let url = nginx.url("/hello.txt");
    // SOCKS5 connections are tunnels (never pooled): one server connection each.
    let (a0, b0) = (server_connections(&a), server_connections(&b));
    assert!(curl_via_socks(&client, &url).status.success());
    assert_eq!(wait_server_connections(&a, a0 + 1), a0 + 1);

    let (st, _) = call(
        client.api,
        "POST",
        "/api/v1/server/select",
        Some(r#"{"server":"nope"}"#),
    );
    assert_eq!(st, 404);
    let (st, _) = call(client.api, "POST", "/api/v1/servers/nope/select", None);
    assert_eq!(st, 404);
    let (st, v) = call(
        client.api,
        "POST",
        "/api/v1/server/select",
        Some(r#"{"server":"b"}"#),
    );
    assert_eq!(st, 200, "{v}");
    assert!(curl_via_socks(&client, &url).status.success());
    assert_eq!(wait_server_connections(&b, b0 + 1), b0 + 1);
    assert_eq!(
        server_connections(&a),
        a0 + 1,
        "a got traffic after b was selected"
    );
    assert_eq!(client.get("/api/v1/settings")["current_server"], "b");

    // By the older form's id.
    let (st, v) = call(client.api, "POST", "/api/v1/servers/a-id/select", None);
    assert_eq!((st, &v["status"]), (200, &serde_json::json!("ok")));
    assert!(curl_via_socks(&client, &url).status.success());
    assert_eq!(wait_server_connections(&a, a0 + 2), a0 + 2);

    // Disconnected: everything goes direct; connected again: through the selected server.
    let (st, v) = call(client.api, "POST", "/api/v1/disconnect", None);
    assert_eq!(
        (st, &v["status"]),
        (200, &serde_json::json!("disconnected"))
    );
    assert_eq!(client.get("/api/v1/status")["server_connected"], false);
    assert!(curl_via_socks(&client, &url).status.success());
    let entries = client.debug_entries_for("127.0.0.1", 4);
    let actions: Vec<&str> = entries
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert_eq!(
        actions,
        ["server", "server", "server", "direct"],
        "{entries:?}"
    );
    assert_eq!(server_connections(&a) + server_connections(&b), a0 + b0 + 3);
    let (st, v) = call(client.api, "POST", "/api/v1/connect", None);
    assert_eq!((st, &v["status"]), (200, &serde_json::json!("connected")));
    assert!(curl_via_socks(&client, &url).status.success());
    assert_eq!(wait_server_connections(&a, a0 + 3), a0 + 3);
}

#[test]
fn config_put_validate_export_import_and_persisted_state() {
    let server = gateway();
    let yaml = client_yaml(&format!(
        "servers:\n{}",
        server_entry("gw", &server, "HTTP")
    ));
    let client = start_client(&yaml);
    let original = client.get("/api/v1/config");
    assert_eq!(original["routing"]["default_action"], "server");
    assert_eq!(original["mesh"]["connection"]["keep_alive_interval"], "25s");

    // Invalid: refused with {valid:false, errors} and nothing changes.
    for bad in [
        r#"{"routing":{"routes":[{"name":"r","patterns":["bad pattern"],"action":"direct"}]}}"#,
        r#"{"proxy":{"htp":{}}}"#,
        r#"{"servers":[{"name":"x","address":"nowhere"}]}"#,
        "not json",
    ] {
        let (st, v) = call(client.api, "PUT", "/api/v1/config", Some(bad));
        assert_eq!(st, 400, "{bad}: {v}");
        assert_eq!(v["valid"], false, "{v}");
        assert!(v["errors"].as_array().is_some_and(|e| !e.is_empty()), "{v}");
    }
    assert_eq!(client.get("/api/v1/config"), original);

    // Validate warns about restart-required changes and changes nothing.
    let (st, v) = call(
        client.api,
        "POST",
        "/api/v1/config/validate",
        Some(r#"{"api":{"listen":"127.0.0.1:1"}}"#),
    );
    assert_eq!((st, &v["valid"]), (200, &serde_json::json!(true)), "{v}");
    assert!(
        v["warnings"][0]
            .as_str()
            .unwrap_or("")
            .contains("api.listen"),
        "{v}"
    );

    // A partial PUT: one restart field, one hot key (durations as strings and nanoseconds).
    let (st, v) = call(
        client.api,
        "PUT",
        "/api/v1/config",
        Some(
            r#"{"proxy":{"socks5":{"listen":"127.0.0.1:1"}},"routing":{"default_action":"direct"},"mesh":{"stun":{"timeout":1500000000}}}"#,
        ),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["status"], "updated");
    assert_eq!(v["restart_required"], true);
    assert_eq!(
        v["restart_fields"],
        serde_json::json!(["proxy.socks5.listen"])
    );
    let now = client.get("/api/v1/config");
    assert_eq!(now["routing"]["default_action"], "direct");
    assert_eq!(now["mesh"]["stun"]["timeout"], "1.5s");
    assert_eq!(now["servers"], original["servers"]);
    assert_eq!(
        client.get("/api/v1/routes/test?domain=a.example")["action"],
        "direct"
    );
    // Saved to the file.
    let saved = std::fs::read_to_string(client.dir.path().join("client.yaml")).expect("saved");
    assert!(saved.contains("default_action: direct"), "{saved}");

    // Export → import round trip, YAML and JSON.
    for format in ["yaml", "json"] {
        let out = curl(&[
            "-sS",
            "-D",
            "-",
            "-X",
            "POST",
            &format!("http://{}/api/v1/config/export?format={format}", client.api),
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").expect("head");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-disposition: attachment"),
            "{head}"
        );
        let (st, v) = call(
            client.api,
            "PUT",
            "/api/v1/config",
            Some(r#"{"routing":{"default_action":"server"}}"#),
        );
        assert_eq!(st, 200, "{v}");
        let (st, v) = call_raw(
            client.api,
            "POST",
            &format!("/api/v1/config/import?format={format}"),
            Some(body),
        );
        assert_eq!(st, 200, "{v}");
        let v: serde_json::Value = serde_json::from_str(&v).expect("json");
        assert_eq!(v["status"], "imported");
        assert_eq!(client.get("/api/v1/config"), now, "{format} round trip");
    }
    let (st, v) = call_raw(
        client.api,
        "POST",
        "/api/v1/config/import?format=yaml",
        Some("proxy: [1"),
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(client.get("/api/v1/config"), now);

    // Quick settings persist in the data directory across a restart.
    let (st, _) = call(
        client.api,
        "POST",
        "/api/v1/settings",
        Some(
            r#"{"auto_connect":false,"start_minimized":true,"show_notifications":true,"vpn_enabled":false,"system_proxy_enabled":false,"current_server":"gw"}"#,
        ),
    );
    assert_eq!(st, 200);
    let (st, _) = call(
        client.api,
        "POST",
        "/api/v1/settings",
        Some(r#"{"current_server":"nope"}"#),
    );
    assert_eq!(st, 404);
    let dir = tempfile::tempdir().expect("tempdir");
    let data: PathBuf = client.dir.path().join("data");
    assert!(data.join("settings.json").exists());
    // Restart with the saved configuration file and data directory (listen addresses back to 0).
    let mut saved: serde_json::Value = client.get("/api/v1/config");
    saved["proxy"]["socks5"]["listen"] = "127.0.0.1:0".into();
    std::fs::write(
        dir.path().join("client.yaml"),
        serde_json::to_string(&saved).expect("json"),
    )
    .expect("write");
    copy_dir(&data, &dir.path().join("data"));
    drop(client);
    let again = start_client_in(dir);
    let s = again.get("/api/v1/settings");
    assert_eq!(
        (s["start_minimized"].as_bool(), s["auto_connect"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(
        again.get("/api/v1/status")["server_connected"],
        false,
        "auto_connect off"
    );
    assert_eq!(again.get("/api/v1/vpn/status")["status"], "disabled");
    assert_eq!(again.get("/api/v1/mesh/status")["status"], "disabled");
    let (st, _) = call(again.api, "GET", "/api/v1/openapi.json", None);
    assert_eq!(st, 200);
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read dir").flatten() {
        std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
    }
}

/// Issue 14 (idle memory): like `server`, the client gives back the code pages start-up mapped
/// once it is up, and its proxies still work afterwards (their code faults back in).
#[test]
fn start_up_code_pages_are_given_back_and_the_proxies_still_work() {
    let Some(nginx) = origin() else { return };
    let client = start_client(&client_yaml(""));
    support::assert_start_up_code_pages_released(&client.logs, client._proc.child.id());
    let out = curl_via_http(&client, &nginx.url("/hello.txt"));
    assert_eq!(out.stdout, b"hello through switchyard");
    let out = curl_via_socks(&client, &nginx.url("/hello.txt"));
    assert_eq!(out.stdout, b"hello through switchyard");
}

#[test]
fn without_servers_everything_goes_direct_and_the_token_guards_the_api() {
    let Some(nginx) = origin() else { return };
    let client = start_client(&client_yaml("").replace(
        "api: {listen: \"127.0.0.1:0\"}",
        "api: {listen: \"127.0.0.1:0\", token: s3cret}",
    ));
    assert!(
        client.log_text().contains("every destination goes direct"),
        "{}",
        client.log_text()
    );
    let out = curl_via_http(&client, &nginx.url("/hello.txt"));
    assert_eq!(out.stdout, b"hello through switchyard");
    let (st, _) = call(client.api, "GET", "/api/v1/status", None);
    assert_eq!(st, 401);
    let (st, v) = call(client.api, "GET", "/api/v1/health", None);
    assert_eq!((st, &v["status"]), (200, &serde_json::json!("healthy")));
    let (st, _) = call(client.api, "GET", "/api/v1/status?token=s3cret", None);
    assert_eq!(st, 200);
    let (st, _) = call(client.api, "POST", "/api/v1/connect?token=s3cret", None);
    assert_eq!(st, 409, "no server to connect to");

    // A browser session (the login cookie) must send the session's CSRF token on state changes.
    let jar = client.dir.path().join("cookies.txt");
    let jar = jar.to_string_lossy();
    let base = format!("http://{}", client.api);
    // (status, response head) of a cookie-authenticated curl request
    let with_cookie = |method: &str, path: &str, extra: &[&str]| {
        let mut args = vec!["-sS", "--max-time", "30", "-o", "/dev/null", "-D", "-"];
        args.extend(["-c", &jar, "-b", &jar, "-X", method]);
        args.extend_from_slice(extra);
        let url = format!("{base}{path}");
        args.push(&url);
        let head = String::from_utf8_lossy(&curl(&args).stdout).into_owned();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
            .unwrap_or(0);
        (status, head)
    };
    let (st, head) = with_cookie(
        "POST",
        "/api/v1/login",
        &[
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            r#"{"token":"s3cret"}"#,
        ],
    );
    assert_eq!(st, 200, "{head}");
    let (st, head) = with_cookie("POST", "/api/v1/connect", &[]);
    assert_eq!(
        st, 403,
        "a cookie-only state change without the CSRF token: {head}"
    );
    let (st, head) = with_cookie("GET", "/api/v1/status", &[]);
    assert_eq!(st, 200, "{head}");
    let csrf = head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("x-csrf-token:"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
        .expect("a cookie-authenticated answer carries X-CSRF-Token");
    let header = format!("X-CSRF-Token: {csrf}");
    let (st, head) = with_cookie("POST", "/api/v1/connect", &["-H", &header]);
    assert_eq!(st, 409, "with the CSRF token the request is served: {head}");
}

/// Opens `GET /api/v1/logs/stream` on a raw socket; returns the reader after the response head
/// and the status code.
fn open_log_stream(api: SocketAddr) -> (u16, BufReader<std::net::TcpStream>) {
    use std::io::Write as _;
    let mut s = std::net::TcpStream::connect(api).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    write!(
        s,
        "GET /api/v1/logs/stream HTTP/1.1\r\nHost: {api}\r\nAccept: text/event-stream\r\n\r\n"
    )
    .expect("request");
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).expect("status line");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    loop {
        line.clear();
        r.read_line(&mut line).expect("head");
        if line.trim().is_empty() {
            break;
        }
    }
    (status, r)
}

/// The next `data:` message of an event stream (chunk sizes and comments skipped).
fn next_event(r: &mut BufReader<std::net::TcpStream>) -> serde_json::Value {
    let mut line = String::new();
    loop {
        line.clear();
        let n = r.read_line(&mut line).expect("read event stream");
        assert!(n > 0, "event stream ended");
        if let Some(data) = line.trim_end().strip_prefix("data: ") {
            return serde_json::from_str(data).expect("event JSON");
        }
    }
}

#[test]
fn log_stream_sends_connected_then_live_entries_and_refuses_the_101st() {
    let client = start_client(&client_yaml(""));
    let mut streams = Vec::new();
    for i in 0..100 {
        let (status, mut r) = open_log_stream(client.api);
        assert_eq!(status, 200, "subscriber {i}");
        assert_eq!(next_event(&mut r), serde_json::json!({"type": "connected"}));
        streams.push(r);
    }
    let (status, _) = open_log_stream(client.api);
    assert_eq!(status, 503, "the 101st subscriber");
    let memory = client.get("/api/v1/debug/memory");
    assert_eq!(memory["log_subscribers"], 100, "{memory}");

    // A live entry: disconnecting logs at info level.
    let (st, _) = call(client.api, "POST", "/api/v1/disconnect", None);
    assert_eq!(st, 200);
    let first = &mut streams[0];
    let entry = loop {
        let e = next_event(first);
        if e["message"]
            .as_str()
            .is_some_and(|m| m.contains("disconnected"))
        {
            break e;
        }
    };
    assert_eq!(entry["level"], "info", "{entry}");
    let page = client.get("/api/v1/logs?limit=5&level=info");
    assert!(
        page["entries"].as_array().is_some_and(|e| !e.is_empty()),
        "{page}"
    );
}

/// Reads a protobuf varint at `*i`.
fn varint(b: &[u8], i: &mut usize) -> u64 {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = b[*i];
        *i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
    }
    v
}

/// Top-level fields of a protobuf message: (field number, length-delimited payload or empty).
fn protobuf_fields(b: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let key = varint(b, &mut i);
        let payload = match key & 7 {
            0 => {
                varint(b, &mut i);
                Vec::new()
            }
            1 => {
                i += 8;
                Vec::new()
            }
            2 => {
                let len = usize::try_from(varint(b, &mut i)).expect("len");
                let p = b[i..i + len].to_vec();
                i += len;
                p
            }
            5 => {
                i += 4;
                Vec::new()
            }
            other => panic!("wire type {other} in a pprof profile"),
        };
        out.push((key >> 3, payload));
    }
    assert_eq!(i, b.len(), "protobuf ends inside a field");
    out
}

#[test]
fn cpu_profile_is_gzipped_pprof_protobuf_with_samples() {
    let client = start_client(&client_yaml(""));
    let api = client.api;
    // Keep the client busy while it is profiled: API requests (bounded in count and time).
    let busy = std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(3);
        let mut n = 0;
        while Instant::now() < end && n < 5000 {
            let _ = call_raw(api, "GET", "/api/v1/openapi.json", None);
            n += 1;
        }
    });
    let file = client.dir.path().join("cpu.pb.gz");
    let out = curl(&[
        "-sS",
        "--max-time",
        "60",
        "-o",
        file.to_str().expect("path"),
        "-w",
        "%{http_code}",
        &format!("http://{api}/debug/pprof/profile?seconds=2"),
    ]);
    busy.join().expect("busy");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    let gz = std::fs::read(&file).expect("profile");
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzip magic");
    let raw = Command::new("gzip")
        .arg("-dc")
        .arg(&file)
        .output()
        .expect("gzip");
    assert!(raw.status.success(), "not gzip");
    let fields = protobuf_fields(&raw.stdout);
    // Profile: 1 sample_type, 2 sample, 6 string_table.
    let samples = fields.iter().filter(|(n, _)| *n == 2).count();
    assert!(samples > 0, "no samples in the profile");
    let strings: Vec<String> = fields
        .iter()
        .filter(|(n, _)| *n == 6)
        .map(|(_, s)| String::from_utf8_lossy(s).into_owned())
        .collect();
    assert!(
        strings.iter().any(|s| s == "cpu" || s == "samples"),
        "{strings:?}"
    );
    // The cmdline endpoint reports this process's arguments.
    let (st, cmdline) = call_raw(api, "GET", "/debug/pprof/cmdline", None);
    assert_eq!(st, 200);
    assert!(cmdline.contains("client"), "{cmdline:?}");
}

/// What the kill switch must do to a destination routed to the server: the HTTP proxy answers
/// `503` naming the reason (a plain request and a CONNECT), the SOCKS5 proxy replies 2 (not
/// allowed by ruleset). `tag` marks the attempts' paths in the origin's access log.
fn expect_blocked(client: &Client, origin: &Nginx, tag: &str) {
    let url = origin.url(&format!("/hello.txt?{tag}-http"));
    let proxy = format!("http://{}", client.http);
    let out = curl(&[
        "-sS",
        "--max-time",
        "20",
        "-w",
        "\n%{http_code}",
        "-x",
        &proxy,
        &url,
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "blocked: not connected\n\n503",
        "{tag}: plain HTTP to a server route\n{}",
        client.log_text()
    );
    let url = origin.url(&format!("/hello.txt?{tag}-connect"));
    let out = curl(&[
        "-sS",
        "--max-time",
        "20",
        "-p",
        "-o",
        "/dev/null",
        "-w",
        "%{http_connect}",
        "-x",
        &proxy,
        &url,
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "503",
        "{tag}: CONNECT to a server route"
    );
    let out = curl_via_socks(client, &origin.url(&format!("/hello.txt?{tag}-socks")));
    assert!(!out.status.success(), "{tag}: SOCKS5 to a server route");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("SOCKS5") && stderr.contains("(2)"),
        "{tag}: SOCKS5 reply 2 (not allowed by ruleset) wanted: {stderr}"
    );
}

/// The direct route's destination works over both proxies (the origin answers).
fn expect_direct_works(client: &Client, origin: &Nginx, tag: &str) {
    // `localhost` is routed direct; the same origin as 127.0.0.1 is routed to the server
    let url = format!("http://localhost:{}/hello.txt?{tag}-direct", origin.port);
    for out in [curl_via_http(client, &url), curl_via_socks(client, &url)] {
        assert_eq!(
            out.stdout,
            b"hello through switchyard",
            "{tag}: the direct route: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            client.log_text()
        );
    }
}

/// `routing.when_disconnected: block` (issue 36): never connected (auto-connect off) and after
/// `POST /api/v1/disconnect`, a destination routed to the server is refused over HTTP (503
/// `blocked: not connected`, plain and CONNECT) and SOCKS5 (reply 2) and neither the origin nor
/// the server sees anything of it, while a `direct` route keeps working; status, health and the
/// debug entries say so. Connected, both work and the server carries the first.
#[test]
fn kill_switch_blocks_server_routes_while_disconnected() {
    let Some(nginx) = origin() else { return };
    let server = gateway();
    let yaml = client_yaml(&format!(
        "server: {{auto_connect: false}}\nrouting:\n  when_disconnected: block\n  routes:\n    - {{name: local, patterns: [localhost], action: direct}}\nservers:\n{}",
        server_entry("gw", &server, "HTTP")
    ));
    let client = start_client(&yaml);
    assert!(
        client
            .log_text()
            .contains("destinations for the server are blocked"),
        "{}",
        client.log_text()
    );
    let status = client.get("/api/v1/status");
    assert_eq!(
        (&status["status"], &status["server_connected"]),
        (
            &serde_json::json!("blocked: not connected"),
            &serde_json::json!(false)
        ),
        "{status}"
    );
    let health = client.get("/api/v1/health");
    assert_eq!(health["status"], "degraded", "{health}");
    assert!(
        health["problems"]
            .to_string()
            .contains("blocked: not connected"),
        "{health}"
    );

    expect_blocked(&client, &nginx, "never");
    expect_direct_works(&client, &nginx, "never");
    let errors = client.get("/api/v1/debug/errors");
    let blocked: Vec<&serde_json::Value> = errors
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["action"] == "blocked")
        .collect();
    assert!(blocked.len() >= 3, "{errors}");
    assert!(
        blocked
            .iter()
            .all(|e| e["error"] == "blocked: not connected"),
        "{errors}"
    );

    // connected: the server carries the server route, the direct route stays direct
    let (st, v) = call(client.api, "POST", "/api/v1/connect", None);
    assert_eq!((st, &v["status"]), (200, &serde_json::json!("connected")));
    assert_eq!(client.get("/api/v1/status")["status"], "running");
    client.wait_health("healthy");
    let url = nginx.url("/hello.txt?connected");
    for out in [curl_via_http(&client, &url), curl_via_socks(&client, &url)] {
        assert_eq!(
            out.stdout,
            b"hello through switchyard",
            "connected: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    expect_direct_works(&client, &nginx, "connected");
    let carried = wait_server_connections(&server, 2);
    assert_eq!(
        carried, 2,
        "the server carried the two server-route requests"
    );

    // disconnected: blocked again
    let (st, _) = call(client.api, "POST", "/api/v1/disconnect", None);
    assert_eq!(st, 200);
    assert_eq!(
        client.get("/api/v1/status")["status"],
        "blocked: not connected"
    );
    expect_blocked(&client, &nginx, "disconnected");
    expect_direct_works(&client, &nginx, "disconnected");

    // nothing refused reached the origin or the server
    let log = std::fs::read_to_string(nginx.dir.path().join("access.log")).unwrap_or_default();
    for tag in ["never", "disconnected"] {
        for leg in ["http", "connect", "socks"] {
            assert!(
                !log.contains(&format!("{tag}-{leg}")),
                "{tag}-{leg} reached the origin:\n{log}"
            );
        }
        assert!(log.contains(&format!("{tag}-direct")), "{log}");
    }
    assert_eq!(server_connections(&server), carried);
}
