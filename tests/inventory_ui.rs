//! The inventory web UI end to end in headless Chromium: the real binary on loopback, Debian's
//! `chromium` driven by `chromedriver` over the W3C WebDriver HTTP protocol.
//!
//! The WebDriver client is the handful of commands this test needs (new session, navigate,
//! find, click, send keys, text, displayed, execute), spoken with the reqwest client the suite
//! already uses, rather than a WebDriver crate and its dependency tree. Waits are explicit:
//! every step polls for the element state it needs (WebDriverWait style) with a deadline.
//! Without chromium/chromedriver the test skips with a printed reason; under `CI` it fails.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::support::{self, Proc};
use super::{start, Db};

/// W3C WebDriver's key of an element reference.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";
/// How long any one explicit wait may take.
const WAIT: Duration = Duration::from_secs(20);

/// A valid 1×1 PNG (so the browser can decode the uploaded image).
const PNG_1X1: &[u8] = b"\x89\x50\x4e\x47\x0d\x0a\x1a\x0a\x00\x00\x00\x0d\x49\x48\x44\x52\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89\x00\x00\x00\x0d\x49\x44\x41\x54\x78\xda\x63\x64\x60\xf8\x5f\x0f\x00\x02\x87\x01\x80\xeb\x47\xba\x92\x00\x00\x00\x00\x49\x45\x4e\x44\xae\x42\x60\x82";

/// One WebDriver session on a chromedriver we started.
struct Browser {
    http: reqwest::Client,
    session: String,
    _driver: Proc,
    profile: tempfile::TempDir,
}

impl Browser {
    /// Start chromedriver on a free loopback port and open a headless Chromium session.
    async fn start(chromium: &Path, chromedriver: &Path) -> Browser {
        let port = support::free_port();
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
        support::wait_for_port(port);
        let profile = tempfile::tempdir().expect("profile dir");
        let http = reqwest::Client::new();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.display().to_string(),
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                    "--disable-breakpad", "--disable-crash-reporter",
                    // loopback only: no name resolves, IP literals (127.0.0.1) still work
                    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
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
    async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
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
    async fn try_cmd(&self, method: reqwest::Method, path: &str, body: Value) -> Option<Value> {
        let mut req = self.http.request(method, format!("{}{path}", self.session));
        if !body.is_null() {
            req = req.json(&body);
        }
        let resp = req.send().await.ok()?;
        let ok = resp.status().is_success();
        let v: Value = resp.json().await.ok()?;
        ok.then(|| v["value"].clone())
    }

    async fn goto(&self, url: &str) {
        self.cmd(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    /// Element ids matching `css` now (possibly none).
    async fn find_all(&self, css: &str) -> Vec<String> {
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

    async fn displayed(&self, el: &str) -> bool {
        self.try_cmd(
            reqwest::Method::GET,
            &format!("/element/{el}/displayed"),
            Value::Null,
        )
        .await
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
    }

    async fn text(&self, el: &str) -> String {
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
    async fn wait_for(&self, css: &str, text: &str) -> String {
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
    async fn wait_hidden(&self, css: &str) {
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
    async fn wait_script(&self, script: &str, what: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            if self.script(script).await == Value::Bool(true) {
                return;
            }
            assert!(Instant::now() < deadline, "waited {WAIT:?} for {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn script(&self, script: &str) -> Value {
        self.cmd(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    async fn click(&self, css: &str) {
        let el = self.wait_for(css, "").await;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{el}/click"),
            Some(json!({})),
        )
        .await;
    }

    /// Clear the field and type `text` into it.
    async fn fill(&self, css: &str, text: &str) {
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
    async fn choose(&self, select_css: &str, label: &str) {
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

    async fn quit(&self) {
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

/// register → sign in → category (with colour), location, item with an image upload → search
/// finds it → sign out, and the UI and the server agree the session is over.
#[tokio::test(flavor = "multi_thread")]
async fn browser_register_sign_in_create_search_sign_out() {
    let Some(chromium) = support::require("chromium") else {
        return;
    };
    let Some(chromedriver) = support::require("chromedriver") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let inv = start(&Db::Sqlite, dir.path(), "", &[]);
    let b = Browser::start(&chromium, &chromedriver).await;
    let home = inv.url("/");
    b.goto(&home).await;

    // register: the UI then asks to sign in, with the e-mail filled in
    b.wait_for("#signup-form", "Create an account").await;
    b.fill("#signup-name", "Ada").await;
    b.fill("#signup-email", "ada@example.org").await;
    b.fill("#signup-password", "correct horse").await;
    b.fill("#signup-confirm", "correct horse").await;
    b.click("#signup-form button[type=submit]").await;
    b.wait_for("#flash", "Account created for ada@example.org")
        .await;
    // a server validation message is shown as it is: a second registration of that e-mail
    b.fill("#signup-email", "ada@example.org").await;
    b.fill("#signup-password", "correct horse").await;
    b.fill("#signup-confirm", "correct horse").await;
    b.click("#signup-form button[type=submit]").await;
    b.wait_for("#error", "User with this email already exists")
        .await;

    // sign in (wrong password first: the server's message)
    b.fill("#signin-email", "ada@example.org").await;
    b.fill("#signin-password", "wrong password").await;
    b.click("#signin-form button[type=submit]").await;
    b.wait_for("#error", "Invalid email or password").await;
    b.fill("#signin-password", "correct horse").await;
    b.click("#signin-form button[type=submit]").await;
    b.wait_for("#whoami", "Ada (admin)").await;
    b.wait_hidden("#auth").await;
    b.wait_hidden("#error").await;

    // category with a colour, and the duplicate-name message
    b.click("#tab-categories").await;
    b.fill("#category-name", "Power tools").await;
    b.script(
        "const c = document.querySelector('#category-color'); c.value = '#ff8800'; \
         c.dispatchEvent(new Event('input', {bubbles: true})); return true;",
    )
    .await;
    b.click("#category-save").await;
    b.wait_for("#categories li", "Power tools").await;
    b.wait_for("#categories li", "#ff8800").await;
    b.fill("#category-name", "Power tools").await;
    b.click("#category-save").await;
    b.wait_for("#error", "Category already exists").await;

    // location
    b.click("#tab-locations").await;
    b.fill("#location-name", "Garage shelf").await;
    b.fill("#location-description", "left wall").await;
    b.click("#location-save").await;
    b.wait_for("#locations li", "Garage shelf").await;

    // an item with category and location, then an image upload into its gallery
    b.click("#tab-items").await;
    b.click("#new-item").await;
    b.fill("#item-name", "Cordless drill").await;
    b.fill("#item-manufacturer", "Makita").await;
    b.fill("#item-barcode", "4002-DRILL").await;
    b.fill("#item-quantity", "3").await;
    b.choose("#item-category", "Power tools").await;
    b.choose("#item-location", "Garage shelf").await;
    b.click("#item-save").await;
    b.wait_for("#item-dialog-title", "Edit Cordless drill")
        .await;
    let image = dir.path().join("drill.png");
    std::fs::write(&image, PNG_1X1).expect("write png");
    let input = b.wait_for("#image-file", "").await;
    b.cmd(
        reqwest::Method::POST,
        &format!("/element/{input}/value"),
        Some(json!({"text": image.display().to_string()})),
    )
    .await;
    b.click("#image-upload").await;
    b.wait_for("#gallery li[data-image-id] button", "Delete")
        .await;
    b.wait_script(
        "const i = document.querySelector('#gallery img'); \
         return !!i && i.complete && i.naturalWidth === 1;",
        "the uploaded image to load from the server",
    )
    .await;
    b.click("#item-close").await;
    b.wait_hidden("#item-dialog").await;

    // a second item the search must leave out
    b.click("#new-item").await;
    b.fill("#item-name", "Claw hammer").await;
    b.click("#item-save").await;
    b.wait_for("#item-dialog-title", "Edit Claw hammer").await;
    b.click("#item-close").await;
    b.wait_for("#items-summary", "2 items").await;

    // search finds the drill (by manufacturer, any case), with its category and thumbnail
    b.fill("#search", "MAKITA").await;
    b.click("#filters button[type=submit]").await;
    b.wait_for("#items-summary", "1 item").await;
    let row = b
        .wait_for("#items li[data-item-id]", "Cordless drill")
        .await;
    let text = b.text(&row).await;
    assert!(
        text.contains("Power tools") && text.contains("Garage shelf"),
        "{text}"
    );
    assert!(!text.contains("Claw hammer"));
    assert_eq!(b.find_all("#items li[data-item-id]").await.len(), 1);
    assert_eq!(b.find_all("#items li img.thumb").await.len(), 1);
    // the category filter narrows the same way
    b.fill("#search", "").await;
    b.choose("#filter-category", "Power tools").await;
    b.wait_for("#items-summary", "1 item").await;

    // sign out: the signed-out view, and the server no longer knows the session
    b.click("#signout").await;
    b.wait_for("#flash", "You are signed out.").await;
    b.wait_for("#signin-form", "Sign in").await;
    b.wait_hidden("#app").await;
    b.wait_hidden("#whoami").await;
    b.goto(&home).await;
    b.wait_for("#signin-form", "Sign in").await;
    b.wait_hidden("#app").await;
    let session = b
        .script("return fetch('/api/auth/session').then(r => r.text());")
        .await;
    assert_eq!(session, json!("null"), "no session after sign-out");
    // the page never stored a token in web storage
    let stored = b
        .script("return localStorage.length + sessionStorage.length;")
        .await;
    assert_eq!(stored, json!(0));
    b.quit().await;
}
