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
