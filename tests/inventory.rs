//! End-to-end tests of `switchyard inventory`: the real binary on a random loopback port with a
//! temp data directory, driven over HTTP with reqwest and a cookie jar the way a browser or a
//! NextAuth client drives it. Accounts, the first-admin race, sessions (expiry, renewal,
//! restart, server-side revocation), CSRF, bruteforce limits, every validation message,
//! categories/locations/items, list search/filter/sort/pagination, user isolation, admin
//! visibility, images, export/import.
//!
//! Every test runs twice: `sqlite::NAME` (SQLite in the data directory) and `postgres::NAME`
//! (a real PostgreSQL server the tests start themselves, one cluster per test binary and one
//! database per service data directory, see `inventory_pg.rs`). Without PostgreSQL the
//! `postgres` variants skip with a printed reason; with `CI` set they fail instead.
//! No test asserts a wall-clock time; the expiry test sleeps across a short configured idle
//! timeout.

mod support;

#[macro_use]
#[path = "inventory_pg.rs"]
mod pg;

#[path = "inventory_ui.rs"]
mod ui;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg::Db;
use reqwest::header::{HeaderMap, CONTENT_TYPE, COOKIE, RETRY_AFTER, SET_COOKIE};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use support::{spawn_reporting, start_moto, Moto, Proc, Reported, BIN};

// ------------------------------------------------------------------ helpers

struct Inventory {
    _proc: Proc,
    addr: SocketAddr,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Inventory {
    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    fn logs(&self) -> String {
        self.logs.lock().map(|l| l.join("\n")).unwrap_or_default()
    }
}

/// Starts `switchyard inventory --listen 127.0.0.1:0 --data-dir DIR` with `yaml` as its config
/// file (in DIR) and `envs`, waiting for its "listening on" line. On PostgreSQL the data
/// directory's own database is used (the same one again after a restart).
fn start(db: &Db, dir: &Path, yaml: &str, envs: &[(&str, &str)]) -> Inventory {
    let config = dir.join("inventory-test.yaml");
    std::fs::write(&config, yaml).expect("write config");
    let mut cmd = Command::new(BIN);
    cmd.args(["inventory", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .arg("--config")
        .arg(&config)
        .env_remove("AUTH_SECRET")
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "info");
    if let Db::Postgres(lease) = db {
        cmd.env("DATABASE_URL", lease.database(dir));
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let Reported { proc, addr, logs } = spawn_reporting(cmd, "switchyard inventory");
    let inv = Inventory {
        _proc: proc,
        addr,
        logs,
    };
    let engine = match db {
        Db::Sqlite => "engine=Sqlite",
        Db::Postgres(_) => "engine=Postgres",
    };
    assert!(inv.logs().contains(engine), "{}", inv.logs());
    inv
}

fn fresh(db: &Db, yaml: &str) -> (tempfile::TempDir, Inventory) {
    let dir = tempfile::tempdir().expect("tempdir");
    let inv = start(db, dir.path(), yaml, &[]);
    (dir, inv)
}

/// A browser-like client: cookie jar, no redirect following, the CSRF token it holds (bound
/// to its session: sign-in and sign-out hand out a new one, which [`Client::call`] picks up).
struct Client {
    http: reqwest::Client,
    base: String,
    csrf: Mutex<String>,
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

impl Reply {
    fn error(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }
}

impl Client {
    async fn new(inv: &Inventory) -> Client {
        let http = support::http_client_builder()
            .cookie_store(true)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client");
        let c = Client {
            http,
            base: inv.url(""),
            csrf: Mutex::new(String::new()),
        };
        c.refresh_csrf().await;
        c
    }

    /// The CSRF token the client holds.
    fn token(&self) -> String {
        self.csrf.lock().map(|t| t.clone()).unwrap_or_default()
    }

    fn set_token(&self, token: &str) {
        if let Ok(mut t) = self.csrf.lock() {
            *t = token.to_string();
        }
    }

    /// Fetches the CSRF token for the client's current session (as the web UI does).
    async fn refresh_csrf(&self) {
        let r = self.call(Method::GET, "/api/auth/csrf", None, false).await;
        assert_eq!(r.status, 200);
        self.set_token(r.body["csrfToken"].as_str().expect("csrfToken"));
    }

    /// Request with an optional JSON body; `csrf` adds the `X-CSRF-Token` header.
    async fn call(&self, method: Method, path: &str, body: Option<Value>, csrf: bool) -> Reply {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(b) = body {
            req = req.json(&b);
        }
        if csrf {
            req = req.header("x-csrf-token", self.token());
        }
        let resp = req.send().await.expect("request");
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        // sign-in and sign-out answer with the token of the new session (or of none)
        if status == StatusCode::FOUND {
            if let Some(t) = body["csrfToken"].as_str() {
                self.set_token(t);
            }
        }
        Reply {
            status,
            headers,
            body,
        }
    }

    async fn get(&self, path: &str) -> Reply {
        self.call(Method::GET, path, None, false).await
    }
    async fn post(&self, path: &str, body: Value) -> Reply {
        self.call(Method::POST, path, Some(body), true).await
    }
    async fn put(&self, path: &str, body: Value) -> Reply {
        self.call(Method::PUT, path, Some(body), true).await
    }
    async fn delete(&self, path: &str) -> Reply {
        self.call(Method::DELETE, path, None, true).await
    }

    async fn register(&self, email: &str, password: &str) -> Reply {
        self.call(
            Method::POST,
            "/api/auth/register",
            Some(json!({"name": "Tester", "email": email, "password": password, "confirmPassword": password})),
            false,
        )
        .await
    }

    async fn sign_in(&self, email: &str, password: &str) -> Reply {
        self.call(
            Method::POST,
            "/api/auth/callback/credentials",
            Some(json!({"email": email, "password": password, "csrfToken": self.token()})),
            false,
        )
        .await
    }

    /// Register and sign in; returns the user record.
    async fn account(inv: &Inventory, email: &str) -> (Client, Value) {
        let c = Client::new(inv).await;
        let r = c.register(email, "correct horse").await;
        assert_eq!(r.status, 201, "{:?}", r.body);
        let s = c.sign_in(email, "correct horse").await;
        assert_eq!(s.status, 302, "{:?}", s.body);
        (c, r.body)
    }
}

fn id(v: &Value) -> String {
    v["id"].as_str().expect("id").to_string()
}

fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("inventory.session-token="))
        .map(str::to_string)
}

// ------------------------------------------------------------------ accounts and sessions

async fn registration_validation_roles_and_duplicates(db: Db) {
    let (_dir, inv) = fresh(&db, "");
    let c = Client::new(&inv).await;
    let cases = [
        (
            json!({"email": "x@example.org", "password": "short", "confirmPassword": "short"}),
            "Password must be at least 8 characters",
        ),
        (
            json!({"email": "not-an-email", "password": "12345678", "confirmPassword": "12345678"}),
            "Invalid email address",
        ),
        (
            json!({"password": "12345678", "confirmPassword": "12345678"}),
            "Email is required",
        ),
        (
            json!({"email": "x@example.org", "password": "12345678", "confirmPassword": "12345679"}),
            "Passwords do not match",
        ),
        (
            json!({"name": "n".repeat(101), "email": "x@example.org", "password": "12345678", "confirmPassword": "12345678"}),
            "Name must be at most 100 characters",
        ),
    ];
    for (body, message) in cases {
        let r = c
            .call(Method::POST, "/api/auth/register", Some(body), false)
            .await;
        assert_eq!(r.status, 400, "{message}");
        assert_eq!(r.error(), message);
    }
    let r = c
        .call(
            Method::POST,
            "/api/auth/register",
            Some(Value::String("x".into())),
            false,
        )
        .await;
    assert_eq!(r.status, 400);
    let first = c.register("Admin@Example.org", "password-1").await;
    assert_eq!(first.status, 201);
    assert_eq!(first.body["role"], "ADMIN");
    assert_eq!(first.body["email"], "admin@example.org");
    assert_eq!(first.body["name"], "Tester");
    assert!(first.body.get("password").is_none() && first.body.get("passwordHash").is_none());
    let second = c.register("user@example.org", "password-2").await;
    assert_eq!(second.body["role"], "USER");
    // duplicate (any case): 409, and the first account keeps its password
    let dup = c.register("ADMIN@example.org", "other-password").await;
    assert_eq!(dup.status, 409);
    assert_eq!(dup.error(), "User with this email already exists");
    assert_eq!(
        c.sign_in("admin@example.org", "other-password")
            .await
            .status,
        401
    );
    assert_eq!(
        c.sign_in("admin@example.org", "password-1").await.status,
        302
    );
    assert!(!inv.logs().contains("password-1"), "passwords never logged");
}

/// Two (and then eight) simultaneous first registrations on fresh servers: exactly one ADMIN.
async fn first_admin_race_yields_exactly_one_admin(db: Db) {
    for n in [2usize, 8] {
        let (_dir, inv) = fresh(&db, "");
        let c = Arc::new(Client::new(&inv).await);
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let c = c.clone();
                tokio::spawn(async move {
                    c.register(&format!("racer{i}@example.org"), "12345678")
                        .await
                })
            })
            .collect();
        let mut roles = Vec::new();
        for t in tasks {
            let r = t.await.expect("task");
            assert_eq!(r.status, 201, "{:?}", r.body);
            roles.push(r.body["role"].as_str().unwrap_or("").to_string());
        }
        let admins = roles.iter().filter(|r| *r == "ADMIN").count();
        assert_eq!(admins, 1, "{n} racers: {roles:?}");
    }
}

async fn sign_in_session_csrf_and_sign_out(db: Db) {
    let (_dir, inv) = fresh(&db, "");
    let c = Client::new(&inv).await;
    assert_eq!(c.register("a@example.org", "12345678").await.status, 201);
    assert_eq!(c.get("/api/auth/session").await.body, Value::Null);
    assert_eq!(c.get("/api/items").await.status, 401);

    // sign-in needs the CSRF token (field or header) and its cookie
    let no_token = c
        .call(
            Method::POST,
            "/api/auth/callback/credentials",
            Some(json!({"email": "a@example.org", "password": "12345678"})),
            false,
        )
        .await;
    assert_eq!(no_token.status, 403);
    let wrong = c
        .call(
            Method::POST,
            "/api/auth/callback/credentials",
            Some(json!({"email": "a@example.org", "password": "12345678", "csrfToken": "forged"})),
            false,
        )
        .await;
    assert_eq!(wrong.status, 403);
    let stranger = support::http_client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let r = stranger
        .post(inv.url("/api/auth/callback/credentials"))
        .json(&json!({"email": "a@example.org", "password": "12345678", "csrfToken": c.token()}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 403, "a token without its cookie is refused");
    let bad = c.sign_in("a@example.org", "wrong-password").await;
    assert_eq!(bad.status, 401);
    assert_eq!(bad.error(), "Invalid email or password");
    assert_eq!(
        c.sign_in("nobody@example.org", "12345678").await.error(),
        "Invalid email or password"
    );

    // NextAuth-style form post with a local callbackUrl
    let form = c
        .http
        .post(inv.url("/api/auth/callback/credentials"))
        .form(&[
            ("email", "a@example.org"),
            ("password", "12345678"),
            ("csrfToken", c.token().as_str()),
            ("callbackUrl", "/items"),
        ])
        .send()
        .await
        .expect("send");
    assert_eq!(form.status(), 302);
    assert_eq!(form.headers()["location"], "/items");
    c.refresh_csrf().await;
    let cookie = session_cookie(form.headers()).expect("session cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Lax") && cookie.contains("Path=/"),
        "{cookie}"
    );
    assert!(!cookie.contains("Secure"), "plain HTTP: not Secure");
    let token = cookie
        .split(';')
        .next()
        .unwrap_or("")
        .trim_start_matches("inventory.session-token=");
    assert_eq!(token.split('.').count(), 5, "JWE compact serialization");
    assert_eq!(
        token.split('.').nth(1),
        Some(""),
        "alg dir: empty encrypted key"
    );

    let open_redirect = c
        .http
        .post(inv.url("/api/auth/callback/credentials"))
        .form(&[
            ("email", "a@example.org"),
            ("password", "12345678"),
            ("csrfToken", c.token().as_str()),
            ("callbackUrl", "https://evil.example/"),
        ])
        .send()
        .await
        .expect("send");
    assert_eq!(open_redirect.headers()["location"], "/");
    c.refresh_csrf().await;

    let s = c.get("/api/auth/session").await;
    assert_eq!(s.body["user"]["email"], "a@example.org");
    assert_eq!(s.body["user"]["role"], "ADMIN");
    assert!(s.body["expires"].as_str().is_some_and(|e| e.ends_with('Z')));
    assert!(
        session_cookie(&s.headers).is_some(),
        "session renewed on use"
    );

    // state-changing requests with the cookie need X-CSRF-Token
    let body = json!({"name": "Tools"});
    let r = c
        .call(Method::POST, "/api/categories", Some(body.clone()), false)
        .await;
    assert_eq!(r.status, 403);
    assert_eq!(r.error(), "Invalid CSRF token");
    let r = c
        .http
        .post(inv.url("/api/categories"))
        .header("x-csrf-token", "forged")
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 403);
    let created = c.post("/api/categories", body).await;
    assert_eq!(created.status, 201);
    let r = c
        .call(
            Method::DELETE,
            &format!("/api/categories/{}", id(&created.body)),
            None,
            false,
        )
        .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        c.get("/api/categories").await.body["categories"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    // non-JSON bodies are refused on the JSON API
    let r = c
        .http
        .post(inv.url("/api/categories"))
        .header("x-csrf-token", c.token())
        .header(CONTENT_TYPE, "text/plain")
        .body("name=x")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 400);

    // a second sign-in of the same user (another device) and a copy of the first cookie
    let other_device = Client::new(&inv).await;
    assert_eq!(
        other_device
            .sign_in("a@example.org", "12345678")
            .await
            .status,
        302
    );
    let copied = session_cookie(&c.get("/api/auth/session").await.headers).expect("cookie");
    let copied = copied.split(';').next().unwrap_or("").to_string();
    let with_copy = |path: &'static str| {
        let url = inv.url(path);
        let cookie = copied.clone();
        async move {
            support::http_client()
                .get(url)
                .header(COOKIE, cookie)
                .send()
                .await
                .expect("send")
        }
    };
    assert_eq!(with_copy("/api/categories").await.status(), 200);

    // sign-out needs the token too, then the session is gone
    let r = c.call(Method::POST, "/api/auth/signout", None, false).await;
    assert_eq!(r.status, 403);
    let r = c
        .call(
            Method::POST,
            "/api/auth/signout",
            Some(json!({"csrfToken": c.token()})),
            false,
        )
        .await;
    assert_eq!(r.status, 302);
    assert!(session_cookie(&r.headers).is_some_and(|c| c.contains("Max-Age=0")));
    assert_eq!(c.get("/api/auth/session").await.body, Value::Null);
    assert_eq!(c.get("/api/categories").await.status, 401);
    // revoked on the server: the copied cookie (still within its expiry) no longer works
    assert_eq!(with_copy("/api/categories").await.status(), 401);
    let s = with_copy("/api/auth/session").await;
    assert_eq!(s.json::<Value>().await.expect("json"), Value::Null);
    // only that session: the other device stays signed in
    assert_eq!(other_device.get("/api/categories").await.status, 200);
    // signing out again (cookie already revoked) is harmless
    let r = c
        .call(
            Method::POST,
            "/api/auth/signout",
            Some(json!({"csrfToken": c.token()})),
            false,
        )
        .await;
    assert_eq!(r.status, 302);
}

/// idle_timeout 3s: a used session lives on past 3s of total age, an unused one dies; a
/// tampered cookie is refused; with the generated secret kept in the data directory a session
/// survives a restart, with another AUTH_SECRET it does not.
async fn session_expiry_renewal_and_secret(db: Db) {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = "session:\n  idle_timeout: 3s\n  max_lifetime: 1h\n";
    let inv = start(&db, dir.path(), yaml, &[]);
    assert!(inv.logs().contains("generated a session secret"));
    let (c, _) = Client::account(&inv, "e@example.org").await;
    let raw = |inv: &Inventory, cookie: String| {
        let url = inv.url("/api/items");
        async move {
            support::http_client()
                .get(url)
                .header(COOKIE, cookie)
                .send()
                .await
                .expect("send")
                .status()
        }
    };
    let s = c.get("/api/auth/session").await;
    let first = session_cookie(&s.headers).expect("cookie");
    let first = first.split(';').next().unwrap_or("").to_string();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            c.get("/api/items").await.status,
            200,
            "renewed on every use"
        );
    }
    // the first cookie was never renewed: 4.5 s old > 3 s idle
    assert_eq!(raw(&inv, first).await, 401);
    let mut tampered = session_cookie(&c.get("/api/auth/session").await.headers).expect("cookie");
    tampered = tampered.split(';').next().unwrap_or("").to_string();
    tampered.insert(tampered.len() - 3, 'A');
    assert_eq!(raw(&inv, tampered).await, 401);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(
        c.get("/api/items").await.status,
        401,
        "idle session expired"
    );
    assert_eq!(c.get("/api/auth/session").await.body, Value::Null);

    // restart on the same data directory: the stored secret (0600) keeps sessions valid
    let c2 = Client::new(&inv).await;
    assert_eq!(
        c2.sign_in("e@example.org", "correct horse").await.status,
        302
    );
    let live = session_cookie(&c2.get("/api/auth/session").await.headers).expect("cookie");
    let live = live.split(';').next().unwrap_or("").to_string();
    drop(inv);
    let inv = start(&db, dir.path(), yaml, &[]);
    assert!(!inv.logs().contains("generated a session secret"));
    assert_eq!(
        raw(&inv, live.clone()).await,
        200,
        "session survives a restart"
    );
    drop(inv);
    let secret = "an-explicit-secret-that-is-long-enough-0123456789";
    let inv = start(&db, dir.path(), yaml, &[("AUTH_SECRET", secret)]);
    assert_eq!(raw(&inv, live).await, 401, "another secret, another key");
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.path().join("auth_secret"))
            .expect("secret")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}

async fn bruteforce_limits_answer_429_with_retry_after(db: Db) {
    let yaml = "limits:\n  signin_failures_per_account: 3\n  signin_failures_per_ip: 5\n  registrations_per_ip: 4\n  window: 10m\n";
    let (_dir, inv) = fresh(&db, yaml);
    let c = Client::new(&inv).await;
    assert_eq!(
        c.register("victim@example.org", "12345678").await.status,
        201
    );
    for _ in 0..3 {
        assert_eq!(
            c.sign_in("victim@example.org", "guess-guess").await.status,
            401
        );
    }
    let r = c.sign_in("victim@example.org", "12345678").await;
    assert_eq!(r.status, 429, "account locked even with the right password");
    let retry: u64 = r.headers[RETRY_AFTER]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=600).contains(&retry), "{retry}");
    // per IP: two more failures on another account reach 5
    for _ in 0..2 {
        assert_eq!(
            c.sign_in("other@example.org", "guess-guess").await.status,
            401
        );
    }
    assert_eq!(
        c.sign_in("third@example.org", "guess-guess").await.status,
        429
    );
    // registration attempts per IP (the first registration counted)
    for i in 0..3 {
        c.register(&format!("r{i}@example.org"), "12345678").await;
    }
    let r = c.register("r9@example.org", "12345678").await;
    assert_eq!(r.status, 429);
    assert!(r.headers.contains_key(RETRY_AFTER));
}

// ------------------------------------------------------------------ categories and locations

async fn categories_and_locations(db: Db) {
    let (_dir, inv) = fresh(&db, "");
    let (c, _) = Client::account(&inv, "cat@example.org").await;
    let d = c.post("/api/categories", json!({"name": "Tools"})).await;
    assert_eq!(d.status, 201);
    assert_eq!(d.body["color"], "#6366f1");
    assert_eq!(d.body["name"], "Tools");
    let e = c
        .post("/api/categories", json!({"name": "Paint", "color": "#F0a"}))
        .await;
    assert_eq!(e.body["color"], "#ff00aa");
    for bad in ["red", "#12", "#1234567", "ff00aa"] {
        let r = c
            .post("/api/categories", json!({"name": "X", "color": bad}))
            .await;
        assert_eq!(r.status, 400, "{bad}");
        assert_eq!(r.error(), "Invalid color format");
    }
    let r = c.post("/api/categories", json!({"name": "Tools"})).await;
    assert_eq!(
        (r.status.as_u16(), r.error()),
        (400, "Category already exists")
    );
    let r = c.post("/api/categories", json!({"color": "#fff"})).await;
    assert_eq!((r.status.as_u16(), r.error()), (400, "Name is required"));
    let cat = id(&d.body);
    let r = c
        .put(
            &format!("/api/categories/{cat}"),
            json!({"name": "Paint", "color": "#000"}),
        )
        .await;
    assert_eq!(
        (r.status.as_u16(), r.error()),
        (400, "Category already exists")
    );
    let r = c
        .put(&format!("/api/categories/{cat}"), json!({"color": "#zzz"}))
        .await;
    assert_eq!(r.error(), "Invalid color format");
    let r = c
        .put(
            &format!("/api/categories/{cat}"),
            json!({"name": "Hand tools", "color": "#123"}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        (r.body["name"].as_str(), r.body["color"].as_str()),
        (Some("Hand tools"), Some("#112233"))
    );

    let l = c
        .post(
            "/api/locations",
            json!({"name": "Garage", "description": "left shelf"}),
        )
        .await;
    assert_eq!(l.status, 201);
    assert_eq!(l.body["description"], "left shelf");
    let r = c.post("/api/locations", json!({"name": "Garage"})).await;
    assert_eq!(
        (r.status.as_u16(), r.error()),
        (400, "Location already exists")
    );
    let loc = id(&l.body);
    let r = c
        .put(
            &format!("/api/locations/{loc}"),
            json!({"name": "Garage", "description": null}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["description"], Value::Null);

    // _count.items, and deleting leaves items uncategorized / without location
    let item = c
        .post(
            "/api/items",
            json!({"name": "Hammer", "categoryId": cat, "locationId": loc}),
        )
        .await;
    assert_eq!(item.status, 201, "{:?}", item.body);
    let list = c.get("/api/categories").await.body;
    let tools = list["categories"]
        .as_array()
        .expect("list")
        .iter()
        .find(|x| x["id"] == cat.as_str())
        .expect("cat")
        .clone();
    assert_eq!(tools["_count"]["items"], 1);
    let list = c.get("/api/locations").await.body;
    assert_eq!(list["locations"][0]["_count"]["items"], 1);
    assert_eq!(
        c.delete(&format!("/api/categories/{cat}")).await.body,
        json!({"success": true})
    );
    assert_eq!(
        c.delete(&format!("/api/locations/{loc}")).await.body,
        json!({"success": true})
    );
    let it = c.get(&format!("/api/items/{}", id(&item.body))).await.body;
    assert_eq!(
        (it["categoryId"].clone(), it["category"].clone()),
        (Value::Null, Value::Null)
    );
    assert_eq!(
        (it["locationId"].clone(), it["location"].clone()),
        (Value::Null, Value::Null)
    );
    assert_eq!(
        c.delete(&format!("/api/categories/{cat}")).await.status,
        404
    );
}

// ------------------------------------------------------------------ items

async fn items_defaults_validation_and_updates(db: Db) {
    let (_dir, inv) = fresh(&db, "");
    let (c, _) = Client::account(&inv, "items@example.org").await;
    let r = c.post("/api/items", json!({"name": "Drill"})).await;
    assert_eq!(r.status, 201);
    let today = chrono_today();
    assert_eq!(r.body["quantity"], 1);
    assert_eq!(r.body["minQuantity"], 0);
    assert_eq!(r.body["buyPrice"], 0.0);
    assert_eq!(r.body["buyDate"], format!("{today}T00:00:00.000Z"));
    assert_eq!(r.body["images"], json!([]));
    for k in [
        "description",
        "manufacturer",
        "barcode",
        "categoryId",
        "locationId",
        "category",
        "location",
    ] {
        assert_eq!(r.body[k], Value::Null, "{k}");
    }
    let drill = id(&r.body);
    let cases = [
        (json!({}), "Name is required"),
        (json!({"name": "  "}), "Name is required"),
        (
            json!({"name": "x", "quantity": -1}),
            "quantity must be a non-negative integer",
        ),
        (
            json!({"name": "x", "quantity": 1.5}),
            "quantity must be a non-negative integer",
        ),
        (
            json!({"name": "x", "minQuantity": "a"}),
            "minQuantity must be a non-negative integer",
        ),
        (
            json!({"name": "x", "buyPrice": -3}),
            "buyPrice must be a non-negative number",
        ),
        (
            json!({"name": "x", "buyDate": "31/12/2024"}),
            "buyDate must be an ISO date (YYYY-MM-DD)",
        ),
        (
            json!({"name": "x", "categoryId": "nope"}),
            "categoryId must be a UUID",
        ),
        (
            json!({"name": "x", "categoryId": "5b0c6b4e-1d7e-4e8a-9a51-3c1b2f0b9d11"}),
            "Category not found",
        ),
        (
            json!({"name": "x", "locationId": "5b0c6b4e-1d7e-4e8a-9a51-3c1b2f0b9d11"}),
            "Location not found",
        ),
    ];
    for (body, message) in cases {
        let r = c.post("/api/items", body).await;
        assert_eq!((r.status.as_u16(), r.error()), (400, message));
    }
    let r = c
        .post("/api/items", json!({"name": "Saw", "barcode": "4006381333931", "buyDate": "2024-02-29", "buyPrice": 12.5, "quantity": 4, "minQuantity": 2, "manufacturer": "Bahco"}))
        .await;
    assert_eq!(r.status, 201);
    assert_eq!(r.body["buyDate"], "2024-02-29T00:00:00.000Z");
    assert_eq!(r.body["buyPrice"], 12.5);
    let dup = c
        .post(
            "/api/items",
            json!({"name": "Other", "barcode": "4006381333931"}),
        )
        .await;
    assert_eq!(
        (dup.status.as_u16(), dup.error()),
        (409, "Item with this barcode already exists")
    );
    let r = c
        .put(
            &format!("/api/items/{drill}"),
            json!({"barcode": "4006381333931"}),
        )
        .await;
    assert_eq!(r.status, 409);
    // PUT changes only what it names; null clears
    let r = c
        .put(
            &format!("/api/items/{drill}"),
            json!({"description": "cordless", "quantity": 0}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        (
            r.body["name"].as_str(),
            r.body["description"].as_str(),
            r.body["quantity"].as_i64()
        ),
        (Some("Drill"), Some("cordless"), Some(0))
    );
    assert!(r.body["updatedAt"].as_str() >= r.body["createdAt"].as_str());
    let r = c
        .put(&format!("/api/items/{drill}"), json!({"description": null}))
        .await;
    assert_eq!(r.body["description"], Value::Null);
    let r = c
        .put(&format!("/api/items/{drill}"), json!({"name": ""}))
        .await;
    assert_eq!(r.error(), "Name is required");
    assert_eq!(
        c.delete(&format!("/api/items/{drill}")).await.body,
        json!({"success": true})
    );
    assert_eq!(c.get(&format!("/api/items/{drill}")).await.status, 404);
    assert_eq!(c.delete(&format!("/api/items/{drill}")).await.status, 404);
}

fn chrono_today() -> String {
    // Avoids a chrono dev-dependency: `date -u +%F`.
    let out = Command::new("date")
        .args(["-u", "+%F"])
        .output()
        .expect("date");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

async fn list_search_filters_sorting_and_pagination(db: Db) {
    let (_dir, inv) = fresh(&db, "");
    let (c, _) = Client::account(&inv, "list@example.org").await;
    let cat = id(&c
        .post("/api/categories", json!({"name": "Electronics"}))
        .await
        .body);
    let loc = id(&c
        .post("/api/locations", json!({"name": "Attic"}))
        .await
        .body);
    for i in 0..25 {
        let mut body =
            json!({"name": format!("Widget {i:02}"), "quantity": i % 5, "minQuantity": 2});
        if i % 3 == 0 {
            body["categoryId"] = json!(cat);
        }
        if i % 4 == 0 {
            body["locationId"] = json!(loc);
        }
        assert_eq!(c.post("/api/items", body).await.status, 201);
    }
    c.post(
        "/api/items",
        json!({"name": "Multimeter", "description": "Measures VOLTAGE", "quantity": 9}),
    )
    .await;
    c.post(
        "/api/items",
        json!({"name": "Scope", "manufacturer": "Rigol", "quantity": 9}),
    )
    .await;
    c.post(
        "/api/items",
        json!({"name": "Cable", "barcode": "ABC-123_x", "quantity": 9}),
    )
    .await;
    c.post("/api/items", json!({"name": "100% cotton", "quantity": 9}))
        .await;

    let r = c.get("/api/items").await.body;
    assert_eq!(
        r["pagination"],
        json!({"page": 1, "limit": 20, "total": 29, "totalPages": 2})
    );
    assert_eq!(r["items"].as_array().map(Vec::len), Some(20));
    assert_eq!(
        r["items"][0]["name"], "100% cotton",
        "newest first by default"
    );
    let r = c.get("/api/items?page=2").await.body;
    assert_eq!(r["items"].as_array().map(Vec::len), Some(9));
    let r = c.get("/api/items?page=9").await.body;
    assert_eq!(r["items"], json!([]));
    assert_eq!(r["pagination"]["total"], 29);

    let names = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|i| i["name"].as_str().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    for (q, want) in [
        ("voltage", "Multimeter"),
        ("rigol", "Scope"),
        ("abc-123_", "Cable"),
        ("100%", "100% cotton"),
    ] {
        let r = c
            .get(&format!("/api/items?search={}", urlencode(q)))
            .await
            .body;
        assert_eq!(names(&r), [want], "search {q}");
    }
    let r = c.get("/api/items?search=_").await.body;
    assert_eq!(names(&r), ["Cable"], "LIKE wildcards are literal");
    let r = c.get("/api/items?search=widget&limit=100").await.body;
    assert_eq!(r["pagination"]["total"], 25);
    // search is case-insensitive beyond ASCII, and follows updates of the searched fields
    let oil = c
        .post(
            "/api/items",
            json!({"name": "Ölfilter", "manufacturer": "MAHLE", "quantity": 9}),
        )
        .await;
    let r = c
        .get(&format!("/api/items?search={}", urlencode("ÖLF")))
        .await
        .body;
    assert_eq!(names(&r), ["Ölfilter"]);
    c.put(
        &format!("/api/items/{}", id(&oil.body)),
        json!({"manufacturer": "Bosch", "description": "for the Zündapp"}),
    )
    .await;
    assert_eq!(
        names(&c.get("/api/items?search=mahle").await.body),
        Vec::<String>::new()
    );
    let r = c
        .get(&format!("/api/items?search={}", urlencode("zÜnd")))
        .await
        .body;
    assert_eq!(names(&r), ["Ölfilter"]);
    assert_eq!(
        c.delete(&format!("/api/items/{}", id(&oil.body)))
            .await
            .status,
        200
    );

    let r = c
        .get(&format!("/api/items?categoryId={cat}&limit=100"))
        .await
        .body;
    assert_eq!(r["pagination"]["total"], 9);
    assert!(r["items"]
        .as_array()
        .expect("items")
        .iter()
        .all(|i| i["category"]["name"] == "Electronics"));
    let r = c
        .get(&format!(
            "/api/items?locationId={loc}&categoryId={cat}&limit=100"
        ))
        .await
        .body;
    assert_eq!(r["pagination"]["total"], 3); // 0, 12, 24
                                             // lowStock: quantity <= minQuantity (2): i % 5 in {0, 1, 2} → 15 widgets
    let r = c.get("/api/items?lowStock=true&limit=100").await.body;
    assert_eq!(r["pagination"]["total"], 15);
    assert!(r["items"]
        .as_array()
        .expect("items")
        .iter()
        .all(|i| i["quantity"].as_i64() <= i["minQuantity"].as_i64()));

    let r = c
        .get("/api/items?sortBy=name&sortOrder=asc&limit=3")
        .await
        .body;
    assert_eq!(names(&r), ["100% cotton", "Cable", "Multimeter"]);
    assert_eq!(r["pagination"]["totalPages"], 10);
    let r = c
        .get("/api/items?sortBy=quantity&sortOrder=desc&limit=1&search=widget")
        .await
        .body;
    assert_eq!(r["items"][0]["quantity"], 4);
    for bad in [
        "sortBy=password_hash",
        "sortBy=name;drop",
        "sortOrder=sideways",
        "limit=0",
        "limit=101",
        "page=0",
        "page=abc",
        "lowStock=perhaps",
    ] {
        let r = c.get(&format!("/api/items?{bad}")).await;
        assert_eq!(r.status, 400, "{bad}");
    }
    assert!(c
        .get("/api/items?sortBy=bogus")
        .await
        .error()
        .starts_with("sortBy must be one of createdAt"));
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

// ------------------------------------------------------------------ isolation

/// User B probes every route with user A's ids: always 404 (as for an absent id), never 403,
/// and nothing of A's changes. The ADMIN (A, first user) sees and edits B's data.
async fn users_are_isolated_and_admin_sees_all(db: Db) {
    let (_dir, inv) = fresh(&db, "");
    let (a, a_user) = Client::account(&inv, "alice@example.org").await;
    assert_eq!(a_user["role"], "ADMIN");
    let (b, b_user) = Client::account(&inv, "bob@example.org").await;
    assert_eq!(b_user["role"], "USER");
    let a_cat = id(&a
        .post("/api/categories", json!({"name": "Tools"}))
        .await
        .body);
    let a_loc = id(&a.post("/api/locations", json!({"name": "Shed"})).await.body);
    let a_item = id(&a.post("/api/items", json!({"name": "Secret saw", "barcode": "111", "categoryId": a_cat, "locationId": a_loc})).await.body);

    // same names and barcode are fine for another user (uniqueness is per user)
    assert_eq!(
        b.post("/api/categories", json!({"name": "Tools"}))
            .await
            .status,
        201
    );
    assert_eq!(
        b.post("/api/locations", json!({"name": "Shed"}))
            .await
            .status,
        201
    );
    let b_item = b
        .post(
            "/api/items",
            json!({"name": "Bob's hammer", "barcode": "111"}),
        )
        .await;
    assert_eq!(b_item.status, 201);
    let b_item = id(&b_item.body);

    let probes = [
        (Method::GET, format!("/api/items/{a_item}"), None),
        (
            Method::PUT,
            format!("/api/items/{a_item}"),
            Some(json!({"name": "mine"})),
        ),
        (Method::DELETE, format!("/api/items/{a_item}"), None),
        (
            Method::PUT,
            format!("/api/categories/{a_cat}"),
            Some(json!({"name": "mine", "color": "#fff"})),
        ),
        (Method::DELETE, format!("/api/categories/{a_cat}"), None),
        (
            Method::PUT,
            format!("/api/locations/{a_loc}"),
            Some(json!({"name": "mine"})),
        ),
        (Method::DELETE, format!("/api/locations/{a_loc}"), None),
    ];
    for (m, path, body) in probes {
        let r = b.call(m.clone(), &path, body, true).await;
        assert_eq!(r.status, 404, "{m} {path}: {:?}", r.body);
    }
    // references to A's category/location are refused like unknown ones
    let r = b
        .post("/api/items", json!({"name": "x", "categoryId": a_cat}))
        .await;
    assert_eq!((r.status.as_u16(), r.error()), (400, "Category not found"));
    let r = b
        .put(
            &format!("/api/items/{b_item}"),
            json!({"locationId": a_loc}),
        )
        .await;
    assert_eq!((r.status.as_u16(), r.error()), (400, "Location not found"));
    // B's lists hold only B's rows; filters by A's ids find nothing
    let r = b.get("/api/items").await.body;
    assert_eq!(r["pagination"]["total"], 1);
    let r = b.get(&format!("/api/items?categoryId={a_cat}")).await.body;
    assert_eq!(r["pagination"]["total"], 0);
    assert_eq!(
        b.get("/api/categories").await.body["categories"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    assert_eq!(
        b.get("/api/locations").await.body["locations"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    // nothing of A's changed
    let it = a.get(&format!("/api/items/{a_item}")).await;
    assert_eq!(
        (it.status.as_u16(), it.body["name"].as_str()),
        (200, Some("Secret saw"))
    );
    assert_eq!(it.body["category"]["name"], "Tools");

    // the admin sees and edits everyone's rows
    assert_eq!(a.get("/api/items").await.body["pagination"]["total"], 2);
    assert_eq!(
        a.get("/api/categories").await.body["categories"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
    let r = a.get(&format!("/api/items/{b_item}")).await;
    assert_eq!(
        (r.status.as_u16(), r.body["userId"].clone()),
        (200, b_user["id"].clone())
    );
    let r = a
        .put(&format!("/api/items/{b_item}"), json!({"quantity": 7}))
        .await;
    assert_eq!(
        (r.status.as_u16(), r.body["quantity"].as_i64()),
        (200, Some(7))
    );
    // …but cannot attach their own category to B's item (categories belong to the item's owner)
    let r = a
        .put(
            &format!("/api/items/{b_item}"),
            json!({"categoryId": a_cat}),
        )
        .await;
    assert_eq!(r.error(), "Category not found");
    assert_eq!(a.delete(&format!("/api/items/{b_item}")).await.status, 200);
    assert_eq!(b.get("/api/items").await.body["pagination"]["total"], 0);
}

/// The unfiltered `total` comes from a per-user count kept in the write transactions (not a
/// COUNT(*)): after concurrent creates, deletes (some of one item twice at once) and an
/// import, it must equal what a filtered list (counted row by row) and the pages hold.
async fn unfiltered_total_stays_exact_under_concurrent_writes(db: Db) {
    let (_dir, inv) = fresh(&db, "");
    let (a, a_user) = Client::account(&inv, "admin@example.org").await;
    assert_eq!(a_user["role"], "ADMIN");
    let (b, _) = Client::account(&inv, "b@example.org").await;
    let (a, b) = (Arc::new(a), Arc::new(b));
    let mut tasks = Vec::new();
    for i in 0..24 {
        let c = if i % 4 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            c.post("/api/items", json!({"name": format!("counted {i}")}))
                .await
        }));
    }
    let mut b_ids = Vec::new();
    for t in tasks {
        let r = t.await.expect("task");
        assert_eq!(r.status, 201, "{:?}", r.body);
        if r.body["userId"] != a_user["id"] {
            b_ids.push(id(&r.body));
        }
    }
    assert_eq!(b_ids.len(), 18);
    // delete four of B's items, each twice at the same time: one delete removes the row
    let mut tasks = Vec::new();
    for item in &b_ids[..4] {
        for _ in 0..2 {
            let (b, path) = (b.clone(), format!("/api/items/{item}"));
            tasks.push(tokio::spawn(async move { b.delete(&path).await }));
        }
    }
    for t in tasks {
        let status = t.await.expect("task").status.as_u16();
        assert!(status == 200 || status == 404, "{status}");
    }
    let r = b
        .post(
            "/api/import",
            json!({"format": "switchyard-inventory", "version": 1, "items": [{"name": "imported"}]}),
        )
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);

    let unfiltered = |c: Arc<Client>| async move {
        c.get("/api/items?limit=100").await.body["pagination"]["total"].clone()
    };
    let counted = |c: Arc<Client>| async move {
        // a filter every item matches forces the row-by-row COUNT(*)
        c.get("/api/items?search=e&limit=100").await.body["pagination"]["total"].clone()
    };
    assert_eq!(unfiltered(b.clone()).await, json!(15));
    assert_eq!(counted(b.clone()).await, json!(15));
    let page = b.get("/api/items?limit=100").await.body;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(15));
    // the admin's total is everyone's
    assert_eq!(unfiltered(a.clone()).await, json!(21));
    assert_eq!(counted(a.clone()).await, json!(21));
}

// ------------------------------------------------------------------ images

const PNG: &[u8] =
    b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89";
const JPEG: &[u8] = &[0xff, 0xd8, 0xff, 0xe0, 0, 0x10, b'J', b'F', b'I', b'F', 0];

impl Client {
    async fn upload(&self, item: &str, part_name: &str, bytes: Vec<u8>, declared: &str) -> Reply {
        let file = reqwest::multipart::Part::bytes(bytes)
            .file_name("photo.png")
            .mime_str(declared)
            .expect("mime");
        let form = reqwest::multipart::Form::new().part(part_name.to_string(), file);
        let resp = self
            .http
            .post(format!("{}/api/items/{item}/images", self.base))
            .header("x-csrf-token", self.token())
            .multipart(form)
            .send()
            .await
            .expect("send");
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        Reply {
            status,
            headers,
            body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
        }
    }

    async fn bytes(&self, path: &str) -> (StatusCode, String, Vec<u8>) {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("send");
        let status = resp.status();
        let ct = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        (status, ct, resp.bytes().await.expect("bytes").to_vec())
    }
}

fn image_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("images"))
        .map(|d| d.filter_map(Result::ok).count())
        .unwrap_or(0)
}

/// Upload (type from the bytes, size limit), list, serve, delete; deleting the item deletes its
/// images; another user gets 404 everywhere.
async fn images_upload_list_serve_delete(db: Db) {
    let (dir, inv) = fresh(&db, "limits:\n  max_image_size: 4KiB\n");
    let (a, _) = Client::account(&inv, "img@example.org").await;
    let (b, _) = Client::account(&inv, "other@example.org").await;
    let item = id(&a.post("/api/items", json!({"name": "Camera"})).await.body);

    let png = a
        .upload(&item, "file", PNG.to_vec(), "application/octet-stream")
        .await;
    assert_eq!(png.status, 201, "{:?}", png.body);
    assert_eq!(png.body["contentType"], "image/png", "type from the bytes");
    assert_eq!(png.body["size"], PNG.len());
    assert_eq!(png.body["filename"], "photo.png");
    let jpeg = a.upload(&item, "file", JPEG.to_vec(), "image/png").await;
    assert_eq!(jpeg.body["contentType"], "image/jpeg");
    let webp = a
        .upload(
            &item,
            "file",
            b"RIFF\x10\0\0\0WEBPVP8 ".to_vec(),
            "image/webp",
        )
        .await;
    assert_eq!(webp.body["contentType"], "image/webp");

    let fake = a
        .upload(
            &item,
            "file",
            b"<svg onload=alert(1)>".to_vec(),
            "image/png",
        )
        .await;
    assert_eq!(
        (fake.status.as_u16(), fake.error()),
        (400, "Unsupported image type (PNG, JPEG, WebP or GIF)")
    );
    let mut big = PNG.to_vec();
    big.resize(4 * 1024 + 1, 0);
    let r = a.upload(&item, "file", big, "image/png").await;
    assert_eq!(r.status, 413);
    let r = a.upload(&item, "photo", PNG.to_vec(), "image/png").await;
    assert_eq!(
        (r.status.as_u16(), r.error()),
        (400, "No file uploaded (part named file)")
    );
    let r = a
        .post(&format!("/api/items/{item}/images"), json!({"file": "x"}))
        .await;
    assert_eq!(r.status, 400);

    let list = a.get(&format!("/api/items/{item}/images")).await.body;
    assert_eq!(list["images"].as_array().map(Vec::len), Some(3));
    let it = a.get(&format!("/api/items/{item}")).await.body;
    assert_eq!(it["images"].as_array().map(Vec::len), Some(3));
    let listed = a.get("/api/items").await.body;
    assert_eq!(
        listed["items"][0]["images"].as_array().map(Vec::len),
        Some(3)
    );

    let url = png.body["url"].as_str().expect("url").to_string();
    let (status, ct, bytes) = a.bytes(&url).await;
    assert_eq!(
        (status.as_u16(), ct.as_str(), bytes.as_slice()),
        (200, "image/png", PNG)
    );

    // another user: 404 on every image route
    assert_eq!(
        b.get(&format!("/api/items/{item}/images")).await.status,
        404
    );
    assert_eq!(
        b.upload(&item, "file", PNG.to_vec(), "image/png")
            .await
            .status,
        404
    );
    assert_eq!(b.bytes(&url).await.0, 404);
    let png_id = id(&png.body);
    let r = b
        .delete(&format!("/api/items/{item}/images?imageId={png_id}"))
        .await;
    assert_eq!(r.status, 404);

    let r = a.delete(&format!("/api/items/{item}/images")).await;
    assert_eq!((r.status.as_u16(), r.error()), (400, "imageId is required"));
    let r = a
        .delete(&format!("/api/items/{item}/images?imageId={png_id}"))
        .await;
    assert_eq!(r.body, json!({"success": true}));
    assert_eq!(a.bytes(&url).await.0, 404);
    assert_eq!(
        a.delete(&format!("/api/items/{item}/images?imageId={png_id}"))
            .await
            .status,
        404
    );
    assert_eq!(image_files(dir.path()), 2);

    assert_eq!(a.delete(&format!("/api/items/{item}")).await.status, 200);
    assert_eq!(
        image_files(dir.path()),
        0,
        "item deletion removes its image files"
    );
    assert_eq!(
        a.bytes(&format!("/api/images/{}", id(&jpeg.body))).await.0,
        404
    );
}

// ------------------------------------------------------------------ images on S3

/// Keys of the objects below `prefix` in `bucket` (ListObjectsV2, unsigned: moto allows it).
async fn s3_keys(moto: &Moto, bucket: &str, prefix: &str) -> Vec<String> {
    let xml = support::http_client()
        .get(format!(
            "{}/{bucket}?list-type=2&prefix={prefix}",
            moto.endpoint
        ))
        .send()
        .await
        .expect("list objects")
        .text()
        .await
        .expect("list body");
    xml.split("<Key>")
        .skip(1)
        .filter_map(|k| k.split("</Key>").next())
        .map(str::to_string)
        .collect()
}

/// `images.storage: s3` against moto: the bytes go to `BUCKET/PREFIX/<id>` (not the data
/// directory), are served back with their type, and image and item deletion remove the objects.
/// Credentials come from `${…}` references and never appear in the log.
#[tokio::test(flavor = "multi_thread")]
async fn images_on_s3_storage() {
    let Some(moto) = start_moto() else { return };
    let created = support::http_client()
        .put(format!("{}/inventory-images", moto.endpoint))
        .send()
        .await
        .expect("create bucket");
    assert!(created.status().is_success(), "{}", created.status());
    let yaml = format!(
        "images:\n  storage: s3\n  s3:\n    url: s3://inventory-images/img\n    endpoint: {}\n    region: us-east-1\n    access_key_id: ${{TEST_S3_KEY}}\n    secret_access_key: ${{TEST_S3_SECRET}}\n",
        moto.endpoint
    );
    let secret = "not-in-the-log-7f3a9c";
    let dir = tempfile::tempdir().expect("tempdir");
    let inv = start(
        &Db::Sqlite,
        dir.path(),
        &yaml,
        &[("TEST_S3_KEY", "testing"), ("TEST_S3_SECRET", secret)],
    );
    assert!(
        inv.logs().contains("s3://inventory-images/img"),
        "{}",
        inv.logs()
    );
    let (a, _) = Client::account(&inv, "s3@example.org").await;
    let item = id(&a.post("/api/items", json!({"name": "Drone"})).await.body);

    let png = a.upload(&item, "file", PNG.to_vec(), "image/png").await;
    assert_eq!(png.status, 201, "{:?}", png.body);
    let jpeg = a.upload(&item, "file", JPEG.to_vec(), "image/png").await;
    assert_eq!(jpeg.status, 201, "{:?}", jpeg.body);
    let (png_id, jpeg_id) = (id(&png.body), id(&jpeg.body));
    let mut keys = s3_keys(&moto, "inventory-images", "img/").await;
    keys.sort();
    let mut expected = vec![format!("img/{png_id}"), format!("img/{jpeg_id}")];
    expected.sort();
    assert_eq!(keys, expected);
    assert_eq!(image_files(dir.path()), 0, "nothing under DATA_DIR/images");

    let list = a.get(&format!("/api/items/{item}/images")).await.body;
    assert_eq!(list["images"].as_array().map(Vec::len), Some(2));
    let url = png.body["url"].as_str().expect("url").to_string();
    let (status, ct, bytes) = a.bytes(&url).await;
    assert_eq!(
        (status.as_u16(), ct.as_str(), bytes.as_slice()),
        (200, "image/png", PNG)
    );
    let (status, ct, bytes) = a.bytes(&format!("/api/images/{jpeg_id}")).await;
    assert_eq!(
        (status.as_u16(), ct.as_str(), bytes.as_slice()),
        (200, "image/jpeg", JPEG)
    );

    let r = a
        .delete(&format!("/api/items/{item}/images?imageId={png_id}"))
        .await;
    assert_eq!(r.body, json!({"success": true}));
    assert_eq!(a.bytes(&url).await.0, 404);
    assert_eq!(
        s3_keys(&moto, "inventory-images", "img/").await,
        [format!("img/{jpeg_id}")]
    );

    assert_eq!(a.delete(&format!("/api/items/{item}")).await.status, 200);
    assert!(
        s3_keys(&moto, "inventory-images", "img/").await.is_empty(),
        "item deletion removes its objects"
    );
    assert_eq!(a.bytes(&format!("/api/images/{jpeg_id}")).await.0, 404);
    assert!(!inv.logs().contains(secret), "{}", inv.logs());
}

// ------------------------------------------------------------------ export / import

/// JSON and CSV export; re-importing an export changes nothing; importing into another account
/// copies it; a file with one bad row, or one that fails inside the transaction, changes nothing.
async fn export_import_round_trip_idempotence_and_rollback(db: Db) {
    let (_dir, inv) = fresh(&db, "");
    Client::account(&inv, "root@example.org").await; // the ADMIN; the rest are USERs
    let (a, _) = Client::account(&inv, "exp@example.org").await;
    let cat = id(&a
        .post("/api/categories", json!({"name": "Tools", "color": "#0a0"}))
        .await
        .body);
    let loc = id(&a
        .post(
            "/api/locations",
            json!({"name": "Shed", "description": "back"}),
        )
        .await
        .body);
    a.post("/api/items", json!({"name": "Saw, \"big\"", "barcode": "B1", "categoryId": cat, "locationId": loc, "quantity": 3, "buyPrice": 9.5, "buyDate": "2024-01-02"})).await;
    a.post(
        "/api/items",
        json!({"name": "Tape", "description": "two\nlines"}),
    )
    .await;

    let export = a.get("/api/export").await;
    assert_eq!(export.status, 200);
    let doc = export.body.clone();
    assert_eq!(
        (doc["format"].as_str(), doc["version"].as_i64()),
        (Some("switchyard-inventory"), Some(1))
    );
    assert_eq!(doc["items"].as_array().map(Vec::len), Some(2));
    let before = a.get("/api/items?sortBy=name&sortOrder=asc").await.body;

    let r = a.post("/api/import", doc.clone()).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["items"], json!({"created": 0, "updated": 0}));
    assert_eq!(r.body["categories"], json!({"created": 0, "updated": 0}));
    assert_eq!(
        a.get("/api/items?sortBy=name&sortOrder=asc").await.body,
        before,
        "idempotent"
    );

    // CSV export, and its import into a fresh account; re-import changes nothing
    let (status, ct, csv) = a.bytes("/api/export?format=csv").await;
    assert_eq!(
        (status.as_u16(), ct.as_str()),
        (200, "text/csv; charset=utf-8")
    );
    let csv = String::from_utf8(csv).expect("utf-8");
    assert!(csv.starts_with("id,name,description,manufacturer,barcode,buyPrice,buyDate,quantity,minQuantity,category,location,createdAt,updatedAt\r\n"));
    assert!(csv.contains("\"Saw, \"\"big\"\"\""), "{csv}");
    let (c, _) = Client::account(&inv, "csv@example.org").await;
    let post_csv = |c: &Client, body: String| {
        c.http
            .post(format!("{}/api/import", c.base))
            .header("x-csrf-token", c.token())
            .header(CONTENT_TYPE, "text/csv")
            .body(body)
            .send()
    };
    let r = post_csv(&c, csv.clone()).await.expect("send");
    assert_eq!(r.status(), 200);
    let items = c.get("/api/items?sortBy=name&sortOrder=asc").await.body;
    assert_eq!(items["pagination"]["total"], 2);
    assert_eq!(items["items"][0]["name"], "Saw, \"big\"");
    assert_eq!(items["items"][0]["category"]["name"], "Tools");
    assert_eq!(items["items"][0]["location"]["name"], "Shed");
    assert_eq!(items["items"][0]["buyDate"], "2024-01-02T00:00:00.000Z");
    assert_eq!(items["items"][1]["description"], "two\nlines");
    // re-importing one's own CSV export changes nothing (rows matched by id)
    let own_csv = String::from_utf8(c.bytes("/api/export?format=csv").await.2).expect("utf-8");
    let again: Value = post_csv(&c, own_csv)
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(again["items"], json!({"created": 0, "updated": 0}));
    assert_eq!(c.get("/api/items").await.body["pagination"]["total"], 2);
    let again: Value = post_csv(&a, csv.clone())
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(again["items"], json!({"created": 0, "updated": 0}));
    assert_eq!(
        a.get("/api/items?sortBy=name&sortOrder=asc").await.body,
        before
    );

    // JSON import into another account: copies (own ids for rows whose ids are taken)
    let (b, _) = Client::account(&inv, "imp@example.org").await;
    let r = b.post("/api/import", doc.clone()).await;
    assert_eq!(r.body["items"], json!({"created": 2, "updated": 0}));
    assert_eq!(b.get("/api/items").await.body["pagination"]["total"], 2);
    assert_eq!(
        a.get("/api/items").await.body["pagination"]["total"],
        2,
        "A untouched"
    );

    // a bad row: nothing is written, every problem named
    let mut bad = doc.clone();
    bad["categories"]
        .as_array_mut()
        .expect("array")
        .push(json!({"name": "New"}));
    bad["items"]
        .as_array_mut()
        .expect("array")
        .push(json!({"name": "ok"}));
    bad["items"]
        .as_array_mut()
        .expect("array")
        .push(json!({"name": "x", "quantity": -1}));
    let r = b.post("/api/import", bad).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.error(),
        "items[3]: quantity must be a non-negative integer"
    );
    assert_eq!(b.get("/api/items").await.body["pagination"]["total"], 2);
    assert_eq!(
        b.get("/api/categories").await.body["categories"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    let r = post_csv(&b, "name,quantity\nfine,1\nbad,x\n".into())
        .await
        .expect("send");
    assert_eq!(r.status(), 400);
    assert_eq!(b.get("/api/items").await.body["pagination"]["total"], 2);

    // valid file, failing inside the transaction (barcode taken by an item not in the file):
    // rolled back, including the category created earlier in the same import
    a.post("/api/items", json!({"name": "Other", "barcode": "B2"}))
        .await;
    let mut clash = doc.clone();
    clash["categories"]
        .as_array_mut()
        .expect("array")
        .push(json!({"name": "Rollback"}));
    let saw = clash["items"]
        .as_array_mut()
        .expect("array")
        .iter_mut()
        .find(|i| i["barcode"] == "B1")
        .expect("saw");
    saw["barcode"] = json!("B2");
    let r = a.post("/api/import", clash).await;
    assert_eq!(
        (r.status.as_u16(), r.error()),
        (409, "Item with this barcode already exists")
    );
    let cats = a.get("/api/categories").await.body;
    assert!(cats["categories"]
        .as_array()
        .expect("array")
        .iter()
        .all(|c| c["name"] != "Rollback"));
    // the stored count rolled back with the rows: A's two items and "Other"
    assert_eq!(a.get("/api/items").await.body["pagination"]["total"], 3);
    let r = a
        .post("/api/import", json!({"format": "other", "version": 1}))
        .await;
    assert_eq!(r.status, 400);
}

// ------------------------------------------------------------------ hardening (issue 19)

/// The value of cookie `name` set by a response (`name=VALUE; …` → `VALUE`).
fn set_cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix(&format!("{name}=")))
        .map(|v| v.split(';').next().unwrap_or("").to_string())
}

/// A request carrying exactly `cookies` (no jar) and optional extra headers.
async fn raw(
    inv: &Inventory,
    method: Method,
    path: &str,
    cookies: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> reqwest::Response {
    let http = support::http_client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let mut req = http.request(method, inv.url(path));
    if !cookies.is_empty() {
        req = req.header(COOKIE, cookies);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    req.send().await.expect("send")
}

/// CSRF pairs are bound to the session: a pair fetched anonymously or by another user is
/// refused with a victim's session; sign-in issues a new token (the one from before no longer
/// works); over TLS both cookies are `__Host-` cookies and only those names are read.
async fn csrf_tokens_are_bound_to_the_session(db: Db) {
    let (_dir, inv) = fresh(&db, "");
    let (alice, _) = Client::account(&inv, "alice@example.org").await;
    let (bob, _) = Client::account(&inv, "bob@example.org").await;
    let session_of = |c: &Client| {
        let c = c.http.clone();
        let url = inv.url("/api/auth/session");
        async move {
            let r = c.get(url).send().await.expect("send");
            session_cookie(r.headers())
                .expect("session cookie")
                .split(';')
                .next()
                .unwrap_or("")
                .to_string()
        }
    };
    let alice_session = session_of(&alice).await;
    let bob_session = session_of(&bob).await;

    // an anonymous pair and bob's own pair, each used with alice's session: refused
    let anon = raw(&inv, Method::GET, "/api/auth/csrf", "", &[], None).await;
    let anon_cookie = set_cookie_value(anon.headers(), "inventory.csrf-token").expect("cookie");
    let anon_token = anon.json::<Value>().await.expect("json")["csrfToken"]
        .as_str()
        .expect("token")
        .to_string();
    let bobs = raw(&inv, Method::GET, "/api/auth/csrf", &bob_session, &[], None).await;
    let bob_cookie = set_cookie_value(bobs.headers(), "inventory.csrf-token").expect("cookie");
    let bob_token = bobs.json::<Value>().await.expect("json")["csrfToken"]
        .as_str()
        .expect("token")
        .to_string();
    for (who, cookie, token) in [
        ("anonymous", &anon_cookie, &anon_token),
        ("bob's", &bob_cookie, &bob_token),
    ] {
        let r = raw(
            &inv,
            Method::POST,
            "/api/categories",
            &format!("{alice_session}; inventory.csrf-token={cookie}"),
            &[("x-csrf-token", token)],
            Some(json!({"name": format!("forged by {who}")})),
        )
        .await;
        assert_eq!(r.status(), 403, "{who} pair accepted with alice's session");
    }
    // the same pair works for the session it was issued to
    let r = raw(
        &inv,
        Method::POST,
        "/api/categories",
        &format!("{bob_session}; inventory.csrf-token={bob_cookie}"),
        &[("x-csrf-token", &bob_token)],
        Some(json!({"name": "bob's own"})),
    )
    .await;
    assert_eq!(r.status(), 201);
    // (alice is ADMIN and sees bob's category too, but no forged one exists)
    let names: Vec<String> = alice.get("/api/categories").await.body["categories"]
        .as_array()
        .expect("categories")
        .iter()
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect();
    assert_eq!(names, ["bob's own"]);

    // sign-in rotates the token: the one held before no longer works, the new one does
    let c = Client::new(&inv).await;
    let before = c.token();
    let r = c.sign_in("alice@example.org", "correct horse").await;
    assert_eq!(r.status, 302);
    let after = r.body["csrfToken"]
        .as_str()
        .expect("new token in the reply")
        .to_string();
    assert_ne!(before, after);
    c.set_token(&before);
    assert_eq!(
        c.post("/api/categories", json!({"name": "x"})).await.status,
        403
    );
    c.set_token(&after);
    assert_eq!(
        c.post("/api/categories", json!({"name": "x"})).await.status,
        201
    );
    c.refresh_csrf().await;
    assert_eq!(c.token(), after, "/api/auth/csrf gives the session's token");

    // over TLS (a TLS-terminating proxy says https): __Host- cookies, only those are read
    let https = [("x-forwarded-proto", "https")];
    let r = raw(&inv, Method::GET, "/api/auth/csrf", "", &https, None).await;
    let csrf_cookie =
        set_cookie_value(r.headers(), "__Host-inventory.csrf-token").expect("__Host- csrf cookie");
    let raw_set: Vec<String> = r
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    assert!(
        raw_set
            .iter()
            .all(|c| c.contains("Secure") && c.contains("Path=/") && !c.contains("Domain")),
        "{raw_set:?}"
    );
    let token = r.json::<Value>().await.expect("json")["csrfToken"]
        .as_str()
        .expect("token")
        .to_string();
    let r = raw(
        &inv,
        Method::POST,
        "/api/auth/callback/credentials",
        &format!("__Host-inventory.csrf-token={csrf_cookie}"),
        &https,
        Some(
            json!({"email": "alice@example.org", "password": "correct horse", "csrfToken": token}),
        ),
    )
    .await;
    assert_eq!(r.status(), 302);
    let secure_session = set_cookie_value(r.headers(), "__Host-inventory.session-token")
        .expect("__Host- session cookie");
    let ok = raw(
        &inv,
        Method::GET,
        "/api/items",
        &format!("__Host-inventory.session-token={secure_session}"),
        &https,
        None,
    )
    .await;
    assert_eq!(ok.status(), 200);
    let plain_name = raw(
        &inv,
        Method::GET,
        "/api/items",
        &format!("inventory.session-token={secure_session}"),
        &https,
        None,
    )
    .await;
    assert_eq!(
        plain_name.status(),
        401,
        "over TLS only the __Host- name counts"
    );
}

/// callbackUrl: only same-origin relative paths are followed; tabs and newlines (which
/// browsers drop), backslashes (read as `/`) and protocol-relative or absolute URLs go to `/`.
async fn sign_in_callback_urls_stay_on_the_site(db: Db) {
    let (_dir, inv) = fresh(&db, "");
    let (c, _) = Client::account(&inv, "cb@example.org").await;
    let cases = [
        ("/items?x=1", "/items?x=1"),
        ("/\t/evil.example", "/"),
        ("/\n/evil.example", "/"),
        ("/\r\n/evil.example", "/"),
        ("/\\evil.example", "/"),
        ("/\\/evil.example", "/"),
        ("//evil.example", "/"),
        ("\t//evil.example", "/"),
        ("https://evil.example/", "/"),
        ("/ /evil.example", "/"),
    ];
    for (given, expected) in cases {
        let r = c
            .call(
                Method::POST,
                "/api/auth/callback/credentials",
                Some(
                    json!({"email": "cb@example.org", "password": "correct horse",
                            "csrfToken": c.token(), "callbackUrl": given}),
                ),
                false,
            )
            .await;
        assert_eq!(r.status, 302, "{given:?}");
        assert_eq!(r.headers["location"], expected, "{given:?}");
        assert_eq!(r.body["url"], expected, "{given:?}");
    }
}

/// A client bound to a source address in 127.0.0.0/8 (all of it is loopback).
fn client_from(ip: &str) -> reqwest::Client {
    support::http_client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .cookie_store(true)
        .local_address(ip.parse::<std::net::IpAddr>().ok())
        .build()
        .expect("client")
}

/// Signs in `email` from `http` (fetching a CSRF pair first) with extra headers; the status.
async fn sign_in_from(
    inv: &Inventory,
    http: &reqwest::Client,
    email: &str,
    password: &str,
    headers: &[(&str, &str)],
) -> StatusCode {
    let t: Value = http
        .get(inv.url("/api/auth/csrf"))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let mut req = http
        .post(inv.url("/api/auth/callback/credentials"))
        .json(&json!({"email": email, "password": password, "csrfToken": t["csrfToken"]}));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.expect("send").status()
}

/// Failed sign-ins back off per account *and* client: an attacker's failures lock out only the
/// attacker, the owner signs in from elsewhere. X-Forwarded-For counts only from a configured
/// trusted proxy.
async fn sign_in_backoff_is_per_account_and_client_and_trusts_only_configured_proxies(db: Db) {
    let yaml = "limits:\n  signin_failures_per_account: 3\n  signin_failures_per_ip: 50\n  window: 10m\ntrusted_proxies: [\"127.0.0.3/32\"]\n";
    let (_dir, inv) = fresh(&db, yaml);
    let c = Client::new(&inv).await;
    assert_eq!(
        c.register("owner@example.org", "12345678").await.status,
        201
    );
    let attacker = client_from("127.0.0.1");
    for _ in 0..3 {
        assert_eq!(
            sign_in_from(&inv, &attacker, "owner@example.org", "guess-guess", &[]).await,
            401
        );
    }
    assert_eq!(
        sign_in_from(&inv, &attacker, "owner@example.org", "12345678", &[]).await,
        429,
        "the attacker's client is backed off"
    );
    // the owner, from another address, is not locked out
    let owner = client_from("127.0.0.2");
    assert_eq!(
        sign_in_from(&inv, &owner, "owner@example.org", "12345678", &[]).await,
        302
    );

    // behind the trusted proxy 127.0.0.3, clients are told apart by X-Forwarded-For
    let proxy = client_from("127.0.0.3");
    let via = |ip: &'static str| [("x-forwarded-for", ip)];
    for _ in 0..3 {
        assert_eq!(
            sign_in_from(
                &inv,
                &proxy,
                "owner@example.org",
                "guess-guess",
                &via("198.51.100.1")
            )
            .await,
            401
        );
    }
    assert_eq!(
        sign_in_from(
            &inv,
            &proxy,
            "owner@example.org",
            "12345678",
            &via("198.51.100.1")
        )
        .await,
        429
    );
    assert_eq!(
        sign_in_from(
            &inv,
            &proxy,
            "owner@example.org",
            "12345678",
            &via("198.51.100.2")
        )
        .await,
        302,
        "another client behind the proxy"
    );
    // from an untrusted peer the header is ignored: 127.0.0.1 is still backed off whatever it claims
    assert_eq!(
        sign_in_from(
            &inv,
            &attacker,
            "owner@example.org",
            "12345678",
            &via("198.51.100.77")
        )
        .await,
        429
    );
}

/// Imports while other requests write: every import and every write succeeds (an import used
/// to open its SQLite transaction with reads and fail with SQLITE_BUSY → 500 when a concurrent
/// write committed first).
async fn import_under_concurrent_writes_never_answers_500(db: Db) {
    let (_dir, inv) = fresh(&db, "");
    let (c, _) = Client::account(&inv, "busy@example.org").await;
    let token = c.token();
    let mut tasks = Vec::new();
    for i in 0..6 {
        let http = c.http.clone();
        let url = inv.url("/api/import");
        let token = token.clone();
        let doc = json!({
            "format": "switchyard-inventory", "version": 1,
            "categories": (0..15).map(|k| json!({"name": format!("cat {i}-{k}")})).collect::<Vec<_>>(),
            "locations": (0..15).map(|k| json!({"name": format!("loc {i}-{k}")})).collect::<Vec<_>>(),
            "items": (0..150).map(|k| json!({"name": format!("imported {i}-{k}")}))
                .collect::<Vec<_>>(),
        });
        tasks.push(tokio::spawn(async move {
            let r = http
                .post(url)
                .header("x-csrf-token", token)
                .json(&doc)
                .send()
                .await
                .expect("send");
            let status = r.status();
            (
                format!("import {i}"),
                status,
                r.text().await.unwrap_or_default(),
            )
        }));
    }
    for w in 0..4 {
        let http = c.http.clone();
        let url = inv.url("/api/items");
        let token = token.clone();
        tasks.push(tokio::spawn(async move {
            for k in 0..25 {
                let r = http
                    .post(url.clone())
                    .header("x-csrf-token", token.clone())
                    .json(&json!({"name": format!("written {w}-{k}")}))
                    .send()
                    .await
                    .expect("send");
                if r.status() != StatusCode::CREATED {
                    let status = r.status();
                    return (
                        format!("writer {w}"),
                        status,
                        r.text().await.unwrap_or_default(),
                    );
                }
            }
            (format!("writer {w}"), StatusCode::CREATED, String::new())
        }));
    }
    for t in tasks {
        let (who, status, body) = t.await.expect("task");
        assert!(status.is_success(), "{who}: {status} {body}");
    }
    let list = c.get("/api/items?limit=1").await;
    assert_eq!(list.body["pagination"]["total"], 6 * 150 + 4 * 25);
}

/// The session secret never comes from the command line (the process list shows it):
/// `--auth-secret` is refused; `--auth-secret-file` works and gives the same key as the same
/// secret in `AUTH_SECRET` (a session made under one is valid under the other).
#[tokio::test(flavor = "multi_thread")]
async fn auth_secret_comes_from_a_file_or_the_environment_never_argv() {
    let secret = "a-secret-from-a-file-that-is-long-enough-0123456789";
    // `timeout`: a server that accepted the flag would keep running (a failure, not a hang).
    let out = Command::new("timeout")
        .args([
            "20",
            BIN,
            "inventory",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(tempfile::tempdir().expect("tempdir").path())
        .args(["--auth-secret", secret])
        .output()
        .expect("run");
    assert_ne!(out.status.code(), Some(124), "--auth-secret was accepted");
    assert!(!out.status.success(), "--auth-secret was accepted");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--auth-secret"));

    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("secret");
    std::fs::write(&file, format!("{secret}\n")).expect("secret file");
    let cmd_file = file.to_str().expect("p").to_string();
    let db = Db::Sqlite;
    let yaml = "";
    let config = dir.path().join("inventory-test.yaml");
    std::fs::write(&config, yaml).expect("config");
    let mut cmd = Command::new(BIN);
    cmd.args(["inventory", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .args(["--config"])
        .arg(&config)
        .args(["--auth-secret-file", &cmd_file])
        .env_remove("AUTH_SECRET")
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "info");
    let Reported { proc, addr, logs } = spawn_reporting(cmd, "switchyard inventory");
    let inv = Inventory {
        _proc: proc,
        addr,
        logs,
    };
    assert!(inv.logs().contains("configured secret"), "{}", inv.logs());
    assert!(!inv.logs().contains("generated a session secret"));
    assert!(!dir.path().join("auth_secret").exists());
    let cmdline =
        std::fs::read(format!("/proc/{}/cmdline", inv._proc.child.id())).expect("cmdline");
    assert!(!String::from_utf8_lossy(&cmdline).contains(secret));
    let (c, _) = Client::account(&inv, "s@example.org").await;
    let live = session_cookie(&c.get("/api/auth/session").await.headers).expect("cookie");
    let live = live.split(';').next().unwrap_or("").to_string();
    drop(inv);
    let inv = start(&db, dir.path(), yaml, &[("AUTH_SECRET", secret)]);
    let r = raw(&inv, Method::GET, "/api/items", &live, &[], None).await;
    assert_eq!(r.status(), 200, "the file's secret is the key");
}

on_both_databases!(
    registration_validation_roles_and_duplicates,
    first_admin_race_yields_exactly_one_admin,
    sign_in_session_csrf_and_sign_out,
    session_expiry_renewal_and_secret,
    bruteforce_limits_answer_429_with_retry_after,
    categories_and_locations,
    items_defaults_validation_and_updates,
    list_search_filters_sorting_and_pagination,
    users_are_isolated_and_admin_sees_all,
    images_upload_list_serve_delete,
    export_import_round_trip_idempotence_and_rollback,
    unfiltered_total_stays_exact_under_concurrent_writes,
    csrf_tokens_are_bound_to_the_session,
    sign_in_callback_urls_stay_on_the_site,
    sign_in_backoff_is_per_account_and_client_and_trusts_only_configured_proxies,
    import_under_concurrent_writes_never_answers_500,
);
