//! The server dashboard (`/ui/` on the management API) end to end: the real binary on
//! loopback, headless Chromium through tests/support/browser.rs for the main flows, and curl /
//! reqwest for the security headers and the CSRF rule. Screenshots at desktop and phone width
//! land in target/ui-screenshots/.

mod support;

use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use support::browser::Browser;
use support::ui_shell::{self, headers};
use support::{api_call, http_code, start_server_with_file, Proc, Server};

const TOKEN: &str = "dash-s3cret-token";

/// A server with an API token, the request log on, and backend tests aimed at `test_target`
/// (a loopback listener: nothing leaves the machine).
fn server(test_target: &str) -> Server {
    server_with_token(Some(TOKEN), test_target)
}

fn server_with_token(token: Option<&str>, test_target: &str) -> Server {
    let token = token.map_or(String::new(), |t| format!("  token: \"{t}\"\n"));
    let dir = tempfile::tempdir().expect("tempdir");
    let config_path = dir.path().join("server.yaml");
    let yaml = format!(
        "server:\n  http: {{ listen: \"127.0.0.1:0\" }}\n  socks5: {{ listen: \"127.0.0.1:0\" }}\n  cores: 2\n\
         api:\n  listen: \"127.0.0.1:0\"\n{token}  enable_request_log: true\n  backend_test_target: \"{test_target}\"\n\
         logging: {{ level: info, format: json }}\n"
    );
    std::fs::write(&config_path, yaml).expect("write config");
    start_server_with_file(dir, config_path)
}

/// A loopback TCP listener that never answers and closes a connection only when its peer
/// does: a proxied request to it stays a live connection until the client gives up.
fn holding_listener() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(120)));
                while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    port
}

/// Sign-in (wrong token first), a live connection, routes, backend test, request log, config
/// save (hot-reloaded and restart-required), mesh registry off, no token in web storage, and
/// screenshots at desktop and phone width.
#[tokio::test(flavor = "multi_thread")]
async fn dashboard_main_flows_in_chromium() {
    let Some(b) = Browser::start_if_installed().await else {
        return;
    };
    let hold_port = holding_listener();
    let s = server(&format!("127.0.0.1:{hold_port}"));
    let base = format!("http://{}", s.api);
    b.resize(1280, 800).await;

    // `/` leads to the sign-in form; a wrong token shows the server's refusal; then by keyboard
    ui_shell::sign_in(&b, &format!("{base}/"), TOKEN).await;
    b.wait_for("#panel-overview", "Live connections").await;
    b.wait_for("#live-state", "live: on").await;

    // a live connection appears while it lasts (a CONNECT tunnel to a listener that never answers)
    let target = format!("127.0.0.1:{hold_port}");
    let slow = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "--max-time", "60", "-p", "-x"])
        .arg(format!("http://{}", s.http))
        .arg(format!("http://{target}/slow"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start curl");
    let slow = Proc {
        child: slow,
        name: "curl".into(),
    };
    b.wait_for("#connections tbody tr", &target).await;
    b.wait_for("#events li", &format!("connection.new: CONNECT {target}"))
        .await;
    b.screenshot("dashboard-overview-desktop").await;
    drop(slow);
    b.wait_for(
        "#events li",
        &format!("connection.close: closed CONNECT {target}"),
    )
    .await;

    // a request made by curl shows in the request log
    let code = http_code(&[
        "-x",
        &format!("http://{}", s.http),
        &format!("{base}/api/v1/health?from=dashboard-test"),
    ]);
    assert_eq!(code, "200");
    b.click("#tab-requests").await;
    b.wait_for("#requests tbody tr", "/api/v1/health?from=dashboard-test")
        .await;
    b.fill("#filter-host", "no-such-host.test").await;
    b.click("#request-filters button[type=submit]").await;
    b.wait_for("#requests tbody", "No requests match.").await;

    // create and delete a route
    b.click("#tab-routes").await;
    b.fill("#route-name", "dash-route").await;
    b.fill("#route-domains", "*.dash.test, dash.test").await;
    b.choose("#route-backend", "direct").await;
    // above the catch-all `default` route of the same backend, so the tester below tells them apart
    b.fill("#route-priority", "10").await;
    b.click("#route-create").await;
    b.wait_for("#flash", "Route dash-route created.").await;
    b.wait_for(
        "#routes tr[data-route=\"dash-route\"]",
        "*.dash.test, dash.test",
    )
    .await;
    let (_, routes) = api_call(&s, "GET", "/api/v1/routes", None, Some(TOKEN));
    assert!(routes.to_string().contains("dash-route"), "{routes}");
    // the route tester answers from the running data plane's route table
    b.fill("#route-test-domain", "www.dash.test:8080").await;
    b.click("#route-test").await;
    b.wait_for(
        "#route-test-result",
        "www.dash.test:8080 → route dash-route (backends: direct)",
    )
    .await;
    let (_, other) = api_call(
        &s,
        "GET",
        "/api/v1/routes/test?domain=elsewhere.test",
        None,
        Some(TOKEN),
    );
    let expected = match other["matched_route"].as_str() {
        Some(route) => format!("elsewhere.test → route {route}"),
        None => "elsewhere.test → refused: no route matches".to_owned(),
    };
    b.fill("#route-test-domain", "elsewhere.test").await;
    b.click("#route-test").await;
    b.wait_for("#route-test-result", &expected).await;
    b.click("#routes tr[data-route=\"dash-route\"] button.delete")
        .await;
    b.wait_for("#flash", "Route dash-route deleted.").await;
    b.wait_hidden("#routes tr[data-route=\"dash-route\"]").await;
    let (_, routes) = api_call(&s, "GET", "/api/v1/routes", None, Some(TOKEN));
    assert!(!routes.to_string().contains("dash-route"), "{routes}");

    // the backend test button shows the measured result
    b.click("#tab-backends").await;
    b.wait_for("#backends tr[data-backend=\"direct\"]", "direct")
        .await;
    b.click("button.test[data-backend=\"direct\"]").await;
    b.wait_for(
        ".test-result[data-backend=\"direct\"]",
        &format!("ok → {target}"),
    )
    .await;

    // config: a routes change is hot-reloaded, a logging change needs a restart
    b.click("#tab-config").await;
    b.wait_script(
        "return document.querySelector('#config-text').value.includes('\"routes\"');",
        "the running configuration in the editor",
    )
    .await;
    ui_shell::edit_config(
        &b,
        "c.routes = (c.routes || []).concat([{name: 'from-editor', domains: ['editor.test'], backend: 'direct'}]);",
    )
    .await;
    b.click("#config-validate").await;
    b.wait_for("#config-result", "Valid configuration.").await;
    b.click("#config-save").await;
    b.wait_for("#config-result .hot-reloaded", "Hot-reloaded: routes")
        .await;
    b.wait_for("#config-result .restart-required", "Restart required: none")
        .await;
    let (_, routes) = api_call(&s, "GET", "/api/v1/routes", None, Some(TOKEN));
    assert!(routes.to_string().contains("from-editor"), "{routes}");
    ui_shell::edit_config(&b, "c.logging.level = 'debug';").await;
    b.click("#config-save").await;
    b.wait_for("#config-result", "Restart required for: logging")
        .await;
    b.wait_for(
        "#config-result .restart-required",
        "Restart required: logging",
    )
    .await;
    // an invalid configuration is refused with the server's errors
    ui_shell::edit_config(
        &b,
        "c.routes.push({name: 'broken', domains: ['b.test'], backend: 'no-such-backend'});",
    )
    .await;
    b.click("#config-save").await;
    b.wait_for("#config-result", "Not saved").await;
    b.wait_for("#config-result .errors li", "no-such-backend")
        .await;
    // the same in YAML, the file's format: the running configuration loads as YAML, an edited
    // route is hot-reloaded, an unknown key is refused naming it
    b.choose("#config-format", "YAML").await;
    b.wait_script(
        "const t = document.querySelector('#config-text').value; \
         return t.includes('routes:') && t.includes('editor.test') && !t.trim().startsWith('{');",
        "the running configuration as YAML in the editor",
    )
    .await;
    b.script(
        "const t = document.querySelector('#config-text'); \
         t.value = t.value.replace('editor.test', 'yaml-editor.test'); return true;",
    )
    .await;
    b.click("#config-validate").await;
    b.wait_for("#config-result", "Valid configuration.").await;
    b.click("#config-save").await;
    b.wait_for("#config-result .hot-reloaded", "Hot-reloaded: routes")
        .await;
    let (_, routes) = api_call(&s, "GET", "/api/v1/routes", None, Some(TOKEN));
    assert!(routes.to_string().contains("yaml-editor.test"), "{routes}");
    b.script(
        "const t = document.querySelector('#config-text'); \
         t.value = t.value + '\\nno_such_key: 1\\n'; return true;",
    )
    .await;
    b.click("#config-save").await;
    b.wait_for("#config-result", "Not saved").await;
    b.wait_for("#config-result .errors li", "no_such_key").await;

    // cache: stats, and a preset toggled from its button
    let (_, presets) = api_call(&s, "GET", "/api/v1/cache/presets", None, Some(TOKEN));
    let preset = &presets["presets"][0];
    let name = preset["name"].as_str().expect("a built-in cache preset");
    let was = preset["enabled"].as_bool().expect("enabled");
    b.click("#tab-cache").await;
    b.wait_for("#cache-stats", "Hit rate").await;
    b.click(&format!("#cache-presets tr[data-preset=\"{name}\"] button"))
        .await;
    b.wait_for(
        &format!("#cache-presets tr[data-preset=\"{name}\"] button"),
        if was { "Enable" } else { "Disable" },
    )
    .await;
    let (_, presets) = api_call(&s, "GET", "/api/v1/cache/presets", None, Some(TOKEN));
    assert_eq!(presets["presets"][0]["enabled"], json!(!was), "{presets}");
    // a cache rule created and deleted from the panel
    b.fill("#cache-rule-name", "dash-rule").await;
    b.fill("#cache-rule-domains", "*.cache.test").await;
    b.fill("#cache-rule-ttl", "2h").await;
    b.click("#cache-rule-create").await;
    b.wait_for("#cache-rules tr[data-rule=\"dash-rule\"]", "*.cache.test")
        .await;
    let (_, rules) = api_call(&s, "GET", "/api/v1/cache/rules", None, Some(TOKEN));
    assert!(rules.to_string().contains("dash-rule"), "{rules}");
    b.click("#cache-rules tr[data-rule=\"dash-rule\"] button")
        .await;
    b.wait_hidden("#cache-rules tr[data-rule=\"dash-rule\"]")
        .await;
    let (_, rules) = api_call(&s, "GET", "/api/v1/cache/rules", None, Some(TOKEN));
    assert!(!rules.to_string().contains("dash-rule"), "{rules}");

    // mesh registry off (the default): said so from the server's answer, no fake list
    // (tests/mesh_registry.rs drives the panel with the registry on)
    b.click("#tab-mesh").await;
    b.wait_for("#mesh-unavailable", "mesh registry is off")
        .await;
    // auth plugins with their availability
    b.click("#tab-auth").await;
    b.wait_for("#auth-plugins tbody tr", "").await;

    ui_shell::assert_no_stored_token(&b).await;

    // phone width: the overview is still usable
    b.click("#tab-overview").await;
    ui_shell::resize_to_phone_and_check_width(&b).await;
    b.wait_for("#stats", "Active connections").await;
    b.screenshot("dashboard-overview-phone").await;
    b.click("#tab-routes").await;
    b.screenshot("dashboard-routes-phone").await;

    // sign out ends the session on the server too
    ui_shell::sign_out(&b).await;
    b.quit().await;
}

/// Without `api.token` the API is open: the page opens without sign-in and offers no sign-out.
#[tokio::test(flavor = "multi_thread")]
async fn open_api_needs_no_sign_in() {
    let Some(b) = Browser::start_if_installed().await else {
        return;
    };
    let s = tokio::task::block_in_place(|| server_with_token(None, "127.0.0.1:9"));
    let url = format!("http://{}/", s.api);
    ui_shell::assert_open_without_sign_in(&b, &url, "#stats", "Active connections").await;
    b.quit().await;
}

/// Every UI response carries the strict CSP and friends; `/` redirects to `/ui/`; the page is
/// open (it signs in itself) while the API stays closed.
#[test]
fn assets_are_served_with_strict_security_headers() {
    let s = server("127.0.0.1:9");
    let base = format!("http://{}", s.api);
    for (path, ctype) in [
        ("/ui/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/common.js", "text/javascript"),
        ("/ui/style.css", "text/css"),
    ] {
        ui_shell::assert_served_with_strict_csp(&base, path, ctype);
    }
    ui_shell::assert_root_redirects_to_the_page(&base);
    assert!(headers(&format!("{base}/ui/nope.js")).starts_with("http/1.1 404"));
    assert!(headers(&format!("{base}/api/v1/status")).starts_with("http/1.1 401"));
}

/// A cookie-authenticated state change needs the session's X-CSRF-Token (sent in every
/// cookie-authenticated answer); Bearer clients need no such header.
#[tokio::test(flavor = "multi_thread")]
async fn cookie_authenticated_changes_need_the_csrf_header() {
    let s = tokio::task::block_in_place(|| server("127.0.0.1:9"));
    let base = format!("http://{}", s.api);
    let http = support::http_client_builder()
        .cookie_store(true)
        .build()
        .expect("client");
    let login = http
        .post(format!("{base}/api/v1/login"))
        .json(&json!({"token": TOKEN}))
        .send()
        .await
        .expect("login");
    assert_eq!(login.status(), 200);
    let status = http
        .get(format!("{base}/api/v1/status"))
        .send()
        .await
        .expect("status");
    assert_eq!(status.status(), 200);
    let csrf = status
        .headers()
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .expect("a cookie-authenticated answer carries X-CSRF-Token")
        .to_owned();
    let route = |name: &str| json!({"name": name, "domains": [format!("{name}.test")], "backend": "direct"});
    // (status, body) of a cookie-authenticated request, with `csrf` as X-CSRF-Token if given
    let send = |method: reqwest::Method, path: &str, body: Option<Value>, csrf: Option<&str>| {
        let mut req = http.request(method, format!("{base}{path}"));
        if let Some(t) = csrf {
            req = req.header("X-CSRF-Token", t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        async move {
            let resp = req.send().await.expect("request");
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let post = reqwest::Method::POST;

    let (status, body) = send(
        post.clone(),
        "/api/v1/routes",
        Some(route("no-header")),
        None,
    )
    .await;
    assert_eq!(status, 403);
    assert_eq!(body["code"], "CSRF_TOKEN_REQUIRED", "{body}");
    let wrong = "0".repeat(64);
    let (status, _) = send(
        post.clone(),
        "/api/v1/routes",
        Some(route("wrong-header")),
        Some(&wrong),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = send(
        post,
        "/api/v1/routes",
        Some(route("with-header")),
        Some(&csrf),
    )
    .await;
    assert_eq!(status, 201);
    let (status, _) = send(
        reqwest::Method::DELETE,
        "/api/v1/routes/with-header",
        None,
        None,
    )
    .await;
    assert_eq!(status, 403, "DELETE needs the header too");

    // Bearer clients are unaffected, and no route was created by a refused request
    let (code, _) = tokio::task::block_in_place(|| {
        api_call(
            &s,
            "POST",
            "/api/v1/routes",
            Some(&route("bearer").to_string()),
            Some(TOKEN),
        )
    });
    assert_eq!(code, 201);
    let (_, routes) =
        tokio::task::block_in_place(|| api_call(&s, "GET", "/api/v1/routes", None, Some(TOKEN)));
    let names = routes.to_string();
    assert!(
        names.contains("with-header") && names.contains("bearer"),
        "{names}"
    );
    assert!(
        !names.contains("no-header") && !names.contains("wrong-header"),
        "{names}"
    );
}
