//! End-to-end tests of `switchyard pkgcache`: the real binary on a random loopback port and a
//! temp directory, driven with curl the way vcpkg drives it (`curl -X PUT -T file`, `curl -L -o`,
//! HEAD without credentials), plus raw sockets where a test must control timing (an upload cut
//! off, two uploads racing). The S3 backend runs against a real S3-compatible server (moto, from
//! PyPI; `tests/run` installs it). No test asserts a wall-clock time.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{curl, spawn_reporting, start_moto, Moto, Proc, Reported, BIN};

// ------------------------------------------------------------------ helpers

struct Pkgcache {
    proc: Proc,
    addr: SocketAddr,
    logs: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Pkgcache {
    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    fn pid(&self) -> u32 {
        self.proc.child.id()
    }

    fn logs(&self) -> String {
        self.logs.lock().map(|l| l.join("\n")).unwrap_or_default()
    }
}

/// Starts `switchyard pkgcache --listen 127.0.0.1:0 ARGS` with `envs`, waiting for its
/// "listening on" line.
fn start(args: &[&str], envs: &[(&str, &str)]) -> Pkgcache {
    let mut cmd = Command::new(BIN);
    cmd.args(["pkgcache", "--listen", "127.0.0.1:0"])
        .args(args)
        .env_remove("RUST_LOG")
        .env("RUST_LOG", "info");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let Reported { proc, addr, logs } = spawn_reporting(cmd, "switchyard pkgcache");
    Pkgcache { proc, addr, logs }
}

fn fs_server(dir: &Path, extra: &[&str]) -> Pkgcache {
    let mut args = vec!["--data-dir", dir.to_str().expect("utf-8 path")];
    args.extend_from_slice(extra);
    start(&args, &[])
}

/// (status, body) of a curl call; `args` come before the URL.
fn call(args: &[&str], url: &str) -> (u16, String) {
    let mut a = vec!["-sS", "--max-time", "60", "-w", "\n%{http_code}"];
    a.extend_from_slice(args);
    a.push(url);
    let out = curl(&a);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

fn status(args: &[&str], url: &str) -> u16 {
    call(args, url).0
}

/// Status and headers of a HEAD request.
fn head(url: &str, extra: &[&str]) -> (u16, String) {
    let mut a = vec!["-sS", "-I", "--max-time", "30"];
    a.extend_from_slice(extra);
    a.push(url);
    let out = curl(&a);
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    let code = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

fn sha(seed: u8) -> String {
    format!("{seed:02x}").repeat(32)
}

/// Deterministic pseudo-random bytes.
fn content(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed ^ 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 56) as u8
        })
        .collect()
}

fn sha256_of_file(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}

/// Opens a raw upload: sends the head with `Content-Length: total` and `first` body bytes.
fn raw_upload(addr: SocketAddr, path: &str, total: usize, first: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    write!(
        s,
        "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {total}\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    .expect("write head");
    s.write_all(first).expect("write body");
    s.flush().expect("flush");
    s
}

/// Reads a whole response (the server closes or we read until the body length).
fn read_status(s: &mut TcpStream) -> u16 {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8_lossy(&buf);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Sets the modification time of `path` to `age` ago.
fn backdate(path: &Path, age: Duration) {
    let when = std::time::SystemTime::now() - age;
    std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(when))
        .expect("backdate");
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

// ------------------------------------------------------------------ protocol

#[test]
fn vcpkg_flow_every_status_and_restart_totals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let srv = fs_server(&store, &[]);
    let body = content(300_000, 1);
    let file = dir.path().join("pkg.zip");
    std::fs::write(&file, &body).expect("write package");
    let f = file.to_str().expect("path");
    let p = format!("/zlib/1.3.1/{}", sha(0xab));
    let url = srv.url(&p);

    // vcpkg's precheck: HEAD without auth → 404, then GET → 404.
    assert_eq!(head(&url, &[]).0, 404);
    assert_eq!(status(&[], &url), 404);

    // vcpkg's upload: curl -X PUT -T file (Content-Length)
    let (code, out) = call(&["-X", "PUT", "-T", f], &url);
    assert_eq!(code, 200, "{out}");
    let up = json(&out);
    let expected_etag = sha256_of_file(&file);
    assert_eq!(up["status"], "uploaded");
    assert_eq!(up["name"], "zlib");
    assert_eq!(up["version"], "1.3.1");
    assert_eq!(up["sha"], sha(0xab));
    assert_eq!(up["size"], 300_000);
    assert_eq!(up["etag"], expected_etag.as_str());

    // present → 409, content unchanged
    let other = dir.path().join("other.zip");
    std::fs::write(&other, b"different").expect("write");
    let (code, out) = call(&["-X", "PUT", "-T", other.to_str().expect("p")], &url);
    assert_eq!(code, 409, "{out}");
    assert_eq!(json(&out)["error"], "already_exists");

    // HEAD 200 with size and ETag
    let (code, headers) = head(&url, &[]);
    assert_eq!(code, 200);
    assert!(headers.contains("content-length: 300000"), "{headers}");
    assert!(
        headers.contains(&format!("etag: \"{expected_etag}\"")),
        "{headers}"
    );

    // vcpkg's download: curl -L -o file
    let got = dir.path().join("got.zip");
    let code = status(&["-L", "-o", got.to_str().expect("p")], &url);
    assert_eq!(code, 200);
    assert_eq!(std::fs::read(&got).expect("read"), body);

    // chunked PUT (body from stdin, no Content-Length)
    let chunked_url = srv.url(&format!("/zlib/1.3.1/{}", sha(0xcd)));
    let out = Command::new("curl")
        .args([
            "-sS",
            "-X",
            "PUT",
            "-T",
            "-",
            "-H",
            "Transfer-Encoding: chunked",
        ])
        .args(["-w", "\n%{http_code}", &chunked_url])
        .stdin(std::fs::File::open(&file).expect("open"))
        .output()
        .expect("curl chunked");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.ends_with("200"), "{text}");
    assert_eq!(head(&chunked_url, &[]).0, 200);

    // 4-segment form addresses the same package
    assert_eq!(head(&srv.url(&format!("{p}/x64-linux")), &[]).0, 200);
    assert_eq!(
        status(&["-X", "PUT", "-T", f], &srv.url(&format!("{p}/x64-linux"))),
        409
    );

    // bad paths → 400, never a file outside the store
    for bad in [
        format!("/zlib/1.3.1/{}", "xyz"),
        format!("/zlib/%2e%2e/{}", sha(1)),
        format!("/%2e%2e/x/{}", sha(1)),
        format!("/a%2Fb/1/{}", sha(1)),
        format!("/.hidden/1/{}", sha(1)),
        format!("/{}/1/{}", "n".repeat(200), sha(1)),
        format!("/zlib/1/{}", "a".repeat(200)),
        format!("/zlib/1/{}/..%2f..", sha(1)),
    ] {
        let u = srv.url(&bad);
        assert_eq!(status(&["--path-as-is"], &u), 400, "GET {bad}");
        assert_eq!(
            status(&["--path-as-is", "-X", "PUT", "-T", f], &u),
            400,
            "PUT {bad}"
        );
        assert_eq!(head(&u, &["--path-as-is"]).0, 400, "HEAD {bad}");
    }
    assert_eq!(
        status(&["--path-as-is"], &srv.url("/../../etc/passwd")),
        400
    );
    assert!(!dir.path().join("passwd").exists());
    assert_eq!(status(&[], &srv.url("/only/two")), 404);
    assert_eq!(status(&["-X", "POST", "-d", "x"], &url), 405);

    // DELETE 200 then 404
    let (code, out) = call(&["-X", "DELETE"], &chunked_url);
    assert_eq!(code, 200, "{out}");
    assert_eq!(json(&out)["status"], "deleted");
    assert_eq!(status(&["-X", "DELETE"], &chunked_url), 404);
    assert_eq!(head(&chunked_url, &[]).0, 404);

    // health, details, metrics, docs
    let (code, out) = call(&[], &srv.url("/health"));
    assert_eq!(code, 200);
    let h = json(&out);
    assert_eq!(h["status"], "healthy");
    assert!(h["version"].is_string() && h["timestamp"].is_string());
    let (code, out) = call(&[], &srv.url("/health/live"));
    assert_eq!((code, json(&out)["status"].clone()), (200, "alive".into()));
    assert_eq!(status(&[], &srv.url("/health/ready")), 200);
    let (_, out) = call(&[], &srv.url("/health/details"));
    let d = json(&out);
    assert!(d["uptime"].as_str().expect("uptime").ends_with('s'), "{d}");
    assert_eq!(d["storage"]["healthy"], true);
    assert_eq!(d["storage"]["backend"], "filesystem");
    assert_eq!(d["storage"]["total_packages"], 1);
    assert_eq!(d["storage"]["total_size_bytes"], 300_000);
    let (hits, misses) = (
        d["cache"]["hits"].as_u64().expect("hits"),
        d["cache"]["misses"].as_u64().expect("misses"),
    );
    assert!(hits >= 4 && misses >= 3, "{d}");
    let rate = d["cache"]["hit_rate"].as_str().expect("rate");
    assert!(rate.ends_with('%') && rate.contains('.'), "{rate}");
    let (code, m) = call(&[], &srv.url("/metrics"));
    assert_eq!(code, 200);
    for name in [
        "switchyard_pkgcache_requests_total{method=\"PUT\",status=\"409\"}",
        "switchyard_pkgcache_received_bytes_total",
        "switchyard_pkgcache_sent_bytes_total",
        "switchyard_pkgcache_cache_hits_total",
        "switchyard_pkgcache_cache_misses_total",
        "switchyard_pkgcache_storage_bytes 300000",
        "switchyard_pkgcache_storage_packages 1",
    ] {
        assert!(m.contains(name), "{name} missing:\n{m}");
    }
    let (code, doc) = call(&[], &srv.url("/api/openapi.json"));
    assert_eq!(code, 200);
    let doc = json(&doc);
    assert!(doc["openapi"].as_str().expect("openapi").starts_with("3."));
    assert!(doc["paths"]["/{name}/{version}/{sha}"]["put"].is_object());
    for (page, asset) in [
        ("/api/docs", "/api/swagger-ui-bundle.js"),
        ("/api/redoc", "/api/redoc.standalone.js"),
    ] {
        let (code, html) = call(&[], &srv.url(page));
        assert_eq!(code, 200);
        assert!(html.contains(asset) && !html.contains("cdn"), "{html}");
        let (code, js) = call(&[], &srv.url(asset));
        assert_eq!(code, 200);
        assert!(js.len() > 100_000, "{asset} is {} bytes", js.len());
        // stored gzip-compressed: browsers get the gzip bytes, curl --compressed inflates them
        // to the same text the client without Accept-Encoding got
        let (_, headers) = head(&srv.url(asset), &["-H", "Accept-Encoding: gzip, br"]);
        assert!(headers.contains("content-encoding: gzip"), "{headers}");
        let (code, inflated) = call(&["--compressed"], &srv.url(asset));
        assert_eq!(code, 200);
        assert!(inflated == js, "{asset}: gzip and identity bodies differ");
    }
    assert!(srv.logs().contains("stored"), "{}", srv.logs());

    // restart: totals are recomputed from the store
    drop(srv);
    let srv = fs_server(&store, &[]);
    let (_, out) = call(&[], &srv.url("/health/details"));
    let d = json(&out);
    assert_eq!(d["storage"]["total_packages"], 1, "{d}");
    assert_eq!(d["storage"]["total_size_bytes"], 300_000, "{d}");
    let got2 = dir.path().join("got2.zip");
    assert_eq!(
        status(&["-L", "-o", got2.to_str().expect("p")], &srv.url(&p)),
        200
    );
    assert_eq!(std::fs::read(&got2).expect("read"), body);
}

// ------------------------------------------------------------------ modes

#[test]
fn modes_from_flags_env_and_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let file = dir.path().join("pkg");
    std::fs::write(&file, content(1000, 2)).expect("write");
    let f = file.to_str().expect("p");
    let present = format!("/boost/1.84/{}", sha(1));
    let absent = format!("/boost/1.84/{}", sha(2));
    {
        let rw = fs_server(&store, &[]);
        assert_eq!(status(&["-X", "PUT", "-T", f], &rw.url(&present)), 200);
    }

    // --read-only: PUT and DELETE 403, HEAD/GET served
    let ro = fs_server(&store, &["--read-only"]);
    assert_eq!(status(&["-X", "PUT", "-T", f], &ro.url(&absent)), 403);
    assert_eq!(status(&["-X", "DELETE"], &ro.url(&present)), 403);
    assert_eq!(head(&ro.url(&present), &[]).0, 200);
    assert_eq!(status(&["-o", "/dev/null"], &ro.url(&present)), 200);
    assert_eq!(head(&ro.url(&absent), &[]).0, 404);
    let (_, out) = call(&[], &ro.url("/health/details"));
    assert_eq!(json(&out)["mode"], "read-only");
    drop(ro);

    // SWITCHYARD_PKGCACHE_MODE=write-only: HEAD/GET 403, PUT works
    let s = store.to_str().expect("p");
    let wo = start(
        &["--data-dir", s],
        &[("SWITCHYARD_PKGCACHE_MODE", "write-only")],
    );
    assert_eq!(head(&wo.url(&present), &[]).0, 403);
    assert_eq!(status(&[], &wo.url(&present)), 403);
    assert_eq!(status(&["-X", "PUT", "-T", f], &wo.url(&absent)), 200);
    assert_eq!(status(&["-X", "PUT", "-T", f], &wo.url(&absent)), 409);
    drop(wo);

    // mode from a config file (and the env data dir)
    let cfg = dir.path().join("pkgcache.yaml");
    std::fs::write(&cfg, "mode: read-only\nlogging:\n  level: debug\n").expect("config");
    let from_file = start(
        &["--config", cfg.to_str().expect("p")],
        &[("SWITCHYARD_PKGCACHE_DATA_DIR", s)],
    );
    assert_eq!(
        status(
            &["-X", "PUT", "-T", f],
            &from_file.url(&format!("/x/1/{}", sha(9)))
        ),
        403
    );
    assert_eq!(head(&from_file.url(&absent), &[]).0, 200);
    drop(from_file);

    // a bad config is refused at start with the key named
    std::fs::write(&cfg, "mode: read-only\nmoed: x\n").expect("config");
    let out = Command::new(BIN)
        .args(["pkgcache", "--config", cfg.to_str().expect("p")])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("moed"));
}

// ------------------------------------------------------------------ auth

#[test]
fn auth_tokens_users_anonymous_head_and_scopes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hash = bcrypt::hash("hunter2", 4).expect("bcrypt");
    let cfg = dir.path().join("pkgcache.yaml");
    std::fs::write(
        &cfg,
        format!(
            "storage:\n  path: {}\nauth:\n  enabled: true\n  tokens: [\"${{TEST_PKGCACHE_TOKEN}}\"]\n  users:\n    - username: ci\n      password_hash: \"{hash}\"\n",
            dir.path().join("store").display()
        ),
    )
    .expect("config");
    let srv = start(
        &["--config", cfg.to_str().expect("p")],
        &[("TEST_PKGCACHE_TOKEN", "t0ken")],
    );
    let file = dir.path().join("pkg");
    std::fs::write(&file, content(5000, 3)).expect("write");
    let f = file.to_str().expect("p");
    let url = srv.url(&format!("/fmt/10.2.1/{}", sha(3)));
    let bearer = "Authorization: Bearer t0ken";

    // vcpkg's HEAD precheck carries no header: allowed by default
    assert_eq!(head(&url, &[]).0, 404);
    // GET/PUT/DELETE without or with wrong credentials: 401 + WWW-Authenticate
    let (code, headers) = head(&url, &["-X", "GET"]);
    assert_eq!(code, 401);
    assert!(headers.contains("www-authenticate: bearer"), "{headers}");
    assert_eq!(status(&["-X", "PUT", "-T", f], &url), 401);
    assert_eq!(
        status(
            &["-X", "PUT", "-T", f, "-H", "Authorization: Bearer nope"],
            &url
        ),
        401
    );
    assert_eq!(status(&["-X", "PUT", "-T", f, "-u", "ci:wrong"], &url), 401);
    assert_eq!(status(&["-X", "DELETE"], &url), 401);
    assert_eq!(head(&url, &[]).0, 404, "nothing was stored");
    // Bearer token and Basic user work
    assert_eq!(status(&["-X", "PUT", "-T", f, "-H", bearer], &url), 200);
    assert_eq!(head(&url, &[]).0, 200);
    assert_eq!(status(&["-o", "/dev/null", "-H", bearer], &url), 200);
    assert_eq!(status(&["-o", "/dev/null", "-u", "ci:hunter2"], &url), 200);
    assert_eq!(status(&["-o", "/dev/null", "-u", "ci:hunter2"], &url), 200);
    // health, metrics, docs open by default
    assert_eq!(status(&[], &srv.url("/health")), 200);
    assert_eq!(status(&[], &srv.url("/metrics")), 200);
    assert_eq!(status(&[], &srv.url("/api/openapi.json")), 200);
    assert!(srv.logs().contains("auth on"), "{}", srv.logs());
    drop(srv);

    // anonymous_head off, metrics covered
    let mut text = std::fs::read_to_string(&cfg).expect("read");
    text.push_str("  anonymous_head: false\n  protect: [packages, metrics]\n");
    std::fs::write(&cfg, text).expect("config");
    let srv = start(
        &["--config", cfg.to_str().expect("p")],
        &[("TEST_PKGCACHE_TOKEN", "t0ken")],
    );
    assert_eq!(
        head(&srv.url(&format!("/fmt/10.2.1/{}", sha(3))), &[]).0,
        401
    );
    assert_eq!(
        head(
            &srv.url(&format!("/fmt/10.2.1/{}", sha(3))),
            &["-H", bearer]
        )
        .0,
        200
    );
    assert_eq!(status(&[], &srv.url("/metrics")), 401);
    assert_eq!(status(&["-H", bearer], &srv.url("/metrics")), 200);
    assert_eq!(status(&[], &srv.url("/health/ready")), 200);
    drop(srv);

    // auth off: everything open
    let open = fs_server(&dir.path().join("store"), &[]);
    assert_eq!(
        status(
            &["-o", "/dev/null"],
            &open.url(&format!("/fmt/10.2.1/{}", sha(3)))
        ),
        200
    );
    assert!(open.logs().contains("auth off"));
}

// ------------------------------------------------------------------ crash safety, races

#[test]
fn dropped_upload_and_kill_9_leave_nothing_visible() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let srv = fs_server(&store, &[]);
    let path = format!("/curl/8.5/{}", sha(4));
    let total = 4 * 1024 * 1024;
    let body = content(total, 4);

    // connection dropped mid-body
    let s = raw_upload(srv.addr, &path, total, &body[..1024 * 1024]);
    std::thread::sleep(Duration::from_millis(200));
    drop(s);
    wait_until("the temp file to be removed", || {
        files_in(&store.join("tmp")).is_empty()
    });
    assert_eq!(head(&srv.url(&path), &[]).0, 404);

    // kill -9 mid-upload
    let mut s = raw_upload(srv.addr, &path, total, &body[..2 * 1024 * 1024]);
    wait_until("the upload to reach the temp file", || {
        files_in(&store.join("tmp"))
            .iter()
            .any(|p| std::fs::metadata(p).map(|m| m.len() > 0).unwrap_or(false))
    });
    let mut proc = srv.proc;
    proc.child.kill().expect("kill -9");
    proc.child.wait().expect("reap");
    let _ = s.write_all(&body[2 * 1024 * 1024..]);
    let leftovers = files_in(&store.join("tmp"));
    assert!(
        !leftovers.is_empty(),
        "the half upload stays in tmp/ after kill -9"
    );
    assert!(!store.join("packages/curl/8.5").join(sha(4)).exists());

    // restart at once: the leftover is young (it could be another server's upload in flight)
    // and stays; nothing is served
    let srv = fs_server(&store, &[]);
    assert_eq!(files_in(&store.join("tmp")), leftovers);
    assert_eq!(head(&srv.url(&path), &[]).0, 404);
    drop(srv);
    // once older than the bound (1 h), a restart removes it
    for f in &leftovers {
        backdate(f, Duration::from_secs(2 * 3600));
    }
    let srv = fs_server(&store, &[]);
    assert!(files_in(&store.join("tmp")).is_empty());
    assert_eq!(head(&srv.url(&path), &[]).0, 404);
    assert_eq!(status(&["-o", "/dev/null"], &srv.url(&path)), 404);
    let file = dir.path().join("pkg");
    std::fs::write(&file, &body).expect("write");
    assert_eq!(
        status(
            &["-X", "PUT", "-T", file.to_str().expect("p")],
            &srv.url(&path)
        ),
        200
    );
    let (_, out) = call(&[], &srv.url("/health/details"));
    assert_eq!(json(&out)["storage"]["total_packages"], 1);
}

/// Two uploads of one package in flight at once: exactly one 200, the other 409 — on one
/// server (in-flight set) and on two servers sharing the directory (link(2) refuses the loser).
#[test]
fn concurrent_puts_exactly_one_wins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let a = fs_server(&store, &[]);
    let b = fs_server(&store, &[]);
    let total = 3 * 1024 * 1024;
    let body = content(total, 5);
    for (i, (first, second)) in [(&a, &a), (&a, &b)].into_iter().enumerate() {
        let path = format!("/race/{i}/{}", sha(5));
        let mut s1 = raw_upload(first.addr, &path, total, &body[..total / 2]);
        let mut s2 = raw_upload(second.addr, &path, total, &body[..total / 2]);
        std::thread::sleep(Duration::from_millis(300));
        let t1 = {
            let rest = body[total / 2..].to_vec();
            std::thread::spawn(move || {
                let _ = s1.write_all(&rest);
                read_status(&mut s1)
            })
        };
        let rest = body[total / 2..].to_vec();
        let _ = s2.write_all(&rest);
        let c2 = read_status(&mut s2);
        let c1 = t1.join().expect("join");
        let mut codes = [c1, c2];
        codes.sort();
        assert_eq!(codes, [200, 409], "case {i}");
        let got = dir.path().join(format!("got{i}"));
        assert_eq!(
            status(&["-o", got.to_str().expect("p")], &a.url(&path)),
            200
        );
        assert_eq!(std::fs::read(&got).expect("read"), body);
    }
}

// ------------------------------------------------------------------ big packages

/// A 2 GiB package generated on the fly: PUT (streamed, Content-Length) and GET back, hashes
/// compared, the server's RSS sampled throughout and kept under 200 MiB.
#[test]
fn two_gib_package_streams_with_bounded_memory() {
    const SIZE: u64 = 2 * 1024 * 1024 * 1024;
    let dir = tempfile::tempdir().expect("tempdir");
    let srv = fs_server(&dir.path().join("store"), &[]);
    let url = srv.url(&format!("/huge/1/{}", sha(6)));
    let pid = srv.pid();
    let peak = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };

    // generator → curl (PUT, Content-Length) and → sha256sum
    let mut put = Command::new("curl")
        .args(["-sS", "-X", "PUT", "-T", "-", "-H"])
        .arg(format!("Content-Length: {SIZE}"))
        .args(["-H", "Expect:", "-w", "\n%{http_code}", &url])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("curl put");
    let mut hash = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum");
    {
        let mut to_curl = put.stdin.take().expect("stdin");
        let mut to_hash = hash.stdin.take().expect("stdin");
        let mut block = content(1 << 20, 6);
        for i in 0..(SIZE >> 20) {
            block[..8].copy_from_slice(&i.to_le_bytes());
            to_curl.write_all(&block).expect("feed curl");
            to_hash.write_all(&block).expect("feed sha256sum");
        }
    }
    let put = put.wait_with_output().expect("curl put");
    let put_text = String::from_utf8_lossy(&put.stdout).into_owned();
    let expected = String::from_utf8_lossy(&hash.wait_with_output().expect("hash").stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(put_text.ends_with("200"), "{put_text}");
    let up = json(put_text.rsplit_once('\n').expect("body").0);
    assert_eq!(up["size"], SIZE);
    assert_eq!(up["etag"], expected.as_str());

    // GET → sha256sum
    let get = Command::new("sh")
        .arg("-c")
        .arg(format!("curl -sS -f '{url}' | sha256sum"))
        .output()
        .expect("curl get");
    let got = String::from_utf8_lossy(&get.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    stop.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");
    assert_eq!(got, expected, "GET returned different bytes");
    let peak_mib = peak.load(Ordering::Relaxed) / 1024;
    eprintln!("pkgcache peak RSS during the 2 GiB PUT+GET: {peak_mib} MiB");
    assert!(peak_mib > 0 && peak_mib < 200, "peak RSS {peak_mib} MiB");
}

// ------------------------------------------------------------------ readiness

#[test]
fn readiness_fails_when_the_store_is_gone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let srv = fs_server(&store, &[]);
    assert_eq!(status(&[], &srv.url("/health/ready")), 200);
    std::fs::remove_dir_all(&store).expect("remove store");
    let (code, out) = call(&[], &srv.url("/health/ready"));
    assert_eq!(code, 503, "{out}");
    assert_eq!(json(&out)["status"], "not ready");
    let (_, out) = call(&[], &srv.url("/health/details"));
    assert_eq!(json(&out)["storage"]["healthy"], false);
    assert_eq!(status(&[], &srv.url("/health/live")), 200);
}

// ------------------------------------------------------------------ S3

const AWS_ENV: [(&str, &str); 3] = [
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_REGION", "us-east-1"),
];

fn s3_server(moto: &Moto, url: &str) -> Pkgcache {
    start(
        &["--s3-url", url, "--s3-endpoint", &moto.endpoint],
        &AWS_ENV,
    )
}

#[test]
fn s3_backend_against_a_real_s3_server() {
    let Some(moto) = start_moto() else { return };
    assert_eq!(
        status(&["-X", "PUT"], &format!("{}/vcpkg", moto.endpoint)),
        200
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let srv = s3_server(&moto, "s3://vcpkg/cache");
    assert!(srv.logs().contains("backend=\"s3\""), "{}", srv.logs());
    assert_eq!(status(&[], &srv.url("/health/ready")), 200);

    let small = dir.path().join("small");
    std::fs::write(&small, content(100_000, 7)).expect("write");
    let s = small.to_str().expect("p");
    let url = srv.url(&format!("/openssl/3.2/{}", sha(7)));
    assert_eq!(head(&url, &[]).0, 404);
    let (code, out) = call(&["-X", "PUT", "-T", s], &url);
    assert_eq!(code, 200, "{out}");
    assert_eq!(json(&out)["etag"], sha256_of_file(&small).as_str());
    assert_eq!(status(&["-X", "PUT", "-T", s], &url), 409);
    let (code, headers) = head(&url, &[]);
    assert_eq!(code, 200);
    assert!(
        headers.contains(&format!("etag: \"{}\"", sha256_of_file(&small))),
        "{headers}"
    );
    let got = dir.path().join("got");
    assert_eq!(status(&["-L", "-o", got.to_str().expect("p")], &url), 200);
    assert_eq!(
        std::fs::read(&got).expect("r"),
        std::fs::read(&small).expect("r")
    );

    // > 8 MiB: multipart upload, streamed both ways
    let big = dir.path().join("big");
    std::fs::write(&big, content(20 * 1024 * 1024 + 123, 8)).expect("write");
    let big_url = srv.url(&format!("/qt/6.6/{}", sha(8)));
    let (code, out) = call(&["-X", "PUT", "-T", big.to_str().expect("p")], &big_url);
    assert_eq!(code, 200, "{out}");
    assert_eq!(json(&out)["etag"], sha256_of_file(&big).as_str());
    assert_eq!(status(&["-o", got.to_str().expect("p")], &big_url), 200);
    assert_eq!(sha256_of_file(&got), sha256_of_file(&big));

    // a second server sharing the bucket sees the packages, totals recomputed at start
    let other = s3_server(&moto, "s3://vcpkg/cache");
    let (_, out) = call(&[], &other.url("/health/details"));
    let d = json(&out);
    assert_eq!(d["storage"]["backend"], "s3");
    assert_eq!(d["storage"]["total_packages"], 2, "{d}");
    assert_eq!(
        d["storage"]["total_size_bytes"],
        100_000 + 20 * 1024 * 1024 + 123
    );
    assert_eq!(
        head(&other.url(&format!("/openssl/3.2/{}", sha(7))), &[]).0,
        200
    );

    // racing uploads on two servers: the conditional PUT lets exactly one win
    let total = 2 * 1024 * 1024;
    let body = content(total, 9);
    let path = format!("/race/1/{}", sha(9));
    let mut s1 = raw_upload(srv.addr, &path, total, &body[..total / 2]);
    let mut s2 = raw_upload(other.addr, &path, total, &body[..total / 2]);
    std::thread::sleep(Duration::from_millis(300));
    let rest = body[total / 2..].to_vec();
    let t1 = std::thread::spawn(move || {
        let _ = s1.write_all(&rest);
        read_status(&mut s1)
    });
    let _ = s2.write_all(&body[total / 2..]);
    let mut codes = [read_status(&mut s2), t1.join().expect("join")];
    codes.sort();
    assert_eq!(codes, [200, 409]);

    // delete, then 404 on both servers
    assert_eq!(status(&["-X", "DELETE"], &url), 200);
    assert_eq!(status(&["-X", "DELETE"], &url), 404);
    assert_eq!(
        head(&other.url(&format!("/openssl/3.2/{}", sha(7))), &[]).0,
        404
    );

    // the store goes away: not ready
    drop(moto);
    let (code, out) = call(&[], &srv.url("/health/ready"));
    assert_eq!(code, 503, "{out}");
}

// ------------------------------------------------------------------ hardening (issue 19)

const TOKEN: &str = "t0ken-19";

/// A file-system pkgcache with auth on (token [`TOKEN`] from a tokens file) and `extra_auth`
/// appended to its `auth:` section.
fn auth_server(dir: &Path, extra_auth: &str) -> Pkgcache {
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("# CI uploader\n{TOKEN}\n")).expect("tokens file");
    let cfg = dir.join("pkgcache-auth.yaml");
    std::fs::write(
        &cfg,
        format!(
            "storage:\n  path: {}\nauth:\n  enabled: true\n{extra_auth}",
            dir.join("store").display()
        ),
    )
    .expect("config");
    start(
        &[
            "--config",
            cfg.to_str().expect("p"),
            "--tokens-file",
            tokens.to_str().expect("p"),
        ],
        &[],
    )
}

/// Every first segment the router reserves for its own endpoints, used as a package name,
/// needs a package's credentials; and every endpoint needs exactly the credentials of its own
/// scope. (Auth used to be decided from the path prefix while the router fell back to the
/// package route: `PUT /health/1/abcdef0123` stored a package without credentials.)
#[test]
fn auth_follows_the_route_that_matched_for_every_reserved_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let srv = auth_server(dir.path(), "");
    let file = dir.path().join("pkg");
    std::fs::write(&file, content(2000, 19)).expect("write");
    let f = file.to_str().expect("p");
    let bearer = format!("Authorization: Bearer {TOKEN}");
    let reserved = [
        "health",
        "metrics",
        "api",
        "docs",
        "redoc",
        "openapi.json",
        "live",
        "ready",
        "details",
    ];
    for (i, name) in reserved.iter().enumerate() {
        for path in [
            format!("/{name}/1/abcdef012{i}"),
            format!("/{name}/docs/abcdef012{i}/x64-linux"),
            format!("/api/{name}/abcdef012{i}"),
            format!("/health/{name}/abcdef012{i}"),
        ] {
            let url = srv.url(&path);
            assert_eq!(status(&["-X", "PUT", "-T", f], &url), 401, "PUT {path}");
            assert_eq!(status(&["-o", "/dev/null"], &url), 401, "GET {path}");
            assert_eq!(status(&["-X", "DELETE"], &url), 401, "DELETE {path}");
            assert_eq!(
                head(&url, &[]).0,
                404,
                "HEAD {path}: anonymous, nothing stored"
            );
        }
        let path = format!("/{name}/1/abcdef012{i}");
        let url = srv.url(&path);
        assert_eq!(
            status(&["-X", "PUT", "-T", f, "-H", &bearer], &url),
            200,
            "{path}"
        );
        assert_eq!(status(&["-o", "/dev/null"], &url), 401, "{path}");
        assert_eq!(
            status(&["-o", "/dev/null", "-H", &bearer], &url),
            200,
            "{path}"
        );
        assert_eq!(head(&url, &[]).0, 200, "{path}");
    }
    let endpoints = [
        "/health",
        "/health/live",
        "/health/ready",
        "/health/details",
        "/metrics",
        "/api/openapi.json",
        "/api/docs",
        "/api/redoc",
        "/api/swagger-ui.css",
    ];
    // default protect [packages]: the endpoints stay open
    for e in endpoints {
        assert_eq!(status(&["-o", "/dev/null"], &srv.url(e)), 200, "{e}");
    }
    let (_, details) = call(&[], &srv.url("/health/details"));
    assert_eq!(json(&details)["storage"]["total_packages"], reserved.len());
    drop(srv);

    // every scope protected: each endpoint needs the token, and packages still do
    let srv = auth_server(dir.path(), "  protect: [packages, health, metrics, docs]\n");
    for e in endpoints {
        assert_eq!(status(&["-o", "/dev/null"], &srv.url(e)), 401, "{e}");
        assert_eq!(
            status(&["-o", "/dev/null", "-H", &bearer], &srv.url(e)),
            200,
            "{e}"
        );
    }
    assert_eq!(
        status(&["-X", "PUT", "-T", f], &srv.url("/metrics/2/abcdef0123")),
        401
    );
    // paths that name nothing are 404 whatever the credentials
    for p in ["/health/x", "/api/nothing", "/a/b", "/a/b/c/d/e"] {
        assert_eq!(status(&[], &srv.url(p)), 404, "{p}");
    }
}

/// Request methods outside the known set are counted as `other`, so clients cannot create
/// metric series at will.
#[test]
fn unknown_methods_are_counted_as_other() {
    let dir = tempfile::tempdir().expect("tempdir");
    let srv = fs_server(&dir.path().join("store"), &[]);
    for (i, m) in ["FOOBAR", "BREW", "X-EVIL-1", "PROPFIND"]
        .iter()
        .enumerate()
    {
        let code = status(&["-X", m], &srv.url(&format!("/zlib/1/ab{i}")));
        assert_eq!(code, 405, "{m}");
        assert_eq!(status(&["-X", m], &srv.url("/health")), 405, "{m}");
    }
    let (_, text) = call(&[], &srv.url("/metrics"));
    for m in ["FOOBAR", "BREW", "X-EVIL-1", "PROPFIND"] {
        assert!(!text.contains(m), "{m} became a label:\n{text}");
    }
    assert!(
        text.contains("switchyard_pkgcache_requests_total{method=\"other\",status=\"405\"} 8"),
        "{text}"
    );
}

/// Temp files have random names (not `{pid}-{counter}`, which repeat across containers that
/// all run as PID 1), and start-up leaves a young temp file alone: it may be another server's
/// upload in flight in a shared directory.
#[test]
fn temp_files_are_random_and_a_shared_directory_keeps_uploads_in_flight() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let a = fs_server(&store, &[]);
    let total = 2 * 1024 * 1024;
    let body = content(total, 8);
    let path = format!("/shared/1/{}", sha(8));
    let mut s = raw_upload(a.addr, &path, total, &body[..total / 2]);
    wait_until("the upload to reach tmp/", || {
        !files_in(&store.join("tmp")).is_empty()
    });
    let names: Vec<String> = files_in(&store.join("tmp"))
        .iter()
        .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_string))
        .collect();
    for n in &names {
        let (random, rest) = n.split_once('-').expect("RANDOM-what.part");
        assert_eq!(rest, "data.part", "{n}");
        assert_eq!(random.len(), 32, "{n}");
        assert!(random.bytes().all(|b| b.is_ascii_hexdigit()), "{n}");
        assert!(!n.starts_with(&format!("{}-", a.pid())), "{n}");
    }
    // a second server starts on the same directory while the upload is in flight
    let b = fs_server(&store, &[]);
    assert!(
        files_in(&store.join("tmp")).len() == names.len(),
        "the second server removed an upload in flight"
    );
    s.write_all(&body[total / 2..]).expect("rest of the body");
    assert_eq!(read_status(&mut s), 200);
    let got = dir.path().join("got");
    assert_eq!(
        status(&["-o", got.to_str().expect("p")], &b.url(&path)),
        200
    );
    assert_eq!(std::fs::read(&got).expect("read"), body);
}

/// An upload that creates `name/` and `version/` fsyncs their parents (and `version/` after
/// the link) before it is acknowledged: strace, attached to the running server, shows each
/// `mkdir` followed by an fsync of the directory it was made in.
#[test]
fn new_package_directories_are_fsynced() {
    let Some(strace) = support::require("strace") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let srv = fs_server(&store, &[]);
    let log = dir.path().join("strace.log");
    let mut tracer = Command::new(strace)
        .args([
            "-f",
            "-y",
            "-qq",
            "-e",
            "trace=mkdir,mkdirat,fsync,fdatasync",
            "-o",
        ])
        .arg(&log)
        .args(["-p", &srv.pid().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("strace");
    let probe = srv.url(&format!("/probe/1/{}", sha(1)));
    let traced = |status: String| {
        status
            .lines()
            .any(|l| l.starts_with("TracerPid:") && l.split_whitespace().nth(1) != Some("0"))
    };
    wait_until("strace to attach to every thread", || {
        head(&probe, &[]);
        let tasks = files_in(Path::new(&format!("/proc/{}/task", srv.pid())));
        !tasks.is_empty()
            && tasks
                .iter()
                .all(|t| traced(std::fs::read_to_string(t.join("status")).unwrap_or_default()))
    });
    let file = dir.path().join("pkg");
    std::fs::write(&file, content(10_000, 9)).expect("write");
    let url = srv.url(&format!("/durable/2.0/{}", sha(9)));
    assert_eq!(
        status(&["-X", "PUT", "-T", file.to_str().expect("p")], &url),
        200
    );
    // detach (SIGTERM makes strace detach and flush), then read what it saw
    let _ = Command::new("kill").arg(tracer.id().to_string()).status();
    let _ = tracer.wait();
    let text = std::fs::read_to_string(&log).expect("strace log");
    let lines: Vec<&str> = text.lines().collect();
    let packages = std::fs::canonicalize(store.join("packages")).expect("canonical");
    let fsync_of = |dir: &Path, from: usize| {
        let needle = format!("<{}>)", dir.display());
        lines[from..]
            .iter()
            .position(|l| l.contains("fsync(") && l.contains(&needle))
            .map(|i| i + from)
    };
    let mut at = 0;
    for (made, parent) in [
        (packages.join("durable"), packages.clone()),
        (packages.join("durable/2.0"), packages.join("durable")),
    ] {
        let needle = format!("{}\"", made.display());
        let m = lines[at..]
            .iter()
            .position(|l| l.contains("mkdir") && l.contains(&needle))
            .map(|i| i + at)
            .unwrap_or_else(|| panic!("no mkdir of {}:\n{text}", made.display()));
        at = fsync_of(&parent, m).unwrap_or_else(|| {
            panic!(
                "no fsync of {} after its new entry:\n{text}",
                parent.display()
            )
        });
    }
    assert!(
        fsync_of(&packages.join("durable/2.0"), at).is_some(),
        "no fsync of the version directory after the link:\n{text}"
    );
}

/// Tokens never come from the command line (the process list shows it): `--tokens` is
/// refused; a tokens file and the environment variable work.
#[test]
fn tokens_come_from_a_file_or_the_environment_never_argv() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(BIN)
        .args([
            "pkgcache",
            "--listen",
            "127.0.0.1:0",
            "--tokens",
            "s3cret",
            "--data-dir",
        ])
        .arg(dir.path().join("argv-store"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    // A server that accepted the flag keeps running: that is the failure, not a hang.
    let mut exited = None;
    for _ in 0..200 {
        if let Ok(Some(st)) = child.try_wait() {
            exited = Some(st);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if exited.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(
        exited.is_some_and(|s| !s.success()),
        "--tokens was accepted"
    );
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(err.contains("--tokens"), "{err}");

    let srv = auth_server(dir.path(), "");
    let url = srv.url(&format!("/zlib/1/{}", sha(7)));
    assert_eq!(status(&["-X", "PUT", "-d", "x"], &url), 401);
    let bearer = format!("Authorization: Bearer {TOKEN}");
    assert_eq!(status(&["-X", "PUT", "-d", "x", "-H", &bearer], &url), 200);
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", srv.pid())).expect("cmdline");
    assert!(!String::from_utf8_lossy(&cmdline).contains(TOKEN));
    drop(srv);

    let srv = start(
        &["--data-dir", dir.path().join("store").to_str().expect("p")],
        &[("SWITCHYARD_PKGCACHE_TOKENS", "from-env,second")],
    );
    let url = srv.url(&format!("/zlib/1/{}", sha(7)));
    assert_eq!(status(&["-o", "/dev/null"], &url), 401);
    assert_eq!(
        status(
            &["-o", "/dev/null", "-H", "Authorization: Bearer second"],
            &url
        ),
        200
    );
}

// ------------------------------------------------------------------ writes from the LAN

/// A network namespace joined to the host by a veth pair this test creates: the host side is
/// `{net}.1`, the namespace `{net}.2`. A client in the namespace reaches a server on the host
/// from a non-loopback address, and nothing leaves the pair. Removed on drop.
struct LanPeer {
    ns: String,
    host_if: String,
    net: String,
}

impl LanPeer {
    fn create() -> LanPeer {
        let tag = std::process::id() % 10_000;
        let peer = LanPeer {
            ns: format!("sypkc{tag}"),
            host_if: format!("sypkc{tag}h"),
            net: format!("10.219.{}", tag % 250 + 2),
        };
        support::netns::sh(&format!(
            "ip netns add {ns} && ip -n {ns} link set lo up && \
             ip link add {host} type veth peer name eth0 netns {ns} && \
             ip addr add {net}.1/30 dev {host} && ip link set {host} up && \
             ip -n {ns} addr add {net}.2/30 dev eth0 && ip -n {ns} link set eth0 up",
            ns = peer.ns,
            host = peer.host_if,
            net = peer.net
        ));
        peer
    }

    /// (status, body) of curl run inside the namespace.
    fn call(&self, args: &[&str], url: &str) -> (u16, String) {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns, "curl", "-sS", "--max-time", "20"])
            .args(["-w", "\n%{http_code}"])
            .args(args)
            .arg(url)
            .output()
            .expect("curl in the namespace");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }
}

impl Drop for LanPeer {
    fn drop(&mut self) {
        support::netns::sh_quiet(&format!(
            "ip link del {} 2>/dev/null; ip netns del {} 2>/dev/null",
            self.host_if, self.ns
        ));
    }
}

/// Without auth, a PUT or DELETE from another host is refused (403), reads still work, loopback
/// writes still work, and the start-up log says who may write; `auth.allow_anonymous_writes`
/// opens writes to everyone, auth to token holders from anywhere.
#[test]
fn anonymous_writes_from_the_lan_are_refused_unless_allowed() {
    if !support::netns::root_with_tools_or_skip("pkgcache LAN writes", &["ip"]) {
        return;
    }
    let lan = LanPeer::create();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("pkg.zip");
    std::fs::write(&file, b"package bytes").expect("package");
    let pkg = file.to_str().expect("utf-8 path");
    let server = |name: &str, auth: &str| {
        let cfg = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &cfg,
            format!(
                "listen: \"0.0.0.0:0\"\nstorage:\n  path: {}\n{auth}",
                dir.path().join(name).display()
            ),
        )
        .expect("config");
        let mut cmd = Command::new(BIN);
        cmd.args(["pkgcache", "--config", cfg.to_str().expect("p")])
            .env_remove("RUST_LOG")
            .env("RUST_LOG", "info");
        let Reported { proc, addr, logs } = spawn_reporting(cmd, "switchyard pkgcache");
        Pkgcache { proc, addr, logs }
    };

    let srv = server("open", "");
    let port = srv.addr.port();
    let from_lan = format!("http://{}.1:{port}/zlib/1.3/{}", lan.net, sha(1));
    let local = format!("http://127.0.0.1:{port}/zlib/1.3/{}", sha(1));
    let (code, body) = lan.call(&["-X", "PUT", "-T", pkg], &from_lan);
    assert_eq!(code, 403, "{body}");
    assert_eq!(json(&body)["error"], "anonymous_write_refused", "{body}");
    assert_eq!(lan.call(&["-I"], &from_lan).0, 404, "nothing was stored");
    assert_eq!(status(&["-X", "PUT", "-T", pkg], &local), 200);
    let (code, body) = lan.call(&[], &from_lan);
    assert_eq!(
        (code, body.as_str()),
        (200, "package bytes"),
        "reads stay open"
    );
    assert_eq!(lan.call(&["-X", "DELETE"], &from_lan).0, 403);
    assert_eq!(
        status(&["-I"], &local),
        200,
        "the LAN DELETE removed nothing"
    );
    let log = srv.logs();
    assert!(
        log.contains("who may write packages") && log.contains("loopback clients only"),
        "{log}"
    );
    drop(srv);

    let srv = server("allowed", "auth:\n  allow_anonymous_writes: true\n");
    let url = format!(
        "http://{}.1:{}/zlib/1.3/{}",
        lan.net,
        srv.addr.port(),
        sha(2)
    );
    assert_eq!(lan.call(&["-X", "PUT", "-T", pkg], &url).0, 200);
    let log = srv.logs();
    assert!(
        log.contains("WARN") && log.contains("anyone who reaches the port"),
        "{log}"
    );
    drop(srv);

    let srv = server(
        "token",
        &format!("auth:\n  enabled: true\n  tokens: [\"{TOKEN}\"]\n"),
    );
    let url = format!(
        "http://{}.1:{}/zlib/1.3/{}",
        lan.net,
        srv.addr.port(),
        sha(3)
    );
    assert_eq!(lan.call(&["-X", "PUT", "-T", pkg], &url).0, 401);
    let bearer = format!("Authorization: Bearer {TOKEN}");
    assert_eq!(
        lan.call(&["-H", &bearer, "-X", "PUT", "-T", pkg], &url).0,
        200
    );
    assert!(srv.logs().contains("clients with a listed token or user"));
}
