//! End-to-end: the real `switchyard server` with curl and real peer programs on loopback.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream, UdpSocket};
use std::time::Duration;
use support::*;

const PAGE: &[u8] = b"hello from nginx\n";

fn big_file() -> Vec<u8> {
    (0..3_000_000u32).map(|i| (i % 251) as u8).collect()
}

#[test]
fn http_proxy_keeps_client_alive_and_pools_origin_connections() {
    let big = big_file();
    let Some(origin) = start_nginx(&[("index.html", PAGE), ("big.bin", &big)]) else {
        return;
    };
    let server = start_server("");
    let proxy = format!("http://{}", server.http);
    // 20 requests in one curl invocation: curl reuses one client connection.
    let url = origin.url("/index.html");
    let mut args = vec!["-sS", "-v", "-x", &proxy];
    for _ in 0..20 {
        args.push(&url);
    }
    let out = curl(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, PAGE.repeat(20));
    let verbose = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        verbose.matches("Re-using existing connection").count(),
        19,
        "{verbose}"
    );

    // The origin saw the requests on pooled keep-alive connections, not one per request.
    let log = origin.access_log(20);
    let index_lines: Vec<_> = log.iter().filter(|l| l.2.contains("/index.html")).collect();
    assert_eq!(index_lines.len(), 20);
    let connections: std::collections::HashSet<u64> = index_lines.iter().map(|l| l.0).collect();
    assert!(
        connections.len() <= 2,
        "origin connections: {connections:?}"
    );
    assert!(
        index_lines.iter().any(|l| l.1 >= 10),
        "no connection carried many requests: {log:?}"
    );

    // A large body arrives intact (Content-Length framing through pooled buffers).
    let out = curl(&["-sS", "-x", &proxy, &origin.url("/big.bin")]);
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), big.len());
    assert!(out.stdout == big);

    let stats = server.api_get("/api/v1/stats");
    assert!(
        stats["bytes_sent"].as_u64().unwrap_or(0) >= big.len() as u64,
        "{stats}"
    );
    assert!(
        stats["total_connections"].as_u64().unwrap_or(0) >= 2,
        "{stats}"
    );
}

#[test]
fn request_bodies_content_length_and_chunked() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let server = start_server("");
    let proxy = format!("http://{}", server.http);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("body");
    std::fs::write(&file, "x".repeat(200_000)).expect("body");
    // PUT with Content-Length, then with a chunked body; nginx (DAV) stores them and the
    // stored files must equal what was sent.
    let sent = std::fs::read(&file).expect("read");
    for (name, extra) in [
        ("fixed", None),
        ("chunked", Some("Transfer-Encoding: chunked")),
    ] {
        let url = origin.url(&format!("/upload/{name}"));
        let mut args = vec![
            "-sS",
            "-f",
            "-x",
            &proxy,
            "-T",
            file.to_str().expect("path"),
            &url,
        ];
        if let Some(h) = extra {
            args.extend(["-H", h]);
        }
        let out = curl(&args);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stored =
            std::fs::read(origin.dir.path().join("www/upload").join(name)).expect("stored");
        assert!(
            stored == sent,
            "{name}: stored {} bytes, sent {}",
            stored.len(),
            sent.len()
        );
    }
}

#[test]
fn connect_tunnel_and_socks5_reach_the_origin() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let server = start_server("");
    let url = format!("http://localhost:{}/index.html", origin.port);
    let out = curl(&["-sS", "-p", "-x", &format!("http://{}", server.http), &url]);
    assert_eq!(out.stdout, PAGE, "{}", String::from_utf8_lossy(&out.stderr));
    let out = curl(&["-sS", "--socks5-hostname", &server.socks5.to_string(), &url]);
    assert_eq!(out.stdout, PAGE, "{}", String::from_utf8_lossy(&out.stderr));
    let out = curl(&[
        "-sS",
        "--socks5",
        &server.socks5.to_string(),
        &origin.url("/index.html"),
    ]);
    assert_eq!(out.stdout, PAGE);
    assert_eq!(server.wait_idle(), 0);
}

/// A minimal system without CA certificates (the appliance's first image had none): the server
/// used to panic building the provider API client; now it serves and logs what to install. The
/// client is built only when a provider backend needs it (it loads every CA certificate), so a
/// server without one never says a word about certificates.
#[test]
fn serves_on_a_system_without_ca_certificates() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let no_certs = [
        ("SSL_CERT_FILE", std::ffi::OsStr::new("/dev/null")),
        ("SSL_CERT_DIR", std::ffi::OsStr::new("/nonexistent")),
    ];
    let start = |extra: &str| {
        let dir = tempfile::tempdir().expect("tempdir");
        let config_path = dir.path().join("server.yaml");
        std::fs::write(
            &config_path,
            format!(
                "server:\n  http: {{ listen: \"127.0.0.1:0\" }}\n  socks5: {{ listen: \"127.0.0.1:0\" }}\n\
                 api: {{ listen: \"127.0.0.1:0\" }}\nlogging: {{ level: info, format: json }}\n{extra}"
            ),
        )
        .expect("write config");
        start_server_with_env(dir, config_path, &no_certs)
    };
    let logs = |server: &Server| server.logs.lock().map(|l| l.join("\n")).unwrap_or_default();

    let server = start("");
    let out = curl(&[
        "-sS",
        "-x",
        &format!("http://{}", server.http),
        &origin.url("/index.html"),
    ]);
    assert_eq!(out.stdout, PAGE, "{}", String::from_utf8_lossy(&out.stderr));
    let logs_without = logs(&server);
    assert!(
        !logs_without.contains("install ca-certificates"),
        "no provider backend, yet the provider API client was built: {logs_without}"
    );
    drop(server);

    // A provider backend (its API on a closed loopback port) needs the client at once.
    let dead = free_port();
    let server = start(&format!(
        "backends:\n  - {{name: nord, type: nordvpn, config: {{country: se, \
         private_key: \"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\", \
         api_url: \"http://127.0.0.1:{dead}\"}}}}\n"
    ));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !logs(&server).contains("install ca-certificates") {
        assert!(
            std::time::Instant::now() < deadline,
            "no word about CA certificates: {}",
            logs(&server)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn errors_name_the_problem() {
    let server = start_server("");
    let proxy = format!("http://{}", server.http);
    let dead = free_port();
    let out = curl(&[
        "-sS",
        "-x",
        &proxy,
        "-w",
        "%{http_code}",
        &format!("http://127.0.0.1:{dead}/"),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.ends_with("502") && text.contains("refused"), "{text}");
    let out = curl(&[
        "-sS",
        "-x",
        &proxy,
        "-w",
        "%{http_code}",
        "http://no-such-host.invalid/",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.ends_with("502") && text.contains("no-such-host.invalid"),
        "{text}"
    );
    // SOCKS5: connection refused is reply 5, which curl reports as such.
    let out = curl(&[
        "-sS",
        "--socks5",
        &server.socks5.to_string(),
        &format!("http://127.0.0.1:{dead}/"),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        err.contains("(5)"),
        "reply 5 (connection refused) expected: {err}"
    );
}

fn raw_exchange(addr: std::net::SocketAddr, request: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let _ = s.write_all(request);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

#[test]
fn bad_input_gets_the_right_answer_and_leaks_nothing() {
    let server = start_server("");
    let r = raw_exchange(server.http, b"NOT A REQUEST\r\n\r\n");
    assert!(
        r.starts_with(b"HTTP/1.1 400"),
        "{}",
        String::from_utf8_lossy(&r)
    );
    let huge = format!(
        "GET http://127.0.0.1/ HTTP/1.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(70_000)
    );
    let r = raw_exchange(server.http, huge.as_bytes());
    assert!(
        r.starts_with(b"HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&r[..r.len().min(100)])
    );
    let r = raw_exchange(server.http, b"GET /relative HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(r.starts_with(b"HTTP/1.1 400"));
    // SOCKS4 greeting to the SOCKS5 port: closed without a reply.
    assert!(raw_exchange(server.socks5, b"\x04\x01\x00\x50\x7f\x00\x00\x01\x00").is_empty());
    // BIND: "command not supported" (7).
    let r = raw_exchange(
        server.socks5,
        b"\x05\x01\x00\x05\x02\x00\x01\x7f\x00\x00\x01\x00\x50",
    );
    assert_eq!(&r[..2], b"\x05\x00");
    assert_eq!(r.get(3), Some(&7), "{r:?}");
    // Unknown address type: 8.
    let r = raw_exchange(
        server.socks5,
        b"\x05\x01\x00\x05\x01\x00\x09\x7f\x00\x00\x01\x00\x50",
    );
    assert_eq!(r.get(3), Some(&8), "{r:?}");

    // 1,000 bad connections of several kinds, some half-sent and abandoned.
    let garbage: [&[u8]; 5] = [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        b"GET http://x/ HTTP/1.1\r\nHost",
        b"\r\n\r\n\r\n",
        b"CONNECT :0 HTTP/1.1\r\n\r\n",
        b"\x05\xff",
    ];
    let mut held = Vec::new();
    for i in 0..1000 {
        let target = if i % 2 == 0 {
            server.http
        } else {
            server.socks5
        };
        let Ok(mut s) = TcpStream::connect(target) else {
            continue;
        };
        let _ = s.write_all(garbage[i % garbage.len()]);
        if i % 3 == 0 {
            let _ = s.shutdown(Shutdown::Both);
        } else {
            held.push(s);
        }
        if held.len() > 200 {
            held.clear();
        }
    }
    drop(held);
    assert_eq!(server.wait_idle(), 0, "connections leaked");
}

#[test]
fn slow_headers_are_cut_off() {
    // The default header timeout is 10s; this server uses 1s.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.yaml");
    std::fs::write(
        &path,
        "server:\n  http: { listen: \"127.0.0.1:0\", header_timeout: 1s }\n  socks5: { listen: \"127.0.0.1:0\" }\n\
         api: { listen: \"127.0.0.1:0\" }\nlogging: { level: info, format: json }\n",
    )
    .expect("write");
    let server = start_server_with_file(dir, path);
    let mut s = TcpStream::connect(server.http).expect("connect");
    s.write_all(b"GET http://127.0.0.1/ HTTP/1.1\r\n")
        .expect("write");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    assert!(
        out.starts_with(b"HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&out)
    );
}

fn alice_config() -> String {
    let hash = bcrypt::hash("wonderland", 4).expect("hash");
    format!("auth:\n  mode: native\n  native:\n    users:\n      - username: alice\n        password_hash: \"{hash}\"\n")
}

#[test]
fn proxy_authentication_native_users() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let server = start_server(&alice_config());
    let proxy = format!("http://{}", server.http);
    let url = origin.url("/index.html");
    assert_eq!(http_code(&["-x", &proxy, &url]), "407");
    let out = curl(&["-sS", "-D", "-", "-o", "/dev/null", "-x", &proxy, &url]);
    let head = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(head.contains("proxy-authenticate: basic"), "{head}");
    assert_eq!(http_code(&["-x", &proxy, "-U", "alice:wrong", &url]), "407");
    let out = curl(&["-sS", "-x", &proxy, "-U", "alice:wonderland", &url]);
    assert_eq!(out.stdout, PAGE);
    // CONNECT with credentials.
    let out = curl(&["-sS", "-p", "-x", &proxy, "-U", "alice:wonderland", &url]);
    assert_eq!(out.stdout, PAGE);
    // SOCKS5: username/password (RFC 1929).
    let socks = format!("socks5h://alice:wonderland@{}", server.socks5);
    let out = curl(&["-sS", "-x", &socks, &url]);
    assert_eq!(out.stdout, PAGE, "{}", String::from_utf8_lossy(&out.stderr));
    let socks = format!("socks5h://alice:nope@{}", server.socks5);
    let out = curl(&["-sS", "-x", &socks, &url]);
    assert!(!out.status.success());
}

#[test]
fn failed_proxy_authentications_are_throttled_per_client() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let server = start_server(&alice_config());
    let proxy = format!("http://{}", server.http);
    let url = origin.url("/index.html");
    let status = |source: &str, user: &str| {
        http_code(&["--interface", source, "-x", &proxy, "-U", user, &url])
    };
    // Ten wrong guesses (known and unknown users) spend 127.0.0.5's failure budget...
    for i in 0..10 {
        let user = if i % 2 == 0 {
            format!("alice:guess{i}")
        } else {
            format!("mallory:guess{i}")
        };
        assert_eq!(status("127.0.0.5", &user), "407", "guess {i}");
    }
    // ...so even the right password is now refused there, unverified, on every protocol...
    assert_eq!(status("127.0.0.5", "alice:wonderland"), "407");
    let socks = format!("socks5h://alice:wonderland@{}", server.socks5);
    let out = curl(&["-sS", "--interface", "127.0.0.5", "-x", &socks, &url]);
    assert!(!out.status.success(), "SOCKS5 from a throttled client");
    let out = curl(&[
        "-sS",
        "--interface",
        "127.0.0.5",
        "-p",
        "-x",
        &proxy,
        "-U",
        "alice:wonderland",
        &url,
    ]);
    assert!(!out.status.success(), "CONNECT from a throttled client");
    // ...while another client is not affected.
    assert_eq!(status("127.0.0.6", "alice:wonderland"), "200");
    let out = curl(&["-sS", "--interface", "127.0.0.6", "-x", &socks, &url]);
    assert_eq!(out.stdout, PAGE);
}

#[test]
fn rate_limit_budget_survives_a_reload() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let limits = "rate_limit:\n  enabled: true\n  requests_per_second: 0.01\n  burst_size: 2\n  per_ip: true\n";
    let server = start_server(limits);
    let proxy = format!("http://{}", server.http);
    let code = || http_code(&["-x", &proxy, &origin.url("/index.html")]);
    // A CONNECT tunnel opened before the reload keeps the old snapshot.
    let mut tunnel = TcpStream::connect(server.http).expect("connect");
    write!(
        tunnel,
        "CONNECT 127.0.0.1:{} HTTP/1.1\r\nHost: x\r\n\r\n",
        origin.port
    )
    .expect("connect req");
    let mut established = [0u8; 39];
    tunnel.read_exact(&mut established).expect("established");
    assert_eq!(code(), "200");
    assert_eq!(code(), "429", "burst of 2 spent (CONNECT + one request)");
    // Reload with a changed (still tiny) rate: the spent budget must stay spent.
    let yaml = std::fs::read_to_string(&server.config_path).expect("config");
    std::fs::write(
        &server.config_path,
        yaml.replace("requests_per_second: 0.01", "requests_per_second: 0.02"),
    )
    .expect("write config");
    let (status, body) = api_call(&server, "POST", "/api/v1/config/reload", None, None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(code(), "429", "a reload must not hand out a fresh budget");
    let status = std::process::Command::new("kill")
        .args(["-HUP", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(code(), "429", "nor a SIGHUP");
    drop(tunnel);
}

#[test]
fn access_control_serves_listed_clients_only() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let url = origin.url("/index.html");
    let fetch = |proxy_flag: &str, proxy: &str, source: &str| {
        curl(&["-sS", "--interface", source, proxy_flag, proxy, &url])
    };
    // Only 127.0.0.2 is listed: it is served, 127.0.0.1 is refused (HTTP and SOCKS5).
    let server = start_server("access_control:\n  whitelist: [\"127.0.0.2\"]\n");
    let (http, socks) = (format!("http://{}", server.http), server.socks5.to_string());
    let out = fetch("-x", &http, "127.0.0.2");
    assert_eq!(out.stdout, PAGE, "{}", String::from_utf8_lossy(&out.stderr));
    let out = fetch("--socks5", &socks, "127.0.0.2");
    assert_eq!(out.stdout, PAGE, "{}", String::from_utf8_lossy(&out.stderr));
    let out = fetch("-x", &http, "127.0.0.1");
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let out = fetch("--socks5", &socks, "127.0.0.1");
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    // The blacklist wins over the default whitelist (local networks).
    let server = start_server("access_control:\n  blacklist: [\"127.0.0.1\"]\n");
    let socks = server.socks5.to_string();
    let out = fetch("--socks5", &socks, "127.0.0.1");
    assert!(!out.status.success());
    let out = fetch("--socks5", &socks, "127.0.0.3");
    assert_eq!(out.stdout, PAGE, "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn default_access_control_is_local_networks_and_logged() {
    // No access_control section: the start-up log says who the proxies serve.
    let server = start_server("");
    let logs = server.logs.lock().expect("logs").join("\n");
    let listening: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("proxy listening") || l.contains("(and CONNECT) listening"))
        .collect();
    assert_eq!(listening.len(), 2, "{logs}");
    for line in listening {
        assert!(
            line.contains("127.0.0.0/8, 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 169.254.0.0/16, ::1/128, fe80::/10, fc00::/7"),
            "{line}"
        );
    }
    assert!(!logs.contains("forwards for every address"), "{logs}");
    let server = start_server("access_control: { whitelist: [] }\n");
    let logs = server.logs.lock().expect("logs").join("\n");
    assert!(logs.contains("every address"), "{logs}");
}

#[test]
fn rate_limit_answers_429() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let server = start_server("rate_limit:\n  enabled: true\n  requests_per_second: 0.01\n  burst_size: 2\n  per_ip: true\n");
    let proxy = format!("http://{}", server.http);
    let codes: Vec<String> = (0..3)
        .map(|_| http_code(&["-x", &proxy, &origin.url("/index.html")]))
        .collect();
    assert_eq!(codes, ["200", "200", "429"]);
}

#[test]
fn routes_to_upstream_http_proxy_and_socks5() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let Some(tinyproxy) = require("tinyproxy") else {
        return;
    };
    let Some(microsocks) = require("microsocks") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let tp_port = free_port();
    let tp_conf = dir.path().join("tinyproxy.conf");
    std::fs::write(
        &tp_conf,
        format!("Port {tp_port}\nListen 127.0.0.1\nTimeout 60\nMaxClients 50\nAllow 127.0.0.1\nLogLevel Error\n"),
    )
    .expect("tinyproxy conf");
    let _tp = start_peer(
        &tinyproxy,
        &["-d", "-c", tp_conf.to_str().expect("path")],
        tp_port,
    );
    // microsocks connects out from 127.0.0.3, so the origin below sees which way a request
    // came: through microsocks (peer=127.0.0.3) or not (peer=127.0.0.1).
    let ms_port = free_port();
    let ms_port_s = ms_port.to_string();
    let _ms = start_peer(
        &microsocks,
        &[
            "-i",
            "127.0.0.1",
            "-p",
            &ms_port_s,
            "-u",
            "bob",
            "-P",
            "builder",
            "-b",
            "127.0.0.3",
        ],
        ms_port,
    );
    let peer_origin = start_recorder_on("127.0.0.4", |_| 200);

    let port = origin.port;
    // Route by destination: 127.0.0.1 via tinyproxy, 127.0.0.4 via microsocks (with auth).
    let server2 = start_server(&format!(
        "backends:\n  - {{ name: tiny, type: httpproxy, http_proxy: {{ address: \"127.0.0.1:{tp_port}\" }} }}\n\
         \x20 - {{ name: micro, type: socks5_proxy, socks5: {{ address: \"127.0.0.1:{ms_port}\", username: bob, password: builder }} }}\n\
         routes:\n  - {{ name: v4, domains: [\"127.0.0.1\"], backend: tiny }}\n\
         \x20 - {{ name: other, domains: [\"127.0.0.4\"], backend: micro }}\n"
    ));
    let proxy2 = format!("http://{}", server2.http);
    // tinyproxy marks what it relays with a Via header.
    let out = curl(&[
        "-sS",
        "-D",
        "-",
        "-x",
        &proxy2,
        &format!("http://127.0.0.1:{port}/index.html"),
    ]);
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(text.ends_with("hello from nginx\n"), "{text}");
    assert!(
        text.contains("\nvia: ") && text.contains("tinyproxy"),
        "via tinyproxy: {text}"
    );
    let micro_url = format!("http://127.0.0.4:{}/page", peer_origin.port);
    let out = curl(&["-sS", "-x", &proxy2, &micro_url]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "peer=127.0.0.3\n",
        "via microsocks: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = curl(&[
        "-sS",
        "--socks5-hostname",
        &server2.socks5.to_string(),
        &micro_url,
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "peer=127.0.0.3\n");
    let backends = server2.api_get("/api/v1/backends");
    let total = |name: &str| {
        backends
            .as_array()
            .into_iter()
            .flatten()
            .chain(backends["backends"].as_array().into_iter().flatten())
            .find(|b| b["name"] == name)
            .and_then(|b| b["stats"]["total_connections"].as_u64())
            .unwrap_or(0)
    };
    assert!(total("tiny") >= 1, "{backends}");
    assert!(total("micro") >= 2, "{backends}");
}

/// A stand-in upstream proxy that accepts only the backend's credentials.
fn wants_backend_credentials(head: &str) -> u16 {
    let head = head.to_ascii_lowercase();
    // base64("svc:s3cret"), lower-cased like the head
    if head.contains("\r\nproxy-authorization: basic c3zjonmzy3jlda==") {
        200
    } else {
        407
    }
}

#[test]
fn httpproxy_backend_forwards_plain_http_in_absolute_form_with_its_credentials() {
    let upstream = start_recorder(wants_backend_credentials);
    let server = start_server(&format!(
        "backends:\n  - {{ name: corp, type: httpproxy, http_proxy: {{ address: \"127.0.0.1:{p}\", username: svc, password: s3cret }} }}\n\
         \x20 - {{ name: nocreds, type: httpproxy, http_proxy: {{ address: \"127.0.0.1:{p}\" }} }}\n\
         routes:\n  - {{ name: corp, domains: [\"*.invalid\"], backend: corp }}\n\
         \x20 - {{ name: bare, domains: [\"bare.invalid\"], backend: nocreds, priority: 10 }}\n",
        p = upstream.port
    ));
    let proxy = format!("http://{}", server.http);
    // Names that resolve nowhere: only the upstream proxy can "reach" them. Two requests on one
    // client connection; the client's own Proxy-Authorization must not travel upstream.
    let out = curl(&[
        "-sS",
        "-x",
        &proxy,
        "-H",
        "Proxy-Authorization: Basic Y2xpZW50OnB3",
        "http://origin.invalid:8080/a?x=1",
        "http://other.invalid/b",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "peer=127.0.0.1\npeer=127.0.0.1\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen[0]
            .head
            .starts_with("GET http://origin.invalid:8080/a?x=1 HTTP/1.1\r\n"),
        "{seen:?}"
    );
    assert!(
        seen[1]
            .head
            .starts_with("GET http://other.invalid/b HTTP/1.1\r\n"),
        "{seen:?}"
    );
    for s in &seen {
        let head = s.head.to_ascii_lowercase();
        assert!(head.contains("\r\nhost: "), "{head}");
        assert!(
            !head.contains("y2xpzw50onb3"),
            "client credentials leaked: {head}"
        );
    }
    assert_eq!(
        seen[0].connection, seen[1].connection,
        "the second request reuses the pooled upstream connection: {seen:?}"
    );
    // The upstream refuses a backend without credentials: the client gets a 502, not a 407 it
    // could never answer.
    assert_eq!(http_code(&["-x", &proxy, "http://bare.invalid/"]), "502");
}

/// A squid configuration with Debian's stock ACLs and http_access rules (squid 5.7,
/// /etc/squid/squid.conf), on its own port and directory. `ssl_port` is added to SSL_ports as an
/// administrator would for an HTTPS service on a non-standard port.
fn stock_squid_conf(dir: &std::path::Path, port: u16, ssl_port: u16) -> String {
    let d = dir.display();
    format!(
        "acl localnet src 0.0.0.1-0.255.255.255\nacl localnet src 10.0.0.0/8\nacl localnet src 100.64.0.0/10\n\
         acl localnet src 169.254.0.0/16\nacl localnet src 172.16.0.0/12\nacl localnet src 192.168.0.0/16\n\
         acl localnet src fc00::/7\nacl localnet src fe80::/10\n\
         acl SSL_ports port 443\nacl SSL_ports port {ssl_port}\n\
         acl Safe_ports port 80\nacl Safe_ports port 21\nacl Safe_ports port 443\nacl Safe_ports port 70\n\
         acl Safe_ports port 210\nacl Safe_ports port 1025-65535\nacl Safe_ports port 280\n\
         acl Safe_ports port 488\nacl Safe_ports port 591\nacl Safe_ports port 777\n\
         http_access deny !Safe_ports\nhttp_access deny CONNECT !SSL_ports\n\
         http_access allow localhost manager\nhttp_access deny manager\n\
         http_access allow localhost\nhttp_access deny all\n\
         http_port 127.0.0.1:{port}\nvisible_hostname sygw1-squid\ncache deny all\n\
         access_log stdio:{d}/access.log squid\ncache_log {d}/cache.log\ncache_store_log none\n\
         pid_filename {d}/squid.pid\ncoredump_dir {d}\npinger_enable off\nshutdown_lifetime 0 seconds\n"
    )
}

#[test]
fn httpproxy_backend_through_stock_squid() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let Some(squid) = require("squid") else {
        return;
    };
    let tls_ish = start_recorder(|_| 200);
    let dir = tempfile::tempdir().expect("tempdir");
    // squid drops root privileges to its own user, which must write the logs here.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let squid_port = free_port();
    let conf = dir.path().join("squid.conf");
    std::fs::write(
        &conf,
        stock_squid_conf(dir.path(), squid_port, tls_ish.port),
    )
    .expect("conf");
    let _squid = start_peer(
        &squid,
        &["-N", "-f", conf.to_str().expect("path")],
        squid_port,
    );
    let access_log = || std::fs::read_to_string(dir.path().join("access.log")).unwrap_or_default();
    let server = start_server(&format!(
        "backends:\n  - {{ name: corp, type: httpproxy, http_proxy: {{ address: \"127.0.0.1:{squid_port}\" }} }}\n\
         routes:\n  - {{ name: all, domains: [\"*\"], backend: corp }}\n"
    ));
    let proxy = format!("http://{}", server.http);

    // Plain HTTP to a port squid does not allow CONNECT to: forwarded as an absolute-form GET.
    let url = origin.url("/index.html");
    let out = curl(&["-sS", "-D", "-", "-x", &proxy, &url]);
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(text.starts_with("http/1.1 200"), "{text}");
    assert!(text.ends_with("hello from nginx\n"), "{text}");
    assert!(text.contains("sygw1-squid"), "squid's Via header: {text}");
    let wanted = format!("GET {url} ");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !access_log().contains(&wanted) {
        assert!(
            std::time::Instant::now() < deadline,
            "squid's access log lacks {wanted}: {}",
            access_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // CONNECT to an SSL port is tunnelled through squid.
    let tunnelled = format!("http://127.0.0.1:{}/t", tls_ish.port);
    let out = curl(&["-sS", "-p", "-x", &proxy, &tunnelled]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "peer=127.0.0.1\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // CONNECT to any other port is squid's stock refusal, reported as a bad gateway.
    let out = curl(&[
        "-s",
        "-p",
        "-o",
        "/dev/null",
        "-w",
        "%{http_connect}",
        "-x",
        &proxy,
        &url,
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "502");
    let wanted_connect = format!("CONNECT 127.0.0.1:{} ", tls_ish.port);
    let denied = "TCP_DENIED/403 ";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let log = access_log();
        if log.contains(&wanted_connect) && log.contains(denied) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "squid's access log: {log}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn socks5_udp_associate_relays_datagrams() {
    let server = start_server("");
    let echo = UdpSocket::bind("127.0.0.1:0").expect("udp");
    let echo_addr = echo.local_addr().expect("addr");
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        for _ in 0..4 {
            if let Ok((n, from)) = echo.recv_from(&mut buf) {
                let _ = echo.send_to(&buf[..n], from);
            }
        }
    });
    let (_ctl, relay) = socks5_udp_associate(server.socks5);
    let client = UdpSocket::bind("127.0.0.1:0").expect("udp");
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut dgram = vec![0, 0, 0, 1, 127, 0, 0, 1];
    dgram.extend_from_slice(&echo_addr.port().to_be_bytes());
    dgram.extend_from_slice(b"ping over udp");
    client.send_to(&dgram, relay).expect("send");
    let mut buf = [0u8; 2048];
    let (n, _) = client
        .recv_from(&mut buf)
        .expect("echo back through the relay");
    assert_eq!(&buf[..10], &dgram[..10], "header names the echo server");
    assert_eq!(&buf[10..n], b"ping over udp");
}

#[test]
fn sighup_reloads_routes_without_dropping_tunnels() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let server = start_server("");
    // A live CONNECT tunnel to nginx.
    let mut tunnel = TcpStream::connect(server.http).expect("connect");
    tunnel
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        tunnel,
        "CONNECT 127.0.0.1:{} HTTP/1.1\r\nHost: x\r\n\r\n",
        origin.port
    )
    .expect("connect req");
    let mut established = [0u8; 39];
    tunnel.read_exact(&mut established).expect("established");
    assert!(established.starts_with(b"HTTP/1.1 200"));

    // New config: 127.0.0.1 is blacklisted and routes change.
    let mut yaml = std::fs::read_to_string(&server.config_path).expect("config");
    yaml.push_str("access_control:\n  blacklist: [\"127.0.0.1/32\"]\n");
    std::fs::write(&server.config_path, yaml).expect("write config");
    let status = std::process::Command::new("kill")
        .args(["-HUP", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let out = curl(&[
            "-sS",
            "-x",
            &format!("http://{}", server.http),
            &origin.url("/index.html"),
        ]);
        if !out.status.success() {
            break; // the new snapshot refuses us
        }
        assert!(
            std::time::Instant::now() < deadline,
            "reload did not take effect"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The old tunnel still works.
    write!(
        tunnel,
        "GET /index.html HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut resp = Vec::new();
    let _ = tunnel.read_to_end(&mut resp);
    assert!(resp.ends_with(PAGE), "{}", String::from_utf8_lossy(&resp));
}

#[test]
fn pac_file_follows_the_route_table() {
    let upstream = free_port();
    let server = start_server(&format!(
        "backends:\n  - {{ name: direct, type: direct }}\n\
         \x20 - {{ name: up, type: httpproxy, http_proxy: {{ address: \"127.0.0.1:{upstream}\" }} }}\n\
         routes:\n  - {{ name: streaming, domains: [\"*.video.test\", \"cdn*.media.test\"], backend: up, priority: 10 }}\n\
         \x20 - {{ name: exception, domains: [\"direct.video.test\"], backend: direct, priority: 20 }}\n\
         \x20 - {{ name: exact, domains: [\"exact.test\"], backends: [up], priority: 5 }}\n\
         \x20 - {{ name: off, domains: [\"off.test\"], backend: up, enabled: false }}\n\
         \x20 - {{ name: rest, domains: [\"*\"], backend: direct }}\n"
    ));
    let out = curl(&[
        "-sS",
        "-D",
        "-",
        &format!("http://{}/proxy.pac", server.api),
    ]);
    let response = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, script) = response.split_once("\r\n\r\n").expect("head and body");
    assert!(
        head.to_lowercase()
            .contains("content-type: application/x-ns-proxy-autoconfig"),
        "{head}"
    );
    let wpad = curl(&["-sS", &format!("http://{}/wpad.dat", server.api)]);
    assert_eq!(String::from_utf8_lossy(&wpad.stdout), script);

    let hosts = [
        "a.video.test",
        "x.y.video.test",
        "video.test",
        "direct.video.test",
        "cdn7.media.test",
        "cdn.media.test",
        "img.media.test",
        "exact.test",
        "sub.exact.test",
        "off.test",
        "other.org",
        "EXACT.TEST",
        "a.video.test.",
    ];
    let jobs: Vec<(&str, &str)> = hosts.iter().map(|h| (script, *h)).collect();
    let results = match switchyard_proto::pac::eval_pac_with_node(&jobs) {
        Ok(r) => r,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("SKIP: node is needed to evaluate the PAC file: {e}");
            return;
        }
        Err(e) => panic!("node: {e}"),
    };
    let proxy = format!("PROXY {}:{}; DIRECT", server.api.ip(), server.http.port());
    let expected = [
        true, true, false, false, true, true, false, true, false, false, false, true, true,
    ];
    for ((host, got), via_proxy) in hosts.iter().zip(&results).zip(expected) {
        let want = if via_proxy { proxy.as_str() } else { "DIRECT" };
        assert_eq!(got, want, "host {host}");
        // The data plane routes the same way: non-direct hosts go to the (dead) upstream proxy,
        // direct ones try to resolve the test name.
        let out = curl(&[
            "-sS",
            "-x",
            &format!("http://{}", server.http),
            &format!("http://{host}/"),
        ]);
        let body = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            body.contains(&format!("127.0.0.1:{upstream}")),
            via_proxy,
            "host {host}: {body}"
        );
    }
}

/// More keep-alive clients than the old per-destination pool limit (32) on one core, all with a
/// request in flight at once, twice: the second round finds every origin connection of the
/// first in the pool, so the origin is connected to once per client and never again (with the
/// old limit, 8 of 40 connections were closed after each round and opened again).
#[test]
fn origin_connections_of_many_concurrent_clients_are_all_pooled() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};
    const CLIENTS: usize = 40;
    const ROUNDS: usize = 2;

    // The origin answers a round's requests only once all of them have arrived, so the proxy
    // holds CLIENTS origin connections at the same time.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind origin");
    let origin = listener.local_addr().expect("origin address");
    let accepted = Arc::new(AtomicUsize::new(0));
    let all_in = Arc::new(Barrier::new(CLIENTS));
    {
        let (accepted, all_in) = (accepted.clone(), all_in.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                accepted.fetch_add(1, Ordering::SeqCst);
                let all_in = all_in.clone();
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match conn.read(&mut chunk) {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buf.clear();
                        all_in.wait();
                        let reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                        if conn.write_all(reply).is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let config_path = dir.path().join("server.yaml");
    std::fs::write(
        &config_path,
        "server:\n  http: { listen: \"127.0.0.1:0\" }\n  socks5: { listen: \"127.0.0.1:0\" }\n  cores: 1\n\
         api: { listen: \"127.0.0.1:0\" }\nlogging: { level: info, format: json }\n",
    )
    .expect("write config");
    let server = start_server_with_file(dir, config_path);

    let round_done = Arc::new(Barrier::new(CLIENTS));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (proxy, round_done) = (server.http, round_done.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let mut s = TcpStream::connect(proxy).map_err(|e| e.to_string())?;
                s.set_read_timeout(Some(Duration::from_secs(20)))
                    .map_err(|e| e.to_string())?;
                for _ in 0..ROUNDS {
                    let request =
                        format!("GET http://{origin}/ HTTP/1.1\r\nHost: {origin}\r\n\r\n");
                    s.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
                    let mut got = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !got.ends_with(b"\r\n\r\nok") {
                        let n = s.read(&mut chunk).map_err(|e| e.to_string())?;
                        if n == 0 {
                            return Err(format!("proxy closed: {got:?}"));
                        }
                        got.extend_from_slice(&chunk[..n]);
                    }
                    if !got.starts_with(b"HTTP/1.1 200") {
                        return Err(String::from_utf8_lossy(&got).into_owned());
                    }
                    // every origin connection is back in the pool before the next round
                    round_done.wait();
                }
                Ok(())
            })
        })
        .collect();
    for c in clients {
        c.join().expect("client thread").expect("client");
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        CLIENTS,
        "origin connections for {CLIENTS} clients × {ROUNDS} rounds"
    );
}

/// Reads one response with a `Content-Length` body from `s`; `None` when the proxy closed first.
fn read_response(s: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).into_owned();
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .unwrap_or(0);
            while got.len() < end + 4 + len {
                let n = s.read(&mut chunk).ok()?;
                if n == 0 {
                    return None;
                }
                got.extend_from_slice(&chunk[..n]);
            }
            return Some((head, got[end + 4..end + 4 + len].to_vec()));
        }
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&chunk[..n]);
    }
}

/// An origin that promises keep-alive and then closes every connection after its first
/// response (as an origin ending an idle connection does, racing with its reuse): the pooled
/// connection is dead when the next request comes. A request without a body is retried on a
/// fresh connection, one with a body finds the connection closed before it is sent; either way
/// the client gets the origin's answer, never a 502.
#[test]
fn a_pooled_connection_the_origin_closed_is_not_used() {
    use std::sync::mpsc;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let origin = listener.local_addr().expect("addr");
    let (closed_tx, closed_rx) = mpsc::channel::<usize>();
    std::thread::spawn(move || {
        for (n, conn) in listener.incoming().enumerate() {
            let Ok(mut conn) = conn else { return };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match conn.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            let text = String::from_utf8_lossy(&head).to_lowercase();
            let body_len: usize = text
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            let mut body = vec![0u8; body_len];
            let _ = conn.read_exact(&mut body);
            let answer = format!("connection {n}");
            let _ = conn.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: keep-alive\r\n\r\n{answer}",
                    answer.len()
                )
                .as_bytes(),
            );
            // the FIN is in the proxy's socket when close(2) returns (loopback)
            drop(conn);
            let _ = closed_tx.send(n);
        }
    });
    let server = start_server("");
    let mut client = TcpStream::connect(server.http).expect("connect");
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let get = format!("GET http://{origin}/ HTTP/1.1\r\nHost: {origin}\r\n\r\n");
    let post = format!(
        "POST http://{origin}/ HTTP/1.1\r\nHost: {origin}\r\nContent-Length: 4\r\n\r\nbody"
    );
    for (i, request) in [&get, &get, &post, &get].into_iter().enumerate() {
        client.write_all(request.as_bytes()).expect("send");
        let (head, body) = read_response(&mut client).expect("a response");
        assert!(head.starts_with("HTTP/1.1 200"), "request {i}: {head}");
        // each request reached a connection of its own (the earlier ones were closed)
        assert_eq!(body, format!("connection {i}").as_bytes(), "request {i}");
        assert_eq!(
            closed_rx.recv_timeout(Duration::from_secs(10)),
            Ok(i),
            "the origin closed connection {i}"
        );
    }
}
