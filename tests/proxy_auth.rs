//! Proxy authentication modes beyond native users, end to end: the real `switchyard server`
//! asked through by curl (HTTP, CONNECT, SOCKS5), verifying against real authorities started by
//! the test (an OpenLDAP `slapd` directory).

mod support;

use std::time::{Duration, Instant};
use support::slapd::{start_slapd, start_slapd_on, Slapd, BASE_DN};
use support::*;

const PAGE: &[u8] = b"<h1>behind the proxy</h1>\n";
const USERS: &[(&str, &str)] = &[("alice", "wonderland"), ("bob", "canwefixit")];

fn ldap_config(url: &str, extra: &str) -> String {
    format!(
        "auth:\n  mode: ldap\n  ldap:\n    url: \"{url}\"\n    base_dn: \"{BASE_DN}\"\n    user_filter: \"(uid=%s)\"\n{extra}"
    )
}

/// The status the HTTP proxy answered (`connect`: to the CONNECT that opens a tunnel).
fn via_http(server: &Server, url: &str, user: Option<&str>, connect: bool) -> String {
    via_http_from("127.0.0.1", server, url, user, connect)
}

/// [`via_http`] from the loopback address `source` (each address has its own failure budget).
fn via_http_from(
    source: &str,
    server: &Server,
    url: &str,
    user: Option<&str>,
    connect: bool,
) -> String {
    let proxy = format!("http://{}", server.http);
    let code = if connect {
        "%{http_connect}"
    } else {
        "%{http_code}"
    };
    let mut args = vec!["-s", "-o", "/dev/null", "-w", code, "--max-time", "20"];
    args.extend(["--interface", source, "-x", &proxy]);
    if let Some(u) = user {
        args.extend(["-U", u]);
    }
    if connect {
        args.push("-p");
    }
    args.push(url);
    String::from_utf8_lossy(&curl(&args).stdout).into_owned()
}

/// The head (lowercase) of the proxy's answer to a request without credentials, which must be
/// a 407.
fn unauthenticated_head(server: &Server, url: &str) -> String {
    let proxy = format!("http://{}", server.http);
    let out = curl(&["-sS", "-D", "-", "-o", "/dev/null", "-x", &proxy, url]);
    let head = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(head.starts_with("http/1.1 407"), "{head}");
    head
}

/// `availability.state` of auth plugin `name` in `GET /api/v1/auth/plugins`.
fn plugin_state(server: &Server, name: &str) -> String {
    let plugins = server.api_get("/api/v1/auth/plugins");
    plugins["plugins"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == name))
        .and_then(|p| p["availability"]["state"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn server_logged(server: &Server, needle: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let found = server
            .logs
            .lock()
            .map(|l| l.iter().any(|line| line.contains(needle)))
            .unwrap_or(false);
        if found || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn ldap_users_authenticate_by_search_and_bind() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let Some(dir) = start_slapd(USERS) else {
        return;
    };
    let server = start_server(&ldap_config(&dir.ldap_url, ""));
    let url = origin.url("/index.html");

    // No credentials: 407 with a Basic challenge.
    let head = unauthenticated_head(&server, &url);
    assert!(
        head.contains("proxy-authenticate: basic realm=\"switchyard\""),
        "{head}"
    );

    // The right password, over HTTP, CONNECT and SOCKS5 (RFC 1929).
    assert_eq!(
        via_http(&server, &url, Some("alice:wonderland"), false),
        "200"
    );
    assert_eq!(via_http(&server, &url, Some("bob:canwefixit"), true), "200");
    let socks = format!("socks5h://alice:wonderland@{}", server.socks5);
    let out = curl(&["-sS", "--max-time", "20", "-x", &socks, &url]);
    assert_eq!(out.stdout, PAGE, "{}", String::from_utf8_lossy(&out.stderr));

    // Wrong password, unknown user, empty password (an unauthenticated bind the directory
    // would accept), and a name that would match every entry if it were not escaped.
    assert_eq!(via_http(&server, &url, Some("alice:nope"), false), "407");
    assert_eq!(
        via_http(&server, &url, Some("carol:wonderland"), true),
        "407"
    );
    assert_eq!(via_http(&server, &url, Some("alice:"), false), "407");
    let searches = dir.searches();
    assert_eq!(
        via_http(&server, &url, Some("*)(uid=*:wonderland"), false),
        "407"
    );
    assert_eq!(via_http(&server, &url, Some("*:canwefixit"), false), "407");
    let socks = format!("socks5h://bob:wrong@{}", server.socks5);
    assert!(!curl(&["-sS", "--max-time", "20", "-x", &socks, &url])
        .status
        .success());
    // The injection names were looked up (escaped) and found nobody: no bind was tried for them.
    // `b*` would match exactly bob's entry if it were not escaped, and his password would pass.
    assert_eq!(via_http(&server, &url, Some("b*:canwefixit"), false), "407");
    assert!(dir.searches() >= searches + 3);
    let log = dir.log();
    assert!(log.contains(r#"filter="(uid=\2A\29\28uid=\2A)""#), "{log}");
    assert!(log.contains(r#"filter="(uid=b\2A)""#), "{log}");

    // The cache: repeating a verified password (accepted or refused) does not reach the
    // directory again.
    // (From another address: 127.0.0.1 has spent most of its failure budget above.)
    let (alice, bob) = (dir.binds_as("alice"), dir.binds_as("bob"));
    assert!(alice >= 1 && bob >= 1, "binds: alice {alice}, bob {bob}");
    let again =
        |user: &str, connect: bool| via_http_from("127.0.0.2", &server, &url, Some(user), connect);
    for _ in 0..3 {
        assert_eq!(again("alice:wonderland", false), "200");
        assert_eq!(again("alice:nope", true), "407");
    }
    assert_eq!(
        dir.binds_as("alice"),
        alice,
        "cached outcomes went to the directory"
    );
    // A new password does (and is refused).
    assert_eq!(again("alice:guess", false), "407");
    assert_eq!(dir.binds_as("alice"), alice + 1);
    assert_eq!(dir.binds_as("bob"), bob);

    // Connections are reused: the proxy's checks ran on at most one connection per core, not
    // one per check.
    let connections = dir.bound_connections();
    assert!(connections.len() <= 2, "{connections:?}\n{}", dir.log());

    // The plugin list reports LDAP as available.
    assert_eq!(plugin_state(&server, "ldap"), "available");
}

fn ldap_tls_case(dir: &Slapd, url: &str, extra: &str, trust_ca: bool) -> String {
    let origin_page = start_nginx(&[("index.html", PAGE)]).expect("nginx");
    let env: Vec<(&str, &std::ffi::OsStr)> = if trust_ca {
        vec![("SSL_CERT_FILE", dir.ca_cert.as_os_str())]
    } else {
        Vec::new()
    };
    let server = start_server_with_yaml_env(&ldap_config(url, extra), &env);
    via_http(
        &server,
        &origin_page.url("/index.html"),
        Some("alice:wonderland"),
        false,
    )
}

#[test]
fn ldap_over_ldaps_and_starttls() {
    if require("nginx").is_none() {
        return;
    }
    let Some(dir) = start_slapd(USERS) else {
        return;
    };
    // LDAPS with the directory's CA trusted.
    assert_eq!(ldap_tls_case(&dir, &dir.ldaps_url, "", true), "200");
    // StartTLS on the plain port.
    assert!(!dir.saw_starttls());
    assert_eq!(
        ldap_tls_case(&dir, &dir.ldap_url, "    tls: true\n", true),
        "200"
    );
    assert!(dir.saw_starttls(), "{}", dir.log());
    // An untrusted certificate is refused (the check fails, so 407), for LDAPS and StartTLS...
    assert_eq!(ldap_tls_case(&dir, &dir.ldaps_url, "", false), "407");
    assert_eq!(
        ldap_tls_case(&dir, &dir.ldap_url, "    tls: true\n", false),
        "407"
    );
    // ...unless verification is turned off.
    let skip = "    insecure_skip_verify: true\n";
    assert_eq!(ldap_tls_case(&dir, &dir.ldaps_url, skip, false), "200");
}

#[test]
fn ldap_directory_down_answers_407_and_says_why() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    if require("slapd").is_none() {
        return;
    }
    let port = free_port();
    let server = start_server(&ldap_config(&format!("ldap://127.0.0.1:{port}"), ""));
    let url = origin.url("/index.html");
    let proxy = format!("http://{}", server.http);
    let out = curl(&[
        "-sS",
        "-D",
        "-",
        "-x",
        &proxy,
        "-U",
        "alice:wonderland",
        &url,
    ]);
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(text.starts_with("http/1.1 407"), "{text}");
    assert!(text.contains("proxy-authenticate: basic"), "{text}");
    assert!(
        text.contains("authentication service is unavailable"),
        "{text}"
    );
    assert!(
        server_logged(&server, "proxy authentication could not be checked"),
        "no log line about the directory"
    );
    assert!(server_logged(
        &server,
        &format!("127.0.0.1:{port} unreachable")
    ));
    // SOCKS5 is refused too.
    let socks = format!("socks5h://alice:wonderland@{}", server.socks5);
    assert!(!curl(&["-sS", "--max-time", "20", "-x", &socks, &url])
        .status
        .success());
    // An outage is neither remembered nor charged to the client: once the directory is up, the
    // same credentials pass at once (more attempts than the failure budget were made).
    for _ in 0..10 {
        assert_eq!(
            via_http(&server, &url, Some("alice:wonderland"), false),
            "407"
        );
    }
    let Some(dir) = start_slapd_on(USERS, port) else {
        return;
    };
    assert_eq!(
        via_http(&server, &url, Some("alice:wonderland"), false),
        "200"
    );
    assert_eq!(dir.binds_as("alice"), 1);
}

/// A local account and a PAM service file of the test's own (pam_exec logs every
/// authentication PAM runs for it, then pam_unix checks the password); both removed on drop.
struct LocalAccount {
    user: String,
    service: String,
    dir: tempfile::TempDir,
}

impl LocalAccount {
    fn create(password: &str) -> Option<LocalAccount> {
        let uid = std::process::Command::new("id").arg("-u").output().ok()?;
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            assert!(
                std::env::var_os("CI").is_none(),
                "the PAM test needs root in CI"
            );
            eprintln!("SKIP: creating a local user needs root");
            return None;
        }
        let useradd = require("useradd")?;
        let chpasswd = require("chpasswd")?;
        let user = format!("syauth{}", std::process::id());
        let service = format!("switchyard-test-{user}");
        let dir = tempfile::tempdir().expect("tempdir");
        let account = LocalAccount {
            user: user.clone(),
            service: service.clone(),
            dir,
        };
        let made = std::process::Command::new(useradd)
            .args(["-M", "-N", "-s", "/usr/sbin/nologin", &user])
            .status()
            .expect("useradd");
        assert!(made.success(), "useradd {user}");
        let mut set = std::process::Command::new(chpasswd)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("chpasswd");
        {
            use std::io::Write;
            let mut stdin = set.stdin.take().expect("stdin");
            writeln!(stdin, "{user}:{password}").expect("write chpasswd");
        }
        assert!(set.wait().expect("chpasswd").success());
        let rules = format!(
            "auth optional pam_exec.so quiet log={} /usr/bin/printenv PAM_USER\n\
             auth required pam_unix.so nodelay\naccount required pam_unix.so\n",
            account.calls_log().display()
        );
        std::fs::write(account.service_file(), rules).expect("write PAM service");
        Some(account)
    }

    fn service_file(&self) -> std::path::PathBuf {
        std::path::Path::new("/etc/pam.d").join(&self.service)
    }

    fn calls_log(&self) -> std::path::PathBuf {
        self.dir.path().join("pam-calls.log")
    }

    /// Authentications PAM ran for `user`.
    fn authentications(&self, user: &str) -> usize {
        std::fs::read_to_string(self.calls_log())
            .unwrap_or_default()
            .lines()
            .filter(|l| l.trim() == user)
            .count()
    }
}

impl Drop for LocalAccount {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.service_file());
        let _ = std::process::Command::new("userdel")
            .arg(&self.user)
            .status();
    }
}

#[test]
fn system_accounts_authenticate_through_pam() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let Some(account) = LocalAccount::create("s3cret-Pam") else {
        return;
    };
    let user = account.user.clone();
    let server = start_server(&format!(
        "auth:\n  mode: system\n  system:\n    service: \"{}\"\n",
        account.service
    ));
    let url = origin.url("/index.html");
    let good = format!("{user}:s3cret-Pam");

    assert_eq!(via_http(&server, &url, None, false), "407");
    assert_eq!(via_http(&server, &url, Some(&good), false), "200");
    assert_eq!(via_http(&server, &url, Some(&good), true), "200");
    let socks = format!("socks5h://{good}@{}", server.socks5);
    let out = curl(&["-sS", "--max-time", "20", "-x", &socks, &url]);
    assert_eq!(out.stdout, PAGE, "{}", String::from_utf8_lossy(&out.stderr));

    assert_eq!(
        via_http(&server, &url, Some(&format!("{user}:wrong")), false),
        "407"
    );
    assert_eq!(
        via_http(&server, &url, Some(&format!("{user}:wrong")), true),
        "407"
    );
    assert_eq!(
        via_http(&server, &url, Some("syauth-nobody:s3cret-Pam"), false),
        "407"
    );
    let socks = format!("socks5h://{user}:wrong@{}", server.socks5);
    assert!(!curl(&["-sS", "--max-time", "20", "-x", &socks, &url])
        .status
        .success());

    // Outcomes are cached: repeating them does not run PAM again.
    let runs = account.authentications(&user);
    assert!(runs >= 2, "PAM ran {runs} times");
    for _ in 0..3 {
        let again = |u: &str| via_http_from("127.0.0.3", &server, &url, Some(u), false);
        assert_eq!(again(&good), "200");
        assert_eq!(again(&format!("{user}:wrong")), "407");
    }
    assert_eq!(account.authentications(&user), runs);

    assert_eq!(plugin_state(&server, "system"), "available");
}

fn oauth_config(issuer: &str, extra: &str) -> String {
    format!(
        "auth:\n  mode: oauth\n  oauth:\n    issuer_url: \"{issuer}\"\n    client_id: switchyard-proxy\n{extra}"
    )
}

/// The status through the HTTP proxy with `Proxy-Authorization: Bearer <token>`.
fn with_bearer(server: &Server, url: &str, token: &str, connect: bool) -> String {
    let proxy = format!("http://{}", server.http);
    let header = format!("Proxy-Authorization: Bearer {token}");
    let code = if connect {
        "%{http_connect}"
    } else {
        "%{http_code}"
    };
    let mut args = vec!["-s", "-o", "/dev/null", "-w", code, "--max-time", "20"];
    args.extend(["-x", &proxy, "--proxy-header", &header]);
    if connect {
        args.push("-p");
    }
    args.push(url);
    String::from_utf8_lossy(&curl(&args).stdout).into_owned()
}

#[test]
fn oauth_tokens_from_a_real_openid_provider() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let Some(op) = support::oidc::start_provider(None, "key-1") else {
        return;
    };
    let server = start_server_with_request_log(&oauth_config(&op.issuer(), ""));
    let url = origin.url("/index.html");

    // No token: 407 offering Bearer and Basic.
    let head = unauthenticated_head(&server, &url);
    assert!(
        head.contains("proxy-authenticate: bearer realm=\"switchyard\""),
        "{head}"
    );
    assert!(
        head.contains("proxy-authenticate: basic realm=\"switchyard\""),
        "{head}"
    );

    // A real token: as Bearer (HTTP and CONNECT) and as the Basic password.
    let token = op.token("");
    assert_eq!(with_bearer(&server, &url, &token, false), "200");
    assert_eq!(with_bearer(&server, &url, &token, true), "200");
    assert_eq!(
        via_http(&server, &url, Some(&format!("laptop:{token}")), true),
        "200"
    );
    // The request log names the token's subject (the client `laptop`), not a user name typed
    // beside the token.
    assert_eq!(
        via_http(&server, &url, Some(&format!("mallory:{token}")), false),
        "200"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = server.api_get("/api/v1/requests?limit=20");
        let names: Vec<String> = log["requests"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| e["username"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert!(!names.iter().any(|n| n == "mallory"), "{log}");
        // Bearer HTTP and CONNECT, Basic `laptop:` and `mallory:`: all the token's subject.
        if names.iter().filter(|n| *n == "laptop").count() == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "request log: {log}");
        std::thread::sleep(Duration::from_millis(100));
    }

    // A token with a changed signature, a garbage token, an unsigned one.
    let (head_payload, signature) = token.rsplit_once('.').expect("a JWT");
    let flipped = if signature.starts_with('A') { "B" } else { "A" };
    let forged = format!("{head_payload}.{flipped}{}", &signature[1..]);
    let payload = head_payload.split('.').nth(1).expect("payload");
    let unsigned = format!("eyJhbGciOiJub25lIn0.{payload}.");
    for bad in [forged.as_str(), "not-a-token", unsigned.as_str()] {
        assert_eq!(with_bearer(&server, &url, bad, false), "407", "{bad}");
    }

    // A token that expires (2 s): accepted while valid, refused once expired although its
    // acceptance was cached.
    let short = op.token("short");
    assert_eq!(with_bearer(&server, &url, &short, false), "200");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(with_bearer(&server, &url, &short, false), "407");
    assert_eq!(with_bearer(&server, &url, &op.token("short"), true), "200");

    // Key rotation: the provider restarts (same issuer) with a new key; its tokens name a key
    // the proxy has not seen, so it fetches the key set again (rate-limited: until the next
    // fetch is allowed, the answer is "unavailable", which is not remembered).
    let port = op.port;
    drop(op);
    let op = support::oidc::start_provider(Some(port), "key-2").expect("restart provider");
    let rotated = op.token("");
    let deadline = Instant::now() + Duration::from_secs(15);
    while with_bearer(&server, &url, &rotated, false) != "200" {
        assert!(
            Instant::now() < deadline,
            "the rotated key was never fetched"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(server_logged(&server, "OAuth key set fetched"));

    // The issuer down: a token naming an unknown key cannot be checked → 407 and a log line.
    drop(op);
    let unknown_kid = format!("eyJhbGciOiJSUzI1NiIsImtpZCI6ImtleS05In0.{payload}.{signature}");
    // (Past the refresh interval, so the proxy does try to fetch the keys.)
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(with_bearer(&server, &url, &unknown_kid, false), "407");
    let issuer = format!("http://127.0.0.1:{port}");
    assert!(server_logged(
        &server,
        &format!("OAuth issuer {issuer}: GET")
    ));
}

#[test]
fn oauth_tokens_by_introspection() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let Some(op) = support::oidc::start_provider(None, "key-1") else {
        return;
    };
    let extra = format!(
        "    client_secret: proxy-secret\n    introspection_url: \"{}/token/introspection\"\n",
        op.issuer()
    );
    let server = start_server(&oauth_config(&op.issuer(), &extra));
    let url = origin.url("/index.html");
    let opaque = op.token("opaque");
    assert_eq!(with_bearer(&server, &url, &opaque, false), "200");
    assert_eq!(
        via_http(&server, &url, Some(&format!("laptop:{opaque}")), true),
        "200"
    );
    let socks = format!("socks5h://laptop:{opaque}@{}", server.socks5);
    let out = curl(&["-sS", "--max-time", "20", "-x", &socks, &url]);
    assert_eq!(out.stdout, PAGE, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(with_bearer(&server, &url, "made-up-token", false), "407");
    // The provider down: not checkable, so 407 and a log line.
    drop(op);
    assert_eq!(
        with_bearer(&server, &url, "another-made-up-token", false),
        "407"
    );
    assert!(server_logged(
        &server,
        "introspection: error sending request"
    ));
}

#[test]
fn negotiate_settings_and_provider_type_are_checked() {
    // A keytab that is not there: start-up fails saying so.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("server.yaml");
    let negotiate = "auth:\n  mode: none\n  negotiate:\n    enabled: true\n    keytab: /nonexistent/proxy.keytab\n    service_principal: HTTP/proxy.example.org\n    realm: EXAMPLE.ORG\n";
    std::fs::write(&path, negotiate).expect("config");
    let out = std::process::Command::new(BIN)
        .args(["server", "--config"])
        .arg(&path)
        .output()
        .expect("run switchyard");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("keytab /nonexistent/proxy.keytab"), "{err}");
    // Validation (as on save): enabled without a keytab or principal is invalid...
    let server = start_server("");
    let body = serde_json::json!({"auth": {"negotiate": {"enabled": true}}});
    let (status, v) = api_call(
        &server,
        "POST",
        "/api/v1/config/validate",
        Some(&body.to_string()),
        None,
    );
    assert_eq!(status, 200);
    assert_eq!(v["valid"], false, "{v}");
    assert!(v.to_string().contains("auth.negotiate.keytab"), "{v}");
    // ...and `negotiate` as an auth mode (provider type) is refused pointing to auth.negotiate.*.
    let body = serde_json::json!({"auth": {"mode": "negotiate"}});
    let (_, v) = api_call(
        &server,
        "POST",
        "/api/v1/config/validate",
        Some(&body.to_string()),
        None,
    );
    assert_eq!(v["valid"], false, "{v}");
    assert!(v.to_string().contains("auth.negotiate"), "{v}");
    // The plugin list never shows it.
    let plugins = server.api_get("/api/v1/auth/plugins");
    assert!(!plugins.to_string().contains("negotiate"), "{plugins}");
}

#[test]
fn negotiate_kerberos_tickets_for_http_and_connect() {
    let Some(origin) = start_nginx(&[("index.html", PAGE)]) else {
        return;
    };
    let Some(kdc) = support::kdc::start_kdc() else {
        return;
    };
    kdc.add_user("alice", "alice-krb5");
    let alice = kdc.kinit("alice", "alice-krb5");
    let yaml = format!(
        "auth:\n  mode: none\n  negotiate:\n    enabled: true\n    keytab: \"{}\"\n    service_principal: \"{}\"\n    realm: \"{}\"\n",
        kdc.keytab.display(),
        support::kdc::SERVICE,
        support::kdc::REALM
    );
    let env = kdc.env();
    let env: Vec<(&str, &std::ffi::OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    let server = start_server_with_yaml_env(&yaml, &env);
    // Through `localhost`, so curl asks for a ticket for HTTP/localhost.
    let proxy = format!("http://localhost:{}", server.http.port());
    let url = origin.url("/index.html");
    let negotiate = |ccache: &std::path::Path, connect: bool| {
        let code = if connect {
            "%{http_connect}"
        } else {
            "%{http_code}"
        };
        let mut cmd = std::process::Command::new("curl");
        cmd.envs(kdc.env())
            .env("KRB5CCNAME", format!("FILE:{}", ccache.display()))
            .args(["-s", "-o", "/dev/null", "-w", code, "--max-time", "20"])
            .args(["--proxy-negotiate", "-U", ":", "-x", &proxy]);
        if connect {
            cmd.arg("-p");
        }
        let out = cmd.arg(&url).output().expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    assert_eq!(negotiate(&alice, false), "200");
    assert_eq!(negotiate(&alice, true), "200");
    // The proxy asked the KDC for nothing; curl got a service ticket for the proxy.
    let klist = std::process::Command::new("klist")
        .envs(kdc.env())
        .env("KRB5CCNAME", format!("FILE:{}", alice.display()))
        .output()
        .expect("klist");
    assert!(String::from_utf8_lossy(&klist.stdout).contains("HTTP/localhost@SYTEST.ORG"));

    // No ticket: 407 with a Negotiate challenge (and curl cannot answer it).
    let empty = kdc.dir.path().join("cc-nobody");
    assert_eq!(negotiate(&empty, false), "407");
    let head = unauthenticated_head(&server, &url);
    assert!(head.contains("proxy-authenticate: negotiate"), "{head}");
    // A made-up token, and Basic credentials (no mode checks them): 407.
    let made_up = "Proxy-Authorization: Negotiate YIIBhgYGKwYBBQUCoIIBejCCAXag";
    let status = http_code(&["-x", &proxy, "--proxy-header", made_up, &url]);
    assert_eq!(status, "407");
    assert_eq!(
        via_http(&server, &url, Some("alice:alice-krb5"), false),
        "407"
    );
    // SOCKS5 cannot carry SPNEGO: refused.
    let socks = format!("socks5h://alice:alice-krb5@{}", server.socks5);
    assert!(!curl(&["-sS", "--max-time", "20", "-x", &socks, &url])
        .status
        .success());
}
