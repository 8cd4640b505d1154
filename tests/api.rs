//! End-to-end: the management API resources of the real `switchyard server`, driven with curl.

mod support;

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use support::*;

const PAGE: &[u8] = b"hello from nginx\n";

fn call(s: &Server, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    api_call(s, method, path, body, None)
}

fn assert_error_body(v: &Value, code: &str) {
    assert!(v["error"].is_string() && v["message"].is_string(), "{v}");
    assert_eq!(v["code"], code, "{v}");
}

#[test]
fn backends_create_get_stats_test_delete() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let server = start_server("");
    let (st, list) = call(&server, "GET", "/api/v1/backends", None);
    assert_eq!(st, 200);
    assert_eq!(list[0]["name"], "direct");
    assert_eq!(list[0]["type"], "direct");
    assert_eq!(list[0]["healthy"], true);
    assert!(list[0]["stats"]["total_connections"].is_u64());

    let dead = free_port();
    let body = format!(
        r#"{{"name":"up","type":"httpproxy","httpproxy":{{"address":"127.0.0.1:{dead}","username":"u","password":"p"}}}}"#
    );
    let (st, v) = call(&server, "POST", "/api/v1/backends", Some(&body));
    assert_eq!(
        (st, v.clone()),
        (
            201,
            json!({"status": "created", "backend": "up", "type": "httpproxy"})
        )
    );
    let (st, v) = call(&server, "POST", "/api/v1/backends", Some(&body));
    assert_eq!(st, 409);
    assert_error_body(&v, "BACKEND_EXISTS");
    // The config spelling of the type works too.
    let (st, _) = call(
        &server,
        "POST",
        "/api/v1/backends",
        Some(r#"{"name":"s","type":"socks5_proxy","socks5":{"address":"127.0.0.1:1"}}"#),
    );
    assert_eq!(st, 201);

    for (bad, code) in [
        (
            r#"{"name":"x","type":"carrier-pigeon"}"#,
            "INVALID_BACKEND_TYPE",
        ),
        (r#"{"name":"x","type":"httpproxy"}"#, "INVALID_BACKEND"),
        (
            r#"{"name":"x","type":"httpproxy","httpproxy":{"address":"no-port"}}"#,
            "INVALID_BACKEND",
        ),
        (r#"{"type":"direct"}"#, "INVALID_JSON"),
        (r#"{"name":7,"type":"direct"}"#, "INVALID_JSON"),
        (
            r#"{"name":"x","type":"direct","surprise":true}"#,
            "INVALID_JSON",
        ),
        ("not json", "INVALID_JSON"),
    ] {
        let (st, v) = call(&server, "POST", "/api/v1/backends", Some(bad));
        assert_eq!(st, 400, "{bad}: {v}");
        assert_error_body(&v, code);
    }

    let (st, v) = call(&server, "GET", "/api/v1/backends/up", None);
    assert_eq!(st, 200);
    assert_eq!(v["type"], "httpproxy");
    let (st, v) = call(&server, "GET", "/api/v1/backends/nope", None);
    assert_eq!(st, 404);
    assert_error_body(&v, "BACKEND_NOT_FOUND");
    let (st, _) = call(
        &server,
        "GET",
        "/api/v1/backends/..%2F..%2Fetc%2Fpasswd",
        None,
    );
    assert_eq!(st, 404);

    // A real connection attempt through each backend.
    let target = format!(r#"{{"target":"127.0.0.1:{}","timeout":"5s"}}"#, origin.port);
    let (st, v) = call(
        &server,
        "POST",
        "/api/v1/backends/direct/test",
        Some(&target),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["status"].clone(), v["healthy"].clone()),
        (json!("ok"), json!(true))
    );
    assert!(
        v["duration"].as_str().is_some_and(|d| d.ends_with('s')),
        "{v}"
    );
    for _ in 0..3 {
        let (st, v) = call(&server, "POST", "/api/v1/backends/up/test", Some(&target));
        assert_eq!(st, 200);
        assert_eq!(v["healthy"], false, "{v}");
        assert!(
            v["error"]
                .as_str()
                .is_some_and(|e| e.contains(&dead.to_string())),
            "{v}"
        );
    }
    let (_, v) = call(&server, "GET", "/api/v1/backends/up", None);
    assert_eq!(
        v["healthy"], false,
        "three failed connects mark the backend unhealthy"
    );
    let (st, v) = call(
        &server,
        "POST",
        "/api/v1/backends/direct/test",
        Some(r#"{"target":"nowhere"}"#),
    );
    assert_eq!(st, 400);
    assert_error_body(&v, "INVALID_TARGET");

    // Traffic shows in the per-backend stats.
    let out = curl(&[
        "-sS",
        "-x",
        &format!("http://{}", server.http),
        &origin.url("/index.html"),
    ]);
    assert_eq!(out.stdout, PAGE);
    let (st, v) = call(&server, "GET", "/api/v1/backends/direct/stats", None);
    assert_eq!(st, 200);
    assert!(v["total_connections"].as_u64().unwrap_or(0) >= 1, "{v}");
    assert!(
        v["bytes_sent"].as_u64().unwrap_or(0) >= PAGE.len() as u64,
        "{v}"
    );
    assert!(v["errors"].is_u64() && v["latency_ms"].is_u64(), "{v}");
    let (_, v) = call(&server, "GET", "/api/v1/backends/up/stats", None);
    assert!(v["errors"].as_u64().unwrap_or(0) >= 3, "{v}");

    // A backend used by a route cannot be deleted; an unused one can.
    let (st, _) = call(
        &server,
        "POST",
        "/api/v1/routes",
        Some(r#"{"name":"r","domains":["x.test"],"backend":"up"}"#),
    );
    assert_eq!(st, 201);
    let (st, v) = call(&server, "DELETE", "/api/v1/backends/up", None);
    assert_eq!(st, 409);
    assert_error_body(&v, "BACKEND_IN_USE");
    assert_eq!(call(&server, "DELETE", "/api/v1/routes/r", None).0, 200);
    let (st, v) = call(&server, "DELETE", "/api/v1/backends/up", None);
    assert_eq!(
        (st, v),
        (200, json!({"status": "deleted", "backend": "up"}))
    );
    assert_eq!(call(&server, "DELETE", "/api/v1/backends/up", None).0, 404);
}

#[test]
fn routes_take_effect_at_once_and_tunnels_survive_changes() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let server = start_server("");
    let dead = free_port();
    let body = format!(
        r#"{{"name":"dead","type":"httpproxy","httpproxy":{{"address":"127.0.0.1:{dead}"}}}}"#
    );
    assert_eq!(
        call(&server, "POST", "/api/v1/backends", Some(&body)).0,
        201
    );

    // A CONNECT tunnel opened before the changes.
    let mut tunnel = TcpStream::connect(server.http).expect("connect");
    tunnel
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        tunnel,
        "CONNECT 127.0.0.1:{} HTTP/1.1\r\nHost: x\r\n\r\n",
        origin.port
    )
    .expect("write");
    let mut established = [0u8; 39];
    tunnel.read_exact(&mut established).expect("established");

    let (st, v) = call(
        &server,
        "POST",
        "/api/v1/routes",
        Some(r#"{"name":"loop","domains":["127.0.0.1"],"backend":"dead","priority":50}"#),
    );
    assert_eq!(st, 201, "{v}");
    assert_eq!(
        v,
        json!({"status": "created", "route": "loop", "domains": ["127.0.0.1"], "backend": "dead"})
    );
    let (st, v) = call(
        &server,
        "POST",
        "/api/v1/routes",
        Some(r#"{"name":"loop","domains":["a.test"],"backend":"direct"}"#),
    );
    assert_eq!(st, 409);
    assert_error_body(&v, "ROUTE_EXISTS");
    for bad in [
        r#"{"name":"b","domains":["a.test"],"backend":"missing"}"#,
        r#"{"name":"b","domains":[],"backend":"direct"}"#,
        r#"{"name":"b","domains":["a..test"],"backend":"direct"}"#,
        r#"{"name":"b","domains":["a.test"]}"#,
        r#"{"name":"b","domains":"a.test","backend":"direct"}"#,
    ] {
        let (st, v) = call(&server, "POST", "/api/v1/routes", Some(bad));
        assert_eq!(st, 400, "{bad}: {v}");
    }
    let (_, routes) = call(&server, "GET", "/api/v1/routes", None);
    let lp = routes
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == "loop").cloned())
        .expect("route listed");
    assert_eq!(
        lp,
        json!({"name": "loop", "domains": ["127.0.0.1"], "backend": "dead", "enabled": true, "priority": 50})
    );

    // New requests to 127.0.0.1 now go to the dead upstream proxy.
    let out = curl(&[
        "-sS",
        "-x",
        &format!("http://{}", server.http),
        &origin.url("/index.html"),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("127.0.0.1:{dead}")), "{text}");
    // The old tunnel still passes bytes.
    write!(
        tunnel,
        "GET /index.html HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )
    .expect("request");
    let mut buf = vec![0u8; 4096];
    let n = tunnel.read(&mut buf).expect("response");
    assert!(
        buf[..n].ends_with(PAGE),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );

    let (st, v) = call(&server, "DELETE", "/api/v1/routes/loop", None);
    assert_eq!(
        (st, v),
        (200, json!({"status": "deleted", "route": "loop"}))
    );
    assert_eq!(call(&server, "DELETE", "/api/v1/routes/loop", None).0, 404);
    let out = curl(&[
        "-sS",
        "-x",
        &format!("http://{}", server.http),
        &origin.url("/index.html"),
    ]);
    assert_eq!(out.stdout, PAGE);
    write!(
        tunnel,
        "GET /index.html HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut rest = Vec::new();
    let _ = tunnel.read_to_end(&mut rest);
    assert!(rest.ends_with(PAGE));
}

#[test]
fn request_log_records_pages_counts_and_clears() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let server = server_with(
        "api: { listen: \"127.0.0.1:0\", enable_request_log: true, request_log_size: 5 }\n",
    );
    let proxy = format!("http://{}", server.http);
    for _ in 0..6 {
        let out = curl(&[
            "-sS",
            "-A",
            "switchyard-test/1",
            "-x",
            &proxy,
            &origin.url("/index.html"),
        ]);
        assert_eq!(out.stdout, PAGE);
    }
    let out = curl(&[
        "-sS",
        "-o",
        "/dev/null",
        "-x",
        &proxy,
        "-X",
        "POST",
        &origin.url("/missing"),
    ]);
    assert!(out.status.success());
    let out = curl(&["-sS", "-p", "-x", &proxy, &origin.url("/index.html")]);
    assert_eq!(out.stdout, PAGE);
    // Records arrive through a queue: wait until all 8 are in.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let stats = loop {
        let (_, s) = call(&server, "GET", "/api/v1/requests/stats", None);
        if s["total_requests"] == 8 || std::time::Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(stats["enabled"], true);
    assert_eq!(stats["total_requests"], 8, "{stats}");
    assert_eq!(stats["count"], 5);
    assert_eq!(stats["max_size"], 5);
    assert_eq!(stats["requests_by_method"]["GET"], 6);
    assert_eq!(stats["requests_by_method"]["POST"], 1);
    assert_eq!(stats["requests_by_method"]["CONNECT"], 1);
    assert_eq!(stats["requests_by_status"]["200"], 7);
    assert!(
        stats["requests_by_status"]["404"].as_u64().is_some(),
        "{stats}"
    );
    assert_eq!(
        stats["top_hosts"][0],
        json!({"host": "127.0.0.1", "count": 8})
    );
    assert!(stats["total_bytes_sent"].as_u64().unwrap_or(0) >= 7 * PAGE.len() as u64);

    let (st, list) = call(&server, "GET", "/api/v1/requests?limit=3", None);
    assert_eq!(st, 200);
    assert_eq!(list["enabled"], true);
    let entries = list["requests"].as_array().cloned().unwrap_or_default();
    assert_eq!(entries.len(), 3);
    let newest = &entries[0];
    assert_eq!(newest["protocol"], "CONNECT");
    assert_eq!(newest["status_code"], 200);
    let get = entries
        .iter()
        .chain(list["requests"].as_array().into_iter().flatten())
        .find(|e| e["method"] == "POST")
        .cloned();
    let get = get.expect("POST entry");
    assert_eq!(get["status_code"], 404);
    assert_eq!(get["path"], "/missing");
    assert_eq!(get["backend"], "direct");
    assert_eq!(get["client_ip"], "127.0.0.1");
    assert_eq!(get["host"], format!("127.0.0.1:{}", origin.port));
    for key in [
        "id",
        "timestamp",
        "url",
        "user_agent",
        "username",
        "bytes_sent",
        "bytes_recv",
        "duration_ms",
        "error",
    ] {
        assert!(get.get(key).is_some(), "{key} missing in {get}");
    }
    let newest_id = newest["id"].as_u64().expect("id");
    let (_, since) = call(
        &server,
        "GET",
        &format!("/api/v1/requests?since={}", newest_id - 1),
        None,
    );
    assert_eq!(since["requests"].as_array().map(Vec::len), Some(1));
    let (_, offset) = call(&server, "GET", "/api/v1/requests?offset=4&limit=10", None);
    assert_eq!(offset["requests"].as_array().map(Vec::len), Some(1));
    let (st, v) = call(&server, "GET", "/api/v1/requests?limit=lots", None);
    assert_eq!(st, 400);
    assert_error_body(&v, "INVALID_QUERY");

    let (st, v) = call(&server, "DELETE", "/api/v1/requests", None);
    assert_eq!(st, 200);
    assert!(v["message"].is_string());
    let (_, s) = call(&server, "GET", "/api/v1/requests/stats", None);
    assert_eq!(
        (
            s["count"].clone(),
            s["total_requests"].clone(),
            s["total_bytes_sent"].clone()
        ),
        (json!(0), json!(0), json!(0))
    );
}

#[test]
fn live_connections_and_clients() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let server = start_server("");
    let mut tunnels = Vec::new();
    for _ in 0..3 {
        let mut t = TcpStream::connect(server.http).expect("connect");
        t.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        write!(t, "CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", origin.port).expect("write");
        let mut established = [0u8; 39];
        t.read_exact(&mut established).expect("established");
        tunnels.push(t);
    }
    let (st, v) = call(&server, "GET", "/api/v1/connections", None);
    assert_eq!(st, 200);
    assert_eq!(v["count"], 3, "{v}");
    let c = &v["connections"][0];
    assert_eq!(c["protocol"], "CONNECT");
    assert_eq!(c["client_ip"], "127.0.0.1");
    assert_eq!(c["host"], format!("127.0.0.1:{}", origin.port));
    assert_eq!(c["backend"], "direct");
    assert!(c["client_port"]
        .as_str()
        .is_some_and(|p| p.parse::<u16>().is_ok()));
    assert!(c["id"].is_string() && c["start_time"].is_string() && v["time"].is_string());
    let (_, v) = call(&server, "GET", "/api/v1/connections/clients", None);
    assert_eq!(v["count"], 1);
    assert_eq!(v["clients"][0]["client_ip"], "127.0.0.1");
    assert_eq!(v["clients"][0]["connections"], 3);
    assert!(v["clients"][0]["first_seen"].is_string());
    drop(tunnels);
    assert_eq!(server.wait_idle(), 0);
    let (_, v) = call(&server, "GET", "/api/v1/connections", None);
    assert_eq!(v["count"], 0);
}

fn token_config(token: &str) -> String {
    format!("api: {{ listen: \"127.0.0.1:0\", token: \"{token}\" }}\n")
}

fn server_with(yaml_tail: &str) -> Server {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("server.yaml");
    std::fs::write(
        &path,
        format!(
            "server:\n  http: {{ listen: \"127.0.0.1:0\" }}\n  socks5: {{ listen: \"127.0.0.1:0\" }}\n\
             logging: {{ level: info, format: json }}\n{yaml_tail}"
        ),
    )
    .expect("config");
    start_server_with_file(dir, path)
}

#[test]
fn api_token_guards_everything_but_health_and_pac() {
    let server = server_with(&token_config("s3cret"));
    assert_eq!(call(&server, "GET", "/api/v1/health", None).0, 200);
    let pac = curl(&[
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("http://{}/proxy.pac", server.api),
    ]);
    assert_eq!(String::from_utf8_lossy(&pac.stdout), "200");
    let (st, v) = call(&server, "GET", "/api/v1/stats", None);
    assert_eq!(st, 401);
    assert_error_body(&v, "UNAUTHORIZED");
    assert_eq!(
        api_call(&server, "GET", "/api/v1/stats", None, Some("wrong")).0,
        401
    );
    assert_eq!(
        api_call(&server, "GET", "/api/v1/stats", None, Some("s3cret")).0,
        200
    );
    assert_eq!(
        call(&server, "GET", "/api/v1/stats?token=s3cret", None).0,
        200
    );

    // The sanitized config masks the token; the full one has it.
    let (_, cfg) = api_call(&server, "GET", "/api/v1/config", None, Some("s3cret"));
    assert_eq!(cfg["api"]["token"], "********");
    let (_, full) = api_call(&server, "GET", "/api/v1/config/full", None, Some("s3cret"));
    assert_eq!(full["api"]["token"], "s3cret");
}

#[test]
fn config_meta_validate_plugins() {
    let server = start_server("");
    let (st, meta) = call(&server, "GET", "/api/v1/config/meta", None);
    assert_eq!(st, 200);
    let sections: Vec<(String, bool)> = meta
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["section"].as_str().unwrap_or_default().to_owned(),
                m["hot_reloadable"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    let expected = [
        ("routes", true),
        ("rate_limit", true),
        ("server", false),
        ("backends", false),
        ("access_control", true),
        ("cache", true),
        ("auth", false),
    ];
    assert_eq!(sections, expected.map(|(s, h)| (s.to_owned(), h)));
    assert!(meta[0]["description"].is_string());

    let (_, full) = call(&server, "GET", "/api/v1/config/full", None);
    let (st, v) = call(
        &server,
        "POST",
        "/api/v1/config/validate",
        Some(&full.to_string()),
    );
    assert_eq!(st, 200);
    assert_eq!(v["valid"], true, "{v}");
    let mut bad = full.clone();
    bad["routes"] = json!([{"name": "r", "domains": ["*"], "backend": "ghost"}]);
    let (_, v) = call(
        &server,
        "POST",
        "/api/v1/config/validate",
        Some(&bad.to_string()),
    );
    assert_eq!(v["valid"], false);
    assert_eq!(v["errors"][0]["section"], "routes");
    assert!(v["message"].is_string());
    let (_, v) = call(
        &server,
        "POST",
        "/api/v1/config/validate",
        Some(r#"{"server":{"htttp":{}}}"#),
    );
    assert_eq!(v["valid"], false);
    assert!(
        v["errors"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("htttp")),
        "{v}"
    );

    let (st, v) = call(&server, "GET", "/api/v1/auth/plugins", None);
    assert_eq!(st, 200);
    let plugins = v["plugins"].as_array().cloned().unwrap_or_default();
    let native = plugins
        .iter()
        .find(|p| p["name"] == "native")
        .expect("native");
    assert_eq!(native["availability"]["state"], "available");
    // This build has every mode (tests/proxy_auth.rs drives each).
    for name in ["system", "ldap", "oauth"] {
        let plugin = plugins.iter().find(|p| p["name"] == name).expect(name);
        assert_eq!(plugin["availability"]["state"], "available", "{plugin}");
    }
    assert!(plugins.iter().all(|p| p["type"] != "negotiate"));

    let (st, v) = call(&server, "GET", "/api/v1/openapi.json", None);
    assert_eq!(st, 200);
    assert_eq!(v["info"]["version"], "1.0.0");
    assert!(v["paths"]["/api/v1/backends/{name}/test"]["post"].is_object());
    let (st, v) = call(&server, "GET", "/api/v1/nothing-here", None);
    assert_eq!(st, 404);
    assert_error_body(&v, "NO_SUCH_ENDPOINT");
    let big = format!(
        "{{\"name\":\"{}\",\"type\":\"direct\"}}",
        "x".repeat(2 << 20)
    );
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("big.json");
    std::fs::write(&file, big).expect("big");
    let out = curl(&[
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        &format!("@{}", file.display()),
        &format!("http://{}/api/v1/backends", server.api),
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "413");
}

#[test]
fn config_save_hot_reload_backup_and_restart_classification() {
    let server = start_server("");
    let original = std::fs::read_to_string(&server.config_path).expect("config");
    let (_, full) = call(&server, "GET", "/api/v1/config/full", None);

    // Invalid: nothing written.
    let mut bad = full.clone();
    bad["routes"] = json!([{"name": "r", "domains": ["*"], "backend": "ghost"}]);
    let (st, v) = call(
        &server,
        "PUT",
        "/api/v1/config",
        Some(&json!({"config": bad, "create_backup": true}).to_string()),
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["valid"], false);
    assert_eq!(
        std::fs::read_to_string(&server.config_path).expect("config"),
        original
    );

    // Routes (hot) and rate_limit (hot) change: applied at once, backup written.
    let mut new = full.clone();
    new["routes"] = json!([{"name": "all", "domains": ["*"], "backend": "direct", "priority": 3}]);
    new["rate_limit"]["requests_per_second"] = json!(500.0);
    new["rate_limit"]["burst_size"] = json!(50);
    let (st, v) = call(
        &server,
        "PUT",
        "/api/v1/config",
        Some(&json!({"config": new, "create_backup": true}).to_string()),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["success"], true);
    assert_eq!(v["changed_sections"], json!(["routes", "rate_limit"]));
    assert_eq!(v["hot_reloaded_sections"], json!(["routes", "rate_limit"]));
    assert_eq!(v["restart_required_sections"], json!([]));
    assert_eq!(v["requires_restart"], false);
    assert_eq!(v["errors"], json!([]));
    let backup = v["backup_path"].as_str().expect("backup path").to_owned();
    assert_eq!(std::fs::read_to_string(&backup).expect("backup"), original);
    let (_, routes) = call(&server, "GET", "/api/v1/routes", None);
    assert_eq!(routes[0]["name"], "all");
    assert_eq!(routes[0]["priority"], 3);
    // The saved file is a valid configuration that loads back to the same routes.
    let out = std::process::Command::new(BIN)
        .args(["config", "validate"])
        .arg(&server.config_path)
        .output()
        .expect("validate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // A server section change needs a restart.
    let mut new2 = new.clone();
    new2["server"]["http"]["idle_timeout"] = json!("5m0s");
    let (st, v) = call(
        &server,
        "PUT",
        "/api/v1/config",
        Some(&json!({"config": new2, "create_backup": false}).to_string()),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["changed_sections"], json!(["server"]));
    assert_eq!(v["hot_reloaded_sections"], json!([]));
    assert_eq!(v["restart_required_sections"], json!(["server"]));
    assert_eq!(v["requires_restart"], true);
    assert!(v.get("backup_path").is_none());

    // Reload from disk through the API.
    let (st, v) = call(&server, "POST", "/api/v1/config/reload", None);
    assert_eq!(st, 200, "{v}");
    assert!(v["message"].is_string() && v["time"].is_string());

    // Concurrent saves: the file is always one complete configuration.
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let mut c = new.clone();
            c["routes"] = json!([{"name": format!("r{i}"), "domains": ["*"], "backend": "direct", "priority": i}]);
            let body = json!({"config": c, "create_backup": false}).to_string();
            let api = server.api;
            std::thread::spawn(move || {
                let out = curl(&["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT", "-H", "Content-Type: application/json",
                    "--data-binary", &body, &format!("http://{api}/api/v1/config")]);
                String::from_utf8_lossy(&out.stdout).into_owned()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().expect("thread"), "200");
    }
    let out = std::process::Command::new(BIN)
        .args(["config", "validate"])
        .arg(&server.config_path)
        .output()
        .expect("validate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let (_, routes) = call(&server, "GET", "/api/v1/routes", None);
    let running = routes[0]["name"].as_str().unwrap_or_default().to_owned();
    let on_disk = std::fs::read_to_string(&server.config_path).expect("config");
    assert!(
        on_disk.contains(&running),
        "the running routes are the ones on disk"
    );
}

/// A save through the API keeps the file's `${NAME}` references (file and backup), secrets sent
/// back masked keep their values, `${NAME}` in YAML sent through the API is refused, and a value
/// `${NAME}` sent as JSON is stored as that text (never expanded from the server's environment).
#[test]
fn config_saves_keep_env_references_and_never_expand_api_values() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("server.yaml");
    let original = "server:\n  http: { listen: \"127.0.0.1:0\" }\n  socks5: { listen: \"127.0.0.1:0\" }\n\
         api: { listen: \"127.0.0.1:0\", token: \"${SY_TEST_API_TOKEN}\" }\n\
         logging: { level: info, format: json }\n\
         backends:\n  - {name: direct, type: direct}\n  - {name: up, type: httpproxy, http_proxy: {address: \"127.0.0.1:9\", username: u, password: \"${SY_TEST_PROXY_PASSWORD}\"}}\n\
         routes:\n  - {name: all, domains: [\"*\"], backend: direct}\n";
    std::fs::write(&path, original).expect("config");
    let env: [(&str, &std::ffi::OsStr); 3] = [
        ("SY_TEST_API_TOKEN", "token-from-env".as_ref()),
        ("SY_TEST_PROXY_PASSWORD", "password-from-env".as_ref()),
        ("SY_TEST_OTHER", "other-secret-of-the-server".as_ref()),
    ];
    let server = start_server_with_env(dir, path.clone(), &env);
    let token = Some("token-from-env");
    let put = |body: &Value| {
        api_call(
            &server,
            "PUT",
            "/api/v1/config",
            Some(&body.to_string()),
            token,
        )
    };

    // The dashboard's round trip: masked config, one route changed, saved with a backup.
    let (st, mut shown) = api_call(&server, "GET", "/api/v1/config", None, token);
    assert_eq!(st, 200, "{shown}");
    assert_eq!(shown["api"]["token"], "********");
    assert_eq!(shown["backends"][1]["http_proxy"]["password"], "********");
    shown["routes"][0]["priority"] = json!(7);
    let (st, v) = put(&json!({"config": shown, "create_backup": true}));
    assert_eq!(st, 200, "{v}");
    let saved = std::fs::read_to_string(&path).expect("saved");
    assert!(
        saved.contains("\"${SY_TEST_API_TOKEN}\"")
            && saved.contains("\"${SY_TEST_PROXY_PASSWORD}\""),
        "{saved}"
    );
    assert!(
        !saved.contains("token-from-env") && !saved.contains("password-from-env"),
        "{saved}"
    );
    let backup = v["backup_path"].as_str().expect("backup");
    assert_eq!(std::fs::read_to_string(backup).expect("backup"), original);
    let (_, full) = api_call(&server, "GET", "/api/v1/config/full", None, token);
    assert_eq!(
        full["backends"][1]["http_proxy"]["password"],
        "password-from-env"
    );
    assert_eq!(full["routes"][0]["priority"], 7);

    // YAML with a reference: refused, nothing written.
    let yaml = saved.replace("username: u", "username: \"${SY_TEST_OTHER}\"");
    let out = curl(&[
        "-sS",
        "-X",
        "PUT",
        "-H",
        "Authorization: Bearer token-from-env",
        "-H",
        "Content-Type: application/yaml",
        "--data-binary",
        &yaml,
        "-w",
        "\n%{http_code}",
        &format!("http://{}/api/v1/config/yaml", server.api),
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.ends_with("\n400"), "{text}");
    assert!(
        text.contains("SY_TEST_OTHER") && !text.contains("other-secret-of-the-server"),
        "{text}"
    );
    assert_eq!(std::fs::read_to_string(&path).expect("file"), saved);

    // JSON with `${NAME}` as a value: stored as that text. A server started from the saved
    // file (same environment) has that text, and the references' values.
    let (_, mut full) = api_call(&server, "GET", "/api/v1/config/full", None, token);
    full["backends"][1]["http_proxy"]["username"] = json!("${SY_TEST_OTHER}");
    let (st, v) = put(&json!({"config": full, "create_backup": false}));
    assert_eq!(st, 200, "{v}");
    let saved = std::fs::read_to_string(&path).expect("saved");
    assert!(!saved.contains("other-secret-of-the-server"), "{saved}");
    drop(server);
    let again_dir = tempfile::tempdir().expect("dir");
    let again_path = again_dir.path().join("server.yaml");
    std::fs::write(&again_path, &saved).expect("copy");
    let again = start_server_with_env(again_dir, again_path, &env);
    let (_, full) = api_call(&again, "GET", "/api/v1/config/full", None, token);
    assert_eq!(
        full["backends"][1]["http_proxy"]["username"], "${SY_TEST_OTHER}",
        "{saved}"
    );
    assert_eq!(
        full["backends"][1]["http_proxy"]["password"],
        "password-from-env"
    );
    assert_eq!(full["api"]["token"], "token-from-env");
    assert_eq!(full["routes"][0]["priority"], 7);
}
