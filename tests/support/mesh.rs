//! Helpers of the mesh namespace tests (`tests/mesh_peer.rs`, `tests/mesh_nat.rs`): ping and
//! curl from a namespace, a client peer started in one, waiting for a peer's API to show
//! something, the registry's event stream, and the registry's admin token with the enrollment
//! keys the peers join with (no peer's configuration holds the admin token).
#![allow(dead_code)]

use super::{spawn_with_listeners, Listening, BIN};
use futures::StreamExt;
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

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

/// One `ping -M do -s <size>` (don't fragment) from namespace `ns`: whether it was answered,
/// and what ping printed (an ICMP "fragmentation needed" shows as `Frag needed … (mtu = N)`).
pub fn ping_dont_fragment(ns: &str, ip: &str, size: usize) -> (bool, String) {
    let out = Command::new("ip")
        .args([
            "netns", "exec", ns, "ping", "-n", "-c", "1", "-W", "2", "-M", "do", "-s",
        ])
        .arg(size.to_string())
        .arg(ip)
        .output();
    match out {
        Ok(o) => (
            o.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        ),
        Err(e) => (false, e.to_string()),
    }
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

/// The registries' `api.token`: the tests' own calls carry it, the peers never see it.
pub const REGISTRY_ADMIN: &str = "registry-admin-token";

/// `GET path` on the registry at `registry` as its admin: the JSON answer.
pub fn registry_get(registry: std::net::SocketAddr, path: &str) -> Value {
    let out = Command::new("curl")
        .args(["-sS", "--fail-with-body", "--max-time", "10", "-H"])
        .arg(format!("Authorization: Bearer {REGISTRY_ADMIN}"))
        .arg(format!("http://{registry}{path}"))
        .output()
        .expect("curl");
    assert!(
        out.status.success(),
        "GET {path}: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// A new single-use enrollment key of `network` on the registry at `registry` (as its admin).
pub fn single_use_key(registry: std::net::SocketAddr, network: &str) -> String {
    single_use_key_at(&format!("http://{registry}"), network)
}

/// [`single_use_key`] from the registry at `base` (`http://…` or `https://…`).
pub fn single_use_key_at(base: &str, network: &str) -> String {
    let path = format!("/api/v1/mesh/networks/{network}/enrollment-keys");
    let (_, answer) = admin_call(base, "POST", &path, Some(serde_json::json!({})));
    answer["key"]
        .as_str()
        .unwrap_or_else(|| panic!("an enrollment key: {answer}"))
        .to_owned()
}

/// `method path` on the registry at `base` as its admin: the status and the JSON answer. An
/// https registry's certificate is not checked here (the test made it; the peers pin it).
pub fn admin_call(base: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let auth = format!("Authorization: Bearer {REGISTRY_ADMIN}");
    let body = body.map(|b| b.to_string());
    let mut args = vec!["--insecure", "-H", &auth];
    if let Some(body) = &body {
        args.extend([
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            body,
        ]);
    }
    call_json(method, &format!("{base}{path}"), &args)
}

/// `curl -X method url` with `extra` arguments (10 s at most): the status and the JSON answer
/// (0 and null when there is none).
pub fn call_json(method: &str, url: &str, extra: &[&str]) -> (u16, Value) {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "-X",
            method,
            "-w",
            "\n%{http_code}",
        ])
        .args(extra)
        .arg(url)
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (
        code.trim().parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
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

/// Polls `get` until `check` holds (at most `patience`), returning the last value; fails with
/// `what`, the last value and `context()` (e.g. the peer's log).
pub fn wait_until(
    patience: Duration,
    what: &str,
    mut get: impl FnMut() -> Value,
    check: impl Fn(&Value) -> bool,
    context: impl Fn() -> String,
) -> Value {
    let deadline = Instant::now() + patience;
    loop {
        let v = get();
        if check(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: last {v}\n{}", context());
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `switchyard client` with the configuration `yaml` (written to `dir`, which also holds its
/// data) in namespace `ns`, once its client API listens.
pub fn start_client_in(ns: &str, name: &str, dir: &std::path::Path, yaml: &str) -> Listening {
    start_client_in_with_env(ns, name, dir, yaml, &[])
}

/// [`start_client_in`] with environment variables `env` set for the client (e.g.
/// `SSL_CERT_FILE`, the CA roots it checks an https registry with).
pub fn start_client_in_with_env(
    ns: &str,
    name: &str,
    dir: &std::path::Path,
    yaml: &str,
    env: &[(&str, &std::path::Path)],
) -> Listening {
    std::fs::write(dir.join("client.yaml"), yaml).expect("write config");
    let mut cmd = Command::new("nsenter");
    cmd.envs(env.iter().copied())
        .arg(format!("--net=/run/netns/{ns}"))
        .arg(BIN)
        .arg("client")
        .arg("--config")
        .arg(dir.join("client.yaml"))
        .arg("--data-dir")
        .arg(dir.join("data"));
    spawn_with_listeners(cmd, name, &["client API listening"])
}
