//! Helpers of the mesh namespace tests (`tests/mesh_peer.rs`, `tests/mesh_nat.rs`): ping and
//! curl from a namespace, and the registry's event stream.
#![allow(dead_code)]

use futures::StreamExt;
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

/// `ping` from namespace `ns` to `ip`: whether replies came back.
pub fn ping(ns: &str, ip: &str, count: u32) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "ping", "-q", "-n", "-c"])
        .arg(count.to_string())
        .args(["-W", "2", "-i", "0.3", ip])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// `curl -sS --max-time <secs> <url>` from namespace `ns`.
pub fn curl_in(ns: &str, secs: u32, url: &str) -> std::process::Output {
    Command::new("ip")
        .args(["netns", "exec", ns, "curl", "-sS", "--max-time"])
        .arg(secs.to_string())
        .arg(url)
        .output()
        .expect("curl")
}

pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The data of the next `kind` event about `peer` on the registry's event stream (waiting at
/// most `patience`).
pub fn next_event(
    rt: &tokio::runtime::Runtime,
    ws: &mut Ws,
    kind: &str,
    peer: &str,
    patience: Duration,
) -> Value {
    let wait = async {
        loop {
            match ws.next().await {
                Some(Ok(tokio_tungstenite::tungstenite::Message::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
                    if v["type"] == kind && v["data"]["peer_id"] == peer {
                        return v["data"].clone();
                    }
                }
                Some(Ok(_)) => {}
                other => panic!("event stream ended waiting for {kind}: {other:?}"),
            }
        }
    };
    rt.block_on(async { tokio::time::timeout(patience, wait).await })
        .unwrap_or_else(|_| panic!("no {kind} event for {peer}"))
}
