//! The inventory web UI end to end in headless Chromium: the real binary on loopback, Debian's
//! `chromium` driven by `chromedriver` over the W3C WebDriver HTTP protocol.
//!
//! The WebDriver client is tests/support/browser.rs. Without chromium/chromedriver the test
//! skips with a printed reason; under `CI` it fails.

use serde_json::json;

use super::support::browser::Browser;
use super::{start, Db};

/// A valid 1×1 PNG (so the browser can decode the uploaded image).
const PNG_1X1: &[u8] = b"\x89\x50\x4e\x47\x0d\x0a\x1a\x0a\x00\x00\x00\x0d\x49\x48\x44\x52\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89\x00\x00\x00\x0d\x49\x44\x41\x54\x78\xda\x63\x64\x60\xf8\x5f\x0f\x00\x02\x87\x01\x80\xeb\x47\xba\x92\x00\x00\x00\x00\x49\x45\x4e\x44\xae\x42\x60\x82";

/// register → sign in → category (with colour), location, item with an image upload → search
/// finds it → sign out, and the UI and the server agree the session is over.
#[tokio::test(flavor = "multi_thread")]
async fn browser_register_sign_in_create_search_sign_out() {
    let Some(b) = Browser::start_if_installed().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let inv = start(&Db::Sqlite, dir.path(), "", &[]);
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
