//! End-to-end tests of the mesh registry of `switchyard server` (issue 13): the real binary
//! on loopback with a temp data directory, driven with reqwest and a real WebSocket client
//! (tokio-tungstenite) on `/api/v1/mesh/networks/{id}/events`.
//!
//! The storage tests run twice: `sqlite::NAME` (SQLite in `server.data_dir`, the default) and
//! `postgres::NAME` (a real PostgreSQL server the tests start themselves, the inventory tests'
//! harness in `inventory_pg.rs`). Without PostgreSQL the `postgres` variants skip with a printed
//! reason; with `CI` set they fail instead. No test asserts a wall-clock time: expiry waits
//! (bounded) for the `peer.left` event of a short configured lease.

mod support;

#[macro_use]
#[path = "inventory_pg.rs"]
mod pg;

use base64::Engine as _;
use futures::{SinkExt, StreamExt};
use pg::Db;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;
use support::Server;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

/// Longest wait for an expected event.
const PATIENCE: Duration = Duration::from_secs(20);

on_both_databases!(
    registry_lifecycle_survives_a_restart,
    expiry_frees_the_address_and_announces_peer_left,
    a_peer_credential_acts_on_its_own_peer_only,
    anycast_addresses_are_the_registrys_word,
    enrollment_keys_expire_are_single_use_and_revocable,
);

/// Writes the configuration (registry on, lease `lease`, metrics on, `extra` appended) into a
/// new temp dir and starts the server.
fn start(db: &Db, lease: &str, extra: &str) -> Server {
    start_with_api(db, lease, "", extra)
}

/// [`start`] with `api_fields` added to the `api:` mapping (e.g. `, token: x`).
fn start_with_api(db: &Db, lease: &str, api_fields: &str, extra: &str) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let url = match db {
        Db::Sqlite => String::new(),
        Db::Postgres(lease) => lease.database(dir.path()),
    };
    let yaml = format!(
        "server:\n  http: {{ listen: \"127.0.0.1:0\" }}\n  socks5: {{ listen: \"127.0.0.1:0\" }}\n  cores: 1\n  data_dir: {data:?}\n\
         api: {{ listen: \"127.0.0.1:0\"{api_fields} }}\nlogging: {{ level: info, format: json }}\n\
         metrics: {{ enabled: true, listen: \"127.0.0.1:0\" }}\n\
         mesh:\n  registry: {{ enabled: true, database_url: {url:?}, lease_time: {lease} }}\n{extra}"
    );
    let path = dir.path().join("server.yaml");
    std::fs::write(&path, yaml).expect("write config");
    support::start_server_with_file(dir, path)
}

/// Stops the server and starts it again on the same configuration and data.
fn restart(s: Server) -> Server {
    let Server {
        proc,
        dir,
        config_path,
        ..
    } = s;
    drop(proc);
    support::start_server_with_file(dir, config_path)
}

fn data_dir(s: &Server) -> PathBuf {
    s.dir.path().join("data")
}

/// One API call; the status and the JSON body (Null when empty).
async fn call(s: &Server, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    call_with(s, method, path, body, None).await
}

async fn call_with(
    s: &Server,
    method: Method,
    path: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> (StatusCode, Value) {
    let mut req = support::http_client().request(method, format!("http://{}{path}", s.api));
    if let Some(b) = body {
        req = req.json(&b);
    }
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("API reachable");
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    let v = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}"))
    };
    (status, v)
}

fn key(seed: u8) -> String {
    base64::engine::general_purpose::STANDARD.encode([seed; 32])
}

fn peer(id: &str, seed: u8) -> Value {
    json!({"id": id, "name": format!("peer {id}"), "public_key": key(seed),
           "endpoints": [{"address": "192.0.2.10", "port": 51820, "type": "lan", "priority": 1}]})
}

async fn register(s: &Server, network: &str, body: Value) -> (StatusCode, Value) {
    call(
        s,
        Method::POST,
        &format!("/api/v1/mesh/networks/{network}/peers"),
        Some(json!({"network_id": network, "peer": body})),
    )
    .await
}

async fn heartbeat(s: &Server, network: &str, peer: &str) -> StatusCode {
    call(
        s,
        Method::POST,
        &format!("/api/v1/mesh/networks/{network}/peers/{peer}/heartbeat"),
        None,
    )
    .await
    .0
}

fn addr(v: &Value) -> Ipv4Addr {
    v.as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("not an IPv4 address: {v}"))
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens the network's event stream with extra headers; `Err((status, body))` when refused.
async fn events(s: &Server, network: &str, headers: &[(&str, &str)]) -> Result<Ws, (u16, Value)> {
    let mut req = format!("ws://{}/api/v1/mesh/networks/{network}/events", s.api)
        .into_client_request()
        .expect("request");
    for (k, v) in headers {
        req.headers_mut().insert(
            tungstenite::http::HeaderName::from_bytes(k.as_bytes()).expect("name"),
            v.parse().expect("value"),
        );
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, _)) => Ok(ws),
        Err(tungstenite::Error::Http(resp)) => {
            let body = resp
                .body()
                .as_ref()
                .and_then(|b| serde_json::from_slice(b).ok())
                .unwrap_or(Value::Null);
            Err((resp.status().as_u16(), body))
        }
        Err(e) => panic!("WebSocket connect: {e}"),
    }
}

/// The next envelope of type `kind` (others are skipped), proving the stream with a ping
/// first so the subscription is in place before the caller acts.
async fn next_event(ws: &mut Ws, kind: &str) -> Value {
    let wait = async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) if t.as_str() == "pong" => {}
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str()).expect("envelope is JSON");
                    assert!(v["timestamp"].is_string(), "{v}");
                    if v["type"] == kind {
                        return v["data"].clone();
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

/// Sends `ping` and waits for `pong`: the session runs (and is subscribed).
async fn ping(ws: &mut Ws) {
    ws.send(Message::Text("ping".into())).await.expect("ping");
    let wait = async {
        while let Some(Ok(m)) = ws.next().await {
            if matches!(&m, Message::Text(t) if t.as_str() == "pong") {
                return;
            }
        }
        panic!("stream ended before pong");
    };
    tokio::time::timeout(PATIENCE, wait).await.expect("pong");
}

/// The metrics listener's address, from its log line.
fn metrics_addr(s: &Server) -> SocketAddr {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let lines = s.logs.lock().map(|l| l.clone()).unwrap_or_default();
        for line in lines {
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if v["fields"]["message"] == "metrics listening" {
                if let Some(a) = v["fields"]["listen"].as_str().and_then(|a| a.parse().ok()) {
                    return a;
                }
            }
        }
        assert!(std::time::Instant::now() < deadline, "no metrics listener");
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn metric(s: &Server, series: &str) -> Option<f64> {
    let text = support::http_client()
        .get(format!("http://{}/metrics", metrics_addr(s)))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

async fn create_network(s: &Server, id: &str, cidr: &str) -> Value {
    let (st, net) = call(
        s,
        Method::POST,
        "/api/v1/mesh/networks",
        Some(json!({"id": id, "name": format!("net {id}"), "cidr": cidr})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{net}");
    net
}

// ------------------------------------------------------------------ tests

async fn registry_lifecycle_survives_a_restart(db: Db) {
    let s = start(&db, "5m", "");
    let net = create_network(&s, "office", "10.77.0.0/24").await;
    assert_eq!(net["id"], "office");
    assert_eq!(net["cidr"], "10.77.0.0/24");
    assert_eq!(net["peer_count"], 0);
    assert!(net["created"].is_string());
    let (st, body) = call(
        &s,
        Method::POST,
        "/api/v1/mesh/networks",
        Some(json!({"id": "office", "name": "again", "cidr": "10.78.0.0/24"})),
    )
    .await;
    assert_eq!(
        (st, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("NETWORK_EXISTS"))
    );

    // N peers at once: distinct addresses inside the CIDR, never network or broadcast.
    const N: u8 = 12;
    let registrations = (0..N).map(|i| {
        let s = &s;
        async move { register(s, "office", peer(&format!("p{i}"), i + 1)).await }
    });
    let answers = futures::future::join_all(registrations).await;
    let mut seen = BTreeSet::new();
    for (st, body) in &answers {
        assert_eq!(*st, StatusCode::CREATED, "{body}");
        assert_eq!(body["success"], true);
        assert_eq!(body["network_cidr"], "10.77.0.0/24");
        let ip = addr(&body["virtual_ip"]);
        let [a, b, c, d] = ip.octets();
        assert_eq!((a, b, c), (10, 77, 0), "{ip} outside the CIDR");
        assert!(
            d != 0 && d != 255,
            "{ip} is the network or broadcast address"
        );
        assert!(seen.insert(ip), "{ip} leased twice");
    }
    // The last to register sees the other N-1 (with keys and endpoints, for the handshake).
    let most = answers
        .iter()
        .map(|(_, b)| b["peers"].as_array().map_or(0, Vec::len))
        .max();
    assert_eq!(most, Some(usize::from(N) - 1));
    let (_, p0) = &answers[0];
    let p0_ip = p0["virtual_ip"].clone();

    // Re-registering with the same key keeps the address; another key is refused.
    let (st, again) = register(&s, "office", peer("p0", 1)).await;
    assert_eq!(st, StatusCode::OK, "{again}");
    assert_eq!(again["virtual_ip"], p0_ip);
    let (st, body) = register(&s, "office", peer("p0", 99)).await;
    assert_eq!(
        (st, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("PUBLIC_KEY_MISMATCH")),
        "{body}"
    );

    // Listing and one peer.
    let (st, list) = call(&s, Method::GET, "/api/v1/mesh/networks/office/peers", None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(list["peers"].as_array().map(Vec::len), Some(usize::from(N)));
    let (st, one) = call(
        &s,
        Method::GET,
        "/api/v1/mesh/networks/office/peers/p3",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{one}");
    assert_eq!(one["public_key"], key(4));
    assert_eq!(one["status"], "connected");
    assert_eq!(one["endpoints"][0]["type"], "lan");
    assert!(one["joined_at"].is_string() && one["last_seen"].is_string());
    let (_, got) = call(&s, Method::GET, "/api/v1/mesh/networks/office", None).await;
    assert_eq!(got["peer_count"], N);

    // Heartbeats: 204, with the peer's own figures; 404 for unknown peer or network.
    assert_eq!(heartbeat(&s, "office", "p3").await, StatusCode::NO_CONTENT);
    let (st, _) = call(
        &s,
        Method::POST,
        "/api/v1/mesh/networks/office/peers/p3/heartbeat",
        Some(json!({"connection_type": "direct", "latency": 12.5, "bytes_sent": 1000, "bytes_received": 2000})),
    )
    .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (_, one) = call(
        &s,
        Method::GET,
        "/api/v1/mesh/networks/office/peers/p3",
        None,
    )
    .await;
    assert_eq!(
        (one["connection_type"].as_str(), one["latency"].as_f64()),
        (Some("direct"), Some(12.5))
    );
    assert_eq!(
        (one["bytes_sent"].as_u64(), one["bytes_received"].as_u64()),
        (Some(1000), Some(2000))
    );
    assert_eq!(
        heartbeat(&s, "office", "nobody").await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(heartbeat(&s, "nowhere", "p3").await, StatusCode::NOT_FOUND);

    // PATCH → peer.updated; DELETE → peer.left, over the network's WebSocket.
    let mut ws = events(&s, "office", &[]).await.expect("events stream");
    ping(&mut ws).await;
    let new_endpoints =
        json!([{"address": "198.51.100.7", "port": 41641, "type": "wan", "priority": 2}]);
    let (st, patched) = call(
        &s,
        Method::PATCH,
        "/api/v1/mesh/networks/office/peers/p5",
        Some(json!({"endpoints": new_endpoints, "metadata": {"os": "linux"}})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{patched}");
    let updated = next_event(&mut ws, "peer.updated").await;
    assert_eq!(updated["peer_id"], "p5");
    assert_eq!(updated["endpoints"], new_endpoints);
    let (_, one) = call(
        &s,
        Method::GET,
        "/api/v1/mesh/networks/office/peers/p5",
        None,
    )
    .await;
    assert_eq!(
        (&one["endpoints"], &one["metadata"]["os"]),
        (&new_endpoints, &json!("linux"))
    );
    let (st, _) = call(
        &s,
        Method::DELETE,
        "/api/v1/mesh/networks/office/peers/p6",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let left = next_event(&mut ws, "peer.left").await;
    assert_eq!(
        (left["peer_id"].as_str(), left["name"].as_str()),
        (Some("p6"), Some("peer p6"))
    );
    let (st, _) = call(
        &s,
        Method::GET,
        "/api/v1/mesh/networks/office/peers/p6",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (_, joined) = register(&s, "office", peer("late", 50)).await;
    let data = next_event(&mut ws, "peer.joined").await;
    assert_eq!(
        (&data["peer_id"], &data["virtual_ip"]),
        (&json!("late"), &joined["virtual_ip"])
    );
    drop(ws);
    assert_eq!(
        metric(&s, "switchyard_mesh_peers{network=\"office\"}").await,
        Some(f64::from(N))
    );
    assert_eq!(metric(&s, "switchyard_mesh_networks").await, Some(1.0));

    // A restart keeps networks, peers and leases.
    let before: Value = call(&s, Method::GET, "/api/v1/mesh/networks/office/peers", None)
        .await
        .1;
    let s = restart(s);
    let after: Value = call(&s, Method::GET, "/api/v1/mesh/networks/office/peers", None)
        .await
        .1;
    let view = |v: &Value| -> Vec<(String, String, String)> {
        v["peers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                (
                    p["id"].to_string(),
                    p["virtual_ip"].to_string(),
                    p["public_key"].to_string(),
                )
            })
            .collect()
    };
    assert_eq!(view(&before), view(&after));
    assert_eq!(
        after["peers"].as_array().map(Vec::len),
        Some(usize::from(N))
    );
    let (_, got) = call(&s, Method::GET, "/api/v1/mesh/networks/office", None).await;
    assert_eq!(
        (got["cidr"].as_str(), got["created"].clone()),
        (Some("10.77.0.0/24"), net["created"].clone())
    );
    assert_eq!(heartbeat(&s, "office", "p0").await, StatusCode::NO_CONTENT);
    let (st, again) = register(&s, "office", peer("p0", 1)).await;
    assert_eq!((st, &again["virtual_ip"]), (StatusCode::OK, &p0_ip));
    // The registry runs on the engine the variant names.
    let logs = s.logs.lock().map(|l| l.join("\n")).unwrap_or_default();
    let engine = match db {
        Db::Sqlite => {
            assert!(data_dir(&s).join("mesh-registry.db").exists());
            "Sqlite"
        }
        Db::Postgres(_) => "Postgres",
    };
    assert!(
        logs.lines().any(|l| l.contains("mesh registry ready")
            && l.contains(&format!("\"engine\":\"{engine}\""))),
        "no `mesh registry ready` line with engine {engine}:\n{logs}"
    );

    // Deleting the network: its stream ends, then it is gone.
    let mut ws = events(&s, "office", &[]).await.expect("events stream");
    ping(&mut ws).await;
    let (st, _) = call(&s, Method::DELETE, "/api/v1/mesh/networks/office", None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    next_event(&mut ws, "peer.left").await;
    let ended = tokio::time::timeout(PATIENCE, async {
        while let Some(Ok(m)) = ws.next().await {
            if matches!(m, Message::Close(_)) {
                return;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream of a deleted network ends");
    let (st, body) = call(&s, Method::GET, "/api/v1/mesh/networks/office", None).await;
    assert_eq!(
        (st, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("NETWORK_NOT_FOUND"))
    );
    let (_, list) = call(&s, Method::GET, "/api/v1/mesh/networks", None).await;
    assert_eq!(list["networks"], json!([]));
    assert_eq!(heartbeat(&s, "office", "p0").await, StatusCode::NOT_FOUND);
}

async fn expiry_frees_the_address_and_announces_peer_left(db: Db) {
    // A one-second lease: the sweep ends it about a second after the last heartbeat.
    let s = start(&db, "1s", "");
    create_network(&s, "lab", "10.88.0.0/29").await;
    let mut ws = events(&s, "lab", &[]).await.expect("events stream");
    ping(&mut ws).await;
    let (st, first) = register(&s, "lab", peer("a", 1)).await;
    assert_eq!(st, StatusCode::CREATED, "{first}");
    assert_eq!(first["virtual_ip"], "10.88.0.1");
    assert_eq!(next_event(&mut ws, "peer.joined").await["peer_id"], "a");

    // No heartbeat: the lease expires, peer.left is announced, the address is free.
    let left = next_event(&mut ws, "peer.left").await;
    assert_eq!(
        (left["peer_id"].as_str(), left["name"].as_str()),
        (Some("a"), Some("peer a"))
    );
    assert_eq!(heartbeat(&s, "lab", "a").await, StatusCode::CONFLICT);
    let (st, body) = call(&s, Method::GET, "/api/v1/mesh/networks/lab/peers/a", None).await;
    assert_eq!(
        (st, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("NO_LEASE"))
    );
    let (_, list) = call(&s, Method::GET, "/api/v1/mesh/networks/lab/peers", None).await;
    assert_eq!(list["peers"], json!([]));
    let (st, other) = register(&s, "lab", peer("b", 2)).await;
    assert_eq!(st, StatusCode::CREATED);
    assert_eq!(
        other["virtual_ip"], "10.88.0.1",
        "the expired lease's address is leased again"
    );

    // The expired peer registers again: a new lease (it was taken meanwhile: the next one).
    let (st, back) = register(&s, "lab", peer("a", 1)).await;
    assert_eq!(st, StatusCode::CREATED, "{back}");
    assert_eq!(back["virtual_ip"], "10.88.0.2");
    let joined = next_event(&mut ws, "peer.joined").await;
    assert_eq!(joined["peer_id"], "b");
    let joined = next_event(&mut ws, "peer.joined").await;
    assert_eq!(joined["peer_id"], "a");
    assert!(metric(&s, "switchyard_mesh_leases_expired_total").await >= Some(1.0));
    assert!(metric(&s, "switchyard_mesh_heartbeats_total{result=\"no_lease\"}").await >= Some(1.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slash_30_holds_two_peers_then_answers_network_full() {
    let s = start(&Db::Sqlite, "5m", "");
    create_network(&s, "tiny", "10.99.0.0/30").await;
    let (_, a) = register(&s, "tiny", peer("a", 1)).await;
    let (_, b) = register(&s, "tiny", peer("b", 2)).await;
    let got: BTreeSet<_> = [addr(&a["virtual_ip"]), addr(&b["virtual_ip"])].into();
    let want: BTreeSet<Ipv4Addr> =
        [Ipv4Addr::new(10, 99, 0, 1), Ipv4Addr::new(10, 99, 0, 2)].into();
    assert_eq!(got, want);
    let (st, full) = register(&s, "tiny", peer("c", 3)).await;
    assert_eq!(
        (st, full["code"].as_str()),
        (StatusCode::CONFLICT, Some("NETWORK_FULL")),
        "{full}"
    );
    assert!(
        full["message"]
            .as_str()
            .unwrap_or_default()
            .contains("10.99.0.0/30"),
        "{full}"
    );
    // A departure frees its address for the next one.
    let (st, _) = call(
        &s,
        Method::DELETE,
        "/api/v1/mesh/networks/tiny/peers/a",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, c) = register(&s, "tiny", peer("c", 3)).await;
    assert_eq!(st, StatusCode::CREATED);
    assert_eq!(c["virtual_ip"], a["virtual_ip"]);
    assert_eq!(
        metric(&s, "switchyard_mesh_lease_addresses{network=\"tiny\"}").await,
        Some(2.0)
    );
    assert!(
        metric(
            &s,
            "switchyard_mesh_registrations_total{result=\"refused\"}"
        )
        .await
            >= Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_fields_are_named() {
    let s = start(&Db::Sqlite, "5m", "");
    let post_network = |body: Value| {
        let s = &s;
        async move { call(s, Method::POST, "/api/v1/mesh/networks", Some(body)).await }
    };
    for (body, field) in [
        (
            json!({"id": "a/b", "name": "x", "cidr": "10.0.0.0/24"}),
            "id:",
        ),
        (
            json!({"id": "ok", "name": "", "cidr": "10.0.0.0/24"}),
            "name:",
        ),
        (
            json!({"id": "ok", "name": "x", "cidr": "10.0.0.1/24"}),
            "cidr:",
        ),
        (
            json!({"id": "ok", "name": "x", "cidr": "10.0.0.0/31"}),
            "cidr:",
        ),
        (
            json!({"id": "ok", "name": "x", "cidr": "fd00::/64"}),
            "cidr:",
        ),
    ] {
        let (st, err) = post_network(body.clone()).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body} → {err}");
        assert_eq!(err["error"], "invalid_request");
        assert_eq!(err["code"], "INVALID_FIELD");
        let message = err["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(field), "{body}: {message}");
    }
    let (st, err) = post_network(json!({"id": "ok", "name": "x"})).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(
        err["message"].as_str().unwrap_or_default().contains("cidr"),
        "{err}"
    );

    create_network(&s, "net", "10.5.0.0/24").await;
    let short = base64::engine::general_purpose::STANDARD.encode([1u8; 31]);
    for (p, field) in [
        (json!({"id": "-bad", "public_key": key(1)}), "peer.id:"),
        (json!({"id": "p", "public_key": short}), "peer.public_key:"),
        (json!({"id": "p", "public_key": "%%%"}), "peer.public_key:"),
        (
            json!({"id": "p", "public_key": key(1), "endpoints": [{"address": "192.0.2.1", "port": 0, "type": "lan", "priority": 0}]}),
            "peer.endpoints[0].port:",
        ),
        (
            json!({"id": "p", "public_key": key(1), "endpoints": [{"address": "no such thing", "port": 1, "type": "lan", "priority": 0}]}),
            "peer.endpoints[0].address:",
        ),
    ] {
        let (st, err) = register(&s, "net", p.clone()).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{p} → {err}");
        let message = err["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(field), "{p}: {message}");
    }
    let (st, err) = call(
        &s,
        Method::POST,
        "/api/v1/mesh/networks/net/peers",
        Some(json!({"network_id": "other", "peer": peer("p", 1)})),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(
        err["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("network_id:"),
        "{err}"
    );
    let (st, _) = register(&s, "missing", peer("p", 1)).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // Nothing invalid was stored.
    let (_, list) = call(&s, Method::GET, "/api/v1/mesh/networks/net/peers", None).await;
    assert_eq!(list["peers"], json!([]));
}

#[tokio::test(flavor = "multi_thread")]
async fn events_stream_follows_the_api_token_and_origin_rules() {
    // With a token: the registry is protected like every API endpoint.
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        "server:\n  http: {{ listen: \"127.0.0.1:0\" }}\n  socks5: {{ listen: \"127.0.0.1:0\" }}\n  cores: 1\n  data_dir: {:?}\n\
         api: {{ listen: \"127.0.0.1:0\", token: sekrit }}\nlogging: {{ level: info, format: json }}\n\
         mesh: {{ registry: {{ enabled: true }} }}\n",
        dir.path().join("data")
    );
    let path = dir.path().join("server.yaml");
    std::fs::write(&path, yaml).expect("write config");
    let s = support::start_server_with_file(dir, path);
    let (st, _) = call(&s, Method::GET, "/api/v1/mesh/networks", None).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let (st, _) = call_with(
        &s,
        Method::POST,
        "/api/v1/mesh/networks",
        Some(json!({"id": "n", "name": "n", "cidr": "10.1.0.0/24"})),
        Some("sekrit"),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, _) = call(
        &s,
        Method::POST,
        "/api/v1/mesh/networks/n/peers/x/heartbeat",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);

    let bearer = "Bearer sekrit";
    let refused = events(&s, "n", &[]).await.err().map(|e| e.0);
    assert_eq!(refused, Some(401));
    let refused = events(
        &s,
        "n",
        &[("authorization", bearer), ("origin", "http://evil.example")],
    )
    .await
    .err();
    assert_eq!(refused.as_ref().map(|e| e.0), Some(403));
    assert_eq!(
        refused.map(|e| e.1["code"].clone()),
        Some(json!("ORIGIN_NOT_ALLOWED"))
    );
    let refused = events(&s, "nope", &[("authorization", bearer)]).await.err();
    assert_eq!(refused.map(|e| e.0), Some(404));
    let mut ws = events(&s, "n", &[("authorization", bearer)])
        .await
        .expect("accepted");
    ping(&mut ws).await;
    let origin = format!("http://{}", s.api);
    let mut ws = events(&s, "n", &[("authorization", bearer), ("origin", &origin)])
        .await
        .expect("same-origin accepted");
    ping(&mut ws).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn registry_is_off_by_default() {
    let s = support::start_server("");
    let (st, body) = call(&s, Method::GET, "/api/v1/mesh/networks", None).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["code"], "MESH_REGISTRY_DISABLED");
    let (st, doc) = call(&s, Method::GET, "/api/v1/openapi.json", None).await;
    assert_eq!(st, StatusCode::OK);
    for path in [
        "/api/v1/mesh/networks",
        "/api/v1/mesh/networks/{networkID}/peers/{peerID}/heartbeat",
        "/api/v1/mesh/networks/{networkID}/events",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} not documented");
    }
    assert!(doc["paths"]["/api/v1/mesh/networks/{networkID}/peers/{peerID}"]["patch"].is_object());
    // Every schema the mesh paths refer to is in the document.
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                    out.push(r.to_owned());
                }
                m.values().for_each(|v| refs(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    refs(&doc, &mut found);
    assert!(
        found.iter().any(|r| r.ends_with("/MeshRegisterRequest")),
        "{found:?}"
    );
    for r in found {
        let name = r.rsplit('/').next().unwrap_or_default();
        assert!(
            doc["components"]["schemas"][name].is_object(),
            "{r} does not resolve"
        );
    }
}

/// The server dashboard's mesh panel (Chromium through WebDriver): networks and their peers
/// from the registry, and the peers' live events from the network's WebSocket.
#[tokio::test(flavor = "multi_thread")]
async fn dashboard_mesh_panel_shows_peers_and_live_events() {
    let Some(b) = support::browser::Browser::start_if_installed().await else {
        return;
    };
    const TOKEN: &str = "mesh-dash-token";
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        "server:\n  http: {{ listen: \"127.0.0.1:0\" }}\n  socks5: {{ listen: \"127.0.0.1:0\" }}\n  cores: 1\n  data_dir: {:?}\n\
         api: {{ listen: \"127.0.0.1:0\", token: {TOKEN} }}\nlogging: {{ level: info, format: json }}\n\
         mesh: {{ registry: {{ enabled: true }} }}\n",
        dir.path().join("data")
    );
    let path = dir.path().join("server.yaml");
    std::fs::write(&path, yaml).expect("write config");
    let s = support::start_server_with_file(dir, path);
    let as_admin = |method: Method, path: &'static str, body: Value| {
        let s = &s;
        async move { call_with(s, method, path, Some(body), Some(TOKEN)).await }
    };
    let (st, _) = as_admin(
        Method::POST,
        "/api/v1/mesh/networks",
        json!({"id": "home", "name": "Home", "cidr": "10.42.0.0/24"}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, _) = as_admin(
        Method::POST,
        "/api/v1/mesh/networks/home/peers",
        json!({"peer": peer("nas", 1)}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);

    b.goto(&format!("http://{}/", s.api)).await;
    b.fill("#signin-token", &format!("{TOKEN}\u{E007}")).await;
    b.wait_for("#flash", "Signed in.").await;
    b.click("#tab-mesh").await;
    b.wait_for("#mesh h3", "Home — home, 10.42.0.0/24, 1 peer")
        .await;
    b.wait_for(
        "table[data-network=\"home\"] tr[data-peer=\"nas\"]",
        "10.42.0.1",
    )
    .await;
    // The stream is subscribed on the server before it opens: a new peer shows up live.
    b.wait_for("#mesh-live", "live: 1 of 1 network").await;
    let (st, _) = as_admin(
        Method::POST,
        "/api/v1/mesh/networks/home/peers",
        json!({"peer": peer("laptop", 2)}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    b.wait_for("#mesh-events li", "laptop joined as 10.42.0.2")
        .await;
    b.wait_for(
        "table[data-network=\"home\"] tr[data-peer=\"laptop\"]",
        "10.42.0.2",
    )
    .await;
    let (st, _) = call_with(
        &s,
        Method::PATCH,
        "/api/v1/mesh/networks/home/peers/nas",
        Some(json!({"endpoints": [{"address": "192.0.2.77", "port": 4000, "type": "wan", "priority": 0}]})),
        Some(TOKEN),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    b.wait_for(
        "#mesh-events li",
        "nas updated its endpoints (192.0.2.77:4000)",
    )
    .await;
    b.wait_for(
        "table[data-network=\"home\"] tr[data-peer=\"nas\"]",
        "192.0.2.77:4000 (wan)",
    )
    .await;
    b.quit().await;
}

// ------------------------------------------------------- mesh trust (issue 28)

const ADMIN: &str = "admin-sekrit";

fn start_secured(db: &Db) -> Server {
    start_with_api(db, "90s", &format!(", token: {ADMIN}"), "")
}

async fn admin(s: &Server, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    call_with(s, method, path, body, Some(ADMIN)).await
}

/// Creates an enrollment key of `network` (admin); the creation answer.
async fn enrollment_key(s: &Server, network: &str, body: Value) -> Value {
    let (st, key) = admin(
        s,
        Method::POST,
        &format!("/api/v1/mesh/networks/{network}/enrollment-keys"),
        Some(body),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{key}");
    key
}

/// Registers `body` in `network` with the Bearer `token`.
async fn register_as(s: &Server, network: &str, body: Value, token: &str) -> (StatusCode, Value) {
    call_with(
        s,
        Method::POST,
        &format!("/api/v1/mesh/networks/{network}/peers"),
        Some(json!({"network_id": network, "peer": body})),
        Some(token),
    )
    .await
}

/// Registers a new peer with `token` and returns its credential.
async fn enroll(s: &Server, network: &str, body: Value, token: &str) -> String {
    let (st, reg) = register_as(s, network, body, token).await;
    assert_eq!(st, StatusCode::CREATED, "{reg}");
    let cred = reg["peer_token"].as_str().expect("peer_token").to_owned();
    assert!(cred.starts_with("sypt_") && cred != token, "{reg}");
    cred
}

async fn admin_network(s: &Server, id: &str, cidr: &str) {
    let (st, net) = admin(
        s,
        Method::POST,
        "/api/v1/mesh/networks",
        Some(json!({"id": id, "name": id, "cidr": cidr})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{net}");
}

async fn a_peer_credential_acts_on_its_own_peer_only(db: Db) {
    let s = start_secured(&db);
    admin_network(&s, "n1", "10.1.0.0/24").await;
    admin_network(&s, "n2", "10.2.0.0/24").await;
    let key = enrollment_key(&s, "n1", json!({"reusable": true})).await;
    let key = key["key"].as_str().expect("key");
    let a = enroll(&s, "n1", peer("a", 1), key).await;
    let b = enroll(&s, "n1", peer("b", 2), key).await;
    assert_ne!(a, b);

    // Its own peer: heartbeat, PATCH, read.
    let p = "/api/v1/mesh/networks/n1/peers";
    for (method, path, body, want) in [
        (
            Method::POST,
            format!("{p}/a/heartbeat"),
            None,
            StatusCode::NO_CONTENT,
        ),
        (
            Method::PATCH,
            format!("{p}/a"),
            Some(json!({"metadata": {"k": 1}})),
            StatusCode::OK,
        ),
        (Method::GET, p.to_owned(), None, StatusCode::OK),
        (Method::GET, format!("{p}/b"), None, StatusCode::OK),
        // Another peer: refused, and left as it was.
        (
            Method::POST,
            format!("{p}/b/heartbeat"),
            None,
            StatusCode::FORBIDDEN,
        ),
        (
            Method::PATCH,
            format!("{p}/b"),
            Some(json!({"endpoints": []})),
            StatusCode::FORBIDDEN,
        ),
        (
            Method::DELETE,
            format!("{p}/b"),
            None,
            StatusCode::FORBIDDEN,
        ),
        // Another network, the admin's routes, the rest of the API.
        (
            Method::GET,
            "/api/v1/mesh/networks/n2/peers".to_owned(),
            None,
            StatusCode::FORBIDDEN,
        ),
        (
            Method::POST,
            "/api/v1/mesh/networks/n2/peers/a/heartbeat".to_owned(),
            None,
            StatusCode::FORBIDDEN,
        ),
        (
            Method::GET,
            "/api/v1/mesh/networks".to_owned(),
            None,
            StatusCode::FORBIDDEN,
        ),
        (
            Method::GET,
            "/api/v1/mesh/networks/n1".to_owned(),
            None,
            StatusCode::FORBIDDEN,
        ),
        (
            Method::DELETE,
            "/api/v1/mesh/networks/n1".to_owned(),
            None,
            StatusCode::FORBIDDEN,
        ),
        (
            Method::GET,
            "/api/v1/mesh/networks/n1/enrollment-keys".to_owned(),
            None,
            StatusCode::FORBIDDEN,
        ),
        (
            Method::POST,
            "/api/v1/mesh/networks/n1/enrollment-keys".to_owned(),
            Some(json!({})),
            StatusCode::FORBIDDEN,
        ),
        (
            Method::GET,
            "/api/v1/config/full".to_owned(),
            None,
            StatusCode::FORBIDDEN,
        ),
        (
            Method::PUT,
            "/api/v1/config".to_owned(),
            Some(json!({})),
            StatusCode::FORBIDDEN,
        ),
        (
            Method::GET,
            "/api/v1/status".to_owned(),
            None,
            StatusCode::FORBIDDEN,
        ),
    ] {
        let (st, body) = call_with(&s, method.clone(), &path, body, Some(&a)).await;
        assert_eq!(st, want, "{method} {path}: {body}");
    }
    // An enrollment key is a credential for registration only.
    for path in ["/api/v1/mesh/networks/n1/peers", "/api/v1/config/full"] {
        let (st, _) = call_with(&s, Method::GET, path, None, Some(key)).await;
        assert_eq!(
            st,
            StatusCode::UNAUTHORIZED,
            "{path} with an enrollment key"
        );
    }
    let (st, _) = call_with(
        &s,
        Method::GET,
        "/api/v1/config/full",
        None,
        Some("sypt_forged"),
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let (st, b_now) = admin(&s, Method::GET, &format!("{p}/b"), None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(b_now["endpoints"], peer("b", 2)["endpoints"], "{b_now}");
    assert_eq!(
        metric(&s, "switchyard_mesh_heartbeats_total{result=\"denied\"}").await,
        Some(2.0),
        "b's and n2's refused heartbeats"
    );

    // Events: its own network only.
    let bearer = format!("Bearer {a}");
    let mut ws = events(&s, "n1", &[("authorization", &bearer)])
        .await
        .expect("own network");
    ping(&mut ws).await;
    assert_eq!(
        events(&s, "n2", &[("authorization", &bearer)])
            .await
            .err()
            .map(|e| e.0),
        Some(403)
    );

    // Registration: its own id with its own credential (handed back as it is), not another's.
    let (st, again) = register_as(&s, "n1", peer("a", 1), &a).await;
    assert_eq!(
        (st, again["peer_token"].as_str()),
        (StatusCode::OK, Some(a.as_str())),
        "{again}"
    );
    let (st, body) = register_as(&s, "n1", peer("b", 9), &a).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{body}");
    // Hijack: an existing id with an enrollment key (and a new public key) is refused.
    let (st, body) = register_as(&s, "n1", peer("b", 9), key).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{body}");
    // One public key, one peer.
    let (st, body) = register_as(&s, "n1", peer("c", 1), key).await;
    assert_eq!(
        (st, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("PUBLIC_KEY_IN_USE")),
        "{body}"
    );

    // The admin re-registers b: a new credential replaces the old one.
    let (st, reg) = register_as(&s, "n1", peer("b", 2), ADMIN).await;
    assert_eq!(st, StatusCode::OK, "{reg}");
    let b2 = reg["peer_token"].as_str().expect("peer_token");
    assert_ne!(b2, b);
    let (st, _) = call_with(
        &s,
        Method::POST,
        &format!("{p}/b/heartbeat"),
        None,
        Some(&b),
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "the replaced credential");
    let (st, _) = call_with(
        &s,
        Method::POST,
        &format!("{p}/b/heartbeat"),
        None,
        Some(b2),
    )
    .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    // A peer leaves with its own credential and comes back with it (its address kept for
    // it); the admin's removal ends the credential.
    let (st, _) = call_with(&s, Method::DELETE, &format!("{p}/a"), None, Some(&a)).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (_, list) = admin(&s, Method::GET, p, None).await;
    assert!(!list.to_string().contains("\"id\":\"a\""), "{list}");
    let (st, back) = register_as(&s, "n1", peer("a", 1), &a).await;
    assert_eq!(
        (st, back["virtual_ip"].as_str()),
        (StatusCode::CREATED, Some("10.1.0.1")),
        "{back}"
    );
    let (st, _) = admin(&s, Method::DELETE, &format!("{p}/a"), None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, _) = call_with(&s, Method::GET, p, None, Some(&a)).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let (st, _) = register_as(&s, "n1", peer("a", 1), &a).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
}

/// `metadata.anycast` is what the data plane trusts for anycast: a member's own or another
/// member's address, or one outside the network, is refused (400, field named); a listed
/// address is never leased to a new peer.
async fn anycast_addresses_are_the_registrys_word(db: Db) {
    let s = start_secured(&db);
    admin_network(&s, "n1", "10.1.0.0/29").await;
    let key = enrollment_key(&s, "n1", json!({"reusable": true})).await;
    let key = key["key"].as_str().expect("key");
    let a = enroll(&s, "n1", peer("a", 1), key).await;
    let b = enroll(&s, "n1", peer("b", 2), key).await;
    let p = "/api/v1/mesh/networks/n1/peers";
    let patch = |list: Value| Some(json!({"metadata": {"anycast": list}}));
    for (list, field) in [
        (json!(["10.1.0.2"]), "metadata.anycast[0]"), // b's address
        (json!(["10.1.0.6", "10.1.0.1"]), "metadata.anycast[1]"), // a's own
        (json!(["10.1.0.7"]), "metadata.anycast[0]"), // the broadcast address
        (json!(["10.9.0.1"]), "metadata.anycast[0]"), // outside the network
        (json!("10.1.0.6"), "metadata.anycast"),
    ] {
        let (st, body) = call_with(
            &s,
            Method::PATCH,
            &format!("{p}/a"),
            patch(list.clone()),
            Some(&a),
        )
        .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{list}: {body}");
        assert!(body.to_string().contains(field), "{list}: {body}");
    }
    // two members serve one anycast address; it is never leased
    for (id, token) in [("a", &a), ("b", &b)] {
        let (st, body) = call_with(
            &s,
            Method::PATCH,
            &format!("{p}/{id}"),
            patch(json!(["10.1.0.3"])),
            Some(token),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{body}");
        assert_eq!(body["metadata"]["anycast"], json!(["10.1.0.3"]));
    }
    enroll(&s, "n1", peer("c", 3), key).await;
    let (_, list) = admin(&s, Method::GET, p, None).await;
    let c_ip = list["peers"]
        .as_array()
        .and_then(|l| l.iter().find(|x| x["id"] == "c"))
        .map(|x| addr(&x["virtual_ip"]))
        .expect("c listed");
    assert_eq!(c_ip, Ipv4Addr::new(10, 1, 0, 4), "10.1.0.3 skipped: {list}");
}

async fn enrollment_keys_expire_are_single_use_and_revocable(db: Db) {
    let s = start_secured(&db);
    admin_network(&s, "n1", "10.1.0.0/24").await;
    admin_network(&s, "n2", "10.2.0.0/24").await;
    let keys = "/api/v1/mesh/networks/n1/enrollment-keys";

    // Single use: a refused registration does not consume it, the first success does.
    let once = enrollment_key(&s, "n1", json!({})).await;
    assert_eq!(once["reusable"], false, "{once}");
    let once_key = once["key"].as_str().expect("key");
    enroll(&s, "n1", peer("a", 1), ADMIN).await;
    let (st, _) = register_as(&s, "n1", peer("b", 1), once_key).await;
    assert_eq!(st, StatusCode::CONFLICT, "a's public key");
    let (st, _) = register_as(&s, "n2", peer("b", 2), once_key).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "a key of another network");
    enroll(&s, "n1", peer("b", 2), once_key).await;
    let (st, body) = register_as(&s, "n1", peer("c", 3), once_key).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "consumed: {body}");

    // Listed without the secret; revoked keys are refused.
    let multi = enrollment_key(&s, "n1", json!({"reusable": true, "ttl": "1h"})).await;
    let multi_key = multi["key"].as_str().expect("key");
    enroll(&s, "n1", peer("c", 3), multi_key).await;
    enroll(&s, "n1", peer("d", 4), multi_key).await;
    let (st, list) = admin(&s, Method::GET, keys, None).await;
    assert_eq!(st, StatusCode::OK);
    let listed = list["keys"].as_array().expect("keys");
    assert_eq!(listed.len(), 1, "the consumed key is gone: {list}");
    assert_eq!(listed[0]["id"], multi["id"]);
    assert!(
        listed[0].get("key").is_none() && !list.to_string().contains(multi_key),
        "{list}"
    );
    let revoke = format!("{keys}/{}", multi["id"].as_str().expect("id"));
    let (st, _) = admin(&s, Method::DELETE, &revoke, None).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, _) = register_as(&s, "n1", peer("e", 5), multi_key).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "revoked");
    let (st, _) = admin(&s, Method::DELETE, &revoke, None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);

    // Expiry: wait (bounded) until the key's expires_at has passed, then it is refused.
    let short = enrollment_key(&s, "n1", json!({"reusable": true, "ttl": "1s"})).await;
    let expires: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(short["expires_at"].clone()).expect("expires_at");
    let wait = (expires - chrono::Utc::now()).to_std().unwrap_or_default();
    assert!(wait < PATIENCE, "{short}");
    tokio::time::sleep(wait + Duration::from_millis(50)).await;
    let (st, body) = register_as(&s, "n1", peer("f", 6), short["key"].as_str().expect("key")).await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "expired: {body}");

    for ttl in ["0s", "soon", "9000h"] {
        let (st, body) = admin(&s, Method::POST, keys, Some(json!({"ttl": ttl}))).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{ttl}: {body}");
    }
    let (st, _) = admin(
        &s,
        Method::POST,
        "/api/v1/mesh/networks/nope/enrollment-keys",
        Some(json!({})),
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // Nothing without a credential.
    let (st, _) = register_as(&s, "n1", peer("g", 7), "syek_guessed").await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lapsed_peer_comes_back_only_with_its_own_credential() {
    // A one-second lease: the victim's lease lapses without heartbeats.
    let s = start_with_api(&Db::Sqlite, "1s", &format!(", token: {ADMIN}"), "");
    admin_network(&s, "lab", "10.88.0.0/29").await;
    let key = enrollment_key(&s, "lab", json!({"reusable": true})).await;
    let key = key["key"].as_str().expect("key");
    let bearer = format!("Bearer {ADMIN}");
    let mut ws = events(&s, "lab", &[("authorization", &bearer)])
        .await
        .expect("events");
    ping(&mut ws).await;
    let victim = enroll(&s, "lab", peer("victim", 1), key).await;
    assert_eq!(next_event(&mut ws, "peer.left").await["peer_id"], "victim");

    // Another member with the network's key: its id and (old) address are not for the taking.
    let (st, body) = register_as(&s, "lab", peer("victim", 66), key).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{body}");
    let (st, body) = register_as(&s, "lab", peer("victim", 66), "sypt_guessed").await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "{body}");
    // The victim itself, with its credential, gets its address back.
    let (st, back) = register_as(&s, "lab", peer("victim", 1), &victim).await;
    assert_eq!(st, StatusCode::CREATED, "{back}");
    assert_eq!(back["virtual_ip"], "10.88.0.1");
    assert_eq!(back["peer_token"].as_str(), Some(victim.as_str()));
}
