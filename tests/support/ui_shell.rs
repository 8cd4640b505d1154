//! Browser steps shared by the tests of the two UIs built on `control/ui/common/common.js`
//! (the server dashboard and the client web UI): the same sign-in shell, element ids and
//! security headers.

use serde_json::{json, Value};

use super::browser::Browser;
use super::curl;

/// From the page at `url`: a wrong token first (the API's refusal is shown, the app stays
/// hidden), then `token` submitted by keyboard (Enter in the field).
pub async fn sign_in(b: &Browser, url: &str, token: &str) {
    b.goto(url).await;
    b.wait_for("#signin-form", "Sign in").await;
    b.fill("#signin-token", "not-the-token").await;
    b.click("#signin-form button[type=submit]").await;
    b.wait_for("#error", "wrong API token").await;
    b.wait_hidden("#app").await;
    b.fill("#signin-token", &format!("{token}\u{E007}")).await;
    b.wait_for("#flash", "Signed in.").await;
}

/// Without an API token the page at `url` opens without sign-in (its first panel shows
/// `text` in `css`), says so, and offers no sign-out.
pub async fn assert_open_without_sign_in(b: &Browser, url: &str, css: &str, text: &str) {
    b.goto(url).await;
    b.wait_for(css, text).await;
    b.wait_for("#open-api", "no API token").await;
    b.wait_hidden("#signout").await;
    b.wait_hidden("#signin").await;
}

/// The session lives in the HttpOnly cookie only: nothing in web storage or document.cookie.
pub async fn assert_no_stored_token(b: &Browser) {
    let stored = b
        .script("return [localStorage.length, sessionStorage.length, document.cookie];")
        .await;
    assert_eq!(stored, json!([0, 0, ""]));
}

/// At phone width (390×844) the page does not scroll sideways.
pub async fn resize_to_phone_and_check_width(b: &Browser) {
    b.resize(390, 844).await;
    let fits = b
        .script("return document.documentElement.scrollWidth <= window.innerWidth + 1;")
        .await;
    assert_eq!(
        fits,
        Value::Bool(true),
        "the page scrolls sideways at 390 px"
    );
}

/// Sign-out returns to the form and ends the session on the API too.
pub async fn sign_out(b: &Browser) {
    b.click("#signout").await;
    b.wait_for("#signin-form", "Sign in").await;
    let status = b
        .script("return fetch('/api/v1/status').then(r => r.status);")
        .await;
    assert_eq!(status, json!(401));
}

/// Applies `statement` (JavaScript on the parsed configuration `c`) to the JSON editor's text.
pub async fn edit_config(b: &Browser, statement: &str) {
    b.script(&format!(
        "const t = document.querySelector('#config-text'); const c = JSON.parse(t.value); \
         {statement} t.value = JSON.stringify(c, null, 2); return true;"
    ))
    .await;
}

/// The response headers of a GET, lower-cased.
pub fn headers(url: &str) -> String {
    String::from_utf8_lossy(&curl(&["-sS", "-D", "-", "-o", "/dev/null", url]).stdout)
        .to_lowercase()
}

/// `path` under `base` answers 200 with `content_type` and the strict CSP of the UIs.
pub fn assert_served_with_strict_csp(base: &str, path: &str, content_type: &str) {
    let h = headers(&format!("{base}{path}"));
    assert!(h.starts_with("http/1.1 200"), "{path}: {h}");
    assert!(
        h.contains(&format!("content-type: {content_type}")),
        "{path}: {h}"
    );
    let csp = h
        .lines()
        .find(|l| l.starts_with("content-security-policy:"))
        .unwrap_or_else(|| panic!("{path}: no CSP: {h}"));
    for directive in [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "{path}: {csp}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert!(h.contains("x-content-type-options: nosniff"), "{path}: {h}");
}

/// `/` redirects to the page at `/ui/`.
pub fn assert_root_redirects_to_the_page(base: &str) {
    let root = headers(&format!("{base}/"));
    assert!(root.starts_with("http/1.1 303"), "{root}");
    assert!(root.contains("location: /ui/"), "{root}");
}
