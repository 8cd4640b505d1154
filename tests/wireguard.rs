//! WireGuard backends end to end: a real userspace WireGuard peer (boringtun-cli with keys set
//! by `wg`) in a network namespace of its own, with nginx behind it on the tunnel address;
//! `switchyard server` in the host namespace reaches the peer's endpoint over a veth pair this
//! test creates, and proxies HTTP, CONNECT and SOCKS5 through the tunnel. The origin's access
//! log must show the tunnel address of switchyard, never a host address. Needs root (namespaces,
//! TUN); skips with a reason otherwise, fails under CI.

mod support;

use std::time::{Duration, Instant};
use support::wg_peer::*;
use support::*;

fn server_yaml(peer: &Peer, peer_public: &str) -> String {
    let settings = serde_json::to_string(&peer.settings(peer_public)).expect("json");
    format!(
        "backends:\n  - {{name: direct, type: direct}}\n  - {{name: wg, type: wireguard, wireguard: {settings}}}\n\
         routes:\n  - {{name: tunnel, domains: [\"{}\"], backend: wg, priority: 10}}\n  - {{name: rest, domains: [\"*\"], backend: direct}}\n",
        peer.origin_ip
    )
}

fn backend_healthy(server: &Server, name: &str) -> Option<bool> {
    server.api_get(&format!("/api/v1/backends/{name}"))["healthy"].as_bool()
}

fn wait_health(server: &Server, name: &str, want: bool, within: Duration) {
    let deadline = Instant::now() + within;
    while backend_healthy(server, name) != Some(want) {
        assert!(
            Instant::now() < deadline,
            "backend {name} did not become healthy={want}; log:\n{}",
            server.logs.lock().map(|l| l.join("\n")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A JSON POST to the management API: (status, body).
fn post(server: &Server, path: &str, body: &dyn std::fmt::Display) -> (u16, serde_json::Value) {
    api_call(server, "POST", path, Some(&body.to_string()), None)
}

fn body(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn http_connect_and_socks5_go_through_the_tunnel() {
    let Some((boringtun, nginx)) = prerequisites() else {
        return;
    };
    let peer = Peer::start(boringtun, nginx);
    let server = start_server(&server_yaml(&peer, &peer.peer_public));
    let url = format!("http://{}/hello.txt", peer.origin_ip);
    let proxy = format!("http://{}", server.http);
    let socks = format!("socks5://{}", server.socks5);

    let http = curl(&["-sS", "--max-time", "20", "-x", &proxy, &url]);
    assert_eq!(body(&http), "hello through the tunnel\n", "{http:?}");
    let connect = curl(&["-sS", "--max-time", "20", "-p", "-x", &proxy, &url]);
    assert_eq!(body(&connect), "hello through the tunnel\n", "{connect:?}");
    let via_socks = curl(&["-sS", "--max-time", "20", "-x", &socks, &url]);
    assert_eq!(
        body(&via_socks),
        "hello through the tunnel\n",
        "{via_socks:?}"
    );
    // Long transfers arrive whole: at full speed through CONNECT, and to a slow reader through
    // SOCKS5 (its flow's window keeps closing and reopening).
    let big_url = format!("http://{}/big.bin", peer.origin_ip);
    let download = |via: &[&str]| {
        let mut args = vec!["-sS", "--max-time", "120", "-o", "/dev/null"];
        args.extend_from_slice(via);
        args.extend_from_slice(&["-w", "%{size_download}", &big_url]);
        curl(&args)
    };
    let fast = download(&["-p", "-x", &proxy]);
    assert_eq!(body(&fast), BIG_FILE.to_string(), "{fast:?}");
    let slow = download(&["--limit-rate", "8M", "-x", &socks]);
    assert_eq!(body(&slow), BIG_FILE.to_string(), "{slow:?}");
    // And no data-plane core went down on the way (a panicking core takes its connections and
    // the tunnel with it; a transfer on another core could still have finished).
    let logs = server.logs.lock().map(|l| l.join("\n")).unwrap_or_default();
    assert!(
        !logs.contains("data-plane core stopped"),
        "a core stopped during the transfers:\n{logs}"
    );

    // The origin saw switchyard's tunnel address only.
    let log = peer.access_log_lines(5);
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 5, "five requests reached the origin:\n{log}");
    for line in &lines {
        assert!(
            line.starts_with(&format!("{} ", peer.client_ip)),
            "origin saw another address: {line}"
        );
    }
    assert_eq!(backend_healthy(&server, "wg"), Some(true));
    let stats = server.api_get("/api/v1/backends/wg/stats");
    assert!(
        stats["total_connections"].as_u64().unwrap_or(0) >= 5,
        "{stats}"
    );
    assert!(
        stats["bytes_sent"].as_u64().unwrap_or(0) >= 2 * BIG_FILE as u64,
        "{stats}"
    );

    // The connection test of the API goes through the tunnel as well.
    let target = format!(r#"{{"target": "{}:80", "timeout": "10s"}}"#, peer.origin_ip);
    let (status, result) = post(&server, "/api/v1/backends/wg/test", &target);
    assert_eq!(status, 200, "{result}");
    assert_eq!(result["status"], "ok", "{result}");
    // A closed port inside the tunnel is refused by the peer's stack, reported as such.
    let closed = format!(r#"{{"target": "{}:81", "timeout": "10s"}}"#, peer.origin_ip);
    let (_, result) = post(&server, "/api/v1/backends/wg/test", &closed);
    assert_eq!(result["status"], "failed", "{result}");
    assert!(
        result["error"]
            .as_str()
            .unwrap_or_default()
            .contains("refused"),
        "{result}"
    );
}

#[test]
fn a_lost_peer_turns_the_backend_unhealthy_and_back() {
    let Some((boringtun, nginx)) = prerequisites() else {
        return;
    };
    let mut peer = Peer::start(boringtun, nginx);
    let server = start_server(&server_yaml(&peer, &peer.peer_public));
    let proxy = format!("http://{}", server.http);
    let url = format!("http://{}/hello.txt", peer.origin_ip);
    let ok = curl(&["-sS", "--max-time", "20", "-x", &proxy, &url]);
    assert_eq!(body(&ok), "hello through the tunnel\n", "{ok:?}");
    wait_health(&server, "wg", true, Duration::from_secs(5));

    peer.stop_wireguard();
    wait_health(&server, "wg", false, Duration::from_secs(40));
    let listed = server.api_get("/api/v1/backends");
    let wg = listed
        .as_array()
        .and_then(|l| l.iter().find(|b| b["name"] == "wg"))
        .cloned()
        .expect("wg listed");
    assert_eq!(wg["healthy"], false, "{listed}");
    assert_eq!(wg["type"], "wireguard");
    let failed = curl(&[
        "-sS",
        "--max-time",
        "30",
        "-x",
        &proxy,
        "-w",
        "%{http_code}",
        "-o",
        "/dev/null",
        &url,
    ]);
    assert!(
        matches!(body(&failed).as_str(), "502" | "504"),
        "{failed:?}"
    );

    peer.start_wireguard();
    wait_health(&server, "wg", true, Duration::from_secs(40));
    let again = curl(&["-sS", "--max-time", "20", "-x", &proxy, &url]);
    assert_eq!(body(&again), "hello through the tunnel\n", "{again:?}");
}

#[test]
fn a_wrong_peer_key_is_a_clear_error() {
    let Some((boringtun, nginx)) = prerequisites() else {
        return;
    };
    let peer = Peer::start(boringtun, nginx);
    let (_, stranger) = keypair();
    let server = start_server(&server_yaml(&peer, &stranger));
    let proxy = format!("http://{}", server.http);
    let url = format!("http://{}/hello.txt", peer.origin_ip);
    let out = curl(&[
        "-sS",
        "--max-time",
        "30",
        "-x",
        &proxy,
        "-w",
        "\n%{http_code}",
        &url,
    ]);
    let text = body(&out);
    assert!(text.ends_with("\n502"), "{text}");
    assert!(
        text.contains("no WireGuard handshake answer") && text.contains("keys do not match"),
        "{text}"
    );
    wait_health(&server, "wg", false, Duration::from_secs(30));
    assert_eq!(peer.access_log(), "", "nothing reached the origin");
}

#[test]
fn a_wireguard_backend_created_through_the_api_carries_traffic_and_hides_its_keys() {
    let Some((boringtun, nginx)) = prerequisites() else {
        return;
    };
    let peer = Peer::start(boringtun, nginx);
    let server = start_server("");
    let create = serde_json::json!({"name": "wg-api", "type": "wireguard", "wireguard": peer.settings(&peer.peer_public)});
    let (status, reply) = post(&server, "/api/v1/backends", &create);
    assert_eq!(status, 201, "{reply}");
    assert_eq!(reply["type"], "wireguard");
    let mut bad = create.clone();
    bad["name"] = "wg-bad".into();
    bad["wireguard"]["private_key"] = "not a key".into();
    let (status, reply) = post(&server, "/api/v1/backends", &bad);
    assert_eq!(status, 400, "{reply}");
    assert!(reply.to_string().contains("private_key"), "{reply}");

    let route = serde_json::json!({"name": "tunnel", "domains": [peer.origin_ip], "backend": "wg-api", "priority": 10});
    let (status, reply) = post(&server, "/api/v1/routes", &route);
    assert_eq!(status, 201, "{reply}");
    let url = format!("http://{}/hello.txt", peer.origin_ip);
    let out = curl(&[
        "-sS",
        "--max-time",
        "20",
        "-x",
        &format!("http://{}", server.http),
        &url,
    ]);
    assert_eq!(body(&out), "hello through the tunnel\n", "{out:?}");

    let config = server.api_get("/api/v1/config");
    let wg = config["backends"]
        .as_array()
        .and_then(|l| l.iter().find(|b| b["name"] == "wg-api"))
        .cloned()
        .expect("listed");
    assert_eq!(wg["wireguard"]["private_key"], "********", "{wg}");
    assert_eq!(wg["wireguard"]["endpoint"], peer.endpoint.as_str(), "{wg}");
    assert!(!config.to_string().contains(&peer.client_private));

    // The OpenAPI document describes the settings object.
    let doc = server.api_get("/api/v1/openapi.json");
    let schema = &doc["components"]["schemas"]["WireguardSettings"];
    for key in [
        "private_key",
        "address",
        "public_key",
        "endpoint",
        "allowed_ips",
        "dns",
    ] {
        assert!(schema["properties"][key].is_object(), "{key} in {schema}");
    }
}

#[test]
fn a_route_fails_over_from_a_dead_tunnel_to_a_live_one() {
    let Some((boringtun, nginx)) = prerequisites() else {
        return;
    };
    let peer = Peer::start(boringtun, nginx);
    let (_, stranger) = keypair();
    let good = serde_json::to_string(&peer.settings(&peer.peer_public)).expect("json");
    let dead = serde_json::to_string(&peer.settings(&stranger)).expect("json");
    let server = start_server(&format!(
        "backends:\n  - {{name: wg-dead, type: wireguard, wireguard: {dead}}}\n  - {{name: wg-good, type: wireguard, wireguard: {good}}}\n\
         routes:\n  - {{name: tunnel, domains: [\"*\"], backends: [wg-dead, wg-good], load_balance: round_robin}}\n"
    ));
    // The connection test starts the dead tunnel; its unanswered handshake marks it unhealthy.
    let target = format!(r#"{{"target": "{}:80", "timeout": "10s"}}"#, peer.origin_ip);
    let (_, result) = post(&server, "/api/v1/backends/wg-dead/test", &target);
    assert_eq!(result["status"], "failed", "{result}");
    wait_health(&server, "wg-dead", false, Duration::from_secs(30));
    let proxy = format!("http://{}", server.http);
    let url = format!("http://{}/hello.txt", peer.origin_ip);
    for _ in 0..4 {
        let out = curl(&["-sS", "--max-time", "20", "-x", &proxy, &url]);
        assert_eq!(body(&out), "hello through the tunnel\n", "{out:?}");
    }
    assert_eq!(backend_healthy(&server, "wg-good"), Some(true));
}

#[test]
fn socks5_udp_associate_datagrams_go_through_the_tunnel() {
    let Some((boringtun, nginx)) = prerequisites() else {
        return;
    };
    let peer = Peer::start(boringtun, nginx);
    let Some(_echo) = udp_echo_in(&peer.ns) else {
        return;
    };
    let server = start_server(&server_yaml(&peer, &peer.peer_public));
    let (_ctl, relay) = socks5_udp_associate(server.socks5);
    let client = udp_client();
    // Routed to the wireguard backend: sent from switchyard's tunnel address.
    let source = echo_source(&client, relay, &peer.origin_ip, "ping over wireguard");
    assert_eq!(source, peer.client_ip);
    // A second datagram on the same association goes the same way.
    assert_eq!(
        echo_source(&client, relay, &peer.origin_ip, "again"),
        peer.client_ip
    );
    // Same association, a destination routed `direct`: over the veth, not the tunnel.
    let source = echo_source(&client, relay, &peer.endpoint_ip, "ping direct");
    assert!(source.starts_with("10."), "{source}");
    assert_ne!(source, peer.client_ip);
}

/// Opens a CONNECT tunnel to `target` through the proxy and returns the stream with the status
/// line and headers read.
fn connect_tunnel(proxy: std::net::SocketAddr, target: &str) -> (std::net::TcpStream, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(proxy).expect("connect to the proxy");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(
        stream,
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"
    )
    .expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    (stream, String::from_utf8_lossy(&head).into_owned())
}

#[test]
fn flows_beyond_max_flows_are_refused_with_an_error_and_the_tunnel_keeps_serving() {
    let Some((boringtun, nginx)) = prerequisites() else {
        return;
    };
    let peer = Peer::start(boringtun, nginx);
    let mut settings = peer.settings(&peer.peer_public);
    settings["max_flows"] = serde_json::json!(3);
    let settings = serde_json::to_string(&settings).expect("json");
    let server = start_server(&format!(
        "backends:\n  - {{name: wg, type: wireguard, wireguard: {settings}}}\n\
         routes:\n  - {{name: tunnel, domains: [\"*\"], backend: wg}}\n"
    ));
    let target = format!("{}:80", peer.origin_ip);
    // Three tunnels hold every flow the backend may open.
    let held: Vec<_> = (0..3)
        .map(|_| {
            let (stream, head) = connect_tunnel(server.http, &target);
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            stream
        })
        .collect();
    // The fourth is refused at once with the reason, not left hanging.
    let (_, head) = connect_tunnel(server.http, &target);
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    let logs = || server.logs.lock().map(|l| l.join("\n")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !logs().contains("flows (max_flows) are all in use") {
        assert!(Instant::now() < deadline, "no refusal logged:\n{}", logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    // Closed tunnels give their ports back: the next request goes through, and no core went
    // down on the way.
    drop(held);
    let proxy = format!("http://{}", server.http);
    let url = format!("http://{}/hello.txt", peer.origin_ip);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = curl(&["-sS", "--max-time", "20", "-x", &proxy, &url]);
        if body(&out) == "hello through the tunnel\n" {
            break;
        }
        assert!(Instant::now() < deadline, "{out:?}\n{}", logs());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!logs().contains("data-plane core stopped"), "{}", logs());
}
