//! The client web UI (`web_ui.listen`) end to end: the real `switchyard client` with a real
//! `switchyard server` as its server and nginx as the origin, all on loopback; headless Chromium
//! through tests/support/browser.rs for the main flows, curl for the proxied request and the
//! security headers. Screenshots at desktop and phone width land in target/ui-screenshots/.

mod support;

use std::net::SocketAddr;
use std::process::Command;

use serde_json::{json, Value};
use support::browser::Browser;
use support::ui_shell::{self, headers};
use support::{curl, free_port, spawn_with_listeners, start_nginx, start_server, Proc, BIN};

const TOKEN: &str = "client-ui-s3cret";

/// A running client with its web UI.
struct Client {
    _proc: Proc,
    http: SocketAddr,
    api: SocketAddr,
    web: SocketAddr,
    logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

/// A client whose servers are `home` (the real server, default) and `spare` (a loopback port
/// nothing listens on). Its `vpn.tun` addresses are IPv6 on purpose: the VPN path cannot run
/// with them, so enabling the VPN fails before touching the host (no device, route or rule).
fn start_client(home: SocketAddr, token: Option<&str>, web_ui: bool) -> Client {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = token.map_or(String::new(), |t| format!(", token: \"{t}\""));
    let spare = free_port();
    // without the key the web UI stays off (the default)
    let web = if web_ui {
        "web_ui: {enabled: true, listen: \"127.0.0.1:0\"}\n"
    } else {
        ""
    };
    let yaml = format!(
        "proxy:\n  http: {{listen: \"127.0.0.1:0\"}}\n  socks5: {{listen: \"127.0.0.1:0\"}}\n  cores: 1\n\
         api: {{listen: \"127.0.0.1:0\"{token}}}\n\
         {web}servers:\n  - {{name: home, address: \"{home}\", protocol: HTTP, is_default: true}}\n\
         \x20 - {{name: spare, address: \"127.0.0.1:{spare}\", protocol: HTTP}}\n\
         vpn:\n  interface_name: sycui0\n  tun: {{address: \"fd00:5c::2/64\", gateway: \"fd00:5c::1\"}}\n\
         logging: {{level: info, format: json}}\n"
    );
    std::fs::write(dir.path().join("client.yaml"), yaml).expect("write config");
    let mut cmd = Command::new(BIN);
    cmd.arg("client")
        .arg("--config")
        .arg(dir.path().join("client.yaml"))
        .arg("--data-dir")
        .arg(dir.path().join("data"));
    let mut messages = vec!["client HTTP proxy listening", "client API listening"];
    if web_ui {
        messages.push("client web UI listening");
    }
    let started = spawn_with_listeners(cmd, "switchyard client", &messages);
    let web = started.addrs.get(2).copied().unwrap_or(started.addrs[1]);
    Client {
        _proc: started.proc,
        http: started.addrs[0],
        api: started.addrs[1],
        web,
        logs: started.logs,
        _dir: dir,
    }
}

/// (status, JSON body) of a Bearer request to the client API.
fn call(api: SocketAddr, method: &str, path: &str) -> (u16, Value) {
    let out = curl(&[
        "-sS",
        "--max-time",
        "20",
        "-X",
        method,
        "-H",
        &format!("Authorization: Bearer {TOKEN}"),
        "-w",
        "\n%{http_code}",
        &format!("http://{api}{path}"),
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (
        code.trim().parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

fn get(api: SocketAddr, path: &str) -> Value {
    let (status, v) = call(api, "GET", path);
    assert_eq!(status, 200, "GET {path}: {v}");
    v
}

/// Sign-in (wrong token first), status and connect/disconnect, the live log showing a request
/// made through the client's proxy with curl, debug entries, routes with the tester, server
/// selection, quick settings, config save (applied / restart required / invalid), export and
/// import, VPN and split-tunnel rules with the VPN's honest failure, mesh "disabled", cache,
/// no token in web storage, phone width, sign-out; screenshots at desktop and phone width.
#[tokio::test(flavor = "multi_thread")]
async fn client_ui_main_flows_in_chromium() {
    let Some(b) = Browser::start_if_installed().await else {
        return;
    };
    let Some(origin) = tokio::task::block_in_place(|| start_nginx(&[("hello.txt", b"hello")]))
    else {
        return;
    };
    let (server, c) = tokio::task::block_in_place(|| {
        let server = start_server("");
        let c = start_client(server.http, Some(TOKEN), true);
        (server, c)
    });
    let base = format!("http://{}", c.web);
    b.resize(1280, 800).await;

    // `/` leads to the sign-in form; a wrong token shows the client's refusal; then by keyboard
    ui_shell::sign_in(&b, &format!("{base}/"), TOKEN).await;
    b.wait_for("#status", &c.http.to_string()).await;
    b.wait_for("#status", &format!("connected to {}", server.http))
        .await;
    b.wait_for("#live-state", "live: on").await;
    b.screenshot("client-status-desktop").await;

    // disconnect and connect again from the status panel
    b.click("#disconnect").await;
    b.wait_for("#flash", "Disconnected").await;
    b.wait_for("#status", "not connected").await;
    assert_eq!(get(c.api, "/api/v1/status")["server_connected"], false);
    b.click("#connect").await;
    b.wait_for("#flash", "Connected.").await;
    b.wait_for("#status", "connected to").await;
    assert_eq!(get(c.api, "/api/v1/status")["server_connected"], true);

    // the live log (SSE) shows a request made through the client's proxy with curl
    b.click("#tab-logs").await;
    let url = origin.url("/hello.txt?from=client-ui");
    let out = tokio::task::block_in_place(|| {
        curl(&[
            "-sS",
            "--max-time",
            "20",
            "-x",
            &format!("http://{}", c.http),
            &url,
        ])
    });
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello", "{out:?}");
    b.wait_for("#log li", "/hello.txt?from=client-ui").await;
    b.wait_for("#log li", "status_code=200").await;
    b.click("#debug-refresh").await;
    b.wait_for("#debug-entries tbody tr", "/hello.txt?from=client-ui")
        .await;
    b.screenshot("client-logs-desktop").await;

    // create a route, test domains against it, delete it
    b.click("#tab-routes").await;
    b.fill("#route-name", "ui-route").await;
    b.fill("#route-domains", "*.ui.test, ui.test").await;
    b.choose("#route-action", "direct").await;
    b.click("#route-create").await;
    b.wait_for("#flash", "Route ui-route created.").await;
    b.wait_for("#routes tr[data-route=\"ui-route\"]", "*.ui.test, ui.test")
        .await;
    assert!(get(c.api, "/api/v1/routes")
        .to_string()
        .contains("ui-route"));
    b.fill("#route-test-domain", "www.ui.test").await;
    b.click("#route-test").await;
    b.wait_for(
        "#route-test-result",
        "www.ui.test → direct (route ui-route)",
    )
    .await;
    b.fill("#route-test-domain", "elsewhere.test").await;
    b.click("#route-test").await;
    b.wait_for(
        "#route-test-result",
        "elsewhere.test → server (no route matched: the default action)",
    )
    .await;
    b.click("#routes tr[data-route=\"ui-route\"] button.delete")
        .await;
    b.wait_for("#flash", "Route ui-route deleted.").await;
    b.wait_hidden("#routes tr[data-route=\"ui-route\"]").await;
    assert!(!get(c.api, "/api/v1/routes")
        .to_string()
        .contains("ui-route"));

    // toggle the server: select the spare one, then home again
    b.click("#tab-servers").await;
    b.wait_for(
        "#servers tr[data-server=\"home\"] button.select[aria-pressed=\"true\"]",
        "Selected",
    )
    .await;
    b.click("#servers tr[data-server=\"spare\"] button.select")
        .await;
    b.wait_for("#flash", "Server spare selected.").await;
    b.wait_for(
        "#servers tr[data-server=\"spare\"] button.select[aria-pressed=\"true\"]",
        "Selected",
    )
    .await;
    b.wait_for(
        "#servers tr[data-server=\"home\"] button.select[aria-pressed=\"false\"]",
        "Select",
    )
    .await;
    assert_eq!(get(c.api, "/api/v1/settings")["current_server"], "spare");
    b.click("#servers tr[data-server=\"home\"] button.select")
        .await;
    b.wait_for("#flash", "Server home selected.").await;
    assert_eq!(get(c.api, "/api/v1/settings")["current_server"], "home");

    // quick settings
    let before = get(c.api, "/api/v1/settings")["start_minimized"].clone();
    b.click("#tab-settings").await;
    b.wait_script(
        "return document.querySelector('#set-current-server').value === 'home';",
        "the settings form filled in",
    )
    .await;
    b.click("#set-start-minimized").await;
    b.click("#settings-save").await;
    b.wait_for("#flash", "Settings saved.").await;
    let after = get(c.api, "/api/v1/settings");
    assert_eq!(after["start_minimized"], json!(before != true), "{after}");

    // config: a route added in the editor applies at once; an API listener change needs a
    // restart; an invalid value is refused with the client's errors
    b.click("#tab-config").await;
    b.wait_script(
        "return document.querySelector('#config-text').value.includes('\"routing\"');",
        "the running configuration in the editor",
    )
    .await;
    ui_shell::edit_config(
        &b,
        "c.routing.routes.push({name: 'from-editor', patterns: ['editor.test'], action: 'direct', priority: 0});",
    )
    .await;
    b.click("#config-validate").await;
    b.wait_for("#config-result", "Valid configuration.").await;
    b.click("#config-save").await;
    b.wait_for(
        "#config-result",
        "Saved: the running configuration is updated.",
    )
    .await;
    b.wait_for("#config-result .changed", "Changed: routing.routes")
        .await;
    b.wait_for("#config-result .restart-required", "Restart required: none")
        .await;
    let tested = get(c.api, "/api/v1/routes/test?domain=editor.test");
    assert_eq!(tested["matched_route"], "from-editor", "{tested}");
    let new_listen = format!("127.0.0.1:{}", free_port());
    ui_shell::edit_config(&b, &format!("c.api.listen = '{new_listen}';")).await;
    b.click("#config-save").await;
    b.wait_for("#config-result", "Saved. Restart required for: api.listen")
        .await;
    b.wait_for(
        "#config-result .restart-required",
        "Restart required: api.listen",
    )
    .await;
    ui_shell::edit_config(&b, "c.routing.default_action = 'sideways';").await;
    b.click("#config-save").await;
    b.wait_for("#config-result", "Not saved").await;
    b.wait_for("#config-result .errors li", "sideways").await;
    b.screenshot("client-config-desktop").await;

    // export as YAML, then import the edited export
    b.click("#config-export").await;
    b.wait_for("#flash", "Exported as YAML").await;
    b.wait_script(
        "return document.querySelector('#import-text').value.includes('from-editor');",
        "the exported YAML in the import box",
    )
    .await;
    b.wait_for("#config-download", "Download switchyard-client.yaml")
        .await;
    b.script(
        "const t = document.querySelector('#import-text'); \
         t.value = t.value.replace('editor.test', 'imported.test'); return true;",
    )
    .await;
    b.click("#config-import").await;
    b.wait_for("#import-result", "Imported").await;
    let tested = get(c.api, "/api/v1/routes/test?domain=imported.test");
    assert_eq!(tested["matched_route"], "from-editor", "{tested}");

    // VPN: split-tunnel rules through the panel; enabling fails here (no IPv4 TUN path) and
    // the panel says so with the client's reason and its `error` state
    b.click("#tab-vpn").await;
    b.wait_for("#vpn-status", "disabled").await;
    // vpn.split.allow_lan (default true) is shown with the split rules
    b.wait_for("#split-lan", "Directly connected LAN: bypasses the VPN")
        .await;
    b.fill("#split-domain", "*.split.test").await;
    b.click("#split-domain-add").await;
    b.wait_for(
        "#split-domains li[data-rule=\"*.split.test\"]",
        "*.split.test",
    )
    .await;
    b.fill("#split-ip", "192.0.2.0/24").await;
    b.click("#split-ip-add").await;
    b.wait_for("#split-ips li[data-rule=\"192.0.2.0/24\"]", "192.0.2.0/24")
        .await;
    b.choose("#split-mode", "include: only matches use the VPN")
        .await;
    b.click("#split-mode-save").await;
    b.wait_for("#flash", "Split-tunnel mode saved.").await;
    let rules = get(c.api, "/api/v1/vpn/split/rules");
    assert_eq!(rules["mode"], "include", "{rules}");
    assert_eq!(rules["domains"], json!(["*.split.test"]), "{rules}");
    assert_eq!(rules["ips"], json!(["192.0.2.0/24"]), "{rules}");
    b.click("#split-ips li[data-rule=\"192.0.2.0/24\"] button")
        .await;
    b.wait_hidden("#split-ips li[data-rule=\"192.0.2.0/24\"]")
        .await;
    assert_eq!(
        get(c.api, "/api/v1/vpn/split/rules")["ips"],
        json!([]),
        "the IP rule is gone"
    );
    b.click("#vpn-enable").await;
    b.wait_for("#error", "VPN not enabled: the VPN path is not running")
        .await;
    b.wait_for("#vpn-error", "VPN error:").await;
    b.wait_for("#vpn-status", "error").await;
    assert_eq!(get(c.api, "/api/v1/vpn/status")["status"], "error");
    b.screenshot("client-vpn-desktop").await;

    // mesh: the state the client reports, and its refusal to enable, shown as they are
    let mesh = get(c.api, "/api/v1/mesh/status");
    let mesh_state = mesh["status"].as_str().expect("mesh status").to_owned();
    b.click("#tab-mesh").await;
    b.wait_for("#mesh-status", &mesh_state).await;
    if mesh["enabled"] == false {
        b.wait_for("#mesh-state", &format!("Mesh is {mesh_state}"))
            .await;
        let (code, refused) = call(c.api, "POST", "/api/v1/mesh/enable");
        if code >= 400 {
            let why = refused["message"].as_str().unwrap_or_default().to_owned();
            b.click("#mesh-enable").await;
            b.wait_for("#error", &format!("Mesh not enabled: {why}"))
                .await;
        }
    }

    // cache
    b.click("#tab-cache").await;
    b.wait_for("#cache-stats", "Hit rate").await;

    ui_shell::assert_no_stored_token(&b).await;

    // phone width: readable without sideways scrolling
    b.click("#tab-status").await;
    ui_shell::resize_to_phone_and_check_width(&b).await;
    b.wait_for("#status", "HTTP proxy").await;
    b.screenshot("client-status-phone").await;
    b.click("#tab-vpn").await;
    b.screenshot("client-vpn-phone").await;
    b.click("#tab-routes").await;
    b.screenshot("client-routes-phone").await;

    // sign out ends the session on the client too
    ui_shell::sign_out(&b).await;
    b.quit().await;
}

/// Without `api.token` the client API is open: the page opens without sign-in and offers no
/// sign-out.
#[tokio::test(flavor = "multi_thread")]
async fn open_api_needs_no_sign_in() {
    let Some(b) = Browser::start_if_installed().await else {
        return;
    };
    let unreachable: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let c = tokio::task::block_in_place(|| start_client(unreachable, None, true));
    let url = format!("http://{}/", c.web);
    ui_shell::assert_open_without_sign_in(&b, &url, "#status", "HTTP proxy").await;
    b.quit().await;
}

/// The web UI listener serves the page with the strict CSP (and `/` redirects to it) and the
/// client API behind the same token; without `web_ui.enabled` nothing listens for it.
#[test]
fn web_ui_listener_serves_the_page_and_the_guarded_api() {
    let server = start_server("");
    let c = start_client(server.http, Some(TOKEN), true);
    let base = format!("http://{}", c.web);
    for (path, ctype) in [
        ("/ui/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/common.js", "text/javascript"),
        ("/ui/style.css", "text/css"),
    ] {
        ui_shell::assert_served_with_strict_csp(&base, path, ctype);
    }
    ui_shell::assert_root_redirects_to_the_page(&base);
    assert!(headers(&format!("{base}/api/v1/status")).starts_with("http/1.1 401"));
    assert!(headers(&format!("{base}/api/v1/health")).starts_with("http/1.1 200"));
    let (code, status) = call(c.web, "GET", "/api/v1/status");
    assert_eq!(code, 200, "{status}");
    assert_eq!(status["http_proxy"], c.http.to_string());
    // the client's session cookie has its own name: a server dashboard on the same host (cookies
    // do not tell ports apart) keeps its session
    let login = curl(&[
        "-sS",
        "-D",
        "-",
        "-o",
        "/dev/null",
        "-H",
        "Content-Type: application/json",
        "--data",
        &format!("{{\"token\": \"{TOKEN}\"}}"),
        &format!("{base}/api/v1/login"),
    ]);
    let login = String::from_utf8_lossy(&login.stdout).to_lowercase();
    assert!(
        login.contains("set-cookie: switchyard_client_session="),
        "{login}"
    );
    // the API listener does not serve the page
    assert!(headers(&format!("http://{}/ui/", c.api)).starts_with("http/1.1 404"));
    drop(c);

    // off by default: the web UI would have logged its listener before the API's
    let off = start_client(server.http, Some(TOKEN), false);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let logs = loop {
        // the collector stores a line just after reporting its listener
        let logs = off.logs.lock().map(|l| l.join("\n")).unwrap_or_default();
        if logs.contains("client API listening") || std::time::Instant::now() > deadline {
            break logs;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(logs.contains("client API listening"), "{logs}");
    assert!(!logs.contains("web UI listening"), "{logs}");
}
