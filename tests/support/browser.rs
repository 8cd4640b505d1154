//! A small W3C WebDriver client for the web UI tests: Debian's `chromium` driven headless by
//! `chromedriver` over HTTP, spoken with the reqwest client the suite already uses, rather than
//! a WebDriver crate and its dependency tree. Waits are explicit: every step polls for the
//! element state it needs (WebDriverWait style) with a deadline. Shared by tests/inventory_ui.rs
//! and tests/dashboard_ui.rs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{free_port, require, wait_for_port, Proc};

/// W3C WebDriver's key of an element reference.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";
/// How long any one explicit wait may take.
pub const WAIT: Duration = Duration::from_secs(20);

/// One WebDriver session on a chromedriver we started.
pub struct Browser {
    http: reqwest::Client,
    session: String,
    _driver: Proc,
    profile: tempfile::TempDir,
}

impl Browser {
    /// Start chromedriver on a free loopback port and open a headless Chromium session;
    /// `None` (skip, or a failure under CI) when chromium or chromedriver is missing.
    pub async fn start_if_installed() -> Option<Browser> {
        let chromium = require("chromium")?;
        let chromedriver = require("chromedriver")?;
        Some(Self::start(&chromium, &chromedriver).await)
    }

    /// Start chromedriver on a free loopback port and open a headless Chromium session.
    pub async fn start(chromium: &Path, chromedriver: &Path) -> Browser {
        let port = free_port();
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let driver = Proc {
            child,
            name: "chromedriver".into(),
        };
        wait_for_port(port);
        let profile = tempfile::tempdir().expect("profile dir");
        let http = super::http_client();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.display().to_string(),
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                    "--disable-breakpad", "--disable-crash-reporter",
                    // loopback only: no name resolves but 127.0.0.1 and 127.0.0.2 (a second
                    // origin, the attacker's page of tests/browser_threat.rs)
                    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1 , EXCLUDE 127.0.0.2",
                    "--window-size=1200,900",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        }}});
        let base = format!("http://127.0.0.1:{port}");
        let resp: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .expect("new session")
            .json()
            .await
            .expect("new session JSON");
        let session = resp["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {resp}"))
            .to_string();
        Browser {
            http,
            session: format!("{base}/session/{session}"),
            _driver: driver,
            profile,
        }
    }

    /// One WebDriver command; panics with the driver's error.
    pub async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.session));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("WebDriver request");
        let status = resp.status();
        let v: Value = resp.json().await.expect("WebDriver JSON");
        assert!(status.is_success(), "{method} {path}: {status} {v}");
        v["value"].clone()
    }

    /// A WebDriver command whose failure (e.g. a stale element) is an answer, not an error.
    pub async fn try_cmd(&self, method: reqwest::Method, path: &str, body: Value) -> Option<Value> {
        let mut req = self.http.request(method, format!("{}{path}", self.session));
        if !body.is_null() {
            req = req.json(&body);
        }
        let resp = req.send().await.ok()?;
        let ok = resp.status().is_success();
        let v: Value = resp.json().await.ok()?;
        ok.then(|| v["value"].clone())
    }

    pub async fn goto(&self, url: &str) {
        self.cmd(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    /// Element ids matching `css` now (possibly none).
    pub async fn find_all(&self, css: &str) -> Vec<String> {
        let v = self
            .try_cmd(
                reqwest::Method::POST,
                "/elements",
                json!({"using": "css selector", "value": css}),
            )
            .await
            .unwrap_or(Value::Null);
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e[ELEMENT_KEY].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub async fn displayed(&self, el: &str) -> bool {
        self.try_cmd(
            reqwest::Method::GET,
            &format!("/element/{el}/displayed"),
            Value::Null,
        )
        .await
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
    }

    pub async fn text(&self, el: &str) -> String {
        self.try_cmd(
            reqwest::Method::GET,
            &format!("/element/{el}/text"),
            Value::Null,
        )
        .await
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
    }

    /// Explicit wait: the first displayed element matching `css` whose text contains
    /// `text` (any text when empty).
    pub async fn wait_for(&self, css: &str, text: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            for el in self.find_all(css).await {
                if self.displayed(&el).await && self.text(&el).await.contains(text) {
                    return el;
                }
            }
            if Instant::now() > deadline {
                let body = self.find_all("body").await;
                let page = match body.first() {
                    Some(b) => self.text(b).await,
                    None => String::new(),
                };
                panic!("waited {WAIT:?} for {css} containing {text:?}; page text:\n{page}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Explicit wait until nothing matching `css` is displayed.
    pub async fn wait_hidden(&self, css: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let mut shown = false;
            for el in self.find_all(css).await {
                shown |= self.displayed(&el).await;
            }
            if !shown {
                return;
            }
            assert!(Instant::now() < deadline, "{css} still displayed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Explicit wait until `script` (a function body) returns `true`.
    pub async fn wait_script(&self, script: &str, what: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            if self.script(script).await == Value::Bool(true) {
                return;
            }
            assert!(Instant::now() < deadline, "waited {WAIT:?} for {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn script(&self, script: &str) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    pub async fn click(&self, css: &str) {
        let el = self.wait_for(css, "").await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{el}/click"),
            Some(json!({})),
        )
        .await;
    }

    /// Clear the field and type `text` into it.
    pub async fn fill(&self, css: &str, text: &str) {
        let el = self.wait_for(css, "").await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{el}/clear"),
            Some(json!({})),
        )
        .await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{el}/value"),
            Some(json!({"text": text})),
        )
        .await;
    }

    /// Choose the option of `select_css` whose label is `label` by clicking it (Selenium's
    /// `Select` does the same). Waits for the option to exist; options of a closed select
    /// are not "displayed" in WebDriver terms, so their `label` property is compared.
    pub async fn choose(&self, select_css: &str, label: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            for option in self.find_all(&format!("{select_css} option")).await {
                let got = self
                    .try_cmd(
                        reqwest::Method::GET,
                        &format!("/element/{option}/property/label"),
                        Value::Null,
                    )
                    .await;
                if got.as_ref().and_then(Value::as_str) == Some(label) {
                    self.cmd(
                        reqwest::Method::POST,
                        &format!("/element/{option}/click"),
                        Some(json!({})),
                    )
                    .await;
                    return;
                }
            }
            if Instant::now() > deadline {
                let html = self
                    .script(&format!(
                        "return document.querySelector('{select_css}').outerHTML;"
                    ))
                    .await;
                panic!("no option {label:?} in {select_css}: {html}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Resize the window (the viewport follows), e.g. 390×844 for a phone.
    pub async fn resize(&self, width: u32, height: u32) {
        self.cmd(
            reqwest::Method::POST,
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        )
        .await;
    }

    /// Save a PNG screenshot of the viewport as `target/ui-screenshots/<name>.png` (a test
    /// artefact) and return its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        use base64::Engine;
        let v = self.cmd(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .expect("screenshot is base64");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/ui-screenshots");
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write screenshot");
        println!("screenshot: {}", path.display());
        path
    }

    pub async fn quit(&self) {
        let _ = self.http.delete(&self.session).send().await;
    }
}

/// Also when a step panics: end the WebDriver session (Chromium exits), then stop by PID any
/// browser process still running on this test's profile directory (they outlive a killed
/// chromedriver); chromedriver itself is stopped by its `Proc` guard.
impl Drop for Browser {
    fn drop(&mut self) {
        let _ = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "--max-time", "10", "-X", "DELETE"])
            .arg(&self.session)
            .status();
        let marker = format!("--user-data-dir={}", self.profile.path().display());
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return;
        };
        for entry in procs.filter_map(Result::ok) {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let ours = cmdline
                .split(|b| *b == 0)
                .any(|arg| arg == marker.as_bytes());
            if ours {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
    }
}
