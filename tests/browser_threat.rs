//! What a web page the user visits can do to the listeners on the user's machine (issue 29):
//! DNS rebinding (a foreign Host) and cross-site writes (a foreign Origin, `Sec-Fetch-Site:
//! cross-site`, `text/plain` bodies that need no CORS preflight), against the real server and
//! client binaries with their default configurations (no token) on loopback, with curl as the
//! attacker's forged requests and headless Chromium as the attacker's page on a second
//! loopback origin.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::Command;

use serde_json::Value;
use support::browser::Browser;
use support::{curl, free_port, spawn_with_listeners, start_server, Proc, BIN};

/// A running client with its API and web UI, two servers (`home` the default, `spare`), not
/// connected.
struct Client {
    _proc: Proc,
    api: SocketAddr,
    web: SocketAddr,
    logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

fn start_client() -> Client {
    let dir = tempfile::tempdir().expect("tempdir");
    let (home, spare) = (free_port(), free_port());
    let yaml = format!(
        "proxy:\n  http: {{listen: \"127.0.0.1:0\"}}\n  socks5: {{listen: \"127.0.0.1:0\"}}\n  cores: 1\n\
         api: {{listen: \"127.0.0.1:0\"}}\n\
         web_ui: {{enabled: true, listen: \"127.0.0.1:0\"}}\n\
         server: {{auto_connect: false}}\n\
         servers:\n  - {{name: home, address: \"127.0.0.1:{home}\", protocol: HTTP, is_default: true}}\n\
         \x20 - {{name: spare, address: \"127.0.0.1:{spare}\", protocol: HTTP}}\n\
         logging: {{level: info, format: json}}\n"
    );
    std::fs::write(dir.path().join("client.yaml"), yaml).expect("write config");
    let mut cmd = Command::new(BIN);
    cmd.arg("client")
        .arg("--config")
        .arg(dir.path().join("client.yaml"))
        .arg("--data-dir")
        .arg(dir.path().join("data"));
    let started = spawn_with_listeners(
        cmd,
        "switchyard client",
        &["client API listening", "client web UI listening"],
    );
    Client {
        _proc: started.proc,
        api: started.addrs[0],
        web: started.addrs[1],
        logs: started.logs,
        _dir: dir,
    }
}

/// (status, JSON body or Null) of `method url` with extra curl arguments (headers, body).
fn call(method: &str, url: &str, extra: &[&str]) -> (u16, Value) {
    let mut args = vec![
        "-sS",
        "--max-time",
        "20",
        "-X",
        method,
        "-w",
        "\n%{http_code}",
    ];
    args.extend_from_slice(extra);
    args.push(url);
    let out = curl(&args);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (
        code.trim().parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

/// Asserts a refusal with the API's error body and `code`.
fn assert_refused(what: &str, (status, body): (u16, Value), want: u16, code: &str) {
    assert_eq!(status, want, "{what}: {body}");
    assert_eq!(body["code"], code, "{what}: {body}");
    assert!(
        body["error"].is_string() && body["message"].is_string(),
        "{what}: {body}"
    );
}

fn log_lines_with(logs: &std::sync::Mutex<Vec<String>>, text: &str) -> usize {
    logs.lock()
        .map(|l| l.iter().filter(|line| line.contains(text)).count())
        .unwrap_or(0)
}

/// The names of the client's servers (GET /api/v1/servers).
fn server_names(api: SocketAddr) -> Vec<String> {
    let (status, v) = call("GET", &format!("http://{api}/api/v1/servers"), &[]);
    assert_eq!(status, 200, "{v}");
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn connected(api: SocketAddr) -> bool {
    let (_, v) = call("GET", &format!("http://{api}/api/v1/status"), &[]);
    v["server_connected"] == Value::Bool(true)
}

const ATTACKER_YAML: &str =
    "servers:\n  - {name: attacker, address: \"127.0.0.1:9\", protocol: HTTP, is_default: true}\n";

/// The server's API, dashboard and PAC file answer only to an IP literal, a loopback name or a
/// listed name as Host; one warning line per refusal, naming the client.
#[test]
fn server_refuses_a_rebound_host_on_every_route() {
    let s = start_server("");
    let base = format!("http://{}", s.api);
    let evil_host = format!("Host: evil.example:{}", s.api.port());
    for path in [
        "/api/v1/config/full",
        "/api/v1/config/yaml",
        "/api/v1/status",
        "/ui/",
        "/proxy.pac",
        "/api/v1/health",
        "/api/v1/nothing-here",
    ] {
        let url = format!("{base}{path}");
        assert_refused(
            path,
            call("GET", &url, &["-H", &evil_host]),
            403,
            "HOST_NOT_ALLOWED",
        );
    }
    // The secrets stay out of the refusal.
    let (_, body) = call(
        "GET",
        &format!("{base}/api/v1/config/full"),
        &["-H", &evil_host],
    );
    assert!(!body.to_string().contains("backends"), "{body}");
    assert!(log_lines_with(&s.logs, "API request refused") >= 7);
    assert!(log_lines_with(&s.logs, "127.0.0.1:") > 0);
    // An IP literal or a loopback name as Host: served, the PAC file included.
    let localhost = format!("Host: localhost:{}", s.api.port());
    for path in ["/api/v1/config/full", "/ui/", "/proxy.pac"] {
        let url = format!("{base}{path}");
        assert_eq!(call("GET", &url, &[]).0, 200, "{path}");
        assert_eq!(call("GET", &url, &["-H", &localhost]).0, 200, "{path}");
        assert_eq!(
            call("GET", &url, &["-H", "Host: 10.1.2.3"]).0,
            200,
            "{path}"
        );
    }
}

/// A gateway reached by a DNS name serves its PAC file (and API) once the name is listed.
#[test]
fn a_listed_gateway_name_passes_the_host_check() {
    let s = start_server_listing("[\"gw.lan\"]");
    let url = format!("http://{}/proxy.pac", s.api);
    assert_eq!(call("GET", &url, &["-H", "Host: gw.lan"]).0, 200);
    assert_eq!(call("GET", &url, &["-H", "Host: other.lan"]).0, 403);
}

fn start_server_listing(list: &str) -> support::Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let config_path = dir.path().join("server.yaml");
    let yaml = format!(
        "server:\n  http: {{ listen: \"127.0.0.1:0\" }}\n  socks5: {{ listen: \"127.0.0.1:0\" }}\n  cores: 1\n\
         api: {{ listen: \"127.0.0.1:0\", allowed_origins: {list} }}\nlogging: {{ level: info, format: json }}\n"
    );
    std::fs::write(&config_path, yaml).expect("write config");
    support::start_server_with_file(dir, config_path)
}

/// Every state-changing route of the server refuses a foreign Origin and a cross-site fetch;
/// a text/plain body is refused whoever sends it; same-origin and Origin-less calls work.
#[test]
fn server_refuses_cross_site_writes() {
    let s = start_server("");
    let base = format!("http://{}", s.api);
    // The backend test's target: it counts the connections the refused tests did not make.
    let target = TcpListener::bind("127.0.0.1:0").expect("bind the test target");
    let test_body = format!(
        "{{\"target\":\"{}\",\"timeout\":\"5s\"}}",
        target.local_addr().expect("addr")
    );
    let foreign = ["-H", "Origin: http://evil.example"];
    let cross_site = ["-H", "Sec-Fetch-Site: cross-site"];
    let text_plain = [
        "-H",
        "Content-Type: text/plain",
        "--data-binary",
        test_body.as_str(),
    ];
    let writes = [
        ("POST", "/api/v1/config/reload"),
        ("POST", "/api/v1/backends/direct/test"),
        ("POST", "/api/v1/cache/presets/any/enable"),
        ("POST", "/api/v1/cache/presets/any/disable"),
        ("POST", "/api/v1/providers/refresh"),
        ("POST", "/api/v1/providers/any/refresh"),
        ("POST", "/api/v1/mesh/networks/n/peers/p/heartbeat"),
        ("PUT", "/api/v1/config/yaml"),
        ("DELETE", "/api/v1/requests"),
        ("DELETE", "/api/v1/backends/direct"),
    ];
    for (method, path) in writes {
        let url = format!("{base}{path}");
        let what = format!("{method} {path}");
        assert_refused(
            &what,
            call(method, &url, &foreign),
            403,
            "ORIGIN_NOT_ALLOWED",
        );
        let with_body: Vec<&str> = foreign.iter().chain(&text_plain).copied().collect();
        assert_refused(
            &what,
            call(method, &url, &with_body),
            403,
            "ORIGIN_NOT_ALLOWED",
        );
        assert_refused(
            &what,
            call(method, &url, &cross_site),
            403,
            "CROSS_SITE_REQUEST",
        );
        assert_refused(
            &what,
            call(method, &url, &text_plain),
            415,
            "UNSUPPORTED_MEDIA_TYPE",
        );
    }
    // The backend test reads JSON only: another declared type is 415 too.
    let test = format!("{base}/api/v1/backends/direct/test");
    let octets = [
        "-H",
        "Content-Type: application/octet-stream",
        "--data-binary",
        test_body.as_str(),
    ];
    assert_refused(
        "octet-stream test",
        call("POST", &test, &octets),
        415,
        "UNSUPPORTED_MEDIA_TYPE",
    );
    // Nothing was deleted.
    assert_eq!(
        call("GET", &format!("{base}/api/v1/backends/direct"), &[]).0,
        200
    );
    // Same origin (the dashboard) and no Origin (curl): served.
    let reload = format!("{base}/api/v1/config/reload");
    let same = format!("Origin: http://{}", s.api);
    assert_eq!(call("POST", &reload, &[]).0, 200);
    let same_origin = ["-H", same.as_str(), "-H", "Sec-Fetch-Site: same-origin"];
    assert_eq!(call("POST", &reload, &same_origin).0, 200);
    let json = [
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        test_body.as_str(),
    ];
    let same_json: Vec<&str> = same_origin.iter().chain(&json).copied().collect();
    let (status, v) = call("POST", &test, &same_json);
    assert_eq!((status, &v["healthy"]), (200, &Value::Bool(true)), "{v}");
    let (status, v) = call("POST", &test, &json);
    assert_eq!((status, &v["healthy"]), (200, &Value::Bool(true)), "{v}");
    // Each answered test has connected before its answer: exactly these two are waiting.
    target.set_nonblocking(true).expect("nonblocking");
    let made = std::iter::from_fn(|| target.accept().ok()).count();
    assert_eq!(made, 2, "connections to the test target");
}

/// The client's API and web UI: a rebound Host is refused on every route; every write with a
/// foreign Origin or from another site is refused and changes nothing; a text/plain import is
/// refused and the servers stay; same-origin and Origin-less calls work.
#[test]
fn client_refuses_rebinding_and_cross_site_writes() {
    let c = start_client();
    for addr in [c.api, c.web] {
        let base = format!("http://{addr}");
        let evil_host = format!("Host: evil.example:{}", addr.port());
        for path in [
            "/api/v1/config",
            "/api/v1/servers",
            "/api/v1/logs",
            "/api/v1/health",
        ] {
            let url = format!("{base}{path}");
            assert_refused(
                path,
                call("GET", &url, &["-H", &evil_host]),
                403,
                "HOST_NOT_ALLOWED",
            );
        }
        let foreign = ["-H", "Origin: http://evil.example"];
        let cross_site = ["-H", "Sec-Fetch-Site: cross-site"];
        for path in [
            "/api/v1/connect",
            "/api/v1/vpn/enable",
            "/api/v1/mesh/enable",
            "/api/v1/config/reload",
            "/api/v1/cache/clear",
            "/api/v1/servers/spare/select",
        ] {
            let url = format!("{base}{path}");
            assert_refused(
                path,
                call("POST", &url, &foreign),
                403,
                "ORIGIN_NOT_ALLOWED",
            );
            assert_refused(
                path,
                call("POST", &url, &cross_site),
                403,
                "CROSS_SITE_REQUEST",
            );
        }
        assert!(!connected(c.api), "a refused connect connected");
        // The import of an attacker's server list, as a page can send it.
        let import = format!("{base}/api/v1/config/import?format=yaml");
        let plain = [
            "-H",
            "Content-Type: text/plain",
            "--data-binary",
            ATTACKER_YAML,
        ];
        let from_evil: Vec<&str> = foreign.iter().chain(&plain).copied().collect();
        assert_refused(
            "import",
            call("POST", &import, &from_evil),
            403,
            "ORIGIN_NOT_ALLOWED",
        );
        assert_refused(
            "import",
            call("POST", &import, &plain),
            415,
            "UNSUPPORTED_MEDIA_TYPE",
        );
        let form = ["--data-binary", ATTACKER_YAML];
        assert_refused(
            "import",
            call("POST", &import, &form),
            415,
            "UNSUPPORTED_MEDIA_TYPE",
        );
        let put = format!("{base}/api/v1/config");
        let octets = [
            "-H",
            "Content-Type: application/octet-stream",
            "--data-binary",
            "{\"routing\":{}}",
        ];
        assert_refused(
            "PUT config",
            call("PUT", &put, &octets),
            415,
            "UNSUPPORTED_MEDIA_TYPE",
        );
        assert_eq!(server_names(c.api), ["home", "spare"]);
        // The same-origin page and Origin-less clients keep working.
        let same = format!("Origin: http://{addr}");
        let same_origin = ["-H", same.as_str(), "-H", "Sec-Fetch-Site: same-origin"];
        let url = format!("{base}/api/v1/connect");
        assert_eq!(call("POST", &url, &same_origin).0, 200);
        assert!(connected(c.api));
        let url = format!("{base}/api/v1/disconnect");
        assert_eq!(call("POST", &url, &[]).0, 200);
        assert!(!connected(c.api));
        assert_eq!(
            call("GET", &format!("{base}/api/v1/config"), &same_origin).0,
            200
        );
    }
    assert_eq!(call("GET", &format!("http://{}/ui/", c.web), &[]).0, 200);
    let evil_host = format!("Host: evil.example:{}", c.web.port());
    let ui = format!("http://{}/ui/", c.web);
    assert_refused(
        "ui",
        call("GET", &ui, &["-H", &evil_host]),
        403,
        "HOST_NOT_ALLOWED",
    );
    assert!(log_lines_with(&c.logs, "API request refused") > 0);
    // A real import, as documented (YAML as application/yaml), still replaces the list.
    let import = format!("http://{}/api/v1/config/import?format=yaml", c.api);
    let yaml = [
        "-H",
        "Content-Type: application/yaml",
        "--data-binary",
        ATTACKER_YAML,
    ];
    let (status, v) = call("POST", &import, &yaml);
    assert_eq!(status, 200, "{v}");
    assert_eq!(server_names(c.api), ["attacker"]);
}

/// Serves `page` as HTML to every request on `ip`:0 from a thread, for as long as the test runs.
fn serve_page(ip: &str, page: String) -> SocketAddr {
    let listener = TcpListener::bind((ip, 0)).expect("bind the attacker's origin");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming().take(64) {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut line = String::new();
            while reader.read_line(&mut line).map(|n| n > 2).unwrap_or(false) {
                line.clear();
            }
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                page.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(page.as_bytes());
        }
    });
    addr
}

/// A page on another loopback origin (127.0.0.2) posts an attacker's server list to the client's
/// import with `fetch(..., {mode: 'no-cors'})` and `text/plain` (no preflight), and tries a
/// body-less connect: the client refuses both (its log shows they arrived) and its servers and
/// connection are unchanged.
#[tokio::test(flavor = "multi_thread")]
async fn a_page_elsewhere_cannot_import_into_the_client() {
    let Some(b) = Browser::start_if_installed().await else {
        return;
    };
    let c = tokio::task::block_in_place(start_client);
    let page = format!(
        "<!doctype html><title>cute cats</title><script>\n\
         const yaml = {yaml};\n\
         Promise.allSettled([\n\
           fetch('http://{api}/api/v1/config/import?format=yaml', {{method: 'POST', mode: 'no-cors', \
             headers: {{'Content-Type': 'text/plain'}}, body: yaml}}),\n\
           fetch('http://{api}/api/v1/connect', {{method: 'POST', mode: 'no-cors'}}),\n\
         ]).then(() => {{ document.title = 'sent'; }});\n\
         </script>",
        yaml = serde_json::to_string(ATTACKER_YAML).expect("yaml as a JS string"),
        api = c.api,
    );
    let evil = serve_page("127.0.0.2", page);
    b.goto(&format!("http://{evil}/")).await;
    b.wait_script("return document.title === 'sent';", "the page's requests")
        .await;
    let refused = |path: &str| {
        c.logs
            .lock()
            .map(|l| {
                l.iter()
                    .any(|line| line.contains("API request refused") && line.contains(path))
            })
            .unwrap_or(false)
    };
    tokio::task::block_in_place(|| {
        assert_eq!(server_names(c.api), ["home", "spare"]);
        assert!(!connected(c.api), "the page connected the client");
        // ... because the client refused them, not because they never arrived.
        assert!(
            refused("/api/v1/config/import"),
            "the import did not reach the client"
        );
        assert!(
            refused("/api/v1/connect"),
            "the connect did not reach the client"
        );
    });
    b.quit().await;
}
