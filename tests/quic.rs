//! The QUIC transport end to end: a real `switchyard server` with `server.quic.listen`, a real
//! `switchyard client` whose server entry says `protocol: QUIC`, real curl and nginx, on
//! loopback with random ports. The namespace tests (root) move the client's address in the
//! middle of a download and add loss and delay with `tc netem`.

mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{curl, spawn_with_listeners, start_nginx, Nginx, Proc, BIN};

/// A server with a QUIC listener and what it reported.
struct QuicServer {
    _proc: Proc,
    api: SocketAddr,
    quic: SocketAddr,
    http: SocketAddr,
    metrics: SocketAddr,
    fingerprint: String,
    _dir: tempfile::TempDir,
}

/// `GET path` of an API on loopback, as JSON.
fn api_get(api: SocketAddr, path: &str) -> serde_json::Value {
    let out = curl(&["-sS", "--max-time", "10", &format!("http://{api}{path}")]);
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("GET {path}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

impl QuicServer {
    fn get(&self, path: &str) -> serde_json::Value {
        api_get(self.api, path)
    }
}

/// What a test server differs in: the `*_extra` texts go into the `http` map, the `server`
/// section (whole lines), the `quic` map and the top level.
#[derive(Default)]
struct ServerShape<'a> {
    quic_listen: Option<&'a str>,
    http_extra: &'a str,
    server_extra: &'a str,
    quic_extra: &'a str,
    extra: &'a str,
}

fn quic_server_shaped(shape: &ServerShape) -> QuicServer {
    let ServerShape {
        quic_listen,
        http_extra,
        server_extra,
        quic_extra,
        extra,
    } = shape;
    let quic_listen = quic_listen.unwrap_or("127.0.0.1:0");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("server.yaml");
    let yaml = format!(
        "server:\n  http: {{ listen: \"127.0.0.1:0\"{http_extra} }}\n  socks5: {{ listen: \"127.0.0.1:0\" }}\n  cores: 2\n{server_extra}\
         \x20 data_dir: \"{data}\"\n  quic: {{ listen: \"{quic_listen}\"{quic_extra} }}\n\
         api: {{ listen: \"127.0.0.1:0\", enable_request_log: true }}\n\
         metrics: {{ enabled: true, listen: \"127.0.0.1:0\" }}\nlogging: {{ level: debug, format: json }}\n{extra}",
        data = dir.path().join("data").display()
    );
    std::fs::write(&config, yaml).expect("config");
    let mut cmd = Command::new(BIN);
    cmd.args(["server", "--config"]).arg(&config);
    let started = spawn_with_listeners(
        cmd,
        "switchyard server",
        &[
            "HTTP proxy",
            "management API",
            "QUIC transport listening",
            "metrics listening",
        ],
    );
    let [http, api, quic, metrics] = started.addrs[..] else {
        unreachable!()
    };
    let mut server = QuicServer {
        _proc: started.proc,
        api,
        quic,
        http,
        metrics,
        fingerprint: String::new(),
        _dir: dir,
    };
    let status = server.get("/api/v1/quic");
    assert_eq!(status["enabled"], true, "{status}");
    assert_eq!(status["self_signed"], true, "{status}");
    server.fingerprint = status["fingerprint"]
        .as_str()
        .expect("fingerprint")
        .to_owned();
    server
}

fn quic_server(quic_extra: &str, extra: &str) -> QuicServer {
    quic_server_shaped(&ServerShape {
        quic_extra,
        extra,
        ..Default::default()
    })
}

struct Client {
    _proc: Proc,
    http: SocketAddr,
    socks5: SocketAddr,
    api: SocketAddr,
    _dir: tempfile::TempDir,
    logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Client {
    fn get(&self, path: &str) -> serde_json::Value {
        api_get(self.api, path)
    }

    fn log_has(&self, needle: &str) -> bool {
        self.logs
            .lock()
            .map(|l| l.iter().any(|line| line.contains(needle)))
            .unwrap_or(false)
    }

    /// The server list entry `name`, once `want` holds for it (bounded wait).
    fn server_entry_when(
        &self,
        name: &str,
        want: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let list = self.get("/api/v1/servers");
            let entry = list
                .as_array()
                .or_else(|| list["servers"].as_array())
                .and_then(|a| a.iter().find(|s| s["name"] == name).cloned())
                .unwrap_or_default();
            if want(&entry) || Instant::now() > deadline {
                return entry;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A client whose only server is `entry` (a YAML flow mapping body).
fn client_with(entry: &str) -> Client {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        "proxy:\n  http: {{listen: \"127.0.0.1:0\"}}\n  socks5: {{listen: \"127.0.0.1:0\"}}\n\
         api: {{listen: \"127.0.0.1:0\"}}\nlogging: {{level: debug, format: json}}\n\
         servers:\n  - {{name: quic-gw, is_default: true, {entry}}}\n"
    );
    std::fs::write(dir.path().join("client.yaml"), yaml).expect("config");
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
        _dir: dir,
        logs: started.logs,
    }
}

fn quic_entry(server: &QuicServer, extra: &str) -> String {
    format!(
        "address: \"{}\", protocol: QUIC, fingerprint: \"{}\"{extra}",
        server.quic, server.fingerprint
    )
}

const HELLO: &[u8] = b"hello over quic";

fn origin() -> Option<Nginx> {
    start_nginx(&[("hello.txt", HELLO)])
}

fn run_curl(args: &[&str]) -> std::process::Output {
    let mut all = vec!["-sS", "--max-time", "20"];
    all.extend_from_slice(args);
    curl(&all)
}

/// (host, protocol) of what the server's request log recorded.
fn server_requests(server: &QuicServer, n: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = server.get("/api/v1/requests")["requests"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if r.len() >= n || Instant::now() > deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn curl_reaches_the_origin_through_a_quic_server_leg() {
    let Some(nginx) = origin() else { return };
    let server = quic_server("", "");
    let client = client_with(&quic_entry(&server, ""));
    let url = nginx.url("/hello.txt");
    let http = format!("http://{}", client.http);
    let socks = client.socks5.to_string();
    for (how, out) in [
        ("HTTP proxy", run_curl(&["-x", &http, &url])),
        ("CONNECT", run_curl(&["-p", "-x", &http, &url])),
        ("SOCKS5", run_curl(&["--socks5-hostname", &socks, &url])),
    ] {
        assert!(
            out.status.success(),
            "{how}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, HELLO, "{how}");
    }
    // The server routed each flow like a CONNECT and logged it as QUIC.
    let origin_host = format!("127.0.0.1:{}", nginx.port);
    let requests = server_requests(&server, 3);
    let quic_flows = requests
        .iter()
        .filter(|r| r["protocol"] == "QUIC" && r["host"] == origin_host.as_str())
        .count();
    assert!(quic_flows >= 1, "{requests:?}");
    // Every flow rode on one QUIC connection.
    let status = server.get("/api/v1/quic");
    assert_eq!(status["connections_total"], 1, "{status}");
    assert!(
        status["streams_total"].as_u64().unwrap_or(0) >= 3,
        "{status}"
    );
    let metrics = curl(&["-sS", &format!("http://{}/metrics", server.metrics)]);
    let text = String::from_utf8_lossy(&metrics.stdout);
    assert!(
        text.contains("switchyard_quic_connections_total 1"),
        "{text}"
    );
    let entry = client.server_entry_when("quic-gw", |e| e["status"] == "connected");
    assert_eq!(entry["protocol"], "QUIC", "{entry}");
    assert_eq!(entry["status"], "connected", "{entry}");
}

/// Opens a CONNECT tunnel through the client's HTTP proxy to `origin` and keeps it open.
fn open_tunnel(proxy: SocketAddr, origin: u16) -> std::net::TcpStream {
    let mut s = std::net::TcpStream::connect(proxy).expect("connect proxy");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        s,
        "CONNECT 127.0.0.1:{origin} HTTP/1.1\r\nHost: 127.0.0.1:{origin}\r\n\r\n"
    )
    .expect("CONNECT");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).expect("CONNECT answer");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

#[test]
fn a_hundred_concurrent_flows_share_one_quic_connection() {
    let Some(nginx) = origin() else { return };
    let server = quic_server("", "");
    let client = client_with(&quic_entry(&server, ""));
    let proxy = client.http;
    let port = nginx.port;
    // 100 tunnels open at once (each is a stream), then one request on each.
    let tunnels: Vec<std::net::TcpStream> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..100)
            .map(|_| scope.spawn(move || open_tunnel(proxy, port)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("tunnel"))
            .collect()
    });
    let live = server.get("/api/v1/connections")["connections"]
        .as_array()
        .map_or(0, |c| c.iter().filter(|c| c["protocol"] == "QUIC").count());
    assert!(live >= 100, "the server holds {live} QUIC flows at once");
    std::thread::scope(|scope| {
        for mut t in tunnels {
            scope.spawn(move || {
                t.write_all(b"GET /hello.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .expect("request");
                let mut answer = Vec::new();
                t.read_to_end(&mut answer).expect("answer");
                assert!(
                    answer.ends_with(HELLO),
                    "{}",
                    String::from_utf8_lossy(&answer)
                );
            });
        }
    });
    let status = server.get("/api/v1/quic");
    assert_eq!(status["connections_total"], 1, "one connection: {status}");
    assert!(
        status["streams_total"].as_u64().unwrap_or(0) >= 100,
        "{status}"
    );
}

#[test]
fn quic_flows_count_toward_the_servers_max_connections() {
    let Some(nginx) = origin() else { return };
    let server = quic_server_shaped(&ServerShape {
        server_extra: "  max_connections: 3\n",
        ..Default::default()
    });
    let client = client_with(&quic_entry(&server, ""));
    let held: Vec<_> = (0..3)
        .map(|_| open_tunnel(client.http, nginx.port))
        .collect();
    // Each flow is one connection (it was counted twice once); a fourth flow on the same QUIC
    // connection is refused by the server's limit.
    let stats = server.get("/api/v1/stats");
    assert_eq!(stats["active_connections"], 3, "{stats}");
    let out = run_curl(&[
        "-p",
        "-x",
        &format!("http://{}", client.http),
        &nginx.url("/hello.txt"),
    ]);
    assert_ne!(out.stdout, HELLO, "a fourth flow got through");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("502"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Closed flows give their places back.
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let out = run_curl(&[
            "-p",
            "-x",
            &format!("http://{}", client.http),
            &nginx.url("/hello.txt"),
        ]);
        if out.stdout == HELLO {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{out:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_wrong_pin_is_refused_with_a_clear_error() {
    let Some(nginx) = origin() else { return };
    let server = quic_server("", "");
    let wrong = "00:".repeat(31) + "00";
    let client = client_with(&format!(
        "address: \"{}\", protocol: QUIC, fingerprint: \"{wrong}\"",
        server.quic
    ));
    let out = run_curl(&[
        "-x",
        &format!("http://{}", client.http),
        &nginx.url("/hello.txt"),
    ]);
    assert_ne!(out.stdout, HELLO, "a wrong pin must not carry traffic");
    let entry = client.server_entry_when("quic-gw", |e| e["error"].is_string());
    let error = entry["error"].as_str().unwrap_or_default();
    assert!(error.contains("does not match the pinned"), "{entry}");
    assert!(client.log_has("does not match the pinned"));
    assert_eq!(server.get("/api/v1/quic")["streams_total"], 0);
}

#[test]
fn a_wrong_token_is_refused_and_the_right_one_accepted() {
    let Some(nginx) = origin() else { return };
    let server = quic_server(", token: s3cret", "");
    let url = nginx.url("/hello.txt");
    let wrong = client_with(&quic_entry(&server, ", token: nope"));
    let out = run_curl(&["-x", &format!("http://{}", wrong.http), &url]);
    assert_ne!(out.stdout, HELLO, "a wrong token must not carry traffic");
    let entry = wrong.server_entry_when("quic-gw", |e| e["error"].is_string());
    let error = entry["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("refused this client") && error.contains("wrong token"),
        "{entry}"
    );
    assert!(server.get("/api/v1/quic")["refused"].as_u64().unwrap_or(0) >= 1);

    let right = client_with(&quic_entry(&server, ", token: s3cret"));
    let out = run_curl(&["-x", &format!("http://{}", right.http), &url]);
    assert_eq!(
        out.stdout,
        HELLO,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn proxy_credentials_authenticate_a_quic_client() {
    let Some(nginx) = origin() else { return };
    let hash = bcrypt::hash("pw", 4).expect("hash");
    let auth = format!(
        "auth:\n  mode: native\n  native:\n    users:\n      - {{username: alice, password_hash: \"{hash}\"}}\n"
    );
    let server = quic_server("", &auth);
    let url = nginx.url("/hello.txt");
    let good = client_with(&quic_entry(&server, ", username: alice, password: pw"));
    let out = run_curl(&["-x", &format!("http://{}", good.http), &url]);
    assert_eq!(
        out.stdout,
        HELLO,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bad = client_with(&quic_entry(&server, ", username: alice, password: wrong"));
    let out = run_curl(&["-x", &format!("http://{}", bad.http), &url]);
    assert_ne!(out.stdout, HELLO);
    let entry = bad.server_entry_when("quic-gw", |e| e["error"].is_string());
    assert!(
        entry["error"]
            .as_str()
            .unwrap_or_default()
            .contains("credentials of alice refused"),
        "{entry}"
    );
}

/// A UDP echo server on loopback: answers each datagram with `echo:` + the payload.
fn udp_echo() -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let addr = socket.local_addr().expect("addr");
    let handle = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            let mut out = b"echo:".to_vec();
            out.extend_from_slice(&buf[..n]);
            let _ = socket.send_to(&out, from);
        }
    });
    (addr, handle)
}

#[test]
fn socks5_udp_associate_travels_as_quic_datagrams() {
    let server = quic_server("", "");
    let client = client_with(&quic_entry(&server, ""));
    let (echo, _thread) = udp_echo();
    let (_ctl, relay) = support::socks5_udp_associate(client.socks5);
    let udp = support::udp_client();
    let std::net::SocketAddr::V4(dest) = echo else {
        unreachable!()
    };
    let (header, data) = support::udp_exchange(&udp, relay, dest, b"ping-1");
    assert_eq!(data, "echo:ping-1");
    let mut want = vec![0, 0, 0, 1];
    want.extend_from_slice(&dest.ip().octets());
    want.extend_from_slice(&dest.port().to_be_bytes());
    assert_eq!(header, want, "the reply names the echo server");
    let (_, data) = support::udp_exchange(&udp, relay, dest, b"ping-2");
    assert_eq!(data, "echo:ping-2");
    let status = server.get("/api/v1/quic");
    assert!(
        status["datagrams_received"].as_u64().unwrap_or(0) >= 2,
        "{status}"
    );
    assert_eq!(status["connections_total"], 1, "{status}");
}

#[test]
fn a_one_way_udp_flow_keeps_its_association_past_the_idle_timeout() {
    // Idle is 2 s; the client sends for 5 s and never gets a reply. A flow that only sends is
    // not idle: every datagram must leave from the same server socket (a torn-down association
    // would reopen on a new port).
    let server = quic_server_shaped(&ServerShape {
        http_extra: ", idle_timeout: 2s",
        ..Default::default()
    });
    let client = client_with(&quic_entry(&server, ""));
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").expect("sink");
    sink.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let std::net::SocketAddr::V4(dest) = sink.local_addr().expect("addr") else {
        unreachable!()
    };
    let (_ctl, relay) = support::socks5_udp_associate(client.socks5);
    let udp = support::udp_client();
    let mut dgram = vec![0, 0, 0, 1];
    dgram.extend_from_slice(&dest.ip().octets());
    dgram.extend_from_slice(&dest.port().to_be_bytes());
    dgram.extend_from_slice(b"one way");
    let mut sources = Vec::new();
    let mut buf = [0u8; 256];
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        udp.send_to(&dgram, relay).expect("send");
        let sent = std::time::Instant::now();
        while sent.elapsed() < Duration::from_millis(400) {
            if let Ok((_, from)) = sink.recv_from(&mut buf) {
                sources.push(from);
            }
        }
    }
    assert!(sources.len() >= 8, "too few datagrams arrived: {sources:?}");
    sources.dedup();
    assert_eq!(
        sources.len(),
        1,
        "the association was reopened: {sources:?}"
    );
}

#[test]
fn blocked_udp_falls_back_to_the_tcp_proxy() {
    let Some(nginx) = origin() else { return };
    let server = quic_server("", "");
    // A UDP port that swallows everything: the handshake never gets an answer.
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let client = client_with(&format!(
        "address: \"{}\", protocol: QUIC, fingerprint: \"{}\", fallback: {{address: \"{}\", protocol: HTTP}}",
        sink.local_addr().expect("addr"),
        server.fingerprint,
        server.http
    ));
    let out = run_curl(&[
        "-x",
        &format!("http://{}", client.http),
        &nginx.url("/hello.txt"),
    ]);
    assert_eq!(
        out.stdout,
        HELLO,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        client.log_has("falling back to the server's TCP proxy"),
        "the fallback is logged"
    );
    // The flow went through the server's HTTP proxy (a CONNECT tunnel the client keeps
    // pooled, so it shows among the live connections), not QUIC.
    assert_eq!(server.get("/api/v1/quic")["connections_total"], 0);
    let live = server.get("/api/v1/connections")["connections"].clone();
    let requests = server.get("/api/v1/requests")["requests"].clone();
    let origin_host = format!("127.0.0.1:{}", nginx.port);
    let via_tcp = [&live, &requests]
        .iter()
        .filter_map(|v| v.as_array())
        .flatten()
        .any(|r| r["host"] == origin_host.as_str() && r["protocol"] != "QUIC");
    assert!(via_tcp, "live {live}, requests {requests}");
    drop(sink);
}

/// A user-space UDP impairment relay (the kernel here has no `sch_netem`), shared with the
/// bench's `quic` scenario: delay, seeded loss, optional outage file; prints its port.
const IMPAIR: &str = include_str!("../bench/relays/udp_impair.py");

/// Runs a relay script with `args`; its process and the loopback port it printed.
fn python_relay(name: &str, script: &str, args: &[String]) -> Option<(Proc, SocketAddr)> {
    let python = support::require("python3")?;
    let mut child = Command::new(python)
        .args(["-c", script])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("relay");
    let mut line = String::new();
    let stdout = child.stdout.take().expect("stdout");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).expect("port");
    let port: u16 = line.trim().parse().expect("relay port");
    Some((
        Proc {
            child,
            name: name.into(),
        },
        SocketAddr::from(([127, 0, 0, 1], port)),
    ))
}

fn impairment_relay(upstream: SocketAddr, delay_ms: u32, loss: f64) -> Option<(Proc, SocketAddr)> {
    let args = [
        upstream.ip().to_string(),
        upstream.port().to_string(),
        delay_ms.to_string(),
        loss.to_string(),
    ];
    python_relay("impairment relay", IMPAIR, &args)
}

/// Deterministic test content of `len` bytes.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn a_download_completes_over_delay_and_loss() {
    let body = pattern(4 << 20);
    let Some(nginx) = start_nginx(&[("big.bin", &body)]) else {
        return;
    };
    let server = quic_server("", "");
    // 25 ms each way (50 ms RTT) and 2 % of the datagrams lost in each direction
    let Some((_relay, relay_addr)) = impairment_relay(server.quic, 25, 0.02) else {
        return;
    };
    let client = client_with(&format!(
        "address: \"{relay_addr}\", protocol: QUIC, fingerprint: \"{}\"",
        server.fingerprint
    ));
    let out = curl(&[
        "-sS",
        "--max-time",
        "90",
        "-x",
        &format!("http://{}", client.http),
        &nginx.url("/big.bin"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout.len(), body.len());
    assert!(out.stdout == body, "the download arrived intact");
    // the path really had the delay: the connection's RTT shows it
    let entry = client.server_entry_when("quic-gw", |e| e["latency_ms"].as_u64() >= Some(50));
    assert!(entry["latency_ms"].as_u64() >= Some(50), "{entry}");
    assert_eq!(server.get("/api/v1/quic")["connections_total"], 1);
}

/// An HTTP origin that sends one file at about 1.3 MB/s to every request.
const SLOW_ORIGIN: &str = r#"
import socket, sys, threading, time
data = open(sys.argv[2], "rb").read()
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", int(sys.argv[1]))); srv.listen(16)
def serve(c):
    try:
        req = b""
        while b"\r\n\r\n" not in req:
            chunk = c.recv(4096)
            if not chunk:
                return
            req += chunk
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(data))
        if req.startswith(b"HEAD"):
            return
        for i in range(0, len(data), 65536):
            c.sendall(data[i:i + 65536]); time.sleep(0.05)
    finally:
        c.close()
while True:
    c, _ = srv.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Namespaces of one migration test (`syquic…`), deleted (with their links) on drop.
struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            support::netns::sh_quiet(&format!("ip netns del {ns}"));
        }
    }
}

/// `args` run inside namespace `ns`.
fn in_ns(ns: &str, program: &str) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, program]);
    cmd
}

fn ns_curl(ns: &str, args: &[&str]) -> std::process::Output {
    in_ns(ns, "curl")
        .args(args)
        .output()
        .expect("curl in netns")
}

#[test]
fn a_download_survives_the_client_changing_its_address() {
    use support::netns::{root_with_tools_or_skip, sh};
    if !root_with_tools_or_skip("QUIC migration", &["ip", "curl", "python3"]) {
        return;
    }
    let id = std::process::id() % 100_000;
    let (s_ns, c_ns) = (format!("syquic-s{id}"), format!("syquic-c{id}"));
    let _guard = Namespaces(vec![s_ns.clone(), c_ns.clone()]);
    // 10.<a>.<b>.0/24 from the pid keeps parallel runs apart
    let net = format!("10.{}.{}", 100 + id % 100, id / 100 % 250);
    let (s_if, c_if) = (format!("syqs{id}"), format!("syqc{id}"));
    sh(&format!(
        "ip netns add {s_ns} && ip netns add {c_ns} && \
         ip link add {s_if} netns {s_ns} type veth peer name {c_if} netns {c_ns} && \
         ip -n {s_ns} link set lo up && ip -n {c_ns} link set lo up && \
         ip -n {s_ns} addr add {net}.1/24 dev {s_if} && ip -n {s_ns} link set {s_if} up && \
         ip -n {c_ns} addr add {net}.2/24 dev {c_if} && ip -n {c_ns} link set {c_if} up && \
         ip netns exec {c_ns} sysctl -qw net.ipv4.conf.{c_if}.promote_secondaries=1"
    ));
    // the origin in the server's namespace: sends the file slowly (64 KiB per 50 ms), so the
    // transfer over QUIC is still running when the client's address changes
    let www = tempfile::tempdir().expect("www");
    let body = pattern(6 << 20);
    std::fs::write(www.path().join("big.bin"), &body).expect("file");
    let origin_port = 18_000 + (id % 1000) as u16;
    let _origin = Proc {
        child: in_ns(&s_ns, "python3")
            .args(["-c", SLOW_ORIGIN, &origin_port.to_string()])
            .arg(www.path().join("big.bin"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("origin"),
        name: "origin".into(),
    };
    let origin_url = format!("http://127.0.0.1:{origin_port}/big.bin");
    let waiting = Instant::now();
    while !ns_curl(&s_ns, &["-sSfI", "--max-time", "2", &origin_url])
        .status
        .success()
    {
        assert!(
            waiting.elapsed() < Duration::from_secs(20),
            "the origin does not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // the server in its namespace (QUIC on the veth address)
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("server.yaml");
    std::fs::write(
        &config,
        format!(
            "server:\n  http: {{ listen: \"127.0.0.1:0\" }}\n  socks5: {{ enabled: false }}\n  cores: 2\n\
             \x20 data_dir: \"{}\"\n  quic: {{ listen: \"{net}.1:0\" }}\n\
             api: {{ listen: \"127.0.0.1:0\" }}\nlogging: {{ level: debug, format: json }}\n",
            dir.path().join("data").display()
        ),
    )
    .expect("config");
    let mut cmd = in_ns(&s_ns, BIN);
    cmd.args(["server", "--config"]).arg(&config);
    let server = spawn_with_listeners(
        cmd,
        "switchyard server (netns)",
        &["management API", "QUIC transport listening"],
    );
    let [api, quic] = server.addrs[..] else {
        unreachable!()
    };
    let server_get = |path: &str| -> serde_json::Value {
        let out = ns_curl(
            &s_ns,
            &["-sS", "--max-time", "10", &format!("http://{api}{path}")],
        );
        serde_json::from_slice(&out.stdout).unwrap_or_default()
    };
    let fingerprint = server_get("/api/v1/quic")["fingerprint"]
        .as_str()
        .expect("fingerprint")
        .to_owned();
    // the client in its namespace
    let cdir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        cdir.path().join("client.yaml"),
        format!(
            "proxy:\n  http: {{listen: \"127.0.0.1:0\"}}\n  socks5: {{listen: \"127.0.0.1:0\"}}\n\
             api: {{listen: \"127.0.0.1:0\"}}\nlogging: {{level: debug, format: json}}\n\
             servers:\n  - {{name: quic-gw, is_default: true, address: \"{quic}\", protocol: QUIC, fingerprint: \"{fingerprint}\"}}\n"
        ),
    )
    .expect("client config");
    let mut cmd = in_ns(&c_ns, BIN);
    cmd.arg("client")
        .arg("--config")
        .arg(cdir.path().join("client.yaml"))
        .arg("--data-dir")
        .arg(cdir.path().join("data"));
    let client = spawn_with_listeners(
        cmd,
        "switchyard client (netns)",
        &["client HTTP proxy listening"],
    );
    let proxy = format!("http://{}", client.addrs[0]);
    // a slow download (about 5 s) through the client, the address moved in the middle
    let out_file = cdir.path().join("download.bin");
    let download = in_ns(&c_ns, "curl")
        .args(["-sS", "--max-time", "60", "-x", &proxy])
        .arg(&origin_url)
        .arg("-o")
        .arg(&out_file)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("download");
    let started = Instant::now();
    while std::fs::metadata(&out_file).map_or(0, |m| m.len()) < 1 << 20 {
        if started.elapsed() > Duration::from_secs(30) {
            let logs = server.logs.lock().map(|l| l.join("\n")).unwrap_or_default();
            let clogs = client.logs.lock().map(|l| l.join("\n")).unwrap_or_default();
            panic!("the download does not start\nSERVER:\n{logs}\nCLIENT:\n{clogs}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    sh(&format!(
        "ip -n {c_ns} addr add {net}.3/24 dev {c_if} && ip -n {c_ns} addr del {net}.2/24 dev {c_if}"
    ));
    let moved_at = std::fs::metadata(&out_file).map_or(0, |m| m.len());
    assert!(moved_at < body.len() as u64, "moved before the end");
    let done = download.wait_with_output().expect("curl");
    if !done.status.success() {
        let quic_lines = |logs: &std::sync::Arc<std::sync::Mutex<Vec<String>>>| {
            logs.lock()
                .map(|l| {
                    l.iter()
                        .filter(|line| line.contains("QUIC") || line.contains("quinn"))
                        .cloned()
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .unwrap_or_default()
        };
        panic!(
            "the download failed after the address change: {}\nclient:\n{}\nserver:\n{}",
            String::from_utf8_lossy(&done.stderr),
            quic_lines(&client.logs),
            quic_lines(&server.logs)
        );
    }
    let got = std::fs::read(&out_file).expect("downloaded");
    assert_eq!(got.len(), body.len());
    assert!(got == body, "the download arrived intact");
    // one connection carried it all: migrated, not reconnected
    let quic_status = server_get("/api/v1/quic");
    assert_eq!(quic_status["connections_total"], 1, "{quic_status}");
    drop(client);
}

#[test]
fn a_reconnect_resumes_with_0rtt() {
    let Some(nginx) = origin() else { return };
    let server = quic_server("", "");
    let dir = tempfile::tempdir().expect("tempdir");
    let outage = dir.path().join("outage");
    let args = [
        server.quic.ip().to_string(),
        server.quic.port().to_string(),
        "0".into(),
        "0".into(),
        outage.display().to_string(),
    ];
    let Some((_relay, relay_addr)) = python_relay("outage relay", IMPAIR, &args) else {
        return;
    };
    let client = client_with(&format!(
        "address: \"{relay_addr}\", protocol: QUIC, fingerprint: \"{}\"",
        server.fingerprint
    ));
    let url = nginx.url("/hello.txt");
    let proxy = format!("http://{}", client.http);
    assert_eq!(run_curl(&["-x", &proxy, &url]).stdout, HELLO);
    // an outage longer than the idle timeout ends the connection on both sides
    std::fs::write(&outage, b"").expect("outage");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !client.log_has("QUIC connection ended") {
        assert!(Instant::now() < deadline, "the connection did not end");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::fs::remove_file(&outage).expect("outage over");
    // the next flow reconnects with the session ticket: 0-RTT
    let out = run_curl(&["-x", &proxy, &url]);
    assert_eq!(
        out.stdout,
        HELLO,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resumed = client
        .logs
        .lock()
        .map(|l| {
            l.iter()
                .filter(|line| line.contains("QUIC connection established"))
                .map(|line| line.contains("\"zero_rtt\":true"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    assert_eq!(resumed, [false, true], "first full handshake, then 0-RTT");
    assert_eq!(server.get("/api/v1/quic")["connections_total"], 2);
}

/// QUIC Initials from `sources` distinct loopback addresses (127.0.1.1, 127.0.1.2, …: a new
/// address each, as a forged-source flood looks to the server), built by a quinn-proto client
/// endpoint and sent once; nothing answers the server's replies.
fn flood_initials(server: SocketAddr, sources: u8) {
    use std::sync::Arc;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut crypto = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    crypto.alpn_protocols = vec![switchyard_proto::quic_wire::ALPN.to_vec()];
    let crypto = quinn_proto::crypto::rustls::QuicClientConfig::try_from(crypto).expect("QUIC TLS");
    let config = quinn_proto::ClientConfig::new(Arc::new(crypto));
    let mut endpoint = quinn_proto::Endpoint::new(
        Arc::new(quinn_proto::EndpointConfig::default()),
        None,
        true,
        None,
    );
    for i in 1..=sources {
        let (_, mut conn) = endpoint
            .connect(Instant::now(), config.clone(), server, "localhost")
            .expect("connect");
        let mut buf = Vec::new();
        let transmit = conn
            .poll_transmit(Instant::now(), 1, &mut buf)
            .expect("an Initial");
        let socket = std::net::UdpSocket::bind(("127.0.1.".to_owned() + &i.to_string(), 0))
            .expect("bind a loopback source");
        socket
            .send_to(&buf[..transmit.size], server)
            .expect("send the Initial");
    }
}

/// Issue 29: Initials from many addresses cost the server at most a budget of TLS handshakes
/// (16) at once; the rest are answered with stateless Retry packets, and a real client (which
/// echoes the Retry token) still connects and transfers during the flood.
#[test]
fn a_flood_of_initials_gets_retries_and_a_real_client_still_connects() {
    let Some(nginx) = origin() else { return };
    let server = quic_server(", max_connections: 64", "");
    flood_initials(server.quic, 200);
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut status = server.get("/api/v1/quic");
    while status["retries"].as_u64().unwrap_or(0) < 200 - 16 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        status = server.get("/api/v1/quic");
    }
    assert_eq!(status["retries"], 200 - 16, "{status}");
    assert_eq!(status["connections_total"], 16, "{status}");

    let client = client_with(&quic_entry(&server, ""));
    let out = run_curl(&[
        "-x",
        &format!("http://{}", client.http),
        &nginx.url("/hello.txt"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, HELLO);
    let status = server.get("/api/v1/quic");
    // the client got a Retry too (16 handshakes still hang), echoed it, and was served
    assert_eq!(status["connections_total"], 17, "{status}");
    assert!(
        status["retries"].as_u64().unwrap_or(0) > 200 - 16,
        "{status}"
    );
    let metrics = curl(&["-sS", &format!("http://{}/metrics", server.metrics)]);
    assert!(
        String::from_utf8_lossy(&metrics.stdout).contains("switchyard_quic_retries_total"),
        "metrics"
    );
}

/// `server.quic.max_connections_per_client` refuses a client address's connections past it.
#[test]
fn connections_past_the_per_client_cap_are_refused() {
    let Some(nginx) = origin() else { return };
    let server = quic_server(", max_connections_per_client: 1", "");
    let url = nginx.url("/hello.txt");
    let fetch = |client: &Client| {
        let out = run_curl(&[
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-x",
            &format!("http://{}", client.http),
            &url,
        ]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let first = client_with(&quic_entry(&server, ""));
    assert_eq!(fetch(&first), "200");
    let second = client_with(&quic_entry(&server, ""));
    assert_ne!(
        fetch(&second),
        "200",
        "a second connection from 127.0.0.1 was served"
    );
    let status = server.get("/api/v1/quic");
    assert_eq!(status["connections_total"], 1, "{status}");
    assert!(
        status["refused_by_limits"].as_u64().unwrap_or(0) >= 1,
        "{status}"
    );
    // the first client's connection is unaffected
    assert_eq!(fetch(&first), "200");
}
