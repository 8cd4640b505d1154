//! End-to-end: the command line (`config validate`, startup on defaults).

mod support;

use std::process::Command;
use support::BIN;

#[test]
fn config_validate_reports_every_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "backends:\n  - { name: up, type: httpproxy }\nroutes:\n  - { name: r, domains: [\"a..b\"], backend: missing }\n",
    )
    .expect("write");
    let out = Command::new(BIN)
        .args(["config", "validate"])
        .arg(&bad)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("missing"), "{text}");
    assert!(text.contains("address"), "{text}");
    assert!(text.contains("a..b"), "{text}");

    let unknown = dir.path().join("unknown.yaml");
    std::fs::write(&unknown, "server:\n  http:\n    lisen: \":1\"\n").expect("write");
    let out = Command::new(BIN)
        .args(["config", "validate"])
        .arg(&unknown)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("server.http.lisen"));

    let examples = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../config/examples/server.yaml"
    );
    let out = Command::new(BIN)
        .args(["config", "validate", examples])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn server_refuses_an_invalid_config_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "routes:\n  - { name: r, domains: [\"*\"], backend: nowhere }\n",
    )
    .expect("write");
    let out = Command::new(BIN)
        .args(["server", "--config"])
        .arg(&bad)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nowhere"));
}

#[test]
fn client_refuses_a_plain_http_mesh_registry_off_loopback() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("client.yaml");
    // 192.0.2.1 (TEST-NET-1) is never contacted: the configuration is refused before.
    std::fs::write(
        &cfg,
        "proxy:\n  http: {listen: \"127.0.0.1:0\"}\n  socks5: {listen: \"127.0.0.1:0\"}\n\
         api: {listen: \"127.0.0.1:0\"}\n\
         mesh:\n  enabled: true\n  network_id: n\n\
         \x20 discovery: {server: \"http://192.0.2.1:7082\", enrollment_key: syek_0}\n",
    )
    .expect("write");
    let mut child = Command::new(BIN)
        .args(["client", "--config"])
        .arg(&cfg)
        // In the temp dir: a client that (wrongly) started must not write into the tree.
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("HOME", dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run");
    // Bounded: a client that accepted the configuration would run until stopped.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the client started with a plain-HTTP registry off loopback");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("mesh.discovery.server") && stderr.contains("plain HTTP"),
        "{stderr}"
    );
}
