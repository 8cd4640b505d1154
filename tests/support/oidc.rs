//! A real OpenID provider on loopback for the OAuth tests: the `oidc-provider` package from npm
//! (installed once into a cache directory under the system temp dir), run by node with
//! `oidc_provider.mjs`. Clients: `laptop`/`laptop-secret` gets tokens (client_credentials),
//! `switchyard-proxy`/`proxy-secret` is the proxy (the tokens' audience, and the introspecting
//! client).

use super::{free_port, require, Proc};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

const SCRIPT: &str = include_str!("oidc_provider.mjs");
const PACKAGE: &str = "oidc-provider@9";

pub struct OpenIdProvider {
    pub proc: Proc,
    pub port: u16,
}

/// The directory with node_modules/oidc-provider, installed on first use.
fn installed() -> Option<PathBuf> {
    require("node")?;
    let npm = require("npm")?;
    let dir = std::env::temp_dir()
        .join("switchyard-test-npm")
        .join("oidc-provider-9");
    std::fs::create_dir_all(&dir).expect("npm cache dir");
    // One installer at a time across test processes.
    let lock = std::fs::File::create(dir.join(".lock")).expect("lock file");
    lock.lock().expect("lock");
    if !dir.join("node_modules/oidc-provider/package.json").exists() {
        let out = Command::new(npm)
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&dir)
            .arg(PACKAGE)
            .output()
            .expect("run npm");
        assert!(
            out.status.success(),
            "npm install {PACKAGE}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::write(dir.join("provider.mjs"), SCRIPT).expect("provider script");
    Some(dir)
}

/// Starts the provider on `port` (a free one when `None`) signing with a new key `kid`.
pub fn start_provider(port: Option<u16>, kid: &str) -> Option<OpenIdProvider> {
    let dir = installed()?;
    let port = port.unwrap_or_else(free_port);
    let mut child = Command::new("node")
        .arg(dir.join("provider.mjs"))
        .arg(port.to_string())
        .arg(kid)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start node");
    let stdout = child.stdout.take().expect("stdout");
    let proc = Proc {
        child,
        name: "oidc-provider".into(),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("listening") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("oidc-provider did not start");
    Some(OpenIdProvider { proc, port })
}

impl OpenIdProvider {
    pub fn issuer(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// An access token for `laptop` (`scope`: `short` for a 2 s token, `opaque` for an opaque
    /// one).
    pub fn token(&self, scope: &str) -> String {
        let out = super::curl(&[
            "-sS",
            "--max-time",
            "10",
            "-u",
            "laptop:laptop-secret",
            "-d",
            "grant_type=client_credentials",
            "-d",
            &format!("scope={scope}"),
            &format!("{}/token", self.issuer()),
        ]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "token answer ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        v["access_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no access_token: {v}"))
            .to_owned()
    }
}
